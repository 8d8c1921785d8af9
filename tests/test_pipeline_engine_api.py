"""onnxruntime-genai's ``Engine`` API (``pipeline/engine_api.py``) against onnxruntime-genai's own, in the same
test: the events of every request (tokens, flags, finish reasons, usage) across batches, turns, rewinds,
cancellations and small event buffers, and the messages of its refusals.  The tiny llama package is copied with
its EOS set to a token the greedy decode reaches, so turns also end on EOS."""
import json
import os
import shutil

import numpy as np
import pytest

import pipeline as pg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(ROOT, "fixtures", "packages", "llama_fp32")
HYBRID = os.path.join(ROOT, "fixtures", "packages", "qwen35_fp32")
EOS = 447  # the greedy decode of PROMPTS[0] reaches it after two tokens
PROMPTS = [[285, 79, 339, 321, 272, 79, 71], [5, 9, 13], [7, 2, 20, 4, 100, 200, 300, 400, 12, 13, 14], [3, 8],
           [40, 41, 42], [50], [5, 9, 13, 100]]


def _package(tmp_path_factory, name, **changes):
    """A copy of the tiny llama package with ``changes`` ({"model.eos_token_id": 447, ...}) in its config."""
    path = str(tmp_path_factory.mktemp(name))
    shutil.copytree(LLAMA, path, dirs_exist_ok=True)
    cfg_path = os.path.join(path, "genai_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    for key, value in changes.items():
        *outer, last = key.split(".")
        d = cfg
        for k in outer:
            d = d.setdefault(k, {})
        d[last] = value
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory, ort_genai):
    path = _package(tmp_path_factory, "eos", **{"model.eos_token_id": EOS})
    return {"og": (ort_genai, ort_genai.Model(path)), "pg": (pg, pg.Model(path, native="all"))}


def _options(mod, request, opts):
    t = mod.TurnOptions(request)
    for k, v in opts.items():
        getattr(t, "set_" + k)(v)
    return t


def _drain(engine, buf, requests, out):
    while engine.has_pending_requests():
        for e in engine.run(buf):
            u = e.usage
            out[requests.index(e.request)].append((e.turn_id, e.token, int(e.flags), int(e.finish_reason),
                                                   (u.prompt_tokens, u.generated_tokens)))


def _script(mod, model, first, turns=(), capacity=64):
    """Requests begun with ``first`` [(prompt, options)], run to their ends, then ``turns`` [(request index,
    tokens, options)] one after another; every request's events."""
    engine = mod.Engine(model)
    buf = engine.create_event_buffer(capacity)
    requests = []
    for prompt, opts in first:
        r = engine.create_request()
        r.begin_turn(np.array(prompt, np.int32), _options(mod, r, opts))
        requests.append(r)
    out = [[] for _ in requests]
    _drain(engine, buf, requests, out)
    for i, tokens, opts in turns:
        requests[i].begin_turn(np.array(tokens, np.int32), _options(mod, requests[i], opts))
        _drain(engine, buf, requests, out)
    return out


def _both(models, *args, **kw):
    return [_script(*models[k], *args, **kw) for k in ("og", "pg")]


def test_batch_events_equal_onnxruntime_genai(models):
    ref, got = _both(models, [(p, {"max_generated_tokens": 8}) for p in PROMPTS])
    assert got == ref
    assert ref[0][-1] == (1, None, 2, 1, (7, 2))  # an EOS ends the turn without being a token
    assert ref[1][-1][2:] == (3, 3, (3, 8))       # TOKEN | TURN_FINISHED, MAX_GENERATED_TOKENS


def test_turn_options_equal_onnxruntime_genai(models):
    first = [(PROMPTS[0], {"max_generated_tokens": 8, "min_generated_tokens": 4}),
             (PROMPTS[6], {"max_generated_tokens": 6, "repetition_penalty": 1.5}),
             (PROMPTS[6], {"max_generated_tokens": 6, "no_repeat_ngram_size": 1}),
             (PROMPTS[6], {"max_generated_tokens": 6, "do_sample": True, "top_k": 1})]
    ref, got = _both(models, first)
    assert got == ref
    assert all(e[1] != EOS for e in ref[0])  # the minimum held the EOS back


