"""Moonshine streaming speech recognition (``streaming_enc_dec_asr`` packages, ``pipeline/moonshine_streaming.py``,
fixture ``fixtures/moonshine_streaming_package.py``): a clip of speech and pauses streamed in pieces and flushed,
natively and on onnxruntime, against onnxruntime-genai in the same test: the processor's chunks and flags, the
tokens of every step, the sequence and the text; its options, the errors, the config's checks."""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import pipeline as og
from streaming_steps import chunk_steps
from fixtures import moonshine_streaming_package as M
from fixtures import nemotron_speech_package as N


def _clip():
    """Speech 0.7 s, a pause 0.4 s, speech 0.1 s, a pause 0.2 s, speech 0.43 s (18 whole chunks and a part): with
    the detector, a segment closed by the token budget's memory cap, one closed by a pause, silence before speech,
    and a short pause inside a segment."""
    return np.concatenate([N.signal(0.7), N.silence(0.4, seed=3), N.signal(0.1, seed=1), N.silence(0.2, seed=4),
                           N.signal(0.43, seed=2)])


# config overlays, each taking the loop down other branches (see test_the_variants_take_different_paths)
VARIANTS = {"plain": (False, None),
            "vad": (True, None),
            "vad_long_segments": (True, {"model": {"moonshine": {"min_segment_memory_frames": 1000,
                                                                 "max_segment_memory_frames": 0}}}),
            "lookahead": (False, {"model": {"moonshine": {"total_lookahead": 12, "left_context_frames": 0}}}),
            "few_tokens": (True, {"model": {"moonshine": {"max_seq_len": 3, "tokens_per_second": 35.0}}})}
_STEP_LIMIT = 100   # a chunk hands out at most max_seq_len tokens, one a step: a loop that never ends fails


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    return {vad: M.build(str(tmp_path_factory.mktemp("moonshine")), vad=vad) for vad in (False, True)}


def _model(api, path, overlay=None, native=None):
    config = api.Config(path)
    if overlay:
        config.overlay(json.dumps(overlay))
    return api.Model(config) if native is None else api.Model(config, native=native)


def _stream(api, model, pieces, options=()):
    """(per call: None or the chunk's (samples, is_silent, is_final); the tokens of every step per chunk; the
    sequence; the text streamed; the sequence decoded): onnxruntime-genai's example loop."""
    processor = api.StreamingProcessor(model)
    for key, value in options:
        processor.set_option(key, value)
    tokenizer = api.Tokenizer(model)
    stream = tokenizer.create_stream()
    generator = api.Generator(model, api.GeneratorParams(model))
    chunks, steps, text = [], [], ""
    for inputs in [processor.process(p) for p in pieces] + [processor.flush()]:
        if inputs is None:
            chunks.append(None)
            continue
        chunks.append((np.array(inputs["audio_chunk"].as_numpy()), int(inputs["is_silent"].as_numpy()[0]),
                       int(inputs["is_final"].as_numpy()[0])))
        generator.set_inputs(inputs)
        chunk, more = chunk_steps(generator, stream, _STEP_LIMIT)
        text += more
        steps.append(chunk)
    seq = generator.get_sequence(0)
    assert generator.token_count() == len(seq)
    return chunks, steps, [int(t) for t in seq], text, tokenizer.decode(seq)


def _pieces(x, size=1000):
    return [x[i:i + size] for i in range(0, len(x), size)]


def _same_chunks(mine, theirs):
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        assert (a is None) == (b is None)
        if a is not None:
            assert a[0].dtype == b[0].dtype == np.float32
            np.testing.assert_array_equal(a[0], b[0])
            assert a[1:] == b[1:]


@pytest.fixture(scope="module")
def reference(packages, ort_genai):
    """onnxruntime-genai's run of each variant, once per module."""
    return {name: _stream(ort_genai, _model(ort_genai, packages[vad], overlay), _pieces(_clip()))
            for name, (vad, overlay) in VARIANTS.items()}


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tokens_are_onnxruntime_genai_s(packages, reference, native, variant):
    vad, overlay = VARIANTS[variant]
    model = _model(og, packages[vad], overlay, native)
    assert set(model.transducer.backends.values()) == {"native" if native == "all" else "ort"}
    chunks, steps, seq, text, decoded = _stream(og, model, _pieces(_clip()))
    ref_chunks, ref_steps, ref_seq, ref_text, ref_decoded = reference[variant]
    _same_chunks(chunks, ref_chunks)
    assert steps == ref_steps
    assert seq == ref_seq and text == ref_text and decoded == ref_decoded


