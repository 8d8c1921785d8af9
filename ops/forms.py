"""The region forms' machinery: the emitter a form writes its block with, and the forms' registry.

``runtime.regions`` fuses a run of nodes into one ``@njit`` function; each node's block of that function comes
from its *form*.  A form reads the node's static facts (input dtypes and ranks, attributes, initializer values
used as parameters) and emits lines with placeholders ``{i0}``.. for the input variables, ``{o0}``.. for the
outputs and ``{p}`` for a per-node prefix of temporaries; the variable ``nthreads`` holds Numba's thread count.

Forms register in ``ops.registry`` under the provider ``REGION``, with versions like any implementation.  An
op written to the one contract registers its form with the op's ``bind``: the form then receives the bound
op its CPU wrapper and CUDA launch also receive, and emits a call to the op's typed driver (its checks
return an error code, raised here with the messages the op's module writes once).  Ops not yet written
that way register a form that reads the node's attributes itself.

A form raises ``Decline`` for anything it does not express (a dtype, an attribute value, an unknown rank);
the node then runs through its wrapper.  A bind that fails leaves the node to its wrapper too, whose own
bind reports the error naming the node.  Forms keep the invariants stated in ``runtime/regions.py``:
contiguous values, no writes into inputs, views only where the wrapper returns views, and errors that name
the node.
"""
from __future__ import annotations

import numpy as np

from runtime.errors import OnnxNumbaError
from . import registry

__all__ = ["Decline", "Emitted", "emit", "form", "form_of", "NODE"]

F32 = np.dtype(np.float32)


class Decline(Exception):
    """The form cannot express this node; it runs through its wrapper instead."""


def _known(fact, what):
    """A static fact a form needs; a form cannot express a node whose fact is unknown."""
    if fact is None:
        raise Decline(f"unknown {what}")
    return fact


class _DtypeOnly:
    """An output's type as the region planner knows it: its dtype (or None)."""
    __slots__ = ("dtype",)

    def __init__(self, dtype):
        self.dtype = dtype


# -- the emitter -----------------------------------------------------------------------------------

class Emitted:
    """One node's block: lines with placeholders, and the imports they need."""

    def __init__(self, node, types):
        self.node = node
        self.t = types
        self.lines = []
        self.imports = {}
        self.declared = {}
        self.constants = []  # arrays prepared at plan time (repacked weights), passed to the region as arguments
        # The block gives the node's wrapper's bits for every input.  A form whose kernels sum floats in another
        # order than the wrapper's for some shapes says False: regions are then never chosen for it behind the
        # user's back (runtime/region_tuner.py), since a run would give other bits than the runs before it.
        self.exact = True

    # static facts
    @property
    def attrs(self):
        return self.node.attrs

    def has(self, k):
        return k < len(self.node.inputs) and bool(self.node.inputs[k])

    def dtype(self, k):
        return _known(self.t.dtype(self.node.inputs[k]), "dtype")

    def rank(self, k):
        return _known(self.t.rank(self.node.inputs[k]), "rank")

    def out_rank(self, k):
        return _known(self.t.rank(self.node.outputs[k]), "output rank")

    def out_dtype(self, k):
        return _known(self.t.dtype(self.node.outputs[k]), "output dtype")

    def const(self, k):
        return self.t.const(self.node.inputs[k]) if self.has(k) else None

    def donated(self, k):
        """Input ``k`` is a graph input read by this node only, which the caller lets it overwrite."""
        return self.has(k) and self.node.inputs[k] in getattr(self.t, "donated", ())

    def used(self, k):
        return k < len(self.node.outputs) and bool(self.node.outputs[k])

    def context(self):
        """The node's plan-time facts as an ``OpContext``, for the op's bind (output dtypes where known)."""
        n = self.node
        return registry.OpContext(
            name=n.name, op_type=n.op_type, domain=n.domain, opset=n.opset, attrs=n.attrs, n_inputs=len(n.inputs),
            n_outputs=len(n.outputs), outputs_used=[bool(o) for o in n.outputs], node=n,
            output_types=[_DtypeOnly(self.t.dtype(o)) if o else None for o in n.outputs])

    # code
    def use(self, obj_module: str, attr: str) -> str:
        alias = f"{attr.strip('_')}__{obj_module.replace('.', '_')}"
        self.imports[alias] = (obj_module, attr)
        return alias

    def line(self, *lines):
        self.lines.extend(lines)

    def constant(self, array) -> str:
        """A plan-time array (derived from initializers) the block reads; returns its placeholder."""
        self.constants.append(np.ascontiguousarray(array))
        return f"{{c{len(self.constants) - 1}}}"

    def declare(self, k, dtype=None, rank=None):
        """State output ``k``'s dtype and rank (kept only if the form succeeds), for later forms to read."""
        if self.used(k):
            self.declared[self.node.outputs[k]] = (None if dtype is None else np.dtype(dtype), rank)

    def render(self, names, prefix):
        """The block's lines with ``names`` (value name -> variable) filled in and ``prefix`` before every
        temporary; the node is called ``@node@`` in error messages (``runtime.regions`` puts its name back)."""
        m = {"p": prefix}
        for k, x in enumerate(self.node.inputs):
            m[f"i{k}"] = names[x] if x else "None"
        for k, x in enumerate(self.node.outputs):
            m[f"o{k}"] = names[x] if x else f"{m['p']}_unused{k}"
        for k in range(len(self.constants)):
            m[f"c{k}"] = f"{m['p']}_const{k}"
        return [ln.format(**m) for ln in self.lines]

    def constant_names(self, prefix):
        return [f"{prefix}_const{k}" for k in range(len(self.constants))]

    def signature(self):
        """What the block's code depends on besides the names of its values: the op, the lines with their
        placeholders (attributes and parameter values are baked into them), the constants' dtypes and shapes,
        the inputs' dtypes and ranks.  Two nodes with equal signatures generate the same code."""
        ins = tuple((self.t.dtype(x), self.t.rank(x)) if x else None for x in self.node.inputs)
        outs = tuple(bool(x) for x in self.node.outputs)
        consts = tuple((c.dtype.str, c.shape) for c in self.constants)
        return (self.node.domain, self.node.op_type, tuple(self.lines), consts, ins, outs,
                tuple(sorted(self.imports.items())))


