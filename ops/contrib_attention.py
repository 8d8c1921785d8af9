"""onnxruntime contrib attention (domain com.microsoft): the attention kernels GroupQueryAttention runs
(the op itself is ``ops/group_query_attention.py``), and MultiHeadAttention.  The rotary ops are
``ops/rotary_embedding.py``.

GroupQueryAttention follows onnxruntime's CPU kernel: per batch entry ``b`` the cache holds
``T_b = seqlens_k[b] + 1`` positions after the step; the new tokens sit at positions
``[P_b, P_b + S)`` with ``P_b = 0`` for the first prompt (``S == total_sequence_length``) and
``P_b = T_b - S`` otherwise.  Query row ``s`` (absolute position ``P_b + s``) attends to the keys
``[lo, hi)``: ``hi = min(P_b + s + 1, T_b)`` when causal (``T_b`` otherwise) and
``lo = P_b + s + 1 - local_window_size`` when a window is set (the window counts the row's own key).
With ``sliding_window_cache=1`` the past/present buffers have a fixed capacity ``C`` and hold the
last ``L(T)`` positions at rows ``[0, L(T))`` (onnxruntime's eviction rule, ``resident_rows``); the
resident past and the new rows are staged and attention runs in staged coordinates.

Invariants:
- 16-bit floats are computed in float32 and rounded back once;
- ``present_key``/``present_value`` are fresh arrays of length ``max(total_sequence_length,
  past_len)`` (``C`` for a windowed cache); only the live rows are written (past rows ``[0, P_b)``
  copied from ``past_*``, then the new ones), the rest stay zero.  ``np.zeros`` of a large buffer is
  lazily zero-paged, so a shared max-length buffer costs O(live length) per step, never O(max_len);
- the attention reads only the live rows: prefill runs one query row per task (parallel over
  batch * heads * rows), decode (one new token) runs one task per (batch, kv head) that streams
  the live K and V rows once for every query head of the group;
- a query row with no key in range yields zeros, never NaN;
- rotary positions (``position_ids`` or ``P_b + s``) are validated against the cos/sin caches
  (``IndexOutOfRangeError``) before a cache row is read;
- MultiHeadAttention turns ``key_padding_mask`` into an additive ``mask_filter_value`` bias, as
  onnxruntime does, and concatenates ``past_*`` with the new keys/values into ``present_*``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import serial_twin
from ._fastmath import fexp
from ._prefill_attention import attend_blocked, key_range, normalize, usable
from .registry import op

_MS = "com.microsoft"


# -- kernels ---------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def cache_write(past_b, new, pres):
    """new (B,S,kvH,D) -> pres (B,kvH,L,D) rows [past_b[b], past_b[b] + S)."""
    B, S, H, D = new.shape
    for b in range(B):
        pb = past_b[b]
        for h in range(H):
            for s in range(S):
                pres[b, h, pb + s, :] = new[b, s, h, :]


@njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def _gqa_prefill_kernel(q, pk, pv, past_b, total_b, kbase, params, causal, window, bias, has_bias, sink, sink_mode,
                        qk, qk_mode, out):
    """q (B,S,H,D), pk/pv (B,kvH,L,D) (row j holds absolute position j + kbase[b]), bias (bb,bh,S|1,Tb)
    indexed by absolute position, sink (H,), params [scale, softcap]; writes out (B,S,H,Dv) and, if qk_mode
    (1 raw, 2 softmax), qk (B,H,S,Tq) at absolute key positions."""
    B, S, H, D = q.shape
    kvH = pk.shape[1]
    Dv = pv.shape[3]
    group = H // kvH
    mb, mh, mq, mk = bias.shape
    scale = params[0]
    softcap = params[1]
    for r in prange(B * H * S):
        b = r // (H * S)
        h = (r // S) % H
        s = r % S
        kh = h // group
        lo, hi = key_range(past_b[b] + s, total_b[b], causal, window)
        n = hi - lo
        sc = np.empty(max(n, 1), np.float32)
        m = -np.inf
        qr = np.empty(D, np.float32)  # contiguous copy: keeps the dot loop vectorized
        for d in range(D):
            qr[d] = q[b, s, h, d]
        for j in range(lo, hi):
            krow = pk[b, kh, j]
            acc = np.float32(0.0)
            for d in range(D):
                acc += qr[d] * krow[d]
            x = acc * scale
            if softcap > 0:
                x = softcap * math.tanh(x / softcap)
            if has_bias:
                x += bias[b if mb > 1 else 0, h if mh > 1 else 0, s if mq > 1 else 0, j + kbase[b]]
            sc[j - lo] = x
            if x > m:
                m = x
        if qk_mode == 1:
            for j in range(lo, hi):
                qk[b, h, s, j + kbase[b]] = sc[j - lo]
        normalize(sc[:n], m, sink_mode, sink[h] if sink_mode == 2 else np.float32(0.0))
        if qk_mode == 2:
            for j in range(lo, hi):
                qk[b, h, s, j + kbase[b]] = sc[j - lo]
        acc_v = np.zeros(Dv, np.float32)
        for j in range(lo, hi):
            w = sc[j - lo]
            vrow = pv[b, kh, j]
            for d in range(Dv):
                acc_v[d] += w * vrow[d]
        for d in range(Dv):
            out[b, s, h, d] = acc_v[d]


@njit(cache=True, nogil=True, inline="always")  # a dispatch only: inlined, no compiled level of its own
def gqa_prefill(q, pk, pv, past_b, total_b, kbase, params, causal, window, bias, has_bias, sink, sink_mode, qk,
                qk_mode, out):
    """Attention of several query rows, arguments as ``_gqa_prefill_kernel``'s: the blocked products of
    ``_prefill_attention`` where they apply (no ``qk`` output, head sizes of whole panels, AVX-512), else that
    kernel's one task per query row."""
    if usable(q.shape[3], pv.shape[3], qk_mode):
        attend_blocked(q, pk, pv, past_b, total_b, kbase, params, causal, window, bias, has_bias, sink, sink_mode,
                       out)
    else:
        _gqa_prefill_kernel(q, pk, pv, past_b, total_b, kbase, params, causal, window, bias, has_bias, sink,
                            sink_mode, qk, qk_mode, out)


