"""The onnxruntime-genai API: over the composite VLM fixture, and side by side with onnxruntime-genai itself on
the bundled llama package."""
import json
import os

import numpy as np
import pytest

import pipeline as og
from pipeline.spec import RequestError
from fixtures import composite_vlm as V


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return V.build_package(str(tmp_path_factory.mktemp("vlm_api")))


@pytest.mark.parametrize("native", ["none", "all", "embedding,decoder"])
def test_generator_loop(package, native):
    model = og.Model(package, native=native)
    tok = og.Tokenizer(model)
    ids = tok.encode("t3 <image>")
    assert list(ids) == V.PROMPT_IDS
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 4, do_sample=False)
    params.set_inputs(pixel_values=V.PIXELS)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(gen.get_next_tokens()[0])
    assert out == V.EXPECTED
    assert gen.get_sequence(0).tolist() == V.PROMPT_IDS + V.EXPECTED
    assert tok.decode(out) == "t0 t5 t6 <image>"
    gen.rewind_to(3)  # keep [3, 7, 0] and regenerate
    gen.generate_next_token()
    assert gen.get_next_tokens()[0] == 5


def test_one_call_generate_and_stream(package):
    model = og.Model(package, native="all")
    assert og.generate(model, V.PROMPT_IDS, 4, inputs={"pixel_values": V.PIXELS}) == V.EXPECTED
    with pytest.raises(Exception, match="pixel_values"):
        og.generate(model, V.PROMPT_IDS, 4)  # the vision encoder's input is nobody's to invent
    pipe = model.pipeline
    streamed = []
    for t in pipe.tokens(V.PROMPT_IDS, 4, external={"pixel_values": V.PIXELS}):
        streamed.append(t)
    assert streamed == V.EXPECTED


def test_the_stream_says_done_with_its_last_token(package):
    """``Decoding.done`` turns True as the last token is yielded (an EOS here, the limit below), and the
    ``Generator`` stops on it: the stop rules are applied in one place."""
    model = og.Model(package, native="none")
    model.spec.eos_token_ids = [V.EXPECTED[2]]
    stream = model.pipeline.tokens(V.PROMPT_IDS, 4, external={"pixel_values": V.PIXELS})
    seen = [(t, stream.done) for t in stream]
    assert seen == [(V.EXPECTED[0], False), (V.EXPECTED[1], False), (V.EXPECTED[2], True)]
    stream = model.pipeline.tokens(V.PROMPT_IDS, 2, external={"pixel_values": V.PIXELS})
    assert [(t, stream.done) for t in stream] == [(V.EXPECTED[0], False), (V.EXPECTED[1], True)]
    params = og.GeneratorParams(model)
    params.set_inputs(pixel_values=V.PIXELS)
    gen = og.Generator(model, params)
    gen.append_tokens(V.PROMPT_IDS)
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(gen.get_next_tokens()[0])
    assert out == V.EXPECTED[:3]


def test_min_length_keeps_eos_out_of_the_stream(package):
    """The stream's EOS rule waits for ``min_length`` (prompt included): EOS is not picked before it."""
    import dataclasses
    model = og.Model(package, native="none")
    model.spec.eos_token_ids = [V.EXPECTED[2]]
    search = dataclasses.replace(model.spec.search, min_length=len(V.PROMPT_IDS) + 4)
    out = list(model.pipeline.tokens(V.PROMPT_IDS, 4, external={"pixel_values": V.PIXELS}, search=search))
    assert out[:2] == V.EXPECTED[:2] and len(out) == 4 and V.EXPECTED[2] not in out


def test_unknown_search_option_is_refused(package):
    params = og.GeneratorParams(og.Model(package))
    with pytest.raises(RuntimeError, match='Unknown value "top_kk"'):
        params.set_search_options(top_kk=3)


