"""Fusions of the decomposed forms that encoder exports write, as onnxruntime's optimizers do.

``FuseLayerNormalization`` (onnxruntime's ``LayerNormFusion``) rewrites
``Add(Mul(Div(d, Sqrt(Add(ReduceMean(Pow(d, 2)), eps))), gamma), beta)`` with ``d = Sub(x, ReduceMean(x))``,
both means over the last axis only, into one ``LayerNormalization(x, gamma, beta, axis=-1, epsilon=eps)``:
one pass over each row where the export takes nine nodes and eight intermediate tensors.  The fused node is
onnxruntime's (the default domain's LayerNormalization at the model's opset, which onnxruntime also registers
below 17), so an optimized model onnxruntime loads computes what onnxruntime's fused model computes.

``FuseGelu`` (``GeluFusion``) rewrites ``Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)``, in its orderings
(the 0.5 applied to ``x`` first or last, either operand order of each Mul and Add, ``Mul`` by ``1/sqrt 2`` for
the Div), into ``com.microsoft.Gelu(x)``.

``FuseMatMulAdd`` (``MatMulAddFusion``) rewrites ``Add(MatMul(A, W), b)`` with ``A`` of rank 2, ``W`` a 2-d and
``b`` a 1-d (or ``[1, N]``) float initializer into ``Gemm(A, W, b)``: the bias is added in the product's pass.

``FuseAttention`` rewrites ``MatMul(Softmax(MatMul(Q, Transpose(K, perm=[0, 1, 3, 2])) [* or / scalar]), V)``,
the self-attention that encoder exports write out, into one ``onnx_numba.ScaledDotAttention(Q, K, V)``: the
scores never make a tensor of their own (``ops/attention.py``; 4-d operands of one batch and head count run as
opset 23's Attention, anything else as the three nodes compute it).

Invariants:
- a pattern is fused only when each of its intermediate values is read by the pattern alone and is not a graph
  output, and its constants are initializers with exactly the values above (within float32 rounding for
  ``sqrt 2``, ``0.5`` and ``1``; ``2`` exactly for the power);
- the fused node produces the pattern's last value, under the name of the pattern's last node; nodes it
  replaces are dropped, and initializers nothing reads any more are left to dead-node elimination;
- results change only by float32 rounding (one normalization in place of nine nodes, erf's own kernel), which
  is what onnxruntime's fused models compute too.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import Graph, Node
from .base import Pass, PassResult
from .cuda_fusions import _readers

__all__ = ["FuseAttention", "FuseGelu", "FuseLayerNormalization", "FuseMatMulAdd", "ONNXRUNTIME_NAMES"]

_STD = ("", "ai.onnx")
# onnxruntime's names of these optimizers (InferenceSession's ``disabled_optimizers``)
ONNXRUNTIME_NAMES = {"LayerNormFusion": "FuseLayerNormalization", "GeluFusion": "FuseGelu",
                     "MatMulAddFusion": "FuseMatMulAdd", "AttentionFusion": "FuseAttention"}


def _scalar(graph: Graph, name: str):
    """The float value of a one-element float initializer, else None."""
    v = graph.initializers.get(name)
    if not isinstance(v, np.ndarray) or v.size != 1 or v.dtype.kind != "f":
        return None
    return float(v.reshape(-1)[0])


def _close(value, want) -> bool:
    return value is not None and abs(value - want) <= 1e-6 * max(1.0, abs(want))


class _Fusion(Pass):
    """Walks the graph from each candidate last node; ``_match`` returns (replacement, nodes it hides)."""

    def call(self, graph: Graph) -> PassResult:
        self.readers = _readers(graph)
        self.producer = {o: n for n in graph.nodes for o in n.outputs if o}
        self.outputs = {v.name for v in graph.outputs}
        self.graph = graph
        drop, replace = set(), {}
        for node in graph.nodes:
            if id(node) in drop or id(node) in replace or node.domain not in _STD:
                continue
            m = self._match(node)
            if m is None:
                continue
            fused, hidden = m
            if any(id(h) in drop or id(h) in replace for h in hidden):
                continue
            replace[id(node)] = fused
            drop.update(id(h) for h in hidden)
        if not replace:
            return PassResult(False)
        graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
        return PassResult(True, [n.name or n.outputs[0] for n in replace.values()])

    def _from(self, value, op_type, readers=1):
        """The node producing ``value`` if it is an ``op_type`` of the default domain whose output is read
        ``readers`` times and is not a graph output."""
        n = self.producer.get(value)
        if n is None or n.op_type != op_type or n.domain not in _STD or len(n.outputs) != 1:
            return None
        if self.readers.get(value, 0) != readers or value in self.outputs:
            return None
        return n

    def _other(self, node, value):
        """The input of a two-input ``node`` that is not ``value`` (None if ``value`` is not one of them)."""
        a, b = node.inputs[:2]
        return b if a == value else a if b == value else None

    def _match(self, node):  # pragma: no cover - interface
        raise NotImplementedError


def _last_axis_mean(graph: Graph, node: Node) -> bool:
    """A ReduceMean over the last axis only, keeping it."""
    if not int(node.attrs.get("keepdims", 1)):
        return False
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        v = graph.initializers.get(node.inputs[1])
        axes = None if v is None else [int(a) for a in np.asarray(v).reshape(-1)]
    if axes is None or len(axes) != 1:
        return False
    vi = graph.value_info.get(node.inputs[0])
    rank = len(vi.shape) if vi is not None and vi.shape is not None else None
    return int(axes[0]) == -1 or (rank is not None and int(axes[0]) == rank - 1)


class FuseLayerNormalization(_Fusion):
    name = "fuse_layer_normalization"

    def _match(self, node):
        g = self.graph
        if node.op_type != "Add" or len(node.inputs) != 2:
            return None
        for k in (0, 1):
            mul = self._from(node.inputs[k], "Mul")
            beta = node.inputs[1 - k]
            if mul is None or beta not in g.initializers:
                continue
            for j in (0, 1):
                div = self._from(mul.inputs[j], "Div")
                gamma = mul.inputs[1 - j]
                if div is None or gamma not in g.initializers:
                    continue
                m = self._normalized(div)
                if m is None:
                    continue
                x, eps, hidden = m
                gv, bv = g.initializers[gamma], g.initializers[beta]
                vi = g.value_info.get(x)
                if vi is None or vi.dtype != np.float32 or gv.dtype != np.float32 or bv.dtype != np.float32 \
                        or gv.ndim != 1 or gv.size < 2 or bv.shape != gv.shape:
                    continue
                if vi.shape is not None and (not vi.shape or vi.shape[-1] not in (gv.shape[0], None)
                                             and isinstance(vi.shape[-1], int)):
                    continue  # (an unknown width is checked by the kernel, as the Mul would have been)
                fused = Node("LayerNormalization", [x, gamma, beta], [node.outputs[0]],
                             {"axis": -1, "epsilon": float(eps)}, node.name, "", node.opset)
                return fused, hidden + [mul, div]
        return None

    def _normalized(self, div):
        """(x, epsilon, hidden nodes) when ``div`` is ``Div(Sub(x, mean(x)), Sqrt(Add(mean(Pow(d, 2)), eps)))``."""
        g = self.graph
        sub = self._from(div.inputs[0], "Sub", readers=2)
        sqrt = self._from(div.inputs[1], "Sqrt")
        if sub is None or sqrt is None:
            return None
        mean = self._from(sub.inputs[1], "ReduceMean")
        x = sub.inputs[0]
        if mean is None or mean.inputs[0] != x or not _last_axis_mean(g, mean):
            return None
        add = self._from(sqrt.inputs[0], "Add")
        if add is None:
            return None
        for k in (0, 1):
            var = self._from(add.inputs[k], "ReduceMean")
            eps = _scalar(g, add.inputs[1 - k])
            if var is None or eps is None or not _last_axis_mean(g, var):
                continue
            pw = self._from(var.inputs[0], "Pow")
            if pw is None or pw.inputs[0] != sub.outputs[0] or _scalar(g, pw.inputs[1]) != 2.0:
                continue
            return x, eps, [mean, sub, pw, var, add, sqrt]
        return None


class FuseGelu(_Fusion):
    name = "fuse_gelu"

    def _match(self, node):
        """``node`` is the last Mul: ``Mul(Mul(x, Add(Erf(x / sqrt 2), 1)), 0.5)`` or ``Mul(Mul(x, 0.5), Add(...))``
        in either operand order."""
        g = self.graph
        if node.op_type != "Mul" or len(node.inputs) != 2:
            return None
        for k in (0, 1):
            inner, other = node.inputs[k], node.inputs[1 - k]
            if _close(_scalar(g, other), 0.5):  # 0.5 last: Mul(Mul(x, Add(...)), 0.5)
                m = self._from(inner, "Mul")
                if m is None:
                    continue
                for j in (0, 1):
                    erf = self._erf_plus_one(m.inputs[j], m.inputs[1 - j])
                    if erf is not None:
                        return self._fused(node, m.inputs[1 - j], erf + [m])
            else:  # 0.5 first: Mul(Mul(x, 0.5), Add(...)) — ``inner`` is the half
                half = self._from(inner, "Mul")
                if half is None:
                    continue
                for j in (0, 1):
                    if _close(_scalar(g, half.inputs[1 - j]), 0.5):
                        erf = self._erf_plus_one(other, half.inputs[j])
                        if erf is not None:
                            return self._fused(node, half.inputs[j], erf + [half])
        return None

    def _erf_plus_one(self, value, x):
        """The hidden nodes when ``value`` is ``Add(Erf(x / sqrt 2), 1)`` (or ``x * (1 / sqrt 2)``)."""
        g = self.graph
        add = self._from(value, "Add")
        if add is None:
            return None
        for k in (0, 1):
            erf = self._from(add.inputs[k], "Erf")
            if erf is None or not _close(_scalar(g, add.inputs[1 - k]), 1.0):
                continue
            scaled = self.producer.get(erf.inputs[0])
            if scaled is None or self.readers.get(erf.inputs[0], 0) != 1 or scaled.domain not in _STD:
                continue
            if scaled.op_type == "Div" and scaled.inputs[0] == x and _close(_scalar(g, scaled.inputs[1]),
                                                                            math.sqrt(2.0)):
                return [scaled, erf, add]
            if scaled.op_type == "Mul" and x in scaled.inputs[:2] and \
                    _close(_scalar(g, self._other(scaled, x)), 1.0 / math.sqrt(2.0)):
                return [scaled, erf, add]
        return None

    def _fused(self, node, x, hidden):
        vi = self.graph.value_info.get(x)
        if vi is None or vi.dtype != np.float32:
            return None
        return Node("Gelu", [x], [node.outputs[0]], {}, node.name, "com.microsoft", 1), hidden


class FuseMatMulAdd(_Fusion):
    name = "fuse_matmul_add"

    def _match(self, node):
        g = self.graph
        if node.op_type != "Add" or len(node.inputs) != 2 or node.opset < 7:
            return None
        for k in (0, 1):
            mm = self._from(node.inputs[k], "MatMul")
            b = node.inputs[1 - k]
            if mm is None or b not in g.initializers:
                continue
            a, w = mm.inputs[:2]
            wv, bv = g.initializers.get(w), g.initializers[b]
            va = g.value_info.get(a)
            if wv is None or wv.ndim != 2 or va is None or va.shape is None or len(va.shape) != 2 \
                    or va.dtype != np.float32 or wv.dtype != np.float32 or bv.dtype != np.float32:
                continue
            if bv.shape not in ((wv.shape[1],), (1, wv.shape[1])):
                continue
            return Node("Gemm", [a, w, b], [node.outputs[0]], {}, node.name, "", node.opset), [mm]
        return None


class FuseAttention(_Fusion):
    name = "fuse_attention"

    def _match(self, node):
        g = self.graph
        if node.op_type != "MatMul" or len(node.inputs) != 2:
            return None
        sm = self._from(node.inputs[0], "Softmax")
        if sm is None:
            return None
        legacy = 0 < node.opset < 13 if sm.opset == 0 else sm.opset < 13
        axis = int(sm.attrs.get("axis", 1 if legacy else -1))
        if axis not in (-1, 3):
            return None
        scale, hidden, scores = 1.0, [sm], sm.inputs[0]
        sc = self.producer.get(scores)
        if sc is not None and sc.op_type in ("Mul", "Div") and sc.domain in _STD and self._from(scores, sc.op_type):
            for k in ((0, 1) if sc.op_type == "Mul" else (0,)):
                v = _scalar(g, sc.inputs[1 - k])
                if v is not None and v != 0.0:
                    scale = v if sc.op_type == "Mul" else 1.0 / v
                    hidden.append(sc)
                    scores = sc.inputs[k]
                    break
        mm = self._from(scores, "MatMul")
        if mm is None:
            return None
        tr = self._from(mm.inputs[1], "Transpose")
        if tr is None or [int(a) for a in tr.attrs.get("perm", ())] != [0, 1, 3, 2]:
            return None
        q, k, v = mm.inputs[0], tr.inputs[0], node.inputs[1]
        if any((g.value_info.get(x) is None or g.value_info[x].dtype != np.float32) for x in (q, k, v)):
            return None
        attrs = {"scale": float(scale), "axis": axis, "legacy_softmax": int(legacy)}
        return Node("ScaledDotAttention", [q, k, v], [node.outputs[0]], attrs, node.name, "onnx_numba", 1), \
            hidden + [mm, tr]
