"""Resampling: Resize (opsets 10-19) and Upsample (7, 9).

Resize is separable, so it is applied one axis at a time.  For each resized
axis the wrapper computes (cheaply, O(output length x taps)) a table of
source indices and weights from the coordinate transformation, the mode
(nearest / linear / cubic, with antialiasing) and ``exclude_outside``; the
@njit kernel then applies that table to the tensor viewed as
(outer, axis, inner), so one kernel compiles per compute dtype whatever the
rank.  Nearest mode gathers without arithmetic, keeping every dtype exact.
Linear and cubic compute in float32 for 16/32-bit floats and float64
otherwise; integer outputs are rounded half to even and saturated.

Semantics follow the ONNX reference: source indices outside the input are
clamped (edge padding), tf_crop_and_resize positions outside the input take
``extrapolation_value``.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, as_int_list, lowp, norm_axis
from .registry import op

_OPTS = dict(cache=True, nogil=True)


# -- kernels ---------------------------------------------------------------------------------------

@njit(**_OPTS)
def _extrapolate(out, o, j, extrap, ev):
    """Fill the row out[o, j, :] with ``ev`` if output position ``j`` lies outside the input (``extrap[j]``);
    whether it did."""
    if extrap[j]:
        for i in range(out.shape[2]):
            out[o, j, i] = ev
        return True
    return False


@njit(parallel=True, **_OPTS)
def _interp_axis(x, idx, w, extrap, ev, out):
    """out[o, j, i] = sum_t w[j, t] * x[o, idx[j, t], i], or ev where extrap[j]."""
    O, _, I = x.shape
    J, T = idx.shape
    for oj in prange(O * J):
        o = oj // J
        j = oj - o * J
        if _extrapolate(out, o, j, extrap, ev):
            continue
        for i in range(I):
            out[o, j, i] = 0
        for t in range(T):
            c = w[j, t]
            if c == 0:
                continue
            s = idx[j, t]
            for i in range(I):
                out[o, j, i] += c * x[o, s, i]


_PARALLEL_MIN = 1 << 15  # output elements from which the gather runs over the threads


@njit(inline="always", **_OPTS)
def _gather_rows(x, idx, out, o):
    """out[o, j, i] = x[o, idx[j], i] for one row o; the innermost axis (I = 1) as a plain indexed copy."""
    if x.shape[2] == 1:
        for j in range(idx.shape[0]):
            out[o, j, 0] = x[o, idx[j], 0]
        return
    for j in range(idx.shape[0]):
        s = idx[j]
        for i in range(x.shape[2]):
            out[o, j, i] = x[o, s, i]


@njit(parallel=True, **_OPTS)
def _gather_axis(x, idx, out):
    """out[o, j, i] = x[o, idx[j], i]: rows o over the threads for large outputs, in this thread for small ones
    (a thread launch costs more than they do)."""
    O = x.shape[0]
    if out.size < _PARALLEL_MIN:
        for o in range(O):
            _gather_rows(x, idx, out, o)
    else:
        for o in prange(O):
            _gather_rows(x, idx, out, o)


@njit(parallel=True, **_OPTS)
def _nearest_planes(x, hidx, widx, out):
    """out[o, i, j] = x[o, hidx[i], widx[j]]: the last two axes resized by nearest in one pass (planes over the
    threads for large outputs), instead of a pass per axis whose last one gathers one element per row.  An
    output row that reads the previous one's source row is a copy of it."""
    O = x.shape[0]
    if out.size < _PARALLEL_MIN:
        for o in range(O):
            _nearest_plane(x, hidx, widx, out, o)
    else:
        for o in prange(O):
            _nearest_plane(x, hidx, widx, out, o)


@njit(**_OPTS)
def _nearest_plane(x, hidx, widx, out, o):
    """Plane ``o`` of ``_nearest_planes``, over flat unsigned indices (no row views whose reference counts the
    threads would share, no negative-index wraparound in the copy loops)."""
    H, W = x.shape[1], x.shape[2]
    OH, OW = out.shape[1], out.shape[2]
    xf = x.reshape(-1)
    of = out.reshape(-1)
    for i in range(OH):
        d = (o * OH + i) * OW
        if i > 0 and hidx[i] == hidx[i - 1]:
            for j in range(OW):
                of[np.uint64(d + j)] = of[np.uint64(d - OW + j)]
            continue
        s = (o * H + hidx[i]) * W
        for j in range(OW):
            of[np.uint64(d + j)] = xf[np.uint64(s + widx[j])]


