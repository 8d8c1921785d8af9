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


@pytest.fixture(scope="module")
def ort_genai():
    return pytest.importorskip("onnxruntime_genai")


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


def test_what_a_whisper_package_refuses(package):
    m = og.Model(package)
    with pytest.raises(NotImplementedError, match="whisper processor is not implemented"):
        m.create_multimodal_processor()
    params = og.GeneratorParams(m)
    params.set_search_options(max_length=12)
    g = og.Generator(m, params)
    with pytest.raises(Exception, match="audio_features"):
        g.append_tokens(np.array([[1, 5, 6, 7]], np.int32))  # the encoder's input is nobody's to invent
