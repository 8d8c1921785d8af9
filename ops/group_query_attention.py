"""com.microsoft GroupQueryAttention, written once: its bind, its checks, its typed driver, its CPU wrapper and
its region form (the CUDA launch in ``ops/cuda/contrib_attention.py`` shares the bind and the checks).

The semantics (onnxruntime's CPU kernel: the positions each batch entry caches, the causal and local windows,
the windowed cache of fixed capacity) are stated in ``ops/contrib_attention.py``, whose attention kernels the
driver calls.  The op in four parts:
- ``bind_gqa(ctx, **attributes)``: the attributes with their defaults, checked once; returns ``Gqa``;
- ``gqa_inputs``: which inputs are present and their ranks (Python, run time; a form knows them statically);
  the fused q/k norms (``q_norm_weight``, ``k_norm_weight``, ``qk_norms``) run in the CPU wrapper, before the
  driver (onnxruntime computes them on CUDA and WebGPU only; the region form and the CUDA launch decline them);
- ``gqa_geometry``, ``gqa_positions``, ``gqa_extras``: the run-time checks and the per-entry positions, typed
  (``@njit``) so that the driver, the CPU wrapper and the CUDA launch run the very same code; each returns an
  error code into ``GQA_ERRORS``, the one table of messages;
- ``gqa_f32``: the driver, on float32 arrays: checks, rotary, present caches (written in place into a donated
  past with room for the total), the attention, the windowed cache's eviction.

Invariants:
- 16-bit float inputs are computed in float32 and rounded back once (the CPU wrapper converts);
- the driver never writes its inputs except a past it is told it may share (``share``, the region form's
  donated caches); present rows past the live ones are zero in a fresh cache, left as they are in a shared one;
- every index a kernel reads (positions into the cos/sin caches, cache rows) is checked before it is read;
- ``local_window_size`` 0 attends no key: the output is zeros, as onnxruntime's, and the caches are written as
  usual (``-1``, the default, is no window).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from . import _mlas_attention as ma
from . import _prefill_attention as pa
from . import contrib_attention as ca
from ._common import constant_twin, mlas_order, raise_coded
from ._glue import GlueCompiler
from ._simd import AVX512
from .attention import rope_tok_kernel
from .forms import Decline, float_only, raise_on, form
from .registry import op

__all__ = ["Gqa", "bind_gqa", "gqa_inputs", "qk_norms", "gqa_geometry", "gqa_positions", "gqa_extras", "gqa_f32",
           "GQA_ERRORS", "raise_gqa_error", "qkv_rows", "rotate_qk", "gqa_f32_mlas", "gqa_f32_blocked",
           "blocked_prefill", "driver"]

MS = "com.microsoft"
F32 = np.dtype(np.float32)
_OPTS = dict(cache=True, nogil=True, error_model="numpy")
_MLAS = False       # ``gqa_f32_mlas``: MLAS's order (a compile-time constant: see ``_common.constant_twin``)
_FLASH = not AVX512  # the flash kernels compiled in: MLAS's order, or a host without the blocked prefill kernel
_BLOCKED = False  # ``gqa_f32_blocked``: every several-row step on the blocked prefill (``blocked_prefill``)
_FLASH_ONLY = False  # ``gqa_f32_mlas_flash``: MLAS's order where the plan knows every step takes the flash kernels


class Gqa(NamedTuple):
    """A GroupQueryAttention node bound at plan time."""

    H: int                # num_heads
    kvH: int              # kv_num_heads
    scale: float          # 0: 1 / sqrt(head_size)
    softcap: float
    window: int           # local_window_size, -1 for none
    rotary: bool          # do_rotary
    interleaved: bool     # rotary_interleaved
    smooth: bool          # smooth_softmax
    causal: bool
    qk_output: int        # 0 none, 1 raw scores, 2 probabilities (output 3)
    windowed: bool        # sliding_window_cache
    n_outputs: int
    no_keys: bool = False  # local_window_size 0: a window of no key, and onnxruntime's output is zeros
    qk_eps: float = 1e-6   # qk_norm_epsilon: the fused q/k norms' epsilon


def bind_gqa(ctx, num_heads=0, kv_num_heads=0, scale=0.0, softcap=0.0, local_window_size=-1, do_rotary=0,
             rotary_interleaved=0, smooth_softmax=-1, causal=1, qk_output=0, sliding_window_cache=0,
             kv_cache_bit_width=0, k_quant_type="NONE", v_quant_type="NONE", qk_norm_epsilon=1e-6,
             q_norm_epsilon=None, k_norm_epsilon=None) -> Gqa:
    H, kvH = int(num_heads), int(kv_num_heads)
    if H <= 0 or kvH <= 0 or H % kvH:
        raise InvalidAttributeError(f"GroupQueryAttention: num_heads ({H}) must be a positive multiple of "
                                    f"kv_num_heads ({kvH})")
    if int(kv_cache_bit_width) or k_quant_type not in ("NONE", b"NONE") or v_quant_type not in ("NONE", b"NONE"):
        raise InvalidAttributeError("GroupQueryAttention: quantized KV caches are not supported by this kernel")
    w = int(local_window_size)
    return Gqa(H, kvH, float(scale), float(softcap), w if w > 0 else -1, bool(int(do_rotary)),
               bool(int(rotary_interleaved)), int(smooth_softmax) > 0, bool(int(causal)), int(qk_output),
               bool(int(sliding_window_cache)), ctx.n_outputs, w == 0, float(qk_norm_epsilon))


# -- checks ----------------------------------------------------------------------------------------

GQA_ERRORS = {
    1: ("ShapeMismatchError", "the packed QKV width is not a multiple of num_heads + 2 * kv_num_heads"),
    2: ("ShapeMismatchError", "the query width is not a multiple of num_heads"),
    3: ("ShapeMismatchError", "key and value must both have shape (batch, sequence, kv_num_heads * head_size)"),
    4: ("ShapeMismatchError", "past_key and past_value must both have shape (batch, kv_num_heads, past, "
                              "head_size)"),
    5: ("ShapeMismatchError", "seqlens_k must have batch_size entries"),
    6: ("InvalidArgumentError", "seqlens_k do not fit sequence_length, total_sequence_length and the past"),
    7: ("InvalidArgumentError", "sliding_window_cache=1 needs local_window_size > 0 and past buffers of capacity "
                                "at least local_window_size"),
    8: ("InvalidArgumentError", "seqlens_k exceed total_sequence_length"),
    9: ("ShapeMismatchError", "cos_cache and sin_cache must be alike and rotate at most head_size dims"),
    10: ("IndexOutOfRangeError", "a position id is outside the cos/sin caches"),
    11: ("ShapeMismatchError", "position_ids must have shape (batch, sequence) or one element"),
    12: ("ShapeMismatchError", "attention_bias must have shape (batch or 1, num_heads or 1, sequence or 1, "
                               "at least the total length)"),
    13: ("ShapeMismatchError", "head_sink must have num_heads entries"),
    14: ("ShapeMismatchError", "the step's head size or attention options (softcap, sinks, score output) are not "
                               "ones the plan compiled this node's attention kernels for"),
}


def raise_gqa_error(code: int, detail: str = ""):
    raise_coded(GQA_ERRORS, code, "GroupQueryAttention", detail)


_UNSUPPORTED = ("k_scale", "v_scale", "q_norm_weight", "k_norm_weight", "query_seqlens")
_NORMS = ("q_norm_weight", "k_norm_weight")


def gqa_inputs(b: Gqa, args, norms: bool = False) -> tuple:
    """The node's first twelve inputs (None where absent), after the checks on presence and rank that a form
    makes statically: query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
    sin_cache, position_ids, attention_bias, head_sink; with ``norms``, then ``q_norm_weight`` and
    ``k_norm_weight`` (accepted together, else refused as the other inputs this kernel does not read)."""
    args = tuple(args) + (None,) * (17 - len(args))
    qn, kn = args[14], args[15]
    if norms and (qn is None) != (kn is None):
        raise InvalidArgumentError("GroupQueryAttention: q_norm_weight and k_norm_weight must be given together")
    for what, v in zip(_UNSUPPORTED, args[12:]):
        if v is not None and not (norms and what in _NORMS):
            raise InvalidArgumentError(f"GroupQueryAttention: input {what} is not supported by this kernel")
    q, k, v, pk, pv, sl, tot, cos, sin, pos, bias, sink = args[:12]
    if sl is None or tot is None:
        raise InvalidArgumentError("GroupQueryAttention: seqlens_k and total_sequence_length are required inputs")
    if q.ndim != 3:
        raise ShapeMismatchError(f"GroupQueryAttention: query must be 3-d (batch, sequence, hidden), got shape "
                                 f"{list(q.shape)}")
    if k is None and v is not None:
        raise InvalidArgumentError("GroupQueryAttention: value is given without key")
    if k is not None and (v is None or k.ndim != 3 or v.ndim != 3):
        raise_gqa_error(3, f", got {list(k.shape)} and {None if v is None else list(v.shape)}")
    if (pk is None) != (pv is None):
        raise InvalidArgumentError("GroupQueryAttention: past_key and past_value must be given together")
    if pk is not None and (pk.ndim != 4 or pv.ndim != 4):
        raise_gqa_error(4, f", got {list(pk.shape)} and {list(pv.shape)}")
    if b.rotary and (cos is None or sin is None):
        raise InvalidArgumentError("GroupQueryAttention: do_rotary=1 needs cos_cache and sin_cache")
    if b.rotary and (cos.ndim != 2 or sin.ndim != 2):
        raise_gqa_error(9, f", got {list(cos.shape)} and {list(sin.shape)}")
    if bias is not None and bias.ndim != 4:
        raise_gqa_error(12, f", got {list(bias.shape)}")
    if norms:
        return q, k, v, pk, pv, sl, tot, cos, sin, pos, bias, sink, qn, kn
    return q, k, v, pk, pv, sl, tot, cos, sin, pos, bias, sink


def qk_norms(qf, kf, packed: bool, H: int, kvH: int, qw, kw, eps: float, op: str = "GroupQueryAttention"):
    """The fused q/k norms (``q_norm_weight``, ``k_norm_weight``): every query and key head, float32, divided by
    the root mean square of its ``head_size`` values (plus ``eps``) and scaled by the weight, before rotary, as
    the model's own RMSNorm over each head computes it.  ``qf`` holds all three when ``packed``.  New arrays."""
    W = qf.shape[-1]
    D = W // (H + 2 * kvH) if packed else W // H
    for name, w in (("q_norm_weight", qw), ("k_norm_weight", kw)):
        if np.asarray(w).shape != (D,):
            raise ShapeMismatchError(f"{op}: {name} must have head_size ({D}) entries, got shape "
                                     f"{list(np.asarray(w).shape)}")
    qw, kw = np.asarray(qw, np.float32), np.asarray(kw, np.float32)

    def heads(x, n, w):
        h = x.reshape(x.shape[:-1] + (n, D))
        r = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True, dtype=np.float32) + np.float32(eps)) * w
        return r.reshape(x.shape).astype(np.float32)

    if packed:
        out = np.array(qf, np.float32)
        out[..., :H * D] = heads(qf[..., :H * D], H, qw)
        out[..., H * D:(H + kvH) * D] = heads(qf[..., H * D:(H + kvH) * D], kvH, kw)
        return out, out
    return np.ascontiguousarray(heads(qf, H, qw)), np.ascontiguousarray(heads(kf, kvH, kw))


