"""CUDA data movement: Transpose, Concat, Split, Slice, Expand.

Every op is one strided copy: ``dst[doff + sum_k i_k * ds_k] = src[soff + sum_k i_k * ss_k]`` over an index
box of up to six axes (element strides; a source stride is negative for a negative Slice step and zero for an
Expand broadcast).  The wrapper drops unit axes, merges axes that are contiguous in both operands and pads
the box on the left to the canonical rank 6, so ``_copy6`` compiles once per dtype.  Concat launches one copy
per input into its window of the output; Split one per output.

Invariants (match ``ops/movement.py`` and ``ops/split_slice.py``, whose binds these launches share):
- Slice's starts/ends/axes/steps, Split's ``split`` input and Expand's ``shape`` are host inputs
  (``host_inputs``): they size the launch, so they are read on the host, never from the device;
- clamping and negative steps follow Python's ``slice.indices`` exactly like the CPU wrapper; errors are the
  CPU's (``InvalidArgumentError``/``InvalidAttributeError``/``ShapeMismatchError``);
- a copy whose box still needs more than six axes after merging raises ``ShapeMismatchError``;
- outputs are C-contiguous device arrays.  A result that is one contiguous run of the input in order (a
  Split along an axis with only unit axes before it, a Slice of whole trailing axes under unit outer ones,
  a Transpose that moves only unit axes) is a view of it and launches nothing; these ops register with
  ``views=True`` so the plan treats them as aliases.  Every other result is a fresh array.
"""
from __future__ import annotations

import numpy as np

from ops._common import as_int_list, broadcast_shape, norm_axis
from ops._common import Plain
from ops.movement import (CONCAT_BINDS, ConcatOp, TransposeOp, bind_expand, bind_transpose, concat_shape, merge_axes,
                          transpose_perm)
from ops.split_slice import SLICE_BINDS, SPLIT_BINDS, SliceOp, SplitOp, slice_bounds, split_sizes
from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import ShapeMismatchError
from ._common import check_device, flat, grid1d

__all__ = ["transpose", "launch_transpose", "launch_concat", "launch_split", "launch_slice", "launch_expand",
           "strided_copy", "broadcast_to"]

CUDA = "CUDAExecutionProvider"
RANK = 6


@jit
def _copy6(src, soff, s0, s1, s2, s3, s4, s5, dst, doff, d0, d1, d2, d3, d4, d5, n1, n2, n3, n4, n5, total):
    """Grid-stride copy over a 6-axis box (extents (., n1..n5), ``total`` elements)."""
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, total, step):
        t = i
        i5 = t % n5
        t //= n5
        i4 = t % n4
        t //= n4
        i3 = t % n3
        t //= n3
        i2 = t % n2
        t //= n2
        i1 = t % n1
        i0 = t // n1
        so = soff + i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3 + i4 * s4 + i5 * s5
        do = doff + i0 * d0 + i1 * d1 + i2 * d2 + i3 * d3 + i4 * d4 + i5 * d5
        dst[do] = src[so]


def _cstrides(shape) -> list:
    """Element strides of a C-contiguous array of ``shape``."""
    st = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        st[k] = st[k + 1] * int(shape[k + 1])
    return st


def _box(op, extents, sstr, dstr) -> list:
    """(extent, src stride, dst stride) per axis: unit axes dropped, mergeable neighbours merged, padded to 6."""
    merged = merge_axes([int(n) for n in extents], [int(s) for s in sstr], [int(d) for d in dstr])
    if len(merged) > RANK:
        raise ShapeMismatchError(f"{op}: the copy needs {len(merged)} axes after merging, the CUDA kernel supports "
                                 f"at most {RANK}")
    return [(1, 0, 0)] * (RANK - len(merged)) + merged


def strided_copy(op, src, soff, sstr, dst, doff, dstr, extents) -> None:
    """Copy the box ``extents`` of ``src`` (offset/strides in elements) into ``dst`` (offset/strides)."""
    total = int(np.prod([int(n) for n in extents], dtype=np.int64)) if len(extents) else 1
    if total == 0:
        return
    b = _box(op, extents, sstr, dstr)
    blocks, threads = grid1d(total)
    _copy6[blocks, threads](flat(src), int(soff), *[s for _, s, _ in b], flat(dst), int(doff),
                            *[d for _, _, d in b], *[n for n, _, _ in b[1:]], total)


def broadcast_to(op, x, shape):
    """A fresh device array: ``x`` broadcast (numpy rules, right-aligned) to ``shape``."""
    shape = tuple(int(s) for s in shape)
    xs = tuple(x.shape)
    if len(xs) > len(shape) or any(a != b and a != 1 for a, b in zip(xs[::-1], shape[::-1])):
        raise ShapeMismatchError(f"{op}: shape {list(xs)} does not broadcast to {list(shape)}")
    out = rc.device_empty(shape, x.dtype)
    lead = len(shape) - len(xs)
    xst = _cstrides(xs)
    sst = [0] * lead + [0 if xs[k] == 1 else xst[k] for k in range(len(xs))]
    strided_copy(op, x, 0, sst, out, 0, _cstrides(shape), shape)
    return out


# -- Transpose -------------------------------------------------------------------------------------

def launch_transpose(b: TransposeOp, ctx=None):
    """The CUDA implementation of Transpose (its bind and permutation are ``ops.movement``'s)."""
    def run(data):
        return transpose(data, b)
    return run


