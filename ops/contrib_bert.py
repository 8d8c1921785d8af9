"""onnxruntime's fused BERT and GPT-2 ops (domain com.microsoft): ``EmbedLayerNormalization`` and ``Attention``,
as onnxruntime's transformer optimizer writes them into encoder and legacy decoder exports.

``EmbedLayerNormalization`` adds the word, position and (optional) segment embedding rows of each token and
normalizes the sum over the hidden axis in onnxruntime's CPU order: the sum, its mean (one float32 running sum
divided by the width), the centred values and their mean square (a second running sum), then
``y = (x - mean) / sqrt(var + epsilon) * gamma + beta``.  ``mask_index`` is the count of ones in each row of
``mask`` (zeros without a mask); ``embedding_sum`` is the sum before the normalization.

``Attention`` projects the input with the merged Q/K/V weights (``input @ weights + bias``), splits the heads,
appends the new keys and values to ``past`` (``(2, batch, heads, past, head_size)``) into ``present``, and runs
the shared prefill kernel with one additive bias: ``mask_filter_value`` where ``mask_index`` masks a key, 0
elsewhere, plus ``attention_bias`` (refused with ``past``, as onnxruntime refuses it).  ``unidirectional`` leaves
the keys after ``past + s`` out of query ``s``'s softmax altogether, as onnxruntime's kernel does (a row whose
remaining keys are all masked then spreads over those keys, not over the future ones).
``mask_index`` takes onnxruntime's CPU formats: ``(batch)`` end positions (right padding), ``(2 * batch)`` end
then start positions (left padding), raw 0/1 masks ``(batch, total)`` and ``(batch, sequence, total)``.

Invariants:
- every id is checked against its table before a row is read (``IndexOutOfRangeError`` naming the input);
- 16-bit floats are computed in float32 and rounded back once;
- what onnxruntime's CPU kernel refuses (a 4-d Megatron mask, rotary, a shared past/present buffer) is an error
  naming the attribute or input, never a silent approximation.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from runtime.errors import IndexOutOfRangeError, InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from .contrib_attention import _DUMMY1, _DUMMY4, gqa_prefill
from .matmul import matmul_nd
from .registry import op

_MS = "com.microsoft"
F32 = np.float32


# -- EmbedLayerNormalization -----------------------------------------------------------------------

@njit(cache=True, nogil=True, parallel=True)
def _embed_ln(ids, seg, pos, word, pemb, semb, gamma, beta, eps, y, sums, has_seg, want_sum):
    """One task per token: the embedding rows summed, then normalized in onnxruntime's order."""
    B, S = ids.shape
    H = word.shape[1]
    for t in prange(B * S):
        b = t // S
        s = t - b * S
        w = ids[b, s]
        p = pos[b if pos.shape[0] > 1 else 0, s]
        total = np.float32(0.0)
        for i in range(H):
            v = word[w, i] + pemb[p, i]
            if has_seg:
                v += semb[seg[b, s], i]
            if want_sum:
                sums[b, s, i] = v
            y[b, s, i] = v
            total += v
        mean = total / np.float32(H)
        sq = np.float32(0.0)
        for i in range(H):
            a = y[b, s, i] - mean
            y[b, s, i] = a
            sq += a * a
        e = np.sqrt(sq / np.float32(H) + eps)
        for i in range(H):
            y[b, s, i] = y[b, s, i] / e * gamma[i] + beta[i]


def _ids(name, what, x, rows, shape):
    """``x`` as int32 of ``shape`` (a leading 1 broadcasts for position ids), every value in [0, rows)."""
    a = np.ascontiguousarray(x, dtype=np.int32)
    if a.ndim != 2 or a.shape[1] != shape[1] or a.shape[0] not in ((shape[0], 1) if what == "position_ids"
                                                                   else (shape[0],)):
        raise ShapeMismatchError(f"{name}: {what} must have shape {list(shape)}, got {list(a.shape)}")
    if a.size and (int(a.min()) < 0 or int(a.max()) >= rows):
        bad = int(a.min()) if int(a.min()) < 0 else int(a.max())
        raise IndexOutOfRangeError(f"{name}: {what} holds {bad}, outside [0, {rows}) of its embedding table")
    return a


