"""Gemma 4 unified packages (``type`` ``gemma4_unified``, ``fixtures/gemma4_package.build(..., unified=True)``):
Gemma 4's processor with every image's patches padded to the budget's most (``max_soft_tokens`` times the pooling
window) and one ``<|audio|>`` per feature frame; inputs and generated tokens equal onnxruntime-genai's, natively
and on onnxruntime."""
import pytest

import pipeline as og
from processor_runs import assert_same_runs, run_cases
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


# prompt, images, the clip: one image; two of different sizes; text only; an image and the clip
CASES = [("Look <|image|> here", [0]), ("<|image|> and <|image|>", [0, 1]), ("hi", []),
         ("<|image|> hear <|audio|>", [0], 2)]


@pytest.fixture(scope="module")
def reference(package, media, ort_genai):
    return run_cases(ort_genai, package, CASES, media)


@pytest.mark.parametrize("native", ["all", "none"])
def test_inputs_and_tokens_are_onnxruntime_genai_s(package, media, reference, native):
    assert_same_runs(CASES, run_cases(og, package, CASES, media, native), reference)


def test_the_cases_pad_to_the_budget_and_count_frames(reference):
    budget = 280 * 3 * 3
    one, two, _, both = (r[0] for r in reference)
    assert one["pixel_values"].shape == (1, budget, 768) and two["pixel_values"].shape == (2, budget, 768)
    assert (one["pixel_position_ids"][0, 250 * 9:] == -1).all() and one["num_image_tokens"].tolist() == [250]
    assert both["audio_sizes"].tolist() == [both["audio_embeds"].shape[1]]   # one token a frame, not a quarter
