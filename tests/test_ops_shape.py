"""Shape, cast and data-movement kernels against onnxruntime on realistic shapes.

Each case builds a one-node model with ``onnx.helper``, runs it through the
native ``runtime.InferenceSession`` and through onnxruntime, and compares
the outputs exactly (data movement and casts have nothing to round), except
where a dtype-specific tolerance is given.  Shape-like inputs are fed as
graph inputs, not initializers, so the kernels run rather than being folded.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from runtime import InferenceSession
from runtime.errors import (IndexOutOfRangeError, InvalidArgumentError, ShapeMismatchError)
from runtime.dtypes import onnx_type

OPSET = 21
RNG = np.random.default_rng(0)


def _model(op_type, feeds: dict, n_out=1, opset=OPSET, **attrs):
    ins = [helper.make_tensor_value_info(k, onnx_type(v.dtype), list(v.shape)) for k, v in feeds.items()]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, list(feeds), outs, **attrs)
    g = helper.make_graph([node], "t", ins, [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    # Output types come from ONNX shape inference (shapes dropped: they may depend on input values).
    inferred = {v.name: v.type.tensor_type.elem_type
                for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    m.graph.output.extend(helper.make_tensor_value_info(o, inferred[o], None) for o in outs)
    return m.SerializeToString()


def _both(op_type, feeds, n_out=1, opset=OPSET, **attrs):
    m = _model(op_type, feeds, n_out, opset, **attrs)
    mine = InferenceSession(m).run(None, feeds)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    return mine, ref


def check(op_type, feeds, n_out=1, opset=OPSET, rtol=0.0, **attrs):
    mine, ref = _both(op_type, feeds, n_out, opset, **attrs)
    assert len(mine) == len(ref)
    for a, b in zip(mine, ref):
        if b.dtype == np.uint8 and a.dtype.name.startswith("float8"):
            a = a.view(np.uint8)  # onnxruntime hands float8 tensors back as raw bytes
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        if rtol:
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol)
        else:
            np.testing.assert_array_equal(a, b)


def I(*v):
    return np.array(v, dtype=np.int64)


def rand(shape, dt=np.float32):
    if np.dtype(dt).kind in "iu":
        return RNG.integers(-100 if np.dtype(dt).kind == "i" else 0, 100, size=shape).astype(dt)
    if np.dtype(dt) == np.bool_:
        return RNG.random(shape) > 0.5
    return RNG.standard_normal(shape).astype(dt)


# -- metadata ----------------------------------------------------------------------------------------

def test_reshape_squeeze_unsqueeze_flatten_shape():
    x = rand((2, 32, 128, 64))
    check("Reshape", {"x": x, "s": I(0, 0, -1)})
    check("Reshape", {"x": x, "s": I(2, 32, 128, 64, 1)}, allowzero=1)
    check("Squeeze", {"x": rand((1, 4096, 1)), "a": I(-1)})
    check("Unsqueeze", {"x": rand((4096,)), "a": I(0, -1)})
    check("Flatten", {"x": x}, axis=2)
    check("Flatten", {"x": x}, axis=0)
    check("Shape", {"x": x}, start=1, end=-1)
    check("Size", {"x": x})


def test_reshape_mismatch_raises():
    m = _model("Reshape", {"x": rand((4, 6)), "s": I(5, -1)})
    with pytest.raises(ShapeMismatchError):
        InferenceSession(m).run(None, {"x": rand((4, 6)), "s": I(5, -1)})


# -- cast --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("src,dst", [
    (np.float32, TensorProto.FLOAT16), (np.float32, TensorProto.BFLOAT16), (np.float16, TensorProto.FLOAT),
    (np.float32, TensorProto.DOUBLE), (np.int32, TensorProto.FLOAT), (np.float32, TensorProto.INT64),
    (np.float32, TensorProto.BOOL), (np.bool_, TensorProto.FLOAT), (np.int64, TensorProto.INT8),
    (np.float32, TensorProto.FLOAT8E4M3FN), (np.float32, TensorProto.FLOAT8E5M2),
])
def test_cast(src, dst):
    x = rand((64, 4096), src)
    if np.dtype(src).kind == "f":
        x = (x * 100).astype(src)
    if dst in (TensorProto.BFLOAT16, TensorProto.FLOAT8E5M2):
        check_roundtrip(x, dst)
    else:
        check("Cast", {"x": x}, to=dst)


def check_roundtrip(x, to=TensorProto.BFLOAT16, **attrs):
    # onnxruntime cannot return bfloat16 or float8e5m2 to numpy: cast there and back inside the model.
    g = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["b"], to=to, **attrs),
         helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT)], "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 10
    m = m.SerializeToString()
    a, = InferenceSession(m).run(None, {"x": x})
    b, = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(a, b)


def test_cast_float8_no_saturate():
    x = np.array([0.5, 1e6, -1e6, np.inf, -np.inf, np.nan, 1e-7, 448.0], np.float32)
    check("Cast", {"x": x}, to=TensorProto.FLOAT8E4M3FN, saturate=0)
    check_roundtrip(x, TensorProto.FLOAT8E5M2, saturate=0)
    check_roundtrip(x, TensorProto.FLOAT8E5M2, saturate=1)
    check("Cast", {"x": x}, to=TensorProto.FLOAT8E4M3FN, saturate=1)


def test_castlike():
    check("CastLike", {"x": rand((128, 4096)), "t": np.zeros(1, np.float16)})


# -- movement ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,perm,dt", [
    ((1, 32, 128, 64), (0, 2, 1, 3), np.float32),
    ((1024, 1024), (1, 0), np.float16),
    ((2, 3, 4, 5, 6, 7, 2), (6, 0, 5, 1, 4, 2, 3), np.int64),
    ((8, 16, 32), (2, 0, 1), np.bool_),
])
def test_transpose(shape, perm, dt):
    check("Transpose", {"x": rand(shape, dt)}, perm=list(perm))


@pytest.mark.parametrize("shape,perm,dt", [
    ((2, 24, 33, 31), (0, 2, 3, 1), np.float32),    # NCHW -> NHWC, a batch, edges past whole tiles
    ((1, 45, 37, 40), (0, 3, 1, 2), np.int8),       # NHWC -> NCHW
    ((3, 1, 70, 90), (1, 0, 3, 2), np.float16),     # unit axes around a matrix transpose under a batch
    ((130, 129), (1, 0), np.bool_),
    ((4, 50, 6, 30), (0, 3, 1, 2), np.int64),       # the last block moved ahead of two
    ((8, 30, 20, 10), (2, 0, 1, 3), np.float32),    # not a swap of two blocks: the general copy
])
def test_transpose_tiled(shape, perm, dt):
    """Transposes that swap two blocks of axes (after leading ones kept) run as tiled matrix transposes:
    onnxruntime's result for every element size and tile edge; other permutations keep the general copy."""
    check("Transpose", {"x": rand(shape, dt)}, perm=list(perm))


