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
  ``image_sizes`` ``(2,)`` (padded height, width) and ``num_img_tokens`` ``(1,)`` int64;
- ``Resize`` (fixed size, or Qwen's ``smart_resize`` to a multiple of ``patch_size * merge_size`` within a
  pixel budget), ``Rescale`` (times ``rescale_factor`` in float32), ``Normalize`` (``(x - mean) / std``;
  ``qwen2_5_vl`` reverses the channels first) and ``PatchImage`` (Qwen's ``patch_size`` squares with the frame
  repeated ``temporal_patch_size`` times, in groups of ``merge_size``): the Qwen2.5-VL and Qwen3-VL chain, whose
  last step returns ``pixel_values`` ``(patches, C * 2 * patch_size**2)`` and ``image_grid_thw`` ``(1, 3)``;
- ``CenterCrop`` (``height`` x ``width`` from the middle) and ``Permute3D`` (axes reordered, ``dims``): with
  ``Resize``, ``Rescale`` and ``Normalize`` the Gemma 3 chain, whose last step returns ``(3, H, W)``;
- ``Phi4VisionDynamicPreprocess``, ``Rescale``, ``Normalize`` and ``Phi4VisionProcessor``: Phi-4-multimodal's
  chain.  The first picks a grid of at most ``dynamic_hd`` crops of ``dyhd_base_resolution`` (448) pixels, resizes
  the image (bilinear) into it keeping its aspect ratio and pads it with white on the right or bottom; it returns a
  ``Phi4HDImage``: the image with its attention mask (one value per 14 x 14 patch, 0 over the padding), which
  ``Rescale`` and ``Normalize`` pass on untouched (the config's ``"inputs": [":0",
  "phi4_vision_dynamic_preprocess:1"]``).  The last returns ``pixel_values`` ``(1 + crops, 3, 448, 448)`` float32
  (a bicubic global view first), ``image_sizes`` ``(2,)``, ``image_attention_mask`` ``(1 + crops, 32, 32)`` int64
  and ``num_img_tokens`` ``(1,)``; ``phi4_stack`` stacks several images' as onnxruntime-extensions does.
- ``PixtralImageSizes``: after the Qwen-style ``Resize`` (``smart_resize``), ``Rescale``, ``Normalize`` and
  ``Permute3D``, Pixtral's (Mistral 3's) last step: the ``(3, H, W)`` image and its ``(H, W)``; ``pixtral_stack``
  stacks several, zero-padded to the largest height and width.
- ``Gemma4ImageTransform``: Gemma 4's chain after ``DecodeImage`` (RGB).  The image is resized, keeping its aspect
  ratio, to sides that are multiples of ``pooling_kernel_size * patch_size`` within ``max_soft_tokens`` pooled
  tokens, by onnxruntime-extensions' float bicubic resampler (``_bicubic_float``: Pillow's kernel and weights, but
  sums kept in float, the rescale to ``[0, 1]`` inside the horizontal pass, no rounding to bytes, no clamping), and
  cut into ``patch_size`` squares row by row; returns ``pixel_values`` ``(patches, patch_size**2 * 3)`` float32,
  ``pixel_position_ids`` ``(patches, 2)`` int64 and ``num_soft_tokens`` ``(1,)``.

