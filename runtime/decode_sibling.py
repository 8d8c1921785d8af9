"""The decode sibling: a second plan, specialized for single-token steps, with single-trip Scans inlined.

A hybrid decoder's recurrences are Scans over the sequence.  For a
one-token step the session can run a sibling plan built from a copy of the
optimized graph in which the sequence symbol is fixed to 1 (and the leading
batch symbols to the step's batch size, one sibling per batch size), shapes
are re-inferred (permissively), and ``InlineSingleTripScan`` has spliced
every eligible Scan body into the graph.  The sibling shares the main plan's
initializer arrays (no copies) and its provider.

Invariants:
- the sibling is only ever run on a step whose scan axis has extent 1
  (``route_to_sibling``); multi-token steps (prefill) run the main plan;
- a graph with no eligible Scan (a dense decoder) has no sibling (None);
- the graph's input and output names and order are the same in both plans,
  so buffers bound by name carry over from one to the other unchanged.
"""
from __future__ import annotations

import copy
from . import settings
from .ir import Graph, ValueInfo
from .passes import InferShapes, InlineSingleTripScan, simplify
from .passes.inline_scan import static_extent

__all__ = ["ENV_FLAG", "TRUTHY", "parse_flag", "route_to_sibling", "find_scan_symbol", "build_sibling"]

ENV_FLAG = "ONNX_NUMBA_DECODE_INLINE_SCAN"
TRUTHY = settings.TRUE


def parse_flag(value) -> bool:
    """``SessionOptions.decode_inline_scan`` under the settings rule (``runtime.settings``): on for
    1/true/yes/on, off for 0/false/no/off or None, an error for anything else."""
    return settings.parse("decode_inline_scan", value, False)


def route_to_sibling(flag: bool, sibling_built: bool, scan_extent) -> bool:
    """Whether a step runs on the sibling: the flag is on, the sibling exists, and the step is one token."""
    return bool(flag) and bool(sibling_built) and scan_extent == 1


def _copy_graph(graph: Graph, dims: dict) -> Graph:
    """A copy whose node lists and dicts are new (initializer arrays shared) with input dims substituted."""
    nodes = []
    for n in graph.nodes:
        c = copy.copy(n)
        c.inputs = list(n.inputs)
        c.outputs = list(n.outputs)
        c.attrs = dict(n.attrs)
        nodes.append(c)
    inputs = []
    for v in graph.inputs:
        shape = None if v.shape is None else tuple(dims.get(d, d) if isinstance(d, str) else d for d in v.shape)
        inputs.append(ValueInfo(v.name, v.dtype, shape, v.elem_type, v.kind, v.type_proto if v.kind != "tensor"
                                else None))
    value_info = {v.name: v for v in inputs}
    for o in graph.outputs:
        value_info.setdefault(o.name, o)
    g = Graph(nodes, inputs, [copy.copy(o) for o in graph.outputs], dict(graph.initializers), value_info,
              dict(graph.opsets), graph.name, graph.ir_version)
    return g


def _eligible_scans(graph: Graph) -> list:
    return [n for n in graph.nodes if n.op_type == "Scan" and n.domain in ("", "ai.onnx") and n.opset >= 9
            and len(n.inputs) - int(n.attrs.get("num_scan_inputs", 0)) >= 1]


def _all_single_trip(graph: Graph) -> bool:
    scans = _eligible_scans(graph)
    if not scans:
        return False
    for n in scans:
        m = int(n.attrs.get("num_scan_inputs", 0))
        axes = list(n.attrs.get("scan_input_axes") or [0] * m)
        for name, ax in zip(n.inputs[len(n.inputs) - m:], axes):
            if static_extent(graph, name, int(ax)) != 1:
                return False
    return True


def find_scan_symbol(graph: Graph):
    """The input dimension symbol that, fixed to 1, makes every stateful Scan run exactly once (or None)."""
    if not _eligible_scans(graph):
        return None
    symbols = []
    for v in graph.inputs:
        for d in v.shape or ():
            if isinstance(d, str) and d not in symbols:
                symbols.append(d)
    for sym in symbols:
        g = _copy_graph(graph, {sym: 1})
        InferShapes(strict=False)(g)
        if _all_single_trip(g):
            return sym
    return None


def symbol_positions(graph: Graph, symbol) -> list:
    """(input index, axis) of every occurrence of ``symbol`` in the graph's declared input shapes."""
    return [(k, ax) for k, v in enumerate(graph.inputs) for ax, d in enumerate(v.shape or ()) if d == symbol]


def batch_symbols(graph: Graph, exclude=()) -> list:
    """Symbols that only ever name a leading (batch) axis of the graph's inputs."""
    lead, other = set(), set()
    for v in graph.inputs:
        for ax, d in enumerate(v.shape or ()):
            if isinstance(d, str) and d not in exclude:
                (lead if ax == 0 else other).add(d)
    return sorted(lead - other)


def build_sibling(graph: Graph, symbol, fixed: dict | None = None) -> Graph | None:
    """The optimized single-token graph, or None if no Scan could be inlined.

    ``fixed`` pins further symbols (the batch size of the generation) so the
    inlined interior gets static shapes: preallocated buffers and fused
    elementwise segments then apply inside it too.
    """
    g = _copy_graph(graph, {symbol: 1, **(fixed or {})})
    InferShapes(strict=False)(g)
    res = InlineSingleTripScan()(g)
    if not res.modified:
        return None
    InferShapes(strict=False)(g)
    if simplify()(g).modified:
        InferShapes(strict=False)(g)
    g.inline_details = res.details
    return g


def flag_from_environment() -> bool:
    return settings.flag(ENV_FLAG)
