"""CUDA Resize (opsets 10-19) and Upsample (7, 9), the twin of ``ops/resize.py``.

Resize is separable and applied one axis at a time, as on the CPU: the host computes each resized axis's table
(``ops.resize.axis_tables``: source indices, tap weights, the tf_crop_and_resize positions outside the input)
with the CPU's request, roi and target rules, and the device applies it to the tensor viewed as
``(outer, axis, inner)``: nearest mode gathers without arithmetic (every dtype exact), linear and cubic sum
their taps in order, skipping zero weights, in float32 for 16/32-bit floats and float64 otherwise; integer
results are rounded half to even and saturated.  The tables are small host arrays uploaded per call.

Invariants: the input is a C-contiguous device array and is never written; the result is a fresh device array
of the input's dtype; errors are the CPU's.
"""
from __future__ import annotations

import math

import numpy as np

from ops.registry import op
from ops.resize import _resize_request, _resize_roi, _resize_targets, axis_tables
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError, InvalidAttributeError
from ._common import F16, F32, check_device, flat, grid1d, host_array
from .elementwise import cast_to

__all__ = ["resize"]

CUDA = "CUDAExecutionProvider"
F64 = np.dtype(np.float64)


@jit
def _gather_axis(x, idx, out, J, I, n_in):
    """out[o, j, i] = x[o, idx[j], i] over out (O, J, I)."""
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i = k % I
        t = k // I
        j = t % J
        o = t // J
        out[k] = x[(o * n_in + idx[j]) * I + i]


@jit
def _interp_axis(x, idx, w, T, out, J, I, n_in, zero):
    """out[o, j, i] = sum_t w[j, t] * x[o, idx[j, t], i] (zero weights skipped, taps in order)."""
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i = k % I
        t0 = k // I
        j = t0 % J
        o = t0 // J
        acc = zero
        for t in range(T):
            c = w[j * T + t]
            if c != 0:
                acc += c * x[(o * n_in + idx[j * T + t]) * I + i]
        out[k] = acc


@jit
def _fill_outside(out, extrap, ev, J, I):
    """out[o, j, :] = ev where position j lies outside the input (tf_crop_and_resize)."""
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        if extrap[(k // I) % J]:
            out[k] = ev


@jit
def _round_saturate(src, dst, lo, hi):
    """dst = src rounded half to even, clamped to [lo, hi] (float to integer)."""
    for k in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        v = src[k]
        r = math.floor(v)
        d = v - r
        if d > 0.5 or (d == 0.5 and r % 2 != 0):
            r += 1
        dst[k] = lo if r < lo else (hi if r > hi else r)


def resize(X, scales, sizes, roi, *, mode, ctm, nearest_mode, cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, antialias=0, axes=None, keep_aspect_ratio_policy="stretch"):
    """Resize the device array ``X`` one axis at a time (scales, sizes and roi are host arrays or None)."""
    check_device("Resize", X=X)
    dt = np.dtype(X.dtype)
    if dt.kind not in "fiub" or (dt.kind == "f" and dt not in (F16, F32, F64)):
        raise InvalidArgumentError(f"Resize: the CUDA kernels resize numeric tensors, got {dt}")
    shape = tuple(int(d) for d in X.shape)
    r = len(shape)
    ax, sc, sz = _resize_request(X, scales, sizes, axes, mode)
    roi_full = _resize_roi(roi, ax, r)
    scale_f, out_shape = _resize_targets(shape, ax, sc, sz, keep_aspect_ratio_policy)
    cdt = dt if mode == "nearest" else (F32 if dt in (F16, F32) else F64)
    cur = X if dt == cdt else cast_to(X, cdt)
    for d in ax:
        lo, hi = (roi_full[d], roi_full[r + d]) if roi_full is not None else (0.0, 1.0)
        n_in, n_out = int(cur.shape[d]), out_shape[d]
        tables = axis_tables(n_in, n_out, scale_f[d], lo, hi, mode=mode, ctm=ctm, nearest_mode=nearest_mode,
                             cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside, antialias=antialias)
        if tables is None:
            continue
        new_shape = tuple(cur.shape)[:d] + (n_out,) + tuple(cur.shape)[d + 1:]
        out = rc.device_empty(new_shape, cdt)
        if out.size:
            if n_in == 0:
                raise InvalidArgumentError(f"Resize: cannot resize an empty axis {d} of shape {list(shape)}")
            idx, w, extrap = tables
            I = int(math.prod(new_shape[d + 1:]))
            blocks, threads = grid1d(out.size)
            didx = rc.to_device(np.ascontiguousarray(idx, np.int64).reshape(-1))
            if w is None:
                _gather_axis[blocks, threads](flat(cur), didx, flat(out), n_out, I, n_in)
            else:
                _interp_axis[blocks, threads](flat(cur), didx, rc.to_device(np.ascontiguousarray(w, cdt).reshape(-1)),
                                              int(w.shape[1]), flat(out), n_out, I, n_in, cdt.type(0))
            if extrap is not None and extrap.any():
                _fill_outside[blocks, threads](flat(out), rc.to_device(extrap.astype(np.uint8)),
                                               cdt.type(extrapolation_value), n_out, I)
        cur = out
    if cur is X:
        y = rc.device_empty(shape, dt)
        if y.size:
            y.copy_to_device(X)
        return y
    if cur.dtype == dt:
        return cur
    if dt.kind in "iu":
        y = rc.device_empty(tuple(cur.shape), dt)
        if y.size:
            info = np.iinfo(dt)
            blocks, threads = grid1d(y.size)
            _round_saturate[blocks, threads](flat(cur), flat(y), cdt.type(info.min), cdt.type(info.max))
        return y
    return cast_to(cur, dt)


def _host(name, v):
    return None if v is None else host_array("Resize", name, v, False)


def _resize10(ctx, mode="nearest"):
    return lambda X, scales: resize(X, _host("scales", scales), None, None, mode=mode, ctm="asymmetric",
                                    nearest_mode="simple")


def _resize11(ctx, antialias=0, axes=None, coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
              exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
              nearest_mode="round_prefer_floor"):
    def run(X, roi=None, scales=None, sizes=None):
        return resize(X, _host("scales", scales), _host("sizes", sizes), _host("roi", roi), mode=mode,
                      ctm=coordinate_transformation_mode, nearest_mode=nearest_mode, cubic_coeff_a=cubic_coeff_a,
                      exclude_outside=exclude_outside, extrapolation_value=extrapolation_value,
                      antialias=antialias, axes=axes, keep_aspect_ratio_policy=keep_aspect_ratio_policy)
    return run


def _upsample7(ctx, mode="nearest", scales=None):
    if scales is None:
        raise InvalidAttributeError("Upsample: the scales attribute is required")
    return lambda X: resize(X, np.asarray(scales, np.float32), None, None, mode=mode, ctm="asymmetric",
                            nearest_mode="simple")


def _upsample9(ctx, mode="nearest"):
    return lambda X, scales: resize(X, _host("scales", scales), None, None, mode=mode, ctm="asymmetric",
                                    nearest_mode="simple")


op("Resize", 10, provider=CUDA, factory=True, host_inputs=(1,))(_resize10)
for _v in (11, 13, 18, 19):
    op("Resize", _v, provider=CUDA, factory=True, host_inputs=(1, 2, 3))(_resize11)
op("Upsample", 7, provider=CUDA, factory=True)(_upsample7)
op("Upsample", 9, provider=CUDA, factory=True, host_inputs=(1,))(_upsample9)