@op("EmbedLayerNormalization", 1, domain=_MS)
def EmbedLayerNormalization(input_ids, segment_ids=None, word_embedding=None, position_embedding=None,
                            segment_embedding=None, gamma=None, beta=None, mask=None, position_ids=None, *,
                            ctx=None, epsilon=1e-12, mask_index_type=1):
    """com.microsoft EmbedLayerNormalization on the CPU (see the module's docstring)."""
    name = "EmbedLayerNormalization"
    if word_embedding is None or position_embedding is None or gamma is None or beta is None:
        raise InvalidArgumentError(f"{name}: word_embedding, position_embedding, gamma and beta are required")
    dtype = word_embedding.dtype
    word, pemb = np.ascontiguousarray(word_embedding, F32), np.ascontiguousarray(position_embedding, F32)
    if word.ndim != 2 or pemb.ndim != 2 or pemb.shape[1] != word.shape[1]:
        raise ShapeMismatchError(f"{name}: word_embedding and position_embedding must be 2-d of one width, got "
                                 f"{list(word.shape)} and {list(pemb.shape)}")
    H = word.shape[1]
    g, bt = np.ascontiguousarray(gamma, F32).reshape(-1), np.ascontiguousarray(beta, F32).reshape(-1)
    if g.shape[0] != H or bt.shape[0] != H:
        raise ShapeMismatchError(f"{name}: gamma and beta must have {H} values, got {g.shape[0]} and {bt.shape[0]}")
    if input_ids.ndim != 2:
        raise ShapeMismatchError(f"{name}: input_ids must be (batch, sequence), got {list(input_ids.shape)}")
    B, S = input_ids.shape
    ids = _ids(name, "input_ids", input_ids, word.shape[0], (B, S))
    if position_ids is not None:
        pos = _ids(name, "position_ids", position_ids, pemb.shape[0], (B, S))
    else:
        if S > pemb.shape[0]:
            raise IndexOutOfRangeError(f"{name}: {S} positions need {S} rows of position_embedding, it has "
                                       f"{pemb.shape[0]}")
        pos = np.arange(S, dtype=np.int32).reshape(1, S)
    has_seg = segment_ids is not None and segment_embedding is not None
    if (segment_ids is None) != (segment_embedding is None):
        raise InvalidArgumentError(f"{name}: segment_ids and segment_embedding must be given together")
    semb = np.ascontiguousarray(segment_embedding, F32) if has_seg else np.zeros((1, H), F32)
    if has_seg and (semb.ndim != 2 or semb.shape[1] != H):
        raise ShapeMismatchError(f"{name}: segment_embedding must be (segments, {H}), got {list(semb.shape)}")
    seg = _ids(name, "segment_ids", segment_ids, semb.shape[0], (B, S)) if has_seg else np.zeros((1, 1), np.int32)
    n_out = ctx.n_outputs if ctx is not None else 1
    want_sum = n_out > 2 and (ctx is None or ctx.outputs_used[2])
    y = np.empty((B, S, H), F32)
    sums = np.empty((B, S, H), F32) if want_sum else np.empty((1, 1, 1), F32)
    _embed_ln(ids, seg, pos, word, pemb, semb, g, bt, F32(epsilon), y, sums, has_seg, want_sum)
    out = [y.astype(dtype, copy=False)]
    if n_out > 1:
        if mask is not None:
            m = np.asarray(mask)
            if m.shape != (B, S):
                raise ShapeMismatchError(f"{name}: mask must have shape {[B, S]}, got {list(m.shape)}")
            out.append((m == 1).sum(axis=1).astype(np.int32))
        else:
            out.append(np.zeros(B, np.int32))
    if n_out > 2:
        out.append(sums.astype(dtype, copy=False) if want_sum else np.empty((B, S, H), dtype))
    return tuple(out) if n_out > 1 else out[0]


# -- Attention -------------------------------------------------------------------------------------

def _mask_keep(name, mask_index, B, S, P, T):
    """The keys ``mask_index`` lets each query row see, as a (B, 1 or S, T) boolean array (None: all)."""
    if mask_index is None:
        return None
    m = np.asarray(mask_index)
    t = np.arange(T)
    if m.ndim == 1 and m.shape[0] == B:  # end positions: right padding
        return (t[None, :] < m.astype(np.int64)[:, None])[:, None, :]
    if m.ndim == 1 and m.shape[0] == 2 * B:  # end positions, then start positions: left padding
        end, start = m[:B].astype(np.int64), m[B:].astype(np.int64)
        return ((t[None, :] < end[:, None]) & (t[None, :] >= start[:, None]))[:, None, :]
    if m.ndim == 2 and m.shape == (B, T):
        return (m > 0)[:, None, :]
    if m.ndim == 3 and m.shape == (B, S, T):
        return m > 0
    raise ShapeMismatchError(f"{name}: mask_index must have shape [{B}], [{2 * B}], [{B}, {T}] or [{B}, {S}, {T}] "
                             f"(onnxruntime's CPU formats), got {list(m.shape)}")


