"""CUDA ``onnx_numba::PagedGroupQueryAttention``: GroupQueryAttention over a paged KV cache, the CPU twin's op
(``ops/paged_attention.py`` states the contract) on device arrays.

Row ``b`` holds ``T_b = seqlens_k[b] + 1`` positions after the step, its ``S`` new tokens at positions
``[P_b, T_b)`` with ``P_b = T_b - S``; position ``p`` lives in block ``block_table[b, p // block_size]`` at row
``p % block_size`` of ``key_pool``/``value_pool`` ``(num_blocks, kv_num_heads, block_size, head_size)``.  Two
kernels, launched in order on one stream:

- ``_paged_write``: one thread per element of the new (B, S, kvH, D) keys and values; the key is rotated at
  position ``P_b + s`` when ``do_rotary`` (read from the input, never in place) and both are written into the
  pools through the table, in place;
- ``_paged_attn``: one block per (row, query head, query position); the (rotated) query row is staged in shared
  memory and the keys ``key_range(P_b + s, T_b, causal, local_window_size)`` are walked in tiles of
  ``blockDim`` keys (one key per thread, its block looked up in the table, its pool offset kept in shared
  memory for the value pass), with an online softmax (running max and sum, rescaled accumulator of ``D`` floats
  in shared memory); softcap, scale (0: ``1/sqrt(D)``) and ``smooth_softmax`` (a zero logit in the sum) as on
  the CPU.  A query with no key in range yields zeros.

``block_table``, ``seqlens_k`` and ``total_sequence_length`` are host inputs: the wrapper checks them on the host
with the CPU twin's typed ``paged_geometry`` (and the rotary positions with ``paged_positions``), raising from
``PAGED_ERRORS`` with the CPU op's classes and messages, before any launch; the table and the per-row
(past, total) then go up through ``upload_small``.  The kernels also clamp every block id, table column and
cache row they derive, so no input reaches outside an array even if a check were missed.

Invariants: query/key/value, the pools and the cos/sin caches are C-contiguous float32 device arrays (other
dtypes are refused); the pools are written in place (only the rows of positions ``[P_b, T_b)``), never copied
or returned, and no other input is written; the output is a new (B, S, num_heads * head_size) float32 device
array.  Two rows must not write the same block row (the engine's paged cache guarantees it: a reused prefix ends
at a block boundary and rows write past their prefix); a block they share is only read.
"""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError, ShapeMismatchError
from ops.group_query_attention import Gqa
from ops.paged_attention import (DOMAIN, OP, bind_paged, paged_geometry, paged_inputs, paged_positions,
                                 raise_paged_error)
from ops.registry import op
from ._common import (F32, MAX_ROW_THREADS, check_device, flat, grid1d, host_array, key_span, online_tile,
                      row_threads, unravel4, upload_small)
from .contrib_attention import MAX_HEAD_SIZE, _rot_elem

__all__ = ["launch_paged"]

_CUDA = "CUDAExecutionProvider"
_ZERO = np.zeros((), np.float32)


# -- kernels -------------------------------------------------------------------------------------------

@jit(device=True)
def _pool_row(table, M, b, p, bs, nblk):
    """The pool block of position ``p`` of row ``b`` (``table`` flat (B, M)), clamped into the table and the
    pool; the host has checked both, so the clamps never bite on valid input."""
    i = p // bs
    if i >= M:
        i = M - 1
    if i < 0:
        i = 0
    blk = np.int64(table[b * M + i])
    if blk >= nblk:
        blk = nblk - 1
    if blk < 0:
        blk = 0
    return blk


@jit
def _paged_write(ksrc, vsrc, kv_stride, k_off, v_off, n, kpool, vpool, table, M, rows, S, kvH, D, bs, nblk,
                 rotary, interleaved, rot, cos, sin, cw, crows):
    """The new keys (rotated when ``rotary``) and values into the pools: one thread per element of (B, S, kvH, D);
    ``rows`` = [past (B), totals (B)]."""
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, n, step):
        b, s, kh, d = unravel4(i, S, kvH, D)
        p = np.int64(rows[b]) + s
        blk = _pool_row(table, M, b, p, bs, nblk)
        o = ((blk * kvH + kh) * bs + p % bs) * D + d
        base = (b * S + s) * kv_stride + k_off + kh * D
        if rotary:
            crow = p if p < crows else crows - 1
            kpool[o] = _rot_elem(ksrc, base, d, rot, interleaved, cos, sin, crow, cw)
        else:
            kpool[o] = ksrc[base + d]
        vpool[o] = vsrc[(b * S + s) * kv_stride + v_off + kh * D + d]


