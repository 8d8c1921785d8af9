"""Pooling: MaxPool (with Indices), AveragePool, LpPool, their Global forms, MaxUnpool.

Inputs are canonicalized to (N*C, D, H, W) with unit leading spatial axes for
1-d and 2-d pools, so each kernel compiles once per dtype.  Windows never
read padding: out-of-image taps are skipped, and AveragePool's divisor with
``count_include_pad`` counts the taps inside the explicitly padded extent
(taps that only exist because of ``ceil_mode`` are never counted), as the
ONNX reference does.  16-bit floats are computed in float32.
"""
from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, as_int_list, check_indices, lowp, pad3, tap_runs, window_geometry, window_taps
from .registry import op

_OPTS = dict(cache=True, nogil=True)


# -- kernels ---------------------------------------------------------------------------------------

@njit(parallel=True, **_OPTS)
def _pool(x, out, idx, mode, p, ksz, st, pb, pe, dil, storage_order, want_idx):
    """mode 0: max (writes idx if want_idx), 1: average excluding pad, 2: average including pad, 3: Lp."""
    NC, D, H, W = x.shape
    _, OD, OH, OW = out.shape
    sp = D * H * W
    for nc in prange(NC):
        for zo in range(OD):
            z0 = zo * st[0] - pb[0]
            a0, a1, na = window_taps(z0, dil[0], ksz[0], D, pe[0])
            for yo in range(OH):
                y0 = yo * st[1] - pb[1]
                b0, b1, nb = window_taps(y0, dil[1], ksz[1], H, pe[1])
                for xo in range(OW):
                    x0 = xo * st[2] - pb[2]
                    e0, e1, ne = window_taps(x0, dil[2], ksz[2], W, pe[2])
                    acc = 0.0
                    best = x[nc, 0, 0, 0]
                    bi = -1
                    cnt = (a1 - a0) * (b1 - b0) * (e1 - e0)
                    cntp = na * nb * ne
                    for a in range(a0, a1):
                        zi = z0 + a * dil[0]
                        for b in range(b0, b1):
                            yi = y0 + b * dil[1]
                            for e in range(e0, e1):
                                xi = x0 + e * dil[2]
                                v = x[nc, zi, yi, xi]
                                if mode == 0:
                                    if bi < 0 or v > best:
                                        best = v
                                        if storage_order == 0:
                                            bi = (zi * H + yi) * W + xi
                                        else:
                                            bi = zi + yi * D + xi * D * H
                                elif mode == 3:  # each |v|**p in the input type: it over- or
                                    acc += x.dtype.type(abs(v) ** p)  # underflows there, as onnxruntime's
                                else:
                                    acc += v
                    if mode == 0:
                        out[nc, zo, yo, xo] = best
                        if want_idx:
                            idx[nc, zo, yo, xo] = nc * sp + bi
                    elif mode == 1:
                        out[nc, zo, yo, xo] = acc / cnt if cnt > 0 else 0.0
                    elif mode == 2:
                        out[nc, zo, yo, xo] = acc / cntp if cntp > 0 else 0.0
                    else:
                        out[nc, zo, yo, xo] = acc ** (1.0 / p)


@njit(**_OPTS)
def _first_taps(los, his, OW):
    """Per output column: its first width tap inside the row (-1: none), from ``tap_runs``' runs."""
    fe = np.full(OW, -1, np.int64)
    for ow in range(OW):
        for e in range(los.shape[0]):
            if ow >= los[e] and ow < his[e]:
                fe[ow] = e
                break
    return fe


