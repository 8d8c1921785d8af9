"""Expand nodes that have no kernel but whose schema has a function body.

Cases rewritten:
- a default-domain (or any registered-schema) node without a kernel whose
  schema carries a plain function body for a version at or below the model's
  opset;
- the same with a context-dependent body, built from the node and the
  inferred types of its inputs.

The body is spliced in place of the node with every internal value renamed
uniquely (prefix: the node's name), formal inputs and outputs bound to the
node's actual ones, ``ref_attr_name`` attributes replaced by the node's
attribute (or the body's default, or else the schema's), and free names of nested subgraphs
renamed consistently.  Body nodes keep the opset the function was written
for.  Expanded bodies are expanded again until nothing changes.
"""
from __future__ import annotations

import onnx
from onnx import AttributeProto, FunctionProto, GraphProto, TypeProto, helper

from .. import isolate
from ..ir import Graph, Node, attr_value, valueinfo_to_proto
from .base import Pass, PassResult

__all__ = ["ExpandFunctions", "function_body"]


def _schema(node: Node):
    try:
        return onnx.defs.get_schema(node.op_type, node.opset, node.domain)
    except Exception:
        return None


def function_body(node: Node, graph: Graph) -> FunctionProto | None:
    """The schema function body for ``node``, or None if its schema has none."""
    s = _schema(node)
    if s is None:
        return None
    plain = [v for v in s.function_opset_versions if v <= node.opset]
    ctxdep = [v for v in s.context_dependent_function_opset_versions if v <= node.opset]
    f = FunctionProto()
    if plain and (not ctxdep or max(plain) >= max(ctxdep)):
        b = s.get_function_with_opset_version(max(plain))
        if not b:
            return None
        f.ParseFromString(b)
        return f
    if ctxdep:
        types = []
        for i in node.inputs:
            tp = TypeProto()
            vi = graph.value_info.get(i) if i else None
            if vi is None and i in graph.initializers:
                from ..ir import ValueInfo
                from ..dtypes import onnx_type
                arr = graph.initializers[i]
                vi = ValueInfo(i, arr.dtype, tuple(arr.shape), onnx_type(arr.dtype))
            if vi is not None:
                tp.CopyFrom(valueinfo_to_proto(vi).type)
            types.append(tp.SerializeToString())
        proto = node.to_proto().SerializeToString()
        try:  # onnx's C++ builds the body from an untrusted node: isolated (runtime.isolate)
            b = isolate.call("context_dependent_body", (node.op_type, node.opset, node.domain, max(ctxdep), proto,
                                                        types), f"function builder for {node.op_type}")
        except isolate.IsolatedStepError:
            return None
        if not b:
            return None
        f.ParseFromString(b)
        return f
    return None


class ExpandFunctions(Pass):
    name = "expand_functions"

    def __init__(self, has_kernel):
        self.has_kernel = has_kernel
        self.counter = 0

    def call(self, graph: Graph) -> PassResult:
        changed_names = []
        for _ in range(16):
            new_nodes = []
            changed = False
            for node in graph.nodes:
                if self.has_kernel(node):
                    new_nodes.append(node)
                    continue
                f = function_body(node, graph)
                if f is None:
                    new_nodes.append(node)
                    continue
                new_nodes.extend(self._inline(node, f, graph))
                changed = True
                changed_names.append(node.name)
            graph.nodes = new_nodes
            if not changed:
                break
        return PassResult(bool(changed_names), changed_names)

    def _inline(self, node: Node, f: FunctionProto, graph: Graph) -> list:
        self.counter += 1
        prefix = f"{node.name or node.op_type}/{f.name}{self.counter}/"
        m = {}
        for i, formal in enumerate(f.input):
            m[formal] = node.inputs[i] if i < len(node.inputs) else ""
        for i, formal in enumerate(f.output):
            actual = node.outputs[i] if i < len(node.outputs) else ""
            m[formal] = actual or graph.unique_name(prefix + formal)

        def ren(x):
            if not x:
                return ""
            if x not in m:
                m[x] = graph.unique_name(prefix + x)
            return m[x]

        node_attrs = {a.name: a for a in (node.attr_protos or [])}
        if node.attr_protos is None:
            node_attrs = {k: helper.make_attribute(k, v) for k, v in node.attrs.items()}
        defaults = {a.name: a for a in f.attribute_proto}
        schema = _schema(node)
        for name, sa in (schema.attributes.items() if schema is not None else ()):
            dv = sa.default_value
            if name not in defaults and dv is not None and dv.type != AttributeProto.UNDEFINED:
                defaults[name] = dv  # the schema's default, where the body declares none
        fopsets = {o.domain: o.version for o in f.opset_import}
        for o in f.opset_import:
            graph.opsets.setdefault(o.domain, o.version)
        out = []
        for bn in f.node:
            attrs = []
            for a in bn.attribute:
                if a.ref_attr_name:
                    src = node_attrs.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                    if src is None:
                        continue
                    na = AttributeProto()
                    na.CopyFrom(src)
                    na.name = a.name
                    attrs.append(na)
                elif a.type == AttributeProto.GRAPH:
                    na = AttributeProto()
                    na.CopyFrom(a)
                    _rename_free(na.g, ren)
                    attrs.append(na)
                else:
                    attrs.append(a)
            dom = bn.domain if bn.domain != "ai.onnx" else ""
            opset = fopsets.get(dom, fopsets.get("ai.onnx") if dom == "" else None) or graph.opsets.get(dom, node.opset)
            out.append(Node(bn.op_type, [ren(i) for i in bn.input], [ren(o) for o in bn.output],
                            {a.name: attr_value(a) for a in attrs}, prefix + (bn.name or bn.op_type), dom, opset,
                            attrs))
        return out


def _rename_free(g: GraphProto, ren) -> None:
    """Rename names a subgraph reads from outside (after they were renamed in the parent)."""
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        for k, i in enumerate(n.input):
            if i and i not in defined:
                n.input[k] = ren(i)
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                _rename_free(a.g, lambda x, d=set(defined): x if x in d else ren(x))
        defined.update(n.output)
    for o in g.output:
        if o.name not in defined:
            o.name = ren(o.name)