@op("Attention", 1, domain=_MS)
def Attention(input, weights=None, bias=None, mask_index=None, past=None, attention_bias=None,
              past_sequence_length=None, *, ctx=None, num_heads=0, qkv_hidden_sizes=None, scale=0.0,
              unidirectional=0, mask_filter_value=-10000.0, do_rotary=0, past_present_share_buffer=0,
              rotary_embedding_dim=0):
    """com.microsoft Attention on the CPU (see the module's docstring)."""
    name = "Attention"
    H = int(num_heads)
    if H <= 0:
        raise InvalidAttributeError(f"{name}: num_heads must be positive, got {num_heads}")
    if int(do_rotary):
        raise InvalidAttributeError(f"{name}: do_rotary=1 is not supported by this kernel (as onnxruntime's CPU "
                                    f"kernel; use RotaryEmbedding before MultiHeadAttention)")
    if int(past_present_share_buffer) or past_sequence_length is not None:
        raise InvalidArgumentError(f"{name}: past_present_share_buffer and past_sequence_length (a shared "
                                   f"max-length cache) are not supported by this kernel")
    if weights is None:
        raise InvalidArgumentError(f"{name}: weights are required")
    if input.ndim != 3 or weights.ndim != 2 or weights.shape[0] != input.shape[2]:
        raise ShapeMismatchError(f"{name}: input must be (batch, sequence, width) and weights (width, q+k+v), got "
                                 f"{list(input.shape)} and {list(weights.shape)}")
    total = weights.shape[1]
    if qkv_hidden_sizes is not None and len(qkv_hidden_sizes):
        hq, hk, hv = (int(v) for v in qkv_hidden_sizes)
        if len(qkv_hidden_sizes) != 3 or hq != hk or hq + hk + hv != total:
            raise InvalidAttributeError(f"{name}: qkv_hidden_sizes must be 3 sizes, Q's equal to K's, summing to "
                                        f"the weights' {total} columns; got {list(qkv_hidden_sizes)}")
    else:
        if total % 3:
            raise ShapeMismatchError(f"{name}: weights must have 3 x hidden columns, got {total}")
        hq = hk = hv = total // 3
    if hq % H or hv % H:
        raise ShapeMismatchError(f"{name}: hidden sizes {hq} and {hv} must be multiples of num_heads {H}")
    D, Dv = hq // H, hv // H
    dtype = input.dtype
    B, S, _ = input.shape
    qkv = matmul_nd(np.ascontiguousarray(input, F32), np.ascontiguousarray(weights, F32))
    if bias is not None:
        b = np.ascontiguousarray(bias, F32).reshape(-1)
        if b.shape[0] != total:
            raise ShapeMismatchError(f"{name}: bias must have {total} values, got {b.shape[0]}")
        qkv = qkv + b
    q = np.ascontiguousarray(qkv[:, :, :hq]).reshape(B, S, H, D)
    k = np.ascontiguousarray(qkv[:, :, hq:hq + hk].reshape(B, S, H, D).transpose(0, 2, 1, 3))
    v = np.ascontiguousarray(qkv[:, :, hq + hk:].reshape(B, S, H, Dv).transpose(0, 2, 1, 3))
    P = 0
    if past is not None:
        if D != Dv or past.ndim != 5 or past.shape[0] != 2 or past.shape[1] != B or past.shape[2] != H \
                or past.shape[4] != D:
            raise ShapeMismatchError(f"{name}: past must have shape [2, {B}, {H}, P, {D}] (and Q, K, V one head "
                                     f"size), got {list(past.shape)}")
        P = past.shape[3]
        pf = np.ascontiguousarray(past, F32)
        k = np.concatenate([pf[0], k], axis=2)
        v = np.concatenate([pf[1], v], axis=2)
    T = P + S
    keep = _mask_keep(name, mask_index, B, S, P, T)
    add = None
    if keep is not None:
        add = np.where(keep, F32(0.0), F32(mask_filter_value)).astype(F32)[:, None]  # (B, 1, S|1, T)
        add = np.ascontiguousarray(np.broadcast_to(add, (B, 1, S, T)))
    if attention_bias is not None:
        ab = np.ascontiguousarray(attention_bias, F32)
        if past is not None:
            raise InvalidArgumentError(f"{name}: attention_bias cannot be given with past (as in onnxruntime)")
        if ab.ndim != 4 or ab.shape[0] not in (1, B) or ab.shape[1] not in (1, H) or ab.shape[2:] != (S, T):
            raise ShapeMismatchError(f"{name}: attention_bias must have shape [{B} or 1, {H} or 1, {S}, {T}], got "
                                     f"{list(ab.shape)}")
        add = ab if add is None else ab + add
    has_bias = add is not None
    params = np.array([float(scale) if scale else 1.0 / math.sqrt(D), 0.0], F32)
    out = np.empty((B, S, H, Dv), F32)
    gqa_prefill(q, k, v, np.full(B, P, np.int64), np.full(B, T, np.int64), np.zeros(B, np.int64), params,
                bool(int(unidirectional)), -1, np.ascontiguousarray(add) if has_bias else _DUMMY4, has_bias, _DUMMY1, 0, _DUMMY4, 0, out)
    y = out.reshape(B, S, H * Dv).astype(dtype, copy=False)
    n_out = ctx.n_outputs if ctx is not None else 1
    if n_out > 1:
        if D != Dv:
            raise ShapeMismatchError(f"{name}: present needs one head size for K and V, got {D} and {Dv}")
        return y, np.stack([k, v]).astype(dtype, copy=False)
    return y
