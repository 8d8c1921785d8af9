"""Fusions of the feed-forward gate, on a GPU and (the gate alone) on the CPU.

On a GPU a small decode step is bound by kernel launches, not by arithmetic; on the CPU a long prompt makes the
gate's three elementwise passes over memory costly.

``FuseGatedActivation`` rewrites the feed-forward gate ``act(g) * u`` into one ``onnx_numba.GatedActivation``:

- SiLU: ``s = Sigmoid(g); a = Mul(g, s); y = Mul(a, u)`` (either operand order of each Mul);
- GELU: ``a = Gelu(g)`` (onnx, ``approximate`` none or tanh), ``com.microsoft.Gelu`` (erf) or
  ``com.microsoft.FastGelu`` without bias (tanh); then ``y = Mul(a, u)``.

``FuseGatedMatMul`` then rewrites ``GatedActivation(MatMul(x, Wg), MatMul(x, Wu))`` with constant 2-d weights of
one shape into ``onnx_numba.GatedMatMul(x, Wg, Wu)``, whose decode step is one GEMV launch.

``FuseGatedMatMulNBits`` rewrites ``GatedActivation(MatMulNBits(x, Bg, ...), MatMulNBits(x, Bu, ...))`` with
constant weights, scales and zero points of one layout (same K, N, bits, block size, no g_idx or bias) into one
``MatMulNBits`` of ``2N`` columns over the weights concatenated along N (each output column reads only its own
row of B, scales and zero points, so every column is computed exactly as before) and a one-input
``GatedActivation`` over the two halves.  The separate weights are dropped when nothing else reads them.

Invariants:
- a pattern is fused only when every value it hides (``s``, ``a``, the products) is read by the pattern
  alone and is not a graph output, and when ``g`` and ``u`` are known to have one shape and one float dtype
  (float32 or float16: from shape inference, or as two MatMulNBits of one input and one N), so the fused
  node computes what the nodes it replaces did, up to rounding: the intermediates stay in float32 instead of
  being stored in the operands' dtype;
- the fused node takes the name of the node whose output it produces and produces the same value name;
- the kernels live in ``ops/cuda/fused.py`` and, for ``GatedActivation``, in ``ops/fused.py`` on the CPU:
  ``runtime.session.build_graph`` runs ``FuseGatedActivation`` for every provider (graph optimization level 2
  and up) and the two product fusions for ``CUDAExecutionProvider`` only (merging weights on the CPU would
  hold them twice), so a CPU plan never sees ``GatedMatMul``.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, free_names, subgraphs
from .base import Pass, PassResult

__all__ = ["FuseGatedActivation", "FuseGatedMatMul", "FuseGatedMatMulNBits", "FUSED_DOMAIN"]

FUSED_DOMAIN = "onnx_numba"
_STD = ("", "ai.onnx")
_MS = "com.microsoft"
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


def _readers(graph: Graph) -> dict:
    """value name -> number of node inputs that read it (subgraph captures and graph outputs count too)."""
    n: dict = {}
    for node in graph.nodes:
        for x in node.inputs:
            if x:
                n[x] = n.get(x, 0) + 1
        for g in subgraphs(node):
            for x in free_names(g):
                n[x] = n.get(x, 0) + 1
    for v in graph.outputs:
        n[v.name] = n.get(v.name, 0) + 1
    return n


def _same_float(graph: Graph, a: str, b: str) -> bool:
    """``a`` and ``b`` are known to have one shape (dims equal as ints or as the same symbol) and one float dtype."""
    va, vb = graph.value_info.get(a), graph.value_info.get(b)
    if va is None or vb is None or va.shape is None or vb.shape is None or va.dtype is None:
        return False
    if np.dtype(va.dtype) not in _FLOATS or vb.dtype is None or np.dtype(vb.dtype) != np.dtype(va.dtype):
        return False
    return len(va.shape) == len(vb.shape) and all(
        x is not None and x == y for x, y in zip(va.shape, vb.shape))


def _twin_products(graph: Graph, a: Node | None, b: Node | None) -> bool:
    """``a`` and ``b`` are two MatMulNBits (contrib ops, whose outputs shape inference leaves unknown) of one
    float input and one N: their results have one shape and the input's dtype."""
    if a is None or b is None or a is b:
        return False
    if any(n.op_type != "MatMulNBits" or n.domain != _MS or not n.inputs for n in (a, b)):
        return False
    x = graph.value_info.get(a.inputs[0])
    return a.inputs[0] == b.inputs[0] and "N" in a.attrs and a.attrs.get("N") == b.attrs.get("N") \
        and x is not None and x.dtype is not None and np.dtype(x.dtype) in _FLOATS


