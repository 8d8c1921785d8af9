"""Streaming speech recognition of ``nemotron_speech`` packages (``pipeline/streaming_asr.py``, fixture
``fixtures/nemotron_speech_package.py``): the clip streamed in chunks and flushed, as onnxruntime-genai's example
does, natively and on onnxruntime, against onnxruntime-genai in the same test: the symbols of every step, the
sequence, the text, the processor's features, its options and the errors."""
import json

import numpy as np
import pytest

import pipeline as og
from streaming_steps import chunk_steps
from fixtures import nemotron_speech_package as N
from fixtures import whisper_package as W

# Tolerance of the log-mel features, fixed from the arithmetic before comparing: onnxruntime-genai's FFT is a
# float32 one, numpy's a double one, so a band's power carries float32 rounding relative to the frame's largest
# bin, not to itself; the clip's quietest bands hold ~1e-7 of their frame's peak power, where that moves the log
# by ~1e-5 (2.05e-5 seen on this clip; a float32 kiss FFT and float32 sums here moved no maximum, so the rest is
# onnxruntime-genai's own rounding).  1e-4 on values in [-17, 1].  Shapes, counts, and the pre-encode cache
# (zeros first, then the previous chunk's last frames) are compared exactly.
FEATURE_ATOL = 1e-4

# Overlays of the package's config, each exercising one branch of the decode loop differently.
VARIANTS = {"plain": None, "blank_penalty": {"search": {"blank_penalty": -1.5}},
            "one_symbol": {"model": {"max_symbols_per_step": 1}},
            "many_symbols": {"model": {"max_symbols_per_step": 6}}}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return N.build(str(tmp_path_factory.mktemp("nemotron")))


def _model(api, path, overlay=None, native=None):
    config = api.Config(path)
    if overlay:
        config.overlay(json.dumps(overlay))
    return api.Model(config) if native is None else api.Model(config, native=native)


_STEP_LIMIT = 200   # a chunk's frames times (max_symbols_per_step + 1) is far below: a loop that never ends fails


def _stream(api, model, pieces):
    """(features of each chunk, symbols of each step per chunk, the sequence, the text) of the clip cut into
    ``pieces``, then flushed: onnxruntime-genai's example loop."""
    processor = api.StreamingProcessor(model)
    tokenizer = api.Tokenizer(model)
    stream = tokenizer.create_stream()
    generator = api.Generator(model, api.GeneratorParams(model))
    features, steps, text = [], [], ""

    def decode(inputs):
        nonlocal text
        features.append(np.array(inputs["audio_features"].as_numpy()))
        generator.set_inputs(inputs)
        chunk, more = chunk_steps(generator, stream, _STEP_LIMIT)
        text += more
        steps.append(chunk)

    for piece in pieces:
        inputs = processor.process(piece)
        if inputs is not None:
            decode(inputs)
    inputs = processor.flush()
    if inputs is not None:
        decode(inputs)
    seq = generator.get_sequence(0)
    return features, steps, [int(t) for t in seq], text, tokenizer.decode(seq)


def _chunks(x, size=N.CHUNK_SAMPLES):
    return [x[i:i + size] for i in range(0, len(x), size)]


@pytest.fixture(scope="module")
def reference(package, ort_genai):
    """onnxruntime-genai's run of each variant, once per module."""
    clip = N.signal()
    return {name: _stream(ort_genai, _model(ort_genai, package, overlay), _chunks(clip))
            for name, overlay in VARIANTS.items()}


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_symbols_and_text_are_onnxruntime_genai_s(package, reference, native, variant):
    model = _model(og, package, VARIANTS[variant], native)
    assert set(model.transducer.backends.values()) == {"native" if native == "all" else "ort"}
    features, steps, seq, text, decoded = _stream(og, model, _chunks(N.signal()))
    ref_features, ref_steps, ref_seq, ref_text, ref_decoded = reference[variant]
    assert steps == ref_steps
    assert seq == ref_seq and text == ref_text and decoded == ref_decoded
    assert [f.shape for f in features] == [f.shape for f in ref_features]


def test_the_fixture_exercises_the_loop(reference):
    """Blanks, whole chunks of blanks, and frames that reach max_symbols_per_step; the variants differ."""
    _, steps, seq, _, _ = reference["plain"]
    assert len(steps) == 6 and len(seq) >= 15 and len(set(seq)) >= 5
    assert any(chunk == [[]] for chunk in steps)                      # a chunk with no symbol
    assert any(len(chunk) >= N.MAX_SYMBOLS + 1 for chunk in steps)   # a frame emitting MAX_SYMBOLS, and more
    seqs = {name: tuple(r[2]) for name, r in reference.items()}
    assert len(set(seqs.values())) == len(seqs)


