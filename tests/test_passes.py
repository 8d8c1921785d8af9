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


# -- CUDA fusions (runtime/passes/cuda_fusions.py): graph rewrites only, no kernel runs here ---------------

def _mlp_nodes(act, order=0):
    """g = x @ Wg, u = x @ Wu, y = act(g) * u in the forms exports use."""
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wg"], ["g"]), n("MatMul", ["x", "wu"], ["u"])]
    if act == "silu":
        nodes += [n("Sigmoid", ["g"], ["s"]),
                  n("Mul", ["g", "s"] if order == 0 else ["s", "g"], ["a"])]
    elif act == "onnx_gelu":
        nodes += [n("Gelu", ["g"], ["a"], approximate="tanh")]
    elif act == "onnx_gelu_erf":
        nodes += [n("Gelu", ["g"], ["a"])]
    elif act == "ms_gelu":
        nodes += [n("Gelu", ["g"], ["a"], domain="com.microsoft")]
    elif act == "fast_gelu":
        nodes += [n("FastGelu", ["g"], ["a"], domain="com.microsoft")]
    nodes += [n("Mul", ["a", "u"] if order == 0 else ["u", "a"], ["y"])]
    return nodes


def _mlp_graph(act, order=0, weights_const=True, extra_outputs=(), u_shape=None):
    from runtime.ir import graph_from_proto as gfp
    w = np.ones((4, 6), np.float32)
    inits = [numpy_helper.from_array(w, "wg"), numpy_helper.from_array(w, "wu")] if weights_const else []
    inputs = [_vi("x", ["batch", 1, 4])] + ([] if weights_const else [_vi("wg", [4, 6]), _vi("wu", [4, 6])])
    nodes = _mlp_nodes(act, order)
    if u_shape is not None:  # u broadcast against the gate: not fusable
        nodes[1] = helper.make_node("MatMul", ["x1", "wu1"], ["u"])
        inputs.append(_vi("x1", u_shape[:-1] + [4]))
        inits.append(numpy_helper.from_array(np.ones((4, u_shape[-1]), np.float32), "wu1"))
    outs = [_vi("y", None)] + [_vi(o, None) for o in extra_outputs]
    g = gfp(helper.make_graph(nodes, "g", inputs, outs, inits), {"": 21, "com.microsoft": 1})
    InferShapes()(g)
    return g


@pytest.mark.parametrize("act,want", [("silu", "silu"), ("onnx_gelu", "gelu_tanh"), ("onnx_gelu_erf", "gelu"),
                                      ("ms_gelu", "gelu"), ("fast_gelu", "gelu_tanh")])
@pytest.mark.parametrize("order", [0, 1])
def test_gated_activation_and_matmul_fuse(act, want, order):
    from runtime.passes.cuda_fusions import FUSED_DOMAIN, FuseGatedActivation, FuseGatedMatMul
    g = _mlp_graph(act, order)
    assert FuseGatedActivation()(g).modified
    assert [(n.op_type, n.domain) for n in g.nodes] == [("MatMul", ""), ("MatMul", ""),
                                                        ("GatedActivation", FUSED_DOMAIN)]
    fused = g.nodes[-1]
    assert fused.inputs == ["g", "u"] and fused.outputs == ["y"] and fused.attrs == {"activation": want}
    assert not FuseGatedActivation()(g).modified
    assert FuseGatedMatMul()(g).modified
    assert [(n.op_type, n.inputs, n.outputs, n.attrs) for n in g.nodes] == \
        [("GatedMatMul", ["x", "wg", "wu"], ["y"], {"activation": want})]
    assert not FuseGatedMatMul()(g).modified


def test_gated_fusions_leave_what_they_cannot_prove():
    from runtime.passes.cuda_fusions import FuseGatedActivation, FuseGatedMatMul
    # The Sigmoid's result is a graph output: nothing is hidden, nothing fused.
    g = _mlp_graph("silu", extra_outputs=("s",))
    assert not FuseGatedActivation()(g).modified and len(g.nodes) == 5
    # A product read elsewhere (a graph output): the activation fuses, the MatMuls stay.
    for act, out in (("silu", "g"), ("fast_gelu", "u")):
        g = _mlp_graph(act, extra_outputs=(out,))
        assert FuseGatedActivation()(g).modified and not FuseGatedMatMul()(g).modified
        assert [n.op_type for n in g.nodes] == ["MatMul", "MatMul", "GatedActivation"]
    # Weights that are graph inputs: the activation fuses, the products are not constant.
    g = _mlp_graph("silu", weights_const=False)
    assert FuseGatedActivation()(g).modified and not FuseGatedMatMul()(g).modified
    # u broadcast against the gate (another shape): not fused.
    g = _mlp_graph("silu", u_shape=[1, 1, 6])
    assert not FuseGatedActivation()(g).modified


