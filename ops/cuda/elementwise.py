"""CUDA elementwise kernels: the binary ops of ``ops.elementwise.BINARY`` the device tables hold (arithmetic,
Pow, comparisons, And/Or/Xor, the bitwise ops; ``CUDA_BINARY`` for floats, ``CUDA_BINARY_INT`` for integers,
``CUDA_BINARY_BOOL`` for bools); every unary op and activation of ``ops._elementwise_kernels`` they hold
(``CUDA_UNARY``: Neg, Exp, Sigmoid, Tanh, Relu, Sqrt, Erf, Gelu, IsNaN, ...; ``CUDA_UNARY_INT``: Neg, Abs, Sign,
BitwiseNot, Relu; ``CUDA_UNARY_BOOL``: Not); Where.

The per-element arithmetic is generated (``ops/cuda/_elementwise_device.py``, by ``tools/gen_elementwise.py``)
from the table that generates the CPU kernels, so each op computes the expression of its CPU kernel.  Binary
ops and Where broadcast through the CPU family's 4-d canonical form (``ops._common.to4``): operands are read
flat with per-axis element strides, a broadcast axis having stride 0, so one kernel per dtype covers every
rank.  The op is a run-time code, uniform across the grid, which keeps one compiled kernel per dtype instead of
one per op.

Invariants:
- inputs and outputs are C-contiguous device arrays; outputs are freshly allocated (or the ``out`` given);
- binary operands share one dtype; Pow is for floats only; integer Div and Mod refuse a zero divisor (checked on
  the device, one flag read back), as onnxruntime's CPU kernels do;
- float unary ops compute float16 and float32 inputs in float32, float64 inputs in float64;
- broadcasts that need more than 4 canonical axes raise ``ShapeMismatchError``.
"""
from __future__ import annotations

import numpy as np

from ops._common import broadcast_shape, to4
from ops.elementwise import BINARY, UNARY
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError, ShapeMismatchError
from ._common import FLOATS, check_device, copy_cast, flat, grid1d, unravel4, upload_small
from ._elementwise_device import (CUDA_BINARY, CUDA_BINARY_BOOL, CUDA_BINARY_INT, CUDA_UNARY, CUDA_UNARY_BOOL,
                                  CUDA_UNARY_INT, binary_store, binary_store_bool, binary_store_int, unary_store,
                                  unary_store_bool, unary_store_int)

__all__ = ["Add", "Sub", "Mul", "Div", "Neg", "Exp", "Sigmoid", "Tanh", "Relu", "Where", "binary", "unary",
           "unary_code", "check_unary", "binary_chain", "clip", "variadic", "power", "cast_to", "bitshift", "UNARY_OPS", "BINARY_OPS"]

# The chain of generated device code that computes operands of each dtype kind, and the kernel a bound op's
# kernel name becomes there (Div: the float or the integer division).
_BINARY_CHAINS = {"f": (CUDA_BINARY, {"div": "div_f"}), "i": (CUDA_BINARY_INT, {"div": "div_i"}),
                  "b": (CUDA_BINARY_BOOL, {})}
_UNARY_CHAINS = {"f": CUDA_UNARY, "i": CUDA_UNARY_INT, "b": CUDA_UNARY_BOOL}


def _kind(dtype) -> str:
    dt = np.dtype(dtype)
    return "f" if dt in FLOATS else ("b" if dt == np.bool_ else ("i" if dt.kind in "iu" else "?"))


def binary_chain(kernel: str, dtype):
    """(chain, code) of the bound binary ``kernel`` for operands of ``dtype``; None when no chain computes it."""
    chain, names = _BINARY_CHAINS.get(_kind(dtype), ((), {}))
    k = names.get(kernel, kernel)
    return (_kind(dtype), chain.index(k)) if k in chain else None


def _kernel(table, name) -> str:
    """The generated kernel of ``name`` with its attributes at their defaults."""
    return table[name][0](None).kernel


# The default-domain ops these kernels compute: those whose generated kernel a device chain holds.
UNARY_OPS = tuple(name for name in UNARY if any(_kernel(UNARY, name) in c for c in _UNARY_CHAINS.values()))
BINARY_OPS = tuple(name for name in BINARY if any(binary_chain(_kernel(BINARY, name), d) is not None
                                                  for d in (np.float32, np.int64, np.bool_)))


def unary_code(kernel: str) -> int:
    """The run-time code of the generated float unary ``kernel`` (a ``Unary.kernel``) in ``CUDA_UNARY``."""
    if kernel not in CUDA_UNARY:
        raise InvalidArgumentError(f"the CUDA kernels do not compute the elementwise op {kernel!r} "
                                   f"(they compute {', '.join(CUDA_UNARY)})")
    return CUDA_UNARY.index(kernel)