@njit(**_OPTS)
def _fill_axis(out, extrap, ev):
    O, J, _ = out.shape
    for oj in range(O * J):
        o = oj // J
        _extrapolate(out, o, oj - o * J, extrap, ev)


# -- per-axis tables -------------------------------------------------------------------------------

_CTM = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
        "tf_half_pixel_for_nn", "tf_crop_and_resize")


def _source_coords(ctm, n_in, n_out, scale, roi_lo, roi_hi):
    """Source coordinate of every output position, and the tf_crop_and_resize extrapolation mask."""
    y = np.arange(n_out, dtype=np.float64)
    ow = scale * n_in
    extrap = None
    if ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        adj = n_out / ow
        x = (n_in / 2) * (1 - adj) + (y + 0.5) / scale - 0.5
    elif ctm == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if ow == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "align_corners":
        x = np.zeros(n_out) if ow == 1 else y * (n_in - 1) / (ow - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    elif ctm == "tf_crop_and_resize":
        if ow == 1:
            x = np.full(n_out, (roi_hi - roi_lo) * (n_in - 1) / 2)
        else:
            x = y * (roi_hi - roi_lo) * (n_in - 1) / (ow - 1)
        x = x + roi_lo * (n_in - 1)
        extrap = (x < 0) | (x > n_in - 1)
    else:
        raise InvalidAttributeError(f"Resize: coordinate_transformation_mode must be one of {list(_CTM)}, "
                                    f"got {ctm!r}")
    return x, extrap


def _nearest_index(x, n_in, nearest_mode, scale):
    fl = np.floor(x)
    frac = x - fl
    if nearest_mode == "round_prefer_floor":
        r = np.where(frac > 0.5, fl + 1, fl)
    elif nearest_mode == "round_prefer_ceil":
        r = np.where(frac >= 0.5, fl + 1, fl)
    elif nearest_mode == "floor":
        r = fl
    elif nearest_mode == "ceil":
        r = np.ceil(x)
    elif nearest_mode == "simple":  # opset 10 / Upsample (onnxruntime's legacy rule)
        r = np.ceil(x) if scale < 1 else fl
    else:
        raise InvalidAttributeError(f"Resize: nearest_mode must be round_prefer_floor, round_prefer_ceil, floor "
                                    f"or ceil, got {nearest_mode!r}")
    return np.clip(r, 0, n_in - 1).astype(np.int64)


def _interp_table(x, n_in, mode, scale, cubic_coeff_a, exclude_outside, antialias):
    """(idx, w): taps per output position for linear / cubic, with optional antialias."""
    fl = np.floor(x)
    ratio = np.where(x == fl, 1.0, x - fl)
    base = fl - np.where(x == fl, 1, 0)  # ratio is in (0, 1], measured from base
    s = min(scale, 1.0) if antialias else 1.0
    A = float(cubic_coeff_a)
    if mode == "linear":
        start = int(math.floor(-1 / s) + 1)
        T = 2 - 2 * start
        off = np.arange(start, start + T, dtype=np.float64)
        args = (off[None, :] - ratio[:, None]) * s
        w = np.clip(1 - np.abs(args), 0, 1)
    else:
        start = int(math.floor(-2 / s) + 1)
        T = 2 - 2 * start
        off = np.arange(start, start + T, dtype=np.float64)
        t = np.abs((off[None, :] - ratio[:, None]) * s)
        t2, t3 = t * t, t * t * t
        w = np.where(t <= 1, (A + 2) * t3 - (A + 3) * t2 + 1,
                     np.where(t < 2, A * t3 - 5 * A * t2 + 8 * A * t - 4 * A, 0.0))
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    idx = base[:, None].astype(np.int64) + off[None, :].astype(np.int64)
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        ssum = w.sum(axis=1, keepdims=True)
        w = w / np.where(ssum == 0, 1.0, ssum)
    return np.clip(idx, 0, n_in - 1), w


# -- driver ----------------------------------------------------------------------------------------

def _resize_request(X, scales, sizes, axes, mode):
    """(ax, sc, sz): the checked mode, the normalized axes and exactly one of the scales / sizes lists."""
    r = X.ndim
    if mode not in ("nearest", "linear", "cubic"):
        raise InvalidAttributeError(f"Resize: mode must be nearest, linear or cubic, got {mode!r}")
    ax = [norm_axis(a, r) for a in as_int_list(axes)] if axes is not None else list(range(r))
    if len(set(ax)) != len(ax):
        raise InvalidAttributeError(f"Resize: axes {list(axes)} repeat an axis")
    sc = None if scales is None or np.asarray(scales).size == 0 else [float(v) for v in np.asarray(scales).reshape(-1)]
    sz = None if sizes is None or np.asarray(sizes).size == 0 else as_int_list(sizes)
    if (sc is None) == (sz is None):
        raise InvalidArgumentError("Resize: exactly one of scales and sizes must be given")
    given = sc if sc is not None else sz
    if len(given) != len(ax):
        raise ShapeMismatchError(f"Resize: {'scales' if sc is not None else 'sizes'} has {len(given)} entries, "
                                 f"expected {len(ax)} for input of shape {list(X.shape)}")
    return ax, sc, sz


def _resize_roi(roi, ax, r):
    """The roi spread over all ``r`` axes ([starts..., ends...], 0/1 for axes not listed), or None."""
    if roi is None or not np.asarray(roi).size:
        return None
    rv = [float(v) for v in np.asarray(roi).reshape(-1)]
    if len(rv) != 2 * len(ax):
        raise ShapeMismatchError(f"Resize: roi has {len(rv)} entries, expected {2 * len(ax)}")
    roi_full = [0.0] * r + [1.0] * r
    for i, d in enumerate(ax):
        roi_full[d], roi_full[r + d] = rv[i], rv[len(ax) + i]
    return roi_full


def _resize_targets(shape, ax, sc, sz, keep_aspect_ratio_policy):
    """(scale_f, out_shape) per axis from the scales, or from the sizes and the keep_aspect_ratio_policy."""
    scale_f = [1.0] * len(shape)
    out_shape = list(shape)
    if sc is not None:
        for i, d in enumerate(ax):
            if sc[i] <= 0:
                raise InvalidArgumentError(f"Resize: scales must be positive, got {sc}")
            scale_f[d] = sc[i]
            out_shape[d] = int(shape[d] * sc[i])
        return scale_f, out_shape
    for i, d in enumerate(ax):
        if sz[i] < 0:
            raise InvalidArgumentError(f"Resize: sizes must be non-negative, got {sz}")
        scale_f[d] = sz[i] / shape[d] if shape[d] else 1.0
        out_shape[d] = sz[i]
    if keep_aspect_ratio_policy not in ("stretch", "not_larger", "not_smaller"):
        raise InvalidAttributeError(f"Resize: keep_aspect_ratio_policy must be stretch, not_larger or "
                                    f"not_smaller, got {keep_aspect_ratio_policy!r}")
    if keep_aspect_ratio_policy != "stretch":
        vals = [scale_f[d] for d in ax]
        s = min(vals) if keep_aspect_ratio_policy == "not_larger" else max(vals)
        for d in ax:
            scale_f[d] = s
            out_shape[d] = int(s * shape[d] + 0.5)
    return scale_f, out_shape


def axis_tables(n_in, n_out, scale, lo, hi, *, mode, ctm, nearest_mode, cubic_coeff_a, exclude_outside,
                antialias):
    """How one axis of ``n_in`` becomes ``n_out``: None when it is unchanged, else ``(idx, w, extrap)``: source
    indices (``(n_out,)`` for nearest, ``(n_out, taps)`` otherwise), tap weights (None for nearest), and the
    tf_crop_and_resize positions outside the input (None when there are none).  The CUDA Resize applies the same
    tables."""
    if math.isclose(scale, 1.0) and n_out == n_in and (
            ctm != "tf_crop_and_resize" or (math.isclose(lo, 0.0) and math.isclose(hi, 1.0))):
        return None
    x, extrap = _source_coords(ctm, n_in, n_out, scale, lo, hi)
    if mode == "nearest":
        return _nearest_index(x, n_in, nearest_mode, scale), None, extrap
    idx, w = _interp_table(x, n_in, mode, scale, cubic_coeff_a, exclude_outside, antialias)
    return np.ascontiguousarray(idx), w, extrap


def _resize_axis(cur, d, n_out, scale, lo, hi, cdt, x_shape, *, mode, ctm, nearest_mode, cubic_coeff_a,
                 exclude_outside, extrapolation_value, antialias):
    """``cur`` resized along axis ``d`` to ``n_out`` (in ``cdt``); ``cur`` itself when the axis is unchanged."""
    n_in = cur.shape[d]
    new_shape = list(cur.shape)
    new_shape[d] = n_out
    if math.isclose(scale, 1.0) and n_out == n_in and (
            ctm != "tf_crop_and_resize" or (math.isclose(lo, 0.0) and math.isclose(hi, 1.0))):
        return cur
    O = int(np.prod(cur.shape[:d]))
    I = int(np.prod(cur.shape[d + 1:]))
    out = np.empty(new_shape, cdt)
    if out.size == 0:
        return out
    if n_in == 0:
        raise InvalidArgumentError(f"Resize: cannot resize an empty axis {d} of shape {list(x_shape)}")
    idx, w, extrap = axis_tables(n_in, n_out, scale, lo, hi, mode=mode, ctm=ctm, nearest_mode=nearest_mode,
                                 cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside, antialias=antialias)
    x3 = np.ascontiguousarray(cur).reshape((O, n_in, I))
    o3 = out.reshape((O, n_out, I))
    if w is None:
        _gather_axis(x3, idx, o3)
        if extrap is not None and extrap.any():
            _fill_axis(o3, extrap, o3.dtype.type(extrapolation_value))
    else:
        ex = extrap if extrap is not None else np.zeros(n_out, np.bool_)
        _interp_axis(x3, idx, np.ascontiguousarray(w, dtype=cdt), ex, cdt.type(extrapolation_value), o3)
    return out


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # element bits moved by _nearest_planes


@functools.lru_cache(maxsize=256)
def _nearest_table(n_in, n_out, scale, ctm, nearest_mode):
    """``axis_tables``' nearest source indices (int64) of one axis, made once per geometry (a model resizes the
    same shapes every run); the kernels only read them."""
    t = axis_tables(n_in, n_out, scale, 0.0, 1.0, mode="nearest", ctm=ctm, nearest_mode=nearest_mode,
                    cubic_coeff_a=-0.75, exclude_outside=0, antialias=0)
    return np.arange(n_in, dtype=np.int64) if t is None else np.ascontiguousarray(t[0], np.int64)


def _nearest_last_two(X, out_shape, scale_f, ctm, nearest_mode):
    """Nearest resizing of the last two axes only (the others unchanged), in one pass over the output, or None
    when either axis has nothing to read (left to the per-axis path and its errors).  The index tables are
    ``axis_tables``' own."""
    r = X.ndim
    tables = []
    for d in (r - 2, r - 1):
        n_in, n_out = X.shape[d], out_shape[d]
        if n_in == 0 or n_out == 0:
            return None
        tables.append(_nearest_table(n_in, n_out, scale_f[d], ctm, nearest_mode))
    O = int(np.prod(X.shape[:-2]))
    xc = np.ascontiguousarray(X)
    src = xc.view(_UINT[xc.dtype.itemsize]) if xc.dtype.kind != "O" and xc.dtype.itemsize in _UINT else None
    out = np.empty(tuple(out_shape), X.dtype)
    if out.size == 0:
        return out
    if src is None:
        out[...] = xc[..., tables[0][:, None], tables[1][None, :]]
        return out
    _nearest_planes(src.reshape((O,) + X.shape[-2:]), tables[0], tables[1],
                    out.view(src.dtype).reshape((O,) + tuple(out_shape[-2:])))
    return out


def _resize_result(cur, X):
    """The result in X's dtype (integers rounded half to even and saturated); a copy when nothing changed."""
    dt = X.dtype
    if cur is X:
        return X.copy()
    if cur.dtype != dt:
        if dt.kind in "iu":
            info = np.iinfo(dt)
            cur = np.clip(np.rint(cur), info.min, info.max)
        cur = cur.astype(dt)
    return cur


def resize_nd(X, scales, sizes, roi, *, mode, ctm, nearest_mode, cubic_coeff_a=-0.75, exclude_outside=0,
              extrapolation_value=0.0, antialias=0, axes=None, keep_aspect_ratio_policy="stretch"):
    """Resize X one axis at a time (the driver of Resize and Upsample)."""
    r = X.ndim
    ax, sc, sz = _resize_request(X, scales, sizes, axes, mode)
    roi_full = _resize_roi(roi, ax, r)
    scale_f, out_shape = _resize_targets(X.shape, ax, sc, sz, keep_aspect_ratio_policy)
    dt = X.dtype
    if mode == "nearest" and r >= 2 and ctm != "tf_crop_and_resize" and all(out_shape[d] == X.shape[d] or d >= r - 2
                                                                            for d in range(r)):
        planes = _nearest_last_two(X, out_shape, scale_f, ctm, nearest_mode)
        if planes is not None:
            return planes
    if mode == "nearest":
        cur = X
        cdt = dt
    else:
        cdt = F32 if (lowp(dt) or dt == F32) else np.dtype(np.float64)
        cur = X.astype(cdt) if dt != cdt else X
    for d in ax:
        lo, hi = (roi_full[d], roi_full[r + d]) if roi_full is not None else (0.0, 1.0)
        cur = _resize_axis(cur, d, out_shape[d], scale_f[d], lo, hi, cdt, X.shape, mode=mode, ctm=ctm,
                           nearest_mode=nearest_mode, cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                           extrapolation_value=extrapolation_value, antialias=antialias)
    return _resize_result(cur, X)


@op("Resize", 10)
def Resize10(X, scales, *, mode="nearest"):
    return resize_nd(X, scales, None, None, mode=mode, ctm="asymmetric", nearest_mode="simple")


@op("Resize", 11)
def Resize(X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    return resize_nd(X, scales, sizes, roi, mode=mode, ctm=coordinate_transformation_mode, nearest_mode=nearest_mode,
                     cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                     extrapolation_value=extrapolation_value, antialias=antialias, axes=axes,
                     keep_aspect_ratio_policy=keep_aspect_ratio_policy)


for _v in (13, 18, 19):
    op("Resize", _v)(Resize)


@op("Upsample", 7)
def Upsample7(X, *, mode="nearest", scales=None):
    if scales is None:
        raise InvalidAttributeError("Upsample: the scales attribute is required")
    return resize_nd(X, np.asarray(scales, np.float32), None, None, mode=mode, ctm="asymmetric",
                     nearest_mode="simple")


@op("Upsample", 9)
def Upsample(X, scales, *, mode="nearest"):
    return resize_nd(X, scales, None, None, mode=mode, ctm="asymmetric", nearest_mode="simple")


# -- GridSample ------------------------------------------------------------------------------------

@njit(**_OPTS)
def _reflect(v, lo, hi):
    rng = hi - lo
    if rng <= 0:
        return lo
    if v < lo:
        dx = lo - v
        n = int(dx / rng)
        r = dx - n * rng
        return lo + r if n % 2 == 0 else hi - r
    if v > hi:
        dx = v - hi
        n = int(dx / rng)
        r = dx - n * rng
        return hi - r if n % 2 == 0 else lo + r
    return v


@njit(**_OPTS)
def _gs_taps(grid, dims, mode, pad, align, idx, wt):
    """Per output point and grid component (x, y, z): up to 4 source indices (-1: reads zero) and weights.

    mode 0 nearest, 1 linear, 2 cubic; pad 0 zeros, 1 border, 2 reflection.
    """
    P = grid.shape[0]
    A = -0.75
    for p in range(P):
        for k in range(3):
            L = dims[k]
            g = grid[p, k]
            if align:
                v = (g + 1) / 2.0 * (L - 1)
                lo, hi = 0.0, L - 1.0
            else:
                v = ((g + 1) * L - 1) / 2.0
                lo, hi = -0.5, L - 0.5
            if mode == 0:
                v = np.rint(v)
            if v < lo or v > hi:
                if pad == 1:
                    v = min(max(v, 0.0), L - 1.0)
                elif pad == 2:
                    v = _reflect(v, lo, hi)
            for t in range(4):
                idx[p, k, t] = -1
                wt[p, k, t] = 0.0
            if mode == 0:
                base = int(v)
                wt[p, k, 0] = 1.0
                ntap = 1
            elif mode == 1:
                base = int(np.floor(v))
                f = v - base
                wt[p, k, 0] = 1 - f
                wt[p, k, 1] = f
                ntap = 2
            else:
                i0 = int(np.floor(v))
                base = i0 - 1
                f = v - i0
                x1 = f + 1
                x2 = 1 - f
                x3 = 2 - f
                wt[p, k, 0] = ((A * x1 - 5 * A) * x1 + 8 * A) * x1 - 4 * A
                wt[p, k, 1] = ((A + 2) * f - (A + 3)) * f * f + 1
                wt[p, k, 2] = ((A + 2) * x2 - (A + 3)) * x2 * x2 + 1
                wt[p, k, 3] = ((A * x3 - 5 * A) * x3 + 8 * A) * x3 - 4 * A
                ntap = 4
            for t in range(ntap):
                i = base + t
                if pad == 0:
                    if i < 0 or i >= L:
                        i = -1
                elif pad == 1:
                    i = min(max(i, 0), L - 1)
                else:
                    i = int(_reflect(float(i), lo, hi))
                    i = min(max(i, 0), L - 1)
                idx[p, k, t] = i


@njit(parallel=True, **_OPTS)
def _gs_apply(x, idx, wt, out):
    """x: (N, C, D, H, W); idx/wt: (N*P, 3, 4) for components (x->W, y->H, z->D); out: (N, C, P)."""
    N, C, D, H, W = x.shape
    P = out.shape[2]
    for q in prange(N * P):
        n = q // P
        p = q - n * P
        for c in range(C):
            acc = 0.0
            for tz in range(4):
                wz = wt[q, 2, tz]
                iz = idx[q, 2, tz]
                if wz == 0 or iz < 0:
                    continue
                for ty in range(4):
                    wy = wt[q, 1, ty]
                    iy = idx[q, 1, ty]
                    if wy == 0 or iy < 0:
                        continue
                    for tx in range(4):
                        wx = wt[q, 0, tx]
                        ix = idx[q, 0, tx]
                        if wx == 0 or ix < 0:
                            continue
                        acc += wz * wy * wx * x[n, c, iz, iy, ix]
            out[n, c, p] = acc


_GS_MODES = {"nearest": 0, "linear": 1, "bilinear": 1, "cubic": 2, "bicubic": 2}
_GS_PADS = {"zeros": 0, "border": 1, "reflection": 2}


@op("GridSample", 16)
def GridSample(X, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    r = X.ndim - 2
    if r < 1 or r > 3 or grid.ndim != X.ndim or grid.shape[-1] != r or grid.shape[0] != X.shape[0]:
        raise ShapeMismatchError(f"GridSample: X {list(X.shape)} needs a grid of shape [N, *out, {r}] with 1 to 3 "
                                 f"spatial axes, got {list(grid.shape)}")
    if mode not in _GS_MODES or padding_mode not in _GS_PADS:
        raise InvalidAttributeError(f"GridSample: unsupported mode {mode!r} or padding_mode {padding_mode!r}")
    N, C = X.shape[:2]
    osp = tuple(grid.shape[1:-1])
    P = int(np.prod(osp))
    dt = X.dtype
    cdt = F32 if (lowp(dt) or dt == F32) else np.dtype(np.float64)
    out = np.empty((N, C, P), cdt)
    if out.size:
        if X.size == 0:
            raise InvalidArgumentError(f"GridSample: cannot sample from an empty input {list(X.shape)}")
        g = np.zeros((N * P, 3), np.float64)
        g[:, :r] = grid.reshape((N * P, r))
        dims = np.array(list(X.shape[2:][::-1]) + [1] * (3 - r), np.int64)  # (W, H, D) order
        idx = np.empty((N * P, 3, 4), np.int64)
        wt = np.empty((N * P, 3, 4), np.float64)
        _gs_taps(g, dims, _GS_MODES[mode], _GS_PADS[padding_mode], bool(align_corners), idx, wt)
        x5 = np.ascontiguousarray(X, dtype=cdt).reshape((N, C) + (1,) * (3 - r) + tuple(X.shape[2:]))
        _gs_apply(x5, idx, wt, out)
    out = out.reshape((N, C) + osp)
    return out.astype(dt) if cdt != dt else out


for _v in (20, 22):
    op("GridSample", _v)(GridSample)


@op("AffineGrid", 20)
def AffineGrid(theta, size, *, align_corners=0):
    sz = as_int_list(size)
    r = len(sz) - 2
    if r not in (2, 3) or theta.shape != (sz[0], r, r + 1):
        raise ShapeMismatchError(f"AffineGrid: size {sz} needs theta of shape [{sz[0]}, {r}, {r + 1}], "
                                 f"got {list(theta.shape)}")
    axes = []
    for n in sz[2:]:
        if align_corners:
            a = np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)
        else:
            a = (2.0 * np.arange(n) + 1) / n - 1
        axes.append(a)
    mesh = np.meshgrid(*axes, indexing="ij")  # spatial order (D,) H, W
    base = np.stack([m.reshape(-1) for m in mesh[::-1]] + [np.ones(mesh[0].size)], axis=0)  # (x, y, (z), 1)
    dt = theta.dtype
    cdt = F32 if lowp(dt) else dt
    th = theta.astype(cdt)
    out = np.matmul(th, base.astype(cdt))  # (N, r, P)
    out = np.ascontiguousarray(out.transpose(0, 2, 1)).reshape([sz[0]] + sz[2:] + [r])
    return out.astype(dt) if cdt != dt else out
