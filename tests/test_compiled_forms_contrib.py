"""Compiled forms of the contrib ops (ops/compiled_forms_contrib.py): each op run inside a compiled region
gives the per-node plan's results bit for bit (and onnxruntime's to float tolerance where it has the op),
raises the wrapper's errors with the node named, and the builder packages decode identically with regions
on and off."""
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession, SessionOptions
from runtime.errors import IndexOutOfRangeError, ShapeMismatchError

RNG = np.random.default_rng(7)
F = TensorProto.FLOAT
I64 = TensorProto.INT64
U8 = TensorProto.UINT8
MS = "com.microsoft"
HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "packages")


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 9
    return m.SerializeToString()


def _vi(name, et, shape):
    return helper.make_tensor_value_info(name, et, shape)


def _out(name, rank):
    """An output of known rank (contrib ops have no shape inference; a form needs its inputs' ranks)."""
    return helper.make_tensor_value_info(name, F, [None] * rank)


def _init(name, arr):
    return numpy_helper.from_array(arr, name)


def _fused(model):
    on = SessionOptions()
    on.compiled_regions = True
    return InferenceSession(model, on)


def _check(model, feeds, op_type, ort=None, exact=True):
    """Run with and without regions; the op must sit in a region and both must agree (exactly, unless the
    kernels sum floats in another order: a float accumulation compiled serially or in parallel, or over
    repacked weights)."""
    fused, plain = _fused(model), InferenceSession(model)
    in_region = [n.op_type for r in fused.plan.regions for n in r.nodes]
    assert op_type in in_region, (op_type, in_region)
    got, want = fused.run(None, feeds), plain.run(None, feeds)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max(initial=1.0)))
    if ort is not None:
        import onnxruntime
        ref = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        for a, b in zip(got, ref):
            np.testing.assert_allclose(a, b, rtol=ort, atol=ort)
    return fused, got


def _then_add(out):
    """A trivial second node (regions need two): z = out + out."""
    return helper.make_node("Add", [out, out], ["z"])


# -- RotaryEmbedding / MRotaryEmbedding ------------------------------------------------------------

def _caches(n, half):
    ang = RNG.uniform(0, 3, (n, half)).astype(np.float32)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["bsh", "bhsd", "pos1", "partial"])
def test_rotary_embedding(layout, interleaved):
    B, S, H, D = 2, 5, 3, 8
    half = D // 2 if layout != "partial" else 2
    cos, sin = _caches(32, half)
    attrs = dict(interleaved=interleaved)
    if layout == "bhsd":
        x = RNG.standard_normal((B, H, S, D)).astype(np.float32)
    else:
        x = RNG.standard_normal((B, S, H * D)).astype(np.float32)
        attrs["num_heads"] = H
        if layout == "partial":
            attrs["rotary_embedding_dim"] = 2 * half
    pos = np.array([3], np.int64) if layout == "pos1" else RNG.integers(0, 32, (B, S)).astype(np.int64)
    nodes = [helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, **attrs),
             _then_add("y")]
    model = _model(nodes, [_vi("x", F, list(x.shape)), _vi("pos", I64, list(pos.shape))],
                   [_out("y", x.ndim), _vi("z", F, None)], [_init("cos", cos), _init("sin", sin)])
    _check(model, {"x": x, "pos": pos}, "RotaryEmbedding", ort=1e-5)


@pytest.mark.parametrize("mrope_layout,section", [(1, [2, 0, 0]), (1, [2, 1, 1]), (0, [2, 1, 1])])
def test_mrotary_embedding(mrope_layout, section):
    B, S, H, D = 1, 4, 2, 8
    half = sum(section)
    cos, sin = _caches(20, half)
    x = RNG.standard_normal((B, S, H * D)).astype(np.float32)
    pos = RNG.integers(0, 20, (3, B, S)).astype(np.int64)
    nodes = [helper.make_node("MRotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, num_heads=H,
                              rotary_embedding_dim=2 * half, mrope_section=section, mrope_layout=mrope_layout),
             _then_add("y")]
    model = _model(nodes, [_vi("x", F, ["b", "s", H * D]), _vi("pos", I64, [3, "b", "s"])],
                   [_out("y", 3), _vi("z", F, None)], [_init("cos", cos), _init("sin", sin)])
    _check(model, {"x": x, "pos": pos}, "MRotaryEmbedding")