Resampling (Gemma 4's aside) is Pillow's, one pass per axis, horizontal first: onnxruntime-extensions carries a copy
of Pillow's resampling code and always runs the passes in that order, so the bytes agree. A transform this module
does not have is an error naming it (``UnsupportedTransform``); nothing is skipped.
"""
from __future__ import annotations

import io
from typing import NamedTuple

import numpy as np

from .spec import RequestError

__all__ = ["UnsupportedTransform", "TRANSFORMS", "decode_image", "convert_rgb", "phi3_image_transform", "resize",
           "rescale", "normalize", "patch_image", "center_crop", "permute3d", "Phi4HDImage", "pixtral_image_sizes",
           "pixtral_stack", "phi4_dynamic_preprocess", "phi4_vision_processor", "phi4_stack", "gemma4_image_transform"]

_CROP = 336
_MAX_CROPS = 16
_TOKENS_PER_CROP = 144
_CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
_CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)


class UnsupportedTransform(NotImplementedError):
    """A processor config names a transform this runtime does not implement."""


class Phi4HDImage(NamedTuple):
    """``Phi4VisionDynamicPreprocess``'s two outputs: the padded ``(H, W, 3)`` image (uint8, float32 after
    ``Rescale``) and its ``(H // 14, W // 14)`` int64 attention mask, which ``Rescale`` and ``Normalize`` carry to
    ``Phi4VisionProcessor`` unchanged."""

    image: np.ndarray
    attention_mask: np.ndarray


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


def _resample(img, size: tuple, flt):
    """Pillow's resampling of a PIL image to ``size`` (width, height) over the whole image, the horizontal pass
    first and then the vertical (onnxruntime-extensions' order; Pillow itself may take the vertical pass first,
    and the rounding between the passes then differs)."""
    w, h = img.size
    if size[0] != w:
        img = img.resize((size[0], h), flt, box=(0, 0, w, h))
    if size[1] != h:
        img = img.resize(size, flt, box=(0, 0, size[0], h))
    return img


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
    resized = np.asarray(_resample(Image.fromarray(image, "RGB"), (new_w, new_h), Image.BILINEAR))
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
        plane = _resample(Image.fromarray(chw[k], "F"), (_CROP, _CROP), Image.BICUBIC)
        out[0, k] = np.asarray(plane, np.float32)
    m, n = h // _CROP, w // _CROP
    crops = chw.reshape(3, m, _CROP, n, _CROP).transpose(1, 3, 0, 2, 4).reshape(m * n, 3, _CROP, _CROP)
    out[1:1 + m * n] = crops
    tokens = (m * n + 1) * _TOKENS_PER_CROP + 1 + (m + 1) * 12
    return out, np.array([h, w], np.int64), np.array([tokens], np.int64)


def _smart_size(h: int, w: int, factor: int, min_pixels: int, max_pixels: int, max_ratio: float = 200.0):
    """Qwen's ``smart_resize`` target (height, width): each a multiple of ``factor``, the pixel count within
    [min_pixels, max_pixels], the aspect ratio kept as nearly as that allows (onnxruntime-extensions' integer
    and float64 steps)."""
    import math
    if max(h, w) / min(h, w) > max_ratio:
        raise ValueError(f"Resize: absolute aspect ratio must be smaller than {max_ratio:g}, got {h}x{w}")

    def round_by(n):  # C's std::round: halves away from zero
        return int(math.floor(n / factor + 0.5)) * factor

    h_bar, w_bar = max(factor, round_by(h)), max(factor, round_by(w))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        h_bar = int(math.floor(int(h / beta) / factor) * factor)
        w_bar = int(math.floor(int(w / beta) / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        h_bar = int(math.ceil(int(h * beta) / factor) * factor)
        w_bar = int(math.ceil(int(w * beta) / factor) * factor)
    return h_bar, w_bar


_FILTERS = {"NEAREST": 0, "LINEAR": 2, "CUBIC": 3, "LANCZOS": 1}  # Pillow's resampling constants


def resize(image: np.ndarray, height: int = 256, width: int = 256, keep_aspect_ratio: int = 1,
           interpolation: str = "CUBIC", smart_resize: int = 0, min_pixels: int = 3136, max_pixels: int = 12845056,
           patch_size: int = 14, merge_size: int = 2) -> np.ndarray:
    """onnxruntime-extensions' ``Resize``: to ``(height, width)``, or with ``smart_resize`` to Qwen's size for
    the image (a multiple of ``patch_size * merge_size``); Pillow's filter over the whole image."""
    from PIL import Image
    if interpolation not in _FILTERS:
        raise ValueError(f"Resize: interpolation must be one of {sorted(_FILTERS)}, got {interpolation!r}")
    h, w = image.shape[:2]
    th, tw = (_smart_size(h, w, patch_size * merge_size, min_pixels, max_pixels) if smart_resize
              else (int(height), int(width)))
    if keep_aspect_ratio:  # scales by max(target / target) = 1 here, as onnxruntime-extensions computes it
        scale = max(tw / tw, th / th)
        tw, th = int(tw * scale), int(th * scale)
    out = _resample(Image.fromarray(np.ascontiguousarray(image), "RGB"), (tw, th), _FILTERS[interpolation])
    return np.asarray(out, np.uint8)


def rescale(image: np.ndarray, rescale_factor: float = 1.0 / 255.0) -> np.ndarray:
    """``image`` times ``rescale_factor`` in float32 (a ``Phi4HDImage``'s image, its mask passed on)."""
    if isinstance(image, Phi4HDImage):
        return image._replace(image=rescale(image.image, rescale_factor))
    return image.astype(np.float32) * np.float32(rescale_factor)


def normalize(image: np.ndarray, mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711),
              qwen2_5_vl: int = 0, qwen3_vl: int = 0) -> np.ndarray:
    """``(x - mean) / std`` per channel in float32; with ``qwen2_5_vl`` (or ``qwen3_vl``) the channels are
    reversed first (the config's decode and ``ConvertRGB`` left them BGR).  A ``Phi4HDImage``'s image is
    normalized and its mask passed on."""
    if isinstance(image, Phi4HDImage):
        return image._replace(image=normalize(image.image, mean, std, qwen2_5_vl, qwen3_vl))
    x = image[:, :, ::-1] if (qwen2_5_vl or qwen3_vl) else image
    return np.ascontiguousarray((x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32), np.float32)


