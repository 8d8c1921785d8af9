"""Write an optimized graph as an ONNX model that onnxruntime (and this runtime) can load.

``SessionOptions.optimized_model_filepath`` saves the graph the session runs: folded, simplified and fused.
The fusions' ops (domain ``onnx_numba``) are not ONNX ops, so each fused node is written as a call of a
model-local function whose body is the standard ops it replaced (one function per op and variant, e.g.
``GatedActivation_silu_2``); a loader that knows the op may use it, any other inlines the body.  A fused node
whose attributes differ from node to node (``FusedConv``: a Conv's pads, strides and groups) is written back as
the standard nodes it replaced instead, as are ``HardSwishRelu6`` and ``ScaledDotAttention`` (its scale).  An op of the domain with no known body makes
saving fail with its name, rather than writing a model nobody can load.

Initializers of at least ``min_external_bytes`` go to ``external_file`` beside the model when one is named
(onnxruntime's ``session.optimized_model_external_initializers_*`` config entries).
"""
from __future__ import annotations

import os

import onnx
from onnx import helper

from .errors import NotSupportedError
from .ir import Graph, model_to_proto

__all__ = ["save_model", "FUSED_DOMAIN"]

FUSED_DOMAIN = "onnx_numba"


def _gated_body(activation: str, n_inputs: int, opset: int) -> list:
    """Nodes computing ``act(g) * u`` from inputs ``g, u`` (or ``gu`` split in halves) into ``y``."""
    nodes = []
    if n_inputs == 1:
        split = {"num_outputs": 2} if opset >= 18 else {}
        nodes.append(helper.make_node("Split", ["gu"], ["g", "u"], axis=-1, **split))
    if activation == "silu":
        nodes += [helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", ["g", "s"], ["a"])]
    elif activation in ("gelu", "gelu_tanh"):
        if opset >= 20:
            nodes.append(helper.make_node("Gelu", ["g"], ["a"],
                                          approximate="tanh" if activation == "gelu_tanh" else "none"))
        elif activation == "gelu":  # 0.5 g (1 + erf(g / sqrt 2))
            nodes += [helper.make_node("Constant", [], ["c"], value_float=0.7071067811865476),
                      helper.make_node("CastLike", ["c", "g"], ["ct"]),
                      helper.make_node("Mul", ["g", "ct"], ["gs"]), helper.make_node("Erf", ["gs"], ["e"]),
                      *_plus_one_half("e", "g")]
        else:  # 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
            nodes += [helper.make_node("Constant", [], ["k0"], value_float=0.044715),
                      helper.make_node("Constant", [], ["k1"], value_float=0.7978845608028654),
                      helper.make_node("CastLike", ["k0", "g"], ["k0t"]),
                      helper.make_node("CastLike", ["k1", "g"], ["k1t"]),
                      helper.make_node("Mul", ["g", "g"], ["g2"]), helper.make_node("Mul", ["g2", "g"], ["g3"]),
                      helper.make_node("Mul", ["g3", "k0t"], ["t0"]), helper.make_node("Add", ["g", "t0"], ["t1"]),
                      helper.make_node("Mul", ["t1", "k1t"], ["t2"]), helper.make_node("Tanh", ["t2"], ["e"]),
                      *_plus_one_half("e", "g")]
    else:
        raise NotSupportedError(f"GatedActivation activation {activation!r} has no ONNX function body")
    nodes.append(helper.make_node("Mul", ["a", "u"], ["y"]))
    return nodes


def _plus_one_half(e: str, g: str) -> list:
    """Nodes for ``a = 0.5 * g * (1 + e)``."""
    return [helper.make_node("Constant", [], ["one"], value_float=1.0),
            helper.make_node("Constant", [], ["half"], value_float=0.5),
            helper.make_node("CastLike", ["one", g], ["onet"]), helper.make_node("CastLike", ["half", g], ["halft"]),
            helper.make_node("Add", [e, "onet"], ["e1"]), helper.make_node("Mul", [g, "halft"], ["gh"]),
            helper.make_node("Mul", ["gh", "e1"], ["a"])]


def _scalar(name: str, value: float):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, onnx.TensorProto.FLOAT, [],
                                                                             [value]))


def _activation_nodes(act: str, params: list, x: str, y: str, opset: int) -> list:
    """Standard nodes computing ``y = act(x)`` for an activation of ``onnx_numba.FusedConv`` (or HardSwishRelu6)."""
    p = list(params) + [0.0, 0.0]
    if act in ("Relu", "Sigmoid", "Tanh"):
        return [helper.make_node(act, [x], [y])]
    if act == "LeakyRelu":
        return [helper.make_node(act, [x], [y], alpha=p[0])]
    if act == "HardSigmoid":
        return [helper.make_node(act, [x], [y], alpha=p[0], beta=p[1])]
    if act == "HardSwish":
        if opset >= 14:
            return [helper.make_node(act, [x], [y])]
        return [helper.make_node("HardSigmoid", [x], [y + "__hs"], alpha=p[0], beta=p[1]),
                helper.make_node("Mul", [x, y + "__hs"], [y])]
    if act == "Clip":
        if opset < 11:
            return [helper.make_node(act, [x], [y], min=p[0], max=p[1])]
        return [_scalar(y + "__lo", p[0]), _scalar(y + "__hi", p[1]),
                helper.make_node(act, [x, y + "__lo", y + "__hi"], [y])]
    if act == "SiLU":
        return [helper.make_node("Sigmoid", [x], [y + "__s"]), helper.make_node("Mul", [x, y + "__s"], [y])]
    if act == "Gelu":
        return [helper.make_node("Gelu", [x], [y], domain="com.microsoft")]
    if act == "HardSwishRelu6":
        return [_scalar(y + "__3", 3.0), _scalar(y + "__0", 0.0), _scalar(y + "__6", 6.0),
                helper.make_node("Add", [x, y + "__3"], [y + "__a"]),
                helper.make_node("Clip", [y + "__a", y + "__0", y + "__6"], [y + "__c"]),
                helper.make_node("Mul", [x, y + "__c"], [y + "__m"]), helper.make_node("Div", [y + "__m", y + "__6"], [y])]
    raise NotSupportedError(f"FusedConv activation {act!r} has no ONNX form")


