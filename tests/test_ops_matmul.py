"""Matrix-product and quantization kernels against onnxruntime on realistic shapes.

Each case builds a one-node model with onnx.helper, runs it through ``runtime.InferenceSession`` and
``onnxruntime.InferenceSession``, and compares every output with a per-dtype tolerance.  Einsum is
also checked against numpy.einsum for equations onnxruntime does not cover.  Shape errors must raise
``ShapeMismatchError`` naming the shapes.
"""
import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession
from runtime.dtypes import onnx_type
from runtime.errors import ShapeMismatchError

import ops.matmul as MM

RNG = np.random.default_rng(0)
TOL = {np.float32: (2e-4, 2e-4), np.float64: (1e-10, 1e-10), np.float16: (2e-2, 2e-2)}


def _model(op_type, feeds, n_out=1, opset=21, inits=None, **attrs):
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
    return m


def _compare(op_type, feeds, rtol=1e-6, atol=1e-6, inits=None, exact=False, **kw):
    m = _model(op_type, feeds, inits=inits, **kw).SerializeToString()
    ours = InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        if exact:
            np.testing.assert_array_equal(a.astype(np.float64), b.astype(np.float64))
        else:
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)
    return ours


def _compare_ref(op_type, feeds, inits=None, **kw):
    """Exact comparison with onnx.reference, for the 4-bit and 8-bit-float types onnxruntime cannot return."""
    from onnx.reference import ReferenceEvaluator
    m = _model(op_type, feeds, inits=inits, **kw)
    ours = InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    ref = ReferenceEvaluator(m).run(None, feeds)
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))
    return ours


def _rand(shape, dtype):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-50, 50, shape).astype(dtype)
    return (RNG.standard_normal(shape) / 8).astype(dtype)


# -- MatMul ----------------------------------------------------------------------------------------

def test_matmul_gemv_4096():
    a = _rand((1, 4096), np.float32)
    w = _rand((4096, 4096), np.float32)
    _compare("MatMul", {"a": a}, *TOL[np.float32], inits={"w": w})


def test_matmul_gemm_folded_batch():
    a = _rand((2, 64, 1024), np.float32)
    w = _rand((1024, 2048), np.float32)
    _compare("MatMul", {"a": a}, *TOL[np.float32], inits={"w": w})


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("sa,sb", [((3, 1, 16, 24), (5, 24, 8)), ((24,), (2, 24, 7)), ((4, 5, 24), (24,)),
                                   ((24,), (24,)), ((1, 300), (300, 520))])
def test_matmul_broadcast_dtypes(dtype, sa, sb):
    rtol, atol = TOL.get(dtype, (0, 0))
    _compare("MatMul", {"a": _rand(sa, dtype), "b": _rand(sb, dtype)}, rtol, atol, opset=13)


def test_matmul_shape_error():
    with pytest.raises(ShapeMismatchError, match="inner dimensions"):
        MM.matmul_nd(np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32))


# -- Gemm ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ta,tb,cshape", [(0, 1, (512,)), (1, 0, (64, 1)), (1, 1, ()), (0, 0, None)])
def test_gemm(ta, tb, cshape):
    m, k, n = 64, 256, 512
    a = _rand((k, m) if ta else (m, k), np.float32)
    b = _rand((n, k) if tb else (k, n), np.float32)
    inits = {"b": b}
    if cshape is not None:
        inits["c"] = _rand(cshape, np.float32)
    _compare("Gemm", {"a": a}, *TOL[np.float32], inits=inits, opset=13, transA=ta, transB=tb, alpha=0.5, beta=2.0)