def test_turns_continue_the_conversation(models):
    # the first turn ends on EOS, which does not join the conversation; the third turn's prompt holds the EOS id
    turns = [(0, [5, 6], {"max_generated_tokens": 3}), (0, [EOS, 6], {"max_generated_tokens": 3}),
             (0, [9], {"max_generated_tokens": 2})]
    ref, got = _both(models, [(PROMPTS[0], {"max_generated_tokens": 4})], turns)
    assert got == ref
    assert [e[0] for e in ref[0]][-1] == 4


def test_one_event_per_run_with_a_buffer_of_one(models):
    first = [(p, {"max_generated_tokens": 3}) for p in PROMPTS[:3]]
    ref, got = _both(models, first, capacity=1)
    assert got == ref
    mod, model = models["pg"]
    engine = mod.Engine(model)
    buf = engine.create_event_buffer(1)
    r = engine.create_request()
    r.begin_turn(np.array(PROMPTS[1], np.int32), _options(mod, r, {"max_generated_tokens": 2}))
    assert [len(engine.run(buf)) for _ in range(3)] == [1, 1, 0]


def _rewound(mod, model):
    engine = mod.Engine(model)
    buf = engine.create_event_buffer(8)
    r = engine.create_request()
    out = [[]]
    ids = []
    for tokens in ([285, 79, 339], [5, 6], [7]):
        ids.append(r.begin_turn(np.array(tokens, np.int32), _options(mod, r, {"max_generated_tokens": 3})))
        _drain(engine, buf, [r], out)
    with pytest.raises(RuntimeError) as unknown:
        r.rewind_to_start_of_turn(7)
    r.rewind_to_start_of_turn(ids[1])
    ids.append(r.begin_turn(np.array([9, 10], np.int32), _options(mod, r, {"max_generated_tokens": 3})))
    _drain(engine, buf, [r], out)
    return ids, out, str(unknown.value)


def test_rewind_to_the_start_of_a_turn(models):
    ref, got = (_rewound(*models[k]) for k in ("og", "pg"))
    assert got == ref
    assert ref[0] == [1, 2, 3, 4]


def _cancelled_and_closed(mod, model):
    engine = mod.Engine(model)
    buf = engine.create_event_buffer(8)
    a, b = engine.create_request(), engine.create_request()
    ta = a.begin_turn(np.array(PROMPTS[1], np.int32), _options(mod, a, {"max_generated_tokens": 6}))
    b.begin_turn(np.array(PROMPTS[3], np.int32), _options(mod, b, {"max_generated_tokens": 6}))
    out = [[], []]
    seen = [(e.request is a, e.token) for e in engine.run(buf)]
    flags = (a.cancel_turn(ta), a.cancel_turn(ta), a.cancel_turn(ta + 1))
    b.close()
    _drain(engine, buf, [a, b], out)
    with pytest.raises(RuntimeError) as e:
        b.begin_turn(np.array([5], np.int32), None)
    return seen, flags, out, str(e.value), engine.has_pending_requests()


def test_cancel_and_close(models):
    ref, got = (_cancelled_and_closed(*models[k]) for k in ("og", "pg"))
    assert got == ref
    assert ref[1] == (True, False, False)
    assert ref[2][0] == [(1, None, 2, 5, (3, 1))]  # CANCELLED after one token; the closed request says nothing