@njit(parallel=True, **_OPTS)
def _max_rows(x, out, ksz, st, pb, dil, nthreads):
    """MaxPool without indices, as ``_pool``'s mode 0 computes it, a row at a time: each output starts at the
    first tap it sees (the first row the window reaches, its first column inside the row), then the output
    row takes every tap in order (depth, height, width), each over the run of outputs whose input lies inside
    the row, as a contiguous select that replaces a value only by a greater one: NaN and ties resolve as in
    ``_pool`` (a first tap taken again changes nothing).  An output that no tap reaches gets the channel's
    first element, as ``_pool`` gives it.  Each of ``nthreads`` tasks takes a run of channels."""
    NC, D, H, W = x.shape
    OD, OH, OW = out.shape[1], out.shape[2], out.shape[3]
    KD, KH, KW = ksz[0], ksz[1], ksz[2]
    s2 = st[2]
    los, his = tap_runs(KW, dil[2], pb[2], s2, W, OW)  # per width tap: the outputs inside the row
    fe = _first_taps(los, his, OW)
    xf = x.reshape(-1)
    of = out.reshape(-1)
    T = max(1, min(nthreads, NC))
    for t in prange(T):
        for nc in range(t * NC // T, (t + 1) * NC // T):
            first = xf[np.uint64(nc * D * H * W)]
            for od in range(OD):
                for oh in range(OH):
                    ob = ((nc * OD + od) * OH + oh) * OW
                    started = False
                    for a in range(KD):
                        zi = od * st[0] - pb[0] + a * dil[0]
                        if zi < 0 or zi >= D:
                            continue
                        for b in range(KH):
                            yi = oh * st[1] - pb[1] + b * dil[1]
                            if yi < 0 or yi >= H:
                                continue
                            rb = ((nc * D + zi) * H + yi) * W
                            if not started:  # the first row the window reaches: each output's first tap
                                for ow in range(OW):
                                    e = fe[ow]
                                    of[np.uint64(ob + ow)] = first if e < 0 else \
                                        xf[np.uint64(rb + e * dil[2] - pb[2] + ow * s2)]
                                started = True
                            for e in range(KW):
                                xo = rb + e * dil[2] - pb[2]
                                # a select writing the one array it reads besides x: it vectorizes
                                if s2 == 1:
                                    for ow in range(los[e], his[e]):
                                        v = xf[np.uint64(xo + ow)]
                                        o = of[np.uint64(ob + ow)]
                                        of[np.uint64(ob + ow)] = v if v > o else o
                                elif s2 == 2:  # a literal stride: the loads vectorize as an interleaved group
                                    for ow in range(los[e], his[e]):
                                        v = xf[np.uint64(xo + 2 * ow)]
                                        o = of[np.uint64(ob + ow)]
                                        of[np.uint64(ob + ow)] = v if v > o else o
                                else:
                                    for ow in range(los[e], his[e]):
                                        v = xf[np.uint64(xo + ow * s2)]
                                        o = of[np.uint64(ob + ow)]
                                        of[np.uint64(ob + ow)] = v if v > o else o
                    if not started:
                        for ow in range(OW):
                            of[np.uint64(ob + ow)] = first


@njit(parallel=True, **_OPTS)
def _max_separable(x, out, ksz, st, pb, dil, nthreads):
    """``_max_rows`` of a 2-d window (depth 1) in two passes: each input row's maximum over the window's columns
    for every output column, then each output the maximum of those over the window's rows, KH + KW comparisons
    per output instead of KH * KW (the 5x5, 9x9 and 13x13 pools of a YOLO SPP block on 13x13 maps).  The same
    values as ``_max_rows``: a maximum is taken with ``v > o``, so equal values keep the first in row-major tap
    order in both; the first tap decides NaN (``_max_rows`` starts from it, and nothing replaces a NaN), so the
    column pass keeps each row's first tap beside a maximum that skips NaN, and the row pass starts from the
    first reached row's first tap."""
    NC, D, H, W = x.shape
    OH, OW = out.shape[2], out.shape[3]
    KH, KW = ksz[1], ksz[2]
    s1, s2 = st[1], st[2]
    los, his = tap_runs(KW, dil[2], pb[2], s2, W, OW)
    fe = _first_taps(los, his, OW)
    xf = x.reshape(-1)
    of = out.reshape(-1)
    T = max(1, min(nthreads, NC))
    neg = -np.inf
    for t in prange(T):
        hm = np.empty(H * OW, x.dtype)  # per input row and output column: the maximum over the columns
        fs = np.empty(H * OW, x.dtype)  # ... and the first tap
        for nc in range(t * NC // T, (t + 1) * NC // T):
            first = xf[np.uint64(nc * H * W)]
            for yi in range(H):
                rb = (nc * H + yi) * W
                hb = yi * OW
                for ow in range(OW):
                    e = fe[ow]
                    fs[np.uint64(hb + ow)] = first if e < 0 else xf[np.uint64(rb + e * dil[2] - pb[2] + ow * s2)]
                    hm[np.uint64(hb + ow)] = neg
                for e in range(KW):
                    xo = rb + e * dil[2] - pb[2]
                    for ow in range(los[e], his[e]):
                        v = xf[np.uint64(xo + ow * s2)]
                        o = hm[np.uint64(hb + ow)]
                        hm[np.uint64(hb + ow)] = v if v > o else o
            for oh in range(OH):
                ob = (nc * OH + oh) * OW
                started = False
                for b in range(KH):
                    yi = oh * s1 - pb[1] + b * dil[1]
                    if yi < 0 or yi >= H:
                        continue
                    hb = yi * OW
                    if not started:
                        for ow in range(OW):
                            of[np.uint64(ob + ow)] = fs[np.uint64(hb + ow)]
                        started = True
                    for ow in range(OW):
                        v = hm[np.uint64(hb + ow)]
                        o = of[np.uint64(ob + ow)]
                        of[np.uint64(ob + ow)] = v if v > o else o
                if not started:
                    for ow in range(OW):
                        of[np.uint64(ob + ow)] = first


_SEPARABLE_MIN_TAPS = 9  # window taps (KH * KW) from which a 2-d MaxPool takes ``_max_separable``


_GLOBAL_PARALLEL_MIN = 1 << 16  # elements from which the channels of a global pooling run over the threads


@njit(parallel=True, **_OPTS)
def _global(x, out, mode, p):
    """x: (NC, L) -> out: (NC,); mode 0: max, 1: mean, 3: Lp.  Channels over the threads for large inputs."""
    NC, L = x.shape
    if NC * L < _GLOBAL_PARALLEL_MIN:
        for i in range(NC):
            _global_row(x, out, mode, p, i)
    else:
        for i in prange(NC):
            _global_row(x, out, mode, p, i)


@njit(**_OPTS)
def _global_row(x, out, mode, p, i):
    L = x.shape[1]
    if mode == 0:
        best = x[i, 0]
        for j in range(1, L):
            if x[i, j] > best:
                best = x[i, j]
        out[i] = best
    elif mode == 1:
        out[i] = _row_sum(x[i]) / L
    else:
        acc = 0.0
        for j in range(L):
            acc += x.dtype.type(abs(x[i, j]) ** p)  # in the input type, as in _pool
        out[i] = acc ** (1.0 / p)


@njit(fastmath={"reassoc"}, **_OPTS)
def _row_sum(r):
    """The float64 sum of ``r``, its additions reassociated so the loop vectorizes (a chain of float64 adds in
    order ran at one element per add's latency, 5x onnxruntime's float32 sum on a 96 x 80 x 80 input)."""
    acc = 0.0
    for j in range(r.shape[0]):
        acc += r[j]
    return acc


@njit(**_OPTS)
def _unpool(x, idx, out):
    """Scatter flat x at flat idx into flat out (pre-zeroed); indices validated by the wrapper."""
    for i in range(x.shape[0]):
        out[idx[i]] = x[i]


# -- wrappers --------------------------------------------------------------------------------------

def _run_pool(name, x, mode, p, kernel_shape, auto_pad, ceil_mode, dilations, pads, strides,
              storage_order=0, want_idx=False):
    k, s, d, pb, pe, osp = window_geometry(name, x.shape, as_int_list(kernel_shape), auto_pad, dilations, pads, strides,
                                          bool(ceil_mode))
    dt = x.dtype
    if mode != 0 and dt.kind != "f" and not lowp(dt):
        raise InvalidArgumentError(f"{name} expects a floating-point input, got {dt}")
    cdt = F32 if lowp(dt) else dt
    N, C = x.shape[:2]
    i3, o3 = pad3(x.shape[2:], 1), pad3(osp, 1)
    out = np.empty((N * C, *o3), cdt)
    idx = np.empty((N * C, *o3) if want_idx else (1, 1, 1, 1), np.int64)
    if out.size and x.size:
        xc = np.ascontiguousarray(x, dtype=cdt).reshape((N * C, *i3))
        # taps past the end padding (they only exist because of ceil_mode) never count, even as padding
        pe3 = pad3(pe, 0)
        if mode == 0 and not want_idx and len(k) <= 2 and int(np.prod(k)) >= _SEPARABLE_MIN_TAPS and \
                np.dtype(cdt).kind == "f":
            _max_separable(xc, out, pad3(k, 1), pad3(s, 1), pad3(pb, 0), pad3(d, 1), get_num_threads())
        elif mode == 0 and not want_idx:
            _max_rows(xc, out, pad3(k, 1), pad3(s, 1), pad3(pb, 0), pad3(d, 1), get_num_threads())
        else:
            _pool(xc, out, idx, mode, float(p), pad3(k, 1), pad3(s, 1), pad3(pb, 0), pe3, pad3(d, 1),
                  int(storage_order), bool(want_idx))
    out = out.reshape((N, C, *osp))
    if cdt != dt:
        out = out.astype(dt)
    if want_idx:
        return out, idx.reshape((N, C, *osp))
    return out


def _maxpool(ctx, X, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides):
    want = ctx is not None and ctx.n_outputs > 1 and (not ctx.outputs_used or ctx.outputs_used[1])
    r = _run_pool("MaxPool", X, 0, 0.0, kernel_shape, auto_pad, ceil_mode, dilations, pads, strides,
                  storage_order, want)
    if ctx is not None and ctx.n_outputs > 1:
        if not want:
            return r, np.zeros(r.shape, np.int64)
        return r
    return r


@op("MaxPool", 1)
def MaxPool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None, storage_order=0,
            strides=None, ctx=None):
    return _maxpool(ctx, X, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides)


for _v in (8, 10, 11, 12):
    op("MaxPool", _v)(MaxPool)


@op("AveragePool", 1)
def AveragePool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape=None,
                pads=None, strides=None):
    return _run_pool("AveragePool", X, 2 if count_include_pad else 1, 0.0, kernel_shape, auto_pad, ceil_mode,
                     dilations, pads, strides)


