"""The image transforms of onnxruntime-genai's ``processor_config.json``, as onnxruntime-extensions runs them.

A processor config lists transforms by ``type``; each is a function here from the previous step's value:

- ``DecodeImage`` (``color_space`` ``RGB`` or ``BGR``): encoded bytes -> ``(height, width, 3)`` uint8 in that
  channel order (Pillow decodes; palette, grey and alpha images are converted to 3 channels, alpha dropped);
- ``ConvertRGB``: reverses the channel order (onnxruntime-extensions swaps channels 0 and 2 whatever the
  order was, so ``BGR`` then ``ConvertRGB`` gives RGB);
- ``Phi3ImageTransform``: Phi-3-vision's HD transform: the image resized (bilinear) so that its longer side
  is a multiple of 336 and at most 16 crops of 336 x 336 cover it, padded with white to a multiple of 336 on
  the shorter side, normalized with CLIP's mean and standard deviation, then a bicubic 336 x 336 global view
  first and the crops after, zero crops up to 17; returns ``pixel_values`` ``(17, 3, 336, 336)`` float32,
  ``image_sizes`` ``(2,)`` (padded height, width) and ``num_img_tokens`` ``(1,)`` int64.

Resampling is Pillow's ``Image.resize`` with a box over the whole image: onnxruntime-extensions carries a copy
of Pillow's resampling code, so the bytes agree.  A transform this module does not have is an error naming it
(``UnsupportedTransform``); nothing is skipped.
"""
from __future__ import annotations

import io

import numpy as np

__all__ = ["UnsupportedTransform", "TRANSFORMS", "decode_image", "convert_rgb", "phi3_image_transform"]

_CROP = 336
_MAX_CROPS = 16
_TOKENS_PER_CROP = 144
_CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
_CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)


class UnsupportedTransform(NotImplementedError):
    """A processor config names a transform this runtime does not implement."""


def decode_image(data: bytes, color_space: str = "BGR") -> np.ndarray:
    from PIL import Image
    if color_space.upper() not in ("RGB", "BGR"):
        raise ValueError(f"DecodeImage: color_space must be RGB or BGR, got {color_space!r}")
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception as exc:
        raise ValueError(f"DecodeImage: the image cannot be decoded ({exc})") from None
    rgb = np.asarray(img.convert("RGB"), np.uint8)
    return np.ascontiguousarray(rgb[:, :, ::-1]) if color_space.upper() == "BGR" else rgb


def convert_rgb(image: np.ndarray) -> np.ndarray:
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"ConvertRGB: expected an (H, W, 3) image, got shape {list(image.shape)}")
    return np.ascontiguousarray(image[:, :, ::-1])


def _hd_transform(image: np.ndarray) -> np.ndarray:
    """Phi-3-vision's HD resize and white padding of an RGB uint8 image (onnxruntime-extensions' order)."""
    from PIL import Image
    h, w = image.shape[:2]
    ratio = w / h if w >= h else h / w
    scale = 1
    while scale * np.ceil(scale / ratio) <= _MAX_CROPS:
        scale += 1
    scale -= 1
    new_w = scale * _CROP
    new_h = int(new_w / ratio)
    if w < h:
        new_w, new_h = new_h, new_w
    resized = np.asarray(Image.fromarray(image, "RGB").resize((new_w, new_h), Image.BILINEAR, box=(0, 0, w, h)))
    if w < h:  # pad the width
        target = int(np.ceil(new_w / _CROP) * _CROP)
        left = int((target - new_w) / 2)
        out = np.full((new_h, target, 3), 255, np.uint8)
        out[:, left:left + new_w] = resized
    else:
        target = int(np.ceil(new_h / _CROP) * _CROP)
        top = int((target - new_h) / 2)
        out = np.full((target, new_w, 3), 255, np.uint8)
        out[top:top + new_h] = resized
    return out


def phi3_image_transform(image: np.ndarray, **_attrs) -> tuple:
    """``(pixel_values, image_sizes, num_img_tokens)`` of one RGB image (the config's ``num_crops`` and
    ``num_img_tokens`` attributes are not read: onnxruntime-extensions fixes 16 crops and 144 tokens)."""
    from PIL import Image
    hd = _hd_transform(image)
    h, w = hd.shape[:2]
    chw = ((hd.astype(np.float32) / np.float32(255.0) - _CLIP_MEAN) / _CLIP_STD).transpose(2, 0, 1)
    chw = np.ascontiguousarray(chw, np.float32)
    out = np.zeros((_MAX_CROPS + 1, 3, _CROP, _CROP), np.float32)
    for k in range(3):
        plane = Image.fromarray(chw[k], "F").resize((_CROP, _CROP), Image.BICUBIC, box=(0, 0, w, h))
        out[0, k] = np.asarray(plane, np.float32)
    m, n = h // _CROP, w // _CROP
    crops = chw.reshape(3, m, _CROP, n, _CROP).transpose(1, 3, 0, 2, 4).reshape(m * n, 3, _CROP, _CROP)
    out[1:1 + m * n] = crops
    tokens = (m * n + 1) * _TOKENS_PER_CROP + 1 + (m + 1) * 12
    return out, np.array([h, w], np.int64), np.array([tokens], np.int64)


TRANSFORMS = {"DecodeImage": decode_image, "ConvertRGB": convert_rgb, "Phi3ImageTransform": phi3_image_transform}
