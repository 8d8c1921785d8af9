"""Transformer ops (ops/attention.py, ops/recurrent_state.py) against onnxruntime on realistic shapes.

Attention and RotaryEmbedding are compared with onnxruntime; SwiGLU (opset
28), LinearAttention and CausalConvWithState (opset 27) with
``onnx.reference.ReferenceEvaluator``, since onnxruntime has no kernel for
them at those opsets.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

import runtime
from runtime.errors import IndexOutOfRangeError, InvalidAttributeError, ShapeMismatchError

RNG = np.random.default_rng(0)
TOL = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float16: dict(rtol=1e-2, atol=2e-3)}
ONNX_T = {np.float32: TP.FLOAT, np.float16: TP.FLOAT16, np.int64: TP.INT64, np.bool_: TP.BOOL}


def _model(op, opset, inputs, outputs, **attrs):
    """inputs/outputs: (name, numpy dtype); an empty name is a skipped optional."""
    node = helper.make_node(op, [n for n, _ in inputs], [n for n, _ in outputs], **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, ONNX_T[t], None) for n, t in inputs if n],
        [helper.make_tensor_value_info(n, ONNX_T[t], None) for n, t in outputs if n])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _ours(model, feeds):
    return runtime.InferenceSession(model.SerializeToString()).run(None, feeds)


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _rand(shape, dt):
    return RNG.standard_normal(shape).astype(dt)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_attention_causal_gqa_vs_ort(dt):
    # batch 1, 32 query heads sharing 8 KV heads, 128 positions, head size 128
    B, Hq, Hkv, S, D = 1, 32, 8, 128, 128
    feeds = {"Q": _rand((B, Hq, S, D), dt), "K": _rand((B, Hkv, S, D), dt), "V": _rand((B, Hkv, S, D), dt)}
    m = _model("Attention", 23, [("Q", dt), ("K", dt), ("V", dt)], [("Y", dt)], is_causal=1)
    got, = _ours(m, feeds)
    want, = _ort(m, feeds)
    assert got.dtype == dt and got.shape == (B, Hq, S, D)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), **TOL[dt])


def test_attention_3d_past_mask_vs_ort():
    # decode-like step: 3-d packed Q/K/V, a KV cache, a float mask shorter than the total length
    B, Hq, Hkv, S, P, D = 2, 8, 2, 4, 60, 64
    dt = np.float32
    feeds = {"Q": _rand((B, S, Hq * D), dt), "K": _rand((B, S, Hkv * D), dt), "V": _rand((B, S, Hkv * D), dt),
             "M": _rand((B, 1, S, P + S), dt), "PK": _rand((B, Hkv, P, D), dt), "PV": _rand((B, Hkv, P, D), dt)}
    m = _model("Attention", 23, [("Q", dt), ("K", dt), ("V", dt), ("M", dt), ("PK", dt), ("PV", dt)],
               [("Y", dt), ("PKo", dt), ("PVo", dt)], q_num_heads=Hq, kv_num_heads=Hkv, is_causal=1)
    got = _ours(m, feeds)
    want = _ort(m, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, **TOL[dt])


def test_attention_bool_mask_softcap_qk_vs_reference():
    B, H, Sq, Skv, D = 2, 4, 16, 24, 32
    dt = np.float32
    feeds = {"Q": _rand((B, H, Sq, D), dt), "K": _rand((B, H, Skv, D), dt), "V": _rand((B, H, Skv, D), dt),
             "M": RNG.random((H, Sq, Skv)) > 0.3}
    feeds["M"][1, 3] = False  # a fully masked row gives zeros, not NaN
    for mode in (0, 1, 2, 3):
        m = _model("Attention", 24, [("Q", dt), ("K", dt), ("V", dt), ("M", np.bool_)],
                   [("Y", dt), ("", dt), ("", dt), ("QK", dt)], softcap=3.0, qk_matmul_output_mode=mode)
        got = _ours(m, feeds)
        want = ReferenceEvaluator(m).run(None, feeds)
        assert not np.isnan(got[0]).any()
        np.testing.assert_allclose(got[0], want[0], **TOL[dt])
        np.testing.assert_allclose(got[1], want[1], **TOL[dt])


def test_attention_nonpad_vs_reference():
    B, Hq, Hkv, Sq, Skv, D = 3, 4, 2, 2, 16, 16
    dt = np.float32
    feeds = {"Q": _rand((B, Hq, Sq, D), dt), "K": _rand((B, Hkv, Skv, D), dt), "V": _rand((B, Hkv, Skv, D), dt),
             "N": np.array([5, 16, 1], np.int64)}
    m = _model("Attention", 24, [("Q", dt), ("K", dt), ("V", dt), ("", dt), ("", dt), ("", dt), ("N", np.int64)],
               [("Y", dt)], is_causal=1)
    got, = _ours(m, feeds)
    want, = ReferenceEvaluator(m).run(None, feeds)
    np.testing.assert_allclose(got, want, **TOL[dt])


def test_attention_3d_needs_heads():
    dt = np.float32
    m = _model("Attention", 23, [("Q", dt), ("K", dt), ("V", dt)], [("Y", dt)])
    x = _rand((1, 4, 8), dt)
    with pytest.raises(InvalidAttributeError):
        _ours(m, {"Q": x, "K": x, "V": x})


def _rope_case(dt, three_d, interleaved, rot):
    B, H, S, D, P = 2, 32, 128, 128, 512
    half = (rot or D) // 2
    ang = RNG.random((P, half)).astype(np.float32) * 6
    x = _rand((B, S, H * D) if three_d else (B, H, S, D), dt)
    feeds = {"X": x, "C": np.cos(ang).astype(dt), "S": np.sin(ang).astype(dt),
             "P": RNG.integers(0, P, (B, S)).astype(np.int64)}
    attrs = dict(interleaved=interleaved, rotary_embedding_dim=rot)
    if three_d:
        attrs["num_heads"] = H
    m = _model("RotaryEmbedding", 23, [("X", dt), ("C", dt), ("S", dt), ("P", np.int64)], [("Y", dt)], **attrs)
    return m, feeds


@pytest.mark.parametrize("dt,three_d,interleaved,rot", [
    (np.float32, False, 0, 0), (np.float32, True, 1, 0), (np.float32, False, 1, 64), (np.float16, True, 0, 64)])
def test_rotary_vs_ort(dt, three_d, interleaved, rot):
    m, feeds = _rope_case(dt, three_d, interleaved, rot)
    got, = _ours(m, feeds)
    want, = _ort(m, feeds)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), **TOL[dt])


def test_rotary_position_out_of_range():
    m, feeds = _rope_case(np.float32, False, 0, 0)
    feeds["P"][1, 5] = 512
    with pytest.raises(IndexOutOfRangeError):
        _ours(m, feeds)


def test_swiglu_vs_reference():
    dt = np.float32
    a, b = _rand((4, 4096), dt), _rand((4, 4096), dt)
    m = _model("SwiGLU", 28, [("A", dt), ("B", dt)], [("Y", dt)], alpha=1.702)
    got, = _ours(m, {"A": a, "B": b})
    want, = ReferenceEvaluator(m).run(None, {"A": a, "B": b})
    np.testing.assert_allclose(got, want, **TOL[dt])
    with pytest.raises(ShapeMismatchError):
        _ours(m, {"A": a, "B": b[:2]})


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_vs_reference(rule):
    B, T, Hq, Hkv, dk, dv = 2, 16, 8, 2, 32, 32
    dt = np.float32
    feeds = {"q": _rand((B, T, Hq * dk), dt), "k": _rand((B, T, Hkv * dk), dt) * 0.2,
             "v": _rand((B, T, Hkv * dv), dt), "s": _rand((B, Hkv, dk, dv), dt)}
    ins = [("q", dt), ("k", dt), ("v", dt), ("s", dt)]
    if rule.startswith("gated"):
        feeds["g"] = -RNG.random((B, T, Hkv * dk)).astype(dt)
        ins.append(("g", dt))
    else:
        ins.append(("", dt))
    if rule.endswith("delta"):
        feeds["b"] = RNG.random((B, T, Hkv)).astype(dt)
        ins.append(("b", dt))
    m = _model("LinearAttention", 27, ins, [("o", dt), ("so", dt)], q_num_heads=Hq, kv_num_heads=Hkv,
               update_rule=rule)
    got = _ours(m, feeds)
    want = ReferenceEvaluator(m).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("past,act", [(False, "none"), (True, "silu")])
def test_causal_conv_with_state_vs_reference(past, act):
    B, C, L, K = 2, 1024, 64, 4
    dt = np.float32
    feeds = {"x": _rand((B, C, L), dt), "w": _rand((C, 1, K), dt), "b": _rand((C,), dt)}
    ins = [("x", dt), ("w", dt), ("b", dt)]
    if past:
        feeds["p"] = _rand((B, C, K - 1), dt)
        ins.append(("p", dt))
    m = _model("CausalConvWithState", 27, ins, [("y", dt), ("ps", dt)], activation=act)
    got = _ours(m, feeds)
    want = ReferenceEvaluator(m).run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, **TOL[dt])
