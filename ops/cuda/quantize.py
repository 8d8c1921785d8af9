"""CUDA QuantizeLinear and DequantizeLinear to and from the 8-, 16- and 32-bit integer types (``ops/quantize.py``'s
twin): per tensor, per axis and blocked.

The CPU's layout rules decide how x, the scale and the zero point are read (``ops.quantize._layout``: x as
``(outer, axis, inner)``, the scale as ``(outer or 1, blocks or 1, inner or 1)`` with block size ``bs``), and
its checks and messages apply.  Quantizing divides in float32 (float16/32 inputs) or float64 (float64 and
integer inputs), rounds half to even, adds the zero point and saturates (NaN gives the low end, as the CPU);
dequantizing computes ``(x - z) * s`` in float32 and converts to the output dtype.  The scale and the zero point
are host inputs, uploaded per call.  The packed 4- and 2-bit types and the 8-bit floats are refused.

Invariants: x is a C-contiguous device array; the result is a fresh device array of x's shape.
"""
from __future__ import annotations

import math

import numpy as np

from ops.quantize import _INT_TARGETS, _as3, _layout, _target
from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.dtypes import np_dtype
from runtime.errors import InvalidArgumentError
from ._common import F16, F32, check_device, flat, grid1d, host_array
from .elementwise import cast_to

__all__ = ["quantize", "dequantize"]

CUDA = "CUDAExecutionProvider"
F64 = np.dtype(np.float64)


@jit(device=True)
def _param(p, o, b, i, po, pb, pi):
    """``p[o, b, i]`` of a (po, pb, pi) parameter, an extent of 1 read at 0."""
    return p[((o if po > 1 else 0) * pb + (b if pb > 1 else 0)) * pi + (i if pi > 1 else 0)]


@jit
def _quant3(x, s, z, out, na, ni, bs, po, pb, pi, lo, hi):
    for k in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        i = k % ni
        a = (k // ni) % na
        o = k // (ni * na)
        v = x[k] / _param(s, o, a // bs, i, po, pb, pi)
        if v != v:
            q = lo
        else:
            r = math.floor(v)
            d = v - r
            if d > 0.5 or (d == 0.5 and r % 2 != 0):
                r += 1
            q = r + _param(z, o, a // bs, i, po, pb, pi)
            q = lo if q < lo else (hi if q > hi else q)
        out[k] = q


@jit
def _dequant3(x, s, z, out, na, ni, bs, po, pb, pi):
    for k in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        i = k % ni
        a = (k // ni) % na
        o = k // (ni * na)
        out[k] = (np.float32(x[k]) - _param(z, o, a // bs, i, po, pb, pi)) * _param(s, o, a // bs, i, po, pb, pi)


def _int_target(name, dt):
    info = _INT_TARGETS.get(np.dtype(dt).name)
    if info is None or info[2]:
        raise InvalidArgumentError(f"{name}: the CUDA kernels quantize to 8-, 16- and 32-bit integers, got {dt}")
    return info


def quantize(x, y_scale, y_zero_point=None, axis=1, saturate=1, block_size=0, output_dtype=0):
    """QuantizeLinear of the device array ``x`` (``y_scale``, ``y_zero_point``: host arrays)."""
    name = "QuantizeLinear"
    check_device(name, x=x)
    tdt = _target(y_zero_point, output_dtype, name)
    lo, hi, _, _ = _int_target(name, tdt)
    shape = tuple(int(d) for d in x.shape)
    x3s, s3s, bs = _layout(name, shape, y_scale, axis, block_size)
    xdt = np.dtype(x.dtype)
    cdt = F32 if xdt in (F16, F32) else F64
    if xdt.kind not in "fiu" or (xdt.kind == "f" and xdt not in (F16, F32, F64)):
        raise InvalidArgumentError(f"{name}: the CUDA kernel quantizes float and integer tensors, got {xdt}")
    s3 = _as3(np.asarray(y_scale).astype(cdt), s3s, name, "y_scale")
    z3 = (np.zeros((1, 1, 1), np.int32) if y_zero_point is None
          else _as3(np.asarray(y_zero_point).astype(np.int32), s3s, name, "y_zero_point"))
    out = rc.device_empty(shape, tdt)
    if out.size:
        xc = x if xdt == cdt else cast_to(x, cdt)
        z3 = np.ascontiguousarray(np.broadcast_to(z3, s3.shape))
        blocks, threads = grid1d(out.size)
        _quant3[blocks, threads](flat(xc), rc.to_device(s3.reshape(-1)), rc.to_device(z3.reshape(-1)), flat(out),
                                 x3s[1], x3s[2], bs, *s3.shape, cdt.type(lo), cdt.type(hi))
    return out


def dequantize(x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0):
    """DequantizeLinear of the device array ``x`` (``x_scale``, ``x_zero_point``: host arrays)."""
    name = "DequantizeLinear"
    check_device(name, x=x)
    xdt = np.dtype(x.dtype)
    if xdt.kind not in "iu":
        raise InvalidArgumentError(f"{name}: the CUDA kernel dequantizes 8-, 16- and 32-bit integers, got {xdt}")
    _int_target(name, xdt)
    shape = tuple(int(d) for d in x.shape)
    x3s, s3s, bs = _layout(name, shape, x_scale, axis, block_size)
    odt = np_dtype(int(output_dtype)) if output_dtype else np.dtype(x_scale.dtype)
    s3 = _as3(np.asarray(x_scale).astype(F32), s3s, name, "x_scale")
    if x_zero_point is None:
        z3 = np.zeros(s3.shape, F32)
    else:
        if np.dtype(x_zero_point.dtype) != xdt:
            raise InvalidArgumentError(f"{name}: x_zero_point must have x's dtype {xdt}, got {x_zero_point.dtype}")
        z3 = np.ascontiguousarray(np.broadcast_to(_as3(x_zero_point.astype(F32), s3s, name, "x_zero_point"),
                                                  s3.shape))
    y = rc.device_empty(shape, F32)
    if y.size:
        blocks, threads = grid1d(y.size)
        _dequant3[blocks, threads](flat(x), rc.to_device(s3.reshape(-1)), rc.to_device(z3.reshape(-1)), flat(y),
                                   x3s[1], x3s[2], bs, *s3.shape)
    return y if odt == F32 else cast_to(y, odt)


def _host(name, what, v):
    return None if v is None else host_array(name, what, v, False)


def _quantize_factory(ctx, axis=1, saturate=1, block_size=0, output_dtype=0, precision=0):
    def run(x, y_scale, y_zero_point=None):
        return quantize(x, _host("QuantizeLinear", "y_scale", y_scale),
                        _host("QuantizeLinear", "y_zero_point", y_zero_point), axis, saturate, block_size,
                        output_dtype)
    return run


def _dequantize_factory(ctx, axis=1, block_size=0, output_dtype=0):
    def run(x, x_scale, x_zero_point=None):
        return dequantize(x, _host("DequantizeLinear", "x_scale", x_scale),
                          _host("DequantizeLinear", "x_zero_point", x_zero_point), axis, block_size, output_dtype)
    return run


for _v in (10, 13, 19, 21, 23, 24, 25):
    op("QuantizeLinear", _v, provider=CUDA, factory=True, host_inputs=(1, 2))(_quantize_factory)
    op("DequantizeLinear", _v, provider=CUDA, factory=True, host_inputs=(1, 2))(_dequantize_factory)
