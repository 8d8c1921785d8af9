"""Data-movement ops: Transpose, Concat, Expand, Tile, ConstantOfShape, Range, Trilu, Where, EyeLike,
ReverseSequence, CenterCropPad, BitCast (Pad, DepthToSpace/SpaceToDepth and Split/Slice, which share
``strided_copy``, ``materialize`` and the byte views, are ``ops/pad.py``, ``ops/depth_space.py`` and
``ops/split_slice.py``).

Moving data does not depend on what the bytes mean, so every kernel here
works on unsigned-integer views of the element bytes (uint8/16/32/64; a
16-byte complex is two uint64): each kernel compiles at most four times,
whatever the dtype.  Object (string) tensors and layouts the kernels cannot
express fall back to numpy.

Most ops are written as "build a numpy view of the source (transpose, slice,
broadcast), then copy it": ``strided_copy`` turns the view into element
offsets and strides, drops unit axes, merges axes that are contiguous in
both source and destination, and hands a rank-6 loop to ``_copy6``.

Invariants: outputs are fresh C-contiguous arrays; inputs are never written; indices
coming from tensors are validated before a kernel reads memory.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numba import njit, prange

from runtime.dtypes import np_dtype
from runtime.errors import (IndexOutOfRangeError, InvalidArgumentError, InvalidAttributeError,
                            ShapeMismatchError)
from ._common import Plain, Resolved, alloc, as_int_list, bind_plain, broadcast_shape, norm_axis, out_buffer, to4
from .registry import op

I64 = np.dtype(np.int64)
OBJ = np.dtype(object)
_UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
MAXR = 6


# -- kernels ---------------------------------------------------------------------------------------

@njit(cache=True)
def _copy6(src, soff, ss, dst, doff, ds, n):
    """dst[doff + sum(i_k*ds_k)] = src[soff + sum(i_k*ss_k)] over the rank-6 box n."""
    n4 = n[4]
    n5 = n[5]
    s4 = ss[4]
    s5 = ss[5]
    d4 = ds[4]
    d5 = ds[5]
    # A swap of the two inner axes (src contiguous along axis 4, dst along 5) is copied in tiles so
    # both sides stay in cache.
    tiled = s4 == 1 and d5 == 1 and s5 != 1 and n4 >= 16 and n5 >= 16
    T = 32
    for a in range(n[0]):
        sa = soff + a * ss[0]
        da = doff + a * ds[0]
        for b in range(n[1]):
            sb = sa + b * ss[1]
            db = da + b * ds[1]
            for c in range(n[2]):
                sc = sb + c * ss[2]
                dc = db + c * ds[2]
                for d in range(n[3]):
                    sd = sc + d * ss[3]
                    dd = dc + d * ds[3]
                    if tiled:
                        for e0 in range(0, n4, T):
                            e1 = min(e0 + T, n4)
                            for f0 in range(0, n5, T):
                                f1 = min(f0 + T, n5)
                                for e in range(e0, e1):
                                    de = dd + e * d4
                                    se = sd + e
                                    for f in range(f0, f1):
                                        dst[de + f] = src[se + f * s5]
                    elif s5 == 1 and d5 == 1:
                        for e in range(n4):
                            sv = src[sd + e * s4: sd + e * s4 + n5]
                            dv = dst[dd + e * d4: dd + e * d4 + n5]
                            for f in range(n5):
                                dv[f] = sv[f]
                    else:
                        for e in range(n4):
                            se = sd + e * s4
                            de = dd + e * d4
                            for f in range(n5):
                                dst[de + f * d5] = src[se + f * s5]


@njit(cache=True)
def _trilu(x, out, k, upper):
    B, M, N = x.shape
    for b in range(B):
        for i in range(M):
            for j in range(N):
                keep = (j - i >= k) if upper else (j - i <= k)
                if keep:
                    out[b, i, j] = x[b, i, j]
                else:
                    out[b, i, j] = 0


@njit(cache=True)
def _where_flat(c, x, y, out):
    for i in range(out.size):
        out[i] = x[i] if c[i] else y[i]


@njit(cache=True)
def _where4(c, x, y, out):
    n0, n1, n2, n3 = out.shape
    for a in range(n0):
        ca = a if c.shape[0] > 1 else 0
        xa = a if x.shape[0] > 1 else 0
        ya = a if y.shape[0] > 1 else 0
        for b in range(n1):
            cb = b if c.shape[1] > 1 else 0
            xb = b if x.shape[1] > 1 else 0
            yb = b if y.shape[1] > 1 else 0
            for d in range(n2):
                cd = d if c.shape[2] > 1 else 0
                xd = d if x.shape[2] > 1 else 0
                yd = d if y.shape[2] > 1 else 0
                for e in range(n3):
                    ce = e if c.shape[3] > 1 else 0
                    xe = e if x.shape[3] > 1 else 0
                    ye = e if y.shape[3] > 1 else 0
                    out[a, b, d, e] = x[xa, xb, xd, xe] if c[ca, cb, cd, ce] else y[ya, yb, yd, ye]


@njit(cache=True)
def _reverse_seq(x, out, lens, time_first):
    """x, out: (d0, d1, inner); reverse the first lens[b] steps of the time axis for each batch b."""
    d0, d1, inner = x.shape
    for i in range(d0):
        for j in range(d1):
            if time_first:
                t = i
                L = lens[j]
                si = (L - 1 - t) if t < L else t
                sj = j
            else:
                t = j
                L = lens[i]
                si = i
                sj = (L - 1 - t) if t < L else t
            for k in range(inner):
                out[i, j, k] = x[si, sj, k]


@njit(cache=True)
def _range(start, delta, out):
    """out[i] = start + i * delta (int64 or float64: compiled once for each)."""
    for i in range(out.size):
        out[i] = start + i * delta


# -- helpers ---------------------------------------------------------------------------------------

def uview(a: np.ndarray):
    """(unsigned view, factor) of a C-contiguous array, flat; factor > 1 for 16-byte elements; None for objects."""
    it = a.dtype.itemsize
    if a.dtype == OBJ or a.dtype.hasobject:
        return None
    if it in _UINT:
        return a.reshape(-1).view(_UINT[it]), 1
    if it % 8 == 0:
        return a.reshape(-1).view(np.uint64), it // 8
    return None


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def numpy_dtype(dt: np.dtype) -> bool:
    """Whether ``dt`` is one of numpy's own dtypes (booleans, numbers, datetimes, strings), which numpy's copies
    and ``np.concatenate`` handle.  ``isbuiltin`` alone does not say it: an array a cached Numba function returns
    carries an unpickled copy of its descriptor, for which numpy reports 0, like a structured dtype's."""
    return dt.isbuiltin == 1 or (dt.isbuiltin == 0 and dt.names is None and dt.subdtype is None
                                 and np.dtype(dt.str) == dt)


