"""Phi-4-multimodal packages end to end (``fixtures/phi4mm_package.py``): the processor's prompt ids and
``audio_projection_mode`` and the decoded tokens equal onnxruntime-genai's, with no media, an image, a clip and
both, on both backends; the speech component runs only for a prompt with clips.  The image and audio features
themselves are compared in ``test_pipeline_phi4mm_vision.py`` and ``test_pipeline_phi4mm_audio.py``."""

import numpy as np
import pytest

import pipeline as pg
from fixtures import phi4mm_package
from fixtures.phi3v_package import png
from fixtures.whisper_package import wav

PROMPTS = {"text": "<|user|>what is this<|end|>", "image": "<|user|><|image_1|>what is this<|end|>",
           "audio": "<|user|><|audio_1|>transcribe<|end|>",
           "both": "<|user|><|image_1|><|audio_1|>what is this<|end|>"}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("phi4mm")
    folder = phi4mm_package.build(str(root / "pkg"))
    return folder, png(str(root / "a.png"), 3, (500, 300)), wav(str(root / "a.wav"), 0.7)


def _media(mod, package, kind):
    _, image, clip = package
    images = mod.Images.open(image) if kind in ("image", "both") else None
    audios = mod.Audios.open(clip) if kind in ("audio", "both") else None
    return images, audios


def _decode(mod, model, package, kind, n=6):
    proc = model.create_multimodal_processor()
    images, audios = _media(mod, package, kind)
    out = proc(PROMPTS[kind], images=images, audios=audios)
    params = mod.GeneratorParams(model)
    params.set_search_options(max_length=2048)
    g = mod.Generator(model, params)
    g.set_inputs(out)
    tokens = []
    for _ in range(n):
        g.generate_next_token()
        tokens.append(int(g.get_next_tokens()[0]))
    ids = out["input_ids"]
    ids = ids.as_numpy() if hasattr(ids, "as_numpy") else np.asarray(ids)
    mode = out["audio_projection_mode"]
    mode = mode.as_numpy() if hasattr(mode, "as_numpy") else np.asarray(mode)
    return ids.tolist(), mode.tolist(), tokens


@pytest.fixture(scope="module")
def reference(package, ort_genai):
    model = ort_genai.Model(package[0])
    return {kind: _decode(ort_genai, model, package, kind) for kind in PROMPTS}


@pytest.mark.parametrize("native", ["none", "all"])
@pytest.mark.parametrize("kind", list(PROMPTS))
def test_decode_equals_onnxruntime_genai(package, reference, kind, native):
    got = _decode(pg, pg.Model(package[0], native=native), package, kind)
    assert got == reference[kind]
    assert got[1] == [{"text": 0, "image": 1, "audio": 2, "both": 3}[kind]]


def test_prompt_and_media_must_agree(package, ort_genai):
    found = []
    for mod in (ort_genai, pg):
        proc = mod.Model(package[0]).create_multimodal_processor()
        images, audios = _media(mod, package, "both")
        messages = []
        for prompt, kw in (("<|image_1|><|image_2|>", {"images": images}), ("no tags", {"audios": audios}),
                           ("<|audio_1|>", {})):
            with pytest.raises(RuntimeError) as e:
                proc(prompt, **kw)
            messages.append(str(e.value))
        found.append(messages)
    assert found[1] == found[0]


def test_speech_runs_only_with_clips(package, monkeypatch):
    from pipeline.runner import Pipeline
    ran = []
    original = Pipeline._run_component

    def spy(self, name, tokens, external):
        ran.append(name)
        return original(self, name, tokens, external)
    monkeypatch.setattr(Pipeline, "_run_component", spy)
    model = pg.Model(package[0], native="all")
    for kind in ("text", "image", "audio"):
        ran.clear()
        _decode(pg, model, package, kind, n=1)
        assert ("speech" in ran) == (kind == "audio") and ("vision" in ran) == (kind == "image")


def test_added_tokens_keep_their_declared_ids(package, ort_genai):
    """The fixture's placeholders are declared at 200010 and 200011, past the 512-entry vocabulary: the tokenizers
    library would renumber them 512 and 513; onnxruntime-genai keeps the declared ids, and so does this runtime."""
    text = "hi <|endoftext10|> x <|endoftext11|>"
    found = []
    for mod in (ort_genai, pg):
        tok = mod.Tokenizer(mod.Model(package[0]))
        ids = tok.encode(text)
        tok.update_options(skip_special_tokens="false")
        stream = tok.create_stream()
        found.append((ids.tolist(), tok.decode(ids), "".join(stream.decode(int(i)) for i in ids)))
    assert found[1] == found[0]
    assert 200010 in found[0][0]


def test_the_command_line_takes_an_image_and_a_clip(package, reference, capsys):
    from pipeline.__main__ import main
    folder, image, clip = package
    assert main(["generate", folder, "--prompt", PROMPTS["both"], "--image", image, "--audio", clip,
                 "--max-new-tokens", "6", "--native", "all"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"token_ids: {reference['both'][2]}"
