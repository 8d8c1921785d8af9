"""The planning both plans share: value slots, kernel resolution, liveness, each node's context and binding.

``executor.Plan`` (the CPU) and ``cuda_plan.CudaPlan`` (the CUDA provider) build on the same pieces:
- ``Slots``: every value name given an integer slot, in one order (slot 0 the empty name, then the
  initializers, the feeds, the outer-scope names a subgraph reads, then each node's outputs in topological
  order), and the checks that the graph is well formed (no value produced twice, every output produced);
- ``liveness``: the slots each step reads, the last step reading each slot and the alias roots of each slot;
- ``node_inputs``, ``node_context``, ``bind_node``: a node's input slots (its subgraphs' captures after its
  declared inputs), the ``OpContext`` its kernel is bound with and the binding itself, whose errors name the
  node;
- ``frees_of``: the slots a step releases after it runs (the values it reads last, never an initializer).

The rule for which graph inputs a kernel may write into is ``Graph.donatable_inputs`` (one rule, both plans).
"""
from __future__ import annotations

import math
import time

import numpy as np

from ops import registry
from .errors import ModelLoadError, OnnxNumbaError
from .ir import free_names, subgraphs

__all__ = ["Slots", "observed", "store", "liveness", "node_inputs", "node_context", "bind_node", "frees_of", "check_static_sizes",
           "KernelError", "raise_at"]


class KernelError(OnnxNumbaError, RuntimeError):
    """A kernel failed while running a node."""


def raise_at(node, e, on: str = ""):
    """Re-raise ``e``, raised by the step that runs ``node``, with the node named (and where it ran)."""
    where = f"node {node.name!r} ({node.op_type}, domain {node.domain or 'ai.onnx'!r}, opset {node.opset}{on})"
    if isinstance(e, OnnxNumbaError):
        try:
            err = type(e)(f"{where}: {e}")
        except Exception:  # a class whose constructor takes more than a message (UnsupportedOpError names nodes)
            raise e from None
        raise err from e
    raise KernelError(f"{where} failed: {type(e).__name__}: {e}") from e


def observed(k, fn, observer):
    """``fn`` (step ``k``'s) wrapped to call ``observer.before(k)`` and ``observer.after(k, args, result, t0_ns)``
    around it (one run's worth: profiling, ``RunOptions.terminate``)."""
    clock = time.perf_counter_ns

    def call(*args):
        observer.before(k)
        t0 = clock()
        r = fn(*args)
        observer.after(k, args, r, t0)
        return r
    return call


def store(vals, out, r) -> None:
    """A step's result into its output slot(s) (``out``: one slot, or a tuple of slots for several results)."""
    if out.__class__ is int:
        vals[out] = r
    else:
        for o, x in zip(out, r):
            vals[o] = x


class Slots:
    """A plan's value slots (see the module docstring); ``values`` is the run template (initializers set)."""

    def __init__(self, graph):
        self.slot_of: dict[str, int] = {"": 0}
        self.values: list = [None]
        for name, arr in graph.initializers.items():
            self.new(name, arr)
        self.init_slots = set(self.slot_of.values()) - {0}
        self.input_names = [v.name for v in graph.inputs]
        self.input_slots = [self.new(n) for n in self.input_names]
        # Names a subgraph reads from its enclosing scope arrive like feeds.
        self.outer_names = sorted(getattr(graph, "outer_names", set()) - set(self.slot_of))
        self.outer_slots = [self.new(n) for n in self.outer_names]

    def new(self, name, value=None) -> int:
        self.slot_of[name] = len(self.values)
        self.values.append(value)
        return self.slot_of[name]

    def produce(self, node) -> None:
        """Slots for the node's outputs."""
        for o in node.outputs:
            if o:
                if self.slot_of.get(o, 0) != 0:
                    raise ModelLoadError(f"value {o!r} is produced twice (node {node.name!r})")
                self.new(o)

    def outputs(self, graph) -> tuple[list, list]:
        """(names, slots) of the graph outputs, each produced by a node, a feed or an initializer."""
        names = [v.name for v in graph.outputs]
        for n in names:
            if n not in self.slot_of:
                raise ModelLoadError(f"graph output {n!r} is not produced by any node, input or initializer")
        return names, [self.slot_of[n] for n in names]

    def discard(self) -> int:
        """A slot that results of outputs a node leaves unnamed land in, and nothing reads."""
        self.values.append(None)
        return len(self.values) - 1


