"""The serving engine on the tiny llama and hybrid packages: greedy output of a request is the same alone, in a
batch, after a reused prefix and after preemption, and the same as the pipeline's; cancelled and finished
requests give their blocks back; the block pool's reference counts, prefix keys and eviction order."""
import os
import threading

import numpy as np
import pytest

from pipeline.engine import Engine, SamplingParams
from pipeline.paged import MakePaged, PagedUnsupportedError
from pipeline.paged_kv import BlockPool, PoolExhausted, chain_keys
from pipeline.spec import RequestError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(ROOT, "fixtures", "packages", "llama_fp32")
HYBRID = os.path.join(ROOT, "fixtures", "packages", "qwen35_fp32")
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def _prompts(n, lengths, seed=0, vocab=500):
    rng = np.random.default_rng(seed)
    return [rng.integers(4, vocab, size=int(k)).tolist() for k in lengths[:n]]


@pytest.fixture(scope="module")
def engine():
    return Engine(LLAMA, block_size=4, max_batch=4, max_model_len=128)


@pytest.fixture(scope="module")
def reference():
    import pipeline as og
    model = og.Model(LLAMA)
    return lambda p, n: [int(t) for t in og.generate(model, p, max_new_tokens=n)]


def test_batch_alone_and_pipeline_agree(engine, reference):
    prompts = _prompts(6, [5, 13, 8, 21, 3, 17])
    together = engine.generate(prompts, GREEDY)  # six requests, four at a time: some join as others leave
    for p, got in zip(prompts, together):
        engine.pool.clear_cache()
        assert engine.generate([p], GREEDY)[0] == got
        assert reference(p, GREEDY.max_tokens) == got
    assert engine.pool.in_use() == 0


def test_prefix_reuse_computes_only_new_tokens(engine):
    shared = _prompts(1, [22], seed=3)[0]
    engine.pool.clear_cache()
    engine.generate([shared + [7, 8]], GREEDY)
    before = engine.stats()
    r = engine.submit(shared + [9, 10, 11], GREEDY)
    engine.run()
    after = engine.stats()
    assert r.reused == 20  # five full blocks of the 22 shared tokens
    assert after["computed_prompt_tokens"] - before["computed_prompt_tokens"] == 25 - 20
    engine.pool.clear_cache()
    assert engine.generate([shared + [9, 10, 11]], GREEDY)[0] == r.output
    assert engine.pool.in_use() == 0


def test_preemption_when_the_pool_runs_short():
    eng = Engine(LLAMA, block_size=4, max_batch=4, num_blocks=16, max_model_len=64, prefix_cache=False)
    prompts = _prompts(4, [9, 14, 6, 11], seed=5)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    together = eng.generate(prompts, params)
    assert eng.stats()["preemptions"] > 0
    assert together == [eng.generate([p], params)[0] for p in prompts]
    assert all(len(o) == 24 for o in together)
    assert eng.pool.in_use() == 0


