"""A float32 product against a constant weight in MLAS's order: onnxruntime's CPU MatMul bit for bit on x86 hosts
with FMA (AVX2 or AVX-512), taken under ``ONNX_NUMBA_MLAS_ORDER=1``.

onnxruntime packs a MatMul's constant 2-d float32 weight at load (``MatMul<float>::PrePack``, ``MlasGemmPackB``)
and multiplies through ``MlasSgemmPackedOperation``: for every output element, per slice of 256 rows of the
weight (``MLAS_SGEMM_PACKED_STRIDEK``), a chain of fused multiply-adds over the slice from its first row, starting
at zero; the first slice's sum is stored (alpha 1, beta 0), each later one added to it in one rounding
(``fma(sum, 1, C)``).  Its split of rows and columns over threads never splits K, so the result does not depend
on the thread count.  Here each slice is packed into the column panels of ``ops/_panels`` and multiplied by its
register tiles of several rows (one chain of fused multiply-adds per element: ``tile4``), rows padded to four.

Invariants: ``pack_slices`` writes every element of its buffer (zeros past N); ``sgemm_packed_mlas`` reads only
its arguments and returns a fresh (M, N) array; the caller checks ``a2.shape[1] == K``.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._panels import PANEL, pack_panels_into, tile4

__all__ = ["STRIDE_K", "pack_slices", "sgemm_packed_mlas"]

STRIDE_K = 256  # MLAS_SGEMM_PACKED_STRIDEK
_GROUP = 8  # panels per task


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
    """``a2 (M, K) @ W`` for the weight ``pack_slices`` made, in MLAS's packed order (see the module)."""
    M = a2.shape[0]
    M4 = (M + 3) // 4 * 4
    P = (N + PANEL - 1) // PANEL
    ns = (K + STRIDE_K - 1) // STRIDE_K
    aflat = np.zeros(ns * M4 * STRIDE_K, np.float32)  # each slice of A contiguous, rows padded to four
    for s in range(ns):
        k0 = s * STRIDE_K
        ck = min(STRIDE_K, K - k0)
        a_s = aflat[s * M4 * STRIDE_K:s * M4 * STRIDE_K + M4 * ck].reshape((M4, ck))
        for r in range(M):
            for k in range(ck):
                a_s[r, k] = a2[r, k0 + k]
    out = np.empty((M4, N), np.float32)
    part = np.empty((M4, N), np.float32) if ns > 1 else out
    ng = (P + _GROUP - 1) // _GROUP
    for t in prange((M4 // 4) * ng):
        r0 = (t // ng) * 4
        p0 = (t % ng) * _GROUP
        p1 = min(P, p0 + _GROUP)
        c1 = min(N, p1 * PANEL)
        for s in range(ns):
            k0 = s * STRIDE_K
            ck = min(STRIDE_K, K - k0)
            a_s = aflat[s * M4 * STRIDE_K:s * M4 * STRIDE_K + M4 * ck].reshape((M4, ck))
            off = s * P * STRIDE_K * PANEL
            w_s = wflat[off:off + P * ck * PANEL].reshape((P, ck, PANEL))
            if s == 0:
                tile4(w_s, a_s, out, r0, p0, p1)
            else:
                tile4(w_s, a_s, part, r0, p0, p1)
                for r in range(r0, r0 + 4):
                    for c in range(p0 * PANEL, c1):
                        out[r, c] = np.float32(out[r, c] + part[r, c])
    return out[:M]