def _conv_bn(conv_bias: bool, second_reader: bool = False):
    """Conv (3x3, 4 -> 6 channels) then an inference BatchNormalization; optionally a Relu also reading the Conv."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 4, 3, 3)).astype(np.float32), "w")]
    conv_in = ["x", "w"]
    if conv_bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b"))
        conv_in.append("b")
    for name, v in (("scale", rng.random(6) + 0.5), ("bias", rng.standard_normal(6)), ("mean", rng.standard_normal(6)),
                    ("var", rng.random(6) + 0.1)):
        inits.append(numpy_helper.from_array(v.astype(np.float32), name))
    nodes = [helper.make_node("Conv", conv_in, ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"], name="bn",
                              epsilon=1e-3)]
    outs = [_vi("y", [1, 6, 5, 5])]
    if second_reader:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        outs.append(_vi("r", [1, 6, 5, 5]))
    g = helper.make_graph(nodes, "g", [_vi("x", [1, 4, 5, 5])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("conv_bias", [True, False])
def test_batchnorm_folds_into_the_conv_as_onnxruntime_folds_it(conv_bias):
    """The fused Conv gives onnxruntime's fused result (the same float steps: ConvBNFusion) within the
    convolution's own rounding, and the BatchNormalization and the unfused weights are gone."""
    import onnxruntime as ort
    from runtime.passes.conv_fusions import FuseConvBatchNorm
    m = _conv_bn(conv_bias)
    x = np.random.default_rng(4).standard_normal((1, 4, 5, 5)).astype(np.float32)
    sess = InferenceSession(m)
    assert [n.op_type for n in sess._graph.nodes] == ["Conv"] and sess._graph.nodes[0].name == "conv"
    assert not {"w", "b"} & set(sess._graph.initializers)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-5, atol=1e-5)
    off = InferenceSession(m, disabled_optimizers=["ConvBNFusion"])
    assert [n.op_type for n in off._graph.nodes] == ["Conv", "BatchNormalization"]
    g = graph_from_proto(__import__("onnx").load_from_string(m).graph, {"": 17})
    assert FuseConvBatchNorm()(g).modified and not FuseConvBatchNorm()(g).modified


def test_batchnorm_stays_when_the_conv_output_has_another_reader():
    from runtime.passes.conv_fusions import FuseConvBatchNorm
    import onnx
    g = graph_from_proto(onnx.load_from_string(_conv_bn(True, second_reader=True)).graph, {"": 17})
    assert not FuseConvBatchNorm()(g).modified
    assert [n.op_type for n in g.nodes] == ["Conv", "BatchNormalization", "Relu"]


