"""Whisper packages in onnxruntime-genai's format (fixture ``fixtures/whisper_package.py``): the audio encoder once
over ``audio_features``, its cross-attention caches fed to every decoder step, natively and on onnxruntime, against
onnxruntime-genai in the same test (greedy, a batch, beams)."""
import numpy as np
import pytest

import pipeline as og
from fixtures import whisper_package as W


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return W.build(str(tmp_path_factory.mktemp("whisper")))


def _run(api, path, features, prompts, native=None, **search):
    m = api.Model(path, **({} if native is None else {"native": native}))
    params = api.GeneratorParams(m)
    params.set_search_options(max_length=12, batch_size=features.shape[0], **search)
    g = api.Generator(m, params)
    inputs = api.NamedTensors()
    inputs["audio_features"] = features
    inputs["input_ids"] = np.asarray(prompts, np.int32)
    g.set_inputs(inputs)
    while not g.is_done():
        g.generate_next_token()
    n = features.shape[0] * int(search.get("num_return_sequences", 1))
    return [g.get_sequence(i).tolist() for i in range(n)]


def test_the_encoder_feeds_the_decoder_s_cross_caches(package):
    spec = og.Model(package).spec
    assert [(s.model, s.run_on) for s in spec.stages] == [("encoder", "prompt_only"), ("decoder", "every_step")]
    assert [(e.src_port, e.dst_port) for e in spec.dataflow] == \
        [(f"present_{k}_cross_{i}", f"past_{k}_cross_{i}") for k in ("key", "value") for i in range(W.LAYERS)]
    assert spec.decoder.io.kv_inputs == [f"past_{k}_self_{i}" for i in range(W.LAYERS) for k in ("key", "value")]


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("batch,search", [(1, {}), (2, {}), (1, {"num_beams": 3, "num_return_sequences": 2}),
                                          (2, {"num_beams": 3, "num_return_sequences": 2})])
def test_tokens_are_onnxruntime_genai_s(package, ort_genai, native, batch, search):
    features = W.features(batch, batch)
    prompts = [[1, 5, 6, 7], [1, 9, 6, 7]][:batch]
    assert _run(og, package, features, prompts, native, **search) == \
        _run(ort_genai, package, features, prompts, **search)


def test_a_whisper_package_needs_its_audio_features(package):
    m = og.Model(package)
    params = og.GeneratorParams(m)
    params.set_search_options(max_length=12)
    g = og.Generator(m, params)
    with pytest.raises(Exception, match="audio_features"):
        g.append_tokens(np.array([[1, 5, 6, 7]], np.int32))  # the encoder's input is nobody's to invent


# ---------------------------------------------------------------------------------------------------------------
# The audio processor (pipeline/audio.py).  Tolerance, fixed beforehand: 1e-4 on the log-mel features (float32
# FFTs of different libraries, before a log10); token ids equal.

@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    # soundfile (FLAC) is a test dependency: without it this fails rather than skipping the FLAC cases
    return {"wav": W.wav(str(d / "chirp.wav")),
            "flac": W.flac(str(d / "stereo44k.flac"))}  # two channels at 44.1 kHz: mixed, filtered, resampled


def _features(api, package, prompt, paths):
    out = api.Model(package).create_multimodal_processor()(prompt, audios=api.Audios.open(*paths))
    return {k: np.asarray(out[k].as_numpy()) for k in out.keys()}


@pytest.mark.parametrize("names,prompt", [(["wav"], "hello"), (["flac"], "hello"),
                                          (["wav", "flac"], ["a b", "hello world"])])
def test_the_audio_processor_gives_onnxruntime_genai_s_inputs(package, clips, ort_genai, names, prompt):
    paths = [clips[n] for n in names]
    got, ref = _features(og, package, prompt, paths), _features(ort_genai, package, prompt, paths)
    assert sorted(got) == sorted(ref)
    assert got["input_ids"].dtype == ref["input_ids"].dtype and np.array_equal(got["input_ids"], ref["input_ids"])
    assert got["audio_features"].shape == ref["audio_features"].shape == (len(paths), W.MELS, W.FRAMES)
    np.testing.assert_allclose(got["audio_features"], ref["audio_features"], rtol=0, atol=1e-4)


@pytest.mark.parametrize("native", ["all", "none"])
def test_a_clip_decodes_as_onnxruntime_genai_decodes_it(package, clips, ort_genai, native):
    def run(api, **kw):
        m = api.Model(package, **kw)
        inputs = m.create_multimodal_processor()("hello world", audios=api.Audios.open(clips["wav"]))
        params = api.GeneratorParams(m)
        params.set_search_options(max_length=inputs["input_ids"].as_numpy().shape[1] + 8)
        g = api.Generator(m, params)
        g.set_inputs(inputs)
        while not g.is_done():
            g.generate_next_token()
        return g.get_sequence(0).tolist()
    assert run(og, native=native) == run(ort_genai)


def test_what_the_audio_processor_refuses(package, clips, ort_genai):
    for api in (og, ort_genai):
        proc = api.Model(package).create_multimodal_processor()
        with pytest.raises(RuntimeError, match="No audios provided to process"):
            proc("hello")
        with pytest.raises(RuntimeError, match="No prompt or prompts provided"):
            proc(audios=api.Audios.open(clips["wav"]))
    with pytest.raises(RuntimeError, match="Audio path does not exist"):
        og.Audios.open(clips["wav"] + ".missing")


def test_the_command_line_takes_an_audio_file(package, clips, ort_genai, capsys):
    from pipeline.__main__ import main
    prompt = "hello world"
    assert main(["generate", package, "--prompt", prompt, "--audio", clips["wav"], "--max-new-tokens", "5",
                 "--native", "none"]) == 0
    printed = capsys.readouterr().out.splitlines()[-1]
    m = ort_genai.Model(package)
    inputs = m.create_multimodal_processor()(prompt, audios=ort_genai.Audios.open(clips["wav"]))
    n = inputs["input_ids"].as_numpy().shape[1]
    params = ort_genai.GeneratorParams(m)
    params.set_search_options(max_length=n + 5)
    g = ort_genai.Generator(m, params)
    g.set_inputs(inputs)
    while not g.is_done():
        g.generate_next_token()
    assert printed == f"token_ids: {g.get_sequence(0)[n:].tolist()}"
    assert main(["generate", package, "--audio", clips["wav"], "--native", "none"]) == 2
    assert "--audio need --prompt" in capsys.readouterr().err