for _v in (7, 10, 11, 19):
    op("AveragePool", _v)(AveragePool)


@op("LpPool", 1)
def LpPool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2, pads=None, strides=None):
    return _run_pool("LpPool", X, 3, float(p), kernel_shape, auto_pad, ceil_mode, dilations, pads, strides)


for _v in (2, 11, 18):
    op("LpPool", _v)(LpPool)


def _run_global(name, x, mode, p=2.0):
    if x.ndim < 2:
        raise InvalidArgumentError(f"{name}: expected input of rank >= 2, got shape {list(x.shape)}")
    dt = x.dtype
    cdt = F32 if lowp(dt) else dt
    N, C = x.shape[:2]
    L = int(np.prod(x.shape[2:]))
    out = np.empty(N * C, cdt)
    if out.size:
        if L == 0:
            raise InvalidArgumentError(f"{name}: spatial extent of input {list(x.shape)} is empty")
        _global(np.ascontiguousarray(x, dtype=cdt).reshape((N * C, L)), out, mode, float(p))
    out = out.reshape((N, C) + (1,) * (x.ndim - 2))
    return out.astype(dt) if cdt != dt else out


@op("GlobalAveragePool", 1)
def GlobalAveragePool(X):
    return _run_global("GlobalAveragePool", X, 1)


