"""ImageDecoder (ops/image_decoder.py): Pillow's decoding in the three pixel formats, images stored with other
modes converted, unreadable streams and images past the output limit refused before decoding."""
import io

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from PIL import Image

from runtime import InferenceSession, SessionOptions
from runtime.errors import InvalidArgumentError

RNG = np.random.default_rng(3)


def _model(pixel_format):
    node = helper.make_node("ImageDecoder", ["data"], ["image"], pixel_format=pixel_format)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("data", TensorProto.UINT8, [None])],
                          [helper.make_tensor_value_info("image", TensorProto.UINT8, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    return m


def _encode(array, mode, fmt="PNG"):
    buf = io.BytesIO()
    Image.fromarray(array, mode).save(buf, format=fmt)
    return np.frombuffer(buf.getvalue(), np.uint8)


@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_an_rgb_png_decodes_as_the_reference_does(pixel_format):
    data = _encode(RNG.integers(0, 256, (7, 5, 3), dtype=np.uint8), "RGB")
    m = _model(pixel_format)
    got = InferenceSession(m.SerializeToString()).run(None, {"data": data})[0]
    want = ReferenceEvaluator(m).run(None, {"data": data})[0]
    assert got.dtype == np.uint8 and got.shape == (7, 5, 1 if pixel_format == "Grayscale" else 3)
    np.testing.assert_array_equal(got, want)


def test_an_image_stored_with_alpha_comes_out_with_three_channels():
    rgba = RNG.integers(0, 256, (4, 6, 4), dtype=np.uint8)
    rgba[..., 3] = 255
    got = InferenceSession(_model("RGB").SerializeToString()).run(None, {"data": _encode(rgba, "RGBA")})[0]
    np.testing.assert_array_equal(got, rgba[..., :3])


def test_an_unreadable_stream_is_refused():
    s = InferenceSession(_model("RGB").SerializeToString())
    with pytest.raises(InvalidArgumentError, match="cannot decode"):
        s.run(None, {"data": np.arange(40, dtype=np.uint8)})


def test_an_image_past_the_output_limit_is_refused_before_decoding():
    so = SessionOptions()
    so.max_output_bytes = 500  # a 16 x 16 RGB image takes 768
    s = InferenceSession(_model("RGB").SerializeToString(), so)
    with pytest.raises(InvalidArgumentError, match="limit"):
        s.run(None, {"data": _encode(np.zeros((16, 16, 3), np.uint8), "RGB")})
