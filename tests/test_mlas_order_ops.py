"""The ops a hybrid decoder adds, in onnxruntime's order with ``ONNX_NUMBA_MLAS_ORDER=1``: MatMul against a
constant weight (MLAS's packed SGEMM), CausalConvWithState, LpNormalization, LinearAttentionGate, GatedRMSNorm,
(M)RotaryEmbedding and LinearAttention, each bit for bit onnxruntime's CPU kernel (``np.array_equal``) node by node and inside a
compiled region, on x86 hosts with FMA.  Each case also shows that it tells the orders apart: the default
kernels' result differs from onnxruntime's on it."""
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from ops import contrib_quant as Q

pytestmark = pytest.mark.skipif(not (Q.mlas_avx2_host() or Q.mlas_avx512_host()),
                                reason="onnxruntime takes MLAS's FMA3 or AVX-512 kernels only on x86 hosts")
MS = "com.microsoft"
F = np.float32
RNG = np.random.default_rng(21)


def _vi(name, shape):
    return h.make_tensor_value_info(name, T.FLOAT, shape)


def _model(node, inputs, n_out, inits=(), ints=()):
    """The node, then ``z = y + y`` on its first output: a compiled region needs two nodes, and outputs of known
    rank (every output here has the first input's rank; contrib ops have no shape inference)."""
    then = h.make_node("Add", [node.output[0]] * 2, ["z"])
    rank = len(inputs[0].type.tensor_type.shape.dim)
    outs = [h.make_tensor_value_info(o, T.FLOAT, [None] * rank) for o in list(node.output[:n_out]) + ["z"]]
    g = h.make_graph([node, then], "g", list(inputs) + list(ints), outs, [nh.from_array(v, k) for k, v in inits])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18), h.make_opsetid(MS, 1)]).SerializeToString()


def _ort(model, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _native(model, feeds, compiled=False):
    import runtime as rt
    so = rt.SessionOptions()
    so.compiled_regions = compiled
    sess = rt.InferenceSession(model, so)
    if compiled:  # the op runs inside a compiled region, not in its node wrapper
        assert len([n for r in sess.plan.regions for n in r.nodes]) == 2
    return sess.run(None, feeds)


def _check(model, feeds, monkeypatch):
    want = _ort(model, feeds)
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "0")
    assert not all(np.array_equal(g, w) for g, w in zip(_native(model, feeds), want))
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    for compiled in (False, True):
        got = _native(model, feeds, compiled)
        assert len(got) == len(want)
        for g, ref in zip(got, want):
            np.testing.assert_array_equal(g, ref)


@pytest.mark.parametrize("shape,K,N", [((1, 600), 600, 40), ((2, 3, 300), 300, 33), ((5, 64), 64, 20),
                                       ((5, 300), 300, 70), ((1, 300), 300, 70)])
def test_matmul_constant_weight(shape, K, N, monkeypatch):
    """Per slice of 256 weight rows a chain of fused multiply-adds; the slices' sums added in turn (the last two
    shapes: register tiles of four panels, of four rows and of one row, beside the panel and row left over)."""
    w = RNG.standard_normal((K, N)).astype(F)
    a = RNG.standard_normal(shape).astype(F)
    model = _model(h.make_node("MatMul", ["a", "w"], ["y"]), [_vi("a", ["m"] * (len(shape) - 1) + [K])], 1,
                   [("w", w)])
    _check(model, {"a": a}, monkeypatch)


@pytest.mark.parametrize("shape,K,N", [((1, 256), 256, 512), ((3, 896), 896, 1200)])
def test_float16_matmul_constant_weight(shape, K, N, monkeypatch):
    """A float16 weight (a float16 export's): onnxruntime multiplies its float32 copy in MLAS's packed order and
    rounds the product to float16; this runtime converts the weight once and does the same, bit for bit."""
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    w = (RNG.standard_normal((K, N)) / np.sqrt(K)).astype(np.float16)
    a = RNG.standard_normal(shape).astype(np.float16)
    g = h.make_graph([h.make_node("MatMul", ["a", "w"], ["y"])], "g",
                     [h.make_tensor_value_info("a", T.FLOAT16, [None, K])],
                     [h.make_tensor_value_info("y", T.FLOAT16, None)], [nh.from_array(w, "w")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 18)]).SerializeToString()
    want = _ort(model, {"a": a})[0]
    import runtime as rt
    sess = rt.InferenceSession(model)
    for _ in range(2):  # the first call converts the weight, the second uses the copy
        np.testing.assert_array_equal(sess.run(None, {"a": a})[0], want)