def liveness(graph, impls, slot_of, nslots, output_slots):
    """(slots each step reads, the last step reading each slot, alias roots of each slot).

    Subgraph captures count as reads; graph outputs live past the last step (``len(nodes) + 1``).  A view
    op's outputs may share memory with any of its inputs, so each value carries the set of root values
    whose memory it may reference."""
    last_use = [-1] * nslots
    step_reads = []
    for i, node in enumerate(graph.nodes):
        reads = {slot_of[x] for x in node.inputs if x}
        for g in subgraphs(node):
            reads |= {slot_of[x] for x in free_names(g) if x in slot_of}
        step_reads.append(reads)
        for s in reads:
            last_use[s] = i
    for s in output_slots:
        last_use[s] = len(graph.nodes) + 1
    roots = [(s,) for s in range(nslots)]
    for node, impl in zip(graph.nodes, impls):
        if impl is not None and impl.views:
            rs = tuple(sorted({r for x in node.inputs if x for r in roots[slot_of[x]]}))
            for o in node.outputs:
                if o and rs:
                    roots[slot_of[o]] = rs
    return step_reads, last_use, roots


def node_inputs(node, slot_of) -> tuple[list, list, tuple]:
    """(declared inputs without trailing absent ones, captured outer names, input slots): a node with subgraphs
    also receives, after its declared inputs, every value its subgraphs read from enclosing scopes."""
    ins = list(node.inputs)
    while ins and not ins[-1]:
        ins.pop()
    captured = sorted({x for g in subgraphs(node) for x in free_names(g) if x in slot_of})
    return ins, captured, tuple(slot_of[x] if x else 0 for x in ins) + tuple(slot_of[x] for x in captured)


def node_context(node, graph, ins, captured, *, provider, session_options, out=None, donated=frozenset()):
    """The ``OpContext`` a node's kernel is bound with."""
    return registry.OpContext(
        name=node.name, op_type=node.op_type, domain=node.domain, opset=node.opset,
        attrs=node.attrs, n_inputs=len(ins), n_outputs=len(node.outputs),
        input_types=[graph.value_info.get(x) if x else None for x in ins],
        output_types=[graph.value_info.get(x) if x else None for x in node.outputs],
        out=list(out) if out is not None else [None] * len(node.outputs), provider=provider,
        outputs_used=[bool(x) for x in node.outputs], node=node, graph=graph, session_options=session_options,
        captured=captured, donated=frozenset(donated))


def bind_node(impl, ctx, node):
    """``registry.bind``, its errors naming the node."""
    try:
        return registry.bind(impl, ctx)
    except OnnxNumbaError as e:
        if str(e).startswith("node "):
            raise
        raise_at(node, e)
    except Exception as e:
        raise KernelError(f"node {node.name!r} ({node.op_type}): could not bind its kernel: {e}") from e


def frees_of(i, step_reads, last_use, init_slots) -> tuple:
    """The slots step ``i`` releases after it runs."""
    return tuple(sorted(s for s in step_reads[i] if last_use[s] == i and s not in init_slots))


def check_static_sizes(graph, session_options) -> None:
    """Refuse, before anything runs, a node output whose static shape is past the output limit."""
    from ops._common import DEFAULT_MAX_OUTPUT_BYTES
    limit = int(getattr(session_options, "max_output_bytes", 0) or 0) or DEFAULT_MAX_OUTPUT_BYTES
    if not limit:
        return
    for node in graph.nodes:
        for o in node.outputs:
            vi = graph.value_info.get(o) if o else None
            shape = vi.static_shape if vi is not None and vi.dtype is not None and vi.dtype != object else None
            if shape is not None and math.prod(shape) * np.dtype(vi.dtype).itemsize > limit:
                raise ModelLoadError(
                    f"node {node.name!r} ({node.op_type}): output {o!r} of shape {list(shape)} ({np.dtype(vi.dtype)}) "
                    f"would take {math.prod(shape) * np.dtype(vi.dtype).itemsize / 2**30:.1f} GiB, more than the "
                    f"limit of {limit / 2**30:.1f} GiB (SessionOptions.max_output_bytes)")
