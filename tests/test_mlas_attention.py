"""GroupQueryAttention and Sigmoid in MLAS's order (``ops/_mlas_attention``, ``ops/_fastmath.fsigmoid_mlas``) with
``ONNX_NUMBA_MLAS_ORDER=1``: bit for bit onnxruntime's CPU kernels (``np.array_equal``) on x86 hosts with AVX2
and without AVX-512, where onnxruntime takes MLAS's FMA3 kernels.  Each case also shows that it tells the orders
apart: the default kernels' result differs from onnxruntime's on it (on hosts without AVX-512 the default
kernels run prompt steps on the same flash kernel, so there the rotary tells them apart)."""
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from fixtures.gqa_node import gqa_feeds, gqa_model
from ops import _mlas_attention as ma
from ops import contrib_quant as Q

pytestmark = pytest.mark.skipif(not Q.mlas_avx2_host(), reason="onnxruntime takes MLAS's FMA3 kernels only on x86 "
                                "hosts with AVX2 and without AVX-512")
F = np.float32


def _kvb(D):
    return ma.kv_block(D, ma.L2_BYTES)


# (heads, kv heads, head size, scale, rotary, interleaved, B, S, P, seqlens, total, onnxruntime threads)
CASES = {
    "prompt": lambda: (4, 2, 32, 0.0, 1, 0, 1, 9, 0, [8], 9, 2),
    "decode": lambda: (4, 2, 80, 0.0, 1, 0, 1, 1, 9, [9], 10, 2),
    "chunk after a past": lambda: (4, 2, 32, 0.125, 1, 0, 1, 5, 7, [11], 12, 2),
    "interleaved rotary": lambda: (4, 2, 48, 0.0, 1, 1, 1, 9, 0, [8], 9, 2),
    "no rotary, ragged decode": lambda: (4, 2, 32, 0.0, 0, 0, 2, 1, 9, [5, 8], 9, 2),
    "padded batch": lambda: (4, 2, 32, 0.0, 1, 0, 2, 6, 0, [3, 5], 6, 2),
    "ragged decode": lambda: (4, 2, 32, 0.0, 1, 0, 2, 1, 9, [5, 8], 9, 2),
    # keys over several of onnxruntime's blocks: the online rescaling by libm's expf
    "several key blocks": lambda: (2, 1, 256, 0.0, 1, 0, 1, 2 * _kvb(256) + 5, 0, [2 * _kvb(256) + 4],
                                   2 * _kvb(256) + 5, 2),
    # fewer heads than onnxruntime's threads: flash decoding splits the keys
    "split decode": lambda: (2, 1, 256, 0.0, 1, 0, 1, 1, 2 * _kvb(256) + 5, [2 * _kvb(256) + 5],
                             2 * _kvb(256) + 6, 4),
}


def _ort(model, feeds, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _native(model, feeds, compiled=False):
    import runtime as rt
    so = rt.SessionOptions()
    so.compiled_regions = compiled
    return rt.InferenceSession(model, so).run(None, feeds)


@pytest.mark.parametrize("case", list(CASES))
def test_gqa_bit_for_bit_onnxruntime(case, monkeypatch):
    nh, kv, D, scale, rot, inter, B, S, P, seqlens, total, threads = CASES[case]()
    model = gqa_model(nh, kv, D, scale, rot, inter).SerializeToString()
    feeds = gqa_feeds(nh, kv, D, B, S, P, seqlens, total, seed=len(case), amp=2.0)
    monkeypatch.setattr(ma, "ORT_THREADS", threads)  # onnxruntime's thread count decides flash decoding
    want = _ort(model, feeds, threads)
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "0")
    assert not np.array_equal(_native(model, feeds)[0], want[0])  # the case tells the orders apart
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    for got, ref in zip(_native(model, feeds), want):
        np.testing.assert_array_equal(got, ref)
    if case in PATHS:  # the case runs the path it names: without it the bits differ
        attr, value = PATHS[case]
        monkeypatch.setattr(ma, attr, value)
        assert not np.array_equal(_native(model, feeds)[0], want[0])


# case -> the module value that takes its path away: one key block for all keys, or no split
PATHS = {"several key blocks": ("L2_BYTES", 1 << 40), "split decode": ("ORT_THREADS", 1)}


def test_gqa_in_a_compiled_region(monkeypatch):
    """The region form (the decoders' path) follows the setting as the node wrapper does."""
    nh, kv, D = 4, 2, 32
    model = gqa_model(nh, kv, D).SerializeToString()
    feeds = gqa_feeds(nh, kv, D, 1, 7, 0, [6], 7, seed=3, amp=2.0)
    want = _ort(model, feeds, 2)
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    for got, ref in zip(_native(model, feeds, compiled=True), want):
        np.testing.assert_array_equal(got, ref)


def test_sum_exp_order():
    """MLAS's sum-exp kernel: the elements by its polynomial, the sum in eight lanes folded pairwise; a partial
    last chunk fills lanes from 0.  Pinned on a row whose sequential sum rounds differently."""
    rng = np.random.default_rng(9)
    row = rng.standard_normal(29).astype(F) * 3
    p = row.copy()
    s = ma.sum_exp(p, 29, F(-1.5))
    lanes = np.zeros(8, F)
    for c in range(0, 29, 8):
        blk = p[c:c + 8]
        lanes[:len(blk)] = (lanes[:len(blk)] + blk).astype(F)
    want = F(F((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + F((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])))
    assert s == want
    seq = F(0.0)
    for v in p:
        seq = F(seq + v)
    assert seq != want  # the row tells the lane order from a plain sum
    assert np.allclose(p, np.exp(row.astype(np.float64) - 1.5), rtol=3e-7, atol=0)  # its polynomial's accuracy


def _sigmoid_model():
    g = h.make_graph([h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("Mul", ["x", "s"], ["a"]),
                      h.make_node("Mul", ["a", "u"], ["y"]), h.make_node("Sigmoid", ["u"], ["z"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["n", 37]), h.make_tensor_value_info("u", T.FLOAT, ["n", 37])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["n", 37]), h.make_tensor_value_info("z", T.FLOAT, ["n", 37])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("compiled", [False, True])
def test_sigmoid_and_fused_silu_bit_for_bit_onnxruntime(compiled, monkeypatch):
    """Sigmoid alone and inside SiLU (fused into one GatedActivation on the CPU) take MLAS's logistic: input
    clamped to [-18, 18], Eigen's rational approximation by fused multiply-adds, only the lower end clamped."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((50, 37)) * 7).astype(F)
    x.flat[:8] = [18, -18, 17.844, -17.97, 0, -0.0, np.inf, -np.inf]
    u = rng.standard_normal((50, 37)).astype(F)
    model = _sigmoid_model()
    want = _ort(model, {"x": x, "u": u}, 2)
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "0")
    assert not np.array_equal(_native(model, {"x": x, "u": u}, compiled)[1], want[1])
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    for got, ref in zip(_native(model, {"x": x, "u": u}, compiled), want):
        np.testing.assert_array_equal(got, ref)
