"""Convolution, pooling and resampling kernels against onnxruntime on realistic shapes.

Each case builds a one-node model with onnx.helper (weights as initializers), runs it through
``runtime.InferenceSession`` and ``onnxruntime.InferenceSession``, and compares every output with a
per-dtype tolerance.  MaxUnpool indices outside the output must raise ``IndexOutOfRangeError``.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession
from runtime.dtypes import onnx_type
from runtime.errors import IndexOutOfRangeError, ShapeMismatchError

RNG = np.random.default_rng(0)


def _model(op_type, feeds, inits=None, n_out=1, opset=19, **attrs):
    inits = inits or {}
    in_names = list(feeds) + list(inits)
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, in_names, outs, **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, onnx_type(v.dtype), list(v.shape)) for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m.SerializeToString()


def _ours(op_type, feeds, inits=None, **kw):
    m = _model(op_type, feeds, inits, **kw)
    return InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)


def _compare(op_type, feeds, inits=None, rtol=1e-5, atol=1e-5, **kw):
    m = _model(op_type, feeds, inits, **kw)
    ours = InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)
    return ours


def _randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# -- Conv ------------------------------------------------------------------------------------------

def test_conv_resnet_3x3():
    x = _randn(1, 64, 56, 56)
    w = (_randn(64, 64, 3, 3) * 0.05).astype(np.float32)
    b = _randn(64)
    (y,) = _compare("Conv", {"x": x}, {"w": w, "b": b}, rtol=1e-4, atol=1e-4, pads=[1, 1, 1, 1])
    assert y.shape == (1, 64, 56, 56)


def test_conv_strided_grouped_dilated():
    x = _randn(2, 32, 29, 31)
    w = _randn(64, 8, 3, 5)
    attrs = dict(group=4, strides=[2, 1], dilations=[1, 2], pads=[1, 0, 2, 3])
    (y,) = _compare("Conv", {"x": x}, {"w": w}, rtol=1e-4, atol=1e-4, **attrs)
    # onnxruntime has no float64 Conv on CPU: check ours against its float32 result
    (y64,) = _ours("Conv", {"x": x.astype(np.float64)}, {"w": w.astype(np.float64)}, **attrs)
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, y, rtol=1e-4, atol=1e-4)


def test_conv_depthwise_same_upper_and_pointwise():
    x = _randn(1, 96, 28, 28)
    _compare("Conv", {"x": x}, {"w": _randn(96, 1, 3, 3)}, rtol=1e-4, atol=1e-4, group=96, auto_pad="SAME_UPPER",
             strides=[2, 2])
    _compare("Conv", {"x": x}, {"w": _randn(48, 96, 1, 1), "b": _randn(48)}, rtol=1e-4, atol=1e-4)


def test_conv_1d_and_3d():
    _compare("Conv", {"x": _randn(3, 16, 100)}, {"w": _randn(24, 16, 7)}, rtol=1e-4, atol=1e-4, strides=[3],
             auto_pad="SAME_LOWER")
    _compare("Conv", {"x": _randn(1, 4, 9, 10, 11)}, {"w": _randn(8, 4, 3, 3, 3), "b": _randn(8)},
             rtol=1e-4, atol=1e-4, pads=[1, 0, 1, 1, 0, 1], strides=[1, 2, 2])


@pytest.mark.parametrize("panels", [True, False])
@pytest.mark.parametrize("xshape,wshape,attrs", [
    ((1, 16, 20, 20), (32, 16, 3, 3), dict(pads=[1, 1, 1, 1])),                       # L = 400, whole panels
    ((2, 8, 13, 11), (24, 8, 3, 3), dict(strides=[2, 1], dilations=[1, 2], pads=[1, 0, 2, 3])),  # ragged L
    ((1, 6, 40), (16, 6, 5), dict(strides=[2], pads=[2, 2])),                          # 1-d
    ((1, 4, 6, 7, 8), (16, 4, 3, 3, 3), dict(pads=[1, 1, 1, 1, 1, 1])),                # 3-d
])
def test_conv_panel_products_on_any_host(monkeypatch, panels, xshape, wshape, attrs):
    """The im2col convolution written into panels and multiplied there (``ops.conv._conv_panels``, taken on
    AVX-512 hosts), forced on or off whatever the host: each against onnxruntime, and the panel path seen to run."""
    from ops import conv
    calls = []
    real = conv._conv_panels
    monkeypatch.setattr(conv, "_conv_panels", lambda *a: (calls.append(1), real(*a))[1])
    monkeypatch.setattr(conv, "PANEL_CONV", panels)
    monkeypatch.setattr(conv, "PANEL_CONV_MIN", 0)
    monkeypatch.setattr(conv, "SHIFTED_CONV", False)
    _compare("Conv", {"x": _randn(*xshape)}, {"w": _randn(*wshape), "b": _randn(wshape[0])}, rtol=1e-4, atol=1e-4,
             **attrs)
    assert bool(calls) == panels


@pytest.mark.parametrize("xshape,wshape,attrs", [
    ((1, 16, 20, 20), (32, 16, 3, 3), dict(pads=[1, 1, 1, 1])),                        # grid 20 x 22
    ((2, 8, 13, 11), (24, 8, 3, 3), dict(strides=[2, 1], dilations=[1, 2], pads=[1, 0, 2, 3])),  # phases, batch
    ((1, 5, 7, 9), (7, 5, 5, 3), dict(strides=[3, 2], pads=[3, 0, 1, 4])),             # padding past the kernel
    ((1, 6, 40), (16, 6, 5), dict(strides=[2], pads=[2, 2])),                           # 1-d
    ((2, 24, 9, 10), (20, 24, 1, 1), {}),                                               # 1x1 in place, ragged tail
    ((1, 12, 9, 9), (16, 12, 1, 1), dict(strides=[2, 2])),                              # 1x1 strided: one phase
    ((1, 600, 3, 3), (8, 600, 1, 1), {}),                                               # K past one chunk
])
def test_conv_shifted_rows_on_any_host(monkeypatch, xshape, wshape, attrs):
    """The convolution as products over shifted rows of the input (``ops._shifted``, taken on AVX-512 hosts),
    forced on whatever the host: against onnxruntime and the ONNX reference evaluator, and seen to run."""
    from onnx.reference import ReferenceEvaluator
    from ops import _shifted, conv
    calls = []
    real = _shifted.conv2d
    monkeypatch.setattr(_shifted, "conv2d", lambda *a: (calls.append(1), real(*a))[1])
    monkeypatch.setattr(conv, "SHIFTED_CONV", True)
    monkeypatch.setattr(conv, "SHIFTED_MIN_MACS", 0)
    monkeypatch.setattr(conv, "SHIFTED_MIN_PIXELS", 0)
    feeds, inits = {"x": _randn(*xshape)}, {"w": _randn(*wshape), "b": _randn(wshape[0])}
    (y,) = _compare("Conv", feeds, inits, rtol=1e-4, atol=1e-4, **attrs)
    assert calls
    (ref,) = ReferenceEvaluator(_model("Conv", feeds, inits, **attrs)).run(None, feeds)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xshape,wshape,attrs,bias,threads", [
    ((1, 129, 4), (128, 129, 3), dict(pads=[1, 1]), True, False),                     # 1-d, 4 outputs
    ((3, 16, 5, 6), (70, 16, 3, 3), dict(strides=[2, 2], dilations=[1, 2], pads=[1, 2, 0, 1]), True, False),
    ((64, 1, 640), (258, 1, 256), dict(strides=[128]), False, True),                  # a batch over the threads
    ((1, 512, 7, 7), (300, 512, 1, 1), {}, True, True),                                # channel tiles over them
    ((1, 480, 1, 40), (60, 480, 1, 3), dict(pads=[0, 1, 0, 1]), True, True),         # one tile: pixel blocks
    ((1, 600, 1, 1), (8, 600, 1, 1), {}, True, False),                                 # K past one chunk, 1 pixel
    ((2, 4, 3, 3, 3), (6, 4, 2, 2, 2), dict(pads=[0, 1, 0, 1, 0, 0]), True, False),   # 3-d
    ((1, 5, 2, 2), (7, 5, 5, 5), dict(pads=[3, 3, 3, 3], strides=[3, 3]), True, False),  # padding past the image
])
def test_conv_few_pixels(monkeypatch, xshape, wshape, attrs, bias, threads):
    """Outputs of fewer than ``FEW_PIXELS`` pixels on the register tiles with the roles turned
    (``ops.conv._few_pixels``, and ``_few_pixels_par`` over (image, channel tile) tasks; taken on AVX-512 hosts,
    forced on whatever the host): against onnxruntime and the ONNX reference evaluator, and seen to run."""
    from onnx.reference import ReferenceEvaluator
    from ops import conv
    monkeypatch.setattr(conv, "FEW_PIXELS", 64)
    calls = []
    for name in ("_few_pixels", "_few_pixels_par"):
        real = getattr(conv, name)
        monkeypatch.setattr(conv, name, lambda *a, real=real, name=name: (calls.append(name), real(*a))[1])
    feeds = {"x": _randn(*xshape)}
    inits = {"w": _randn(*wshape), **({"b": _randn(wshape[0])} if bias else {})}
    (y,) = _compare("Conv", feeds, inits, rtol=1e-4, atol=1e-4, **attrs)
    assert calls == ["_few_pixels_par" if threads else "_few_pixels"]
    (ref,) = ReferenceEvaluator(_model("Conv", feeds, inits, **attrs)).run(None, feeds)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xshape,wshape,attrs", [
    ((2, 6, 13, 11), (6, 1, 3, 3), dict(pads=[1, 1, 1, 1])),                           # batch, ragged grid
    ((1, 5, 17, 16), (5, 1, 5, 5), dict(strides=[2, 2], pads=[2, 1, 2, 3])),            # stride 2, 5x5
    ((1, 4, 12, 12), (4, 1, 3, 3), dict(dilations=[2, 3], pads=[4, 0, 1, 5])),          # dilation, pads past it
    ((1, 3, 9, 10), (3, 1, 3, 2), dict(strides=[3, 1], pads=[0, 1, 2, 0])),            # stride past 2
    ((2, 8, 40), (8, 1, 7), dict(strides=[2], pads=[3, 3])),                            # 1-d
])
def test_conv_depthwise_tiles_on_any_host(monkeypatch, xshape, wshape, attrs):
    """A depthwise convolution on the shifted-row register tiles, one row per channel (``ops._shifted.depthwise2d``,
    taken on AVX-512 hosts), forced on whatever the host: against onnxruntime and the ONNX reference evaluator,
    and seen to run."""
    from onnx.reference import ReferenceEvaluator
    from ops import _shifted, conv
    calls = []
    real = _shifted.depthwise2d
    monkeypatch.setattr(_shifted, "depthwise2d", lambda *a: (calls.append(1), real(*a))[1])
    monkeypatch.setattr(conv, "SHIFTED_DEPTHWISE", True)
    feeds, inits = {"x": _randn(*xshape)}, {"w": _randn(*wshape), "b": _randn(wshape[0])}
    (y,) = _compare("Conv", feeds, inits, rtol=1e-4, atol=1e-4, group=xshape[1], **attrs)
    assert calls
    (ref,) = ReferenceEvaluator(_model("Conv", feeds, inits, group=xshape[1], **attrs)).run(None, feeds)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_conv_float16_matches_float32():
    x = _randn(1, 16, 20, 20)
    w = _randn(8, 16, 3, 3) * 0.1
    (y32,) = _ours("Conv", {"x": x}, {"w": w})
    (y16,) = _ours("Conv", {"x": x.astype(np.float16)}, {"w": w.astype(np.float16)})
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16.astype(np.float32), y32, rtol=2e-2, atol=2e-2)


def test_conv_channel_mismatch():
    with pytest.raises(ShapeMismatchError):
        _ours("Conv", {"x": _randn(1, 5, 8, 8)}, {"w": _randn(4, 4, 3, 3)})


# -- ConvTranspose ---------------------------------------------------------------------------------

def test_convtranspose_upsampler():
    x = _randn(1, 64, 28, 28)
    w = _randn(64, 32, 4, 4) * 0.05
    (y,) = _compare("ConvTranspose", {"x": x}, {"w": w.astype(np.float32), "b": _randn(32)}, rtol=1e-4, atol=1e-4,
                    strides=[2, 2], pads=[1, 1, 1, 1])
    assert y.shape == (1, 64 // 2, 56, 56)


def test_convtranspose_group_dilation_output_padding():
    x = _randn(2, 8, 7, 9)
    w = _randn(8, 3, 3, 2)
    _compare("ConvTranspose", {"x": x}, {"w": w}, rtol=1e-4, atol=1e-4, group=2, strides=[3, 2],
             dilations=[2, 1], output_padding=[1, 1])
    _compare("ConvTranspose", {"x": _randn(1, 4, 10)}, {"w": _randn(4, 6, 3)}, rtol=1e-4, atol=1e-4, strides=[2],
             output_shape=[21])


# -- pooling ---------------------------------------------------------------------------------------

def test_maxpool_with_indices():
    x = _randn(2, 32, 57, 57)
    _compare("MaxPool", {"x": x}, n_out=2, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    _compare("MaxPool", {"x": x[:, :4]}, n_out=2, kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1,
             storage_order=1)


def test_maxpool_3d_of_depth_one_with_padded_depth_windows():
    """A 3-d window over an input of depth 1 whose depth padding makes three output planes (the separable 2-d
    kernel is for 2-d windows only): against onnxruntime."""
    _compare("MaxPool", {"x": _randn(1, 2, 1, 7, 6)}, kernel_shape=[3, 3, 3], pads=[2, 1, 1, 2, 1, 1])


def test_maxpool_uint8_dilated_3d():
    x = RNG.integers(0, 255, (1, 3, 16, 17)).astype(np.uint8)
    _compare("MaxPool", {"x": x}, kernel_shape=[3, 3], dilations=[2, 2], strides=[1, 2])
    _compare("MaxPool", {"x": _randn(1, 2, 8, 9, 10)}, kernel_shape=[2, 3, 2], auto_pad="SAME_UPPER",
             strides=[2, 2, 2])


@pytest.mark.parametrize("cip", [0, 1])
def test_averagepool(cip):
    x = _randn(2, 16, 35, 35)
    _compare("AveragePool", {"x": x}, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
             count_include_pad=cip, ceil_mode=1)
    _compare("AveragePool", {"x": _randn(3, 4, 50)}, kernel_shape=[5], strides=[3], auto_pad="SAME_LOWER",
             count_include_pad=cip)


@pytest.mark.parametrize("op,kw", [("MaxPool", {"n_out": 2}), ("MaxPool", {}), ("AveragePool", {"count_include_pad": 0}),
                                     ("AveragePool", {"count_include_pad": 1}), ("LpPool", {"p": 3})])
def test_windows_larger_than_the_input_visit_only_its_elements(op, kw):
    """Kernels wider than the input, dilated, with padding on both sides: the loops take only the taps that land
    inside the input (a kernel of a million taps costs what the input does); results and counts unchanged."""
    x = _randn(1, 2, 5, 6)
    _compare(op, {"x": x}, kernel_shape=[9, 4], dilations=[2, 3], pads=[7, 3, 6, 2], strides=[3, 2], **kw)
    _compare(op, {"x": x}, kernel_shape=[11, 7], auto_pad="SAME_LOWER", **kw)


def test_lppool_and_globals():
    x = _randn(2, 64, 14, 14)
    _compare("LpPool", {"x": x}, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], p=2, rtol=1e-4)
    _compare("GlobalAveragePool", {"x": x})
    _compare("GlobalMaxPool", {"x": x})
    _compare("GlobalLpPool", {"x": x}, rtol=1e-4)
    big = _randn(1, 24, 80, 80)  # channels over the threads, the sum's loop vectorized
    _compare("GlobalAveragePool", {"x": big})
    _compare("GlobalMaxPool", {"x": big})


def test_maxunpool_roundtrip_and_bad_index():
    x = _randn(1, 3, 8, 8)
    _, idx = _ours("MaxPool", {"x": x}, n_out=2, kernel_shape=[2, 2], strides=[2, 2])
    pooled = _randn(1, 3, 4, 4)
    _compare("MaxUnpool", {"x": pooled, "i": idx}, kernel_shape=[2, 2], strides=[2, 2])
    bad = idx.copy()
    bad[0, 0, 0, 0] = 3 * 64
    with pytest.raises(IndexOutOfRangeError):
        _ours("MaxUnpool", {"x": pooled, "i": bad}, kernel_shape=[2, 2], strides=[2, 2])


# -- Resize ----------------------------------------------------------------------------------------

_EMPTY = np.zeros(0, np.float32)


@pytest.mark.parametrize("mode,ctm", [("nearest", "asymmetric"), ("nearest", "half_pixel"),
                                      ("linear", "half_pixel"), ("linear", "align_corners"),
                                      ("linear", "pytorch_half_pixel"), ("cubic", "half_pixel"),
                                      ("cubic", "asymmetric")])
def test_resize_sizes(mode, ctm):
    x = _randn(1, 3, 40, 36)
    sizes = np.array([1, 3, 80, 54], np.int64)
    _compare("Resize", {"x": x}, {"roi": _EMPTY, "scales": _EMPTY, "sizes": sizes}, rtol=1e-4, atol=1e-4,
             mode=mode, coordinate_transformation_mode=ctm)


@pytest.mark.parametrize("nearest_mode", ["floor", "round_prefer_ceil"])
def test_resize_nearest_large_enough_for_the_threads(nearest_mode):
    """Nearest resizes past ``_PARALLEL_MIN`` outputs per axis (both the row and the innermost-axis gathers run
    over the threads) equal onnxruntime's exactly."""
    x = _randn(1, 16, 40, 44)
    sizes = np.array([1, 16, 80, 88], np.int64)
    _compare("Resize", {"x": x}, {"roi": _EMPTY, "scales": _EMPTY, "sizes": sizes}, rtol=0, atol=0,
             mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode=nearest_mode)


