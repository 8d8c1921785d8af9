"""ImageDecoder (opset 20): an encoded image (BMP, JPEG, JPEG 2000, PNG, PNM, TIFF, WebP: what Pillow reads) to
an ``(height, width, channels)`` uint8 tensor, as the ONNX reference decodes it with Pillow.

``pixel_format`` RGB gives 3 channels (an image stored otherwise, palette or RGBA, is converted to RGB), BGR the
same channels reversed, Grayscale 1 channel (Pillow's ``L`` conversion).  Decoding is Pillow's, so an image
decodes to the bits the reference gives with the same Pillow.

Invariants:
- the header is read first and an image whose pixels would pass the session's output limit is refused before
  any pixel is decoded (a small stream can declare a huge image);
- a stream Pillow cannot read is an ``InvalidArgumentError`` naming the pixel format and Pillow's reason.
"""
from __future__ import annotations

import io

import numpy as np

from runtime.errors import InvalidArgumentError, InvalidAttributeError
from ._common import check_output_size
from .registry import op

_CHANNELS = {"RGB": 3, "BGR": 3, "Grayscale": 1}


@op("ImageDecoder", 20)
def ImageDecoder(encoded_stream, *, ctx=None, pixel_format="RGB"):
    """ImageDecoder on the CPU, through Pillow."""
    fmt = pixel_format.decode() if isinstance(pixel_format, bytes) else str(pixel_format)
    if fmt not in _CHANNELS:
        raise InvalidAttributeError(f"ImageDecoder: pixel_format must be one of {list(_CHANNELS)}, got {fmt!r}")
    data = np.asarray(encoded_stream)
    if data.dtype != np.uint8 or data.ndim != 1:
        raise InvalidArgumentError(f"ImageDecoder: encoded_stream must be a 1-d uint8 tensor, got {data.dtype} of "
                                   f"shape {list(data.shape)}")
    import PIL.Image
    try:
        img = PIL.Image.open(io.BytesIO(data.tobytes()))
        w, h = img.size
        check_output_size((h, w, _CHANNELS[fmt]), np.uint8)
        img = img.convert("L" if fmt == "Grayscale" else "RGB")
        decoded = np.asarray(img, dtype=np.uint8)
    except InvalidArgumentError:
        raise
    except Exception as e:  # noqa: BLE001 - Pillow's errors for unreadable, truncated or oversized streams
        raise InvalidArgumentError(f"ImageDecoder ({fmt}): cannot decode the {data.size}-byte stream: "
                                   f"{type(e).__name__}: {e}") from None
    if fmt == "Grayscale":
        return np.ascontiguousarray(decoded[:, :, None])
    if fmt == "BGR":
        return np.ascontiguousarray(decoded[:, :, ::-1])
    return np.ascontiguousarray(decoded)
