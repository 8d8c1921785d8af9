"""Graph clean-up passes: constant folding, identity elimination, dead nodes.

``FoldConstants`` rewrites:
- ``Constant`` nodes into initializers;
- any deterministic node whose inputs are all initializers, by running its
  own kernel once at plan time (outputs above ``max_elements`` are kept as
  nodes so folding never balloons memory);
- ``Shape`` and ``Size`` of values whose shape is statically known.

``EliminateIdentity`` reroutes readers of an ``Identity`` to its input unless
the output is a graph output.

``EliminateDeadNodes`` drops nodes none of whose outputs is read or returned.

``simplify()`` is the three in that order, once, as a ``PassManager``: what sessions and the decode sibling run
after shape inference.
"""
from __future__ import annotations

import numpy as np

from ops import registry
from ..ir import Graph, free_names, subgraphs
from .base import Pass, PassManager, PassResult

__all__ = ["FoldConstants", "EliminateIdentity", "EliminateDeadNodes", "simplify"]

_NONDETERMINISTIC = {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial",
                     "Bernoulli", "Dropout"}
_NO_FOLD = _NONDETERMINISTIC | {"If", "Loop", "Scan", "SequenceMap", "Optional", "OptionalHasElement",
                                "OptionalGetElement"}


class FoldConstants(Pass):
    name = "fold_constants"

    def __init__(self, max_elements: int = 1 << 22):
        self.max_elements = max_elements

    def call(self, graph: Graph) -> PassResult:
        modified = False
        keep = []
        for node in graph.nodes:
            folded = self._fold(graph, node)
            if folded is None:
                keep.append(node)
                continue
            for name, arr in zip(node.outputs, folded):
                if name:
                    graph.initializers[name] = arr
            modified = True
        graph.nodes = keep
        return PassResult(modified)

    def _fold(self, graph, node):
        if node.domain not in ("", "ai.onnx") or node.op_type in _NO_FOLD or any(True for _ in subgraphs(node)):
            return None
        if node.op_type in ("Shape", "Size") and node.inputs and node.inputs[0] not in graph.initializers:
            vi = graph.value_info.get(node.inputs[0])
            if vi is None or vi.static_shape is None:
                return None
            shape = np.array(vi.static_shape, dtype=np.int64)
            if node.op_type == "Size":
                return [np.array(int(np.prod(shape)), dtype=np.int64)]
            start = node.attrs.get("start", 0)
            end = node.attrs.get("end", None)
            return [shape[slice(start, end)].copy()]
        if not all((not i) or i in graph.initializers for i in node.inputs):
            return None
        if node.op_type not in ("Constant",) and any(
                graph.initializers[i].size > self.max_elements for i in node.inputs if i):
            return None
        if any(graph.initializers[i].dtype == object for i in node.inputs if i):
            return None
        impl = registry.resolve(node.domain, node.op_type, node.opset)
        if impl is None:
            return None
        ins = [graph.initializers[i] if i else None for i in node.inputs]
        while ins and ins[-1] is None:
            ins.pop()
        ctx = registry.OpContext(node.name, node.op_type, node.domain, node.opset, node.attrs, len(ins),
                                 len(node.outputs), [graph.value_info.get(i) for i in node.inputs],
                                 [graph.value_info.get(o) for o in node.outputs], [None] * len(node.outputs),
                                 outputs_used=[bool(o) for o in node.outputs], node=node, graph=graph)
        try:
            fn = registry.bind(impl, ctx)
            r = fn(*ins)
        except Exception:
            return None  # leave the node; the error surfaces when it runs
        res = [r] if len(node.outputs) == 1 else list(r)
        if len(res) < len([o for o in node.outputs if o]):
            return None
        out = []
        for a in res[:len(node.outputs)]:
            if not isinstance(a, np.ndarray):
                return None
            if a.size > self.max_elements:
                return None
            out.append(a)
        return out


class EliminateIdentity(Pass):
    name = "eliminate_identity"

    def call(self, graph: Graph) -> PassResult:
        outputs = {v.name for v in graph.outputs}
        captured = set()
        for n in graph.nodes:
            for g in subgraphs(n):
                captured |= free_names(g)
        rename = {}
        keep = []
        for n in graph.nodes:
            n.inputs = [rename.get(i, i) for i in n.inputs]
            if n.op_type == "Identity" and n.domain in ("", "ai.onnx") and len(n.inputs) == 1 \
                    and n.outputs[0] not in outputs and n.outputs[0] not in captured and n.inputs[0]:
                rename[n.outputs[0]] = n.inputs[0]
                continue
            keep.append(n)
        if not rename:
            return PassResult(False)
        graph.nodes = keep
        return PassResult(True, list(rename))


class EliminateDeadNodes(Pass):
    name = "eliminate_dead_nodes"

    def call(self, graph: Graph) -> PassResult:
        live = {v.name for v in graph.outputs}
        keep = []
        for n in reversed(graph.nodes):
            if any(o in live for o in n.outputs if o):
                keep.append(n)
                live.update(i for i in n.inputs if i)
                for g in subgraphs(n):
                    live |= free_names(g)
        keep.reverse()
        changed = len(keep) != len(graph.nodes)
        graph.nodes = keep
        dead_inits = [k for k in graph.initializers if k not in live]
        for k in dead_inits:
            del graph.initializers[k]
        return PassResult(changed or bool(dead_inits))


# onnxruntime's names of the optimizers these passes do (InferenceSession's ``disabled_optimizers``).
ONNXRUNTIME_NAMES = {"ConstantFolding": "FoldConstants", "EliminateIdentity": "EliminateIdentity",
                     "EliminateDeadNodes": "EliminateDeadNodes"}


def simplify(disabled=()) -> PassManager:
    """Constant folding, identity elimination and dead-node elimination, each run once; a pass named in
    ``disabled`` (by its class name or onnxruntime's optimizer name) is left out."""
    off = {ONNXRUNTIME_NAMES.get(n, n) for n in disabled}
    passes = [p for p in (FoldConstants(), EliminateIdentity(), EliminateDeadNodes()) if type(p).__name__ not in off]
    return PassManager(passes, max_iterations=1)