def test_resize_scales_downsample_antialias_and_uint8():
    x = _randn(2, 3, 64, 48)
    scales = np.array([1, 1, 0.5, 0.75], np.float32)
    _compare("Resize", {"x": x}, {"roi": _EMPTY, "scales": scales}, rtol=1e-4, atol=1e-4, mode="linear",
             antialias=1)
    _compare("Resize", {"x": x}, {"roi": _EMPTY, "scales": scales}, rtol=1e-4, atol=1e-4, mode="cubic",
             exclude_outside=1, cubic_coeff_a=-0.5)
    xi = RNG.integers(0, 255, (1, 3, 20, 20)).astype(np.uint8)
    _compare("Resize", {"x": xi}, {"roi": _EMPTY, "scales": np.array([1, 1, 2, 2], np.float32)}, atol=1,
             mode="nearest", nearest_mode="round_prefer_ceil")


@pytest.mark.parametrize("opset,scales", [(10, [1, 1, 0.5, 0.6]), (10, [1, 1, 2, 3]), (9, [1, 1, 2, 1.5])])
def test_resize10_and_upsample_legacy(opset, scales):
    x = _randn(1, 2, 10, 12)
    s = np.array(scales, np.float32)
    op_type = "Resize" if opset == 10 else "Upsample"
    for mode in ("nearest", "linear"):
        _compare(op_type, {"x": x}, {"scales": s}, opset=opset, mode=mode)