def _gelu_kind(node: Node) -> str | None:
    if node.op_type == "Gelu" and node.domain in _STD:
        approx = node.attrs.get("approximate", "none")
        approx = approx.decode() if isinstance(approx, bytes) else approx
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(approx)
    if node.domain == _MS and node.op_type == "Gelu":
        return "gelu"
    if node.domain == _MS and node.op_type == "FastGelu" and len([x for x in node.inputs if x]) == 1:
        return "gelu_tanh"
    return None


class FuseGatedActivation(Pass):
    name = "fuse_gated_activation"

    def call(self, graph: Graph) -> PassResult:
        producer = {o: node for node in graph.nodes for o in node.outputs if o}
        readers = _readers(graph)
        drop: set = set()   # ids of the nodes a fusion hides
        replace: dict = {}  # id(final Mul) -> the fused node
        for mul in graph.nodes:
            if mul.op_type != "Mul" or mul.domain not in _STD or len(mul.inputs) != 2 or id(mul) in drop:
                continue
            for k in (0, 1):
                m = _match_activation(producer.get(mul.inputs[k]), producer, readers, drop)
                if m is None:
                    continue
                g, act, hidden = m
                u = mul.inputs[1 - k]
                # act(g) has g's shape, so the Mul broadcasts nothing
                if not (_same_float(graph, g, u) or _twin_products(graph, producer.get(g), producer.get(u))):
                    continue
                drop.update(id(h) for h in hidden)
                replace[id(mul)] = Node("GatedActivation", [g, u], [mul.outputs[0]], {"activation": act},
                                        mul.name, FUSED_DOMAIN, 1)
                break
        if not replace:
            return PassResult(False)
        graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
        return PassResult(True, [n.outputs[0] for n in replace.values()])


def _match_activation(a_node, producer, readers, drop):
    """(g, activation, nodes it hides) when ``a_node`` computes ``act(g)`` and one node alone reads its result."""
    if a_node is None or id(a_node) in drop or readers.get(a_node.outputs[0], 0) != 1:
        return None
    kind = _gelu_kind(a_node)
    if kind is not None:
        return a_node.inputs[0], kind, [a_node]
    if a_node.op_type != "Mul" or a_node.domain not in _STD or len(a_node.inputs) != 2:
        return None
    for j in (0, 1):  # SiLU: a = Mul(g, Sigmoid(g)), the Sigmoid read by that Mul alone
        g, s = a_node.inputs[j], a_node.inputs[1 - j]
        sig = producer.get(s)
        if sig is None or id(sig) in drop or sig.op_type != "Sigmoid" or sig.domain not in _STD:
            continue
        if sig.inputs[0] == g and readers.get(s, 0) == 1:
            return g, "silu", [a_node, sig]
    return None


class _GateProducts(Pass):
    """Rewrites ``GatedActivation(P(x, ...), P(x, ...))`` whose two products (``op_type``/``domain``) are read by
    it alone; ``rewrite`` returns the nodes that replace it (the products are dropped), or None."""
    op_type = domain = ""

    def call(self, graph: Graph) -> PassResult:
        producer = {o: node for node in graph.nodes for o in node.outputs if o}
        self.readers = _readers(graph)
        drop: set = set()
        replace: dict = {}
        for node in graph.nodes:
            if node.op_type != "GatedActivation" or node.domain != FUSED_DOMAIN or len(node.inputs) != 2:
                continue
            mg, mu = producer.get(node.inputs[0]), producer.get(node.inputs[1])
            if mg is None or mu is None or mg is mu or any(
                    m.op_type != self.op_type or m.domain not in self.domain or id(m) in drop or not m.inputs
                    or self.readers.get(m.outputs[0], 0) != 1 for m in (mg, mu)) or mg.inputs[0] != mu.inputs[0]:
                continue
            new = self.rewrite(graph, node, mg, mu)
            if new is not None:
                drop.update((id(mg), id(mu)))
                replace[id(node)] = new
        if not replace:
            return PassResult(False)
        nodes = []
        for nd in graph.nodes:
            if id(nd) not in drop:
                nodes.extend(replace.get(id(nd), (nd,)))
        graph.nodes = nodes
        return PassResult(True, [new[-1].outputs[0] for new in replace.values()])

    def rewrite(self, graph, node, mg, mu):  # pragma: no cover - interface
        raise NotImplementedError


