"""Gemma 4 packages end to end (``fixtures/gemma4_package.py``): the processor's prompt ids and token types and the
decoded tokens equal onnxruntime-genai's, with no media, an image, a clip and both, on both backends; the prompt
rules for image and audio tags, and the embedding's ``per_layer_inputs`` fed to the decoder at every step.  The
image and audio features themselves are compared in ``test_pipeline_gemma4_vision.py`` and
``test_pipeline_gemma4_audio.py``."""
import numpy as np
import pytest

import pipeline as pg
from fixtures import gemma4_package
from fixtures.phi3v_package import png
from fixtures.whisper_package import wav

PROMPTS = {"text": "hello there", "image": "<|image>what is this", "audio": "<|audio|>say it",
           "both": "<|image><|audio|>what is this"}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    folder = gemma4_package.build(str(root / "pkg"))
    return (folder, png(str(root / "a.png"), 3, (300, 200)), wav(str(root / "a.wav"), 0.7),
            png(str(root / "b.png"), 4, (640, 130)))


def _media(mod, package, kind, images=1):
    _, image, clip, other = package
    return (mod.Images.open(*[image, other][:images]) if kind in ("image", "both") else None,
            mod.Audios.open(clip) if kind in ("audio", "both") else None)


def _numpy(v):
    return v.as_numpy() if hasattr(v, "as_numpy") else np.asarray(v)


def _decode(mod, model, package, kind, n=6):
    images, audios = _media(mod, package, kind)
    out = model.create_multimodal_processor()(PROMPTS[kind], images=images, audios=audios)
    params = mod.GeneratorParams(model)
    params.set_search_options(max_length=2048)
    g = mod.Generator(model, params)
    g.set_inputs(out)
    tokens = []
    for _ in range(n):
        g.generate_next_token()
        tokens.append(int(g.get_next_tokens()[0]))
    types = _numpy(out["token_type_ids"]).tolist() if "token_type_ids" in out.keys() else None
    return _numpy(out["input_ids"]).tolist(), types, tokens


@pytest.fixture(scope="module")
def reference(package, ort_genai):
    model = ort_genai.Model(package[0])
    return {kind: _decode(ort_genai, model, package, kind) for kind in PROMPTS}


@pytest.mark.parametrize("native", ["none", "all"])
@pytest.mark.parametrize("kind", list(PROMPTS))
def test_decode_equals_onnxruntime_genai(package, reference, kind, native):
    assert _decode(pg, pg.Model(package[0], native=native), package, kind) == reference[kind]


def _prompt_rules(mod, package):
    """input_ids for the tag rules, or the message of a refusal."""
    proc = mod.Model(package[0]).create_multimodal_processor()
    out = []
    for prompt, kind, images in (("no tags", "image", 1), ("<|image|> and <|image|>", "image", 2),
                                 ("<|image>", "image", 2),
                                 ("<|image|> once", "image", 2), ("", "image", 1), ("<|image> x", "text", 1),
                                 ("<|audio> x", "audio", 1), ("no tag", "audio", 1),
                                 ("<|audio|><|audio|>", "audio", 1)):
        imgs, auds = _media(mod, package, kind, images)
        try:
            got = proc(prompt, images=imgs, audios=auds)
            out.append(_numpy(got["input_ids"]).tolist())
        except RuntimeError as e:
            out.append(str(e))
    return out


def test_prompt_rules_equal_onnxruntime_genai(package, ort_genai):
    assert _prompt_rules(pg, package) == _prompt_rules(ort_genai, package)
