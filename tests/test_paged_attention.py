"""onnx_numba::PagedGroupQueryAttention, and com.microsoft::PagedAttention (onnxruntime has no CPU kernel for it),
against onnxruntime's GroupQueryAttention on the same caches laid out contiguously: outputs, and the pools read
back through the block table against onnxruntime's presents."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxruntime as ort

from ops.paged_attention import DOMAIN, OP
from runtime import InferenceSession
from runtime.errors import IndexOutOfRangeError, InvalidArgumentError, InvalidAttributeError

H, KVH, D, BS, NBLK = 4, 2, 16, 4, 12
ATOL, RTOL = 2e-5, 1e-4


def _gqa_model(packed, attrs, f=TensorProto.FLOAT):
    names = ["query", "key", "value"] if not packed else ["query", "", ""]
    node = helper.make_node("GroupQueryAttention", names + ["past_key", "past_value", "seqlens_k", "total", "cos",
                            "sin"], ["out", "present_key", "present_value"], domain="com.microsoft",
                            num_heads=H, kv_num_heads=KVH, **attrs)
    ins = [helper.make_tensor_value_info("query", f, None)]
    if not packed:
        ins += [helper.make_tensor_value_info("key", f, None), helper.make_tensor_value_info("value", f, None)]
    ins += [helper.make_tensor_value_info(n, f, None) for n in ("past_key", "past_value")]
    ins += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, None),
            helper.make_tensor_value_info("total", TensorProto.INT32, None),
            helper.make_tensor_value_info("cos", f, None), helper.make_tensor_value_info("sin", f, None)]
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "present_key", "present_value")]
    m = helper.make_model(helper.make_graph([node], "g", ins, outs),
                          opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def _paged_model(packed, attrs):
    names = ["query", "key", "value"] if not packed else ["query", "", ""]
    node = helper.make_node(OP, names + ["key_pool", "value_pool", "table", "seqlens_k", "total", "cos", "sin"],
                            ["out"], domain=DOMAIN, num_heads=H, kv_num_heads=KVH, **attrs)
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("query", f, None)]
    if not packed:
        ins += [helper.make_tensor_value_info("key", f, None), helper.make_tensor_value_info("value", f, None)]
    ins += [helper.make_tensor_value_info(n, f, [None, KVH, BS, D]) for n in ("key_pool", "value_pool")]
    ins += [helper.make_tensor_value_info("table", TensorProto.INT32, [None, None]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [None]),
            helper.make_tensor_value_info("total", TensorProto.INT32, []),
            helper.make_tensor_value_info("cos", f, None), helper.make_tensor_value_info("sin", f, None)]
    m = helper.make_model(helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("out", f, None)]),
                          opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)])
    m.ir_version = 10
    return m.SerializeToString()


def _rope(rng, rows=64):
    ang = rng.random((rows, D // 2)).astype(np.float32) * 3
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _case(rng, pasts, S, packed, attrs):
    """Each row against onnxruntime alone; the paged op on all rows at once, on shuffled blocks."""
    B = len(pasts)
    cos, sin = _rope(rng)
    width = (H + 2 * KVH) * D if packed else H * D
    q = rng.standard_normal((B, S, width)).astype(np.float32)
    k = rng.standard_normal((B, S, KVH * D)).astype(np.float32)
    v = rng.standard_normal((B, S, KVH * D)).astype(np.float32)
    totals = [p + S for p in pasts]
    kpool = rng.standard_normal((NBLK, KVH, BS, D)).astype(np.float32)  # garbage where nothing was written
    vpool = rng.standard_normal((NBLK, KVH, BS, D)).astype(np.float32)
    perm = rng.permutation(NBLK)
    need = [-(-t // BS) for t in totals]
    table = np.zeros((B, max(need)), np.int32)
    taken = 0
    for b in range(B):
        table[b, :need[b]] = perm[taken:taken + need[b]]
        taken += need[b]
    pasts_k, pasts_v = [], []
    for b in range(B):
        pk = rng.standard_normal((1, KVH, pasts[b], D)).astype(np.float32)
        pv = rng.standard_normal((1, KVH, pasts[b], D)).astype(np.float32)
        for p in range(pasts[b]):
            kpool[table[b, p // BS], :, p % BS] = pk[0, :, p]
            vpool[table[b, p // BS], :, p % BS] = pv[0, :, p]
        pasts_k.append(pk)
        pasts_v.append(pv)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    ref = ort.InferenceSession(_gqa_model(packed, attrs), so, providers=["CPUExecutionProvider"])
    outs, pres_k, pres_v = [], [], []
    for b in range(B):
        feeds = {"query": q[b:b + 1], "past_key": pasts_k[b], "past_value": pasts_v[b],
                 "seqlens_k": np.array([totals[b] - 1], np.int32), "total": np.array(totals[b], np.int32),
                 "cos": cos, "sin": sin}
        if not packed:
            feeds.update(key=k[b:b + 1], value=v[b:b + 1])
        o, pk, pv = ref.run(None, feeds)
        outs.append(o)
        pres_k.append(pk)
        pres_v.append(pv)
    sess = InferenceSession(_paged_model(packed, attrs))
    feeds = {"query": q, "key_pool": kpool, "value_pool": vpool, "table": table,
             "seqlens_k": np.array(totals, np.int32) - 1, "total": np.array(max(totals), np.int32),
             "cos": cos, "sin": sin}
    if not packed:
        feeds.update(key=k, value=v)
    got = sess.run(None, feeds)[0]
    for b in range(B):
        np.testing.assert_allclose(got[b:b + 1], outs[b], atol=ATOL, rtol=RTOL)
        for p in range(totals[b]):
            np.testing.assert_allclose(kpool[table[b, p // BS], :, p % BS], pres_k[b][0, :, p], atol=ATOL, rtol=RTOL)
            np.testing.assert_allclose(vpool[table[b, p // BS], :, p % BS], pres_v[b][0, :, p], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("pasts,S,packed,attrs", [
    ([0], 5, True, dict(do_rotary=1)),                                   # a prompt from nothing
    ([8], 3, True, dict(do_rotary=1)),                                   # a chunk after a reused prefix
    ([6, 9], 1, False, dict(softcap=3.0, local_window_size=4)),          # decode, two rows, own lengths
    ([5, 2, 11], 1, True, dict(do_rotary=1, rotary_interleaved=1, smooth_softmax=1, scale=0.3)),
])
def test_paged_matches_onnxruntime_gqa(pasts, S, packed, attrs):
    _case(np.random.default_rng(len(pasts) * 10 + S), pasts, S, packed, attrs)


@pytest.mark.parametrize("C,W,steps", [(6, 4, [9, 1, 1, 3, 1, 1]), (5, 5, [3, 1, 1, 1, 1, 2, 1])])
def test_windowed_cache_is_its_window_over_the_pools(C, W, steps):
    """A sliding-window layer (``sliding_window_cache=1``, capacity C, window W): onnxruntime keeps the resident
    rows in a buffer of capacity C, its present fed back as the next past; the paged op keeps every position in
    its blocks and attends the window.  Each step's output equals onnxruntime's, and the pools' last resident
    positions equal its present rows."""
    from ops.contrib_attention import resident_rows
    rng = np.random.default_rng(C * 10 + W)
    attrs = dict(do_rotary=1, local_window_size=W, sliding_window_cache=1)
    cos, sin = _rope(rng)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    ref = ort.InferenceSession(_gqa_model(False, attrs), so, providers=["CPUExecutionProvider"])
    sess = InferenceSession(_paged_model(False, attrs))
    kpool = rng.standard_normal((NBLK, KVH, BS, D)).astype(np.float32)
    vpool = rng.standard_normal((NBLK, KVH, BS, D)).astype(np.float32)
    table = rng.permutation(NBLK)[None, :-(-sum(steps) // BS)].astype(np.int32)
    pk = np.zeros((1, KVH, C, D), np.float32)
    pv = np.zeros((1, KVH, C, D), np.float32)
    T = 0
    for S in steps:
        T += S
        q, k, v = (rng.standard_normal((1, S, n * D)).astype(np.float32) for n in (H, KVH, KVH))
        want, pk, pv = ref.run(None, {"query": q, "key": k, "value": v, "past_key": pk, "past_value": pv,
                                      "seqlens_k": np.array([T - 1], np.int32), "total": np.array(T, np.int32),
                                      "cos": cos, "sin": sin})
        got = sess.run(None, {"query": q, "key": k, "value": v, "key_pool": kpool, "value_pool": vpool,
                              "table": table, "seqlens_k": np.array([T - 1], np.int32),
                              "total": np.array(T, np.int32), "cos": cos, "sin": sin})[0]
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)
        n = int(resident_rows(T, C, W))
        for i in range(n):
            p = T - n + i
            np.testing.assert_allclose(kpool[table[0, p // BS], :, p % BS], pk[0, :, i], atol=ATOL, rtol=RTOL)
            np.testing.assert_allclose(vpool[table[0, p // BS], :, p % BS], pv[0, :, i], atol=ATOL, rtol=RTOL)


def _bad_feeds(table, seqlens):
    rng = np.random.default_rng(1)
    cos, sin = _rope(rng)
    return {"query": rng.standard_normal((1, 1, (H + 2 * KVH) * D)).astype(np.float32),
            "key_pool": np.zeros((NBLK, KVH, BS, D), np.float32), "value_pool": np.zeros((NBLK, KVH, BS, D), np.float32),
            "table": np.array(table, np.int32), "seqlens_k": np.array(seqlens, np.int32),
            "total": np.array(max(seqlens) + 1, np.int32), "cos": cos, "sin": sin}


@pytest.mark.parametrize("table,seqlens,cls,words", [
    ([[0, NBLK]], [5], IndexOutOfRangeError, "block id is outside the pool"),
    ([[0, -1]], [5], IndexOutOfRangeError, "block id is outside the pool"),
    ([[0]], [5], IndexOutOfRangeError, "past its block table"),
])
def test_paged_refuses_what_it_cannot_read(table, seqlens, cls, words):
    sess = InferenceSession(_paged_model(True, dict(do_rotary=1)))
    feeds = _bad_feeds(table, seqlens)
    before = feeds["key_pool"].copy()
    with pytest.raises(cls, match=words):
        sess.run(None, feeds)
    assert np.array_equal(feeds["key_pool"], before)  # nothing written


def test_paged_refuses_fewer_positions_than_new_tokens():
    sess = InferenceSession(_paged_model(True, dict(do_rotary=1)))
    feeds = _bad_feeds([[0, 1]], [5])
    feeds["query"] = np.zeros((1, 8, (H + 2 * KVH) * D), np.float32)
    with pytest.raises(InvalidArgumentError, match="fewer than its new tokens"):
        sess.run(None, feeds)


# -- com.microsoft::PagedAttention: float16, caches (blocks, block_size, kv heads, head size), packed tokens ----
MS_ATOL = MS_RTOL = 5e-3    # float16 outputs: onnxruntime rounds its rotated query to float16, this kernel does not
CACHE_TOL = 2e-3            # the written keys: rotated in float32 here, then rounded once


def _ms_model(packed, attrs, extra=()):
    names = ["query", "key", "value"] if not packed else ["query", "", ""]
    ins = names + ["key_cache", "value_cache", "cum", "past", "table", "cos", "sin"] + list(extra)
    node = helper.make_node("PagedAttention", ins, ["out", "key_cache_out", "value_cache_out"],
                            domain="com.microsoft", num_heads=H, kv_num_heads=KVH, **attrs)
    f, i32 = TensorProto.FLOAT16, TensorProto.INT32
    vi = helper.make_tensor_value_info
    graph_ins = [vi(n, f, None) for n in names if n] + [vi("key_cache", f, [NBLK, BS, KVH, D]),
                                                        vi("value_cache", f, [NBLK, BS, KVH, D]),
                                                        vi("cum", i32, [None]), vi("past", i32, [None]),
                                                        vi("table", i32, [None, None]), vi("cos", f, None),
                                                        vi("sin", f, None)]
    graph_ins += [vi(n, f if n.endswith("norm_weight") else i32, None) for n in extra if n]
    outs = [vi("out", f, None), vi("key_cache_out", f, [NBLK, BS, KVH, D]),
            vi("value_cache_out", f, [NBLK, BS, KVH, D])]
    m = helper.make_model(helper.make_graph([node], "g", graph_ins, outs),
                          opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def _ms_inputs(rng, pasts, news, packed):
    """Packed float16 tokens of sequences with ``pasts`` cached and ``news`` new positions; caches of random
    garbage, each sequence's history written through a block table of shuffled blocks (-1 past its own)."""
    h = lambda *shape: rng.standard_normal(shape).astype(np.float16)  # noqa: E731
    T = sum(news)
    totals = [p + n for p, n in zip(pasts, news)]
    need = [-(-t // BS) for t in totals]
    table = np.full((len(pasts), max(need) + 1), -1, np.int32)
    perm, taken = rng.permutation(NBLK), 0
    for b, n in enumerate(need):
        table[b, :n] = perm[taken:taken + n]
        taken += n
    ang = rng.random((64, D // 2)) * 3
    return dict(query=h(T, (H + 2 * KVH) * D if packed else H * D), key=h(T, KVH * D), value=h(T, KVH * D),
                key_cache=h(NBLK, BS, KVH, D), value_cache=h(NBLK, BS, KVH, D),
                cum=np.concatenate([[0], np.cumsum(news)]).astype(np.int32), past=np.array(pasts, np.int32),
                table=table, cos=np.cos(ang).astype(np.float16), sin=np.sin(ang).astype(np.float16))


def _history(cache, table, b, n):
    """Positions [0, n) of sequence ``b`` as onnxruntime's (1, kv heads, n, head size)."""
    return np.stack([cache[table[b, p // BS], p % BS] for p in range(n)], 1)[None] if n else \
        np.zeros((1, KVH, 0, D), cache.dtype)


def _rms_heads(x, w, eps=1e-6):
    """Each head of ``x`` (..., heads * D) RMS-normalised and scaled by ``w`` (D,), in float32, rounded back."""
    h = x.astype(np.float32).reshape(x.shape[:-1] + (-1, D))
    return (h / np.sqrt((h * h).mean(-1, keepdims=True) + eps) * w.astype(np.float32)).reshape(x.shape).astype(
        x.dtype)


@pytest.mark.parametrize("pasts,news,packed,attrs", [
    ([0, 5, 9], [3, 1, 2], False, dict(do_rotary=1, softcap=5.0, local_window_size=6)),  # prompt, decode, chunk
    ([4, 0], [1, 6], True, dict(do_rotary=1, rotary_interleaved=1, scale=0.3)),
    ([7], [1], False, {}),
    ([3, 0], [2, 4], False, dict(do_rotary=1, norms=1)),  # the fused q/k norms, as a Qwen 3 CUDA export has them
])
def test_ms_paged_attention_matches_onnxruntime_gqa(pasts, news, packed, attrs):
    rng = np.random.default_rng(sum(pasts) + len(news))
    feeds = _ms_inputs(rng, pasts, news, packed)
    before = {k: feeds[k].copy() for k in ("key_cache", "value_cache")}
    attrs, extra = dict(attrs), []
    if attrs.pop("norms", 0):  # the reference gets the query and key normalised beforehand
        extra = ["", "", "q_norm_weight", "k_norm_weight"]
        feeds.update(q_norm_weight=(1 + 0.5 * rng.standard_normal(D)).astype(np.float16),
                     k_norm_weight=(1 + 0.5 * rng.standard_normal(D)).astype(np.float16))
    if packed:
        del feeds["key"], feeds["value"]
    out, kc, vc = InferenceSession(_ms_model(packed, attrs, extra)).run(None, feeds)
    if extra:
        feeds = dict(feeds, query=_rms_heads(feeds["query"], feeds["q_norm_weight"]),
                     key=_rms_heads(feeds["key"], feeds["k_norm_weight"]))
    assert np.array_equal(feeds["key_cache"], kc) and np.array_equal(feeds["value_cache"], vc)  # in place
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    ref = ort.InferenceSession(_gqa_model(packed, attrs, TensorProto.FLOAT16), so,
                               providers=["CPUExecutionProvider"])
    cum, table = feeds["cum"], feeds["table"]
    for b, (p, n) in enumerate(zip(pasts, news)):
        rows = slice(int(cum[b]), int(cum[b + 1]))
        step = {"query": feeds["query"][None, rows], "past_key": _history(before["key_cache"], table, b, p),
                "past_value": _history(before["value_cache"], table, b, p),
                "seqlens_k": np.array([p + n - 1], np.int32), "total": np.array(p + n, np.int32),
                "cos": feeds["cos"], "sin": feeds["sin"]}
        if not packed:
            step.update(key=feeds["key"][None, rows], value=feeds["value"][None, rows])
        o, pk, pv = ref.run(None, step)
        np.testing.assert_allclose(out[rows].astype(np.float32), o[0].astype(np.float32), atol=MS_ATOL, rtol=MS_RTOL)
        for got, want in ((_history(kc, table, b, p + n), pk), (_history(vc, table, b, p + n), pv)):
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=CACHE_TOL,
                                       rtol=CACHE_TOL)
    untouched = np.setdiff1d(np.arange(NBLK), table[table >= 0])
    assert np.array_equal(kc[untouched], before["key_cache"][untouched])


def test_ms_paged_attention_refuses_what_it_cannot_read():
    rng = np.random.default_rng(3)
    sess = InferenceSession(_ms_model(False, dict(do_rotary=1)))
    cases = [(dict(table=np.array([[NBLK]], np.int32)), IndexOutOfRangeError, "block id is outside the cache"),
             (dict(cum=np.array([0, 2], np.int32)), InvalidArgumentError, "rise from 0 to the number of tokens"),
             (dict(past=np.array([64], np.int32), table=np.arange(17, dtype=np.int32)[None] % NBLK),
              IndexOutOfRangeError, "outside the cos/sin caches"),
             (dict(table=np.zeros((1, 0), np.int32)), IndexOutOfRangeError, "reach past its block table")]
    for change, cls, words in cases:
        feeds = _ms_inputs(rng, [0], [1], False)
        kc = feeds["key_cache"].copy()
        feeds.update(change)
        with pytest.raises(cls, match=words):
            sess.run(None, feeds)
        assert np.array_equal(feeds["key_cache"], kc)  # nothing written before the checks
    feeds = _ms_inputs(rng, [0], [1], False)
    with pytest.raises(InvalidArgumentError, match="input slot_mapping is not supported"):
        InferenceSession(_ms_model(False, {}, extra=["slot_mapping"])).run(None, dict(feeds, slot_mapping=np.zeros(
            1, np.int32)))
    with pytest.raises(InvalidAttributeError, match="kv_cache_layout 'LATENT'"):
        InferenceSession(_ms_model(False, dict(kv_cache_layout="LATENT")))