def test_rotary_position_out_of_range_names_the_node():
    cos, sin = _caches(8, 2)
    nodes = [helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, num_heads=2,
                              name="rope_q"), _then_add("y")]
    model = _model(nodes, [_vi("x", F, ["b", "s", 8]), _vi("pos", I64, ["b", "s"])], [_out("y", 3), _vi("z", F, None)],
                   [_init("cos", cos), _init("sin", sin)])
    fused = _fused(model)
    assert fused.plan.regions
    with pytest.raises(IndexOutOfRangeError, match="rope_q"):
        fused.run(None, {"x": np.ones((1, 2, 8), np.float32), "pos": np.array([[1, 8]], np.int64)})
    with pytest.raises(ShapeMismatchError, match="rope_q"):
        fused.run(None, {"x": np.ones((1, 2, 8), np.float32), "pos": np.array([[1, 2, 3]], np.int64)})


# -- MatMulNBits -----------------------------------------------------------------------------------

def _nbits(K, N, bits, bs, zp):
    nb = (K + bs - 1) // bs
    blob = bs * bits // 8
    b = RNG.integers(0, 256, (N, nb, blob)).astype(np.uint8)
    scales = (RNG.uniform(0.5, 1.5, (N * nb,)) * 0.02).astype(np.float32)
    inits = [_init("B", b), _init("scales", scales)]
    ins = ["a", "B", "scales"]
    if zp == "packed":
        per_row = (nb * bits + 7) // 8
        inits.append(_init("zp", RNG.integers(0, 256, (N * per_row,)).astype(np.uint8)))
        ins.append("zp")
    elif zp == "float":
        inits.append(_init("zp", RNG.uniform(0, 2 ** bits - 1, (N * nb,)).astype(np.float32)))
        ins.append("zp")
    return ins, inits


@pytest.mark.parametrize("bits,zp,level,bias", [(4, None, 4, False), (4, "packed", 4, True), (4, None, 0, False),
                                                (8, None, 4, False), (8, "packed", 0, True), (4, "float", 4, False)])
@pytest.mark.parametrize("M", [1, 3, 12, 80])  # 80: past the int8 kernels' rows, tiles at level 4
def test_matmul_nbits(bits, zp, level, bias, M):
    K, N, bs = 96, 40, 32
    ins, inits = _nbits(K, N, bits, bs, zp)
    if bias:
        while len(ins) < 5:
            ins.append("")
        ins.append("bias")
        inits.append(_init("bias", RNG.standard_normal(N).astype(np.float32)))
    nodes = [helper.make_node("MatMulNBits", ins, ["y"], domain=MS, K=K, N=N, bits=bits, block_size=bs,
                              accuracy_level=level), _then_add("y")]
    model = _model(nodes, [_vi("a", F, [1, "s", K])], [_out("y", 3), _vi("z", F, None)], inits)
    a = RNG.standard_normal((1, M, K)).astype(np.float32)
    # accuracy_level 4 (int8 A, integer block dots) is exact in any order; float accumulation is not.
    _check(model, {"a": a}, "MatMulNBits", ort=2e-3, exact=level == 4 and zp != "float")


def test_matmul_nbits_big_weight_runs_the_parallel_kernel():
    """2 MiB of packed weight: the wrapper and the form both take the multithreaded rows pass."""
    K, N, bs = 1024, 4096, 32
    ins, inits = _nbits(K, N, 4, bs, None)
    nodes = [helper.make_node("MatMulNBits", ins, ["y"], domain=MS, K=K, N=N, bits=4, block_size=bs,
                              accuracy_level=4), _then_add("y")]
    model = _model(nodes, [_vi("a", F, [1, "s", K])], [_out("y", 3), _vi("z", F, None)], inits)
    for M in (1, 9):
        _check(model, {"a": RNG.standard_normal((1, M, K)).astype(np.float32)}, "MatMulNBits")


def test_matmul_nbits_shape_error_names_the_node():
    ins, inits = _nbits(64, 8, 4, 32, None)
    nodes = [helper.make_node("MatMulNBits", ins, ["y"], domain=MS, K=64, N=8, bits=4, block_size=32,
                              name="proj"), _then_add("y")]
    model = _model(nodes, [_vi("a", F, [1, "s", "k"])], [_out("y", 3), _vi("z", F, None)], inits)
    fused = _fused(model)
    assert fused.plan.regions
    with pytest.raises(ShapeMismatchError, match="proj"):
        fused.run(None, {"a": np.ones((1, 2, 63), np.float32)})


