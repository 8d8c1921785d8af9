"""Reduction, softmax, normalization, cumulative and TopK kernels against onnxruntime on realistic shapes.

Each case builds a one-node model with onnx.helper, runs it through ``runtime.InferenceSession`` and
``onnxruntime.InferenceSession``, and compares every output with a per-dtype tolerance.  Bad axes and
out-of-range K must raise the runtime's named errors.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from runtime import InferenceSession
from runtime.dtypes import onnx_type
from runtime.errors import InvalidArgumentError, InvalidAttributeError, OnnxNumbaError

RNG = np.random.default_rng(0)
TOL = {np.float32: (1e-5, 1e-5), np.float64: (1e-12, 1e-12), np.float16: (2e-3, 2e-3)}


def _model(op_type, feeds, n_out=1, opset=18, inits=None, **attrs):
    inits = inits or {}
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, list(feeds) + list(inits), outs, **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, onnx_type(v.dtype), list(v.shape)) for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m.SerializeToString()


def _run_ours(op_type, feeds, **kw):
    return InferenceSession(_model(op_type, feeds, **kw), providers=["CPUExecutionProvider"]).run(None, feeds)


def _compare(op_type, feeds, rtol=None, atol=None, exact=False, **kw):
    m = _model(op_type, feeds, **kw)
    ours = InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    dt = next(iter(feeds.values())).dtype.type
    r, a = TOL.get(dt, (0, 0))
    rtol = r if rtol is None else rtol
    atol = a if atol is None else atol
    assert len(ours) == len(ref)
    for x, y in zip(ours, ref):
        assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, x.shape, y.dtype, y.shape)
        if exact:
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x.astype(np.float64), y.astype(np.float64), rtol=rtol, atol=atol)
    return ours


# -- softmax ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
def test_softmax_vocab_32k(op_type):
    x = (RNG.standard_normal((4, 32000)) * 8).astype(np.float32)
    (y,) = _compare(op_type, {"x": x}, axis=-1)
    if op_type == "Softmax":
        np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-5)


def test_softmax_attention_scores_parallel():
    x = RNG.standard_normal((2, 8, 128, 256), dtype=np.float32)
    _compare("Softmax", {"x": x}, axis=-1)


def test_softmax_middle_axis_and_opset11_coercion():
    x = RNG.standard_normal((4, 33, 17, 5), dtype=np.float32)
    _compare("Softmax", {"x": x}, axis=1, opset=13)
    _compare("Softmax", {"x": x}, axis=1, opset=11)
    _compare("Hardmax", {"x": x}, axis=2, opset=13)


def test_softmax_float16():
    x = RNG.standard_normal((8, 4096)).astype(np.float16)
    _compare("Softmax", {"x": x}, axis=-1, rtol=1e-2, atol=1e-4)


# -- normalization ---------------------------------------------------------------------------------

def test_layernorm_hidden_4096_with_stats():
    x = RNG.standard_normal((4, 64, 4096), dtype=np.float32) * 3 + 1
    s = RNG.standard_normal(4096, dtype=np.float32)
    b = RNG.standard_normal(4096, dtype=np.float32)
    _compare("LayerNormalization", {"x": x}, n_out=3, opset=17, inits={"s": s, "b": b}, axis=-1,
             epsilon=1e-5, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not __import__("ops._simd", fromlist=["AVX2"]).AVX2,
                    reason="onnxruntime's MLAS layer-norm kernel (whose order is reproduced) is for x86 hosts with AVX2")
@pytest.mark.parametrize("n,bias", [(16, False), (900, True)])
def test_layernorm_bits_with_stats(n, bias):
    """Rows of 16 and more, float32, a scale of the row's size: MLAS's kernel order, so onnxruntime's bits."""
    x = RNG.standard_normal((3, 5, n), dtype=np.float32) * 3 + 1
    inits = {"s": RNG.standard_normal(n, dtype=np.float32)}
    if bias:
        inits["b"] = RNG.standard_normal(n, dtype=np.float32)
    _compare("LayerNormalization", {"x": x}, n_out=3, opset=17, inits=inits, axis=-1, epsilon=1e-5, exact=True)


def test_layernorm_float16_axis_minus_2():
    x = RNG.standard_normal((2, 16, 64, 32)).astype(np.float16)
    s = RNG.standard_normal((64, 32)).astype(np.float16)
    _compare("LayerNormalization", {"x": x}, opset=17, inits={"s": s}, axis=-2, rtol=1e-2, atol=1e-2)


