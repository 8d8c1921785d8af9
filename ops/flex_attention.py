"""FlexAttention (ai.onnx.preview, 1): scaled dot-product attention with score_mod / prob_mod subgraphs.

    Scores = (Q * sqrt(scale)) @ (K * sqrt(scale))^T      # (B, Hq, L, S)
    Scores = score_mod(Scores)                              # optional GRAPH attribute
    Probs  = Softmax(Scores, axis=-1)
    Probs  = prob_mod(Probs)                                # optional GRAPH attribute
    Y      = Probs @ V                                      # (B, Hq, L, Ev)

Without modifiers the node runs the fused, row-streaming kernel of
``ops/attention.py`` (no (L, S) score tensor is materialized).  With a
modifier, ``_flex_scores`` materializes the scores, the modifier subgraph
runs as a child plan (``runtime.subgraph.plan_subgraph``, planned once at
bind time, reading outer-scope values the executor passes after Q, K, V),
and ``_flex_softmax_pv`` does the softmax and/or Probs @ V.

Invariants:
- the compute dtype is float64 when the softmax precision is double, else
  float32; 16-bit inputs are scaled by sqrt(scale) in their own precision
  first (as the reference does) and rounded back to V's dtype once at the end;
- the modifier subgraphs see the softmax-precision dtype (``softmax_precision``,
  default float32 for non-double inputs, double otherwise) and must return
  a tensor of the scores' shape;
- a query row whose scores are all -inf yields zeros, never NaN;
- GQA maps query head ``h`` to key/value head ``h // (Hq // Hkv)``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange
from onnx import TensorProto

from runtime.dtypes import np_dtype
from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, lowp
from .attention import attention_kernel, exp_shift, head_task, row_max
from .registry import op

F64 = np.dtype(np.float64)
_PRECISIONS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


# -- kernels ---------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def _flex_scores(q, k, sq, s):
    """s[b,h,i,j] = sum_d (q[b,h,i,d]*sq) * (k[b,h//g,j,d]*sq); q (B,Hq,L,E), k (B,Hkv,S,E), s (B,Hq,L,S)."""
    B, Hq, L, E = q.shape
    Hkv = k.shape[1]
    S = k.shape[2]
    group = Hq // Hkv
    zero = np.zeros(1, s.dtype)[0]
    for bh in prange(B * Hq):
        b, h, kh = head_task(bh, Hq, group)
        for i in range(L):
            qi = q[b, h, i]
            for j in range(S):
                kj = k[b, kh, j]
                t = zero
                for d in range(E):
                    t += (qi[d] * sq) * (kj[d] * sq)
                s[b, h, i, j] = t


@njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def _flex_softmax_pv(s, v, y, do_softmax, do_pv):
    """Per row of s (B,Hq,L,S): softmax in place if ``do_softmax``; y (B,Hq,L,Ev) = s @ v[kv head] if ``do_pv``."""
    B, Hq, L, S = s.shape
    Hkv = v.shape[1]
    Ev = v.shape[3]
    group = Hq // Hkv
    ninf = -np.inf
    zero = np.zeros(1, s.dtype)[0]
    one = zero + 1
    for bh in prange(B * Hq):
        b, h, kh = head_task(bh, Hq, group)
        for i in range(L):
            row = s[b, h, i]
            if do_softmax:
                m = row_max(row)
                if m == ninf:
                    # every key masked: zeros rather than NaN
                    for j in range(S):
                        row[j] = zero
                else:
                    tot = exp_shift(row, m, zero)
                    inv = one / tot
                    for j in range(S):
                        row[j] *= inv
            if do_pv:
                out = y[b, h, i]
                for dd in range(Ev):
                    out[dd] = zero
                for j in range(S):
                    p = row[j]
                    if p != 0.0:
                        vj = v[b, kh, j]
                        for dd in range(Ev):
                            out[dd] += p * vj[dd]


# -- wrapper ---------------------------------------------------------------------------------------

def _mod_dtype(T, softmax_precision):
    if softmax_precision is None:
        return F64 if T == F64 else F32
    p = int(softmax_precision)
    if p not in _PRECISIONS:
        raise InvalidAttributeError(f"FlexAttention: softmax_precision must be one of FLOAT (1), FLOAT16 (10), "
                                    f"BFLOAT16 (16) or DOUBLE (11), got {p}")
    return np_dtype(p)


def _run_mod(child, x, md, cd, captured, what):
    """Run a modifier subgraph on ``x`` (compute dtype) and return a contiguous result of x's shape in ``cd``."""
    feed = x if md == cd else x.astype(md)
    outs = child.run([feed], captured)
    if len(outs) != 1:
        raise InvalidArgumentError(f"FlexAttention: {what} must produce exactly 1 output, got {len(outs)}")
    r = np.asarray(outs[0])
    if r.shape != x.shape:
        raise ShapeMismatchError(f"FlexAttention: {what} must return shape {list(x.shape)} like its input, "
                                 f"got {list(r.shape)}")
    # The child returns fresh arrays (graph outputs never alias its arena or feeds), so an
    # array already in the compute dtype can be modified in place by the next kernel.
    if r.dtype != cd or not r.flags.c_contiguous or not r.flags.writeable:
        r = np.array(r, dtype=cd, order="C")
    return r


@op("FlexAttention", 1, domain="ai.onnx.preview", factory=True)
def FlexAttention(ctx, prob_mod=None, scale=None, score_mod=None, softmax_precision=None):
    from runtime.subgraph import plan_subgraph  # late: the runtime imports ops

    if ctx.n_inputs != 3:
        raise InvalidArgumentError(f"FlexAttention: expected 3 inputs (Q, K, V), got {ctx.n_inputs}")
    score_p = plan_subgraph(score_mod, ctx) if score_mod is not None else None
    prob_p = plan_subgraph(prob_mod, ctx) if prob_mod is not None else None
    for p, what in ((score_p, "score_mod"), (prob_p, "prob_mod")):
        if p is not None and len(p.input_names) != 1:
            raise InvalidAttributeError(f"FlexAttention: {what} must take exactly 1 input, "
                                        f"got {len(p.input_names)}")
    if softmax_precision is not None:
        _mod_dtype(F32, softmax_precision)  # validate at bind time

    def run(Q, K, V, *captured):
        T = Q.dtype
        if K.dtype != T or V.dtype != T:
            raise InvalidArgumentError(f"FlexAttention: Q, K and V must share one dtype, got {T}, {K.dtype}, "
                                       f"{V.dtype}")
        if Q.ndim != 4 or K.ndim != 4 or V.ndim != 4:
            raise ShapeMismatchError(f"FlexAttention: Q, K, V must be rank 4, got shapes {list(Q.shape)}, "
                                     f"{list(K.shape)}, {list(V.shape)}")
        B, Hq, L, E = Q.shape
        _, Hkv, S, _ = K.shape
        Ev = V.shape[3]
        if K.shape[0] != B or V.shape[0] != B or K.shape[3] != E or V.shape[1] != Hkv or V.shape[2] != S:
            raise ShapeMismatchError(f"FlexAttention: inconsistent shapes Q {list(Q.shape)}, K {list(K.shape)}, "
                                     f"V {list(V.shape)}; expected Q (B,Hq,L,E), K (B,Hkv,S,E), V (B,Hkv,S,Ev)")
        if Hkv == 0 or Hq % Hkv:
            raise ShapeMismatchError(f"FlexAttention: q heads ({Hq}) must be a multiple of kv heads ({Hkv})")
        sc = (1.0 / math.sqrt(E)) if scale is None else float(scale)
        md = _mod_dtype(T, softmax_precision)
        cd = F64 if md == F64 else F32
        sq = math.sqrt(np.float32(sc))
        if lowp(T):
            # the reference scales 16-bit inputs in their own precision before the product
            st = np.array(sq, dtype=T)
            qc = np.ascontiguousarray(Q * st, dtype=cd)
            kc = np.ascontiguousarray(K * st, dtype=cd)
            sq = 1.0
        else:
            qc = np.ascontiguousarray(Q, dtype=cd)
            kc = np.ascontiguousarray(K, dtype=cd)
        vc = np.ascontiguousarray(V, dtype=cd)
        y = np.empty((B, Hq, L, Ev), cd)
        if y.size == 0:
            return y.astype(T)
        if score_p is None and prob_p is None:
            params = np.array([sq * sq, 0.0], cd)
            attention_kernel(qc, kc, vc, np.zeros((1, 1, 1, S), cd), np.zeros(B, np.int64),
                              np.full(B, S, np.int64), params, False, -1, -1, 0, False, y,
                              np.empty((1, 1, 1, 1), cd))
            return y.astype(T)
        s = np.empty((B, Hq, L, S), cd)
        _flex_scores(qc, kc, cd.type(sq), s)
        if score_p is not None:
            s = _run_mod(score_p, s, md, cd, captured, "score_mod")
        if prob_p is not None:
            _flex_softmax_pv(s, vc, y, True, False)
            s = _run_mod(prob_p, s, md, cd, captured, "prob_mod")
            _flex_softmax_pv(s, vc, y, False, True)
        else:
            _flex_softmax_pv(s, vc, y, True, True)
        return y.astype(T)

    return run
