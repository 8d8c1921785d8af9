"""The small internal graph representation the passes and the planner share.

Invariants:
- ``Graph.nodes`` is a list in a valid topological order once ``toposort`` ran.
- Value names are unique within a graph; the empty name means "absent input".
- Initializers are numpy arrays (memory-mapped views for external data) and
  are never written to.
- Every node carries the opset version of its own domain (``Node.opset``), so
  nodes spliced in from function bodies keep the version they were written for.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from .dtypes import np_dtype, onnx_type
from .errors import ModelLoadError

__all__ = ["ValueInfo", "Node", "Graph", "attr_value", "graph_from_proto", "graph_to_proto"]

Dim = Any  # int, str (symbolic) or None (unknown)


@dataclass
class ValueInfo:
    """Static knowledge of a value: dtype (None if unknown) and shape.

    ``shape`` is None when even the rank is unknown; dims are ints, symbolic
    names (str) or None.
    """

    name: str
    dtype: np.dtype | None = None
    shape: tuple | None = None
    elem_type: int = 0
    kind: str = "tensor"  # tensor, sequence, optional, map, ...
    type_proto: Any = None

    @property
    def static_shape(self) -> tuple | None:
        if self.shape is None or any(not isinstance(d, int) for d in self.shape):
            return None
        return tuple(self.shape)


def valueinfo_from_proto(vi) -> ValueInfo:
    t = vi.type
    which = t.WhichOneof("value")
    if which == "tensor_type":
        et = t.tensor_type.elem_type
        dtype = None
        if et:
            try:
                dtype = np_dtype(et)
            except TypeError:
                dtype = None
        shape = None
        if t.tensor_type.HasField("shape"):
            dims = []
            for d in t.tensor_type.shape.dim:
                w = d.WhichOneof("value")
                if w == "dim_value":  # a negative extent (-1 as some exporters write) is dynamic, as in onnxruntime
                    dims.append(d.dim_value if d.dim_value >= 0 else None)
                else:
                    dims.append((d.dim_param or None) if w == "dim_param" else None)
            shape = tuple(dims)
        return ValueInfo(vi.name, dtype, shape, et, "tensor", t)
    return ValueInfo(vi.name, None, None, 0, which or "unknown", t)


def valueinfo_to_proto(v: ValueInfo):
    if v.kind != "tensor" and v.type_proto is not None:
        vi = helper.make_empty_tensor_value_info(v.name)
        vi.type.CopyFrom(v.type_proto)
        return vi
    et = v.elem_type or (onnx_type(v.dtype) if v.dtype is not None else 0)
    shape = None if v.shape is None else [d if d is not None else None for d in v.shape]
    return helper.make_tensor_value_info(v.name, et, shape)


def attr_value(a: AttributeProto) -> Any:
    """Python value of an attribute: numbers, str, lists, ndarray, GraphProto."""
    t = a.type
    if t == AttributeProto.FLOAT:
        return float(a.f)
    if t == AttributeProto.INT:
        return int(a.i)
    if t == AttributeProto.STRING:
        return a.s.decode("utf-8", errors="surrogateescape")
    if t == AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if t == AttributeProto.GRAPH:
        return a.g
    if t == AttributeProto.FLOATS:
        return [float(x) for x in a.floats]
    if t == AttributeProto.INTS:
        return [int(x) for x in a.ints]
    if t == AttributeProto.STRINGS:
        return [s.decode("utf-8", errors="surrogateescape") for s in a.strings]
    if t == AttributeProto.TENSORS:
        return [numpy_helper.to_array(x) for x in a.tensors]
    if t == AttributeProto.GRAPHS:
        return list(a.graphs)
    if t == AttributeProto.SPARSE_TENSOR:
        return _sparse_to_dense(a.sparse_tensor)
    if t == AttributeProto.TYPE_PROTO:
        return a.tp
    if t == AttributeProto.TYPE_PROTOS:
        return list(a.type_protos)
    return helper.get_attribute_value(a)


def _sparse_to_dense(sp) -> np.ndarray:
    values = numpy_helper.to_array(sp.values)
    idx = numpy_helper.to_array(sp.indices)
    dims = tuple(sp.dims)
    out = np.zeros(int(np.prod(dims)) if dims else 1, dtype=values.dtype)
    if idx.ndim == 2:
        idx = np.ravel_multi_index(tuple(idx.T), dims)
    out[idx.reshape(-1)] = values.reshape(-1)
    return out.reshape(dims)


@dataclass
class Node:
    op_type: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    name: str = ""
    domain: str = ""
    opset: int = 0
    attr_protos: list | None = None  # original protos, kept for re-export

    def to_proto(self) -> NodeProto:
        n = helper.make_node(self.op_type, list(self.inputs), list(self.outputs), name=self.name or None,
                             domain=self.domain or None)
        if self.attr_protos is not None:
            n.attribute.extend(self.attr_protos)
        else:
            for k, v in self.attrs.items():
                if isinstance(v, np.ndarray):
                    v = numpy_helper.from_array(v)
                n.attribute.append(helper.make_attribute(k, v))
        return n

    def __repr__(self):
        return f"Node({self.name!r}, {self.op_type}, {self.inputs} -> {self.outputs})"


@dataclass
class Graph:
    nodes: list
    inputs: list  # ValueInfo
    outputs: list  # ValueInfo
    initializers: dict  # name -> ndarray
    value_info: dict  # name -> ValueInfo
    opsets: dict  # domain -> version
    name: str = "graph"
    ir_version: int = 8
    functions: list = field(default_factory=list)

    def producers(self) -> dict:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict:
        c: dict = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    c.setdefault(i, []).append(n)
            for g in subgraphs(n):
                for name in free_names(g):
                    c.setdefault(name, []).append(n)
        return c

    def donatable_inputs(self) -> set:
        """The graph inputs a caller may hand over to the one node that reads them (``kv_share_buffer``): read
        once, by one node's input and by no subgraph, and not a graph output.  The one rule both plans use."""
        outs = {v.name for v in self.outputs}
        readers = self.consumers()
        return {v.name for v in self.inputs if v.name not in outs and len(readers.get(v.name, ())) == 1
                and v.name in readers[v.name][0].inputs}

    def unique_name(self, base: str) -> str:
        taken = getattr(self, "_taken", None)
        if taken is None:
            taken = set(self.initializers) | {v.name for v in self.inputs}
            for n in self.nodes:
                taken.update(n.outputs)
            self._taken = taken
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    def toposort(self) -> None:
        """Order nodes topologically; raises ``ModelLoadError`` on a cycle or an undefined input."""
        avail = set(self.initializers) | {v.name for v in self.inputs} | {""}
        avail |= getattr(self, "outer_names", set())
        pending = list(self.nodes)
        ordered = []
        deps = {}
        for n in pending:
            need = [i for i in n.inputs if i]
            for g in subgraphs(n):
                need.extend(free_names(g))
            deps[id(n)] = need
        producers = {o: n for n in pending for o in n.outputs if o}
        # Kahn's algorithm, stable with respect to the file order.
        indeg = {}
        users: dict = {}
        for n in pending:
            k = 0
            for i in deps[id(n)]:
                if i in avail:
                    continue
                p = producers.get(i)
                if p is None:
                    raise ModelLoadError(
                        f"node {n.name!r} ({n.op_type}) reads {i!r}, which no node, input or initializer defines")
                k += 1
                users.setdefault(id(p), []).append(n)
            indeg[id(n)] = k
        ready = [n for n in pending if indeg[id(n)] == 0]
        pos = {id(n): i for i, n in enumerate(pending)}
        import heapq
        heap = [(pos[id(n)], id(n), n) for n in ready]
        heapq.heapify(heap)
        while heap:
            _, _, n = heapq.heappop(heap)
            ordered.append(n)
            for u in users.get(id(n), ()):
                indeg[id(u)] -= 1
                if indeg[id(u)] == 0:
                    heapq.heappush(heap, (pos[id(u)], id(u), u))
        if len(ordered) != len(pending):
            stuck = [n.name or n.op_type for n in pending if indeg[id(n)] > 0][:5]
            raise ModelLoadError(f"graph {self.name!r} has a cycle through nodes {stuck}")
        self.nodes = ordered