@njit(**_OPTS)
def gqa_geometry(qshape, kshape, vshape, packed, pkshape, pvshape, has_past, seqlens, total, H, kvH, windowed,
                 window):
    """Shapes and per-entry positions of one step: ``(error code, B, S, D, P, L, past_b, totals, n_new, kbase,
    abs_past)``.  ``past_b``: past rows kept; ``totals``: positions after the step; ``n_new``: valid new rows;
    ``kbase``: absolute position of cache row 0; ``abs_past``: absolute position of the first new row; ``L``:
    the present's rows (a windowed cache: its capacity ``P``)."""
    B, S, hidden = qshape
    e = np.zeros(B, np.int64)
    if packed:
        if hidden % (H + 2 * kvH):
            return 1, B, S, 0, 0, 0, e, e, e, e, e
        D = hidden // (H + 2 * kvH)
    else:
        if hidden % H:
            return 2, B, S, 0, 0, 0, e, e, e, e, e
        D = hidden // H
        if kshape[0] != B or kshape[1] != S or kshape[2] != kvH * D or vshape[0] != B or vshape[1] != S \
                or vshape[2] != kvH * D:
            return 3, B, S, D, 0, 0, e, e, e, e, e
    P = 0
    if has_past:
        if pkshape[0] != B or pkshape[1] != kvH or pkshape[3] != D or pvshape[0] != B or pvshape[1] != kvH \
                or pvshape[2] != pkshape[2] or pvshape[3] != D:
            return 4, B, S, D, 0, 0, e, e, e, e, e
        P = pkshape[2]
    if seqlens.shape[0] != B:
        return 5, B, S, D, P, 0, e, e, e, e, e
    totals = np.empty(B, np.int64)
    past_b = np.zeros(B, np.int64)
    n_new = np.empty(B, np.int64)
    kbase = np.zeros(B, np.int64)
    abs_past = np.zeros(B, np.int64)
    if windowed:
        if window <= 0 or not has_past or P < window:
            return 7, B, S, D, P, 0, e, e, e, e, e
        L = P
        for b in range(B):
            totals[b] = seqlens[b] + 1
            if totals[b] < 1 or totals[b] > max(total, 1):
                return 8, B, S, D, P, L, e, e, e, e, e
            n_new[b] = min(S, totals[b])
            abs_past[b] = totals[b] - n_new[b]
            past_b[b] = ca.resident_rows(abs_past[b], P, window)
            kbase[b] = abs_past[b] - past_b[b]
    else:
        L = max(total, P)
        first = S == total
        for b in range(B):
            totals[b] = seqlens[b] + 1
            past_b[b] = 0 if first else totals[b] - S
            abs_past[b] = past_b[b]
            n_new[b] = S
            if past_b[b] < 0 or past_b[b] > P or past_b[b] + S > L or totals[b] > L or totals[b] < 1:
                return 6, B, S, D, P, L, e, e, e, e, e
    return 0, B, S, D, P, L, past_b, totals, n_new, kbase, abs_past


