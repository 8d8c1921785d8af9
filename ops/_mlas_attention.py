"""GroupQueryAttention's rotary and attention in MLAS's order: onnxruntime's CPU bits on x86 hosts with AVX2/FMA,
with or without AVX-512.

``ops/group_query_attention.gqa_f32`` takes these kernels when asked for MLAS's order (``ONNX_NUMBA_MLAS_ORDER``)
on float32 steps.  ``attend_mlas`` is onnxruntime's flash kernels, which it runs where there is no softcap,
smooth softmax, head sink or ``qk`` output (a local window, a windowed cache and an attention bias are part of
them); ``attend_probs_mlas`` is its kernel's other path, for those four (``ComputeAttentionProbs``,
``ComputeVxAttentionScore``: whole score rows by SGEMM, then softcap, bias and MLAS's softmax, then the value
product; its docstring gives the order).  They reproduce onnxruntime 1.32's arithmetic, read from its CPU kernel
(``GQAAttentionBase``) and MLAS (``flashattn_gqa.cpp``, ``compute.cpp``'s softmax, the FMA3 SGEMM and sum-exp
kernels, the AVX2 rotary kernel); every operation below is named with the rounding it does:

- rotary (non-interleaved halves ``x1``, ``x2``): ``x1' = fma(x1, cos, -(x2 * sin))``, ``x2' = fma(x1, sin,
  x2 * cos)``;
- several query rows (prefill, chunked prefill): query rows in blocks of ``q_block = min(kv_block, 2 D)``, keys in
  blocks of ``kv_block = L2 / (32 D)`` (the per-core L2 cache, ``L2_BYTES``); a key block at or past the block's
  causal limit is skipped.  Per key block: scores = (a chain of fused multiply-adds over the head dimension from
  0) * scale, over slices of the head dimension when it is longer than one SGEMM pass (``sgemm_stride_k``: the
  first slice times scale, each later one added by ``fma(slice, scale, score)``); the attention bias added; keys
  past a row's causal limit or before its local window set to ``-FLT_MAX`` (they still go through the
  exponential: their tiny value is part of the sums); a row wholly masked in the block is zeroed and keeps its
  state.  Otherwise
  the running max ``m`` is raised, ``e = sum_exp(score - m)``, and after the first block the state is rescaled
  by ``d = expf(m_old - m)`` (libm's ``expf``): ``l = d * l + rowsum`` and ``acc *= d`` (separate roundings).
  Then ``acc`` gains ``e @ V_block``: per output and SGEMM pass over the keys a fused chain from the pass's first
  key, stored (the first pass of the first block) or added to ``acc`` in one rounding; a query block of one row
  goes through MLAS's one-row kernel instead (keys in groups of 4, 2, 1; products and sums rounded apart).
  Output ``acc * (1 / l)``;
- one query row (decode): scores by eight float lanes over the head dimension (``lane += q * k``, separately
  rounded; the lanes summed ``((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))``, the odd tail added in order), times scale;
  ``e = sum_exp(score - max)``; output ``sum_t e_t * v_t`` in key order (separately rounded) times ``1 / l``.
  When the batch has fewer heads in all than onnxruntime has threads and the keys span several blocks, it splits
  the keys (flash decoding): each block's ``(m, l, e @ v)`` as above, merged in block order with ``r =
  expf(m_c - m)``, ``l += r * l_c``, ``out += r * out_c``;
- ``sum_exp``: MLAS's FMA3 kernel: ``x = max(v + negmax, -88.3762626647949)``, its 2^n split and degree-6
  polynomial in fused multiply-adds, the scale built in the exponent bits; sums in eight lanes over chunks of
  eight, folded as above.  On hosts with AVX-512 F onnxruntime's platform table takes MLAS's AVX-512 kernel
  (``sum_exp16``): the same polynomial scaled by ``vscalefps``, sums in 16 lanes folded to 8 and then as above.

Scope: head sizes up to ``MAX_HEAD`` (256), where MLAS's SGEMM sums every product in one chain; the products
run on ``_panels``' register tiles, whose multiply-adds are fused on hosts with FMA (every AVX2 host), as MLAS's
FMA3 kernels fuse them.

Invariants: these kernels are compiled without fast-math flags (no contraction or reassociation beyond the
fused multiply-adds written out); they read only the live cache rows; the caller has checked every shape and
position (``gqa_geometry``, ``gqa_positions``).
"""
from __future__ import annotations

import contextvars
import math
import os

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from runtime.settings import SettingError, text
from ._fastmath import maxnum
from ._mlas_sgemm import m1_rowvec, m1t_fold
from ._panels import PANEL, pack_panels_into, tile4
from .attention import rope_tok_kernel
from ._simd import AVX512F, fma32

__all__ = ["L2_BYTES", "PHYSICAL_CORES", "SESSION_INTRA_OP_THREADS", "ort_threads", "sum_exp", "sum_exp8",
           "sum_exp16", "rope_mlas", "attend_mlas", "attend_probs_mlas", "kv_block"]

