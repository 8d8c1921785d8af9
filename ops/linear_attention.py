"""LinearAttention, written once for the default domain (opset 27) and com.microsoft (which adds "inverse GQA":
``kv_num_heads > q_num_heads``, query and key carry ``q_num_heads`` heads, value and the state
``kv_num_heads``, and state head ``g`` reads query/key head ``g // (kv_num_heads // q_num_heads)``, one output
per KV head): its binds, its checks and messages, its typed driver, its CPU wrapper and region form (the CUDA
launch in ``ops/cuda/contrib_recurrent.py`` shares the binds and the checks).

Invariants:
- the recurrence runs token by token exactly as the spec states it (the ``chunk_size`` hint does not change
  results); the state is float32 inside and is cast to ``past_state``'s dtype (or the query's when no past is
  given) on output; query head ``h`` reads KV head ``h // (q_num_heads // kv_num_heads)``;
- only ``state_window = 0`` (the 4-d state) is supported (``InvalidAttributeError``);
- in onnxruntime's order (``_common.mlas_order``, read when the node is bound) the recurrence runs
  ``linear_attention_mlas``: onnxruntime's LinearAttention bit for bit (the order is written out above it).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, mlas_order, raise_coded
from ._mlas_sgemm import m1_rowvec
from ._la_pass import PANEL as LA_PANEL, state_rows, update_rows
from ._simd import AVX512F, fma32
from .forms import Decline, float_only, raise_on, form
from .registry import op

__all__ = ["LinAttn", "bind_linear_attention", "bind_linear_attention_ms", "la_inputs", "la_geometry",
           "linattn_f32", "LA_ERRORS", "RULES", "linear_attention_kernel"]

MS = "com.microsoft"
_OPTS = dict(cache=True, nogil=True, error_model="numpy")
RULES = {"linear": (False, False), "gated": (True, False), "delta": (False, True), "gated_delta": (True, True)}
MLAS_PORTABLE = 1  # onnxruntime's order, its portable kernel (``linear_attention_mlas``)
MLAS_FUSED = 2     # onnxruntime's order, its AVX-512 kernel where the head geometry takes it


class LinAttn(NamedTuple):
    """A LinearAttention node bound at plan time."""

    Hq: int               # q_num_heads
    Hkv: int              # kv_num_heads (> Hq: com.microsoft's inverse GQA)
    scale: float          # 0: 1 / sqrt(head size)
    rule: str
    gating: bool          # the update rule reads decay
    delta: bool           # the update rule reads beta
    mlas: int = 0         # 0 the default order, else onnxruntime's (``mlas_kind``)


def mlas_kind() -> int:
    """The order a node planned now runs in: 0 the default, ``MLAS_FUSED`` in onnxruntime's on hosts where it
    takes MLAS's AVX-512 kernel, ``MLAS_PORTABLE`` in onnxruntime's elsewhere."""
    if not mlas_order():
        return 0
    return MLAS_FUSED if AVX512F else MLAS_PORTABLE


def _rule(update_rule) -> tuple:
    rule = update_rule.decode() if isinstance(update_rule, bytes) else str(update_rule)
    if rule not in RULES:
        raise InvalidAttributeError(f"LinearAttention: update_rule must be one of {sorted(RULES)}, got {rule!r}")
    return (rule,) + RULES[rule]


def bind_linear_attention(ctx, chunk_size=64, kv_num_heads=None, q_num_heads=None, scale=0.0,
                          update_rule="gated_delta") -> LinAttn:
    if not q_num_heads or not kv_num_heads or q_num_heads <= 0 or kv_num_heads <= 0 or q_num_heads % kv_num_heads:
        raise InvalidAttributeError(f"LinearAttention: q_num_heads ({q_num_heads}) must be a positive multiple of "
                                    f"kv_num_heads ({kv_num_heads})")
    return LinAttn(int(q_num_heads), int(kv_num_heads), float(scale), *_rule(update_rule), mlas_kind())


def bind_linear_attention_ms(ctx, chunk_size=64, kv_num_heads=None, q_num_heads=None, scale=0.0,
                             update_rule="gated_delta", state_window=0) -> LinAttn:
    if state_window:
        raise InvalidAttributeError(f"LinearAttention (com.microsoft): state_window={state_window} is not supported "
                                    f"(only 0, the 4-d state)")
    if not q_num_heads or not kv_num_heads or q_num_heads <= 0 or kv_num_heads <= 0:
        raise InvalidAttributeError(f"LinearAttention: q_num_heads ({q_num_heads}) and kv_num_heads "
                                    f"({kv_num_heads}) must be positive")
    if kv_num_heads <= q_num_heads:
        return bind_linear_attention(ctx, chunk_size, kv_num_heads, q_num_heads, scale, update_rule)
    if kv_num_heads % q_num_heads:
        raise InvalidAttributeError(f"LinearAttention: kv_num_heads ({kv_num_heads}) must be a multiple of "
                                    f"q_num_heads ({q_num_heads}) for inverse grouped-query attention")
    return LinAttn(int(q_num_heads), int(kv_num_heads), float(scale), *_rule(update_rule), mlas_kind())


LA_ERRORS = {
    1: ("ShapeMismatchError", "query, key and value do not split into the heads (with kv_num_heads > "
                              "q_num_heads, key must have query's shape)"),
    2: ("ShapeMismatchError", "the key head size differs from the query head size"),
    3: ("ShapeMismatchError", "decay must be (B, T, kv_num_heads) or (B, T, kv_num_heads * head_size)"),
    4: ("ShapeMismatchError", "beta must be (B, T, kv_num_heads) or (B, T, 1)"),
    5: ("ShapeMismatchError", "past_state must be (B, kv_num_heads, dk, dv)"),
}


def la_inputs(b: LinAttn, query, key, value, past_state, decay, beta) -> None:
    """The checks on presence and rank that a form makes statically (host or device arrays)."""
    for flag, x, what in ((b.gating, decay, "decay"), (b.delta, beta, "beta")):
        if flag != (x is not None):
            raise InvalidArgumentError(f"LinearAttention: update_rule {b.rule!r} {'requires' if flag else 'forbids'} "
                                       f"the {what} input")
    for name, a in (("query", query), ("key", key), ("value", value), ("decay", decay), ("beta", beta)):
        if a is not None and a.ndim != 3:
            raise ShapeMismatchError(f"LinearAttention: {name} must be 3-d (B, T, ...), got {list(a.shape)}")
    if past_state is not None and past_state.ndim != 4:
        raise_coded(LA_ERRORS, 5, "LinearAttention", f", got {list(past_state.shape)}")


@njit(**_OPTS)
def la_geometry(qs, ks, vs, ds, has_decay, bs, has_beta, ps, has_past, Hq, Hkv):
    """``(error code, dk, dv, decay width per head, beta width, output heads)`` of one call (absent operands'
    shapes are not read)."""
    B, T, hq = qs
    if Hkv > Hq:
        if hq % Hq or ks[0] != B or ks[1] != T or ks[2] != hq:
            return 1, 0, 0, 0, 0, 0
        dk = hq // Hq
        Hout = Hkv
    else:
        if ks[0] != B or ks[1] != T or hq % Hq or ks[2] % Hkv:
            return 1, 0, 0, 0, 0, 0
        dk = hq // Hq
        if ks[2] // Hkv != dk:
            return 2, 0, 0, 0, 0, 0
        Hout = Hq
    if vs[0] != B or vs[1] != T or vs[2] % Hkv:
        return 1, 0, 0, 0, 0, 0
    dv = vs[2] // Hkv
    if has_decay and (ds[0] != B or ds[1] != T or (ds[2] != Hkv and ds[2] != Hkv * dk)):
        return 3, dk, dv, 0, 0, Hout
    if has_beta and (bs[0] != B or bs[1] != T or (bs[2] != Hkv and bs[2] != 1)):
        return 4, dk, dv, 0, 0, Hout
    if has_past and (ps[0] != B or ps[1] != Hkv or ps[2] != dk or ps[3] != dv):
        return 5, dk, dv, 0, 0, Hout
    return 0, dk, dv, ds[2] // Hkv if has_decay else 1, bs[2] if has_beta else 1, Hout


@njit(cache=True, nogil=True)
def linear_attention_kernel(q, k, v, decay, beta, state, out, gating, delta, scale):
    """q (B,T,Hq,dk), k (B,T,Hkv,dk), v (B,T,Hkv,dv), decay (B,T,Hkv,1|dk), beta (B,T,1|Hkv),
    state (B,Hkv,dk,dv) updated in place, out (B,T,Hq,dv).  Per token and head: two passes over the state's
    rows (decay and the delta rule's S^T k, then the rank-1 update and the queries' S^T q), each inner loop
    running along a contiguous row of dv."""
    B, T, Hq, dk = q.shape
    Hkv = k.shape[2]
    dv = v.shape[3]
    group = Hq // Hkv
    nd = decay.shape[3]
    nb = beta.shape[2]
    u = np.empty(dv, np.float32)
    r = np.empty(dv, np.float32)
    o = np.empty((group, dv), np.float32)
    for b in range(B):
        for g in range(Hkv):
            S = state[b, g]
            for t in range(T):
                for m in range(dv):
                    r[m] = 0.0
                if gating or delta:
                    for d in range(dk):
                        row = S[d]
                        if gating:
                            f = math.exp(decay[b, t, g, d if nd > 1 else 0])
                            for m in range(dv):
                                row[m] *= f
                        if delta:
                            kd = k[b, t, g, d]
                            for m in range(dv):
                                r[m] += row[m] * kd
                if delta:
                    bt = beta[b, t, g if nb > 1 else 0]
                    for m in range(dv):
                        u[m] = bt * (v[b, t, g, m] - r[m])
                else:
                    for m in range(dv):
                        u[m] = v[b, t, g, m]
                for j in range(group):
                    for m in range(dv):
                        o[j, m] = 0.0
                for d in range(dk):
                    row = S[d]
                    kd = k[b, t, g, d]
                    for m in range(dv):
                        row[m] += kd * u[m]
                    for j in range(group):
                        qd = q[b, t, g * group + j, d]
                        for m in range(dv):
                            o[j, m] += qd * row[m]
                for j in range(group):
                    for m in range(dv):
                        out[b, t, g * group + j, m] = scale * o[j, m]


# -- onnxruntime's order (``_common.mlas_order``), read from MLAS's linear-attention kernels and checked bit for bit
# against onnxruntime's LinearAttention on an AVX-512 host.  Per (batch, KV head) one of two kernels:
#
# - ``MLAS_FUSED`` (MLAS's AVX-512 kernel: x86 hosts with AVX-512, dk a multiple of 16 up to 256, dv a multiple of
#   32, 1, 2, 4 or 8 query heads per KV head): per token, with ``dec = expf(decay)`` (per key row or one per head),
#   ``q' = dec * q`` and ``k' = dec * k`` (rounded; q, k without decay); ``qk`` = q . k (raw) in 16 lanes of fused
#   chains over i = l (mod 16), folded by halves (8, 4, 2, 1); then over the OLD state, per column, fused chains
#   from 0 over the rows ``a = fma(q'[i], S[i], a)`` and (delta rules) ``r = fma(k'[i], S[i], r)``;
#   ``u = beta * (v - r)`` (or v); ``out = scale * fma(qk, u, a)``; then the state ``fma(dec[i], S, k[i] * u)``
#   with decay, ``fma(k[i], u, S)`` without;
# - ``MLAS_PORTABLE`` (every other shape or host): the default kernel's order (decay ``S * dec`` first, nothing
#   fused, the state ``S + k[i] * u``, the readout over the new state), except that from dk * dv = 4096 on the two
#   row-vector products (retrieval and readout) are MLAS's one-row SGEMM (``_mlas_sgemm.m1_rowvec``).
_M1_FROM = 4096  # the state size from which onnxruntime's portable kernel takes MLAS's SGEMM


@njit(cache=True, nogil=True)
def _mlas_scratch(group, dk, dv):
    """One task's scratch for ``_mlas_head``: (dec, wq, wk, qk, lanes, r, u, a, kt, dprev); the decayed key ``wk`` is the row
    after the group's decayed queries in ``wq``, and the retrieval ``r`` the row after their readouts in ``a``, so
    the fused pass takes them all in one call of ``_la_pass``."""
    wq = np.empty((group + 1, dk), np.float32)
    a = np.empty((group + 1, dv), np.float32)
    return (np.empty(dk, np.float32), wq, wq[group], np.empty(group, np.float32), np.empty(16, np.float32), a[group],
            np.empty(dv, np.float32), a, np.empty(dk, np.float32), np.empty(dk, np.float32))


_P1, _P2, _P3, _P4, _P5 = (state_rows(r) for r in range(1, 6))
_P6, _P7, _P8, _P9 = (state_rows(r) for r in range(6, 10))


@njit(cache=True, nogil=True)
def _state_pass(R, S, W, acc):
    """``acc[:R] = W[:R] @ S`` in MLAS's fused chains, 32 columns at a time (``ops/_la_pass``; dv a multiple of
    32 and R at most 9, as ``mlas_kind``'s fused kernel requires)."""
    for m0 in range(0, S.shape[1], LA_PANEL):
        if R == 1:
            _P1(S, W, acc, m0)
        elif R == 2:
            _P2(S, W, acc, m0)
        elif R == 3:
            _P3(S, W, acc, m0)
        elif R == 4:
            _P4(S, W, acc, m0)
        elif R == 5:
            _P5(S, W, acc, m0)
        elif R == 6:
            _P6(S, W, acc, m0)
        elif R == 7:
            _P7(S, W, acc, m0)
        elif R == 8:
            _P8(S, W, acc, m0)
        else:
            _P9(S, W, acc, m0)