@njit(**_OPTS)
def gqa_positions(pos_ids, has_pos, abs_past, totals, S, cos_shape, sin_shape, D):
    """Each new row's rotary position, checked against the caches: ``(error code, positions (B, S))``.
    ``pos_ids`` is position_ids as (rows, cols) (one element: the first row's position, the rest follow it);
    without position ids a row is at its absolute position, a right-padded row (past its entry's total) too, as
    onnxruntime's CPU kernel places it."""
    B = abs_past.shape[0]
    pos = np.zeros((B, S), np.int64)
    if sin_shape[0] != cos_shape[0] or sin_shape[1] != cos_shape[1] or 2 * cos_shape[1] > D:
        return 9, pos
    one = has_pos and pos_ids.size == 1
    if has_pos and not one and (pos_ids.shape[0] != B or pos_ids.shape[1] != S):
        return 11, pos
    for b in range(B):
        for s in range(S):
            if one:
                p = pos_ids[0, 0] + s
            elif has_pos:
                p = pos_ids[b, s]
            else:
                p = abs_past[b] + s
            if p < 0 or p >= cos_shape[0]:
                return 10, pos
            pos[b, s] = p
    return 0, pos


@njit(**_OPTS)
def gqa_extras(bias_shape, has_bias, sink_size, has_sink, B, H, S, totals):
    """attention_bias and head_sink against the step: an error code (0: they fit)."""
    if has_bias:
        need = 0
        for b in range(totals.shape[0]):
            need = max(need, totals[b])
        if (bias_shape[0] != 1 and bias_shape[0] != B) or (bias_shape[1] != 1 and bias_shape[1] != H) \
                or (bias_shape[2] != 1 and bias_shape[2] != S) or bias_shape[3] < need:
            return 12
    if has_sink and sink_size != H:
        return 13
    return 0


