"""CUDA stateful sequence ops: LinearAttention (com.microsoft 1 and the default domain's opset 27),
com.microsoft LinearAttentionGate, CausalConvWithState (com.microsoft 1 and opset 27).

LinearAttention: the state ``S`` (B, Hkv, dk, dv) is float32 in device memory; one thread owns one value column
``S[b, g, :, m]``, since every step of the recurrence (decay, delta read-out ``S^T k``, rank-1 update
``k u^T``, query read-out ``q^T S``) touches column ``m`` only, so the whole time scan (decode: one token;
prefill: T tokens, sequentially) runs inside one launch without synchronization.  The grid is
(B * Hkv, ceil(dv / threads)), threads adjacent in ``m`` so state and value accesses coalesce.  The contrib
form's "inverse GQA" (``kv_num_heads > q_num_heads``: state head ``g`` reads query/key head
``g // (kv/q)`` and produces one output per KV head) is an index mapping, not a copy.

CausalConvWithState: one thread per output element of the depthwise cross-correlation over
``past_state ++ input`` (dilation and channels-last are index arithmetic), and one per ``present_state``
element (the last ``(k - 1) * dilation`` positions of the padded input).  LinearAttentionGate is elementwise.

Invariants (match ``ops/contrib_recurrent.py`` / ``ops/recurrent_state.py``):
- same attribute and shape checks and error classes as the CPU wrappers (only ``state_window = 0`` and
  ``ndim = 1``, the CUDA-only attributes at their defaults);
- arithmetic in float32; outputs in the query / input / ``a`` dtype; LinearAttention's ``present_state`` in
  ``past_state``'s dtype (the query's when absent);
- all tensors are C-contiguous device arrays; nothing is read back to the host.
"""
from __future__ import annotations

import math

import numpy as np

from ops._common import raise_coded
from ops.contrib_recurrent import Ccws, bind_ccws, bind_ccws_27, bind_la_gate, ccws_geometry, la_gate_check
from ops.linear_attention import (LA_ERRORS, LinAttn, bind_linear_attention, bind_linear_attention_ms,
                                  la_geometry, la_inputs)
from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ._common import FLOATS, check_device, copy_cast, fill0, flat, grid1d, row_threads

__all__ = ["launch_linattn", "launch_la_gate", "launch_ccws"]

CUDA = "CUDAExecutionProvider"
MS = "com.microsoft"
F32 = np.dtype(np.float32)


# -- kernels ---------------------------------------------------------------------------------------

