"""Convolutions: Conv, ConvTranspose, ConvInteger, Col2Im, com.microsoft FusedConv, and the fusion passes'
onnx_numba FusedConv and HardSwishRelu6.

Every spatial rank (1-d, 2-d, 3-d) is canonicalized to 3-d by inserting unit
leading spatial axes, so each kernel compiles once per dtype.  A float32 1-d or
2-d Conv of one group on an AVX-512 host runs as products over shifted rows of
its input (``ops/_shifted.py``, ``SHIFTED_CONV``), the bias and a fused
activation applied per tile; otherwise Conv is im2col followed by a BLAS matmul
per (batch, group), and a float32 im2col Conv of one group on an AVX-512 host
writes its columns as the panels of ``ops/_panels.py`` and multiplies the weight
rows against them there (``_conv_panels``, ``PANEL_CONV``).  ``onnx_numba.FusedConv``
(``runtime/passes/conv_fusions.py``) is a Conv with the activation that followed
it, applied by the same plan.  ConvTranspose is the reverse, a matmul followed
by a col2im scatter-add.  16-bit floats are computed in float32; integer convs
(ConvInteger) in float64, which is exact for the int32 accumulations their
inputs allow.

Invariants: kernels receive C-contiguous arrays and never write into their
inputs; attribute checks (channel/group consistency, kernel shape) happen in
the wrappers and raise ``ShapeMismatchError`` / ``InvalidAttributeError``.
"""
from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from . import _i16pairs, _shifted, _u8s8
from ._common import F32, as_int_list, lowp, pad3, tap_runs, window_geometry
from ._panels import PANEL, gemm_panels_par
from ._simd import AVX512
from .registry import op

__all__ = ["conv_nd", "conv_transpose_nd"]

_OPTS = dict(cache=True, nogil=True)


# -- kernels ---------------------------------------------------------------------------------------

_IM2COL_PARALLEL_MIN = 1 << 15  # column elements from which ``_im2col`` spreads its rows over the threads