def subgraphs(node: Node):
    for v in node.attrs.values():
        if isinstance(v, GraphProto):
            yield v
        elif isinstance(v, list) and v and isinstance(v[0], GraphProto):
            yield from v


def free_names(g: GraphProto) -> set:
    """Names a subgraph reads from its enclosing scopes."""
    defined = {i.name for i in g.input} | {t.name for t in g.initializer} | {t.name for t in g.sparse_initializer}
    free = set()
    for n in g.node:
        for i in n.input:
            if i and i not in defined:
                free.add(i)
        for a in n.attribute:
            subs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)
            for sg in subs:
                free |= {x for x in free_names(sg) if x not in defined}
        defined.update(n.output)
    return free


def node_from_proto(n: NodeProto, opsets: dict) -> Node:
    attrs = {a.name: attr_value(a) for a in n.attribute}
    return Node(n.op_type, list(n.input), list(n.output), attrs, n.name, n.domain,
                opsets.get(n.domain, opsets.get("ai.onnx", 0) if n.domain == "" else 0), list(n.attribute))


def graph_from_proto(g: GraphProto, opsets: dict, initializers: dict | None = None, as_inputs=()) -> Graph:
    """Build an IR graph; ``initializers`` may supply already loaded arrays by name.  ``as_inputs``: names of
    graph inputs that also have an initializer (onnxruntime's overridable initializers) kept as inputs, their
    initializers becoming ``graph.input_defaults``."""
    inits = {}
    for t in g.initializer:
        if initializers is not None and t.name in initializers:
            inits[t.name] = initializers[t.name]
        else:
            inits[t.name] = numpy_helper.to_array(t)
    for sp in g.sparse_initializer:
        inits[sp.values.name] = _sparse_to_dense(sp)
    defaults = {n: inits.pop(n) for n in as_inputs if n in inits}
    init_names = set(inits)
    inputs = [valueinfo_from_proto(v) for v in g.input if v.name not in init_names]
    outputs = [valueinfo_from_proto(v) for v in g.output]
    vinfo = {v.name: valueinfo_from_proto(v) for v in g.value_info}
    for v in list(inputs) + list(outputs):
        vinfo.setdefault(v.name, v)
    nodes = [node_from_proto(n, opsets) for n in g.node]
    for i, n in enumerate(nodes):
        if not n.name:
            n.name = f"{n.op_type}_{i}"
    graph = Graph(nodes, inputs, outputs, inits, vinfo, dict(opsets), g.name or "graph")
    graph.input_defaults = defaults
    return graph


