"""CUDA contrib attention ops (com.microsoft): GroupQueryAttention, RotaryEmbedding, MRotaryEmbedding.

GroupQueryAttention follows the CPU twin (``ops/contrib_attention.py``): per batch entry ``b`` the cache holds
``T_b = seqlens_k[b] + 1`` positions after the step; the new tokens sit at ``[P_b, P_b + S)`` with ``P_b = 0``
for the first prompt (``S == total_sequence_length``) and ``P_b = T_b - S`` otherwise.  Query row ``s``
(position ``P_b + s``) attends to keys ``[lo, hi)``: ``hi = min(P_b + s + 1, T_b)`` when causal (``T_b``
otherwise), ``lo = P_b + s + 1 - local_window_size`` when a window is set.  Two kernels:

- ``_kv_write``: one thread per element of ``present_key``/``present_value`` (B, kvH, L, D),
  ``L = max(total_sequence_length, past_len)``: rows ``[0, P_b)`` copied from ``past_*``, rows
  ``[P_b, P_b + S)`` the new K (rotated when ``do_rotary``) and V, the rest zero.  When the plan donates
  ``past_key``/``past_value`` (``OpContext.donated``, a decoder's ``kv_share_buffer``) and they have room for
  ``total_sequence_length``, they are the present: ``_kv_append`` writes only the new rows into them, one
  thread per new element, and the other rows are neither copied nor cleared (none past ``T_b`` is read).  A
  decode step (one new row) of a packed QKV does not launch ``_kv_append``: ``_gqa_attn`` stages the new key
  and value row in shared memory, reads it from there, and the first query head of each group writes it;
- ``_gqa_attn``: one block per (batch, head, query row); the (rotated) query row is staged in shared memory,
  the live keys are walked in tiles of ``blockDim`` keys (one key per thread, float32 dot), with an online
  softmax (running max and sum, rescaled accumulator of ``D`` floats in shared memory, V rows read
  coalesced along ``D``); softcap, ``attention_bias``, ``head_sink`` and ``smooth_softmax`` as on the CPU.
  A row with no key in range yields zeros.

``seqlens_k``, ``total_sequence_length`` and ``position_ids`` are host inputs: the plan hands them over as the
host arrays a decoder's shape subgraph computes from its attention mask (a device-resident one is downloaded
once per run, counted), the wrapper validates them as the CPU twin does, with no transfer and no
synchronization.  The kernels take batch 1's one length by value and otherwise read ``seqlens_k`` (and
``position_ids``) through ``upload_small``, one upload per distinct content, which all the layers of a step
share.  The kernels also clamp every index they derive.

With ``sliding_window_cache=1`` the past/present buffers have a fixed capacity ``C`` and hold the last
``L(T)`` positions at rows ``[0, L(T))`` (onnxruntime's eviction rule, ``contrib_attention.resident_rows``).  The host
computes per entry the resident past rows, the staged total and ``kbase`` (the absolute position of staged row
0) and uploads them as one small array; ``_kv_write`` stages the resident past and the new rows, ``_gqa_attn``
attends in staged rows (bias and rotary positions at absolute positions), and ``_window_keep`` writes the last
``L(T)`` staged rows into a fresh present.  Quantized KV
caches, ``qk_output`` > 0 and the k_scale/v_scale/q_norm/k_norm/query_seqlens inputs are rejected.

RotaryEmbedding / MRotaryEmbedding: one thread per output element, the rotated pair read from the input
(never in place); ``position_ids`` is a host input, validated on the host, then read on the device through
``upload_small``.  MRotaryEmbedding picks the T/H/W position stream per rotary half-dim from ``mrope_section``
(sectioned layout 0 or interleaved layout 1), as the CPU twin does.

Invariants: inputs are C-contiguous device arrays (the host inputs above numpy arrays) and are never written,
except a donated past cache, which is returned as the present;
outputs are new device arrays of the input dtype; float16 is computed in float32.
"""
from __future__ import annotations

import math

import numpy as np

from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ops.contrib_attention import resident_rows
from ops.group_query_attention import (Gqa, bind_gqa, gqa_extras, gqa_geometry, gqa_inputs, gqa_positions,
                                       positions_2d, raise_gqa_error)
