"""``onnx_numba::PagedGroupQueryAttention``: GroupQueryAttention whose KV cache is a pool of fixed-size blocks
read and written through a block table (the serving engine's paged cache, ``pipeline/paged_kv.py``).

The op is what ``pipeline/paged.py`` makes of a decoder's com.microsoft GroupQueryAttention nodes; it keeps their
attributes and semantics (``ops/contrib_attention.py`` states them) and changes only where the cache lives:

- inputs: ``query``, ``key``, ``value`` (absent: ``query`` packs all three), ``key_pool`` and ``value_pool``
  ``(num_blocks, kv_num_heads, block_size, head_size)`` float32, ``block_table`` ``(batch, max_blocks)``
  int32, ``seqlens_k`` ``(batch,)`` (positions after the step, minus one), ``total_sequence_length`` (the
  largest total; a bound every row is checked against), ``cos_cache`` and ``sin_cache`` (with
  ``do_rotary``); output ``(batch, sequence, num_heads * head_size)``;
- row ``b`` holds ``T_b = seqlens_k[b] + 1`` positions after the step; its ``S`` new tokens are positions
  ``[T_b - S, T_b)``, whatever came before them (a prefix another request computed, or this row's own past);
- position ``p`` of row ``b`` lives in block ``block_table[b, p // block_size]`` at row ``p % block_size``;
  the new keys and values (keys after rotary) are written there, in place, before the attention reads them:
  the pools are the engine's, fed whole every step, and this op is the one thing that writes them;
- query ``s`` of row ``b`` attends to the keys ``key_range(T_b - S + s, T_b, causal, local_window_size)``.

Bind: ``bind_paged``, GroupQueryAttention's bind with what the paged form does not cover refused (``qk_output``,
a windowed cache without a window); a windowed cache with its window is attended as that window over the pools;
the checks are the typed ``paged_geometry`` returning a code into ``PAGED_ERRORS``, the
one table of messages the CPU wrapper, the region form and the CUDA launch (``ops/cuda/paged_attention.py``)
raise from.

``com.microsoft::PagedAttention`` (onnxruntime-genai's paged decoders, ``use_paged_attention`` in its builder;
onnxruntime has kernels for it on CUDA and WebGPU only) is the same attention over another layout, written here on
the same kernels:
- inputs: ``query`` (num_tokens, hidden), or the three packed when ``key`` and ``value`` are absent; ``key_cache``
  and ``value_cache`` (num_blocks, block_size, kv_num_heads, head_size) in float16, bfloat16 or float32;
  ``cumulative_sequence_length`` (batch + 1), ``past_seqlens`` (batch), ``block_table`` (batch, max_blocks;
  -1 past a sequence's own blocks), ``cos_cache`` and ``sin_cache``; ``attention_metadata`` is a launch hint and
  is not read; outputs: (num_tokens, num_heads * head_size) in the query's dtype, and the two caches, the input
  arrays themselves, written in place;
- the tokens ``[cum[b], cum[b + 1])`` are sequence ``b``'s positions ``past_seqlens[b] + j``; their keys (after
  rotary) and values are written into the caches, in the caches' dtype, then each attends causally (or to the
  whole sequence with ``is_causal=0``) within ``local_window_size``, with ``softcap`` and ``scale`` as
  GroupQueryAttention;
- the attention runs in float32 (``paged_attend_*``) over the blocks the step's sequences use, gathered once;
- the fused q/k norms (``q_norm_weight``, ``k_norm_weight``) as GroupQueryAttention's (``qk_norms``);
- refused by name: ``slot_mapping``, ``head_sink``, quantized caches and their scales, the LATENT layout,
  ``rotary_offset``; checked before any write: the shapes, the boundaries, every block id a sequence
  reaches and every rotary position (``ms_geometry``, ``MS_ERRORS``).

Invariants:
- every block id a row reaches and every rotary position is checked before memory is read or written;
- only the blocks of positions ``[T_b - S, T_b)`` are written; a block shared by two rows (a reused prefix) is
  only ever read, since a reused prefix ends at a block boundary and rows write past their prefix;
- one task per (row, kv head, query) streams the group's keys once, four keys of a block per pass (as the
  contiguous decode kernel does); the same code serves prefill and decode, so a request's tokens do not depend on
  what else runs in its batch.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError
from ._common import raise_coded, serial_twin
from .contrib_attention import key_scores1, key_scores4, value_sums1, value_sums4
from ._prefetch import prefetch_all
from ._prefill_attention import key_range, normalize
from .forms import Decline, float_only, form, raise_on
from .group_query_attention import GQA_ERRORS, Gqa, bind_gqa, qk_norms, qkv_rows, rotate_qk
from .registry import op

__all__ = ["DOMAIN", "OP", "bind_paged", "paged_geometry", "paged_f32", "PAGED_ERRORS", "raise_paged_error",
           "paged_positions", "PAGED_PARALLEL_WORK", "MS_OP", "MS_DOMAIN", "bind_ms_paged", "ms_geometry", "ms_paged",
           "MS_ERRORS"]

DOMAIN = "onnx_numba"
OP = "PagedGroupQueryAttention"
_OPTS = dict(cache=True, nogil=True, error_model="numpy")
# Below this many multiply-adds (rows * heads * keys * head size) the attention runs serially: a decode step of
# a few short requests costs less than waking the thread pool.
PAGED_PARALLEL_WORK = 1 << 15


def bind_paged(ctx, **attrs) -> Gqa:
    """GroupQueryAttention's bind; the ``qk`` output, and a windowed cache without a window, are refused
    (``InvalidAttributeError``).  A windowed cache (``sliding_window_cache=1``) is served as its window over the
    whole history: onnxruntime's resident rows always hold the window's keys (its capacity is at least the
    window), so each query sees the same keys; the pools keep every block."""
    b = bind_gqa(ctx, **attrs)
    if b.qk_output:
        raise InvalidAttributeError(f"{OP}: qk_output is not supported")
    if b.no_keys:
        raise InvalidAttributeError(f"{OP}: local_window_size 0 attends no key (onnxruntime returns zeros); the "
                                    f"paged cache does not serve it")
    if b.windowed and b.window <= 0:
        raise InvalidAttributeError(f"{OP}: sliding_window_cache=1 needs local_window_size > 0, got "
                                    f"{attrs.get('local_window_size', -1)}")
    return b


PAGED_ERRORS = {
    **{k: GQA_ERRORS[k] for k in (1, 2, 3)},  # the query, key and value shapes, as GroupQueryAttention
    4: ("ShapeMismatchError", "key_pool and value_pool must both have shape (num_blocks, kv_num_heads, "
                              "block_size, head_size)"),
    5: ("ShapeMismatchError", "block_table must have shape (batch, max_blocks) and seqlens_k batch entries"),
    6: ("InvalidArgumentError", "a row's positions (seqlens_k + 1) are fewer than its new tokens or more than "
                                "total_sequence_length"),
    7: ("IndexOutOfRangeError", "a row's positions reach past its block table"),
    8: ("IndexOutOfRangeError", "a block id is outside the pool"),
    9: GQA_ERRORS[9],  # the cos/sin caches' shapes
    10: ("IndexOutOfRangeError", "a position is outside the cos/sin caches"),
}


def raise_paged_error(code: int, detail: str = ""):
    raise_coded(PAGED_ERRORS, code, OP, detail)


@njit(**_OPTS)
def paged_geometry(qshape, kshape, vshape, packed, kpool, vshape_pool, table, seqlens, total, H, kvH):
    """Shapes and positions of one step, checked: ``(error code, B, S, D, past (B,), totals (B,))``.  Every block
    id of positions ``[0, T_b)`` is checked against the pool."""
    B, S, hidden = qshape
    e = np.zeros(B, np.int64)
    if packed:
        if hidden % (H + 2 * kvH):
            return 1, B, S, 0, e, e
        D = hidden // (H + 2 * kvH)
    else:
        if hidden % H:
            return 2, B, S, 0, e, e
        D = hidden // H
        if kshape[0] != B or kshape[1] != S or kshape[2] != kvH * D or vshape[0] != B or vshape[1] != S \
                or vshape[2] != kvH * D:
            return 3, B, S, D, e, e
    N, ph, bs, pd = kpool.shape
    if ph != kvH or pd != D or bs < 1 or vshape_pool[0] != N or vshape_pool[1] != kvH or vshape_pool[2] != bs \
            or vshape_pool[3] != D:
        return 4, B, S, D, e, e
    if table.shape[0] != B or seqlens.shape[0] != B:
        return 5, B, S, D, e, e
    M = table.shape[1]
    totals = np.empty(B, np.int64)
    past = np.empty(B, np.int64)
    for b in range(B):
        t = np.int64(seqlens[b]) + 1
        if t < S or t > total:
            return 6, B, S, D, e, e
        if (t + bs - 1) // bs > M:
            return 7, B, S, D, e, e
        for i in range((t + bs - 1) // bs):
            blk = table[b, i]
            if blk < 0 or blk >= N:
                return 8, B, S, D, e, e
        totals[b] = t
        past[b] = t - S
    return 0, B, S, D, past, totals


@njit(**_OPTS)
def paged_positions(past, S, cos_shape, sin_shape, D):
    """Each new row's rotary position (``past[b] + s``), checked against the caches: ``(error code, (B, S))``."""
    B = past.shape[0]
    pos = np.zeros((B, S), np.int64)
    if sin_shape[0] != cos_shape[0] or sin_shape[1] != cos_shape[1] or 2 * cos_shape[1] > D:
        return 9, pos
    for b in range(B):
        for s in range(S):
            p = past[b] + s
            if p >= cos_shape[0]:
                return 10, pos
            pos[b, s] = p
    return 0, pos


