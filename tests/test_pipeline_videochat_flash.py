"""VideoChat-Flash packages (``type`` ``videochat_flash_qwen``, fixture ``fixtures/videochat_flash_package.py``): the
processor's outputs (``pixel_values`` ``(1, frames, 3, H, W)`` from channels-last frames, ``image_grid_thw``,
``input_ids`` with ``num_visual_tokens`` pads per frame, ``num_image_tokens``), its errors and the generated tokens
equal onnxruntime-genai's, natively and on onnxruntime."""
import json

import pytest

import pipeline as og
from processor_runs import assert_same_runs, run_cases
from fixtures import phi3v_package as P
from fixtures import videochat_flash_package as V

S, E, PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return V.build(str(tmp_path_factory.mktemp("videochat")))


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    d = tmp_path_factory.mktemp("pictures")
    return [P.png(str(d / f"{k}.png"), k, size) for k, size in enumerate([(120, 50), (120, 50), (64, 90)])]


# prompt, which pictures: one frame; two, the first marker without its end (onnxruntime-genai's scan repeats the
# text between); too few markers; text only; a marker without frames; three markers for two frames
CASES = [(f"{S}{E}What is this?", [0]), (f"{S} two {S}xx{E} end", [0, 2]), ("Two pictures", [0, 1]), ("hello", []),
         (S, []), (f"a{S}b{E}c{S}d", [1, 0]), (f"{S}{S}{S}", [0, 1])]


@pytest.fixture(scope="module")
def reference(package, pictures, ort_genai):
    return run_cases(ort_genai, package, CASES, pictures)


@pytest.mark.parametrize("native", ["all", "none"])
def test_inputs_errors_and_tokens_are_onnxruntime_genai_s(package, pictures, reference, native):
    assert_same_runs(CASES, run_cases(og, package, CASES, pictures, native), reference)


def test_the_cases_are_what_they_pin(reference):
    block = [V.VISION_START] + [V.IMAGE_PAD] * V.TOKENS + [V.VISION_END]
    first, second = reference[0][0], reference[1][0]
    assert first["input_ids"][0, :6].tolist() == block and first["pixel_values"].shape == (1, 1, 3, 56, 56)
    assert first["image_grid_thw"].tolist() == [[1, 56, 56]] and first["num_image_tokens"].tolist() == [4]
    ids = second["input_ids"][0].tolist()
    assert ids.count(V.VISION_START) == 2 and ids[:6] == block and second["num_image_tokens"].tolist() == [8]
    assert reference[2][0] == "error" and reference[6][0] == "error"
    assert reference[4][0]["input_ids"].tolist() == [[V.VISION_START]]


def test_num_visual_tokens_is_required(tmp_path, ort_genai):
    folder = V.build(str(tmp_path / "pkg"))
    cfg = json.load(open(f"{folder}/genai_config.json"))
    del cfg["model"]["vision"]["num_visual_tokens"]
    json.dump(cfg, open(f"{folder}/genai_config.json", "w"))
    words = []
    for api in (og, ort_genai):
        with pytest.raises(RuntimeError) as info:
            api.Model(folder).create_multimodal_processor()
        words.append(str(info.value))
    assert words[0] == words[1]