# -- the driver ------------------------------------------------------------------------------------

@njit(**_OPTS)
def params_scale(scale, D):
    """The scores' scale as onnxruntime takes it: the attribute, or ``1.0f / sqrtf(D)`` when it is 0."""
    return np.float32(scale) if scale != 0 else np.float32(1.0) / np.float32(math.sqrt(D))


@njit(**_OPTS)
def mlas_probs_step(causal):
    """Whether ``ops/_mlas_attention.attend_probs_mlas`` reproduces a float32 step that onnxruntime runs
    outside its flash kernels (softcap, smooth softmax, head sink, ``qk`` output): causal ones (one query row at
    scale 1 included: MLAS's one-row transposed kernel, ``_qk_one_row_alpha1``)."""
    return causal


@njit(**_OPTS)
def mlas_step(softcap, smooth, has_sink, qk_mode, windowed, causal):
    """Whether onnxruntime runs a float32 step through its flash kernels, whose order ``ops/_mlas_attention``
    reproduces: causal, no softcap, smooth softmax, head sink or ``qk`` output (a local window, a windowed cache
    and an attention bias are reproduced)."""
    return causal and softcap == 0 and not smooth and not has_sink and qk_mode == 0


@njit(inline="always", **_OPTS)  # a dispatch only: inlined into the driver, no compiled level of its own
def _decode(q4, kc, vc, past_b, att_total, kbase, params, total, window, bias, has_bias, sink, sink_mode, causal,
            out):
    """One new row without a ``qk`` output: the decode kernel (serial below ``GQA_DECODE_PARALLEL_WORK``)."""
    B, S, H, D = q4.shape
    if B * H * max(total, 1) * D < ca.GQA_DECODE_PARALLEL_WORK:
        ca.gqa_decode_serial(q4, kc, vc, past_b, att_total, kbase, params, causal, window, bias, has_bias,
                             sink, sink_mode, out)
    else:
        ca.gqa_decode_par(q4, kc, vc, past_b, att_total, kbase, params, causal, window, bias, has_bias,
                          sink, sink_mode, out)


@njit(inline="always", **_OPTS)
def _attend(q4, kc, vc, past_b, att_total, kbase, params, total, window, bias, has_bias, sink, sink_mode, causal,
            qk, qk_mode):
    """Attention of q4 (B, S, H, D) over the caches kc/vc (B, kvH, L, D): out (B, S, H, D).  One new row
    without a ``qk`` output: the decode kernel; else the prefill."""
    B, S, H, D = q4.shape
    out = np.empty((B, S, H, D), np.float32)
    if S == 1 and qk_mode == 0:
        _decode(q4, kc, vc, past_b, att_total, kbase, params, total, window, bias, has_bias, sink, sink_mode, causal,
                out)
    else:
        ca.gqa_prefill(q4, kc, vc, past_b, att_total, kbase, params, causal, window, bias, has_bias, sink,
                       sink_mode, qk, qk_mode, out)
    return out


@njit(inline="always", **_OPTS)
def _attend_blocked(q4, kc, vc, past_b, att_total, kbase, params, total, window, bias, has_bias, sink, sink_mode,
                    causal):
    """``_attend`` where the blocked prefill serves every step of several rows (``blocked_prefill``): the
    decode kernel or ``attend_blocked``, and the per-row prefill kernel is neither typed nor compiled."""
    B, S, H, D = q4.shape
    out = np.empty((B, S, H, D), np.float32)
    if S == 1:
        _decode(q4, kc, vc, past_b, att_total, kbase, params, total, window, bias, has_bias, sink, sink_mode, causal,
                out)
    else:
        pa.attend_blocked(q4, kc, vc, past_b, att_total, kbase, params, causal, window, bias, has_bias, sink,
                          sink_mode, out)
    return out


@njit(**_OPTS)
def _presents(pk, pv, has_past, past_b, pres_k, pres_v, S, zero_tail):
    """The kept past rows copied into the present caches; with ``zero_tail`` the rows past the new ones zeroed
    (a buffer the caller zero-filled needs none)."""
    B, kvH, rows, D = pres_k.shape
    for b in range(B):
        n = past_b[b] if has_past else 0
        for h in range(kvH):
            for j in range(n):
                for d in range(D):
                    pres_k[b, h, j, d] = pk[b, h, j, d]
                    pres_v[b, h, j, d] = pv[b, h, j, d]
            if zero_tail:
                for j in range(n + S, rows):
                    for d in range(D):
                        pres_k[b, h, j, d] = 0.0
                        pres_v[b, h, j, d] = 0.0