def test_rmsnorm_hidden_4096():
    x = RNG.standard_normal((4, 64, 4096), dtype=np.float32)
    s = RNG.standard_normal(4096, dtype=np.float32)
    _compare("RMSNormalization", {"x": x}, opset=23, inits={"s": s}, rtol=1e-4, atol=1e-4)


def test_batchnorm_inference():
    x = RNG.standard_normal((8, 64, 28, 28), dtype=np.float32)
    c = 64
    inits = {"s": RNG.standard_normal(c, dtype=np.float32), "b": RNG.standard_normal(c, dtype=np.float32),
             "m": RNG.standard_normal(c, dtype=np.float32), "v": RNG.random(c, dtype=np.float32) + 0.5}
    _compare("BatchNormalization", {"x": x}, opset=15, inits=inits, rtol=1e-4, atol=1e-4)


def test_instance_and_group_norm():
    x = RNG.standard_normal((2, 32, 24, 24), dtype=np.float32)
    s = RNG.standard_normal(32, dtype=np.float32)
    b = RNG.standard_normal(32, dtype=np.float32)
    _compare("InstanceNormalization", {"x": x}, opset=18, inits={"s": s, "b": b}, rtol=1e-4, atol=1e-4)
    # GroupNormalization-21 equals LayerNorm over (C/G, H, W) per group followed by a per-channel affine.
    (y,) = _run_ours("GroupNormalization", {"x": x}, opset=21, inits={"s": s, "b": b}, num_groups=8)
    xg = x.reshape(2, 8, -1).astype(np.float64)
    ref = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    ref = ref * s[:, None, None] + b[:, None, None]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_lrn_lp_mvn():
    x = RNG.standard_normal((2, 16, 20, 20), dtype=np.float32)
    _compare("LRN", {"x": x}, size=5, alpha=1e-3, beta=0.75, bias=2.0, rtol=1e-5, atol=1e-5)
    _compare("LpNormalization", {"x": x}, axis=1, p=2, opset=18)
    _compare("LpNormalization", {"x": x}, axis=-1, p=1, opset=18)
    _compare("MeanVarianceNormalization", {"x": x}, opset=13, rtol=1e-4, atol=1e-4)


def test_norm_binds_plan_time_facts():
    """What the binds decide at plan time: LayerNormalization-17 computes InvStdDev when only it is read (Mean
    unnamed); LpNormalization rejects a p other than 1 or 2 when the session is built."""
    x = RNG.standard_normal((3, 5, 16), dtype=np.float32)
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "", "inv"], axis=-1)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx_type(x.dtype), list(x.shape))],
                          [helper.make_empty_tensor_value_info("y"), helper.make_empty_tensor_value_info("inv")],
                          [numpy_helper.from_array(RNG.standard_normal(16, dtype=np.float32), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    ours = InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for a, r in zip(ours, ref):
        assert a.dtype == r.dtype and a.shape == r.shape
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)
    with pytest.raises(InvalidAttributeError, match="p must be 1 or 2, got 3"):
        _run_ours("LpNormalization", {"x": x}, p=3)


# -- reductions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type,axes,keepdims", [
    ("ReduceMean", [-1], 1), ("ReduceSum", [0, 2], 0), ("ReduceMax", [1], 0), ("ReduceLogSumExp", [-1], 1),
    ("ReduceL2", [1, 2], 1), ("ReduceSumSquare", None, 0), ("ReduceMin", [0, 2], 1), ("ReduceL1", [-1], 0)])
def test_reductions_float32(op_type, axes, keepdims):
    x = RNG.standard_normal((8, 512, 768), dtype=np.float32)
    inits = {} if axes is None else {"axes": np.array(axes, np.int64)}
    # onnxruntime accumulates float32 sums in float32, we in float64: allow its rounding error on long sums.
    _compare(op_type, {"x": x}, inits=inits, keepdims=keepdims, rtol=1e-3 if axes is None else 1e-4, atol=1e-3)