@pytest.mark.parametrize("rows", [1, 5, 65])
@pytest.mark.parametrize("tb", [0, 1])
def test_gemm_few_rows_against_a_constant_weight(rows, tb):
    """Few rows against a constant weight run on its packed panels (a classifier head): onnxruntime's result
    for one row, several, and more than the panels take (BLAS), a column count that leaves a part panel, both
    layouts of B, twice from one session (the second run reuses the panels)."""
    k, n = 200, 75
    b = _rand((n, k) if tb else (k, n), np.float32)
    inits = {"b": b, "c": _rand((n,), np.float32)}
    m = _model("Gemm", {"a": _rand((rows, k), np.float32)}, inits=inits, opset=13, transB=tb, alpha=0.5,
               beta=2.0).SerializeToString()
    ours = InferenceSession(m, providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    for _ in range(2):
        feeds = {"a": _rand((rows, k), np.float32)}
        np.testing.assert_allclose(ours.run(None, feeds)[0], ref.run(None, feeds)[0], *TOL[np.float32])


def test_gemm_bad_bias():
    m = _model("Gemm", {"a": _rand((4, 8), np.float32), "b": _rand((8, 6), np.float32),
                        "c": _rand((5,), np.float32)}, opset=13).SerializeToString()
    feeds = {"a": _rand((4, 8), np.float32), "b": _rand((8, 6), np.float32), "c": _rand((5,), np.float32)}
    with pytest.raises(Exception, match="broadcast"):
        InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)


# -- Einsum ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("eq,shapes", [
    ("bhqd,bhkd->bhqk", [(2, 4, 16, 32), (2, 4, 24, 32)]),
    ("...ij,...jk->...ik", [(3, 1, 5, 6), (4, 6, 2)]),
    ("ij,jk,kl->il", [(5, 6), (6, 7), (7, 3)]),
    ("ii->i", [(7, 7)]),
    ("bii->b", [(3, 5, 5)]),
    ("ij->", [(9, 4)]),
    ("ij,ij->i", [(9, 4), (9, 4)]),
    ("i,j", [(4,), (3,)]),
    ("abc->cab", [(2, 3, 4)]),
    ("ba,ca", [(3, 5), (4, 5)]),
])
def test_einsum_vs_numpy(eq, shapes):
    xs = [_rand(s, np.float64) for s in shapes]
    np.testing.assert_allclose(MM.einsum(eq, *xs), np.einsum(eq, *xs), rtol=1e-10, atol=1e-12)


def test_einsum_vs_ort():
    feeds = {"q": _rand((2, 8, 64, 64), np.float32), "k": _rand((2, 8, 64, 64), np.float32)}
    _compare("Einsum", feeds, *TOL[np.float32], opset=12, equation="bhqd,bhkd->bhqk")


# -- integer and quantized products ----------------------------------------------------------------

def _pairs_saturated(a, b):
    """sum over k pairs (2p, 2p + 1) of the raw codes' products, each pair sum clamped to int16: onnxruntime's
    uint8 x int8 products where MLAS sums them by ``vpmaddubsw`` (``ops._u8s8``)."""
    a = a.astype(np.int64)
    b = b.astype(np.int64)
    if a.shape[-1] % 2:
        a = np.concatenate([a, np.zeros(a.shape[:-1] + (1,), np.int64)], axis=-1)
        b = np.concatenate([b, np.zeros((1, b.shape[1]), np.int64)])
    pairs = a[..., 0::2, None] * b[0::2] + a[..., 1::2, None] * b[1::2]
    return np.clip(pairs, -32768, 32767).sum(-2)