def test_features_are_onnxruntime_genai_s(package, reference):
    features = _stream(og, og.Model(package, native="none"), _chunks(N.signal()))[0]
    ref = reference["plain"][0]
    assert len(features) == len(ref) == 6
    for mine, theirs in zip(features, ref):
        assert mine.dtype == theirs.dtype == np.float32 and mine.shape == theirs.shape == (1, 12, N.MELS)
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=FEATURE_ATOL)
    assert not features[0][0, :N.PRE_CACHE].any()
    for prev, cur in zip(features, features[1:]):                     # the pre-encode cache: the last frames
        np.testing.assert_array_equal(cur[0, :N.PRE_CACHE], prev[0, -N.PRE_CACHE:])


def test_pieces_of_any_size(package, ort_genai):
    """Uneven pieces: one chunk is cut per call (the rest waits), flush pads what is left to one chunk or cuts it."""
    clip = np.concatenate([N.signal(), N.signal(0.2, seed=1)])
    sizes = [700, 2500, 100, 4000, 1, 0, 1599, 3300, 5000]
    pieces, at = [], 0
    for s in sizes:
        pieces.append(clip[at:at + s])
        at += s
    runs = [_stream(api, _model(api, package), pieces) for api in (og, ort_genai)]
    assert runs[0][1:] == runs[1][1:]
    assert len(runs[0][0]) == len(runs[1][0])
    for mine, theirs in zip(runs[0][0], runs[1][0]):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=FEATURE_ATOL)
    for api in (og, ort_genai):
        p = api.StreamingProcessor(_model(api, package))
        assert p.flush() is None and p.process(np.zeros(10, np.float64)) is None
        assert p.process([0.0] * N.CHUNK_SAMPLES) is not None and p.flush() is not None and p.flush() is None


def test_options_are_onnxruntime_genai_s(package, ort_genai):
    def session(api):
        p = api.Model(package).create_streaming_processor()
        log = []
        for op in [("get", "use_vad"), ("get", "vad_threshold"), ("get", "silence_duration_ms"),
                   ("get", "prefix_padding_ms"), ("get", "nope"), ("set", "use_vad", "false"), ("set", "use_vad", "0"),
                   ("set", "use_vad", "maybe"), ("set", "use_vad", "true"), ("set", "vad_threshold", "0.7"),
                   ("set", "vad_threshold", "abc"), ("set", "silence_duration_ms", "1000"),
                   ("set", "prefix_padding_ms", "250"), ("set", "silence_duration_ms", "x"), ("set", "nope", "1"),
                   ("get", "vad_threshold"), ("get", "silence_duration_ms"), ("get", "prefix_padding_ms")]:
            try:
                log.append(p.get_option(op[1]) if op[0] == "get" else p.set_option(op[1], op[2]))
            except RuntimeError as e:
                log.append(("error", str(e)))
        return log

    assert session(og) == session(ort_genai)


def test_errors_are_onnxruntime_genai_s(package, ort_genai, tmp_path):
    whisper = W.build(str(tmp_path / "whisper"))

    def errors(api):
        out = []

        def attempt(f):
            try:
                r = f()
                out.append(None if r is None else np.asarray(r).tolist() if not isinstance(r, (bool, int)) else r)
            except RuntimeError as e:
                out.append(("error", str(e)))

        model = api.Model(package)
        attempt(lambda: api.StreamingProcessor(api.Model(whisper)))
        attempt(lambda: model.create_multimodal_processor())
        attempt(lambda: api.StreamingProcessor(model).process(np.zeros((2, 10), np.float32)))
        g = api.Generator(model, api.GeneratorParams(model))
        attempt(lambda: g.is_done())
        attempt(lambda: g.get_sequence(0))
        attempt(lambda: g.set_runtime_option("lang_id", "1"))
        attempt(lambda: g.set_runtime_option("lang_id", "x"))
        inputs = api.StreamingProcessor(model).process(N.signal()[:N.CHUNK_SAMPLES])
        g.set_inputs(inputs)
        attempt(lambda: g.is_done())
        attempt(lambda: g.generate_next_token())
        attempt(lambda: g.get_next_tokens())
        attempt(lambda: g.get_sequence(1))
        attempt(lambda: g.get_output("encoded"))
        attempt(lambda: g.rewind_to(0))
        for shape in [(1, 12, 7), (12, N.MELS), (2, 12, N.MELS)]:
            bad = api.NamedTensors()
            bad["processed_signal"] = np.zeros(shape, np.float32)
            g.set_inputs(bad)
            attempt(lambda: g.generate_next_token())
        return out

    assert errors(og) == errors(ort_genai)


def test_native_all_runs_every_model_natively(package):
    model = og.Model(package, native="all")
    assert model.transducer.backends == {"encoder": "native", "decoder": "native", "joiner": "native"}
    assert og.Model(package, native="decoder").transducer.backends == \
        {"encoder": "ort", "decoder": "native", "joiner": "ort"}
    with pytest.raises(ValueError, match="unknown component"):
        og.Model(package, native="vision")


# -- voice activity detection (Silero VAD's interface, the fixture's ``vad.onnx``) --------------------------------