def test_impossible_requests_fail_at_once_with_onnxruntime_genais_words(package):
    model = og.Model(package)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=0)
    with pytest.raises(RuntimeError, match="search max_length is 0"):
        og.Generator(model, params)
    if model.spec.context_length:
        params.set_search_options(max_length=model.spec.context_length + 1)
        with pytest.raises(RuntimeError, match="cannot be greater than model context_length"):
            og.Generator(model, params)
    params.set_search_options(max_length=len(V.PROMPT_IDS))
    params.set_inputs(pixel_values=V.PIXELS)
    gen = og.Generator(model, params)
    with pytest.raises(RuntimeError, match=rf"input_ids size \({len(V.PROMPT_IDS) + 1}\) \+ current sequence length "
                                           rf"\(0\) exceeds max length \({len(V.PROMPT_IDS)}\)"):
        gen.append_tokens(V.PROMPT_IDS + [1])
    gen.append_tokens(V.PROMPT_IDS)
    with pytest.raises(RuntimeError, match="already at max_length"):
        gen.generate_next_token()
    pipe = model.pipeline
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        list(pipe.tokens(V.PROMPT_IDS, -1))
    with pytest.raises(ValueError, match="leaves no room to generate"):
        list(pipe.tokens(list(range(pipe.max_length)), 1))


def test_command_line_refuses_negative_token_counts(package, capsys):
    from pipeline.__main__ import main
    with pytest.raises(SystemExit) as exit_:
        main(["generate", package, "--max-new-tokens", "-3"])
    assert exit_.value.code == 2 and "expected a count >= 0, got -3" in capsys.readouterr().err


# -- side by side with onnxruntime-genai -------------------------------------------------------------

LLAMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "packages", "llama_fp32")
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<a>{% endif %}{{ eos_token }}")


def _session(api, **kw):
    """One walk through the API: every value onnxruntime-genai reports along the way."""
    m = api.Model(api.Config(LLAMA), **kw)
    tok = api.Tokenizer(m)
    ids = tok.encode("hello world")
    batch = tok.encode_batch(["hello", "hello world foo"])
    out = {"model": (m.type, m.device_type), "ids": (ids.dtype.name, ids.tolist()),
           "batch": (batch.shape(), batch.as_numpy().tolist(), tok.decode_batch(batch)),
           "special": (tok.to_token_id("hello"), tok.to_token_id("<s>"), tok.bos_token_id,
                       tok.eos_token_ids.tolist(), tok.pad_token_id),
           "chat": tok.apply_chat_template(json.dumps([{"role": "user", "content": "hi"}]), template_str=TEMPLATE)}
    params = api.GeneratorParams(m)
    params.set_search_options(max_length=24)
    g = api.Generator(m, params)
    g.append_tokens(ids)
    lg = g.get_logits()
    out["prefill"] = (g.token_count(), lg.shape, lg.dtype.name, int(lg.argmax()), g.get_output("logits").shape)
    steer = np.zeros_like(lg)
    steer[..., 7] = 1
    g.set_logits(steer)  # the next pick is 7
    g.generate_next_token()
    g.generate_next_token()
    nxt = g.get_next_tokens()
    g.append_tokens([5, 6])  # a second turn on top of the cached sequence
    for _ in range(3):
        g.generate_next_token()
    out["turns"] = (nxt.dtype.name, g.token_count(), g.get_sequence(0).dtype.name, g.get_sequence(0).tolist())
    g.rewind_to(5)
    g.append_tokens([79, 71])
    g.generate_next_token()
    out["rewound"] = g.get_sequence(0).tolist()
    return out


def test_the_api_reports_what_onnxruntime_genai_reports(ort_genai):
    want = _session(ort_genai)
    got = _session(og, native="all")
    assert got == want


def _batch(api, **kw):
    """Three prompts of different lengths, right-padded, in one batch; the first row ends at once."""
    m = api.Model(LLAMA, **kw)
    tok = api.Tokenizer(m)
    params = api.GeneratorParams(m)
    params.set_search_options(max_length=20, batch_size=3)
    g = api.Generator(m, params)
    g.append_tokens(tok.encode_batch(["hello", "hello world foo", "wor"]))
    lg = g.get_logits()
    lg[0, 0, 2] = 100.0  # EOS for the first row: it takes pads from then on
    g.set_logits(lg)
    while not g.is_done():
        g.generate_next_token()
    return [lg.shape] + [g.get_sequence(i).tolist() for i in range(3)]