_G = tuple(update_rows(r, True) for r in range(1, 10))
_U = tuple(update_rows(r, False) for r in range(1, 10))
_G1, _G2, _G3, _G4, _G5, _G6, _G7, _G8, _G9 = _G
_U1, _U2, _U3, _U4, _U5, _U6, _U7, _U8, _U9 = _U


@njit(cache=True, nogil=True)
def _update_pass(R, gating, S, W, acc, kt, dec, u):
    """``_la_pass.update_rows`` for R weight rows, 32 columns at a time (as ``_state_pass``)."""
    for m0 in range(0, S.shape[1], LA_PANEL):
        if gating:
            if R == 1:
                _G1(S, W, acc, m0, kt, dec, u)
            elif R == 2:
                _G2(S, W, acc, m0, kt, dec, u)
            elif R == 3:
                _G3(S, W, acc, m0, kt, dec, u)
            elif R == 4:
                _G4(S, W, acc, m0, kt, dec, u)
            elif R == 5:
                _G5(S, W, acc, m0, kt, dec, u)
            elif R == 6:
                _G6(S, W, acc, m0, kt, dec, u)
            elif R == 7:
                _G7(S, W, acc, m0, kt, dec, u)
            elif R == 8:
                _G8(S, W, acc, m0, kt, dec, u)
            else:
                _G9(S, W, acc, m0, kt, dec, u)
        elif R == 1:
            _U1(S, W, acc, m0, kt, dec, u)
        elif R == 2:
            _U2(S, W, acc, m0, kt, dec, u)
        elif R == 3:
            _U3(S, W, acc, m0, kt, dec, u)
        elif R == 4:
            _U4(S, W, acc, m0, kt, dec, u)
        elif R == 5:
            _U5(S, W, acc, m0, kt, dec, u)
        elif R == 6:
            _U6(S, W, acc, m0, kt, dec, u)
        elif R == 7:
            _U7(S, W, acc, m0, kt, dec, u)
        elif R == 8:
            _U8(S, W, acc, m0, kt, dec, u)
        else:
            _U9(S, W, acc, m0, kt, dec, u)


