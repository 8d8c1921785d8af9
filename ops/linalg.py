"""Linear-algebra ops: Det.

Matrices are flattened to a (batch, M, M) float64 stack so the LU kernel
(partial pivoting) compiles once; results are cast back to the input dtype.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, ShapeMismatchError
from ._common import lowp
from .registry import op

__all__ = ["Det"]


@njit(cache=True, nogil=True)
def _det_kernel(a, out):
    nb, n, _ = a.shape
    m = np.empty((n, n))
    for b in range(nb):
        m[:, :] = a[b]
        det = 1.0
        for k in range(n):
            p = k
            best = abs(m[k, k])
            for i in range(k + 1, n):
                if abs(m[i, k]) > best:
                    best = abs(m[i, k])
                    p = i
            if best == 0.0:
                det = 0.0
                break
            if p != k:
                for j in range(n):
                    m[k, j], m[p, j] = m[p, j], m[k, j]
                det = -det
            piv = m[k, k]
            det *= piv
            for i in range(k + 1, n):
                f = m[i, k] / piv
                if f != 0.0:
                    for j in range(k + 1, n):
                        m[i, j] -= f * m[k, j]
        out[b] = det


@op("Det", 11)
def Det(X):
    if X.dtype.kind != "f" and not lowp(X.dtype):
        raise InvalidArgumentError(f"Det expects a floating-point input, got {X.dtype}")
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise ShapeMismatchError(f"Det expects [..., M, M], got {list(X.shape)}")
    n = X.shape[-1]
    a = np.ascontiguousarray(X.reshape(-1, n, n), np.float64)
    out = np.empty(a.shape[0], np.float64)
    if out.size:
        _det_kernel(a, out)
    return out.reshape(X.shape[:-2]).astype(X.dtype)