def _messages(mod, model):
    """What each misuse raises (or ``ok``)."""
    engine = mod.Engine(model)
    cases = {"temperature": {"temperature": -1.0}, "nan": {"temperature": float("nan")}, "top_p": {"top_p": 1.5},
             "top_k": {"top_k": -1}, "penalty": {"repetition_penalty": 0.0}, "ngram": {"no_repeat_ngram_size": -1},
             "min>max": {"min_generated_tokens": 5, "max_generated_tokens": 3}}
    out = {}
    for name, opts in cases.items():
        r = engine.create_request()
        try:
            r.begin_turn(np.array([5, 9], np.int32), _options(mod, r, opts))
            out[name] = "ok"
        except RuntimeError as e:
            out[name] = str(e)
        r.close()
    r, other = engine.create_request(), engine.create_request()
    calls = {"empty": lambda: r.begin_turn(np.array([], np.int32), None),
             "foreign": lambda: r.begin_turn(np.array([5], np.int32), mod.TurnOptions(other)),
             "too long": lambda: r.begin_turn(np.arange(1, 4097, dtype=np.int32) % 500, None),
             "stop strings": lambda: mod.TurnOptions(r).set_stop_strings(["a"] * 17),
             "empty stop": lambda: mod.TurnOptions(r).set_stop_strings([""]),
             "guidance": lambda: mod.TurnOptions(r).set_guidance("bogus", "{}")}
    for name, call in calls.items():
        try:
            call()
            out[name] = "ok"
        except RuntimeError as e:
            out[name] = str(e)
    r.begin_turn(np.array([5], np.int32), _options(mod, r, {"max_generated_tokens": 2}))
    for name, call in {"twice": lambda: r.begin_turn(np.array([5], np.int32), None),
                       "rewind active": lambda: r.rewind_to_start_of_turn(1)}.items():
        with pytest.raises(RuntimeError) as e:
            call()
        out[name] = str(e.value)
    r.close()
    return out


def test_enums_print_as_onnxruntime_genai_s(ort_genai):
    for name in ("FinishReason", "EngineErrorCode", "EngineEventFlags"):
        for member in getattr(ort_genai, name).__members__:
            assert str(getattr(getattr(pg, name), member)) == str(getattr(getattr(ort_genai, name), member))


def test_refusals_say_what_onnxruntime_genai_says(models):
    ref, got = (_messages(*models[k]) for k in ("og", "pg"))
    assert got == ref
    assert ref["temperature"] == "temperature (-1.000000) must be finite and 0 or greater."


def test_session_limit(tmp_path_factory, ort_genai):
    path = _package(tmp_path_factory, "short", **{"model.eos_token_id": EOS, "search.max_length": 12})
    found = []
    for mod, model in ((ort_genai, ort_genai.Model(path)), (pg, pg.Model(path, native="all"))):
        engine = mod.Engine(model)
        buf = engine.create_event_buffer(16)
        opts = mod.RequestOptions()
        opts.set_max_session_tokens(100)
        with pytest.raises(RuntimeError) as too_many:
            engine.create_request(options=opts)
        opts.set_max_session_tokens(10)
        r = engine.create_request(options=opts)
        r.begin_turn(np.array(PROMPTS[1], np.int32), None)
        out = [[]]
        _drain(engine, buf, [r], out)
        with pytest.raises(RuntimeError) as no_room:
            r.begin_turn(np.array([5, 6], np.int32), None)
        found.append((str(too_many.value), out, str(no_room.value)))
    assert found[1] == found[0]
    assert found[0][1][0][-1][3] == 4  # MAX_SESSION_TOKENS


def test_parked_conversations_give_blocks_back_under_pressure(tmp_path_factory, models, caplog):
    """Eight blocks of four positions, two requests at a time: a parked conversation's blocks go to the others
    and it is computed again when its next turn begins; the tokens do not change.  (onnxruntime-genai reads an
    ``engine.dynamic_batching`` section only beside its own paged decoder format, so its reference runs the
    package without the section.)"""
    path = _package(tmp_path_factory, "small", **{
        "model.eos_token_id": EOS, "engine.dynamic_batching": {"block_size": 4, "num_blocks": 8, "max_batch_size": 2}})
    first = [(PROMPTS[2], {"max_generated_tokens": 6}), (PROMPTS[1], {"max_generated_tokens": 8}),
             (PROMPTS[4], {"max_generated_tokens": 8})]
    turns = [(0, [5, 6], {"max_generated_tokens": 4}), (1, [9], {"max_generated_tokens": 3})]
    # onnxruntime-genai continues only the one resident request of a static batch: its reference is each
    # conversation alone
    ref = [_script(*models["og"], [first[i]], [(0, t, o) for j, t, o in turns if j == i])[0] for i in range(3)]
    model = pg.Model(path, native="all")
    with caplog.at_level("INFO", logger="pipeline.engine"):
        got = _script(pg, model, first, turns)
    assert got == ref
    assert "gave its blocks back" in caplog.text
    engine = pg.Engine(model)
    r = engine.create_request()
    r.begin_turn(np.array(PROMPTS[2], np.int32), _options(pg, r, {"max_generated_tokens": 2}))
    _drain(engine, engine.create_event_buffer(8), [r], [[]])
    assert engine._serving.pool.in_use() > 0   # parked with its blocks
    r.close()
    assert engine._serving.pool.in_use() == 0


