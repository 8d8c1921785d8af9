"""Indexing ops: Gather, GatherElements, GatherND, Scatter, ScatterElements, ScatterND, TensorScatter, OneHot,
Compress, NonZero, Unique.

Invariants:
- every index input is validated in the wrapper before a kernel reads memory: negative indices are normalized
  where the spec allows them, anything else outside the indexed extent raises ``IndexOutOfRangeError`` naming
  the op, the offending index and the valid range (OneHot is the exception: the spec maps out-of-range indices
  to an all-off row);
- data movement kernels see the payload as unsigned integers of the same width (``_bits``), so a gather
  compiles once per element width, not once per dtype; 16-bit floats and bool ride along for free;
- kernels see canonical shapes: (outer, axis, inner) for axis ops, (batch, rows, inner) for the ND ops, flat
  data plus a shape vector for the element-wise ones, so each compiles once per width / dtype, not per rank;
- reductions of the scatter ops run in the data's dtype (16-bit floats in float32);
- no wrapper returns an input or a view of one.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from runtime.errors import IndexOutOfRangeError, InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, alloc, check_indices, lowp, norm_axis, out_buffer
from .movement import contig, materialize
from .registry import op

I64 = np.dtype(np.int64)
_UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
_REDUCTIONS = {"none": 0, "add": 1, "mul": 2, "max": 3, "min": 4}


# -- helpers ---------------------------------------------------------------------------------------

def _bits(a: np.ndarray):
    """``a`` reinterpreted as same-width unsigned ints, or None for widths/kinds a kernel cannot move."""
    if a.dtype.kind == "O" or a.dtype.itemsize not in _UINT:
        return None
    return a.view(_UINT[a.dtype.itemsize])


def _prod(shape) -> int:
    p = 1
    for s in shape:
        p *= int(s)
    return p


def norm_indices(opname: str, idx, n: int, what: str = "index", negative: bool = True) -> np.ndarray:
    """int64 copy of ``idx`` with negatives wrapped; raises unless every index lies in [-n, n) ([0, n))."""
    idx = np.asarray(idx)
    if idx.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{opname}: indices must be integers, got {idx.dtype}")
    idx = idx.astype(I64)
    if not _wrap_in_range(idx.reshape(-1), n, negative):
        check_indices(opname, idx, -n if negative else 0, n, what)  # raises, naming the worst index
    return idx


@njit(cache=True, nogil=True)
def _wrap_in_range(idx, n, negative):
    """Whether every index lies in [-n, n) (``negative``) or [0, n); the negative ones wrapped in place when all
    do.  One pass: a small index array costs a call, not numpy's reductions."""
    lo = -n if negative else 0
    for i in range(idx.shape[0]):
        if idx[i] < lo or idx[i] >= n:
            return False
    if negative:
        for i in range(idx.shape[0]):
            if idx[i] < 0:
                idx[i] += n
    return True


def _strides(shape) -> np.ndarray:
    st = np.ones(len(shape), I64)
    for d in range(len(shape) - 2, -1, -1):
        st[d] = st[d + 1] * shape[d + 1]
    return st


# -- kernels ---------------------------------------------------------------------------------------

@njit(cache=True)
def k_gather(src, idx, out):
    # src (outer, n, inner), idx (m,), out (outer, m, inner)
    outer, m, inner = out.shape
    for o in range(outer):
        for j in range(m):
            k = idx[j]
            for i in range(inner):
                out[o, j, i] = src[o, k, i]


@njit(cache=True)
def _k_gather_batched(src, lin, out):
    # src (B, S, inner), lin (B, M), out (B, M, inner)
    B, M, inner = out.shape
    for b in range(B):
        for j in range(M):
            k = lin[b, j]
            for i in range(inner):
                out[b, j, i] = src[b, k, i]


@njit(cache=True)
def _advance(coord, shape):
    """Step the multi-index ``coord`` to the next element of ``shape`` in row-major order (all zeros after the last)."""
    d = coord.shape[0] - 1
    while d >= 0:
        coord[d] += 1
        if coord[d] < shape[d]:
            return
        coord[d] = 0
        d -= 1


@njit(cache=True)
def _elem_offsets(dshape, ishape, idx, axis):
    """Flat data offset of every element of ``idx`` (shape ``ishape``) with its own axis coordinate replaced."""
    r = dshape.shape[0]
    dst = np.ones(r, np.int64)
    for d in range(r - 2, -1, -1):
        dst[d] = dst[d + 1] * dshape[d + 1]
    n = idx.shape[0]
    offs = np.empty(n, np.int64)
    cnt = np.zeros(r, np.int64)
    for e in range(n):
        off = 0
        for d in range(r):
            c = idx[e] if d == axis else cnt[d]
            off += c * dst[d]
        offs[e] = off
        _advance(cnt, ishape)
    return offs