@jit
def _la_scan(q, k, v, decay, beta, S, out, T, Hq, Hk, Hkv, Hout, dk, dv, nd, nb, group, krep,
             gating, delta, scale):
    """q (B,T,Hq,dk), k (B,T,Hk,dk), v (B,T,Hkv,dv), decay (B,T,Hkv,nd), beta (B,T,nb), S (B,Hkv,dk,dv) float32
    updated in place, out (B,T,Hout,dv); output head h (of group g's ``group`` heads) reads query head h // krep,
    state head g reads key head g // krep."""
    bg = cuda.blockIdx.x
    m = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if m >= dv:
        return
    b = bg // Hkv
    g = bg % Hkv
    sb = bg * dk * dv + m
    kh = g // krep
    for t in range(T):
        bt_ = b * T + t
        kb = (bt_ * Hk + kh) * dk
        vv = np.float32(v[(bt_ * Hkv + g) * dv + m])
        if delta:
            bta = np.float32(beta[bt_ * nb + (g if nb > 1 else 0)])
            r = np.float32(0.0)
            if gating:
                db = (bt_ * Hkv + g) * nd
                for d in range(dk):
                    s = S[sb + d * dv] * math.exp(np.float32(decay[db + (d if nd > 1 else 0)]))
                    S[sb + d * dv] = s
                    r += s * np.float32(k[kb + d])
            else:
                for d in range(dk):
                    r += S[sb + d * dv] * np.float32(k[kb + d])
            u = bta * (vv - r)
        else:
            if gating:
                db = (bt_ * Hkv + g) * nd
                for d in range(dk):
                    S[sb + d * dv] *= math.exp(np.float32(decay[db + (d if nd > 1 else 0)]))
            u = vv
        h0 = g * group
        qb = (bt_ * Hq + h0 // krep) * dk
        o = np.float32(0.0)
        for d in range(dk):
            s = S[sb + d * dv] + np.float32(k[kb + d]) * u
            S[sb + d * dv] = s
            o += np.float32(q[qb + d]) * s
        out[(bt_ * Hout + h0) * dv + m] = scale * o
        for h in range(h0 + 1, h0 + group):
            qb = (bt_ * Hq + h // krep) * dk
            o = np.float32(0.0)
            for d in range(dk):
                o += np.float32(q[qb + d]) * S[sb + d * dv]
            out[(bt_ * Hout + h) * dv + m] = scale * o


@jit
def _gate(a, dt_bias, decay_scale, b, has_b, decay, beta, H):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, a.size, step):
        h = i % H
        z = np.float32(a[i]) + np.float32(dt_bias[h])
        sp = z if z > np.float32(20.0) else math.log1p(math.exp(z))
        decay[i] = np.float32(decay_scale[h]) * sp
        if has_b:
            beta[i] = np.float32(1.0) / (np.float32(1.0) + math.exp(-np.float32(b[i])))


@jit(device=True)
def _at(a, b, c, t, C, n, cl):
    """Flat index of (batch b, channel c, position t) in a (B, C, n) or channels-last (B, n, C) tensor."""
    if cl:
        return (b * n + t) * C + c
    return (b * C + c) * n + t


@jit(device=True)
def _unravel(i, C, n, cl):
    """(batch b, channel c, position t) of flat index ``i`` in a (B, C, n) or channels-last (B, n, C) tensor."""
    if cl:
        return i // (C * n), i % C, (i // C) % n
    return i // (C * n), (i // n) % C, i % n


@jit(device=True)
def _padded(x, past, has_past, b, c, p, C, L, P, cl):
    """Position ``p`` of ``past ++ x`` (zeros for a missing past) along the length axis."""
    if p < P:
        if has_past:
            return np.float32(past[_at(past, b, c, p, C, P, cl)])
        return np.float32(0.0)
    return np.float32(x[_at(x, b, c, p - P, C, L, cl)])


@jit
def _cconv(x, w, bias, has_bias, past, has_past, out, C, L, K, P, dil, silu, cl):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, out.size, step):
        b, c, t = _unravel(i, C, L, cl)
        acc = np.float32(bias[c]) if has_bias else np.float32(0.0)
        for j in range(K):
            acc += np.float32(w[c * K + j]) * _padded(x, past, has_past, b, c, t + j * dil, C, L, P, cl)
        if silu:
            acc = acc / (np.float32(1.0) + math.exp(-acc))
        out[i] = acc


@jit
def _cconv_state(x, past, has_past, present, C, L, P, cl):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, present.size, step):
        b, c, j = _unravel(i, C, P, cl)
        present[i] = _padded(x, past, has_past, b, c, L + j, C, L, P, cl)


def _launch1d(kern, n, *args):
    if n:
        blocks, threads = grid1d(n)
        kern[blocks, threads](*args)


# -- LinearAttention -------------------------------------------------------------------------------

def _shape(a, rank):
    return (0,) * rank if a is None else tuple(int(v) for v in a.shape)