from ops.registry import op
from ops.rotary_embedding import (Rope, bind_mrope, bind_rope, positions_of, raise_rope_error, rope_check,
                                  rope_geometry, rope_inputs)
from ._common import (MAX_ROW_THREADS, check_device, fill0, flat, grid1d, host_array, key_span, online_tile,
                      row_threads, unravel4, upload_small)

__all__ = ["launch_gqa", "launch_rope", "MAX_HEAD_SIZE"]

_MS = "com.microsoft"
_CUDA = "CUDAExecutionProvider"
_ZP = np.zeros((1, 1), np.int64)
MAX_HEAD_SIZE = 512  # shared-memory query/accumulator length of the attention kernel


# -- device helpers ------------------------------------------------------------------------------------

@jit(device=True)
def _pair(d, rot, interleaved):
    """(t, i1, i2, first) for rotary element ``d < rot``: cache column t, pair (i1, i2), d == i1."""
    half = rot // 2
    if interleaved:
        t = d // 2
        return t, 2 * t, 2 * t + 1, d % 2 == 0
    if d < half:
        return d, d, d + half, True
    return d - half, d - half, d, False


@jit(device=True)
def _rot_elem(x, base, d, rot, interleaved, cos, sin, crow, cw):
    """Element ``d`` of the head vector ``x[base:base + D]`` after rotation at cache row ``crow``."""
    if d >= rot:
        return np.float32(x[base + d])
    t, i1, i2, first = _pair(d, rot, interleaved)
    co = np.float32(cos[crow * cw + t])
    sn = np.float32(sin[crow * cw + t])
    x1 = np.float32(x[base + i1])
    x2 = np.float32(x[base + i2])
    if first:
        return co * x1 - sn * x2
    return sn * x1 + co * x2


@jit(device=True)
def _past_total(seqlens, seq_inline, b, S, first_prompt, P, L):
    """(P_b, T_b) of batch entry b, clamped into the buffers; ``seq_inline`` >= 0 is batch 1's seqlens_k, passed
    by value (``seqlens`` is then not read)."""
    T = (np.int64(seq_inline) if seq_inline >= 0 else np.int64(seqlens[b])) + 1
    pb = np.int64(0) if first_prompt else T - S
    if pb > P:
        pb = P
    if pb > L - S:
        pb = L - S
    if pb < 0:
        pb = 0
    if T > L:
        T = L
    return pb, T


WINDOWED = -2  # seq_inline for a staged windowed cache: ``seqlens`` then holds the host's rows (see _rows)


@jit(device=True)
def _rows(seqlens, seq_inline, b, nb, S, first_prompt, P, L):
    """(P_b, T_b, kbase_b): the rows of entry b's new tokens start at P_b, its keys end at T_b, and row j holds
    absolute position j + kbase_b.  A staged windowed cache (``seq_inline == WINDOWED``) reads them from
    ``seqlens`` = [past_b (nb), total_b (nb), kbase (nb), ...], computed and validated on the host."""
    if seq_inline == WINDOWED:
        return np.int64(seqlens[b]), np.int64(seqlens[nb + b]), np.int64(seqlens[2 * nb + b])
    pb, T = _past_total(seqlens, seq_inline, b, S, first_prompt, P, L)
    return pb, T, np.int64(0)


@jit(device=True)
def _gqa_pos(b, s, S, pb, T, pos_ids, pos_mode, crows):
    if pos_mode == 1:
        p = np.int64(pos_ids[0]) + s
    elif pos_mode == 2:
        p = np.int64(pos_ids[b * S + s])
    else:
        p = pb + s
        if p >= T:
            p = 1  # right-padded rows get position 1, as onnxruntime does
    if p >= crows:
        p = crows - 1
    if p < 0:
        p = 0
    return p


@jit(device=True)
def _new_k(ksrc, kv_stride, k_off, b, s, kh, d, S, D, pb, T, rotary, interleaved, rot, cos, sin, cw, crows, pos_ids,
           pos_mode):
    """Element ``d`` of new key row ``s`` of kv head ``kh`` (rotated when ``rotary``), in float32."""
    base = (b * S + s) * kv_stride + k_off + kh * D
    if rotary:
        crow = _gqa_pos(b, s, S, pb, T, pos_ids, pos_mode, crows)
        return _rot_elem(ksrc, base, d, rot, interleaved, cos, sin, crow, cw)
    return np.float32(ksrc[base + d])


