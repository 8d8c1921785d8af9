"""Block-quantized contrib ops (domain com.microsoft): MatMulNBits (GatherBlockQuantized is
``ops/gather_block_quantized.py``).

These are what the onnxruntime-genai model builder emits for int4/int8 packages: every linear layer
is a ``MatMulNBits`` and a tied embedding is a ``GatherBlockQuantized`` over the lm_head's packed
weight.

MatMulNBits: ``Y = A @ dequant(B)^T (+ bias)`` where ``B`` is uint8 ``[N, n_blocks, blob]`` holding
``bits``-bit codes packed low bits first along K, and element ``(n, k)`` dequantizes as
``(q - zp[n, g(k)]) * scale[n, g(k)]`` with ``g(k) = k // block_size`` (or ``g_idx[k]``).  Zero
points are absent (``2**(bits-1)``), packed uint8 (``ceil(n_blocks*bits/8)`` bytes per row) or
floats of A's type (with a g_idx, onnxruntime ignores packed zero points and so do we).  Two paths:

- rows (M <= ``ROWS_MAX``, decode): one pass over the packed weight, parallel over N; each block's
  codes are dotted with the matching slice of A (deinterleaved into even/odd halves once per call so
  the nibble loop is two vectorizable FMAs per byte) and the zero point is folded out through the block
  sum of A: ``sum((q - z) a) = sum(q a) - z sum(a)``.  With ``accuracy_level=4`` A is first
  quantized to int8 per block (scale ``max|a|/127``, round half to even) as onnxruntime does; the
  integer block dots are exact in float32, so the result matches onnxruntime's int8 path to float
  rounding.  Otherwise (level 0..3, float zero points, or a g_idx, where onnxruntime also keeps A float)
  A stays float: float accumulation of dequantized weights.  Small weights run on one thread
  (waking threads costs more than streaming them); big ones in small dynamically scheduled chunks
  of rows, so a thread delayed on a busy core does not hold up the pass.
- int8 rows (any number of rows; 4 bits, level 4 without float zero points, block size a multiple of
  16): the same arithmetic on integer instructions (``_simd``): A quantized to int8 per block, codes
  repacked once per node into 8-column groups (``int4_layout``), each block dot an exact integer sum of
  code-by-activation products, then ``scale_a * scale * (dot - z * sum_a)`` per block in float32 (without
  zero points ``- z * sum_a`` is an integer the block's sum starts from: ``zero_terms``);
  ``_simd.ROWS`` rows of A share each pass over the codes (from ``PAD_ROWS_MIN`` rows left, a pass runs with
  the last row repeated: a decode batch of 3 to 7 rows streams the codes once, not once per row).  A pass of
  several rows counts as that many times the bytes when choosing threads: at 8 rows a 896x1152 product took
  1.7 ms on 2 threads against 2.2 on one (24 weights streamed from memory).  Per row this costs about what the tiles +
  BLAS cost (K=896, N=4864: 18 against 14 ms at 256 rows, 148 against 169 ms at 2048, before rows shared
  a pass), and a prefill over the repacked codes never reads the original weight again.
- tiles (other configurations with more rows, or a non-trivial g_idx): a tile of weight rows is dequantized
  once into float32 and multiplied with all rows of A by BLAS.  At level 4 (without a g_idx or float zero
  points), A is replaced by its per-block int8 quantization scaled back (``qa * sa``), which is onnxruntime's
  level-4 product up to float rounding (the block scales factor out of each block's integer dot).

In MLAS's order (``_common.mlas_order``: the default on x86 hosts with AVX2; ``mlas_path``, read when a node is
planned) the products follow onnxruntime's float order instead, bit for bit its CPU kernel's on hosts of that
kind, AVX2 (without AVX-512) or AVX-512: level 4 with 4- and 8-bit codes in blocks of 16 to 256 by MLAS's int8
kernels (``gemv_q4i8_mlas``: blocks of 32 of 4-bit codes by ``_simd._OrtEmitter``, the others by ``_MlasLanes``
on AVX-512 hosts and ``_Avx2Lanes`` on AVX2 ones; 8-bit codes repacked by ``int8_layout``), levels 0 to 3 (float
A, no g_idx, no float zero points) by MLAS's float kernels (``gemv_fp_mlas``), and 4-bit codes with float zero
points or a g_idx, at any level, as onnxruntime's unpacked path: B dequantized first to
``q * s + (-s * z)`` (``dequant_ort_unpacked``; a packed zero point beside a g_idx read as 8), then its SGEMM
(``gemv_fp_mlas`` over the float weights).

Per node, the float scales and unpacked zero points are cached by the identity of the initializer
arrays (they are constants in every builder package).

The op is written once: its bind (``bind_mnb``), its checks and messages (``mnb_check``, ``MNB_ERRORS``), its
CPU wrapper here, its region form in ``ops/compiled_forms_contrib.py`` and its CUDA launch.

Invariants: inputs are never written; outputs are fresh arrays of A's dtype; 16-bit floats are computed in
float32.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from runtime.errors import InvalidAttributeError
from . import _simd
from ._common import F32, constant_twin, mlas_order, raise_coded
from ._fastmath import FAST
from ._glue import GlueCompiler
from ._mlas_attention import ort_threads
from ._mlas_sgemm import batch_split, k_stride, m1t_fold, task_range
from .registry import op

__all__ = ["matmul_nbits", "Mnb", "bind_mnb", "mnb_check", "check_inputs", "groups_of", "MNB_ERRORS"]

ROWS_MAX = 8          # rows of A handled by the one-pass kernel; more go through dequantized tiles + BLAS
# The int8 kernel's passes take ``_simd.ROWS`` rows at once; from this many rows left a pass runs padded (the last
# row repeated) rather than row by row: one pass over the codes costs less than three (a batch of decode rows).
PAD_ROWS_MIN = 3
# A pass's rows are quantized over the threads from this many blocks along K (fewer stay on the calling thread): at
# 8 rows a decoder layer's five products (K 896 and 4864) took 13.1-13.8 ms for 24 layers against 14.6-15.7 with
# the rows quantized on one thread.
PREP_PARALLEL_BLOCKS = 16
_CHUNK_ROWS = 64      # weight rows per dynamically scheduled chunk of the one-pass kernel
BYTES_PER_THREAD = 1 << 20
TILE_ELEMS = 1 << 20  # float32 elements of one dequantized weight tile (4 MiB)


# -- MatMulNBits kernels ---------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _block_scale(a, m, k0, k1, quant):
    """(scale, inverse) of the int8 quantization of the block ``a[m, k0:k1]``: ``max|a|/127`` and its inverse
    (0 for an all-zero block); (1, 1) unless ``quant``."""
    if not quant:
        return np.float32(1.0), np.float32(1.0)
    amax = np.float32(0.0)
    for k in range(k0, k1):
        v = abs(np.float32(a[m, k]))
        if v > amax:
            amax = v
    s = amax / np.float32(127.0)
    inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
    return s, inv


@njit(cache=True, nogil=True)
def prep_a4(a, nb, bs, quant, ae, ao, asum, ascale):
    """Split A [M, K] per block into ae = even elements and ao = odd - 16*even ([M, nb, bs//2]), so
    that ``byte*ae + (byte >> 4)*ao`` is the block dot with both nibbles; block sums and scales [M, nb].

    ``quant``: replace each block by its int8 quantization (values stay small integers in float32)
    and record the block scale; else keep floats with scale 1."""
    m_, k_ = a.shape
    half = bs // 2
    for m in range(m_):
        for blk in range(nb):
            k0 = blk * bs
            s, inv = _block_scale(a, m, k0, min(k0 + bs, k_), quant)
            tot = np.float32(0.0)
            for j in range(half):
                k = k0 + 2 * j
                x0 = np.float32(a[m, k]) if k < k_ else np.float32(0.0)
                x1 = np.float32(a[m, k + 1]) if k + 1 < k_ else np.float32(0.0)
                if quant:
                    x0 = np.float32(np.rint(x0 * inv))
                    x1 = np.float32(np.rint(x1 * inv))
                ae[m, blk, j] = x0
                ao[m, blk, j] = x1 - np.float32(16.0) * x0  # byte*x0 + hi*(x1 - 16 x0) = lo*x0 + hi*x1
                tot += x0 + x1
            asum[m, blk] = tot
            ascale[m, blk] = s


@njit(cache=True, nogil=True)
def prep_a8(a, nb, bs, quant, ap, asum, ascale):
    """A [M, K] padded per block: ap [M, nb, bs], block sums and scales [M, nb] (int8-quantized if ``quant``)."""
    m_, k_ = a.shape
    for m in range(m_):
        for blk in range(nb):
            k0 = blk * bs
            s, inv = _block_scale(a, m, k0, min(k0 + bs, k_), quant)
            tot = np.float32(0.0)
            for t in range(bs):
                k = k0 + t
                x = np.float32(a[m, k]) if k < k_ else np.float32(0.0)
                if quant:
                    x = np.float32(np.rint(x * inv))
                ap[m, blk, t] = x
                tot += x
            asum[m, blk] = tot
            ascale[m, blk] = s


@njit(cache=True, nogil=True)
def fake_quant_a(a, bs, out):
    """out = A [M, K] int8-quantized per block of ``bs`` along K and scaled back (onnxruntime's level-4 A)."""
    m_, k_ = a.shape
    for m in range(m_):
        for k0 in range(0, k_, bs):
            k1 = min(k0 + bs, k_)
            s, inv = _block_scale(a, m, k0, k1, True)
            for k in range(k0, k1):
                out[m, k] = np.float32(np.rint(np.float32(a[m, k]) * inv)) * s


@njit(cache=True, nogil=True, parallel=True, fastmath=FAST)
def rows_q4(b, ae, ao, asum, ascale, sc, zf, has_zp, zdef, out):
    """out[m, n] = sum_blk ascale*sc*(sum_j (lo*a_even + hi*a_odd) - z*asum): one streamed pass over B
    [N, nb, half]."""
    n_, nb, half = b.shape
    m_ = ae.shape[0]
    for n in prange(n_):
        for m in range(m_):
            tot = np.float32(0.0)
            for blk in range(nb):
                d = np.float32(0.0)
                for j in range(half):
                    # High nibble by float floor (exact for 0..255): Numba widens integer ops to
                    # int64, whose conversion to float does not vectorize on AVX2; floor does.  The
                    # low nibble is folded into ``ao`` (see prep_a4): 2 FMAs per byte.
                    f = np.float32(b[n, blk, j])
                    d += f * ae[m, blk, j] + np.floor(f * np.float32(0.0625)) * ao[m, blk, j]
                z = zf[n, blk] if has_zp else zdef
                tot += (ascale[m, blk] * sc[n, blk]) * (d - z * asum[m, blk])
            out[m, n] = tot


@njit(cache=True, nogil=True, parallel=True, fastmath=FAST)
def rows_q8(b, ap, asum, ascale, sc, zf, has_zp, zdef, out):
    """8-bit variant of ``rows_q4``: B [N, nb, bs], one code per byte."""
    n_, nb, bs = b.shape
    m_ = ap.shape[0]
    for n in prange(n_):
        for m in range(m_):
            tot = np.float32(0.0)
            for blk in range(nb):
                d = np.float32(0.0)
                for j in range(bs):
                    d += np.float32(b[n, blk, j]) * ap[m, blk, j]
                z = zf[n, blk] if has_zp else zdef
                tot += (ascale[m, blk] * sc[n, blk]) * (d - z * asum[m, blk])
            out[m, n] = tot


# -- the int8-activation path (4-bit codes at accuracy_level 4, blocks of 16k): see ``_simd`` -------

# 8-column groups per parallel task (64 columns): static scheduling gives each thread a contiguous run of tasks, so
# small tasks keep the threads' shares even (tasks of 32 groups split 112 groups 64 to 48 over two threads, 144
# groups 96 to 48: 8 rows of 24 weights of 896x1152 took 1.02 ms against 0.81 in tasks of 8).  A multiple of
# ``_simd.GROUPS`` and even (the 512-bit pass takes groups in pairs).
_GROUPS_PER_TASK = 8


def int4_path(bits, bs, quant, grp) -> bool:
    """Whether a MatMulNBits configuration runs on the int8-activation kernels (``_simd``)."""
    return bits == 4 and quant and bs % 16 == 0 and grp is None


@njit(cache=True, nogil=True)
def int4_layout(b3, sc, zf, has_zp):
    """B [N, nb, bs//2] codes, scales and float zero points [N, nb] -> the ``_simd`` layout: codes
    [G, nb, bs//8, 32] (8-column groups, column ``8g + i`` in bytes ``4i..4i+3`` of each vector, zero columns
    past N), scales and zero points [G, nb, 8] (a group's blocks in order)."""
    N, nb, blob = b3.shape
    nj = blob // 4
    G = (N + 7) // 8
    qi = np.zeros((G, nb, nj, 32), np.uint8)
    sct = np.zeros((G, nb, 8), np.float32)
    zft = np.zeros((G, nb, 8) if has_zp else (1, 1, 8), np.float32)
    for n in range(N):
        g, i = n // 8, n % 8
        for blk in range(nb):
            sct[g, blk, i] = sc[n, blk]
            if has_zp:
                zft[g, blk, i] = zf[n, blk]
            for j in range(nj):
                for t in range(4):
                    # codes k = 8j + t and 8j + 4 + t of the block: bytes 4j + t/2 and 4j + 2 + t/2 of B
                    k0, k1 = 8 * j + t, 8 * j + 4 + t
                    c0 = (b3[n, blk, k0 // 2] >> (4 * (k0 % 2))) & 15
                    c1 = (b3[n, blk, k1 // 2] >> (4 * (k1 % 2))) & 15
                    qi[g, blk, j, 4 * i + t] = c0 | (c1 << 4)
    return qi, sct, zft


@njit(cache=True, nogil=True)
def _absmax_probe(x):
    """(max |x|, probe) over a block of A; the probe is NaN when the block holds a NaN or an infinity.  Eight
    independent accumulators keep the loop free of a serial max chain."""
    n = x.shape[0]
    full = n - n % 8
    z = np.float32(0.0)
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = z
    p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = z
    for c in range(0, full, 8):
        v0, v1, v2, v3 = x[c], x[c + 1], x[c + 2], x[c + 3]
        v4, v5, v6, v7 = x[c + 4], x[c + 5], x[c + 6], x[c + 7]
        p0 += v0 * z
        p1 += v1 * z
        p2 += v2 * z
        p3 += v3 * z
        p4 += v4 * z
        p5 += v5 * z
        p6 += v6 * z
        p7 += v7 * z
        a0 = abs(v0)
        m0 = a0 if a0 > m0 else m0
        a1 = abs(v1)
        m1 = a1 if a1 > m1 else m1
        a2 = abs(v2)
        m2 = a2 if a2 > m2 else m2
        a3 = abs(v3)
        m3 = a3 if a3 > m3 else m3
        a4 = abs(v4)
        m4 = a4 if a4 > m4 else m4
        a5 = abs(v5)
        m5 = a5 if a5 > m5 else m5
        a6 = abs(v6)
        m6 = a6 if a6 > m6 else m6
        a7 = abs(v7)
        m7 = a7 if a7 > m7 else m7
    for k in range(full, n):
        p0 += x[k] * z
        a0 = abs(x[k])
        m0 = a0 if a0 > m0 else m0
    m = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    return m, ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))


@njit(cache=True, nogil=True)
def _quantize_block(x, q, inv):
    """q[k] = round-half-even(x[k] * inv) as int8 (|x * inv| <= 127); returns their sum.  Adding and
    subtracting 1.5 * 2**23 rounds a float32 below 2**22 in magnitude half to even exactly, as ``rint`` does,
    in a loop that vectorizes."""
    rnd = np.float32(12582912.0)
    tot = np.int32(0)
    for k in range(x.shape[0]):
        v = np.int32((np.float32(x[k]) * inv + rnd) - rnd)
        q[k] = np.int8(v)
        tot += v
    return tot


@njit(cache=True, nogil=True)
def _prep_a_i8(a, bs, aq, ascale, asum):
    """One row of A [K] quantized to int8 per block as onnxruntime's level 4 does (scale max|a|/127, round
    half to even; zeros past K) into ``aq`` [nb * bs], with ``ascale`` and ``asum`` (the integer block sums)
    [nb].  A block holding a NaN or an infinity gets codes 0 and scale NaN, so every output of the row is NaN
    (as on the float path)."""
    nb = ascale.shape[0]
    k_ = a.shape[0]
    for blk in range(nb):
        k0 = blk * bs
        x = a[k0:min(k0 + bs, k_)]
        q = aq[k0:k0 + bs]
        amax, probe = _absmax_probe(x)
        if probe != probe:
            q[:] = 0
            ascale[blk] = np.nan
            asum[blk] = 0.0
            continue
        inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
        tot = _quantize_block(x, q, inv)
        q[x.shape[0]:] = 0
        ascale[blk] = amax / np.float32(127.0)
        asum[blk] = np.float32(tot)


@njit(cache=True, nogil=True)
def zero_terms(asum, zdef, zt):
    """``zt = - zdef * asum`` as int32 (the blocks' integer activation sums times the default zero point): what
    the ``_simd`` kernels without zero points take in the sums' place."""
    z = np.int32(zdef)
    a = asum.reshape(-1)
    t = zt.reshape(-1)
    for i in range(a.shape[0]):
        t[i] = -z * np.int32(a[i])


@njit(cache=True, nogil=True)
def _q4i8_groups(qi, aq, ascale, asum, zt, zdef, zft, has_zp, sct, y, g0, g1):
    """Column groups [g0, g1) for one row (``aq`` 1-d) or ``_simd.ROWS`` rows (2-d; Numba keeps one branch):
    with zero points from the sums ``asum``, without from the zero terms ``zt``."""
    if aq.ndim == 1:
        if has_zp:
            _simd.dot_q4_zp(qi, aq, ascale, asum, zft, sct, y, g0, g1)
        else:
            _simd.dot_q4(qi, aq, ascale, zt, zdef, sct, y, g0, g1)
    elif has_zp:
        _simd.dot_q4_zp_rows(qi, aq, ascale, asum, zft, sct, y, g0, g1)
    else:
        _simd.dot_q4_rows(qi, aq, ascale, zt, zdef, sct, y, g0, g1)


@njit(cache=True, nogil=True, parallel=True)
def _q4i8_par(qi, aq, ascale, asum, zt, zdef, zft, has_zp, sct, y):
    G = qi.shape[0]
    for t in prange((G + _GROUPS_PER_TASK - 1) // _GROUPS_PER_TASK):
        g0 = t * _GROUPS_PER_TASK
        _q4i8_groups(qi, aq, ascale, asum, zt, zdef, zft, has_zp, sct, y, g0, min(g0 + _GROUPS_PER_TASK, G))


@njit(cache=True, nogil=True, parallel=True)
def _prep_rows_par(a2, r0, take, bs, aq, ascale, asum):
    """``_prep_a_i8`` of rows [r0, r0 + take) of A into rows [0, take), the rows over the threads."""
    for r in prange(take):
        _prep_a_i8(a2[r0 + r], bs, aq[r], ascale[r], asum[r])


@njit(cache=True, nogil=True, inline="always")  # a dispatch only: inlined, no compiled level of its own
def _q4i8_pass(qi, aq, ascale, asum, zt, zdef, zft, has_zp, sct, y, parallel):
    """One pass of ``_simd.ROWS`` rows over every column group, on the thread pool or on this thread."""
    if parallel:
        _q4i8_par(qi, aq, ascale, asum, zt, zdef, zft, has_zp, sct, y)
    else:
        _q4i8_groups(qi, aq, ascale, asum, zt, zdef, zft, has_zp, sct, y, np.int64(0), qi.shape[0])


@njit(cache=True, nogil=True, pipeline_class=GlueCompiler)
def gemv_q4i8(a2, qi, sct, zft, has_zp, zdef, bs, out, parallel):
    """out [M, N] = A [M, K] @ dequant(B)^T on the int8-activation kernels (``int4_layout`` arrays;
    ``parallel`` splits the columns over the thread pool): ``_simd.ROWS`` rows at a time through one pass
    over the codes, the rest row by row; each row's result is the same bits either way."""
    G, nb = qi.shape[0], qi.shape[1]
    N = out.shape[1]
    if qi.shape[2] * 8 != bs:
        raise ValueError("gemv_q4i8: the codes' layout does not match block_size")
    z = np.float32(zdef)
    R = _simd.ROWS
    M = a2.shape[0]
    done = 0
    if M >= PAD_ROWS_MIN:
        aqr = np.empty((R, nb * bs), np.int8)
        ascr = np.empty((R, nb), np.float32)
        asur = np.empty((R, nb), np.float32)
        ztr = np.empty((R, nb), np.int32)
        yr = np.empty((R, 8 * G), np.float32)
        while M - done >= PAD_ROWS_MIN:
            take = min(R, M - done)  # fewer than R rows: the last one repeated fills the pass
            if parallel and nb >= PREP_PARALLEL_BLOCKS:
                _prep_rows_par(a2, np.int64(done), take, bs, aqr, ascr, asur)
            else:
                for r in range(take):
                    _prep_a_i8(a2[done + r], bs, aqr[r], ascr[r], asur[r])
            for r in range(take, R):
                aqr[r] = aqr[take - 1]
                ascr[r] = ascr[take - 1]
                asur[r] = asur[take - 1]
            if not has_zp:
                zero_terms(asur, z, ztr)
            if take == R and N == 8 * G:  # a whole pass over whole groups: straight into the output rows
                _q4i8_pass(qi, aqr, ascr, asur, ztr, z, zft, has_zp, sct, out[done:done + R], parallel)
            else:
                _q4i8_pass(qi, aqr, ascr, asur, ztr, z, zft, has_zp, sct, yr, parallel)
                out[done:done + take, :N] = yr[:take, :N]
            done += take
    aq = np.empty(nb * bs, np.int8)
    ascale = np.empty(nb, np.float32)
    asum = np.empty(nb, np.float32)
    zt = np.empty(nb, np.int32)
    y = np.empty(8 * G, np.float32)
    for m in range(done, M):
        _prep_a_i8(a2[m], bs, aq, ascale, asum)
        if not has_zp:
            zero_terms(asum, z, zt)
        if parallel:
            _q4i8_par(qi, aq, ascale, asum, zt, z, zft, has_zp, sct, y)
        else:
            _q4i8_groups(qi, aq, ascale, asum, zt, z, zft, has_zp, sct, y, np.int64(0), G)
        for n in range(N):
            out[m, n] = y[n]


# -- onnxruntime's order on x86 hosts: MLAS's AVX2 int8 kernels, or its AVX-512 ones (blocks of 32) --------

ORDER_AVX2 = 1  # ``mlas_path``'s values: 0 the blockwise order, these two MLAS's
ORDER_AVX512 = 2


def mlas_avx2_host() -> bool:
    """Whether onnxruntime takes MLAS's AVX2 int8 kernels for level-4 int4 products on this host: x86 with AVX2 and
    without AVX-512 (with AVX-VNNI it takes their VNNI twins, which compute the same integers)."""
    return _simd.AVX2 and not _simd.AVX512F


def mlas_avx512_host() -> bool:
    """Whether onnxruntime takes MLAS's AVX-512 int8 kernels: x86 with AVX-512 F, DQ, BW and VL (its "AVX-512
    core"; with AVX512-VNNI the ``vpdpbusd`` twins, which compute the same integers; checked against onnxruntime on
    a VNNI host)."""
    return _simd.AVX512


MLAS_BLOCKS = (16, 32, 64, 128, 256)  # the block sizes of MLAS's int8 kernels (others: its float path)


def mlas_path(bs, bits=4, level4=True) -> int:
    """The order of a MatMulNBits product of block size ``bs`` with ``bits``-bit codes, at accuracy level 4
    (``level4``: A quantized to int8) or below (A float): 0, the blockwise order (faster at prefill, and equal to
    onnxruntime's up to float rounding), or under ``_common.mlas_order`` (the default on x86 hosts with AVX2)
    MLAS's order for this host, bit for bit onnxruntime's there.  Level 4: on ``mlas_avx512_host`` hosts
    ``ORDER_AVX512`` for 4- and 8-bit codes in every block size of ``MLAS_BLOCKS`` (``gemv_q4i8_mlas``,
    ``_MlasLanes``), on ``mlas_avx2_host`` hosts ``ORDER_AVX2`` for the same (``_simd._OrtEmitter`` for 4-bit codes
    in blocks of 32, ``_Avx2Lanes`` for the rest; checked under an emulated AVX2 CPU, ``tools/emulated_host.py``).
    Below level 4: the host's order (``gemv_fp_mlas``; ``fp_order_path``).  Any host runs either order: the
    kernels have a portable form.  MLAS's AVX2 order for 4-bit codes in blocks of 32 cost 1.0-1.4x the blockwise
    one per decode product and 2-3x per prefill product (measured in cache on an AVX2 host, before ``_gemv_ort32``
    quantized every row first and took all rows in one parallel pass; not measured again: no AVX2-only host
    here)."""
    if bits not in (4, 8) or not mlas_order():
        return 0
    if mlas_avx512_host():
        host = ORDER_AVX512
    elif mlas_avx2_host():
        host = ORDER_AVX2
    else:  # AVX-512 F without the rest of MLAS's "AVX-512 core": only the kernel checked on every x86 host so far
        return ORDER_AVX2 if level4 and bs == 32 and bits == 4 else 0
    if not level4:
        return host
    return host if bs in MLAS_BLOCKS else 0


ORT_RANGE_M = 128  # MLAS's rows per thread range: a range of one row takes its one-row kernel


@njit(cache=True, nogil=True, inline="always")
def lone_row(M, threads):
    """Whether onnxruntime on ``threads`` intra-op threads runs the last of M rows of a MatMulNBits product
    (``MlasQNBitGemmBatch``) alone, through MLAS's one-row kernels: M = 1, or with a thread pool (more than one
    thread) a last range of ``ORT_RANGE_M`` rows holding one row (M = 1 mod 128); one thread runs all M rows in one
    range."""
    return M == 1 or (threads > 1 and M % ORT_RANGE_M == 1)


@njit(cache=True, nogil=True)
def _prep_a_i8_groups(a, bs, aq, ascale, gsum, absum):
    """``_prep_a_i8`` as MLAS's ``QuantizeARow_CompInt8`` does it, with the sums of every 4 quantized values
    ``gsum`` [nb * bs // 4] (the zero points' share of the one-row kernel's lanes) and ``absum`` [nb], each
    block's ``f32(scale * sum)`` (its several-row kernel's block sums)."""
    nb = ascale.shape[0]
    _prep_a_i8(a, bs, aq, ascale, absum)
    for blk in range(nb):
        absum[blk] = ascale[blk] * absum[blk]
        for q in range(bs // 4):
            t = blk * bs + 4 * q
            gsum[blk * (bs // 4) + q] = np.float32(np.int32(aq[t]) + np.int32(aq[t + 1]) + np.int32(aq[t + 2])
                                                   + np.int32(aq[t + 3]))


@njit(cache=True, nogil=True)
def _ort_groups(signed, quads, qi, aq, ascale, gsum, zdef, zft, has_zp, sct, y, g0, g1, n4, absum, bias, has_bias):
    """Column groups [g0, g1): one row (``aq`` 1-d; ``signed`` codes minus zero points, MLAS's AVX2 one-row kernel,
    or unsigned codes) or ``_simd.ORT_ROWS`` rows (2-d, unsigned); ``quads``: one row in MLAS's AVX-512 lanes
    (unsigned), the zero points' share (from ``absum``) and the bias taken in the same pass."""
    if quads:
        _simd.dot_q4_ort_u4(qi, aq, ascale, absum, zdef, sct, y, g0, g1, n4, zft, has_zp, bias, has_bias)
    elif aq.ndim == 2:
        _simd.dot_q4_ort_u_rows(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
    elif not signed:
        _simd.dot_q4_ort_u(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
    elif has_zp:
        _simd.dot_q4_ort_s_zp(qi, aq, ascale, gsum, zft, sct, y, g0, g1, n4)
    else:
        _simd.dot_q4_ort_s(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)


_ZS_GROUPS = 32  # column groups of 8 whose zero-point chains ``ort_zero_point_rows`` runs side by side


@njit(cache=True, nogil=True)
def _zero_share_groups(absum, sct, zft, has_zp, zdef, out, nu, bias, has_bias, g0, g1, t, c):
    """``ort_zero_point_rows`` on the column groups [g0, g1) (``t`` [nb, 8 _ZS_GROUPS] and ``c`` scratch; every
    element of ``t`` read is written first)."""
    N = out.shape[1]
    M = out.shape[0]
    nb = sct.shape[1]
    for gb in range(g0, g1, _ZS_GROUPS):
        ge = min(gb + _ZS_GROUPS, g1)
        w = 8 * (ge - gb)
        for blk in range(nb):  # the factors f32(-scale * zero) of these groups, block-major
            for g in range(gb, ge):
                for i in range(8):
                    z = zft[g, blk, i] if has_zp else zdef
                    t[blk, 8 * (g - gb) + i] = -(sct[g, blk, i] * z)
        n0 = 8 * gb
        n1 = min(n0 + w, N)
        for r in range(M):
            if has_bias:
                for n in range(n0, n1):
                    out[r, n] += bias[n]
            if r >= nu:
                continue
            c[:] = 0
            for blk in range(nb):
                a = absum[r, blk]
                for j in range(w):  # independent chains, one per column
                    c[j] = _simd.fma32(a, t[blk, j], c[j])
            for n in range(n0, n1):
                out[r, n] = c[n - n0] + out[r, n]


_ZS_TASK_GROUPS = 2 * _ZS_GROUPS  # column groups per parallel task of ``ort_zero_point_rows``


@njit(cache=True, nogil=True, parallel=True)
def _zero_share_par(absum, sct, zft, has_zp, zdef, out, nu, bias, has_bias):
    G, nb = sct.shape[0], sct.shape[1]
    for k in prange((G + _ZS_TASK_GROUPS - 1) // _ZS_TASK_GROUPS):
        t = np.empty((nb, 8 * _ZS_GROUPS), np.float32)
        c = np.empty(8 * _ZS_GROUPS, np.float32)
        g0 = k * _ZS_TASK_GROUPS
        _zero_share_groups(absum, sct, zft, has_zp, zdef, out, nu, bias, has_bias, g0, min(g0 + _ZS_TASK_GROUPS, G),
                           t, c)


@njit(cache=True, nogil=True)
def ort_zero_point_rows(absum, sct, zft, has_zp, zdef, out, nu, bias, has_bias, parallel):
    """Every row of ``out`` [M, N]: the bias added (rounded), then for rows below ``nu``
    ``out[r, c] = f32(sum_blk absum[r, blk] * f32(-scale[c, blk] * zero[c, blk]) + out[r, c])``, the sum a chain of
    fused multiply-adds over the blocks from 0 (``absum`` [M, nb]): MLAS's several-row kernel takes the zero points
    out of its unsigned-code products this way, by a float GEMM over the block sums.  The columns of
    ``_ZS_GROUPS`` groups run side by side (independent chains, one vector pass per block), their factors computed
    once per call and shared by the rows; the columns' tasks in parallel."""
    G, nb = sct.shape[0], sct.shape[1]
    if parallel and G > _ZS_TASK_GROUPS:
        _zero_share_par(absum, sct, zft, has_zp, zdef, out, nu, bias, has_bias)
    else:
        _zero_share_groups(absum, sct, zft, has_zp, zdef, out, nu, bias, has_bias, np.int64(0), G,
                           np.empty((nb, 8 * _ZS_GROUPS), np.float32), np.empty(8 * _ZS_GROUPS, np.float32))


# -- MLAS's AVX-512 int8 kernels for the other block sizes, and for 8-bit codes (``ORDER_AVX512``) ------------
#
# Every block size runs one pattern (read from MLAS's ``sqnbitgemm_kernel_avx512_int8_blklen{16,32,64,128}.h`` and
# checked bit for bit against onnxruntime's MatMulNBits): per row and column 16 float lanes, each a chain of
# ``fma(exact integer lane sum, f32(ascale * scale), lane)``, one update per few blocks.  A lane sum adds whole
# quads (the 4 code-by-activation products of a ``vpdpbusd`` lane: codes k = 4q .. 4q + 3 of a block) and is exact
# in any order, so only which quads and which lane matter; the ``_MLAS_PLANS`` below list them per update, as
# (block of the update, quads of that block).  Blocks of 16 and 32 then add the lanes' two halves into 8 lanes
# (``l[i] + l[i + 8]``) and take their last blocks one at a time into those 8; the others keep 16 lanes to the end.


def _plan_b16():  # 8 blocks of 16 per update: lanes 4i .. 4i + 3 from blocks i and i + 4
    return [lane for i in range(4) for lane in ((i, (0, 2)), (i, (1, 3)), (i + 4, (0, 2)), (i + 4, (1, 3)))]


def _plan_b32():  # 4 blocks of 32: in the window of 32 quads, lane 4i the quads 4i and 4i + 2, ...
    def q(w):
        return w // 8, w % 8
    plan = []
    for i in range(4):
        for w in (4 * i, 4 * i + 1, 16 + 4 * i, 17 + 4 * i):
            (b, x), (_, y) = q(w), q(w + 2)
            plan.append((b, (x, y)))
    return plan


def _plan_b64():  # 2 blocks of 64: lanes alternate between the blocks
    return [lane for i in range(4) for lane in ((0, (4 * i, 4 * i + 2)), (1, (4 * i, 4 * i + 2)),
                                                (0, (4 * i + 1, 4 * i + 3)), (1, (4 * i + 1, 4 * i + 3)))]


_MLAS_PLANS = {
    16: (8, _plan_b16(), [(0, (i // 2,)) for i in range(8)]),  # the last blocks: lane i codes 2i and 2i + 1 (pairs)
    32: (4, _plan_b32(), [(0, (j,)) for j in range(8)]),
    64: (2, _plan_b64(), [(0, (i,)) for i in range(16)]),
    128: (1, [(0, (i, 16 + i)) for i in range(16)], None),  # per 128 codes of a block (blocks of 128 or 256)
}


class _MlasLanes(_simd._OrtEmitter):
    """MLAS's AVX-512 order for ``family`` (16, 32, 64, or 128 for blocks of 128 and more) over 8-column groups:
    ``int4_layout`` codes (``bits`` 4) or ``int8_layout`` codes (8).  Per row, 16 lanes of 8 columns
    (``lanes16``), then 8 (``lanes``) for families 16 and 32; the fold into the output as MLAS's:

    - families 16 and 32: the halves' sum ``l[i] + l[i + 8]``, then the blocks past a multiple of 8 (16) or 4 (32)
      one at a time into those 8 lanes (lane i: codes 2i, 2i + 1 for 16, the quad i for 32), then for the columns
      below N rounded down to 4 ``((l0+l1)+l2)+l3 + (((l4+l5)+l6)+l7)``, for the rest
      ``((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))``;
    - families 64 and 128: for the columns past N rounded down to 4, and below it when the argument ``c4`` is 0,
      the halving tree ``h = l[i] + l[i+8]``, ``q = h[i] + h[i+4]``, ``(q0+q2) + (q1+q3)``; else each 4 lanes
      ``((l[4j]+l[4j+1])+l[4j+2])+l[4j+3]`` as v0 .. v3, then ``(v0+v2) + (v1+v3)``.

    Codes are unsigned (the zero points come in after, through ``ort_zero_point_rows``), and a lane's integer sum
    is exact (``vpdpbusd``, the AVX2 pair sums for 4-bit codes, or the portable lane sums), so the host's form and
    the portable IR give the same bits."""

    def __init__(self, context, builder, sig, args, portable, vnni, rows, bits, family):
        super().__init__(context, builder, sig, args, False, portable, vnni, rows, False, True)
        self.bits, self.family = bits, family
        self.blen = builder.mul(self.nj, self.const(8 if bits == 4 else 4))  # codes per block
        self.pair_masks = [_simd._splat(_simd._V8I32, 0xFFFF), _simd._splat(_simd._V8I32, -65536)]

    def dot4(self, c, a, d):
        """<8 x i32>: ``d`` (None: 0) plus, per column lane, its 4 codes ``c`` dotted with the 4 activations ``a``
        (<32 x i8>)."""
        builder = self.builder
        if self.vnni:
            v8 = _simd._V8I32
            dp = _simd._fn(builder, "llvm.x86.avx512.vpdpbusd.256", v8, [v8, v8, v8])
            return builder.call(dp, [_simd._splat(v8, 0) if d is None else d, builder.bitcast(c, v8),
                                     builder.bitcast(a, v8)])
        if not self.portable:  # 4-bit codes only: a pair sum is at most 2 * 15 * 127
            mub = _simd._fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _simd._V16I16, [_simd._V32I8, _simd._V32I8])
            x = self.widen(builder.call(mub, [c, a]))
        else:
            p = builder.mul(builder.zext(c, _simd._V32I32), builder.sext(a, _simd._V32I32))
            parts = [_simd._shuffle(builder, p, p, [4 * i + t for i in range(8)]) for t in range(4)]
            x = builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))
        return x if d is None else builder.add(d, x)

    def quad(self, cache, g, blk, jb, w):
        """(codes, activation offset) of quad ``w`` (a Python int) of block ``blk`` from its code vector ``jb``."""
        builder, const = self.builder, self.const
        if self.bits == 4:  # vector j: quads 2j (low nibbles) and 2j + 1 (high)
            j = builder.add(jb, const(w // 2))
            key = (id(blk), w // 2)
            if key not in cache:
                first = builder.mul(builder.add(builder.mul(g, self.nb), blk), self.nj)  # the block's first vector
                cache[key] = self.codes(builder.add(first, j))
            c = cache[key][w % 2]
            k = builder.add(builder.mul(j, self.c8), const(4 * (w % 2)))
        else:  # vector j: quad j
            j = builder.add(jb, const(w))
            vec = builder.add(builder.mul(builder.add(builder.mul(g, self.nb), blk), self.nj), j)
            c = self.vload(self.qp, builder.mul(vec, const(32)), _simd._V32I8, 1)
            k = builder.mul(j, self.c4)
        return c, builder.add(builder.mul(blk, self.blen), k)

    def update(self, g, blks, jb, plan, wide, pairs=False):
        """One update: lane L of ``plan`` (block ``blks[b]``, quads) into ``lanes16`` (``wide``) or ``lanes``."""
        builder = self.builder
        cache, scales = {}, {}
        for L, (b, quads) in enumerate(plan):
            for r in range(self.rows):
                d = None
                for w in quads:
                    c, k = self.quad(cache, g, blks[b], jb, w)
                    a = self.splat4(self.aps[r], k)
                    if pairs:  # codes 2L, 2L + 1 of the block: the other two activations zeroed
                        v8 = _simd._V8I32
                        a = builder.bitcast(builder.and_(builder.bitcast(a, v8), self.pair_masks[L % 2]),
                                            _simd._V32I8)
                    d = self.dot4(c, a, d)
                if (b, r) not in scales:
                    scales[b, r] = self.scale(g, blks[b], r)[0]
                slot = (self.lanes16 if wide else self.lanes)[r][L]
                v = builder.sitofp(d, _simd._V8F)
                builder.store(builder.call(self.fma, [v, scales[b, r], builder.load(slot)]), slot)

    def run(self, gs):
        builder, const, nb = self.builder, self.const, self.nb
        g = gs[0]
        zero = _simd._splat(_simd._V8F, 0.0)
        for r in range(self.rows):
            for L in range(16):
                builder.store(zero, self.lanes16[r][L])
            for L in range(8):
                builder.store(zero, self.lanes[r][L])
        per, plan, last = _MLAS_PLANS[self.family]
        if self.family == 128:  # each block, 128 codes (one or two code vectors' worth of quads 0 .. 31) a time
            q32 = const(16 if self.bits == 4 else 32)  # code vectors per 128 codes
            with cgutils.for_range(builder, nb, intp=self.intp) as lb:
                with cgutils.for_range(builder, builder.udiv(self.nj, q32), intp=self.intp) as lu:
                    self.update(g, [lb.index], builder.mul(lu.index, q32), plan, True)
        else:
            full = builder.sdiv(nb, const(per))
            with cgutils.for_range(builder, full, intp=self.intp) as lm:
                b0 = builder.mul(lm.index, const(per))
                self.update(g, [builder.add(b0, const(i)) for i in range(per)], const(0), plan, True)
            wide = self.family == 64
            if not wide:
                for r in range(self.rows):
                    for L in range(8):
                        s = builder.fadd(builder.load(self.lanes16[r][L]), builder.load(self.lanes16[r][L + 8]))
                        builder.store(s, self.lanes[r][L])
            with cgutils.for_range_slice(builder, builder.mul(full, const(per)), nb, const(1),
                                         intp=self.intp) as (blk, _):
                self.update(g, [blk], const(0), last, wide, pairs=self.family == 16)
        self.fold(g)

    def fold(self, g):
        builder = self.builder
        n4, c4 = self.args[9], self.args[10]
        add = builder.fadd
        cols = builder.add(_simd._broadcast_i(builder, builder.trunc(builder.mul(g, self.c8), _simd._I32)),
                           ir.Constant(_simd._V8I32, list(range(8))))
        full = builder.icmp_signed("<", cols, _simd._broadcast_i(builder, builder.trunc(n4, _simd._I32)))
        fold512 = builder.icmp_signed("!=", c4, self.const(0))
        for r in range(self.rows):
            if self.family in (16, 32):
                x = [builder.load(self.lanes[r][L]) for L in range(8)]
                c4v = add(add(add(add(x[0], x[1]), x[2]), x[3]), add(add(add(x[4], x[5]), x[6]), x[7]))
                tail = add(add(add(x[0], x[4]), add(x[2], x[6])), add(add(x[1], x[5]), add(x[3], x[7])))
            else:
                x = [builder.load(self.lanes16[r][L]) for L in range(16)]
                v = [add(add(add(x[4 * j], x[4 * j + 1]), x[4 * j + 2]), x[4 * j + 3]) for j in range(4)]
                h = [add(x[i], x[i + 8]) for i in range(8)]
                q = [add(h[i], h[i + 4]) for i in range(4)]
                tail = add(add(q[0], q[2]), add(q[1], q[3]))
                c4v = builder.select(fold512, add(add(v[0], v[2]), add(v[1], v[3])), tail)
            optr = builder.bitcast(builder.gep(self.ops_[r], [builder.mul(g, self.c8)]), _simd._V8F.as_pointer())
            builder.store(builder.select(full, c4v, tail), optr, align=4)


def make_mlas_lanes(bits: int, family: int, rows: int, portable: bool = False):
    """The ``_MlasLanes`` kernel for ``bits``-bit codes of ``family`` over ``rows`` rows (1: ``aq`` 1-d, else 2-d
    with that many rows), in the host's instructions or the ``portable`` IR (the same bits; for tests).  Arguments
    ``(qi, aq, ascale, ascale, zero, sct, y, g0, g1, n4, c4)``: column groups [g0, g1) into ``y``; ``zero`` a
    float32 scalar (unused: codes are unsigned); ``n4`` N rounded down to 4; ``c4`` nonzero: MLAS's one-row fold
    for the columns below ``n4`` (families 64 and 128)."""
    vnni = _simd.VNNI and not portable
    portable = portable or not _simd.AVX2 or (bits == 8 and not vnni)  # AVX2 pair sums would saturate 8-bit codes

    def impl(typingctx, qi, aq, ascale, asum, zero, sct, out, g0, g1, n4, c4):
        if not (_simd._operands_fit(False, rows, qi, aq, ascale, asum, zero, sct, out)
                and all(isinstance(x, types.Integer) for x in (g0, g1, n4, c4))):
            return None
        sig = types.void(qi, aq, ascale, asum, zero, sct, out, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            _MlasLanes(context, builder, sig, args, portable, vnni, rows, bits, family).emit()
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = f"dot_mlas_b{family}_q{bits}{'_portable' if portable else ''}{'_vnni' if vnni else ''}_r{rows}"
    return intrinsic(impl)


_L4_16_1, _L4_16_R = make_mlas_lanes(4, 16, 1), make_mlas_lanes(4, 16, _simd.ORT_ROWS)
_L4_64_1, _L4_64_R = make_mlas_lanes(4, 64, 1), make_mlas_lanes(4, 64, _simd.ORT_ROWS)
_L4_128_1, _L4_128_R = make_mlas_lanes(4, 128, 1), make_mlas_lanes(4, 128, _simd.ORT_ROWS)
_L8_16_1, _L8_16_R = make_mlas_lanes(8, 16, 1), make_mlas_lanes(8, 16, _simd.ORT_ROWS)
_L8_32_1, _L8_32_R = make_mlas_lanes(8, 32, 1), make_mlas_lanes(8, 32, _simd.ORT_ROWS)
_L8_64_1, _L8_64_R = make_mlas_lanes(8, 64, 1), make_mlas_lanes(8, 64, _simd.ORT_ROWS)
_L8_128_1, _L8_128_R = make_mlas_lanes(8, 128, 1), make_mlas_lanes(8, 128, _simd.ORT_ROWS)


@njit(cache=True, nogil=True)
def int8_layout(b3, sc, zf, has_zp):
    """B [N, nb, bs] 8-bit codes, scales and float zero points [N, nb] -> ``int4_layout``'s form for one code per
    byte: codes [G, nb, bs//4, 32] (column ``8g + i`` in bytes ``4i..4i+3`` of each vector, codes k = 4j .. 4j + 3
    of the block in vector j; zero columns past N), scales and zero points [G, nb, 8]."""
    N, nb, bs = b3.shape
    G = (N + 7) // 8
    qi = np.zeros((G, nb, bs // 4, 32), np.uint8)
    sct = np.zeros((G, nb, 8), np.float32)
    zft = np.zeros((G, nb, 8) if has_zp else (1, 1, 8), np.float32)
    for n in range(N):
        g, i = n // 8, n % 8
        for blk in range(nb):
            sct[g, blk, i] = sc[n, blk]
            if has_zp:
                zft[g, blk, i] = zf[n, blk]
            for k in range(bs):
                qi[g, blk, k // 4, 4 * i + k % 4] = b3[n, blk, k]
    return qi, sct, zft


@njit(cache=True, nogil=True)
def _mlas_groups(bits, family, qi, aq, ascale, zdef, sct, y, g0, g1, n4, c4):
    """Column groups [g0, g1) of one row (``aq`` 1-d) or ``_simd.ORT_ROWS`` rows (2-d; Numba keeps one branch)
    through the ``_MlasLanes`` kernel of ``bits`` and ``family``."""
    if aq.ndim == 1:
        if bits == 4:
            if family == 16:
                _L4_16_1(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
            elif family == 64:
                _L4_64_1(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
            else:
                _L4_128_1(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
        elif family == 16:
            _L8_16_1(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
        elif family == 32:
            _L8_32_1(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
        elif family == 64:
            _L8_64_1(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
        else:
            _L8_128_1(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
    elif bits == 4:
        if family == 16:
            _L4_16_R(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
        elif family == 64:
            _L4_64_R(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
        else:
            _L4_128_R(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
    elif family == 16:
        _L8_16_R(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
    elif family == 32:
        _L8_32_R(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
    elif family == 64:
        _L8_64_R(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)
    else:
        _L8_128_R(qi, aq, ascale, ascale, zdef, sct, y, g0, g1, n4, c4)


@njit(cache=True, nogil=True, parallel=True)
def _mlas_par(bits, family, qi, aq, ascale, zdef, sct, y, n4, c4):
    G = qi.shape[0]
    for t in prange((G + _GROUPS_PER_TASK - 1) // _GROUPS_PER_TASK):
        g0 = t * _GROUPS_PER_TASK
        _mlas_groups(bits, family, qi, aq, ascale, zdef, sct, y, g0, min(g0 + _GROUPS_PER_TASK, G), n4, c4)


@njit(cache=True, nogil=True, inline="always")
def _mlas_pass(bits, family, qi, aq, ascale, zdef, sct, y, n4, c4, parallel):
    if parallel:
        _mlas_par(bits, family, qi, aq, ascale, zdef, sct, y, n4, c4)
    else:
        _mlas_groups(bits, family, qi, aq, ascale, zdef, sct, y, np.int64(0), qi.shape[0], n4, c4)


@njit(cache=True, nogil=True)
def _gemv_mlas512(a2, qi, sct, bits, bs, out, absum, parallel):
    """``gemv_q4i8_mlas``'s products in ``_MlasLanes``'s order (blocks of 16 to 256, 4- or 8-bit codes), before
    the bias and the zero points' share; ``absum`` [M, nb] receives each block's ``f32(scale * sum)`` of A."""
    G, nb = qi.shape[0], qi.shape[1]
    N = out.shape[1]
    n4 = N - N % 4
    M = a2.shape[0]
    family = bs if bs < 128 else 128
    # MLAS's two-row kernels take the rows in pairs; an odd last row goes through its one-row kernel, whose fold
    # differs (families 64 and 128; for 8-bit codes in blocks of 64 the two-row kernel folds as the one-row one)
    c2 = 1 if bits == 8 and bs == 64 else 0
    m2 = M - M % 2
    z = np.float32(1 << (bits - 1))
    R = _simd.ORT_ROWS
    asu = np.empty(nb, np.float32)
    done = 0
    if m2 >= PAD_ROWS_MIN:
        aqr = np.empty((R, nb * bs), np.int8)
        ascr = np.empty((R, nb), np.float32)
        yr = np.empty((R, 8 * G), np.float32)
        while m2 - done >= PAD_ROWS_MIN:
            take = min(R, m2 - done)
            for r in range(take):
                _prep_a_i8(a2[done + r], bs, aqr[r], ascr[r], asu)
                for blk in range(nb):
                    absum[done + r, blk] = ascr[r, blk] * asu[blk]
            for r in range(take, R):
                aqr[r] = aqr[take - 1]
                ascr[r] = ascr[take - 1]
            _mlas_pass(bits, family, qi, aqr, ascr, z, sct, yr, n4, c2, parallel)
            out[done:done + take, :N] = yr[:take, :N]
            done += take
    aq = np.empty(nb * bs, np.int8)
    ascale = np.empty(nb, np.float32)
    y = np.empty(8 * G, np.float32)
    for m in range(done, M):
        _prep_a_i8(a2[m], bs, aq, ascale, asu)
        for blk in range(nb):
            absum[m, blk] = ascale[blk] * asu[blk]
        _mlas_pass(bits, family, qi, aq, ascale, z, sct, y, n4, c2 if m < m2 else 1, parallel)
        for n in range(N):
            out[m, n] = y[n]


# -- MLAS's AVX2 int8 kernels for the other block sizes (``ORDER_AVX2``) -----------------------------------------
#
# Read from MLAS's ``sqnbitgemm_kernel_avx2_int8_blklen16.h``, ``_blklen32.h`` (8-bit codes), ``_blklen64.h``
# (blocks of 64, 128 and 256), ``sqnbitgemm_m1_sym_kernel_avx2_int8_blklen64.h`` and ``sqnbitgemm_kernel_avx2.cpp``
# (which kernel for which product), and checked bit for bit against onnxruntime's MatMulNBits under an emulated AVX2
# CPU (``tools/emulated_host.py``; also with a bias, and M = 129 and 257).  Per row and column 8 float lanes, each a
# chain of ``fma(exact integer lane sum, f32(ascale * scale), lane)``; a lane adds two quads (4 codes each), as
# listed per update in the plans below, (block of the update, quads of that block):
#
# - blocks of 16: 4 blocks per update (the ``vpmaddubsw`` + ``vphaddw`` interleave puts blocks 0, 2, 1, 3 in lane
#   pairs), the blocks past a multiple of 4 one at a time, lane i codes 2i and 2i + 1 (``vpmaddwd`` of one block);
# - 8-bit codes in blocks of 32: 2 blocks per update (``vphaddd`` of the two blocks' quad sums), a last odd block
#   alone, lane i its quad i;
# - blocks of 64 to 256: one update per 64 codes of a block (the block's scale each time), the same interleave
#   (4-bit codes: lanes 0 .. 7 the quads 0-1, 2-3, 8-9, 10-11, 4-5, 6-7, 12-13, 14-15; 8-bit: lane i quads i, i + 8).
#
# Then the fold of the blocks of 32 (``((l0+l1)+l2)+l3 + (((l4+l5)+l6)+l7)`` below N rounded down to 4, else
# ``((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))``), the bias, and for unsigned codes the zero points' share
# (``ort_zero_point_rows``), on every row: MLAS's several-row kernels serve M = 1 too, except with 4-bit codes in
# blocks of 64 or more, where its one-row kernel takes the same lanes over signed codes (code - zero point), no
# share after.

_AVX2_PLAN16 = [(0, (0, 1)), (0, (2, 3)), (2, (0, 1)), (2, (2, 3)), (1, (0, 1)), (1, (2, 3)), (3, (0, 1)), (3, (2, 3))]
_AVX2_LAST16 = [(0, (i // 2,)) for i in range(8)]  # with ``pairs``: lane i codes 2i and 2i + 1
# 8-bit codes in blocks of 32: 2 blocks per update (lanes 0, 1, 4, 5 the first), then the last block alone, lane i
# the quad i
_AVX2_PLAN32 = [(0, (0, 1)), (0, (2, 3)), (1, (0, 1)), (1, (2, 3)), (0, (4, 5)), (0, (6, 7)), (1, (4, 5)), (1, (6, 7))]
_AVX2_LAST32 = [(0, (i,)) for i in range(8)]
_AVX2_PLAN64 = {4: [(0, q) for q in ((0, 1), (2, 3), (8, 9), (10, 11), (4, 5), (6, 7), (12, 13), (14, 15))],
                8: [(0, (i, i + 8)) for i in range(8)]}


class _Avx2Lanes(_MlasLanes):
    """MLAS's AVX2 order (see above) for ``family`` 16 (blocks of 16), 32 (8-bit codes in blocks of 32) or 64
    (blocks of 64 and more) over 8-column groups of ``int4_layout`` (``bits`` 4) or ``int8_layout`` (8) codes: per
    row 8 lanes (``lanes``), folded as ``_OrtEmitter``'s.  ``signed``: MLAS's one-row kernel, each lane's integer sum
    taken with the codes minus the zero point (``zero`` the zero points [G, nb, 8] with ``has_zp``, else the scalar
    default), through the sums of every 4 activations (argument 3): ``sum (q - z) a = sum q a - z sum a``, exact
    in float32.  Unsigned codes otherwise (the zero points come in after, through ``ort_zero_point_rows``).  Every
    integer is exact, so the host's form and the portable IR give the same bits."""

    def __init__(self, context, builder, sig, args, portable, vnni, rows, bits, family, signed, has_zp):
        _simd._OrtEmitter.__init__(self, context, builder, sig, args, has_zp, portable, vnni, rows, signed)
        self.bits, self.family = bits, family
        self.blen = builder.mul(self.nj, self.const(8 if bits == 4 else 4))
        self.pair_masks = [_simd._splat(_simd._V8I32, 0xFFFF), _simd._splat(_simd._V8I32, -65536)]

    def update(self, g, blks, jb, plan, wide=False, pairs=False):
        """One update: lane L of ``plan`` (block ``blks[b]``, quads) into ``lanes``."""
        builder = self.builder
        cache, scales = {}, {}
        for L, (b, quads) in enumerate(plan):
            for r in range(self.rows):
                d, ks = None, []
                for w in quads:
                    c, k = self.quad(cache, g, blks[b], jb, w)
                    a = self.splat4(self.aps[r], k)
                    if pairs:  # codes 2L, 2L + 1 of the block: the other two activations zeroed
                        v8 = _simd._V8I32
                        a = builder.bitcast(builder.and_(builder.bitcast(a, v8), self.pair_masks[L % 2]),
                                            _simd._V32I8)
                    d = self.dot4(c, a, d)
                    ks.append(k)
                if (b, r) not in scales:
                    scales[b, r] = self.scale(g, blks[b], r)
                s, col = scales[b, r]
                v = builder.sitofp(d, _simd._V8F)
                if self.signed:
                    asum = None
                    for k in ks:
                        x = builder.load(builder.gep(self.ssps[r], [builder.udiv(k, self.c4)]))
                        asum = x if asum is None else builder.fadd(asum, x)
                    v = builder.fsub(v, builder.fmul(self.zero(col), _simd._broadcast(builder, asum)))
                slot = self.lanes[r][L]
                builder.store(builder.call(self.fma, [v, s, builder.load(slot)]), slot)

    def run(self, gs):
        builder, const, nb = self.builder, self.const, self.nb
        g = gs[0]
        for r in range(self.rows):
            for L in range(8):
                builder.store(_simd._splat(_simd._V8F, 0.0), self.lanes[r][L])
        if self.family in (16, 32):
            per, plan, last = (4, _AVX2_PLAN16, _AVX2_LAST16) if self.family == 16 else (2, _AVX2_PLAN32, _AVX2_LAST32)
            full = builder.sdiv(nb, const(per))
            with cgutils.for_range(builder, full, intp=self.intp) as lm:
                b0 = builder.mul(lm.index, const(per))
                self.update(g, [builder.add(b0, const(i)) for i in range(per)], const(0), plan)
            with cgutils.for_range_slice(builder, builder.mul(full, const(per)), nb, const(1),
                                         intp=self.intp) as (blk, _):
                self.update(g, [blk], const(0), last, pairs=self.family == 16)
        else:  # 64 codes a time: 8 code vectors of 4-bit codes, 16 of 8-bit ones
            per = const(8 if self.bits == 4 else 16)
            with cgutils.for_range(builder, nb, intp=self.intp) as lb:
                with cgutils.for_range(builder, builder.udiv(self.nj, per), intp=self.intp) as lu:
                    self.update(g, [lb.index], builder.mul(lu.index, per), _AVX2_PLAN64[self.bits])
        self.fold(g)

    def fold(self, g):
        builder = self.builder
        add = builder.fadd
        cols = builder.add(_simd._broadcast_i(builder, builder.trunc(builder.mul(g, self.c8), _simd._I32)),
                           ir.Constant(_simd._V8I32, list(range(8))))
        full = builder.icmp_signed("<", cols, _simd._broadcast_i(builder, builder.trunc(self.args[9], _simd._I32)))
        for r in range(self.rows):
            x = [builder.load(self.lanes[r][L]) for L in range(8)]
            c4v = add(add(add(add(x[0], x[1]), x[2]), x[3]), add(add(add(x[4], x[5]), x[6]), x[7]))
            tail = add(add(add(x[0], x[4]), add(x[2], x[6])), add(add(x[1], x[5]), add(x[3], x[7])))
            optr = builder.bitcast(builder.gep(self.ops_[r], [builder.mul(g, self.c8)]), _simd._V8F.as_pointer())
            builder.store(builder.select(full, c4v, tail), optr, align=4)


def make_avx2_lanes(bits: int, family: int, rows: int, signed: bool = False, has_zp: bool = False,
                    portable: bool = False):
    """The ``_Avx2Lanes`` kernel for ``bits``-bit codes of ``family`` over ``rows`` rows (1: ``aq`` 1-d, else 2-d),
    unsigned or ``signed`` (one row; ``has_zp``: zero points [G, nb, 8], else the scalar default), in the host's
    instructions or the ``portable`` IR (the same bits).  Arguments ``(qi, aq, ascale, gsum, zero, sct, y, g0, g1,
    n4)``: column groups [g0, g1) into ``y``; ``gsum`` the sums of every 4 activations (read when ``signed``);
    ``n4`` N rounded down to 4."""
    vnni = _simd.VNNI and not portable
    portable = portable or not _simd.AVX2 or (bits == 8 and not vnni)

    def impl(typingctx, qi, aq, ascale, gsum, zero, sct, out, g0, g1, n4):
        if not (_simd._operands_fit(has_zp, rows, qi, aq, ascale, gsum, zero, sct, out)
                and all(isinstance(x, types.Integer) for x in (g0, g1, n4))):
            return None
        sig = types.void(qi, aq, ascale, gsum, zero, sct, out, types.intp, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            _Avx2Lanes(context, builder, sig, args, portable, vnni, rows, bits, family, signed, has_zp).emit()
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = (f"dot_avx2_b{family}_q{bits}{'_s' if signed else '_u'}{'_zp' if has_zp else ''}"
                     f"{'_portable' if portable else ''}{'_vnni' if vnni else ''}_r{rows}")
    return intrinsic(impl)


# Rows per unsigned pass (MLAS's kernels take rows in pairs too).  Four rows ran 32 rows of 2048x1024 products
# 1.2-1.4x faster than two on this host, but took 12 s more to compile per target (the passes' kernels inlined into
# the parallel loop): two keep tests/test_emulated_host.py's cold run near 40 s.
_AVX2_ROWS = 2
_A4_16_1, _A4_16_R = make_avx2_lanes(4, 16, 1), make_avx2_lanes(4, 16, _AVX2_ROWS)
_A4_64_1, _A4_64_R = make_avx2_lanes(4, 64, 1), make_avx2_lanes(4, 64, _AVX2_ROWS)
_A4_64_S, _A4_64_SZ = make_avx2_lanes(4, 64, 1, True), make_avx2_lanes(4, 64, 1, True, True)
_A8_16_1, _A8_16_R = make_avx2_lanes(8, 16, 1), make_avx2_lanes(8, 16, _AVX2_ROWS)
_A8_32_1, _A8_32_R = make_avx2_lanes(8, 32, 1), make_avx2_lanes(8, 32, _AVX2_ROWS)
_A8_64_1, _A8_64_R = make_avx2_lanes(8, 64, 1), make_avx2_lanes(8, 64, _AVX2_ROWS)


@njit(cache=True, nogil=True)
def _avx2_unsigned(bits, family, qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4):
    """One row (``aq`` 1-d) or ``_AVX2_ROWS`` rows (2-d; Numba keeps one branch) through the unsigned
    ``_Avx2Lanes`` kernel of ``bits`` and ``family``."""
    if aq.ndim == 1:
        if bits == 4:
            if family == 16:
                _A4_16_1(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
            else:
                _A4_64_1(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
        elif family == 16:
            _A8_16_1(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
        elif family == 32:
            _A8_32_1(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
        else:
            _A8_64_1(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
    elif bits == 4:
        if family == 16:
            _A4_16_R(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
        else:
            _A4_64_R(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
    elif family == 16:
        _A8_16_R(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
    elif family == 32:
        _A8_32_R(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
    else:
        _A8_64_R(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)


@njit(cache=True, nogil=True)
def _avx2_rows(bits, family, qi, aq, ascale, gsum, zdef, zft, has_zp, sct, y, nu, g0, g1, n4):
    """Every row of ``aq`` [M, K] over the column groups [g0, g1) in ``_Avx2Lanes``'s order: rows below ``nu``
    unsigned, in passes of ``_AVX2_ROWS`` rows, then one at a time; the rows from ``nu`` signed (MLAS's one-row
    kernel).  A row's bits do not depend on the rows it shares a pass with."""
    M = aq.shape[0]
    R = _AVX2_ROWS
    mr = nu - nu % R
    for r0 in range(0, mr, R):
        _avx2_unsigned(bits, family, qi, aq[r0:r0 + R], ascale[r0:r0 + R], gsum[r0:r0 + R], zdef, sct,
                       y[r0:r0 + R], g0, g1, n4)
    for r in range(mr, nu):
        _avx2_unsigned(bits, family, qi, aq[r], ascale[r], gsum[r], zdef, sct, y[r], g0, g1, n4)
    for r in range(nu, M):
        if has_zp:
            _A4_64_SZ(qi, aq[r], ascale[r], gsum[r], zft, sct, y[r], g0, g1, n4)
        else:
            _A4_64_S(qi, aq[r], ascale[r], gsum[r], zdef, sct, y[r], g0, g1, n4)


@njit(cache=True, nogil=True, parallel=True)
def _avx2_rows_par(bits, family, qi, aq, ascale, gsum, zdef, zft, has_zp, sct, y, nu, n4):
    G = qi.shape[0]
    for t in prange((G + _GROUPS_PER_TASK - 1) // _GROUPS_PER_TASK):
        g0 = t * _GROUPS_PER_TASK
        _avx2_rows(bits, family, qi, aq, ascale, gsum, zdef, zft, has_zp, sct, y, nu, g0,
                   min(g0 + _GROUPS_PER_TASK, G), n4)


@njit(cache=True, nogil=True)
def _gemv_avx2(a2, qi, sct, zft, has_zp, z, bits, bs, out, parallel, bias, has_bias, threads):
    """``gemv_q4i8_mlas`` in ``_Avx2Lanes``'s order (4-bit codes in blocks of 16, 64, 128 or 256, 8-bit codes in
    blocks of 16 to 256): every row
    quantized first (``_prep_a_i8_groups``), one pass over the column groups for all rows, then the bias and the
    zero points' share of the unsigned rows (``ort_zero_point_rows``)."""
    G, nb = qi.shape[0], qi.shape[1]
    N = out.shape[1]
    n4 = N - N % 4
    M = a2.shape[0]
    family = bs if bs < 64 else 64
    # MLAS's one-row kernel (signed codes) serves a row alone in its range (``lone_row``) with 4-bit codes (blocks
    # of 64 and more here); the several-row kernels take every other row (M = 129 and 257 checked under emulation,
    # onnxruntime on one thread and on two)
    nu = M - 1 if bits == 4 and bs >= 32 and lone_row(M, threads) else M
    aq = np.empty((M, nb * bs), np.int8)
    ascale = np.empty((M, nb), np.float32)
    gsum = np.empty((M, nb * bs // 4), np.float32)
    absum = np.empty((M, nb), np.float32)
    if parallel and M > 1:
        _prep_groups_par(a2, bs, aq, ascale, gsum, absum)
    else:
        for r in range(M):
            _prep_a_i8_groups(a2[r], bs, aq[r], ascale[r], gsum[r], absum[r])
    y = out if N == 8 * G else np.empty((M, 8 * G), np.float32)
    if parallel:
        _avx2_rows_par(bits, family, qi, aq, ascale, gsum, z, zft, has_zp, sct, y, nu, n4)
    else:
        _avx2_rows(bits, family, qi, aq, ascale, gsum, z, zft, has_zp, sct, y, nu, np.int64(0), G, n4)
    if N != 8 * G:
        out[:, :] = y[:, :N]
    ort_zero_point_rows(absum, sct, zft, has_zp, z, out, nu, bias, has_bias, parallel)


@njit(cache=True, nogil=True)
def _ort_rows(quads, qi, aq, ascale, gsum, zdef, zft, has_zp, sct, y, nu, g0, g1, n4, absum, bias, has_bias):
    """Every row of ``aq`` [M, K] over the column groups [g0, g1): rows below ``nu`` with unsigned codes, passes
    of ``_simd.ORT4_ROWS`` (``quads``) or ``_simd.ORT_ROWS`` rows, then one at a time; the rows from ``nu`` with
    signed codes (a row's bits do not depend on the rows it shares a pass with).  With ``quads`` the rows past the
    passes take the zero points' share and the bias in the same pass (the others take them after, ``_gemv_ort32``)."""
    M = aq.shape[0]
    R = _simd.ORT4_ROWS if quads else _simd.ORT_ROWS
    mr = nu - nu % R
    for r0 in range(0, mr, R):
        if quads:
            _simd.dot_q4_ort_u4_rows(qi, aq[r0:r0 + R], ascale[r0:r0 + R], gsum[r0:r0 + R], zdef, sct,
                                     y[r0:r0 + R], g0, g1, n4)
        else:
            _simd.dot_q4_ort_u_rows(qi, aq[r0:r0 + R], ascale[r0:r0 + R], gsum[r0:r0 + R], zdef, sct,
                                    y[r0:r0 + R], g0, g1, n4)
    for r in range(mr, M):
        _ort_groups(r >= nu, quads, qi, aq[r], ascale[r], gsum[r], zdef, zft, has_zp, sct, y[r], g0, g1, n4,
                    absum[r], bias, has_bias)


@njit(cache=True, nogil=True, parallel=True)
def _ort_rows_par(quads, qi, aq, ascale, gsum, zdef, zft, has_zp, sct, y, nu, n4, absum, bias, has_bias):
    G = qi.shape[0]
    for t in prange((G + _GROUPS_PER_TASK - 1) // _GROUPS_PER_TASK):
        g0 = t * _GROUPS_PER_TASK
        _ort_rows(quads, qi, aq, ascale, gsum, zdef, zft, has_zp, sct, y, nu, g0, min(g0 + _GROUPS_PER_TASK, G), n4,
                  absum, bias, has_bias)


@njit(cache=True, nogil=True, parallel=True)
def _prep_groups_par(a2, bs, aq, ascale, gsum, absum):
    for r in prange(a2.shape[0]):
        _prep_a_i8_groups(a2[r], bs, aq[r], ascale[r], gsum[r], absum[r])


@njit(cache=True, nogil=True)
def _gemv_ort32(a2, qi, sct, zft, has_zp, z, bs, out, parallel, quads, bias, has_bias, threads):
    """``gemv_q4i8_mlas`` for 4-bit codes in blocks of 32: MLAS's AVX2 order, then the bias and the zero points'
    share (``ort_zero_point_rows``), or with ``quads`` its AVX-512 one, a row outside the several-row passes taking
    the share and the bias in its own pass (``_simd.dot_q4_ort_u4``).  Every row is quantized first, then one
    parallel pass over the column groups takes all rows (a task's codes stay in cache across its rows)."""
    G, nb = qi.shape[0], qi.shape[1]
    N = out.shape[1]
    n4 = N - N % 4
    M = a2.shape[0]
    nu = M - 1 if not quads and lone_row(M, threads) else M  # rows with unsigned codes; the last one, if any, signed
    aq = np.empty((M, nb * bs), np.int8)
    ascale = np.empty((M, nb), np.float32)
    gsum = np.empty((M, nb * bs // 4), np.float32)
    absum = np.empty((M, nb), np.float32)
    if parallel and M > 1:
        _prep_groups_par(a2, bs, aq, ascale, gsum, absum)
    else:
        for r in range(M):
            _prep_a_i8_groups(a2[r], bs, aq[r], ascale[r], gsum[r], absum[r])
    y = out if N == 8 * G else np.empty((M, 8 * G), np.float32)
    bias8 = bias
    if quads and has_bias and N != 8 * G:  # the pass reads the bias of whole column groups
        bias8 = np.zeros(8 * G, np.float32)
        bias8[:N] = bias[:N]
    if parallel:
        _ort_rows_par(quads, qi, aq, ascale, gsum, z, zft, has_zp, sct, y, nu, n4, absum, bias8, has_bias)
    else:
        _ort_rows(quads, qi, aq, ascale, gsum, z, zft, has_zp, sct, y, nu, np.int64(0), G, n4, absum, bias8,
                  has_bias)  # np.int64(0), not a literal: the parallel tasks' compile serves it
    if N != 8 * G:
        out[:, :] = y[:, :N]
    if not quads:
        ort_zero_point_rows(absum, sct, zft, has_zp, z, out, nu, bias, has_bias, parallel)
    else:
        mr = nu - nu % _simd.ORT4_ROWS  # the rows of several-row passes; the rest took the share in their pass
        if mr:
            ort_zero_point_rows(absum[:mr], sct, zft, has_zp, z, out[:mr], mr, bias, has_bias, parallel)


@njit(cache=True, nogil=True)
def gemv_q4i8_mlas(a2, qi, sct, zft, has_zp, zdef, bs, out, parallel, bias, has_bias, order, threads):
    """``gemv_q4i8`` (with the bias added) in MLAS's AVX2 order for blocks of 32, bit for bit onnxruntime's
    level-4 product on such hosts:

    - A quantized per block as ``QuantizeARow_CompInt8`` (``_prep_a_i8_groups``);
    - per row and column, eight float lanes, each a chain of ``fma(exact integer lane sum, f32(ascale * scale),
      lane)`` over the blocks (``_simd._OrtEmitter``); lanes folded ``((l0+l1)+l2)+l3 + (((l4+l5)+l6)+l7)``
      for the columns below N rounded down to 4, ``((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`` for the rest; then
      the bias added;
    - a row alone in its range (``lone_row``: M = 1, or M = 1 mod ``ORT_RANGE_M`` when onnxruntime's ``threads``
      intra-op threads are more than one) uses signed codes (code - zero point) and pairs of blocks per update
      without zero points, one block per update with them; every other row uses unsigned codes and pairs of
      blocks, then ``ort_zero_point_rows``.

    Other block sizes of ``MLAS_BLOCKS``, and 8-bit codes, in ``ORDER_AVX2``: ``_gemv_avx2`` (``_Avx2Lanes``).

    ``order`` ``ORDER_AVX512``: MLAS's AVX-512 kernels instead.  Every row uses unsigned codes; per row and column
    16 float lanes take 4 blocks per update (``_simd._OrtEmitter.quad``), the two halves are added lane by lane
    (``l[j] + l[j + 8]``), the blocks past a multiple of 4 update those 8 lanes one block at a time (lane j the
    block's products 4j..4j+3), then the folds, the bias and ``ort_zero_point_rows`` as above.  Other block sizes
    of ``MLAS_BLOCKS``, and 8-bit codes (``int8_layout``: ``qi.shape[2] * 4 == bs``; zero point 128 by default),
    take ``ORDER_AVX512`` only, through ``_MlasLanes``: the same A, its lanes, then the bias and
    ``ort_zero_point_rows`` on every row."""
    nb = qi.shape[1]
    bits = 4 if qi.shape[2] * 8 == bs else 8 if qi.shape[2] * 4 == bs else 0
    if bits == 0 or not (bs == 16 or bs == 32 or bs == 64 or bs == 128 or bs == 256):
        raise ValueError("gemv_q4i8_mlas: the codes' layout does not match block_size, or no MLAS kernel for it")
    z = np.float32(zdef)
    M = a2.shape[0]
    if (_ONLY_AVX2 and order == ORDER_AVX512) or (_ONLY_AVX512 and order != ORDER_AVX512):
        raise ValueError("gemv_q4i8_mlas: this twin compiles the other host's kernels only")
    if _ONLY32:  # ``gemv_q4i8_mlas32``: 4-bit codes in blocks of 32 only
        if bits != 4 or bs != 32:
            raise ValueError("gemv_q4i8_mlas32: 4-bit codes in blocks of 32 only")
        _gemv_ort32(a2, qi, sct, zft, has_zp, z, bs, out, parallel, order == ORDER_AVX512, bias, has_bias, threads)
    elif bits == 4 and bs == 32:
        _gemv_ort32(a2, qi, sct, zft, has_zp, z, bs, out, parallel, order == ORDER_AVX512, bias, has_bias, threads)
    elif _ONLY_AVX2:
        _gemv_avx2(a2, qi, sct, zft, has_zp, z, bits, bs, out, parallel, bias, has_bias, threads)
    elif _ONLY_AVX512:
        absum = np.empty((max(M, 1), nb), np.float32)
        _gemv_mlas512(a2, qi, sct, bits, bs, out, absum, parallel)
        ort_zero_point_rows(absum, sct, zft, has_zp, z, out, M, bias, has_bias, parallel)
    elif order != ORDER_AVX512:
        _gemv_avx2(a2, qi, sct, zft, has_zp, z, bits, bs, out, parallel, bias, has_bias, threads)
    else:
        absum = np.empty((max(M, 1), nb), np.float32)
        _gemv_mlas512(a2, qi, sct, bits, bs, out, absum, parallel)
        ort_zero_point_rows(absum, sct, zft, has_zp, z, out, M, bias, has_bias, parallel)


# ``gemv_q4i8_mlas``'s compile-time constants (``_common.constant_twin``), each twin compiling a part of its kernels
_ONLY32 = False
_ONLY_AVX2 = False
_ONLY_AVX512 = False
# The twin for 4-bit codes in blocks of 32 (what the model builder writes), compiling none of the other block sizes'
# lane kernels (about a third of the general one's compile time).
gemv_q4i8_mlas32 = constant_twin(gemv_q4i8_mlas, "32", _ONLY32=True)
# The twins for the other products of one host's order: a node compiles the lane kernels of its host's order only
# (the general one, both).
gemv_q4i8_mlas_avx2 = constant_twin(gemv_q4i8_mlas, "avx2", _ONLY_AVX2=True)
gemv_q4i8_mlas512 = constant_twin(gemv_q4i8_mlas, "512", _ONLY_AVX512=True)


def mlas_gemv(bits, bs, order=ORDER_AVX512):
    """The MLAS-order product for codes of ``bits`` in blocks of ``bs`` in ``order``: ``gemv_q4i8_mlas32``, or the
    twin of the host's order."""
    if bits == 4 and bs == 32:
        return gemv_q4i8_mlas32
    return gemv_q4i8_mlas_avx2 if order == ORDER_AVX2 else gemv_q4i8_mlas512


# -- onnxruntime's float path (accuracy levels 0 to 3, float32 A) on AVX-512 and AVX2 hosts ------------------
#
# onnxruntime keeps A float and dequantizes B, ``w = f32((code - zero) * scale)`` (exact integer difference, one
# rounding), then (``matmul_nbits.cc``, ``qnbitgemm.cpp``, ``sgemm.cpp``, read and checked bit for bit):
#
# - 4-bit codes in blocks of ``MLAS_BLOCKS`` (MLAS's ``SQNBIT_CompFp32``): M = 1 through MLAS's one-row kernel,
#   per column 16 lanes, lane i the chain ``fma(w[k], a[k], lane)`` over k = i (mod 16), folded as
#   ``_MlasLanes``'s one-row fold (``FoldAccumulators`` below N rounded down to 4, the halving tree past it), then
#   the bias (on AVX2 hosts its AVX2 one-row kernel instead: 8 lanes, ``_fp_lanes``' path 3); several rows through
#   the float GEMM kernel: one chain ``fma(a[k], w[k], acc)`` over all of K, then
#   the bias.  (onnxruntime with a thread pool splits M into ranges of ``ORT_RANGE_M`` rows, and a last range of
#   one row takes the one-row kernel: for M = 1 (mod 128), M > 1, its result depends on whether it has a pool;
#   ``lone_row``);
# - otherwise (8-bit codes, other blocks) the dequantized B through MLAS's SGEMM: M = 1 by its AVX one-row kernel
#   (per column 8 lanes, lane i adding the rounded products ``a[k] * w[k]`` for k = i (mod 8), no fused
#   multiply-add; the columns by 4 folded as ``((l0+l1)+l2)+l3 + (((l4+l5)+l6)+l7)``, a last pair
#   ``((l0+l2)+(l4+l6)) + ((l1+l3)+(l5+l7))``, a last one ``((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))``; then the
#   bias, or +0), several rows by its packed kernel: slices of K (``_mlas_sgemm.k_stride`` of the range's
#   columns), in each one chain ``fma(a[k], w[k], acc)`` from 0, added to C in turn (C starting at the bias, or
#   at the first slice's sum).  onnxruntime on several threads splits N or M (``_mlas_sgemm.batch_split``), and
#   with N the slices: its result depends on its thread count there, which ``gemv_fp_mlas`` takes.
#
# Every path takes onnxruntime's intra-op thread count (``_mlas_attention.ort_threads``, by default its own default:
# the host's physical cores), never the threads this runtime runs on.
#
# On AVX2 hosts (``ORDER_AVX2``) every path but the 4-bit one-row kernel gives the AVX-512 hosts' bits (MLAS's FMA3
# SGEMM kernels chain the same fused multiply-adds per element, its one-row SGEMM kernel is the same AVX one), as
# does the dequantized path of float zero points and g_idx: checked under an emulated AVX2 CPU.

FP_COLS = 512  # columns per parallel task of the float path (per k, a row of that many codes)


def fp_order_path(bits, bs, order=ORDER_AVX512) -> int:
    """Which float order onnxruntime takes on a host of ``order``: 1 MLAS's ``SQNBIT_CompFp32`` (4-bit codes, blocks
    of ``MLAS_BLOCKS``), its AVX-512 one-row kernel; 3 the same with its AVX2 one-row kernel
    (``ORDER_AVX2``); 2 the dequantized B through its SGEMM."""
    if bits == 4 and bs in MLAS_BLOCKS:
        return 3 if order == ORDER_AVX2 else 1
    return 2


@njit(cache=True, nogil=True)
def fp_layout(b3, bits, sc, zf, has_zp, zdef):
    """B [N, nb, blob] -> its codes transposed, one per byte, ct [nb * bs, N] (k-major: a k's columns contiguous),
    with scales and zero points (``zdef`` without) as float32 [nb, N]."""
    N, nb, blob = b3.shape
    bs = blob * 8 // bits
    ct = np.empty((nb * bs, N), np.uint8)
    st = np.empty((nb, N), np.float32)
    zt = np.empty((nb, N), np.float32)
    for n in range(N):
        for blk in range(nb):
            st[blk, n] = sc[n, blk]
            zt[blk, n] = zf[n, blk] if has_zp else zdef
            for j in range(blob):
                byte = b3[n, blk, j]
                if bits == 4:
                    ct[blk * bs + 2 * j, n] = byte & 15
                    ct[blk * bs + 2 * j + 1, n] = byte >> 4
                else:
                    ct[blk * bs + j, n] = byte
    return ct, st, zt


@njit(cache=True, nogil=True)
def _fp_lanes(a, ct, st, zt, bs, path, bias, has_bias, N, acc, y, n0, n1):
    """One row ``a`` [K] against columns [n0, n1): MLAS's one-row lanes of ``path`` (1: 16 lanes of fused
    multiply-adds, the AVX-512 4-bit kernel; 3: 8 such lanes, the AVX2 one; 2: 8 lanes of rounded products added,
    the SGEMM one), folded into y.  The loops run along a row of codes (the columns), on 1-d views: they
    vectorize.

    Path 3 is ``SQ4BitGemmM1Kernel_CompFp32_avx2`` (``sqnbitgemm_kernel_avx2.cpp``): lane i the chain
    ``fma(w[k], a[k], lane)`` over k = i (mod 8); the columns below N rounded down to 4 folded as
    ``FoldAccumulators`` (``((l0+l1)+l2)+l3 + (((l4+l5)+l6)+l7)``) plus the bias if any, the others as
    ``((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7))`` plus the bias, or +0."""
    K = a.shape[0]
    W = n1 - n0
    fused = path != 2
    L = 16 if path == 1 else 8
    acc[:L, :W] = 0
    for blk in range((K + bs - 1) // bs):
        zrow = zt[blk, n0:n1]
        srow = st[blk, n0:n1]
        for k in range(blk * bs, min(K, blk * bs + bs)):
            crow = ct[k, n0:n1]
            lane = acc[k % L, :W]
            ak = np.float32(a[k])
            if fused:
                for c in range(W):
                    lane[c] = _simd.fma32((np.float32(crow[c]) - zrow[c]) * srow[c], ak, lane[c])
            else:
                for c in range(W):
                    lane[c] = lane[c] + ((np.float32(crow[c]) - zrow[c]) * srow[c]) * ak
    n4 = N - N % 4
    for c in range(W):
        n = n0 + c
        x0, x1, x2, x3 = acc[0, c], acc[1, c], acc[2, c], acc[3, c]
        x4, x5, x6, x7 = acc[4, c], acc[5, c], acc[6, c], acc[7, c]
        if path == 3:
            if n < n4:
                s = (((x0 + x1) + x2) + x3) + (((x4 + x5) + x6) + x7)
            else:
                s = ((x0 + x4) + (x1 + x5)) + ((x2 + x6) + (x3 + x7))
                if not has_bias:
                    s = s + np.float32(0.0)
        elif fused:
            x8, x9, x10, x11 = acc[8, c], acc[9, c], acc[10, c], acc[11, c]
            x12, x13, x14, x15 = acc[12, c], acc[13, c], acc[14, c], acc[15, c]
            if n < n4:
                s = ((((x0 + x1) + x2) + x3) + (((x8 + x9) + x10) + x11)) + \
                    ((((x4 + x5) + x6) + x7) + (((x12 + x13) + x14) + x15))
            else:
                h0, h1, h2, h3 = x0 + x8, x1 + x9, x2 + x10, x3 + x11
                h4, h5, h6, h7 = x4 + x12, x5 + x13, x6 + x14, x7 + x15
                s = ((h0 + h4) + (h2 + h6)) + ((h1 + h5) + (h3 + h7))
        else:
            s = m1t_fold(x0, x1, x2, x3, x4, x5, x6, x7, n, N)
        if has_bias:
            s = s + bias[n]
        elif not fused:
            s = s + np.float32(0.0)
        y[n] = s


@njit(cache=True, nogil=True)
def _fp_chain(a2, m0, m1, ct, st, zt, bs, sk, bias, has_bias, acc, w, out, n0, n1):
    """Rows [m0, m1) against columns [n0, n1): per slice of ``sk`` along K one chain of fused multiply-adds per
    element, the slices added to the output in turn (which starts at the bias, or at the first slice)."""
    K = a2.shape[1]
    W = n1 - n0
    R = m1 - m0
    wv = w[:W]
    for k0 in range(0, K, sk):
        acc[:R, :W] = 0
        for k in range(k0, min(K, k0 + sk)):
            blk = k // bs
            crow = ct[k, n0:n1]
            zrow = zt[blk, n0:n1]
            srow = st[blk, n0:n1]
            for c in range(W):
                wv[c] = (np.float32(crow[c]) - zrow[c]) * srow[c]
            for r in range(R):
                ak = np.float32(a2[m0 + r, k])
                row = acc[r, :W]
                for c in range(W):
                    row[c] = _simd.fma32(ak, wv[c], row[c])
        for r in range(R):
            o = out[m0 + r, n0:n1]
            row = acc[r, :W]
            if k0 > 0:
                for c in range(W):
                    o[c] = o[c] + row[c]
            elif has_bias:
                b = bias[n0:n1]
                for c in range(W):
                    o[c] = b[c] + row[c]
            else:
                o[:] = row


@njit(cache=True, nogil=True)
def _fp_ranges(M, N, K, path, threads):
    """The ranges onnxruntime on ``threads`` threads runs a float-path product in, as rows [0] x [1], columns [2] x
    [3] and K slice [4] per range: paths 1 and 3 (``MlasQNBitGemmBatch``) one chain over all of K per element,
    a last row alone in its range (``lone_row``) its own range; path 2 (``MlasGemmBatch``) its thread split
    (``_mlas_sgemm.batch_split``), each range slicing K by its own width.  A range of one row takes the one-row
    kernel."""
    if path != 2:
        one = M - 1 if lone_row(M, threads) else M
        r = np.zeros((2, 5), np.int64)
        r[0, 0], r[0, 1], r[0, 3], r[0, 4] = 0, one, N, K
        r[1, 0], r[1, 1], r[1, 3], r[1, 4] = one, M - one, N, K
        return r
    per, tm, tn = batch_split(1, M, N, K, threads)
    r = np.zeros((per, 5), np.int64)
    for t in range(per):
        m0, cm, n0, cn = task_range(t, tm, tn, M, N)
        r[t, 0], r[t, 1], r[t, 2], r[t, 3] = m0, cm, n0, cn
        r[t, 4] = k_stride(cn, K) if cn > 0 else K
    return r


@njit(cache=True, nogil=True, parallel=True)
def gemv_fp_mlas(a2, ct, st, zt, bs, path, threads, bias, has_bias, out):
    """out [M, N] = A [M, K] @ dequant(B)^T (+ bias) in onnxruntime's float order (see above) on ``threads``
    threads (its intra-op count; ``_fp_ranges``): ``path`` ``fp_order_path``'s.  Each range runs in tasks of
    ``FP_COLS`` columns."""
    M = a2.shape[0]
    N = out.shape[1]
    K = a2.shape[1]
    rng = _fp_ranges(M, N, K, path, threads)
    first = np.zeros(rng.shape[0] + 1, np.int64)  # each range's first task
    for i in range(rng.shape[0]):
        first[i + 1] = first[i] + (rng[i, 3] + FP_COLS - 1) // FP_COLS if rng[i, 1] > 0 else first[i]
    for t in prange(first[-1]):
        i = 0
        while first[i + 1] <= t:
            i += 1
        m0, cm, sk = rng[i, 0], rng[i, 1], rng[i, 4]
        n0 = rng[i, 2] + (t - first[i]) * FP_COLS
        n1 = min(rng[i, 2] + rng[i, 3], n0 + FP_COLS)
        acc = np.empty((16, FP_COLS), np.float32)
        w = np.empty(FP_COLS, np.float32)
        if cm == 1:
            _fp_lanes(a2[m0], ct, st, zt, bs, path, bias, has_bias, N, acc, out[m0], n0, n1)
        else:
            for r0 in range(m0, m0 + cm, 16):
                _fp_chain(a2, r0, min(m0 + cm, r0 + 16), ct, st, zt, bs, sk, bias, has_bias, acc, w, out, n0, n1)


@njit(cache=True, nogil=True, parallel=True)
def dequant_tile(b, bits, sc, zf, has_zp, zdef, grp, n0, w):
    """w[r, k] = (q[n0 + r, k] - z) * s for the tile's rows, block of k given by ``grp[k]``."""
    rows, k_ = w.shape
    nb = b.shape[1]
    blob = b.shape[2]
    per = 8 // bits
    bs = blob * per
    for r in prange(rows):
        n = n0 + r
        # Codes first, walking bytes (no division per element), then the per-element group's scale.
        for blk in range(nb):
            k0 = blk * bs
            for j in range(blob):
                byte = np.int32(b[n, blk, j])
                k = k0 + j * per
                if bits == 4:
                    if k < k_:
                        w[r, k] = np.float32(byte & 15)
                    if k + 1 < k_:
                        w[r, k + 1] = np.float32(byte >> 4)
                elif k < k_:
                    w[r, k] = np.float32(byte)
        for k in range(k_):
            g = grp[k]
            z = zf[n, g] if has_zp else zdef
            w[r, k] = (w[r, k] - z) * sc[n, g]


def dequant_ort_unpacked(b3, bits, sc, zf, float_zp, zdef, grp, K):
    """B dequantized as onnxruntime does before its SGEMM when a float zero point or a g_idx is given: element
    (n, k) is ``q * s + (-s * z)``, each product and the sum rounded to float32, with ``s``, ``z`` of group
    ``grp[k]`` (``k // block_size`` without a g_idx) and ``z`` the float zero point, else the default.  Returns
    the weights transposed, [K, N] float32."""
    N, nb, blob = b3.shape
    codes = np.empty((N, nb * blob * 8 // bits), np.int32)
    unpack_codes(b3.reshape(N, -1), bits, codes.shape[1], codes)
    g = np.arange(K) // (blob * 8 // bits) if grp is None else np.asarray(grp, np.int64)
    s = sc[:, g]
    z = zf[:, g] if float_zp else np.full(s.shape, zdef, F32)
    adjust = (-s) * z  # float32 products, one rounding each
    w = codes[:, :K].astype(F32) * s + adjust
    return np.ascontiguousarray(w.T)


# -- MatMulNBits wrapper ---------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def unpack_codes(packed, bits, n, out):
    """out[r, t] = code t of row r of ``packed`` (uint8, ``8/bits`` codes per byte, low bits first), for t < n
    and within the row's codes (never reads past a row)."""
    per = 8 // bits
    mask = (1 << bits) - 1
    n = min(n, packed.shape[1] * per)
    for r in range(packed.shape[0]):
        for t in range(n):
            out[r, t] = (np.int32(packed[r, t // per]) >> ((t % per) * bits)) & mask


def unpack_zero_points(zp, n, nb, bits):
    """Zero points (checked by ``mnb_check``) as float32 [N, nb]: packed uint8 codes or floats."""
    if zp.dtype == np.uint8:
        z = np.empty((n, nb), F32)
        unpack_codes(np.ascontiguousarray(zp).reshape(n, (nb * bits + 7) // 8), bits, nb, z)
        return z
    return np.ascontiguousarray(zp.reshape(n, nb), dtype=F32)


class Mnb(NamedTuple):
    """A MatMulNBits node bound at plan time."""

    K: int
    N: int
    bits: int
    bs: int               # block_size
    nb: int               # blocks per column: ceil(K / block_size)
    blob: int             # bytes per block
    level4: bool          # accuracy_level 4: A quantized to int8 per block (unless zero points are floats)


def bind_mnb(ctx, K, N, bits=4, block_size=0, accuracy_level=0) -> Mnb:
    K, N, bits, bs = int(K), int(N), int(bits), int(block_size)
    if bits not in (4, 8):
        raise InvalidAttributeError(f"MatMulNBits: bits must be 4 or 8, got {bits}")
    if bs < 16 or bs & (bs - 1):
        raise InvalidAttributeError(f"MatMulNBits: block_size must be a power of two >= 16, got {bs}")
    return Mnb(K, N, bits, bs, (K + bs - 1) // bs, bs * bits // 8, int(accuracy_level) == 4)


MNB_ERRORS = {
    1: ("ShapeMismatchError", "A's last dim must be K"),
    2: ("ShapeMismatchError", "B must be uint8 holding N * n_blocks * (block_size * bits / 8) bytes"),
    3: ("ShapeMismatchError", "scales must have N * n_blocks elements"),
    4: ("ShapeMismatchError", "zero_points must hold N * ceil(n_blocks * bits / 8) packed bytes, or N * n_blocks "
                              "floats"),
    5: ("ShapeMismatchError", "bias must have N elements"),
    6: ("ShapeMismatchError", "g_idx must have K entries"),
    7: ("IndexOutOfRangeError", "a g_idx entry is outside [0, n_blocks)"),
}


def raise_mnb_error(code: int, detail: str = ""):
    raise_coded(MNB_ERRORS, code, "MatMulNBits", detail)


def zp_mode_of(zero_points, g_idx) -> int:
    """0 no zero points (or packed ones beside a g_idx, which onnxruntime 1.32 ignores), 1 packed uint8,
    2 floats."""
    if zero_points is None or (g_idx is not None and zero_points.dtype == np.uint8):
        return 0
    return 1 if zero_points.dtype == np.uint8 else 2


@njit(cache=True, nogil=True)
def mnb_check(a_last, b_u8, b_size, s_size, zp_mode, zp_size, bias_size, K, N, bits, nb, blob):
    """The inputs against the bound attributes: an error code into ``MNB_ERRORS`` (0: they fit);
    ``bias_size`` is -1 without a bias."""
    if a_last != K:
        return 1
    if not b_u8 or b_size != N * nb * blob:
        return 2
    if s_size != N * nb:
        return 3
    if (zp_mode == 1 and zp_size != N * ((nb * bits + 7) // 8)) or (zp_mode == 2 and zp_size != N * nb):
        return 4
    if bias_size >= 0 and bias_size != N:
        return 5
    return 0


def check_inputs(m: Mnb, a, b, scales, zero_points, g_idx, bias) -> int:
    """``mnb_check`` on the node's inputs (host or device arrays), raising its error; returns the zero-point
    mode.  A g_idx must be a host array here."""
    zp_mode = zp_mode_of(zero_points, g_idx)
    err = mnb_check(int(a.shape[a.ndim - 1]) if a.ndim else -1, np.dtype(b.dtype) == np.uint8, int(b.size),
                    int(scales.size), zp_mode, 0 if zero_points is None else int(zero_points.size),
                    -1 if bias is None else int(bias.size), m.K, m.N, m.bits, m.nb, m.blob)
    if err:
        raise_mnb_error(err, f" (K={m.K}, N={m.N}, bits={m.bits}, block_size={m.bs}; A {list(a.shape)}, B "
                             f"{list(b.shape)}, scales {list(scales.shape)})")
    return zp_mode


def groups_of(m: Mnb, g_idx):
    """A host g_idx checked: None when absent or trivial (``k // block_size``), else the int64 groups."""
    if g_idx is None:
        return None
    gi = np.asarray(g_idx).reshape(-1).astype(np.int64)
    if gi.size != m.K:
        raise_mnb_error(6, f" (K={m.K}), got shape {list(np.shape(g_idx))}")
    if gi.size and (gi.min() < 0 or gi.max() >= m.nb):
        raise_mnb_error(7, f" (n_blocks={m.nb})")
    return None if np.array_equal(gi, np.arange(m.K) // m.bs) else gi


@contextlib.contextmanager
def _threads_for(nbytes, chunk=None):
    """Numba's thread count (and chunk size) for one pass over ``nbytes`` of packed weight: waking threads costs
    more than a small weight takes to stream, so one thread per ``BYTES_PER_THREAD``; restored after."""
    nt_max = numba.get_num_threads()
    nt = max(1, min(nt_max, nbytes // BYTES_PER_THREAD))
    prev = numba.get_parallel_chunksize() if chunk else None
    if chunk:
        numba.set_parallel_chunksize(chunk)
    if nt != nt_max:
        numba.set_num_threads(nt)
    try:
        yield nt
    finally:
        if chunk:
            numba.set_parallel_chunksize(prev)
        if nt != nt_max:
            numba.set_num_threads(nt_max)


def _rows_pass(m: Mnb, a2, b3, sc, zf, has_zp, zdef, quant, out):
    """A few rows of A in one pass over the packed weight (see the module docstring)."""
    rows_a, nb, bs = a2.shape[0], m.nb, m.bs
    asum = np.empty((rows_a, nb), F32)
    ascale = np.empty((rows_a, nb), F32)
    if m.bits == 4:
        ae = np.empty((rows_a, nb, bs // 2), F32)
        ao = np.empty((rows_a, nb, bs // 2), F32)
        prep_a4(a2, nb, bs, quant, ae, ao, asum, ascale)
        rows_q4(b3, ae, ao, asum, ascale, sc, zf, has_zp, zdef, out)
    else:
        ap = np.empty((rows_a, nb, bs), F32)
        prep_a8(a2, nb, bs, quant, ap, asum, ascale)
        rows_q8(b3, ap, asum, ascale, sc, zf, has_zp, zdef, out)


def _tiles_pass(m: Mnb, a2, b3, sc, zf, has_zp, zdef, quant, grp, out):
    """Tiles of weight rows dequantized into float32, each multiplied with every row of A by BLAS."""
    K, N, bs = m.K, m.N, m.bs
    af = a2 if a2.dtype == F32 else a2.astype(F32)
    if quant:
        fq = np.empty((a2.shape[0], K), F32)
        fake_quant_a(np.ascontiguousarray(af), bs, fq)
        af = fq
    g = grp if grp is not None else (np.arange(K, dtype=np.int64) // bs)
    tile = max(1, min(N, TILE_ELEMS // max(K, 1)))
    w = np.empty((tile, K), F32)
    for n0 in range(0, N, tile):
        rows = min(tile, N - n0)
        wt = w[:rows]
        dequant_tile(b3, m.bits, sc, zf, has_zp, zdef, g, n0, wt)
        np.matmul(af, wt.T, out=out[:, n0:n0 + rows])


def matmul_nbits(m: Mnb, a, b, scales, zero_points=None, g_idx=None, bias=None, cache=None, mlas=None):
    """The op on one set of inputs (the node wrapper passes a per-node constant cache, and ``mlas``, the order of
    the int8-activation path (``mlas_path``: 0 blockwise, else MLAS's), decided once when the node is planned; None
    reads the setting now)."""
    K, N, bits, bs, nb, blob = m.K, m.N, m.bits, m.bs, m.nb, m.blob
    zp_mode = check_inputs(m, a, b, scales, zero_points, g_idx, bias)
    has_zp = zp_mode != 0
    cache = {} if cache is None else cache
    key = (scales, zero_points, g_idx)
    hit = cache.get("consts")
    if hit is None or any(x is not y for x, y in zip(hit[0], key)):
        sc = np.ascontiguousarray(scales.reshape(N, nb), dtype=F32)
        zf = unpack_zero_points(zero_points, N, nb, bits) if has_zp else np.zeros((1, 1), F32)
        hit = cache["consts"] = (key, sc, zf, groups_of(m, g_idx))
    _, sc, zf, grp = hit
    zdef = np.float32(1 << (bits - 1))
    b3 = b.reshape(N, nb, blob)
    dt = a.dtype
    a2 = a.reshape(-1, K)
    rows_a = a2.shape[0]
    out = np.empty((rows_a, N), F32)
    # onnxruntime's int8 path (level 4) quantizes A per block; with float zero points, or with a g_idx (even
    # one equal to k // block_size), it keeps float A.
    quant = m.level4 and zp_mode != 2 and g_idx is None
    order = mlas_path(bs, bits, m.level4) if mlas is None else mlas
    if rows_a == 0 or N == 0:
        pass
    elif K == 0:
        out[...] = 0
    elif order and bits == 4 and (zp_mode == 2 or g_idx is not None) and mlas_path(bs, bits, False):
        # onnxruntime dequantizes B first here (a float zero point or a g_idx): q * s + (-s * z) in float32, a
        # packed zero point beside a g_idx read as the default 8; then its SGEMM over the float weights
        lay = cache.get("dq")
        if lay is None or lay[0] is not b or lay[1] is not sc:
            # (``sc`` is rebuilt whenever scales, zero points or g_idx change: its identity keys all three)
            wt = dequant_ort_unpacked(b3, bits, sc, zf, zp_mode == 2, zdef, grp, K)
            # the float weights through the SGEMM kernel as codes of scale 1 and zero 0 (exact: w * 1 - 0 = w)
            lay = cache["dq"] = (b, sc, wt, np.ones((1, N), F32), np.zeros((1, N), F32))
        _, _, wt, ones, zeros = lay
        has_bias = bias is not None
        bf = np.ascontiguousarray(bias, dtype=F32).reshape(-1) if has_bias else np.zeros(1, F32)
        with _threads_for(wt.nbytes * min(rows_a, ROWS_MAX)):
            gemv_fp_mlas(np.ascontiguousarray(a2, dtype=F32), wt, ones, zeros, K, 2, ort_threads(),
                         bf, has_bias, out)
        bias = None
    elif order and not m.level4 and zp_mode != 2 and grp is None:
        # onnxruntime's float path (levels 0 to 3): codes transposed once per node, dequantized on the fly
        lay = cache.get("fp")
        if lay is None or lay[0] is not b or lay[1] is not sc:
            lay = cache["fp"] = (b, sc) + fp_layout(b3, bits, sc, zf, has_zp, zdef)
        _, _, ct, st, zt = lay
        path = fp_order_path(bits, bs, order)
        has_bias = bias is not None
        bf = np.ascontiguousarray(bias, dtype=F32).reshape(-1) if has_bias else np.zeros(1, F32)
        with _threads_for(b3.nbytes * min(rows_a, ROWS_MAX)):
            gemv_fp_mlas(np.ascontiguousarray(a2, dtype=F32), ct, st, zt, bs, path, ort_threads(), bf, has_bias,
                         out)
        bias = None
    elif int4_path(bits, bs, quant, grp) or (bits == 8 and quant and grp is None and order):
        # 8-bit codes take these kernels in MLAS's order only (``int8_layout``; the blockwise order: the rows)
        key = "int4" if bits == 4 else "int8"
        lay = cache.get(key)
        if lay is None or lay[0] is not b or lay[1] is not sc:
            lay = cache[key] = (b, sc) + (int4_layout if bits == 4 else int8_layout)(b3, sc, zf, has_zp)
        _, _, qi, sct, zft = lay
        with _threads_for(b3.nbytes * min(rows_a, ROWS_MAX)) as nt:  # rows sharing a pass: more work per byte
            a2c = np.ascontiguousarray(a2, dtype=F32)
            if order:
                has_bias = bias is not None
                bf = np.ascontiguousarray(bias, dtype=F32).reshape(-1) if has_bias else np.zeros(1, F32)
                mlas_gemv(bits, bs, order)(a2c, qi, sct, zft, has_zp, zdef, bs, out, nt > 1, bf, has_bias, order,
                                           ort_threads())
                bias = None  # added in onnxruntime's place, before the zero points' share
            else:
                gemv_q4i8(a2c, qi, sct, zft, has_zp, zdef, bs, out, nt > 1)
    elif rows_a <= ROWS_MAX and grp is None:
        # Small dynamic chunks: a thread delayed by a busy core does not hold up the whole pass.
        with _threads_for(b3.nbytes, _CHUNK_ROWS):
            _rows_pass(m, np.ascontiguousarray(a2, dtype=F32), b3, sc, zf, has_zp, zdef, quant, out)
    else:
        _tiles_pass(m, a2, b3, sc, zf, has_zp, zdef, quant, grp, out)
    if bias is not None:
        out += bias.reshape(1, N).astype(F32)
    res = out.reshape(a.shape[:-1] + (N,))
    return res if dt == F32 else res.astype(dt)


@op("MatMulNBits", 1, domain="com.microsoft", bind=bind_mnb)
def _matmul_nbits_cpu(m: Mnb, ctx):
    cache = {}
    mlas = mlas_path(m.bs, m.bits, m.level4)  # the setting, read once per node rather than at every run

    def run(a, b, scales, zero_points=None, g_idx=None, bias=None):
        return matmul_nbits(m, a, b, scales, zero_points, g_idx, bias, cache=cache, mlas=mlas)
    return run