def test_stop_strings_and_seeds(models):
    """Served on every package here (onnxruntime-genai serves them only with dynamic batching): the turn ends on
    the token whose text completes a stop string, which stays in the conversation."""
    mod, model = models["pg"]
    tok = mod.Tokenizer(model)
    plain = _script(mod, model, [(PROMPTS[1], {"max_generated_tokens": 8})])[0]
    tokens = [e[1] for e in plain]
    stop = tok.decode(np.array(tokens[2:4], np.int32))
    engine = mod.Engine(model)
    buf = engine.create_event_buffer(16)
    r = engine.create_request()
    opts = _options(mod, r, {"max_generated_tokens": 8})
    opts.set_stop_strings(["never there", stop])
    r.begin_turn(np.array(PROMPTS[1], np.int32), opts)
    events = []
    while engine.has_pending_requests():
        events += list(engine.run(buf))
    assert [e.token for e in events] == tokens[:4]
    last = events[-1]
    assert (int(last.flags), last.finish_reason, last.matched_stop_string_index) == (3, mod.FinishReason.STOP_STRING, 1)
    assert len(r._serving.tokens) == len(PROMPTS[1]) + 4

    def sampled(seed):
        return [e[1] for e in _script(mod, model, [(PROMPTS[6], {"max_generated_tokens": 8, "do_sample": True,
                                                                 "temperature": 1.5, "top_k": 0, "seed": seed})])[0]]
    assert sampled(5) == sampled(5)
    assert sampled(5) != sampled(6)


def test_cached_prompt_tokens_count_reused_prefix_blocks(models):
    """A prompt that shares 20 tokens with an earlier one takes its first full block (16 positions) from the prefix
    cache, as onnxruntime-genai's paged engine reports it; the tokens are those of the prompt alone."""
    mod, model = models["pg"]
    shared = list(range(30, 50))
    alone = _script(mod, model, [(shared + [7, 8], {"max_generated_tokens": 3})])[0]
    got = _script(mod, model, [(shared + [5, 6], {"max_generated_tokens": 3}),
                               (shared + [7, 8], {"max_generated_tokens": 3})])
    assert got[1][:-1] == alone[:-1]
    engine = mod.Engine(model)
    buf = engine.create_event_buffer(8)
    usage = []
    for tail in ([5, 6], [7, 8]):
        r = engine.create_request()
        r.begin_turn(np.array(shared + tail, np.int32), _options(mod, r, {"max_generated_tokens": 2}))
        events = []
        while engine.has_pending_requests():
            events += list(engine.run(buf))
        usage.append((events[-1].usage.prompt_tokens, events[-1].usage.cached_prompt_tokens))
    assert usage == [(22, 0), (22, 16)]


def test_hybrid_decoder_turns_equal_the_generator(ort_genai):
    """The qwen3.5 hybrid package (recurrent state beside the blocks): onnxruntime-genai's Engine cannot run its
    3-D positions, so the reference is its Generator over the whole conversation."""
    model = pg.Model(HYBRID, native="all")
    ref_model = ort_genai.Model(HYBRID)

    def generator(seq, n):
        g = ort_genai.Generator(ref_model, ort_genai.GeneratorParams(ref_model))
        g.append_tokens(np.array(seq, np.int32))
        out = []
        for _ in range(n):
            g.generate_next_token()
            out.append(int(g.get_next_tokens()[0]))
        return out

    got = _script(pg, model, [(PROMPTS[0], {"max_generated_tokens": 5}), (PROMPTS[2], {"max_generated_tokens": 4})],
                  [(0, [5, 6], {"max_generated_tokens": 3})])
    first = generator(PROMPTS[0], 5)
    assert [e[1] for e in got[0][:5]] == first
    assert [e[1] for e in got[0][5:]] == generator(PROMPTS[0] + first + [5, 6], 3)
    assert [e[1] for e in got[1]] == generator(PROMPTS[2], 4)