@njit(**_OPTS)
def _evict(wk, wv, past_b, n_new, totals, P, window):
    """A windowed cache's present: the last L(T) staged rows at rows [0, L(T)) of a capacity-P buffer."""
    B, kvH, _, D = wk.shape
    pres_k = np.zeros((B, kvH, P, D), np.float32)
    pres_v = np.zeros((B, kvH, P, D), np.float32)
    for b in range(B):
        end = past_b[b] + n_new[b]
        n = ca.resident_rows(totals[b], P, window)
        for h in range(kvH):
            for j in range(n):
                for d in range(D):
                    pres_k[b, h, j, d] = wk[b, h, end - n + j, d]
                    pres_v[b, h, j, d] = wv[b, h, end - n + j, d]
    return pres_k, pres_v


@njit(**_OPTS)
def _full_window_first(kc, vc, past_b, att_total, kbase, P, window):
    """A windowed cache's one-row step as onnxruntime attends it in MLAS's order: an entry whose kept rows and
    new row overflow the capacity ``P`` drops its oldest ``P - window + 1`` rows before the attention (they are
    all before the window); ``(keys, values, past_b, att_total, kbase)`` for the attention, copies only when an
    entry drops rows.  Several-row steps attend the whole staged cache."""
    G = P - window + 1
    shift = np.zeros(past_b.shape[0], np.int64)
    for b in range(past_b.shape[0]):
        if past_b[b] + 1 > P:
            shift[b] = G
    if not shift.any():
        return kc, vc, past_b, att_total, kbase
    ks = np.zeros_like(kc)
    vs = np.zeros_like(vc)
    rows = kc.shape[2]
    for b in range(kc.shape[0]):
        for h in range(kc.shape[1]):
            for j in range(rows - shift[b]):
                for d in range(kc.shape[3]):
                    ks[b, h, j, d] = kc[b, h, j + shift[b], d]
                    vs[b, h, j, d] = vc[b, h, j + shift[b], d]
    return ks, vs, past_b - shift, att_total - shift, kbase + shift


@njit(**_OPTS)
def qkv_rows(query, key, value, packed, H, kvH, D):
    """The step's query, key and value as contiguous (B, S, heads, D) arrays; ``query`` holds all three when
    ``packed``."""
    B, S = query.shape[0], query.shape[1]
    if packed:
        q3 = query[:, :, :H * D]
        k3 = query[:, :, H * D:(H + kvH) * D]
        v3 = query[:, :, (H + kvH) * D:]
    else:
        q3, k3, v3 = query, key, value
    q4 = np.ascontiguousarray(q3).reshape((B, S, H, D))
    k4 = np.ascontiguousarray(k3).reshape((B, S, kvH, D))
    v4 = np.ascontiguousarray(v3).reshape((B, S, kvH, D))
    return q4, k4, v4


@njit(**_OPTS)
def rotate_qk(q4, k4, pos, cosc, sinc, interleaved):
    """Copies of q4 and k4 (B, S, heads, D) rotated at the positions ``pos`` (B, S), checked by the caller against
    the cos/sin caches (the inputs may be views of the caller's arrays, so they are not rotated in place)."""
    B, S = q4.shape[0], q4.shape[1]
    q4 = q4.copy()
    k4 = k4.copy()
    half = cosc.shape[1]
    cos_t = np.empty((B, S, half), np.float32)
    sin_t = np.empty((B, S, half), np.float32)
    for b in range(B):
        for s in range(S):
            for t in range(half):
                cos_t[b, s, t] = cosc[pos[b, s], t]
                sin_t[b, s, t] = sinc[pos[b, s], t]
    rope_tok_kernel(q4, cos_t, sin_t, q4, True, interleaved, 2 * half)
    rope_tok_kernel(k4, cos_t, sin_t, k4, True, interleaved, 2 * half)
    return q4, k4