def launch_linattn(la: LinAttn, ctx=None):
    """The CUDA implementation of LinearAttention (opset 27 and com.microsoft), written once in
    ``ops/linear_attention.py`` (its binds, its checks and messages)."""

    def run(query, key, value, past_state=None, decay=None, beta=None):
        check_device("LinearAttention", query=query, key=key, value=value, past_state=past_state, decay=decay,
                     beta=beta)
        la_inputs(la, query, key, value, past_state, decay, beta)
        err, dk, dv, nd, nb, Hout = la_geometry(
            _shape(query, 3), _shape(key, 3), _shape(value, 3), _shape(decay, 3), decay is not None,
            _shape(beta, 3), beta is not None, _shape(past_state, 4), past_state is not None, la.Hq, la.Hkv)
        if err:
            raise_coded(LA_ERRORS, err, "LinearAttention")
        B, T = int(query.shape[0]), int(query.shape[1])
        Hkv = la.Hkv
        sshape = (B, Hkv, dk, dv)
        sdt = np.dtype(query.dtype if past_state is None else past_state.dtype)
        present = rc.device_empty(sshape, sdt)
        S = present if sdt == F32 else rc.device_empty(sshape, F32)
        if past_state is not None:
            _launch1d(copy_cast, S.size, flat(past_state), flat(S))
        else:
            _launch1d(fill0, S.size, flat(S))
        out = rc.device_empty((B, T, Hout * dv), query.dtype)
        if out.size:
            krep = Hkv // la.Hq if Hkv > la.Hq else 1
            threads = row_threads(dv)
            qf = flat(query)
            _la_scan[(B * Hkv, -(-dv // threads)), threads](
                qf, flat(key), flat(value), flat(decay) if decay is not None else qf,
                flat(beta) if beta is not None else qf, flat(S), flat(out), T, int(query.shape[2]) // dk,
                int(key.shape[2]) // dk, Hkv, Hout, dk, dv, nd, nb, Hout // Hkv, krep, la.gating, la.delta,
                np.float32(la.scale if la.scale else 1.0 / math.sqrt(dk)))
        if S is not present:
            _launch1d(copy_cast, S.size, flat(S), flat(present))
        return out, present
    return run


op("LinearAttention", 1, domain=MS, provider=CUDA, bind=bind_linear_attention_ms)(launch_linattn)
op("LinearAttention", 27, provider=CUDA, bind=bind_linear_attention)(launch_linattn)


# -- LinearAttentionGate ---------------------------------------------------------------------------

def launch_la_gate(_, ctx=None):
    """The CUDA implementation of LinearAttentionGate (its checks are ``contrib_recurrent.la_gate_check``)."""
    return _la_gate


def _la_gate(a, dt_bias, decay_scale, b=None):
    check_device("LinearAttentionGate", a=a, dt_bias=dt_bias, decay_scale=decay_scale, b=b)
    H = la_gate_check(a, dt_bias, decay_scale, b)
    dec = rc.device_empty(tuple(a.shape), a.dtype)
    bt = rc.device_empty(tuple(a.shape) if b is not None else (1,), a.dtype)
    af = flat(a)
    _launch1d(_gate, a.size, af, flat(dt_bias), flat(decay_scale), flat(b) if b is not None else af,
              b is not None, flat(dec), flat(bt), H)
    return dec if b is None else (dec, bt)


op("LinearAttentionGate", 1, domain=MS, provider=CUDA, bind=bind_la_gate)(launch_la_gate)


# -- CausalConvWithState ---------------------------------------------------------------------------

def _causal_conv(input, weight, bias, past, B, C, L, K, dil, act, cl, oshape, pshape):
    P = (K - 1) * dil
    out = rc.device_empty(oshape, input.dtype)
    present = rc.device_empty(pshape, input.dtype)
    xf = flat(input)
    pf = flat(past) if past is not None else xf
    _launch1d(_cconv, out.size, xf, flat(weight), flat(bias) if bias is not None else xf, bias is not None,
              pf, past is not None, flat(out), C, L, K, P, dil, act != "none", cl)
    _launch1d(_cconv_state, present.size, xf, pf, past is not None, flat(present), C, L, P, cl)
    return out, present


def launch_ccws(c: Ccws, ctx=None):
    """The CUDA implementation of CausalConvWithState (com.microsoft and opset 27), written once in
    ``ops/contrib_recurrent.py`` (its binds, its checks and messages)."""

    def run(input, weight, bias=None, past_state=None):
        check_device("CausalConvWithState", input=input, weight=weight, bias=bias, past_state=past_state)
        B, C, L, K, P = ccws_geometry(c, input, weight, bias, past_state)
        if np.dtype(input.dtype) not in FLOATS:
            raise InvalidArgumentError(f"CausalConvWithState: expects a floating-point input, got {input.dtype}")
        shape = tuple(input.shape)
        pshape = (B, P) + shape[2:] if c.channels_last else (B, C, P)
        return _causal_conv(input, weight, bias, past_state, B, C, L, K, c.dilation, "silu" if c.silu else "none",
                            c.channels_last, shape, pshape)
    return run


op("CausalConvWithState", 1, domain=MS, provider=CUDA, bind=bind_ccws)(launch_ccws)
op("CausalConvWithState", 27, provider=CUDA, bind=bind_ccws_27)(launch_ccws)
