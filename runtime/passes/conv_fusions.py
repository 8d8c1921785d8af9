"""Fusions of a convolution with what follows it, as onnxruntime's basic and extended optimizations do.

``FuseConvBatchNorm`` folds an inference ``BatchNormalization`` into the ``Conv`` that feeds it: with
``alpha = scale / sqrt(var + epsilon)`` per output channel, the weights become ``W * alpha`` (along the output
channels) and the bias ``(B - mean) * alpha + bias`` (``bias - mean * alpha`` when the Conv has none), each
step in the weights' float type, in onnxruntime's order (``ConvBNFusion``), so the fused model computes what
onnxruntime's fused model computes.  A whole normalization pass over the activations is saved per pair.

``FuseConvActivation`` rewrites a ``Conv`` followed by an activation into one ``onnx_numba.FusedConv`` (the
Conv's inputs and attributes, plus ``activation`` and ``activation_params`` as com.microsoft's FusedConv takes
them), whose kernel applies the activation to each tile of the output while it is in cache instead of in a
second pass over memory (``ops/_shifted.py``): Relu, LeakyRelu, Clip (constant bounds), HardSigmoid, HardSwish,
Sigmoid, Tanh, SiLU (``Mul(y, Sigmoid(y))`` in either operand order) and com.microsoft's erf ``Gelu``.  The
activation is its op's own expression, so the fused node gives the bits of the nodes it replaces for float32.
``FuseConvAddActivation`` does the same for a Conv followed by a residual ``Add`` (and, optionally, one of
those activations): the Add and the activation run in one pass after the convolution.

``FuseHardSwishRelu6`` first rewrites ``Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)`` (either Mul operand order;
float32 scalar constants of exactly those values), the HardSwish that Paddle exports write as four nodes, into
one ``onnx_numba.HardSwishRelu6(x)`` that computes the same four float32 steps in one pass;
``FuseConvActivation`` then takes it into a Conv that produces ``x`` like any other activation.  onnxruntime
runs the four nodes as they are.

Invariants:
- HardSwishRelu6 is fused only when the Add, Clip and Mul results are read by the next node of the pattern
  alone and are not graph outputs, and ``x`` is float32 (the Add's constant is);
- an activation is fused only when the Conv's output is read by the activation's nodes alone and is not a graph
  output, and (SiLU) the Sigmoid's output by the Mul alone; the fused node keeps the Conv's name and produces
  the activation's output value;
- fused only when the Conv's output is read by the BatchNormalization alone and is not a graph output, the
  BatchNormalization is in inference form (one output, no ``training_mode``, ``spatial`` 1), and the weights,
  Conv bias and the four statistics are float32 or float64 initializers of the shapes the ops require;
- the fused Conv keeps its name and attributes and produces the BatchNormalization's output value;
  the new weights get new initializer names (the old ones are dropped by dead-node elimination when nothing
  else reads them), so a weight shared with another node is never changed under it.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .base import Pass, PassResult
from .cuda_fusions import _readers

__all__ = ["FuseConvActivation", "FuseConvAddActivation", "FuseConvBatchNorm", "FuseHardSwishRelu6",
           "ONNXRUNTIME_NAMES"]

_STD = ("", "ai.onnx")
_MS = "com.microsoft"
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# onnxruntime's names of these optimizers (InferenceSession's ``disabled_optimizers``)
ONNXRUNTIME_NAMES = {"ConvBNFusion": "FuseConvBatchNorm", "ConvActivationFusion": "FuseConvActivation",
                     "ConvAddActivationFusion": "FuseConvAddActivation"}
# (FuseHardSwishRelu6 has no onnxruntime counterpart: it is disabled by its own name)
FUSED_DOMAIN = "onnx_numba"
_INF = float("inf")


def _links(graph: Graph):
    """(value name -> how many inputs read it, value name -> the node that writes it)."""
    return _readers(graph), {o: n for n in graph.nodes for o in n.outputs if o}


class FuseConvBatchNorm(Pass):
    name = "fuse_conv_batchnorm"

    def call(self, graph: Graph) -> PassResult:
        readers, producer = _links(graph)
        inits = graph.initializers
        fused, drop = [], set()
        for bn in graph.nodes:
            conv = self._pair(bn, producer, readers, inits)
            if conv is None:
                continue
            w, b = inits[conv.inputs[1]], inits[conv.inputs[2]] if len(conv.inputs) > 2 and conv.inputs[2] else None
            scale, bias, mean, var = (inits[x] for x in bn.inputs[1:5])
            eps = w.dtype.type(bn.attrs.get("epsilon", 1e-5))
            alpha = scale / np.sqrt(var + eps)
            new_w = (w * alpha.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
            new_b = ((b - mean) * alpha + bias if b is not None else bias - mean * alpha).astype(w.dtype)
            wname, bname = self._fresh(inits, f"{bn.name or bn.outputs[0]}_fused_W"), None
            inits[wname] = np.ascontiguousarray(new_w)
            bname = self._fresh(inits, f"{bn.name or bn.outputs[0]}_fused_B")
            inits[bname] = np.ascontiguousarray(new_b)
            conv.inputs = [conv.inputs[0], wname, bname]
            conv.outputs = [bn.outputs[0]]
            drop.add(id(bn))
            fused.append(conv.name)
        if not fused:
            return PassResult(False)
        graph.nodes = [n for n in graph.nodes if id(n) not in drop]
        return PassResult(True, fused)

    @staticmethod
    def _pair(bn: Node, producer: dict, readers: dict, inits: dict):
        """The Conv that ``bn`` can be folded into, or None."""
        if bn.op_type != "BatchNormalization" or bn.domain not in _STD or len(bn.inputs) < 5:
            return None
        if len([o for o in bn.outputs if o]) != 1 or bn.attrs.get("training_mode", 0) or \
                bn.attrs.get("spatial", 1) != 1:
            return None
        conv = producer.get(bn.inputs[0])
        if conv is None or conv.op_type != "Conv" or conv.domain not in _STD or len(conv.outputs) != 1:
            return None
        if readers.get(conv.outputs[0], 0) != 1 or len(conv.inputs) < 2:
            return None
        names = [conv.inputs[1]] + ([conv.inputs[2]] if len(conv.inputs) > 2 and conv.inputs[2] else []) \
            + list(bn.inputs[1:5])
        if not all(x in inits and inits[x].dtype in _FLOATS for x in names):
            return None
        w = inits[conv.inputs[1]]
        if w.ndim < 3 or any(inits[x].dtype != w.dtype for x in names):
            return None
        m = w.shape[0]
        return conv if all(inits[x].shape == (m,) for x in names[1:]) else None

    @staticmethod
    def _fresh(inits: dict, name: str) -> str:
        k, out = 0, name
        while out in inits:
            k += 1
            out = f"{name}_{k}"
        return out


def _f32(v) -> float:
    return float(np.float32(v))


class FuseConvActivation(Pass):
    name = "fuse_conv_activation"

    def call(self, graph: Graph) -> PassResult:
        readers, producer = _links(graph)
        drop, replace = set(), {}
        for node in graph.nodes:
            if id(node) in drop or node.domain not in _STD + (FUSED_DOMAIN, _MS):
                continue
            m = self._match(node, producer, readers, graph.initializers)
            if m is None or id(m[0]) in replace or id(m[0]) in drop:
                continue
            conv, act, params, hidden = m
            attrs = dict(conv.attrs, activation=act)
            if params:  # (an empty list is no ONNX attribute: its type cannot be told)
                attrs["activation_params"] = params
            replace[id(conv)] = Node("FusedConv", list(conv.inputs), [node.outputs[0]], attrs, conv.name,
                                     FUSED_DOMAIN, 1)
            drop.update(id(h) for h in hidden)
        if not replace:
            return PassResult(False)
        graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
        return PassResult(True, [n.name or n.outputs[0] for n in replace.values()])

    @staticmethod
    def _conv(name, producer, readers, n_readers):
        conv = producer.get(name)
        if conv is None or conv.op_type != "Conv" or conv.domain not in _STD or len(conv.outputs) != 1:
            return None
        return conv if readers.get(name, 0) == n_readers else None

    def _match(self, node, producer, readers, inits):
        """(conv, activation, params, nodes hidden) when ``node`` ends a Conv-and-activation pattern."""
        op = node.op_type
        if op == "Mul" and len(node.inputs) == 2:  # SiLU: Mul(y, Sigmoid(y))
            for k in (0, 1):
                sig = producer.get(node.inputs[1 - k])
                y = node.inputs[k]
                if sig is None or sig.op_type != "Sigmoid" or sig.domain not in _STD or sig.inputs[0] != y or \
                        readers.get(sig.outputs[0], 0) != 1:
                    continue
                conv = self._conv(y, producer, readers, 2)
                if conv is not None:
                    return conv, "SiLU", [], [sig, node]
            return None
        if not node.inputs or not node.inputs[0]:
            return None
        if node.domain == FUSED_DOMAIN:
            if op != "HardSwishRelu6":
                return None
            params = []
        elif node.domain == _MS:  # the erf Gelu (FuseGelu writes it so), in its kernel's float32 steps
            if op != "Gelu" or len(node.inputs) != 1:
                return None
            params = []
        elif op in ("Relu", "Sigmoid", "Tanh"):
            params = []
        elif op == "HardSwish":  # x * HardSigmoid(x) with alpha 1/6 and beta 0.5
            params = [_f32(1 / 6), 0.5]
        elif op == "LeakyRelu":
            params = [_f32(node.attrs.get("alpha", 0.01))]
        elif op == "HardSigmoid":
            params = [_f32(node.attrs.get("alpha", 0.2)), _f32(node.attrs.get("beta", 0.5))]
        elif op == "Clip":
            params = self._clip_bounds(node, inits)
            if params is None:
                return None
        else:
            return None
        conv = self._conv(node.inputs[0], producer, readers, 1)
        return None if conv is None else (conv, op, params, [node])

    @staticmethod
    def _clip_bounds(node, inits):
        """[min, max] of a Clip with constant bounds (attributes before opset 11, scalar initializers after)."""
        if node.opset and node.opset < 11:
            return [_f32(node.attrs.get("min", -_INF)), _f32(node.attrs.get("max", _INF))]
        bounds = [-_INF, _INF]
        for i in (1, 2):
            if len(node.inputs) > i and node.inputs[i]:
                v = inits.get(node.inputs[i])
                if v is None or v.size != 1 or v.dtype != np.float32:
                    return None
                bounds[i - 1] = float(v.reshape(-1)[0])
        return bounds


class FuseConvAddActivation(Pass):
    """``act(Add(Conv(X, W, B), Z))`` (a residual block's end; the activation optional, any of
    ``FuseConvActivation``'s, SiLU included) into ``onnx_numba.FusedConv(X, W, B, Z, activation=act)``: the Add and the
    activation in one pass over the convolution's output, as onnxruntime's ``ConvAddActivationFusion``.  Fused
    only when Z and the Conv's output are float32, the Conv's output is read by the Add alone and the Add's by
    the activation alone (neither a graph output); a Z of another shape is broadcast at run time as the Add
    would broadcast it."""
    name = "fuse_conv_add_activation"

    def call(self, graph: Graph) -> PassResult:
        readers, producer = _links(graph)
        outputs = {v.name for v in graph.outputs}
        drop, replace = set(), {}
        for node in reversed(graph.nodes):  # (an activation before the Add it follows: the longer pattern first)
            if id(node) in drop or id(node) in replace or node.domain not in _STD + (_MS,):
                continue
            m = self._match(node, producer, readers, outputs, graph)
            if m is None or id(m[0]) in replace or id(m[0]) in drop:
                continue
            conv, z, act, params, hidden = m
            attrs = dict(conv.attrs, activation=act)
            if params:
                attrs["activation_params"] = params
            ins = list(conv.inputs) + [""] * (3 - len(conv.inputs)) + [z]
            # In the last node's place: Z may be produced after the Conv (a shortcut branch exported second).
            replace[id(node)] = Node("FusedConv", ins, [node.outputs[0]], attrs, conv.name, FUSED_DOMAIN, 1)
            drop.update(id(h) for h in [conv] + hidden if h is not node)
        if not replace:
            return PassResult(False)
        graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
        return PassResult(True, [n.name or n.outputs[0] for n in replace.values()])

    def _match(self, node, producer, readers, outputs, graph):
        act, params, hidden, add = "", [], [], node
        if node.op_type == "Mul" and len(node.inputs) == 2:  # SiLU: Mul(s, Sigmoid(s)) with s the Add's output
            for k in (0, 1):
                sig, s = producer.get(node.inputs[1 - k]), node.inputs[k]
                if sig is not None and sig.op_type == "Sigmoid" and sig.domain in _STD and sig.inputs[0] == s \
                        and readers.get(sig.outputs[0], 0) == 1 and sig.outputs[0] not in outputs:
                    add = producer.get(s)
                    if add is not None and add.op_type == "Add" and add.domain in _STD and len(add.outputs) == 1 \
                            and readers.get(s, 0) == 2 and s not in outputs:
                        act, hidden = "SiLU", [node, sig]
                        break
            else:
                return None
        elif node.op_type != "Add":
            add = producer.get(node.inputs[0]) if node.inputs else None
            if add is None or add.op_type != "Add" or add.domain not in _STD or len(add.outputs) != 1 \
                    or readers.get(add.outputs[0], 0) != 1 or add.outputs[0] in outputs:
                return None
            act, params = self._activation(node, graph.initializers)
            if act is None:
                return None
            hidden = [node]
        if len(add.inputs) != 2:
            return None
        for k in (0, 1):
            y, z = add.inputs[k], add.inputs[1 - k]
            conv = producer.get(y)
            if conv is None or conv.op_type != "Conv" or conv.domain not in _STD or len(conv.outputs) != 1 \
                    or readers.get(y, 0) != 1 or y in outputs:
                continue
            vy, vz = graph.value_info.get(y), graph.value_info.get(z)
            if vy is None or vz is None or vy.dtype != np.float32 or vz.dtype != np.float32:
                continue
            return conv, z, act, params, hidden + [add]
        return None

    @staticmethod
    def _activation(node, inits):
        """(name, params) of an activation ``FuseConvActivation`` fuses (SiLU aside), else (None, None)."""
        op = node.op_type
        if node.domain == _MS:
            return ("Gelu", []) if op == "Gelu" and len(node.inputs) == 1 else (None, None)
        if op in ("Relu", "Sigmoid", "Tanh"):
            return op, []
        if op == "HardSwish":
            return op, [_f32(1 / 6), 0.5]
        if op == "LeakyRelu":
            return op, [_f32(node.attrs.get("alpha", 0.01))]
        if op == "HardSigmoid":
            return op, [_f32(node.attrs.get("alpha", 0.2)), _f32(node.attrs.get("beta", 0.5))]
        if op == "Clip":
            b = FuseConvActivation._clip_bounds(node, inits)
            return (op, b) if b is not None else (None, None)
        return None, None


class FuseHardSwishRelu6(Pass):
    name = "fuse_hardswish_relu6"

    def call(self, graph: Graph) -> PassResult:
        readers, producer = _links(graph)
        inits = graph.initializers
        drop, replace = set(), {}
        for div in graph.nodes:
            m = self._match(div, producer, readers, inits)
            if m is None or any(id(h) in drop for h in m[1]):
                continue
            x, hidden = m
            replace[id(div)] = Node("HardSwishRelu6", [x], [div.outputs[0]], {}, div.name, FUSED_DOMAIN, 1)
            drop.update(id(h) for h in hidden)
        if not replace:
            return PassResult(False)
        graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
        return PassResult(True, [n.outputs[0] for n in replace.values()])

    @staticmethod
    def _match(div, producer, readers, inits):
        """(x, the Add, Clip and Mul it hides) when ``div`` ends the pattern, or None."""
        def const(name, value):
            v = inits.get(name)
            return v is not None and v.dtype == np.float32 and v.size == 1 and v.ndim <= 1 and \
                float(v.reshape(-1)[0]) == value

        def only(name, op):
            n = producer.get(name)
            ok = n is not None and n.op_type == op and n.domain in _STD and readers.get(name, 0) == 1
            return n if ok and len(n.outputs) == 1 else None

        if div.op_type != "Div" or div.domain not in _STD or len(div.inputs) != 2 or not const(div.inputs[1], 6.0):
            return None
        mul = only(div.inputs[0], "Mul")
        if mul is None or len(mul.inputs) != 2:
            return None
        for k in (0, 1):
            clip = only(mul.inputs[1 - k], "Clip")
            if clip is None or len(clip.inputs) != 3 or clip.opset < 11 or not const(clip.inputs[1], 0.0) or \
                    not const(clip.inputs[2], 6.0):
                continue
            add = only(clip.inputs[0], "Add")
            if add is None or len(add.inputs) != 2:
                continue
            x = mul.inputs[k]
            if add.inputs[0] == x and const(add.inputs[1], 3.0) or add.inputs[1] == x and const(add.inputs[0], 3.0):
                return x, [add, clip, mul]
        return None
