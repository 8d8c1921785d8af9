"""Stateful sequence ops of the default domain (opset 27): LinearAttention (CausalConvWithState, both domains, is
written once in ``ops/contrib_recurrent.py``).

Both carry a recurrent state between decode steps (``past_state`` in,
``present_state`` out).  Wrappers keep the packed 3-d layouts as 4-d views
(batch, time, heads, dim) so kernels index them without transposes, and
compute everything in float32 (the op types are float, float16, bfloat16).

Invariants:
- LinearAttention runs the recurrence token by token exactly as the spec
  states it (the ``chunk_size`` hint does not change results); the state is
  float32 inside and is cast to ``past_state``'s dtype (or the query's when no
  past is given) on output; query head ``h`` reads KV head
  ``h // (q_num_heads // kv_num_heads)``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32
from .registry import op

_RULES = {"linear": (False, False), "gated": (True, False), "delta": (False, True), "gated_delta": (True, True)}


def _s(x):
    return x.decode() if isinstance(x, bytes) else str(x)


# -- kernels ---------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _linear_attention_kernel(q, k, v, decay, beta, state, out, gating, delta, scale):
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


# -- LinearAttention -------------------------------------------------------------------------------

@op("LinearAttention", 27)
def LinearAttention(query, key, value, past_state=None, decay=None, beta=None, *, chunk_size=64,
                    kv_num_heads=None, q_num_heads=None, scale=0.0, update_rule="gated_delta"):
    rule = _s(update_rule)
    if rule not in _RULES:
        raise InvalidAttributeError(f"LinearAttention: update_rule must be one of {sorted(_RULES)}, got {rule!r}")
    gating, delta = _RULES[rule]
    if not q_num_heads or not kv_num_heads or q_num_heads <= 0 or kv_num_heads <= 0 or q_num_heads % kv_num_heads:
        raise InvalidAttributeError(f"LinearAttention: q_num_heads ({q_num_heads}) must be a positive multiple of "
                                    f"kv_num_heads ({kv_num_heads})")
    if gating != (decay is not None):
        raise InvalidArgumentError(f"LinearAttention: update_rule {rule!r} {'requires' if gating else 'forbids'} "
                                   f"the decay input")
    if delta != (beta is not None):
        raise InvalidArgumentError(f"LinearAttention: update_rule {rule!r} {'requires' if delta else 'forbids'} "
                                   f"the beta input")
    for name, a in (("query", query), ("key", key), ("value", value)):
        if a.ndim != 3:
            raise ShapeMismatchError(f"LinearAttention: {name} must be 3-d (B, T, H*D), got {list(a.shape)}")
    B, T, hq = query.shape
    if key.shape[:2] != (B, T) or value.shape[:2] != (B, T) or hq % q_num_heads or key.shape[2] % kv_num_heads \
            or value.shape[2] % kv_num_heads:
        raise ShapeMismatchError(f"LinearAttention: query {list(query.shape)}, key {list(key.shape)}, value "
                                 f"{list(value.shape)} do not split into {q_num_heads}/{kv_num_heads} heads")
    dk = hq // q_num_heads
    dv = value.shape[2] // kv_num_heads
    if key.shape[2] // kv_num_heads != dk:
        raise ShapeMismatchError(f"LinearAttention: key head size {key.shape[2] // kv_num_heads} differs from the "
                                 f"query head size {dk}")
    q = np.ascontiguousarray(query, dtype=F32).reshape(B, T, q_num_heads, dk)
    k = np.ascontiguousarray(key, dtype=F32).reshape(B, T, kv_num_heads, dk)
    v = np.ascontiguousarray(value, dtype=F32).reshape(B, T, kv_num_heads, dv)
    if decay is not None:
        if decay.ndim != 3 or decay.shape[:2] != (B, T) or decay.shape[2] not in (kv_num_heads, kv_num_heads * dk):
            raise ShapeMismatchError(f"LinearAttention: decay must be (B, T, {kv_num_heads}) or "
                                     f"(B, T, {kv_num_heads * dk}), got {list(decay.shape)}")
        dc = np.ascontiguousarray(decay, dtype=F32).reshape(B, T, kv_num_heads, decay.shape[2] // kv_num_heads)
    else:
        dc = np.zeros((1, 1, 1, 1), F32)
    if beta is not None:
        if beta.ndim != 3 or beta.shape[:2] != (B, T) or beta.shape[2] not in (kv_num_heads, 1):
            raise ShapeMismatchError(f"LinearAttention: beta must be (B, T, {kv_num_heads}) or (B, T, 1), got "
                                     f"{list(beta.shape)}")
        bt = np.ascontiguousarray(beta, dtype=F32)
    else:
        bt = np.ones((1, 1, 1), F32)
    if past_state is not None:
        if past_state.shape != (B, kv_num_heads, dk, dv):
            raise ShapeMismatchError(f"LinearAttention: past_state must be {[B, kv_num_heads, dk, dv]}, got "
                                     f"{list(past_state.shape)}")
        state = np.array(past_state, dtype=F32, copy=True)
        sdt = past_state.dtype
    else:
        state = np.zeros((B, kv_num_heads, dk, dv), F32)
        sdt = query.dtype
    sc = float(scale) if scale else 1.0 / math.sqrt(dk)
    out = np.empty((B, T, q_num_heads, dv), F32)
    if out.size or state.size:
        _linear_attention_kernel(q, k, v, dc, bt, state, out, gating, delta, np.float32(sc))
    return out.reshape(B, T, q_num_heads * dv).astype(query.dtype, copy=False), state.astype(sdt, copy=False)
