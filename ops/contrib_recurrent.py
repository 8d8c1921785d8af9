"""onnxruntime contrib (com.microsoft) forms of the stateful sequence ops: LinearAttention,
LinearAttentionGate, CausalConvWithState, as the GenAI model builder emits them (qwen35 gated DeltaNet,
lfm2 short convolutions).

LinearAttention reuses the default-domain kernel of ``ops/recurrent_state.py``; the contrib form adds
"inverse GQA" (``kv_num_heads > q_num_heads``: query and key carry ``q_num_heads`` heads, value and the
state ``kv_num_heads``, and state head ``g`` reads query/key head ``g // (kv_num_heads // q_num_heads)``,
producing one output per KV head), which the wrapper maps onto the ordinary case by repeating query and key
heads (small tensors next to the state).  CausalConvWithState has its own kernel because the contrib form
adds ``dilation`` and the channels-last layout (handled by transposing views in the wrapper).

Invariants:
- only ``state_window = 0`` (4-d recurrent state, 3-d conv state) and ``ndim = 1`` are supported; the
  CUDA-only attributes must keep their defaults; anything else raises ``InvalidAttributeError``;
- LinearAttentionGate computes in float64 and rounds once to the output dtype (``a``'s dtype);
- CausalConvWithState computes in float32; ``present_state`` holds the last ``(k - 1) * dilation`` positions
  of the past-padded input, in the input dtype.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32
from ._fastmath import fsigmoid
from .recurrent_state import LinearAttention as _linear_attention_default
from .registry import op

MS = "com.microsoft"
_OPTS = dict(cache=True, nogil=True, error_model="numpy")


def _s(x):
    return x.decode() if isinstance(x, bytes) else str(x)


# -- kernels ---------------------------------------------------------------------------------------

@njit(**_OPTS)
def _gate_kernel(a, dt_bias, decay_scale, b, decay, beta, has_b):
    """a/b/decay/beta (R, H) float32; decay = decay_scale * softplus(a + dt_bias), beta = sigmoid(b)."""
    R, H = a.shape
    for r in range(R):
        for h in range(H):
            z = np.float64(a[r, h]) + np.float64(dt_bias[h])
            sp = z if z > 20.0 else math.log1p(math.exp(z))
            decay[r, h] = np.float64(decay_scale[h]) * sp
            if has_b:
                beta[r, h] = 1.0 / (1.0 + math.exp(-np.float64(b[r, h])))


@njit(**_OPTS)
def _dilated_conv_kernel(x, w, bias, past, out, dil, silu):
    """x/out (B,C,L), w (C,K), bias (C,), past (B,C,P) with P = (K-1)*dil:
    out[t] = bias + sum_i w[i] * padded[t + i*dil], padded = past ++ x."""
    B, C, L = x.shape
    K = w.shape[1]
    P = past.shape[2]
    for b in range(B):
        for c in range(C):
            for t in range(L):
                acc = bias[c]
                for i in range(K):
                    p = t + i * dil
                    xv = past[b, c, p] if p < P else x[b, c, p - P]
                    acc += w[c, i] * xv
                if silu:
                    acc = acc * fsigmoid(acc)
                out[b, c, t] = acc


# -- LinearAttention -------------------------------------------------------------------------------

@op("LinearAttention", 1, domain=MS)
def LinearAttention(query, key, value, past_state=None, decay=None, beta=None, *, chunk_size=64,
                    kv_num_heads=None, q_num_heads=None, scale=0.0, update_rule="gated_delta", state_window=0):
    if state_window:
        raise InvalidAttributeError(f"LinearAttention (com.microsoft): state_window={state_window} is not supported "
                                    f"(only 0, the 4-d state)")
    if not q_num_heads or not kv_num_heads or q_num_heads <= 0 or kv_num_heads <= 0:
        raise InvalidAttributeError(f"LinearAttention: q_num_heads ({q_num_heads}) and kv_num_heads "
                                    f"({kv_num_heads}) must be positive")
    if kv_num_heads <= q_num_heads:
        return _linear_attention_default(query, key, value, past_state, decay, beta, chunk_size=chunk_size,
                                         kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, scale=scale,
                                         update_rule=update_rule)
    if kv_num_heads % q_num_heads:
        raise InvalidAttributeError(f"LinearAttention: kv_num_heads ({kv_num_heads}) must be a multiple of "
                                    f"q_num_heads ({q_num_heads}) for inverse grouped-query attention")
    for name, a in (("query", query), ("key", key), ("value", value)):
        if a.ndim != 3:
            raise ShapeMismatchError(f"LinearAttention: {name} must be 3-d (B, T, H*D), got {list(a.shape)}")
    B, T, hq = query.shape
    if hq % q_num_heads or key.shape != query.shape:
        raise ShapeMismatchError(f"LinearAttention: with kv_num_heads ({kv_num_heads}) > q_num_heads "
                                 f"({q_num_heads}) key must have query's shape {list(query.shape)} "
                                 f"(q_num_heads heads), got {list(key.shape)}")
    dk = hq // q_num_heads
    rep = kv_num_heads // q_num_heads
    # State head g reads query/key head g // rep: repeat the (small) query and key heads.
    q = np.repeat(query.reshape(B, T, q_num_heads, dk), rep, axis=2).reshape(B, T, kv_num_heads * dk)
    k = np.repeat(key.reshape(B, T, q_num_heads, dk), rep, axis=2).reshape(B, T, kv_num_heads * dk)
    return _linear_attention_default(q, k, value, past_state, decay, beta, chunk_size=chunk_size,
                                     kv_num_heads=kv_num_heads, q_num_heads=kv_num_heads,
                                     scale=scale if scale else 1.0 / math.sqrt(dk), update_rule=update_rule)


@op("LinearAttentionGate", 1, domain=MS)
def LinearAttentionGate(a, dt_bias, decay_scale, b=None):
    if a.ndim < 1:
        raise ShapeMismatchError(f"LinearAttentionGate: a must be (B, T, H), got {list(a.shape)}")
    H = a.shape[-1]
    for name, v in (("dt_bias", dt_bias), ("decay_scale", decay_scale)):
        if v.size != H:
            raise ShapeMismatchError(f"LinearAttentionGate: {name} must have {H} elements (a's last axis), got "
                                     f"shape {list(v.shape)}")
    if b is not None and b.shape != a.shape:
        raise ShapeMismatchError(f"LinearAttentionGate: b must have a's shape {list(a.shape)}, got {list(b.shape)}")
    R = a.size // H if H else 0
    a2 = np.ascontiguousarray(a, dtype=F32).reshape(R, H)
    b2 = a2 if b is None else np.ascontiguousarray(b, dtype=F32).reshape(R, H)
    dec = np.empty((R, H), F32)
    bt = np.empty((R, H) if b is not None else (0, H), F32)
    if a.size:
        _gate_kernel(a2, np.ascontiguousarray(dt_bias, dtype=F32).reshape(H),
                     np.ascontiguousarray(decay_scale, dtype=F32).reshape(H), b2, dec, bt, b is not None)
    dec = dec.reshape(a.shape).astype(a.dtype, copy=False)
    if b is None:
        return dec
    return dec, bt.reshape(a.shape).astype(a.dtype, copy=False)


# -- CausalConvWithState ---------------------------------------------------------------------------

@op("CausalConvWithState", 1, domain=MS)
def CausalConvWithState(input, weight, bias=None, past_state=None, *, activation="none", ndim=1, dilation=1,
                        channels_last=0, state_window=0, state_update_capacity=0, state_channels_last=-1,
                        state_length=0, input_channel_offset=0, input_channels=0):
    act = _s(activation)
    if act not in ("none", "silu", "swish"):
        raise InvalidAttributeError(f"CausalConvWithState: activation must be 'none', 'silu' or 'swish', got {act!r}")
    if ndim != 1 or state_window or state_update_capacity or state_channels_last != -1 or state_length \
            or input_channel_offset or input_channels:
        raise InvalidAttributeError(
            f"CausalConvWithState (com.microsoft): only ndim=1, state_window=0 and the default CUDA-only attributes "
            f"are supported, got ndim={ndim}, state_window={state_window}, state_update_capacity="
            f"{state_update_capacity}, state_channels_last={state_channels_last}, state_length={state_length}, "
            f"input_channel_offset={input_channel_offset}, input_channels={input_channels}")
    if dilation < 1:
        raise InvalidAttributeError(f"CausalConvWithState: dilation must be >= 1, got {dilation}")
    if channels_last:
        if input.ndim < 3:
            raise ShapeMismatchError(f"CausalConvWithState: channels-last input must be (batch, length, d_1, ...), "
                                     f"got {list(input.shape)}")
        B, L = input.shape[:2]
        C = int(math.prod(input.shape[2:]))
        x = input.reshape(B, L, C).transpose(0, 2, 1)
    else:
        if input.ndim != 3:
            raise ShapeMismatchError(f"CausalConvWithState: input must be (batch, channels, length), got "
                                     f"{list(input.shape)}")
        B, C, L = input.shape
        x = input
    if weight.ndim != 3 or weight.shape[0] != C or weight.shape[1] != 1 or weight.shape[2] < 1:
        raise ShapeMismatchError(f"CausalConvWithState: weight must be ({C}, 1, k), got {list(weight.shape)}")
    K = weight.shape[2]
    P = (K - 1) * int(dilation)
    if bias is not None and bias.size != C:
        raise ShapeMismatchError(f"CausalConvWithState: bias must be ({C},), got {list(bias.shape)}")
    if past_state is not None:
        if channels_last:
            if past_state.shape[:2] != (B, P) or int(math.prod(past_state.shape[2:])) != C:
                raise ShapeMismatchError(f"CausalConvWithState: past_state must be (batch={B}, {P}, channels...), "
                                         f"got {list(past_state.shape)}")
            past = past_state.reshape(B, P, C).transpose(0, 2, 1)
        else:
            if past_state.shape != (B, C, P):
                raise ShapeMismatchError(f"CausalConvWithState: past_state must be {[B, C, P]}, got "
                                         f"{list(past_state.shape)}")
            past = past_state
    else:
        past = None
    T = input.dtype
    if T.kind != "f" and T.name != "bfloat16":
        raise InvalidArgumentError(f"CausalConvWithState: expects a floating-point input, got {T}")
    xf = np.ascontiguousarray(x, dtype=F32)
    w = np.ascontiguousarray(weight, dtype=F32).reshape(C, K)
    bs = np.zeros(C, F32) if bias is None else np.ascontiguousarray(bias, dtype=F32).reshape(C)
    pf = np.zeros((B, C, P), F32) if past is None else np.ascontiguousarray(past, dtype=F32)
    out = np.empty((B, C, L), F32)
    if out.size:
        _dilated_conv_kernel(xf, w, bs, pf, out, int(dilation), act != "none")
    pad = np.zeros((B, C, P), T) if past is None else past.astype(T, copy=False)
    present = np.concatenate((pad, x.astype(T, copy=False)), axis=2)[:, :, L:] if P else np.zeros((B, C, 0), T)
    out = out.astype(T, copy=False)
    if channels_last:
        out = np.ascontiguousarray(out.transpose(0, 2, 1)).reshape(input.shape)
        present = np.ascontiguousarray(present.transpose(0, 2, 1)).reshape((B, P) + input.shape[2:])
    return out, np.ascontiguousarray(present)