@njit(**_OPTS)
def _write(table, past, new, pool):
    """new (B, S, kvH, D) into the pool at positions ``past[b] + s`` through the block table."""
    B, S, kvH, D = new.shape
    bs = pool.shape[2]
    for b in range(B):
        for s in range(S):
            p = past[b] + s
            blk = table[b, p // bs]
            r = p % bs
            for h in range(kvH):
                for d in range(D):
                    pool[blk, h, r, d] = new[b, s, h, d]


@njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def paged_attend_par(q, kpool, vpool, table, past, totals, params, causal, window, smooth, out):
    """q (B, S, H, D) over the pools through ``table``: one task per (row, kv head, query) streams the keys
    and values of its range once for the whole query-head group; out (B, S, H, D)."""
    B, S, H, D = q.shape
    kvH = kpool.shape[1]
    bs = kpool.shape[2]
    group = H // kvH
    scale = params[0]
    softcap = params[1]
    for r in prange(B * kvH * S):
        b = r // (kvH * S)
        kh = (r // S) % kvH
        s = r % S
        lo, hi = key_range(past[b] + s, totals[b], causal, window)
        n = hi - lo
        sc = np.empty((group, max(n, 1)), np.float32)
        qg = np.empty((group, D), np.float32)
        for g in range(group):
            for d in range(D):
                qg[g, d] = q[b, s, kh * group + g, d]
        if lo < hi:
            prefetch_all(kpool[table[b, lo // bs], kh])
            prefetch_all(vpool[table[b, lo // bs], kh])
        j = lo
        while j < hi:  # one block at a time: the keys of a block are contiguous; four keys per pass over q
            kmat = kpool[table[b, j // bs], kh]
            stop = min(hi, (j // bs + 1) * bs)
            if stop < hi:  # the next block's keys arrive while these are summed
                prefetch_all(kpool[table[b, stop // bs], kh])
            row = j % bs
            while j + 4 <= stop:
                key_scores4(qg, kmat, row, sc, j - lo)
                j += 4
                row += 4
            while j < stop:
                key_scores1(qg, kmat, row, sc, j - lo)
                j += 1
                row += 1
        for g in range(group):  # scale, softcap and the maximum; smooth softmax: a zero logit joins the two
            m = np.float32(-np.inf)
            for c in range(n):
                x = sc[g, c] * scale
                if softcap > 0:
                    x = softcap * math.tanh(x / softcap)
                sc[g, c] = x
                m = max(m, x)
            normalize(sc[g, :n], m, 1 if smooth else 0, np.float32(0.0))
        acc_v = np.zeros((group, D), np.float32)
        j = lo
        while j < hi:  # four value rows per pass over the accumulators
            vmat = vpool[table[b, j // bs], kh]
            stop = min(hi, (j // bs + 1) * bs)
            if stop < hi:
                prefetch_all(vpool[table[b, stop // bs], kh])
            row = j % bs
            while j + 4 <= stop:
                value_sums4(sc, j - lo, vmat, row, acc_v)
                j += 4
                row += 4
            while j < stop:
                value_sums1(sc, j - lo, vmat, row, acc_v)
                j += 1
                row += 1
        for g in range(group):
            for d in range(D):
                out[b, s, kh * group + g, d] = acc_v[g, d]


paged_attend_serial = serial_twin(paged_attend_par)


@njit(**_OPTS)
def paged_f32(query, key, value, packed, kpool, vpool, table, seqlens, total, cosc, sinc, H, kvH, scale, softcap,
              window, rotary, interleaved, smooth, causal):
    """The op on float32 arrays (``key``/``value`` any arrays when ``packed``; ``cosc``/``sinc`` any when not
    ``rotary``): ``(error code, output (B, S, H * D))``; the new keys and values are written into the pools."""
    err, B, S, D, past, totals = paged_geometry(query.shape, key.shape, value.shape, packed, kpool, vpool.shape,
                                                table, seqlens, total, H, kvH)
    if err:
        return err, np.empty((0, 0, 0), np.float32)
    q4, k4, v4 = qkv_rows(query, key, value, packed, H, kvH, D)
    if rotary:
        err, pos = paged_positions(past, S, cosc.shape, sinc.shape, D)
        if err:
            return err, np.empty((0, 0, 0), np.float32)
        q4, k4 = rotate_qk(q4, k4, pos, cosc, sinc, interleaved)
    _write(table, past, k4, kpool)
    _write(table, past, v4, vpool)
    params = np.empty(2, np.float32)
    params[0] = scale if scale != 0 else 1.0 / math.sqrt(D)
    params[1] = softcap
    out = np.empty((B, S, H, D), np.float32)
    work = 0
    for b in range(B):
        work += totals[b]
    if work * S * H * D < PAGED_PARALLEL_WORK:
        paged_attend_serial(q4, kpool, vpool, table, past, totals, params, causal, window, smooth, out)
    else:
        paged_attend_par(q4, kpool, vpool, table, past, totals, params, causal, window, smooth, out)
    return 0, out.reshape((B, S, H * D))


# -- the CPU wrapper and the region form -------------------------------------------------------------

_ZC = np.zeros((1, 1), np.float32)


def paged_inputs(b: Gqa, args) -> tuple:
    """The ten inputs (None where absent) after the presence and type checks a form makes statically."""
    args = tuple(args) + (None,) * (10 - len(args))
    q, k, v, kp, vp, table, sl, tot, cos, sin = args[:10]
    if len(args) > 10 and any(a is not None for a in args[10:]):
        raise InvalidArgumentError(f"{OP}: takes at most 10 inputs")
    if q is None or kp is None or vp is None or table is None or sl is None or tot is None:
        raise InvalidArgumentError(f"{OP}: query, key_pool, value_pool, block_table, seqlens_k and "
                                   f"total_sequence_length are required")
    if q.ndim != 3:
        raise InvalidArgumentError(f"{OP}: query must be 3-d (batch, sequence, hidden), got shape {list(q.shape)}")
    if (k is None) != (v is None) or (k is not None and (k.ndim != 3 or v.ndim != 3)):
        raise_paged_error(3, f", got {None if k is None else list(k.shape)} and {None if v is None else list(v.shape)}")
    for name, pool in (("key_pool", kp), ("value_pool", vp)):
        if pool.ndim != 4 or pool.dtype != np.float32 or not pool.flags.c_contiguous or not pool.flags.writeable:
            raise InvalidArgumentError(f"{OP}: {name} must be a writable C-contiguous float32 array of rank 4 "
                                       f"(num_blocks, kv_num_heads, block_size, head_size), got {pool.dtype} "
                                       f"{list(pool.shape)}")
    if table.ndim != 2 or table.dtype.kind not in "iu":
        raise_paged_error(5, f", got block_table {table.dtype} {list(table.shape)}")
    if b.rotary and (cos is None or sin is None or cos.ndim != 2 or sin.ndim != 2):
        raise_paged_error(9, "; do_rotary=1 needs both, 2-d")
    return q, k, v, kp, vp, table, sl, tot, cos, sin


def _f32(x):
    return np.ascontiguousarray(x, dtype=np.float32)


def _cpu(b: Gqa, ctx):
    def run(*args):
        q, k, v, kp, vp, table, sl, tot, cos, sin = paged_inputs(b, args)
        qf = _f32(q)
        err, y = paged_f32(qf, qf if k is None else _f32(k), qf if v is None else _f32(v), k is None, kp, vp,
                           np.ascontiguousarray(table, dtype=np.int32), np.asarray(sl).reshape(-1).astype(np.int64),
                           int(np.asarray(tot).reshape(-1)[0]), _ZC if cos is None else _f32(cos),
                           _ZC if sin is None else _f32(sin), b.H, b.kvH, b.scale, b.softcap, b.window, b.rotary,
                           b.interleaved, b.smooth, b.causal)
        if err:
            raise_paged_error(err)
        return y if q.dtype == np.float32 else y.astype(q.dtype)
    return run


def _form(e, b: Gqa):
    """The region form: ``paged_f32`` on the node's values; the pools must be donated graph inputs (the engine
    feeds them whole and lets this node write them)."""
    float_only(e, 0, 1, 2, 8, 9)
    if len(e.node.inputs) > 10 or e.rank(0) != 3 or e.has(1) != e.has(2) or not all(e.has(k) for k in (3, 4, 5, 6, 7)):
        raise Decline("inputs")
    if not (e.donated(3) and e.donated(4)) or e.dtype(3) != np.float32 or e.dtype(4) != np.float32 \
            or e.rank(3) != 4 or e.rank(4) != 4 or e.rank(5) != 2:
        raise Decline("pools that are not donated float32 graph inputs")
    if (e.has(1) and (e.rank(1) != 3 or e.rank(2) != 3)) or \
            (b.rotary and not (e.has(8) and e.has(9) and e.rank(8) == 2 and e.rank(9) == 2)):
        raise Decline("ranks")
    if any(e.dtype(k).kind not in "iu" for k in (5, 6, 7)):
        raise Decline("integer inputs")
    zc = "np.zeros((1, 1), np.float32)"
    total = "{i7}[()]" if e.rank(7) == 0 else "{i7}[0]"
    table = "{i5}" if e.dtype(5) == np.int32 else "{i5}.astype(np.int32)"  # no copy per layer of an int32 table
    g = e.use(__name__, "paged_f32")
    has = e.has
    e.line(f"{{p}}_err, {{o0}} = {g}({{i0}}, {'{i1}' if has(1) else '{i0}'}, {'{i2}' if has(2) else '{i0}'}, "
           f"{not has(1)}, {{i3}}, {{i4}}, {table}, {{i6}}.reshape(({{i6}}.size,)), "
           f"np.int64({total}), {'{i8}' if has(8) else zc}, {'{i9}' if has(9) else zc}, {b.H}, {b.kvH}, "
           f"{b.scale!r}, {b.softcap!r}, {b.window}, {b.rotary}, {b.interleaved}, {b.smooth}, {b.causal})")
    raise_on(e, "{p}_err", [(c, cls, msg) for c, (cls, msg) in PAGED_ERRORS.items()])
    e.declare(0, np.dtype(np.float32), 3)


op(OP, 1, domain=DOMAIN, bind=bind_paged)(_cpu)
form(OP, domain=DOMAIN, bind=bind_paged)(_form)


# -- com.microsoft::PagedAttention: onnxruntime-genai's paged decoders -----------------------------------------

MS_OP = "PagedAttention"
MS_DOMAIN = "com.microsoft"
# the inputs this kernel refuses, by position; past the first ten it reads the q/k norms (12, 13), and
# attention_metadata (16) is a launch hint it does not read
_MS_UNSUPPORTED = {10: "slot_mapping", 11: "head_sink", 14: "k_scale", 15: "v_scale"}
_MS_INPUTS = 17


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def bind_ms_paged(ctx, num_heads=0, kv_num_heads=0, scale=0.0, softcap=0.0, local_window_size=-1, do_rotary=0,
                  rotary_interleaved=0, is_causal=1, rotary_offset=0, kv_cache_layout="SEPARATE", v_head_size=0,
                  k_quant_type="NONE", v_quant_type="NONE", k_cache_dtype="", v_cache_dtype="",
                  qk_norm_epsilon=1e-6) -> Gqa:
    """The attributes, as GroupQueryAttention's bound form (the same attention; no smooth softmax, no score
    output); what this kernel does not compute is refused by name (``InvalidAttributeError``): the LATENT layout
    and its narrower value heads, quantized caches, a rotary offset, a window of no key."""
    H, kvH = int(num_heads), int(kv_num_heads)
    if H <= 0 or kvH <= 0 or H % kvH:
        raise InvalidAttributeError(f"{MS_OP}: num_heads ({H}) must be a positive multiple of kv_num_heads ({kvH})")
    if _text(kv_cache_layout) != "SEPARATE" or int(v_head_size):
        raise InvalidAttributeError(f"{MS_OP}: kv_cache_layout {_text(kv_cache_layout)!r} (v_head_size "
                                    f"{int(v_head_size)}) is not supported; this kernel reads SEPARATE caches")
    for name, v in (("k_quant_type", k_quant_type), ("v_quant_type", v_quant_type)):
        if _text(v) != "NONE":
            raise InvalidAttributeError(f"{MS_OP}: {name} {_text(v)!r}: quantized caches are not supported")
    for name, v in (("k_cache_dtype", k_cache_dtype), ("v_cache_dtype", v_cache_dtype)):
        if _text(v) not in ("", "float16", "bfloat16"):
            raise InvalidAttributeError(f"{MS_OP}: {name} {_text(v)!r}: quantized caches are not supported")
    if int(rotary_offset):
        raise InvalidAttributeError(f"{MS_OP}: rotary_offset {int(rotary_offset)} is not supported (only 0)")
    w = int(local_window_size)
    if w == 0:
        raise InvalidAttributeError(f"{MS_OP}: local_window_size 0 attends no key; it is not supported")
    return Gqa(H, kvH, float(scale), float(softcap), w if w > 0 else -1, bool(int(do_rotary)),
               bool(int(rotary_interleaved)), smooth=False, causal=bool(int(is_causal)), qk_output=0, windowed=False,
               n_outputs=ctx.n_outputs, qk_eps=float(qk_norm_epsilon))


MS_ERRORS = {
    **{k: GQA_ERRORS[k] for k in (1, 2)},
    3: ("ShapeMismatchError", "key and value must both have shape (num_tokens, kv_num_heads * head_size)"),
    4: ("ShapeMismatchError", "key_cache and value_cache must both have shape (num_blocks, block_size, "
                              "kv_num_heads, head_size)"),
    5: ("ShapeMismatchError", "cumulative_sequence_length must have batch_size + 1 entries and block_table "
                              "batch_size rows, batch_size being past_seqlens' length"),
    6: ("InvalidArgumentError", "cumulative_sequence_length must rise from 0 to the number of tokens, and "
                                "past_seqlens be 0 or more"),
    7: ("IndexOutOfRangeError", "a sequence's positions reach past its block table"),
    8: ("IndexOutOfRangeError", "a block id is outside the cache"),
    9: GQA_ERRORS[9],
    10: ("IndexOutOfRangeError", "a position is outside the cos/sin caches"),
}


def raise_ms_error(code: int, detail: str = ""):
    raise_coded(MS_ERRORS, code, MS_OP, detail)


@njit(**_OPTS)
def ms_geometry(qshape, kshape, vshape, packed, kc_shape, vc_shape, cum, past, table, H, kvH):
    """Shapes and positions of one step, checked: ``(error code, D, row (T,), pos (T,), totals (B,))``: each packed
    token's sequence and position, and each sequence's length after the step.  Every block id of positions
    ``[0, totals[b])`` is checked against the cache."""
    T, hidden = qshape
    B = past.shape[0]
    e = np.zeros(0, np.int64)
    if packed:
        if hidden % (H + 2 * kvH):
            return 1, 0, e, e, e
        D = hidden // (H + 2 * kvH)
    else:
        if hidden % H:
            return 2, 0, e, e, e
        D = hidden // H
        if kshape[0] != T or kshape[1] != kvH * D or vshape[0] != T or vshape[1] != kvH * D:
            return 3, D, e, e, e
    N, bs, ch, cd = kc_shape
    if ch != kvH or cd != D or bs < 1 or vc_shape[0] != N or vc_shape[1] != bs or vc_shape[2] != kvH \
            or vc_shape[3] != D:
        return 4, D, e, e, e
    if cum.shape[0] != B + 1 or table.shape[0] != B:
        return 5, D, e, e, e
    if cum[0] != 0 or cum[B] != T:
        return 6, D, e, e, e
    M = table.shape[1]
    row = np.empty(T, np.int64)
    pos = np.empty(T, np.int64)
    totals = np.empty(B, np.int64)
    for b in range(B):
        n = np.int64(cum[b + 1]) - np.int64(cum[b])
        if n < 0 or past[b] < 0:
            return 6, D, e, e, e
        t = np.int64(past[b]) + n
        if (t + bs - 1) // bs > M:
            return 7, D, e, e, e
        for i in range((t + bs - 1) // bs):
            blk = table[b, i]
            if blk < 0 or blk >= N:
                return 8, D, e, e, e
        totals[b] = t
        for j in range(n):
            row[cum[b] + j] = b
            pos[cum[b] + j] = np.int64(past[b]) + j
    return 0, D, row, pos, totals


def ms_paged(b: Gqa, q, k, v, kc, vc, cum, past, table, cos, sin, qn=None, kn=None):
    """The op: ``output`` (num_tokens, num_heads * head_size) in ``q``'s dtype; the step's keys (after rotary) and
    values are written into ``kc`` and ``vc`` in place, in their dtype, before the attention reads them.

    The attention runs in float32 over the blocks the step's sequences use, gathered once from the caches into
    the pool layout of ``paged_attend_*``, each packed token a row of its own: its sequence's block table, its
    position as the past, its sequence's length as the total."""
    packed = k is None
    cum = np.ascontiguousarray(cum, dtype=np.int64).reshape(-1)
    past = np.ascontiguousarray(past, dtype=np.int64).reshape(-1)
    table = np.ascontiguousarray(table, dtype=np.int64)
    err, D, row, pos, totals = ms_geometry(q.shape, q.shape if packed else k.shape, q.shape if packed else v.shape,
                                           packed, kc.shape, vc.shape, cum, past, table, b.H, b.kvH)
    if err:
        raise_ms_error(err)
    T = q.shape[0]
    qf = _f32(q).reshape(T, 1, -1)
    kf = qf if packed else _f32(k).reshape(T, 1, -1)
    vf = qf if packed else _f32(v).reshape(T, 1, -1)
    if qn is not None:  # the fused q/k norms, before rotary
        qf, kf = qk_norms(qf, kf, packed, b.H, b.kvH, qn, kn, b.qk_eps, MS_OP)
        vf = qf if packed else vf
    q4, k4, v4 = qkv_rows(qf, kf, vf, packed, b.H, b.kvH, D)
    if b.rotary:
        err, pos2 = paged_positions(pos, 1, cos.shape, sin.shape, D)
        if err:
            raise_ms_error(err)
        # only the step's rows of the caches go to float32 (a float16 export's caches hold every position)
        rows = np.arange(T, dtype=np.int64).reshape(T, 1)
        q4, k4 = rotate_qk(q4, k4, rows, _f32(cos[pos2[:, 0]]), _f32(sin[pos2[:, 0]]), b.interleaved)
    bs = kc.shape[1]
    blk = table[row, pos // bs]
    kc[blk, pos % bs] = k4[:, 0]
    vc[blk, pos % bs] = v4[:, 0]
    used = np.unique(np.concatenate([table[s, :(totals[s] + bs - 1) // bs] for s in range(len(totals))] +
                                    [np.zeros(0, np.int64)]))
    kpool = np.ascontiguousarray(np.asarray(kc[used], np.float32).transpose(0, 2, 1, 3))
    vpool = np.ascontiguousarray(np.asarray(vc[used], np.float32).transpose(0, 2, 1, 3))
    width = max(1, int((totals.max(initial=0) + bs - 1) // bs))
    local = np.searchsorted(used, table[:, :width].clip(0)).astype(np.int32)  # rows' ids in the gathered pool
    params = np.asarray([b.scale if b.scale != 0 else 1.0 / math.sqrt(D), b.softcap], np.float32)
    out = np.empty((T, 1, b.H, D), np.float32)
    attend = paged_attend_serial if int(totals[row].sum()) * b.H * D < PAGED_PARALLEL_WORK else paged_attend_par
    attend(q4, kpool, vpool, np.ascontiguousarray(local[row]), pos, np.ascontiguousarray(totals[row]), params,
           b.causal, b.window, False, out)
    y = out.reshape(T, b.H * D)
    return y if q.dtype == np.float32 else y.astype(q.dtype)


def _ms_cpu(b: Gqa, ctx):
    def run(*args):
        args = tuple(args) + (None,) * (_MS_INPUTS - len(args))
        q, k, v, kc, vc, cum, past, table, cos, sin = args[:10]
        for at, name in _MS_UNSUPPORTED.items():
            if args[at] is not None:
                raise InvalidArgumentError(f"{MS_OP}: input {name} is not supported by this kernel")
        qn, kn = args[12], args[13]
        if (qn is None) != (kn is None):
            raise InvalidArgumentError(f"{MS_OP}: q_norm_weight and k_norm_weight must be given together")
        if q is None or kc is None or vc is None or cum is None or past is None or table is None:
            raise InvalidArgumentError(f"{MS_OP}: query, key_cache, value_cache, cumulative_sequence_length, "
                                       f"past_seqlens and block_table are required")
        if q.ndim != 2:
            raise InvalidArgumentError(f"{MS_OP}: query must be 2-d (num_tokens, hidden), got shape "
                                       f"{list(q.shape)}")
        if (k is None) != (v is None) or (k is not None and (k.ndim != 2 or v.ndim != 2)):
            raise_ms_error(3, f", got {None if k is None else list(k.shape)} and "
                              f"{None if v is None else list(v.shape)}")
        for name, c in (("key_cache", kc), ("value_cache", vc)):
            if c.ndim != 4 or c.dtype.kind != "f" and c.dtype.name != "bfloat16" or not c.flags.c_contiguous \
                    or not c.flags.writeable:
                raise InvalidArgumentError(f"{MS_OP}: {name} must be a writable C-contiguous float array of rank 4 "
                                           f"(num_blocks, block_size, kv_num_heads, head_size), got {c.dtype} "
                                           f"{list(c.shape)}")
        for name, a, rank in (("cumulative_sequence_length", cum, 1), ("past_seqlens", past, 1),
                              ("block_table", table, 2)):
            if a.ndim != rank or a.dtype.kind not in "iu":
                raise InvalidArgumentError(f"{MS_OP}: {name} must be an integer tensor of rank {rank}, got "
                                           f"{a.dtype} {list(a.shape)}")
        if b.rotary and (cos is None or sin is None or cos.ndim != 2 or sin.ndim != 2):
            raise_ms_error(9, "; do_rotary=1 needs both, 2-d")
        return ms_paged(b, q, k, v, kc, vc, cum, past, table, cos, sin, qn, kn), kc, vc
    return run


op(MS_OP, 1, domain=MS_DOMAIN, bind=bind_ms_paged, views=True)(_ms_cpu)
