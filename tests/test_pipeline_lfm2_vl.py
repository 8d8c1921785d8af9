"""LFM2-VL packages (``type`` ``lfm2_vl``, fixture ``fixtures/lfm2_vl_package.py``): the processor's outputs
(``input_ids`` with each ``<image>`` expanded between ``<|image_start|>`` and ``<|image_end|>``, the images'
16-pixel patches padded to ``max_num_patches`` with their mask and grid, ``num_image_tokens``), its errors, and the
generated tokens equal onnxruntime-genai's, natively and on onnxruntime."""
import numpy as np
import pytest

import pipeline as og
from processor_runs import assert_same_runs, run_cases
from fixtures import lfm2_vl_package as L
from fixtures import phi3v_package as P


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return L.build(str(tmp_path_factory.mktemp("lfm2_vl")))


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    d = tmp_path_factory.mktemp("pictures")
    # two of one size (resized to 64 x 128: 4 x 8 patches, 8 tokens), one of another (96 x 64: 6 x 4, 6 tokens)
    return [P.png(str(d / f"{k}.png"), k, size) for k, size in enumerate([(120, 50), (120, 50), (64, 90)])]


# prompt, which pictures: one image; two; text only; text before the image; too few and too many <image>
CASES = [("<image>What is this?", [0]), ("<image> and <image>", [0, 1]), ("hello", []), ("x<image>", [2]),
         ("Two pictures", [0, 1]), ("<image><image>", [0])]


@pytest.fixture(scope="module")
def reference(package, pictures, ort_genai):
    return run_cases(ort_genai, package, CASES, pictures)


@pytest.mark.parametrize("native", ["all", "none"])
def test_inputs_errors_and_tokens_are_onnxruntime_genai_s(package, pictures, reference, native):
    assert_same_runs(CASES, run_cases(og, package, CASES, pictures, native), reference)


def test_the_cases_expand_as_lfm2_vl_does(reference):
    """The reference pins what the cases are meant to: a run of 8 <image> per 4 x 8-patch image between its
    markers, the patches padded to max_num_patches with the mask over the image's own, the grid in patches."""
    one = [L.IMAGE_START] + [L.IMAGE] * 8 + [L.IMAGE_END]
    first, second = reference[0][0], reference[1][0]
    assert first["input_ids"][0, :10].tolist() == one
    assert first["pixel_values"].shape == (1, L.MAX_NUM_PATCHES, 16 * 16 * 3)
    assert first["image_attention_mask"].sum() == 32 and first["image_sizes"].tolist() == [[4, 8]]
    assert not first["pixel_values"][0, 32:].any()
    assert second["input_ids"][0].tolist().count(L.IMAGE) == 16 and second["num_image_tokens"].tolist() == [16]
    assert reference[3][0]["image_sizes"].tolist() == [[6, 4]] and reference[3][0]["num_image_tokens"].tolist() == [6]
    assert L.IMAGE not in reference[2][0]["input_ids"][0] and reference[2][0]["num_image_tokens"].tolist() == [0]
    assert [r[0] for r in reference[4:]] == ["error", "error"]


def test_images_of_different_sizes(package, pictures, ort_genai):
    """Images of different sizes: each image's patches, mask and grid are those onnxruntime-genai gives for it
    alone (onnxruntime-genai 0.18 stacks such images wrongly and fails), and the prompt decodes."""
    alone = [ort_genai.Model(package).create_multimodal_processor()("<image>", images=ort_genai.Images.open(p))
             for p in (pictures[0], pictures[2])]
    model = og.Model(package, native="all")
    inputs = model.create_multimodal_processor()("<image> then <image>", images=og.Images.open(pictures[0],
                                                                                              pictures[2]))
    for k, one in enumerate(alone):
        for name in ("pixel_values", "image_attention_mask", "image_sizes"):
            np.testing.assert_array_equal(inputs[name].as_numpy()[k], one[name].as_numpy()[0], err_msg=name)
    assert inputs["num_image_tokens"].as_numpy().tolist() == [8 + 6]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=inputs["input_ids"].as_numpy().shape[1] + 2)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    generator.generate_next_token()
    assert model.pipeline.values[("vision", "image_features")].shape == (14, L.E)
