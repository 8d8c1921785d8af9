"""ops/fused.py: the CPU GatedActivation the gate fusion produces, per node and in a compiled region."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper

import runtime
from ops.fused import GatedActivation
from runtime.errors import ShapeMismatchError

RNG = np.random.default_rng(3)


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
    regions = runtime.SessionOptions()
    regions.compiled_regions = True
    s = runtime.InferenceSession(_gate_model("silu"), regions)
    with pytest.raises(ShapeMismatchError, match="one shape"):
        s.run(None, {"g": np.zeros((2, 40), np.float32), "u": np.zeros((3, 40), np.float32)})
