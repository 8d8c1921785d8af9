"""Vectorized fast paths: ``ops._fastmath.exp32`` accuracy and the hot kernels that use it.

exp32 is checked against the correctly rounded float32 ``e**x`` (numpy's float64 exp, rounded)
over a dense sample of every float32 bit pattern in the finite-result range, a dense uniform grid,
and the special values (overflow, underflow into subnormals, +-inf, NaN), both through the
vectorized loop a kernel compiles and scalar calls.  Softmax/LogSoftmax, LayerNormalization,
MatMul (GEMV and GEMM) and Gemm are compared with onnxruntime on realistic shapes, including
NaN/inf rows and read-only (memory-mapped) weights.
"""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit
from onnx import TensorProto, helper, numpy_helper

from ops import _simd
from ops._fastmath import FAST, exp32, exp32_normal, fexp, maxnum, minnum
from runtime import InferenceSession

import onnxruntime as ort  # noqa: E402


@njit(fastmath=FAST, cache=True)
def _vexp(x, out):
    for i in range(x.shape[0]):
        out[i] = fexp(x[i])


@njit(fastmath=FAST, cache=True)
def _vmax(x):
    m = x[0]
    for i in range(1, x.shape[0]):
        m = maxnum(m, x[i])
    return m


def _ulp_err(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    _vexp(x, out)
    with np.errstate(over="ignore"):
        exact = np.exp(x.astype(np.float64))
        ref = exact.astype(np.float32)
    fin = np.isfinite(ref)
    a = np.abs(ref[fin])
    ulp = (np.nextafter(a, np.float32(np.inf)) - a).astype(np.float64)
    err = np.abs(out[fin].astype(np.float64) - exact[fin]) / ulp
    # Overflow must agree exactly with the correctly rounded result.
    assert np.array_equal(np.isinf(out), np.isinf(ref))
    return err


def test_exp32_dense_bit_patterns():
    # Every 509th float32 bit pattern of each sign, up to the overflow / full-underflow bounds.
    pos = np.arange(0, np.float32(89.0).view(np.int32), 509, dtype=np.int32).view(np.float32)
    neg = -np.arange(0, np.float32(104.0).view(np.int32), 509, dtype=np.int32).view(np.float32)
    for x in (pos, neg):
        err = _ulp_err(x)
        assert err.max() <= 2.0, (float(err.max()), float(x[np.argmax(err)]))


def test_exp32_dense_grid():
    x = np.linspace(-104.0, 89.0, 2_000_001, dtype=np.float32)
    err = _ulp_err(x)
    assert err.max() <= 2.0, (float(err.max()), float(x[np.argmax(err)]))
    # Softmax's argument range: x - max <= 0, where results must be nearly exact.
    x = np.linspace(-20.0, 0.0, 1_000_001, dtype=np.float32)
    assert _ulp_err(x).max() <= 1.5


def test_exp32_special_values():
    x = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 88.72283, 88.7229, 88.8, 89.0, 100.0, 1e30,
                  3.4e38, -87.33655, -87.4, -103.0, -103.9, -104.0, -110.0, -1e30, -3.4e38,
                  1e-30, -1e-30, 1e-45, -1e-45], np.float32)
    out = np.empty_like(x)
    _vexp(x, out)
    with np.errstate(over="ignore"):
        ref = np.exp(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    fin = ~np.isnan(ref)
    np.testing.assert_array_max_ulp(out[fin], ref[fin], maxulp=2)
    assert out[0] == np.inf and out[1] == 0.0 and out[9] == np.inf and out[-6] == 0.0
    # Scalar (non-vectorized) calls give the same results.
    for v, o in zip(x, out):
        s = exp32(v)
        assert (np.isnan(s) and np.isnan(o)) or s == o


@njit(fastmath=FAST, cache=True)
def _vexp_normal(x, out):
    for i in range(x.shape[0]):
        out[i] = exp32_normal(x[i])


def test_exp32_normal_range_and_nan_payloads():
    x = np.linspace(-86.0, 88.0, 1_000_001, dtype=np.float32)
    out = np.empty_like(x)
    full = np.empty_like(x)
    _vexp_normal(x, out)
    _vexp(x, full)
    np.testing.assert_array_max_ulp(out, full, maxulp=1)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7FC001FF, 0x7F800001, 0xFFFFFFFF, 0x7FC12345], np.uint32)
    nans = nans.view(np.float32)
    out = np.empty_like(nans)
    _vexp_normal(nans, out)
    assert np.isnan(out).all()
    _vexp(nans, out)
    assert np.isnan(out).all()


def test_fexp_float64_is_libm():
    x = np.linspace(-700, 700, 10001)
    out = np.empty_like(x)
    _vexp(x, out)
    np.testing.assert_array_max_ulp(out, np.exp(x), maxulp=1)