@op("GlobalMaxPool", 1)
def GlobalMaxPool(X):
    return _run_global("GlobalMaxPool", X, 0)


@op("GlobalLpPool", 1)
def GlobalLpPool(X, *, p=2):
    return _run_global("GlobalLpPool", X, 3, p)


op("GlobalLpPool", 2)(GlobalLpPool)


@op("MaxUnpool", 9)
def MaxUnpool(X, I, output_shape=None, *, kernel_shape=None, pads=None, strides=None):
    nd = X.ndim - 2
    k = as_int_list(kernel_shape)
    if len(k) != nd:
        raise InvalidAttributeError(f"MaxUnpool: kernel_shape {k} must have {nd} entries for input {list(X.shape)}")
    s = as_int_list(strides) or [1] * nd
    p = as_int_list(pads) or [0] * (2 * nd)
    if I.shape != X.shape:
        raise ShapeMismatchError(f"MaxUnpool: I must have X's shape {list(X.shape)}, got {list(I.shape)}")
    inferred = tuple(X.shape[:2]) + tuple((X.shape[2 + i] - 1) * s[i] + k[i] - p[i] - p[nd + i] for i in range(nd))
    out = np.zeros(int(np.prod(inferred)), X.dtype)
    ii = np.ascontiguousarray(I, dtype=np.int64).reshape(-1)
    check_indices("MaxUnpool", ii, 0, out.size, "index")
    if X.size:
        _unpool(np.ascontiguousarray(X).reshape(-1), ii, out)
    out = out.reshape(inferred)
    if output_shape is None:
        return out
    # indices address the inferred shape; an explicit output_shape places that block at the origin
    shape = tuple(as_int_list(output_shape))
    if len(shape) != X.ndim:
        raise ShapeMismatchError(f"MaxUnpool: output_shape {list(shape)} must have rank {X.ndim}")
    if shape == inferred:
        return out
    res = np.zeros(shape, X.dtype)
    sl = tuple(slice(0, min(a, b)) for a, b in zip(shape, inferred))
    res[sl] = out[sl]
    return res


