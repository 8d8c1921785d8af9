"""Write the elementwise modules from one table: ops/_elementwise_kernels.py (one typed @njit kernel per op and
the fused segments' row op) and ops/cuda/_elementwise_device.py (the CUDA device functions).

Numba caches a compiled function by its source file and qualified name, so
kernels made by a closure factory cannot be cached.  This script spells every
kernel out in a real module instead.  Each op's expression below is the one
its CPU kernel, its segment opcode, its region form (which calls the kernel)
and its CUDA device function compute.  Run it after changing the tables:

    python tools/gen_elementwise.py

``tests/test_ops_elementwise.py`` checks that the committed modules are what
this script writes.
"""
from __future__ import annotations

import os
import textwrap

# name -> expression of x (the element) and p0, p1 (float attributes)
UNARY = {
    "abs": "abs(x)",
    "neg": "-x",
    "exp": "fexp(x)",
    "log": "math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)",
    "sqrt": "math.sqrt(x) if x >= 0 else math.nan",
    "reciprocal": "1 / x if x != 0 else math.copysign(math.inf, x)",
    "tanh": "ftanh(x)",  # onnxruntime's float32 bits on x86-64 (MLAS's rational form)
    "sigmoid": "fsigmoid(x)",
    "sigmoid_mlas": "fsigmoid_mlas(x)",  # onnxruntime's float32 bits on x86-64 (ONNX_NUMBA_MLAS_ORDER)
    "erf": "math.erf(x)",
    "sin": "math.sin(x)",
    "cos": "math.cos(x)",
    "tan": "math.tan(x)",
    "asin": "math.asin(x) if -1 <= x <= 1 else math.nan",
    "acos": "math.acos(x) if -1 <= x <= 1 else math.nan",
    "atan": "math.atan(x)",
    "sinh": "math.sinh(x)",
    "cosh": "math.cosh(x)",
    "asinh": "math.asinh(x)",
    "acosh": "math.acosh(x) if x >= 1 else math.nan",
    "atanh": "math.atanh(x) if -1 < x < 1 else (math.copysign(math.inf, x) if abs(x) == 1 else math.nan)",
    "floor": "math.floor(x) if abs(x) < 4503599627370496.0 else x",  # from 2**52 every float is whole
    "ceil": "math.ceil(x) if abs(x) < 4503599627370496.0 else x",
    "round": "_round_half_even(x)",
    "sign": "int(x > 0) - int(x < 0)",
    "sign_f": "x if x != x else ((x > 0) * 1.0 - (x < 0) * 1.0)",
    "not_": "not x",
    "isnan": "x != x",
    "isinf": "(x == math.inf and p0 != 0) or (x == -math.inf and p1 != 0)",
    "relu": "x if x > 0 or x != x else False",  # -inf gives 0, NaN passes; False: a zero of any type
    "softplus": "x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))",
    "softsign": "x / (1 + abs(x))",
    "mish": "x * math.tanh(x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x)))",
    "hardswish": "x * ((p0 * x + p1) if (p0 * x + p1) != (p0 * x + p1) else max(0, min(1, p0 * x + p1)))",
    "elu": "x if x >= 0 else p0 * (math.exp(x) - 1)",
    "selu": "p1 * x if x > 0 else p1 * (p0 * (math.exp(x) - 1))",  # alpha (exp(x) - 1), as onnxruntime
    "celu": "max(0, x) + (p0 * (math.exp(x / p0) - 1) if not p0 * (math.exp(x / p0) - 1) > 0 else False)",  # NaN propagates, as in the spec's formula
    "leakyrelu": "x if x >= 0 else p0 * x",
    "hardsigmoid": "(p0 * x + p1) if (p0 * x + p1) != (p0 * x + p1) else max(0, min(1, p0 * x + p1))",  # NaN (of x, alpha or beta) propagates
    "thresholdedrelu": "x if x > p0 else False",  # NaN and -inf give 0, as onnxruntime
    "shrink": "x + p0 if x < -p1 else (x - p0 if x > p1 else False)",  # the spec's order (lambd < 0)
    "gelu": "0.5 * x * (1 + math.erf(x * 0.7071067811865476))",
    "gelu_tanh": "fgelu_tanh(x)",
    "gelu_tanh_mlas": "fgelu_tanh_mlas(x)",  # onnxruntime's float32 bits on x86-64 (ONNX_NUMBA_MLAS_ORDER)
    "swish": "x / (1 + math.exp(-p0 * x)) if p0 * x >= 0 else x * math.exp(p0 * x) / (1 + math.exp(p0 * x))",
    "bitwise_not": "~x",
    "quick_gelu": "x / (1 + math.exp(-p0 * x)) if p0 * x >= 0 else x * math.exp(p0 * x) / (1 + math.exp(p0 * x))",
}