@pytest.mark.parametrize("adt,bdt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_matmul_integer(adt, bdt):
    """Against onnxruntime (its own products: for uint8 x int8 on hosts where its kernel saturates 16-bit
    pair sums, those) and against numpy's exact or saturated integers; a per-column B zero point too."""
    from ops import _u8s8
    a = RNG.integers(np.iinfo(adt).min, np.iinfo(adt).max, (2, 33, 63)).astype(adt)
    b = RNG.integers(np.iinfo(bdt).min, np.iinfo(bdt).max, (63, 48)).astype(bdt)
    za, zb = np.array(3, adt), np.array(2, bdt)
    zbc = RNG.integers(0, 5, (48,)).astype(bdt)
    for z in (zb, zbc):
        _compare("MatMulInteger", {"a": a}, exact=True, inits={"b": b, "za": za, "zb": z}, opset=10)
        zi = z.astype(np.int64)
        if (adt, bdt) == (np.uint8, np.int8) and _u8s8.SATURATES:
            ref = _pairs_saturated(a, b) - zi * a.astype(np.int64).sum(-1, keepdims=True) \
                - 3 * b.astype(np.int64).sum(0) + 63 * 3 * zi
            assert not np.array_equal(ref, (a.astype(np.int64) - 3) @ (b.astype(np.int64) - zi))  # it saturates
        else:
            ref = (a.astype(np.int64) - 3) @ (b.astype(np.int64) - zi)
        np.testing.assert_array_equal(MM.matmul_integer(a, b, za, z), ref)


@pytest.mark.parametrize("bdt", [np.uint8, np.int8])
def test_matmul_integer_packed_b_follows_its_zero_point(bdt):
    """One session run with two B zero points fed in turn: the node's packed B (kept between runs) is remade
    for the new zero point, and each run equals onnxruntime's."""
    a = RNG.integers(0, 256, (4, 24)).astype(np.uint8)
    b = RNG.integers(np.iinfo(bdt).min, np.iinfo(bdt).max, (24, 16)).astype(bdt)
    feeds = {"a": a, "zb": np.array(3, bdt)}
    m = _model("MatMulInteger", feeds, inits={"b": b}, opset=10)
    m.graph.node[0].input[:] = ["a", "b", "", "zb"]
    ours = InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for z in (3, -7 if bdt == np.int8 else 200, 3):
        f = {"a": a, "zb": np.array(z, bdt)}
        np.testing.assert_array_equal(ours.run(None, f)[0], ref.run(None, f)[0])


@pytest.mark.parametrize("kernel", ["gemm", "gemm_portable"])
def test_int16_pairs_are_the_exact_integers(kernel):
    """``_i16pairs``' products (the host's ``vpmaddwd`` form and the portable loop) over packed int16 operands:
    an odd K, a part-filled last column group, the extremes of codes minus zero points (+-255); and the
    threaded driver over more groups than one task holds."""
    from ops import _i16pairs
    a = RNG.integers(-255, 256, (5, 37)).astype(np.int16)
    b = RNG.integers(-255, 256, (37, 141)).astype(np.int16)
    a[0], b[:, 0] = 255, -255
    bp = _i16pairs.pack(b)
    ap = np.zeros((5, 2 * bp.shape[1]), np.int16)
    ap[:, :37] = a
    out = np.empty((5, 8 * bp.shape[0]), np.int32)
    getattr(_i16pairs, kernel)(ap, bp, out, 0, bp.shape[0])
    want = a.astype(np.int64) @ b.astype(np.int64)
    np.testing.assert_array_equal(out[:, :141], want)
    out[:] = 0
    _i16pairs.gemm_groups(ap, bp, out)
    np.testing.assert_array_equal(out[:, :141], want)


@pytest.mark.parametrize("dt,bdt", [(np.uint8, np.uint8), (np.int8, np.int8), (np.uint8, np.int8)])
def test_qlinear_matmul(dt, bdt):
    lo, hi = np.iinfo(dt).min, np.iinfo(dt).max
    a = RNG.integers(lo, hi, (3, 16, 64)).astype(dt)
    b = RNG.integers(np.iinfo(bdt).min, np.iinfo(bdt).max, (64, 40)).astype(bdt)
    inits = {"as": np.array(0.02, np.float32), "az": np.array(1, dt), "b": b, "bs": np.array(0.01, np.float32),
             "bz": np.array(2, bdt), "ys": np.array(0.5, np.float32), "yz": np.array(5, dt)}
    feeds = {"a": a}
    m = _model("QLinearMatMul", feeds, inits=inits, opset=10)
    node = m.graph.node[0]
    node.input[:] = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    ours = InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    assert np.abs(ours.astype(np.int32) - ref.astype(np.int32)).max() <= 1


# -- QuantizeLinear / DequantizeLinear -------------------------------------------------------------

@pytest.mark.parametrize("dt", [np.uint8, np.int8, np.int16])
def test_quantize_per_axis(dt):
    x = RNG.standard_normal((4, 256, 8)).astype(np.float32) * 3
    inits = {"s": (RNG.random(256) * 0.05 + 0.01).astype(np.float32), "z": RNG.integers(0, 10, 256).astype(dt)}
    _compare("QuantizeLinear", {"x": x}, exact=True, inits=inits, opset=21, axis=1)


def test_quantize_blocked_int4_roundtrip():
    x = RNG.standard_normal((64, 96)).astype(np.float32)
    s = (RNG.random((64, 3)) * 0.3 + 0.05).astype(np.float32)
    z = np.zeros((64, 3), ml_dtypes.int4)
    (q,) = _compare_ref("QuantizeLinear", {"x": x}, inits={"s": s, "z": z}, opset=21, axis=1, block_size=32)
    (d,) = _compare_ref("DequantizeLinear", {"q": q}, inits={"s": s, "z": z}, opset=21, axis=1, block_size=32)
    inside = (x / np.repeat(s, 32, axis=1) > -7.5) & (x / np.repeat(s, 32, axis=1) < 6.5)
    assert np.all(np.abs(d - x)[inside] <= np.repeat(s, 32, axis=1)[inside] * 0.5 + 1e-6)


def test_dequantize_uint8_per_tensor_large():
    q = RNG.integers(0, 255, (1024, 1024)).astype(np.uint8)
    _compare("DequantizeLinear", {"q": q}, exact=True,
             inits={"s": np.array(0.037, np.float32), "z": np.array(128, np.uint8)}, opset=13)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_quantize_float8_saturate(name):
    x = (RNG.standard_normal((32, 64)) * 1000).astype(np.float32)
    z = np.zeros((), getattr(ml_dtypes, name))
    _compare_ref("QuantizeLinear", {"x": x}, inits={"s": np.array(0.5, np.float32), "z": z}, opset=19)


def test_dynamic_quantize():
    x = RNG.standard_normal((16, 1024)).astype(np.float32)
    _compare("DynamicQuantizeLinear", {"x": x}, n_out=3, rtol=0, atol=1, opset=11)


@pytest.mark.parametrize("lo, hi", [(-3.0, 5.0), (0.5, 4.0), (-6.0, -1.0)])
def test_dynamic_quantize_equals_onnxruntime_over_several_chunks(lo, hi):
    """Codes, scale and zero point equal to onnxruntime's over more than one chunk of the threaded passes, with
    values on the half-way points between codes (rounded to even) and the range's ends in different chunks;
    ranges that hold 0, lie above it and below it."""
    n = 3 * (1 << 16) + 77
    x = RNG.uniform(lo, hi, n).astype(np.float32)
    x[5], x[n - 3] = lo, hi
    scale = np.float32(np.float32(max(hi, 0) - min(lo, 0)) / np.float32(255))
    x[100:400] = (np.arange(300, dtype=np.float32) - 150 + 0.5) * scale  # x / scale lands on k + 0.5
    x[100:400] = np.clip(x[100:400], lo, hi)
    _compare("DynamicQuantizeLinear", {"x": x}, n_out=3, exact=True, opset=11)


def test_quantize_bad_scale_shape():
    from ops.quantize import quantize_linear
    with pytest.raises(ShapeMismatchError, match="per-axis scale"):
        quantize_linear(np.zeros((4, 5), np.float32), np.ones(3, np.float32), None, axis=1)
