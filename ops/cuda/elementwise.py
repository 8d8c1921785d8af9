"""CUDA elementwise kernels: Add, Sub, Mul, Div, Pow, the float unary ops (Neg, Exp, Sigmoid, Tanh, Relu, Sqrt,
Erf, Abs, Log, Reciprocal, Sin, Cos, Floor, Ceil), Where.

Binary ops and Where broadcast through the CPU family's 4-d canonical form (``ops._common.to4``): operands
are read flat with per-axis element strides, a broadcast axis having stride 0, so one kernel per dtype covers
every rank.  The op is a run-time code, uniform across the grid, which keeps one compiled kernel per dtype
instead of one per op.

Invariants:
- inputs and outputs are C-contiguous device arrays; outputs are freshly allocated (or the ``out`` given);
- binary operands share one dtype; Div and Pow are for floats only (integer Div truncation is not implemented);
- unary ops take floats and compute in float32 (float64 inputs too);
- broadcasts that need more than 4 canonical axes raise ``ShapeMismatchError``.
"""
from __future__ import annotations

import math

import numpy as np

from ops._common import broadcast_shape, to4
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError, ShapeMismatchError
from ._common import FLOATS, check_device, flat, grid1d, unravel4

__all__ = ["Add", "Sub", "Mul", "Div", "Neg", "Exp", "Sigmoid", "Tanh", "Relu", "Where", "binary", "unary",
           "UNARY_OPS", "BINARY_OPS"]

ADD, SUB, MUL, DIV, POW = 0, 1, 2, 3, 4
NEG, EXP, SIGMOID, TANH, RELU, SQRT, ERF, ABS, LOG, RECIP, SIN, COS, FLOOR, CEIL = range(14)
_BINARY = {"Add": ADD, "Sub": SUB, "Mul": MUL, "Div": DIV, "Pow": POW}
_UNARY = {"Neg": NEG, "Exp": EXP, "Sigmoid": SIGMOID, "Tanh": TANH, "Relu": RELU, "Sqrt": SQRT, "Erf": ERF,
          "Abs": ABS, "Log": LOG, "Reciprocal": RECIP, "Sin": SIN, "Cos": COS, "Floor": FLOOR, "Ceil": CEIL}
UNARY_OPS = tuple(_UNARY)
BINARY_OPS = tuple(_BINARY)


# -- kernels ---------------------------------------------------------------------------------------

@jit(device=True)
def _bin(op, x, y):
    if op == ADD:
        return x + y
    if op == SUB:
        return x - y
    if op == MUL:
        return x * y
    if op == POW:
        return x ** y
    return x / y


@jit(device=True)
def _off(i, n1, n2, n3, s0, s1, s2, s3):
    """Element offset of flat output index ``i`` (4-d extents (., n1, n2, n3)) in an operand with strides s."""
    i0, i1, i2, i3 = unravel4(i, n1, n2, n3)
    return i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3


@jit
def _binary4(op, a, b, out, n1, n2, n3, a0, a1, a2, a3, b0, b1, b2, b3):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, out.size, step):
        x = a[_off(i, n1, n2, n3, a0, a1, a2, a3)]
        y = b[_off(i, n1, n2, n3, b0, b1, b2, b3)]
        out[i] = _bin(op, x, y)


@jit
def _where4(c, x, y, out, n1, n2, n3, c0, c1, c2, c3, x0, x1, x2, x3, y0, y1, y2, y3):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, out.size, step):
        if c[_off(i, n1, n2, n3, c0, c1, c2, c3)]:
            out[i] = x[_off(i, n1, n2, n3, x0, x1, x2, x3)]
        else:
            out[i] = y[_off(i, n1, n2, n3, y0, y1, y2, y3)]


@jit(device=True)
def _un(op, v):
    if op == NEG:
        return -v
    if op == EXP:
        return math.exp(v)
    if op == SIGMOID:
        # Two branches so exp never overflows.
        one = np.float32(1.0)
        if v >= 0:
            return one / (one + math.exp(-v))
        e = math.exp(v)
        return e / (one + e)
    if op == TANH:
        return math.tanh(v)
    if op == SQRT:
        return math.sqrt(v) if v >= 0 else np.float32(math.nan)
    if op == ERF:
        return math.erf(v)
    if op == ABS:
        return abs(v)
    if op == LOG:
        if v > 0:
            return math.log(v)
        if v == 0:
            return np.float32(-math.inf)
        return np.float32(math.nan)
    if op == RECIP:
        return np.float32(1.0) / v if v != 0 else np.float32(math.copysign(math.inf, v))
    if op == SIN:
        return math.sin(v)
    if op == COS:
        return math.cos(v)
    if op == FLOOR:  # from 2**23 every float32 is whole (math.floor would convert it to int64)
        return math.floor(v) if abs(v) < np.float32(8388608.0) else v
    if op == CEIL:
        return math.ceil(v) if abs(v) < np.float32(8388608.0) else v
    if v > 0 or v != v:  # NaN passes through, like max(x, 0) on the CPU
        return v
    return np.float32(0.0)


