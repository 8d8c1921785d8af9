"""TopK: the k largest (or smallest) elements along an axis, with their int64 indices.

The input is viewed as (outer, n, inner) with the selected axis in the
middle.  Each row goes through a size-k heap ordered by value and then by
index, so that, as in onnxruntime, equal values come out lowest index first
for both ``largest`` settings; results are always sorted (the spec leaves the order undefined when ``sorted=0``).
K is an attribute in opset 1 and a 1-element int64 input from 10.
16-bit floats are compared in float32 and returned in their own dtype.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError
from ._common import F32, as_int_list, lowp, norm_axis
from .registry import op

_OPTS = dict(cache=True, nogil=True, error_model="numpy")


@njit(**_OPTS)
def _better(va, ia, vb, ib, largest):
    """Whether element (va, ia) ranks before (vb, ib): by value, then by lower index.  NaN ranks above every
    number, as in onnxruntime: first when ``largest``, last otherwise."""
    a_nan, b_nan = va != va, vb != vb
    if a_nan or b_nan:
        if a_nan and b_nan:
            return ia < ib
        return a_nan if largest else b_nan
    if va == vb:
        return ia < ib
    return va > vb if largest else va < vb


@njit(**_OPTS)
def _sift_down(hv, hi, size, p, largest):
    while True:
        c = 2 * p + 1
        if c >= size:
            return
        if c + 1 < size and _better(hv[c], hi[c], hv[c + 1], hi[c + 1], largest):
            c += 1
        if not _better(hv[p], hi[p], hv[c], hi[c], largest):
            return
        hv[p], hv[c] = hv[c], hv[p]
        hi[p], hi[c] = hi[c], hi[p]
        p = c


@njit(**_OPTS)
def _topk3(x, vals, idx, largest):
    """Fill ``vals``/``idx`` (outer, k, inner) with the top k of each row of ``x`` (outer, n, inner).

    A size-k heap whose root is the worst element kept (O(n log k) per row);
    popping it fills the outputs from the back, so they come out best first.
    """
    outer, n, inner = x.shape
    k = vals.shape[1]
    hv = np.empty(k, x.dtype)
    hi = np.empty(k, np.int64)
    for o in range(outer):
        for i in range(inner):
            size = 0
            for j in range(n):
                v = x[o, j, i]
                if size < k:
                    p = size
                    hv[p] = v
                    hi[p] = j
                    size += 1
                    while p > 0:
                        q = (p - 1) // 2
                        if not _better(hv[q], hi[q], hv[p], hi[p], largest):
                            break
                        hv[p], hv[q] = hv[q], hv[p]
                        hi[p], hi[q] = hi[q], hi[p]
                        p = q
                elif _better(v, j, hv[0], hi[0], largest):
                    hv[0] = v
                    hi[0] = j
                    _sift_down(hv, hi, size, 0, largest)
            for t in range(k - 1, -1, -1):
                vals[o, t, i] = hv[0]
                idx[o, t, i] = hi[0]
                size -= 1
                hv[0] = hv[size]
                hi[0] = hi[size]
                _sift_down(hv, hi, size, 0, largest)


def run_topk(x, k, axis, largest):
    ax = norm_axis(axis, x.ndim)
    n = x.shape[ax]
    if k < 0 or k > n:
        raise InvalidArgumentError(f"TopK: k must lie in [0, {n}] for axis {axis} of shape {list(x.shape)}, got {k}")
    dt = x.dtype
    if dt.kind not in "fiu" and not lowp(dt):
        raise InvalidArgumentError(f"TopK expects a numeric tensor, got {dt}")
    xc = x.astype(F32) if lowp(dt) else x
    oshape = x.shape[:ax] + (k,) + x.shape[ax + 1:]
    vals = np.empty(oshape, xc.dtype)
    idx = np.empty(oshape, np.int64)
    if vals.size:
        outer = int(math.prod(x.shape[:ax]))
        inner = int(math.prod(x.shape[ax + 1:]))
        _topk3(xc.reshape(outer, n, inner), vals.reshape(outer, k, inner), idx.reshape(outer, k, inner),
               bool(largest))
    return (vals.astype(dt) if vals.dtype != dt else vals), idx


def _k_of(K) -> int:
    ks = as_int_list(K)
    if len(ks) != 1:
        raise InvalidArgumentError(f"TopK: K must hold exactly one integer, got {ks}")
    return ks[0]


@op("TopK", 1)
def TopK_1(X, *, axis=-1, k):
    return run_topk(X, int(k), axis, True)


@op("TopK", 10)
def TopK_10(X, K, *, axis=-1):
    return run_topk(X, _k_of(K), axis, True)


@op("TopK", 11)
def TopK_11(X, K, *, axis=-1, largest=1, sorted=1):
    return run_topk(X, _k_of(K), axis, largest)


op("TopK", 24)(TopK_11)