@njit(parallel=True, **_OPTS)
def _im2col(x, col, ksz, st, pb, dil, osz):
    """x: (Cg, D, H, W) -> col: (Cg*kd*kh*kw, od*oh*ow); out-of-image taps read 0.  Rows in parallel, or in
    this thread for small columns (a thread launch costs more than they do)."""
    nrow = col.shape[0]
    if col.size < _IM2COL_PARALLEL_MIN:
        _im2col_rows(x, col, ksz, st, pb, dil, osz, 0, nrow)
        return
    nt = min(nrow, 64)
    for t in prange(nt):
        _im2col_rows(x, col, ksz, st, pb, dil, osz, t * nrow // nt, (t + 1) * nrow // nt)


@njit(**_OPTS)
def _im2col_rows(x, col, ksz, st, pb, dil, osz, r0, r1, dst0=0):
    """Rows [r0, r1) of ``_im2col``, row r written as ``col``'s row ``r - dst0``.  Flat unsigned indices (no view
    reference counts across threads, no negative-index wraparound in the copy loops); the row's channel and taps
    are counted up from r0's, and a column stride of 1 bounds its valid outputs without a division (a row of a small
    convolution costs a few outputs' copies, less than the integer divisions that located it)."""
    Cg, D, H, W = x.shape
    kd, kh, kw = ksz[0], ksz[1], ksz[2]
    od, oh, ow = osz[0], osz[1], osz[2]
    L = od * oh * ow
    xf = x.reshape(-1)
    cf = col.reshape(-1)
    s2 = st[2]
    c = r0 // (kd * kh * kw)
    rem = r0 - c * (kd * kh * kw)
    a = rem // (kh * kw)
    rem -= a * (kh * kw)
    b = rem // kw
    e = rem - b * kw
    for r in range(r0, r1):
        # valid output columns: 0 <= xo*st - pb + e*dil < W, so the inner loop needs no branch
        off = e * dil[2] - pb[2]
        if s2 == 1:
            lo = min(max(-off, 0), ow)
            hi = min(max(W - off, 0), ow)
        else:
            lo = 0
            if off < 0:
                lo = min((-off + s2 - 1) // s2, ow)
            hi = 0
            if W - off > 0:
                hi = min((W - off + s2 - 1) // s2, ow)
        hi = max(hi, lo)
        j = (r - dst0) * L
        for zo in range(od):
            zi = zo * st[0] - pb[0] + a * dil[0]
            zok = zi >= 0 and zi < D
            for yo in range(oh):
                yi = yo * st[1] - pb[1] + b * dil[1]
                if zok and yi >= 0 and yi < H:
                    src = ((c * D + zi) * H + yi) * W + off
                    for xo in range(lo):
                        cf[np.uint64(j + xo)] = 0
                    if s2 == 1:
                        for xo in range(lo, hi):
                            cf[np.uint64(j + xo)] = xf[np.uint64(src + xo)]
                    else:
                        for xo in range(lo, hi):
                            cf[np.uint64(j + xo)] = xf[np.uint64(src + xo * s2)]
                    for xo in range(hi, ow):
                        cf[np.uint64(j + xo)] = 0
                else:
                    for xo in range(ow):
                        cf[np.uint64(j + xo)] = 0
                j += ow
        e += 1
        if e == kw:
            e = 0
            b += 1
            if b == kh:
                b = 0
                a += 1
                if a == kd:
                    a = 0
                    c += 1


_BATCH_COL_BYTES = 64 << 20  # a batch's im2col columns are made at once below this size
# A float32 convolution of one group through im2col runs on the panel products of ``ops/_panels.py`` on hosts with
# AVX-512 (where those take their blocked register tiles), from ``PANEL_CONV_MIN`` column rows (Cg * kernel
# taps) and output pixels and 16 output channels up: its columns are written straight into the panels
# (``_im2col_panels``), so the product costs no packing pass.
# In one process, alternating, with the panels against numpy's BLAS: YOLOv8n at 320x320 26.0 against 30.7 ms,
# the ddddocr recognizer 20.6 against 24.8 ms.  1x1 convolutions stay on BLAS, which reads the image in place
# (a 1x1 over 256 channels of 7600 pixels took 5.7 ms through packed panels against 3.9), as do columns of
# fewer rows (a first 3x3 convolution of 3 channels: 5.5 against 3.1 ms), images of fewer pixels (a batch of 64
# images of 1 to 5 pixels takes two thread-pool launches per image: 4.1 ms against 1.9 for BLAS's one batched
# product) and fewer than 16 output channels.
PANEL_CONV = AVX512
PANEL_CONV_MIN = 64  # column rows (Cg * taps) and output pixels from which the panels run
# Before both, a float32 1-d or 2-d convolution of one group on an AVX-512 host runs as products over shifted rows
# of the input (``ops/_shifted.py``: no columns written at all, the bias and the activation applied per tile),
# from ``SHIFTED_MIN_MACS`` multiply-adds (below, its two thread-pool launches cost more than the product).  In
# one process, 2 threads, against the panels and BLAS paths: 3x3 convolutions of 12 to 512 channels 1.1 to 1.8
# times faster alone.  1x1 convolutions take it too: alone, one over 169 to 196 pixels ran at 0.64 to 0.72 times
# BLAS's speed (each 4-row tile rereads a deep input tile that BLAS packs once), but inside models, where BLAS's
# threads wake after Numba's, every model ran faster with them here (sessions alternating in one process: a
# MobileNetV3 orientation classifier 5.41 -> 4.64 ms, the PaddleOCR direction classifier 3.19 -> 2.60 ms,
# YOLOv8n 19.3 -> 18.1 ms), and 2**18 multiply-adds against 2**20 took another 3% off the small models.  Outputs
# of fewer than ``_shifted.TILE`` pixels stay with BLAS: a tile of 64 would be mostly waste, and a batch of them
# costs two launches per image (Silero VAD's batch of 64 STFT frames of 5 outputs each: 2.7 -> 5.6 ms).
SHIFTED_CONV = AVX512
SHIFTED_MIN_MACS = 1 << 18
# A float32 depthwise convolution of depth 1 on an AVX-512 host runs on the same register tiles, one row per
# channel over its taps (``_shifted.depthwise2d``), the bias and the activation applied as each output row is
# written.  In one process, alternating, against ``_depthwise_rows`` and ``_depthwise_wide`` and their separate
# bias and activation pass: a MobileNetV3 orientation classifier 5.17-5.48 -> 4.53-4.67 ms, the PaddleOCR
# detector 16.6-17.4 -> 16.1-16.3 ms.
SHIFTED_DEPTHWISE = AVX512
SHIFTED_MIN_PIXELS = _shifted.TILE


# On an AVX-512 host an output of fewer than ``FEW_PIXELS`` pixels (a voice-activity model's convolutions over 1
# to 5 frames, a classifier's last 7x7 and 1x1 maps) runs on ``_shifted``'s register tiles with the roles turned:
# the output pixels' columns, transposed, are the rows, and the 64-wide vectors run over the output channels, the
# weights packed at plan time tile by tile ((M/64, K, 64), zeros past M) so that each tile streams its weights
# front to back.  The product, the bias and the activation are one kernel call instead of the column, product and
# epilogue steps of the im2col path, and the (image, channel tile) tasks go over the threads from
# ``_FEW_PIXELS_PARALLEL_MIN`` multiply-adds (below, waking the threads costs more: Silero's STFT convolution,
# 2**18 of them, took 17 us in this thread and 43 us on two, alternating with onnxruntime).  Each output sums its
# terms in order from zero and then adds the bias, as the other paths of one group do.  Inside Silero VAD
# (alternating with onnxruntime) its six convolutions of 1 to 4 outputs took 59 us together, against 119 through
# im2col, BLAS and the epilogue; in one process, sessions alternating, against im2col and BLAS: a MobileNetV3
# classifier (7x7 and 1x1 maps) 4.37 -> 3.99 ms, Silero's batch of 64 frames 2.88 -> 2.11 ms, a CRNN recognizer
# and magika unchanged.
FEW_PIXELS = _shifted.TILE if AVX512 else 0  # (the tiles' 16-lane vectors would spill on narrower hosts)
_FEW_PIXELS_PARALLEL_MIN = 1 << 19  # multiply-adds from which the tasks go to the threads


@njit(**_OPTS)
def _columns_t(x, colt, ksz, st, pb, dil, osz, c0, c1):
    """im2col's columns transposed, for the input channels [c0, c1): colt[j, k] is output pixel j's input under
    weight column k = (c, a, b, e) of x (Cg, D, H, W), 0 outside the image.  Flat unsigned indices (signed ones
    cost Numba's negative-index wraparound on every element)."""
    Cg, D, H, W = x.shape
    K = colt.shape[1]
    xf = x.reshape(-1)
    cf = colt.reshape(-1)
    taps = ksz[0] * ksz[1] * ksz[2]
    for c in range(c0, c1):
        k = c * taps
        for a in range(ksz[0]):
            for b in range(ksz[1]):
                for e in range(ksz[2]):
                    j = 0
                    for z in range(osz[0]):
                        zi = z * st[0] - pb[0] + a * dil[0]
                        for y in range(osz[1]):
                            yi = y * st[1] - pb[1] + b * dil[1]
                            inside = 0 <= zi < D and 0 <= yi < H
                            row = ((c * D + zi) * H + yi) * W
                            for o in range(osz[2]):
                                xi = o * st[2] - pb[2] + e * dil[2]
                                v = np.float32(0.0)
                                if inside and 0 <= xi < W:
                                    v = xf[np.uint64(row + xi)]
                                cf[np.uint64(j * K + k)] = v
                                j += 1
                    k += 1


@njit(**_OPTS)
def _few_pixels_task(colt, wt, offs, out, bias, act, p0, p1, mt, r0, r1, ot, col):
    """out[m, j] = act(sum_k colt[j, k] * W[m, k] + bias[m]) for the output channels m of tile ``mt`` and the
    pixels j in [r0, r1); ``wt`` holds W tile by tile, (MT, K, 64) flat, ``offs[k] = k * 64``; ot (L, 64) and
    col (L,) are scratch."""
    M, L = out.shape
    TILE = _shifted.TILE
    _shifted.product_tile(wt, offs, colt, ot, r0, r1, mt * offs.shape[0] * TILE, 0)
    nb = bias.shape[0] > 0
    m0 = mt * TILE
    if r1 - r0 < 8:
        for m in range(m0, min(M, m0 + TILE)):
            bv = bias[m] if nb else _shifted.NO_ADD
            for j in range(r0, r1):
                out[m, j] = _shifted.act_value(ot[j, m - m0] + bv, act, p0, p1)
        return
    # longer runs: each channel's column gathered, then finished by the vectorized loops of ``_shifted``
    of = out.reshape(-1)
    for m in range(m0, min(M, m0 + TILE)):
        for j in range(r0, r1):
            col[j] = ot[j, m - m0]
        _shifted.finish_run(col, r0, of, m * L + r0, r1 - r0, bias[m] if nb else _shifted.NO_ADD, act, p0, p1)


@njit(**_OPTS)
def _few_pixels(x, wt, offs, out, bias, act, p0, p1, ksz, st, pb, dil, osz):
    """out (N, M, L) = act(W @ im2col(x[n]) + bias) for x (N, Cg, D, H, W), in this thread."""
    K, L = offs.shape[0], out.shape[2]
    MT = wt.shape[0] // (K * _shifted.TILE)
    colt, ot, col = np.empty((L, K), np.float32), np.empty((L, _shifted.TILE), np.float32), np.empty(L, np.float32)
    for n in range(x.shape[0]):
        _columns_t(x[n], colt, ksz, st, pb, dil, osz, 0, x.shape[1])
        for mt in range(MT):
            _few_pixels_task(colt, wt, offs, out[n], bias, act, p0, p1, mt, 0, L, ot, col)


@njit(parallel=True, **_OPTS)
def _few_pixels_par(x, wt, offs, out, bias, act, p0, p1, ksz, st, pb, dil, osz, nthreads):
    """``_few_pixels`` over the threads: the columns by runs of input channels, then tasks of (image, channel
    tile, block of pixels), the pixels cut into blocks of six rows of the tiles until there are tasks for
    every thread twice over."""
    N, Cg, K, L = x.shape[0], x.shape[1], offs.shape[0], out.shape[2]
    MT = wt.shape[0] // (K * _shifted.TILE)
    colt = np.empty((N, L, K), np.float32)
    P = max(1, min(nthreads, Cg))
    for task in prange(N * P):
        n = task // P
        part = task - n * P
        _columns_t(x[n], colt[n], ksz, st, pb, dil, osz, part * Cg // P, (part + 1) * Cg // P)
    RB = L
    while N * MT * ((L + RB - 1) // RB) < 2 * nthreads and RB > 6:
        RB = max(6, (RB // 2 + 5) // 6 * 6)
    LB = (L + RB - 1) // RB
    ntask = N * MT * LB
    T = max(1, min(nthreads, ntask))
    for t in prange(T):
        ot, col = np.empty((L, _shifted.TILE), np.float32), np.empty(L, np.float32)
        for task in range(t * ntask // T, (t + 1) * ntask // T):
            n = task // (MT * LB)
            rest = task - n * MT * LB
            mt = rest // LB
            r0 = (rest - mt * LB) * RB
            _few_pixels_task(colt[n], wt, offs, out[n], bias, act, p0, p1, mt, r0, min(L, r0 + RB), ot, col)


@njit(parallel=True, **_OPTS)
def _im2col_panels(x, wp, ksz, st, pb, dil, osz):
    """``_im2col``'s columns (K, L) written straight into float32 panels ``wp`` (ceil(L/16), K, 16) as
    ``_panels.pack_panels_into`` lays them out (zeros past L): each row is made in a buffer of the task's, then
    cut into its panels' rows."""
    P, K = wp.shape[0], wp.shape[1]
    L = osz[0] * osz[1] * osz[2]
    nt = min(K, 64)
    for t in prange(nt):
        buf = np.empty((1, P * PANEL), np.float32)  # each row writes [0, L); the last panel's tail stays zero
        buf[0, L:] = 0.0
        for r in range(t * K // nt, (t + 1) * K // nt):
            _im2col_rows(x, buf, ksz, st, pb, dil, osz, r, r + 1, r)
            for q in range(P):
                for i in range(PANEL):
                    wp[q, r, i] = buf[0, q * PANEL + i]


@njit(**_OPTS)
def _conv_panels(xc, w2, out, wp, ksz, st, pb, dil, osz):
    """One group's convolution of every image over the panel products: xc (N, Cg, D, H, W) float32, w2 (M, K),
    out (N, M, L), ``wp`` scratch panels (ceil(L/16), K, 16).  The columns are the product's panels and the weight
    rows its rows, so the result is NCHW as it stands."""
    for n in range(xc.shape[0]):
        _im2col_panels(xc[n], wp, ksz, st, pb, dil, osz)
        gemm_panels_par(w2, wp, out[n])


@njit(parallel=True, **_OPTS)
def _im2col_batch(x, cols, ksz, st, pb, dil, osz):
    """x: (N, Cg, D, H, W) -> cols: (N, Cg*kd*kh*kw, od*oh*ow), each image as ``_im2col`` lays it out; one
    parallel task per image (``_im2col_rows`` over all its rows)."""
    for n in prange(x.shape[0]):
        _im2col_rows(x[n], cols[n], ksz, st, pb, dil, osz, 0, cols.shape[1])


@njit(**_OPTS)
def _add_bias(out, b):
    """out: (N, M, L) += b[M]."""
    N, M, L = out.shape
    for nm in range(N * M):
        n = nm // M
        m = nm - n * M
        v = b[m]
        for j in range(L):
            out[n, m, j] += v


@njit(**_OPTS)
def _conv_run(x, w, out, col, ksz, st, pb, dil, osz, direct):
    """x: (N, G, Cg, D, H, W); w: (G, Mg, Cg*K); out: (N, G, Mg, L); col: (Cg*K, L) scratch."""
    N, G = x.shape[0], x.shape[1]
    Cg = x.shape[2]
    L = out.shape[3]
    for n in range(N):
        for g in range(G):
            if direct:
                np.dot(w[g], x[n, g].reshape((Cg, L)), out[n, g])
            else:
                _im2col(x[n, g], col, ksz, st, pb, dil, osz)
                np.dot(w[g], col, out[n, g])


@njit(parallel=True, **_OPTS)
def _depthwise_rows(x, w, out, ksz, st, pb, dil):
    """x: (N, C, ID, IH, IW), w: (C, KD, KH, KW), out: (N, C, OD, OH, OW); one filter per channel, for long
    output rows or column strides above 2 (``_depthwise_wide`` otherwise).  Channels run in parallel; each
    output row takes its taps in order (depth, height, width), each tap over the run of outputs whose input
    lies inside the row, so every output sums the taps it had alone, in the same order, and the inner loop is
    a contiguous axpy.  Flat indices, not views: a view inside the parallel loop would count references on the
    shared array from every thread; unsigned, so that Numba adds no negative-index wraparound, which keeps the
    inner loop from vectorizing (each index is in range by construction)."""
    N, C, OD, OH, OW = out.shape
    ID, IH, IW = x.shape[2], x.shape[3], x.shape[4]
    KD, KH, KW = ksz[0], ksz[1], ksz[2]
    xf = x.reshape(-1)
    of = out.reshape(-1)
    wf = w.reshape(-1)
    s2 = st[2]
    los, his = tap_runs(KW, dil[2], pb[2], s2, IW, OW)  # per width tap: the outputs inside the row
    for nc in prange(N * C):
        c = nc % C
        xb = nc * ID * IH * IW
        for od in range(OD):
            for oh in range(OH):
                ob = ((nc * OD + od) * OH + oh) * OW
                for ow in range(OW):
                    of[np.uint64(ob + ow)] = 0
                for a in range(KD):
                    zi = od * st[0] - pb[0] + a * dil[0]
                    if zi < 0 or zi >= ID:
                        continue
                    for b in range(KH):
                        yi = oh * st[1] - pb[1] + b * dil[1]
                        if yi < 0 or yi >= IH:
                            continue
                        rb = xb + (zi * IH + yi) * IW
                        for e in range(KW):
                            off = e * dil[2] - pb[2]
                            lo, hi = los[e], his[e]
                            wv = wf[np.uint64(((c * KD + a) * KH + b) * KW + e)]
                            if s2 == 1:
                                xo = rb + off
                                for ow in range(lo, hi):
                                    of[np.uint64(ob + ow)] += xf[np.uint64(xo + ow)] * wv
                            else:
                                for ow in range(lo, hi):
                                    of[np.uint64(ob + ow)] += xf[np.uint64(rb + ow * s2 + off)] * wv


@njit(parallel=True, **_OPTS)
def _depthwise_wide(x, w, out, ksz, st, pb, dil, nthreads):
    """x: (N, C, ID, IH, IW), w: (C, KD, KH, KW), out: (N, C, OD, OH, OW); one filter per channel, for short
    output rows (``_depthwise_rows`` otherwise).

    Each of ``nthreads`` tasks takes a run of channels.  A channel's input plane is copied, zero-padded, into
    stride-phase planes (``_phase_planes``: plane (pr, pc) holds the padded rows pr, pr+s1, ... and columns pc,
    pc+s2, ...), so that every tap reads one contiguous stretch of one plane at a fixed offset from the output
    position.  Output rows go in blocks laid out RW wide (the columns past OW are computed and dropped), small
    enough to stay in the first-level cache; a tap's share of a block is one long multiply-add loop instead of
    a short loop per row.  Every output sums its taps in order (depth, height, width) from zero, as a direct
    loop would.  Scratch is allocated once per task."""
    N, C, OD, OH, OW = out.shape
    ID = x.shape[2]
    KD, KH, KW = ksz[0], ksz[1], ksz[2]
    s1, s2 = st[1], st[2]
    RH = ((OH - 1) * s1 + (KH - 1) * dil[1] + 1 + s1 - 1) // s1  # rows of a phase plane
    RW = ((OW - 1) * s2 + (KW - 1) * dil[2] + 1 + s2 - 1) // s2  # columns of a phase plane (the laid-out width)
    PS = RH * RW + RW  # a plane's length: a tap's stretch may run up to RW - 1 past its last row
    # output rows per block; with depth taps, one block per output plane, so that each depth tap's planes are
    # made once (the sums and their order do not depend on the blocks)
    RB = OH if KD > 1 else max(1, _DW_BLOCK // RW)
    NC = N * C
    T = max(1, min(nthreads, NC))
    xf = x.reshape(-1)
    of = out.reshape(-1)
    wf = w.reshape(-1)
    for t in prange(T):
        planes = np.empty(s1 * s2 * PS, x.dtype)
        acc = np.empty(min(RB, OH) * RW, x.dtype)
        for nc in range(t * NC // T, (t + 1) * NC // T):
            c = nc % C
            for od in range(OD):
                for h0 in range(0, OH, RB):
                    n = (min(OH, h0 + RB) - h0) * RW
                    acc[:n] = 0
                    for a in range(KD):
                        zi = od * st[0] - pb[0] + a * dil[0]
                        if zi < 0 or zi >= ID:
                            continue
                        if h0 == 0:  # (KD is 1 when there are later blocks: the planes stay made for them)
                            _phase_planes(xf, (nc * ID + zi) * x.shape[3] * x.shape[4], x.shape[3], x.shape[4],
                                          planes, RH, RW, PS, s1, s2, pb[1], pb[2])
                        for b in range(KH):
                            r = b * dil[1]
                            for e in range(KW):
                                q = e * dil[2]
                                base = ((r % s1) * s2 + q % s2) * PS + (r // s1 + h0) * RW + q // s2
                                wv = wf[np.uint64(((c * KD + a) * KH + b) * KW + e)]
                                for j in range(n):
                                    acc[j] += planes[np.uint64(base + j)] * wv
                    ob = ((nc * OD + od) * OH + h0) * OW
                    for i in range(n // RW):
                        for ow in range(OW):
                            of[np.uint64(ob + i * OW + ow)] = acc[i * RW + ow]


_DW_BLOCK = 2048  # elements of a depthwise output block (8 KiB in float32)
_DW_WIDE_MAX_OW = 64  # the widest output rows ``_depthwise_wide`` takes (with column stride 1 or 2)


def _depthwise(x, w, out, ksz, st, pb, dil):
    """The depthwise kernel that pays for this geometry: rows of a few dozen outputs spend a short loop per tap
    and row in ``_depthwise_rows``, so they take ``_depthwise_wide``'s long loops, whose phase planes cost a
    copy of the input that long rows and column strides above 2 do not repay.  One node, 2 threads, rows
    against wide: 256x14x14 by 5x5 252 -> 115 us; 96x28x28 by 5x5 230 -> 113 us; 32x112x112 by 3x3 stride 2
    179 -> 144 us; 16x112x112 by 3x3 111 us against 146 (so rows there).  Both sum every output's taps in the
    same order, so they give the same bits."""
    if _depthwise_wide_pays(out.shape[4], st[2]):
        _depthwise_wide(x, w, out, ksz, st, pb, dil, get_num_threads())
    else:
        _depthwise_rows(x, w, out, ksz, st, pb, dil)


def _depthwise_wide_pays(ow: int, col_stride: int) -> bool:
    return col_stride <= 2 and ow <= _DW_WIDE_MAX_OW


@njit(**_OPTS)
def _phase_planes(xf, xb, IH, IW, planes, RH, RW, PS, s1, s2, p1, p2):
    """The IH x IW plane of ``xf`` at ``xb``, padded by p1 rows and p2 columns before (zeros around), split into
    s1 x s2 phase planes of RH x RW (plane (pr, pc), element (i, j): padded row i*s1 + pr, column j*s2 + pc),
    each followed by RW zeros.  Every element is written once."""
    for pr in range(s1):
        for pc in range(s2):
            pb0 = (pr * s2 + pc) * PS
            # columns j with 0 <= j*s2 + pc - p2 < IW
            lo = min(RW, max(0, (p2 - pc + s2 - 1) // s2))
            hi = max(lo, min(RW, (IW - 1 + p2 - pc) // s2 + 1)) if IW - 1 + p2 - pc >= 0 else lo
            for i in range(RH):
                pb = pb0 + i * RW
                yi = i * s1 + pr - p1
                if yi < 0 or yi >= IH:
                    for j in range(RW):
                        planes[np.uint64(pb + j)] = 0
                    continue
                rb = xb + yi * IW + pc - p2
                for j in range(lo):
                    planes[np.uint64(pb + j)] = 0
                if s2 == 1:
                    for j in range(lo, hi):
                        planes[np.uint64(pb + j)] = xf[np.uint64(rb + j)]
                elif s2 == 2:  # a literal stride: the loads vectorize as an interleaved group
                    for j in range(lo, hi):
                        planes[np.uint64(pb + j)] = xf[np.uint64(rb + 2 * j)]
                else:
                    for j in range(lo, hi):
                        planes[np.uint64(pb + j)] = xf[np.uint64(rb + j * s2)]
                for j in range(hi, RW):
                    planes[np.uint64(pb + j)] = 0
            for j in range(RW):
                planes[np.uint64(pb0 + RH * RW + j)] = 0


@njit(parallel=True, **_OPTS)
def _col2im(col, out, ksz, st, pb, dil, isz):
    """col: (Mg*kd*kh*kw, id*ih*iw) scatter-added into out: (Mg, OD, OH, OW)."""
    Mg, OD, OH, OW = out.shape
    kd, kh, kw = ksz[0], ksz[1], ksz[2]
    idd, ih, iw = isz[0], isz[1], isz[2]
    K = kd * kh * kw
    for m in prange(Mg):
        for k in range(K):
            a = k // (kh * kw)
            rem = k - a * (kh * kw)
            b = rem // kw
            e = rem - b * kw
            r = m * K + k
            j = 0
            for zi in range(idd):
                zo = zi * st[0] - pb[0] + a * dil[0]
                zok = zo >= 0 and zo < OD
                for yi in range(ih):
                    yo = yi * st[1] - pb[1] + b * dil[1]
                    yok = zok and yo >= 0 and yo < OH
                    for xi in range(iw):
                        xo = xi * st[2] - pb[2] + e * dil[2]
                        if yok and xo >= 0 and xo < OW:
                            out[m, zo, yo, xo] += col[r, j]
                        j += 1


@njit(**_OPTS)
def _convT_run(x, wt, out, col, ksz, st, pb, dil, isz):
    """x: (N, G, Cg, L); wt: (G, Mg*K, Cg); out: (N, G, Mg, OD, OH, OW) zero-filled; col: (Mg*K, L)."""
    N, G = x.shape[0], x.shape[1]
    for n in range(N):
        for g in range(G):
            np.dot(wt[g], x[n, g], col)
            _col2im(col, out[n, g], ksz, st, pb, dil, isz)


# -- shape bookkeeping -----------------------------------------------------------------------------

def _blas_ready(a):
    """A C-contiguous, writeable array: numba's np.dot crashes on read-only operands (initializer mmaps)."""
    a = np.ascontiguousarray(a)
    return a if a.flags.writeable else a.copy()


def _with_bias(out, b, osp, dt, name):
    """A convolution's result: ``out`` (N, G, Mg, *spatial) in the compute dtype plus the bias ``b`` [M] (checked),
    shaped (N, M, *osp) in ``dt``."""
    N, G, Mg = out.shape[:3]
    M = G * Mg
    out = out.reshape((N, M, int(np.prod(out.shape[3:]))))
    if b is not None and out.size:
        if b.shape != (M,):
            raise ShapeMismatchError(f"{name}: B must have shape [{M}], got {list(b.shape)}")
        _add_bias(out, np.ascontiguousarray(b, dtype=out.dtype))
    out = out.reshape((N, M, *osp))
    return out.astype(dt) if out.dtype != dt else out


class _ConvPlan:
    """What a convolution of one input shape and dtype by one weight needs, worked out once: the window geometry
    (3-d), the path (1x1 product, im2col product, depthwise, grouped), the weights in the compute dtype,
    ready for BLAS, and the bias checked.  ``Conv`` keeps the plan of its last input shape, so a run with the
    same shape pays only the kernels."""

    def __init__(self, xshape, xdtype, w, b, auto_pad, dilations, group, kernel_shape, pads, strides, name,
                 panels=None, shifted=None, act=0, p0=0.0, p1=0.0):
        if len(xshape) != w.ndim:
            raise ShapeMismatchError(f"{name}: X has rank {len(xshape)} but W has rank {w.ndim}")
        N, C = xshape[:2]
        M = w.shape[0]
        group = int(group)
        if group < 1 or C != w.shape[1] * group or M % group:
            raise ShapeMismatchError(f"{name}: X has {C} channels, W has shape {list(w.shape)} and group={group}; "
                                     f"expected C == W.shape[1]*group and M divisible by group")
        ks = kernel_shape if kernel_shape else w.shape[2:]
        if list(ks) != list(w.shape[2:]):
            raise ShapeMismatchError(f"{name}: kernel_shape {list(ks)} does not match W spatial shape "
                                     f"{list(w.shape[2:])}")
        k, s, d, pb, pe, osp = window_geometry(name, xshape, ks, auto_pad, dilations, pads, strides)
        self.dt = dt = np.dtype(xdtype)
        cdt = F32 if lowp(dt) else dt
        if cdt.kind != "f":
            cdt = np.dtype(np.float64)
        self.cdt, self.name, self.osp = cdt, name, tuple(osp)
        self.N, self.C, self.G, self.Cg, self.Mg = N, C, group, C // group, M // group
        self.k3, self.s3, self.d3 = pad3(k, 1), pad3(s, 1), pad3(d, 1)
        self.pb3, self.o3, self.i3 = pad3(pb, 0), pad3(osp, 1), pad3(xshape[2:], 1)
        self.L = int(np.prod(self.o3))
        self.wc = _blas_ready(w.astype(cdt, copy=False)).reshape((group, M // group, -1))
        self.direct = bool(np.all(self.k3 == 1) and np.all(self.s3 == 1) and not any(pb) and not any(pe))
        self.empty = self.Cg * int(np.prod(self.k3)) == 0
        # the panel products (``PANEL_CONV``, ``PANEL_CONV_MIN``; ``panels`` True or False overrides the host's
        # choice for a float32 im2col convolution of one group)
        self.panels = group == 1 and cdt == F32 and not self.empty and not self.direct and (
            PANEL_CONV and self.wc.shape[2] >= PANEL_CONV_MIN and self.L >= PANEL_CONV_MIN
            and self.Mg >= PANEL if panels is None else bool(panels))
        # the shifted-row products (``SHIFTED_CONV`` and its thresholds; ``shifted`` True or False overrides the
        # host's choice for a float32 convolution of one group and depth 1)
        self.shifted = group == 1 and cdt == F32 and not self.empty and self.k3[0] == 1 and self.i3[0] == 1 and (
            SHIFTED_CONV and M * self.wc.shape[2] * self.L >= SHIFTED_MIN_MACS and self.L >= SHIFTED_MIN_PIXELS
            if shifted is None else bool(shifted))
        # a float32 depthwise convolution of depth 1 on ``_shifted``'s tiles (``SHIFTED_DEPTHWISE``)
        self.dw_tiles = (SHIFTED_DEPTHWISE and group == C > 1 and self.Mg == 1 and cdt == F32 and not self.empty
                         and self.k3[0] == 1 and self.i3[0] == 1)
        if b is not None and b.shape != (M,):
            raise ShapeMismatchError(f"{name}: B must have shape [{M}], got {list(b.shape)}")
        self.b = None if b is None else np.ascontiguousarray(b, dtype=cdt)
        # the activation applied to the result (``_shifted.ACTIVATIONS``: a Conv fused with what follows it)
        self.act, self.p0, self.p1 = int(act), float(p0), float(p1)
        self.bias = self.b if self.b is not None else np.zeros(0, cdt)  # as the kernels take it: empty for none
        # outputs of a few pixels: one call (``_few_pixels``) over W transposed into rows of whole tiles
        K = self.wc.shape[2]
        self.few = (group == 1 and cdt == F32 and not self.empty and not self.shifted and not self.panels
                    and 0 < self.L < FEW_PIXELS)
        if self.few:
            T = _shifted.TILE
            MT = -(-M // T)
            wt = np.zeros((MT * T, K), F32)
            wt[:M] = self.wc[0]
            self.wt = np.ascontiguousarray(wt.reshape(MT, T, K).transpose(0, 2, 1)).reshape(-1)
            self.offs = np.arange(K, dtype=np.int64) * T
            self.x5 = (N, C, *(int(v) for v in self.i3))
            self.few_par = N * M * K * self.L >= _FEW_PIXELS_PARALLEL_MIN and (N * MT > 1 or self.L > 6)
            self.wc = None  # the tiles hold the weights now

    def __call__(self, x):
        N, G, Cg, Mg, L, cdt = self.N, self.G, self.Cg, self.Mg, self.L, self.cdt
        k3, s3, pb3, d3, o3, i3, wc = self.k3, self.s3, self.pb3, self.d3, self.o3, self.i3, self.wc
        if self.dw_tiles:
            out = np.empty((N, G, o3[1], o3[2]), F32)
            if out.size:
                xc = x if x.dtype == F32 and x.flags.c_contiguous else np.ascontiguousarray(x, dtype=F32)
                _shifted.depthwise2d(xc.reshape((N, G, i3[1], i3[2])), wc.reshape((G, -1)), out, self.bias,
                                     self.act, self.p0, self.p1, k3[1], k3[2], s3[1], s3[2], pb3[1], pb3[2], d3[1],
                                     d3[2], get_num_threads())
            out = out.reshape((N, G, *self.osp))
            return out.astype(self.dt) if out.dtype != self.dt else out
        if self.few:
            out = np.empty((N, Mg, L), F32)
            xc = x if x.dtype == F32 and x.flags.c_contiguous else np.ascontiguousarray(x, dtype=F32)
            if self.few_par:
                _few_pixels_par(xc.reshape(self.x5), self.wt, self.offs, out, self.bias, self.act, self.p0, self.p1,
                                k3, s3, pb3, d3, o3, get_num_threads())
            else:
                _few_pixels(xc.reshape(self.x5), self.wt, self.offs, out, self.bias, self.act, self.p0, self.p1,
                            k3, s3, pb3, d3, o3)
            out = out.reshape((N, Mg, *self.osp))
            return out.astype(self.dt) if out.dtype != self.dt else out
        out = np.empty((N, G, Mg, L), cdt)
        if out.size and self.shifted:
            xc = np.ascontiguousarray(x, dtype=cdt).reshape((N, Cg, i3[1], i3[2]))
            _shifted.conv2d(xc, wc[0], out.reshape((N, Mg, o3[1], o3[2])), self.bias, self.act, self.p0, self.p1,
                            k3[1], k3[2], s3[1], s3[2], pb3[1], pb3[2], d3[1], d3[2], get_num_threads())
            out = out.reshape((N, G * Mg, *self.osp))
            return out.astype(self.dt) if out.dtype != self.dt else out
        if out.size:
            xc = _blas_ready(x.astype(cdt, copy=False)).reshape((N, G, Cg, *i3))
            col = np.empty((0, 0) if self.direct or self.panels else (wc.shape[2], L), cdt)
            if self.empty:
                out[...] = 0
            elif self.panels:
                wp = np.empty(((L + PANEL - 1) // PANEL, wc.shape[2], PANEL), F32)
                _conv_panels(xc.reshape((N, Cg, *i3)), wc[0], out.reshape((N, Mg, L)), wp, k3, s3, pb3, d3, o3)
            elif G == 1 and (self.direct or N == 1 or N * col.size * cdt.itemsize > _BATCH_COL_BYTES):
                # numpy's BLAS runs its own thread pool and beats numba's np.dot binding here
                for n in range(N):
                    if self.direct:
                        np.matmul(wc[0], xc[n, 0].reshape((Cg, L)), out=out[n, 0])
                    else:
                        _im2col(xc[n, 0], col, k3, s3, pb3, d3, o3)
                        np.matmul(wc[0], col, out=out[n, 0])
            elif G == 1:
                # a batch of small images: every image's columns in one parallel pass, then one batched product,
                # instead of alternating Numba's threads and BLAS's N times (each switch can stall on the other
                # pool's spinning threads)
                cols = np.empty((N,) + col.shape, cdt)
                _im2col_batch(xc[:, 0], cols, k3, s3, pb3, d3, o3)
                np.matmul(wc[0], cols, out=out[:, 0])
            elif Cg == 1 and Mg == 1:
                # Depthwise: one direct loop; per-group im2col + matmul would pay C parallel launches.
                _depthwise(xc.reshape((N, self.C, *i3)), wc.reshape((self.C, *k3)), out.reshape((N, self.C, *o3)),
                           k3, s3, pb3, d3)
            else:
                _conv_run(xc, wc, out, col, k3, s3, pb3, d3, o3, self.direct)
        out = out.reshape((N, G * Mg, L))
        if (self.b is not None or self.act) and out.size:
            _shifted.finish(out, self.bias, self.act, self.p0, self.p1)
        out = out.reshape((N, G * Mg, *self.osp))
        return out.astype(self.dt) if out.dtype != self.dt else out


def conv_nd(x, w, b, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
            name="Conv"):
    """Float convolution; x: (N, C, *S), w: (M, C/group, *K)."""
    return _ConvPlan(x.shape, x.dtype, w, b, auto_pad, dilations, group, kernel_shape, pads, strides, name)(x)


def _conv_factory(ctx, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                  act=0, p0=0.0, p1=0.0):
    last = [None]  # (x shape, dtype, W, B, plan): the weights are the node's initializers, the same every run

    def run(X, W, B=None):
        entry = last[0]  # read once: a concurrent run may replace it
        if entry is None or entry[0] != X.shape or entry[1] != X.dtype or entry[2] is not W or entry[3] is not B:
            entry = (X.shape, X.dtype, W, B, _ConvPlan(X.shape, X.dtype, W, B, auto_pad, dilations, group,
                                                        kernel_shape, pads, strides, "Conv", act=act, p0=p0, p1=p1))
            last[0] = entry
        return entry[4](X)

    return run


def _conv_activation_factory(ctx, activation=b"", activation_params=None, auto_pad="NOTSET", dilations=None,
                             group=1, kernel_shape=None, pads=None, strides=None):
    """``onnx_numba.FusedConv`` (``runtime/passes/conv_fusions``): Y = activation(Conv(X, W, B)), the activation
    applied by the convolution's own epilogue (``_shifted.ACTIVATIONS``); with a fourth input Z (the residual
    Add, ``FuseConvAddActivation``), Y = activation(Conv(X, W, B) + Z) in one pass after the convolution (an
    empty activation: the Add alone).  A Z of another shape is broadcast to the output's, as the Add would."""
    from .elementwise import cpu_kernel
    act = activation.decode() if isinstance(activation, bytes) else str(activation)
    name = ctx.name or "FusedConv"
    with_z = len(ctx.node.inputs) > 3 and bool(ctx.node.inputs[3]) if getattr(ctx, "node", None) else False
    if act not in _shifted.ACTIVATIONS or (not act and not with_z):
        raise InvalidAttributeError(f"{name}: activation must be one of "
                                    f"{sorted(a for a in _shifted.ACTIVATIONS if a and '_' not in a)}, got {act!r}")
    if act in ("Sigmoid", "SiLU") and cpu_kernel("sigmoid") == "sigmoid_mlas":
        act += "_mlas"
    p = [float(np.float32(v)) for v in (activation_params or [])] + [0.0, 0.0]
    code = _shifted.ACTIVATIONS[act]
    conv = _conv_factory(ctx, auto_pad, dilations, group, kernel_shape, pads, strides, 0 if with_z else code,
                         p[0], p[1])
    if not with_z:
        return conv
    p0, p1 = np.float32(p[0]), np.float32(p[1])

    def run(X, W, B=None, Z=None):
        y = conv(X, W, B)  # a fresh array
        if Z is None or y.dtype != F32 or Z.dtype != F32:
            raise InvalidArgumentError(f"{name}: the residual Z must be float32 like the convolution, got "
                                       f"{None if Z is None else Z.dtype}")
        if Z.shape != y.shape:  # the Add's broadcasting (numpy's error names the shapes when they do not fit)
            try:
                r = np.add(y, Z)
            except ValueError:
                raise ShapeMismatchError(f"{name}: the residual Z of shape {list(Z.shape)} does not broadcast with "
                                         f"the convolution's {list(y.shape)}") from None
            flat = r.reshape(-1)
            _shifted.activate(flat, flat, code, p0, p1)
            return r
        _shifted.add_activate(y.reshape(-1), np.ascontiguousarray(Z).reshape(-1), code, p0, p1)
        return y
    return run


op("Conv", 1, factory=True)(_conv_factory)
op("Conv", 11, factory=True)(_conv_factory)


# -- FusedConv (com.microsoft): a Conv whose output goes through an activation, as onnxruntime's optimizer writes
# it.  activation -> (the unary kernel of ``ops.elementwise`` it runs, how many activation_params it takes);
# onnxruntime's FusedConv takes these and refuses others.  Clip runs as numpy's clip between its two params.
FUSED_CONV_ACTIVATIONS = {"Relu": ("relu", 0), "Tanh": ("tanh", 0), "Sigmoid": ("sigmoid", 0),
                          "LeakyRelu": ("leakyrelu", 1), "HardSigmoid": ("hardsigmoid", 2), "Clip": (None, 2)}


def _activation(name: str, activation, params):
    """``f(y)``: the activation of ``y`` with the unary op's own kernel and driver, so a FusedConv gives the bits
    of Conv followed by that op.  (Applied in place it ran slower: the kernel's loop does not vectorize over
    an output that is its input.)"""
    from . import _elementwise_kernels as K
    from .elementwise import cpu_kernel, run_unary
    act = activation.decode() if isinstance(activation, bytes) else activation
    if act not in FUSED_CONV_ACTIVATIONS:
        raise InvalidAttributeError(f"{name}: activation must be one of {sorted(FUSED_CONV_ACTIVATIONS)}, got "
                                    f"{act!r}")
    kernel, n = FUSED_CONV_ACTIVATIONS[act]
    p = [float(np.float32(v)) for v in (params or [])]
    if len(p) < n:
        raise InvalidAttributeError(f"{name}: activation {act} takes {n} activation_params, got {len(p)}")
    if kernel is None:
        lo, hi = p[0], p[1]
        return lambda y: np.clip(y, y.dtype.type(lo), y.dtype.type(hi), out=y)
    kern = getattr(K, "u_" + cpu_kernel(kernel))
    p0, p1 = (p + [0.0, 0.0])[:2]
    return lambda y: run_unary(kern, y, None, p0, p1)


def _fused_conv_factory(ctx, activation=None, activation_params=None, auto_pad="NOTSET", dilations=None, group=1,
                        kernel_shape=None, pads=None, strides=None):
    """Y = activation(Conv(X, W, B) + Z)."""
    conv = _conv_factory(ctx, auto_pad, dilations, group, kernel_shape, pads, strides)
    act = _activation(ctx.name or "FusedConv", activation, activation_params)

    def run(X, W, B=None, Z=None):
        y = conv(X, W, B)  # a fresh array
        if Z is not None:
            if Z.shape != y.shape or Z.dtype != y.dtype:
                raise ShapeMismatchError(f"FusedConv: Z must be {y.dtype}{list(y.shape)} like the convolution, "
                                         f"got {Z.dtype}{list(Z.shape)}")
            np.add(y, Z, out=y)
        return act(y)
    return run


op("FusedConv", 1, domain="com.microsoft", factory=True)(_fused_conv_factory)
op("FusedConv", 1, domain="onnx_numba", factory=True)(_conv_activation_factory)



def conv_transpose_nd(x, w, b, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, output_padding=None,
                      output_shape=None, pads=None, strides=None, name="ConvTranspose"):
    """x: (N, C, *S), w: (C, M/group, *K) -> (N, M, *O)."""
    if x.ndim != w.ndim:
        raise ShapeMismatchError(f"{name}: X has rank {x.ndim} but W has rank {w.ndim}")
    nd = x.ndim - 2
    if nd < 1 or nd > 3:
        raise InvalidArgumentError(f"{name}: expected 1 to 3 spatial axes, got input of shape {list(x.shape)}")
    N, C = x.shape[:2]
    group = int(group)
    if group < 1 or w.shape[0] != C or C % group:
        raise ShapeMismatchError(f"{name}: X has {C} channels, W has shape {list(w.shape)} and group={group}; "
                                 f"expected W.shape[0] == C, divisible by group")
    G, Cg, Mg = group, C // group, w.shape[1]
    k = list(w.shape[2:])
    if kernel_shape and list(kernel_shape) != k:
        raise ShapeMismatchError(f"{name}: kernel_shape {list(kernel_shape)} does not match W spatial shape {k}")
    s = as_int_list(strides) or [1] * nd
    d = as_int_list(dilations) or [1] * nd
    op_ = as_int_list(output_padding) or [0] * nd
    if len(op_) == 2 * nd:
        op_ = op_[:nd]
    ins = list(x.shape[2:])
    full = [s[i] * (ins[i] - 1) + op_[i] + (k[i] - 1) * d[i] + 1 for i in range(nd)]
    p = as_int_list(pads)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") or (output_shape is not None and len(output_shape) and not p):
        if output_shape is not None and len(output_shape):
            osp = as_int_list(output_shape)[-nd:]
        else:
            osp = [ins[i] * s[i] for i in range(nd)]
        tot = [full[i] - osp[i] for i in range(nd)]
        if auto_pad == "SAME_UPPER":
            pb = [t // 2 for t in tot]
        else:
            pb = [t - t // 2 for t in tot]
    else:
        if auto_pad == "VALID" or not p:
            p = [0] * (2 * nd)
        if len(p) != 2 * nd:
            raise InvalidAttributeError(f"{name}: pads {p} must have {2 * nd} entries")
        pb = p[:nd]
        if output_shape is not None and len(output_shape):
            osp = as_int_list(output_shape)[-nd:]
        else:
            osp = [full[i] - p[i] - p[nd + i] for i in range(nd)]
    if any(o < 0 for o in osp):
        raise ShapeMismatchError(f"{name}: computed a negative output shape {osp}")
    dt = x.dtype
    cdt = F32 if lowp(dt) else dt
    o3 = pad3(osp, 1)
    out = np.zeros((N, G, Mg, *o3), cdt)
    L = int(np.prod(ins))
    K = int(np.prod(k))
    if out.size and L and Cg and K:
        xc = _blas_ready(x.astype(cdt, copy=False)).reshape((N, G, Cg, L))
        wt = np.ascontiguousarray(np.ascontiguousarray(w, dtype=cdt).reshape((G, Cg, Mg * K)).transpose(0, 2, 1))
        col = np.empty((Mg * K, L), cdt)
        _convT_run(xc, wt, out, col, pad3(k, 1), pad3(s, 1), pad3(pb, 0), pad3(d, 1), pad3(ins, 1))
    return _with_bias(out, b, osp, dt, name)


@op("ConvTranspose", 1)
def ConvTranspose(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                  output_padding=None, output_shape=None, pads=None, strides=None):
    return conv_transpose_nd(X, W, B, auto_pad, dilations, group, kernel_shape, output_padding, output_shape,
                             pads, strides)


op("ConvTranspose", 11)(ConvTranspose)


def _conv_integer_float(x, w, x_zero_point, w_zero_point, auto_pad, dilations, group, kernel_shape, pads, strides):
    """Integer conv in float64 (exact up to 2**53); padding contributes the zero point, i.e. 0 after shifting."""
    xf = x.astype(np.float64)
    if x_zero_point is not None:
        xf -= np.asarray(x_zero_point, np.float64).reshape(-1)[0]
    wf = w.astype(np.float64)
    if w_zero_point is not None:
        zp = np.asarray(w_zero_point, np.float64).reshape(-1)
        wf -= zp.reshape((-1,) + (1,) * (w.ndim - 1)) if zp.size > 1 else zp[0]
    y = conv_nd(xf, wf, None, auto_pad, dilations, group, kernel_shape, pads, strides, name="ConvInteger")
    return np.rint(y).astype(np.int32)


@njit(parallel=True, **_OPTS)
def _rows_u8(xp, rows, rsum, ksz, st, dil, osz):
    """The windows of one uint8 image as rows: ``xp`` (C, D, H, W) is the image already padded with its zero
    point, so every window lies inside it; rows[j, k] is output pixel j's code under weight column k = (c, a, b,
    e) and rsum[j] the row's sum.  Pixels in blocks over the threads, flat unsigned indices (no bounds tests,
    no negative-index wraparound); columns past K stay as they are (zeros)."""
    C, D, H, W = xp.shape
    L, K4 = rows.shape
    xf = xp.reshape(-1)
    rf = rows.reshape(-1)
    oh, ow = osz[1], osz[2]
    nb = (L + 63) // 64
    for blk in prange(nb):
        for j in range(blk * 64, min(L, blk * 64 + 64)):
            z = j // (oh * ow)
            y = (j // ow) % oh
            o = j % ow
            s = np.int32(0)
            k = np.uint64(j * K4)
            for c in range(C):
                for a in range(ksz[0]):
                    for b in range(ksz[1]):
                        base = ((c * D + z * st[0] + a * dil[0]) * H + y * st[1] + b * dil[1]) * W + o * st[2]
                        for e in range(ksz[2]):
                            v = xf[np.uint64(base + e * dil[2])]
                            rf[k] = v
                            s += np.int32(v)
                            k += np.uint64(1)
            rsum[j] = s


@njit(parallel=True, **_OPTS)
def _zero_points_t(acc, rsum, cb, za, zb, shift, K, out):
    """out[m, j] (M, L) = acc[j, m] - (zb[m] - shift) * rsum[j] - za * cb[m] + K * za * zb[m] in int32 (wrapping
    as onnxruntime's sums do): ``_u8s8.zero_point_terms`` for one zero point of x, written transposed."""
    M, L = out.shape
    z = np.int32(za)
    per = 1 if zb.shape[0] > 1 else 0
    for m in prange(M):
        zj = np.int32(zb[m * per])
        c = np.int32(z * cb[m]) - np.int32(K) * z * zj
        f = zj - np.int32(shift)
        for j in range(L):
            out[m, j] = np.int32(acc[j, m] - f * rsum[j] - c)


_8BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def _conv_integer_gemm(x, w, xz, wz, auto_pad, dilations, kernel_shape, pads, strides, packed):
    """An ungrouped ConvInteger as onnxruntime's integer GEMM sums it: each image's windows as rows against the
    weights packed once per node (``packed``: the weights, their zero points and the packed form).  uint8 x on
    VNNI hosts: the codes, read from the image padded with its zero point (``_rows_u8``, which also sums each
    row), against the weights as int8 (less 128 when uint8) by ``vpdpbusd`` (``_u8s8.host_gemm_tasks``), the
    zero points through the row and column sums (``_zero_points_t``, written straight into the output);
    elsewhere the codes minus their zero point (im2col, transposed) as exact int16 pairs (``_i16pairs``).  Both
    are the exact integers."""
    N, C = x.shape[:2]
    M = w.shape[0]
    ks = kernel_shape if kernel_shape else w.shape[2:]
    k, s, d, pb, _, osp = window_geometry("ConvInteger", x.shape, ks, auto_pad, dilations, pads, strides)
    k3, s3, d3, pb3, o3, i3 = pad3(k, 1), pad3(s, 1), pad3(d, 1), pad3(pb, 0), pad3(osp, 1), pad3(x.shape[2:], 1)
    K, L = C * int(np.prod(k3)), int(np.prod(o3))
    dots = _u8s8.VNNI and x.dtype == np.uint8
    got = packed.get("w")
    if got is None or got[0] is not w or got[1] != wz.tobytes() or got[2] != dots:
        wzc = wz.reshape((-1,) + (1,) * (w.ndim - 1)) if wz.size > 1 else wz.reshape(())
        if dots:
            shift = 128 if w.dtype == np.uint8 else 0
            wk = np.ascontiguousarray(w.reshape(M, K).T)
            form = (_u8s8.pack((wk.astype(np.int16) - shift).astype(np.int8)), wk.sum(axis=0, dtype=np.int32),
                    np.ascontiguousarray(np.broadcast_to(wz.astype(np.int32), (M,))), shift)
        else:
            bz = (w.astype(np.int16) - wzc.astype(np.int16)).reshape(M, K)
            form = _i16pairs.pack(np.ascontiguousarray(bz.T))
        got = (w, wz.tobytes(), dots, form)
        packed["w"] = got
    form = got[3]
    out = np.empty((N, M, L), np.int32)
    if dots:
        bp, cb, zb, shift = form
        rows = np.zeros((L, 4 * bp.shape[1]), np.uint8)
        rsum = np.empty(L, np.int32)
        acc = np.empty((L, 8 * bp.shape[0]), np.int32)
        za = np.uint8(xz.reshape(-1)[0])
        # the images padded with their zero point, far enough for every window
        ext = [max(int(pb3[i]) + int(i3[i]), (int(o3[i]) - 1) * int(s3[i]) + (int(k3[i]) - 1) * int(d3[i]) + 1)
               for i in range(3)]
        xp = np.full((N, C, *ext), za, np.uint8)
        xp[:, :, pb3[0]:pb3[0] + i3[0], pb3[1]:pb3[1] + i3[1], pb3[2]:pb3[2] + i3[2]] = x.reshape((N, C, *i3))
        for n in range(N):
            _rows_u8(xp[n], rows, rsum, k3, s3, d3, o3)
            _u8s8.host_gemm_tasks(rows, bp, acc)
            _zero_points_t(acc, rsum, cb, np.int32(za), zb, shift, K, out[n])
        return out.reshape((N, M, *osp))
    col = np.empty((K, L), np.int16)
    xs = (x.astype(np.int16) - xz.astype(np.int16).reshape(())).reshape((N, C, *i3))
    bp = form
    rows = np.zeros((L, 2 * bp.shape[1]), np.int16)
    acc = np.empty((L, 8 * bp.shape[0]), np.int32)
    for n in range(N):
        _im2col(xs[n], col, k3, s3, pb3, d3, o3)
        rows[:, :K] = col.T
        _i16pairs.gemm_groups(rows, bp, acc)
        out[n] = acc[:, :M].T
    return out.reshape((N, M, *osp))


def _conv_integer_factory(ctx, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                          strides=None):
    packed = {}  # the weights' packed form, kept while the same weights come in (an initializer: every run)

    def run(x, w, x_zero_point=None, w_zero_point=None):
        xz = np.zeros(1, np.int16) if x_zero_point is None else np.asarray(x_zero_point).reshape(-1)
        wz = np.zeros(1, np.int16) if w_zero_point is None else np.asarray(w_zero_point).reshape(-1)
        ks = list(kernel_shape) if kernel_shape else list(w.shape[2:])
        if (int(group) == 1 and x.dtype in _8BIT and w.dtype in _8BIT and x.ndim == w.ndim >= 3
                and x.shape[1] == w.shape[1] and ks == list(w.shape[2:]) and xz.size == 1
                and wz.size in (1, w.shape[0]) and x.shape[0] * w.shape[0] * w[0].size > 0):
            return _conv_integer_gemm(x, w, xz, wz, auto_pad, dilations, kernel_shape, pads, strides, packed)
        # groups, other types, and every shape the float path refuses by name
        return _conv_integer_float(x, w, x_zero_point, w_zero_point, auto_pad, dilations, group, kernel_shape,
                                   pads, strides)
    return run


op("ConvInteger", 10, factory=True)(_conv_integer_factory)


@op("QLinearConv", 10)
def QLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None, *,
                auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Integer accumulation (exact in float64), then requantization with a float32 multiplier, rounded half to even."""
    xf = x.astype(np.float64) - float(np.asarray(x_zero_point).reshape(-1)[0])
    wzp = np.asarray(w_zero_point).astype(np.float64).reshape(-1)
    wf = w.astype(np.float64) - (wzp.reshape((-1,) + (1,) * (w.ndim - 1)) if wzp.size > 1 else wzp[0])
    acc = conv_nd(xf, wf, None, auto_pad, dilations, group, kernel_shape, pads, strides, name="QLinearConv")
    M = w.shape[0]
    if B is not None:
        acc += np.asarray(B, np.float64).reshape((1, M) + (1,) * (acc.ndim - 2))
    ws = np.asarray(w_scale, np.float32).reshape(-1)
    mult = (np.float32(np.asarray(x_scale, np.float32).reshape(-1)[0]) * ws) / np.float32(
        np.asarray(y_scale, np.float32).reshape(-1)[0])
    mult = mult.astype(np.float64).reshape(((1, -1) if ws.size > 1 else (1, 1)) + (1,) * (acc.ndim - 2))
    yz = np.asarray(y_zero_point)
    info = np.iinfo(yz.dtype)
    y = np.rint((acc * mult).astype(np.float32)) + float(yz.reshape(-1)[0])
    return np.clip(y, info.min, info.max).astype(yz.dtype)


@op("Col2Im", 18)
def Col2Im(input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    img = as_int_list(image_shape)
    blk = as_int_list(block_shape)
    nd = len(img)
    if nd < 1 or nd > 3 or len(blk) != nd:
        raise InvalidArgumentError(f"Col2Im: expected 1 to 3 spatial axes with matching block_shape, got "
                                   f"image_shape {img} and block_shape {blk}")
    s = as_int_list(strides) or [1] * nd
    d = as_int_list(dilations) or [1] * nd
    p = as_int_list(pads) or [0] * (2 * nd)
    K = int(np.prod(blk))
    N, CK, L = input.shape
    if K == 0 or CK % K:
        raise ShapeMismatchError(f"Col2Im: input dim 1 ({CK}) must be a multiple of prod(block_shape) ({K})")
    nblk = [(img[i] + p[i] + p[nd + i] - ((blk[i] - 1) * d[i] + 1)) // s[i] + 1 for i in range(nd)]
    if int(np.prod(nblk)) != L:
        raise ShapeMismatchError(f"Col2Im: input has {L} blocks, image_shape {img} with these attributes gives "
                                 f"{int(np.prod(nblk))}")
    C = CK // K
    dt = input.dtype
    cdt = F32 if lowp(dt) else dt
    o3 = pad3(img, 1)
    out = np.zeros((N, C, *o3), cdt)
    xc = np.ascontiguousarray(input, dtype=cdt)
    for n in range(N):
        _col2im(xc[n], out[n], pad3(blk, 1), pad3(s, 1), pad3(p[:nd], 0), pad3(d, 1), pad3(nblk, 1))
    out = out.reshape((N, C, *img))
    return out.astype(dt) if cdt != dt else out


@njit(parallel=True, **_OPTS)
def _deform_im2col(x, off, msk, col, ksz, st, pb, dil, osz):
    """x: (C, H, W); off: (OG, kh, kw, 2, oh, ow); msk: (OG, kh, kw, oh, ow); col: (C*kh*kw, oh*ow).

    Each tap samples x bilinearly at its offset position; corners outside the image read 0.
    """
    C, H, W = x.shape
    OG = off.shape[0]
    kh, kw = ksz[0], ksz[1]
    oh, ow = osz[0], osz[1]
    cpg = C // OG
    for r in prange(C * kh * kw):
        c = r // (kh * kw)
        rem = r - c * (kh * kw)
        a = rem // kw
        b = rem - a * kw
        og = c // cpg
        j = 0
        for yo in range(oh):
            for xo in range(ow):
                hh = yo * st[0] - pb[0] + a * dil[0] + off[og, a, b, 0, yo, xo]
                ww = xo * st[1] - pb[1] + b * dil[1] + off[og, a, b, 1, yo, xo]
                h0 = int(np.floor(hh))
                w0 = int(np.floor(ww))
                lh = hh - h0
                lw = ww - w0
                v = 0.0
                if h0 >= 0 and h0 < H:
                    if w0 >= 0 and w0 < W:
                        v += (1 - lh) * (1 - lw) * x[c, h0, w0]
                    if w0 + 1 >= 0 and w0 + 1 < W:
                        v += (1 - lh) * lw * x[c, h0, w0 + 1]
                if h0 + 1 >= 0 and h0 + 1 < H:
                    if w0 >= 0 and w0 < W:
                        v += lh * (1 - lw) * x[c, h0 + 1, w0]
                    if w0 + 1 >= 0 and w0 + 1 < W:
                        v += lh * lw * x[c, h0 + 1, w0 + 1]
                col[r, j] = v * msk[og, a, b, yo, xo]
                j += 1


@op("DeformConv", 19)
def DeformConv(X, W, offset, B=None, mask=None, *, dilations=None, group=1, kernel_shape=None, offset_group=1,
               pads=None, strides=None):
    if X.ndim not in (3, 4) or W.ndim != X.ndim:
        raise InvalidArgumentError(f"DeformConv: expected 1-d or 2-d spatial input, got X {list(X.shape)}, "
                                   f"W {list(W.shape)}")
    one_d = X.ndim == 3
    if one_d:  # a unit height axis: offsets gain a zero row component
        X, W = X[:, :, None, :], W[:, :, None, :]
        n_, c_, ow_ = offset.shape
        o2 = offset.reshape((n_, c_ // 1, 1, ow_))
        o2 = np.stack([np.zeros_like(o2), o2], axis=2).reshape((n_, 2 * c_, 1, ow_))
        offset = o2
        if mask is not None:
            mask = mask[:, :, None, :]
        dilations = [1] + as_int_list(dilations) if dilations is not None else None
        strides = [1] + as_int_list(strides) if strides is not None else None
        if pads is not None:
            p = as_int_list(pads)
            pads = [0, p[0], 0, p[1]]
    N, C, H, Wd = X.shape
    M = W.shape[0]
    group, og = int(group), int(offset_group)
    k = list(W.shape[2:])
    if kernel_shape is not None and len(kernel_shape) and list(kernel_shape)[-len(k) if not one_d else -1:] != \
            (k if not one_d else k[-1:]):
        raise ShapeMismatchError(f"DeformConv: kernel_shape {list(kernel_shape)} does not match W {list(W.shape)}")
    if C != W.shape[1] * group or M % group or og < 1 or C % og:
        raise ShapeMismatchError(f"DeformConv: X has {C} channels, W {list(W.shape)}, group={group}, "
                                 f"offset_group={og}: inconsistent")
    K = k[0] * k[1]
    oh, ow = offset.shape[2:]
    if offset.shape[:2] != (N, og * 2 * K):
        raise ShapeMismatchError(f"DeformConv: offset must have shape [{N}, {og * 2 * K}, oH, oW], "
                                 f"got {list(offset.shape)}")
    s = as_int_list(strides) or [1, 1]
    d = as_int_list(dilations) or [1, 1]
    p = as_int_list(pads) or [0, 0, 0, 0]
    for i, (n_in, n_out) in enumerate(((H, oh), (Wd, ow))):
        if (n_in + p[i] + p[2 + i] - ((k[i] - 1) * d[i] + 1)) // s[i] + 1 != n_out:
            raise ShapeMismatchError(f"DeformConv: offset spatial shape {[oh, ow]} does not match the conv output")
    dt = X.dtype
    cdt = F32 if lowp(dt) else dt
    xc = np.ascontiguousarray(X, dtype=cdt)
    offc = np.ascontiguousarray(offset, dtype=cdt).reshape((N, og, k[0], k[1], 2, oh, ow))
    if mask is None:
        mc = np.ones((N, og, k[0], k[1], oh, ow), cdt)
    else:
        mc = np.ascontiguousarray(mask, dtype=cdt).reshape((N, og, k[0], k[1], oh, ow))
    G, Cg, Mg = group, C // group, M // group
    wc = _blas_ready(W.astype(cdt, copy=False)).reshape((G, Mg, Cg * K))
    L = oh * ow
    out = np.empty((N, G, Mg, L), cdt)
    col = np.empty((C * K, L), cdt)
    ia = lambda v: np.array(v, np.int64)  # noqa: E731
    for n in range(N):
        _deform_im2col(xc[n], offc[n], mc[n], col, ia(k), ia(s), ia(p[:2]), ia(d), ia([oh, ow]))
        for g in range(G):
            np.dot(wc[g], col[g * Cg * K:(g + 1) * Cg * K], out[n, g])
    out = out.reshape((N, M, L))
    if B is not None:
        _add_bias(out, np.ascontiguousarray(B, dtype=cdt).reshape(-1))
    out = out.reshape((N, M, oh, ow) if not one_d else (N, M, ow))
    return out.astype(dt) if cdt != dt else out


op("DeformConv", 22)(DeformConv)


def _hardswish_relu6_factory(ctx):
    """``onnx_numba.HardSwishRelu6`` (``runtime/passes/conv_fusions.FuseHardSwishRelu6``): x * Clip(x + 3, 0, 6) / 6
    in one pass, the four float32 steps of the nodes it replaces; float32 only (the pass fuses no other)."""
    code = _shifted.ACTIVATIONS["HardSwishRelu6"]

    def run(x):
        if x.dtype != F32:
            raise InvalidArgumentError(f"{ctx.name or 'HardSwishRelu6'} expects float32, got {x.dtype}")
        out = np.empty(x.shape, F32)
        if x.size:
            _shifted.activate(np.ascontiguousarray(x).reshape(-1), out.reshape(-1), code, 0.0, 0.0)
        return out
    return run


op("HardSwishRelu6", 1, domain="onnx_numba", factory=True)(_hardswish_relu6_factory)