op("MaxUnpool", 11)(MaxUnpool)


# -- RoiAlign --------------------------------------------------------------------------------------

@njit(**_OPTS)
def _sample_cell(v, size):
    """A bilinear sample at ``v >= 0`` on an axis of ``size``: (v, its cell's low and high index), with a sample
    at or past the last index clamped onto it (both indices the last)."""
    lo = int(v)
    if lo >= size - 1:
        lo = size - 1
        return float(lo), lo, lo
    return v, lo, lo + 1


@njit(parallel=True, **_OPTS)
def _roi_align(x, rois, bidx, out, scale, sampling_ratio, half_pixel, is_max):
    """x: (N, C, H, W); rois: (R, 4) as x1, y1, x2, y2; out: (R, C, PH, PW); bilinear samples per bin."""
    N, C, H, W = x.shape
    R, _, PH, PW = out.shape
    off = 0.5 if half_pixel else 0.0
    for rc in prange(R * C):
        r = rc // C
        c = rc - r * C
        n = bidx[r]
        sw = rois[r, 0] * scale - off
        sh = rois[r, 1] * scale - off
        rw = rois[r, 2] * scale - off - sw
        rh = rois[r, 3] * scale - off - sh
        if not half_pixel:
            rw = max(rw, 1.0)
            rh = max(rh, 1.0)
        bh = rh / PH
        bw = rw / PW
        gh = sampling_ratio if sampling_ratio > 0 else int(np.ceil(rh / PH))
        gw = sampling_ratio if sampling_ratio > 0 else int(np.ceil(rw / PW))
        cnt = max(gh * gw, 1)
        for ph in range(PH):
            for pw in range(PW):
                acc = 0.0
                first = True
                for iy in range(gh):
                    y0 = sh + ph * bh + (iy + 0.5) * bh / gh
                    for ix in range(gw):
                        xx = sw + pw * bw + (ix + 0.5) * bw / gw
                        v = 0.0
                        if not (y0 < -1.0 or y0 > H or xx < -1.0 or xx > W):
                            y, yl, yh = _sample_cell(max(y0, 0.0), H)
                            xv, xl, xh = _sample_cell(max(xx, 0.0), W)
                            ly = y - yl
                            lx = xv - xl
                            hy = 1.0 - ly
                            hx = 1.0 - lx
                            a1 = hy * hx * x[n, c, yl, xl]
                            a2 = hy * lx * x[n, c, yl, xh]
                            a3 = ly * hx * x[n, c, yh, xl]
                            a4 = ly * lx * x[n, c, yh, xh]
                            if is_max:
                                v = max(max(a1, a2), max(a3, a4))
                            else:
                                v = a1 + a2 + a3 + a4
                        elif is_max:
                            v = 0.0
                        if is_max:
                            acc = v if first else max(acc, v)
                            first = False
                        else:
                            acc += v
                out[r, c, ph, pw] = acc if is_max else acc / cnt