@njit(cache=True, nogil=True, inline="always")
def _fused_weights(q, k, decay, gating, b, t, g, group, scratch):
    """Token ``t``'s decay, decayed queries and key (``wq``, ``wk``) and the query-key dots (``qk``, MLAS's 16 lanes
    folded by halves)."""
    dec, wq, wk, qk, lanes, r, u, a, kt, dprev = scratch
    dk = q.shape[3]
    nd = decay.shape[3]
    if gating:
        for i in range(dk):
            dec[i] = math.exp(decay[b, t, g, i if nd > 1 else 0])
    for j in range(group):
        h = g * group + j
        for l in range(16):
            lanes[l] = 0.0
        for i0 in range(0, dk, 16):
            for l in range(16):
                lanes[l] = fma32(q[b, t, h, i0 + l], k[b, t, g, i0 + l], lanes[l])
        for w in (8, 4, 2, 1):
            for l in range(w):
                lanes[l] = np.float32(lanes[l] + lanes[l + w])
        qk[j] = lanes[0]
        for i in range(dk):
            wq[j, i] = np.float32(dec[i] * q[b, t, h, i]) if gating else q[b, t, h, i]
    for i in range(dk):
        wk[i] = np.float32(dec[i] * k[b, t, g, i]) if gating else k[b, t, g, i]


