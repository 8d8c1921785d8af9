"""CUDA TopK (``ops/topk.py``'s twin): the k largest (or smallest) elements along an axis, with int64 indices.

The input is viewed as ``(outer, n, inner)``; one thread per ``(outer, inner)`` column selects its k elements
in rank order, each the best element that ranks after the previous one (O(n k) reads, no scratch).  The order
is the CPU's: by value, then by lower index, NaN above every number (first when ``largest``, last otherwise),
so equal values come out lowest index first and results are always sorted.  16-bit floats are compared in
float32; K is a host input.

Invariants: the input is a C-contiguous device array; both outputs are fresh device arrays.
"""
from __future__ import annotations

import math

import numpy as np

from ops._common import norm_axis
from ops.registry import op
from ops.topk import _k_of
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ._common import F16, F32, FLOATS, check_device, flat, grid1d, host_array
from .elementwise import cast_to

__all__ = ["topk"]

CUDA = "CUDAExecutionProvider"


@jit(device=True)
def _better(va, ia, vb, ib, largest):
    """Whether (va, ia) ranks before (vb, ib) (``ops.topk._better``'s order)."""
    a_nan = va != va
    b_nan = vb != vb
    if a_nan or b_nan:
        if a_nan and b_nan:
            return ia < ib
        return a_nan if largest else b_nan
    if va == vb:
        return ia < ib
    return va > vb if largest else va < vb


@jit
def _topk_cols(x, vals, idx, outer, n, inner, k, largest):
    for c in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
        o = c // inner
        i = c - o * inner
        base = o * n * inner + i
        obase = o * k * inner + i
        pv = x[base]
        pi = -1
        for t in range(k):
            bv = x[base]
            bi = -1
            for j in range(n):
                v = x[base + j * inner]
                if pi >= 0 and not _better(pv, pi, v, j, largest):
                    continue  # ranks at or before the previous pick
                if bi < 0 or _better(v, j, bv, bi, largest):
                    bv = v
                    bi = j
            vals[obase + t * inner] = bv
            idx[obase + t * inner] = bi
            pv = bv
            pi = bi


def topk(X, k: int, axis: int, largest) -> tuple:
    """(values, indices) of the top ``k`` of the device array ``X`` along ``axis``."""
    check_device("TopK", X=X)
    dt = np.dtype(X.dtype)
    if dt.kind not in "iu" and dt not in FLOATS:
        raise InvalidArgumentError(f"TopK expects a numeric tensor, got {dt}")
    shape = tuple(int(d) for d in X.shape)
    ax = norm_axis(axis, len(shape))
    n = shape[ax]
    if k < 0 or k > n:
        raise InvalidArgumentError(f"TopK: k must lie in [0, {n}] for axis {axis} of shape {list(shape)}, got {k}")
    if dt == F16:
        v, i = topk(cast_to(X, F32), k, axis, largest)
        return cast_to(v, F16), i
    oshape = shape[:ax] + (k,) + shape[ax + 1:]
    vals = rc.device_empty(oshape, dt)
    idx = rc.device_empty(oshape, np.int64)
    if vals.size:
        outer, inner = int(math.prod(shape[:ax])), int(math.prod(shape[ax + 1:]))
        blocks, threads = grid1d(outer * inner)
        _topk_cols[blocks, threads](flat(X), flat(vals), flat(idx), outer, n, inner, k, bool(largest))
    return vals, idx


def _topk1(ctx, axis=-1, k=None):
    return lambda X: topk(X, int(k), axis, True)


def _topk10(ctx, axis=-1):
    return lambda X, K: topk(X, _k_of(host_array("TopK", "K", K)), axis, True)


def _topk11(ctx, axis=-1, largest=1, sorted=1):
    return lambda X, K: topk(X, _k_of(host_array("TopK", "K", K)), axis, largest)


op("TopK", 1, provider=CUDA, factory=True)(_topk1)
op("TopK", 10, provider=CUDA, factory=True, host_inputs=(1,))(_topk10)
for _v in (11, 24):
    op("TopK", _v, provider=CUDA, factory=True, host_inputs=(1,))(_topk11)
