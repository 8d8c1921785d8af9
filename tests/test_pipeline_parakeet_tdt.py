"""Offline speech recognition of ``parakeet_tdt`` packages (``pipeline/streaming_asr.py``, fixture
``fixtures/parakeet_package.py``): a WAV clip through ``create_multimodal_processor()`` and the token-and-duration
transducer, natively and on onnxruntime, against onnxruntime-genai in the same test: the symbols of every step,
the sequence, the text, the features and the errors."""
import itertools
import json

import numpy as np
import pytest

import pipeline as og
from fixtures import parakeet_package as P

# Tolerance of the normalised features, fixed from the arithmetic before comparing: the log-mels carry the
# streaming front end's bound (1e-4, tests/test_pipeline_nemotron_speech.py: a float32 FFT against a double one),
# and the normalisation divides them by each band's standard deviation, at least 0.235 on this clip: 5e-4.
FEATURE_ATOL = 5e-4

# Overlays of the package's config, each moving the decode differently: one symbol per frame, and smaller chunks
# with other contexts (more encoder runs, other decode ranges).
VARIANTS = {"plain": None, "one_symbol": {"model": {"max_symbols_per_step": 1}},
            "small_chunks": {"model": {"chunk_samples": 2400, "left_context_samples": 800,
                                       "right_context_samples": 1600}}}
_STEP_LIMIT = 500


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    folder = P.build(str(tmp_path_factory.mktemp("parakeet")))
    P.wav(f"{folder}/clip.wav")
    return folder


def _model(api, path, overlay=None, native=None):
    config = api.Config(path)
    if overlay:
        config.overlay(json.dumps(overlay))
    return api.Model(config) if native is None else api.Model(config, native=native)


def _transcribe(api, model, clip):
    """(features, the symbols of each step, the sequence, the text): onnxruntime-genai's test loop."""
    processor = model.create_multimodal_processor()
    inputs = processor("", audios=api.Audios.open(clip))
    features = np.array(inputs["audio_features"].as_numpy())
    generator = api.Generator(model, api.GeneratorParams(model))
    generator.set_inputs(inputs)
    steps = []
    while not generator.is_done():
        assert len(steps) < _STEP_LIMIT, f"not done after {_STEP_LIMIT} steps"
        generator.generate_next_token()
        steps.append([int(t) for t in generator.get_next_tokens()])
    seq = generator.get_sequence(0)
    return features, steps, [int(t) for t in seq], processor.decode(seq)


@pytest.fixture(scope="module")
def reference(package, ort_genai):
    return {name: _transcribe(ort_genai, _model(ort_genai, package, overlay), f"{package}/clip.wav")
            for name, overlay in VARIANTS.items()}


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_symbols_and_text_are_onnxruntime_genai_s(package, reference, native, variant):
    model = _model(og, package, VARIANTS[variant], native)
    assert set(model.transducer.backends.values()) == {"native" if native == "all" else "ort"}
    features, steps, seq, text = _transcribe(og, model, f"{package}/clip.wav")
    ref_features, ref_steps, ref_seq, ref_text = reference[variant]
    assert steps == ref_steps and seq == ref_seq and text == ref_text
    assert features.shape == ref_features.shape == (1, P.MELS, 93) and features.dtype == np.float32
    np.testing.assert_allclose(features, ref_features, rtol=0, atol=FEATURE_ATOL)


def test_the_fixture_exercises_the_loop(reference):
    seqs = {name: tuple(r[2]) for name, r in reference.items()}
    assert len(set(seqs.values())) == len(seqs) and all(len(s) >= 8 for s in seqs.values())
    plain = seqs["plain"]
    # runs of one symbol longer than one_symbol allows per frame: duration 0 kept the frame
    assert max(sum(1 for _ in g) for _, g in itertools.groupby(plain)) >= 3


def test_errors_are_onnxruntime_genai_s(package, ort_genai, tmp_path):
    clip = f"{package}/clip.wav"
    longer = P.wav(str(tmp_path / "longer.wav"), seconds=1.5, seed=1)
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("encoder.onnx", "decoder.onnx", "joiner.onnx", "tokenizer.json", "tokenizer_config.json"):
        (bad / name).write_bytes(open(f"{package}/{name}", "rb").read())
    cfg = P.config()
    cfg["model"]["eos_token_id"] = [2]
    (bad / "genai_config.json").write_text(json.dumps(cfg))

    def errors(api):
        out = []

        def attempt(f):
            try:
                r = f()
                out.append(r.tolist() if isinstance(r, np.ndarray) else r if isinstance(r, (bool, int, str))
                           else None)
            except RuntimeError as e:
                out.append(("error", str(e)))

        model = api.Model(package)
        processor = model.create_multimodal_processor()
        attempt(lambda: api.Model(str(bad)))
        attempt(lambda: processor("", audios=None))
        attempt(lambda: processor("", audios=api.Audios.open(clip, clip)))
        attempt(lambda: api.StreamingProcessor(model))
        g = api.Generator(model, api.GeneratorParams(model))
        attempt(lambda: g.is_done())
        attempt(lambda: g.generate_next_token())
        attempt(lambda: g.rewind_to(0))
        attempt(lambda: g.get_output("encoder_outputs"))
        for shape in [(1, 7, 20), (P.MELS, 20)]:
            g = api.Generator(model, api.GeneratorParams(model))
            named = api.NamedTensors()
            named["audio_features"] = np.zeros(shape, np.float32)
            attempt(lambda: g.set_inputs(named))
            attempt(lambda: g.generate_next_token())
        g = api.Generator(model, api.GeneratorParams(model))
        inputs = processor("", audios=api.Audios.open(clip))
        g.set_inputs(inputs)
        for _ in range(_STEP_LIMIT):
            if g.is_done():
                break
            g.generate_next_token()
        other = processor("", audios=api.Audios.open(longer))
        g.set_inputs(other)                   # a second clip on the same generator is ignored
        attempt(lambda: g.is_done())
        attempt(lambda: g.generate_next_token())
        attempt(lambda: g.get_next_tokens())
        attempt(lambda: g.is_done())
        attempt(lambda: g.token_count())
        return out

    assert errors(og) == errors(ort_genai)
