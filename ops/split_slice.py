"""Split and Slice on the CPU, written to the one op contract (``ops/registry.py``).

Each op has one bind per group of versions that share attributes (``SPLIT_BINDS``, ``SLICE_BINDS``); the CPU
wrapper here, the region form (``ops/compiled_forms.py``, Split) and the CUDA launch (``ops/cuda/shape.py``)
register with the same bind at each version and read the bound op, never the node's attributes.  The
geometry both kernels need is computed once here: ``split_sizes`` (the parts along the axis) and
``slice_bounds`` (each sliced axis's begin, end and step, as ``slice.indices`` resolves them).

Split: before opset 13 the part sizes are an attribute (opset 1 also takes them as a second input, which wins);
from 13 on only the input; opset 18 adds ``num_outputs`` (ceil-sized parts, the last one shorter), exclusive
with the input.  Slice: before opset 10 starts, ends and axes are attributes; from 10 on they and steps are
inputs.

Invariants: the bind does every check that needs no tensor (attribute shapes, which of split input and
``num_outputs`` is given, ``num_outputs`` against the node's outputs); checks on tensors raise at run time.
Outputs are fresh C-contiguous arrays copied by ``ops.movement.materialize`` (into the plan's buffers when
given: ``writes_out``); inputs are never written.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from runtime.errors import InvalidArgumentError, InvalidAttributeError
from ._common import Resolved, as_int_list, norm_axis, value_key
from .movement import contig, materialize, out_of
from .registry import op

__all__ = ["SplitOp", "SPLIT_BINDS", "split_sizes", "split_cpu", "SliceOp", "SLICE_BINDS", "slice_bounds",
           "slice_cpu"]


def _ints(v):
    return None if v is None else tuple(int(d) for d in as_int_list(v))


def _has_input(ctx, k: int) -> bool:
    """Input ``k`` of the node is given (trailing absent inputs may or may not be counted in ``n_inputs``)."""
    if k >= ctx.n_inputs:
        return False
    node = ctx.node
    return node is None or k >= len(node.inputs) or bool(node.inputs[k])


# -- Split -----------------------------------------------------------------------------------------

class SplitOp(NamedTuple):
    """Split bound: its axis, its output count, the part sizes the ``split`` attribute gives (before opset 13;
    None when absent) and whether ``num_outputs`` asks for ceil-sized parts (opset 18)."""
    axis: int
    n_out: int
    sizes: Any
    ceil: bool


def bind_split_1(ctx, axis=0, split=None):
    """Split-1 and Split-2: sizes as an attribute (Split-1's optional second input overrides it)."""
    return SplitOp(int(axis), ctx.n_outputs, _ints(split), False)


def bind_split_13(ctx, axis=0):
    return SplitOp(int(axis), ctx.n_outputs, None, False)


def bind_split(ctx, axis=0, num_outputs=None):
    given = _has_input(ctx, 1)
    if given and num_outputs is not None:
        raise InvalidAttributeError("Split: give either the split input or num_outputs, not both")
    if not given and num_outputs is None:
        raise InvalidAttributeError("Split: one of the split input or the num_outputs attribute is required")
    if num_outputs is not None and int(num_outputs) != ctx.n_outputs:
        raise InvalidAttributeError(f"Split: num_outputs={num_outputs} but the node has {ctx.n_outputs} outputs")
    return SplitOp(int(axis), ctx.n_outputs, None, num_outputs is not None)


SPLIT_BINDS = ((1, bind_split_1), (2, bind_split_1), (13, bind_split_13), (18, bind_split))


def split_sizes(b: SplitOp, d: int, ax: int, split=None) -> list:
    """Split's part sizes along axis ``ax`` of extent ``d``: the ``split`` input (else the bound attribute sizes),
    ceil-sized parts for ``num_outputs``, or equal parts; shared with the CUDA kernel."""
    n_out = b.n_out
    parts = as_int_list(split if split is not None else b.sizes)
    if parts:
        if len(parts) != n_out or sum(parts) != d or min(parts) < 0:
            raise InvalidArgumentError(f"Split: split {parts} must be {n_out} non-negative sizes summing to {d}")
        return parts
    if b.ceil:
        c = -(-d // n_out)
        return [min(c, max(d - i * c, 0)) for i in range(n_out)]
    if d % n_out:
        raise InvalidArgumentError(f"Split: axis {ax} of size {d} cannot be split into {n_out} equal parts")
    return [d // n_out] * n_out


def split_cpu(b: SplitOp, ctx):
    """Split on the CPU (the region form and the CUDA launch share the bind)."""
    bufs = ctx.out

    def run(input, split=None):
        x = contig(input)
        ax = norm_axis(b.axis, x.ndim)
        outs = []
        off = 0
        idx = [slice(None)] * x.ndim
        for i, n in enumerate(split_sizes(b, x.shape[ax], ax, split)):
            idx[ax] = slice(off, off + n)
            outs.append(materialize(x, x[tuple(idx)], bufs[i] if i < len(bufs) else None))
            off += n
        return outs[0] if b.n_out == 1 else tuple(outs)
    return run


for _v, _bind in SPLIT_BINDS:
    op("Split", _v, bind=_bind, writes_out=True)(split_cpu)


# -- Slice -----------------------------------------------------------------------------------------

class SliceOp(NamedTuple):
    """Slice bound.  Before opset 10 starts, ends and axes are attributes, held here checked as the lists
    (starts, ends, axes, steps) (``given``); from 10 on they and steps are inputs and ``given`` is None."""
    given: Any


def slice_lists(starts, ends, axes, steps) -> tuple:
    """(starts, ends, axes, steps) as int lists, axes and steps filled in when absent or empty, after checking
    they have one length; starts and ends are required."""
    if starts is None or ends is None:
        raise InvalidArgumentError(f"Slice: starts and ends are required, got starts={starts!r} and ends={ends!r}")
    st = as_int_list(starts)
    en = as_int_list(ends)
    ax = list(range(len(st))) if axes is None or len(as_int_list(axes)) == 0 else as_int_list(axes)
    sp = [1] * len(st) if steps is None or len(as_int_list(steps)) == 0 else as_int_list(steps)
    if not (len(st) == len(en) == len(ax) == len(sp)):
        raise InvalidArgumentError(f"Slice: starts {st}, ends {en}, axes {ax} and steps {sp} differ in length")
    return st, en, ax, sp


def bind_slice_1(ctx, axes=None, ends=None, starts=None):
    return SliceOp(slice_lists(starts, ends, axes, None))


def bind_slice(ctx):
    return SliceOp(None)


SLICE_BINDS = ((1, bind_slice_1), (10, bind_slice))


def slice_bounds(b: SliceOp, shape, starts=None, ends=None, axes=None, steps=None) -> list:
    """Slice resolved against ``shape``: ``(axis, begin, end, step)`` per sliced axis, as ``slice.indices`` gives
    them, from the bound attributes or (from opset 10) the inputs; the CPU and CUDA kernels share it."""
    st, en, ax, sp = b.given if b.given is not None else slice_lists(starts, ends, axes, steps)
    r = len(shape)
    out, seen = [], set()
    for s, e, a, p in zip(st, en, ax, sp):
        a = norm_axis(a, r)
        if a in seen:
            raise InvalidArgumentError(f"Slice: axes {ax} repeat axis {a}")
        seen.add(a)
        if p == 0:
            raise InvalidArgumentError("Slice: steps must be non-zero")
        out.append((a,) + slice(s, e, p).indices(int(shape[a])))
    return out


def slice_cpu(b: SliceOp, ctx):
    """Slice on the CPU (the CUDA launch shares the bind).  The index resolved for an input shape and the
    values of starts, ends, axes and steps is kept (a few of them; a model slices the same way every run)."""
    buf = out_of(ctx)
    resolved = Resolved()

    def index(shape, starts, ends, axes, steps):
        idx = [slice(None)] * len(shape)
        for a, s, e, p in slice_bounds(b, shape, starts, ends, axes, steps):
            idx[a] = slice(s, e if e >= 0 else None, p)
        return tuple(idx)

    def run(data, starts=None, ends=None, axes=None, steps=None):
        x = contig(data)
        key = (x.shape, value_key(starts), value_key(ends), value_key(axes), value_key(steps))
        return materialize(x, x[resolved.get(key, lambda: index(x.shape, starts, ends, axes, steps))], buf)
    return run


for _v, _bind in SLICE_BINDS:
    op("Slice", _v, bind=_bind, writes_out=True)(slice_cpu)