def graph_to_proto(graph: Graph, *, small_init_limit: int | None = None) -> GraphProto:
    """Export the graph; initializers above ``small_init_limit`` elements become typed inputs.

    Passing a limit keeps shape inference cheap: only small constants (shape
    vectors and the like) travel as data.
    """
    inits = []
    extra_inputs = []
    for name, arr in graph.initializers.items():
        if small_init_limit is not None and arr.size > small_init_limit:
            extra_inputs.append(helper.make_tensor_value_info(name, onnx_type(arr.dtype), list(arr.shape)))
        else:
            inits.append(_to_tensor(arr, name))
    # Values a subgraph reads from enclosing scopes travel as typed inputs when their type is known.
    outer_types = getattr(graph, "outer_types", {})
    for name in sorted(getattr(graph, "outer_names", ())):
        vi = outer_types.get(name)
        if vi is not None and name not in graph.initializers:
            extra_inputs.append(valueinfo_to_proto(ValueInfo(name, vi.dtype, vi.shape, vi.elem_type, vi.kind,
                                                             vi.type_proto)))
    g = helper.make_graph(
        [n.to_proto() for n in graph.nodes], graph.name,
        [valueinfo_to_proto(v) for v in graph.inputs] + extra_inputs,
        [valueinfo_to_proto(v) for v in graph.outputs], inits,
    )
    io = {v.name for v in graph.inputs} | {v.name for v in graph.outputs}
    for name, v in graph.value_info.items():
        if name not in io and name not in graph.initializers:
            g.value_info.append(valueinfo_to_proto(v))
    return g


def _to_tensor(arr: np.ndarray, name: str) -> TensorProto:
    if arr.dtype == object:
        return helper.make_tensor(name, TensorProto.STRING, arr.shape,
                                  [s.encode() if isinstance(s, str) else s for s in arr.reshape(-1)])
    return numpy_helper.from_array(np.asarray(arr), name)


def model_to_proto(graph: Graph, *, small_init_limit: int | None = None) -> ModelProto:
    g = graph_to_proto(graph, small_init_limit=small_init_limit)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in graph.opsets.items()])
    m.ir_version = max(graph.ir_version, 3)
    return m
