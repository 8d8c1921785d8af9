"""Image preprocessing declared by a package, where it is representable.

Reads ``preprocessor_config.json`` (or ``processor_config.json``) from the
package folder, in the layout Hugging Face image processors write:
``do_convert_rgb``, ``do_resize`` with ``size`` ({height, width} or
{shortest_edge}), ``resample``, ``do_rescale`` with ``rescale_factor``,
``do_normalize`` with ``image_mean`` / ``image_std``.  The result is a
float32 [1, 3, H, W] array.

Preprocessing that depends on the image in ways this module does not
reproduce (Qwen's ``smart_resize`` with min/max pixel budgets and patch
merging) raises ``MetadataError`` naming the reason: use ``--pixel-values``
with an array prepared by the model's own processor instead.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .spec import MetadataError

__all__ = ["find_preprocessor", "preprocess_image"]

_NAMES = ("preprocessor_config.json", "processor_config.json")
_UNREPRESENTABLE = ("smart_resize", "min_pixels", "max_pixels", "merge_size", "temporal_patch_size")


def find_preprocessor(root: str) -> dict:
    for name in _NAMES:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            with open(path) as f:
                cfg = json.load(f)
            cfg = cfg.get("image_processor", cfg)
            bad = [k for k in _UNREPRESENTABLE if k in json.dumps(cfg)]
            if bad:
                raise MetadataError(f"{name}: the image preprocessing uses {bad}, which this runner does not "
                                    f"reproduce; pass --pixel-values prepared by the model's own processor")
            return cfg
    raise MetadataError(f"the package at {root!r} declares no image preprocessing ({' or '.join(_NAMES)}); "
                        f"pass --pixel-values")


def preprocess_image(path: str, cfg: dict) -> np.ndarray:
    """[1, 3, H, W] float32 pixels for the image file at ``path``."""
    from PIL import Image

    img = Image.open(path)
    if cfg.get("do_convert_rgb", True):
        img = img.convert("RGB")
    if cfg.get("do_resize", False):
        size = cfg.get("size") or {}
        if "height" in size and "width" in size:
            h, w = int(size["height"]), int(size["width"])
        elif "shortest_edge" in size:
            s = int(size["shortest_edge"])
            w0, h0 = img.size
            scale = s / min(w0, h0)
            h, w = max(1, round(h0 * scale)), max(1, round(w0 * scale))
        else:
            raise MetadataError(f"preprocessing: size {size!r} is neither {{height, width}} nor {{shortest_edge}}")
        img = img.resize((w, h), resample=int(cfg.get("resample", 3)))
    x = np.asarray(img, dtype=np.float32)
    if x.ndim == 2:
        x = x[:, :, None]
    if cfg.get("do_rescale", True):
        x = x * np.float32(cfg.get("rescale_factor", 1 / 255))
    if cfg.get("do_normalize", False):
        mean = np.asarray(cfg.get("image_mean", [0.5, 0.5, 0.5]), np.float32)
        std = np.asarray(cfg.get("image_std", [0.5, 0.5, 0.5]), np.float32)
        x = (x - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None]).astype(np.float32)
