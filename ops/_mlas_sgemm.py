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

``sgemm_mlas`` is onnxruntime's MatMul of two run-time float32 inputs (``MlasGemmBatch`` over unpacked B), bit for
bit on one thread or several: its work is split over ``threads`` (onnxruntime's intra-op thread count) as
``MlasGemmBatch`` splits it, ``(complexity M*N*K / 65536) + 1`` threads at most, divided among the batch's products,
each product's along N in blocks of 16 columns when N > M, else along M; and each thread's range runs
``MlasSgemmOperation``: a range of one row takes the one-row kernel (``m1_rowvec``), a product with one column
(N = 1) the one-row transposed kernel with A in B's place (8 lanes over K, products and sums rounded apart, folded
by ``m1t_fold`` by the row's place in its range), every other range slices K by its own width (``k_stride``: the
thread split changes the slices, so the result depends on the thread count as onnxruntime's does) into chains of
fused multiply-adds from zero (``blocked_cols``' register tiles over the slice packed into panels), each later
slice's sums added to the first's.  onnxruntime folds A's batch into its
rows when B is 2-d (one product), and multiplies batch by batch otherwise.

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

__all__ = ["STRIDE_K", "batch_split", "k_stride", "m1_rowvec", "m1t_fold", "pack_slices", "sgemm_packed_mlas",
           "sgemm_mlas", "task_range"]

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


THREAD_COMPLEXITY = 64 * 1024  # MLAS_SGEMM_THREAD_COMPLEXITY: multiplies per thread before another is taken
THREAD_ALIGN = 16  # MLAS_SGEMM_STRIDEN_THREAD_ALIGN: columns of a thread's range, a multiple of this


@njit(cache=True, nogil=True)
def k_stride(N, K):
    """The K slice of ``MlasSgemmOperation`` over N columns (A not transposed): strides of 128 columns and 128 of
    K, N's doubled while K's half still covers K, else K's doubled while N's half covers N (down to 16 columns)."""
    sn, sk = 128, 128
    if N >= K:
        while sk // 2 >= K:
            sn, sk = sn * 2, sk // 2
    else:
        while sn > 16 and sn // 2 >= N:
            sn, sk = sn // 2, sk * 2
    return sk


@njit(cache=True, nogil=True, inline="always")
def _partition(i, n, total):
    """``MlasPartitionWork``: part ``i`` of ``n`` of ``total`` items, (start, count), the first ``total % n`` one
    larger."""
    q, r = total // n, total % n
    if i < r:
        return i * (q + 1), q + 1
    return i * q + r, q


@njit(cache=True, nogil=True)
def _range(a, b, m0, cm, n0, cn, out):
    """``MlasSgemmOperation`` on rows [m0, m0 + cm) and columns [n0, n0 + cn) of ``out = a @ b``."""
    K = a.shape[1]
    N = b.shape[1]
    if cm == 1:
        m1_rowvec(a[m0], b[:, n0:n0 + cn], out[m0, n0:n0 + cn], True)
        return
    if N == 1:  # B a contiguous column: the one-row transposed kernel, A's rows its columns
        x = np.empty(8, np.float32)
        for j in range(cm):
            x[:] = 0.0
            for k in range(K):
                x[k % 8] = np.float32(x[k % 8] + np.float32(b[k, 0] * a[m0 + j, k]))
            out[m0 + j, 0] = np.float32(m1t_fold(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], j, cm)
                                        + np.float32(0.0))
        return
    S = k_stride(cn, K)
    P = (cn + PANEL - 1) // PANEL
    rows = np.ascontiguousarray(a[m0:m0 + cm])
    acc = np.empty((cm, P * PANEL), np.float32)
    part = np.empty((cm, P * PANEL), np.float32) if K > S else acc
    for k0 in range(0, K, S):  # per slice, ``blocked_cols``'s register tiles: one chain per element from zero
        ck = min(S, K - k0)
        wp = np.empty((P, ck, PANEL), np.float32)
        pack_panels_into(b[k0:k0 + ck, n0:n0 + cn], wp)
        blocked_cols(np.ascontiguousarray(rows[:, k0:k0 + ck]), wp, acc if k0 == 0 else part, 0, P, 0, ck, True)
        if k0 > 0:
            for i in range(cm):
                for n in range(cn):
                    acc[i, n] = np.float32(part[i, n] + acc[i, n])
    for i in range(cm):
        for n in range(cn):
            out[m0 + i, n0 + n] = acc[i, n]


@njit(cache=True, nogil=True)
def batch_split(nb, M, N, K, threads):
    """``MlasGemmBatch``'s split of ``nb`` (M, N, K) products over ``threads`` threads: (tasks per product, row
    parts, column parts); ``task_range`` gives a task's rows and columns."""
    target = min(np.int64(float(M) * float(N) * float(K) / float(THREAD_COMPLEXITY)) + 1, max(threads, 1))
    per = (target + nb - 1) // nb
    if N > M:
        per = min(per, (N + THREAD_ALIGN - 1) // THREAD_ALIGN)
        return per, 1, per
    per = min(per, M)
    return per, per, 1


@njit(cache=True, nogil=True, inline="always")
def task_range(tid, tm, tn, M, N):
    """Task ``tid`` of a product split ``tm`` x ``tn`` (``batch_split``): (m0, rows, n0, columns); columns in
    multiples of ``THREAD_ALIGN`` but the last part's (rows or columns may be 0: nothing to do)."""
    m0, cm = _partition(tid // tn, tm, M)
    n0, cn = _partition(tid % tn, tn, (N + THREAD_ALIGN - 1) // THREAD_ALIGN)
    n0 *= THREAD_ALIGN
    return m0, cm, n0, min(N - n0, cn * THREAD_ALIGN)


@njit(cache=True, nogil=True, parallel=True)
def sgemm_mlas(a3, b3, ia, ib, out3, threads):
    """``out3[g] = a3[ia[g]] @ b3[ib[g]]`` for every product g, as ``MlasGemmBatch`` computes them on ``threads``
    threads (see the module; a 2-d product is one of one).  Every element of ``out3`` is written."""
    nb, M, N = out3.shape
    K = a3.shape[2]
    if K == 0:
        out3[:] = 0.0
        return
    per, tm, tn = batch_split(nb, M, N, K, threads)
    for t in prange(nb * per):
        g = t // per
        m0, cm, n0, cn = task_range(t % per, tm, tn, M, N)
        if cm > 0 and cn > 0:
            _range(a3[ia[g]], b3[ib[g]], m0, cm, n0, cn, out3[g])