@njit(fastmath=FAST, cache=True)
def _vmin(x):
    m = x[0]
    for i in range(1, x.shape[0]):
        m = minnum(m, x[i])
    return m


def test_maxnum_reduction():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(10007).astype(np.float32)
    assert _vmax(x) == x.max()
    assert _vmin(x) == x.min()
    x[5000] = 1e30
    assert _vmax(x) == np.float32(1e30)
    x[:3] = -np.inf
    assert _vmax(x) == np.float32(1e30)


# -- kernels against onnxruntime ---------------------------------------------------------------------

def _model(op_type, feeds: dict, inits: dict, opset=17, **attrs):
    node = helper.make_node(op_type, list(feeds) + list(inits), ["y"], **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def _both(op_type, feeds, inits=None, **attrs):
    m = _model(op_type, feeds, inits or {}, **attrs)
    ours = InferenceSession(m).run(None, feeds)[0]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    theirs = ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return ours, theirs


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,axis", [((8, 32768), -1), ((3, 7, 5), 1), ((2, 1000), -1)])
def test_softmax_vs_ort(op_type, shape, axis):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    ours, theirs = _both(op_type, {"x": x}, axis=axis)
    np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=1e-6 if op_type == "Softmax" else 2e-5)


def test_softmax_nonfinite_rows():
    x = np.random.default_rng(2).standard_normal((7, 4096)).astype(np.float32)
    x[0, 17] = np.nan
    x[1, :] = -np.inf
    x[2, 5] = np.inf
    x[3, 9] = -np.inf  # a single -inf element is fine: it contributes exp(-inf) = 0
    x[4, 100] = np.uint32(0x7FC001FF).view(np.float32)  # a NaN whose payload has low bits set
    x[5, 7] = -200.0  # spread beyond the fast exp's range: the general path, tiny values underflow
    m = _model("Softmax", {"x": x}, {}, axis=-1)
    y = InferenceSession(m).run(None, {"x": x})[0]
    assert np.isnan(y[:3]).all() and np.isnan(y[4]).all()
    assert y[3, 9] == 0.0 and np.isfinite(y[3]).all()
    np.testing.assert_allclose(y[3].sum(), 1.0, rtol=1e-5)
    assert y[5, 7] == 0.0
    ref = np.exp(x[5].astype(np.float64) - x[5].max())
    np.testing.assert_allclose(y[5], ref / ref.sum(), rtol=2e-6, atol=1e-12)
    # LogSoftmax takes the same paths.
    m = _model("LogSoftmax", {"x": x}, {}, axis=-1)
    y = InferenceSession(m).run(None, {"x": x})[0]
    assert np.isnan(y[:3]).all() and np.isnan(y[4]).all()
    x6 = x[6].astype(np.float64)
    np.testing.assert_allclose(y[6], x6 - x6.max() - np.log(np.exp(x6 - x6.max()).sum()), rtol=1e-5, atol=1e-5)


def test_softmax_float64_big():
    x = np.random.default_rng(3).standard_normal((16, 32768))
    ours, theirs = _both("Softmax", {"x": x}, axis=-1)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("rows", [3, 512])
def test_layernorm_vs_ort(rows):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((rows, 4096)) * 3 + 1).astype(np.float32)
    g = rng.standard_normal(4096).astype(np.float32)
    b = rng.standard_normal(4096).astype(np.float32)
    ours, theirs = _both("LayerNormalization", {"x": x}, {"g": g, "b": b}, axis=-1, epsilon=1e-5)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (1, 1000, 300), (1, 6, 512), (128, 512, 1024), (2, 64, 4)])
def test_matmul_vs_ort(m, k, n):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    ours, theirs = _both("MatMul", {"x": x}, {"w": w})
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=2e-5)


def test_gemv_float64_and_batched_row():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 1, 777))
    w = rng.standard_normal((777, 1031))
    ours, theirs = _both("MatMul", {"x": x}, {"w": w})
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-10)