# -- GroupQueryAttention kernels ---------------------------------------------------------------------

@jit
def _kv_write(ksrc, vsrc, kv_stride, k_off, v_off, past_k, past_v, has_past, P, pres_k, pres_v, seqlens,
              seq_inline, first_prompt, S, kvH, L, D, rotary, interleaved, rot, cos, sin, cw, crows, pos_ids, pos_mode):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    total = pres_k.size
    nb = total // (kvH * L * D)
    for i in range(start, total, step):
        b, kh, j, d = unravel4(i, kvH, L, D)
        pb, T, k0 = _rows(seqlens, seq_inline, b, nb, S, first_prompt, P, L)
        if j < pb:
            src = ((b * kvH + kh) * P + j) * D + d
            pres_k[i] = past_k[src]
            pres_v[i] = past_v[src]
        elif j < pb + S:
            s = j - pb
            pres_k[i] = _new_k(ksrc, kv_stride, k_off, b, s, kh, d, S, D, pb + k0, T + k0, rotary, interleaved, rot,
                               cos, sin, cw, crows, pos_ids, pos_mode)
            pres_v[i] = vsrc[(b * S + s) * kv_stride + v_off + kh * D + d]
        else:
            pres_k[i] = 0
            pres_v[i] = 0


@jit
def _kv_append(ksrc, vsrc, kv_stride, k_off, v_off, n, pres_k, pres_v, seqlens, seq_inline, first_prompt, P, S, kvH,
               L, D, rotary, interleaved, rot, cos, sin, cw, crows, pos_ids, pos_mode):
    """Shared buffers: only the new rows ``[P_b, P_b + S)`` of ``present`` (the donated past) are written; one
    thread per element of the (B, kvH, S, D) new keys."""
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, n, step):
        b, kh, s, d = unravel4(i, kvH, S, D)
        pb, T = _past_total(seqlens, seq_inline, b, S, first_prompt, P, L)
        o = ((b * kvH + kh) * L + pb + s) * D + d
        pres_k[o] = _new_k(ksrc, kv_stride, k_off, b, s, kh, d, S, D, pb, T, rotary, interleaved, rot, cos, sin,
                           cw, crows, pos_ids, pos_mode)
        pres_v[o] = vsrc[(b * S + s) * kv_stride + v_off + kh * D + d]