def test_refused_without_a_native_decoder_or_with_foreign_ids(models):
    with pytest.raises(RuntimeError, match="runs the decoder natively"):
        pg.Engine(pg.Model(LLAMA, native="none"))
    mod, model = models["pg"]
    engine = mod.Engine(model)
    r = engine.create_request()
    with pytest.raises(RuntimeError, match=r"outside the vocabulary \[0, 512\)"):
        r.begin_turn(np.array([5, 600], np.int32), None)
    assert not engine.has_pending_requests()
    with pytest.raises(RuntimeError, match="ready to decode"):
        r.set_draft_tokens(np.array([1], np.int32))


def test_stop_string_late_in_a_long_turn(models):
    """A stop string completed far into a turn (past the decoded tail's first width) ends it at the first token
    whose text, with the tokens before it, contains the string."""
    mod, model = models["pg"]
    tok = mod.Tokenizer(model)
    prompt, stop = PROMPTS[3], "it def"  # its greedy text holds "it def" once, about 50 tokens in
    tokens = [e[1] for e in _script(mod, model, [(prompt, {"max_generated_tokens": 60})])[0] if e[1] is not None]
    text = tok._tok.decode  # the engine's text: on past bytes that are not UTF-8 (og.Tokenizer.decode stops)
    end = next(j for j in range(len(tokens)) if stop in text(np.array(tokens[:j + 1], np.int32)))
    assert end > 4 * len(stop) + 8
    engine = mod.Engine(model)
    r = engine.create_request()
    opts = _options(mod, r, {"max_generated_tokens": 60})
    opts.set_stop_strings([stop])
    r.begin_turn(np.array(prompt, np.int32), opts)
    events = []
    while engine.has_pending_requests():
        events += list(engine.run(engine.create_event_buffer(64)))
    assert [e.token for e in events] == tokens[:end + 1]
    assert events[-1].finish_reason == mod.FinishReason.STOP_STRING


def test_speculative_statistics_and_draft_capacity_as_onnxruntime_genai(models):
    """Neither engine decodes speculatively: no draft tokens per proposal, and every statistic onnxruntime-genai
    reports, at zero."""
    engines = [mod.Engine(model) for mod, model in (models["og"], models["pg"])]
    assert engines[0].get_speculative_stats() == engines[1].get_speculative_stats()
    assert engines[0].max_draft_tokens_per_proposal() == engines[1].max_draft_tokens_per_proposal() == 0


# -- onnxruntime-genai's paged decoder format (fixtures/paged_format_package.py) -----------------------------------
PAGED_EOS = 10  # the closed-form decode reaches it after a few tokens from these prompts
PAGED_PROMPTS = [[5, 9, 13], [7, 2, 20, 4, 8, 9, 10], [5, 9, 13, 2, 3, 4, 6, 7, 11], [5, 9, 13, 2, 3, 4, 6, 7, 40, 41]]


@pytest.fixture(scope="module", params=["per_request", "per_token"])
def paged(request, tmp_path_factory, ort_genai):
    from fixtures.paged_format_package import build
    path = build(str(tmp_path_factory.mktemp(request.param)), per_token=request.param == "per_token",
                 eos=PAGED_EOS)
    return {"og": (ort_genai, ort_genai.Model(path)), "pg": (pg, pg.Model(path, native="all"))}


