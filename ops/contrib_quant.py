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
  rounding.  Otherwise (level 0..3, or float zero points, where onnxruntime also keeps A float)
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
  once into float32 and multiplied with all rows of A by BLAS.  At level 4, A is replaced by its
  per-block int8 quantization scaled back (``qa * sa``), which is onnxruntime's level-4 product up
  to float rounding (the block scales factor out of each block's integer dot).

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
from numba import njit, prange

from runtime.errors import InvalidAttributeError
from . import _simd
from ._common import F32, mlas_order, raise_coded
from ._fastmath import FAST
from ._glue import GlueCompiler
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
    """out[m, n] = sum_blk ascale*sc*(sum_j (lo*a_even + hi*a_odd) - z*asum): one streamed pass over B [N, nb, half]."""
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


def mlas_path(bs) -> int:
    """The order of a level-4 int4 product of block size ``bs``: 0, the blockwise order (each block's exact integer
    dot summed into one float per column; the default: faster, and equal to onnxruntime's up to float rounding), or
    under ``_common.mlas_order`` for blocks of 32, MLAS's order for this host, bit for bit onnxruntime's there:
    ``ORDER_AVX512`` on ``mlas_avx512_host`` hosts, else ``ORDER_AVX2`` (any host runs either: the kernels have a
    portable form).  MLAS's AVX2 order costs 1.0-1.4x the blockwise one per decode product and 2-3x per prefill
    product (measured in cache on an AVX2 host)."""
    if bs != 32 or not mlas_order():
        return 0
    return ORDER_AVX512 if mlas_avx512_host() else ORDER_AVX2


ORT_RANGE_M = 128  # MLAS's rows per thread range: a range of one row takes its one-row kernel


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
def _ort_groups(signed, quads, qi, aq, ascale, gsum, zdef, zft, has_zp, sct, y, g0, g1, n4):
    """Column groups [g0, g1): one row (``aq`` 1-d; ``signed`` codes minus zero points, MLAS's AVX2 one-row kernel,
    or unsigned codes) or ``_simd.ORT_ROWS`` rows (2-d, unsigned); ``quads``: MLAS's AVX-512 lanes (unsigned)."""
    if quads:
        if aq.ndim == 2:
            _simd.dot_q4_ort_u4_rows(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
        else:
            _simd.dot_q4_ort_u4(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
    elif aq.ndim == 2:
        _simd.dot_q4_ort_u_rows(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
    elif not signed:
        _simd.dot_q4_ort_u(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)
    elif has_zp:
        _simd.dot_q4_ort_s_zp(qi, aq, ascale, gsum, zft, sct, y, g0, g1, n4)
    else:
        _simd.dot_q4_ort_s(qi, aq, ascale, gsum, zdef, sct, y, g0, g1, n4)


@njit(cache=True, nogil=True, parallel=True)
def _ort_par(signed, quads, qi, aq, ascale, gsum, zdef, zft, has_zp, sct, y, n4):
    G = qi.shape[0]
    for t in prange((G + _GROUPS_PER_TASK - 1) // _GROUPS_PER_TASK):
        g0 = t * _GROUPS_PER_TASK
        _ort_groups(signed, quads, qi, aq, ascale, gsum, zdef, zft, has_zp, sct, y, g0,
                    min(g0 + _GROUPS_PER_TASK, G), n4)


@njit(cache=True, nogil=True)
def ort_zero_point_sums(absum, sct, zft, has_zp, zdef, y):
    """y[c] = f32(sum_blk absum[blk] * f32(-scale[c, blk] * zero[c, blk]) + y[c]), the sum a chain of fused
    multiply-adds over the blocks from 0: MLAS's several-row kernel takes the zero points out of its
    unsigned-code products this way, by a float GEMM over the block sums (``y`` [8 G])."""
    G, nb = sct.shape[0], sct.shape[1]
    c = np.empty(8, np.float32)
    for g in range(G):
        c[:] = 0
        for blk in range(nb):
            a = absum[blk]
            for i in range(8):
                z = zft[g, blk, i] if has_zp else zdef
                c[i] = _simd.fma32(a, -(sct[g, blk, i] * z), c[i])
        for i in range(8):
            y[8 * g + i] = c[i] + y[8 * g + i]


@njit(cache=True, nogil=True)
def gemv_q4i8_mlas(a2, qi, sct, zft, has_zp, zdef, bs, out, parallel, bias, has_bias, order):
    """``gemv_q4i8`` (with the bias added) in MLAS's AVX2 order for blocks of 32, bit for bit onnxruntime's
    level-4 product on such hosts:

    - A quantized per block as ``QuantizeARow_CompInt8`` (``_prep_a_i8_groups``);
    - per row and column, eight float lanes, each a chain of ``fma(exact integer lane sum, f32(ascale * scale),
      lane)`` over the blocks (``_simd._OrtEmitter``); lanes folded ``((l0+l1)+l2)+l3 + (((l4+l5)+l6)+l7)``
      for the columns below N rounded down to 4, ``((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`` for the rest; then
      the bias added;
    - a row alone in its range of ``ORT_RANGE_M`` rows (M = 1 among them) uses signed codes (code - zero point)
      and pairs of blocks per update without zero points, one block per update with them; every other row uses
      unsigned codes and pairs of blocks, then ``ort_zero_point_sums``.

    ``order`` ``ORDER_AVX512``: MLAS's AVX-512 kernels instead.  Every row uses unsigned codes; per row and column
    16 float lanes take 4 blocks per update (``_simd._OrtEmitter.quad``), the two halves are added lane by lane
    (``l[j] + l[j + 8]``), the blocks past a multiple of 4 update those 8 lanes one block at a time (lane j the
    block's products 4j..4j+3), then the folds, the bias and ``ort_zero_point_sums`` as above."""
    G, nb = qi.shape[0], qi.shape[1]
    N = out.shape[1]
    if qi.shape[2] * 8 != bs or bs != 32:
        raise ValueError("gemv_q4i8_mlas: blocks of 32 only, in the int4_layout of that block size")
    n4 = N - N % 4
    z = np.float32(zdef)
    M = a2.shape[0]
    quads = order == ORDER_AVX512
    nu = M - 1 if M % ORT_RANGE_M == 1 and not quads else M  # rows with unsigned codes; the last one, if any, signed
    R = _simd.ORT_ROWS
    nq = nb * bs // 4
    absum = np.empty((max(M, 1), nb), np.float32)
    done = 0
    if nu >= PAD_ROWS_MIN:
        aqr = np.empty((R, nb * bs), np.int8)
        ascr = np.empty((R, nb), np.float32)
        gsr = np.empty((R, nq), np.float32)
        yr = np.empty((R, 8 * G), np.float32)
        while nu - done >= PAD_ROWS_MIN:
            take = min(R, nu - done)
            for r in range(take):
                _prep_a_i8_groups(a2[done + r], bs, aqr[r], ascr[r], gsr[r], absum[done + r])
            for r in range(take, R):
                aqr[r] = aqr[take - 1]
                ascr[r] = ascr[take - 1]
                gsr[r] = gsr[take - 1]
            if parallel:
                _ort_par(False, quads, qi, aqr, ascr, gsr, z, zft, has_zp, sct, yr, n4)
            else:
                _ort_groups(False, quads, qi, aqr, ascr, gsr, z, zft, has_zp, sct, yr, 0, G, n4)
            out[done:done + take, :N] = yr[:take, :N]
            done += take
    aq = np.empty(nb * bs, np.int8)
    ascale = np.empty(nb, np.float32)
    gs = np.empty(nq, np.float32)
    y = np.empty(8 * G, np.float32)
    for m in range(done, M):
        _prep_a_i8_groups(a2[m], bs, aq, ascale, gs, absum[m])
        signed = m >= nu
        if parallel:
            _ort_par(signed, quads, qi, aq, ascale, gs, z, zft, has_zp, sct, y, n4)
        else:
            _ort_groups(signed, quads, qi, aq, ascale, gs, z, zft, has_zp, sct, y, 0, G, n4)
        for n in range(N):
            out[m, n] = y[n]
    yz = np.empty(8 * G, np.float32)
    for m in range(M):
        if has_bias:
            for n in range(N):
                out[m, n] += bias[n]
        if m < nu:
            for n in range(N):
                yz[n] = out[m, n]
            ort_zero_point_sums(absum[m], sct, zft, has_zp, z, yz)
            for n in range(N):
                out[m, n] = yz[n]


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
    """The op on one set of inputs (the node wrapper passes a per-node constant cache, and ``mlas``, whether the
    int4 path runs in MLAS's order, decided once when the node is planned; None reads the setting now)."""
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
    # onnxruntime's int8 path (level 4) quantizes A per block; with float zero points it keeps float A.
    quant = m.level4 and zp_mode != 2
    if rows_a == 0 or N == 0:
        pass
    elif K == 0:
        out[...] = 0
    elif int4_path(bits, bs, quant, grp):
        lay = cache.get("int4")
        if lay is None or lay[0] is not b or lay[1] is not sc:
            lay = cache["int4"] = (b, sc) + int4_layout(b3, sc, zf, has_zp)
        _, _, qi, sct, zft = lay
        with _threads_for(b3.nbytes * min(rows_a, ROWS_MAX)) as nt:  # rows sharing a pass: more work per byte
            a2c = np.ascontiguousarray(a2, dtype=F32)
            order = mlas_path(bs) if mlas is None else mlas
            if order:
                has_bias = bias is not None
                bf = np.ascontiguousarray(bias, dtype=F32).reshape(-1) if has_bias else np.zeros(1, F32)
                gemv_q4i8_mlas(a2c, qi, sct, zft, has_zp, zdef, bs, out, nt > 1, bf, has_bias, order)
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
    mlas = mlas_path(m.bs)  # the setting, read once per node rather than at every run

    def run(a, b, scales, zero_points=None, g_idx=None, bias=None):
        return matmul_nbits(m, a, b, scales, zero_points, g_idx, bias, cache=cache, mlas=mlas)
    return run