# name -> expression of x, y
BINARY = {
    "add": "x + y",
    "sub": "x - y",
    "mul": "x * y",
    "div_f": "x / y",
    "div_i": "_idiv(x, y)",
    "mod_i": "_imod(x, y)",
    "fmod_i": "_ifmod(x, y)",
    "fmod_f": "np.fmod(x, y) if y != 0 else math.nan",
    "mod_f": "_fmod_py(x, y)",
    "pow": "_pow(x, y)",
    "max": "x if (x >= y or x != x) else y",
    "min": "x if (x <= y or x != x) else y",
    "equal": "x == y",
    "less": "x < y",
    "less_equal": "x <= y",
    "greater": "x > y",
    "greater_equal": "x >= y",
    "and_": "x and y",
    "or_": "x or y",
    "xor": "x != y",
    "bitwise_and": "x & y",
    "bitwise_or": "x | y",
    "bitwise_xor": "x ^ y",
    "shl": "_shl(x, y, xs.itemsize * 8)",
    "shr": "_shr(x, y, xs.itemsize * 8)",
    "prelu": "x if x >= 0 else x * y",
}

# The row ops of the fused float32 segments (runtime/segments.py), by opcode: names in UNARY or BINARY, so a
# segment computes each with the very expression of its kernel.
SEGMENT = ("add", "sub", "mul", "div_f", "relu", "neg", "exp", "tanh", "sigmoid", "abs", "sigmoid_mlas")

# The ops the CUDA provider computes (ops/cuda/elementwise.py, ops/cuda/activations.py), by run-time code:
# names in UNARY or BINARY, so a CUDA kernel computes each with the very expression of its CPU kernel.  Unary
# ones are float ops (the CUDA kernels compute them in float32).
CUDA_UNARY = ("neg", "exp", "sigmoid", "tanh", "relu", "sqrt", "erf", "abs", "log", "reciprocal", "sin", "cos",
              "floor", "ceil", "gelu", "gelu_tanh", "quick_gelu", "softplus", "softsign", "hardsigmoid",
              "leakyrelu", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "round",
              "mish", "elu", "selu", "celu", "thresholdedrelu", "shrink", "swish", "hardswish", "sign_f", "isnan",
              "isinf")
CUDA_BINARY = ("add", "sub", "mul", "div_f", "pow", "max", "min", "equal", "less", "less_equal", "greater",
               "greater_equal", "prelu")
# Integer and bool operands have chains of their own: every branch of a chain is compiled for the dtype a kernel
# is called with, and ``~x`` or ``x & y`` do not type for floats.
CUDA_UNARY_INT = ("neg", "abs", "sign", "bitwise_not", "relu")
CUDA_UNARY_BOOL = ("not_",)
CUDA_BINARY_INT = ("add", "sub", "mul", "div_i", "mod_i", "fmod_i", "max", "min", "equal", "less", "less_equal",
                   "greater", "greater_equal", "bitwise_and", "bitwise_or", "bitwise_xor", "prelu")