@njit(cache=True)
def _k_take_flat(src, offs, out):
    for e in range(offs.shape[0]):
        out[e] = src[offs[e]]


@njit(cache=True)
def _k_scatter_rows(out, lin, upd, red):
    # out (S, inner), lin (M,), upd (M, inner); red: 0 none, 1 add, 2 mul, 3 max, 4 min
    M, inner = upd.shape
    for j in range(M):
        k = lin[j]
        if red == 0:
            for i in range(inner):
                out[k, i] = upd[j, i]
        elif red == 1:
            for i in range(inner):
                out[k, i] += upd[j, i]
        elif red == 2:
            for i in range(inner):
                out[k, i] *= upd[j, i]
        elif red == 3:
            for i in range(inner):
                if upd[j, i] > out[k, i]:
                    out[k, i] = upd[j, i]
        else:
            for i in range(inner):
                if upd[j, i] < out[k, i]:
                    out[k, i] = upd[j, i]


@njit(cache=True)
def _k_onehot(idx, depth, off, on, out):
    # idx (outer, inner) already wrapped; out (outer, depth, inner)
    outer, inner = idx.shape
    for o in range(outer):
        for d in range(depth):
            for i in range(inner):
                out[o, d, i] = off
        for i in range(inner):
            k = idx[o, i]
            if k >= 0 and k < depth:
                out[o, k, i] = on


@njit(cache=True)
def _k_tensor_scatter(out, upd, widx, circular):
    # out (B, P, S, I) already holds the past cache, upd (B, P, L, I)
    B, P, L, I = upd.shape
    S = out.shape[2]
    for b in range(B):
        w = widx[b]
        for p in range(P):
            for s in range(L):
                t = w + s
                if circular:
                    t = t % S
                for i in range(I):
                    out[b, p, t, i] = upd[b, p, s, i]


@njit(cache=True)
def _k_nonzero(bits, mask, shape):
    n = bits.shape[0]
    cnt = 0
    for e in range(n):
        if bits[e] & mask:
            cnt += 1
    r = shape.shape[0]
    out = np.empty((r, cnt), np.int64)
    coord = np.zeros(r, np.int64)
    j = 0
    for e in range(n):
        if bits[e] & mask:
            for d in range(r):
                out[d, j] = coord[d]
            j += 1
        _advance(coord, shape)
    return out


# -- Gather family ---------------------------------------------------------------------------------

def gather_axis(data: np.ndarray, idx: np.ndarray, axis: int, buf=None) -> np.ndarray:
    """``data`` gathered along ``axis`` by already validated, non-negative int64 ``idx``."""
    shp = data.shape
    out_shape = shp[:axis] + idx.shape + shp[axis + 1:]
    o = out_buffer(buf, out_shape, data.dtype)
    if o.size == 0:
        return o
    src = _bits(data)
    if src is None:
        o[...] = np.take(data, idx, axis=axis)
        return o
    outer, n, inner = _prod(shp[:axis]), shp[axis], _prod(shp[axis + 1:])
    k_gather(src.reshape(outer, n, inner), idx.reshape(-1), o.view(src.dtype).reshape(outer, idx.size, inner))
    return o


class GatherOp(NamedTuple):
    axis: int


def bind_gather(ctx, axis=0):
    return GatherOp(int(axis))


def gather_cpu(b: GatherOp, ctx):
    """Gather on the CPU (the region form and the CUDA launch share the bind)."""
    buf = ctx.out[0] if ctx.out else None
    axis = b.axis

    def run(data, indices):
        if data.ndim == 0:
            raise InvalidArgumentError("Gather: data must have rank >= 1, got a scalar")
        ax = norm_axis(axis, data.ndim)
        n = data.shape[ax]
        if indices.ndim == 0 and indices.dtype.kind in "iu" and -n <= int(indices) < n:
            # one index (a dimension of a Shape, a layer of a state): a copy of that slice, without the index
            # array's conversion and checks
            x = contig(data)
            return materialize(x, x[(slice(None),) * ax + (int(indices),)], buf)
        idx = norm_indices("Gather", indices, n)
        return gather_axis(data, idx, ax, buf)
    return run


GATHER_VERSIONS = (1, 11, 13)
for _v in GATHER_VERSIONS:
    op("Gather", _v, bind=bind_gather, writes_out=True)(gather_cpu)