@njit(cache=True, nogil=True)
def _mlas_head_fused(q, k, v, decay, beta, state, out, gating, delta, scale, b, g, scratch):
    """``_mlas_head`` in MLAS's fused kernel (``MLAS_FUSED``).  Per token: ``q' = dec * q``, ``k' = dec * k``; one
    pass over the old state, fused chains from 0 for the readouts ``q' S`` and the retrieval ``k' S``; ``u = beta *
    (v - r)``, the output ``scale * fma(q . k, u, readout)``; the state becomes ``fma(dec, S, k * u)`` (without
    decay ``fma(k, u, S)``).  A token's update and the next token's pass run as one pass over the state
    (``_la_pass.update_rows``): each row is updated, then read by the next token's chains, which see exactly the
    rows a separate pass would."""
    T = q.shape[1]
    dv = v.shape[3]
    group = q.shape[2] // k.shape[2]
    nb = beta.shape[2]
    dec, wq, wk, qk, lanes, r, u, a, kt, dprev = scratch
    S = state[b, g]
    R = group + 1 if delta else group
    if T == 0:
        return
    _fused_weights(q, k, decay, gating, b, 0, g, group, scratch)
    _state_pass(R, S, wq, a)
    for t in range(T):
        bt = beta[b, t, g if nb > 1 else 0]
        for m in range(dv):
            u[m] = np.float32(bt * np.float32(v[b, t, g, m] - r[m])) if delta else v[b, t, g, m]
        for j in range(group):
            for m in range(dv):
                out[b, t, g * group + j, m] = np.float32(scale * fma32(qk[j], u[m], a[j, m]))
        kt[:] = k[b, t, g]
        dprev[:] = dec
        if t + 1 < T:  # this token's update, and the next token's pass over the rows it leaves
            _fused_weights(q, k, decay, gating, b, t + 1, g, group, scratch)
            _update_pass(R, gating, S, wq, a, kt, dprev, u)
        else:
            for i in range(S.shape[0]):  # the last token's update
                row = S[i]
                ki = kt[i]
                if gating:
                    di = dprev[i]
                    for m in range(dv):
                        row[m] = fma32(di, row[m], np.float32(ki * u[m]))
                else:
                    for m in range(dv):
                        row[m] = fma32(ki, u[m], row[m])