@njit(pipeline_class=GlueCompiler, **_OPTS)
def gqa_f32(query, key, value, packed, pk, pv, has_past, seqlens, total, cosc, sinc, pos_ids, has_pos, bias,
            has_bias, sink, has_sink, H, kvH, scale, softcap, window, rotary, interleaved, smooth, causal, windowed,
            share, qk_mode, fresh_k, fresh_v, l2, ort_threads):
    """GroupQueryAttention on float32 arrays (absent inputs as small dummies with their flag False):
    ``(error code, output (B, S, H * D), present_key, present_value, qk (B, H, S, total) or a dummy)``.
    ``share``: the past buffers may be written and returned as the present (kv_share_buffer's donated caches),
    which happens when they have room for the total; ``qk_mode`` > 0 fills ``qk`` (1 scores, 2 probabilities).
    ``fresh_k``/``fresh_v``: zero-filled present buffers of the step's shape, taken when they fit (the CPU
    wrapper's, from ``np.zeros``, which the OS zeroes lazily: a long cache costs its live rows, not its
    length); any other shape (the form's dummies) and the driver allocates its own.  ``gqa_f32_mlas``, the same
    source with ``_MLAS`` set, runs the rotary and the attention in MLAS's order (``ops/_mlas_attention``): the
    flash kernels where onnxruntime runs them (``mlas_step``), else its score-rows path (``mlas_probs_step``),
    ``l2`` and ``ort_threads`` the host's L2 cache bytes and onnxruntime's thread count they depend on; this one
    compiles none of those kernels on a host with AVX-512 (``_FLASH``), and never the score-rows path.
    ``gqa_f32_blocked`` (``_BLOCKED``) runs several-row steps on the blocked prefill only, and refuses (code 14) a
    head size or score output that would need the per-row kernel it does not compile."""
    z4 = np.zeros((1, 1, 1, 1), np.float32)
    err, B, S, D, P, L, past_b, totals, n_new, kbase, abs_past = gqa_geometry(
        query.shape, key.shape, value.shape, packed, pk.shape, pv.shape, has_past, seqlens, total, H, kvH,
        windowed, window)
    if err == 0:
        err = gqa_extras(bias.shape, has_bias, sink.size, has_sink, B, H, S, totals)
    if err == 0 and _BLOCKED and (qk_mode != 0 or not pa.usable(D, D, 0)):
        err = 14
    if err == 0 and _FLASH_ONLY and not (D <= ma.MAX_HEAD and mlas_step(softcap, smooth, has_sink, qk_mode,
                                                                        windowed, causal)):
        err = 14
    if err:
        return err, np.empty((0, 0, 0), np.float32), z4, z4, z4
    q4, k4, v4 = qkv_rows(query, key, value, packed, H, kvH, D)
    use_mlas = flash = probs = False
    if _FLASH:
        eligible = D <= ma.MAX_HEAD and mlas_step(softcap, smooth, has_sink, qk_mode, windowed, causal)
        use_mlas = _MLAS and eligible
        probs = _MLAS and D <= ma.MAX_HEAD and not eligible and mlas_probs_step(causal)
        # Hosts without AVX-512 (no blocked prefill kernel) run several-row steps on the flash kernel in any
        # case: on an AVX2 host 1.4-3.4x faster than the per-row kernel (tools/bench_attention.py).
        flash = use_mlas or (eligible and S > 1 and not AVX512)
    if rotary:
        err, pos = gqa_positions(pos_ids, has_pos, abs_past, totals, S, cosc.shape, sinc.shape, D)
        if err:
            return err, np.empty((0, 0, 0), np.float32), z4, z4, z4
        if _FLASH and (use_mlas or probs):
            q4 = ma.rope_mlas(q4, pos, cosc, sinc, interleaved)
            k4 = ma.rope_mlas(k4, pos, cosc, sinc, interleaved)
        else:
            q4, k4 = rotate_qk(q4, k4, pos, cosc, sinc, interleaved)
    rows = L
    if windowed:  # staged: the resident past, then the new rows
        rows = 0
        for b in range(B):
            rows = max(rows, past_b[b] + S)
    if share and has_past and not windowed and P >= total:
        pres_k, pres_v = pk, pv
    elif fresh_k.shape == (B, kvH, rows, D) and fresh_v.shape == (B, kvH, rows, D):
        pres_k, pres_v = fresh_k, fresh_v
        # plain flags (np.bool_, not literals): one compile of _presents for both calls
        _presents(pk, pv, has_past, past_b, pres_k, pres_v, S, np.bool_(False))
    else:
        pres_k = np.empty((B, kvH, rows, D), np.float32)
        pres_v = np.empty((B, kvH, rows, D), np.float32)
        _presents(pk, pv, has_past, past_b, pres_k, pres_v, S, np.bool_(True))
    ca.cache_write(past_b, k4, pres_k)
    ca.cache_write(past_b, v4, pres_v)
    params = np.empty(2, np.float32)
    params[0] = params_scale(scale, D)
    params[1] = softcap
    att_total = past_b + n_new if windowed else totals
    sink_mode = 2 if has_sink else (1 if smooth else 0)
    qk = np.zeros((B, H, S, total), np.float32) if qk_mode else z4
    if _FLASH_ONLY:  # (checked above: every step of this node is one the flash kernels take)
        out = np.empty((B, S, H, D), np.float32)
        kq, vq, pb, at, kb = pres_k, pres_v, past_b, att_total, kbase
        if windowed and S == 1:
            kq, vq, pb, at, kb = _full_window_first(pres_k, pres_v, past_b, att_total, kbase, P, window)
        ma.attend_mlas(q4, kq, vq, pb, at, params[0], l2, ort_threads, out, window, bias, has_bias, kb)
    elif _FLASH and (flash or probs):
        out = np.empty((B, S, H, D), np.float32)
        kq, vq, pb, at, kb = pres_k, pres_v, past_b, att_total, kbase
        if windowed and S == 1:
            kq, vq, pb, at, kb = _full_window_first(pres_k, pres_v, past_b, att_total, kbase, P, window)
        if flash:
            ma.attend_mlas(q4, kq, vq, pb, at, params[0], l2, ort_threads, out, window, bias, has_bias, kb)
        elif _MLAS:
            ma.attend_probs_mlas(q4, kq, vq, pb, at, kb, params[0], params[1], window, bias, has_bias,
                                 sink.reshape((sink.size,)), sink_mode, qk, qk_mode, out)
    elif _BLOCKED:
        out = _attend_blocked(q4, pres_k, pres_v, past_b, att_total, kbase, params, total, window, bias, has_bias,
                              sink.reshape((sink.size,)), sink_mode, causal)
    else:
        out = _attend(q4, pres_k, pres_v, past_b, att_total, kbase, params, total, window, bias, has_bias,
                      sink.reshape((sink.size,)), sink_mode, causal, qk, qk_mode)
    if windowed:
        pres_k, pres_v = _evict(pres_k, pres_v, past_b, n_new, totals, P, window)
    return 0, out.reshape((B, S, H * D)), pres_k, pres_v, qk