def _eos_steps(api, case):
    """EOS steered into one row of one, into both rows of two at once, or into the two rows one after the other:
    the step that ends the last row is not appended (the sequences never hold it), rows that ended before hold
    their EOS and then pads, and ``get_next_tokens`` reports the step's tokens all the same."""
    m = api.Model(LLAMA)
    tok = api.Tokenizer(m)
    bs = 1 if case == "one" else 2
    params = api.GeneratorParams(m)
    params.set_search_options(max_length=16, batch_size=bs)
    g = api.Generator(m, params)
    g.append_tokens(tok.encode_batch(["hello", "wor"][:bs]))
    lg = g.get_logits()
    lg[0, 0, 2] = 100.0
    if case == "both":
        lg[1, 0, 2] = 100.0
    g.set_logits(lg)
    g.generate_next_token()
    if case == "in turn":
        g.generate_next_token()
        lg = g.get_logits()
        lg[1, 0, 2] = 100.0
        g.set_logits(lg)
        g.generate_next_token()
    return g.is_done(), [g.get_sequence(i).tolist() for i in range(bs)], g.get_next_tokens().tolist(), \
        g.token_count()


@pytest.mark.parametrize("case", ["one", "both", "in turn"])
def test_the_step_that_ends_the_last_row_is_not_appended(ort_genai, case):
    got = _eos_steps(og, case)
    assert got == _eos_steps(ort_genai, case)
    assert 2 in got[2]


@pytest.mark.parametrize("native", ["all", "none"])
def test_a_padded_batch_decodes_as_onnxruntime_genai_does(ort_genai, native):
    """Each row of a right-padded batch keeps its own length (mask, positions, cache rows): its tokens are the
    ones onnxruntime-genai gives, which are the ones the prompt gives alone."""
    assert _batch(og, native=native) == _batch(ort_genai)