# -- the rest of the family --------------------------------------------------------------------------

@pytest.mark.parametrize("mode,pad", [("linear", "zeros"), ("nearest", "border"), ("cubic", "reflection")])
def test_gridsample(mode, pad):
    x = _randn(2, 8, 24, 20)
    grid = RNG.uniform(-1.2, 1.2, (2, 16, 18, 2)).astype(np.float32)
    for ac in (0, 1):
        _compare("GridSample", {"x": x, "grid": grid}, opset=20, mode=mode, padding_mode=pad, align_corners=ac,
                 rtol=1e-4, atol=1e-4)


def test_roialign_and_bad_batch_index():
    x = _randn(2, 16, 32, 32)
    rois = np.sort(RNG.uniform(0, 60, (10, 4)).astype(np.float32).reshape(10, 2, 2), axis=1)
    rois = rois.transpose(0, 2, 1).reshape(10, 4)[:, [0, 2, 1, 3]].copy()  # x1 <= x2, y1 <= y2
    bi = RNG.integers(0, 2, 10).astype(np.int64)
    _compare("RoiAlign", {"x": x, "rois": rois, "bi": bi}, opset=16, output_height=7, output_width=7,
             spatial_scale=0.5, sampling_ratio=2, rtol=1e-4, atol=1e-4)
    with pytest.raises(IndexOutOfRangeError):
        _ours("RoiAlign", {"x": x, "rois": rois, "bi": bi + 2}, opset=16)


