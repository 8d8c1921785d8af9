"""CUDA matrix products: a GEMV for decode (M = 1) and a tiled shared-memory GEMM.

GEMV: ``y[n] = sum_k x[k] * W[k, n] (+ bias[n])`` with ``W`` (K, N) row-major: a block of 32 x 8 threads owns
32 adjacent columns, each warp reads 32 adjacent columns of a row of ``W`` at once (coalesced) and the 8 warps
split K, adding their partial sums through shared memory in a fixed order (deterministic), so even a
decode-sized N (a few thousand columns) puts thousands of warps in flight.  GEMM: ``C = A @ B`` for 2-d or
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
from ._common import F16, F32, check_device, flat

__all__ = ["gemv", "gemm", "MatMul", "TILE", "launch_gemv", "gemv_geometry", "gemv_column_sums", "GEMV_COLS",
           "GEMV_SLICES", "GEMV_SCRATCH"]

TILE = 16
_MATMUL_DTYPES = (F32, F16)


GEMV_COLS, GEMV_SLICES = 32, 8  # a block's columns (threadIdx.x) and K slices (threadIdx.y) on a GPU
# The shape of the GEMV kernels' shared scratch.  A shared array's shape must be a compile-time constant: a
# global of the kernel's own module is one; a product written inside the kernel, or another module's attribute,
# is typed as a run-time int64 and fails to compile for a GPU (the simulator does not type it).
GEMV_SCRATCH = (2 * GEMV_SLICES, GEMV_COLS)


def gemv_geometry(N: int) -> tuple:
    """(blocks, (columns, slices)) for the GEMV kernels: a warp covers 32 adjacent columns of a weight row
    (coalesced) and 8 warps split K, so a decode-sized N still fills the device; under the simulator, where
    every thread is a Python thread, a few threads and at most two blocks."""
    N = max(int(N), 1)
    if rc.simulator():
        cols = min(N, 4)
        return min(-(-N // cols), 2), (cols, 2)
    return min(-(-N // GEMV_COLS), 1 << 16), (GEMV_COLS, GEMV_SLICES)


@jit(device=True)
def gemv_column_sums(x, w, n, N, K, sh, part):
    """Column ``n``'s dot product with ``x``, for every thread of a (columns, slices) block: thread (tx, ty)
    sums k = ty, ty + slices, ... and the block adds the slices in order (deterministic).  ``part`` selects the
    row of ``sh`` (a float32 shared (2 * GEMV_SLICES, GEMV_COLS) scratch) so two sums can be in flight; every
    thread of the block must call it with the same arguments but its own ``n``."""
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    slices = cuda.blockDim.y
    acc = np.float32(0.0)
    if n < N:
        for k in range(ty, K, slices):
            acc += np.float32(x[k]) * np.float32(w[k * N + n])
    sh[part * GEMV_SLICES + ty, tx] = acc
    cuda.syncthreads()
    tot = np.float32(0.0)
    for j in range(slices):
        tot += sh[part * GEMV_SLICES + j, tx]
    cuda.syncthreads()  # the scratch is free again
    return tot


@jit
def _gemv(x, w, bias, has_bias, y, K, N):
    sh = cuda.shared.array(GEMV_SCRATCH, np.float32)
    for n0 in range(cuda.blockIdx.x * cuda.blockDim.x, N, cuda.gridDim.x * cuda.blockDim.x):  # block-uniform
        n = n0 + cuda.threadIdx.x
        acc = gemv_column_sums(x, w, n, N, K, sh, 0)
        if cuda.threadIdx.y == 0 and n < N:
            if has_bias:
                acc += np.float32(bias[n])
            y[n] = acc


def launch_gemv(x, w, bias, y, K, N):
    """``y = x @ w (+ bias)`` for flat device arrays (x of K, w of K*N row-major, y of N)."""
    blocks, threads = gemv_geometry(N)
    _gemv[blocks, threads](x, w, bias if bias is not None else x, bias is not None, y, K, N)


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
        launch_gemv(flat(x), flat(W), flat(bias) if bias is not None else None, flat(y), K, N)
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