def _with_position_ids(dst):
    """The llama package with learned absolute positions (GPT-2's): a ``position_ids`` input whose rows of a
    table are added to the token embeddings, so a row fed the wrong positions decodes differently."""
    import shutil
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    shutil.copytree(LLAMA, dst)
    path = os.path.join(dst, "model.onnx")
    m = onnx.load(path, load_external_data=False)
    g = m.graph
    emb = next(n for n in g.node if n.op_type == "Gather" and n.input[1] == "input_ids")
    hidden = next(t for t in g.initializer if t.name == emb.input[0]).dims[1]
    for n in g.node:
        n.input[:] = ["emb_plus_pos" if i == emb.output[0] else i for i in n.input]
    table = np.random.default_rng(0).standard_normal((64, hidden)).astype(np.float32)
    g.initializer.append(numpy_helper.from_array(table, "pos_table"))
    at = list(g.node).index(emb) + 1
    g.node.insert(at, helper.make_node("Gather", ["pos_table", "position_ids"], ["pos_emb"], name="pos_gather"))
    g.node.insert(at + 1, helper.make_node("Add", [emb.output[0], "pos_emb"], ["emb_plus_pos"], name="pos_add"))
    g.input.insert(2, helper.make_tensor_value_info("position_ids", TensorProto.INT64,
                                                    ["batch_size", "sequence_length"]))
    onnx.save(m, path)
    cfg = json.loads(open(os.path.join(dst, "genai_config.json")).read())
    cfg["model"]["decoder"]["inputs"]["position_ids"] = "position_ids"
    open(os.path.join(dst, "genai_config.json"), "w").write(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("native", ["all", "none"])
def test_a_padded_batch_feeds_each_row_its_own_position_ids(ort_genai, native, tmp_path, monkeypatch):
    """A decoder with a position_ids input: each row of a right-padded batch is fed its own positions, so its
    tokens are onnxruntime-genai's and the ones its prompt gives alone (per-node plan: no region to compile)."""
    monkeypatch.setenv("ONNX_NUMBA_COMPILED_REGIONS", "0")
    pkg = _with_position_ids(str(tmp_path / "llama_pos"))
    prompts = ["hello", "hello world foo bar baz", "wor"]

    def run(api, batch, **kw):
        m = api.Model(pkg, **kw)
        params = api.GeneratorParams(m)
        params.set_search_options(max_length=22, batch_size=len(batch))
        g = api.Generator(m, params)
        g.append_tokens(api.Tokenizer(m).encode_batch(batch))
        while not g.is_done():
            g.generate_next_token()
        return [g.get_sequence(i).tolist() for i in range(len(batch))]

    got = run(og, prompts, native=native)
    assert got == run(ort_genai, prompts)
    pad = og.Model(pkg, native="none").pad_token_id
    for row, prompt in zip(got, prompts):
        alone = run(og, [prompt], native=native)[0]
        real = [t for t in row if t != pad]
        assert real == alone[:len(real)]


def _beams(api, nb, nrs, early, penalty, eos_at=(), **kw):
    """Beam search on one prompt: each step's beam tokens, then the returned sequences.  At the steps in
    ``eos_at`` the first and last beams' logits are steered to EOS, so hypotheses end early."""
    m = api.Model(LLAMA, **kw)
    params = api.GeneratorParams(m)
    params.set_search_options(max_length=18, num_beams=nb, num_return_sequences=nrs, early_stopping=early,
                              length_penalty=penalty)
    g = api.Generator(m, params)
    g.append_tokens(api.Tokenizer(m).encode("hello world"))
    steps = []
    while not g.is_done():
        if len(steps) + 1 in eos_at:
            lg = g.get_logits()
            lg[0, 0, 2] = lg[0, 0].max() + 0.5
            lg[-1, 0, 2] = lg[-1, 0].max() + 3.0
            g.set_logits(lg)
        g.generate_next_token()
        steps.append(g.get_next_tokens().tolist())
    return steps, [g.get_sequence(i).tolist() for i in range(nrs)]


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("case", [(4, 4, False, 0.5, ()), (3, 2, False, 1.0, (3, 5, 6)), (4, 4, False, 3.0, (2, 6))])
def test_beam_search_scores_as_onnxruntime_genai_does(ort_genai, native, case):
    """Beams, their caches reordered each step, hypotheses ended by EOS and scored with the length penalty,
    early stopping and num_return_sequences: the tokens of every step and the sequences are onnxruntime-genai's."""
    got = _beams(og, *case[:4], eos_at=case[4], native=native)
    assert got == _beams(ort_genai, *case[:4], eos_at=case[4])
    assert len(got[0]) <= 18 - 7


def _batch_beams(api, **kw):
    """Beam search over a right-padded batch of three prompts, 3 beams each; EOS steered into the first beam
    of the first two prompts and the last beam of the last at steps 2 and 4."""
    m = api.Model(LLAMA, **kw)
    params = api.GeneratorParams(m)
    params.set_search_options(max_length=20, num_beams=3, num_return_sequences=2, length_penalty=2.0,
                              batch_size=3)
    g = api.Generator(m, params)
    g.append_tokens(api.Tokenizer(m).encode_batch(["hello world", "wor", "hello world foo"]))
    steps = []
    while not g.is_done():
        if len(steps) + 1 in (2, 4):
            lg = g.get_logits()
            for row, lift in ((0, 0.5), (3, 1.0), (8, 3.0)):
                lg[row, 0, 2] = lg[row, 0].max() + lift
            g.set_logits(lg)
        g.generate_next_token()
        steps.append(g.get_next_tokens().tolist())
    return steps, [g.get_sequence(i).tolist() for i in range(6)]


@pytest.mark.parametrize("native", ["all", "none"])
def test_beam_search_over_a_padded_batch_as_onnxruntime_genai_does(ort_genai, native):
    """Each prompt's beams are rows of one batch, reordered within the prompt's rows; every step's tokens and
    each prompt's sequences (pads where the batch put them) are onnxruntime-genai's."""
    got = _batch_beams(og, native=native)
    assert got == _batch_beams(ort_genai)
    assert len(got[0][0]) == 9


def test_sampling_with_beams_is_refused_as_onnxruntime_genai_refuses_it(ort_genai):
    for api in (og, ort_genai):
        m = api.Model(LLAMA, **({"native": "none"} if api is og else {}))
        params = api.GeneratorParams(m)
        params.set_search_options(max_length=20, num_beams=3, do_sample=True)
        with pytest.raises(RuntimeError, match="TopK and TopP cannot be used with a beam search"):
            api.Generator(m, params)
        params.set_search_options(top_k=1)  # a top-k of 1 is allowed: the beams then score greedily
        api.Generator(m, params)


@pytest.mark.parametrize("beams", [1, 3])
def test_no_repeat_ngram_size_as_onnxruntime_genai_applies_it(ort_genai, beams):
    def run(api, **kw):
        m = api.Model(LLAMA, **kw)
        params = api.GeneratorParams(m)
        params.set_search_options(max_length=30, no_repeat_ngram_size=2, num_beams=beams)
        g = api.Generator(m, params)
        g.append_tokens([285, 79, 339])
        while not g.is_done():
            g.generate_next_token()
        return g.get_sequence(0).tolist()
    got = run(og, native="all")
    assert got == run(ort_genai)
    pairs = list(zip(got, got[1:]))
    assert len(pairs) == len(set(pairs))  # greedy alone repeats (482, 482) on this package


def test_a_batch_pads_with_the_id_the_generator_reads_as_padding(tmp_path):
    """Without a pad id in genai_config.json, encode_batch and the generator still agree on one (the
    tokenizer's): each row decodes as its prompt does alone.  A row of nothing but pads is refused."""
    import shutil
    pkg = tmp_path / "nopad"
    shutil.copytree(LLAMA, pkg)
    cfg = json.loads((pkg / "genai_config.json").read_text())
    del cfg["model"]["pad_token_id"]
    (pkg / "genai_config.json").write_text(json.dumps(cfg))
    model = og.Model(str(pkg), native="none")
    tok = og.Tokenizer(model)
    prompts = ["hello", "hello world foo"]

    def run(batch, ids):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=16, batch_size=batch)
        g = og.Generator(model, params)
        g.append_tokens(ids)
        for _ in range(4):
            g.generate_next_token()
        return g
    g = run(2, tok.encode_batch(prompts))
    assert [g.get_sequence(i).tolist()[-4:] for i in range(2)] == \
        [run(1, tok.encode(p)).get_sequence(0).tolist()[-4:] for p in prompts]
    with pytest.raises(RequestError, match="row 0 holds only pads"):
        run(2, np.full((2, 3), model.pad_token_id, np.int32))