def test_concat_split():
    a, b, c = rand((8, 100, 64)), rand((8, 28, 64)), rand((8, 1, 64))
    check("Concat", {"a": a, "b": b, "c": c}, axis=1)
    check("Concat", {"a": rand((4, 7), np.int32), "b": rand((4, 9), np.int32)}, axis=-1)
    x = rand((16, 4096, 3))
    check("Split", {"x": x}, n_out=3, opset=18, axis=1, num_outputs=3)
    check("Split", {"x": x, "s": I(1000, 3000, 96)}, n_out=3, axis=1)


def test_split_bad_sizes_raise():
    feeds = {"x": rand((4, 10)), "s": I(3, 3)}
    with pytest.raises(InvalidArgumentError):
        InferenceSession(_model("Split", feeds, n_out=2, axis=1)).run(None, feeds)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ((0, 10), (1000, -10), (0, 2), (1, 2)),
    ((-1,), (-10 ** 18,), (1,), (-1,)),
    ((100, 5), (2, 10 ** 9), (2, 1), (-3, 7)),
])
def test_slice(starts, ends, axes, steps):
    x = rand((16, 128, 256))
    check("Slice", {"x": x, "s": I(*starts), "e": I(*ends), "a": I(*axes), "p": I(*steps)})


def test_slice_follows_new_bounds_and_shapes_between_runs():
    """One session fed other bounds, then another input shape, then the first again: each run is sliced by
    what it is fed (the node keeps the index it resolved for each shape and bound values)."""
    x = rand((6, 8))
    proto = onnx.load_from_string(_model("Slice", {"x": x, "s": I(1), "e": I(5), "a": I(1)}))
    for d, name in zip(proto.graph.input[0].type.tensor_type.shape.dim, ("rows", "cols")):
        d.dim_param = name
    m = proto.SerializeToString()
    mine = InferenceSession(m)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    for feeds in ({"x": x, "s": I(1), "e": I(5), "a": I(1)}, {"x": x, "s": I(0), "e": I(3), "a": I(0)},
                  {"x": rand((6, 3)), "s": I(1), "e": I(5), "a": I(1)}, {"x": x, "s": I(1), "e": I(5), "a": I(1)},
                  {"x": x, "s": I(-2), "e": I(5), "a": I(1)},
                  {"x": rand((6, 3)), "s": I(-2), "e": I(5), "a": I(1)}):
        np.testing.assert_array_equal(mine.run(None, feeds)[0], ref.run(None, feeds)[0])


