"""CUDA Gather, GatherElements, GatherND, ScatterElements (and the old Scatter), ScatterND; OneHot, EyeLike.

The canonical view is ``data`` (outer, axis_n, inner) -> ``out`` (outer, n_idx, inner); one thread per output
element.  Indices are validated on the host before launch (Numba does not bounds-check on the device), then
normalized (negatives wrapped) and uploaded as int64.  Indices that arrive on the device are copied back
through ``runtime.cuda.to_host`` for that check, so the copy is visible to ``TransferCounter``; token ids
usually come from the host anyway.

Invariants: ``data`` is a C-contiguous device array; out-of-range indices raise ``IndexOutOfRangeError``
before any kernel runs; the result is a new device array of shape
``data.shape[:axis] + indices.shape + data.shape[axis + 1:]``.

The others gather or scatter whole rows of ``inner`` elements at offsets the host computed with the CPU twins'
index code (below); scatters copy ``data`` and apply the updates in the CPU's order, one thread per column.
"""
from __future__ import annotations

import numpy as np

from ops._common import check_indices, norm_axis
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ._common import check_device, flat, grid1d, host_array

__all__ = ["Gather"]


@jit
def _gather3(data, idx, out, axis_n, n_idx, inner):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, out.size, step):
        k = i % inner
        t = i // inner
        j = t % n_idx
        o = t // n_idx
        out[i] = data[(o * axis_n + idx[j]) * inner + k]


def Gather(data, indices, axis=0):
    """``data`` gathered along ``axis`` at ``indices`` (a host numpy array or a device array)."""
    check_device("Gather", data=data)
    if data.ndim == 0:
        raise InvalidArgumentError("Gather: data must have rank >= 1")
    ax = norm_axis(axis, data.ndim)
    idx = np.asarray(rc.to_host(indices) if rc.is_device_array(indices) else indices)
    if idx.dtype.kind not in "iu":
        raise InvalidArgumentError(f"Gather: indices must be int32 or int64, got {idx.dtype}")
    axis_n = tuple(data.shape)[ax]
    check_indices("Gather", idx, -axis_n, axis_n)
    norm = np.where(idx < 0, idx + axis_n, idx).astype(np.int64).reshape(-1)
    shape = tuple(data.shape)[:ax] + tuple(idx.shape) + tuple(data.shape)[ax + 1:]
    out = rc.device_empty(shape, data.dtype)
    if out.size:
        inner = int(np.prod(tuple(data.shape)[ax + 1:], dtype=np.int64))
        d_idx = rc.to_device(norm)
        blocks, threads = grid1d(out.size)
        _gather3[blocks, threads](flat(data), d_idx, flat(out), axis_n, norm.size, inner)
    return out


# -- GatherElements, GatherND, ScatterElements, ScatterND --------------------------------------------
# The CPU twins' host-side index work is shared: ``_elem_prepare`` (GatherElements, ScatterElements: flat element
# offsets) and ``_nd_linear`` (GatherND, ScatterND: linear row numbers), both validating every index before an
# offset is formed, so the kernels read only offsets that are in range.  Indices are host inputs.

from ops.indexing import _elem_prepare, _nd_linear, _reduction, onehot_params  # noqa: E402
from ops.registry import op  # noqa: E402
from runtime.dtypes import np_dtype  # noqa: E402
from runtime.errors import InvalidAttributeError, ShapeMismatchError  # noqa: E402

CUDA = "CUDAExecutionProvider"


@jit
def _take_rows(src, lin, out, B, S, M, inner):
    """out[b, m, :] = src[b, lin[b*M + m], :] over (B, M, inner), grid-stride."""
    for i in range(cuda.grid(1), B * M * inner, cuda.gridsize(1)):
        c = i % inner
        bm = i // inner
        b = bm // M
        out[i] = src[(b * S + lin[bm]) * inner + c]


@jit
def _scatter_cols(out, lin, upd, M, inner, red):
    """Rows ``lin`` of ``out`` (S, inner) updated from ``upd`` (M, inner) in order, one thread per column (a
    repeated row takes its updates in the CPU's order); red: 0 none, 1 add, 2 mul, 3 max, 4 min."""
    for c in range(cuda.grid(1), inner, cuda.gridsize(1)):
        for j in range(M):
            o = lin[j] * inner + c
            u = upd[j * inner + c]
            if red == 0:
                out[o] = u
            elif red == 1:
                out[o] += u
            elif red == 2:
                out[o] *= u
            elif red == 3:
                if u > out[o]:
                    out[o] = u
            elif u < out[o]:
                out[o] = u


def _take(data, lin, B, S, M, inner, shape):
    out = rc.device_empty(tuple(shape), data.dtype)
    if out.size:
        blocks, threads = grid1d(out.size)
        _take_rows[blocks, threads](flat(data), rc.to_device(np.ascontiguousarray(lin, np.int64)), flat(out),
                                    B, S, M, inner)
    return out


def _scatter(op_name, data, lin, updates, inner, red):
    check_device(op_name, data=data, updates=updates)
    if np.dtype(updates.dtype) != np.dtype(data.dtype):
        raise InvalidArgumentError(f"{op_name}: updates dtype {updates.dtype} differs from data dtype {data.dtype}")
    if red and np.dtype(data.dtype) == np.bool_:
        raise InvalidArgumentError(f"{op_name}: the CUDA kernel reduces numeric tensors, got bool")
    out = rc.device_empty(tuple(data.shape), data.dtype)
    if data.size:
        out.copy_to_device(data)
    M = int(lin.size)
    if M and out.size and inner:
        blocks, threads = grid1d(inner)
        _scatter_cols[blocks, threads](flat(out), rc.to_device(np.ascontiguousarray(lin, np.int64)),
                                       flat(updates), M, inner, red)
    return out