gqa_f32_mlas = constant_twin(gqa_f32, "_mlas", _MLAS=True, _FLASH=True)
gqa_f32_mlas_flash = constant_twin(gqa_f32, "_mlas_flash", _MLAS=True, _FLASH=True, _FLASH_ONLY=True)
gqa_f32_blocked = constant_twin(gqa_f32, "_blocked", _BLOCKED=True)


def blocked_prefill(head_size) -> bool:
    """Every several-row step of a node with this head size (None: not known at plan time) and no score output
    runs on the blocked prefill: a host with AVX-512 and a head size of whole panels."""
    return head_size is not None and AVX512 and head_size % pa.PANEL == 0


def driver(mlas: bool, blocked: bool = False, flash_only: bool = False):
    """The driver for a node: ``gqa_f32_mlas`` when MLAS's order is asked for (float32 steps), or
    ``gqa_f32_mlas_flash`` where ``flash_only`` (every step of the node runs the flash kernels: ``mlas_step`` on its
    attributes, a head size known at plan time up to ``MAX_HEAD``; it compiles no other attention kernel and
    refuses, code 14, a step that would need one); else ``gqa_f32_blocked`` where ``blocked_prefill`` holds (its
    steps compile no per-row prefill kernel), else ``gqa_f32``."""
    if mlas:
        return gqa_f32_mlas_flash if flash_only else gqa_f32_mlas
    return gqa_f32_blocked if blocked else gqa_f32


# -- the CPU wrapper and the region form -------------------------------------------------------------

_Z4 = np.zeros((1, 1, 1, 1), np.float32)
_Z1 = np.zeros(1, np.float32)
_ZP = np.zeros((1, 1), np.int64)
_ZC = np.zeros((1, 1), np.float32)


def _f32(x):
    return np.ascontiguousarray(x, dtype=np.float32)


def positions_2d(pos):
    """position_ids as the (rows, cols) int64 array ``gqa_positions`` reads."""
    pos = np.asarray(pos)
    return np.ascontiguousarray(pos.reshape(pos.shape[0], -1) if pos.ndim == 2 else pos.reshape(1, -1),
                                dtype=np.int64)


def _cpu(b: Gqa, ctx):
    want_qk = b.n_outputs > 3 and b.qk_output > 0
    mlas = mlas_order()  # the setting, read once per node

    def run(*args):
        q, k, v, pk, pv, sl, tot, cos, sin, pos, bias, sink, qn, kn = gqa_inputs(b, args, norms=True)
        dtype = q.dtype
        total = int(np.asarray(tot).reshape(-1)[0])
        fk = fv = _Z4
        if not b.windowed:
            B, S, W = q.shape
            D = W // (b.H + 2 * b.kvH) if k is None else W // b.H
            L = max(total, 0 if pk is None else pk.shape[2])
            fk, fv = np.zeros((B, b.kvH, L, D), np.float32), np.zeros((B, b.kvH, L, D), np.float32)
        qf = _f32(q)
        kf = qf if k is None else _f32(k)
        if qn is not None:  # the fused q/k norms, before rotary
            qf, kf = qk_norms(qf, kf, k is None, b.H, b.kvH, qn, kn, b.qk_eps)
        err, y, pres_k, pres_v, qk = driver(mlas and dtype == F32)(
            qf, kf, qf if v is None else _f32(v), k is None,
            _Z4 if pk is None else _f32(pk), _Z4 if pv is None else _f32(pv), pk is not None,
            np.asarray(sl).reshape(-1).astype(np.int64), total, _ZC if cos is None else _f32(cos),
            _ZC if sin is None else _f32(sin), _ZP if pos is None else positions_2d(pos), pos is not None,
            _Z4 if bias is None else _f32(bias), bias is not None, _Z1 if sink is None else _f32(sink),
            sink is not None, b.H, b.kvH, b.scale, b.softcap, b.window, b.rotary, b.interleaved, b.smooth, b.causal,
            b.windowed, False, b.qk_output if want_qk else 0, fk, fv, ma.L2_BYTES, ma.ort_threads())
        if err:
            raise_gqa_error(err)
        if b.no_keys:  # local_window_size 0 attends no key: onnxruntime returns zeros (the caches as usual)
            y = np.zeros_like(y)
        if dtype != F32:
            y, pres_k, pres_v = y.astype(dtype), pres_k.astype(dtype), pres_v.astype(dtype)
        res = [y, pres_k, pres_v]
        if b.n_outputs > 3:  # output_qk declared: scores (qk_output=1), probabilities (2), or zeros (0)
            B, S = q.shape[:2]
            res.append(qk.astype(dtype) if want_qk else np.zeros((B, b.H, S, total), dtype))
        return tuple(res[:b.n_outputs]) if b.n_outputs > 1 else y
    return run


