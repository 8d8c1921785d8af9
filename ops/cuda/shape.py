"""CUDA data movement: Transpose, Concat, Split, Slice, Expand, Tile, DepthToSpace, SpaceToDepth, ReverseSequence;
Pad and Trilu.

Every op is one strided copy: ``dst[doff + sum_k i_k * ds_k] = src[soff + sum_k i_k * ss_k]`` over an index
box of up to six axes (element strides; a source stride is negative for a negative Slice step and zero for an
Expand broadcast).  The wrapper drops unit axes, merges axes that are contiguous in both operands and pads
the box on the left to the canonical rank 6, so ``_copy6`` compiles once per dtype.  Concat launches one copy
per input into its window of the output; Split one per output.  Tile, DepthToSpace and SpaceToDepth copy the
view their CPU twins build (``ops.movement.tile_view``, ``ops.depth_space``), taken on a one-byte probe array
with the input's C strides, so the element strides come from numpy without touching data (``view_copy``).
Pad gathers through the per-axis offset maps of ``ops.pad.pad_maps`` (an entry < 0 reads the fill value):
every mode, negative pads cropping.  Trilu keeps the elements on the chosen side of diagonal ``k``.

Invariants (match ``ops/movement.py`` and ``ops/split_slice.py``, whose binds these launches share):
- Slice's starts/ends/axes/steps, Split's ``split`` input and Expand's ``shape`` are host inputs
  (``host_inputs``): they size the launch, so they are read on the host, never from the device;
- clamping and negative steps follow Python's ``slice.indices`` exactly like the CPU wrapper; errors are the
  CPU's (``InvalidArgumentError``/``InvalidAttributeError``/``ShapeMismatchError``);
- a copy whose box still needs more than six axes after merging is one launch per index of its leading axes
  (up to 4096 launches; past that ``ShapeMismatchError``);
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
from ops.depth_space import depth_to_space_view, space_to_depth_view
from ops.movement import Range as cpu_range, tile_view
from ops.pad import pad_fill, pad_geometry, pad_maps
from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import IndexOutOfRangeError, InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import check_device, flat, grid1d, host_array

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
    return [(1, 0, 0)] * (RANK - len(merged)) + merged


_MAX_SPLIT = 4096  # launches one copy may be split into when its box needs more than six axes


def strided_copy(op, src, soff, sstr, dst, doff, dstr, extents) -> None:
    """Copy the box ``extents`` of ``src`` (offset/strides in elements) into ``dst`` (offset/strides).  A box
    that still needs more than six axes after merging is copied as one launch per index of its leading axes."""
    total = int(np.prod([int(n) for n in extents], dtype=np.int64)) if len(extents) else 1
    if total == 0:
        return
    b = _box(op, extents, sstr, dstr)
    lead, b = b[:len(b) - RANK], b[len(b) - RANK:]
    if lead and int(np.prod([n for n, _, _ in lead])) > _MAX_SPLIT:
        raise ShapeMismatchError(f"{op}: the copy needs {len(lead) + RANK} axes after merging, the CUDA kernel "
                                 f"supports {RANK} (and {_MAX_SPLIT} launches over the others)")
    each = total // max(int(np.prod([n for n, _, _ in lead])), 1)
    blocks, threads = grid1d(each)
    sf, df = flat(src), flat(dst)
    for idx in np.ndindex(*[n for n, _, _ in lead]):
        so = int(soff) + sum(i * s for i, (_, s, _) in zip(idx, lead))
        do = int(doff) + sum(i * d for i, (_, _, d) in zip(idx, lead))
        _copy6[blocks, threads](sf, so, *[s for _, s, _ in b], df, do, *[d for _, _, d in b],
                                *[n for n, _, _ in b[1:]], each)


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


# -- views of the CPU twins: Tile, DepthToSpace, SpaceToDepth ---------------------------------------

def view_copy(op, x, view):
    """A fresh device array: the C-order copy of ``view(probe)``, where ``probe`` is a numpy stand-in of ``x``
    (its shape and C strides, one byte per element, no data) and ``view`` builds reshaped, transposed, indexed or
    broadcast views of it (a view's start offset is read from the probe too).  Returns the result reshaped to the shape ``view`` gives with it."""
    shape = tuple(int(d) for d in x.shape)
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape, _cstrides(shape) if shape else ())
    v, out_shape = view(probe)
    out = rc.device_empty(tuple(out_shape), x.dtype)
    if out.size:
        offset = v.__array_interface__["data"][0] - probe.__array_interface__["data"][0]  # one byte per element
        strided_copy(op, x, offset, list(v.strides), out, 0, _cstrides(v.shape), v.shape)
    return out


def _tile(ctx):
    def run(input, repeats):
        check_device("Tile", input=input)
        return view_copy("Tile", input, lambda p: tile_view(p, as_int_list(repeats)))
    return run


def _depth_to_space(ctx, blocksize=None, mode="DCR"):
    def run(input):
        check_device("DepthToSpace", input=input)
        _rank4("DepthToSpace", input)
        return view_copy("DepthToSpace", input, lambda p: depth_to_space_view(p, blocksize, mode))
    return run