@pytest.mark.parametrize("a_shape,b_shape", [
    ((20, 700), (700, 40)),        # N > M: two threads split N (32 and 8 columns), each with its own K slices
    ((130, 300), (300, 33)),       # M >= N: two threads split M
    ((2, 3, 700), (700, 20)),      # A's batch folded into its rows against one matrix
    ((3, 1, 40), (1, 40, 2)),      # B's batch dims all 1: folded too (three rows, not three one-row products)
    ((2, 5, 300), (2, 300, 17)),   # batch by batch
    ((9, 300), (300, 1)),          # one column: the one-row transposed kernel over A's rows
    ((2, 5, 300), (300,)),         # a vector: each row of A a one-row product
    ((300,), (300, 70)),           # one row
])
def test_matmul_two_run_time_inputs(a_shape, b_shape, monkeypatch):
    """onnxruntime's MatMul of two run-time float32 inputs (``_mlas_sgemm.sgemm_mlas``), on its default thread
    count: node by node, and inside a compiled region where B is 2-d (the region declines a batched or 1-d B)."""
    from ops._mlas_attention import ort_threads
    import onnxruntime as ort
    a = RNG.standard_normal(a_shape).astype(F)
    b = RNG.standard_normal(b_shape).astype(F)
    model = _model(h.make_node("MatMul", ["a", "b"], ["y"]), [_vi("a", [None] * len(a_shape)),
                                                              _vi("b", [None] * len(b_shape))], 1)
    so = ort.SessionOptions()
    so.intra_op_num_threads = ort_threads()
    want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"a": a, "b": b})
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "0")
    assert not np.array_equal(_native(model, {"a": a, "b": b})[0], want[0])
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    for compiled in (False, True) if len(b_shape) == 2 else (False,):
        got = _native(model, {"a": a, "b": b}, compiled)
        for g, ref in zip(got, want):
            np.testing.assert_array_equal(g, ref)


def test_a_session_s_intra_op_threads_are_onnxruntime_s(monkeypatch):
    """A session given ``intra_op_num_threads`` follows onnxruntime given the same: one thread and two give
    different bits here (MLAS's SGEMM splits N over two threads, and each part slices K by its own width), node
    by node and in a compiled region (planned under the session's count)."""
    import onnxruntime as ort
    import runtime as rt
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    monkeypatch.delenv("ONNX_NUMBA_ORT_THREADS", raising=False)
    feeds = {"a": RNG.standard_normal((8, 3000)).astype(F), "b": RNG.standard_normal((3000, 100)).astype(F)}
    model = _model(h.make_node("MatMul", ["a", "b"], ["y"]), [_vi("a", [None, None]), _vi("b", [None, None])], 1)
    wants = []
    for threads in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        wants.append(ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds))
        for compiled in (False, True):
            so = rt.SessionOptions()
            so.intra_op_num_threads = threads
            so.compiled_regions = compiled
            for g, ref in zip(rt.InferenceSession(model, so).run(None, feeds), wants[-1]):
                np.testing.assert_array_equal(g, ref)
    assert not np.array_equal(wants[0][0], wants[1][0])


@pytest.mark.parametrize("L,with_past", [(5, True), (1, True), (4, False)])
def test_causal_conv_with_state(L, with_past, monkeypatch):
    """The taps summed from the bias in order, then ``x / (1 + expf(-x))``."""
    B, C, K = 2, 24, 4
    x = RNG.standard_normal((B, C, L)).astype(F) * 2
    ins = ["x", "w", "bias"] + (["past"] if with_past else [])
    node = h.make_node("CausalConvWithState", ins, ["y", "present"], domain=MS, activation="silu", ndim=1)
    model = _model(node, [_vi("x", [B, C, L])] + ([_vi("past", [B, C, K - 1])] if with_past else []), 2,
                   [("w", RNG.standard_normal((C, 1, K)).astype(F)), ("bias", RNG.standard_normal(C).astype(F))])
    feeds = {"x": x, **({"past": RNG.standard_normal((B, C, K - 1)).astype(F)} if with_past else {})}
    _check(model, feeds, monkeypatch)


@pytest.mark.parametrize("axis,p", [(-1, 2), (1, 1)])
def test_lp_normalization(axis, p, monkeypatch):
    """Eigen's ``lpNorm`` over a strided row: float32 sums in order, ``sqrtf``, then divisions."""
    x = RNG.standard_normal((3, 40, 24)).astype(F)
    model = _model(h.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=p), [_vi("x", ["b", 40, 24])], 1)
    _check(model, {"x": x}, monkeypatch)


def test_linear_attention_gate(monkeypatch):
    """softplus in float32 by ``logf``/``expf`` (its two branches), times the scale; beta by MLAS's logistic."""
    a = RNG.standard_normal((2, 9, 8)).astype(F) * 3
    b = RNG.standard_normal((2, 9, 8)).astype(F) * 3
    node = h.make_node("LinearAttentionGate", ["a", "dt", "ds", "b"], ["decay", "beta"], domain=MS)
    model = _model(node, [_vi("a", ["b", "s", 8]), _vi("b", ["b", "s", 8])], 2,
                   [("dt", RNG.standard_normal(8).astype(F)), ("ds", -RNG.uniform(0.5, 2, 8).astype(F))])
    _check(model, {"a": a, "b": b}, monkeypatch)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_gated_rms_norm(activation, monkeypatch):
    """Squares summed in order, ``1 / sqrtf(mean + eps)``, ``(x * inv) * scale`` times the gate."""
    x = RNG.standard_normal((2, 5, 4, 32)).astype(F)
    g = RNG.standard_normal(x.shape).astype(F) * 2
    node = h.make_node("GatedRMSNorm", ["x", "scale", "g"], ["y"], domain=MS, epsilon=1e-6, activation=activation)
    model = _model(node, [_vi("x", ["b", "s", 4, 32]), _vi("g", ["b", "s", 4, 32])], 1,
                   [("scale", RNG.standard_normal(32).astype(F))])
    _check(model, {"x": x, "g": g}, monkeypatch)