def _elem_prepare(opname, data, indices, axis):
    if indices.ndim != data.ndim:
        raise ShapeMismatchError(f"{opname}: indices must have the data's rank {data.ndim}, "
                                 f"got shape {list(indices.shape)}")
    ax = norm_axis(axis, data.ndim)
    for d in range(data.ndim):
        if d != ax and indices.shape[d] > data.shape[d]:
            raise ShapeMismatchError(f"{opname}: indices shape {list(indices.shape)} exceeds data shape "
                                     f"{list(data.shape)} on axis {d}")
    idx = norm_indices(opname, indices, data.shape[ax])
    offs = _elem_offsets(np.asarray(data.shape, I64), np.asarray(indices.shape, I64), idx.reshape(-1), ax)
    return offs


@op("GatherElements", 11)
def GatherElements(data, indices, axis=0):
    if data.ndim == 0:
        raise InvalidArgumentError("GatherElements: data must have rank >= 1")
    offs = _elem_prepare("GatherElements", data, indices, axis)
    o = np.empty(indices.shape, data.dtype)
    if o.size == 0:
        return o
    src = _bits(data)
    if src is None:
        o.reshape(-1)[...] = data.reshape(-1)[offs]
        return o
    _k_take_flat(src.reshape(-1), offs, o.view(src.dtype).reshape(-1))
    return o


op("GatherElements", 13)(GatherElements)


def _nd_linear(opname, dshape, indices):
    """Linear row index over ``dshape`` of each k-tuple in ``indices[..., :k]`` (validated, negatives wrapped)."""
    k = indices.shape[-1]
    if k > len(dshape):
        raise ShapeMismatchError(f"{opname}: indices' last dimension {k} exceeds the indexed rank {len(dshape)}")
    if indices.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{opname}: indices must be integers, got {indices.dtype}")
    idx = indices.astype(I64).reshape(_prod(indices.shape[:-1]), k)
    sub = dshape[:k]
    lin = np.zeros(idx.shape[0], I64)
    st = _strides(sub)
    for j in range(k):
        col = norm_indices(opname, idx[:, j], sub[j], what=f"index (component {j})")
        lin += col * st[j]
    return lin, _prod(sub), _prod(dshape[k:])


@op("GatherND", 11)
def GatherND(data, indices, batch_dims=0):
    b = int(batch_dims)
    if b < 0 or b >= min(data.ndim, indices.ndim):
        raise InvalidAttributeError(f"GatherND: batch_dims must be in [0, {min(data.ndim, indices.ndim) - 1}], got {b}")
    if data.shape[:b] != indices.shape[:b]:
        raise ShapeMismatchError(f"GatherND: batch dimensions differ: data {list(data.shape)}, "
                                 f"indices {list(indices.shape)}")
    k = indices.shape[-1]
    out_shape = indices.shape[:-1] + data.shape[b + k:]
    lin, S, inner = _nd_linear("GatherND", data.shape[b:], indices)
    o = np.empty(out_shape, data.dtype)
    if o.size == 0:
        return o
    B = _prod(data.shape[:b])
    M = lin.size // max(B, 1)
    src = _bits(data)
    if src is None:
        flat = data.reshape(B, S, inner)
        o.reshape(B, M, inner)[...] = flat[np.arange(B)[:, None], lin.reshape(B, M)]
        return o
    _k_gather_batched(src.reshape(B, S, inner), lin.reshape(B, M), o.view(src.dtype).reshape(B, M, inner))
    return o


op("GatherND", 12)(GatherND)
op("GatherND", 13)(GatherND)


# -- Scatter family --------------------------------------------------------------------------------

def _reduction(opname, reduction):
    if reduction not in _REDUCTIONS:
        raise InvalidAttributeError(f"{opname}: reduction must be one of {list(_REDUCTIONS)}, got {reduction!r}")
    return _REDUCTIONS[reduction]


def _scatter_rows(opname, data, lin, upd, S, inner, red):
    """Copy of ``data`` (viewed (S, inner)) with rows ``lin`` updated from ``upd`` (viewed (M, inner))."""
    if upd.dtype != data.dtype:
        raise InvalidArgumentError(f"{opname}: updates dtype {upd.dtype} differs from data dtype {data.dtype}")
    M = lin.size
    if red == 0 and _bits(data) is not None:
        o = data.copy()
        if M and o.size:
            _k_scatter_rows(_bits(o).reshape(S, inner), lin, _bits(upd).reshape(M, inner), 0)
        return o
    if data.dtype.kind == "O":
        if red:
            raise InvalidArgumentError(f"{opname}: reduction is not defined for string tensors")
        o = data.copy()
        o.reshape(S, inner)[lin] = upd.reshape(M, inner)
        return o
    work = data.astype(F32) if lowp(data.dtype) else data.copy()
    u = upd.astype(work.dtype) if lowp(data.dtype) else upd
    if M and work.size:
        _k_scatter_rows(work.reshape(S, inner), lin, np.ascontiguousarray(u).reshape(M, inner), red)
    return work.astype(data.dtype) if lowp(data.dtype) else work