def _space_to_depth(ctx, blocksize=None, mode="DCR"):
    def run(input):
        check_device("SpaceToDepth", input=input)
        _rank4("SpaceToDepth", input)
        return view_copy("SpaceToDepth", input, lambda p: space_to_depth_view(p, blocksize, mode))
    return run


def _rank4(op, x):
    if x.ndim != 4:
        raise InvalidArgumentError(f"{op}: input must be 4-D (N, C, H, W), got shape {list(x.shape)}")


op("Tile", 6, provider=CUDA, factory=True, host_inputs=(1,))(_tile)
op("DepthToSpace", 1, provider=CUDA, factory=True)(_depth_to_space)
op("SpaceToDepth", 1, provider=CUDA, factory=True)(_space_to_depth)


# -- Pad -------------------------------------------------------------------------------------------

@jit
def _gather_maps(src, maps, m0, m1, m2, m3, m4, m5, dst, fill, n1, n2, n3, n4, n5):
    """dst[i] (C order over extents (., n1..n5)) = src[sum_k maps[m_k + i_k]], or ``fill`` where an entry is < 0."""
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        t = i
        a5 = maps[m5 + t % n5]
        t //= n5
        a4 = maps[m4 + t % n4]
        t //= n4
        a3 = maps[m3 + t % n3]
        t //= n3
        a2 = maps[m2 + t % n2]
        t //= n2
        a1 = maps[m1 + t % n1]
        a0 = maps[m0 + t // n1]
        if a0 < 0 or a1 < 0 or a2 < 0 or a3 < 0 or a4 < 0 or a5 < 0:
            dst[i] = fill
        else:
            dst[i] = src[a0 + a1 + a2 + a3 + a4 + a5]


def pad(data, pads, mode="constant", value=None, axes=None):
    """Pad of the device array ``data`` (``pads``, ``value``, ``axes`` on the host), as ``ops.pad._pad``."""
    check_device("Pad", data=data)
    dt = np.dtype(data.dtype)
    if dt.kind not in "fiub":
        raise InvalidArgumentError(f"Pad: the CUDA kernel pads numeric and bool tensors, got {dt}")
    shape = tuple(int(d) for d in data.shape)
    before, after = pad_geometry(shape, pads, mode, axes)
    out = rc.device_empty(tuple(d + b + a for d, b, a in zip(shape, before, after)), dt)
    if out.size == 0:
        return out
    if len(shape) > RANK:
        raise ShapeMismatchError(f"Pad: the CUDA kernel pads tensors of rank {RANK} at most, got rank {len(shape)}")
    maps = [np.zeros(1, np.int64)] * (RANK - len(shape)) + pad_maps(shape, before, after, mode)
    starts = np.concatenate([[0], np.cumsum([len(m) for m in maps])[:-1]]).astype(np.int64)
    fill = pad_fill(value, dt)[()]
    blocks, threads = grid1d(out.size)
    _gather_maps[blocks, threads](flat(data) if data.size else rc.device_empty((1,), dt),
                                  rc.to_device(np.concatenate(maps)), *[int(v) for v in starts], flat(out), fill,
                                  *[len(m) for m in maps[1:]])
    return out


def _pad_1(ctx, mode="constant", paddings=None, value=0.0):
    return lambda data: pad(data, paddings, mode, value)


def _pad_2(ctx, mode="constant", pads=None, value=0.0):
    return lambda data: pad(data, pads, mode, value)


def _pad_11(ctx, mode="constant"):
    def run(data, pads, constant_value=None, axes=None):
        host = [None if v is None else host_array("Pad", n, v, n != "constant_value")
                for n, v in (("pads", pads), ("constant_value", constant_value), ("axes", axes))]
        return pad(data, host[0], mode, host[1], host[2])
    return run


op("Pad", 1, provider=CUDA, factory=True)(_pad_1)
op("Pad", 2, provider=CUDA, factory=True)(_pad_2)
op("Pad", 11, provider=CUDA, factory=True, host_inputs=(1, 2, 3))(_pad_11)


# -- Trilu -----------------------------------------------------------------------------------------

@jit
def _trilu(x, out, M, N, k, upper):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        c = i % N
        r = (i // N) % M
        keep = (c - r >= k) if upper else (c - r <= k)
        out[i] = x[i] if keep else x[i] * 0


def _trilu_factory(ctx, upper=1):
    def run(input, k=None):
        check_device("Trilu", input=input)
        if input.ndim < 2:
            raise InvalidArgumentError(f"Trilu: input must have rank >= 2, got shape {list(input.shape)}")
        kk = 0 if k is None else int(host_array("Trilu", "k", k).reshape(-1)[0])
        out = rc.device_empty(tuple(input.shape), input.dtype)
        if input.size:
            M, N = (int(d) for d in tuple(input.shape)[-2:])
            blocks, threads = grid1d(input.size)
            _trilu[blocks, threads](flat(input), flat(out), M, N, kk, bool(upper))
        return out
    return run


op("Trilu", 14, provider=CUDA, factory=True, host_inputs=(1,))(_trilu_factory)


# -- ConstantOfShape, Range ------------------------------------------------------------------------
# Both run on the host as shape computation when their result is an integer tensor that stays there
# (``runtime.cuda_plan.SHAPE_OPS``); these kernels make the float results (and integer ones a device kernel
# reads) on the device.  The CPU twins decide the shape, dtype and checks.

@jit
def _fill(out, v):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = v


@jit
def _arange(out, start, delta):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = start + i * delta


def _constant_of_shape(ctx, value=None):
    def run(input):
        shape = as_int_list(host_array("ConstantOfShape", "input", input))
        if any(d < 0 for d in shape):
            raise InvalidArgumentError(f"ConstantOfShape: shape {shape} has a negative dim")
        v = np.zeros((), np.float32) if value is None else np.asarray(value).reshape(-1)
        if v.size != 1:
            raise InvalidArgumentError(f"ConstantOfShape: value must hold one element, got {v.size}")
        v = v.reshape(())
        if v.dtype.kind not in "fiub":
            raise InvalidArgumentError(f"ConstantOfShape: the CUDA kernel fills numeric tensors, got {v.dtype}")
        out = rc.device_empty(tuple(shape), v.dtype)
        if out.size:
            blocks, threads = grid1d(out.size)
            _fill[blocks, threads](flat(out), v[()])
        return out
    return run


def _range(ctx):
    def run(start, limit, delta):
        s, l, d = (host_array("Range", n, v, False) for n, v in (("start", start), ("limit", limit),
                                                                  ("delta", delta)))
        n = int(cpu_range(s, l, d).size) if s.dtype.kind in "iu" else None
        dt = s.dtype
        if n is None:  # floats: the CPU's count, and start + i * delta in float64 rounded once to T
            n = int(cpu_range(s.astype(np.float64), l.astype(np.float64), d.astype(np.float64)).size)
        out = rc.device_empty((n,), dt)
        if n:
            tmp = out if dt in (np.dtype(np.float64), np.dtype(np.int64)) else rc.device_empty((n,), np.dtype(
                np.float64 if dt.kind == "f" else np.int64))
            blocks, threads = grid1d(n)
            kind = np.float64 if dt.kind == "f" else np.int64
            _arange[blocks, threads](flat(tmp), kind(s.reshape(())[()]), kind(d.reshape(())[()]))
            if tmp is not out:
                from .elementwise import cast_to
                return cast_to(tmp, dt)
        return out
    return run


op("ConstantOfShape", 9, provider=CUDA, factory=True, host_inputs=(0,))(_constant_of_shape)
op("Range", 11, provider=CUDA, factory=True, host_inputs=(0, 1, 2))(_range)


# -- ReverseSequence -------------------------------------------------------------------------------

@jit
def _reverse_seq(x, out, lens, B, T, inner, time_major):
    """Each batch row's first lens[b] time steps reversed, the rest copied; x viewed (T, B, inner) when
    ``time_major`` else (B, T, inner)."""
    for k in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        i = k % inner
        r = k // inner
        if time_major:
            t = r // B
            b = r - t * B
        else:
            b = r // T
            t = r - b * T
        L = lens[b]
        src_t = L - 1 - t if t < L else t
        out[k] = x[((src_t * B + b) if time_major else (b * T + src_t)) * inner + i]


def _reverse_sequence(ctx, batch_axis=1, time_axis=0):
    def run(input, sequence_lens):
        check_device("ReverseSequence", input=input)
        shape = tuple(int(d) for d in input.shape)
        if len(shape) < 2:
            raise InvalidArgumentError(f"ReverseSequence: input must have rank >= 2, got shape {list(shape)}")
        if sorted((batch_axis, time_axis)) != [0, 1]:
            raise InvalidAttributeError(f"ReverseSequence: batch_axis/time_axis must be 0 and 1, got "
                                        f"{batch_axis}/{time_axis}")
        lens = np.ascontiguousarray(host_array("ReverseSequence", "sequence_lens", sequence_lens),
                                    dtype=np.int64).reshape(-1)
        B, T = shape[batch_axis], shape[time_axis]
        if lens.size != B:
            raise InvalidArgumentError(f"ReverseSequence: sequence_lens has {lens.size} entries, expected {B}")
        if lens.size and (lens.min() < 0 or lens.max() > T):
            bad = int(lens.min() if lens.min() < 0 else lens.max())
            raise IndexOutOfRangeError(f"ReverseSequence: sequence length {bad} is out of range [0, {T}]")
        out = rc.device_empty(shape, input.dtype)
        if out.size:
            blocks, threads = grid1d(out.size)
            _reverse_seq[blocks, threads](flat(input), flat(out), rc.to_device(lens), B, T,
                                          int(np.prod(shape[2:], dtype=np.int64)), time_axis == 0)
        return out
    return run


op("ReverseSequence", 10, provider=CUDA, factory=True, host_inputs=(1,))(_reverse_sequence)