CUDA_BINARY_BOOL = ("and_", "or_", "xor", "equal")
# device function -> (its parameters, the ops it computes, their table)
CUDA_CHAINS = {
    "unary_store": ("op, x, p0, p1, out, o", CUDA_UNARY, UNARY),
    "unary_store_int": ("op, x, p0, p1, out, o", CUDA_UNARY_INT, UNARY),
    "unary_store_bool": ("op, x, p0, p1, out, o", CUDA_UNARY_BOOL, UNARY),
    "binary_store": ("op, x, y, out, o", CUDA_BINARY, BINARY),
    "binary_store_int": ("op, x, y, out, o", CUDA_BINARY_INT, BINARY),
    "binary_store_bool": ("op, x, y, out, o", CUDA_BINARY_BOOL, BINARY),
}

# Scalar helpers the expressions call, written once: each target adds its decorator (an inlined @njit for the
# CPU kernels, a device function for CUDA) and takes the ones its expressions name.
HELPERS = {
    "_round_half_even": """def _round_half_even(x):
    if not abs(x) < 4503599627370496.0:  # NaN, infinities and floats from 2**52 on are whole already
        return x
    r = math.floor(x)
    d = x - r
    if d > 0.5 or (d == 0.5 and r % 2 != 0):
        r += 1
    return r
""",
    "_idiv": """def _idiv(x, y):
    # y != 0: the wrappers refuse integer division by zero.  Every value keeps x's integer type (an integer
    # literal would turn uint64 arithmetic into float64), and MIN / -1 wraps instead of trapping.
    if y == -1:
        return (x - x) - x
    q = x // y
    if (x < 0) != (y < 0) and q * y != x:
        q += y // y
    return q
""",
    "_imod": """def _imod(x, y):
    if y == -1:
        return x - x
    return x % y
""",
    "_ifmod": """def _ifmod(x, y):
    if y == -1:
        return x - x
    r = x % y
    if r != 0 and (r < 0) != (x < 0):
        r -= y
    return r
""",
    "_fmod_py": """def _fmod_py(x, y):
    # numpy's float mod: the result takes the divisor's sign; zero keeps it too.
    if y == 0 or not math.isfinite(x) or y != y:
        return x * 0 + math.nan
    r = np.fmod(x, y)
    if r != 0:
        if (y < 0) != (r < 0):
            r += y
    else:
        r = math.copysign(0.0, y)
    return r
""",
    "_pow": """def _pow(x, y):
    return x ** y
""",
    "_shl": """def _shl(x, y, nbits):
    # Shifts by a negative amount or by the bit width or more give 0.
    if y < 0 or y >= nbits:
        return x * 0
    return x << y
""",
    "_shr": """def _shr(x, y, nbits):
    if y < 0 or y >= nbits:
        return x * 0 - 1 if x < 0 else x * 0
    return x >> y
""",
}

# ``ops._fastmath``'s float helpers (vectorizable float32 forms on the CPU), as CUDA computes them: the same
# formulas through the device's exp.
CUDA_FASTMATH = {
    "fexp": """def fexp(x):
    return math.exp(x)
""",
    "fsigmoid": """def fsigmoid(x):
    e = math.exp(-abs(x))  # in (0, 1]: no overflow either way
    s = _ONE / (_ONE + e)
    return s if x >= 0 else e * s  # e / (1 + e) for negative x; NaN: e and s are NaN
""",
    "ftanh": """def ftanh(x):
    return math.tanh(x)
""",
    "fgelu_tanh": """def fgelu_tanh(x):
    # (1 + tanh(z)) / 2 == sigmoid(2 z): one exp, no cancellation near tanh = -1.
    e = math.exp(-abs(x * (_GT0 + _GT1 * x * x)))
    s = _ONE / (_ONE + e)
    return x * (s if x >= 0 else e * s)  # 2 z has the sign of x
""",
}