@op("RoiAlign", 10)
def RoiAlign10(X, rois, batch_indices, *, mode="avg", output_height=1, output_width=1, sampling_ratio=0,
               spatial_scale=1.0):
    return _run_roi_align("RoiAlign", X, rois, batch_indices, "output_half_pixel", mode, output_height, output_width,
                      sampling_ratio, spatial_scale)


@op("RoiAlign", 16)
def RoiAlign(X, rois, batch_indices, *, coordinate_transformation_mode="half_pixel", mode="avg", output_height=1,
             output_width=1, sampling_ratio=0, spatial_scale=1.0):
    return _run_roi_align("RoiAlign", X, rois, batch_indices, coordinate_transformation_mode, mode, output_height,
                      output_width, sampling_ratio, spatial_scale)


_MAX_SAMPLES = 1 << 33  # bilinear samples in one RoiAlign call: minutes of work, far past any real model


def _bounded_work(name, rois, channels, oh, ow, sr, scale) -> None:
    """Refuse a RoiAlign whose sample grid would take practically forever (a huge ``sampling_ratio``, or, when it
    is 0, regions of huge or non-finite extent), before the kernel starts."""
    r = np.asarray(rois, np.float64)
    if r.size and not np.isfinite(r).all():
        raise InvalidArgumentError(f"{name}: rois must be finite numbers")
    if sr < 0 or oh < 0 or ow < 0:
        raise InvalidAttributeError(f"{name}: sampling_ratio, output_height and output_width must be >= 0, got "
                                    f"{sr}, {oh}, {ow}")
    if r.size == 0 or oh == 0 or ow == 0:
        return
    if sr > 0:
        per_bin = float(sr) * sr * r.shape[0]
    else:
        h = np.maximum(np.abs(r[:, 3] - r[:, 1]) * abs(scale), 1.0)
        w = np.maximum(np.abs(r[:, 2] - r[:, 0]) * abs(scale), 1.0)
        per_bin = float(np.sum(np.ceil(h / oh) * np.ceil(w / ow)))
    total = per_bin * channels * oh * ow
    if total > _MAX_SAMPLES:
        raise InvalidArgumentError(f"{name}: the regions need {total:.3g} bilinear samples (sampling_ratio {sr}), "
                                   f"more than the {_MAX_SAMPLES:.3g} this runtime takes on")


def _run_roi_align(name, X, rois, bi, ctm, mode, oh, ow, sr, scale):
    if X.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or bi.shape != (rois.shape[0],):
        raise ShapeMismatchError(f"{name}: expected X [N, C, H, W], rois [R, 4], batch_indices [R]; got "
                                 f"{list(X.shape)}, {list(rois.shape)}, {list(bi.shape)}")
    if mode not in ("avg", "max") or ctm not in ("half_pixel", "output_half_pixel"):
        raise InvalidAttributeError(f"{name}: unsupported mode {mode!r} or coordinate_transformation_mode {ctm!r}")
    b = np.ascontiguousarray(bi, dtype=np.int64)
    check_indices(name, b, 0, X.shape[0], "batch index")
    _bounded_work(name, rois, X.shape[1], int(oh), int(ow), int(sr), float(scale))
    dt = X.dtype
    cdt = F32 if lowp(dt) else dt
    out = np.empty((rois.shape[0], X.shape[1], int(oh), int(ow)), cdt)
    if out.size:
        _roi_align(np.ascontiguousarray(X, dtype=cdt), np.ascontiguousarray(rois, dtype=np.float64), b, out,
                   float(scale), int(sr), ctm == "half_pixel", mode == "max")
    return out.astype(dt) if cdt != dt else out