def test_rewind_keeps_the_prefix_and_continues_as_a_fresh_sequence():
    model = og.Model(LLAMA, native="all")
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16)
    g = og.Generator(model, params)
    g.append_tokens([285, 79, 339, 321, 272, 79, 71])
    for _ in range(3):
        g.generate_next_token()
    g.rewind_to(5)
    assert g.token_count() == 5
    for _ in range(3):
        g.generate_next_token()
    fresh = og.Generator(model, params)
    fresh.append_tokens([285, 79, 339, 321, 272])
    for _ in range(3):
        fresh.generate_next_token()
    assert g.get_sequence(0).tolist() == fresh.get_sequence(0).tolist()
    assert g.get_output("present.0.key").shape[2] == 7  # the cache's live rows: 8 tokens, the last one unfed


def test_search_options_as_onnxruntime_genai_reports_them(ort_genai):
    want = ort_genai.GeneratorParams(ort_genai.Model(LLAMA)).get_search_options()
    got = og.GeneratorParams(og.Model(LLAMA)).get_search_options()
    assert {k: v for k, v in got.items() if k in want} == want
    assert set(got) - set(want) == {"min_p"}  # this runtime's own option beside onnxruntime-genai's


def test_overlay_min_length_seed_and_what_one_sequence_refuses():
    cfg = og.Config(LLAMA)
    cfg.overlay(json.dumps({"search": {"max_length": 11}}))
    model = og.Model(cfg, native="all")
    params = og.GeneratorParams(model)
    assert params.search.max_length == 11
    params.set_search_options(min_length=12, max_length=24)
    g = og.Generator(model, params)
    g.append_tokens([285, 79, 339, 321, 272])
    lg = g.get_logits()
    lg[..., 2] = 100.0  # EOS on top: min_length must keep it out (onnxruntime-genai then picks 174)
    g.set_logits(lg)
    g.generate_next_token()
    assert g.get_next_tokens().tolist() == [174] and not g.is_done()

    def sample(seed):
        p = og.GeneratorParams(model)
        p.set_search_options(max_length=16, do_sample=True, random_seed=seed)
        gen = og.Generator(model, p)
        gen.append_tokens([285, 79, 339])
        while not gen.is_done():
            gen.generate_next_token()
        return gen.get_sequence(0).tolist()
    assert sample(3) == sample(3) and sample(3) != sample(4)
    p = og.GeneratorParams(model)
    p.set_search_options(num_beams=2, do_sample=True)
    with pytest.raises(RequestError, match="TopK and TopP cannot be used with a beam search"):
        og.Generator(model, p)
    p.set_search_options(num_beams=2, do_sample=False, num_return_sequences=3)
    with pytest.raises(RequestError, match="num_return_sequences"):
        og.Generator(model, p)