CPU_HEADER = '''"""Typed elementwise kernels, generated by tools/gen_elementwise.py; do not edit.

Each unary kernel ``u_<op>(x, out, p0, p1)`` maps a flat contiguous array
into ``out`` (p0, p1: the op's float attributes).  Each binary op has a flat
kernel ``b_<op>(x, y, out)`` for equal shapes and ``b4_<op>(x, y, out)`` for
4-d broadcasting, where an input axis of extent 1 is read at index 0.  Their
parallel twins ``pu_<op>(x, out, p0, p1, nchunk)`` and ``pb_<op>(x, y, out,
nchunk)`` run ``nchunk`` runs of the flat arrays over the threads, and
``pb4_<op>(x, y, out)`` the rows of the first three axes.
``segment_op(op, x, y, out, o)`` is the fused segments' row op number ``op``
(``SEGMENT`` names them), with the expression of that op's kernel.
"""
import math

import numpy as np
from numba import njit, prange

from ._fastmath import fexp, fgelu_tanh, fgelu_tanh_mlas, fsigmoid, fsigmoid_mlas, ftanh

_OPTS = dict(cache=True, nogil=True, error_model="numpy", fastmath=False)
'''

CUDA_HEADER = '''"""CUDA elementwise device functions, generated by tools/gen_elementwise.py from the table that generates
``ops/_elementwise_kernels.py``; do not edit.

``unary_store(op, x, p0, p1, out, i)`` writes unary op number ``op`` (``CUDA_UNARY`` names them) of the scalar
``x`` to ``out[i]`` (p0, p1: the op's float attributes); ``binary_store(op, x, y, out, i)`` writes binary op
number ``op`` (``CUDA_BINARY``) of x and y.  Those take floats; ``*_int`` and ``*_bool`` are the chains for
integer and bool operands (``CUDA_UNARY_INT``, ... name their ops).  Each op is the expression of its CPU kernel; ``fexp``,
``fsigmoid`` and ``fgelu_tanh`` are ``ops._fastmath``'s formulas through the device's exp.  The op is a
run-time code, uniform across a grid, so a kernel that calls these compiles once per dtype for every op.
"""
import math

import numpy as np

from runtime.cuda import jit

# ops._fastmath's float32 constants
_ONE = np.float32(1.0)
_GT0 = np.float32(2.0 * 0.7978845608028654)
_GT1 = np.float32(2.0 * 0.7978845608028654 * 0.044715)
'''


def _used(names, exprs) -> list:
    return [n for n in names if any(n + "(" in x for x in exprs)]


def _helpers(decorator, exprs, sources) -> str:
    """The helpers that ``exprs`` (or other helpers they take) call, each under ``decorator``."""
    texts = list(exprs)
    wanted = _used(sources, texts)
    while True:
        more = _used(sources, [sources[n] for n in wanted])
        if set(more) <= set(wanted):
            break
        wanted += [n for n in more if n not in wanted]
    return "".join(f"\n\n{decorator}\n{sources[n]}" for n in sources if n in wanted)


def _chain(fn, params, names, table, comment) -> str:
    """A device/row function that writes op number ``op`` (its index in ``names``) of the table to out[o]."""
    lines = [f"\n\n{comment}\ndef {fn}({params}):\n"]
    for k, name in enumerate(names):
        lines.append(f"    {'if' if k == 0 else 'elif'} op == {k}:  # {name}\n        out[o] = {table[name]}\n")
    return "".join(lines)


def _expr(name):
    return BINARY[name] if name in BINARY else UNARY[name]


# which axes of a 4-d operand are read at their index (an axis of extent 1 is read at 0): b4_ and pb4_ share them
_BROADCAST_FLAGS = "".join(f"    {v}{k} = {a}.shape[{k}] != 1\n"
                           for v, a in (("a", "xs"), ("c", "ys")) for k in range(4))


