"""Float32 products over panel-packed weights (ops/_panels.py), and the MatMul paths that use them: the packing
layout, every row and column remainder against a float64 product, thread splits that give the serial bits, and a
one-row MatMul on an initializer giving the same bits per node and in a compiled region."""
import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError
from onnx import TensorProto, helper, numpy_helper

from ops import _panels as P
from runtime import InferenceSession, SessionOptions

RNG = np.random.default_rng(5)


def _ref(a, w):
    return a.astype(np.float64) @ w.astype(np.float64)


def test_pack_layout():
    K, N = 3, 37
    w = RNG.standard_normal((K, N)).astype(np.float32)
    wp = P.pack_panels(w)
    assert wp.shape == (3, K, 16) and wp.flags.c_contiguous
    for n in range(48):
        for k in range(K):
            assert wp[n // 16, k, n % 16] == (w[k, n] if n < N else 0.0)


@pytest.mark.parametrize("K,N", [(256, 768), (7, 5), (33, 17), (5, 16), (130, 47), (64, 1)])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 7, 9])
def test_products_match_float64(K, N, M):
    """Rows 1..3 past a four-row tile, K not a multiple of the four partial sums, N past the last full panel."""
    w = RNG.standard_normal((K, N)).astype(np.float32)
    a = RNG.standard_normal((M, K)).astype(np.float32)
    wp = P.pack_panels(w)
    out = np.full((M, N), np.nan, np.float32)
    P.gemm_panels(a, wp, out)
    np.testing.assert_allclose(out, _ref(a, w), rtol=2e-5, atol=2e-5 * np.sqrt(K))
    par = np.full((M, N), np.nan, np.float32)
    P.gemm_panels_par(a, wp, par)
    np.testing.assert_array_equal(par, out)  # each panel's sums do not depend on the split
    if M == 1:
        for nt in (1, 2, 3):
            g = np.full((1, N), np.nan, np.float32)
            P.gemv_panels(a, wp, g, nt)
            np.testing.assert_allclose(g, _ref(a, w), rtol=2e-5, atol=2e-5 * np.sqrt(K))
            if nt > 1:
                np.testing.assert_array_equal(g, g1)
            else:
                g1 = g


@pytest.mark.parametrize("M", [1, 3, 4, 9])
@pytest.mark.parametrize("K,N", [(1100, 96), (7, 16), (512, 80)])
def test_blocked_product_matches_float64_and_any_split(K, N, M):
    """The AVX-512 blocked product, called directly so every host runs it: K past one and two chunks, rows past
    a four-row tile, a last group of fewer than four panels; group ranges split anywhere give the same bits."""
    w = RNG.standard_normal((K, N)).astype(np.float32)
    a = RNG.standard_normal((M, K)).astype(np.float32)
    wp = P.pack_panels(w)
    G = (wp.shape[0] + 3) // 4
    out = np.full((M, N), np.nan, np.float32)
    P.gemm_blocked(a, wp, out, 0, G)
    np.testing.assert_allclose(out, _ref(a, w), rtol=2e-5, atol=2e-5 * np.sqrt(K))
    split = np.full((M, N), np.nan, np.float32)
    P.gemm_blocked(a, wp, split, 0, 1)
    P.gemm_blocked(a, wp, split, 1, G)
    np.testing.assert_array_equal(split, out)


@njit(cache=True)
def _tile2(wp, a, out, r0, p0, p1):
    P.tile2(wp, a, out, r0, p0, p1)


def test_writes_only_its_rows_and_columns():
    w = RNG.standard_normal((20, 21)).astype(np.float32)
    a = RNG.standard_normal((6, 20)).astype(np.float32)
    wp = P.pack_panels(w)
    out = np.full((6, 21), -7.0, np.float32)
    _tile2(wp, a, out, 3, 1, 2)  # rows 3..4, columns 16..20
    mask = np.zeros_like(out, bool)
    mask[3:5, 16:21] = True
    assert np.all(out[~mask] == -7.0)
    np.testing.assert_allclose(out[3:5, 16:], _ref(a[3:5], w[:, 16:]), rtol=1e-5, atol=1e-5)


def test_refuses_non_contiguous_rows():
    w = P.pack_panels(RNG.standard_normal((8, 16)).astype(np.float32))
    a = RNG.standard_normal((2, 16)).astype(np.float32)[:, ::2]
    with pytest.raises(TypingError):
        P.gemm_panels(a, w, np.empty((2, 16), np.float32))


def _matmul_model(K, N):
    w = RNG.standard_normal((K, N)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString(), w


@pytest.mark.parametrize("K,N", [(64, 300), (40, 9)])
def test_one_row_matmul_same_bits_per_node_and_compiled(K, N):
    """Decode's one-row products: the per-node wrapper and the compiled form both run the panel GEMV on the
    initializer, so their results are equal bit for bit; several rows agree to summation order."""
    model, w = _matmul_model(K, N)
    on = SessionOptions()
    on.compiled_regions = True
    fused, plain = InferenceSession(model, on), InferenceSession(model)
    assert sum(len(r.nodes) for r in fused.plan.regions) == 2 and not plain.plan.regions
    x = RNG.standard_normal((1, 1, K)).astype(np.float32)
    a, b = fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, np.tanh(_ref(x[0], w))[None], rtol=1e-5, atol=1e-6)
    x = RNG.standard_normal((2, 5, K)).astype(np.float32)
    a, b = fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a, np.tanh(_ref(x.reshape(10, K), w)).reshape(2, 5, N), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 10])
def test_matmul_on_a_computed_weight_in_a_region(rows):
    """A weight computed in the graph (here a transposed input): one row takes the row GEMV, several rows pack
    it into panels at run time; both equal numpy's product."""
    K, N = 24, 37
    g = helper.make_graph(
        [helper.make_node("Transpose", ["wt"], ["w"], perm=[1, 0]), helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", K]),
              helper.make_tensor_value_info("wt", TensorProto.FLOAT, [N, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    on = SessionOptions()
    on.compiled_regions = True
    sess = InferenceSession(m.SerializeToString(), on)
    assert sum(len(r.nodes) for r in sess.plan.regions) == 2
    x = RNG.standard_normal((1, rows, K)).astype(np.float32)
    wt = RNG.standard_normal((N, K)).astype(np.float32)
    y = sess.run(None, {"x": x, "wt": wt})[0]
    assert y.shape == (1, rows, N)
    np.testing.assert_allclose(y, (x.astype(np.float64) @ wt.T.astype(np.float64)), rtol=2e-5, atol=2e-5)