@pytest.fixture(scope="module")
def vad_package(tmp_path_factory):
    return N.build(str(tmp_path_factory.mktemp("nemotron_vad")), vad=True)


def _speech_pause_speech():
    """Speech, 1.2 s of near silence (12 chunks), speech."""
    return np.concatenate([N.signal(0.35, seed=1), N.silence(1.2, seed=3), N.signal(0.45, seed=2)])


def _vad_stream(api, model, options, pieces):
    """Per piece whether ``process`` gave features (None: not a whole chunk yet, or a dropped one), the features,
    and the symbols of every step, after ``options`` were set."""
    processor = api.StreamingProcessor(model)
    for key, value in options:
        processor.set_option(key, value)
    generator = api.Generator(model, api.GeneratorParams(model))
    given, features, steps = [], [], []
    for inputs in [processor.process(p) for p in pieces] + [processor.flush()]:
        given.append(inputs is not None)
        if inputs is None:
            continue
        features.append(np.array(inputs["audio_features"].as_numpy()))
        generator.set_inputs(inputs)
        while not generator.is_done():
            assert len(steps) < 20 * _STEP_LIMIT
            generator.generate_next_token()
            steps.append([int(t) for t in generator.get_next_tokens()])
    return given, features, steps


VAD_VARIANTS = {"config": ([], None), "off": ([("use_vad", "false")], None),
                "threshold": ([("vad_threshold", "0.97")], None),
                "durations": ([("silence_duration_ms", "100"), ("prefix_padding_ms", "100")], None),
                "8kHz": ([], {"model": {"sample_rate": 8000}})}


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("variant", list(VAD_VARIANTS))
def test_voice_activity_detection_is_onnxruntime_genai_s(vad_package, ort_genai, native, variant):
    """Which chunks the detector drops, the features of the rest and the symbols, against onnxruntime-genai: the
    package's settings, the detector off, a higher threshold, shorter durations, and 8 kHz windows (256 samples)."""
    options, overlay = VAD_VARIANTS[variant]
    pieces = _chunks(_speech_pause_speech(), 1000)
    want = _vad_stream(ort_genai, _model(ort_genai, vad_package, overlay), options, pieces)
    got = _vad_stream(og, _model(og, vad_package, overlay, native), options, pieces)
    kept = sum(want[0])
    if variant == "off":
        assert kept == 20   # every chunk of the 2 s (nothing left to flush)
    else:
        assert 6 <= kept <= 16, kept   # the pause dropped, not the speech
    assert got[0] == want[0]
    assert len(got[1]) == len(want[1])
    for a, b in zip(got[1], want[1]):
        np.testing.assert_allclose(a, b, rtol=0, atol=FEATURE_ATOL)
    assert got[2] == want[2]


def test_voice_activity_options_are_onnxruntime_genai_s(vad_package, ort_genai, tmp_path):
    def session(api, path):
        p = api.Model(path).create_streaming_processor()
        log = []
        for op in [("get", "use_vad"), ("get", "vad_threshold"), ("get", "silence_duration_ms"),
                   ("get", "prefix_padding_ms"), ("set", "vad_threshold", "0.97"), ("get", "vad_threshold"),
                   ("set", "use_vad", "false"), ("get", "use_vad"), ("get", "vad_threshold"),
                   ("set", "vad_threshold", "0.2"), ("set", "use_vad", "1"), ("get", "vad_threshold"),
                   ("set", "vad_threshold", "7"), ("get", "vad_threshold"), ("set", "vad_threshold", "-1"),
                   ("get", "vad_threshold"), ("set", "use_vad", "no")]:
            try:
                log.append(p.get_option(op[1]) if op[0] == "get" else p.set_option(op[1], op[2]))
            except RuntimeError as e:
                log.append(("error", str(e)))
        return log

    assert session(og, vad_package) == session(ort_genai, vad_package)
    odd = str(tmp_path / "odd_rate")
    N.build(odd, vad=True)
    cfg = json.load(open(f"{odd}/genai_config.json"))
    cfg["model"]["sample_rate"] = 22050

    def creation(api):
        with open(f"{odd}/genai_config.json", "w") as fh:
            json.dump(cfg, fh)
        try:
            api.StreamingProcessor(api.Model(odd))
        except RuntimeError as e:
            return str(e)

    assert creation(og) == creation(ort_genai) is not None


def test_a_malformed_vad_section_is_refused_at_load(tmp_path):
    from pipeline.spec import MetadataError
    folder = N.build(str(tmp_path / "pkg"), vad=True)
    cfg = json.load(open(f"{folder}/genai_config.json"))
    for bad, words in (({"threshold": "high"}, "model.vad.threshold: expected a number"),
                       ({"windows": 3}, "model.vad.windows: not a key")):
        c = json.loads(json.dumps(cfg))
        c["model"]["vad"].update(bad)
        with open(f"{folder}/genai_config.json", "w") as fh:
            json.dump(c, fh)
        with pytest.raises(MetadataError, match=words):
            og.Model(folder)