@jit
def _paged_attn(qsrc, q_stride, kpool, vpool, table, M, rows, S, H, kvH, D, bs, nblk, scale, softcap, causal, window,
                smooth, rotary, interleaved, rot, cos, sin, cw, crows, out):
    qs = cuda.shared.array(MAX_HEAD_SIZE, np.float32)
    acc = cuda.shared.array(MAX_HEAD_SIZE, np.float32)
    ps = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    ko = cuda.shared.array(MAX_ROW_THREADS, np.int64)  # pool offset of each key of the tile
    red = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    r = cuda.blockIdx.x
    b = r // (H * S)
    h = (r // S) % H
    s = r % S
    kh = h // (H // kvH)
    nb = rows.size // 2
    T = np.int64(rows[nb + b])
    p = np.int64(rows[b]) + s
    lo, hi = key_span(p, T, causal, window)
    qbase = (b * S + s) * q_stride + h * D
    crow = p if p < crows else crows - 1
    for d in range(tid, D, nt):
        if rotary:
            qs[d] = _rot_elem(qsrc, qbase, d, rot, interleaved, cos, sin, crow, cw)
        else:
            qs[d] = qsrc[qbase + d]
        acc[d] = np.float32(0.0)
    cuda.syncthreads()
    m = np.float32(-np.inf)
    lsum = np.float32(0.0)
    for t0 in range(lo, hi, nt):
        j = t0 + tid
        x = np.float32(-np.inf)
        if j < hi:
            kb = ((_pool_row(table, M, b, j, bs, nblk) * kvH + kh) * bs + j % bs) * D
            ko[tid] = kb
            dot = np.float32(0.0)
            for d in range(D):
                dot += qs[d] * kpool[kb + d]
            x = dot * scale
            if softcap > 0:
                x = softcap * math.tanh(x / softcap)
        m, alpha, lsum = online_tile(red, ps, tid, nt, x, j < hi, m, lsum)  # its barriers also publish ko
        cnt = hi - t0
        if cnt > nt:
            cnt = nt
        for d in range(tid, D, nt):
            a = acc[d] * alpha
            for t in range(cnt):
                a += ps[t] * vpool[ko[t] + d]
            acc[d] = a
        cuda.syncthreads()
    f = np.float32(1.0)
    if smooth:  # a zero logit joins the max and the sum (ops/paged_attention.paged_attend_par)
        m2 = m if m > 0 else np.float32(0.0)
        f = math.exp(m - m2)
        lsum = lsum * f + math.exp(-m2)
    inv = np.float32(0.0)
    if lsum != 0:
        inv = f / lsum
    obase = ((b * S + s) * H + h) * D
    for d in range(tid, D, nt):
        out[obase + d] = acc[d] * inv


# -- the launch ----------------------------------------------------------------------------------------

class _PoolFacts(NamedTuple):
    """What ``paged_inputs`` reads of a pool, taken from a device array (whose ``flags`` is not numpy's)."""

    ndim: int
    dtype: np.dtype
    shape: tuple
    flags: SimpleNamespace


def _facts(a):
    if a is None:
        return None
    return _PoolFacts(a.ndim, a.dtype, tuple(int(v) for v in a.shape),
                      SimpleNamespace(c_contiguous=a.is_c_contiguous(), writeable=True))


def _host(name, a):
    return None if a is None else host_array(OP, name, a, integer=False)


def launch_paged(g: Gqa, ctx):
    """The CUDA implementation of PagedGroupQueryAttention, written once in ``ops/paged_attention.py`` (its
    bind, its checks and messages): the bound op's per-run callable; the pools are written in place."""
    def run(*args):
        return _paged(g, *args)
    return run


def _paged(g: Gqa, *args):
    args = tuple(args) + (None,) * (10 - len(args))
    q, k, v, kp, vp = args[:5]
    cos, sin = args[8:10]
    check_device(OP, query=q, key=k, value=v, key_pool=kp, value_pool=vp, cos_cache=cos, sin_cache=sin)
    # The CPU twin's presence, rank and type checks, on the pools' facts and the host inputs.
    checked = paged_inputs(g, args[:3] + (_facts(kp), _facts(vp)) + tuple(
        _host(n, a) for n, a in zip(("block_table", "seqlens_k", "total_sequence_length"), args[5:8]))
        + args[8:])
    table_h, sl_h, tot_h = checked[5:8]
    floats = dict(query=q, key=k, value=v, **(dict(cos_cache=cos, sin_cache=sin) if g.rotary else {}))
    for name, a in floats.items():
        if a is not None and a.dtype != F32:
            raise InvalidArgumentError(f"{OP}: the CUDA kernel takes float32 {name}, got {a.dtype}")
    packed = k is None
    qs = tuple(int(x) for x in q.shape)
    kshape = qs if packed else tuple(int(x) for x in k.shape)
    vshape = qs if packed else tuple(int(x) for x in v.shape)
    table = np.ascontiguousarray(table_h, dtype=np.int32)
    # paged_geometry reads only the key pool's shape: a zero-stride stand-in of that shape, no memory.
    err, B, S, D, past, totals = paged_geometry(
        qs, kshape, vshape, packed, np.broadcast_to(_ZERO, tuple(kp.shape)), tuple(int(x) for x in vp.shape),
        table, np.asarray(sl_h).reshape(-1).astype(np.int64), int(np.asarray(tot_h).reshape(-1)[0]), g.H, g.kvH)
    if err:
        raise_paged_error(err)
    if D > MAX_HEAD_SIZE:
        raise ShapeMismatchError(f"{OP}: head size {D} exceeds the CUDA kernel's limit {MAX_HEAD_SIZE}")
    H, kvH = g.H, g.kvH
    if g.rotary:
        err, _ = paged_positions(past, S, tuple(int(x) for x in cos.shape), tuple(int(x) for x in sin.shape), D)
        if err:
            raise_paged_error(err)
        cw, crows = int(cos.shape[1]), int(cos.shape[0])
        cos_f, sin_f = flat(cos), flat(sin)
    else:
        cw, crows = 1, 1
        cos_f = sin_f = flat(q)
    hidden = qs[2]
    if packed:
        ksrc = vsrc = q
        kv_stride, k_off, v_off = hidden, H * D, (H + kvH) * D
    else:
        ksrc, vsrc = k, v
        kv_stride, k_off, v_off = kvH * D, 0, 0
    y = rc.device_empty((B, S, H * D), F32)
    if y.size == 0:
        return y
    nblk, bs, M = int(kp.shape[0]), int(kp.shape[2]), int(table.shape[1])
    table_d = flat(upload_small(table))
    rows_d = flat(upload_small(np.concatenate([past, totals]).astype(np.int64)))
    kp_f, vp_f = flat(kp), flat(vp)
    n_new = B * S * kvH * D
    blocks, threads = grid1d(n_new)
    _paged_write[blocks, threads](flat(ksrc), flat(vsrc), kv_stride, k_off, v_off, n_new, kp_f, vp_f, table_d, M,
                                  rows_d, S, kvH, D, bs, nblk, g.rotary, g.interleaved, 2 * cw, cos_f, sin_f, cw,
                                  crows)
    sc = g.scale if g.scale else 1.0 / math.sqrt(D)
    nt = row_threads(max(min(int(totals.max()), MAX_ROW_THREADS), D))
    _paged_attn[B * H * S, nt](flat(q), hidden, kp_f, vp_f, table_d, M, rows_d, S, H, kvH, D, bs, nblk,
                               np.float32(sc), np.float32(g.softcap), g.causal, g.window, g.smooth, g.rotary,
                               g.interleaved, 2 * cw, cos_f, sin_f, cw, crows, flat(y))
    return y


op(OP, 1, domain=DOMAIN, provider=_CUDA, host_inputs=(5, 6, 7), bind=bind_paged)(launch_paged)
