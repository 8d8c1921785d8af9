"""Softmax, LogSoftmax and Hardmax.

Before opset 13 the input is coerced to 2-d at ``axis`` (rows are the
flattened trailing axes); from 13 on the op works along one axis.  Both are
canonicalized to a 3-d view ``(outer, n, inner)`` so each kernel compiles
once per dtype.  Rows are max-shifted before ``exp``.  Large inputs
normalized along their last (contiguous) axis with more than one row use a
``parallel=True`` kernel over rows.  16-bit floats are computed in float32.

Speed: the softmax kernels are compiled with ``FAST`` (reassociation and
contraction, never nnan/ninf) so their max, exp and sum loops vectorize.
Float32 exponentials use ``ops._fastmath`` (within 2 ulp; a row whose
spread ``max - min`` is at most 86 takes the cheaper ``exp32_normal``, the
others the fully general ``exp32``); float64 keeps ``math.exp``.  Row sums
add vector partial sums (in the input dtype, over blocks of ``_BLOCK``
elements) in float64; the strided (inner > 1) kernel sums in float64.  A NaN anywhere in a
row makes the whole row NaN, as in the reference.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError
from ._common import F32, lowp, norm_axis, out_buffer
from ._fastmath import FAST, fexp, fexp_normal, maxnum, minnum
from .registry import op

_OPTS = dict(cache=True, nogil=True, error_model="numpy")
_PARALLEL_MIN = 1 << 18  # elements; below this, thread start-up costs more than it saves
_BLOCK = 1024  # elements per float32 partial sum in _softmax_row


@njit(fastmath=FAST, **_OPTS)
def _softmax_row(x, out, r, log):
    """Softmax (or ``log``-softmax) of row ``r`` of ``x`` (rows, n) into ``out``.

    Every loop vectorizes.  The first pass takes the row's max and min (``maxnum``/``minnum``
    reductions, which skip NaN; a sum in the same loop would stop it vectorizing).  When
    ``min - max >= -86`` (false with an inf), every ``exp(x - max)`` of a number is a normal float
    and the cheaper ``fexp_normal`` is as accurate; otherwise ``fexp`` handles inf and underflow.
    Either maps NaN to NaN, so a row with a NaN sums to NaN and comes out all NaN.  Sums: blocks of ``_BLOCK`` elements in vector lanes of the input
    dtype, block sums added in float64 (a block's lanes hold only ``_BLOCK / 32`` terms)."""
    n = x.shape[1]
    m = x[r, 0]
    lo = x[r, 0]
    for k in range(n):
        v = x[r, k]
        m = maxnum(m, v)
        lo = minnum(lo, v)
    normal = lo - m >= -86.0
    s = 0.0
    for k0 in range(0, n, _BLOCK):
        k1 = min(k0 + _BLOCK, n)
        b = x.dtype.type(0.0)
        # LogSoftmax stores the exponentials too (overwritten below): one loop per path compiles faster.
        if normal:
            for k in range(k0, k1):
                e = fexp_normal(x[r, k] - m)
                out[r, k] = e
                b += e
        else:
            for k in range(k0, k1):
                e = fexp(x[r, k] - m)
                out[r, k] = e
                b += e
        s += b
    if log:
        # (x - max) - log(sum), as onnxruntime; two loops, so that fast-math cannot fold it into
        # x - (max + log(sum)), where a large max (1e30) swallows the log
        for k in range(n):
            out[r, k] = x[r, k] - m
        ls = x.dtype.type(math.log(s))
        for k in range(n):
            out[r, k] -= ls
    else:
        inv = x.dtype.type(1.0 / s)
        for k in range(n):
            out[r, k] *= inv


@njit(fastmath=FAST, **_OPTS)
def _softmax3(x, out, log):
    """Softmax (or ``log``-softmax) of ``x`` (outer, n, inner) along axis 1 into ``out``."""
    outer, n, inner = x.shape
    if inner == 1:
        x2 = x.reshape(outer, n)
        o2 = out.reshape(outer, n)
        for r in range(outer):
            _softmax_row(x2, o2, r, log)
        return
    m = np.empty(inner, x.dtype)
    s = np.empty(inner, np.float64)
    for o in range(outer):
        for i in range(inner):
            m[i] = x[o, 0, i]
            s[i] = 0.0
        for k in range(1, n):
            for i in range(inner):
                m[i] = maxnum(m[i], x[o, k, i])
        for k in range(n):
            for i in range(inner):
                e = fexp(x[o, k, i] - m[i])
                out[o, k, i] = e
                s[i] += e
        if log:
            for i in range(inner):
                s[i] = math.log(s[i])
            for k in range(n):  # (x - max) - log(sum) in two loops, as in _softmax_row
                for i in range(inner):
                    out[o, k, i] = x[o, k, i] - m[i]
            for k in range(n):
                for i in range(inner):
                    out[o, k, i] -= s[i]
        else:
            for i in range(inner):
                s[i] = 1.0 / s[i]
            for k in range(n):
                for i in range(inner):
                    out[o, k, i] *= s[i]


@njit(parallel=True, fastmath=FAST, **_OPTS)
def _softmax_rows_par(x, out, log):
    """Softmax of each row of ``x`` (rows, n) into ``out``, rows spread over threads."""
    for r in prange(x.shape[0]):
        _softmax_row(x, out, r, log)


@njit(**_OPTS)
def _hardmax3(x, out):
    outer, n, inner = x.shape
    for o in range(outer):
        for i in range(inner):
            best = x[o, 0, i]
            bi = 0
            for k in range(n):
                v = x[o, k, i]
                if v > best:
                    best = v
                    bi = k
                out[o, k, i] = 0
            out[o, bi, i] = 1


def _shape3(shape: tuple, axis: int, coerce_2d: bool) -> tuple:
    ax = norm_axis(axis, len(shape))
    outer = int(math.prod(shape[:ax]))
    if coerce_2d:
        return outer, int(math.prod(shape[ax:])), 1
    return outer, shape[ax], int(math.prod(shape[ax + 1:]))


def _check(name, x):
    if x.dtype.kind != "f" and not lowp(x.dtype):
        raise InvalidArgumentError(f"{name} expects a floating-point input, got {x.dtype}")


class SoftmaxOp(NamedTuple):
    """Softmax, LogSoftmax or Hardmax bound: its axis and, before opset 13, whether it runs over the flattened
    trailing block [axis:] (``coerce_2d``) rather than along the axis alone."""
    op: str
    axis: int
    coerce_2d: bool


def bind_softmax_1(ctx, axis=1):
    return SoftmaxOp(ctx.op_type, int(axis), True)


def bind_softmax(ctx, axis=-1):
    return SoftmaxOp(ctx.op_type, int(axis), False)


def softmax_cpu(b: SoftmaxOp, ctx):
    """Softmax and LogSoftmax on the CPU (the CUDA launch shares the bind: ``ops/cuda/registered.py``)."""
    buf = ctx.out[0] if ctx.out else None
    name, axis, coerce_2d, log = b.op, b.axis, b.coerce_2d, b.op == "LogSoftmax"

    def run(x):
        _check(name, x)
        shp3 = _shape3(x.shape, axis, coerce_2d) if x.ndim else (1, 1, 1)
        dt = x.dtype
        if lowp(dt):
            xf = x.astype(F32)
            out = np.empty(x.shape, F32)
        else:
            xf = x
            out = out_buffer(buf, x.shape, dt)
        if out.size:
            if x.size >= _PARALLEL_MIN and shp3[0] > 1 and shp3[2] == 1:
                _softmax_rows_par(xf.reshape(shp3[:2]), out.reshape(shp3[:2]), log)
            else:
                _softmax3(xf.reshape(shp3), out.reshape(shp3), log)
        return out.astype(dt) if out.dtype != dt else out
    return run


def hardmax_cpu(b: SoftmaxOp, ctx):
    buf = ctx.out[0] if ctx.out else None
    axis, coerce_2d = b.axis, b.coerce_2d

    def run(x):
        _check("Hardmax", x)
        shp3 = _shape3(x.shape, axis, coerce_2d) if x.ndim else (1, 1, 1)
        dt = x.dtype
        xf = x.astype(F32) if lowp(dt) else x
        out = out_buffer(buf, x.shape, xf.dtype) if xf is x else np.empty(x.shape, F32)
        if out.size:
            _hardmax3(xf.reshape(shp3), out.reshape(shp3))
        return out.astype(dt) if out.dtype != dt else out
    return run


SOFTMAX_BINDS = ((1, bind_softmax_1), (13, bind_softmax))
for _v, _bind in SOFTMAX_BINDS:
    op("Softmax", _v, bind=_bind, writes_out=True)(softmax_cpu)
    op("LogSoftmax", _v, bind=_bind, writes_out=True)(softmax_cpu)
    op("Hardmax", _v, bind=_bind, writes_out=True)(hardmax_cpu)