def merge_axes(shape, ss, ds):
    """(extent, src stride, dst stride) per axis of a strided copy: unit axes dropped, neighbours that are
    contiguous in both source and destination merged (the CPU and CUDA copies share it)."""
    dims = [(n, s, d) for n, s, d in zip(shape, ss, ds) if n != 1]
    out = []
    for n, s, d in dims:
        if out:
            pn, ps, pd = out[-1]
            if ps == s * n and pd == d * n:
                out[-1] = (pn * n, s, d)
                continue
        out.append((n, s, d))
    return out


def strided_copy(dst_base: np.ndarray, dst_view: np.ndarray, src_base: np.ndarray, src_view: np.ndarray) -> None:
    """Copy ``src_view`` (a view into the C-contiguous ``src_base``) into ``dst_view`` (a view into ``dst_base``):
    numpy's copy for its built-in dtypes, the unsigned-integer kernel ``_copy6`` (the bits of any fixed-size
    element) for the others (ml_dtypes' bfloat16, float8 and so on)."""
    if dst_view.size == 0:
        return
    if not isinstance(src_view, np.ndarray):  # one element picked by an integer index: a scalar, not a view
        dst_view[...] = src_view
        return
    if src_view.shape != dst_view.shape:
        src_view = np.broadcast_to(src_view, dst_view.shape)
    if numpy_dtype(src_base.dtype) and dst_base.dtype == src_base.dtype:
        # numpy's own strided copy: no setup in Python (a 64x64 slice: 0.6 us against 18 us for the kernel
        # below), as fast on large copies, and safe when the two views overlap
        np.copyto(dst_view, src_view)
        return
    su = uview(src_base)
    du = uview(dst_base)
    it = src_base.dtype.itemsize
    if su is None or du is None or dst_base.dtype.itemsize != it:
        dst_view[...] = src_view
        return
    sflat, f = su
    dflat = du[0]
    shape = list(dst_view.shape)
    ss = [s // it * f for s in src_view.strides]
    ds = [s // it * f for s in dst_view.strides]
    if f > 1:
        shape.append(f)
        ss.append(1)
        ds.append(1)
    dims = merge_axes(shape, ss, ds)
    if len(dims) > MAXR:
        dst_view[...] = src_view
        return
    dims = [(1, 0, 0)] * (MAXR - len(dims)) + dims
    soff = (_addr(src_view) - _addr(src_base)) // it * f
    doff = (_addr(dst_view) - _addr(dst_base)) // it * f
    n = np.array([d[0] for d in dims], I64)
    _copy6(sflat, soff, np.array([d[1] for d in dims], I64), dflat, doff, np.array([d[2] for d in dims], I64), n)


def contig(x: np.ndarray) -> np.ndarray:
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


def materialize(src_base: np.ndarray, src_view: np.ndarray, buf=None) -> np.ndarray:
    """A fresh C-contiguous copy of a view of ``src_base`` (into ``buf`` when it fits)."""
    out = out_buffer(buf, src_view.shape, src_base.dtype)
    strided_copy(out, out, src_base, src_view)
    return out


def out_of(ctx):
    return ctx.out[0] if ctx is not None and ctx.out else None


# -- Transpose -------------------------------------------------------------------------------------

class TransposeOp(NamedTuple):
    perm: Any  # a tuple of axes, or None: reversed


def bind_transpose(ctx, perm=None):
    return TransposeOp(None if perm is None else tuple(int(a) for a in perm))


def transpose_perm(rank: int, b: TransposeOp) -> list:
    """The permutation of a rank-``rank`` input (negative entries counted from the end)."""
    p = list(range(rank))[::-1] if b.perm is None else [norm_axis(a, rank, "perm entry") for a in b.perm]
    if sorted(p) != list(range(rank)):
        raise InvalidAttributeError(f"Transpose: perm {list(b.perm)} is not a permutation of range({rank})")
    return p


def transpose_cpu(b: TransposeOp, ctx):
    out = out_of(ctx)

    def run(data):
        x = contig(data)
        perm = transpose_perm(x.ndim, b)
        tiles = _matrix_swap(x.shape, perm) if x.size >= _TILED_MIN else None
        u = uview(x) if tiles is not None else None
        if u is None or u[1] != 1:
            return materialize(x, x.transpose(perm), out)
        o = out_buffer(out, tuple(x.shape[a] for a in perm), x.dtype)
        _transpose_tiles(u[0].reshape(tiles), o.reshape(-1).view(u[0].dtype).reshape(tiles[0], tiles[2], tiles[1]))
        return o
    return run


_TILED_MIN = 1 << 14  # elements from which a transpose that swaps two blocks of axes runs tiled
_TILE = 32


def _matrix_swap(shape, perm):
    """``(batch, R, C)`` when transposing ``shape`` by ``perm`` swaps two blocks of axes after leading ones it
    keeps (the input read as batch x R x C, the output as batch x C x R: NCHW to NHWC and back, a matrix
    transpose), else None."""
    rank = {a: k for k, a in enumerate(a for a in range(len(shape)) if shape[a] != 1)}
    axes = [rank[a] for a in perm if a in rank]  # the axes that are not extent 1, renumbered, in output order
    dims = [shape[a] for a in sorted(rank, key=rank.get)]
    runs = []
    for a in axes:
        if runs and a == runs[-1][-1] + 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    # runs of input axes in output order; a batch run (kept in place) may lead
    if len(runs) == 3 and runs[0][0] == 0 and runs[2][0] == runs[0][-1] + 1 and runs[2][-1] + 1 == runs[1][0]:
        batch, (c, r) = runs[0], runs[1:]
    elif len(runs) == 2 and runs[1][-1] + 1 == runs[0][0]:
        batch, (c, r) = [], runs
    else:
        return None
    size = lambda axs: int(np.prod([dims[a] for a in axs])) if axs else 1  # noqa: E731
    return size(batch), size(r), size(c)


@njit(cache=True, nogil=True, parallel=True)
def _transpose_tiles(x, out):
    """out (B, C, R) = x (B, R, C) transposed per matrix, in 32 x 32 tiles over the threads: each tile's reads
    and writes stay in cache (numpy's strided copy of the transposed view ran 3.6x onnxruntime on NCHW to
    NHWC at 64 x 80 x 80)."""
    B, R, C = x.shape
    xf = x.reshape(-1)
    of = out.reshape(-1)
    tr = (R + _TILE - 1) // _TILE
    tc = (C + _TILE - 1) // _TILE
    for t in prange(B * tr * tc):
        bt = t // (tr * tc)
        rem = t - bt * tr * tc
        i0 = (rem // tc) * _TILE
        j0 = (rem - (rem // tc) * tc) * _TILE
        i1 = min(R, i0 + _TILE)
        j1 = min(C, j0 + _TILE)
        base = bt * R * C
        for j in range(j0, j1):
            d = base + j * R
            for i in range(i0, i1):  # flat unsigned indices: no wraparound, no view reference counts
                of[np.uint64(d + i)] = xf[np.uint64(base + i * C + j)]


op("Transpose", 1, bind=bind_transpose, writes_out=True)(transpose_cpu)


# -- Concat ----------------------------------------------------------------------------------------

def concat_shape(xs, axis) -> tuple:
    """(axis, dtype, output shape) of Concat over the present inputs ``xs`` (host or device arrays), after its
    checks (the CPU and CUDA kernels share them)."""
    if not xs:
        raise InvalidArgumentError("Concat needs at least one input")
    r = xs[0].ndim
    ax = norm_axis(axis, r)
    dt = xs[0].dtype
    base = list(xs[0].shape)
    for x in xs:
        if x.dtype != dt:
            raise InvalidArgumentError(f"Concat: inputs must share one dtype, got {[str(a.dtype) for a in xs]}")
        if x.ndim != r or any(x.shape[i] != base[i] for i in range(r) if i != ax):
            raise ShapeMismatchError(f"Concat: input shapes {[list(a.shape) for a in xs]} differ outside axis {ax}")
    base[ax] = sum(x.shape[ax] for x in xs)
    return ax, dt, tuple(base)


def _concat(inputs, axis, buf):
    xs = [contig(x) for x in inputs if x is not None]
    ax, dt, shape = concat_shape(xs, axis)
    r = len(shape)
    out = out_buffer(buf, shape, dt)
    off = 0
    idx = [slice(None)] * r
    for x in xs:
        n = x.shape[ax]
        if n:
            idx[ax] = slice(off, off + n)
            strided_copy(out, out[tuple(idx)], x, x)
        off += n
    return out


class ConcatOp(NamedTuple):
    axis: int


def bind_concat_1(ctx, axis=1):
    return ConcatOp(int(axis))


def bind_concat(ctx, axis=None):
    if axis is None:
        raise InvalidAttributeError("Concat: the axis attribute is required")
    return ConcatOp(int(axis))


CONCAT_BINDS = ((1, bind_concat_1), (4, bind_concat))


def concat_cpu(b: ConcatOp, ctx):
    """Concat on the CPU.  Inputs of numpy's own dtypes go through ``np.concatenate`` into the output, after the
    checks of ``concat_shape``, kept per input shapes and dtypes (a model concatenates the same shapes every
    run)."""
    out, axis = out_of(ctx), b.axis
    checked = Resolved()

    def run(*inputs):
        xs = [x for x in inputs if x is not None]
        ax, dt, shape = checked.get(tuple((x.shape, x.dtype) for x in xs), lambda: concat_shape(xs, axis))
        if not numpy_dtype(dt):
            return _concat(xs, axis, out)
        o = out_buffer(out, shape, dt)
        np.concatenate(xs, axis=ax, out=o)
        return o
    return run


for _v, _bind in CONCAT_BINDS:
    op("Concat", _v, bind=_bind, writes_out=True)(concat_cpu)


# -- Expand / Tile ---------------------------------------------------------------------------------

bind_expand = bind_plain("Expand")


def expand_cpu(b: Plain, ctx):
    out = out_of(ctx)

    def run(input, shape):
        x = contig(input)
        return materialize(x, np.broadcast_to(x, broadcast_shape(x.shape, tuple(as_int_list(shape)))), out)
    return run


op("Expand", 8, bind=bind_expand, writes_out=True)(expand_cpu)


@op("Tile", 1)
def Tile_1(input, tiles, axis):
    x = contig(input)
    reps = [1] * x.ndim
    reps[norm_axis(int(np.asarray(axis).reshape(-1)[0]), x.ndim)] = int(np.asarray(tiles).reshape(-1)[0])
    return Tile(x, np.array(reps))


def tile_view(x, repeats):
    """(the broadcast view of the contiguous ``x`` whose C-order copy is Tile's result, the result's shape)."""
    reps = as_int_list(repeats)
    if len(reps) != x.ndim or any(r < 0 for r in reps):
        raise InvalidArgumentError(f"Tile: repeats {reps} must be {x.ndim} non-negative counts")
    inter = []
    bshape = []
    for d, r in zip(x.shape, reps):
        inter += [1, d]
        bshape += [r, d]
    return np.broadcast_to(x.reshape(inter), bshape), tuple(d * r for d, r in zip(x.shape, reps))


@op("Tile", 6)
def Tile(input, repeats, *, ctx=None):
    x = contig(input)
    v, shape = tile_view(x, repeats)
    out = out_buffer(out_of(ctx), shape, x.dtype)
    strided_copy(out, out.reshape(v.shape), x, v)
    return out


# -- ConstantOfShape / Range / EyeLike -------------------------------------------------------------

@op("ConstantOfShape", 9)
def ConstantOfShape(input, value=None):
    shape = as_int_list(input)
    if any(d < 0 for d in shape):
        raise InvalidArgumentError(f"ConstantOfShape: shape {shape} has a negative dim")
    if value is None:
        v = np.zeros((), np.float32)
    else:
        v = np.asarray(value).reshape(-1)
        if v.size != 1:
            raise InvalidAttributeError(f"ConstantOfShape: value must hold one element, got {v.size}")
        v = v.reshape(())
    out = alloc(tuple(shape), v.dtype)
    out[...] = v
    return out


def _scalar(x, name):
    a = np.asarray(x)
    if a.size != 1:
        raise InvalidArgumentError(f"Range: {name} must be a scalar, got shape {list(a.shape)}")
    return a.reshape(())


@op("Range", 11)
def Range(start, limit, delta, stash_type=1):
    s, l, d = _scalar(start, "start"), _scalar(limit, "limit"), _scalar(delta, "delta")
    dt = s.dtype
    if dt.kind in "iu":
        si, li, di = int(s), int(l), int(d)
        if di == 0:
            raise InvalidArgumentError("Range: delta must be non-zero")
        n = max(-(-(li - si) // di), 0)
        out = alloc((n,), np.int64)
        _range(si, di, out)
        return out.astype(dt)
    # Like the spec's loop, start + i * delta; evaluated in float64 and rounded once to T.
    sf, lf, df = (float(np.asarray(v).astype(np.float64)) for v in (s, l, d))
    if df == 0:
        raise InvalidArgumentError("Range: delta must be non-zero")
    n = max(int(np.ceil((lf - sf) / df)), 0) if np.isfinite((lf - sf) / df) else -1
    if n < 0:
        raise InvalidArgumentError(f"Range: start {sf}, limit {lf} and delta {df} give no finite number of elements")
    out = alloc((n,), np.float64)
    _range(sf, df, out)
    return out if dt == np.float64 else out.astype(dt)


@op("EyeLike", 9)
def EyeLike(input, dtype=None, k=0):
    if input.ndim != 2:
        raise InvalidArgumentError(f"EyeLike: input must be 2-D, got shape {list(input.shape)}")
    dt = input.dtype if dtype is None else np_dtype(int(dtype))
    out = np.zeros(input.shape, dt)
    m, n = input.shape
    i = np.arange(max(0, -k), min(m, n - k)) if n - k > 0 else np.arange(0)
    if i.size:
        out[i, i + k] = 1
    return out


# -- Trilu / Where ---------------------------------------------------------------------------------

@op("Trilu", 14)
def Trilu(input, k=None, upper=1):
    x = contig(input)
    if x.ndim < 2:
        raise InvalidArgumentError(f"Trilu: input must have rank >= 2, got shape {list(x.shape)}")
    kk = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    out = np.empty(x.shape, x.dtype)
    if x.size == 0:
        return out
    M, N = x.shape[-2:]
    u = uview(x)
    if u is None or u[1] != 1:
        i = np.arange(M)[:, None]
        j = np.arange(N)[None, :]
        keep = (j - i >= kk) if upper else (j - i <= kk)
        out[...] = np.where(keep, x, np.zeros((), x.dtype))
        return out
    ut = u[0].dtype
    _trilu(u[0].reshape(-1, M, N), out.reshape(-1, M, N).view(ut), kk, bool(upper))
    return out


def _where(condition, X, Y, buf=None):
    if X.dtype != Y.dtype:
        raise InvalidArgumentError(f"Where: X and Y must share one dtype, got {X.dtype} and {Y.dtype}")
    c = contig(condition)
    if c.dtype != np.bool_:
        c = c.astype(bool)
    x = contig(X)
    y = contig(Y)
    shape = broadcast_shape(c.shape, x.shape, y.shape)
    out = out_buffer(buf, shape, x.dtype)
    if out.size == 0:
        return out
    ux, uy = uview(x), uview(y)
    if ux is None or ux[1] != 1:
        out[...] = np.where(c, x, y)
        return out
    ut = ux[0].dtype
    cu = c.reshape(-1).view(np.uint8)
    uo = out.reshape(-1).view(ut)
    if c.shape == x.shape == y.shape:
        _where_flat(cu, ux[0], uy[0], uo)
        return out
    g = to4(shape, (c.shape, x.shape, y.shape))
    if g is None:
        cb = np.ascontiguousarray(np.broadcast_to(c, shape)).reshape(-1).view(np.uint8)
        xb = np.ascontiguousarray(np.broadcast_to(x, shape)).reshape(-1).view(ut)
        yb = np.ascontiguousarray(np.broadcast_to(y, shape)).reshape(-1).view(ut)
        _where_flat(cb, xb, yb, uo)
        return out
    o4, (c4, x4, y4) = g
    _where4(cu.reshape(c4), ux[0].reshape(x4), uy[0].reshape(y4), uo.reshape(o4))
    return out


bind_where = bind_plain("Where")


def where_cpu(b: Plain, ctx):
    out = out_of(ctx)

    def run(condition, X, Y):
        return _where(condition, X, Y, out)
    return run


op("Where", 9, bind=bind_where, writes_out=True)(where_cpu)


# -- ReverseSequence / CenterCropPad / BitCast ----------------------------------------------------

@op("ReverseSequence", 10)
def ReverseSequence(input, sequence_lens, batch_axis=1, time_axis=0):
    x = contig(input)
    if x.ndim < 2:
        raise InvalidArgumentError(f"ReverseSequence: input must have rank >= 2, got shape {list(x.shape)}")
    if sorted((batch_axis, time_axis)) != [0, 1]:
        raise InvalidAttributeError(f"ReverseSequence: batch_axis/time_axis must be 0 and 1, got "
                                    f"{batch_axis}/{time_axis}")
    lens = np.ascontiguousarray(sequence_lens, dtype=np.int64).reshape(-1)
    B, T = x.shape[batch_axis], x.shape[time_axis]
    if lens.size != B:
        raise InvalidArgumentError(f"ReverseSequence: sequence_lens has {lens.size} entries, expected {B}")
    if lens.size and (lens.min() < 0 or lens.max() > T):
        bad = int(lens.min() if lens.min() < 0 else lens.max())
        raise IndexOutOfRangeError(f"ReverseSequence: sequence length {bad} is out of range [0, {T}]")
    out = np.empty(x.shape, x.dtype)
    if x.size == 0:
        return out
    u = uview(x)
    if u is None or u[1] != 1:
        for b in range(B):
            L = int(lens[b])
            src = [slice(None)] * x.ndim
            src[batch_axis] = b
            out[tuple(src)] = x[tuple(src)]
            src[time_axis] = slice(0, L)
            dst = list(src)
            dst[time_axis] = slice(L - 1, None, -1) if L else slice(0, 0)
            out[tuple(src)] = x[tuple(dst)]
        return out
    ut = u[0].dtype
    shp = (x.shape[0], x.shape[1], -1)
    _reverse_seq(u[0].reshape(shp), out.reshape(-1).view(ut).reshape(shp), lens, time_axis == 0)
    return out


@op("CenterCropPad", 18)
def CenterCropPad(input_data, shape, axes=None):
    x = contig(input_data)
    r = x.ndim
    target = as_int_list(shape)
    ax = list(range(r)) if axes is None else [norm_axis(a, r) for a in axes]
    if len(target) != len(ax):
        raise InvalidArgumentError(f"CenterCropPad: shape {target} must have one entry per axis {ax}")
    out_shape = list(x.shape)
    src = [slice(None)] * r
    dst = [slice(None)] * r
    for a, s in zip(ax, target):
        d = x.shape[a]
        out_shape[a] = s
        if s < d:
            o = (d - s) // 2
            src[a] = slice(o, o + s)
        elif s > d:
            o = (s - d) // 2
            dst[a] = slice(o, o + d)
    out = np.zeros(tuple(out_shape), x.dtype)
    strided_copy(out, out[tuple(dst)], x, x[tuple(src)])
    return out


@op("BitCast", 26)
def BitCast(input, to=None):
    if to is None:
        raise InvalidAttributeError("BitCast: the 'to' attribute is required")
    dt = np_dtype(int(to))
    x = contig(input)
    if dt == OBJ or x.dtype == OBJ:
        raise InvalidArgumentError("BitCast: string tensors cannot be bit-cast")
    if dt.itemsize != x.dtype.itemsize:
        raise InvalidArgumentError(f"BitCast: {x.dtype} ({x.dtype.itemsize * 8} bits) and {dt} "
                                   f"({dt.itemsize * 8} bits) differ in width")
    return x.copy().view(dt)