def cpu_source() -> str:
    out = [CPU_HEADER, _helpers('@njit(inline="always", **_OPTS)', list(UNARY.values()) + list(BINARY.values()),
                                HELPERS)]
    for name, expr in UNARY.items():
        out.append(f'''

@njit(**_OPTS)
def u_{name}(xs, out, p0, p1):
    for i in range(xs.shape[0]):
        x = xs[i]
        out[i] = {expr}


@njit(parallel=True, **_OPTS)
def pu_{name}(xs, out, p0, p1, nchunk):
    n = xs.shape[0]
    for c in prange(nchunk):
        u_{name}(xs[c * n // nchunk:(c + 1) * n // nchunk], out[c * n // nchunk:(c + 1) * n // nchunk], p0, p1)
''')
    for name, expr in BINARY.items():
        out.append(f'''

@njit(**_OPTS)
def b_{name}(xs, ys, out):
    for i in range(out.shape[0]):
        x = xs[i]
        y = ys[i]
        out[i] = {expr}


@njit(**_OPTS)
def b4_{name}(xs, ys, out):
    n0, n1, n2, n3 = out.shape
{_BROADCAST_FLAGS}    for i0 in range(n0):
        for i1 in range(n1):
            for i2 in range(n2):
                for i3 in range(n3):
                    x = xs[i0 * a0, i1 * a1, i2 * a2, i3 * a3]
                    y = ys[i0 * c0, i1 * c1, i2 * c2, i3 * c3]
                    out[i0, i1, i2, i3] = {expr}


@njit(parallel=True, **_OPTS)
def pb_{name}(xs, ys, out, nchunk):
    n = out.shape[0]
    for c in prange(nchunk):
        lo, hi = c * n // nchunk, (c + 1) * n // nchunk
        b_{name}(xs[lo:hi], ys[lo:hi], out[lo:hi])


@njit(parallel=True, **_OPTS)
def pb4_{name}(xs, ys, out):
    n0, n1, n2, n3 = out.shape
{_BROADCAST_FLAGS}    for t in prange(n0 * n1 * n2):
        i0 = t // (n1 * n2)
        i1 = t // n2 - i0 * n1
        i2 = t - (i0 * n1 + i1) * n2
        for i3 in range(n3):
            x = xs[i0 * a0, i1 * a1, i2 * a2, i3 * a3]
            y = ys[i0 * c0, i1 * c1, i2 * c2, i3 * c3]
            out[i0, i1, i2, i3] = {expr}
''')
    out.append(f"\n\nSEGMENT = {SEGMENT!r}\n")
    out.append(_chain("segment_op", "op, x, y, out, o", SEGMENT, {n: _expr(n) for n in SEGMENT},
                      '@njit(inline="always", **_OPTS)'))
    return "".join(out)


def _wrap(names, indent=14, brackets="()") -> str:
    """A tuple (or list) literal of ``names`` in lines under 110 characters, continued ``indent`` columns in."""
    body = ("\n" + " " * indent).join(textwrap.wrap(", ".join(map(repr, names)), 108 - indent))
    return brackets[0] + body + ("," if len(names) == 1 and brackets == "()" else "") + brackets[1]


def cuda_source() -> str:
    exprs = [table[n] for _, names, table in CUDA_CHAINS.values() for n in names]
    sources = {**HELPERS, **CUDA_FASTMATH}
    tables = {"CUDA_UNARY": CUDA_UNARY, "CUDA_BINARY": CUDA_BINARY, "CUDA_UNARY_INT": CUDA_UNARY_INT,
              "CUDA_UNARY_BOOL": CUDA_UNARY_BOOL, "CUDA_BINARY_INT": CUDA_BINARY_INT,
              "CUDA_BINARY_BOOL": CUDA_BINARY_BOOL}
    out = [CUDA_HEADER, f"\n__all__ = {_wrap([*tables, *CUDA_CHAINS], 11, '[]')}\n",
           "\n" + "".join(f"{k} = {_wrap(v, len(k) + 4)}\n" for k, v in tables.items()),
           _helpers("@jit(device=True)", exprs, sources)]
    out += [_chain(fn, params, names, table, "@jit(device=True)") for fn, (params, names, table) in CUDA_CHAINS.items()]
    return "".join(out)


OUTPUTS = {os.path.join("ops", "_elementwise_kernels.py"): cpu_source,
           os.path.join("ops", "cuda", "_elementwise_device.py"): cuda_source}


def main(root=None):
    """Write every generated module under ``root`` (the repository by default)."""
    root = root or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    for rel, make in OUTPUTS.items():
        with open(os.path.join(root, rel), "w") as f:
            f.write(make())


if __name__ == "__main__":
    main()
