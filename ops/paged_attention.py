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
from .group_query_attention import GQA_ERRORS, Gqa, bind_gqa, qkv_rows, rotate_qk
from .registry import op

__all__ = ["DOMAIN", "OP", "bind_paged", "paged_geometry", "paged_f32", "PAGED_ERRORS", "raise_paged_error",
           "paged_positions", "PAGED_PARALLEL_WORK"]

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