def form(*op_types, domain="", since=1, bind=None):
    """Register the decorated form of ``op_types`` in the versioned registry (provider ``REGION``) from
    ``since`` on.  With ``bind`` (the op's contract, the one its wrapper registers) the form is called as
    ``form(e, bound)`` and emits its block from the bound op; otherwise as ``form(e)``."""
    def deco(fn):
        for t in op_types:
            registry.op(t, since, domain, provider=registry.REGION, bind=bind)(fn)
        return fn
    return deco


def form_of(node):
    """The registered form for ``node`` at its opset (an opset of 0, unknown, takes the newest), or None."""
    return registry.resolve(node.domain, node.op_type, node.opset or 1 << 30, registry.REGION)


def numba_typed(dt) -> bool:
    """Whether compiled code can hold arrays of ``dt`` (None: not known yet): Numba types no float16, bfloat16,
    float8 or string arrays."""
    return dt is None or dt.kind in "biuc" or dt.name in ("float32", "float64")


def emit(node, types, used_after=None):
    """The node's Emitted block, or None when its form declines (or it has none).  A node with an input or output
    that compiled code cannot hold (``numba_typed``) is declined before its form is asked, whatever the form:
    a view op's form would otherwise pass a float16 value through."""
    impl = form_of(node)
    if impl is None:
        return None
    if not all(numba_typed(types.dtype(x)) for x in list(node.inputs) + list(node.outputs) if x):
        return None
    e = Emitted(node, types)
    try:
        if impl.contract is not None:
            try:
                bound = impl.contract(e.context(), **node.attrs)
            except (TypeError, OnnxNumbaError):  # the wrapper's own bind reports it, naming the node
                return None
            impl.fn(e, bound)
        else:
            impl.fn(e)
    except Decline:
        return None
    for name, (dt, r) in e.declared.items():
        known_dt, known_r = types.dtype(name), types.rank(name)
        types.declared[name] = (known_dt if known_dt is not None else dt, known_r if known_r is not None else r)
    return e


def np_type(dt) -> str:
    dt = np.dtype(dt)
    names = {"float32": "np.float32", "float64": "np.float64", "int64": "np.int64", "int32": "np.int32",
             "int8": "np.int8", "uint8": "np.uint8", "bool": "np.bool_", "int16": "np.int16",
             "uint16": "np.uint16", "uint32": "np.uint32", "uint64": "np.uint64"}
    if dt.name not in names:
        raise Decline(f"dtype {dt}")
    return names[dt.name]


def _shape_tuple(var, rank, dims=None):
    dims = range(rank) if dims is None else dims
    parts = [f"{var}.shape[{d}]" for d in dims]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def product_expr(parts):
    return " * ".join(parts) if parts else "1"


NODE = "@node@"  # stands for the node's name in generated error messages, so code never depends on names


def quote(node):
    return f"node '{NODE}' ({node.op_type})"


def float_only(e, *ks):
    for k in ks:
        if e.has(k) and e.dtype(k) != F32:
            raise Decline("float32 only")


def raise_on(e, var, table):
    """Emit ``if var == code: raise Class("node ...: message")`` for each (code, class name, message)."""
    who = quote(e.node).replace("{", "{{").replace("}", "}}").replace("\\", "/")
    for j, (code, cls, msg) in enumerate(table):
        alias = e.use("runtime.errors", cls)
        e.line(f"{'if' if j == 0 else 'elif'} {var} == {code}:",
               f"    raise {alias}(\"{who}: {msg}\")")