@njit(cache=True, nogil=True, inline="always", fastmath={"reassoc", "contract"})
def key_scores4(qg, kmat, row, sc, c):
    """``sc[g, c + i] = qg[g] . kmat[row + i]`` for i < 4 and every query head g of the group: four keys per pass
    over the query row (one load of q per four products).  Shared by the contiguous and the paged decode
    kernels."""
    for g in range(qg.shape[0]):
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        for d in range(qg.shape[1]):
            qd = qg[g, d]
            a0 += qd * kmat[row, d]
            a1 += qd * kmat[row + 1, d]
            a2 += qd * kmat[row + 2, d]
            a3 += qd * kmat[row + 3, d]
        sc[g, c] = a0
        sc[g, c + 1] = a1
        sc[g, c + 2] = a2
        sc[g, c + 3] = a3


@njit(cache=True, nogil=True, inline="always", fastmath={"reassoc", "contract"})
def key_scores1(qg, kmat, row, sc, c):
    """``sc[g, c] = qg[g] . kmat[row]`` for every query head g."""
    for g in range(qg.shape[0]):
        acc = np.float32(0.0)
        for d in range(qg.shape[1]):
            acc += qg[g, d] * kmat[row, d]
        sc[g, c] = acc


@njit(cache=True, nogil=True, inline="always", fastmath={"reassoc", "contract"})
def value_sums4(sc, c, vmat, row, acc):
    """``acc[g] += sum_i sc[g, c + i] * vmat[row + i]`` for i < 4: four value rows per pass over the
    accumulators."""
    for g in range(acc.shape[0]):
        w0 = sc[g, c]
        w1 = sc[g, c + 1]
        w2 = sc[g, c + 2]
        w3 = sc[g, c + 3]
        for d in range(acc.shape[1]):
            acc[g, d] += (w0 * vmat[row, d] + w1 * vmat[row + 1, d]) + (w2 * vmat[row + 2, d] + w3 * vmat[row + 3, d])


@njit(cache=True, nogil=True, inline="always", fastmath={"reassoc", "contract"})
def value_sums1(sc, c, vmat, row, acc):
    """``acc[g] += sc[g, c] * vmat[row]``."""
    for g in range(acc.shape[0]):
        w = sc[g, c]
        for d in range(acc.shape[1]):
            acc[g, d] += w * vmat[row, d]


@njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def gqa_decode_par(q, pk, pv, past_b, total_b, kbase, params, causal, window, bias, has_bias, sink, sink_mode, out):
    """One new token (S == 1): one task per (batch, kv head) streams the live K rows, then the V rows,
    once for the whole query-head group.  Shapes as in ``_gqa_prefill_kernel``."""
    B, S, H, D = q.shape
    kvH = pk.shape[1]
    Dv = pv.shape[3]
    group = H // kvH
    mb, mh, mq, mk = bias.shape
    scale = params[0]
    softcap = params[1]
    for r in prange(B * kvH):
        b = r // kvH
        kh = r % kvH
        lo, hi = key_range(past_b[b], total_b[b], causal, window)
        n = hi - lo
        sc = np.empty((group, max(n, 1)), np.float32)
        mx = np.full(group, -np.inf, np.float32)
        qg = np.empty((group, D), np.float32)  # contiguous copy: keeps the dot loops vectorized
        for g in range(group):
            for d in range(D):
                qg[g, d] = q[b, 0, kh * group + g, d]
        kmat = pk[b, kh]  # (L, D) views taken once per task: no array view per key row
        vmat = pv[b, kh]
        # Raw scores, four keys per pass over the query row (one load of q per four products).
        j = lo
        while j + 4 <= hi:
            key_scores4(qg, kmat, j, sc, j - lo)
            j += 4
        while j < hi:
            key_scores1(qg, kmat, j, sc, j - lo)
            j += 1
        for j in range(lo, hi):
            for g in range(group):
                h = kh * group + g
                x = sc[g, j - lo] * scale
                if softcap > 0:
                    x = softcap * math.tanh(x / softcap)
                if has_bias:
                    x += bias[b if mb > 1 else 0, h if mh > 1 else 0, 0, j + kbase[b]]
                sc[g, j - lo] = x
                if x > mx[g]:
                    mx[g] = x
        for g in range(group):
            h = kh * group + g
            m = mx[g]
            sk = np.float32(0.0)
            if sink_mode == 2:
                sk = sink[h]
            if sink_mode > 0 and sk > m:
                m = sk
            tot = np.float32(0.0)
            if sink_mode > 0:
                tot = math.exp(sk - m)
            if m == -np.inf:
                for j in range(n):
                    sc[g, j] = 0.0
            else:
                for j in range(n):
                    e = fexp(sc[g, j] - m)
                    sc[g, j] = e
                    tot += e
            inv = np.float32(0.0) if tot == 0 else np.float32(1.0) / tot
            for j in range(n):
                sc[g, j] *= inv
        accv = np.zeros((group, Dv), np.float32)
        j = lo
        while j + 4 <= hi:  # four value rows per pass over the accumulators
            value_sums4(sc, j - lo, vmat, j, accv)
            j += 4
        while j < hi:
            value_sums1(sc, j - lo, vmat, j, accv)
            j += 1
        for g in range(group):
            for d in range(Dv):
                out[b, 0, kh * group + g, d] = accv[g, d]


# A decode step's attention (B*H*T*D multiply-adds per product) runs serially below this.  With the pool's
# workers spinning briefly between kernels (``runtime.cpu_env``) a parallel call costs a few microseconds: at 14
# heads of 64 on 2 cores the parallel kernel measured 5.6 us against 6.2 at T=64, 15 against 21 at T=300.  The
# node wrapper and the compiled form both choose by it (the two kernels give the same bits).
GQA_DECODE_PARALLEL_WORK = 1 << 15
gqa_decode_serial = serial_twin(gqa_decode_par)


# -- helpers ---------------------------------------------------------------------------------------

_DUMMY4 = np.zeros((1, 1, 1, 1), np.float32)
_DUMMY1 = np.zeros(1, np.float32)


def _f32(x):
    return np.ascontiguousarray(x, dtype=np.float32)