# -- GatherBlockQuantized --------------------------------------------------------------------------

@pytest.mark.parametrize("bits,with_zp", [(4, False), (4, True), (8, False)])
def test_gather_block_quantized(bits, with_zp):
    V, Hd, bs = 30, 64, 32
    per = 8 // bits
    data = RNG.integers(0, 256, (V, Hd // per)).astype(np.uint8)
    nbq = Hd // bs
    scales = RNG.uniform(0.01, 0.1, (V, nbq)).astype(np.float32)
    inits = [_init("data", data), _init("scales", scales)]
    ins = ["data", "ids", "scales"]
    if with_zp:
        inits.append(_init("zp", RNG.integers(0, 256, (V, (nbq + per - 1) // per)).astype(np.uint8)))
        ins.append("zp")
    nodes = [helper.make_node("GatherBlockQuantized", ins, ["y"], domain=MS, bits=bits, block_size=bs,
                              gather_axis=0, quantize_axis=1), _then_add("y")]
    model = _model(nodes, [_vi("ids", I64, ["b", "s"])], [_out("y", 3), _vi("z", F, None)], inits)
    ids = RNG.integers(-V, V, (2, 5)).astype(np.int64)
    _check(model, {"ids": ids}, "GatherBlockQuantized", ort=1e-6 if bits == 4 else None)


def test_gather_block_quantized_index_error_names_the_node():
    data = RNG.integers(0, 256, (10, 16)).astype(np.uint8)
    scales = np.ones((10, 1), np.float32)
    nodes = [helper.make_node("GatherBlockQuantized", ["data", "ids", "scales"], ["y"], domain=MS, bits=4,
                              block_size=32, name="embed_q"), _then_add("y")]
    model = _model(nodes, [_vi("ids", I64, ["b", "s"])], [_out("y", 3), _vi("z", F, None)],
                   [_init("data", data), _init("scales", scales)])
    fused = _fused(model)
    assert fused.plan.regions
    with pytest.raises(IndexOutOfRangeError, match="embed_q"):
        fused.run(None, {"ids": np.array([[1, 10]], np.int64)})


# -- LpNormalization / GatedRMSNorm ----------------------------------------------------------------

@pytest.mark.parametrize("axis,p", [(-1, 2), (1, 1), (0, 2)])
def test_lp_normalization(axis, p):
    x = RNG.standard_normal((2, 5, 16)).astype(np.float32)
    x[0, 1] = 0
    nodes = [helper.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=p), _then_add("y")]
    model = _model(nodes, [_vi("x", F, ["b", "s", 16])], [_out("y", 3), _vi("z", F, None)])
    _check(model, {"x": x}, "LpNormalization", ort=1e-5)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_gated_rms_norm(activation):
    x = RNG.standard_normal((2, 3, 4, 8)).astype(np.float32)
    g = RNG.standard_normal(x.shape).astype(np.float32)
    nodes = [helper.make_node("GatedRMSNorm", ["x", "scale", "g"], ["y"], domain=MS, epsilon=1e-6,
                              activation=activation), _then_add("y")]
    model = _model(nodes, [_vi("x", F, ["b", "s", 4, 8]), _vi("g", F, ["b", "s", 4, 8])],
                   [_out("y", 4), _vi("z", F, None)],
                   [_init("scale", RNG.standard_normal(8).astype(np.float32))])
    _check(model, {"x": x, "g": g}, "GatedRMSNorm")


@pytest.mark.parametrize("op_type,attrs,with_bias", [("Gelu", {}, False), ("BiasGelu", {}, True),
                                                    ("FastGelu", {}, True), ("FastGelu", {}, False),
                                                    ("QuickGelu", {"alpha": 1.5}, False)])
def test_gelu_family(op_type, attrs, with_bias):
    """The com.microsoft GELU family in a region: the bound op's driver, as the wrapper runs it."""
    x = RNG.standard_normal((2, 3, 8)).astype(np.float32) * 3
    ins = ["x"] + (["bias"] if with_bias else [])
    nodes = [helper.make_node(op_type, ins, ["y"], domain=MS, **attrs), _then_add("y")]
    model = _model(nodes, [_vi("x", F, ["b", 3, 8])], [_out("y", 3), _vi("z", F, None)],
                   [_init("bias", RNG.standard_normal(8).astype(np.float32))] if with_bias else [])
    _check(model, {"x": x}, op_type, ort=1e-5 if op_type != "QuickGelu" else None)


# -- recurrent ops ---------------------------------------------------------------------------------

@pytest.mark.parametrize("channels_last,dilation,with_past", [(0, 1, True), (0, 2, False), (1, 1, True)])
def test_causal_conv_with_state(channels_last, dilation, with_past):
    B, C, L, K = 2, 6, 5, 4
    P = (K - 1) * dilation
    x = RNG.standard_normal((B, L, C) if channels_last else (B, C, L)).astype(np.float32)
    past = RNG.standard_normal((B, P, C) if channels_last else (B, C, P)).astype(np.float32)
    ins = ["x", "w", "bias"] + (["past"] if with_past else [])
    nodes = [helper.make_node("CausalConvWithState", ins, ["y", "present"], domain=MS, activation="silu",
                              ndim=1, dilation=dilation, channels_last=channels_last), _then_add("y")]
    inputs = [_vi("x", F, list(x.shape))] + ([_vi("past", F, list(past.shape))] if with_past else [])
    model = _model(nodes, inputs, [_out("y", 3), _out("present", 3), _vi("z", F, None)],
                   [_init("w", RNG.standard_normal((C, 1, K)).astype(np.float32)),
                    _init("bias", RNG.standard_normal(C).astype(np.float32))])
    feeds = {"x": x, **({"past": past} if with_past else {})}
    _check(model, feeds, "CausalConvWithState")


def test_linear_attention_gate():
    a = RNG.standard_normal((2, 3, 4)).astype(np.float32) * 5
    b = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [helper.make_node("LinearAttentionGate", ["a", "dt", "ds", "b"], ["decay", "beta"], domain=MS),
             _then_add("decay")]
    model = _model(nodes, [_vi("a", F, ["b", "s", 4]), _vi("b", F, ["b", "s", 4])],
                   [_out("decay", 3), _out("beta", 3), _vi("z", F, None)],
                   [_init("dt", RNG.standard_normal(4).astype(np.float32)),
                    _init("ds", -RNG.uniform(0.5, 2, 4).astype(np.float32))])
    _check(model, {"a": a, "b": b}, "LinearAttentionGate")


@pytest.mark.parametrize("q_heads,kv_heads,decay_w", [(2, 4, 1), (4, 2, 1), (2, 2, 8)])
def test_linear_attention(q_heads, kv_heads, decay_w):
    B, T, dk, dv = 1, 3, 8, 6
    qk_heads = q_heads if kv_heads > q_heads else kv_heads
    q = RNG.standard_normal((B, T, q_heads * dk)).astype(np.float32) * 0.3
    k = RNG.standard_normal((B, T, qk_heads * dk)).astype(np.float32) * 0.3
    v = RNG.standard_normal((B, T, kv_heads * dv)).astype(np.float32)
    past = RNG.standard_normal((B, kv_heads, dk, dv)).astype(np.float32) * 0.1
    decay = -RNG.uniform(0, 1, (B, T, kv_heads * decay_w)).astype(np.float32)
    beta = RNG.uniform(0, 1, (B, T, kv_heads)).astype(np.float32)
    nodes = [helper.make_node("LinearAttention", ["q", "k", "v", "past", "decay", "beta"], ["y", "state"], domain=MS,
                              q_num_heads=q_heads, kv_num_heads=kv_heads, update_rule="gated_delta"),
             _then_add("y")]
    feeds = {"q": q, "k": k, "v": v, "past": past, "decay": decay, "beta": beta}
    model = _model(nodes, [_vi(n, F, list(a.shape)) for n, a in feeds.items()],
                   [_out("y", 3), _out("state", 4), _vi("z", F, None)])
    _check(model, feeds, "LinearAttention")


# -- builder packages end to end -------------------------------------------------------------------

def _decode(path, regions, prompt, steps):
    from pipeline.backends import BackendChoice
    from pipeline.metadata import load_package
    from pipeline.runner import Pipeline
    old = os.environ.get("ONNX_NUMBA_COMPILED_REGIONS")
    os.environ["ONNX_NUMBA_COMPILED_REGIONS"] = "1" if regions else "0"
    try:
        pipe = Pipeline(load_package(path), BackendChoice(set(), True, "cpu"))
    finally:
        if old is None:
            del os.environ["ONNX_NUMBA_COMPILED_REGIONS"]
        else:
            os.environ["ONNX_NUMBA_COMPILED_REGIONS"] = old
    dec = pipe.decoder
    assert dec.backend == "native"
    logits = [np.array(dec.prefill(np.array([prompt], np.int64)), copy=True)]
    for _ in range(steps):
        tok = int(np.argmax(logits[-1].reshape(-1, logits[-1].shape[-1])[-1]))
        logits.append(np.array(dec.step(np.array([[tok]], np.int64)), copy=True))
    return dec, logits


@pytest.mark.parametrize("name", ["qwen35_fp32", "qwen35_int4", "llama_int4"])
def test_package_decode_matches_without_regions(name):
    """Regions on and off give the same greedy path and logits equal up to summation order (a prefill
    MatMul of several rows runs the panel tiles in a region and BLAS through the wrapper)."""
    path = os.path.join(HERE, name)
    prompt = [1, 45, 77, 12, 300, 9, 17, 23, 5, 11, 40]   # > 8 tokens: MatMulNBits' multi-row paths in prefill
    on, got = _decode(path, True, prompt, 8)
    off, want = _decode(path, False, prompt, 8)
    assert not off.session.plan.regions
    plan = on.session.plan
    covered = {n.op_type for r in plan.regions for n in r.nodes}
    expect = {"qwen35_fp32": {"MRotaryEmbedding", "LpNormalization", "GatedRMSNorm", "CausalConvWithState",
                              "LinearAttentionGate", "LinearAttention"},
              "qwen35_int4": {"MRotaryEmbedding", "MatMulNBits", "GatherBlockQuantized", "LinearAttention"},
              "llama_int4": {"MatMulNBits"}}[name]
    assert expect <= covered, expect - covered
    assert sum(len(r.nodes) for r in plan.regions) == len(plan.graph.nodes)  # the whole step is compiled
    for a, b in zip(got, want):
        assert np.argmax(a.reshape(-1, a.shape[-1]), -1).tolist() == np.argmax(b.reshape(-1, b.shape[-1]), -1).tolist()
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_group_query_attention_with_bias_and_sink():
    """GroupQueryAttention's form runs the wrapper's driver, attention_bias and head_sink included."""
    B, S, H, kvH, D, P = 1, 3, 4, 2, 16, 5
    T = P + S
    q = RNG.standard_normal((B, S, H * D)).astype(np.float32)
    k = RNG.standard_normal((B, S, kvH * D)).astype(np.float32)
    v = RNG.standard_normal((B, S, kvH * D)).astype(np.float32)
    pk = RNG.standard_normal((B, kvH, P, D)).astype(np.float32)
    pv = RNG.standard_normal((B, kvH, P, D)).astype(np.float32)
    bias = RNG.standard_normal((1, 1, S, T)).astype(np.float32)
    sink = RNG.standard_normal(H).astype(np.float32)
    ins = ["q", "k", "v", "pk", "pv", "sl", "tot", "", "", "", "bias", "sink"]
    nodes = [helper.make_node("GroupQueryAttention", ins, ["y", "pko", "pvo"], domain=MS, num_heads=H,
                              kv_num_heads=kvH), _then_add("y")]
    inputs = [_vi("q", F, list(q.shape)), _vi("k", F, list(k.shape)), _vi("v", F, list(v.shape)),
              _vi("pk", F, list(pk.shape)), _vi("pv", F, list(pv.shape)), _vi("bias", F, list(bias.shape)),
              _vi("sink", F, [H])]
    model = _model(nodes, inputs, [_out("y", 3), _out("pko", 4), _out("pvo", 4), _vi("z", F, None)],
                   [_init("sl", np.array([T - 1], np.int32)), _init("tot", np.array(T, np.int32))])
    _check(model, {"q": q, "k": k, "v": v, "pk": pk, "pv": pv, "bias": bias, "sink": sink},
           "GroupQueryAttention")