def test_chat_templates_render_as_hugging_face_does():
    from pipeline.chat_template import render
    msgs = [{"role": "user", "content": "h\u00e9"}]
    t = "{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}{{ tools | length }}"
    assert render(t, json.dumps(msgs), json.dumps([{"name": "f"}]), True, {"bos_token": "<s>"}) == \
        '<s>{"role": "user", "content": "h\u00e9"}1'
    with pytest.raises(ValueError, match="only user turns"):
        render("{{ raise_exception('only user turns') }}", msgs)
    with pytest.raises(ValueError, match="list of objects"):
        render(t, json.dumps({"role": "user"}))


# -- the command line ---------------------------------------------------------------------------------

def _chat_package(tmp_path):
    """The llama package with a chat template in its tokenizer_config.json."""
    import shutil
    pkg = tmp_path / "chat"
    shutil.copytree(LLAMA, pkg)
    cfg = json.loads((pkg / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (pkg / "tokenizer_config.json").write_text(json.dumps(cfg))
    return str(pkg)


def test_generate_streams_the_text_of_its_tokens(capsys):
    from pipeline.__main__ import main
    assert main(["generate", LLAMA, "--prompt", "hello world", "--max-new-tokens", "6", "--native", "none"]) == 0
    text, ids = capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)
    ids = json.loads(ids.split(": ", 1)[1])
    assert len(ids) == 6 and text == og.Tokenizer(og.Model(LLAMA, native="none")).decode(ids)


def test_a_batch_file_decodes_as_one_batch_with_each_prompts_tokens(tmp_path, capsys, monkeypatch):
    from pipeline.__main__ import main
    prompts = ["hello", "hello world foo", "wor"]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n")
    base = ["generate", LLAMA, "--max-new-tokens", "4", "--native", "none"]
    alone = []
    for p in prompts:
        assert main(base + ["--prompt", p]) == 0
        alone.append(capsys.readouterr().out.rsplit("token_ids: ", 1)[1].strip())
    calls = []
    real = og.Generator.append_tokens
    monkeypatch.setattr(og.Generator, "append_tokens", lambda g, ids: (calls.append(g.batch), real(g, ids))[1])
    assert main(base + ["--batch-file", str(tmp_path / "p.txt")]) == 0
    out = capsys.readouterr().out
    assert calls == [3] and [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("token_ids")] == alone


def test_chat_continues_the_cached_conversation(tmp_path, capsys, monkeypatch):
    """``--chat`` renders the template; without a prompt it converses, each turn fed on top of the last."""
    from pipeline import __main__ as cli
    pkg = _chat_package(tmp_path)
    assert cli.main(["generate", pkg, "--chat", "--prompt", "hi", "--max-new-tokens", "3", "--native", "none"]) == 0
    first = json.loads(capsys.readouterr().out.rsplit("token_ids: ", 1)[1])
    fed = []
    real = og.Generator.append_tokens
    monkeypatch.setattr(og.Generator, "append_tokens", lambda g, ids: (fed.append(len(ids)), real(g, ids))[1])
    turns = iter(["hi", "more"])

    def user(prompt=""):
        line = next(turns, None)
        if line is None:
            raise EOFError
        return line
    monkeypatch.setattr("builtins.input", user)
    assert cli.main(["generate", pkg, "--chat", "--max-new-tokens", "3", "--native", "none"]) == 0
    tok = og.Tokenizer(og.Model(pkg, native="none"))
    whole = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi"},
                                                {"role": "assistant", "content": tok.decode(first)},
                                                {"role": "user", "content": "more"}]))
    assert fed[0] == len(tok.encode("<user>hi<a></s>")) and fed[1] < len(whole)  # the second turn: only what is new


