"""Transformer ops of the default domain: Attention (23, 24, 25), RotaryEmbedding (23), SwiGLU (28).

Attention wrappers bring Q/K/V to the canonical 4-d layout
(batch, heads, seq, head_dim), concatenate the past cache, turn the mask into
an additive float bias of rank 4 (bool -> 0/-inf) and describe the causal,
sliding-window and padding limits by per-batch integers, so one fused
``@njit`` kernel per compute dtype (float32, or float64 for double inputs)
does QK^T, softcap, bias, a fully-masked-row-safe softmax and PV.

Invariants:
- 16-bit floats are computed in float32 and rounded back once at the end;
- a query row whose bias is -inf for every key yields zeros (in Y and in the
  mode-3 ``qk_matmul_output``), never NaN;
- the mask's last axis may be shorter than the total key length; the missing
  keys are masked (-inf), as the spec pads them;
- GQA maps query head ``h`` to key/value head ``h // (q_heads // kv_heads)``;
- ``softmax_precision`` is accepted and needs no action: the softmax always
  runs in float32 (float64 for double inputs), at least the requested precision;
- outputs never alias inputs: ``present_key``/``present_value`` are fresh
  arrays even when there is no past cache.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, check_indices, lowp
from ._simd import fma32
from .registry import op

F64 = np.dtype(np.float64)
_NEG_INF = -np.inf


# -- kernels ---------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def head_task(bh, Hq, group):
    """(batch, query head, key/value head) of task ``bh`` of a loop over B * Hq (``group`` query heads per kv head)."""
    h = bh % Hq
    return bh // Hq, h, h // group


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def row_max(s):
    """The largest entry of the score row ``s`` by comparison (NaNs never win), -inf when none is above it."""
    m = -np.inf
    for j in range(s.shape[0]):
        if s[j] > m:
            m = s[j]
    return m


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def exp_shift(s, m, zero):
    """s[j] = exp(s[j] - m) in place; returns their sum, accumulated from ``zero`` (0 in s's dtype)."""
    tot = zero
    for j in range(s.shape[0]):
        e = np.exp(s[j] - m)
        s[j] = e
        tot += e
    return tot


@njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def attention_kernel(q, k, v, mask, offset, valid, params, is_causal, left, right,
                      qk_mode, want_qk, y, qk):
    """q (B,Hq,Sq,D), k (B,Hkv,Skv,D), v (B,Hkv,Skv,Dv), mask (mb,mh,mq,mk) additive,
    offset/valid (B,) int64, params [scale, softcap] in q's dtype; writes y (B,Hq,Sq,Dv) and, if want_qk, qk (B,Hq,Sq,Skv)."""
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    Skv = k.shape[2]
    Dv = v.shape[3]
    mb, mh, mq, mk = mask.shape
    group = Hq // Hkv
    ninf = -np.inf
    zero = np.zeros(1, q.dtype)[0]
    one = zero + 1
    scale = params[0]
    softcap = params[1]
    for bh in prange(B * Hq):
        b, h, kh = head_task(bh, Hq, group)
        ib = b if mb > 1 else 0
        ih = h if mh > 1 else 0
        off = offset[b]
        nval = valid[b]
        s = np.empty(Skv, q.dtype)
        bias = np.empty(Skv, q.dtype)
        acc = np.empty(Dv, q.dtype)
        for i in range(Sq):
            iq = i if mq > 1 else 0
            # additive bias: mask, causal frontier, sliding window, padding
            any_ok = False
            for j in range(Skv):
                bj = mask[ib, ih, iq, j] if j < mk else ninf
                d = i + off - j
                if is_causal and d < 0:
                    bj = ninf
                if left >= 0 and d > left:
                    bj = ninf
                if right >= 0 and -d > right:
                    bj = ninf
                if j >= nval:
                    bj = ninf
                if bj != ninf:
                    any_ok = True
                bias[j] = bj
            # scores; a key the bias removes needs none unless the raw scores are an output
            qi = q[b, h, i]
            for j in range(Skv):
                if bias[j] == ninf and not want_qk:
                    s[j] = ninf
                    continue
                kj = k[b, kh, j]
                t = zero
                for dd in range(D):
                    t += qi[dd] * kj[dd]
                t *= scale
                if softcap > 0:
                    t = softcap * np.tanh(t / softcap)
                s[j] = t
            if want_qk and qk_mode <= 1:
                for j in range(Skv):
                    qk[b, h, i, j] = s[j]
            for j in range(Skv):
                s[j] += bias[j]
            if want_qk and qk_mode == 2:
                for j in range(Skv):
                    qk[b, h, i, j] = s[j]
            for dd in range(Dv):
                acc[dd] = 0.0
            if any_ok:
                m = row_max(s)
                if m == ninf:
                    m = zero
                tot = exp_shift(s, m, zero)
                if tot == 0.0:
                    tot = one
                inv = one / tot
                for j in range(Skv):
                    p = s[j] * inv
                    s[j] = p
                    if p != 0.0:
                        vj = v[b, kh, j]
                        for dd in range(Dv):
                            acc[dd] += p * vj[dd]
            else:
                for j in range(Skv):
                    s[j] = 0.0
            if want_qk and qk_mode == 3:
                for j in range(Skv):
                    qk[b, h, i, j] = s[j]
            for dd in range(Dv):
                y[b, h, i, dd] = acc[dd]


@njit(cache=True, nogil=True)
def rope_tok_kernel(x, cos_t, sin_t, out, seq_second, interleaved, rot, mlas=False):
    """x/out 4-d (B,H,S,D), or (B,S,H,D) if seq_second; cos_t/sin_t (B,S,rot//2) per-token tables.
    ``out`` may be ``x`` (each rotated pair is read before it is written).  ``mlas``: in MLAS's order
    (``MlasRotaryEmbedOneRow``, onnxruntime's CPU kernel): ``x1' = fma(x1, cos, -(x2 * sin))``,
    ``x2' = fma(x1, sin, x2 * cos)``."""
    A0, A1, A2, D = x.shape
    half = rot // 2
    for a in range(A0):
        for c in range(A1):
            for e in range(A2):
                si = c if seq_second else e
                for t in range(half):
                    co = cos_t[a, si, t]
                    sn = sin_t[a, si, t]
                    if interleaved:
                        i1 = 2 * t
                        i2 = 2 * t + 1
                    else:
                        i1 = t
                        i2 = t + half
                    x1 = x[a, c, e, i1]
                    x2 = x[a, c, e, i2]
                    if mlas:
                        out[a, c, e, i1] = fma32(x1, co, -np.float32(x2 * sn))
                        out[a, c, e, i2] = fma32(x1, sn, np.float32(x2 * co))
                    else:
                        out[a, c, e, i1] = co * x1 - sn * x2
                        out[a, c, e, i2] = sn * x1 + co * x2
                for t in range(rot, D):
                    out[a, c, e, t] = x[a, c, e, t]


@njit(cache=True, nogil=True)
def _swiglu_kernel(a, b, out, alpha):
    for i in range(a.size):
        x = a[i]
        out[i] = x * (1.0 / (1.0 + math.exp(-alpha * x))) * b[i]


# -- Attention -------------------------------------------------------------------------------------

def _to4(x, heads, what):
    """(B, S, H*D) -> contiguous (B, H, S, D)."""
    if x.ndim != 3:
        raise ShapeMismatchError(f"Attention: {what} must be 3-d like Q, got shape {list(x.shape)}")
    bsz, seq, hid = x.shape
    if hid % heads:
        raise ShapeMismatchError(f"Attention: {what} hidden size {hid} is not a multiple of {heads} heads")
    return np.ascontiguousarray(x.reshape(bsz, seq, heads, hid // heads).transpose(0, 2, 1, 3))


def _check_attention_args(Q, K, V, past_key, past_value, nonpad_kv_seqlen, left_window_size, right_window_size):
    """Checks that need no layout: one dtype, the past pair, the input ranks and the window sizes."""
    T = Q.dtype
    if K.dtype != T or (past_key is not None and past_key.dtype != T):
        raise InvalidArgumentError(f"Attention: Q, K and past_key must share one dtype, got "
                                   f"{T}, {K.dtype}, {None if past_key is None else past_key.dtype}")
    if (past_key is None) != (past_value is None):
        raise InvalidArgumentError("Attention: past_key and past_value must be given together")
    if nonpad_kv_seqlen is not None and past_key is not None:
        raise InvalidArgumentError("Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value")
    if not (Q.ndim == K.ndim == V.ndim) or Q.ndim not in (3, 4):
        raise ShapeMismatchError(f"Attention: Q, K, V must all be 3-d or all 4-d, got shapes "
                                 f"{list(Q.shape)}, {list(K.shape)}, {list(V.shape)}")
    if left_window_size < -1 or right_window_size < -1:
        raise InvalidAttributeError(f"Attention: window sizes must be -1 or nonnegative, got "
                                    f"left={left_window_size}, right={right_window_size}")


def _attention_bhsd(Q, K, V, three_d, q_num_heads, kv_num_heads):
    """Q, K, V in the canonical (B, H, S, D) layout, their shapes and head counts checked."""
    if three_d:
        if not q_num_heads or not kv_num_heads:
            raise InvalidAttributeError("Attention: 3-d Q/K/V need the q_num_heads and kv_num_heads attributes")
        q4 = _to4(Q, q_num_heads, "Q")
        k4 = _to4(K, kv_num_heads, "K")
        v4 = _to4(V, kv_num_heads, "V")
    else:
        q4, k4, v4 = Q, K, V
    B, Hq, Sq, D = q4.shape
    Hkv = k4.shape[1]
    if k4.shape[0] != B or v4.shape[0] != B or v4.shape[1] != Hkv or k4.shape[3] != D or v4.shape[2] != k4.shape[2]:
        raise ShapeMismatchError(f"Attention: inconsistent 4-d shapes Q {list(q4.shape)}, K {list(k4.shape)}, "
                                 f"V {list(v4.shape)}")
    if Hkv == 0 or Hq % Hkv:
        raise ShapeMismatchError(f"Attention: q heads ({Hq}) must be a multiple of kv heads ({Hkv})")
    return q4, k4, v4


def _attention_present(past_key, past_value, k4, v4):
    """(present_k, present_v, past_len): the past cache (checked against K/V) followed by the new keys/values."""
    if past_key is None:
        return k4, v4, 0
    B, Hkv, _, D = k4.shape
    if past_key.ndim != 4 or past_key.shape[:2] != (B, Hkv) or past_key.shape[3] != D \
            or past_value.ndim != 4 or past_value.shape[:2] != (B, Hkv) or past_value.shape[3] != v4.shape[3] \
            or past_value.shape[2] != past_key.shape[2]:
        raise ShapeMismatchError(f"Attention: past_key {list(past_key.shape)} / past_value "
                                 f"{list(past_value.shape)} do not match K {list(k4.shape)} / V {list(v4.shape)}")
    present_k = np.concatenate((past_key, k4), axis=2)
    present_v = np.concatenate((past_value, v4.astype(past_value.dtype, copy=False)), axis=2)
    return present_k, present_v, past_key.shape[2]


def _attention_mask(attn_mask, cd, B, Hq, Sq, Skv):
    """attn_mask as an additive rank-4 bias of dtype ``cd`` (bool -> 0/-inf); zeros when absent."""
    if attn_mask is None:
        return np.zeros((1, 1, 1, Skv), cd)
    m = attn_mask
    if m.ndim > 4 or m.ndim == 0:
        raise ShapeMismatchError(f"Attention: attn_mask must have rank 1 to 4, got shape {list(m.shape)}")
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)
    for ax, (n, want) in enumerate(zip(m.shape[:3], (B, Hq, Sq))):
        if n != 1 and n != want:
            raise ShapeMismatchError(f"Attention: attn_mask shape {list(attn_mask.shape)} does not broadcast "
                                     f"to (batch {B}, heads {Hq}, q_seq {Sq}, total_seq {Skv})")
    if m.shape[3] > Skv:
        raise ShapeMismatchError(f"Attention: attn_mask last axis {m.shape[3]} is longer than the total "
                                 f"sequence length {Skv}")
    if m.dtype == np.bool_:
        return np.where(m, cd.type(0), cd.type(_NEG_INF))
    return np.ascontiguousarray(m, dtype=cd)


def _attention_limits(nonpad_kv_seqlen, B, Sq, Skv, past_len):
    """(offset, valid) per batch entry: the query rows' key offset and the number of valid keys."""
    if nonpad_kv_seqlen is None:
        return np.full(B, past_len, np.int64), np.full(B, Skv, np.int64)
    nonpad = np.asarray(nonpad_kv_seqlen, dtype=np.int64).reshape(-1)
    if nonpad.shape[0] != B:
        raise ShapeMismatchError(f"Attention: nonpad_kv_seqlen must have shape ({B},), got "
                                 f"{list(nonpad_kv_seqlen.shape)}")
    return nonpad - Sq, nonpad.copy()


def _attention_outputs(ctx, used, want_qk, y, qk, present_k, present_v, T, three_d):
    """Y (back in Q's layout and dtype), then present_key, present_value and qk_matmul_output as used."""
    if three_d:
        B, Hq, Sq, Dv = y.shape
        y = y.transpose(0, 2, 1, 3).reshape(B, Sq, Hq * Dv)
    y = np.ascontiguousarray(y, dtype=T)
    n = ctx.n_outputs if ctx is not None else 4
    res = [y]
    if n > 1:
        res.append(np.array(present_k, copy=True) if used[1] else None)
    if n > 2:
        res.append(np.array(present_v, copy=True) if used[2] else None)
    if n > 3:
        res.append(qk.astype(T) if want_qk else None)
    return y if n == 1 else tuple(res)


def _attention(ctx, Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, *, is_causal, kv_num_heads,
               q_num_heads, qk_matmul_output_mode, scale, softcap, softmax_precision, left_window_size,
               right_window_size):
    """The CPU Attention of opsets 23-25: checks, canonical layout, past cache, mask, then the fused kernel."""
    T = Q.dtype
    _check_attention_args(Q, K, V, past_key, past_value, nonpad_kv_seqlen, left_window_size, right_window_size)
    three_d = Q.ndim == 3
    q4, k4, v4 = _attention_bhsd(Q, K, V, three_d, q_num_heads, kv_num_heads)
    B, Hq, Sq, D = q4.shape
    present_k, present_v, past_len = _attention_present(past_key, past_value, k4, v4)
    Skv = present_k.shape[2]

    cd = F64 if T == F64 else F32
    qc = np.ascontiguousarray(q4, dtype=cd)
    kc = np.ascontiguousarray(present_k, dtype=cd)
    vc = np.ascontiguousarray(present_v, dtype=cd)
    mask = _attention_mask(attn_mask, cd, B, Hq, Sq, Skv)
    offset, valid = _attention_limits(nonpad_kv_seqlen, B, Sq, Skv, past_len)

    if scale is None:
        scale = 1.0 / math.sqrt(D)
    used = ctx.outputs_used if ctx is not None else [True] * 4
    want_qk = len(used) > 3 and used[3]
    mode = int(qk_matmul_output_mode)
    if mode not in (0, 1, 2, 3):
        raise InvalidAttributeError(f"Attention: qk_matmul_output_mode must be 0..3, got {mode}")
    y = np.empty((B, Hq, Sq, v4.shape[3]), cd)
    qk = np.empty((B, Hq, Sq, Skv) if want_qk else (1, 1, 1, 1), cd)
    if y.size:
        params = np.array([scale, softcap or 0.0], cd)
        attention_kernel(qc, kc, vc, mask, offset, valid, params,
                          bool(is_causal), int(left_window_size), int(right_window_size), mode, want_qk, y, qk)
    return _attention_outputs(ctx, used, want_qk, y, qk, present_k, present_v, T, three_d)


@op("Attention", 23)
def Attention_23(Q, K, V, attn_mask=None, past_key=None, past_value=None, *, ctx=None, is_causal=0,
                 kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
                 softmax_precision=None):
    return _attention(ctx, Q, K, V, attn_mask, past_key, past_value, None, is_causal=is_causal,
                      kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, qk_matmul_output_mode=qk_matmul_output_mode,
                      scale=scale, softcap=softcap, softmax_precision=softmax_precision, left_window_size=-1,
                      right_window_size=-1)


@op("Attention", 24)
def Attention_24(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, ctx=None,
                 is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
                 softmax_precision=None):
    return _attention(ctx, Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
                      kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, qk_matmul_output_mode=qk_matmul_output_mode,
                      scale=scale, softcap=softcap, softmax_precision=softmax_precision, left_window_size=-1,
                      right_window_size=-1)


@op("Attention", 25)
def Attention_25(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, ctx=None,
                 is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
                 softmax_precision=None, left_window_size=-1, right_window_size=-1):
    if Q.ndim == 4 and (q_num_heads is not None or kv_num_heads is not None):
        raise InvalidAttributeError("Attention-25: q_num_heads and kv_num_heads must not be set for 4-d inputs")
    return _attention(ctx, Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
                      kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, qk_matmul_output_mode=qk_matmul_output_mode,
                      scale=scale, softcap=softcap, softmax_precision=softmax_precision,
                      left_window_size=left_window_size, right_window_size=right_window_size)


# -- RotaryEmbedding -------------------------------------------------------------------------------

@op("ScaledDotAttention", 1, domain="onnx_numba")
def ScaledDotAttention(Q, K, V, *, ctx=None, scale=1.0, axis=-1, legacy_softmax=0):
    """``MatMul(Softmax(MatMul(Q, Transpose(K)) * scale), V)``, the encoder pattern that
    ``runtime/passes/encoder_fusions.FuseAttention`` replaces: 4-d float32 ``Q (B, H, S, D)``, ``K (B, H, T, D)``
    and ``V (B, H, T, Dv)`` of one batch and head count run as opset 23's Attention; any other operands (MatMul's
    broadcasting, another rank or dtype) as the three nodes compute them, the Softmax over ``axis`` with its
    opset's semantics (``legacy_softmax``: before opset 13, the axes from ``axis`` on flattened into one)."""
    if Q.ndim == K.ndim == V.ndim == 4 and Q.shape[:2] == K.shape[:2] == V.shape[:2] and Q.shape[3] == K.shape[3] \
            and K.shape[2] == V.shape[2] and Q.dtype == K.dtype == V.dtype == F32 and axis in (-1, 3):
        y = _attention(ctx, Q, K, V, None, None, None, None, is_causal=0, kv_num_heads=None, q_num_heads=None,
                       qk_matmul_output_mode=0, scale=float(scale), softcap=0.0, softmax_precision=None,
                       left_window_size=-1, right_window_size=-1)
        return y[0] if isinstance(y, tuple) else y
    s = np.matmul(Q, np.swapaxes(K, -1, -2))
    if scale != 1.0:
        s = s * s.dtype.type(scale)
    ax = axis + s.ndim if axis < 0 else axis
    shape = s.shape
    if legacy_softmax:
        s = s.reshape(shape[:ax] + (-1,))
        ax = s.ndim - 1
    e = np.exp(s - s.max(axis=ax, keepdims=True))
    p = (e / e.sum(axis=ax, keepdims=True)).reshape(shape)
    return np.matmul(p, V)


@op("RotaryEmbedding", 23)
def RotaryEmbedding(X, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0,
                    rotary_embedding_dim=0):
    T = X.dtype
    if X.ndim == 4:
        B, H, S, D = X.shape
        x4, seq_second = X, False
    elif X.ndim == 3:
        B, S, hid = X.shape
        if not num_heads or hid % num_heads:
            raise InvalidAttributeError(f"RotaryEmbedding: a 3-d input needs num_heads dividing its hidden size "
                                        f"{hid}, got num_heads={num_heads}")
        D = hid // num_heads
        x4, seq_second = X.reshape(B, S, num_heads, D), True
    else:
        raise ShapeMismatchError(f"RotaryEmbedding: X must be 3-d or 4-d, got shape {list(X.shape)}")
    rot = int(rotary_embedding_dim) or D
    if rot > D or rot % 2:
        raise InvalidAttributeError(f"RotaryEmbedding: rotary_embedding_dim {rot} must be even and at most the "
                                    f"head size {D}")
    half = rot // 2
    if cos_cache.shape != sin_cache.shape or cos_cache.shape[-1] != half:
        raise ShapeMismatchError(f"RotaryEmbedding: cos/sin caches {list(cos_cache.shape)} / "
                                 f"{list(sin_cache.shape)} must share a shape ending in rotary_embedding_dim/2 = {half}")
    if position_ids is not None:
        if cos_cache.ndim != 2:
            raise ShapeMismatchError(f"RotaryEmbedding: with position_ids the caches must be 2-d, got "
                                     f"{list(cos_cache.shape)}")
        try:
            pos = np.ascontiguousarray(np.broadcast_to(position_ids.astype(np.int64, copy=False), (B, S)))
        except ValueError:
            raise ShapeMismatchError(f"RotaryEmbedding: position_ids {list(position_ids.shape)} do not match "
                                     f"(batch {B}, seq {S})") from None
        check_indices("RotaryEmbedding", pos, 0, cos_cache.shape[0], "position id")
        cos2, sin2 = cos_cache, sin_cache
    else:
        if cos_cache.ndim == 2 and cos_cache.shape[0] == S:
            pos = np.broadcast_to(np.arange(S, dtype=np.int64), (B, S)).copy()
            cos2, sin2 = cos_cache, sin_cache
        elif cos_cache.ndim == 3 and cos_cache.shape[1] == S and cos_cache.shape[0] in (1, B):
            nb = cos_cache.shape[0]
            pos = (np.arange(B, dtype=np.int64)[:, None] * S * (nb > 1) + np.arange(S, dtype=np.int64)[None, :])
            cos2, sin2 = cos_cache.reshape(nb * S, half), sin_cache.reshape(nb * S, half)
        else:
            raise ShapeMismatchError(f"RotaryEmbedding: without position_ids the caches must be (batch {B}, seq {S}, "
                                     f"{half}), got {list(cos_cache.shape)}")
    cd = F32 if (lowp(T) or T == F32) else T
    xc = np.ascontiguousarray(x4, dtype=cd)
    out = np.empty(xc.shape, cd)
    if out.size:
        # Per-token tables (B, S, rot/2): the gather by position happens once, outside the kernel.
        cos_t = np.ascontiguousarray(np.asarray(cos2, dtype=cd)[pos])
        sin_t = np.ascontiguousarray(np.asarray(sin2, dtype=cd)[pos])
        rope_tok_kernel(xc, cos_t, sin_t, out, seq_second, bool(interleaved), rot)
    return out.reshape(X.shape).astype(T, copy=False)


# -- SwiGLU ----------------------------------------------------------------------------------------

@op("SwiGLU", 28)
def SwiGLU(A, B, *, alpha=1.0):
    if A.shape != B.shape or A.dtype != B.dtype:
        raise ShapeMismatchError(f"SwiGLU: A and B must have identical shapes and dtypes (no broadcasting), got "
                                 f"{list(A.shape)} {A.dtype} and {list(B.shape)} {B.dtype}")
    T = A.dtype
    cd = F64 if T == F64 else F32
    a = np.ascontiguousarray(A, dtype=cd).reshape(-1)
    b = np.ascontiguousarray(B, dtype=cd).reshape(-1)
    out = np.empty(a.shape, cd)
    if out.size:
        _swiglu_kernel(a, b, out, float(alpha))
    return out.reshape(A.shape).astype(T, copy=False)