def transpose(data, b: TransposeOp):
    check_device("Transpose", data=data)
    p = transpose_perm(data.ndim, b)
    shape = tuple(data.shape)
    oshape = tuple(shape[a] for a in p)
    moved = [a for a in p if shape[a] != 1]
    if moved == sorted(moved):  # only unit axes move: the same elements in the same order
        return data.reshape(oshape)
    out = rc.device_empty(oshape, data.dtype)
    sst = _cstrides(shape)
    strided_copy("Transpose", data, 0, [sst[a] for a in p], out, 0, _cstrides(oshape), oshape)
    return out


op("Transpose", 1, views=True, provider=CUDA, bind=bind_transpose)(launch_transpose)


# -- Concat / Split --------------------------------------------------------------------------------

def _concat(inputs, axis):
    xs = [x for x in inputs if x is not None]
    check_device("Concat", **{f"input{k}": x for k, x in enumerate(xs)})
    ax, dt, shape = concat_shape(xs, axis)
    out = rc.device_empty(shape, dt)
    dst = _cstrides(shape)
    off = 0
    for x in xs:
        n = x.shape[ax]
        if n and x.size:
            strided_copy("Concat", x, 0, _cstrides(x.shape), out, off * dst[ax], dst, tuple(x.shape))
        off += n
    return out


def launch_concat(b: ConcatOp, ctx=None):
    """The CUDA implementation of Concat (its bind is ``ops.movement``'s)."""
    def run(*inputs):
        return _concat(inputs, b.axis)
    return run


for _v, _bind in CONCAT_BINDS:
    op("Concat", _v, provider=CUDA, bind=_bind)(launch_concat)


def _window(x, off, oshape):
    """The contiguous run of ``x`` from element ``off`` viewed as ``oshape`` (no copy)."""
    n = int(np.prod(oshape, dtype=np.int64))
    return flat(x)[off:off + n].reshape(tuple(oshape))


def _split(x, b: SplitOp, split):
    check_device("Split", input=x)
    ax = norm_axis(b.axis, x.ndim)
    parts = split_sizes(b, x.shape[ax], ax, split)
    shape = tuple(x.shape)
    sst = _cstrides(shape)
    as_views = all(d == 1 for d in shape[:ax])  # every part is one contiguous run of x
    outs = []
    off = 0
    for n in parts:
        oshape = shape[:ax] + (n,) + shape[ax + 1:]
        if as_views:
            o = _window(x, off * sst[ax], oshape)
        else:
            o = rc.device_empty(oshape, x.dtype)
            strided_copy("Split", x, off * sst[ax], sst, o, 0, _cstrides(oshape), oshape)
        outs.append(o)
        off += n
    return outs[0] if b.n_out == 1 else tuple(outs)


def launch_split(b: SplitOp, ctx=None):
    """The CUDA implementation of Split (its binds and part sizes are ``ops.split_slice``'s); the split input is
    read on the host."""
    def run(input, split=None):
        return _split(input, b, split)
    return run


for _v, _bind in SPLIT_BINDS:  # Split-2 takes no split input
    op("Split", _v, views=True, provider=CUDA, host_inputs=() if _v == 2 else (1,), bind=_bind)(launch_split)


# -- Slice -----------------------------------------------------------------------------------------

def _slice(x, bounds):
    """``x`` sliced by ``bounds`` (``ops.split_slice.slice_bounds``): a view when the result is one contiguous
    run of ``x``, else a strided copy."""
    r = x.ndim
    shape = tuple(x.shape)
    begin = [0] * r
    step = [1] * r
    oshape = list(shape)
    for a, b, c, p in bounds:
        begin[a], step[a], oshape[a] = b, p, len(range(b, c, p))
    xst = _cstrides(shape)
    soff = sum(begin[k] * xst[k] for k in range(r))
    # A box whose outer axes have extent 1, then one axis of step 1, then whole axes, is one contiguous run.
    lead = next((k for k in range(r) if oshape[k] != 1), r)
    if lead == r or (step[lead] == 1 and all(oshape[k] == shape[k] and step[k] == 1 for k in range(lead + 1, r))):
        return _window(x, soff, oshape)
    out = rc.device_empty(tuple(oshape), x.dtype)
    if out.size:
        strided_copy("Slice", x, soff, [xst[k] * step[k] for k in range(r)], out, 0, _cstrides(oshape), oshape)
    return out


def launch_slice(b: SliceOp, ctx=None):
    """The CUDA implementation of Slice (its binds and bounds are ``ops.split_slice``'s); from opset 10 the starts,
    ends, axes and steps inputs are read on the host."""
    def run(data, starts=None, ends=None, axes=None, steps=None):
        check_device("Slice", data=data)
        return _slice(data, slice_bounds(b, tuple(data.shape), starts, ends, axes, steps))
    return run


for _v, _bind in SLICE_BINDS:
    op("Slice", _v, views=True, provider=CUDA, host_inputs=(1, 2, 3, 4) if _v > 1 else (), bind=_bind)(launch_slice)


# -- Expand ----------------------------------------------------------------------------------------

def launch_expand(b: Plain, ctx=None):
    """The CUDA implementation of Expand (its bind is ``ops.movement``'s)."""
    def run(input, shape):
        check_device("Expand", input=input)
        return broadcast_to("Expand", input, broadcast_shape(tuple(input.shape), tuple(as_int_list(shape))))
    return run


op("Expand", 8, provider=CUDA, host_inputs=(1,), bind=bind_expand)(launch_expand)
