"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul.

Every (de)quantization is canonicalized to a 3-d ``(outer, axis, inner)``
view of x and a 3-d scale/zero-point array whose extents are 1 (broadcast),
the full extent, or, along the axis, the number of blocks; one kernel then
covers per-tensor, per-axis and blocked modes and compiles once per dtype.
Rounding is half-to-even, integer results saturate to the target range.
Sub-byte integers (int4/uint4/int2/uint2, one value per byte in ml_dtypes)
travel as raw uint8: kernels decode and encode the low bits themselves.
Float8/float4 targets are computed in float32 by the kernel and rounded to
the 8-bit format by ml_dtypes' cast (after clipping to the finite range when
``saturate`` is set).

Invariants: inputs are never written; outputs are fresh arrays; scale and
zero-point shapes are checked against x before a kernel reads them.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from numba import njit, prange

from runtime.dtypes import np_dtype
from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, lowp, norm_axis
from ._fastmath import maxnum, minnum
from .matmul import matmul_integer
from .registry import op

I32 = np.dtype(np.int32)
U8 = np.dtype(np.uint8)

# name -> (lo, hi, bits (0 = a whole byte or more), signed)
_INT_TARGETS = {
    "uint8": (0, 255, 0, False), "int8": (-128, 127, 0, True),
    "uint16": (0, 65535, 0, False), "int16": (-32768, 32767, 0, True),
    "uint4": (0, 15, 4, False), "int4": (-8, 7, 4, True),
    "uint2": (0, 3, 2, False), "int2": (-2, 1, 2, True),
}
_FLOAT_TARGETS = {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn"}


# -- kernels ---------------------------------------------------------------------------------------

@njit(inline="always", cache=True)
def _rint(v):
    r = math.floor(v)
    d = v - r
    if d > 0.5 or (d == 0.5 and r % 2 != 0):
        r += 1
    return r


@njit(inline="always", cache=True)
def _at(p3, o, b, i):
    """``p3[o, b, i]`` with broadcasting: an axis of extent 1 is read at 0."""
    po, pb, pi = p3.shape
    return p3[o if po > 1 else 0, b if pb > 1 else 0, i if pi > 1 else 0]


@njit(cache=True, nogil=True)
def _quant_int(x3, s3, z3, bs, lo, hi, mask, out3):
    """out = clip(rint(x / s) + z, lo, hi) & mask, with s, z read per (outer, axis // bs, inner)."""
    no, na, ni = x3.shape
    for o in range(no):
        for a in range(na):
            b = a // bs
            for i in range(ni):
                s = _at(s3, o, b, i)
                z = _at(z3, o, b, i)
                v = x3[o, a, i] / s
                if v != v:
                    q = lo
                else:
                    q = _rint(v) + z
                    q = lo if q < lo else (hi if q > hi else q)
                out3[o, a, i] = np.int64(q) & mask


@njit(cache=True, nogil=True)
def _scale_div(x3, s3, bs, out3):
    """out = x / s in float32 (the float8/float4 targets round afterwards)."""
    no, na, ni = x3.shape
    for o in range(no):
        for a in range(na):
            b = a // bs
            for i in range(ni):
                out3[o, a, i] = x3[o, a, i] / _at(s3, o, b, i)


@njit(cache=True, nogil=True)
def _dequant(x3, bits, signed, s3, z3, bs, out3):
    """out = (decode(x) - z) * s; ``bits`` > 0 decodes that many low bits of a raw byte."""
    no, na, ni = x3.shape
    m = (1 << bits) - 1
    half = 1 << (bits - 1) if bits > 0 else 0
    for o in range(no):
        for a in range(na):
            b = a // bs
            for i in range(ni):
                if bits > 0:
                    iv = np.int64(x3[o, a, i]) & m
                    if signed and iv >= half:
                        iv -= 1 << bits
                    v = np.float32(iv)
                else:
                    v = np.float32(x3[o, a, i])
                s = _at(s3, o, b, i)
                z = _at(z3, o, b, i)
                out3[o, a, i] = (v - z) * s


_CHUNK = 1 << 16  # elements per task of the DynamicQuantizeLinear passes


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _range_with_zero(x):
    """(min, max) of flat float32 ``x`` and 0, NaNs ignored: chunks over the threads, each a vectorized
    ``minnum``/``maxnum`` reduction (over unsigned indices: a signed one that Numba cannot prove nonnegative
    keeps its negative-index wraparound, and the loop scalar)."""
    n = x.shape[0]
    nc = (n + _CHUNK - 1) // _CHUNK
    mins = np.zeros(nc, np.float32)
    maxs = np.zeros(nc, np.float32)
    for c in prange(nc):
        mn = np.float32(0.0)
        mx = np.float32(0.0)
        for i in range(np.uint64(c * _CHUNK), np.uint64(min(n, (c + 1) * _CHUNK))):
            mn = minnum(mn, x[i])
            mx = maxnum(mx, x[i])
        mins[c] = mn
        maxs[c] = mx
    mn = np.float32(0.0)
    mx = np.float32(0.0)
    for c in range(nc):
        mn = min(mn, mins[c])
        mx = max(mx, maxs[c])
    return mn, mx


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _codes_u8(x, scale, zp, out):
    """out = clip(rint(x / scale) + zp, 0, 255) over flat float32 ``x`` (NaN gives 0), in vectorized chunks
    over the threads (unsigned indices, as in ``_range_with_zero``): ``_quant_int``'s values for one scale and
    zero point."""
    n = x.shape[0]
    lo = -zp
    hi = np.float32(255.0) - zp
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        for i in range(np.uint64(c * _CHUNK), np.uint64(min(n, (c + 1) * _CHUNK))):
            v = np.rint(x[i] / scale)
            v = max(v, lo)  # a NaN compares false: lo
            v = min(v, hi)
            out[i] = np.uint8(np.int32(v + zp))


@njit(cache=True, nogil=True)
def _requant(c, mult, zy, lo, hi, out):
    """out = clip(rint(c * mult + zy), lo, hi); mult and zy have one element or one per output."""
    nm = mult.shape[0]
    nz = zy.shape[0]
    for k in range(c.shape[0]):
        v = c[k] * mult[k if nm > 1 else 0] + zy[k if nz > 1 else 0]
        q = _rint(v)
        out[k] = lo if q < lo else (hi if q > hi else q)


# -- canonical layout ------------------------------------------------------------------------------

def _layout(op_name, x_shape, scale, axis, block_size, zp=None):
    """(x3 shape, s3 shape, bs): how x, the scale and the zero point are read by the kernels."""
    r = len(x_shape)
    if scale.size == 1 and scale.ndim <= 1 and not block_size:
        return (1, int(math.prod(x_shape)), 1), (1, 1, 1), 1
    if r == 0:
        raise ShapeMismatchError(f"{op_name}: a scalar x needs a scalar scale, got shape {list(scale.shape)}")
    ax = norm_axis(axis, r)
    o = int(math.prod(x_shape[:ax]))
    a = x_shape[ax]
    i = int(math.prod(x_shape[ax + 1:]))
    x3 = (o, a, i)
    if block_size and block_size > 0:
        nblk = -(-a // block_size)
        want = tuple(x_shape[:ax]) + (nblk,) + tuple(x_shape[ax + 1:])
        if scale.shape != want:
            raise ShapeMismatchError(f"{op_name}: blocked quantization with block_size={block_size} along axis {ax} "
                                     f"of x {list(x_shape)} needs a scale of shape {list(want)}, got "
                                     f"{list(scale.shape)}")
        return x3, (o, nblk, i), int(block_size)
    if block_size and block_size < 0:
        raise InvalidAttributeError(f"{op_name}: block_size must be >= 0, got {block_size}")
    if scale.size == 1 and scale.ndim <= 1:
        return x3, (1, 1, 1), 1
    if scale.ndim != 1 or scale.shape[0] != a:
        raise ShapeMismatchError(f"{op_name}: per-axis scale must be 1-d with {a} elements (x {list(x_shape)}, "
                                 f"axis {ax}), got shape {list(scale.shape)}")
    return x3, (1, a, 1), 1


def _as3(v, s3, op_name, what):
    if v.size != int(np.prod(s3)):
        raise ShapeMismatchError(f"{op_name}: {what} of shape {list(v.shape)} does not match the scale's layout")
    return v.reshape(s3)


def _target(zp, output_dtype, op_name):
    if zp is not None:
        if output_dtype and np_dtype(int(output_dtype)) != zp.dtype:
            raise InvalidArgumentError(f"{op_name}: output_dtype {np_dtype(int(output_dtype))} differs from the "
                                       f"zero point's dtype {zp.dtype}")
        return zp.dtype
    if output_dtype:
        return np_dtype(int(output_dtype))
    return U8


# -- QuantizeLinear --------------------------------------------------------------------------------

def quantize_linear(x, y_scale, y_zero_point=None, axis=1, saturate=1, block_size=0, output_dtype=0):
    name = "QuantizeLinear"
    tdt = _target(y_zero_point, output_dtype, name)
    x3s, s3s, bs = _layout(name, x.shape, y_scale, axis, block_size)
    if x.dtype.kind in "iu":
        xc, sc = x.astype(np.float64), y_scale.astype(np.float64)
    elif lowp(x.dtype) or x.dtype == np.float16:
        xc, sc = x.astype(F32), y_scale.astype(F32)
    else:
        xc, sc = x, y_scale.astype(x.dtype)
    s3 = _as3(sc, s3s, name, "y_scale")
    x3 = xc.reshape(x3s)
    if tdt.name in _INT_TARGETS:
        lo, hi, bits, _ = _INT_TARGETS[tdt.name]
        if y_zero_point is None:
            z3 = np.zeros((1, 1, 1), I32)
        else:
            z3 = _as3(y_zero_point.astype(I32), s3s, name, "y_zero_point")
        if bits:
            raw = np.empty(x.shape, U8)
            _quant_int(x3, s3, z3, bs, lo, hi, (1 << bits) - 1, raw.reshape(x3s))
            return raw.view(tdt)
        out = np.empty(x.shape, tdt)
        _quant_int(x3, s3, z3, bs, lo, hi, -1, out.reshape(x3s))
        return out
    if tdt.name in _FLOAT_TARGETS:
        y = np.empty(x.shape, F32)
        _scale_div(x3.astype(F32, copy=False), s3.astype(F32, copy=False), bs, y.reshape(x3s))
        if tdt.name == "float4_e2m1fn":
            if y_zero_point is not None:
                # (y - (-z)) * 1: the dequantize kernel adds the zero point with the same layout.
                nz = -_as3(y_zero_point.astype(F32), s3s, name, "y_zero_point")
                y2 = np.empty(x.shape, F32)
                _dequant(y.reshape(x3s), 0, False, np.ones((1, 1, 1), F32), nz, bs, y2.reshape(x3s))
                y = y2
            return y.astype(tdt)
        if saturate:
            fmax = float(ml_dtypes.finfo(tdt).max)
            np.clip(y, -fmax, fmax, out=y)
        return y.astype(tdt)
    raise InvalidArgumentError(f"{name}: unsupported quantized type {tdt}")


def _quantize_factory(ctx, axis=1, saturate=1, block_size=0, output_dtype=0, precision=0):
    def run(x, y_scale, y_zero_point=None):
        return quantize_linear(x, y_scale, y_zero_point, axis, saturate, block_size, output_dtype)
    return run


for _v in (10, 13, 19, 21, 23, 24, 25):
    op("QuantizeLinear", _v, factory=True)(_quantize_factory)


# -- DequantizeLinear ------------------------------------------------------------------------------

def dequantize_linear(x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0):
    name = "DequantizeLinear"
    x3s, s3s, bs = _layout(name, x.shape, x_scale, axis, block_size)
    odt = np_dtype(int(output_dtype)) if output_dtype else x_scale.dtype
    s3 = _as3(x_scale.astype(F32), s3s, name, "x_scale")
    if x_zero_point is None or x.dtype.name in _FLOAT_TARGETS:
        z3 = np.zeros((1, 1, 1), F32)
    else:
        if x_zero_point.dtype != x.dtype:
            raise InvalidArgumentError(f"{name}: x_zero_point must have x's dtype {x.dtype}, "
                                       f"got {x_zero_point.dtype}")
        z3 = _as3(x_zero_point.astype(F32), s3s, name, "x_zero_point")
    info = _INT_TARGETS.get(x.dtype.name)
    if info is not None and info[2]:
        xr, bits, signed = x.view(U8), info[2], info[3]
    elif x.dtype.name in _FLOAT_TARGETS:
        xr, bits, signed = x.astype(F32), 0, False
    elif x.dtype.kind in "iu":
        xr, bits, signed = x, 0, False
    else:
        raise InvalidArgumentError(f"{name}: x must be a quantized integer or 8-bit float type, got {x.dtype}")
    y = np.empty(x.shape, F32)
    _dequant(xr.reshape(x3s), bits, signed, s3, z3, bs, y.reshape(x3s))
    return y if odt == F32 else y.astype(odt)


def _dequantize_factory(ctx, axis=1, block_size=0, output_dtype=0):
    def run(x, x_scale, x_zero_point=None):
        return dequantize_linear(x, x_scale, x_zero_point, axis, block_size, output_dtype)
    return run


for _v in (10, 13, 19, 21, 23, 24, 25):
    op("DequantizeLinear", _v, factory=True)(_dequantize_factory)


# -- DynamicQuantizeLinear -------------------------------------------------------------------------

@op("DynamicQuantizeLinear", 11)
def DynamicQuantizeLinear(x):
    if x.dtype != F32:
        raise InvalidArgumentError(f"DynamicQuantizeLinear expects float32 input, got {x.dtype}")
    flat = np.ascontiguousarray(x).reshape(-1)
    mn, mx = _range_with_zero(flat) if flat.size else (np.float32(0), np.float32(0))
    mn, mx = np.float32(mn), np.float32(mx)
    scale = np.float32(np.float32(1.0) if mx == mn else mx - mn) / np.float32(255)
    zp0 = np.float32(0) - mn / scale
    zp = np.float32(np.rint(min(255.0, max(0.0, float(zp0)))))
    y = np.empty(x.shape, U8)
    if x.size:
        _codes_u8(flat, scale, zp, y.reshape(-1))
    return y, np.array(scale, F32), np.array(int(zp), U8)


# -- QLinearMatMul ---------------------------------------------------------------------------------

def _qlinear_matmul_factory(ctx):
    packed = {}  # matmul_integer's cache of B's packed forms

    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point=None):
        name = "QLinearMatMul"
        c = matmul_integer(a, b, _zp_for_rows(a_zero_point, a), _zp_for_cols(b_zero_point, b), name, packed)
        mult = np.asarray(a_scale * b_scale / y_scale)
        odt = y_zero_point.dtype if y_zero_point is not None else a.dtype
        if odt.name not in ("int8", "uint8"):
            raise InvalidArgumentError(f"{name}: output must be int8 or uint8, got {odt}")
        lo, hi = _INT_TARGETS[odt.name][:2]
        try:
            mult = _flat_for(mult.astype(np.float64), c.shape)
            zy = np.zeros(1) if y_zero_point is None else _flat_for(y_zero_point.astype(np.float64), c.shape)
        except ValueError:
            raise ShapeMismatchError(f"{name}: scales/zero point of shapes {list(np.shape(a_scale))}, "
                                     f"{list(np.shape(b_scale))}, {list(np.shape(y_scale))} do not broadcast "
                                     f"to the output {list(c.shape)}") from None
        out = np.empty(c.shape, odt)
        if c.size:
            _requant(c.reshape(-1), mult, zy, lo, hi, out.reshape(-1))
        return out
    return run


def _zp_for_rows(z, a):
    # A's zero point: scalar or one per row of A ([M] or [..., M, 1]).
    if z is None or z.size == 1:
        return None if z is None else z.reshape(())
    return z


def _zp_for_cols(z, b):
    if z is None or z.size == 1:
        return None if z is None else z.reshape(())
    return z


def _flat_for(v, shape):
    if v.size == 1:
        return v.reshape(1)
    return np.ascontiguousarray(np.broadcast_to(v, shape)).reshape(-1)


for _v in (10, 21):
    op("QLinearMatMul", _v, factory=True)(_qlinear_matmul_factory)