def test_col2im_matches_ort():
    x = _randn(2, 3 * 2 * 3, 6 * 4)
    _compare("Col2Im", {"x": x}, {"image_shape": np.array([7, 10], np.int64),
                                  "block_shape": np.array([2, 3], np.int64)}, opset=18, strides=[1, 3],
             pads=[0, 1, 0, 1])


@pytest.mark.parametrize("case", ["2d", "strided_dilated", "1d", "grouped", "per_channel", "3d"])
def test_conv_integer_equals_onnxruntime(case):
    """ConvInteger's integer products (``vpdpbusd`` on VNNI hosts, int16 pairs elsewhere; the float path it keeps
    for groups) equal onnxruntime's integers: uint8 codes with zero points near the middle, a batch of 2, SAME
    padding, strides and dilations, 1-d and 3-d; with one weight zero point per output channel, which
    onnxruntime refuses, the ONNX reference evaluator's."""
    if case == "1d":
        x = RNG.integers(0, 256, (2, 6, 50)).astype(np.uint8)
        w = RNG.integers(0, 256, (5, 6, 4)).astype(np.uint8)
        kw = dict(strides=[2], pads=[1, 2])
    elif case == "3d":
        x = RNG.integers(0, 256, (2, 3, 5, 7, 6)).astype(np.uint8)
        w = RNG.integers(0, 256, (4, 3, 2, 3, 2)).astype(np.uint8)
        kw = dict(pads=[1, 0, 1, 0, 2, 1], strides=[1, 2, 1])
    else:
        x = RNG.integers(0, 256, (2, 12, 19, 17)).astype(np.uint8)
        w = RNG.integers(0, 256, (10, 3 if case == "grouped" else 12, 3, 3)).astype(np.uint8)
        kw = {"2d": dict(auto_pad="SAME_UPPER"), "strided_dilated": dict(strides=[2, 1], dilations=[2, 2]),
              "grouped": dict(group=4, pads=[1, 1, 1, 1]), "per_channel": dict(pads=[2, 0, 1, 1])}[case]
    if case == "grouped":
        w = RNG.integers(0, 256, (12, 3, 3, 3)).astype(np.uint8)
    wz = RNG.integers(100, 140, w.shape[0]).astype(np.uint8) if case == "per_channel" else np.array(118, np.uint8)
    inits = {"w": w, "xz": np.array(131, np.uint8), "wz": wz}
    if case != "per_channel":
        _compare("ConvInteger", {"x": x}, inits, rtol=0, atol=0, opset=10, **kw)
        return
    from onnx.reference import ReferenceEvaluator
    (want,) = ReferenceEvaluator(_model("ConvInteger", {"x": x}, inits, opset=10, **kw)).run(None, {"x": x})
    (y,) = _ours("ConvInteger", {"x": x}, inits, opset=10, **kw)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, want)


