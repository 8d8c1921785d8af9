"""onnxruntime contrib norms, GELU activations and recurrent ops (ops/contrib_norm.py, ops/contrib_recurrent.py)
against onnxruntime.

Each case builds a one-node model with onnx.helper (optional inputs and outputs left out with "" as the
GenAI builder does), runs it through ``runtime.InferenceSession`` and ``onnxruntime.InferenceSession`` and
compares every produced output with a per-dtype tolerance.  Shapes cover single-token decode and prefill
rows of realistic hidden sizes, broadcast skips, odd head sizes, inverse and ordinary GQA for
LinearAttention, and convolutions shorter than the kernel.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from runtime import InferenceSession
from runtime.dtypes import onnx_type
from runtime.errors import InvalidAttributeError, OnnxNumbaError, ShapeMismatchError

RNG = np.random.default_rng(0)
TOL = {np.float32: (2e-5, 2e-5), np.float64: (1e-12, 1e-12), np.float16: (4e-3, 4e-3)}
MS = "com.microsoft"


def _model(op_type, inputs, outs, domain=MS, opset=22, inits=None, **attrs):
    """inputs: list of (name, array) with None for a missing optional input; outs: names, "" for unused."""
    inits = inits or {}
    names = [n if a is not None else "" for n, a in inputs] + list(inits)
    node = helper.make_node(op_type, names, outs, domain=domain, **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, onnx_type(a.dtype), list(a.shape)) for n, a in inputs if a is not None],
        [helper.make_empty_tensor_value_info(o) for o in outs if o],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    return m.SerializeToString()


def _feeds(inputs):
    return {n: a for n, a in inputs if a is not None}


def _compare(op_type, inputs, outs, rtol=None, atol=None, **kw):
    m = _model(op_type, inputs, outs, **kw)
    feeds = _feeds(inputs)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    dt = inputs[0][1].dtype.type
    r, a = TOL.get(dt, (0, 0))
    rtol = r if rtol is None else rtol
    atol = a if atol is None else atol
    assert len(ours) == len(ref)
    for k, (x, y) in enumerate(zip(ours, ref)):
        assert x.dtype == y.dtype and x.shape == y.shape, (k, x.dtype, x.shape, y.dtype, y.shape)
        np.testing.assert_allclose(x.astype(np.float64), y.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=f"output {k} of {op_type}")
    return ours


def _r(*shape, dt=np.float32, s=1.0):
    return (RNG.standard_normal(shape) * s).astype(dt)


# -- SimplifiedLayerNormalization ------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1, 4096), (2, 37, 4096), (3, 5, 17)])
def test_simplified_layer_norm(shape):
    x = _r(*shape, s=3.0)
    ins = [("x", x), ("g", _r(shape[-1]))]
    ref = _compare("SimplifiedLayerNormalization", ins, ["y", "inv"], domain="", epsilon=1e-6, axis=-1,
                   stash_type=1)
    # onnxruntime registers it only in the default domain; the com.microsoft alias must agree with it.
    m = _model("SimplifiedLayerNormalization", ins, ["y", "inv"], domain=MS, epsilon=1e-6)
    ours = InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, _feeds(ins))
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)


def _bits(op_type, inputs, outs, **kw):
    """The outputs of native and onnxruntime, which must be the same bits."""
    m = _model(op_type, inputs, outs, **kw)
    feeds = _feeds(inputs)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    for k, (x, y) in enumerate(zip(ours, ref)):
        np.testing.assert_array_equal(x, y, err_msg=f"output {k} of {op_type}")


@pytest.mark.parametrize("n", [15, 16, 17, 896])
def test_simplified_layer_norm_bits(n):
    """onnxruntime's own order (MLAS's AVX2 kernel from 16 elements on hosts with AVX2, else its plain loop), so
    the same float32 bits; ``contrib_norm.mlas_order`` says which."""
    from ops import contrib_norm
    if n >= contrib_norm.MLAS_NORM_MIN and not contrib_norm._simd.AVX2:
        pytest.skip("onnxruntime's MLAS layer-norm kernel is for x86 hosts with AVX2; this host runs its fallback")
    _bits("SimplifiedLayerNormalization", [("x", _r(5, n, s=3.0)), ("g", _r(n))], ["y"], domain="", epsilon=1e-6,
          axis=-1)


@pytest.mark.parametrize("n,bias", [(15, False), (896, False), (900, True)])
def test_skip_simplified_layer_norm_bits(n, bias):
    """onnxruntime's skip norms keep their plain loop (sums one element after the other, a division per element)
    on every host: the same float32 bits, and the same sum output."""
    ins = [("x", _r(3, n, s=2.0)), ("s", _r(3, n)), ("g", _r(n)), ("bias", _r(n) if bias else None)]
    _bits("SkipSimplifiedLayerNormalization", ins, ["y", "", "", "sum"], epsilon=1e-6)


def test_simplified_layer_norm_axis_and_fp16():
    x = _r(4, 6, 10)
    _compare("SimplifiedLayerNormalization", [("x", x), ("g", _r(6, 10))], ["y", "inv"], domain="", axis=1)
    x16 = _r(2, 3, 256, dt=np.float16)
    _compare("SimplifiedLayerNormalization", [("x", x16), ("g", _r(256, dt=np.float16))], ["y"], domain="",
             epsilon=1e-5)
    _compare("SimplifiedLayerNormalization", [("x", x16), ("g", _r(256))], ["y", "inv"], domain="")


def test_layer_norm_contrib_opset13():
    x = _r(2, 7, 96)
    _compare("LayerNormalization", [("x", x), ("g", _r(96)), ("b", _r(96))], ["y", "mean", "inv"], domain="",
             opset=13, epsilon=1e-5)
    _compare("LayerNormalization", [("x", x), ("g", _r(96))], ["y"], domain="", opset=13)


# -- Skip norms ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,skip_shape", [((1, 1, 4096), (1, 1, 4096)), ((2, 33, 4096), (2, 33, 4096)),
                                              ((2, 5, 48), (1, 5, 48)), ((2, 5, 48), (5, 48)),
                                              ((7, 64), (7, 64))])
@pytest.mark.parametrize("outs", [["y", "", "", "s"], ["y"], ["y", "m", "inv", "s"]])
def test_skip_simplified_layer_norm(shape, skip_shape, outs):
    h = shape[-1]
    ins = [("x", _r(*shape, s=2.0)), ("skip", _r(*skip_shape)), ("g", _r(h))]
    _compare("SkipSimplifiedLayerNormalization", ins, outs, epsilon=1e-6)


def test_skip_simplified_layer_norm_bias_fp16():
    ins = [("x", _r(2, 9, 128)), ("skip", _r(2, 9, 128)), ("g", _r(128)), ("b", _r(128))]
    _compare("SkipSimplifiedLayerNormalization", ins, ["y", "", "inv", "s"], epsilon=1e-5)
    ins16 = [(n, a.astype(np.float16)) for n, a in ins]
    _compare("SkipSimplifiedLayerNormalization", ins16, ["y", "", "", "s"], epsilon=1e-5)


@pytest.mark.parametrize("beta,bias", [(False, False), (True, False), (True, True), (False, True)])
def test_skip_layer_norm(beta, bias):
    h = 768
    ins = [("x", _r(2, 11, h)), ("skip", _r(2, 11, h)), ("g", _r(h)), ("beta", _r(h) if beta else None),
           ("bias", _r(h) if bias else None)]
    _compare("SkipLayerNormalization", ins, ["y", "m", "inv", "s"], epsilon=1e-5)
    _compare("SkipLayerNormalization", ins, ["y"], epsilon=1e-12)


def test_skip_layer_norm_fp16():
    ins = [("x", _r(1, 3, 64, dt=np.float16)), ("skip", _r(1, 3, 64, dt=np.float16)),
           ("g", _r(64, dt=np.float16)), ("beta", _r(64, dt=np.float16))]
    _compare("SkipLayerNormalization", ins, ["y", "", "", "s"], epsilon=1e-5)


def test_skip_shape_mismatch():
    m = _model("SkipSimplifiedLayerNormalization", [("x", _r(2, 5, 8)), ("skip", _r(2, 4, 8)), ("g", _r(8))],
               ["y"])
    with pytest.raises(OnnxNumbaError):
        InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": _r(2, 5, 8), "skip": _r(2, 4, 8),
                                                                           "g": _r(8)})


# -- GatedRMSNorm ----------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", [None, "silu", "swish", "sigmoid"])
@pytest.mark.parametrize("shape,C", [((1, 1, 64), 16), ((2, 13, 4 * 128), 128), ((3, 7), 7), ((1, 4, 48), 48)])
def test_gated_rms_norm(activation, shape, C):
    kw = {} if activation is None else {"activation": activation}
    ins = [("x", _r(*shape, s=2.0)), ("g", _r(C)), ("z", _r(*shape, s=3.0))]
    _compare("GatedRMSNorm", ins, ["y"], epsilon=1e-6, **kw)


def test_gated_rms_norm_bad_group():
    m = _model("GatedRMSNorm", [("x", _r(2, 10)), ("g", _r(4)), ("z", _r(2, 10))], ["y"])
    with pytest.raises(ShapeMismatchError):
        InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": _r(2, 10), "g": _r(4),
                                                                           "z": _r(2, 10)})


# -- GELU family -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_gelu_family(dt):
    x = _r(3, 5, 257, dt=dt, s=3.0)
    b = _r(257, dt=dt)
    _compare("Gelu", [("x", x)], ["y"])
    _compare("BiasGelu", [("x", x), ("b", b)], ["y"])
    _compare("FastGelu", [("x", x)], ["y"])
    _compare("FastGelu", [("x", x), ("b", b)], ["y"])
    _compare("QuickGelu", [("x", x)], ["y"])
    _compare("QuickGelu", [("x", x)], ["y"], alpha=1.25)


# -- LinearAttention / LinearAttentionGate ---------------------------------------------------------

def _la_inputs(B, T, hq, hkv, dk, dv, rule, past=True, per_dim_decay=False):
    hk = min(hq, hkv)
    q = _r(B, T, hq * dk, s=0.5)
    k = _r(B, T, hk * dk)
    k /= np.linalg.norm(k.reshape(B, T, hk, dk), axis=-1, keepdims=True).repeat(dk, -1).reshape(k.shape)
    v = _r(B, T, hkv * dv)
    st = _r(B, hkv, dk, dv, s=0.3) if past else None
    gating = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")
    dec = -np.abs(_r(B, T, hkv * (dk if per_dim_decay else 1), s=0.5)) if gating else None
    beta = RNG.random((B, T, hkv)).astype(np.float32) if delta else None
    return [("q", q), ("k", k), ("v", v), ("past", st), ("decay", dec), ("beta", beta)]


@pytest.mark.parametrize("hq,hkv", [(2, 4), (1, 8), (4, 4), (4, 2), (8, 1), (16, 2)])
@pytest.mark.parametrize("T", [1, 9])
def test_linear_attention_gqa(hq, hkv, T):
    ins = _la_inputs(2, T, hq, hkv, 16, 16, "gated_delta")
    _compare("LinearAttention", ins, ["o", "s"], rtol=1e-4, atol=1e-4, q_num_heads=hq, kv_num_heads=hkv,
             update_rule="gated_delta", scale=1.0)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("hq,hkv", [(2, 4), (4, 2)])
def test_linear_attention_rules(rule, hq, hkv):
    ins = _la_inputs(1, 6, hq, hkv, 7, 5, rule, past=rule != "delta", per_dim_decay=rule == "gated")
    _compare("LinearAttention", ins, ["o", "s"], rtol=1e-4, atol=1e-4, q_num_heads=hq, kv_num_heads=hkv,
             update_rule=rule)


def test_linear_attention_state_window_rejected():
    ins = _la_inputs(1, 2, 2, 4, 4, 4, "gated_delta", past=False)
    m = _model("LinearAttention", ins, ["o", "s"], q_num_heads=2, kv_num_heads=4, state_window=2)
    with pytest.raises(InvalidAttributeError):
        InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, _feeds(ins))


@pytest.mark.parametrize("with_b", [True, False])
def test_linear_attention_gate(with_b):
    a = _r(2, 7, 8, s=10.0)
    ins = [("a", a), ("dt", _r(8)), ("ds", -np.exp(_r(8))), ("b", _r(2, 7, 8, s=4.0) if with_b else None)]
    _compare("LinearAttentionGate", ins, ["d", "beta"] if with_b else ["d"], rtol=1e-5, atol=1e-5)


# -- CausalConvWithState ---------------------------------------------------------------------------

@pytest.mark.parametrize("L", [1, 2, 3, 10])
@pytest.mark.parametrize("activation,bias,past", [("silu", True, True), ("none", False, True),
                                                  ("swish", True, False), ("none", False, False)])
def test_causal_conv(L, activation, bias, past):
    B, C, K = 2, 48, 4
    ins = [("x", _r(B, C, L)), ("w", _r(C, 1, K)), ("b", _r(C) if bias else None),
           ("past", _r(B, C, K - 1) if past else None)]
    _compare("CausalConvWithState", ins, ["y", "s"], ndim=1, activation=activation, state_window=0)


@pytest.mark.parametrize("dilation,channels_last", [(2, 0), (1, 1), (3, 1)])
def test_causal_conv_dilation_channels_last(dilation, channels_last):
    B, C, K, L = 2, 12, 3, 5
    P = (K - 1) * dilation
    x = _r(B, L, C) if channels_last else _r(B, C, L)
    past = _r(B, P, C) if channels_last else _r(B, C, P)
    ins = [("x", x), ("w", _r(C, 1, K)), ("b", _r(C)), ("past", past)]
    _compare("CausalConvWithState", ins, ["y", "s"], activation="silu", dilation=dilation,
             channels_last=channels_last)


def test_causal_conv_bad_state():
    ins = [("x", _r(1, 8, 3)), ("w", _r(8, 1, 4)), ("b", None), ("past", _r(1, 8, 2))]
    m = _model("CausalConvWithState", ins, ["y", "s"])
    with pytest.raises(ShapeMismatchError):
        InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, _feeds(ins))