def patch_image(image: np.ndarray, patch_size: int = 14, temporal_patch_size: int = 2, merge_size: int = 2):
    """Qwen's patches of an (H, W, C) float image: the frame repeated to ``temporal_patch_size``, cut into
    ``patch_size`` squares grouped ``merge_size`` by ``merge_size``; returns ``(pixel_values [patches,
    C * temporal_patch_size * patch_size**2], image_grid_thw [1, 3])``."""
    h, w, c = image.shape
    gh, gw = h // patch_size, w // patch_size
    if gh % merge_size or gw % merge_size or gh * patch_size != h or gw * patch_size != w:
        raise ValueError(f"PatchImage: a {h}x{w} image does not split into {patch_size}-pixel patches in groups "
                         f"of {merge_size}")
    frames = np.repeat(image.transpose(2, 0, 1)[None], temporal_patch_size, axis=0)  # [tp, C, H, W]
    x = frames.reshape(1, temporal_patch_size, c, gh // merge_size, merge_size, patch_size, gw // merge_size,
                       merge_size, patch_size)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(gh * gw, c * temporal_patch_size * patch_size * patch_size)
    return np.ascontiguousarray(x, np.float32), np.array([[1, gh, gw]], np.int64)


def center_crop(image: np.ndarray, height: int = 224, width: int = 224) -> np.ndarray:
    h, w = image.shape[:2]
    if height > h or width > w:
        raise ValueError(f"CenterCrop: a {height}x{width} crop does not fit a {h}x{w} image")
    top, left = (h - height) // 2, (w - width) // 2
    return np.ascontiguousarray(image[top:top + height, left:left + width])


def permute3d(image: np.ndarray, dims=(2, 0, 1)) -> np.ndarray:
    dims = [int(d) for d in dims]
    if image.ndim != 3 or sorted(dims) != [0, 1, 2]:
        raise ValueError(f"Permute3D: expected a 3-d image and a permutation of 0, 1, 2, got shape "
                         f"{list(image.shape)} and dims {dims}")
    return np.ascontiguousarray(image.transpose(dims))


def pixtral_image_sizes(image: np.ndarray) -> tuple:
    """onnxruntime-extensions' ``PixtralImageSizes``: the ``(3, H, W)`` float image unchanged and its ``(H, W)``
    (int64), which say how much of a zero-padded stack of several images is the image (``pixtral_stack``)."""
    if image.ndim != 3 or image.dtype != np.float32:
        raise ValueError(f"PixtralImageSizes: expected a 3-d CHW float32 image, got shape {list(image.shape)} "
                         f"{image.dtype}")
    return image, np.array(image.shape[1:], np.int64)