@njit(cache=True, nogil=True)
def _mlas_head(q, k, v, decay, beta, state, out, gating, delta, scale, fused, b, g, scratch):
    """``linear_attention_mlas`` for the KV head ``g`` of batch row ``b`` (its state and output heads only)."""
    T, dk = q.shape[1], q.shape[3]
    dv = v.shape[3]
    group = q.shape[2] // k.shape[2]
    nd = decay.shape[3]
    nb = beta.shape[2]
    m1 = dk * dv >= _M1_FROM
    if fused:
        _mlas_head_fused(q, k, v, decay, beta, state, out, gating, delta, scale, b, g, scratch)
        return
    dec, wq, wk, qk, lanes, r, u, a, kt, dprev = scratch  # each read only after this head writes it
    S = state[b, g]
    for t in range(T):
        if gating:
            for i in range(dk):
                dec[i] = math.exp(decay[b, t, g, i if nd > 1 else 0])
        bt = beta[b, t, g if nb > 1 else 0]
        if gating:
            for i in range(dk):
                di = dec[i]
                row = S[i]
                for m in range(dv):
                    row[m] = np.float32(row[m] * di)
        if delta:
            if m1:
                m1_rowvec(k[b, t, g], S, r, True)
            else:
                for m in range(dv):
                    r[m] = 0.0
                for i in range(dk):
                    ki = k[b, t, g, i]
                    row = S[i]
                    for m in range(dv):
                        r[m] = np.float32(r[m] + np.float32(row[m] * ki))
        for m in range(dv):
            u[m] = np.float32(bt * np.float32(v[b, t, g, m] - r[m])) if delta else v[b, t, g, m]
        for i in range(dk):
            ki = k[b, t, g, i]
            row = S[i]
            for m in range(dv):
                row[m] = np.float32(row[m] + np.float32(ki * u[m]))
        for j in range(group):
            h = g * group + j
            if m1:
                m1_rowvec(q[b, t, h], S, a[j], True)
            else:
                for m in range(dv):
                    a[j, m] = 0.0
                for i in range(dk):
                    qi = q[b, t, h, i]
                    row = S[i]
                    for m in range(dv):
                        a[j, m] = np.float32(a[j, m] + np.float32(qi * row[m]))
            for m in range(dv):
                out[b, t, h, m] = np.float32(scale * a[j, m])