@jit
def _gqa_attn(qsrc, q_stride, pres_k, pres_v, seqlens, seq_inline, first_prompt, P, S, H, kvH, L, D, scale, softcap,
              causal, window, bias, has_bias, bb, bh, bq, bk, sink, sink_mode, rotary, interleaved, rot, cos, sin, cw,
              crows, pos_ids, pos_mode, append, k_off, v_off, out):
    qs = cuda.shared.array(MAX_HEAD_SIZE, np.float32)
    acc = cuda.shared.array(MAX_HEAD_SIZE, np.float32)
    ksn = cuda.shared.array(MAX_HEAD_SIZE, np.float32)
    vsn = cuda.shared.array(MAX_HEAD_SIZE, np.float32)
    ps = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    red = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    r = cuda.blockIdx.x
    b = r // (H * S)
    h = (r // S) % H
    s = r % S
    kh = h // (H // kvH)
    pb, T, k0 = _rows(seqlens, seq_inline, b, cuda.gridDim.x // (H * S), S, first_prompt, P, L)
    p = pb + s
    lo, hi = key_span(p, T, causal, window)
    qbase = (b * S + s) * q_stride + h * D
    crow = np.int64(0)
    if rotary:
        crow = _gqa_pos(b, s, S, pb + k0, T + k0, pos_ids, pos_mode, crows)
    kv0 = (b * kvH + kh) * L
    # append (one new row, packed QKV, shared cache): the new key and value row pb are staged here from the
    # packed input and read from shared memory; the first query head of each kv head's group writes them into
    # the cache, which no block reads at that row in this launch.
    writer = append and h % (H // kvH) == 0
    for d in range(tid, D, nt):
        if rotary:
            qs[d] = _rot_elem(qsrc, qbase, d, rot, interleaved, cos, sin, crow, cw)
        else:
            qs[d] = np.float32(qsrc[qbase + d])
        acc[d] = np.float32(0.0)
        if append:
            ksn[d] = _new_k(qsrc, q_stride, k_off, b, 0, kh, d, S, D, pb + k0, T + k0, rotary, interleaved, rot,
                            cos, sin, cw, crows, pos_ids, pos_mode)
            vsn[d] = np.float32(qsrc[b * q_stride + v_off + kh * D + d])
            if writer:
                pres_k[(kv0 + pb) * D + d] = ksn[d]
                pres_v[(kv0 + pb) * D + d] = qsrc[b * q_stride + v_off + kh * D + d]
    cuda.syncthreads()
    m = np.float32(-np.inf)
    lsum = np.float32(0.0)
    bb_i = b if bb > 1 else 0
    bh_i = h if bh > 1 else 0
    bq_i = s if bq > 1 else 0
    brow = ((bb_i * bh + bh_i) * bq + bq_i) * bk
    for t0 in range(lo, hi, nt):
        j = t0 + tid
        x = np.float32(-np.inf)
        if j < hi:
            kb = (kv0 + j) * D
            dot = np.float32(0.0)
            if append and j == pb:
                for d in range(D):
                    dot += qs[d] * ksn[d]
            else:
                for d in range(D):
                    dot += qs[d] * np.float32(pres_k[kb + d])
            x = dot * scale
            if softcap > 0:
                x = softcap * math.tanh(x / softcap)
            if has_bias and j + k0 < bk:
                x += np.float32(bias[brow + j + k0])
        m, alpha, lsum = online_tile(red, ps, tid, nt, x, j < hi, m, lsum)
        cnt = hi - t0
        if cnt > nt:
            cnt = nt
        for d in range(tid, D, nt):
            a = acc[d] * alpha
            for t in range(cnt):
                if append and t0 + t == pb:
                    a += ps[t] * vsn[d]
                else:
                    a += ps[t] * np.float32(pres_v[(kv0 + t0 + t) * D + d])
            acc[d] = a
        cuda.syncthreads()
    f = np.float32(1.0)
    if sink_mode > 0:
        sk = np.float32(0.0)
        if sink_mode == 2:
            sk = np.float32(sink[h])
        m2 = m if m > sk else sk
        f = math.exp(m - m2)
        lsum = lsum * f + math.exp(sk - m2)
    inv = np.float32(0.0)
    if lsum != 0:
        inv = f / lsum
    obase = ((b * S + s) * H + h) * D
    for d in range(tid, D, nt):
        out[obase + d] = acc[d] * inv


@jit
def _window_keep(stage_k, stage_v, pres_k, pres_v, rows, kvH, live, C, D):
    """present rows [0, keep_b) = staged rows [total_b - keep_b, total_b), the rest zero (``rows`` as in _rows,
    with keep_b after kbase)."""
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    nb = pres_k.size // (kvH * C * D)
    for i in range(start, pres_k.size, step):
        b, kh, j, d = unravel4(i, kvH, C, D)
        n = np.int64(rows[3 * nb + b])
        if j < n:
            src = ((b * kvH + kh) * live + np.int64(rows[nb + b]) - n + j) * D + d
            pres_k[i] = stage_k[src]
            pres_v[i] = stage_v[src]
        else:
            pres_k[i] = 0
            pres_v[i] = 0


def _shape(a, rank):
    return (0,) * rank if a is None else tuple(int(v) for v in a.shape)


def launch_gqa(g: Gqa, ctx):
    """The CUDA implementation of GroupQueryAttention, written once in ``ops/group_query_attention.py`` (its
    bind, its checks and messages, its positions): the bound op's per-run callable, over a fresh ``present``
    cache or a donated past (see the module docstring)."""
    if g.n_outputs > 3 and g.qk_output > 0:
        raise InvalidAttributeError(f"GroupQueryAttention: qk_output={g.qk_output} is not supported by the CUDA "
                                    f"kernel")
    donated = ctx.donated if ctx is not None else frozenset()

    def run(*args):
        return _gqa(g, donated, *gqa_inputs(g, args))
    return run


def _checked(g: Gqa, query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
             sin_cache, attention_bias, head_sink):
    """The shared checks (``gqa_geometry``, ``gqa_extras``) and the device ones: (host seqlens_k, total, query
    shape, geometry)."""
    name = "GroupQueryAttention"
    check_device(name, query=query, key=key, value=value, past_key=past_key, past_value=past_value,
                 cos_cache=cos_cache, sin_cache=sin_cache, attention_bias=attention_bias, head_sink=head_sink)
    seqlens_h = host_array(name, "seqlens_k", seqlens_k)
    packed = key is None
    if not packed and (key.dtype != query.dtype or value.dtype != query.dtype):
        raise InvalidArgumentError(f"{name}: key/value must have the query dtype {query.dtype}")
    total = int(np.asarray(total_sequence_length).reshape(-1)[0])
    qs = _shape(query, 3)
    err, *geo = gqa_geometry(
        qs, qs if packed else _shape(key, 3), qs if packed else _shape(value, 3), packed, _shape(past_key, 4),
        _shape(past_value, 4), past_key is not None, seqlens_h.reshape(-1).astype(np.int64), total, g.H, g.kvH,
        g.windowed, g.window)
    B, S, D, totals = geo[0], geo[1], geo[2], geo[6]
    if not err:
        err = gqa_extras(_shape(attention_bias, 4), attention_bias is not None,
                         0 if head_sink is None else head_sink.size, head_sink is not None, B, g.H, S, totals)
    if err:
        raise_gqa_error(err)
    if D > MAX_HEAD_SIZE:
        raise ShapeMismatchError(f"{name}: head size {D} exceeds the CUDA kernel's limit {MAX_HEAD_SIZE}")
    return seqlens_h, total, qs, tuple(geo)


def _window_rows(g: Gqa, B, S, P, past_b, totals, n_new, kbase):
    """A windowed cache of capacity P holding the last L(T) positions: the resident past and the new rows are
    staged (row j = absolute position j + kbase), attended in staged rows, and the last L(T) rows kept.  Returns
    the staged rows and the per-entry rows the kernels read (resident, staged total, kbase, kept)."""
    L = int((past_b + S).max()) if B else 0
    keep = np.array([resident_rows(int(t), P, g.window) for t in totals], np.int64)
    # The kernels index the past, the staging rows and the present with these: check them before any launch.
    if (past_b > P).any() or (keep > past_b + n_new).any() or (keep > P).any():
        raise InvalidArgumentError(f"GroupQueryAttention: windowed cache rows out of range (resident "
                                   f"{past_b.tolist()}, kept {keep.tolist()}, capacity {P})")
    return L, np.concatenate([past_b, past_b + n_new, kbase, keep]).astype(np.int64)


def _rope_args(g: Gqa, query, cos_cache, sin_cache, position_ids, B, S, D, abs_past, totals):
    """The rotary arguments of the kernels, the positions checked on the host: (rot, cache width, cache rows,
    position mode, cos, sin, positions)."""
    dummy = flat(query)
    if not g.rotary:
        return 0, 1, 1, 0, dummy, dummy, dummy
    crows, cw = int(cos_cache.shape[0]), int(cos_cache.shape[1])
    ph = None if position_ids is None else host_array("GroupQueryAttention", "position_ids", position_ids)
    err, _ = gqa_positions(_ZP if ph is None else positions_2d(ph), ph is not None, abs_past, totals, S,
                           _shape(cos_cache, 2), _shape(sin_cache, 2), D)
    if err:
        raise_gqa_error(err)
    pos_mode = 0 if ph is None else 2 if tuple(ph.shape) == (B, S) else 1
    pos_f = dummy if ph is None else flat(upload_small(ph))
    return 2 * cw, cw, crows, pos_mode, flat(cos_cache), flat(sin_cache), pos_f


def _gqa(g, donated, query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
         sin_cache, position_ids, attention_bias, head_sink):
    H, kvH = g.H, g.kvH
    seqlens_h, total, qs, (B, S, D, P, L, past_b, totals, n_new, kbase, abs_past) = _checked(
        g, query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
        attention_bias, head_sink)
    packed = key is None
    has_past = past_key is not None
    hidden = qs[2]
    if packed:
        ksrc = vsrc = query
        kv_stride, k_off, v_off = hidden, H * D, (H + kvH) * D
    else:
        ksrc, vsrc = key, value
        kv_stride, k_off, v_off = kvH * D, 0, 0
    dtype = query.dtype
    windowed = g.windowed
    first_prompt = S == total
    if windowed:
        L, rows = _window_rows(g, B, S, P, past_b, totals, n_new, kbase)
    rotary = g.rotary
    rot, cw, crows, pos_mode, cos_f, sin_f, pos_f = _rope_args(g, query, cos_cache, sin_cache, position_ids, B, S, D,
                                                               abs_past, totals)

    has_bias = attention_bias is not None
    bshape = _shape(attention_bias, 4) if has_bias else (1, 1, 1, 1)
    if head_sink is not None:
        sink_mode, sink_f = 2, flat(head_sink)
    else:
        sink_mode, sink_f = (1 if g.smooth else 0), flat(query)
    sc = g.scale if g.scale else 1.0 / math.sqrt(D)
    window = g.window

    # A donated past with room for the total (kv_share_buffer) is the present: only the new rows are written.
    share = has_past and not windowed and {3, 4} <= donated and P >= total
    if share:
        pres_k, pres_v = past_key, past_value
    else:  # for a windowed cache: the staging buffers
        pres_k = rc.device_empty((B, kvH, L, D), dtype)
        pres_v = rc.device_empty((B, kvH, L, D), dtype)
    y = rc.device_empty((B, S, H * D), dtype)
    if windowed:  # the kernels read the rows the host computed
        seq_inline, seq_f = WINDOWED, flat(upload_small(rows))
    elif B == 1:  # batch 1 passes its one length by value: nothing is uploaded for it
        seq_inline, seq_f = int(seqlens_h.reshape(-1)[0]), flat(query)
    else:
        seq_inline, seq_f = -1, flat(upload_small(seqlens_h))
    n_new = B * kvH * S * D
    # One new row of a packed QKV into a shared cache: the attention kernel appends it itself (one launch).
    fuse_append = share and packed and S == 1
    if share and n_new and not fuse_append:
        blocks, threads = grid1d(n_new)
        _kv_append[blocks, threads](flat(ksrc), flat(vsrc), kv_stride, k_off, v_off, n_new, flat(pres_k),
                                    flat(pres_v), seq_f, seq_inline, first_prompt, P, S, kvH, L, D, rotary,
                                    g.interleaved, rot, cos_f, sin_f, cw, crows, pos_f, pos_mode)
    elif not share and pres_k.size:
        blocks, threads = grid1d(pres_k.size)
        _kv_write[blocks, threads](flat(ksrc), flat(vsrc), kv_stride, k_off, v_off,
                                   flat(past_key) if has_past else flat(query), flat(past_value) if has_past else
                                   flat(query), has_past, P, flat(pres_k), flat(pres_v), seq_f, seq_inline,
                                   first_prompt, S, kvH, L, D, rotary, g.interleaved, rot, cos_f,
                                   sin_f, cw, crows, pos_f, pos_mode)
    if y.size:
        nt = row_threads(max(min(L, MAX_ROW_THREADS), D))
        _gqa_attn[B * H * S, nt](flat(query), hidden, flat(pres_k), flat(pres_v), seq_f, seq_inline, first_prompt,
                                 P, S, H, kvH, L, D, np.float32(sc), np.float32(g.softcap), g.causal, window,
                                 flat(attention_bias) if has_bias else flat(query), has_bias, *bshape, sink_f,
                                 sink_mode, rotary, g.interleaved, rot, cos_f, sin_f, cw, crows,
                                 pos_f, pos_mode, fuse_append, k_off, v_off, flat(y))
    return _outputs(g, y, pres_k, pres_v, seq_f, P, L, total)


def _outputs(g: Gqa, y, pres_k, pres_v, seq_f, P, L, total):
    """(output, present_key, present_value[, output_qk]): a windowed cache keeps its last L(T) staged rows in a
    fresh capacity-P present; a declared output_qk (qk_output=0) is zeros, as on the CPU."""
    B, S = y.shape[0], y.shape[1]
    kvH, D = pres_k.shape[1], pres_k.shape[3]
    if g.windowed:
        stage_k, stage_v = pres_k, pres_v
        pres_k = rc.device_empty((B, kvH, P, D), y.dtype)
        pres_v = rc.device_empty((B, kvH, P, D), y.dtype)
        if pres_k.size:
            blocks, threads = grid1d(pres_k.size)
            _window_keep[blocks, threads](flat(stage_k), flat(stage_v), flat(pres_k), flat(pres_v), seq_f, kvH, L,
                                          P, D)
    if g.no_keys and y.size:  # local_window_size 0: onnxruntime's output is zeros
        blocks, threads = grid1d(y.size)
        fill0[blocks, threads](flat(y))
    res = [y, pres_k, pres_v]
    if g.n_outputs > 3:
        qk = rc.device_empty((B, g.H, S, total), y.dtype)
        if qk.size:
            blocks, threads = grid1d(qk.size)
            fill0[blocks, threads](flat(qk))
        res.append(qk)
    return tuple(res[:g.n_outputs]) if g.n_outputs > 1 else y


op("GroupQueryAttention", 1, domain=_MS, provider=_CUDA, host_inputs=(5, 6, 9), bind=bind_gqa)(launch_gqa)


# -- RotaryEmbedding / MRotaryEmbedding ------------------------------------------------------------

@jit
def _rope_kernel(x, y, A1, A2, D, seq_second, B, S, rot, interleaved, cos, sin, cw, pos, pos_mode, sec0, sec1, sec2,
                 layout):
    """x/y flat (B, A1, A2, D) = (B,H,S,D), or (B,S,H,D) if seq_second.  pos_mode 1: pos[0] + s; 2: pos[b, s];
    3: multimodal pos[w, b, s] with stream w chosen per half-dim from the sections."""
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, y.size, step):
        d = i % D
        if d >= rot:
            y[i] = x[i]
            continue
        r = i // D
        e = r % A2
        r2 = r // A2
        c = r2 % A1
        b = r2 // A1
        s = c if seq_second else e
        t, i1, i2, first = _pair(d, rot, interleaved)
        if pos_mode == 1:
            p = np.int64(pos[0]) + s
        elif pos_mode == 2:
            p = np.int64(pos[b * S + s])
        else:
            w = 0
            if layout == 0:
                if t >= sec0 + sec1:
                    w = 2
                elif t >= sec0:
                    w = 1
            else:
                if t % 3 == 1 and t < 3 * sec1:
                    w = 1
                elif t % 3 == 2 and t < 3 * sec2:
                    w = 2
            p = np.int64(pos[(w * B + b) * S + s])
        y[i] = _rot_elem(x, i - d, d, rot, interleaved, cos, sin, p, cw)


def launch_rope(b: Rope, ctx=None):
    """The CUDA implementation of RotaryEmbedding and MRotaryEmbedding, written once in
    ``ops/rotary_embedding.py`` (their binds, their checks and messages): one thread per output element; the
    positions are validated on the host, then read on the device through ``upload_small``."""

    def run(input, position_ids, cos_cache, sin_cache):
        check_device(b.op, input=input, cos_cache=cos_cache, sin_cache=sin_cache)
        rope_inputs(b, input, cos_cache, sin_cache)
        ph = host_array(b.op, "position_ids", position_ids)
        pos, p0, pb, ps = positions_of(ph)
        cw = int(cos_cache.shape[1])
        err, B, S, nh, D, rot, seq_second = rope_geometry(_shape(input, input.ndim), b.H, b.rot_attr, cw)
        if not err:
            err = rope_check(pos, p0, pb, ps, B, S, _shape(cos_cache, 2), _shape(sin_cache, 2), rot // 2, b.mrope,
                             b.s0, b.s1, b.s2)
        if err:
            raise_rope_error(b, err)
        A1, A2 = (S, nh) if seq_second else (nh, S)
        pos_mode = 3 if b.mrope else (1 if ph.size == 1 else 2)
        y = rc.device_empty(tuple(input.shape), input.dtype)
        if y.size:
            blocks, threads = grid1d(y.size)
            _rope_kernel[blocks, threads](flat(input), flat(y), A1, A2, D, seq_second, B, S, rot, b.interleaved,
                                          flat(cos_cache), flat(sin_cache), cw, flat(upload_small(ph)), pos_mode,
                                          b.s0, b.s1, b.s2, b.layout)
        return y
    return run


for _name, _bind in (("RotaryEmbedding", bind_rope), ("MRotaryEmbedding", bind_mrope)):
    op(_name, 1, domain=_MS, provider=_CUDA, host_inputs=(1,), bind=_bind)(launch_rope)