def _unfused(node, opset: int) -> list:
    """The standard nodes a ``FusedConv``, ``HardSwishRelu6`` or ``ScaledDotAttention`` node replaced."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    y = node.output[0]
    if node.op_type == "ScaledDotAttention":
        q, k, v = node.input
        out = [helper.make_node("Transpose", [k], [y + "__kt"], perm=[0, 1, 3, 2]),
               helper.make_node("MatMul", [q, y + "__kt"], [y + "__s"], name=node.name or None)]
        scores = y + "__s"
        if float(attrs.get("scale", 1.0)) != 1.0:
            out += [helper.make_node("Constant", [], [y + "__c"], value=helper.make_tensor(
                        y + "__c", onnx.TensorProto.FLOAT, [], [float(attrs["scale"])])),
                    helper.make_node("Mul", [scores, y + "__c"], [y + "__ss"])]
            scores = y + "__ss"
        return out + [helper.make_node("Softmax", [scores], [y + "__p"], axis=int(attrs.get("axis", -1))),
                      helper.make_node("MatMul", [y + "__p", v], [y])]
    if node.op_type == "HardSwishRelu6":
        return _activation_nodes("HardSwishRelu6", [], node.input[0], y, opset)
    act = attrs.pop("activation", b"")
    act = act.decode() if isinstance(act, bytes) else act
    params = attrs.pop("activation_params", [])
    ins = list(node.input)
    if len(ins) > 3 and ins[3]:  # the residual Add (FuseConvAddActivation)
        conv = helper.make_node("Conv", [i for i in ins[:3] if i], [y + "__conv"], name=node.name or None, **attrs)
        if not act:
            return [conv, helper.make_node("Add", [y + "__conv", ins[3]], [y])]
        return [conv, helper.make_node("Add", [y + "__conv", ins[3]], [y + "__sum"])] + \
            _activation_nodes(act, params, y + "__sum", y, opset)
    conv = helper.make_node("Conv", ins, [y + "__conv"], name=node.name or None, **attrs)
    return [conv] + _activation_nodes(act, params, y + "__conv", y, opset)


def _functions(model: onnx.ModelProto, opset: int) -> list:
    """Rename each fused node to its variant's function and return the functions' definitions (nodes written
    back as standard ones, ``_unfused``, first)."""
    nodes = []
    for node in model.graph.node:
        if node.domain == FUSED_DOMAIN and node.op_type in ("FusedConv", "HardSwishRelu6", "ScaledDotAttention"):
            nodes += _unfused(node, opset)
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    defined: dict = {}
    for node in model.graph.node:
        if node.domain != FUSED_DOMAIN:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "GatedActivation":
            raise NotSupportedError(f"node {node.name!r}: the fused op {FUSED_DOMAIN}::{node.op_type} has no ONNX "
                                    f"function body, so the optimized model cannot be saved; lower "
                                    f"graph_optimization_level to ORT_ENABLE_BASIC to save it")
        act = attrs.get("activation", "silu")
        act = act.decode() if isinstance(act, bytes) else act
        name = f"GatedActivation_{act}_{len(node.input)}"
        if name not in defined:
            ins = ["gu"] if len(node.input) == 1 else ["g", "u"]
            body = _gated_body(act, len(ins), opset)
            if opset < 15:  # no CastLike: the constants are float32, as the fused float32 gate is
                body = [helper.make_node("Identity", [n.input[0]], list(n.output)) if n.op_type == "CastLike" else n
                        for n in body]
            defined[name] = helper.make_function(FUSED_DOMAIN, name, ins, ["y"], body,
                                                 [helper.make_opsetid("", opset)])
        node.op_type = name
        del node.attribute[:]
    return list(defined.values())


def save_model(graph: Graph, path: str, external_file: str | None = None, min_external_bytes: int = 1024) -> None:
    """Write ``graph`` to ``path`` (see the module docstring)."""
    model = model_to_proto(graph)
    opset = graph.opsets.get("", 1)
    funcs = _functions(model, opset)
    declared = {o.domain for o in model.opset_import}
    for domain in sorted({n.domain for n in model.graph.node if n.domain and n.domain != FUSED_DOMAIN} - declared):
        model.opset_import.append(helper.make_opsetid(domain, 1))  # (com.microsoft: a written-back Gelu)
    if funcs:
        model.functions.extend(funcs)
        if not any(o.domain == FUSED_DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(FUSED_DOMAIN, 1))
    meta = getattr(graph, "model_meta", None) or {}
    model.producer_name = "onnx-numba"
    if meta:
        model.doc_string = meta.get("description", "")
        model.domain = meta.get("domain", "")
        for k, v in meta.get("custom_metadata_map", {}).items():
            model.metadata_props.add(key=k, value=v)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    if external_file:
        if os.path.isabs(external_file) or os.path.normpath(external_file).startswith(".."):
            raise ValueError(f"external initializers file {external_file!r} must be a relative path beside the "
                             f"optimized model")
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=external_file, size_threshold=int(min_external_bytes))
    else:
        onnx.save_model(model, path)
