"""Gemma 4's ``Gemma4ImageTransform`` (``gemma4_image_transform`` in ``pipeline/image_transforms.py``) run after
``DecodeImage`` as the fixture package's ``processor_config.json`` lists them (``fixtures/gemma4_package.py``), against
onnxruntime-genai's own ``gemma4`` processor in the same test.

Tolerances, fixed before comparing: ``pixel_position_ids`` and ``num_image_tokens`` equal; ``pixel_values`` (a float
bicubic resize, not Pillow's uint8 one) within 1e-5, or equal if every image came out equal.  Every image came out
bit-equal, so ``pixel_values`` is asserted equal too."""
import json
import os
import shutil

import numpy as np
import pytest

from fixtures import gemma4_package as G4
from fixtures import phi3v_package as P3
from pipeline.image_transforms import TRANSFORMS, gemma4_image_transform
from pipeline.spec import RequestError

SIZES = {"tiny": (20, 20),            # upscaled to 768 x 768
         "small": (100, 37),
         "medium": (300, 200),
         "vga": (640, 480),
         "large": (2000, 1500),       # downscaled to 912 x 672
         "square": (500, 500),
         "exact": (960, 672),         # the factor is exactly 1: no resize (the float32 rescale only), 280 tokens
         "cols_only": (1300, 480),    # the height stays 480: the horizontal pass only
         "rows_only": (480, 1300),    # the width stays 480: the vertical pass only
         "wide": (3000, 40),          # 6912 x 48
         "tall": (40, 3000),
         "zero_height": (5000, 10),   # the height rounds to 0: 48 high, the width capped at 280 * 48
         "zero_width": (10, 3000),
         "needle": (1, 281)}          # 47.9 wide rounds to 0; 280 * 48 high
POS = ("pixel_values", "pixel_position_ids", "num_image_tokens")


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return G4.build(str(tmp_path_factory.mktemp("gemma4")))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    return {name: P3.png(str(d / f"{name}.png"), seed, size) for seed, (name, size) in enumerate(SIZES.items())}


def _variant(package, folder, attrs):
    """The fixture package with other ``Gemma4ImageTransform`` attributes."""
    shutil.copytree(package, folder)
    path = os.path.join(folder, "processor_config.json")
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    doc["processor"]["transforms"][1]["operation"]["attrs"] = attrs
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    return folder


def _steps(package):
    with open(os.path.join(package, "processor_config.json"), encoding="utf-8") as fh:
        doc = json.load(fh)
    return [(TRANSFORMS[s["operation"]["type"]], s["operation"].get("attrs") or {})
            for s in doc["processor"]["transforms"]]


def _ours(package, path):
    """The chain run on one image, as ``MultiModalProcessor._run_steps`` runs it."""
    with open(path, "rb") as fh:
        value = fh.read()
    for fn, attrs in _steps(package):
        value = fn(value, **attrs)
    return value


def _theirs(api, package, paths, prompt=None):
    proc = api.Model(package).create_multimodal_processor()
    out = proc("<|image>" * len(paths) + "what" if prompt is None else prompt, images=api.Images.open(*paths))
    return {k: np.asarray(out[k].as_numpy()) for k in POS + ("input_ids",)}


def _assert_one(got, ref):
    pixels, positions, tokens = got
    assert pixels.dtype == np.float32 and positions.dtype == np.int64 and tokens.dtype == np.int64
    assert pixels.shape == ref["pixel_values"].shape[1:] and positions.shape == ref["pixel_position_ids"].shape[1:]
    assert np.array_equal(positions, ref["pixel_position_ids"][0])
    assert np.array_equal(tokens, ref["num_image_tokens"])
    assert np.array_equal(pixels, ref["pixel_values"][0]), float(np.abs(pixels - ref["pixel_values"][0]).max())


