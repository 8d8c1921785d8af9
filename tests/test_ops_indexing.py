"""Indexing and loss kernels against onnxruntime on realistic shapes, plus index-validation errors.

Each case builds a one-node model with onnx.helper, runs it through ``runtime.InferenceSession`` and
``onnxruntime.InferenceSession``, and compares every output.  Out-of-range indices must raise
``IndexOutOfRangeError`` before a kernel reads memory.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from runtime import InferenceSession
from runtime.dtypes import onnx_type
from runtime.errors import IndexOutOfRangeError

RNG = np.random.default_rng(0)


def _model(op_type, feeds, n_out=1, opset=18, inits=None, out_names=None, **attrs):
    inits = inits or {}
    in_names = list(feeds) + list(inits)
    outs = out_names or [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, [n if n is not None else "" for n in in_names], outs, **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, onnx_type(v.dtype), list(v.shape)) for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs if o],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _run_ours(op_type, feeds, **kw):
    m = _model(op_type, feeds, **kw)
    return InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _compare(op_type, feeds, rtol=1e-6, atol=1e-6, **kw):
    m = _model(op_type, feeds, **kw)
    ours = InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)
    return ours


# -- gathers ---------------------------------------------------------------------------------------

def test_gather_embedding_lookup():
    table = RNG.standard_normal((8192, 1024), dtype=np.float32)
    ids = RNG.integers(-8192, 8192, (4, 64)).astype(np.int64)
    (y,) = _compare("Gather", {"table": table, "ids": ids}, axis=0)
    assert y.shape == (4, 64, 1024)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.bool_])
def test_gather_middle_axis(dtype):
    x = (RNG.standard_normal((8, 300, 33)) * 10).astype(dtype)
    idx = RNG.integers(-300, 300, (17,)).astype(np.int32)
    _compare("Gather", {"x": x, "i": idx}, axis=-2)


@pytest.mark.parametrize("axis,k", [(0, 3), (0, -1), (1, -4), (2, 4)])
def test_gather_one_scalar_index(axis, k):
    """A 0-d index (a dimension read from a Shape, a layer of a state) takes a slice copy: onnxruntime's
    values and shape, negative indices wrapped; a non-contiguous input and bfloat16 bits too."""
    x = RNG.standard_normal((5, 4, 6), dtype=np.float32)
    _compare("Gather", {"x": x, "i": np.array(k, np.int64)}, axis=axis)
    (y,) = _run_ours("Gather", {"x": x.transpose(2, 1, 0).copy().transpose(2, 1, 0), "i": np.array(k, np.int32)},
                     axis=axis)
    np.testing.assert_array_equal(y, np.take(x, k, axis=axis))
    assert y.flags.c_contiguous


def test_gather_one_index_of_a_vector_whose_dtype_was_unpickled():
    """An array a cached Numba function returns (a compiled region's Shape, say) carries an unpickled copy of its
    dtype, which numpy does not call built-in.  Picking one element of such a vector took the copy kernel's path
    with a scalar for a view, and read memory at an unrelated address."""
    import pickle
    from ops.movement import numpy_dtype
    i64 = pickle.loads(pickle.dumps(np.dtype(np.int64)))
    assert i64.isbuiltin == 0 and numpy_dtype(i64)
    x = np.array([1, 96, 8, -5], dtype=i64)
    for k in range(-4, 4):
        (y,) = _run_ours("Gather", {"x": x, "i": np.array(k, np.int64)}, axis=0)
        assert y.shape == () and int(y) == int(x[k])


def test_gather_elements():
    x = RNG.standard_normal((64, 512), dtype=np.float32)
    idx = RNG.integers(-512, 512, (64, 100)).astype(np.int64)
    _compare("GatherElements", {"x": x, "i": idx}, axis=1)
    idx0 = RNG.integers(0, 64, (10, 512)).astype(np.int64)
    _compare("GatherElements", {"x": x, "i": idx0}, axis=0)


def test_gather_nd_batch_dims():
    x = RNG.standard_normal((4, 32, 16, 64), dtype=np.float32)
    idx = np.stack([RNG.integers(0, 32, (4, 50)), RNG.integers(-16, 16, (4, 50))], -1).astype(np.int64)
    _compare("GatherND", {"x": x, "i": idx}, batch_dims=1)
    _compare("GatherND", {"x": x, "i": RNG.integers(0, 4, (7, 1)).astype(np.int64)})


def test_compress_and_nonzero():
    x = RNG.standard_normal((128, 257), dtype=np.float32)
    cond = RNG.random(257) > 0.5
    _compare("Compress", {"x": x, "c": cond}, axis=1)
    _compare("Compress", {"x": x, "c": RNG.random(1000) > 0.3})
    z = np.where(RNG.random((50, 40, 3)) > 0.7, x[:50, :120].reshape(50, 40, 3), 0).astype(np.float32)
    z[0, 0, 0] = -0.0
    _compare("NonZero", {"z": z})
    _compare("NonZero", {"z": (z > 0)})


def test_onehot():
    idx = RNG.integers(-1200, 1200, (16, 32)).astype(np.int64)
    depth = np.array(1000, np.int64)
    vals = np.array([-1.5, 3.0], np.float32)
    _compare("OneHot", {"i": idx, "d": depth, "v": vals}, axis=1)
    _compare("OneHot", {"i": idx, "d": depth, "v": vals.astype(np.int64)})


@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique(sorted_):
    x = RNG.integers(0, 50, 2000).astype(np.float32)
    _compare("Unique", {"x": x}, n_out=4, sorted=sorted_)
    rows = RNG.integers(0, 3, (200, 4)).astype(np.int64)
    _compare("Unique", {"x": rows}, n_out=4, sorted=1, axis=0)


def test_unique_only_some_outputs():
    x = np.array([2, 1, 1, 3, 4, 3], np.int64)
    y, inv = _run_ours("Unique", {"x": x}, out_names=["y", "", "inv"], sorted=0)
    np.testing.assert_array_equal(y, [2, 1, 3, 4])
    np.testing.assert_array_equal(inv, [0, 1, 1, 2, 3, 2])


# -- scatters --------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    data = RNG.standard_normal((256, 128), dtype=np.float32)
    if reduction == "none":
        rows = RNG.permutation(256)[:64]
    else:
        rows = RNG.integers(0, 256, 64)
    idx = rows.reshape(64, 1).astype(np.int64)
    upd = RNG.standard_normal((64, 128), dtype=np.float32)
    _compare("ScatterND", {"d": data, "i": idx, "u": upd}, reduction=reduction, rtol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(reduction):
    data = RNG.standard_normal((64, 300), dtype=np.float32)
    if reduction == "none":
        idx = np.stack([RNG.permutation(300)[:40] for _ in range(64)]).astype(np.int64)
    else:
        idx = RNG.integers(-300, 300, (64, 40)).astype(np.int64)
    upd = RNG.standard_normal((64, 40), dtype=np.float32)
    _compare("ScatterElements", {"d": data, "i": idx, "u": upd}, axis=1, reduction=reduction, rtol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_kv_cache(mode):
    past = RNG.standard_normal((2, 8, 512, 64), dtype=np.float32)
    upd = RNG.standard_normal((2, 8, 16, 64), dtype=np.float32)
    w = np.array([100, 500 if mode == "circular" else 496], np.int64)
    m = _model("TensorScatter", {"p": past, "u": upd, "w": w}, opset=24, mode=mode, axis=2)
    (ours,) = InferenceSession(m.SerializeToString()).run(None, {"p": past, "u": upd, "w": w})
    ref = past.copy()
    for b in range(2):
        for s in range(16):
            t = w[b] + s
            ref[b, :, t % 512 if mode == "circular" else t] = upd[b, :, s]
    np.testing.assert_array_equal(ours, ref)
    theirs = ort.InferenceSession(m.SerializeToString()).run(None, {"p": past, "u": upd, "w": w})[0]
    np.testing.assert_array_equal(ours, theirs)


# -- losses ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_softmax_cross_entropy(reduction, weighted):
    N, C, D = 16, 1000, 12
    x = RNG.standard_normal((N, C, D), dtype=np.float32) * 3
    t = RNG.integers(0, C, (N, D)).astype(np.int64)
    t[0, :3] = -100
    feeds = {"x": x, "t": t}
    if weighted:
        feeds["w"] = RNG.random(C, dtype=np.float32)
    _compare("SoftmaxCrossEntropyLoss", feeds, n_out=2, reduction=reduction, ignore_index=-100, rtol=1e-4,
             atol=1e-5)
    _compare("NegativeLogLikelihoodLoss", feeds, reduction=reduction, ignore_index=-100, rtol=1e-5, atol=1e-6)


def test_softmax_cross_entropy_2d_no_ignore():
    x = RNG.standard_normal((512, 32000 // 8), dtype=np.float32)
    t = RNG.integers(0, x.shape[1], 512).astype(np.int64)
    _compare("SoftmaxCrossEntropyLoss", {"x": x, "t": t}, rtol=1e-4, atol=1e-5)


# -- index validation ------------------------------------------------------------------------------

def _raises(op_type, feeds, match, **kw):
    with pytest.raises(IndexOutOfRangeError, match=match):
        _run_ours(op_type, feeds, **kw)


def test_gather_past_the_end_raises():
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    _raises("Gather", {"x": x, "i": np.array([0, 10], np.int64)}, r"Gather: index 10 .*\[-10, 9\]")
    _raises("Gather", {"x": x, "i": np.array([-11], np.int64)}, r"Gather: index -11 ")
    _raises("Gather", {"x": x, "i": np.array([4], np.int32)}, r"Gather: index 4 .*\[-4, 3\]", axis=1)
    _raises("Gather", {"x": x, "i": np.array(-11, np.int64)}, r"Gather: index -11 .*\[-10, 9\]")


def test_other_index_ops_raise():
    x = np.zeros((4, 5), np.float32)
    big = np.array([[0, 5]], np.int64)
    _raises("GatherElements", {"x": x, "i": big}, r"GatherElements: index 5", axis=1)
    _raises("ScatterElements", {"x": x, "i": big, "u": np.ones((1, 2), np.float32)}, r"ScatterElements: index 5",
            axis=1)
    _raises("GatherND", {"x": x, "i": np.array([[3, 7]], np.int64)}, r"GatherND: index \(component 1\) 7")
    _raises("ScatterND", {"x": x, "i": np.array([[4]], np.int64), "u": np.ones((1, 5), np.float32)},
            r"ScatterND: index \(component 0\) 4")
    _raises("Compress", {"x": x, "c": np.array([0, 0, 0, 0, 1], bool)}, r"Compress: .* 4", axis=0)
    _raises("NegativeLogLikelihoodLoss", {"x": x, "t": np.array([1, 2, 5, 0], np.int64)},
            r"NegativeLogLikelihoodLoss: target 5 .*\[0, 4\]")
    _raises("SoftmaxCrossEntropyLoss", {"x": x, "t": np.array([1, -1, 0, 0], np.int64)},
            r"SoftmaxCrossEntropyLoss: target -1")
    past, upd = np.zeros((1, 8, 2), np.float32), np.ones((1, 3, 2), np.float32)
    with pytest.raises(IndexOutOfRangeError, match="TensorScatter: write index"):
        InferenceSession(_model("TensorScatter", {"p": past, "u": upd, "w": np.array([6], np.int64)}, opset=24,
                                axis=1).SerializeToString()).run(None, {"p": past, "u": upd,
                                                                        "w": np.array([6], np.int64)})


def test_onehot_out_of_range_is_all_off():
    (y,) = _run_ours("OneHot", {"i": np.array([1, 9, -9, -1], np.int64), "d": np.array(5, np.int64),
                                "v": np.array([0, 1], np.int32)})
    np.testing.assert_array_equal(y, np.array([[0, 1, 0, 0, 0], [0] * 5, [0] * 5, [0, 0, 0, 0, 1]], np.int32))
