"""Control flow and sequences beyond the node suite: captured outer values, nested subgraphs, sequence state."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.test.loader import load_node_model_tests

from runtime import InferenceSession


def _vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


def test_loop_with_optional_sequence_state_matches_the_suite_data():
    # test_loop16_seq_none is excluded from the suite only because onnx's runner cannot compare its output.
    case = next(c for c in load_node_model_tests() if c.name == "test_loop16_seq_none")
    s = InferenceSession(case.model)
    (inputs, expected), = case.data_sets[:1]
    out = s.run(None, dict(zip([i.name for i in s.get_inputs()], inputs)))[0]
    assert isinstance(out, list) and len(out) == len(expected[0])
    for a, b in zip(out, expected[0]):
        np.testing.assert_array_equal(a, b)


def test_if_branches_read_outer_values_and_nested_scan():
    # then: y = x * w (w from the outer scope); else: a Scan summing the rows of x plus w.
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y_then"])], "then", [],
                               [_vi("y_then", TensorProto.FLOAT, [3])])
    body = helper.make_graph([helper.make_node("Add", ["acc", "row"], ["acc_out"]),
                              helper.make_node("Add", ["acc_out", "w"], ["acc_w"]),
                              helper.make_node("Identity", ["acc_out"], ["out_row"])], "body",
                             [_vi("acc", TensorProto.FLOAT, [3]), _vi("row", TensorProto.FLOAT, [3])],
                             [_vi("acc_w", TensorProto.FLOAT, [3]), _vi("out_row", TensorProto.FLOAT, [3])])
    else_g = helper.make_graph([helper.make_node("Scan", ["w", "xs"], ["y_else", "rows"], body=body,
                                                 num_scan_inputs=1)], "else", [],
                               [_vi("y_else", TensorProto.FLOAT, [3])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], "g",
                          [_vi("c", TensorProto.BOOL, []), _vi("x", TensorProto.FLOAT, [3]),
                           _vi("w", TensorProto.FLOAT, [3]), _vi("xs", TensorProto.FLOAT, [4, 3])],
                          [_vi("y", TensorProto.FLOAT, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    s = InferenceSession(m)
    x = np.arange(3, dtype=np.float32)
    w = np.full(3, 2, np.float32)
    xs = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(s.run(None, {"c": np.array(True), "x": x, "w": w, "xs": xs})[0], x * w)
    acc = w.copy()
    for r in xs:
        acc = acc + r + w
    np.testing.assert_array_equal(s.run(None, {"c": np.array(False), "x": x, "w": w, "xs": xs})[0], acc)


def test_sequence_ops_do_not_mutate_their_inputs():
    g = helper.make_graph([
        helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
        helper.make_node("SequenceInsert", ["s", "a"], ["s2"]),
        helper.make_node("SequenceErase", ["s2"], ["s3"], ),
        helper.make_node("SequenceLength", ["s"], ["n"]),
        helper.make_node("SequenceLength", ["s3"], ["n3"]),
        helper.make_node("ConcatFromSequence", ["s2"], ["cat"], axis=0),
    ], "g", [_vi("a", TensorProto.FLOAT, [2]), _vi("b", TensorProto.FLOAT, [2])],
        [_vi("n", TensorProto.INT64, []), _vi("n3", TensorProto.INT64, []), _vi("cat", TensorProto.FLOAT, [6])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    a, b = np.ones(2, np.float32), np.zeros(2, np.float32)
    n, n3, cat = InferenceSession(m).run(None, {"a": a, "b": b})
    assert int(n) == 2 and int(n3) == 2
    np.testing.assert_array_equal(cat, [1, 1, 0, 0, 1, 1])


def test_an_input_a_subgraph_reads_is_never_donated():
    """kv_share_buffer's rule (Graph.donatable_inputs, used by the CPU and CUDA plans): a graph input is handed
    to its reader only when one node reads it once and no subgraph reads it; an If body's read counts."""
    from runtime.loader import load_graph
    then_g = helper.make_graph([helper.make_node("Neg", ["a"], ["t"])], "then", [],
                               [_vi("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Identity", ["b"], ["e"])], "else", [],
                               [_vi("e", TensorProto.FLOAT, [2])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
                           helper.make_node("Add", ["a", "d"], ["z"])], "g",
                          [_vi("c", TensorProto.BOOL, []), _vi("a", TensorProto.FLOAT, [2]),
                           _vi("b", TensorProto.FLOAT, [2]), _vi("d", TensorProto.FLOAT, [2])],
                          [_vi("y", TensorProto.FLOAT, [2]), _vi("z", TensorProto.FLOAT, [2])])
    graph = load_graph(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert graph.donatable_inputs() == {"c", "d"}  # a: the Add and the then-branch; b: the else-branch


def test_a_branch_folds_what_it_computes_from_the_parents_constants():
    """A branch that slices a weight of the enclosing graph with constant bounds: the weight and the bounds are
    the child's own constants, so the Slice folds when the branch is planned, the branch runs only its Add and
    reads only ``x`` from the enclosing scope; the result is the unfolded one."""
    from ops.registry import OpContext
    from runtime.subgraph import plan_subgraph
    then_g = helper.make_graph([helper.make_node("Slice", ["w", "s", "e"], ["ws"]),
                                helper.make_node("Add", ["ws", "x"], ["y_then"])], "then", [],
                               [_vi("y_then", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["y_else"])], "else", [],
                               [_vi("y_else", TensorProto.FLOAT, [2])])
    inits = [numpy_helper.from_array(np.arange(5, dtype=np.float32), "w"),
             numpy_helper.from_array(np.array([1], np.int64), "s"),
             numpy_helper.from_array(np.array([3], np.int64), "e")]
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    g = helper.make_graph([node], "g", [_vi("c", TensorProto.BOOL, []), _vi("x", TensorProto.FLOAT, [2])],
                          [_vi("y", TensorProto.FLOAT, [2])], inits)
    s = InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    x = np.array([10, 20], np.float32)
    np.testing.assert_array_equal(s.run(None, {"c": np.array(True), "x": x})[0], [11, 22])
    np.testing.assert_array_equal(s.run(None, {"c": np.array(False), "x": x})[0], -x)
    parent = s._graph
    ctx = OpContext("If", "If", "", 17, {}, 1, 1, graph=parent, session_options=s._options,
                    captured=["e", "s", "w", "x"])
    child = plan_subgraph(then_g, ctx)
    assert [n.op_type for n in child.plan.graph.nodes] == ["Add"]
    assert child.plan.outer_names == ["x"]