def _conv_act(act: str, extra_reader: str = "", depthwise: bool = False):
    """Conv (3x3, 4 -> 16 channels, 10x10; ``depthwise``: 4 -> 4, one filter per channel) then ``act`` (SiLU:
    Sigmoid then Mul); ``extra_reader`` "conv" or "sigmoid" adds a Relu reading that value as a second graph
    output."""
    rng = np.random.default_rng(5)
    M = 4 if depthwise else 16
    inits = [numpy_helper.from_array(rng.standard_normal((M, 1 if depthwise else 4, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(M).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
             numpy_helper.from_array(np.array(1.5, np.float32), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1],
                              group=4 if depthwise else 1)]
    if act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    elif act == "HardSwishRelu6":
        nodes += _hardswish_relu6_nodes("c", "y")
        inits += _hardswish_relu6_constants()
    else:
        ins = {"Clip": ["c", "lo", "hi"], "ClipHigh": ["c", "", "hi"]}.get(act, ["c"])
        attrs = {"LeakyRelu": dict(alpha=0.2), "HardSigmoid": dict(alpha=0.3, beta=0.4)}.get(act, {})
        nodes.append(helper.make_node(act.replace("ClipHigh", "Clip"), ins, ["y"], **attrs))
    outs = [_vi("y", [1, M, 10, 10])]
    if extra_reader:
        nodes.append(helper.make_node("Relu", [{"conv": "c", "sigmoid": "s"}[extra_reader]], ["r"]))
        outs.append(_vi("r", [1, M, 10, 10]))
    g = helper.make_graph(nodes, "g", [_vi("x", [1, 4, 10, 10])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _hardswish_relu6_nodes(x: str, y: str, add_to: str = "three"):
    """y = x * Clip(x + 3, 0, 6) / 6 as Paddle exports write it (the Add's constant named ``add_to``)."""
    return [helper.make_node("Add", [x, add_to], [f"{y}_a"]), helper.make_node("Clip", [f"{y}_a", "zero", "six"], [f"{y}_c"]),
            helper.make_node("Mul", [x, f"{y}_c"], [f"{y}_m"]), helper.make_node("Div", [f"{y}_m", "six"], [y])]


def _hardswish_relu6_constants():
    return [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
            (("three", 3.0), ("zero", 0.0), ("six", 6.0), ("two", 2.0))]


@pytest.mark.parametrize("path", ["im2col", "shifted", "few", "depthwise", "depthwise_tiles"])
@pytest.mark.parametrize("act", ["Relu", "LeakyRelu", "Clip", "ClipHigh", "HardSigmoid", "HardSwish", "Sigmoid",
                                 "Tanh", "SiLU", "HardSwishRelu6"])
def test_conv_activation_fuses_into_one_node_with_the_same_bits(monkeypatch, act, path):
    """Conv and its activation become one onnx_numba.FusedConv whose float32 result is the unfused graph's bit for
    bit, with the activation applied after the whole convolution, per tile of the shifted-row products, per
    output of the few-pixel product, after a depthwise convolution or per output row of the depthwise tiles
    (each forced on or off, whatever the host), within 1e-5 of onnxruntime and 1e-4 of the ONNX reference
    evaluator."""
    import onnxruntime as ort
    from ops import _shifted, conv
    monkeypatch.setattr(conv, "SHIFTED_CONV", path == "shifted")
    monkeypatch.setattr(conv, "SHIFTED_MIN_MACS", 0)
    monkeypatch.setattr(conv, "SHIFTED_MIN_PIXELS", 0)
    monkeypatch.setattr(conv, "FEW_PIXELS", 128 if path == "few" else 0)  # the output has 100 pixels
    monkeypatch.setattr(conv, "SHIFTED_DEPTHWISE", path == "depthwise_tiles")
    calls = []
    module, name = {"shifted": (_shifted, "conv2d"), "depthwise": (conv, "_depthwise"),
                    "depthwise_tiles": (_shifted, "depthwise2d")}.get(path, (conv, "_few_pixels"))
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: (calls.append(1), real(*a))[1])
    m = _conv_act(act, depthwise=path.startswith("depthwise"))
    x = (np.random.default_rng(6).standard_normal((1, 4, 10, 10)) * 0.3).astype(np.float32)
    sess = InferenceSession(m)
    assert [(n.domain, n.op_type) for n in sess._graph.nodes] == [("onnx_numba", "FusedConv")]
    off = InferenceSession(m, disabled_optimizers=["ConvActivationFusion"])
    assert "FusedConv" not in [n.op_type for n in off._graph.nodes]
    (y,), (want,) = sess.run(None, {"x": x}), off.run(None, {"x": x})
    assert bool(calls) == (path != "im2col")
    np.testing.assert_array_equal(y, want)
    (ref,) = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    from onnx.reference import ReferenceEvaluator  # the convolutions' own tolerance (tests/test_ops_conv.py)
    np.testing.assert_allclose(y, ReferenceEvaluator(m).run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act,reader", [("Relu", "conv"), ("SiLU", "conv"), ("SiLU", "sigmoid")])
def test_conv_activation_stays_apart_when_a_hidden_value_has_another_reader(act, reader):
    import onnx
    from runtime.passes.conv_fusions import FuseConvActivation
    g = graph_from_proto(onnx.load_from_string(_conv_act(act, reader)).graph, {"": 17})
    assert not FuseConvActivation()(g).modified



@pytest.mark.parametrize("add_to,fused", [("three", True), ("two", False)])
def test_hardswish_written_as_four_nodes_runs_as_one_with_their_bits(add_to, fused):
    """x * Clip(x + 3, 0, 6) / 6 over a graph input becomes one onnx_numba.HardSwishRelu6 giving the four nodes'
    float32 bits, NaN, infinities and signed zeros included, and within 1e-6 of onnxruntime and the ONNX reference
    evaluator; with another constant it stays four nodes."""
    import onnxruntime as ort
    g = helper.make_graph(_hardswish_relu6_nodes("x", "y", add_to), "g", [_vi("x", [3, 50, 40])],
                          [_vi("y", [3, 50, 40])], _hardswish_relu6_constants())
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    x = (np.random.default_rng(7).standard_normal((3, 50, 40)) * 4).astype(np.float32)
    x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, -3.0]
    sess = InferenceSession(m)
    ops = [(n.domain, n.op_type) for n in sess._graph.nodes]
    assert (ops == [("onnx_numba", "HardSwishRelu6")]) == fused and (len(ops) == 4) != fused
    (y,) = sess.run(None, {"x": x})
    (want,) = InferenceSession(m, disabled_optimizers=["FuseHardSwishRelu6"]).run(None, {"x": x})
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    (ref,) = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    from onnx.reference import ReferenceEvaluator
    np.testing.assert_allclose(y, ReferenceEvaluator(m).run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)


def _conv_add(act: str, z_shape, bias: bool = True):
    """x -> Conv(3x3, pad 1) -> Add(z) [-> act]: a residual block's end."""
    rng = np.random.default_rng(5)
    ins = ["x", "w"] + (["b"] if bias else [])
    nodes = [helper.make_node("Conv", ins, ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["z", "c"], ["s" if act else "y"])]
    if act == "Clip":
        nodes.append(helper.make_node("Clip", ["s", "lo", "hi"], ["y"]))
    elif act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["s"], ["g"]), helper.make_node("Mul", ["g", "s"], ["y"])]
    elif act == "Gelu":
        nodes.append(helper.make_node("Gelu", ["s"], ["y"], domain="com.microsoft"))
    elif act:
        nodes.append(helper.make_node(act, ["s"], ["y"]))
    inits = [numpy_helper.from_array(rng.standard_normal((6, 4, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b"),
             numpy_helper.from_array(np.float32(-0.5), "lo"), numpy_helper.from_array(np.float32(0.7), "hi")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 9, 11]),
                                       helper.make_tensor_value_info("z", TensorProto.FLOAT, list(z_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("act,z_shape,bias", [("Relu", (2, 6, 9, 11), True), ("", (2, 6, 9, 11), False),
                                              ("Clip", (2, 6, 9, 11), True), ("Sigmoid", (1, 6, 1, 1), True),
                                              ("SiLU", (2, 6, 9, 11), True), ("Gelu", (2, 6, 9, 11), True)])
def test_conv_add_activation_is_one_node_with_the_same_bits(tmp_path, act, z_shape, bias):
    """The residual Add and the activation after a Conv run in one pass after it (a Z of another shape is
    broadcast as the Add would): the bits of the unfused nodes, and an optimized model onnxruntime loads."""
    import onnxruntime
    model = _conv_add(act, z_shape, bias)
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((2, 4, 9, 11)).astype(np.float32),
             "z": rng.standard_normal(z_shape).astype(np.float32)}
    so = SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "fused.onnx")
    fused = InferenceSession(model, so)
    plain = InferenceSession(model, disabled_optimizers=["ConvAddActivationFusion"])
    assert [n.op_type for n in fused._graph.nodes] == ["FusedConv"]
    assert fused._graph.nodes[0].inputs[3] == "z"
    got = fused.run(None, feeds)[0]
    np.testing.assert_array_equal(got, plain.run(None, feeds)[0])
    ref = onnxruntime.InferenceSession(so.optimized_model_filepath, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, ref.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_conv_add_stays_apart_when_the_conv_output_has_another_reader():
    model = _conv_add("Relu", (2, 6, 9, 11))
    import onnx
    m = onnx.load_from_string(model)
    m.graph.output.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, None))
    s = InferenceSession(m.SerializeToString())
    assert "Add" in [n.op_type for n in s._graph.nodes]


def test_a_gelu_written_out_after_a_conv_joins_it():
    """Conv, then Gelu in its erf form: FuseGelu first, then the Conv takes the Gelu in its epilogue, with the
    bits of the Conv followed by com.microsoft's Gelu."""
    rng = np.random.default_rng(8)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Div", ["c", "s2"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["c", "a"], ["h"]),
             helper.make_node("Mul", ["h", "half"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((5, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.float32(np.sqrt(2.0)), "s2"), numpy_helper.from_array(np.float32(1), "one"),
             numpy_helper.from_array(np.float32(0.5), "half")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    model = m.SerializeToString()
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    fused = InferenceSession(model)
    assert [(n.op_type, n.attrs.get("activation")) for n in fused._graph.nodes] == [("FusedConv", "Gelu")]
    apart = InferenceSession(model, disabled_optimizers=["ConvActivationFusion"])
    assert [n.op_type for n in apart._graph.nodes] == ["Conv", "Gelu"]
    np.testing.assert_array_equal(fused.run(None, {"x": x})[0], apart.run(None, {"x": x})[0])


def test_conv_add_whose_residual_is_computed_after_the_conv():
    """The residual Z is produced by a node after the Conv (a shortcut branch exported second): the fused node
    takes the Add's place, where Z exists, with the unfused bits."""
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["z"]),
             helper.make_node("Add", ["c", "z"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((6, 4, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((6, 4, 1, 1)).astype(np.float32), "w2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    model = m.SerializeToString()
    x = rng.standard_normal((1, 4, 7, 7)).astype(np.float32)
    fused = InferenceSession(model)
    assert sum(n.op_type == "FusedConv" and len(n.inputs) > 3 for n in fused._graph.nodes) == 1
    plain = InferenceSession(model, disabled_optimizers=["ConvAddActivationFusion", "ConvActivationFusion"])
    np.testing.assert_array_equal(fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])
