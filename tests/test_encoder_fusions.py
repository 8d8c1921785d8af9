"""runtime/passes/encoder_fusions.py: decomposed LayerNormalization and Gelu, and MatMul + Add, each fused into
one node on tiny graphs, checked against the unfused graph and onnxruntime; patterns whose intermediates are
read elsewhere stay as they are, and onnxruntime's optimizer names turn each fusion off.

Tolerances, fixed beforehand: 1e-5 absolute for the normalization (a row of 16 float32 values, the fused kernel
sums in another order), 1e-6 for Gelu (erf's own kernel) and 1e-5 for the Gemm."""
import collections

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession

F = TensorProto.FLOAT
RNG = np.random.default_rng(11)


def _model(nodes, inits, x_shape, outputs=("y",), opset=13):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, x_shape)],
                          [helper.make_tensor_value_info(o, F, None) for o in outputs],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def _ops(sess):
    return collections.Counter((n.domain, n.op_type) for n in sess._graph.nodes)


def _layer_norm(extra_output=False):
    n = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
         helper.make_node("Sub", ["x", "m"], ["d"]),
         helper.make_node("Pow", ["d", "two"], ["p"]),
         helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
         helper.make_node("Add", ["v", "eps"], ["ve"]),
         helper.make_node("Sqrt", ["ve"], ["s"]),
         helper.make_node("Div", ["d", "s"], ["nrm"]),
         helper.make_node("Mul", ["gamma", "nrm"], ["sc"]),
         helper.make_node("Add", ["sc", "beta"], ["y"])]
    inits = {"two": 2.0, "eps": 1e-5, "gamma": RNG.standard_normal(16), "beta": RNG.standard_normal(16)}
    return _model(n, inits, [2, 3, 16], ("y", "d") if extra_output else ("y",))


def _gelu(half_first, reciprocal):
    scaled = helper.make_node("Mul", ["x", "rs2"], ["t"]) if reciprocal else helper.make_node("Div", ["x", "s2"],
                                                                                              ["t"])
    n = [scaled, helper.make_node("Erf", ["t"], ["e"]), helper.make_node("Add", ["one", "e"], ["a"])]
    if half_first:
        n += [helper.make_node("Mul", ["half", "x"], ["h"]), helper.make_node("Mul", ["h", "a"], ["y"])]
    else:
        n += [helper.make_node("Mul", ["a", "x"], ["h"]), helper.make_node("Mul", ["h", "half"], ["y"])]
    inits = {"s2": np.sqrt(2.0), "rs2": 1 / np.sqrt(2.0), "one": 1.0, "half": 0.5}
    return _model(n, inits, [3, 40])


def _check(model, disabled, tol, feeds):
    fused, plain = InferenceSession(model), InferenceSession(model, disabled_optimizers=[disabled])
    got, want = fused.run(None, feeds), plain.run(None, feeds)
    ref = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b, c in zip(got, want, ref):
        np.testing.assert_allclose(a, b, rtol=0, atol=tol)
        np.testing.assert_allclose(a, c, rtol=0, atol=tol)
    return fused, plain


def test_a_decomposed_layer_normalization_is_one_node():
    x = RNG.standard_normal((2, 3, 16)).astype(np.float32) * 3e-3 + 1  # variance near epsilon: it counts
    fused, plain = _check(_layer_norm(), "LayerNormFusion", 1e-5, {"x": x})
    assert _ops(fused) == {("", "LayerNormalization"): 1}
    assert _ops(plain)[("", "ReduceMean")] == 2


def test_a_layer_normalization_whose_centred_values_are_read_elsewhere_stays():
    s = InferenceSession(_layer_norm(extra_output=True))
    assert ("", "LayerNormalization") not in _ops(s)


