"""Graph passes: each reports whether it changed the graph, and changes only what it says."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession, SessionOptions
from runtime.errors import ShapeInferenceError
from runtime.ir import graph_from_proto
from runtime.passes import EliminateDeadNodes, EliminateIdentity, FoldConstants, InferShapes


def _graph(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return graph_from_proto(g, {"": opset})


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def test_fold_constants_runs_kernels_at_plan_time():
    c = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "c")
    g = _graph([helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([3.0, 4.0], np.float32))),
                helper.make_node("Add", ["c", "k"], ["ck"]),
                helper.make_node("Mul", ["x", "ck"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], [c])
    res = FoldConstants()(g)
    assert res.modified
    assert [n.op_type for n in g.nodes] == ["Mul"]
    np.testing.assert_array_equal(g.initializers["ck"], [4.0, 6.0])
    assert not FoldConstants()(g).modified


def test_shape_of_static_value_folds():
    g = _graph([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)],
               [_vi("x", [3, 5])], [_vi("y", [2])])
    InferShapes()(g)
    assert FoldConstants()(g).modified
    np.testing.assert_array_equal(g.initializers["y"] if "y" in g.initializers else g.initializers["s"],
                                  [3, 5])


def test_identity_elimination_keeps_graph_outputs():
    g = _graph([helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                helper.make_node("Identity", ["b"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    assert EliminateIdentity()(g).modified
    assert [n.op_type for n in g.nodes] == ["Relu", "Identity"]
    assert g.nodes[0].inputs == ["x"]
    assert not EliminateIdentity()(g).modified


def test_dead_nodes_are_removed():
    g = _graph([helper.make_node("Relu", ["x"], ["dead"]), helper.make_node("Neg", ["x"], ["y"])],
               [_vi("x", [2])], [_vi("y", [2])])
    assert EliminateDeadNodes()(g).modified
    assert [n.op_type for n in g.nodes] == ["Neg"]
    assert not EliminateDeadNodes()(g).modified


def test_symbolic_dims_propagate():
    g = _graph([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", 4])], [_vi("y", None)])
    assert InferShapes()(g).modified
    assert g.value_info["y"].shape == ("batch", 4)


def test_strict_shape_inference_rejects_contradictions_permissive_does_not():
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["x", "z"], ["y"])], "g", [_vi("x", [2, 3]), _vi("z", [4, 5])], [_vi("y", None)]),
        opset_imports=[helper.make_opsetid("", 17)])
    g = graph_from_proto(m.graph, {"": 17})
    with pytest.raises(ShapeInferenceError):
        InferShapes(strict=True)(g)
    InferShapes(strict=False)(graph_from_proto(m.graph, {"": 17}))  # no error
    opts = SessionOptions()
    opts.strict_shape_inference = True
    with pytest.raises(ShapeInferenceError):
        InferenceSession(m, opts)