def _gather_elements(ctx, axis=0):
    def run(data, indices):
        check_device("GatherElements", data=data)
        if data.ndim == 0:
            raise InvalidArgumentError("GatherElements: data must have rank >= 1")
        offs = _elem_prepare("GatherElements", data, np.asarray(indices), axis)
        return _take(data, offs, 1, int(data.size), int(offs.size), 1, tuple(np.shape(indices)))
    return run


def _gather_nd(ctx, batch_dims=0):
    b = int(batch_dims)

    def run(data, indices):
        check_device("GatherND", data=data)
        indices = np.asarray(indices)
        dshape = tuple(int(d) for d in data.shape)
        if b < 0 or b >= min(len(dshape), indices.ndim):
            raise InvalidAttributeError(f"GatherND: batch_dims must be in [0, {min(len(dshape), indices.ndim) - 1}], "
                                        f"got {b}")
        if dshape[:b] != indices.shape[:b]:
            raise ShapeMismatchError(f"GatherND: batch dimensions differ: data {list(dshape)}, "
                                     f"indices {list(indices.shape)}")
        k = indices.shape[-1]
        lin, S, inner = _nd_linear("GatherND", dshape[b:], indices)
        B = int(np.prod(dshape[:b], dtype=np.int64))
        return _take(data, lin, B, S, lin.size // max(B, 1), inner, indices.shape[:-1] + dshape[b + k:])
    return run


def _scatter_elements(ctx, axis=0, reduction="none"):
    red = _reduction("ScatterElements", reduction)

    def run(data, indices, updates):
        indices = np.asarray(indices)
        if tuple(updates.shape) != indices.shape:
            raise ShapeMismatchError(f"ScatterElements: updates shape {list(updates.shape)} must equal indices "
                                     f"shape {list(indices.shape)}")
        if data.ndim == 0:
            raise InvalidArgumentError("ScatterElements: data must have rank >= 1")
        offs = _elem_prepare("ScatterElements", data, indices, axis)
        return _scatter("ScatterElements", data, offs, updates, 1, red)
    return run


def _scatter_nd(ctx, reduction="none"):
    red = _reduction("ScatterND", reduction)

    def run(data, indices, updates):
        indices = np.asarray(indices)
        dshape = tuple(int(d) for d in data.shape)
        k = indices.shape[-1] if indices.ndim else 0
        want = indices.shape[:-1] + dshape[k:]
        if tuple(updates.shape) != want:
            raise ShapeMismatchError(f"ScatterND: updates must have shape {list(want)}, got {list(updates.shape)}")
        lin, S, inner = _nd_linear("ScatterND", dshape, indices)
        return _scatter("ScatterND", data, lin, updates, inner, red)
    return run


for _v in (11, 13):
    op("GatherElements", _v, provider=CUDA, factory=True, host_inputs=(1,))(_gather_elements)
for _v in (11, 12, 13):
    op("GatherND", _v, provider=CUDA, factory=True, host_inputs=(1,))(_gather_nd)
for _v in (11, 13, 16, 18):
    op("ScatterElements", _v, provider=CUDA, factory=True, host_inputs=(1,))(_scatter_elements)
    op("ScatterND", _v, provider=CUDA, factory=True, host_inputs=(1,))(_scatter_nd)
for _v in (9, 11):
    op("Scatter", _v, provider=CUDA, factory=True, host_inputs=(1,))(_scatter_elements)


# -- OneHot, EyeLike -------------------------------------------------------------------------------

@jit
def _onehot(idx, out, dep, inner, off, on, negative):
    """out[o, d, i] = on where the (truncated) index idx[o, i] is d (wrapped when ``negative``), else off."""
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i = k % inner
        t = k // inner
        d = t % dep
        o = t // dep
        v = idx[o * inner + i]
        j = np.int64(v)  # toward zero for float indices
        if negative and j < 0:
            j += dep
        out[k] = on if j == d else off


def _onehot_factory(negative):
    def factory(ctx, axis=-1):
        def run(indices, depth, values):
            check_device("OneHot", indices=indices)
            dep, vals = onehot_params(host_array("OneHot", "depth", depth, False),
                                      host_array("OneHot", "values", values, False))
            shape = tuple(int(s) for s in indices.shape)
            ax = norm_axis(axis, len(shape) + 1)
            out = rc.device_empty(shape[:ax] + (dep,) + shape[ax:], vals.dtype)
            if out.size:
                blocks, threads = grid1d(out.size)
                _onehot[blocks, threads](flat(indices), flat(out), dep, int(np.prod(shape[ax:], dtype=np.int64)),
                                         vals[0], vals[1], bool(negative))
            return out
        return run
    return factory


op("OneHot", 9, provider=CUDA, factory=True, host_inputs=(1, 2))(_onehot_factory(False))
op("OneHot", 11, provider=CUDA, factory=True, host_inputs=(1, 2))(_onehot_factory(True))


@jit
def _eye(out, n, k):
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        r = t // n
        out[t] = 1 if t - r * n - r == k else 0


def _eyelike(ctx, dtype=None, k=0):
    def run(input):
        if input.ndim != 2:
            raise InvalidArgumentError(f"EyeLike: input must be 2-D, got shape {list(input.shape)}")
        dt = np.dtype(input.dtype) if dtype is None else np_dtype(int(dtype))
        out = rc.device_empty(tuple(input.shape), dt)
        if out.size:
            blocks, threads = grid1d(out.size)
            _eye[blocks, threads](flat(out), int(input.shape[1]), int(k))
        return out
    return run


op("EyeLike", 9, provider=CUDA, factory=True)(_eyelike)
