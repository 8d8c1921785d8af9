"""CUDA matrix products: a GEMV for decode (M = 1) and a tiled shared-memory GEMM.

GEMV: ``y[n] = sum_k x[k] * W[k, n] (+ bias[n])`` with ``W`` (K, N) row-major, one thread per output column,
so a warp reads 32 adjacent columns of a row of ``W`` at once (coalesced).  GEMM: ``C = A @ B`` for 2-d or
batched 3-d operands in ``TILE x TILE`` blocks staged through shared memory; a 2-d ``B`` is shared by every
batch (a weight).  Accumulation is float32; float16 operands are widened on load and rounded on store.

Invariants: operands are C-contiguous device arrays of one float dtype; the result is a new device array of
that dtype; inner dimensions must agree (``ShapeMismatchError`` otherwise).
"""
from __future__ import annotations

import numpy as np

from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError, ShapeMismatchError
from ._common import F16, F32, check_device, flat, grid1d

__all__ = ["gemv", "gemm", "MatMul", "TILE"]

TILE = 16
_MATMUL_DTYPES = (F32, F16)


@jit
def _gemv(x, w, bias, has_bias, y, K, N):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for n in range(start, N, step):
        acc = np.float32(0.0)
        for k in range(K):
            acc += np.float32(x[k]) * np.float32(w[k * N + n])
        if has_bias:
            acc += np.float32(bias[n])
        y[n] = acc


@jit
def _gemm_tiled(a, b, c, M, N, K, a_batch, b_batch):
    sa = cuda.shared.array((TILE, TILE), np.float32)
    sb = cuda.shared.array((TILE, TILE), np.float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col = cuda.blockIdx.x * TILE + tx
    row = cuda.blockIdx.y * TILE + ty
    z = cuda.blockIdx.z
    ao = z * a_batch
    bo = z * b_batch
    acc = np.float32(0.0)
    for t in range((K + TILE - 1) // TILE):
        ka = t * TILE + tx
        sa[ty, tx] = np.float32(a[ao + row * K + ka]) if row < M and ka < K else np.float32(0.0)
        kb = t * TILE + ty
        sb[ty, tx] = np.float32(b[bo + kb * N + col]) if kb < K and col < N else np.float32(0.0)
        cuda.syncthreads()
        for k in range(TILE):
            acc += sa[ty, k] * sb[k, tx]
        cuda.syncthreads()
    if row < M and col < N:
        c[z * M * N + row * N + col] = acc


def _check_dtypes(op, *arrays):
    dt = np.dtype(arrays[0].dtype)
    if dt not in _MATMUL_DTYPES or any(np.dtype(a.dtype) != dt for a in arrays):
        raise InvalidArgumentError(f"{op}: operands must share float32 or float16, got {[str(a.dtype) for a in arrays]}")


def gemv(x, W, bias=None):
    """``x @ W (+ bias)`` for ``x`` of shape (K,) or (1, K) and ``W`` (K, N); the result has ``x``'s rank."""
    check_device("gemv", x=x, W=W, bias=bias)
    _check_dtypes("gemv", *(t for t in (x, W, bias) if t is not None))
    if W.ndim != 2 or x.ndim not in (1, 2) or (x.ndim == 2 and tuple(x.shape)[0] != 1):
        raise ShapeMismatchError(f"gemv: expected x (K,) or (1, K) and W (K, N), got {list(x.shape)} and "
                                 f"{list(W.shape)}")
    K, N = W.shape
    if tuple(x.shape)[-1] != K or (bias is not None and bias.size != N):
        raise ShapeMismatchError(f"gemv: x {list(x.shape)}, W {list(W.shape)}"
                                 f"{'' if bias is None else f', bias {list(bias.shape)}'} do not agree")
    y = rc.device_empty(tuple(x.shape)[:-1] + (N,), x.dtype)
    if N:
        blocks, threads = grid1d(N)
        _gemv[blocks, threads](flat(x), flat(W), flat(bias) if bias is not None else flat(x), bias is not None,
                               flat(y), K, N)
    return y


def gemm(A, B):
    """``A @ B`` for A (M, K) or (batch, M, K) and B (K, N) or (batch, K, N)."""
    check_device("gemm", A=A, B=B)
    _check_dtypes("gemm", A, B)
    if A.ndim not in (2, 3) or B.ndim not in (2, 3) or \
            (B.ndim == 3 and (A.ndim != 3 or tuple(B.shape)[0] != tuple(A.shape)[0])):
        raise ShapeMismatchError(f"gemm: expected A (M, K) or (b, M, K) and B (K, N) or (b, K, N), got "
                                 f"{list(A.shape)} and {list(B.shape)}")
    M, K = tuple(A.shape)[-2:]
    K2, N = tuple(B.shape)[-2:]
    if K != K2:
        raise ShapeMismatchError(f"gemm: inner dimensions differ: A {list(A.shape)} @ B {list(B.shape)}")
    batch = tuple(A.shape)[0] if A.ndim == 3 else 1
    C = rc.device_empty(tuple(A.shape)[:-1] + (N,), A.dtype)
    if C.size:
        grid = (-(-N // TILE), -(-M // TILE), batch)
        _gemm_tiled[grid, (TILE, TILE)](flat(A), flat(B), flat(C), M, N, K, M * K, K * N if B.ndim == 3 else 0)
    return C


def MatMul(A, B):
    """Dispatches to the GEMV when A is a single row and B a 2-d weight, else to the tiled GEMM."""
    if B.ndim == 2 and (A.ndim == 1 or (A.ndim == 2 and tuple(A.shape)[0] == 1)):
        return gemv(A, B)
    return gemm(A, B)
