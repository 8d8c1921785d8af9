"""Mistral 3 (Pixtral) packages (``type`` ``mistral3``, fixture ``fixtures/mistral3_package.py``): the processor's
outputs (``input_ids`` with each image's rows of ``[IMG]``, ``[IMG_BREAK]`` and ``[IMG_END]``, ``pixel_values``,
``image_sizes``, ``num_image_tokens``) and the generated tokens equal onnxruntime-genai's, natively and on
onnxruntime; images of different sizes are padded and run one by one."""
import numpy as np
import pytest

import pipeline as og
from processor_runs import assert_same_runs, run_cases
from fixtures import mistral3_package as M
from fixtures import phi3v_package as P


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return M.build(str(tmp_path_factory.mktemp("mistral3")))


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    d = tmp_path_factory.mktemp("pictures")
    # two of one size (resized to 56 x 112: two rows of four tiles), one of another (84 x 56)
    return [P.png(str(d / f"{k}.png"), k, size) for k, size in enumerate([(120, 50), (120, 50), (64, 90)])]


# prompt, which pictures: one image at its [IMG]; a run of [IMG] taken as one, a second image at the next; images
# without placeholders put after [INST], or first; text only; an empty prompt
CASES = [("[INST][IMG]What is this?", [0]), ("[INST][IMG][IMG] and [IMG] compare", [0, 1]),
         ("[INST]Two pictures", [0, 1]), ("No instruction", [1, 0]), ("hello", []), ("", [2])]


@pytest.fixture(scope="module")
def reference(package, pictures, ort_genai):
    return run_cases(ort_genai, package, CASES, pictures)


@pytest.mark.parametrize("native", ["all", "none"])
def test_inputs_and_tokens_are_onnxruntime_genai_s(package, pictures, reference, native):
    assert_same_runs(CASES, run_cases(og, package, CASES, pictures, native), reference)


def test_the_cases_expand_as_pixtral_does(reference):
    """What the reference gives is what the cases are meant to pin: rows of [IMG] closed by [IMG_BREAK] and the
    last by [IMG_END], one run per image wherever it went, and no image tokens without images."""
    ids = [r[0]["input_ids"][0].tolist() for r in reference]
    one = [M.IMG] * 4 + [M.IMG_BREAK] + [M.IMG] * 4 + [M.IMG_END]
    assert ids[0][:11] == [M.INST] + one and ids[0].count(M.IMG) == 8
    assert ids[1].count(M.IMG_END) == 2 and ids[1][:11] == [M.INST] + one
    assert ids[2][:21] == [M.INST] + one + one
    assert ids[3][:20] == one + one and M.INST not in ids[3]
    assert M.IMG not in ids[4] and reference[4][0]["num_image_tokens"].tolist() == [0]
    assert ids[5] == [M.IMG, M.IMG, M.IMG_BREAK] * 2 + [M.IMG, M.IMG, M.IMG_END]
    assert [r[0]["num_image_tokens"].tolist() for r in reference] == [[8], [16], [16], [16], [0], [6]]


def test_images_of_different_sizes_are_padded_and_run_one_by_one(package, pictures, ort_genai):
    """Pixtral's stack: each image at the top left of the largest size, zeros after, ``image_sizes`` its own; each
    image's pixels are those onnxruntime-genai gives for it alone.  The vision model then runs once per image on
    its own size (onnxruntime-genai 0.18 stacks such images wrongly and fails: compared here with each image
    alone), and the image features reach the embedding in order."""
    alone = [np.array(ort_genai.Model(package).create_multimodal_processor()(
        "", images=ort_genai.Images.open(p))["pixel_values"].as_numpy())[0] for p in (pictures[0], pictures[2])]
    model = og.Model(package, native="all")
    inputs = model.create_multimodal_processor()("[INST][IMG] and [IMG]", images=og.Images.open(pictures[0],
                                                                                               pictures[2]))
    pixels, sizes = inputs["pixel_values"].as_numpy(), inputs["image_sizes"].as_numpy()
    assert pixels.shape == (2, 3, 84, 112) and sizes.tolist() == [[56, 112], [84, 56]]
    for k, (h, w) in enumerate(sizes.tolist()):
        np.testing.assert_array_equal(pixels[k, :, :h, :w], alone[k])
        assert not pixels[k, :, h:, :].any() and not pixels[k, :, :, w:].any()
    assert inputs["num_image_tokens"].as_numpy().tolist() == [8 + 6]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=inputs["input_ids"].as_numpy().shape[1] + 3)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    generator.generate_next_token()
    vision = model.pipeline.components["vision"]
    each = [vision.run({"pixel_values": a[None]})["image_features"] for a in alone]
    np.testing.assert_array_equal(model.pipeline.values[("vision", "image_features")], np.concatenate(each))


class _Recorder:
    def __init__(self):
        self.seen = []

    def run(self, feeds):
        self.seen.append(feeds["pixel_values"].shape)
        return {"image_features": np.full((1, 2), float(len(self.seen)), np.float32)}


def test_run_per_image_cuts_each_image_and_checks_the_sizes():
    from pipeline.multimodal import run_per_image
    from pipeline.spec import RequestError
    pixels = np.zeros((2, 3, 84, 112), np.float32)
    rec = _Recorder()
    out = run_per_image(rec, {"pixel_values": pixels}, "pixel_values", np.array([[56, 112], [84, 56]]))
    assert rec.seen == [(1, 3, 56, 112), (1, 3, 84, 56)] and out["image_features"][:, 0].tolist() == [1.0, 2.0]
    rec = _Recorder()
    run_per_image(rec, {"pixel_values": pixels[:1]}, "pixel_values", None)
    assert rec.seen == [(1, 3, 84, 112)]     # one image runs as it is
    for sizes, words in ((None, "multi-image inputs require image_sizes"),
                         (np.array([[56, 112, 1]]), r"image_sizes must be \[N, 2\]"),
                         (np.array([[56, 112]]), "image_heights_ has 1 entries but num_images_ is 2"),
                         (np.array([[56, 112], [90, 56]]), r"image 1 has h_i=90 which is out of valid range \(0, 84\]"),
                         (np.array([[56, 0], [84, 56]]), r"image 0 has w_i=0")):
        with pytest.raises(RequestError, match=words):
            run_per_image(_Recorder(), {"pixel_values": pixels}, "pixel_values", sizes)
