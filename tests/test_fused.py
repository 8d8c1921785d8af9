"""ops/fused.py: the CPU GatedActivation the gate fusion produces, per node and in a compiled region, and the CPU
GatedMatMul (the CUDA plan's fused gate and its two products) against numpy."""
import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper

import runtime
from ops import registry
from ops.fused import DOMAIN
from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError

RNG = np.random.default_rng(3)


def _cpu(op_type, n_inputs, **attrs):
    """The CPU wrapper of ``op_type`` bound as a plan binds it."""
    ctx = registry.OpContext(name="n", op_type=op_type, domain=DOMAIN, opset=1, attrs=attrs, n_inputs=n_inputs,
                             n_outputs=1, outputs_used=[True])
    return registry.bind(registry.resolve(DOMAIN, op_type, 1), ctx)


def GatedActivation(g, u=None, **attrs):
    return _cpu("GatedActivation", 1 if u is None else 2, **attrs)(g, u)


def _gate_model(act):
    if act == "silu":
        nodes = [helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", ["s", "g"], ["a"])]
    else:
        nodes = [helper.make_node("Gelu", ["g"], ["a"], approximate="tanh" if act == "gelu_tanh" else "none")]
    nodes += [helper.make_node("Mul", ["u", "a"], ["y"]), helper.make_node("Add", ["y", "u"], ["z"])]
    vi = [helper.make_tensor_value_info(n, TP.FLOAT, ["b", 40]) for n in "gu"]
    g = helper.make_graph(nodes, "gate", vi, [helper.make_tensor_value_info("z", TP.FLOAT, ["b", 40])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
def test_fused_gate_matches_the_nodes_it_replaces(act):
    m = _gate_model(act)
    g, u = (RNG.standard_normal((2, 5, 40)) * 6).astype(np.float32)
    feeds = {"g": g, "u": u}
    fused = runtime.InferenceSession(m)
    assert [n.op_type for n in fused.plan.graph.nodes] == ["GatedActivation", "Add"]
    off = runtime.SessionOptions()
    off.graph_optimization_level = 0
    plain = runtime.InferenceSession(m, off).run(None, feeds)[0]
    regions = runtime.SessionOptions()
    regions.compiled_regions = True
    in_region = runtime.InferenceSession(m, regions)
    assert in_region.plan.regions
    y, yr = fused.run(None, feeds)[0], in_region.run(None, feeds)[0]
    np.testing.assert_array_equal(y, yr)
    if act == "silu":  # the Sigmoid kernel's own function, in the same order: the same bits
        np.testing.assert_array_equal(y, plain)
    np.testing.assert_allclose(y, plain, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(y, ort.InferenceSession(m).run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_one_input_halves_and_bad_shapes():
    gu = RNG.standard_normal((3, 2, 16)).astype(np.float32)
    y = GatedActivation(gu)
    g, u = gu[..., :8], gu[..., 8:]
    np.testing.assert_allclose(y, g / (1 + np.exp(-g)) * u, rtol=1e-6, atol=1e-6)
    assert GatedActivation(gu.astype(np.float16)).dtype == np.float16
    with pytest.raises(ShapeMismatchError, match="even last axis"):
        GatedActivation(gu[..., :15])
    with pytest.raises(ShapeMismatchError, match="one shape"):
        GatedActivation(g, u[:, :1])
    with pytest.raises(InvalidAttributeError, match="activation must be one of"):
        GatedActivation(gu, activation="relu")
    regions = runtime.SessionOptions()
    regions.compiled_regions = True
    s = runtime.InferenceSession(_gate_model("silu"), regions)
    with pytest.raises(ShapeMismatchError, match="one shape"):
        s.run(None, {"g": np.zeros((2, 40), np.float32), "u": np.zeros((3, 40), np.float32)})


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
def test_gated_matmul_matches_numpy(act):
    x = (RNG.standard_normal((2, 3, 12)) / 2).astype(np.float32)
    wg, wu = (RNG.standard_normal((2, 12, 7)) / 2).astype(np.float32)
    y = _cpu("GatedMatMul", 3, activation=act)(x, wg, wu)
    x64, g, u = x.astype(np.float64), wg.astype(np.float64), wu.astype(np.float64)
    h = x64 @ g
    ref = {"silu": h / (1 + np.exp(-h)),
           "gelu": 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2))),
           "gelu_tanh": 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))}[act]
    assert y.dtype == np.float32 and y.shape == (2, 3, 7)
    np.testing.assert_allclose(y, ref * (x64 @ u), rtol=1e-5, atol=1e-5)
    one = _cpu("GatedMatMul", 3, activation=act)(x[0, 0], wg, wu)  # x (K,): one row, result (N,)
    np.testing.assert_allclose(one, y[0, 0], rtol=1e-6, atol=1e-6)
    half = _cpu("GatedMatMul", 3, activation=act)(*(a.astype(np.float16) for a in (x, wg, wu)))
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, y, rtol=2e-2, atol=2e-2)


def test_gated_matmul_checks():
    w = np.zeros((3, 4), np.float32)
    with pytest.raises(InvalidAttributeError, match="activation must be one of"):
        _cpu("GatedMatMul", 3, activation="relu")
    with pytest.raises(ShapeMismatchError, match="two"):
        _cpu("GatedMatMul", 3)(np.zeros((1, 5), np.float32), w, w)
    with pytest.raises(ShapeMismatchError, match="two"):
        _cpu("GatedMatMul", 3)(np.zeros((1, 3), np.float32), w, np.zeros((3, 5), np.float32))
    with pytest.raises(InvalidArgumentError, match="float32 or float16"):
        _cpu("GatedMatMul", 3)(np.zeros((1, 3)), w, w)