def test_generate_decodes_speculatively_with_the_same_tokens(capsys, monkeypatch):
    """``--ngram-size`` (and ``--draft-tokens``) decode speculatively; the tokens are plain decoding's."""
    from pipeline.__main__ import main
    from pipeline.speculative import Speculator
    base = ["generate", LLAMA, "--prompt-ids", "5,7,9,11,5,7,9", "--max-new-tokens", "12", "--native", "none"]
    assert main(base) == 0
    plain = capsys.readouterr().out.rsplit("token_ids: ", 1)[1]
    rounds = []
    real = Speculator.round
    monkeypatch.setattr(Speculator, "round", lambda self: (rounds.append(1), real(self))[1])
    assert main(base + ["--ngram-size", "2", "--draft-tokens", "3"]) == 0
    assert capsys.readouterr().out.rsplit("token_ids: ", 1)[1] == plain and rounds


@pytest.mark.parametrize("argv,words", [
    (["--ngram-size", "1"], "speculative.ngram_size must be 0 or between 2 and 16. Got: 1."),
    (["--max-length", "4"], "exceeds max length (4)"),
    (["--max-length", "99999"], "cannot be greater than model context_length"),
    (["--chat"], "Empty chat template."),
    (["--device", "tpu"], "device='tpu'"),
])
def test_command_line_mistakes_are_one_line_and_status_2(argv, words, capsys):
    from pipeline.__main__ import main
    assert main(["generate", LLAMA, "--prompt", "hello world", "--native", "none"] + argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_terminate_session_run_option(ort_genai):
    """``set_runtime_option("terminate_session", "1")`` stops every later model run with onnxruntime-genai's
    message; "0" lets the generator go on; the tokens before and after are onnxruntime-genai's."""
    found = []
    for mod in (ort_genai, og):
        model = mod.Model(LLAMA) if mod is ort_genai else og.Model(LLAMA, native="all")
        params = mod.GeneratorParams(model)
        params.set_search_options(max_length=20)
        g = mod.Generator(model, params)
        g.append_tokens(np.array([[5, 9, 13]], np.int32))
        g.generate_next_token()
        g.set_runtime_option("terminate_session", "1")
        with pytest.raises(RuntimeError) as e:
            g.generate_next_token()
        g.set_runtime_option("terminate_session", "0")
        g.generate_next_token()
        found.append((str(e.value), g.get_sequence(0).tolist()))
    assert found[1] == found[0]
    assert og.TokenizerStream is not None


def test_tool_and_reasoning_tag_ids(tmp_path, ort_genai):
    """``bot/eot/bor/eor_token_id``: the genai_config's values, else onnxruntime-genai's by model type (qwen2 has
    tool-call tags, no reasoning ones), else its "not defined" error."""
    import json
    import shutil
    folders = []
    for name, change in (("tags", dict(bot_token_id=5, eot_token_id=6, bor_token_id=7, eor_token_id=8)),
                         ("qwen2", dict(type="qwen2")), ("plain", {})):
        folder = str(tmp_path / name)
        shutil.copytree(LLAMA, folder)
        cfg = os.path.join(folder, "genai_config.json")
        with open(cfg) as fh:
            doc = json.load(fh)
        doc["model"].update(change)
        with open(cfg, "w") as fh:
            json.dump(doc, fh)
        folders.append(folder)
    found = []
    for mod in (ort_genai, og):
        got = []
        for folder in folders:
            tok = mod.Tokenizer(mod.Model(folder))
            for key in ("bot_token_id", "eot_token_id", "bor_token_id", "eor_token_id"):
                try:
                    got.append(getattr(tok, key))
                except RuntimeError as e:
                    got.append(str(e))
        found.append(got)
    assert found[1] == found[0]
    assert found[0][:6] == [5, 6, 7, 8, 151657, 151658]


@pytest.mark.parametrize("native", ["none", "all"])
def test_a_model_given_in_memory_decodes_as_onnxruntime_genai_does(ort_genai, native, tmp_path):
    import shutil
    folder = tmp_path / "pkg"
    shutil.copytree(LLAMA, folder)
    data = (folder / "model.onnx").read_bytes()
    (folder / "model.onnx").unlink()            # only the bytes remain; model.onnx.data stays in the folder

    def decode(lib, **kw):
        cfg = lib.Config(str(folder))
        cfg.add_model_data("model.onnx", memoryview(data))
        model = lib.Model(cfg, **kw)
        cfg.remove_model_data("model.onnx")     # the model keeps what it loaded
        params = lib.GeneratorParams(model)
        params.set_search_options(max_length=14)
        g = lib.Generator(model, params)
        g.append_tokens(np.array([[285, 79, 339]], np.int32))
        while not g.is_done():
            g.generate_next_token()
        return g.get_sequence(0).tolist()
    assert decode(og, native=native) == decode(ort_genai)
    cfg = og.Config(str(folder))
    from pipeline.spec import IncompletePackageError
    with pytest.raises(IncompletePackageError, match="model.onnx' is missing"):
        og.Model(cfg)
    for bad, words in ((b"", "Received nullptr or zero length"), ("text", "Expected bytes or buffer"),
                       (np.zeros((2, 2), np.uint8), "Expected a 1D buffer of uint8_t")):
        with pytest.raises(RuntimeError, match=words):
            cfg.add_model_data("model.onnx", bad)
    cfg.add_model_data("model.onnx", data)
    with pytest.raises(RuntimeError, match="was already added previously"):
        cfg.add_model_data("model.onnx", data)
    with pytest.raises(RuntimeError, match="Model data for 'x.onnx' was not found."):
        cfg.remove_model_data("x.onnx")


def test_device_filters_are_checked_and_recorded_as_onnxruntime_genai_does(ort_genai):
    """``Config.set_decoder_provider_options_hardware_*``: the type name is checked with onnxruntime-genai's
    message; the filters do not stop the CPU provider from loading, in either runtime."""
    for prov in ("cpu", "CPUExecutionProvider"):
        for setter, value in (("device_type", "GPU"), ("device_type", "npu"), ("device_id", 5), ("vendor_id", 7)):
            loaded = []
            for mod in (ort_genai, og):
                c = mod.Config(LLAMA)
                c.clear_providers()
                c.append_provider(prov)
                getattr(c, f"set_decoder_provider_options_hardware_{setter}")(prov, value)
                getattr(c, f"clear_decoder_provider_options_hardware_{setter}")(prov)
                getattr(c, f"set_decoder_provider_options_hardware_{setter}")(prov, value)
                loaded.append(mod.Model(c).device_type)
            assert loaded[0] == loaded[1] == "CPU"
        for mod in (ort_genai, og):
            c = mod.Config(LLAMA)
            c.set_decoder_provider_options_hardware_device_type(prov, "tpu")  # not appended: nothing set
            c.clear_providers()
            c.append_provider(prov)
            with pytest.raises(RuntimeError, match="^Unsupported hardware device type: tpu$"):
                c.set_decoder_provider_options_hardware_device_type(prov, "tpu")
    c = og.Config(LLAMA)
    c.append_provider("cpu")
    c.set_decoder_provider_options_hardware_device_type("cpu", "GPU")
    c.set_decoder_provider_options_hardware_vendor_id("cpu", 4318)
    c.clear_decoder_provider_options_hardware_vendor_id("cpu")
    assert c.provider_options["cpu"]["device_filtering_options"] == {"hardware_device_type": "gpu"}


def test_bytes_that_are_not_utf8_decode_as_onnxruntime_genai_does(ort_genai):
    """Byte-level tokens that leave UTF-8 incomplete or invalid (lone continuation bytes, a lead byte followed by
    ASCII, a NUL): ``decode`` and a stream give onnxruntime-genai's text, on crafted and random id sequences."""
    ours, theirs = og.Tokenizer(og.Model(LLAMA)), ort_genai.Tokenizer(ort_genai.Model(LLAMA))
    a, b, c3, a9, e2, x82, xac, nul = 68, 69, 131, 106, 162, 228, 109, 192  # bytes 0xC3, 0xA9, 0xE2 0x82 0xAC, 0x00
    cases = [[a, a9, a, b], [a, c3, a, b, c3, a9], [c3, a9, a9, a], [a, e2, x82, xac, b], [a, e2, x82, a, b],
             [a, e2, a, b], [a, b, a9], [c3], [nul, a], [a, nul, b, a9], [0, a, 1, c3, 2, a9]]
    rng = np.random.default_rng(5)
    cases += [rng.integers(0, 512, int(rng.integers(1, 12))).tolist() for _ in range(40)]
    for ids in cases:
        s1, s2 = ours.create_stream(), theirs.create_stream()
        assert ours.decode(np.array(ids, np.int32)) == theirs.decode(np.array(ids, np.int32)), ids
        assert [s1.decode(i) for i in ids] == [s2.decode(i) for i in ids], ids
