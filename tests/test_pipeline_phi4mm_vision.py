"""Phi-4-multimodal's image transforms (``Phi4VisionDynamicPreprocess`` ... ``Phi4VisionProcessor`` and
``phi4_stack`` in ``pipeline/image_transforms.py``), run over the fixture package's ``vision_processor.json``
(``fixtures/phi4mm_package.py``), against onnxruntime-genai's own ``phi4mm`` processor in the same test.

Tolerances, fixed before comparing: ``image_sizes``, ``image_attention_mask`` and ``num_image_tokens`` equal; the
448 x 448 crops (bilinear uint8, then rescale and normalize) equal; the bicubic global view (crop 0) within 1e-5.
Every output came out bit-equal, so every output is asserted equal, the global view included."""
import json
import math
import os

import numpy as np
import pytest

from fixtures import phi3v_package as P3
from fixtures import phi4mm_package as P4
from pipeline.image_transforms import (TRANSFORMS, Phi4HDImage, normalize, phi4_dynamic_preprocess, phi4_stack,
                                       phi4_vision_processor, rescale)
from pipeline.spec import RequestError

NAMES = ("pixel_values", "image_sizes", "image_attention_mask", "num_image_tokens")
SIZES = {"small": (120, 50),       # one crop, padded in height
         "tiny": (8, 8),           # one crop, upscaled
         "float32": (23, 23),      # 23 * float32(448 / 23) truncates to 447: one white column (448 in float64)
         "edge": (448, 434),       # exactly 14 pixels of padding: one mask row 0
         "wide": (700, 300),       # 2 x 1 crops
         "square": (1000, 900),    # 3 x 3 crops
         "search": (3000, 2300),   # 7 x 6 > 36: the nearest ratio, 4 x 3
         "tall": (1000, 9000),     # 3 x 21 > 36: 1 / 9 and 2 / 18 tie, the larger area takes 2 x 18
         "big": (3000, 3000),      # 7 x 7 > 36: 1 x 1 ... 6 x 6 tie, 6 x 6 (36 crops)
         "extreme": (16384, 10)}   # 36 x 1, 9 pixels high: "the aspect ratio is very extreme"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return P4.build(str(tmp_path_factory.mktemp("phi4mm")))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    return {name: P3.png(str(d / f"{name}.png"), seed, size) for seed, (name, size) in enumerate(SIZES.items())}


@pytest.fixture(scope="module")
def steps(package):
    with open(os.path.join(package, "vision_processor.json"), encoding="utf-8") as fh:
        doc = json.load(fh)
    return [(TRANSFORMS[s["operation"]["type"]], s["operation"].get("attrs") or {})
            for s in doc["processor"]["transforms"]]


def _ours(steps, paths):
    """The chain run per image (as ``MultiModalProcessor._run_steps`` runs it), then ``phi4_stack``."""
    shots = []
    for path in paths:
        with open(path, "rb") as fh:
            value = fh.read()
        for fn, attrs in steps:
            value = fn(value, **attrs)
        shots.append(value)
    return dict(zip(NAMES, phi4_stack(shots)))


def _theirs(api, package, paths):
    proc = api.Model(package).create_multimodal_processor()
    tags = "".join(f"<|image_{i + 1}|>" for i in range(len(paths)))
    out = proc(tags + "hi", images=api.Images.open(*paths))
    return {k: np.asarray(out[k].as_numpy()) for k in NAMES}


def _assert_same(got, ref):
    for k in NAMES:
        assert got[k].shape == ref[k].shape and got[k].dtype == ref[k].dtype, (k, got[k].shape, ref[k].shape)
        assert np.array_equal(got[k], ref[k]), (k, float(np.abs(got[k].astype(np.float64) - ref[k]).max()))


@pytest.mark.parametrize("name", ["small", "tiny", "float32", "edge", "wide", "square", "search", "tall", "big"])
def test_each_image_as_onnxruntime_genai_processes_it(package, images, steps, ort_genai, name):
    got, ref = _ours(steps, [images[name]]), _theirs(ort_genai, package, [images[name]])
    _assert_same(got, ref)
    w, h = SIZES[name]
    if name in ("search", "tall", "big"):  # the case runs the aspect-ratio search
        assert math.ceil(w / 448) * math.ceil(h / 448) > 36
        assert got["pixel_values"].shape[1] - 1 < math.ceil(w / 448) * math.ceil(h / 448)


@pytest.mark.parametrize("names", [["wide", "small", "square"], ["tiny", "wide"]])
def test_images_of_different_crop_counts_stack_as_onnxruntime_genai_stacks_them(package, images, steps, ort_genai,
                                                                                names):
    paths = [images[n] for n in names]
    got, ref = _ours(steps, paths), _theirs(ort_genai, package, paths)
    _assert_same(got, ref)
    crops = [_ours(steps, [p])["pixel_values"].shape[1] for p in paths]
    assert len(set(crops)) > 1 and got["pixel_values"].shape[1] == max(crops)
    for i, c in enumerate(crops):  # the padding: zero pixels, masks all ones (the aligner)
        assert not got["pixel_values"][i, c:].any() and (got["image_attention_mask"][i, c:] == 1).all()


def test_an_extreme_aspect_ratio_is_an_error_as_in_onnxruntime_genai(package, images, steps, ort_genai):
    with pytest.raises(Exception, match="aspect ratio is very extreme"):
        _theirs(ort_genai, package, [images["extreme"]])
    with pytest.raises(RequestError, match="aspect ratio is very extreme"):
        _ours(steps, [images["extreme"]])


def test_the_mask_travels_through_rescale_and_normalize_and_plain_images_are_unchanged():
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    mask = np.ones((1, 1), np.int64)
    carried = normalize(rescale(Phi4HDImage(image, mask)), mean=[0.5] * 3, std=[0.5] * 3)
    assert isinstance(carried, Phi4HDImage) and carried.attention_mask is mask
    plain = normalize(rescale(image), mean=[0.5] * 3, std=[0.5] * 3)
    assert isinstance(plain, np.ndarray) and plain.dtype == np.float32 and np.array_equal(carried.image, plain)


def test_bad_inputs_are_clear_errors():
    with pytest.raises(RequestError, match=r"expected an \(H, W, 3\) uint8 RGB image, got shape \[4, 4, 4\]"):
        phi4_dynamic_preprocess(np.zeros((4, 4, 4), np.uint8))
    with pytest.raises(RequestError, match="expected the output of Phi4VisionDynamicPreprocess"):
        phi4_vision_processor(np.zeros((448, 448, 3), np.float32))
    with pytest.raises(RequestError, match="interpolation must be one of"):
        phi4_vision_processor(phi4_dynamic_preprocess(np.zeros((4, 4, 3), np.uint8)), interpolation="SINC")