def pixtral_stack(results: list) -> tuple:
    """Several images' ``PixtralImageSizes`` results as ``pixel_values`` ``(N, 3, max H, max W)``, each image at
    the top left and zeros after, and ``image_sizes`` ``(N, 2)``."""
    h = max(img.shape[1] for img, _ in results)
    w = max(img.shape[2] for img, _ in results)
    pixels = np.zeros((len(results), results[0][0].shape[0], h, w), np.float32)
    for k, (img, _) in enumerate(results):
        pixels[k, :, :img.shape[1], :img.shape[2]] = img
    return pixels, np.stack([size for _, size in results]).astype(np.int64)


_PHI4_PATCH = 14  # pixels per attention-mask value


def _phi4_grid(width: int, height: int, max_num: int, size: int) -> tuple:
    """(columns, rows) of ``size``-pixel crops for a ``width`` x ``height`` image, onnxruntime-extensions'
    ``DynamicPreprocess`` with ``min_num`` 1 (its float32 arithmetic): ``ceil(side / size)`` each way if at most
    ``max_num`` crops; else the grid ``(i, j)``, ``i * j <= max_num``, whose ``i / j`` is nearest the image's
    aspect ratio (``FindClosestAspectRatio``): the candidates in ascending ``i * j``, and a later candidate at an
    equal distance replaces the best when the image's area exceeds half the grid's pixel area.  Within one
    ``i * j`` onnxruntime-extensions' unstable sort may order the grids otherwise; no two grids of one ``i * j`` are
    neighbours among the ratios, so that order cannot decide a tie.  (For ``dynamic_hd`` up to 48 at 448 pixels and
    sides up to 16384, every image that reaches the search and ties exactly has the area, so the largest of the tied
    grids wins.)"""
    f32 = np.float32
    cols = int(np.ceil(f32(width) / f32(size)))
    rows = int(np.ceil(f32(height) / f32(size)))
    if cols * rows <= max_num:
        return cols, rows
    aspect = f32(width) / f32(height)
    grids = sorted(((i, j) for i in range(1, max_num + 1) for j in range(1, max_num // i + 1)),
                   key=lambda g: g[0] * g[1])
    best, best_diff, area = (1, 1), f32(np.inf), width * height
    for i, j in grids:
        diff = abs(aspect - f32(i) / f32(j))
        if diff < best_diff:
            best, best_diff = (i, j), diff
        elif diff == best_diff and area > 0.5 * size * size * i * j:
            best = (i, j)
    return best


def phi4_dynamic_preprocess(image: np.ndarray, dynamic_hd: int = 36, dyhd_base_resolution: int = 448) -> Phi4HDImage:
    """onnxruntime-extensions' ``Phi4VisionDynamicPreprocess`` of an ``(H, W, 3)`` uint8 RGB image: the crop grid
    (``_phi4_grid``), the image resized (Pillow's bilinear, horizontal pass first) to fill the grid's width or its
    height, whichever scale is smaller (the other side ``int(side * scale)``, float32), white padding on the right
    and bottom, and the attention mask ``(32 * rows, 32 * columns)`` with its last ``padding // 14`` columns or
    rows 0 where the padding is at least 14 pixels.  A side under 10 pixels after the resize is an error (the
    aspect ratio is very extreme)."""
    from PIL import Image
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        shape = list(getattr(image, "shape", []))
        raise RequestError(f"Phi4VisionDynamicPreprocess: expected an (H, W, 3) uint8 RGB image, got shape {shape}"
                           f"{'' if not shape else ' ' + str(image.dtype)}")
    size, max_num = int(dyhd_base_resolution), int(dynamic_hd)
    if size < _PHI4_PATCH or max_num < 1:
        raise RequestError(f"Phi4VisionDynamicPreprocess: dyhd_base_resolution must be at least {_PHI4_PATCH} and "
                           f"dynamic_hd at least 1, got {size} and {max_num}")
    h, w = image.shape[:2]
    cols, rows = _phi4_grid(w, h, max_num, size)
    target_w, target_h = cols * size, rows * size
    f32 = np.float32
    scale_w, scale_h = f32(target_w) / f32(w), f32(target_h) / f32(h)
    if scale_w < scale_h:
        new_w, new_h = target_w, int(f32(h) * scale_w)
    else:
        new_w, new_h = int(f32(w) * scale_h), target_h
    if min(new_w, new_h) < 10:
        raise RequestError(f"Phi4VisionDynamicPreprocess: the aspect ratio is very extreme: a {w}x{h} image would be "
                           f"resized to {new_w}x{new_h} in a {cols}x{rows} grid of {size}-pixel crops")
    m = size // _PHI4_PATCH
    mask = np.ones((m * rows, m * cols), np.int64)
    pad_w, pad_h = target_w - new_w, target_h - new_h
    if pad_w >= _PHI4_PATCH:
        mask[:, mask.shape[1] - pad_w // _PHI4_PATCH:] = 0
    if pad_h >= _PHI4_PATCH:
        mask[mask.shape[0] - pad_h // _PHI4_PATCH:, :] = 0
    resized = np.asarray(_resample(Image.fromarray(np.ascontiguousarray(image), "RGB"), (new_w, new_h),
                                   Image.BILINEAR), np.uint8)
    out = np.full((target_h, target_w, 3), 255, np.uint8)
    out[:new_h, :new_w] = resized
    return Phi4HDImage(out, mask)


def phi4_vision_processor(value: Phi4HDImage, dyhd_base_resolution: int = 448, interpolation: str = "CUBIC") -> tuple:
    """onnxruntime-extensions' ``Phi4VisionProcessor`` of the normalized ``Phi4HDImage``: ``(pixel_values
    [1 + crops, 3, size, size] float32, image_sizes [2] int64, image_attention_mask [1 + crops, size // 14,
    size // 14] int64, num_img_tokens [1] int64)``.  The global view is each channel resized to ``size`` x
    ``size`` by Pillow's bicubic filter on a float image (onnxruntime-extensions validates ``interpolation`` but
    always takes bicubic, and so does this); the crops follow row by row, the global view's mask all ones before
    the crops' masks; ``image_sizes`` is the padded image's (height, width); ``num_img_tokens`` is
    ``256 + 1 + 16`` plus the mask's values at even rows and even columns plus its even rows' first values
    (``CountTokenNumber``)."""
    from PIL import Image
    if not isinstance(value, Phi4HDImage):
        raise RequestError("Phi4VisionProcessor: expected the output of Phi4VisionDynamicPreprocess (the image and "
                           "its attention mask), through Rescale and Normalize; got "
                           f"{type(value).__name__}")
    if interpolation not in _FILTERS:
        raise RequestError(f"Phi4VisionProcessor: interpolation must be one of {sorted(_FILTERS)}, got "
                           f"{interpolation!r}")
    hd, mask = np.asarray(value.image, np.float32), np.asarray(value.attention_mask, np.int64)
    size = int(dyhd_base_resolution)
    m = size // _PHI4_PATCH
    if (hd.ndim != 3 or hd.shape[2] != 3 or hd.shape[0] % size or hd.shape[1] % size or mask.ndim != 2
            or mask.shape[0] * _PHI4_PATCH != hd.shape[0] or mask.shape[1] * _PHI4_PATCH != hd.shape[1]):
        raise RequestError(f"Phi4VisionProcessor: expected a 3-channel image in {size}-pixel crops and its "
                           f"{_PHI4_PATCH}-pixel mask, got image shape {list(hd.shape)} and mask shape "
                           f"{list(mask.shape)} (is dyhd_base_resolution the dynamic preprocess's?)")
    h, w = hd.shape[:2]
    rows, cols = h // size, w // size
    pixels = np.empty((1 + rows * cols, 3, size, size), np.float32)
    for k in range(3):
        plane = Image.fromarray(np.ascontiguousarray(hd[:, :, k]), "F")
        pixels[0, k] = np.asarray(_resample(plane, (size, size), Image.BICUBIC), np.float32)
    pixels[1:] = hd.reshape(rows, size, cols, size, 3).transpose(0, 2, 4, 1, 3).reshape(-1, 3, size, size)
    masks = np.ones((1 + rows * cols, m, m), np.int64)
    masks[1:] = mask.reshape(rows, m, cols, m).transpose(0, 2, 1, 3).reshape(-1, m, m)
    tokens = 256 + 1 + 16 + int(mask[::2, ::2].sum()) + int(mask[::2, 0].sum())
    return pixels, np.array([h, w], np.int64), masks, np.array([tokens], np.int64)


def phi4_stack(results: list) -> tuple:
    """Several images' ``phi4_vision_processor`` tuples stacked as onnxruntime-extensions' ``StackTensors`` and
    ``phi4-vision-aligner`` return them: ``(pixel_values [n, most, 3, size, size] float32, image_sizes [n, 2]
    int64, image_attention_mask [n, most, m, m] float32, num_image_tokens [n, 1] int64)``, ``most`` the largest
    crop count; an image with fewer crops is padded with zero pixels and zero masks, then every mask whose
    top-left value is not positive (the padding's, or a crop's that begins in the image's padding) becomes all
    ones."""
    if not results:
        raise RequestError("phi4_stack: no images")
    most = max(r[0].shape[0] for r in results)
    n = len(results)
    first_pixels, first_mask = results[0][0], results[0][2]
    pixels = np.zeros((n, most) + first_pixels.shape[1:], np.float32)
    masks = np.zeros((n, most) + first_mask.shape[1:], np.float32)
    for i, (pv, _, mk, _) in enumerate(results):
        if pv.shape[1:] != first_pixels.shape[1:] or mk.shape[1:] != first_mask.shape[1:]:
            raise RequestError(f"phi4_stack: images of crop shape {list(pv.shape[1:])} and "
                               f"{list(first_pixels.shape[1:])} cannot be stacked")
        pixels[i, :pv.shape[0]] = pv
        masks[i, :mk.shape[0]] = mk
    masks[masks[:, :, 0, 0] <= 0] = 1.0
    sizes = np.stack([np.asarray(r[1], np.int64).reshape(2) for r in results])
    tokens = np.stack([np.asarray(r[3], np.int64).reshape(1) for r in results])
    return pixels, sizes, masks, tokens


def _cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic kernel (a = -0.5) in float64, written as onnxruntime-extensions' ``bicubic_kernel`` writes it
    (Pillow's outer branch, ``-0.5`` times ``((x - 5) x + 8) x - 4``, gives the same doubles: the factor is a power
    of two)."""
    x = np.abs(x)
    inner = ((1.5 * x - 2.5) * x) * x + 1.0
    outer = ((-0.5 * x + 2.5) * x - 4.0) * x + 2.0
    return np.where(x < 1.0, inner, np.where(x < 2.0, outer, 0.0))


def _cubic_coeffs(in_size: int, out_size: int) -> tuple:
    """``(start [out], count [out], weights [out, taps])`` of a bicubic pass from ``in_size`` to ``out_size`` samples
    over the whole axis: Pillow's ``precompute_coeffs`` as onnxruntime-extensions' ``image_resample_float.h`` has it
    (support 2 widened by the downscale, the window clipped to the axis, each row of weights summed tap by tap in
    float64 and divided by that sum; weights past ``count`` are 0)."""
    scale = float(in_size) / out_size
    filter_scale = max(scale, 1.0)
    support = 2.0 * filter_scale
    taps = int(np.ceil(support)) * 2 + 1
    center = (np.arange(out_size) + 0.5) * scale
    start = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C's int cast truncates toward zero
    count = np.minimum((center + support + 0.5).astype(np.int64), in_size) - start
    weights = np.zeros((out_size, taps))
    total = np.zeros(out_size)
    inv = 1.0 / filter_scale
    for j in range(taps):
        live = j < count
        w = np.where(live, _cubic(((j + start) - center + 0.5) * inv), 0.0)
        weights[:, j] = w
        total = np.where(live, total + w, total)
    weights = np.where(total[:, None] != 0.0, weights / np.where(total == 0.0, 1.0, total)[:, None], weights)
    return start, count, weights


def _cubic_pass(src: np.ndarray, axis: int, out_size: int) -> np.ndarray:
    """One float64 bicubic pass of ``src`` along ``axis`` (0 rows, 1 columns): each output sample's taps added in
    order from the window's start, as the C loops add them."""
    start, _, weights = _cubic_coeffs(src.shape[axis], out_size)
    last = src.shape[axis] - 1
    shape = [1, 1, 1]
    shape[axis] = out_size
    acc = np.zeros(src.shape[:axis] + (out_size,) + src.shape[axis + 1:])
    for j in range(weights.shape[1]):
        # taps past the window have weight 0 (adding +0.0 changes nothing); clip their index into the axis
        acc += np.take(src, np.minimum(start + j, last), axis=axis) * weights[:, j].reshape(shape)
    return acc


def _bicubic_float(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """onnxruntime-extensions' ``BicubicResizeU8ToFloatRGB``: an ``(H, W, 3)`` uint8 image to ``(height, width, 3)``
    float32 in ``[0, 1]`` plus bicubic overshoot (no clamping).  Horizontal pass first, on the bytes in float64,
    each sum times ``1 / 255`` (float64) and then rounded to float32; the vertical pass sums those float32 values in
    float64 and rounds to float32.  Without a horizontal pass the bytes are first scaled in float32 (``x *
    float32(1 / 255)``); without either pass that scaling is the output."""
    h, w = image.shape[:2]
    if w != width:
        out = (_cubic_pass(image.astype(np.float64), 1, width) * (1.0 / 255.0)).astype(np.float32)
    else:
        out = image.astype(np.float32) * np.float32(1.0 / 255.0)
    if h != height:
        out = _cubic_pass(out.astype(np.float64), 0, height).astype(np.float32)
    return out


def _gemma4_size(h: int, w: int, patch_size: int, max_patches: int, pooling: int) -> tuple:
    """onnxruntime-extensions' ``GetAspectRatioPreservingSize``: (height, width), each ``floor(side * factor /
    side_mult) * side_mult`` with ``factor = sqrt(max_patches * patch_size**2 / (h * w))`` (float64) and ``side_mult
    = pooling * patch_size``; a side that comes out 0 becomes ``side_mult`` and the other ``floor(long / short) *
    side_mult``, at most ``max_patches // pooling**2 * side_mult`` (and at least ``side_mult``); (0, 0) when both
    come out 0."""
    import math
    mult = pooling * patch_size
    factor = math.sqrt(float(max_patches) * patch_size * patch_size / (float(h) * w))
    th = int(math.floor(factor * h / mult)) * mult
    tw = int(math.floor(factor * w / mult)) * mult
    most = (max_patches // (pooling * pooling)) * mult
    if th == 0 and tw == 0:
        return 0, 0
    if th == 0:
        th, tw = mult, min(int(math.floor(w / h)) * mult, most) or mult
    elif tw == 0:
        tw, th = mult, min(int(math.floor(h / w)) * mult, most) or mult
    return th, tw


def gemma4_image_transform(image: np.ndarray, patch_size: int = 16, max_soft_tokens: int = 280,
                           pooling_kernel_size: int = 3, **unknown) -> tuple:
    """onnxruntime-extensions' ``Gemma4ImageTransform`` of one ``(H, W, 3)`` uint8 RGB image, as onnxruntime-genai
    (0.18) hands it to the vision model: ``(pixel_values [patches, patch_size**2 * 3] float32, pixel_position_ids
    [patches, 2] int64, num_soft_tokens [1] int64)``.

    - size: ``_gemma4_size`` with ``max_patches = max_soft_tokens * pooling_kernel_size**2``: both sides rounded
      down to multiples of ``pooling_kernel_size * patch_size`` (48), the aspect ratio kept; a side that rounds to 0
      (an aspect ratio past about ``max_soft_tokens``) is one multiple and the other as long as the budget allows;
      both 0 (only when ``max_soft_tokens`` is under 1) is an error;
    - resize: ``_bicubic_float`` (Keys' cubic, a = -0.5, antialiased, float64 sums, no clamping, the 1 / 255 rescale
      inside the horizontal pass), so values may lie a little outside ``[0, 1]``;
    - patches: row by row over the resized image (``patch = row * columns + column``), each patch's pixels in
      raster order with the 3 channels innermost (HWC); ``pixel_position_ids`` are ``(x, y) = (column, row)``;
    - ``num_soft_tokens`` is ``patches // pooling_kernel_size**2``.

    onnxruntime-extensions pads both outputs to ``max_patches`` rows (zero pixels, positions ``(-1, -1)``);
    onnxruntime-genai then keeps the first ``num_soft_tokens * 9`` rows (its pooling is fixed at 3 x 3) when that is
    fewer, and this returns those rows: with ``pooling_kernel_size`` 3, exactly the image's patches, no padding.
    (With another pooling size the padding rows that onnxruntime-genai keeps come back too.)"""
    if unknown:
        raise RequestError(f"[Gemma4ImageTransform]: unknown attribute '{sorted(unknown)[0]}'")
    try:
        ps, soft_most, pool = int(patch_size), int(max_soft_tokens), int(pooling_kernel_size)
    except (TypeError, ValueError):
        raise RequestError(f"[Gemma4ImageTransform]: patch_size, max_soft_tokens and pooling_kernel_size must be "
                           f"integers, got {patch_size!r}, {max_soft_tokens!r} and {pooling_kernel_size!r}") from None
    if ps < 1 or pool < 1 or soft_most < 0:
        raise RequestError(f"[Gemma4ImageTransform]: patch_size and pooling_kernel_size must be at least 1 and "
                           f"max_soft_tokens at least 0, got {ps}, {pool} and {soft_most}")
    if (not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8
            or 0 in image.shape):
        raise RequestError("[Gemma4ImageTransform]: expected (H, W, 3) uint8 input, got shape "
                           f"{list(getattr(image, 'shape', []))}")
    h, w = image.shape[:2]
    max_patches = soft_most * pool * pool
    th, tw = _gemma4_size(h, w, ps, max_patches, pool)
    if th == 0 or tw == 0:
        raise RequestError(f"[Gemma4ImageTransform]: image has extreme aspect ratio ({h}, {w}) and cannot be "
                           f"resized to fit the patch constraints")
    resized = _bicubic_float(np.ascontiguousarray(image), th, tw)
    rows, cols = th // ps, tw // ps
    patches = rows * cols
    keep = min(patches // (pool * pool) * 9, max_patches)  # onnxruntime-genai's trim (3 x 3 pooling assumed)
    real = resized.reshape(rows, ps, cols, ps, 3).transpose(0, 2, 1, 3, 4).reshape(patches, ps * ps * 3)
    pixels = np.zeros((keep, ps * ps * 3), np.float32)
    positions = np.full((keep, 2), -1, np.int64)
    n = min(patches, keep)
    pixels[:n] = real[:n]
    grid_y, grid_x = np.divmod(np.arange(n, dtype=np.int64), cols)
    positions[:n, 0], positions[:n, 1] = grid_x, grid_y
    return pixels, positions, np.array([patches // (pool * pool)], np.int64)


TRANSFORMS = {"DecodeImage": decode_image, "ConvertRGB": convert_rgb, "Phi3ImageTransform": phi3_image_transform,
              "Resize": resize, "Rescale": rescale, "Normalize": normalize, "PatchImage": patch_image,
              "CenterCrop": center_crop, "Permute3D": permute3d,
              "Phi4VisionDynamicPreprocess": phi4_dynamic_preprocess, "Phi4VisionProcessor": phi4_vision_processor,
              "Gemma4ImageTransform": gemma4_image_transform, "PixtralImageSizes": pixtral_image_sizes}
