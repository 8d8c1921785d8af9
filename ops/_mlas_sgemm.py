"""A float32 product against a constant weight in MLAS's order: onnxruntime's CPU MatMul bit for bit on x86 hosts
with FMA (AVX2 or AVX-512), taken where ``_common.mlas_order`` holds (by default on x86 hosts with AVX2).

onnxruntime packs a MatMul's constant 2-d float32 weight at load (``MatMul<float>::PrePack``, ``MlasGemmPackB``)
and multiplies through ``MlasSgemmPackedOperation``: for every output element, per slice of 256 rows of the
weight (``MLAS_SGEMM_PACKED_STRIDEK``), a chain of fused multiply-adds over the slice from its first row, starting
at zero; the first slice's sum is stored (alpha 1, beta 0), each later one added to it in one rounding
(``fma(sum, 1, C)``).  Its split of rows and columns over threads never splits K, so the result does not depend
on the thread count.  Here each slice is packed into the column panels of ``ops/_panels`` and multiplied by its
register tiles of rows by panels (one chain of fused multiply-adds per element from zero: ``blocked_cols``; one
row runs four panels side by side, so the chains' latency does not bound it).

``m1_rowvec`` is MLAS's one-row SGEMM kernel for B not transposed (GroupQueryAttention's one-row value product,
LinearAttention's row-vector products); ``m1t_fold`` is the fold of its kernel for a transposed B (eight lanes per
column), which the 8-bit MatMulNBits float path and GroupQueryAttention's one-row scores at scale 1 share.

Invariants: ``pack_slices`` writes every element of its buffer (zeros past N); ``sgemm_packed_mlas`` reads only
its arguments and returns a fresh (M, N) array; the caller checks ``a2.shape[1] == K``.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._panels import PANEL, blocked_cols, pack_panels_into

__all__ = ["STRIDE_K", "m1_rowvec", "m1t_fold", "pack_slices", "sgemm_packed_mlas"]

STRIDE_K = 256  # MLAS_SGEMM_PACKED_STRIDEK
_GROUP = 8  # panels per task


@njit(cache=True, nogil=True, inline="always")
def m1_rowvec(w, B, C, first):
    """C (+)= w . B (w [K], B [K, N]) as MLAS's one-row SGEMM kernel for B not transposed
    (``MlasSgemmKernelM1Avx``) sums it: rows of B in groups of 4, then 2, then 1; per group and column the
    products (each rounded) summed in row order, then added to C, which the first group replaces when ``first``."""
    K, N = B.shape
    k = 0
    store = first
    while k < K:
        g = 4 if K - k >= 4 else (2 if K - k >= 2 else 1)
        for n in range(N):
            t = np.float32(w[k] * B[k, n])
            for u in range(1, g):
                t = np.float32(t + np.float32(w[k + u] * B[k + u, n]))
            C[n] = np.float32(t + (np.float32(0.0) if store else C[n]))
        store = False
        k += g


@njit(cache=True, nogil=True, inline="always")
def m1t_fold(x0, x1, x2, x3, x4, x5, x6, x7, n, N):
    """Column ``n`` of N: its eight float32 lanes folded as MLAS's one-row transposed SGEMM kernel folds them (each
    sum rounded): below N rounded down to 4 ``(((l0+l1)+l2)+l3) + (((l4+l5)+l6)+l7)``, a last pair
    ``((l0+l2)+(l4+l6)) + ((l1+l3)+(l5+l7))``, a last one ``((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))``."""
    n4 = N - N % 4
    if n < n4:
        return (((x0 + x1) + x2) + x3) + (((x4 + x5) + x6) + x7)
    if N % 4 >= 2 and n < n4 + 2:
        return ((x0 + x2) + (x4 + x6)) + ((x1 + x3) + (x5 + x7))
    return ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))


@njit(cache=True, nogil=True)
def pack_slices(w):
    """The (K, N) weight as consecutive slices of ``STRIDE_K`` rows, each packed into (P, rows, 16) panels: slice
    ``s`` at offset ``s * P * STRIDE_K * 16`` of the flat result."""
    K, N = w.shape
    P = (N + PANEL - 1) // PANEL
    ns = (K + STRIDE_K - 1) // STRIDE_K
    flat = np.zeros(ns * P * STRIDE_K * PANEL, np.float32)
    for s in range(ns):
        k0 = s * STRIDE_K
        ck = min(STRIDE_K, K - k0)
        off = s * P * STRIDE_K * PANEL
        pack_panels_into(w[k0:k0 + ck], flat[off:off + P * ck * PANEL].reshape((P, ck, PANEL)))
    return flat


@njit(cache=True, nogil=True, parallel=True)
def sgemm_packed_mlas(a2, wflat, K, N):
    """``a2 (M, K) @ W`` for the weight ``pack_slices`` made, in MLAS's packed order (see the module): tasks of
    ``_GROUP`` panels over all rows; per slice, ``blocked_cols``'s register tiles from zero over the slice's rows
    (one chain of fused multiply-adds per element), each later slice's sums added in one rounding."""
    M = a2.shape[0]
    P = (N + PANEL - 1) // PANEL
    ns = (K + STRIDE_K - 1) // STRIDE_K
    aflat = np.empty(ns * M * STRIDE_K, np.float32)  # each slice of A contiguous
    for s in range(ns):
        k0 = s * STRIDE_K
        ck = min(STRIDE_K, K - k0)
        a_s = aflat[s * M * STRIDE_K:s * M * STRIDE_K + M * ck].reshape((M, ck))
        for r in range(M):
            for k in range(ck):
                a_s[r, k] = a2[r, k0 + k]
    out = np.empty((M, P * PANEL), np.float32)  # whole panels; the columns past N dropped at the end
    part = np.empty((M, P * PANEL), np.float32) if ns > 1 else out
    for t in prange((P + _GROUP - 1) // _GROUP):
        p0 = t * _GROUP
        p1 = min(P, p0 + _GROUP)
        for s in range(ns):
            k0 = s * STRIDE_K
            ck = min(STRIDE_K, K - k0)
            a_s = aflat[s * M * STRIDE_K:s * M * STRIDE_K + M * ck].reshape((M, ck))
            off = s * P * STRIDE_K * PANEL
            w_s = wflat[off:off + P * ck * PANEL].reshape((P, ck, PANEL))
            if s == 0:
                blocked_cols(a_s, w_s, out, p0, p1, 0, ck, True)
            else:
                blocked_cols(a_s, w_s, part, p0, p1, 0, ck, True)
                for r in range(M):
                    for c in range(p0 * PANEL, p1 * PANEL):
                        out[r, c] = np.float32(out[r, c] + part[r, c])
    return np.ascontiguousarray(out[:, :N]) if N != P * PANEL else out
