"""Child plans for the subgraphs of control-flow nodes (If, Loop, Scan, SequenceMap).

A subgraph is planned once, when its parent node is bound.  It reads values
of enclosing scopes by name: they arrive at run time as ``outer`` values
(see ``Plan.run``), so the child shares the parent's weights and feeds
without copying them.  On the CPU, the parent's constants (initializers
that no feed replaces) are the child's initializers instead, the same
arrays: the child's constant folding sees them.  The child runs on the parent's provider: a ``CudaPlan`` under the CUDA provider, whose
outputs a ``ChildPlan`` keeps on the device (``device_outputs``) unless asked for them on the host.
"""
from __future__ import annotations

from onnx import GraphProto

from .executor import Plan
from .ir import ValueInfo, free_names, graph_from_proto
from .providers import CUDA_PROVIDER

__all__ = ["ChildPlan", "plan_subgraph"]


class ChildPlan:
    """A planned subgraph plus the positions of its outer values in the parent's captured list."""

    def __init__(self, plan: Plan, outer_index: list):
        self.plan = plan
        self.outer_index = outer_index
        self.on_device = plan.provider == CUDA_PROVIDER
        self.input_names = plan.input_names
        self.output_names = plan.output_names

    def run(self, feeds, captured, host_outputs=()) -> list:
        """The subgraph's outputs for ``feeds`` and the parent's ``captured`` values; on a CUDA child, every
        output but the positions in ``host_outputs`` stays on the device."""
        outer = [captured[i] for i in self.outer_index]
        if self.on_device:
            keep = [k for k in range(len(self.output_names)) if k not in host_outputs]
            return self.plan.run(feeds, outer, device_outputs=keep)
        return self.plan.run(feeds, outer)


def plan_subgraph(gproto: GraphProto, ctx, input_types: list | None = None) -> ChildPlan:
    """Plan ``gproto`` as a child of the node described by ``ctx`` (an ``OpContext``)."""
    from .session import build_graph  # late: session imports the executor

    parent = ctx.graph
    g = graph_from_proto(gproto, dict(parent.opsets) if parent is not None else {"": ctx.opset})
    g.outer_names = free_names(gproto)
    types = {}
    if parent is not None:
        for name in g.outer_names:
            vi = parent.value_info.get(name)
            if vi is None and name in parent.initializers:
                arr = parent.initializers[name]
                from .dtypes import onnx_type
                vi = ValueInfo(name, arr.dtype, tuple(arr.shape), onnx_type(arr.dtype)) if arr.dtype != object else None
            if vi is not None:
                types[name] = vi
    g.outer_types = types
    if parent is not None and ctx.provider != CUDA_PROVIDER:
        # The parent's constants (initializers no feed can replace) become the child's own, the same arrays:
        # constant folding then sees them, so a branch's arithmetic on weights runs once, at plan time.
        fed = {v.name for v in parent.inputs}
        consts = {n: parent.initializers[n] for n in g.outer_names if n in parent.initializers and n not in fed}
        g.initializers.update(consts)
        g.outer_names = g.outer_names - set(consts)
    if input_types:
        for v, t in zip(g.inputs, input_types):
            if t is not None and v.dtype is None and v.kind == "tensor":
                v.dtype, v.elem_type = t.dtype, t.elem_type
    g.toposort()
    g = build_graph(g, ctx.session_options, ctx.provider)
    if ctx.provider == CUDA_PROVIDER:
        from .cuda_plan import CudaPlan
        plan = CudaPlan(g, ctx.provider, session_options=ctx.session_options)
    else:
        plan = Plan(g, ctx.provider, session_options=ctx.session_options)
    outer_index = [ctx.captured.index(n) for n in plan.outer_names]
    return ChildPlan(plan, outer_index)
