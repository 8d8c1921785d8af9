"""InferenceSession: onnxruntime's API shape, feed validation, unsupported ops, IO binding, plan invariants."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from runtime import InferenceSession, SessionOptions
from runtime.errors import InvalidFeedError, UnsupportedOpError
from runtime.ir import graph_from_proto
from runtime.passes import ExpandFunctions, InferShapes


def _model(nodes, inputs, outputs, opset=17, extra_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), *extra_opsets])


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def test_api_shape():
    m = _model([helper.make_node("Add", ["x", "y"], ["z"])], [_vi("x", ["batch", 4]), _vi("y", [4])],
               [_vi("z", ["batch", 4])])
    s = InferenceSession(m, providers=["CPUExecutionProvider"])
    assert [i.name for i in s.get_inputs()] == ["x", "y"]
    assert s.get_inputs()[0].shape == ["batch", 4]
    assert s.get_inputs()[0].type == "tensor(float)"
    assert s.get_outputs()[0].name == "z"
    assert s.get_providers() == ["CPUExecutionProvider"]
    x = np.random.rand(3, 4).astype(np.float32)
    y = np.random.rand(4).astype(np.float32)
    (z,) = s.run(["z"], {"x": x, "y": y})
    np.testing.assert_allclose(z, x + y)
    np.testing.assert_allclose(s.run(None, {"x": x, "y": y})[0], x + y)


def test_unknown_provider_is_an_error():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1])], [_vi("y", [1])])
    with pytest.raises(ValueError, match="unknown execution provider"):
        InferenceSession(m, providers=["NoSuchExecutionProvider"])


@pytest.mark.parametrize("feed,match", [
    ({"x": np.zeros((2, 4), np.float32), "w": np.zeros(4, np.float32)}, "not an input"),
    ({"x": np.zeros((2, 4), np.float64)}, "expected dtype tensor\\(float\\)"),
    ({"x": np.zeros((2, 4, 1), np.float32)}, "expected rank 2"),
    ({"x": np.zeros((2, 5), np.float32)}, "axis 1: expected 4, got 5"),
    ({}, "missing"),
])
def test_bad_feeds_are_refused_with_a_named_message(feed, match):
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["n", 4])], [_vi("y", ["n", 4])])
    s = InferenceSession(m)
    with pytest.raises(InvalidFeedError, match=match) as e:
        s.run(None, feed)
    assert "'x'" in str(e.value) or "'w'" in str(e.value)


def test_a_negative_declared_extent_is_dynamic_as_in_onnxruntime():
    """``dim_value: -1`` (as some exporters write) accepts any extent and reports None; 0 stays a fixed 0."""
    import onnxruntime as ort
    x = _vi("x", [1, 4])
    x.type.tensor_type.shape.dim[0].dim_value = -1
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [_vi("y", None)])
    feed = {"x": -np.ones((3, 4), np.float32)}
    s = InferenceSession(m)
    assert s.get_inputs()[0].shape == ort.InferenceSession(m.SerializeToString()).get_inputs()[0].shape == [None, 4]
    np.testing.assert_array_equal(s.run(None, feed)[0], np.zeros((3, 4), np.float32))
    x.type.tensor_type.shape.dim[0].dim_value = 0
    with pytest.raises(InvalidFeedError, match="axis 0: expected 0, got 3"):
        InferenceSession(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [_vi("y", None)])).run(None, feed)


def test_unknown_output_name_is_refused():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1])], [_vi("y", [1])])
    with pytest.raises(InvalidFeedError, match="'nope'"):
        InferenceSession(m).run(["nope"], {"x": np.zeros(1, np.float32)})


def test_unsupported_ops_are_all_listed():
    m = _model([helper.make_node("FancyOp", ["x"], ["a"], name="first", domain="acme"),
                helper.make_node("Relu", ["a"], ["b"]),
                helper.make_node("OtherOp", ["b"], ["y"], name="second", domain="acme")],
               [_vi("x", [1])], [_vi("y", [1])], extra_opsets=[helper.make_opsetid("acme", 3)])
    with pytest.raises(UnsupportedOpError) as e:
        InferenceSession(m)
    assert [n[:3] for n in e.value.nodes] == [("first", "FancyOp", "acme"), ("second", "OtherOp", "acme")]
    assert "opset 3" in str(e.value) and "'first'" in str(e.value) and "'second'" in str(e.value)


def test_function_bodies_expand_when_no_kernel():
    # Gelu has a kernel; pretend it has not, so its schema body (Erf, Mul, Add...) runs instead.
    m = _model([helper.make_node("Gelu", ["x"], ["y"])], [_vi("x", [5])], [_vi("y", [5])], opset=20)
    g = graph_from_proto(m.graph, {"": 20})
    InferShapes()(g)
    res = ExpandFunctions(lambda n: n.op_type != "Gelu")(g)
    assert res.modified and "Gelu" not in [n.op_type for n in g.nodes]
    from runtime.executor import Plan
    from ops import registry
    assert all(registry.resolve(n.domain, n.op_type, n.opset) for n in g.nodes), "Gelu's body needs kernels"
    x = np.linspace(-3, 3, 5).astype(np.float32)
    ref = InferenceSession(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(Plan(g).run([x])[0], ref, rtol=1e-5, atol=1e-6)


def test_an_expanded_body_takes_the_schemas_attribute_defaults():
    """HannWindow's body reads ``output_datatype`` by reference; a node that leaves it unset gets the schema's
    default (float), which the body itself does not declare."""
    m = _model([helper.make_node("HannWindow", ["n"], ["y"])], [_vi("n", [], TensorProto.INT64)],
               [_vi("y", [None])], opset=17)
    g = graph_from_proto(m.graph, {"": 17})
    InferShapes()(g)
    assert ExpandFunctions(lambda n: n.op_type != "HannWindow")(g).modified
    from runtime.executor import Plan
    n = np.array(8, np.int64)
    want = InferenceSession(m).run(None, {"n": n})[0]
    got = Plan(g).run([n])[0]
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_io_binding_reads_and_writes_resident_buffers():
    m = _model([helper.make_node("Add", ["x", "y"], ["z"])], [_vi("x", [4]), _vi("y", [4])], [_vi("z", [4])])
    s = InferenceSession(m)
    b = s.io_binding()
    x = np.ones(4, np.float32)
    y = np.arange(4, dtype=np.float32)
    out = np.zeros(4, np.float32)
    b.bind_input("x", x)
    b.bind_input("y", y)
    b.bind_output("z", out)
    s.run_with_iobinding(b)
    np.testing.assert_array_equal(out, x + y)
    assert b.get_output_arrays()[0] is out and b.get_outputs()[0].numpy() is out
    y[:] = 10  # bound inputs are read in place on the next run
    s.run_with_iobinding(b)
    np.testing.assert_array_equal(out, 11)
    with pytest.raises(InvalidFeedError):
        b.bind_input("nope", x)


def test_arena_reuse_never_corrupts_values():
    # A long chain of statically shaped values: buffers get recycled; results must equal numpy's.
    nodes, prev = [], "x"
    for i in range(20):
        op = ["Add", "Mul", "Sub"][i % 3]
        nodes.append(helper.make_node(op, [prev, "x"], [f"v{i}"]))
        prev = f"v{i}"
    nodes.append(helper.make_node("Add", ["v3", prev], ["y"]))  # v3 stays live until the end
    m = _model(nodes, [_vi("x", [8, 8])], [_vi("y", [8, 8])])
    s = InferenceSession(m)
    assert s.plan.arena_bytes < 20 * 8 * 8 * 4, "the arena should recycle dead buffers"
    x = np.random.rand(8, 8).astype(np.float32)
    v, vals = x, []
    for i in range(20):
        v = [v + x, v * x, v - x][i % 3]
        vals.append(v)
    for _ in range(2):
        np.testing.assert_allclose(s.run(None, {"x": x})[0], vals[3] + vals[-1], rtol=1e-6)


def test_outputs_are_fresh_arrays():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [4])], [_vi("y", [4])])
    s = InferenceSession(m)
    a = s.run(None, {"x": np.ones(4, np.float32)})[0]
    b = s.run(None, {"x": np.full(4, 2, np.float32)})[0]
    assert a is not b and a[0] == 1 and b[0] == 2


def test_values_are_released_after_last_use():
    m = _model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                helper.make_node("Relu", ["b"], ["y"])], [_vi("x", [4])], [_vi("y", [4])])
    opts = SessionOptions()
    opts.fused_segments = False
    s = InferenceSession(m, opts)
    frees = [step[3] for step in s.plan.steps]
    slot = s.plan.slot_of
    assert frees[1] == (slot["a"],) and frees[2] == (slot["b"],)


def test_fused_segments_match_the_unfused_plan_bit_for_bit():
    # Mixed elementwise ops with scalar broadcasts, a value read after the segment and a returned view.
    ops = ["Add", "Mul", "Sub", "Div", "Relu", "Tanh", "Sigmoid", "Neg", "Exp", "Abs"]
    nodes, prev = [], "x"
    for i, op in enumerate(ops * 3):
        ins = [prev] if op in ("Relu", "Tanh", "Sigmoid", "Neg", "Exp", "Abs") else [prev, ["x", "s"][i % 2]]
        nodes.append(helper.make_node(op, ins, [f"v{i}"]))
        prev = f"v{i}"
    nodes.append(helper.make_node("Reshape", ["v4", "shape"], ["r"]))
    nodes.append(helper.make_node("Shape", ["x"], ["shp"]))
    nodes.append(helper.make_node("Add", [prev, "v7"], ["y"]))
    g = helper.make_graph(nodes, "g", [_vi("x", [2, 3]), _vi("s", [1])], [_vi("y", [2, 3]), _vi("r", [6])],
                          [helper.make_tensor("shape", TensorProto.INT64, [1], [6])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    fused = InferenceSession(m)
    assert fused.plan.segments and len(fused.plan.segments[0].nodes) >= 10
    opts = SessionOptions()
    opts.fused_segments = False
    plain = InferenceSession(m, opts)
    assert not plain.plan.segments
    rng = np.random.default_rng(0)
    for _ in range(3):
        feed = {"x": rng.standard_normal((2, 3)).astype(np.float32), "s": np.array([0.7], np.float32)}
        a = fused.run(None, feed)
        b = plain.run(None, feed)
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)
    first = fused.run(None, feed)[1]
    fused.run(None, {"x": feed["x"] + 1, "s": feed["s"]})
    np.testing.assert_array_equal(first, b[1]), "returned values must not alias the segment scratch"


def test_kernel_errors_name_the_node():
    m = _model([helper.make_node("Add", ["x", "y"], ["z"], name="the_add")], [_vi("x", None), _vi("y", None)],
               [_vi("z", None)])
    s = InferenceSession(m)
    with pytest.raises(Exception, match="the_add") as e:
        s.run(None, {"x": np.zeros((2, 3), np.float32), "y": np.zeros((4, 5), np.float32)})
    assert "cannot be broadcast" in str(e.value) or "cannot be broadcast" in "".join(getattr(e.value, "__notes__", []))
    assert s.plan.device.kind == "cpu"


def test_io_binding_refuses_an_unbound_input():
    m = _model([helper.make_node("Add", ["x", "y"], ["z"])], [_vi("x", [4]), _vi("y", [4])], [_vi("z", [4])])
    s = InferenceSession(m)
    b = s.io_binding()
    b.bind_input("x", np.ones(4, np.float32))
    with pytest.raises(InvalidFeedError, match="'y'"):
        s.run_with_iobinding(b)
