"""Passes that make a graph's repeated layers alike, so that compiled regions generate one function per kind.

A compiled region's source follows its nodes' structure (``runtime/regions.py``), so a layer that differs from
the others in one optional output is a layer kind of its own, compiled apart.  Decoder exports give every
layer's closing ``SkipSimplifiedLayerNormalization`` the residual sum (output 3, ``input_skip_bias_sum``) that
the next layer reads, except the last layer's, whose sum nothing reads: at 24 layers that one difference cost
a second compile of a whole layer, several seconds of a cold start.

``ExposeSkipSums`` gives such a node the output its siblings have.  The kernels compute the sum in any case (it
is the row the norm reads), so the node computes nothing more; the value has no reader.

Invariants:
- only nodes of an op some other node of the same op and domain already exposes the sum for are changed, so
  a graph with one norm, or none exposing it, is left as it is;
- the new value gets a fresh name and the value info of the node's first input (the sum has its shape and
  dtype); graph outputs and every other value are untouched.
"""
from __future__ import annotations

import copy

from .base import Pass, PassResult

__all__ = ["ExposeSkipSums"]

_SUM = 3  # input_skip_bias_sum
_OPS = {("com.microsoft", "SkipSimplifiedLayerNormalization"), ("com.microsoft", "SkipLayerNormalization")}


class ExposeSkipSums(Pass):
    """Give a skip norm without its residual-sum output one, where other norms of its op have it."""

    name = "expose_skip_sums"

    def call(self, graph) -> PassResult:
        norms = [n for n in graph.nodes if (n.domain, n.op_type) in _OPS]
        exposing = {(n.domain, n.op_type) for n in norms if len(n.outputs) > _SUM and n.outputs[_SUM]}
        changed = []
        for n in norms:
            if (n.domain, n.op_type) not in exposing or (len(n.outputs) > _SUM and n.outputs[_SUM]):
                continue
            name = graph.unique_name(f"{n.name or n.outputs[0]}/input_skip_bias_sum")
            n.outputs = list(n.outputs) + [""] * (_SUM + 1 - len(n.outputs))
            n.outputs[_SUM] = name
            vi = graph.value_info.get(n.inputs[0])
            if vi is not None:
                vi = copy.copy(vi)
                vi.name = name
                graph.value_info[name] = vi
            changed.append(n.name)
        return PassResult(bool(changed), changed)
