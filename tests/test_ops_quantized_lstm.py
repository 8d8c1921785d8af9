"""com.microsoft DynamicQuantizeLSTM against onnxruntime, on one-node models.

The op quantizes X (all steps at once) and the hidden state (at every step) to uint8 as onnxruntime does, and
multiplies by int8 or uint8 weight codes.  On x86 hosts without VNNI onnxruntime's uint8 x int8 products add
adjacent pairs in 16 bits with saturation; the kernel reproduces that (``rnn.MLAS_U8S8_SATURATES``).

Tolerances, fixed before running: one step (the only quantized state is the given one) differs from
onnxruntime only by its approximate sigmoid and tanh, atol 1e-5; over several steps a hidden value one
rounding apart can land on the next uint8 code when it is quantized again, which moves the next products by
about one code step of the hidden state (2/255), so several steps are held to atol 0.02.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from ops import rnn
from runtime import InferenceSession
from runtime.dtypes import onnx_type
from runtime.errors import InvalidArgumentError, ShapeMismatchError


def _model(D, H, nin, wdt, per_column, rng, attrs=None):
    """The op over X [seq, 1, nin] with initial states, and its weights: codes of full range, so that the
    pair sums of large uint8 activations saturate 16 bits where onnxruntime saturates them."""
    direction = "bidirectional" if D == 2 else "forward"
    lo, hi = (-127, 128) if wdt == np.int8 else (0, 256)
    inits = {
        "W": rng.integers(lo, hi, (D, nin, 4 * H)).astype(wdt),
        "R": rng.integers(lo, hi, (D, H, 4 * H)).astype(wdt),
        "B": (rng.standard_normal((D, 8 * H)) * 0.1).astype(np.float32),
    }
    shape = (D, 4 * H) if per_column else (D,)
    zero = 0 if wdt == np.int8 else 128
    for w in ("W", "R"):
        inits[f"{w}_scale"] = (rng.random(shape) * 0.004 + 0.002).astype(np.float32)
        inits[f"{w}_zp"] = np.full(shape, zero, wdt)
    node = helper.make_node(
        "DynamicQuantizeLSTM", ["X", "W", "R", "B", "", "h0", "c0", "", "W_scale", "W_zp", "R_scale", "R_zp"],
        ["Y", "Yh", "Yc"], domain="com.microsoft", hidden_size=H, direction=direction, **(attrs or {}))
    return node, inits


def _run(node, inits, feeds, reference=True):
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, onnx_type(v.dtype), list(v.shape)) for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in node.output],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    mb = m.SerializeToString()
    if not reference:
        return InferenceSession(mb).run(None, feeds)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(mb, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    return InferenceSession(mb).run(None, feeds), ref


def _feeds(seq, D, H, nin, rng):
    # mostly negative inputs: a uint8 zero point near 230, so codes are large
    return {"X": (rng.random((seq, 1, nin)) * 4 - 3.5).astype(np.float32),
            "h0": (rng.random((D, 1, H)) * 2 - 1).astype(np.float32),
            "c0": (rng.random((D, 1, H)) * 2 - 1).astype(np.float32)}


@pytest.mark.parametrize("D,wdt,per_column", [(2, np.int8, False), (1, np.int8, True), (2, np.uint8, True)])
def test_one_step_is_onnxruntimes(D, wdt, per_column, monkeypatch):
    rng = np.random.default_rng(D + per_column)
    H, nin = 16, 24
    node, inits = _model(D, H, nin, wdt, per_column, rng)
    feeds = _feeds(1, D, H, nin, rng)
    got, ref = _run(node, inits, feeds)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=0, atol=1e-5)
    if wdt == np.int8:  # the data provokes the saturation where onnxruntime saturates, and nowhere else
        monkeypatch.setattr(rnn, "MLAS_U8S8_SATURATES", not rnn.MLAS_U8S8_SATURATES)
        flipped, _ = _run(node, inits, feeds)
        assert np.abs(flipped[0] - ref[0]).max() > 1e-3


def test_several_steps_with_clip_follow_onnxruntime():
    rng = np.random.default_rng(7)
    D, H, nin, seq = 2, 8, 12, 6
    node, inits = _model(D, H, nin, np.int8, False, rng, {"clip": 2.5})
    feeds = _feeds(seq, D, H, nin, rng)
    got, ref = _run(node, inits, feeds)
    assert [g.shape for g in got] == [(seq, D, 1, H), (D, 1, H), (D, 1, H)]
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=0, atol=0.02)


def test_weights_onnxruntime_refuses_are_refused_by_name():
    rng = np.random.default_rng(1)
    node, inits = _model(1, 4, 6, np.int8, False, rng)
    feeds = _feeds(2, 1, 4, 6, rng)
    bad = dict(inits, W_zp=np.array([3], np.int8))
    with pytest.raises(InvalidArgumentError, match="W's zero point must be 0 for int8 codes"):
        _run(node, bad, feeds, reference=False)
    bad = dict(inits, R_scale=np.ones((1, 5), np.float32))
    with pytest.raises(ShapeMismatchError, match=r"R's scale must have shape \[1\] \(per tensor\) or \[1, 16\]"):
        _run(node, bad, feeds, reference=False)


@pytest.mark.parametrize("K,full", [(7, False), (600, False), (1101, True)])
@pytest.mark.parametrize("kernel", ["sat_gemm", "sat_gemm_portable"])
def test_saturating_pairs_are_the_exact_integers(K, full, kernel):
    """``_u8s8``'s products (the host's ``vpmaddubsw`` form where it has AVX2, and the portable loop) give the
    integers of the pairwise 16-bit saturating sum over packed weights: an odd K pairs its last code with a
    zero, 37 columns leave a part-filled group, and with every pair at the 16-bit limit 1101 codes sum past
    what a float32 holds exactly (2 ** 24)."""
    from ops import _u8s8
    rng = np.random.default_rng(K)
    a = rng.integers(0, 256, (3, K))
    w = rng.integers(-128, 128, (K, 37))
    if full:
        a[:] = 255
        w[:] = 127
    wp = _u8s8.pack(w.astype(np.int8))
    ap = np.zeros((3, 4 * wp.shape[1]), np.uint8)
    ap[:, :K] = a
    out = np.empty((3, 8 * wp.shape[0]), np.int32)
    getattr(_u8s8, kernel)(ap, wp, out)
    a2 = np.concatenate([a, np.zeros((3, K % 2), np.int64)], axis=1)
    w2 = np.concatenate([w, np.zeros((K % 2, 37), np.int64)])
    pairs = a2[:, 0::2, None] * w2[None, 0::2] + a2[:, 1::2, None] * w2[None, 1::2]
    assert (np.abs(pairs) > 32767).any()
    np.testing.assert_array_equal(out[:, :37], np.clip(pairs, -32768, 32767).sum(1))


@pytest.mark.parametrize("K", [7, 600, 1101])
@pytest.mark.parametrize("kernel", ["dot_gemm", "dot_gemm_portable"])
def test_dot_products_are_the_exact_integers(K, kernel):
    """``_u8s8``'s exact products (``vpdpbusd`` on VNNI hosts, the portable loop elsewhere) over the same packed
    weights: every uint8 x int8 product added in 32 bits, the sums that saturate in pairs included; a K that is
    not a multiple of 4 leaves zero-padded codes, 37 columns a part-filled group."""
    from ops import _u8s8
    rng = np.random.default_rng(K + 1)
    a = rng.integers(0, 256, (3, K))
    w = rng.integers(-128, 128, (K, 37))
    a[0] = 255
    w[:, 0] = 127
    wp = _u8s8.pack(w.astype(np.int8))
    ap = np.zeros((3, 4 * wp.shape[1]), np.uint8)
    ap[:, :K] = a
    out = np.empty((3, 8 * wp.shape[0]), np.int32)
    getattr(_u8s8, kernel)(ap, wp, out)
    np.testing.assert_array_equal(out[:, :37], a @ w)
