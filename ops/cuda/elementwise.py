"""CUDA elementwise kernels: the binary ops Add, Sub, Mul, Div, Pow; every float unary op and activation of
``ops._elementwise_kernels`` the device table holds (``CUDA_UNARY``: Neg, Exp, Sigmoid, Tanh, Relu, Sqrt, Erf,
Gelu, ...); Where.

The per-element arithmetic is generated (``ops/cuda/_elementwise_device.py``, by ``tools/gen_elementwise.py``)
from the table that generates the CPU kernels, so each op computes the expression of its CPU kernel.  Binary
ops and Where broadcast through the CPU family's 4-d canonical form (``ops._common.to4``): operands are read
flat with per-axis element strides, a broadcast axis having stride 0, so one kernel per dtype covers every
rank.  The op is a run-time code, uniform across the grid, which keeps one compiled kernel per dtype instead of
one per op.

Invariants:
- inputs and outputs are C-contiguous device arrays; outputs are freshly allocated (or the ``out`` given);
- binary operands share one dtype; Div and Pow are for floats only (integer Div truncation is not implemented);
- unary ops take floats and compute in float32 (float64 inputs too);
- broadcasts that need more than 4 canonical axes raise ``ShapeMismatchError``.
"""
from __future__ import annotations

import numpy as np

from ops._common import broadcast_shape, to4
from ops.elementwise import BINARY, UNARY
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError, ShapeMismatchError
from ._common import FLOATS, check_device, flat, grid1d, unravel4
from ._elementwise_device import CUDA_BINARY, CUDA_UNARY, binary_store, unary_store

__all__ = ["Add", "Sub", "Mul", "Div", "Neg", "Exp", "Sigmoid", "Tanh", "Relu", "Where", "binary", "unary",
           "unary_code", "UNARY_OPS", "BINARY_OPS"]

# The generated binary kernel the CUDA provider runs for each Binary kernel (Div: the float one only).
_DEVICE_BINARY = {"div": "div_f"}


def _kernel(table, name) -> str:
    """The generated kernel of ``name`` with its attributes at their defaults."""
    k = table[name][0](None).kernel
    return _DEVICE_BINARY.get(k, k) if table is BINARY else k


# The default-domain ops these kernels compute: those whose generated kernel the device table holds.
UNARY_OPS = tuple(name for name in UNARY if _kernel(UNARY, name) in CUDA_UNARY)
BINARY_OPS = tuple(name for name in BINARY if _kernel(BINARY, name) in CUDA_BINARY)
_FLOAT_ONLY = ("div_f", "pow")


def unary_code(kernel: str) -> int:
    """The run-time code of the generated unary ``kernel`` (a ``Unary.kernel``) in the device table."""
    if kernel not in CUDA_UNARY:
        raise InvalidArgumentError(f"the CUDA kernels do not compute the elementwise op {kernel!r} "
                                   f"(they compute {', '.join(CUDA_UNARY)})")
    return CUDA_UNARY.index(kernel)


# -- kernels ---------------------------------------------------------------------------------------

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
        binary_store(op, x, y, out, i)


@jit
def _where4(c, x, y, out, n1, n2, n3, c0, c1, c2, c3, x0, x1, x2, x3, y0, y1, y2, y3):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, out.size, step):
        if c[_off(i, n1, n2, n3, c0, c1, c2, c3)]:
            out[i] = x[_off(i, n1, n2, n3, x0, x1, x2, x3)]
        else:
            out[i] = y[_off(i, n1, n2, n3, y0, y1, y2, y3)]


@jit
def _unary_f32(op, x, out, p0, p1):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, x.size, step):
        unary_store(op, np.float32(x[i]), p0, p1, out, i)


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
    """``op`` (one of ``BINARY_OPS``) over two device arrays with numpy broadcasting."""
    kernel = _kernel(BINARY, op)
    check_device(op, A=A, B=B)
    if A.dtype != B.dtype:
        raise InvalidArgumentError(f"{op}: inputs must share one dtype, got {A.dtype} and {B.dtype}")
    if kernel in _FLOAT_ONLY and np.dtype(A.dtype) not in FLOATS:
        raise InvalidArgumentError(f"{op}: the CUDA kernel takes float operands only, got {A.dtype}")
    out_shape, out4, (sa, sb) = _plan(op, (A, B))
    y = _out(op, out, out_shape, A.dtype)
    n = int(np.prod(out_shape, dtype=np.int64))
    if n:
        blocks, threads = grid1d(n)
        _binary4[blocks, threads](CUDA_BINARY.index(kernel), flat(A), flat(B), flat(y), out4[1], out4[2], out4[3],
                                  *sa, *sb)
    return y


def unary(op: str, X, *, out=None, kernel=None, p0=0.0, p1=0.0):
    """``op`` (one of ``UNARY_OPS``) over a float device array (computed in float32): the generated ``kernel``
    with float attributes p0, p1 (a bound ``Unary``'s), by default the op's with its attributes' defaults."""
    if kernel is None:
        u = UNARY[op][0](None)
        kernel, p0, p1 = u.kernel, u.p0, u.p1
    code = unary_code(kernel)
    check_device(op, X=X)
    if np.dtype(X.dtype) not in FLOATS:
        raise InvalidArgumentError(f"{op}: the CUDA kernel takes float tensors, got {X.dtype}")
    y = _out(op, out, tuple(X.shape), X.dtype)
    if X.size:
        blocks, threads = grid1d(X.size)
        _unary_f32[blocks, threads](code, flat(X), flat(y), np.float32(p0), np.float32(p1))
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