def test_the_variants_take_different_paths(reference):
    """The reference runs are not trivial: tokens in several chunks, chunks without, segments closed with many
    tokens at once, pauses flagged by the detector; and each variant's tokens differ from the others'."""
    chunks, steps, seq, _, _ = reference["plain"]
    assert len(seq) >= 20 and len(set(seq)) >= 8
    per_chunk = [sum(len(s) for s in chunk) for chunk in steps]
    assert per_chunk.count(0) >= 3 and max(per_chunk) >= 6 and sum(1 for n in per_chunk if 0 < n < 4) >= 2
    assert [c[1] for c in chunks if c is not None] == [0] * 19 and chunks[-1][2] == 1
    silent = [c[1] for c in reference["vad"][0] if c is not None]
    assert silent[7:11] == [1, 1, 1, 1] and silent[12:14] == [1, 1] and silent.count(1) == 6
    seqs = {name: tuple(r[2]) for name, r in reference.items()}
    assert len(set(seqs.values())) == len(seqs)
    assert max(sum(len(s) for s in chunk) for chunk in reference["few_tokens"][1]) <= 3


def test_pieces_of_any_size(packages, ort_genai):
    """Uneven pieces: one chunk is cut per call (the rest waits); flush sends the rest, or an empty final chunk."""
    sizes = [700, 2500, 100, 4000, 1, 0, 1599, 3300, 5000, 9000]
    clip, pieces, at = _clip(), [], 0
    for s in sizes:
        pieces.append(clip[at:at + s])
        at += s
    runs = [_stream(api, _model(api, packages[True]), pieces) for api in (og, ort_genai)]
    _same_chunks(runs[0][0], runs[1][0])
    assert runs[0][1:] == runs[1][1:]

    def flushes(api):
        model = _model(api, packages[True])
        p, g = api.StreamingProcessor(model), api.Generator(model, api.GeneratorParams(model))
        out = []
        for inputs in (p.flush(), p.process(np.zeros(10, np.float64)), p.flush(), p.flush()):
            out.append(None if inputs is None else [inputs["audio_chunk"].as_numpy().shape,
                                                    int(inputs["is_final"].as_numpy()[0])])
            if inputs is not None:
                g.set_inputs(inputs)
                while not g.is_done():
                    g.generate_next_token()
        return out, [int(t) for t in g.get_sequence(0)]

    assert flushes(og) == flushes(ort_genai)


def test_options_are_onnxruntime_genai_s(packages, ort_genai):
    def session(api, path):
        p = api.Model(path).create_streaming_processor()
        log = []
        for op in [("get", "use_vad"), ("get", "vad_threshold"), ("get", "silence_duration_ms"), ("get", "nope"),
                   ("set", "vad_threshold", "0.97"), ("get", "vad_threshold"), ("set", "use_vad", "false"),
                   ("get", "use_vad"), ("set", "use_vad", "maybe"), ("set", "use_vad", "1"),
                   ("set", "prefix_padding_ms", "250"), ("get", "prefix_padding_ms"), ("set", "nope", "1")]:
            try:
                log.append(p.get_option(op[1]) if op[0] == "get" else p.set_option(op[1], op[2]))
            except RuntimeError as e:
                log.append(("error", str(e)))
        return log

    for path in packages.values():
        assert session(og, path) == session(ort_genai, path)
    # a detector turned off by option flags no chunk; a threshold of 0.97 flags more of them
    for options in ([("use_vad", "false")], [("vad_threshold", "0.97")]):
        runs = [_stream(api, _model(api, packages[True]), _pieces(_clip()), options) for api in (og, ort_genai)]
        _same_chunks(runs[0][0], runs[1][0])
        assert runs[0][1:] == runs[1][1:]


def test_generator_calls_are_onnxruntime_genai_s(packages, ort_genai):
    def calls(api):
        out = []

        def attempt(f):
            try:
                r = f()
                out.append(None if r is None else r if isinstance(r, (bool, int)) else np.asarray(r).tolist())
            except RuntimeError as e:
                out.append(("error", str(e)))

        model = api.Model(packages[False])
        g = api.Generator(model, api.GeneratorParams(model))
        for f in (g.is_done, g.generate_next_token, g.get_next_tokens, lambda: g.get_sequence(0), g.token_count,
                  lambda: api.StreamingProcessor(model).process(np.zeros((2, 10), np.float32)),
                  model.create_multimodal_processor):
            attempt(f)
        p = api.StreamingProcessor(model)
        g.set_inputs(p.process(_clip()[:2 * M.CHUNK_SAMPLES]))
        attempt(g.is_done)
        g.set_inputs(p.process(np.zeros(0, np.float32)))   # the second chunk, queued: the last one given wins
        for f in (g.is_done, g.generate_next_token, g.get_next_tokens, lambda: g.get_output("logits"),
                  lambda: g.get_input("token"), lambda: g.rewind_to(0), lambda: g.set_runtime_option("lang_id", "1")):
            attempt(f)
        other = api.NamedTensors()
        other["something"] = np.zeros(3, np.float32)   # no audio_chunk: nothing to run
        g.set_inputs(other)
        for f in (g.is_done, g.generate_next_token, g.is_done, lambda: g.get_sequence(0)):
            attempt(f)
        return out

    assert calls(og) == calls(ort_genai)