_OPTS = dict(cache=True, nogil=True)
LOWEST = np.float32(np.finfo(np.float32).min)
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_LOWER = np.float32(-88.3762626647949)
_BIAS = np.float32(12582912.0)
_LOG2R = np.float32(1.44269504088896341)
_LOG2H = np.float32(-6.93145752e-1)
_LOG2L = np.float32(-1.42860677e-6)
_P0 = np.float32(float.fromhex("0x1.694000p-10"))
_P1 = np.float32(float.fromhex("0x1.125edcp-7"))
_P2 = np.float32(float.fromhex("0x1.555b5ap-5"))
_P3 = np.float32(float.fromhex("0x1.555450p-3"))
_P4 = np.float32(float.fromhex("0x1.fffff6p-2"))


def _l2_bytes() -> int:
    """The per-core L2 cache in bytes, as onnxruntime reads it (512 KiB where the system does not say)."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as f:
            text = f.read().strip().upper()
        mult = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
        return int(text.rstrip("KM")) * mult
    except (OSError, ValueError):
        return 524288


def _physical_cores() -> int:
    """Physical cores this process may run on: onnxruntime's default thread count."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
    cores = set()
    for c in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/core_id") as f:
                core = f.read().strip()
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/physical_package_id") as f:
                pkg = f.read().strip()
            cores.add((pkg, core))
        except OSError:
            cores.add(("", str(c)))
    return max(len(cores), 1)


L2_BYTES = _l2_bytes()
MAX_HEAD = 256  # MLAS's SGEMM sums a longer product in parts (its K stride): not reproduced
PHYSICAL_CORES = _physical_cores()
# A session's own ``intra_op_num_threads`` (0: none given), set around its planning and its runs
# (``runtime.session``): onnxruntime given the same options splits its work over that many threads.
SESSION_INTRA_OP_THREADS = contextvars.ContextVar("session_intra_op_threads", default=0)


def ort_threads() -> int:
    """onnxruntime's intra-op thread count that the kernels reproducing its order follow (its thread split
    changes some of its results): the running session's ``intra_op_num_threads`` when it sets one, else
    ``ONNX_NUMBA_ORT_THREADS`` when set (a positive integer: the count a user gives onnxruntime's
    ``intra_op_num_threads``), else onnxruntime's default, the physical cores this process may run on."""
    n = SESSION_INTRA_OP_THREADS.get()
    if n > 0:
        return n
    v = text("ONNX_NUMBA_ORT_THREADS")
    if v is None:
        return PHYSICAL_CORES
    try:
        n = int(v.strip())
    except ValueError:
        n = 0
    if n < 1:
        raise SettingError(f"ONNX_NUMBA_ORT_THREADS={v!r} is not a thread count: expected a positive integer "
                           f"(onnxruntime's intra_op_num_threads), or unset for its default ({PHYSICAL_CORES})")
    return n