def test_reshape_follows_new_targets_and_shapes_between_runs():
    """One Reshape session fed other targets and another input size in turn (a 0 and a -1 in the target read
    the input's dims): each run is shaped by what it is fed, as onnxruntime shapes it."""
    x = rand((4, 6))
    proto = onnx.load_from_string(_model("Reshape", {"x": x, "s": I(0, -1)}))
    proto.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "cols"
    m = proto.SerializeToString()
    mine = InferenceSession(m)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    for feeds in ({"x": x, "s": I(0, -1)}, {"x": x, "s": I(-1, 3)}, {"x": rand((4, 2)), "s": I(0, -1)},
                  {"x": rand((4, 2)), "s": I(-1, 4)}, {"x": x, "s": I(0, -1)}):
        a, b = mine.run(None, feeds)[0], ref.run(None, feeds)[0]
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_expand_tile_where():
    check("Expand", {"x": rand((1, 1, 64)), "s": I(4, 32, 1)})
    check("Expand", {"x": rand((3, 1), np.int64), "s": I(2, 1, 6)})
    check("Tile", {"x": rand((2, 3, 4)), "r": I(2, 1, 3)})
    check("Tile", {"x": rand((16, 64), np.float16), "r": I(3, 5)})
    check("Where", {"c": rand((32, 1, 64), np.bool_), "x": rand((128, 64)), "y": rand((1,))})
    check("Where", {"c": rand((1000,), np.bool_), "x": rand((1000,), np.int64), "y": rand((1000,), np.int64)})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = rand((2, 3, 64, 64))
    feeds = {"x": x, "p": I(0, 0, 3, 2, 0, 0, 1, 4)}
    if mode == "constant":
        feeds["v"] = np.array(1.5, np.float32)
    check("Pad", feeds, mode=mode)
    # axes input, negative pads crop
    feeds = {"x": x, "p": I(2, -1, 1, 1), "v": np.array(0.0, np.float32), "a": I(-1, 1)}
    check("Pad", feeds, mode=mode)


def test_plans_kept_per_shape_follow_the_values_of_each_run():
    """Pad, Concat and the reductions keep what they worked out per input shape and per value of their small
    inputs: one session fed the same shape with other pads, other axes, then other shapes, matches onnxruntime
    on every run."""
    x = rand((2, 3, 8))
    for op_type, runs, attrs in [
        ("Pad", [{"x": x, "p": I(0, 0, 2, 0, 1, 3)}, {"x": x, "p": I(0, 1, 0, 0, 0, -2)},
                 {"x": rand((4, 5, 6)), "p": I(1, 0, 2, 0, 1, 3)}], dict(mode="reflect")),
        ("Concat", [{"a": x, "b": rand((2, 1, 8))}, {"a": rand((2, 2, 8)), "b": rand((2, 4, 8))}], dict(axis=1)),
        ("ReduceMean", [{"x": x, "a": I(2)}, {"x": x, "a": I(0)}, {"x": x, "a": I(-1, 1)}, {"x": rand((5, 7, 1)),
                                                                                             "a": I(1)}], {}),
        ("ReduceMax", [{"x": x, "a": I(2)}, {"x": x, "a": I(1)}], dict(keepdims=0)),
    ]:
        proto = onnx.load_from_string(_model(op_type, runs[0], **attrs))
        for v in proto.graph.input:  # every dimension dynamic
            for k, d in enumerate(v.type.tensor_type.shape.dim):
                d.dim_param = f"{v.name}{k}"
        m = proto.SerializeToString()
        mine = InferenceSession(m)
        ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
        for feeds in runs:
            (a,), (b,) = mine.run(None, feeds), ref.run(None, feeds)
            assert a.shape == b.shape, (op_type, a.shape, b.shape)
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_trilu_range_misc():
    x = rand((4, 256, 300))
    for upper in (0, 1):
        for k in (-5, 0, 17):
            check("Trilu", {"x": x, "k": np.array(k, np.int64)}, upper=upper)
    # onnxruntime accumulates float ranges step by step; we follow the spec's start + i * delta, so long
    # float ranges agree only to accumulated rounding.
    check("Range", {"s": np.array(1.5, np.float32), "l": np.array(1000.0, np.float32),
                    "d": np.array(0.37, np.float32)}, rtol=5e-5)
    check("Range", {"s": np.array(10, np.int64), "l": np.array(-5000, np.int64), "d": np.array(-3, np.int64)})
    check("ConstantOfShape", {"s": I(3, 4, 5)}, value=helper.make_tensor("v", TensorProto.INT32, [1], [7]))
    check("EyeLike", {"x": rand((64, 100))}, k=3)
    check("EyeLike", {"x": rand((64, 100), np.int32)}, k=-10, dtype=TensorProto.DOUBLE)


