"""CUDA Gather.

The canonical view is ``data`` (outer, axis_n, inner) -> ``out`` (outer, n_idx, inner); one thread per output
element.  Indices are validated on the host before launch (Numba does not bounds-check on the device), then
normalized (negatives wrapped) and uploaded as int64.  Indices that arrive on the device are copied back
through ``runtime.cuda.to_host`` for that check, so the copy is visible to ``TransferCounter``; token ids
usually come from the host anyway.

Invariants: ``data`` is a C-contiguous device array; out-of-range indices raise ``IndexOutOfRangeError``
before any kernel runs; the result is a new device array of shape
``data.shape[:axis] + indices.shape + data.shape[axis + 1:]``.
"""
from __future__ import annotations

import numpy as np

from ops._common import check_indices, norm_axis
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ._common import check_device, flat, grid1d

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
