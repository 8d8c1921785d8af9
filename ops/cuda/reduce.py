"""CUDA ArgMax over the last axis (greedy sampling over the vocabulary).

One block per row of the canonical ``(rows, n)`` view; each thread scans a strided slice keeping the first
maximum it sees, then the block reduces (value, index) pairs preferring the larger value and, on ties, the
smaller index, so the result is the FIRST maximum like numpy and onnxruntime.  NaNs are never selected
(unlike numpy's argmax, which returns the first NaN); a row of all -inf returns index 0.

Invariants: the input is a C-contiguous float device array; the output is a new int64 device array of
shape ``input.shape[:-1]`` (+ ``(1,)`` when ``keepdims``).
"""
from __future__ import annotations

import math

import numpy as np

from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ops._common import norm_axis
from ._common import ARGMAX, FLOATS, MAX_ROW_THREADS, block_fold, check_device, flat, row_threads

__all__ = ["ArgMax"]


@jit
def _argmax_rows(x, out, n):
    sv = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    si = cuda.shared.array(MAX_ROW_THREADS, np.int64)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    base = row * n
    best = np.float32(-math.inf)
    bi = n  # sentinel: loses every tie against a real index
    for j in range(tid, n, nt):
        v = np.float32(x[base + j])
        if v > best or (v == best and j < bi):
            best = v
            bi = j
    sv[tid] = best
    si[tid] = bi
    block_fold(sv, si, tid, nt, ARGMAX)
    if tid == 0:
        out[row] = si[0] if si[0] < n else 0


def ArgMax(data, axis=-1, keepdims=1, select_last_index=0):
    check_device("ArgMax", data=data)
    if np.dtype(data.dtype) not in FLOATS:
        raise InvalidArgumentError(f"ArgMax: the CUDA kernel takes float tensors, got {data.dtype}")
    if data.ndim == 0 or norm_axis(axis, data.ndim) != data.ndim - 1:
        raise InvalidArgumentError(f"ArgMax: the CUDA kernel reduces the last axis only, got axis={axis} "
                                   f"for rank {data.ndim}")
    if select_last_index:
        raise InvalidArgumentError("ArgMax: select_last_index=1 is not supported by the CUDA kernel")
    n = tuple(data.shape)[-1]
    if n == 0:
        raise InvalidArgumentError("ArgMax: cannot reduce an empty axis")
    shape = tuple(data.shape)[:-1] + ((1,) if keepdims else ())
    y = rc.device_empty(shape, np.int64)
    rows = data.size // n
    if rows:
        _argmax_rows[rows, row_threads(n)](flat(data), flat(y) if y.ndim else y.reshape(1), n)
    return y