@njit(cache=True, nogil=True)
def resident_rows(T, C, W):
    """Rows a windowed cache of capacity C and window W holds after T positions (onnxruntime's L(T))."""
    if T <= C:
        return T
    G = C - W + 1
    return T - G * ((T - C + G - 1) // G)


# -- MultiHeadAttention --------------------------------------------------------------------------

def _bnsh(x, B, L, H, D):
    """(B,L,H*D) -> (B,H,L,D) float32 C-contiguous."""
    return np.ascontiguousarray(_f32(x).reshape(B, L, H, D).transpose(0, 2, 1, 3))


def _mha_packed_qkv(name, query, key, value, bias, H):
    """Packed QKV query (B,S,H,3,D) -> (q (B,S,H,D), k, v (B,H,S,D), D, Dv), float32 with the bias added."""
    if key is not None or value is not None:
        raise InvalidArgumentError(f"{name}: packed QKV query excludes key and value inputs")
    B, S, _, three, D = query.shape
    if query.shape[2] != H or three != 3:
        raise ShapeMismatchError(f"{name}: packed QKV must have shape [B, S, {H}, 3, D], got {list(query.shape)}")
    qkv = _f32(query)
    if bias is not None:
        qkv = qkv + bias.reshape(3, H, D).transpose(1, 0, 2)
    q = np.ascontiguousarray(qkv[:, :, :, 0])
    k = np.ascontiguousarray(qkv[:, :, :, 1].transpose(0, 2, 1, 3))
    v = np.ascontiguousarray(qkv[:, :, :, 2].transpose(0, 2, 1, 3))
    return q, k, v, D, D


def _mha_query(name, query, key, bias, H):
    """Unpacked query (B,S,H*D) -> (q (B,S,H,D) float32 with its bias added, D); the key must be given."""
    if query.ndim != 3 or query.shape[2] % H:
        raise ShapeMismatchError(f"{name}: query must be (batch, seq, hidden) with hidden a multiple of "
                                 f"{H}, got {list(query.shape)}")
    B, S, hq = query.shape
    D = hq // H
    if key is None:
        raise InvalidArgumentError(f"{name}: key is required unless query is packed QKV")
    qb = bias[:hq] if bias is not None else None
    q = _f32(query) if qb is None else _f32(query) + qb
    return np.ascontiguousarray(q).reshape(B, S, H, D), D


def _mha_key_value(name, key, value, bias, B, H, D):
    """key/value (packed KV, BNSH or (B,L,hidden)) -> (k, v (B,H,L,D|Dv) float32, Dv, cross_bnsh)."""
    hq = H * D
    if key.ndim == 5:  # packed KV (B,L,H,2,D)
        if value is not None or key.shape[2] != H or key.shape[3] != 2 or key.shape[4] != D:
            raise ShapeMismatchError(f"{name}: packed KV must have shape [B, L, {H}, 2, {D}] and no value, "
                                     f"got {list(key.shape)}")
        kv = _f32(key)
        if bias is not None:
            kv = kv + bias[hq:].reshape(2, H, D).transpose(1, 0, 2)
        k = np.ascontiguousarray(kv[:, :, :, 0].transpose(0, 2, 1, 3))
        v = np.ascontiguousarray(kv[:, :, :, 1].transpose(0, 2, 1, 3))
        return k, v, D, False
    if key.ndim == 4:  # already projected BNSH key/value (cross-attention cache)
        if value is None or key.shape[0] != B or key.shape[1] != H or key.shape[3] != D \
                or value.ndim != 4 or value.shape[:3] != key.shape[:3]:
            raise ShapeMismatchError(f"{name}: BNSH key/value must have shape [{B}, {H}, L, D], got "
                                     f"{list(key.shape)} and {None if value is None else list(value.shape)}")
        return _f32(key), _f32(value), value.shape[3], True
    if value is None or key.ndim != 3 or value.ndim != 3 or key.shape[0] != B or key.shape[2] != hq \
            or value.shape[:2] != key.shape[:2] or value.shape[2] % H:
        raise ShapeMismatchError(f"{name}: key/value must be (batch, kv_seq, hidden) with key hidden "
                                 f"{hq}, got {list(key.shape)} and "
                                 f"{None if value is None else list(value.shape)}")
    Lk = key.shape[1]
    Dv = value.shape[2] // H
    kf, vf = _f32(key), _f32(value)
    if bias is not None:
        kf = kf + bias[hq:2 * hq]
        vf = vf + bias[2 * hq:]
    return _bnsh(kf, B, Lk, H, D), _bnsh(vf, B, Lk, H, Dv), Dv, False


def _mha_past(name, past_key, past_value, k, v, cross_bnsh, B, H, D, Dv):
    """(k, v, P): the past cache (P rows) concatenated before the new keys/values; BNSH cross K/V ignore it."""
    if (past_key is None) != (past_value is None):
        raise InvalidArgumentError(f"{name}: past_key and past_value must be given together")
    if past_key is None or cross_bnsh:
        return k, v, 0
    if past_key.ndim != 4 or past_key.shape[:2] != (B, H) or past_key.shape[3] != D \
            or past_value.shape[:3] != past_key.shape[:3] or past_value.shape[3] != Dv:
        raise ShapeMismatchError(f"{name}: past_key/past_value must have shape [{B}, {H}, P, {D}/{Dv}], got "
                                 f"{list(past_key.shape)} and {list(past_value.shape)}")
    k = np.concatenate([_f32(past_key), k], axis=2)
    v = np.concatenate([_f32(past_value), v], axis=2)
    return k, v, past_key.shape[2]


def _mha_additive_bias(name, attention_bias, key_padding_mask, mask_filter_value, B, H, S, T):
    """attention_bias plus the key padding mask (mask_filter_value where masked) as float32, or None."""
    add = None
    if attention_bias is not None:
        ab = _f32(attention_bias)
        if ab.ndim != 4 or ab.shape[0] not in (1, B) or ab.shape[1] not in (1, H) or ab.shape[2] != S \
                or ab.shape[3] != T:
            raise ShapeMismatchError(f"{name}: attention_bias must have shape [{B} or 1, {H} or 1, {S}, {T}], "
                                     f"got {list(attention_bias.shape)}")
        add = ab
    if key_padding_mask is not None:
        m = np.asarray(key_padding_mask)
        if m.ndim == 1 and m.shape[0] == B:
            keep = np.arange(T)[None, :] < m.astype(np.int64)[:, None]
            keep = keep[:, None, None, :]
        elif m.ndim == 2 and m.shape == (B, T):
            keep = (m != 0)[:, None, None, :]
        elif m.ndim == 3 and m.shape == (B, S, T):
            keep = (m != 0)[:, None, :, :]
        else:
            raise ShapeMismatchError(f"{name}: key_padding_mask must have shape [{B}], [{B}, {T}] or "
                                     f"[{B}, {S}, {T}], got {list(m.shape)}")
        madd = np.where(keep, np.float32(0), np.float32(mask_filter_value)).astype(np.float32)
        add = madd if add is None else add + madd
    return add


def _mha_attend(ctx, q, k, v, add, P, D, Dv, scale, unidirectional, dtype):
    """Runs the prefill kernel on q (B,S,H,D), k/v (B,H,T,D|Dv) and returns the node's outputs in ``dtype``."""
    B, S, H, _ = q.shape
    T = k.shape[2]
    has_bias = add is not None
    add = np.ascontiguousarray(add, np.float32) if has_bias else _DUMMY4
    sc = float(scale) if scale else 1.0 / math.sqrt(D)
    params = np.array([sc, 0.0], np.float32)
    past_b = np.full(B, P, np.int64)
    totals = np.full(B, T, np.int64)
    out = np.empty((B, S, H, Dv), np.float32)
    want_qk = ctx is not None and ctx.n_outputs > 3 and ctx.outputs_used[3]
    # qk: the scaled, biased scores; keys outside the causal range read the float32 lowest, as onnxruntime's
    qk = np.full((B, H, S, T), np.finfo(np.float32).min, np.float32) if want_qk else _DUMMY4
    gqa_prefill(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), past_b, totals,
                np.zeros(B, np.int64), params, bool(int(unidirectional)), -1, add, has_bias, _DUMMY1, 0,
                qk, 1 if want_qk else 0, out)
    y = out.reshape(B, S, H * Dv).astype(dtype, copy=False)
    res = [y, k.astype(dtype), v.astype(dtype)]
    if want_qk:
        res.append(qk.astype(dtype))
    n = ctx.n_outputs if ctx is not None else 1
    return tuple(res[:n]) if n > 1 else y