_PAR_ELEMS = 1 << 16  # state elements times tokens from which the heads run in parallel
_HEADS_PER_TASK = 4   # (batch, KV head) pairs per parallel task (one scratch allocation per task)


@njit(cache=True, nogil=True, parallel=True)
def _mlas_heads_par(q, k, v, decay, beta, state, out, gating, delta, scale, fused):
    """The (batch, KV head) pairs in tasks of ``_HEADS_PER_TASK``, each task with its own scratch."""
    Hkv = k.shape[2]
    n = q.shape[0] * Hkv
    for c in prange((n + _HEADS_PER_TASK - 1) // _HEADS_PER_TASK):
        scratch = _mlas_scratch(q.shape[2] // Hkv, q.shape[3], v.shape[3])
        for bg in range(c * _HEADS_PER_TASK, min(n, (c + 1) * _HEADS_PER_TASK)):
            _mlas_head(q, k, v, decay, beta, state, out, gating, delta, scale, fused, bg // Hkv, bg % Hkv, scratch)


@njit(cache=True, nogil=True)
def linear_attention_mlas(q, k, v, decay, beta, state, out, gating, delta, scale, fused):
    """``linear_attention_kernel`` in onnxruntime's order (``MLAS_FUSED`` with ``fused``, else ``MLAS_PORTABLE``;
    see above); the same operands.  The (batch, KV head) pairs are independent: in parallel from ``_PAR_ELEMS``."""
    B, T = q.shape[0], q.shape[1]
    Hkv = k.shape[2]
    if B * Hkv > 1 and state[0, 0].size * T * B * Hkv >= _PAR_ELEMS:
        _mlas_heads_par(q, k, v, decay, beta, state, out, gating, delta, scale, fused)
        return
    scratch = _mlas_scratch(q.shape[2] // Hkv, q.shape[3], v.shape[3])
    for b in range(B):
        for g in range(Hkv):
            _mlas_head(q, k, v, decay, beta, state, out, gating, delta, scale, fused, b, g, scratch)


@njit(**_OPTS)
def linattn_f32(query, key, value, past, has_past, decay, has_decay, beta, has_beta, Hq, Hkv, scale, gating, delta,
                mlas=0):
    """The driver, on float32 arrays: ``(error code, out (B, T, Hout * dv), state)``; ``mlas`` 0 the default
    order, else onnxruntime's (``MLAS_FUSED`` where the host and the shape take that kernel)."""
    B, T, hq = query.shape
    err, dk, dv, nd, nb, Hout = la_geometry(query.shape, key.shape, value.shape, decay.shape, has_decay,
                                            beta.shape, has_beta, past.shape, has_past, Hq, Hkv)
    if err:
        return err, np.empty((0, 0, 0), np.float32), np.empty((0, 0, 0, 0), np.float32)
    if Hkv > Hq:  # state head g reads query/key head g // rep
        rep = Hkv // Hq
        q = np.empty((B, T, Hkv, dk), np.float32)
        k = np.empty((B, T, Hkv, dk), np.float32)
        for b in range(B):
            for t in range(T):
                for g in range(Hkv):
                    for d in range(dk):
                        q[b, t, g, d] = query[b, t, (g // rep) * dk + d]
                        k[b, t, g, d] = key[b, t, (g // rep) * dk + d]
    else:
        q = query.reshape((B, T, Hq, dk))
        k = key.reshape((B, T, Hkv, dk))
    v = value.reshape((B, T, Hkv, dv))
    dc = decay.reshape((B, T, Hkv, nd)) if has_decay else np.zeros((1, 1, 1, 1), np.float32)
    bt = beta if has_beta else np.ones((1, 1, 1), np.float32)
    state = past.copy() if has_past else np.zeros((B, Hkv, dk, dv), np.float32)
    out = np.empty((B, T, Hout, dv), np.float32)
    if out.size or state.size:
        sc = np.float32(scale) if scale else np.float32(1.0) / np.float32(math.sqrt(dk))  # onnxruntime's 1.0f / sqrtf
        if mlas:
            group = q.shape[2] // Hkv
            fused = mlas == MLAS_FUSED and dk % 16 == 0 and dk <= 256 and dv % 32 == 0 and \
                (group == 1 or group == 2 or group == 4 or group == 8)
            linear_attention_mlas(q, k, v, dc, bt, state, out, gating, delta, sc, fused)
        else:
            linear_attention_kernel(q, k, v, dc, bt, state, out, gating, delta, sc)
    return 0, out.reshape((B, T, Hout * dv)), state


_Z3 = np.zeros((1, 1, 1), np.float32)
_Z4 = np.zeros((1, 1, 1, 1), np.float32)


def _f32(x):
    return np.ascontiguousarray(x, dtype=F32)


def _cpu(b: LinAttn, ctx):
    def run(query, key, value, past_state=None, decay=None, beta=None):
        la_inputs(b, query, key, value, past_state, decay, beta)
        err, out, state = linattn_f32(_f32(query), _f32(key), _f32(value), _Z4 if past_state is None else
                                      _f32(past_state), past_state is not None, _Z3 if decay is None else _f32(decay),
                                      decay is not None, _Z3 if beta is None else _f32(beta), beta is not None, b.Hq,
                                      b.Hkv, b.scale, b.gating, b.delta, b.mlas)
        if err:
            raise_coded(LA_ERRORS, err, "LinearAttention")
        sdt = query.dtype if past_state is None else past_state.dtype
        return out.astype(query.dtype, copy=False), state.astype(sdt, copy=False)
    return run


def _form(e, b: LinAttn):
    float_only(e, 0, 1, 2, 3, 4, 5)
    if b.gating != e.has(4) or b.delta != e.has(5):
        raise Decline("decay/beta presence")
    if any(e.rank(i) != 3 for i in (0, 1, 2)) or (e.has(3) and e.rank(3) != 4) or (e.has(4) and e.rank(4) != 3) \
            or (e.has(5) and e.rank(5) != 3):
        raise Decline("ranks")
    k = e.use(__name__, "linattn_f32")
    past = "{i3}" if e.has(3) else "np.zeros((1, 1, 1, 1), np.float32)"
    dec = "{i4}" if e.has(4) else "np.zeros((1, 1, 1), np.float32)"
    bet = "{i5}" if e.has(5) else "np.zeros((1, 1, 1), np.float32)"
    e.line(f"{{p}}_err, {{o0}}, {{p}}_st = {k}({{i0}}, {{i1}}, {{i2}}, {past}, {e.has(3)}, {dec}, {e.has(4)}, "
           f"{bet}, {e.has(5)}, {b.Hq}, {b.Hkv}, {b.scale!r}, {b.gating}, {b.delta}, {b.mlas})")
    raise_on(e, "{p}_err", [(c, cls, msg) for c, (cls, msg) in LA_ERRORS.items()])
    if e.used(1):
        e.line("{o1} = {p}_st")


op("LinearAttention", 27, bind=bind_linear_attention)(_cpu)
op("LinearAttention", 1, domain=MS, bind=bind_linear_attention_ms)(_cpu)
form("LinearAttention", domain=MS, bind=bind_linear_attention_ms)(_form)