def test_paged_format_events_equal_onnxruntime_genai(paged):
    """Four requests in one batch (the last two sharing their first two blocks), turns ending on EOS and on the
    cap, then second turns: every event equal to onnxruntime-genai's, and the tokens those of the closed form."""
    from fixtures.paged_format_package import expected_tokens
    first = [(p, {"max_generated_tokens": 12 if k else 4}) for k, p in enumerate(PAGED_PROMPTS)]
    turns = [(0, [12], {"max_generated_tokens": 5}), (3, [PAGED_EOS, 7, 7], {"max_generated_tokens": 20})]
    ref, got = _both(paged, first, turns)
    assert got == ref
    tokens = lambda k, turn: [e[1] for e in ref[k] if e[0] == turn and e[1] is not None]  # noqa: E731
    for k, p in enumerate(PAGED_PROMPTS):
        assert tokens(k, 1) == expected_tokens(p, 12 if k else 4, PAGED_EOS)
    for k, extra, cap in turns:  # the second turn reads the whole conversation back from the blocks
        assert tokens(k, 2) == expected_tokens(PAGED_PROMPTS[k] + tokens(k, 1) + extra, cap["max_generated_tokens"],
                                               PAGED_EOS)
    assert {e[3] for r in ref for e in r} >= {1, 3}  # turns ended on EOS and on max_generated_tokens


def test_paged_format_is_refused_by_the_generator_and_checked_against_the_config(tmp_path):
    from fixtures.paged_format_package import build
    model = pg.Model(build(str(tmp_path / "p")), native="all")
    with pytest.raises(RuntimeError, match="paged format .* runs through og.Engine"):
        pg.Generator(model, pg.GeneratorParams(model))
    path = build(str(tmp_path / "b"))
    cfg_path = os.path.join(path, "genai_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["engine"]["dynamic_batching"]["block_size"] = 8
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match=r"has 4 at axis 1 .* engine.dynamic_batching.block_size is 8"):
        pg.Engine(pg.Model(path, native="all"))
    bad = build(str(tmp_path / "c"), config={"inputs": {"input_ids": "input_ids", "block_table": "block_table",
                                                        "cumulative_sequence_lengths": "cu_seqlens"}})
    with pytest.raises(ValueError, match=r"paged decoder format needs .* lacks \['cumulative_sequence_lengths'\]"):
        pg.Model(bad, native="all")


@pytest.mark.parametrize("window", [0, 6])
def test_paged_attention_decoder_equals_its_group_query_attention_twin(tmp_path, ort_genai, window):
    """A float16 decoder over com.microsoft PagedAttention (onnxruntime has no CPU kernel for it) through og.Engine,
    four requests at once, against onnxruntime-genai's Generator on its GroupQueryAttention twin (same weights),
    one prompt at a time; with ``window``, a sliding-window first layer on ``block_table_windowed``.  Tokens are
    compared while the reference's two best logits are more than ``GAP`` apart (about ten float16 steps: float16
    rounding may order a closer pair either way), at least six per prompt."""
    from fixtures.paged_attention_package import build
    GAP, N = 0.02, 12
    paged = build(str(tmp_path / "paged"), window=window)
    plain = build(str(tmp_path / "plain"), paged=False, window=window)
    prompts = [[5, 9, 13], [7, 2, 20, 4, 8, 9, 10, 11, 30, 31], [5, 9, 13, 2, 3, 4, 6, 7, 11], [50]]
    ref_model = ort_genai.Model(plain)
    ref = []
    for p in prompts:
        gp = ort_genai.GeneratorParams(ref_model)
        gp.set_search_options(max_length=len(p) + N)
        g = ort_genai.Generator(ref_model, gp)
        g.append_tokens(np.asarray(p, np.int32))
        steps = []
        while not g.is_done():
            top = np.sort(np.asarray(g.get_logits(), np.float32).reshape(-1))[-2:]
            g.generate_next_token()
            steps.append((int(g.get_next_tokens()[0]), float(top[1] - top[0])))
        ref.append(steps)
    model = pg.Model(paged, native="all")
    got = _script(pg, model, [(p, {"max_generated_tokens": N}) for p in prompts])
    from pipeline.paged import PagedDecoder
    assert not PagedDecoder(model.spec, 64, 4)._present_at  # the caches are written in place, never copied back
    for events, steps in zip(got, ref):
        clear = next((k for k, (_, gap) in enumerate(steps) if gap <= GAP), len(steps))
        assert clear >= 6
        assert [e[1] for e in events[:clear]] == [t for t, _ in steps[:clear]]