def test_readonly_weights(tmp_path):
    """Initializers may be read-only memory maps: the BLAS and GEMV paths must accept them."""
    from ops.matmul import matmul_nd
    rng = np.random.default_rng(7)
    w = rng.standard_normal((512, 300)).astype(np.float32)
    path = tmp_path / "w.npy"
    np.save(path, w)
    wm = np.load(path, mmap_mode="r")
    assert not wm.flags.writeable
    for x in (rng.standard_normal((1, 512)).astype(np.float32), rng.standard_normal((5, 512)).astype(np.float32)):
        np.testing.assert_allclose(matmul_nd(x, wm), x @ w, rtol=1e-4, atol=1e-4)
    # Gemm with transB on a read-only weight.
    x = rng.standard_normal((3, 300)).astype(np.float32)
    c = rng.standard_normal(512).astype(np.float32)
    ours, theirs = _both("Gemm", {"x": x}, {"w": w, "c": c}, alpha=0.5, beta=2.0, transB=1)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_sigmoid_and_tanh_gelu_float32_kernels():
    """The elementwise Sigmoid and tanh-GELU kernels on float32 (through exp32) against float64 references,
    over a dense grid with the tails and the special values; float64 inputs keep libm's formulas."""
    from ops import _elementwise_kernels as K
    x = np.concatenate([np.linspace(-110, 110, 400001), [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30]])
    x32 = x.astype(np.float32)
    xd = x32.astype(np.float64)
    out = np.empty_like(x32)
    K.u_sigmoid(x32, out, 0.0, 0.0)
    with np.errstate(over="ignore"):
        ref = 1 / (1 + np.exp(-xd))
    fin = np.isfinite(xd)
    rel = np.abs(out[fin] - ref[fin]) / np.maximum(ref[fin], np.finfo(np.float32).tiny)
    assert rel.max() < 4e-7, rel.max()
    assert out[-5] == 1.0 and out[-4] == 0.0 and np.isnan(out[-3])
    K.u_gelu_tanh(x32, out, 0.0, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = 0.5 * xd * (1 + np.tanh(0.7978845608028654 * (xd + 0.044715 * xd ** 3)))
    assert np.abs(out[fin] - ref[fin]).max() <= 4e-7 * np.abs(xd[fin]).max()
    close = fin & (np.abs(xd) < 8)
    np.testing.assert_allclose(out[close], ref[close], rtol=2e-6, atol=1e-12)
    assert np.isnan(out[-3]) and out[-5] == np.inf
    out64 = np.empty_like(xd)
    K.u_sigmoid(xd, out64, 0.0, 0.0)
    np.testing.assert_allclose(out64[fin], 1 / (1 + np.exp(-np.clip(xd[fin], -700, 700))), rtol=1e-15)


def _tanh_model():
    g = helper.make_graph([helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Mul", ["t", "x"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n"]),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.skipif(not _simd.AVX2,
                    reason="onnxruntime's FMA3 Tanh kernel runs on x86-64 hosts with AVX2")
@pytest.mark.parametrize("compiled", [False, True])
def test_tanh_bit_for_bit_onnxruntime(compiled):
    """float32 Tanh is MLAS's rational form, as onnxruntime computes it: the node alone and inside a fused
    segment or compiled region, over a wide sample with the clamp's ends, zeros, infinities and NaN."""
    import runtime as rt
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(20000) * s for s in (1e-3, 0.3, 2.0, 12.0)]).astype(np.float32)
    x[:10] = [9, -9, 8.99, -9.01, 0, -0.0, np.inf, -np.inf, np.nan, 1e-40]
    model = _tanh_model()
    so = rt.SessionOptions()
    so.compiled_regions = compiled
    got = rt.InferenceSession(model, so).run(None, {"x": x})
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert not np.array_equal(np.tanh(x[10:]), want[0][10:])  # libm's values differ: the sample tells them apart
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


_HELPERS = ("fsigmoid", "ftanh", "fsigmoid_mlas", "fgelu_tanh", "fexp")

_FIRST = """
import numpy as np
from numba import njit
from ops._fastmath import fsigmoid, ftanh, fsigmoid_mlas, fgelu_tanh, fexp
@njit(cache=True)  # Numba's default error model: a float division checks for zero
def first(x):
    s = np.float32(0)
    for i in range(x.shape[0]):
        s += fsigmoid(x[i]) + ftanh(x[i]) + fsigmoid_mlas(x[i]) + fgelu_tanh(x[i]) + fexp(x[i])
    return s
first(np.ones(4, np.float32))
"""

_LATER = """
import re, sys
import numpy as np
from numba import njit
from ops._fastmath import fsigmoid, ftanh, fsigmoid_mlas, fgelu_tanh, fexp
""" + "".join(f"""
@njit(cache=True, error_model="numpy")
def later_{f}(x, out):
    for i in range(x.shape[0]):
        out[i] = {f}(x[i])
""" for f in _HELPERS) + """
bad = []
for k in (""" + ", ".join(f"later_{f}" for f in _HELPERS) + """,):
    k(np.ones(64, np.float32), np.empty(64, np.float32))
    if not re.search(r"\\bv?(mul|add|fmadd\\d*)ps\\b", k.inspect_asm(k.signatures[0])):
        bad.append(k.__name__)
print("scalar:", bad)
sys.exit(1 if bad else 0)
"""


def test_helpers_vectorize_in_kernels_compiled_after_their_cache(tmp_path):
    """A kernel compiled in a process where the float helpers are already in Numba's on-disk cache, put there
    by a kernel with Numba's default error model, still vectorizes its loop over them: the helpers carry
    their own error model, so no zero-division check of the first caller's comes along (Sigmoid 7x slower)."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=root)
    for i, src in enumerate((_FIRST, _LATER)):
        path = tmp_path / f"step{i}.py"
        path.write_text(src)
        r = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