def check_unary(kernel: str) -> None:
    """Refuse a unary ``kernel`` no device chain holds (at plan time)."""
    if not any(kernel in c for c in _UNARY_CHAINS.values()):
        raise InvalidArgumentError(f"the CUDA kernels do not compute the elementwise op {kernel!r} "
                                   f"(they compute {', '.join(sorted(set().union(*_UNARY_CHAINS.values())))})")


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
def _binary4_int(op, a, b, out, n1, n2, n3, a0, a1, a2, a3, b0, b1, b2, b3):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, out.size, step):
        x = a[_off(i, n1, n2, n3, a0, a1, a2, a3)]
        y = b[_off(i, n1, n2, n3, b0, b1, b2, b3)]
        binary_store_int(op, x, y, out, i)


@jit
def _binary4_bool(op, a, b, out, n1, n2, n3, a0, a1, a2, a3, b0, b1, b2, b3):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, out.size, step):
        x = a[_off(i, n1, n2, n3, a0, a1, a2, a3)]
        y = b[_off(i, n1, n2, n3, b0, b1, b2, b3)]
        binary_store_bool(op, x, y, out, i)


_BINARY_KERNELS = {"f": _binary4, "i": _binary4_int, "b": _binary4_bool}


@jit
def _shift4(left, nbits, a, b, out, n1, n2, n3, a0, a1, a2, a3, b0, b1, b2, b3):
    """BitShift as the CPU kernel (``_shl``/``_shr``): a shift by a negative amount or by the bit width or more
    gives 0 (-1 for a negative value shifted right); a right shift of a signed value is arithmetic."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        x = a[_off(i, n1, n2, n3, a0, a1, a2, a3)]
        y = b[_off(i, n1, n2, n3, b0, b1, b2, b3)]
        if y < 0 or y >= nbits:
            out[i] = x - x - 1 if (x < 0 and not left) else x - x
        elif left:
            out[i] = x << y
        else:
            out[i] = x >> y


@jit
def _any_zero(a, flag):
    """flag[0] = 1 when some element of ``a`` is 0 (grid-stride; every writer writes the same value)."""
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        if a[i] == 0:
            flag[0] = 1


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


@jit
def _unary_f64(op, x, out, p0, p1):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, x.size, step):
        unary_store(op, np.float64(x[i]), p0, p1, out, i)


@jit
def _unary_int(op, x, out, p0, p1):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, x.size, step):
        unary_store_int(op, x[i], p0, p1, out, i)


@jit
def _unary_bool(op, x, out, p0, p1):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, x.size, step):
        unary_store_bool(op, x[i], p0, p1, out, i)


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


def binary(op: str, A, B, *, out=None, kernel=None, out_dtype=None):
    """``op`` (one of ``BINARY_OPS``) over two device arrays with numpy broadcasting: the generated ``kernel`` (a
    bound ``Binary``'s, by default the op's), the result in ``out_dtype`` (by default the operands')."""
    kernel = kernel or _kernel(BINARY, op)
    check_device(op, A=A, B=B)
    if A.dtype != B.dtype:
        raise InvalidArgumentError(f"{op}: inputs must share one dtype, got {A.dtype} and {B.dtype}")
    found = binary_chain(kernel, A.dtype)
    if found is None:
        kinds = [k for k, d in (("float", np.float32), ("integer", np.int64), ("bool", np.bool_))
                 if binary_chain(kernel, d) is not None]
        raise InvalidArgumentError(f"{op}: the CUDA kernel takes {' or '.join(kinds)} operands, got {A.dtype}")
    kind, code = found
    out_shape, out4, (sa, sb) = _plan(op, (A, B))
    y = _out(op, out, out_shape, out_dtype or A.dtype)
    n = int(np.prod(out_shape, dtype=np.int64))
    if n:
        if kind == "i" and kernel in ("div", "mod_i", "fmod_i"):
            _no_zero_divisor(op, B)
        blocks, threads = grid1d(n)
        _BINARY_KERNELS[kind][blocks, threads](code, flat(A), flat(B), flat(y), out4[1], out4[2], out4[3], *sa, *sb)
    return y


def bitshift(A, B, left: bool):
    """BitShift of two integer device arrays of one dtype, broadcast together."""
    check_device("BitShift", A=A, B=B)
    if A.dtype != B.dtype or np.dtype(A.dtype).kind not in "iu":
        raise InvalidArgumentError(f"BitShift: the CUDA kernel takes two integer operands of one dtype, "
                                   f"got {A.dtype} and {B.dtype}")
    out_shape, out4, (sa, sb) = _plan("BitShift", (A, B))
    y = rc.device_empty(out_shape, A.dtype)
    if y.size:
        blocks, threads = grid1d(y.size)
        _shift4[blocks, threads](bool(left), np.dtype(A.dtype).type(8 * np.dtype(A.dtype).itemsize), flat(A),
                                 flat(B), flat(y), out4[1], out4[2], out4[3], *sa, *sb)
    return y


def _no_zero_divisor(op, B):
    """Integer division and modulo refuse a zero divisor, as onnxruntime's CPU kernels (one flag read back)."""
    flag = rc.to_device(np.zeros(1, np.int8))
    blocks, threads = grid1d(B.size)
    _any_zero[blocks, threads](flat(B), flag)
    if rc.to_host(flag)[0]:
        what = "division" if op == "Div" else "modulo"
        raise InvalidArgumentError(f"{op}: integer {what} by zero: the divisor B ({B.dtype}{list(B.shape)}) holds 0")


def unary(op: str, X, *, out=None, kernel=None, p0=0.0, p1=0.0, out_dtype=None):
    """``op`` (one of ``UNARY_OPS``) over a device array: the generated ``kernel`` with float attributes p0, p1 (a
    bound ``Unary``'s, by default the op's with its attributes' defaults), the result in ``out_dtype`` (by
    default the input's).  Float16 and float32 compute in float32."""
    if kernel is None:
        u = UNARY[op][0](None)
        kernel, p0, p1, out_dtype = u.kernel, u.p0, u.p1, u.out_dtype
    check_device(op, X=X)
    kind = _kind(X.dtype)
    chain = _UNARY_CHAINS.get(kind, ())
    if kernel not in chain:
        kinds = [k for k, c in (("float", CUDA_UNARY), ("integer", CUDA_UNARY_INT), ("bool", CUDA_UNARY_BOOL))
                 if kernel in c]
        raise InvalidArgumentError(f"{op}: the CUDA kernel takes {' or '.join(kinds) or 'no'} tensors, got {X.dtype}")
    y = _out(op, out, tuple(X.shape), out_dtype or X.dtype)
    if X.size:
        blocks, threads = grid1d(X.size)
        if kind == "f":
            k, a0, a1 = ((_unary_f64, np.float64(p0), np.float64(p1)) if np.dtype(X.dtype) == np.float64
                         else (_unary_f32, np.float32(p0), np.float32(p1)))
        else:
            k, a0, a1 = (_unary_int if kind == "i" else _unary_bool), np.float32(p0), np.float32(p1)
        k[blocks, threads](chain.index(kernel), flat(X), flat(y), a0, a1)
    return y


@jit
def _clip(x, out, lo, hi):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = x[i]
        v = lo if v < lo else v  # NaN passes; with lo > hi everything becomes hi, as the CPU kernel
        out[i] = hi if v > hi else v


def clip(X, lo, hi):
    """Clip of a device array between the host scalars ``lo`` and ``hi`` (16-bit floats in float32)."""
    check_device("Clip", X=X)
    dt = np.dtype(X.dtype)
    if _kind(dt) not in "fi":
        raise InvalidArgumentError(f"Clip: the CUDA kernel takes float and integer tensors, got {dt}")
    y = rc.device_empty(tuple(X.shape), dt)
    if X.size:
        blocks, threads = grid1d(X.size)
        t = np.float32 if dt == np.float16 else dt.type
        _clip[blocks, threads](flat(X), flat(y), t(lo), t(hi))
    return y


def variadic(op: str, kernel: str, xs, mean: bool = False):
    """Max, Min, Sum or Mean of one or more device arrays, broadcast together: ``kernel`` folded left to right."""
    if not xs:
        raise InvalidArgumentError(f"{op} needs at least one input")
    acc = xs[0]
    if len(xs) == 1:
        acc = _copy(acc)
    for x in xs[1:]:
        acc = binary(op, acc, x, kernel=kernel)
    if mean:
        if _kind(acc.dtype) != "f":
            raise InvalidArgumentError(f"{op}: the CUDA kernel averages float tensors, got {acc.dtype}")
        acc = binary(op, acc, upload_small(np.array(len(xs), acc.dtype)), kernel="div")
    return acc


def cast_to(x, dtype):
    """A fresh device array: ``x`` converted to ``dtype`` (C casting, as numpy's ``astype``)."""
    y = rc.device_empty(tuple(x.shape), dtype)
    if x.size:
        blocks, threads = grid1d(x.size)
        copy_cast[blocks, threads](flat(x), flat(y))
    return y


def power(A, B):
    """Pow as the CPU kernel computes it: a float base with the exponent converted to its dtype, an integer base
    through float64 and back."""
    check_device("Pow", A=A, B=B)
    if _kind(A.dtype) == "f":
        return binary("Pow", A, B if B.dtype == A.dtype else cast_to(B, A.dtype))
    if _kind(A.dtype) == "i" and _kind(B.dtype) in "fi":
        f64 = np.dtype(np.float64)
        return cast_to(binary("Pow", cast_to(A, f64), cast_to(B, f64)), A.dtype)
    raise InvalidArgumentError(f"Pow: the CUDA kernel takes float or integer operands, got {A.dtype} and {B.dtype}")


def _copy(a):
    y = rc.device_empty(tuple(a.shape), a.dtype)
    if a.size:
        y.copy_to_device(a)
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
