"""Gemma 4 unified packages (``type`` ``gemma4_unified``, ``fixtures/gemma4_package.build(..., unified=True)``):
Gemma 4's processor with every image's patches padded to the budget's most (``max_soft_tokens`` times the pooling
window) and one ``<|audio|>`` per feature frame; inputs and generated tokens equal onnxruntime-genai's, natively
and on onnxruntime."""
import numpy as np
import pytest

import pipeline as og
from fixtures import gemma4_package as G4
from fixtures import phi3v_package as P
from fixtures.whisper_package import clip


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return G4.build(str(tmp_path_factory.mktemp("gemma4_unified")), unified=True)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    return (P.png(str(d / "a.png"), 0, (120, 50)), P.png(str(d / "b.png"), 2, (64, 90)),
            clip(str(d / "c.wav"), 16000, 0.5, seed=0))


# prompt, images, with the clip: one image; two of different sizes; text only; an image and a clip
CASES = [("Look <|image|> here", [0], False), ("<|image|> and <|image|>", [0, 1], False), ("hi", [], False),
         ("<|image|> hear <|audio|>", [0], True)]


def _run(api, path, media, native=None):
    model = api.Model(path) if native is None else api.Model(path, native=native)
    processor = model.create_multimodal_processor()
    runs = []
    for prompt, which, audio in CASES:
        inputs = processor(prompt, images=api.Images.open(*[media[k] for k in which]) if which else None,
                           audios=api.Audios.open(media[2]) if audio else None)
        arrays = {k: np.array(inputs[k].as_numpy()) for k in inputs.keys()}
        params = api.GeneratorParams(model)
        params.set_search_options(max_length=arrays["input_ids"].shape[1] + 4)
        generator = api.Generator(model, params)
        generator.set_inputs(inputs)
        while not generator.is_done():
            generator.generate_next_token()
        runs.append((arrays, generator.get_sequence(0).tolist()))
    return runs


@pytest.fixture(scope="module")
def reference(package, media, ort_genai):
    return _run(ort_genai, package, media)


@pytest.mark.parametrize("native", ["all", "none"])
def test_inputs_and_tokens_are_onnxruntime_genai_s(package, media, reference, native):
    for (prompt, _, _), (want, want_seq), (got, got_seq) in zip(CASES, reference, _run(og, package, media, native)):
        assert sorted(got) == sorted(want), prompt
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, (prompt, k)
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{prompt!r}: {k}")
        assert got_seq == want_seq, prompt


def test_the_cases_pad_to_the_budget_and_count_frames(reference):
    budget = 280 * 3 * 3
    one, two, _, both = (r[0] for r in reference)
    assert one["pixel_values"].shape == (1, budget, 768) and two["pixel_values"].shape == (2, budget, 768)
    assert (one["pixel_position_ids"][0, 250 * 9:] == -1).all() and one["num_image_tokens"].tolist() == [250]
    assert both["audio_sizes"].tolist() == [both["audio_embeds"].shape[1]]   # one token a frame, not a quarter
