"""Declared image preprocessing (--image) and its refusal where it cannot be reproduced."""
import json
import os

import numpy as np
import pytest
from PIL import Image

from fixtures import composite_vlm as V
from pipeline.__main__ import main
from pipeline.preprocess import find_preprocessor, preprocess_image
from pipeline.spec import MetadataError


def _write(folder, cfg, name="preprocessor_config.json"):
    with open(os.path.join(folder, name), "w") as f:
        json.dump(cfg, f)


def test_resize_rescale_normalize(tmp_path):
    px = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3) * 5
    Image.fromarray(px).save(tmp_path / "img.png")
    cfg = {"do_resize": True, "size": {"height": 2, "width": 2}, "resample": 0, "do_rescale": True,
           "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.1, 0.2, 0.3], "image_std": [0.5, 0.6, 0.7]}
    _write(tmp_path, cfg)
    got = preprocess_image(str(tmp_path / "img.png"), find_preprocessor(str(tmp_path)))
    near = np.asarray(Image.fromarray(px).resize((2, 2), resample=0), np.float32)
    want = ((near / 255 - np.array([0.1, 0.2, 0.3], np.float32)) / np.array([0.5, 0.6, 0.7], np.float32))
    assert got.shape == (1, 3, 2, 2) and got.dtype == np.float32
    np.testing.assert_allclose(got, want.transpose(2, 0, 1)[None], rtol=1e-6)


def test_qwen_smart_resize_is_not_representable(tmp_path):
    _write(tmp_path, {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 12845056},
           "processor_config.json")
    with pytest.raises(MetadataError, match="pixel-values"):
        find_preprocessor(str(tmp_path))


def test_image_flag_drives_the_vision_component(tmp_path, capsys):
    pkg = V.build_package(str(tmp_path / "vlm"))
    # Pixel (i, j) of channel c holds c*4 + i*2 + j; divided by 12 that is exactly the fixture's PIXELS.
    img = np.zeros((2, 2, 3), np.uint8)
    for c in range(3):
        for i in range(2):
            for j in range(2):
                img[i, j, c] = c * 4 + i * 2 + j
    Image.fromarray(img).save(tmp_path / "img.png")
    _write(pkg, {"do_resize": False, "do_rescale": True, "rescale_factor": 1.0, "do_normalize": True,
                 "image_mean": [0, 0, 0], "image_std": [12, 12, 12]})
    np.testing.assert_array_equal(preprocess_image(str(tmp_path / "img.png"), find_preprocessor(pkg)), V.PIXELS)
    rc = main(["parity", pkg, "--prompt-ids", "3,7", "--image", str(tmp_path / "img.png"), "--tokens", "4"])
    out = capsys.readouterr().out
    assert rc == 0 and "native_token_ids: [0, 5, 6, 7]" in out