@op("ScatterElements", 11)
def ScatterElements(data, indices, updates, axis=0, reduction="none"):
    red = _reduction("ScatterElements", reduction)
    if updates.shape != indices.shape:
        raise ShapeMismatchError(f"ScatterElements: updates shape {list(updates.shape)} must equal indices shape "
                                 f"{list(indices.shape)}")
    if data.ndim == 0:
        raise InvalidArgumentError("ScatterElements: data must have rank >= 1")
    offs = _elem_prepare("ScatterElements", data, indices, axis)
    return _scatter_rows("ScatterElements", data, offs, updates, data.size, 1, red)


for _v in (13, 16, 18):
    op("ScatterElements", _v)(ScatterElements)


@op("Scatter", 9)
def Scatter(data, indices, updates, axis=0):
    return ScatterElements(data, indices, updates, axis=axis, reduction="none")


op("Scatter", 11)(Scatter)


@op("ScatterND", 11)
def ScatterND(data, indices, updates, reduction="none"):
    red = _reduction("ScatterND", reduction)
    k = indices.shape[-1] if indices.ndim else 0
    want = indices.shape[:-1] + data.shape[k:]
    if updates.shape != want:
        raise ShapeMismatchError(f"ScatterND: updates must have shape {list(want)}, got {list(updates.shape)}")
    lin, S, inner = _nd_linear("ScatterND", data.shape, indices)
    return _scatter_rows("ScatterND", data, lin, updates, S, inner, red)


for _v in (13, 16, 18):
    op("ScatterND", _v)(ScatterND)


@op("TensorScatter", 24)
def TensorScatter(past_cache, update, write_indices=None, axis=-2, mode="linear"):
    if mode not in ("linear", "circular"):
        raise InvalidAttributeError(f"TensorScatter: mode must be 'linear' or 'circular', got {mode!r}")
    r = past_cache.ndim
    ax = norm_axis(axis, r)
    if ax == 0:
        raise InvalidAttributeError("TensorScatter: axis cannot be 0 (the batch dimension)")
    if update.ndim != r or update.shape[:ax] != past_cache.shape[:ax] \
            or update.shape[ax + 1:] != past_cache.shape[ax + 1:]:
        raise ShapeMismatchError(f"TensorScatter: update shape {list(update.shape)} must match past_cache shape "
                                 f"{list(past_cache.shape)} except on axis {ax}")
    if update.dtype != past_cache.dtype:
        raise InvalidArgumentError(f"TensorScatter: update dtype {update.dtype} differs from past_cache "
                                   f"{past_cache.dtype}")
    B, S, L = past_cache.shape[0], past_cache.shape[ax], update.shape[ax]
    if write_indices is None:
        w = np.zeros(B, I64)
    else:
        w = np.asarray(write_indices).astype(I64).reshape(-1)
        if w.size != B:
            raise ShapeMismatchError(f"TensorScatter: write_indices must have {B} entries (batch size), got {w.size}")
    circular = mode == "circular"
    if circular:
        check_indices("TensorScatter", w, 0, max(S, 1), "write index")
        if L > S:
            raise IndexOutOfRangeError(f"TensorScatter: update length {L} exceeds the cache length {S}")
    elif w.size:
        check_indices("TensorScatter", w, 0, S - L + 1, f"write index (with update length {L})")
    o = past_cache.copy()
    if update.size == 0:
        return o
    P, I = _prod(past_cache.shape[1:ax]), _prod(past_cache.shape[ax + 1:])
    src = _bits(update)
    if src is None:
        raise InvalidArgumentError(f"TensorScatter: unsupported dtype {past_cache.dtype}")
    _k_tensor_scatter(_bits(o).reshape(B, P, S, I), src.reshape(B, P, L, I), w, circular)
    return o


# -- OneHot, Compress, NonZero, Unique -------------------------------------------------------------