def test_seeded_sampling_does_not_depend_on_the_batch(engine):
    prompts = _prompts(3, [6, 9, 4], seed=7)
    params = [SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    reqs = [engine.submit(p, sp) for p, sp in zip(prompts, params)]
    engine.run()
    for r, p, sp in zip(reqs, prompts, params):
        one = engine.submit(p, sp)
        engine.run()
        assert one.output == r.output


def test_cancel_frees_blocks_and_spares_the_others(engine):
    prompts = _prompts(3, [7, 10, 5], seed=9)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    reqs = [engine.submit(p, params) for p in prompts]
    for _ in range(4):
        engine.step()
    assert engine.cancel(reqs[1])
    assert reqs[1].finish_reason == "cancelled" and not engine.cancel(reqs[1])
    engine.run()
    assert engine.pool.in_use() == 0
    assert [r.finish_reason for r in reqs] == ["length", "cancelled", "length"]
    assert reqs[0].output == engine.generate([prompts[0]], params)[0]


def test_stream_on_the_engine_thread(engine):
    engine.start()
    try:
        r = engine.submit(_prompts(1, [6], seed=11)[0], SamplingParams(max_tokens=6, ignore_eos=True))
        seen = list(r.stream(timeout=60))
        assert r.wait(60) and seen == r.output and len(seen) == 6
        waiter, proceed = threading.Event(), threading.Event()

        def first_token():  # holds the engine's thread at its first token until the cancel is in
            waiter.set()
            proceed.wait(60)
        r2 = engine.submit(_prompts(1, [5], seed=12)[0], SamplingParams(max_tokens=50, ignore_eos=True))
        r2.add_listener(first_token)
        assert waiter.wait(60)
        engine.cancel(r2.id)
        proceed.set()
        assert r2.wait(60) and r2.finish_reason == "cancelled"
    finally:
        engine.shutdown()
    assert engine.pool.in_use() == 0


def test_stop_token_ids_end_a_request(engine):
    p = _prompts(1, [8], seed=13)[0]
    free = engine.generate([p], GREEDY)[0]
    stop = free[3]
    r = engine.submit(p, SamplingParams(max_tokens=12, stop_token_ids=(stop,), ignore_eos=True))
    engine.run()
    assert r.finish_reason == "stop" and r.output == free[:free.index(stop) + 1]


@pytest.mark.parametrize("prompt,params,words", [
    ([], GREEDY, "empty"),
    ([1, 2, 9999], GREEDY, "outside the vocabulary"),
    ([1] * 120, SamplingParams(max_tokens=20), "exceeds the model's context"),
    ([1, 2], SamplingParams(max_tokens=0), "max_tokens"),
    ([1, 2], SamplingParams(top_p=0.0), "top_p"),
])
def test_requests_it_cannot_serve_are_refused(engine, prompt, params, words):
    waiting = len(engine.waiting)
    with pytest.raises(RequestError, match=words):
        engine.submit(prompt, params)
    assert len(engine.waiting) == waiting


def test_hybrid_decoder_keeps_state_per_request():
    import pipeline as og
    eng = Engine(HYBRID, block_size=4, max_batch=3, max_model_len=64)
    assert not eng.pool.prefix_cache  # recurrent state: cached blocks could not restore it
    prompts = _prompts(3, [5, 11, 7], seed=15, vocab=400)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    together = eng.generate(prompts, params)
    model = og.Model(HYBRID)
    assert together == [[int(t) for t in og.generate(model, p, max_new_tokens=6)] for p in prompts]


# -- the block pool ----------------------------------------------------------------------------------

def test_pool_reference_counts_and_lru_eviction():
    pool = BlockPool(4, 2)
    toks = [1, 2, 3, 4, 5, 6]
    keys = chain_keys(toks, 2)
    blocks = [pool.allocate() for _ in range(3)]
    for b, k in zip(blocks, keys):
        pool.register(b, k)
    assert pool.match(keys[:2]) == blocks[:2]  # a second holder of the first two blocks
    pool.release(blocks)                       # the first holder leaves: block 2 waits, keyed
    assert pool.in_use() == 2 and pool.free_blocks() == 2
    pool.release(blocks[:2])
    assert pool.in_use() == 0
    assert pool.allocate() == 3                # never-used first
    assert pool.allocate() == blocks[2]        # then the least recently released keyed block
    assert pool.match(keys) == blocks[:2]      # its key was forgotten: the chain stops there
    with pytest.raises(PoolExhausted):
        pool.allocate()
    with pytest.raises(ValueError, match="not held"):
        pool.release([3, 3])


def test_chain_keys_name_the_whole_prefix():
    a = chain_keys([1, 2, 3, 4], 2)
    b = chain_keys([9, 9, 3, 4], 2)
    assert a[1] != b[1]  # same tokens in block 1, different prefix
    assert chain_keys([1, 2, 3, 4, 5], 2) == a
    assert chain_keys([1, 2, 3, 4], 2, a[0], 1) == a[1:]


def test_make_paged_names_what_it_cannot_serve():
    from runtime.ir import Graph, Node, ValueInfo
    f = np.dtype(np.float32)
    g = Graph(nodes=[Node("Identity", ["past.0.key"], ["present.0.key"], name="copy")],
              inputs=[ValueInfo("past.0.key", f, ("b", 2, "p", 8), 1)],
              outputs=[ValueInfo("present.0.key", f, None, 1)], initializers={}, value_info={}, opsets={"": 21})
    with pytest.raises(PagedUnsupportedError, match="node 'copy' .*Identity"):
        MakePaged([("past.0.key", "present.0.key")])(g)


def _gqa_graph(cap, **attrs):
    """One GroupQueryAttention over the caches past.0.key/value of capacity ``cap`` (packed QKV)."""
    from runtime.ir import Graph, Node, ValueInfo
    f, i32 = np.dtype(np.float32), np.dtype(np.int32)
    node = Node("GroupQueryAttention", ["qkv", "", "", "past.0.key", "past.0.value", "seqlens_k", "total"],
                ["out", "present.0.key", "present.0.value"], name="attn", domain="com.microsoft",
                attrs=dict(num_heads=4, kv_num_heads=2, **attrs))
    ins = [ValueInfo("qkv", f, ("b", "s", 128), 1), ValueInfo("past.0.key", f, ("b", 2, cap, 16), 1),
           ValueInfo("past.0.value", f, ("b", 2, cap, 16), 1), ValueInfo("seqlens_k", i32, ("b",), 6),
           ValueInfo("total", i32, (), 6)]
    outs = [ValueInfo(n, f, None, 1) for n in ("out", "present.0.key", "present.0.value")]
    return Graph(nodes=[node], inputs=ins, outputs=outs, initializers={}, value_info={},
                 opsets={"": 21, "com.microsoft": 1})


@pytest.mark.parametrize("cap,attrs,words", [
    (8, dict(local_window_size=8, sliding_window_cache=1), None),          # served: the window over the pools
    ("p", dict(local_window_size=8, sliding_window_cache=1), None),        # capacity not static: served
    (6, dict(local_window_size=8, sliding_window_cache=1), "holds 6 positions, fewer than its window of 8"),
    (8, dict(sliding_window_cache=1), "needs local_window_size > 0"),
])
def test_make_paged_serves_windowed_caches_by_their_window(cap, attrs, words):
    g = _gqa_graph(cap, **attrs)
    pas = MakePaged([("past.0.key", "present.0.key"), ("past.0.value", "present.0.value")])
    if words:
        with pytest.raises(PagedUnsupportedError, match=words):
            pas(g)
        return
    pas(g)
    (n,) = g.nodes
    assert n.op_type == "PagedGroupQueryAttention" and n.attrs["local_window_size"] == 8
    assert pas.layers["past.0.key"] == (2, 16) and [o.name for o in g.outputs] == ["out"]