@pytest.mark.parametrize("is_max", [True, False])
def test_row_extremes_give_the_general_kernels_bits(is_max):
    """The vectorized row max/min against the general kernel on rows with NaN first, NaN later (two payloads),
    signed zeros in both orders, infinities and ties: the same bits in every row."""
    from ops import reduce as R
    rows = RNG.standard_normal((12, 37)).astype(np.float32)
    nan2 = np.frombuffer(np.uint32(0x7FC00123).tobytes(), np.float32)[0]
    rows[0, 0] = np.nan
    rows[1, 5], rows[1, 30] = np.nan, nan2
    rows[2] = 0.0
    rows[2, 3] = -0.0
    rows[3] = -0.0
    rows[3, 7] = 0.0
    rows[4, 9] = np.inf
    rows[5, 11] = -np.inf
    rows[6] = -np.inf
    rows[7, :] = rows[7, 0]
    rows[8, 0], rows[8, 20] = np.nan, 1e30
    rows[9] = -0.0
    rows[9, -1] = 0.0
    rows[10] = 0.0
    rows[10, -1] = -0.0
    rows[11] = -1.0 if is_max else 1.0
    rows[11, 5], rows[11, 20], rows[11, 36] = -0.0, 0.0, 0.0
    for dt in (np.float32, np.float64):
        x = rows.astype(dt)
        got = np.empty(12, dt)
        R.extreme_rows(x, got, is_max)
        want = np.empty((12, 1), dt)
        R.reduce3(x.reshape(12, 37, 1), want, np.zeros((2, 1)), R.MAX if is_max else R.MIN)
        np.testing.assert_array_equal(got.view(np.uint32 if dt == np.float32 else np.uint64),
                                      want.reshape(-1).view(np.uint32 if dt == np.float32 else np.uint64))


@pytest.mark.parametrize("dtype", [np.int64])
def test_reductions_int(dtype):
    x = RNG.integers(-50, 50, (16, 300, 40)).astype(dtype)
    ax = {"axes": np.array([1], np.int64)}
    _compare("ReduceSum", {"x": x}, inits=ax, exact=True)
    _compare("ReduceMax", {"x": x}, inits=ax, keepdims=0, exact=True)
    _compare("ReduceProd", {"x": (x % 3).astype(dtype)}, inits={"axes": np.array([2], np.int64)}, exact=True)


def test_reduce_attribute_axes_opset11():
    x = RNG.standard_normal((6, 10, 12), dtype=np.float32)
    _compare("ReduceMean", {"x": x}, opset=11, axes=[0, 2], keepdims=0)
    _compare("ReduceProd", {"x": x}, opset=11, axes=[1], rtol=1e-4)
    _compare("ReduceSum", {"x": x}, opset=11, axes=[-1], keepdims=0)


def test_argmax_vocab_and_ties():
    x = RNG.standard_normal((16, 32000), dtype=np.float32)
    _compare("ArgMax", {"x": x}, axis=-1, keepdims=0, exact=True)
    t = RNG.integers(0, 3, (64, 40)).astype(np.float32)
    for last in (0, 1):
        _compare("ArgMin", {"x": t}, axis=1, select_last_index=last, exact=True, opset=13)
        _compare("ArgMax", {"x": t}, axis=0, select_last_index=last, exact=True, opset=13)


# -- cumulative and TopK ---------------------------------------------------------------------------

@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(exclusive, reverse):
    x = RNG.standard_normal((16, 4096), dtype=np.float32)
    _compare("CumSum", {"x": x}, inits={"axis": np.array(1, np.int64)}, exclusive=exclusive, reverse=reverse,
             rtol=1e-4, atol=1e-4)
    xi = RNG.integers(-100, 100, (30, 7, 5)).astype(np.int64)
    _compare("CumSum", {"x": xi}, inits={"axis": np.array(-2, np.int32)}, exclusive=exclusive, reverse=reverse,
             exact=True)


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_vocab(largest):
    x = RNG.standard_normal((4, 32000), dtype=np.float32)
    _compare("TopK", {"x": x}, n_out=2, inits={"k": np.array([50], np.int64)}, largest=largest, exact=True,
             opset=11)


def test_topk_ties_lower_index_first():
    x = RNG.integers(0, 4, (8, 100, 3)).astype(np.float32)
    for largest in (0, 1):
        _compare("TopK", {"x": x}, n_out=2, inits={"k": np.array([20], np.int64)}, axis=1, largest=largest,
                 exact=True, opset=11)


# -- errors ----------------------------------------------------------------------------------------

def test_topk_k_out_of_range():
    x = RNG.standard_normal((2, 10), dtype=np.float32)
    with pytest.raises(InvalidArgumentError, match="k must lie"):
        _run_ours("TopK", {"x": x}, n_out=2, inits={"k": np.array([11], np.int64)}, opset=11)


def test_bad_axis_is_rejected():
    x = RNG.standard_normal((2, 10), dtype=np.float32)
    with pytest.raises(OnnxNumbaError):
        _run_ours("Softmax", {"x": x}, axis=2, opset=13)
    with pytest.raises(OnnxNumbaError):
        _run_ours("ReduceSum", {"x": x}, inits={"axes": np.array([3], np.int64)})