def onehot_params(depth, values) -> tuple:
    """OneHot's checked ``(depth, [off_value, on_value])`` (the CUDA launch shares them)."""
    d = np.asarray(depth).reshape(-1)
    if d.size != 1:
        raise InvalidArgumentError(f"OneHot: depth must be a scalar or 1-element tensor, "
                                   f"got shape {list(np.shape(depth))}")
    dep = int(d[0])
    if dep < 1:
        raise InvalidArgumentError(f"OneHot: depth must be positive, got {dep}")
    vals = np.asarray(values).reshape(-1)
    if vals.size != 2:
        raise InvalidArgumentError(f"OneHot: values must hold [off_value, on_value], got {vals.size} elements")
    return dep, vals


def _onehot(indices, depth, values, axis, negative):
    dep, vals = onehot_params(depth, values)
    r = indices.ndim
    ax = norm_axis(axis, r + 1)
    idx = indices.astype(I64) if indices.dtype.kind in "iub" else np.trunc(indices.astype(np.float64)).astype(I64)
    if negative:
        idx = np.where(idx < 0, idx + dep, idx)  # still out of range when idx < -depth: row stays all-off
    out_shape = indices.shape[:ax] + (dep,) + indices.shape[ax:]
    o = alloc(out_shape, vals.dtype)
    if o.size == 0:
        return o
    outer, inner = _prod(indices.shape[:ax]), _prod(indices.shape[ax:])
    vb = _bits(vals)
    if vb is None:
        sel = np.arange(dep).reshape((dep,) + (1,) * (r - ax))
        o[...] = np.where(np.expand_dims(idx, ax) == sel, vals[1], vals[0])
        return o
    _k_onehot(idx.reshape(outer, inner), dep, vb[0], vb[1], o.view(vb.dtype).reshape(outer, dep, inner))
    return o


@op("OneHot", 9)
def OneHot9(indices, depth, values, axis=-1):
    return _onehot(indices, depth, values, axis, negative=False)


@op("OneHot", 11)
def OneHot(indices, depth, values, axis=-1):
    return _onehot(indices, depth, values, axis, negative=True)


@op("Compress", 9)
def Compress(input, condition, axis=None):
    data = input
    if axis is None:
        data = data.reshape(-1)
        ax = 0
    else:
        ax = norm_axis(axis, data.ndim)
    n = data.shape[ax]
    cond = np.asarray(condition).reshape(-1).astype(bool)
    sel = np.flatnonzero(cond).astype(I64)
    check_indices("Compress", sel, 0, n, "selected position (condition longer than the axis)")
    return gather_axis(data, sel, ax)


op("Compress", 11)(Compress)


@op("NonZero", 9)
def NonZero(X):
    x = X if X.ndim else X.reshape(1)
    b = _bits(x)
    if b is None:
        return np.array(np.nonzero(x), I64)
    dt = x.dtype
    if dt.kind == "f" or lowp(dt):  # -0.0 is zero: ignore the sign bit
        mask = (1 << (8 * dt.itemsize - 1)) - 1
    else:
        mask = (1 << (8 * dt.itemsize)) - 1
    res = _k_nonzero(b.reshape(-1), b.dtype.type(mask), np.asarray(x.shape, I64))
    return res  # a scalar counts as a 1-element vector, as onnxruntime does: shape (1, nnz)


op("NonZero", 13)(NonZero)


@op("Unique", 11)
def Unique(X, axis=None, sorted=1, *, ctx=None):
    # A rarely used op: numpy's compiled sort does the work; only the order bookkeeping is done here.
    x = X
    work = x.astype(F32) if lowp(x.dtype) else x
    if axis is None:
        y, first, inv, cnt = np.unique(work.reshape(-1), return_index=True, return_inverse=True, return_counts=True)
        ax = None
    else:
        ax = norm_axis(axis, x.ndim)
        y, first, inv, cnt = np.unique(work, return_index=True, return_inverse=True, return_counts=True, axis=ax)
    inv = inv.reshape(-1)
    if not sorted:
        perm = np.argsort(first, kind="stable")
        rank = np.empty_like(perm)
        rank[perm] = np.arange(perm.size)
        y = np.take(y, perm, axis=0 if ax is None else ax)
        first, cnt, inv = first[perm], cnt[perm], rank[inv]
    if lowp(x.dtype):
        y = y.astype(x.dtype)
    res = (np.ascontiguousarray(y), first.astype(I64), inv.astype(I64), cnt.astype(I64))
    if ctx is None:
        return res
    # Only the node's declared outputs; an unused one (empty name) gets None so nothing lands in its slot.
    res = tuple(r if used else None for r, used in zip(res, ctx.outputs_used))
    return res[0] if ctx.n_outputs == 1 else res