@pytest.mark.parametrize("mrope,half", [(True, 12), (True, 2), (False, 20)])
def test_rotary_embeddings(mrope, half, monkeypatch):
    """``fma(x1, cos, -(x2 * sin))`` and ``fma(x1, sin, x2 * cos)``, a partial rotary width included."""
    B, S, H, D = 2, 5, 3, 48
    x = RNG.standard_normal((B, S, H * D)).astype(F) * 3
    ang = np.arange(64)[:, None] * (10000.0 ** (-np.arange(half) / half))[None]
    cos, sin = np.cos(ang).astype(F), np.sin(ang).astype(F)
    if mrope:
        sec = [half - 2 * (half // 3), half // 3, half // 3]
        pos = RNG.integers(0, 64, (3, B, S)).astype(np.int64)
        node = h.make_node("MRotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, num_heads=H,
                           rotary_embedding_dim=2 * half, mrope_section=sec)
    else:
        pos = RNG.integers(0, 64, (B, S)).astype(np.int64)
        node = h.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, num_heads=H,
                           rotary_embedding_dim=2 * half)
    pos_vi = h.make_tensor_value_info("pos", T.INT64, list(pos.shape))
    model = _model(node, [_vi("x", [B, S, H * D])], 1, [("cos", cos), ("sin", sin)], [pos_vi])
    _check(model, {"x": x, "pos": pos}, monkeypatch)



def _linear_attention_case(dk, dv, Hq, Hkv, rule, per_key, scale, T=5, B=2):
    """A LinearAttention node with a past state (then ``z = y + y``), and its feeds."""
    Hk = Hq if Hkv > Hq else Hkv
    ins = ["q", "k", "v", "past"] + (["decay"] if "gated" in rule else [""] if "delta" in rule else []) + \
        (["beta"] if "delta" in rule else [])
    attrs = dict(q_num_heads=Hq, kv_num_heads=Hkv, update_rule=rule, **({"scale": scale} if scale else {}))
    node = h.make_node("LinearAttention", ins, ["y", "state"], domain=MS, **attrs)
    feeds = {"q": RNG.standard_normal((B, T, Hq * dk)).astype(F), "k": RNG.standard_normal((B, T, Hk * dk)).astype(F)
             * F(0.3), "v": RNG.standard_normal((B, T, Hkv * dv)).astype(F),
             "past": RNG.standard_normal((B, Hkv, dk, dv)).astype(F) * F(0.1)}
    if "gated" in rule:
        feeds["decay"] = -RNG.random((B, T, Hkv * (dk if per_key else 1))).astype(F)
    if "delta" in rule:
        feeds["beta"] = RNG.random((B, T, Hkv)).astype(F)
    then = h.make_node("Add", ["y", "y"], ["z"])
    g = h.make_graph([node, then], "g", [_vi(n, [None] * a.ndim) for n, a in feeds.items()],
                     [_vi("y", [None] * 3), _vi("state", [None] * 4), _vi("z", [None] * 3)])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 18), h.make_opsetid(MS, 1)]).SerializeToString()
    return model, feeds


@pytest.mark.parametrize("dk,dv,Hq,Hkv,rule,per_key,scale", [
    (32, 32, 4, 2, "gated_delta", True, 0.0),   # MLAS's AVX-512 kernel on such hosts: pre-weighted, fused passes
    (16, 64, 2, 2, "linear", False, 0.0),
    (32, 64, 2, 4, "delta", False, 1.0),         # inverse GQA
    (72, 64, 2, 2, "gated_delta", False, 0.5),  # the portable kernel from 4096 state elements: MLAS's one-row SGEMM
    (66, 70, 1, 1, "delta", False, 0.0)])
def test_linear_attention(dk, dv, Hq, Hkv, rule, per_key, scale, monkeypatch):
    """onnxruntime's LinearAttention: output and state, both kernels (``ops/linear_attention.linear_attention_mlas``)."""
    model, feeds = _linear_attention_case(dk, dv, Hq, Hkv, rule, per_key, scale)
    _check(model, feeds, monkeypatch)


def test_linear_attention_small_state(monkeypatch):
    """Below 4096 state elements onnxruntime's portable kernel is the default kernel's order: both orders give its
    bits (dv 40 keeps MLAS's AVX-512 kernel out)."""
    model, feeds = _linear_attention_case(24, 40, 2, 1, "gated_delta", True, 0.0)
    want = _ort(model, feeds)
    for order in ("0", "1"):
        monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", order)
        for compiled in (False, True):
            for g, w in zip(_native(model, feeds, compiled), want):
                np.testing.assert_array_equal(g, w)