class FuseGatedMatMul(_GateProducts):
    """``GatedActivation(MatMul(x, Wg), MatMul(x, Wu))`` with constant (K, N) weights -> ``GatedMatMul``."""
    name = "fuse_gated_matmul"
    op_type, domain = "MatMul", _STD

    def rewrite(self, graph, node, mg, mu):
        x, wg, wu = mg.inputs[0], mg.inputs[1], mu.inputs[1]
        a, b = graph.initializers.get(wg), graph.initializers.get(wu)
        xi = graph.value_info.get(x)
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.ndim != 2 or a.shape != b.shape \
                or a.dtype != b.dtype or a.dtype not in _FLOATS or xi is None or xi.dtype is None \
                or np.dtype(xi.dtype) != a.dtype:
            return None
        return [Node("GatedMatMul", [x, wg, wu], list(node.outputs), dict(node.attrs), node.name, FUSED_DOMAIN, 1)]


def _per_column(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` (B, scales or zero points of a MatMulNBits with ``n`` columns) as rows of one column each."""
    return a.reshape(n, -1)


class FuseGatedMatMulNBits(_GateProducts):
    """``GatedActivation(MatMulNBits(x, Bg..), MatMulNBits(x, Bu..))`` -> one MatMulNBits of 2N columns over the
    concatenated weights and a one-input ``GatedActivation`` (module docstring)."""
    name = "fuse_gated_matmulnbits"
    op_type, domain = "MatMulNBits", (_MS,)
    _ATTRS = ("K", "N", "bits", "block_size", "accuracy_level")

    def rewrite(self, graph, node, mg, mu):
        inits = graph.initializers
        if any(x for m in (mg, mu) for x in m.inputs[4:]) or len(mg.inputs[1:4]) != len(mu.inputs[1:4]) \
                or any(mg.attrs.get(a) != mu.attrs.get(a) for a in self._ATTRS) or "N" not in mg.attrs:
            return None  # only the plain form (no g_idx, no bias) of one layout
        n = int(mg.attrs["N"])
        parts = []
        for k in range(1, len(mg.inputs[:4])):
            a_name, b_name = mg.inputs[k], mu.inputs[k]
            if not a_name and not b_name:
                continue
            a, b = inits.get(a_name), inits.get(b_name)
            if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.shape != b.shape \
                    or a.dtype != b.dtype or a.size % n:
                return None
            parts.append((k, a_name, b_name, a, b))
        if [k for k, *_ in parts][:2] != [1, 2]:
            return None
        ins = [mg.inputs[0], "", "", ""]
        for k, a_name, b_name, a, b in parts:
            cat = np.concatenate([_per_column(a, n), _per_column(b, n)])
            ins[k] = graph.unique_name(f"{a_name}+{b_name}")
            inits[ins[k]] = cat.reshape((2 * n,) + a.shape[1:]) if a.ndim > 1 and a.shape[0] == n \
                else cat.reshape(-1)
            for w in (a_name, b_name):  # the separate weights go when nothing else reads them
                self.readers[w] -= 1
                if self.readers[w] <= 0 and w in inits:
                    del inits[w]
        while not ins[-1]:
            ins.pop()
        gu = graph.unique_name(f"{node.outputs[0]}/gate_and_value")
        attrs = dict(mg.attrs)
        attrs["N"] = 2 * n
        return [Node("MatMulNBits", ins, [gu], attrs, f"{node.name}/gate_and_value", _MS, mg.opset),
                Node("GatedActivation", [gu], list(node.outputs), dict(node.attrs), node.name, FUSED_DOMAIN, 1)]
