"""Prefill attention as two blocked products: many query rows against the cached keys and values.

Used by GroupQueryAttention and MultiHeadAttention (``contrib_attention.gqa_prefill``).
``attend_blocked`` takes the arguments of ``contrib_attention._gqa_prefill_kernel`` (which it matches in
semantics, not in bits) without the ``qk`` output.  Per (batch, kv head) the keys are packed once as
column panels of K transposed (``kt[p, d, c]`` = key ``16p + c``, dimension ``d``) and the values as panels of V
(``vp[p, j, c]`` = key ``j``, value column ``16p + c``), so both products are the panel products of
``_panels.blocked_cols``.  The query rows of a kv head's group are taken ``QROWS`` at a time in position-major
order (row ``s * group + g`` is position ``s`` of head ``kh * group + g``), one task each: the scores of those
rows against the keys any of them may see, the scaled, capped, biased, masked softmax row by row, then the
probabilities times V.  The causal and window limits bound each task's key range, so a causal prefill does
about half the work of a full one.

Each row's softmax is the kernel's: the maximum over its keys ``[lo, hi)`` (and the sink, with
``sink_mode``), exponentials of the differences, their sum and its reciprocal; keys of the task's range that
lie outside a row's get probability 0.  A row with no key in range yields zeros.

Invariants: reads ``q``, ``pk``/``pv`` rows below ``total_b[b]`` and ``bias``; writes only ``out``.  Callers
guarantee D and Dv are multiples of 16 (``usable``).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ._fastmath import fexp
from ._panels import PANEL, blocked_cols
from ._simd import AVX512

__all__ = ["QROWS", "usable", "key_range", "normalize", "attend_blocked"]

QROWS = 64  # query rows per task


@njit(cache=True, nogil=True)
def usable(D, Dv, qk_mode):
    """The blocked form applies: no score output wanted, head sizes whole panels, a host with AVX-512 (whose
    sixteen 16-float accumulators the panel tiles are written for)."""
    return AVX512 and qk_mode == 0 and D % PANEL == 0 and Dv % PANEL == 0


@njit(cache=True, nogil=True, inline="always")
def key_range(p, T, causal, window):
    """The keys ``[lo, hi)`` that the query at position ``p`` sees among ``T``: at most ``p + 1`` when causal, the
    last ``window`` of them when a window is set (the query's own key counted), empty when the two cross."""
    hi = T
    if causal and p + 1 < hi:
        hi = p + 1
    lo = 0
    if window > 0 and p + 1 - window > 0:
        lo = p + 1 - window
    if hi < lo:
        hi = lo
    return lo, hi


@njit(cache=True, nogil=True, inline="always", fastmath={"reassoc", "contract"})
def normalize(x, m, sink_mode, sk):
    """Scores ``x`` (1-d, their maximum ``m``) into probabilities in place: the exponentials of the differences
    over their sum, the sink ``sk`` taking part in the maximum and the sum when ``sink_mode`` > 0; all zeros when
    no score is finite."""
    if sink_mode > 0 and sk > m:
        m = sk
    tot = np.float32(0.0)
    if sink_mode > 0:
        tot = math.exp(sk - m)
    n = x.shape[0]
    if m == -np.inf:
        for j in range(n):
            x[j] = 0.0
    else:
        for j in range(n):
            e = fexp(x[j] - m)
            x[j] = e
            tot += e
    inv = np.float32(0.0) if tot == 0 else np.float32(1.0) / tot
    for j in range(n):
        x[j] *= inv


@njit(cache=True, nogil=True)
def _pack(pk, pv, b, kh, T, kt, vp):
    """Keys and values of (b, kh), rows [0, T), into the panels ``kt`` (Pk, D, 16) and ``vp`` (Dv/16, Lp, 16);
    the padding past T is zeros."""
    D = pk.shape[3]
    Dv = pv.shape[3]
    Lp = kt.shape[0] * PANEL
    for p in range(kt.shape[0]):
        for c in range(PANEL):
            j = p * PANEL + c
            if j < T:
                for d in range(D):
                    kt[p, d, c] = pk[b, kh, j, d]
            else:
                for d in range(D):
                    kt[p, d, c] = 0.0
    for j in range(Lp):
        for p in range(Dv // PANEL):
            for c in range(PANEL):
                vp[p, j, c] = pv[b, kh, j, p * PANEL + c] if j < T else 0.0


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _softmax_rows(sc, r0, R, group, kh, b, past, T, klo, khi, params, causal, window, bias, has_bias, kb,
                  sink, sink_mode):
    """Scores ``sc[i, klo:khi]`` of rows r0 + i into probabilities in place (zeros outside each row's keys)."""
    mb, mh, mq, _ = bias.shape
    scale = params[0]
    softcap = params[1]
    for i in range(R):
        r = r0 + i
        s = r // group
        h = kh * group + r % group
        lo, hi = key_range(past + s, T, causal, window)
        row = sc[i]
        m = -np.inf
        for j in range(lo, hi):
            x = row[j] * scale
            if softcap > 0:
                x = softcap * math.tanh(x / softcap)
            if has_bias:
                x += bias[b if mb > 1 else 0, h if mh > 1 else 0, s if mq > 1 else 0, j + kb]
            row[j] = x
            if x > m:
                m = x
        for j in range(klo, lo):
            row[j] = 0.0
        for j in range(hi, khi):
            row[j] = 0.0
        normalize(row[lo:hi], m, sink_mode, sink[h] if sink_mode == 2 else np.float32(0.0))


@njit(cache=True, nogil=True, parallel=True)
def attend_blocked(q, pk, pv, past_b, total_b, kbase, params, causal, window, bias, has_bias, sink, sink_mode,
                   out):
    """q (B,S,H,D), pk/pv (B,kvH,L,D|Dv) -> out (B,S,H,Dv); arguments as ``_gqa_prefill_kernel``'s."""
    B, S, H, D = q.shape
    kvH = pk.shape[1]
    Dv = pv.shape[3]
    group = H // kvH
    Tmax = 0
    for b in range(B):
        Tmax = max(Tmax, total_b[b])
    Pk = max(1, (Tmax + PANEL - 1) // PANEL)
    Lp = Pk * PANEL
    kt = np.empty((B * kvH, Pk, D, PANEL), np.float32)
    vp = np.empty((B * kvH, Dv // PANEL, Lp, PANEL), np.float32)
    for t in prange(B * kvH):
        _pack(pk, pv, t // kvH, t % kvH, total_b[t // kvH], kt[t], vp[t])
    rows = group * S
    nblk = (rows + QROWS - 1) // QROWS
    for t in prange(B * kvH * nblk):
        _task(np.int64(t), nblk, q, pk, pv, past_b, total_b, kbase, params, causal, window, bias, has_bias, sink,
              sink_mode, kt, vp, out)  # t as int64: one compile of _task whichever type the parfor gives t


@njit(cache=True, nogil=True)
def _task(t, nblk, q, pk, pv, past_b, total_b, kbase, params, causal, window, bias, has_bias, sink, sink_mode, kt,
          vp, out):
    """Task ``t`` of ``attend_blocked``: QROWS query rows of one (batch, kv head) group."""
    S, H, D = q.shape[1], q.shape[2], q.shape[3]
    kvH = pk.shape[1]
    Dv = pv.shape[3]
    group = H // kvH
    rows = group * S
    Lp = kt.shape[1] * PANEL
    bk = t // nblk
    b = bk // kvH
    kh = bk % kvH
    r0 = (t % nblk) * QROWS
    R = min(QROWS, rows - r0)
    past = past_b[b]
    T = total_b[b]
    s0 = r0 // group
    s1 = (r0 + R - 1) // group
    klo = key_range(past + s0, T, causal, window)[0]  # the task's first row starts its keys,
    khi = max(klo, key_range(past + s1, T, causal, window)[1])  # its last row ends them
    p0 = klo // PANEL
    p1 = (khi + PANEL - 1) // PANEL
    qa = np.empty((R, D), np.float32)
    for i in range(R):
        r = r0 + i
        h = kh * group + r % group
        for d in range(D):
            qa[i, d] = q[b, r // group, h, d]
    sc = np.empty((R, Lp), np.float32)
    o = np.empty((R, Dv), np.float32)
    if p1 > p0:
        blocked_cols(qa, kt[bk], sc, p0, p1, np.int64(0), D, True)  # no literal: one compile for both calls
        _softmax_rows(sc, r0, R, group, kh, b, past, T, klo, khi, params, causal, window, bias, has_bias,
                      kbase[b], sink, sink_mode)
        blocked_cols(sc, vp[bk], o, np.int64(0), Dv // PANEL, klo, khi, True)
    else:
        for i in range(R):  # no key in range for any row: zeros, as the row kernel gives
            for d in range(Dv):
                o[i, d] = 0.0
    for i in range(R):
        r = r0 + i
        h = kh * group + r % group
        for d in range(Dv):
            out[b, r // group, h, d] = o[i, d]