def test_depth_space_reverse_crop():
    x = rand((2, 64, 16, 24))
    for mode in ("DCR", "CRD"):
        check("DepthToSpace", {"x": x}, blocksize=4, mode=mode)
    check("SpaceToDepth", {"x": x}, blocksize=4)
    seq = rand((50, 8, 32))
    check("ReverseSequence", {"x": seq, "l": I(50, 1, 0, 7, 33, 50, 2, 49)}, batch_axis=1, time_axis=0)
    check("ReverseSequence", {"x": seq.transpose(1, 0, 2).copy(), "l": I(50, 1, 0, 7, 33, 50, 2, 49)},
          batch_axis=0, time_axis=1)
    check("CenterCropPad", {"x": rand((3, 20, 11)), "s": I(10, 16)}, axes=[1, 2])


def test_reverse_sequence_bad_length_raises():
    feeds = {"x": rand((5, 2, 3)), "l": I(6, 1)}
    with pytest.raises(IndexOutOfRangeError):
        InferenceSession(_model("ReverseSequence", feeds, batch_axis=1, time_axis=0)).run(None, feeds)


def test_dropout_inference_and_seeded_training():
    x = rand((64, 4096))
    check("Dropout", {"x": x}, n_out=2)
    feeds = {"x": x, "r": np.array(0.3, np.float32), "t": np.array(True)}
    y, mask = InferenceSession(_model("Dropout", feeds, n_out=2, seed=0)).run(None, feeds)
    assert mask.dtype == np.bool_ and 0.25 < 1 - mask.mean() < 0.35
    np.testing.assert_allclose(y, np.where(mask, x / np.float32(0.7), 0), rtol=1e-6)


def test_views_do_not_leak_feeds():
    # A view op's output that is a graph output must not alias the caller's feed.
    x = rand((4, 6))
    y, = InferenceSession(_model("Reshape", {"x": x, "s": I(6, 4)})).run(None, {"x": x, "s": I(6, 4)})
    y[...] = 0
    assert np.any(x != 0)


def test_pad_refuses_negative_pads_past_the_extent():
    from onnx import TensorProto as _T, helper as _h
    import runtime as _rt
    m = _h.make_model(_h.make_graph([_h.make_node("Pad", ["x", "p"], ["y"], name="pad0")], "g",
                                    [_h.make_tensor_value_info("x", _T.FLOAT, [3])],
                                    [_h.make_tensor_value_info("y", _T.FLOAT, None)],
                                    [_h.make_tensor("p", _T.INT64, [2], [0, -4])]),
                      opset_imports=[_h.make_opsetid("", 18)])
    with pytest.raises(_rt.InvalidArgumentError, match="pad0.*axis 0.*output extent would be -1"):
        _rt.InferenceSession(m.SerializeToString()).run(None, {"x": np.arange(3, dtype=np.float32)})
    m.graph.initializer[0].int64_data[:] = [-2, -1]  # down to exactly nothing is allowed, as onnxruntime allows it
    assert _rt.InferenceSession(m.SerializeToString()).run(None, {"x": np.arange(3, dtype=np.float32)})[0].shape == (0,)