def test_native_components_by_name(packages):
    model = og.Model(packages[True], native="all")
    assert model.transducer.backends == {c: "native" for c in ("frontend", "encoder", "adapter", "cross_kv",
                                                               "decoder_kv", "vad")}
    assert og.Model(packages[False], native="decoder_kv").transducer.backends == \
        {"frontend": "ort", "encoder": "ort", "adapter": "ort", "cross_kv": "ort", "decoder_kv": "native"}
    with pytest.raises(ValueError, match="unknown component"):
        og.Model(packages[False], native="joiner")


def _edited(tmp_path, name, cfg_edit=None, graph_edit=None):
    folder = M.build(str(tmp_path / name))
    if cfg_edit:
        path = f"{folder}/genai_config.json"
        cfg = json.load(open(path))
        cfg_edit(cfg["model"])
        json.dump(cfg, open(path, "w"))
    if graph_edit:
        comp, input_name, elem, cast_to = graph_edit
        m = onnx.load(f"{folder}/{M.FILES[comp]}")
        for i in m.graph.input:
            if i.name == input_name:
                i.type.tensor_type.elem_type = elem
        for node in m.graph.node:
            node.input[:] = [f"{x}_cast" if x == input_name else x for x in node.input]
        m.graph.node.insert(0, helper.make_node("Cast", [input_name], [f"{input_name}_cast"], to=cast_to))
        onnx.save(m, f"{folder}/{M.FILES[comp]}")
    return folder


def test_load_errors_are_onnxruntime_genai_s(tmp_path, ort_genai):
    """onnxruntime-genai's rules on the models' types and the config's file names, in its words."""
    cases = {"no_adapter_file": (lambda m: m["moonshine"].pop("adapter_filename"), None),
             "int32_sample_len": (None, ("frontend", "sample_len", TensorProto.INT32, TensorProto.INT64)),
             "int32_token": (None, ("decoder_kv", "token", TensorProto.INT32, TensorProto.INT64)),
             "float16_audio": (None, ("frontend", "audio_chunk", TensorProto.FLOAT16, TensorProto.FLOAT)),
             "float16_features": (None, ("encoder", "features", TensorProto.FLOAT16, TensorProto.FLOAT))}
    for name, (cfg_edit, graph_edit) in cases.items():
        folder = _edited(tmp_path, name, cfg_edit, graph_edit)
        messages = []
        for api in (og, ort_genai):
            with pytest.raises(RuntimeError if api is ort_genai else ValueError) as info:
                api.Model(folder)
            messages.append(str(info.value))
        assert messages[0] == messages[1], name


def test_renamed_ports_and_config_errors(tmp_path, ort_genai):
    """Graph names the config maps (``model.moonshine.<model>.inputs`` / ``outputs``) run as the defaults do; a
    name the graph lacks, an unknown key and an unknown port are refused at load, naming the key."""
    from pipeline.spec import MetadataError
    folder = M.build(str(tmp_path / "renamed"))
    for comp, old, new in (("adapter", "pos_offset", "offset"), ("decoder_kv", "out_k_self", "present_k")):
        m = onnx.load(f"{folder}/{M.FILES[comp]}")
        for vi in list(m.graph.input) + list(m.graph.output):
            vi.name = new if vi.name == old else vi.name
        for node in m.graph.node:
            node.input[:] = [new if x == old else x for x in node.input]
            node.output[:] = [new if x == old else x for x in node.output]
        onnx.save(m, f"{folder}/{M.FILES[comp]}")
    cfg = json.load(open(f"{folder}/genai_config.json"))
    cfg["model"]["moonshine"].update({"adapter": {"inputs": {"pos_offset": "offset"}},
                                      "decoder_kv": {"outputs": {"k_self": "present_k"}}})
    json.dump(cfg, open(f"{folder}/genai_config.json", "w"))
    pieces = _pieces(_clip()[:8 * M.CHUNK_SAMPLES])
    runs = [_stream(api, _model(api, folder, native=native), pieces)
            for api, native in ((og, "all"), (ort_genai, None))]
    assert runs[0][1:] == runs[1][1:] and len(runs[0][2]) >= 5
    for edit, words in ((lambda m: m["moonshine"].update(adapter={"inputs": {"pos_offset": "nope"}}),
                         "model.moonshine.adapter.inputs.pos_offset: 'nope' is not among"),
                        (lambda m: m["moonshine"].update(bogus=1), "model.moonshine.bogus: not a key"),
                        (lambda m: m["moonshine"].update(adapter={"inputs": {"nope": "x"}}),
                         "model.moonshine.adapter.inputs.nope: not one of"),
                        (lambda m: m["moonshine"].update(max_seq_len="long"),
                         "model.moonshine.max_seq_len: expected a number"),
                        (lambda m: m["moonshine"].update(adapter_filename="gone.onnx"),
                         "model.moonshine.adapter_filename: .* does not exist")):
        bad = _edited(tmp_path, f"bad{abs(hash(words))}", edit)
        with pytest.raises(MetadataError, match=words):
            og.Model(bad)