@pytest.mark.parametrize("name", list(SIZES))
def test_each_image_as_onnxruntime_genai_processes_it(package, images, ort_genai, name):
    got = _ours(package, images[name])
    _assert_one(got, _theirs(ort_genai, package, [images[name]]))
    pixels, positions, tokens = got
    w, h = SIZES[name]
    cols = positions[:, 0].max() + 1
    rows = positions[:, 1].max() + 1
    assert cols % 3 == 0 and rows % 3 == 0 and rows * cols == len(positions) == 9 * tokens[0] <= 2520
    if name.startswith("zero") or name == "needle":  # one 48-pixel side, the other capped at 280 * 48
        assert sorted((rows, cols)) == [3, 840]
    elif name == "exact":
        assert (rows, cols) == (h // 16, w // 16) and tokens[0] == 280


def test_other_attributes_as_onnxruntime_genai_applies_them(package, images, ort_genai, tmp_path):
    """14-pixel patches; and 2 x 2 pooling, where onnxruntime-genai still keeps ``soft tokens * 9`` rows (its
    pooling is fixed at 3), so the padding rows (zero pixels, positions -1) up to ``max_patches`` come back."""
    for k, attrs in enumerate([{"patch_size": 14, "max_soft_tokens": 70, "pooling_kernel_size": 3},
                               {"patch_size": 16, "max_soft_tokens": 100, "pooling_kernel_size": 2}]):
        variant = _variant(package, str(tmp_path / f"v{k}"), attrs)
        for name in ("vga", "tiny", "zero_height"):
            got = _ours(variant, images[name])
            _assert_one(got, _theirs(ort_genai, variant, [images[name]]))
        if attrs["pooling_kernel_size"] == 2:
            pixels, positions, tokens = _ours(variant, images["vga"])
            real = 4 * int(tokens[0])
            assert len(pixels) == 400 > real and (positions[real:] == -1).all() and not pixels[real:].any()


def test_two_images_come_back_each_padded_to_the_longest(package, images, ort_genai):
    """onnxruntime-genai 0.18 stacks several images: each image's patches, then zero pixels and positions -1 up to
    the longest image's; ``num_image_tokens`` one count per image; each ``<|image>`` expanded to its own image's
    count of ``<|image|>``."""
    names = ["wide", "tiny", "vga"]
    ref = _theirs(ort_genai, package, [images[n] for n in names])
    shots = [_ours(package, images[n]) for n in names]
    most = max(len(s[0]) for s in shots)
    assert ref["pixel_values"].shape == (3, most, 768) and ref["pixel_position_ids"].shape == (3, most, 2)
    assert np.array_equal(ref["num_image_tokens"], np.concatenate([s[2] for s in shots]))
    for i, (pixels, positions, _) in enumerate(shots):
        n = len(pixels)
        assert np.array_equal(ref["pixel_values"][i, :n], pixels) and not ref["pixel_values"][i, n:].any()
        assert np.array_equal(ref["pixel_position_ids"][i, :n], positions)
        assert (ref["pixel_position_ids"][i, n:] == -1).all()
    ids = ref["input_ids"][0]
    starts = np.flatnonzero((ids[1:] == G4.IMAGE_ID) & (ids[:-1] != G4.IMAGE_ID)) + 1
    runs = [int(np.argmax(np.append(ids[s:], -1) != G4.IMAGE_ID)) for s in starts]
    assert runs == [int(s[2][0]) for s in shots]


def test_errors_are_clear(package, images, ort_genai, tmp_path):
    variant = _variant(package, str(tmp_path / "none"), {"patch_size": 16, "max_soft_tokens": 0,
                                                           "pooling_kernel_size": 3})
    with pytest.raises(Exception, match="extreme aspect ratio"):
        _theirs(ort_genai, variant, [images["vga"]])
    with pytest.raises(RequestError, match=r"image has extreme aspect ratio \(480, 640\) and cannot be resized"):
        _ours(variant, images["vga"])
    with pytest.raises(RequestError, match="unknown attribute 'foo'"):
        gemma4_image_transform(np.zeros((4, 4, 3), np.uint8), foo=1)
    with pytest.raises(RequestError, match=r"expected \(H, W, 3\) uint8 input, got shape \[4, 4, 4\]"):
        gemma4_image_transform(np.zeros((4, 4, 4), np.uint8))
    with pytest.raises(RequestError, match="patch_size and pooling_kernel_size must be at least 1"):
        gemma4_image_transform(np.zeros((4, 4, 3), np.uint8), patch_size=0)