@pytest.mark.parametrize("half_first,reciprocal", [(False, False), (True, False), (False, True)])
def test_a_decomposed_gelu_is_one_node(half_first, reciprocal):
    x = RNG.standard_normal((3, 40)).astype(np.float32) * 3
    fused, plain = _check(_gelu(half_first, reciprocal), "GeluFusion", 1e-6, {"x": x})
    assert _ops(fused) == {("com.microsoft", "Gelu"): 1}
    assert _ops(plain)[("", "Erf")] == 1


def test_matmul_and_add_are_one_gemm():
    n = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["b", "m"], ["y"])]
    model = _model(n, {"w": RNG.standard_normal((12, 7)), "b": RNG.standard_normal(7)}, [5, 12])
    fused, plain = _check(model, "MatMulAddFusion", 1e-5, {"x": RNG.standard_normal((5, 12)).astype(np.float32)})
    assert _ops(fused) == {("", "Gemm"): 1} and _ops(plain)[("", "MatMul")] == 1
    # three-dimensional A stays a MatMul and an Add
    s = InferenceSession(_model(n, {"w": RNG.standard_normal((12, 7)), "b": RNG.standard_normal(7)}, [2, 5, 12]))
    assert ("", "Gemm") not in _ops(s)


def _attention_model(q_shape, k_shape, opset=13, scale_op="Mul"):
    ins = [helper.make_tensor_value_info(n, F, s) for n, s in (("q", q_shape), ("k", k_shape), ("v", k_shape))]
    n = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
         helper.make_node("MatMul", ["q", "kt"], ["s"]),
         helper.make_node(scale_op, ["s", "c"], ["ss"]),
         helper.make_node("Softmax", ["ss"], ["p"], axis=3 if opset < 13 else -1),
         helper.make_node("MatMul", ["p", "v"], ["y"])]
    g = helper.make_graph(n, "g", ins, [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(np.array(0.35 if scale_op == "Mul" else 2.5, np.float32), "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("q_shape,k_shape,opset,scale_op", [
    ((2, 3, 5, 8), (2, 3, 7, 8), 13, "Mul"), ((1, 4, 6, 8), (1, 4, 6, 8), 12, "Div"),
    ((2, 3, 5, 8), (1, 3, 7, 8), 13, "Mul")])  # the last broadcasts K and V over the batch (the three nodes' way)
def test_an_encoder_self_attention_is_one_node(q_shape, k_shape, opset, scale_op):
    model = _attention_model(q_shape, k_shape, opset, scale_op)
    feeds = {"q": RNG.standard_normal(q_shape).astype(np.float32),
             "k": RNG.standard_normal(k_shape).astype(np.float32),
             "v": RNG.standard_normal(k_shape).astype(np.float32)}
    fused, plain = _check(model, "AttentionFusion", 1e-5, feeds)
    assert _ops(fused) == {("onnx_numba", "ScaledDotAttention"): 1}
    assert _ops(plain)[("", "Softmax")] == 1


def test_an_optimized_model_with_the_fused_nodes_loads_in_onnxruntime(tmp_path):
    """The fused attention is written back as the nodes it replaced; Gelu and LayerNormalization are ops
    onnxruntime has."""
    from runtime import SessionOptions
    shapes = (("q", (2, 3, 5, 8)), ("k", (2, 3, 7, 8)), ("v", (2, 3, 7, 8)))
    for name, model, feeds in (
            ("attention", _attention_model((2, 3, 5, 8), (2, 3, 7, 8), 12, "Div"),
             {k: RNG.standard_normal(s).astype(np.float32) for k, s in shapes}),
            ("gelu", _gelu(True, False), {"x": RNG.standard_normal((3, 40)).astype(np.float32)}),
            ("layer_norm", _layer_norm(), {"x": RNG.standard_normal((2, 3, 16)).astype(np.float32)})):
        so = SessionOptions()
        so.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
        got = InferenceSession(model, so).run(None, feeds)[0]
        ref = onnxruntime.InferenceSession(so.optimized_model_filepath, providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(got, ref.run(None, feeds)[0], rtol=0, atol=1e-5)
