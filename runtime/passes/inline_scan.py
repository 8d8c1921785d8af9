"""Inline the body of a Scan that runs exactly once into its parent graph.

In single-token decode the recurrence of a hybrid model (linear attention,
Mamba-style convolution state) is a ``Scan`` over a sequence of length 1:
one child-plan call, loop-state copies and output stacking per layer per
step.  Splicing the body into the parent removes that boundary.

Case rewritten: a default-domain Scan (opset 9 or newer) such that
- every scan input's scan axis has a static extent of 1;
- it has at least one state input;
- its body holds no nested control flow (If, Loop, Scan, SequenceMap);
- every value its body reads from enclosing scopes resolves in the parent.

Rewrite:
- state inputs of the body bind directly to the parent's state values;
- each scan input becomes a ``Squeeze`` on its scan axis;
- body initializers move into the parent under unique names;
- every other body value is renamed uniquely (prefix: the Scan's name);
- a state output is produced by the body node that computed it (or by an
  ``Identity`` when the body passes a value straight through);
- each scan output gets an ``Unsqueeze`` on its scan-output axis.

The graph's input and output names and order do not change.  A Scan that
fails a precondition is left alone, and the result's ``details`` say which
precondition failed, as ``(node name, reason)`` pairs.
"""
from __future__ import annotations

import logging

import numpy as np
from onnx import GraphProto, numpy_helper

from ..ir import Graph, Node, free_names, node_from_proto
from .base import Pass, PassResult

__all__ = ["InlineSingleTripScan"]

logger = logging.getLogger(__name__)

_CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}


def static_extent(graph: Graph, name: str, axis: int):
    if name in graph.initializers:
        shape = graph.initializers[name].shape
    else:
        vi = graph.value_info.get(name)
        if vi is None or vi.shape is None:
            return None
        shape = vi.shape
    if not shape:
        return None
    ax = axis + len(shape) if axis < 0 else axis
    if not 0 <= ax < len(shape):
        return None
    return shape[ax]


class InlineSingleTripScan(Pass):
    name = "inline_single_trip_scan"

    def call(self, graph: Graph) -> PassResult:
        details = []
        modified = False
        defined = set(graph.initializers) | {v.name for v in graph.inputs} | set(getattr(graph, "outer_names", ()))
        for n in graph.nodes:
            defined.update(o for o in n.outputs if o)
        new_nodes = []
        for node in graph.nodes:
            reason = self._check(graph, node, defined)
            if reason is None:
                new_nodes.extend(self._inline(graph, node))
                details.append((node.name, "inlined"))
                modified = True
            else:
                if node.op_type == "Scan" and node.domain in ("", "ai.onnx"):
                    details.append((node.name, reason))
                    logger.debug("Scan %r left alone: %s", node.name, reason)
                new_nodes.append(node)
        graph.nodes = new_nodes
        if modified:
            graph.toposort()
        return PassResult(modified, details)

    @staticmethod
    def _check(graph: Graph, node: Node, defined: set) -> str | None:
        if node.op_type != "Scan" or node.domain not in ("", "ai.onnx"):
            return "not a default-domain Scan"
        if node.opset < 9:
            return "opset 8 Scan (batched form) is not inlined"
        body = node.attrs.get("body")
        if not isinstance(body, GraphProto):
            return "Scan has no body graph"
        m = int(node.attrs.get("num_scan_inputs", 0))
        n_state = len(node.inputs) - m
        if n_state < 1:
            return "Scan has no state input"
        axes = list(node.attrs.get("scan_input_axes") or [0] * m)
        for name, ax in zip(node.inputs[n_state:], axes):
            ext = static_extent(graph, name, int(ax))
            if ext != 1:
                return f"scan input {name!r} has extent {ext!r} on axis {ax}, not a static 1"
        for bn in body.node:
            if bn.op_type in _CONTROL_FLOW and bn.domain in ("", "ai.onnx"):
                return f"body holds nested control flow ({bn.op_type} {bn.name!r})"
        missing = sorted(x for x in free_names(body) if x not in defined)
        if missing:
            return f"body reads outer values that do not resolve: {missing}"
        return None

    @staticmethod
    def _inline(graph: Graph, node: Node) -> list:
        body: GraphProto = node.attrs["body"]
        m = int(node.attrs.get("num_scan_inputs", 0))
        n_state = len(node.inputs) - m
        in_axes = list(node.attrs.get("scan_input_axes") or [0] * m)
        n_out = len(body.output) - n_state
        out_axes = list(node.attrs.get("scan_output_axes") or [0] * n_out)
        prefix = f"{node.name or 'scan'}/"
        opset = graph.opsets.get("", node.opset)
        rename: dict = {}
        out_nodes: list = []

        def fresh(base):
            return graph.unique_name(prefix + base)

        def axes_const(ax):
            name = fresh(f"axes_{ax}")
            graph.initializers[name] = np.array([ax], dtype=np.int64)
            return name

        # State inputs bind to the parent's values; scan inputs are squeezed.
        for k, bi in enumerate(body.input):
            if k < n_state:
                rename[bi.name] = node.inputs[k]
            else:
                src = node.inputs[k]
                ax = int(in_axes[k - n_state])
                if ax < 0:
                    vi = graph.value_info.get(src)
                    ax += len(vi.shape) if vi is not None and vi.shape is not None else 0
                dst = fresh(bi.name)
                rename[bi.name] = dst
                if opset >= 13:
                    out_nodes.append(Node("Squeeze", [src, axes_const(ax)], [dst], {}, fresh("squeeze"), "",
                                          opset))
                else:
                    out_nodes.append(Node("Squeeze", [src], [dst], {"axes": [ax]}, fresh("squeeze"), "", opset))
        for t in body.initializer:
            new = fresh(t.name)
            graph.initializers[new] = numpy_helper.to_array(t)
            rename[t.name] = new
        produced = {o for bn in body.node for o in bn.output if o}
        # State outputs computed by a body node take the Scan's output names directly.
        claimed = set()
        for k in range(n_state):
            bo = body.output[k].name
            if bo in produced and bo not in claimed and bo not in rename:
                rename[bo] = node.outputs[k]
                claimed.add(bo)
        for bn in body.node:
            for o in bn.output:
                if o and o not in rename:
                    rename[o] = fresh(o)

        def ren(x):
            return rename.get(x, x) if x else ""

        for bn in body.node:
            nn = node_from_proto(bn, graph.opsets)
            nn.inputs = [ren(x) for x in nn.inputs]
            nn.outputs = [ren(x) for x in nn.outputs]
            nn.name = prefix + (bn.name or bn.op_type)
            out_nodes.append(nn)
        for k in range(n_state):
            bo = body.output[k].name
            if rename.get(bo) != node.outputs[k] and node.outputs[k]:
                out_nodes.append(Node("Identity", [ren(bo)], [node.outputs[k]], {}, fresh("state_identity"), "",
                                      opset))
        for j in range(n_out):
            target = node.outputs[n_state + j] if n_state + j < len(node.outputs) else ""
            if not target:
                continue
            src = ren(body.output[n_state + j].name)
            ax = int(out_axes[j])  # negative axes count from the end of the output, as Unsqueeze does
            if opset >= 13:
                out_nodes.append(Node("Unsqueeze", [src, axes_const(ax)], [target], {}, fresh("unsqueeze"), "",
                                      opset))
            else:
                out_nodes.append(Node("Unsqueeze", [src], [target], {"axes": [ax]}, fresh("unsqueeze"), "", opset))
        return out_nodes