@njit(**_OPTS)
def kv_block(D, l2):
    """onnxruntime's key block for head size ``D``: ``l2 / (4 * 4 * 2 D)``, at least 1."""
    return max(l2 // (32 * D), 1)


@intrinsic
def _pow2_bits(typingctx, b):
    """``bitcast((bits(b) << 23) + 0x3F800000)``: 2**n for the integer n in b's low mantissa bits (int32 wrap)."""
    if b != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        v = builder.add(builder.shl(builder.bitcast(args[0], i32), ir.Constant(i32, 23)), ir.Constant(i32, 0x3F800000))
        return builder.bitcast(v, ir.FloatType())
    return types.float32(types.float32), codegen


@njit(cache=True, nogil=True, inline="always")
def _exp_poly(v, negmax):
    """MLAS's exp of ``v + negmax`` up to its final scaling: ``(p, b, m)``, the polynomial of the reduced argument,
    the rounding-biased ``x / ln 2`` and the integer ``m`` it rounds to (branch-free: it vectorizes)."""
    x = maxnum(np.float32(v + negmax), _LOWER)  # vmaxps(lower, x)
    b = fma32(x, _LOG2R, _BIAS)
    m = np.float32(b - _BIAS)
    x = fma32(m, _LOG2H, x)
    x = fma32(m, _LOG2L, x)
    p = fma32(_P0, x, _P1)
    p = fma32(p, x, _P2)
    p = fma32(p, x, _P3)
    p = fma32(p, x, _P4)
    p = fma32(p, x, _ONE)
    p = fma32(p, x, _ONE)
    return p, b, m


@njit(cache=True, nogil=True, inline="always")
def _exp_el(v, negmax):
    """One element of MLAS's FMA3 sum-exp kernel: the polynomial times 2**m built in the exponent bits."""
    p, b, m = _exp_poly(v, negmax)
    return np.float32(p * _pow2_bits(b))


@njit(cache=True, nogil=True, inline="always")
def _exp_el16(v, negmax):
    """One element of MLAS's AVX-512 sum-exp kernel: the polynomial scaled by ``vscalefps`` (``p * 2**m`` rounded
    once)."""
    p, b, m = _exp_poly(v, negmax)
    return np.float32(np.float64(p) * math.ldexp(1.0, int(m)))  # exact in float64, then one rounding


@njit(cache=True, nogil=True, inline="always")
def _lanes8(p, n, off, stride):
    """Eight float32 lane sums of ``p[:n]``: lane i adds ``p[c + i]`` for c = off, off + stride, ... in order (a
    last partial run of fewer than 8 fills lanes from 0), each add rounded, as a vector accumulator does."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = _ZERO
    c = off
    while c + 8 <= n:
        a0 += p[c]
        a1 += p[c + 1]
        a2 += p[c + 2]
        a3 += p[c + 3]
        a4 += p[c + 4]
        a5 += p[c + 5]
        a6 += p[c + 6]
        a7 += p[c + 7]
        c += stride
    k = n - c
    if k > 0:
        a0 += p[c]
    if k > 1:
        a1 += p[c + 1]
    if k > 2:
        a2 += p[c + 2]
    if k > 3:
        a3 += p[c + 3]
    if k > 4:
        a4 += p[c + 4]
    if k > 5:
        a5 += p[c + 5]
    if k > 6:
        a6 += p[c + 6]
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit(**_OPTS)
def sum_exp16(p, n, negmax):
    """``sum_exp`` as MLAS's AVX-512 kernel computes it (onnxruntime on hosts with AVX-512 F): the elements by
    ``_exp_el16``; the sum in 16 lanes, lane i adding elements i, i + 16, i + 32, ... in order, the halves added
    (``s_i = l_i + l_{i+8}``) and folded ``((s0+s1)+(s2+s3)) + ((s4+s5)+(s6+s7))``."""
    for j in range(n):
        p[j] = _exp_el16(p[j], negmax)
    l0, l1, l2, l3, l4, l5, l6, l7 = _lanes8(p, n, 0, 16)
    h0, h1, h2, h3, h4, h5, h6, h7 = _lanes8(p, n, 8, 16)
    return np.float32(np.float32(((l0 + h0) + (l1 + h1)) + ((l2 + h2) + (l3 + h3)))
                      + np.float32(((l4 + h4) + (l5 + h5)) + ((l6 + h6) + (l7 + h7))))


@njit(**_OPTS)
def sum_exp8(p, n, negmax):
    """``p[:n] = e**(p[:n] + negmax)`` in place, by MLAS's FMA3 sum-exp kernel; returns their sum in its order:
    eight lanes over chunks of eight (a last partial chunk in lanes from 0), folded ``((l4+l5)+(l6+l7)) +
    ((l0+l1)+(l2+l3))``."""
    for j in range(n):
        p[j] = _exp_el(p[j], negmax)
    a0, a1, a2, a3, a4, a5, a6, a7 = _lanes8(p, n, 0, 8)
    return np.float32(np.float32((a4 + a5) + (a6 + a7)) + np.float32((a0 + a1) + (a2 + a3)))


# onnxruntime's platform table takes the AVX-512 F kernel wherever the host has AVX-512 F
sum_exp = sum_exp16 if AVX512F else sum_exp8


@njit(**_OPTS)
def rope_mlas(x4, pos, cosc, sinc, interleaved):
    """A rotated copy of x4 (B, S, heads, D) at positions ``pos`` (B, S) in MLAS's order
    (``ops/attention.rope_tok_kernel`` with ``mlas``) over the rotary dimensions (``cosc``'s width, doubled)."""
    B, S, Hh, D = x4.shape
    half = cosc.shape[1]
    cos_t = np.empty((B, S, half), np.float32)
    sin_t = np.empty((B, S, half), np.float32)
    for b in range(B):
        for s in range(S):
            for t in range(half):
                cos_t[b, s, t] = cosc[pos[b, s], t]
                sin_t[b, s, t] = sinc[pos[b, s], t]
    out = np.empty_like(x4)
    rope_tok_kernel(x4, cos_t, sin_t, out, True, interleaved, 2 * half, True)
    return out


@njit(**_OPTS)
def sgemm_stride_k(N, K):
    """The slice of K that MLAS's SGEMM (``MlasSgemmOperation``) multiplies per pass for N output columns: 128,
    halved while half of it still covers K when N >= K, else doubled while N fits in half the column slice
    (from 128 down to 16).  A longer K is summed in passes: the first (beta 0) stored times alpha, each later one
    added as ``fma(pass, alpha, C)``."""
    sn = 128
    sk = 128
    if N >= K:
        while sk // 2 >= K:
            sn *= 2
            sk //= 2
    else:
        while sn > 16 and sn // 2 >= N:
            sk *= 2
            sn //= 2
    return sk


@njit(cache=True, nogil=True, inline="always")
def _bi(a, axis, i):
    """Index ``i`` along ``axis`` of a broadcast operand: 0 where that axis has length 1."""
    return i if a.shape[axis] > 1 else 0


@njit(**_OPTS)
def _qk_panels(qbuf, rq, kc, b, kh, ir, rk, scale, kbuf, scbuf, abuf, pbuf):
    """Scores ``scale * (Q rows @ keys [ir, ir + rk))`` as MLAS's SGEMM forms them (per pass over a slice of the
    head dimension (``sgemm_stride_k``) a chain of multiply-adds from the slice's start; the first pass times
    scale, each later one added by ``fma(pass, scale, score)``), by the register tiles of ``_panels`` (fused
    multiply-adds on FMA hosts): query rows in ``qbuf`` (padded to a multiple of four rows), the key block packed
    into ``kbuf``; returns the scores as a C-contiguous (rows, rk) view of ``scbuf``."""
    R4, D = qbuf.shape
    P = (rk + PANEL - 1) // PANEL
    sc = scbuf[:R4 * rk].reshape((R4, rk))
    sk = sgemm_stride_k(rk, D)
    if sk >= D:
        kp = kbuf[:P * D * PANEL].reshape((P, D, PANEL))
        pack_panels_into(kc[b, kh, ir:ir + rk].T, kp)
        for r in range(0, R4, 4):
            tile4(kp, qbuf, sc, r, 0, P)
        for i in range(rq):
            for j in range(rk):
                sc[i, j] = np.float32(sc[i, j] * scale)
        return sc
    part = pbuf[:R4 * rk].reshape((R4, rk))
    for k0 in range(0, D, sk):
        ck = min(sk, D - k0)
        kp = kbuf[:P * ck * PANEL].reshape((P, ck, PANEL))
        pack_panels_into(kc[b, kh, ir:ir + rk, k0:k0 + ck].T, kp)
        a = abuf[:R4 * ck].reshape((R4, ck))
        a[:, :] = qbuf[:, k0:k0 + ck]
        for r in range(0, R4, 4):
            tile4(kp, a, part, r, 0, P)
        for i in range(rq):
            for j in range(rk):
                sc[i, j] = np.float32(part[i, j] * scale) if k0 == 0 else fma32(part[i, j], scale, sc[i, j])
    return sc


@njit(**_OPTS)
def _qk_one_row_alpha1(q, b, h, kc, kh, T, out):
    """``out[:T]`` = q[b, 0, h] . keys [0, T) as MLAS's SGEMM hands one query row with alpha exactly 1 to its
    one-row transposed kernel: per key, eight lanes over the head dimension (``lane += q * k``, each product and
    sum rounded), folded by ``m1t_fold``, then plus 0 (beta 0)."""
    D = q.shape[3]
    lanes = np.empty(8, np.float32)
    for j in range(T):
        krow = kc[b, kh, j]
        for i in range(8):
            lanes[i] = _ZERO
        for d in range(D):
            lanes[d % 8] = np.float32(lanes[d % 8] + np.float32(q[b, 0, h, d] * krow[d]))
        out[j] = np.float32(m1t_fold(lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7],
                                     j, T) + _ZERO)


@njit(**_OPTS)
def _sv_one_row(sc, vc, b, kh, ir, rk, first, acc):
    """``_sv_panels`` for a block of one query row, as MLAS's SGEMM hands it to its one-row kernel
    (``MlasSgemmKernelM1Avx``): keys in groups of 4, then 2, then 1; per group and output the products (each
    rounded) summed in key order, then added to ``acc``, which the first group replaces when ``first``."""
    m1_rowvec(sc[0, :rk], vc[b, kh, ir:ir + rk], acc[0], first)


@njit(**_OPTS)
def _sv_panels(sc, rq, vc, b, kh, ir, rk, first, acc, vbuf, pbuf, abuf):
    """``acc[:rq] (+)= sc[:rq] @ values [ir, ir + rk)`` as MLAS's SGEMM does with alpha 1: per pass over a slice
    of the block's keys (``sgemm_stride_k``) and output, a chain of multiply-adds from the slice's start, stored
    (the first pass when ``first``) or added to ``acc`` in one rounding; by the register tiles of ``_panels``, the
    value slice packed into ``vbuf``."""
    if rq == 1:
        _sv_one_row(sc, vc, b, kh, ir, rk, first, acc)
        return
    R4 = sc.shape[0]
    D = acc.shape[1]
    P = (D + PANEL - 1) // PANEL
    part = pbuf[:R4 * D].reshape((R4, D))
    sk = sgemm_stride_k(D, rk)
    for k0 in range(0, rk, sk):
        ck = min(sk, rk - k0)
        vp = vbuf[:P * ck * PANEL].reshape((P, ck, PANEL))
        pack_panels_into(vc[b, kh, ir + k0:ir + k0 + ck], vp)
        if ck == rk:
            a = sc
        else:
            a = abuf[:R4 * ck].reshape((R4, ck))
            a[:, :] = sc[:, k0:k0 + ck]
        for r in range(0, R4, 4):
            tile4(vp, a, part, r, 0, P)
        store = first and k0 == 0
        for i in range(rq):
            for d in range(D):
                acc[i, d] = part[i, d] if store else np.float32(part[i, d] + acc[i, d])


@njit(**_OPTS)
def _flash_task(q, kc, vc, b, h, kh, qs, rq, past, T, scale, kvb, out, bufs, window, bias, has_bias, kb):
    """One (entry, head, query block) of the flash kernel: writes out[b, qs:qs + rq, h]."""
    D = q.shape[3]
    qbuf, scbuf, acc, part, m, l, kp, vp, abuf, qpart = bufs
    R4 = qbuf.shape[0]
    for i in range(R4):
        for d in range(D):
            qbuf[i, d] = q[b, qs + i, h, d] if i < rq else _ZERO
    for i in range(rq):
        m[i] = LOWEST
        l[i] = _ZERO
        for d in range(D):
            acc[i, d] = _ZERO
    limit = past + qs + rq
    ir = 0
    while ir < T and ir < limit:
        rk = min(kvb, T - ir)
        sc = _qk_panels(qbuf, rq, kc, b, kh, ir, rk, scale, kp, scbuf, abuf, qpart)
        for i in range(rq):
            causal = past + qs + i + 1
            start = causal - window if 0 <= window < causal else 0  # a local window's first key
            row = sc[i]
            if has_bias:  # the additive bias, after the scale, before the masks
                brow = bias[_bi(bias, 0, b), _bi(bias, 1, h), _bi(bias, 2, qs + i)]
                for j in range(rk):
                    row[j] = np.float32(row[j] + brow[kb + ir + j])
            for j in range(rk):
                if ir + j >= causal or ir + j < start:
                    row[j] = LOWEST
            rmax = row[0]
            for j in range(1, rk):
                if row[j] > rmax:
                    rmax = row[j]
            if rmax == LOWEST:
                for j in range(rk):
                    row[j] = _ZERO
                continue
            m_old = m[i]
            if rmax > m[i]:
                m[i] = rmax
            rs = sum_exp(row, rk, -m[i])
            if ir != 0:
                ed = math.exp(np.float32(m_old - m[i]))
                l[i] = np.float32(np.float32(ed * l[i]) + rs)
                for d in range(D):
                    acc[i, d] = np.float32(acc[i, d] * ed)
            else:
                l[i] = rs
        _sv_panels(sc, rq, vc, b, kh, ir, rk, ir == 0, acc, vp, part, abuf)
        ir += kvb
    for i in range(rq):
        inv = np.float32(_ONE / l[i]) if l[i] > _ZERO else _ZERO
        for d in range(D):
            out[b, qs + i, h, d] = np.float32(acc[i, d] * inv)


@njit(cache=True, nogil=True, inline="always")
def _dot8(q, b, h, krow):
    """q[b, 0, h] . krow in MLAS's one-row order: eight lanes over the head dimension (``lane += q * k``, each
    product and sum rounded), folded ``((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))``, the tail past a multiple of eight
    added in order."""
    D = krow.shape[0]
    D8 = D - D % 8
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = _ZERO
    for d in range(0, D8, 8):
        a0 += np.float32(q[b, 0, h, d] * krow[d])
        a1 += np.float32(q[b, 0, h, d + 1] * krow[d + 1])
        a2 += np.float32(q[b, 0, h, d + 2] * krow[d + 2])
        a3 += np.float32(q[b, 0, h, d + 3] * krow[d + 3])
        a4 += np.float32(q[b, 0, h, d + 4] * krow[d + 4])
        a5 += np.float32(q[b, 0, h, d + 5] * krow[d + 5])
        a6 += np.float32(q[b, 0, h, d + 6] * krow[d + 6])
        a7 += np.float32(q[b, 0, h, d + 7] * krow[d + 7])
    s = np.float32(np.float32((a0 + a1) + (a2 + a3)) + np.float32((a4 + a5) + (a6 + a7)))
    for d in range(D8, D):
        s = np.float32(s + np.float32(q[b, 0, h, d] * krow[d]))
    return s


@njit(**_OPTS)
def _decode_scores(q, b, h, kc, kh, lo, n, scale, sc):
    """sc[:n] = scale * q[b, 0, h] . keys [lo, lo + n) in MLAS's decode order (eight lanes, no fused ops)."""
    for t in range(n):
        krow = kc[b, kh, lo + t]
        sc[t] = np.float32(_dot8(q, b, h, krow) * scale)


@njit(**_OPTS)
def _decode_sv(sc, n, vc, b, kh, lo, o):
    """o = sum over keys [lo, lo + n) of sc[t] * v[t], in key order, separately rounded."""
    D = o.shape[0]
    for d in range(D):
        o[d] = _ZERO
    for t in range(n):
        w = sc[t]
        vrow = vc[b, kh, lo + t]
        for d in range(D):
            o[d] = np.float32(o[d] + np.float32(w * vrow[d]))


@njit(**_OPTS)
def _decode_heads(q, kc, vc, b, kh, h0, h1, lo, T, scale, out, sc, o, bias, has_bias, kb):
    """Query heads [h0, h1) of kv head ``kh`` in MLAS's one-row kernel's order (per head: ``_decode_scores``, keys
    before ``lo`` (a local window's first) set to ``-FLT_MAX``, the max, ``sum_exp``, ``_decode_sv``, times
    ``1 / sum``), each key and value row read once for all of them: sc (heads, T) and o (heads, D) are scratch."""
    D = q.shape[3]
    for t in range(T):
        krow = kc[b, kh, t]
        for g in range(h1 - h0):
            x = np.float32(_dot8(q, b, h0 + g, krow) * scale)
            if has_bias:
                x = np.float32(x + bias[_bi(bias, 0, b), _bi(bias, 1, h0 + g), 0, kb + t])
            sc[g, t] = x if t >= lo else LOWEST
    sums = np.empty(h1 - h0, np.float32)
    for g in range(h1 - h0):
        row = sc[g]
        mx = row[0]
        for t in range(1, T):
            if row[t] > mx:
                mx = row[t]
        sums[g] = sum_exp(row, T, -mx)
        for d in range(D):
            o[g, d] = _ZERO
    for t in range(T):
        vrow = vc[b, kh, t]
        for g in range(h1 - h0):
            w = sc[g, t]
            for d in range(D):
                o[g, d] = np.float32(o[g, d] + np.float32(w * vrow[d]))
    for g in range(h1 - h0):
        inv = np.float32(_ONE / sums[g]) if sums[g] > _ZERO else _ZERO
        for d in range(D):
            out[b, 0, h0 + g, d] = np.float32(o[g, d] * inv)


@njit(**_OPTS)
def _split_task(q, kc, vc, b, h, kh, lo, T, scale, kvb, out, sc, o, parts, bias, has_bias, kb):
    """One (entry, head) of flash decoding: per key block (m, l, e @ v), keys before ``lo`` (a local window's
    first) set to ``-FLT_MAX`` and a block of such keys only left out, merged in block order."""
    D = q.shape[3]
    nc = (T + kvb - 1) // kvb
    for c in range(nc):
        ir = c * kvb
        rk = min(kvb, T - ir)
        _decode_scores(q, b, h, kc, kh, ir, rk, scale, sc)
        if has_bias:
            brow = bias[_bi(bias, 0, b), _bi(bias, 1, h), 0]
            for t in range(rk):
                sc[t] = np.float32(sc[t] + brow[kb + ir + t])
        for t in range(min(rk, lo - ir)):
            sc[t] = LOWEST
        mx = sc[0]
        for t in range(1, rk):
            if sc[t] > mx:
                mx = sc[t]
        if mx == LOWEST:
            parts[c, 0] = LOWEST
            parts[c, 1] = _ZERO
            continue
        parts[c, 0] = mx
        parts[c, 1] = sum_exp(sc, rk, -mx)
        _decode_sv(sc, rk, vc, b, kh, ir, o)
        for d in range(D):
            parts[c, 2 + d] = o[d]
    gm = LOWEST
    for c in range(nc):
        if parts[c, 0] > gm:
            gm = parts[c, 0]
    gl = _ZERO
    for d in range(D):
        o[d] = _ZERO
    for c in range(nc):
        if parts[c, 1] <= _ZERO:
            continue
        r = math.exp(np.float32(parts[c, 0] - gm))
        gl = np.float32(gl + np.float32(r * parts[c, 1]))
        for d in range(D):
            o[d] = np.float32(o[d] + np.float32(r * parts[c, 2 + d]))
    inv = np.float32(_ONE / gl) if gl > _ZERO else _ZERO
    for d in range(D):
        out[b, 0, h, d] = np.float32(o[d] * inv)


@njit(cache=True, nogil=True, inline="always")
def _task(r, q, kc, vc, past_b, totals, scale, kvb0, split, nq, out, window, bias, has_bias, kbase):
    """Task ``r`` of ``attend_mlas``: a one-row step's (entry, head) of flash decoding (``split`` > 0, its key
    block) or (entry, kv head, share ``nq`` of its query heads), or several rows' (entry, head, query block of
    ``nq``); allocates its own scratch."""
    B, S, H, D = q.shape
    group = H // kc.shape[1]
    if S == 1:
        if split > 0:
            b = r // H
            h = r % H
            T = totals[b]
            sc = np.empty(max(T, 1), np.float32)
            o = np.empty(D, np.float32)
            parts = np.empty(((T + split - 1) // split, 2 + D), np.float32)
            _split_task(q, kc, vc, b, h, h // group, T - window if 0 <= window < T else 0, T, scale, split, out,
                        sc, o, parts, bias, has_bias, kbase[b])
            return
        kvH = kc.shape[1]
        b = r // (kvH * nq)
        kh = (r // nq) % kvH
        sub = r % nq
        h0 = kh * group + sub * group // nq
        h1 = kh * group + (sub + 1) * group // nq
        T = totals[b]
        if T <= 0:
            for h in range(h0, h1):
                for d in range(D):
                    out[b, 0, h, d] = _ZERO
            return
        lo = T - window if 0 <= window < T else 0
        _decode_heads(q, kc, vc, b, kh, h0, h1, lo, T, scale, out, np.empty((h1 - h0, T), np.float32),
                      np.empty((h1 - h0, D), np.float32), bias, has_bias, kbase[b])
        return
    b = r // (H * nq)
    h = (r // nq) % H
    qi = r % nq
    T = totals[b]
    kvb = min(kvb0, max(T, 1))
    qb = min(min(kvb0, 2 * D), S)
    R4 = (qb + 3) // 4 * 4
    qs = qi * qb
    rq = min(qb, S - qs)
    bufs = (np.empty((R4, D), np.float32), np.empty(R4 * kvb, np.float32), np.empty((rq, D), np.float32),
            np.empty(R4 * D, np.float32), np.empty(rq, np.float32), np.empty(rq, np.float32),
            np.empty((kvb + PANEL - 1) // PANEL * D * PANEL, np.float32),
            np.empty((D + PANEL - 1) // PANEL * kvb * PANEL, np.float32), np.empty(R4 * max(D, kvb), np.float32),
            np.empty(R4 * kvb, np.float32))
    _flash_task(q, kc, vc, b, h, h // group, qs, rq, past_b[b], T, scale, kvb, out, bufs, window, bias,
                has_bias, kbase[b])


@njit(cache=True, nogil=True, parallel=True)
def attend_mlas(q, kc, vc, past_b, totals, scale, l2, threads, out, window, bias, has_bias, kbase):
    """Causal attention of q (B, S, H, D) over the caches kc/vc (B, kvH, L, D) (entry b's keys at rows
    [0, totals[b]), its new rows from ``past_b[b]``, row j at absolute position ``j + kbase[b]``, which indexes the
    bias's columns) into out (B, S, H, D), in onnxruntime's flash order; ``threads``: onnxruntime's thread count
    (it decides flash decoding).  One parallel loop over the tasks, ``_task`` inlined into it: every compiled
    level above the flash kernels optimizes and emits them again when it links them, so two levels fewer (the
    task, and a wrapper around the loop) took 4 s off the 24-layer package's first start (GroupQueryAttention's
    compile, 33-34 s before, 29-30 s after)."""
    B, S, H, D = q.shape
    kvb0 = kv_block(D, l2)
    split = np.int64(0)
    if S == 1:
        tmax = 1
        ragged = False
        for b in range(B):
            tmax = max(tmax, totals[b])
            if totals[b] != totals[0]:
                ragged = True
        kvb = min(kvb0, tmax)
        if (not ragged) and B * H < threads and (tmax + kvb - 1) // kvb > 1:
            split = np.int64(kvb)
            n, nq = B * H, np.int64(1)
        else:
            # one task per (entry, kv head, share of its query heads): every key row read once per share, shares
            # enough for the threads (onnxruntime's count: the physical cores, as a rule the pool's too)
            kvH = kc.shape[1]
            group = H // kvH
            nq = np.int64(min(group, max(1, -(-threads // (B * kvH)))))
            n = B * kvH * nq
    else:
        qb = min(min(kvb0, 2 * D), S)
        nq = np.int64((S + qb - 1) // qb)
        n = B * H * nq
    for r in prange(n):
        _task(np.int64(r), q, kc, vc, past_b, totals, scale, kvb0, split, nq, out, window, bias, has_bias, kbase)


@njit(**_OPTS)
def _probs_task(r, q, kc, vc, past_b, att_total, kbase, scale, softcap, window, bias, has_bias, sink, sink_mode,
                qk, qk_mode, out):
    """One (entry, head) of ``attend_probs_mlas``: the scores of all its query rows, each row's masks, softcap,
    bias and softmax, then the value product; allocates its own scratch."""
    B, S, H, D = q.shape
    group = H // kc.shape[1]
    b = r // H
    h = r % H
    kh = h // group
    T = att_total[b]
    R4 = (S + 3) // 4 * 4
    qbuf = np.zeros((R4, D), np.float32)
    for i in range(S):
        for d in range(D):
            qbuf[i, d] = q[b, i, h, d]
    kbuf = np.empty((T + PANEL - 1) // PANEL * D * PANEL, np.float32)
    scbuf = np.empty(R4 * T, np.float32)
    sk = sgemm_stride_k(T, D)
    abuf = np.empty(R4 * max(min(sk, D), min(sgemm_stride_k(D, T), T)), np.float32)
    pbuf = np.empty(R4 * max(T, D), np.float32)
    if S == 1 and scale == _ONE:  # MLAS's SGEMM takes its one-row path for one row at alpha 1
        sc = scbuf[:R4 * T].reshape((R4, T))
        _qk_one_row_alpha1(q, b, h, kc, kh, T, sc[0])
    else:
        # np.int64(0), not a literal 0: the flash kernels' compile of these two serves here too
        sc = _qk_panels(qbuf, S, kc, b, kh, np.int64(0), T, scale, kbuf, scbuf, abuf, pbuf)
    sk_v = sink[h] if sink_mode == 2 else _ZERO
    for i in range(S):
        row = sc[i]
        eff = min(past_b[b] + i + 1, T)
        lo = eff - window if 0 <= window < eff else 0
        for j in range(lo):
            row[j] = _ZERO
        if softcap > _ZERO:
            for j in range(lo, eff):
                row[j] = np.float32(math.tanh(np.float32(row[j] / softcap)) * softcap)
        if has_bias:
            brow = bias[_bi(bias, 0, b), _bi(bias, 1, h), _bi(bias, 2, i)]
            for j in range(lo, eff):
                row[j] = np.float32(row[j] + brow[j + kbase[b]])
        for j in range(eff, T):
            row[j] = _ZERO
        if qk_mode == 1:
            for j in range(T):
                qk[b, h, i, j + kbase[b]] = row[j]
        mx = row[lo]
        for j in range(lo + 1, eff):
            if row[j] > mx:
                mx = row[j]
        if sink_mode > 0 and sk_v > mx:
            mx = sk_v
        win = row[lo:eff]
        tot = sum_exp(win, eff - lo, -mx)
        if sink_mode > 0:
            tot = np.float32(tot + math.exp(np.float32(sk_v + -mx)))  # libm's expf
        inv = np.float32(_ONE / tot)
        for j in range(lo, eff):
            row[j] = np.float32(row[j] * inv)
        if qk_mode == 2:
            for j in range(T):
                qk[b, h, i, j + kbase[b]] = row[j]
    acc = np.empty((S, D), np.float32)
    vbuf = np.empty((D + PANEL - 1) // PANEL * min(sgemm_stride_k(D, T), T) * PANEL, np.float32)
    _sv_panels(sc, S, vc, b, kh, np.int64(0), T, True, acc, vbuf, pbuf, abuf)
    for i in range(S):
        for d in range(D):
            out[b, i, h, d] = acc[i, d]


@njit(cache=True, nogil=True, parallel=True)
def _probs_tasks(q, kc, vc, past_b, att_total, kbase, scale, softcap, window, bias, has_bias, sink, sink_mode, qk,
                 qk_mode, out):
    B, S, H, D = q.shape
    for r in prange(B * H):
        _probs_task(np.int64(r), q, kc, vc, past_b, att_total, kbase, scale, softcap, window, bias, has_bias, sink,
                    sink_mode, qk, qk_mode, out)


@njit(**_OPTS)
def attend_probs_mlas(q, kc, vc, past_b, att_total, kbase, scale, softcap, window, bias, has_bias, sink, sink_mode,
                      qk, qk_mode, out):
    """Attention of q (B, S, H, D) over the caches kc/vc (B, kvH, L, D) (entry b's keys at rows
    [0, att_total[b]), its new rows from ``past_b[b]``, row j at absolute position ``j + kbase[b]``) into out
    (B, S, H, D), in the order of onnxruntime's CPU kernel where it does not run its flash kernels
    (``GQAAttentionBase::ComputeAttentionProbs`` and ``ComputeVxAttentionScore``): per (entry, head) the scores of
    every query row against keys [0, T) by MLAS's SGEMM (``_qk_panels``: chains over the head dimension, times
    scale; one query row at scale exactly 1, its one-row transposed kernel, ``_qk_one_row_alpha1``); per row,
    keys before its local window and past its causal limit set to 0, over the window ``softcap * tanhf(x / softcap)`` (each step rounded), the bias added, the ``qk`` output taken (``qk_mode`` 1),
    then MLAS's softmax: the maximum (raised to the sink with ``sink_mode`` > 0: 1 smooth softmax, sink 0; 2 the
    head's sink), ``sum_exp``, plus ``expf(sink - max)`` with a sink, each times ``1 / sum``; then the
    probabilities over all T keys, zeros included, times the values by MLAS's SGEMM with alpha 1 (``_sv_panels``:
    its one-row kernel for one query row)."""
    _probs_tasks(q, kc, vc, past_b, att_total, kbase, scale, softcap, window, bias, has_bias, sink, sink_mode, qk,
                 qk_mode, out)