def test_quantized_convs():
    x = RNG.integers(0, 255, (1, 16, 20, 20)).astype(np.uint8)
    w = RNG.integers(-127, 127, (8, 16, 3, 3)).astype(np.int8)
    _compare("ConvInteger", {"x": x}, {"w": w, "xz": np.array(128, np.uint8)}, opset=10, pads=[1, 1, 1, 1])
    # uint8 weights: onnxruntime's u8s8 path may saturate int16 pair sums on AVX2, u8u8 is exact
    wu = RNG.integers(0, 255, (8, 16, 3, 3)).astype(np.uint8)
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8), "w": wu,
             "ws": np.full(8, 0.01, np.float32), "wz": np.full(8, 120, np.uint8), "ys": np.array(0.5, np.float32),
             "yz": np.array(100, np.uint8), "b": RNG.integers(-500, 500, 8).astype(np.int32)}
    _compare("QLinearConv", {"x": x}, inits, opset=10, atol=1, strides=[2, 2])


def test_deformconv():
    x = _randn(2, 8, 12, 12)
    w = _randn(6, 4, 3, 3)
    off = (_randn(2, 2 * 2 * 9, 10, 10) * 2).astype(np.float32)
    mask = RNG.uniform(0, 1, (2, 2 * 9, 10, 10)).astype(np.float32)
    _compare("DeformConv", {"x": x, "w": w, "off": off}, {"b": _randn(6), "mask": mask}, opset=19, group=2,
             offset_group=2, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,k,attrs", [((2, 3072, 4), (4,), {}),
                                          ((1, 32, 16, 16), (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
                                          ((1, 8, 5, 6, 7), (3, 2, 3), {"dilations": [1, 2, 1]})])
def test_depthwise_conv_matches_onnxruntime(shape, k, attrs):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from runtime import InferenceSession
    rng = np.random.default_rng(3)
    C = shape[1]
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((C, 1, *k)).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], group=C, **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    ours = InferenceSession(m).run(None, {"x": x})[0]
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_a_conv_session_follows_its_input_shape_from_run_to_run():
    """The Conv keeps the plan of its last input shape: a run of another shape plans again, and going back
    gives the first shape's result again."""
    w = _randn(6, 4, 3, 3)
    b = _randn(6)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 1])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx_type(np.dtype(np.float32)),
                                                                      ["n", 4, "h", "w"])],
                          [helper.make_empty_tensor_value_info("y")],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    ours = InferenceSession(m)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    for shape in [(1, 4, 8, 8), (2, 4, 5, 7), (1, 4, 8, 8)]:
        x = _randn(*shape)
        np.testing.assert_allclose(ours.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def _depthwise_in_tap_order(x, w, b, strides, pads, dils):
    """A float32 depthwise convolution summing each output's taps in order (depth, height, width) from zero,
    then adding the bias: the order the kernel promises, so equal to it bit for bit."""
    r = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + r]) for i in range(r)])
    k = w.shape[2:]
    osz = [(xp.shape[2 + i] - (k[i] - 1) * dils[i] - 1) // strides[i] + 1 for i in range(r)]
    out = np.zeros(x.shape[:2] + tuple(osz), np.float32)
    for tap in np.ndindex(*k):
        idx = (slice(None), slice(None)) + tuple(
            slice(tap[i] * dils[i], tap[i] * dils[i] + (osz[i] - 1) * strides[i] + 1, strides[i]) for i in range(r))
        out += xp[idx] * w[(slice(None), 0) + tap].reshape((1, -1) + (1,) * r)
    return out + b.reshape((1, -1) + (1,) * r)


@pytest.mark.parametrize("shape,k,strides,pads,dils", [
    ((1, 256, 14, 14), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    ((2, 5, 9, 11), (3, 3), (2, 3), (1, 0, 2, 1), (1, 1)),       # strides that do not divide, uneven pads
    ((1, 3, 7, 6), (3, 2), (1, 2), (4, 3, 5, 4), (2, 3)),        # pads beyond the kernel, dilations
    ((1, 4, 2, 3), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),        # a kernel larger than the input
    ((1, 3, 40, 100), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),     # several output blocks
    ((1, 2, 3, 2100), (1, 3), (1, 1), (0, 1, 0, 1), (1, 1)),     # a row wider than one output block
    ((3, 6, 50), (7,), (3,), (3, 2), (2,)),                      # 1-d
    ((1, 3, 5, 6, 4), (3, 2, 3), (2, 1, 1), (1, 0, 1, 1, 1, 0), (1, 2, 1)),  # 3-d: several depth taps
])
@pytest.mark.parametrize("wide", [True, False, "tiles"])
def test_depthwise_sums_each_tap_in_order_bit_for_bit(monkeypatch, shape, k, strides, pads, dils, wide):
    """Both direct depthwise kernels, on every geometry (the choice between them is forced), bit for bit; the
    register tiles of ``_shifted.depthwise2d`` (one fused multiply-add per tap) within 1e-5, except in 3-d,
    which they leave to the direct kernels."""
    import ops.conv
    tiles = wide == "tiles" and len(shape) < 5
    monkeypatch.setattr(ops.conv, "_depthwise_wide_pays", lambda ow, col_stride: wide)
    monkeypatch.setattr(ops.conv, "SHIFTED_DEPTHWISE", wide == "tiles")
    rng = np.random.default_rng(11)
    C = shape[1]
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((C, 1, *k)).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32)
    (y,) = _ours("Conv", {"x": x}, {"w": w, "b": b}, group=C, strides=list(strides), pads=list(pads),
                 dilations=list(dils))
    want = _depthwise_in_tap_order(x, w, b, strides, pads, dils)
    if tiles:
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(y, want)


_FUSED_ACTS = [("Relu", {}, None), ("Tanh", {}, None), ("Sigmoid", {}, None),
               ("LeakyRelu", {"alpha": 0.1}, [0.1]), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, [0.3, 0.4]),
               ("Clip", {"min": -0.5, "max": 0.75}, [-0.5, 0.75])]