@jit
def _unary_f32(op, x, out):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, x.size, step):
        out[i] = _un(op, np.float32(x[i]))


# -- wrappers --------------------------------------------------------------------------------------

def _strides4(shape4) -> tuple:
    """Element strides of a contiguous 4-d shape, 0 on extent-1 axes (they broadcast)."""
    s = [0, 0, 0, 0]
    acc = 1
    for ax in range(3, -1, -1):
        s[ax] = acc if shape4[ax] != 1 else 0
        acc *= shape4[ax]
    return tuple(s)


def _plan(op: str, arrays) -> tuple:
    shapes = tuple(tuple(a.shape) for a in arrays)
    out_shape = broadcast_shape(*shapes)
    c = to4(out_shape, shapes)
    if c is None:
        raise ShapeMismatchError(f"{op}: broadcasting {[list(s) for s in shapes]} needs more than 4 canonical axes, "
                               f"which the CUDA kernel does not support")
    out4, ins4 = c
    return out_shape, out4, [_strides4(s) for s in ins4]


def _out(op, out, shape, dtype):
    if out is None:
        return rc.device_empty(shape, dtype)
    check_device(op, out=out)
    if tuple(out.shape) != tuple(shape) or np.dtype(out.dtype) != np.dtype(dtype):
        raise ShapeMismatchError(f"{op}: out is {list(out.shape)} {out.dtype}, expected {list(shape)} {dtype}")
    return out


def binary(op: str, A, B, *, out=None):
    """``op`` in Add/Sub/Mul/Div over two device arrays with numpy broadcasting."""
    code = _BINARY[op]
    check_device(op, A=A, B=B)
    if A.dtype != B.dtype:
        raise InvalidArgumentError(f"{op}: inputs must share one dtype, got {A.dtype} and {B.dtype}")
    if code in (DIV, POW) and np.dtype(A.dtype) not in FLOATS:
        raise InvalidArgumentError(f"{op}: the CUDA kernel takes float operands only, got {A.dtype}")
    out_shape, out4, (sa, sb) = _plan(op, (A, B))
    y = _out(op, out, out_shape, A.dtype)
    n = int(np.prod(out_shape, dtype=np.int64))
    if n:
        blocks, threads = grid1d(n)
        _binary4[blocks, threads](code, flat(A), flat(B), flat(y), out4[1], out4[2], out4[3], *sa, *sb)
    return y


def unary(op: str, X, *, out=None):
    """``op`` (one of ``UNARY_OPS``) over a float device array (computed in float32)."""
    check_device(op, X=X)
    if np.dtype(X.dtype) not in FLOATS:
        raise InvalidArgumentError(f"{op}: the CUDA kernel takes float tensors, got {X.dtype}")
    y = _out(op, out, tuple(X.shape), X.dtype)
    if X.size:
        blocks, threads = grid1d(X.size)
        _unary_f32[blocks, threads](_UNARY[op], flat(X), flat(y))
    return y


def Add(A, B, *, out=None):
    return binary("Add", A, B, out=out)


def Sub(A, B, *, out=None):
    return binary("Sub", A, B, out=out)


def Mul(A, B, *, out=None):
    return binary("Mul", A, B, out=out)


def Div(A, B, *, out=None):
    return binary("Div", A, B, out=out)


def Neg(X, *, out=None):
    return unary("Neg", X, out=out)


def Exp(input, *, out=None):
    return unary("Exp", input, out=out)


def Sigmoid(X, *, out=None):
    return unary("Sigmoid", X, out=out)


def Tanh(input, *, out=None):
    return unary("Tanh", input, out=out)


def Relu(X, *, out=None):
    return unary("Relu", X, out=out)


def Where(condition, X, Y, *, out=None):
    """``X`` where ``condition`` else ``Y``; all three broadcast together."""
    check_device("Where", condition=condition, X=X, Y=Y)
    if np.dtype(condition.dtype) != np.dtype(np.bool_):
        raise InvalidArgumentError(f"Where: condition must be bool, got {condition.dtype}")
    if X.dtype != Y.dtype:
        raise InvalidArgumentError(f"Where: X and Y must share one dtype, got {X.dtype} and {Y.dtype}")
    out_shape, out4, (sc, sx, sy) = _plan("Where", (condition, X, Y))
    y = _out("Where", out, out_shape, X.dtype)
    n = int(np.prod(out_shape, dtype=np.int64))
    if n:
        blocks, threads = grid1d(n)
        _where4[blocks, threads](flat(condition), flat(X), flat(Y), flat(y), out4[1], out4[2], out4[3],
                                 *sc, *sx, *sy)
    return y
