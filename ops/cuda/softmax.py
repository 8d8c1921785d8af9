"""CUDA Softmax, LogSoftmax and Hardmax over the last axis.

One block per row of the canonical ``(rows, n)`` view: a block-wide max, then ``exp(x - max)`` written once
and summed, then a scale by ``1 / sum`` (LogSoftmax: ``x - max - log(sum)``; Hardmax: 1 at the first maximum,
found as the block-wide largest ``-j`` among the positions holding it).  Computed in float32 for
float16/float32 inputs.  Other axes are moved last by the registration (``ops/cuda/registered.py``).

Invariants: input and output are C-contiguous device arrays of one shape and dtype; only the last axis is
supported here (``axis`` must name it; opset >= 13 semantics); an empty tensor returns an empty tensor.
"""
from __future__ import annotations

import math

import numpy as np

from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ops._common import norm_axis
from ._common import FLOATS, MAX_ROW_THREADS, block_max, block_sum, check_device, flat, row_threads

__all__ = ["Softmax", "SOFTMAX", "LOG_SOFTMAX", "HARDMAX"]


SOFTMAX, LOG_SOFTMAX, HARDMAX = 0, 1, 2


@jit
def _softmax_rows(x, y, n, mode):
    sh = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    base = row * n
    m = np.float32(-math.inf)
    for j in range(tid, n, nt):
        v = np.float32(x[base + j])
        if v > m:
            m = v
    m = block_max(sh, tid, nt, m)
    if mode == HARDMAX:
        first = np.float32(-math.inf)  # the largest -j with x[j] == m: the first maximum
        for j in range(tid, n, nt):
            if np.float32(x[base + j]) == m and np.float32(-j) > first:
                first = np.float32(-j)
        first = block_max(sh, tid, nt, first)
        for j in range(tid, n, nt):
            y[base + j] = np.float32(1.0) if np.float32(-j) == first else np.float32(0.0)
        return
    acc = np.float32(0.0)
    for j in range(tid, n, nt):
        e = math.exp(np.float32(x[base + j]) - m)
        y[base + j] = e
        acc += e
    total = block_sum(sh, tid, nt, acc)
    if mode == LOG_SOFTMAX:
        lse = m + math.log(total)
        for j in range(tid, n, nt):
            y[base + j] = np.float32(x[base + j]) - lse
        return
    inv = np.float32(1.0) / total
    for j in range(tid, n, nt):
        y[base + j] = np.float32(y[base + j]) * inv


def Softmax(input, axis=-1, *, out=None, mode=SOFTMAX, name="Softmax"):
    check_device(name, input=input)
    if np.dtype(input.dtype) not in FLOATS:
        raise InvalidArgumentError(f"{name}: expected a float tensor, got {input.dtype}")
    rank = max(input.ndim, 1)
    if norm_axis(axis, rank) != rank - 1:
        raise InvalidArgumentError(f"{name}: the CUDA kernel reduces the last axis only, got axis={axis} "
                                   f"for rank {input.ndim}")
    y = rc.device_empty(tuple(input.shape), input.dtype) if out is None else out
    n = tuple(input.shape)[-1] if input.ndim else 1
    if input.size:
        rows = input.size // n
        _softmax_rows[rows, row_threads(n)](flat(input), flat(y), n, mode)
    return y