@pytest.mark.parametrize("act,attrs,params", _FUSED_ACTS)
@pytest.mark.parametrize("group", [1, 8])
def test_fused_conv_gives_the_bits_of_conv_and_its_activation(act, attrs, params, group):
    """com.microsoft::FusedConv runs the activation op's own kernel on the convolution: the bits of the two
    nodes; onnxruntime's FusedConv within 1e-5."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float32)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8 // group, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    vi = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 10, 10])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    kw = {"activation": act, **({"activation_params": params} if params else {})}
    fused = helper.make_model(
        helper.make_graph([helper.make_node("FusedConv", ["x", "w", "b"], ["y"], domain="com.microsoft",
                                            pads=[1, 1, 1, 1], group=group, **kw)], "g", *vi, inits),
        opset_imports=[helper.make_opsetid("", 6), helper.make_opsetid("com.microsoft", 1)]).SerializeToString()
    apart = helper.make_model(
        helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=group),
                           helper.make_node(act, ["c"], ["y"], **attrs)], "g", *vi, inits),
        opset_imports=[helper.make_opsetid("", 6)]).SerializeToString()
    y = InferenceSession(fused).run(None, {"x": x})[0]
    np.testing.assert_array_equal(y, InferenceSession(apart).run(None, {"x": x})[0])
    ref = ort.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act,params", [("Relu", None), ("LeakyRelu", [0.2]), ("Clip", [-1.0, 0.5])])
def test_onnxruntimes_fused_conv_with_a_sum_input(act, params):
    """com.microsoft::FusedConv as onnxruntime's optimizer writes it, Z included: Y = act(Conv(X, W, B) + Z)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    z = rng.standard_normal((2, 5, 7, 7)).astype(np.float32)
    kw = {"activation": act, **({"activation_params": params} if params else {})}
    node = helper.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain="com.microsoft", pads=[1, 1, 1, 1],
                            **kw)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 7, 7]),
                                        helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 5, 7, 7])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(rng.standard_normal((5, 3, 3, 3)).astype(np.float32), "w"),
                           numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    feeds = {"x": x, "z": z}
    ours = InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,k,s,pads,d,ceil", [
    ((3, 1, 9, 14), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
    ((2, 1, 7, 20), (2, 4), (1, 3), (0, 2, 1, 3), (2, 2), False),
    ((1, 3, 6, 7, 8), (2, 3, 2), (2, 1, 2), (1, 0, 1, 1, 1, 0), (1, 2, 1), False),
    ((2, 1, 3, 4), (2, 2), (1, 1), (3, 3, 3, 3), (1, 1), False),  # pads past the kernel: windows reaching nothing
    ((2, 2, 10, 11), (3, 2), (3, 2), (0, 1, 0, 0), (1, 1), True),  # ceil_mode: last windows past the end
    ((1, 4, 13, 13), (13, 13), (1, 1), (6, 6, 6, 6), (1, 1), False),  # an SPP block's widest window
])
def test_maxpool_rows_give_the_general_kernels_bits_with_nan_and_infinities(shape, k, s, pads, d, ceil):
    """MaxPool without indices takes the row kernel, or for 2-d windows the separable one: the same outputs as the
    general kernel's max mode, NaN (first or later in a window), infinities, ties and windows that reach no
    element included."""
    import numba
    from ops import pool
    from ops._common import pad3, window_geometry
    rng = np.random.default_rng(9)
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, flat.size // 6, replace=False)] = np.nan
    flat[rng.choice(flat.size, flat.size // 8, replace=False)] = np.inf
    flat[rng.choice(flat.size, flat.size // 8, replace=False)] = -np.inf
    flat[rng.choice(flat.size, flat.size // 8, replace=False)] = 1.0
    kk, ss, dd, pb, pe, osp = window_geometry("MaxPool", shape, list(k), "NOTSET", list(d), list(pads), list(s), ceil)
    N, C = shape[:2]
    xc = x.reshape((N * C, *pad3(shape[2:], 1)))
    want = np.empty((N * C, *pad3(osp, 1)), np.float32)
    got = np.full_like(want, 7.0)
    pool._pool(xc, want, np.empty((1, 1, 1, 1), np.int64), 0, 0.0, pad3(kk, 1), pad3(ss, 1), pad3(pb, 0),
               pad3(pe, 0), pad3(dd, 1), 0, False)
    pool._max_rows(xc, got, pad3(kk, 1), pad3(ss, 1), pad3(pb, 0), pad3(dd, 1), numba.get_num_threads())
    np.testing.assert_array_equal(got, want)
    assert np.isnan(want).any() and np.isinf(want).any()
    if len(shape) == 4:
        sep = np.full_like(want, 7.0)
        pool._max_separable(xc, sep, pad3(kk, 1), pad3(ss, 1), pad3(pb, 0), pad3(dd, 1), numba.get_num_threads())
        np.testing.assert_array_equal(sep, want)