def _head_size(e, b: Gqa):
    """The head size the query's static width gives (None when the width is not known at plan time)."""
    shape = getattr(e.t.value_info.get(e.node.inputs[0]), "shape", None)
    width = shape[-1] if shape else None
    heads = b.H if e.has(1) else b.H + 2 * b.kvH
    return width // heads if isinstance(width, int) and width > 0 and width % heads == 0 else None


def _form(e, b: Gqa):
    """The region form: ``gqa_f32`` called on the node's float32 values, its codes raised as the wrapper
    raises them; donated past caches (distinct, not windowed) are shared."""
    float_only(e, 0, 1, 2, 3, 4, 7, 8, 10, 11)
    if b.no_keys:
        raise Decline("local_window_size 0 (zeros, in the node wrapper)")
    if len(e.node.outputs) > 3 or any(e.has(k) for k in range(12, 17)) or e.rank(0) != 3:
        raise Decline("extra inputs or outputs")
    if (e.has(1) and (not e.has(2) or e.rank(1) != 3 or e.rank(2) != 3)) or (e.has(3) != e.has(4)) \
            or (e.has(3) and (e.rank(3) != 4 or e.rank(4) != 4)) or not (e.has(5) and e.has(6)):
        raise Decline("inputs")
    if (b.rotary and not (e.has(7) and e.has(8) and e.rank(7) == 2 and e.rank(8) == 2)) \
            or (e.has(10) and e.rank(10) != 4) or (e.has(9) and e.rank(9) not in (1, 2)):
        raise Decline("rotary caches, bias or positions")
    if any(e.has(k) and e.dtype(k).kind not in "iu" for k in (5, 6, 9)):
        raise Decline("integer inputs")
    share = e.has(3) and not b.windowed and e.donated(3) and e.donated(4) and e.node.inputs[3] != e.node.inputs[4]
    z4, z1, zc = "np.zeros((1, 1, 1, 1), np.float32)", "np.zeros(1, np.float32)", "np.zeros((1, 1), np.float32)"
    pos = ("np.zeros((1, 1), np.int64)" if not e.has(9) else
           "{i9}.reshape(({i9}.shape[0], {i9}.size // max({i9}.shape[0], 1))).astype(np.int64)" if e.rank(9) == 2
           else "{i9}.reshape((1, {i9}.size)).astype(np.int64)")
    total = "{i6}[()]" if e.rank(6) == 0 else "{i6}[0]"
    mlas = mlas_order() and e.dtype(0) == F32  # float16 steps run onnxruntime's other kernels
    hs = _head_size(e, b)
    flash_only = (hs is not None and hs <= ma.MAX_HEAD
                  and mlas_step(b.softcap, b.smooth, e.has(11), 0, b.windowed, b.causal))
    g = e.use(__name__, driver(mlas, blocked_prefill(hs), flash_only).py_func.__name__)  # twins carry their names
    has = e.has
    e.line(f"{{p}}_err, {{o0}}, {{p}}_pk, {{p}}_pv, {{p}}_qk = {g}({{i0}}, {'{i1}' if has(1) else '{i0}'}, "
           f"{'{i2}' if has(2) else '{i0}'}, {not has(1)}, {'{i3}' if has(3) else z4}, {'{i4}' if has(4) else z4}, "
           f"{has(3)}, {{i5}}.reshape(({{i5}}.size,)).astype(np.int64), np.int64({total}), "
           f"{'{i7}' if has(7) else zc}, {'{i8}' if has(8) else zc}, {pos}, {has(9)}, "
           f"{'{i10}' if has(10) else z4}, {has(10)}, {'{i11}' if has(11) else z1}, {has(11)}, {b.H}, {b.kvH}, "
           f"{b.scale!r}, {b.softcap!r}, {b.window}, {b.rotary}, {b.interleaved}, {b.smooth}, {b.causal}, "
           f"{b.windowed}, {share}, 0, {z4}, {z4}, {ma.L2_BYTES}, {ma.ort_threads()})")
    raise_on(e, "{p}_err", [(c, cls, msg) for c, (cls, msg) in GQA_ERRORS.items()])
    e.declare(0, F32, 3)
    for k, var in ((1, "{p}_pk"), (2, "{p}_pv")):
        if e.used(k):
            e.line(f"{{o{k}}} = {var}")
            e.declare(k, F32, 4)


op("GroupQueryAttention", 1, domain=MS, bind=bind_gqa)(_cpu)
form("GroupQueryAttention", domain=MS, bind=bind_gqa)(_form)