@op("MultiHeadAttention", 1, domain=_MS)
def MultiHeadAttention(query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
                       past_key=None, past_value=None, past_sequence_length=None, cache_indirection=None, *,
                       ctx=None, num_heads=0, scale=0.0, mask_filter_value=-10000.0, unidirectional=0):
    """com.microsoft MultiHeadAttention on the CPU: Q/K/V projections, past cache, additive bias, prefill kernel."""
    name = "MultiHeadAttention"
    H = int(num_heads)
    if H <= 0:
        raise InvalidAttributeError(f"{name}: num_heads must be positive, got {num_heads}")
    if past_sequence_length is not None or cache_indirection is not None:
        raise InvalidArgumentError(f"{name}: past_sequence_length/cache_indirection (buffer sharing, beam "
                                   f"search) are not supported by this kernel")
    dtype = query.dtype
    if bias is not None:
        bias = _f32(bias).reshape(-1)
    cross_bnsh = False
    if query.ndim == 5:  # packed QKV (B,S,H,3,D)
        q, k, v, D, Dv = _mha_packed_qkv(name, query, key, value, bias, H)
    else:
        q, D = _mha_query(name, query, key, bias, H)
        k, v, Dv, cross_bnsh = _mha_key_value(name, key, value, bias, q.shape[0], H, D)
    B, S = q.shape[:2]
    k, v, P = _mha_past(name, past_key, past_value, k, v, cross_bnsh, B, H, D, Dv)
    add = _mha_additive_bias(name, attention_bias, key_padding_mask, mask_filter_value, B, H, S, k.shape[2])
    return _mha_attend(ctx, q, k, v, add, P, D, Dv, scale, unidirectional, dtype)

