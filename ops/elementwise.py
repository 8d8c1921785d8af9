"""Elementwise ops: unary math and activations, binary arithmetic, comparison and logic, variadic Max/Min/Sum/Mean.

Wrappers flatten same-shape operands and canonicalize broadcasts to 4-d, so
each kernel in ``_elementwise_kernels`` compiles once per dtype.  16-bit
floats are computed in float32 and rounded back.  From ``PARALLEL_MIN``
elements, with more than one thread, the kernels' parallel twins run instead
(the same expression per element, so the same bits).

``UNARY`` and ``BINARY`` are the one table of the elementwise ops: op type ->
(its bind, its versions).  A bind takes the node's attributes (defaults
written there only) and returns a ``Unary`` / ``Binary`` record naming the
generated kernel; the CPU wrapper here, the region form (``unary_form`` here,
the binary one in ``compiled_forms``) and the CUDA launches
(``ops/cuda/registered.py``, ``ops/cuda/activations.py``) all register with
that bind.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numba import get_num_threads, njit

from runtime.errors import InvalidArgumentError, InvalidAttributeError
from . import _elementwise_kernels as K
from ._common import F32, broadcast_shape, lowp, mlas_order, out_buffer, to4
from .forms import float_only, form
from .registry import op

BOOL = np.dtype(bool)


# -- drivers ---------------------------------------------------------------------------------------

# Elements from which a kernel's parallel twin (``_elementwise_kernels``: ``pu_``, ``pb_``, ``pb4_``) runs when the
# session has more than one thread.  Tanh over 4.7 M float32 elements took 648 us on 2 threads against 1239 on
# one; in one process, alternating, an additive-attention text model (that Tanh and the broadcast Add before it)
# went from 8.12 to 7.34 ms.
PARALLEL_MIN = 1 << 18
_TWINS: dict = {}


def _twin(kern):
    """The parallel twin of a generated kernel (False for other kernels)."""
    t = _TWINS.get(kern)
    if t is None:
        name = getattr(getattr(kern, "py_func", None), "__name__", "")
        t = _TWINS[kern] = getattr(K, "p" + name, False) if name[:2] in ("u_", "b_", "b4") else False
    return t


def run_unary(kern, x, buf=None, p0=0.0, p1=0.0, out_dtype=None):
    dt = x.dtype
    if lowp(dt):
        xf = x.astype(F32)
        o = np.empty(x.shape, F32 if out_dtype is None else out_dtype)
        kern(xf.reshape(-1), o.reshape(-1), p0, p1)
        return o.astype(dt) if out_dtype is None else o
    o = out_buffer(buf, x.shape, dt if out_dtype is None else out_dtype)
    if x.size >= PARALLEL_MIN and (nt := get_num_threads()) > 1 and (twin := _twin(kern)):
        twin(x.reshape(-1), o.reshape(-1), p0, p1, nt)
    elif x.ndim == 1:
        kern(x, o, p0, p1)
    elif x.size:
        kern(x.reshape(-1), o.reshape(-1), p0, p1)
    return o


def run_binary(flat, nd, a, b, buf=None, out_dtype=None, name="op"):
    if a.dtype == object or b.dtype == object:
        return _run_object(flat, a, b, name)
    if a.dtype != b.dtype:
        raise InvalidArgumentError(f"{name}: both inputs must have one dtype, got {a.dtype} and {b.dtype}")
    dt = a.dtype
    if lowp(dt):
        r = run_binary(flat, nd, a.astype(F32), b.astype(F32), None, out_dtype, name)
        return r.astype(dt) if out_dtype is None else r
    odt = dt if out_dtype is None else out_dtype
    if a.shape == b.shape:
        o = out_buffer(buf, a.shape, odt)
        if a.size >= PARALLEL_MIN and (nt := get_num_threads()) > 1 and (twin := _twin(flat)):
            twin(a.reshape(-1), b.reshape(-1), o.reshape(-1), nt)
        elif a.ndim == 1:
            flat(a, b, o)
        elif a.size:
            flat(a.reshape(-1), b.reshape(-1), o.reshape(-1))
        return o
    shape = broadcast_shape(a.shape, b.shape)
    o = out_buffer(buf, shape, odt)
    if o.size == 0:
        return o
    c = to4(shape, (a.shape, b.shape))
    if c is None:
        a = np.ascontiguousarray(np.broadcast_to(a, shape))
        b = np.ascontiguousarray(np.broadcast_to(b, shape))
        flat(a.reshape(-1), b.reshape(-1), o.reshape(-1))
        return o
    out4, (a4, b4) = c
    if o.size >= PARALLEL_MIN and get_num_threads() > 1 and (twin := _twin(nd)):
        twin(a.reshape(a4), b.reshape(b4), o.reshape(out4))
    else:
        nd(a.reshape(a4), b.reshape(b4), o.reshape(out4))
    return o


_OBJECT_OPS = {"b_equal": np.equal}


def _run_object(flat, a, b, name):
    """String tensors: only equality is defined on them."""
    f = _OBJECT_OPS.get(getattr(flat, "__name__", ""))
    if f is None:
        raise InvalidArgumentError(f"{name} is not defined for string tensors")
    return np.asarray(f(a, b), dtype=bool)


# -- unary math ------------------------------------------------------------------------------------

class Unary(NamedTuple):
    """A unary elementwise op bound to its node: ``kernel`` names ``_elementwise_kernels.u_<kernel>`` (the CUDA
    implementations map it to their device code); ``p0``/``p1`` its float attributes; ``check``: ``"no_int"``
    refuses integer inputs; ``out_dtype``: the result's dtype when it is not the input's."""
    op: str
    kernel: str
    p0: float = 0.0
    p1: float = 0.0
    check: str = ""
    out_dtype: Any = None


def _unary(op_type, kernel, p0=0.0, p1=0.0, **kw) -> Unary:
    # ONNX float attributes are float32: a default written in a signature (alpha=0.01) is rounded as the model's
    # own value would be, so float64 inputs see the same constant as onnxruntime's kernels
    return Unary(op_type, kernel, float(np.float32(p0)), float(np.float32(p1)), **kw)


def _plain(op_type, kernel, **kw):
    """The bind of a unary op without attributes."""
    def bind(ctx):
        return _unary(op_type, kernel, **kw)
    bind.__name__ = f"bind_{kernel}"
    return bind


def bind_hardswish(ctx):
    """x * HardSigmoid(x) with alpha 1/6 (as a float32 attribute) and beta 0.5, as the spec defines it."""
    return _unary("HardSwish", "hardswish", 1 / 6, 0.5)


def bind_isinf(ctx, detect_negative=1, detect_positive=1):
    return _unary("IsInf", "isinf", float(detect_positive), float(detect_negative), out_dtype=BOOL)


def bind_elu(ctx, alpha=1.0):
    return _unary("Elu", "elu", alpha)


def bind_selu(ctx, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return _unary("Selu", "selu", alpha, gamma)


def bind_celu(ctx, alpha=1.0):
    return _unary("Celu", "celu", alpha)


def bind_leakyrelu(ctx, alpha=0.01):
    return _unary("LeakyRelu", "leakyrelu", alpha)


def bind_hardsigmoid(ctx, alpha=0.2, beta=0.5):
    return _unary("HardSigmoid", "hardsigmoid", alpha, beta)


def bind_thresholdedrelu(ctx, alpha=1.0):
    return _unary("ThresholdedRelu", "thresholdedrelu", alpha)


def bind_shrink(ctx, bias=0.0, lambd=0.5):
    return _unary("Shrink", "shrink", bias, lambd)


def bind_gelu(ctx, approximate="none"):
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    if approximate not in ("none", "tanh"):
        raise InvalidAttributeError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("Gelu", "gelu_tanh" if approximate == "tanh" else "gelu")


def bind_swish(ctx, alpha=1.0):
    return _unary("Swish", "swish", alpha)


# op type -> (its bind, the versions it is registered at): every implementation of a unary op (the CPU wrapper
# here, its region form, its CUDA launch) registers with this bind.
UNARY = {
    **{name: (_plain(name, kernel), vers) for name, kernel, vers in [
        ("Abs", "abs", (6, 13)), ("Neg", "neg", (6, 13)), ("Exp", "exp", (6, 13)), ("Log", "log", (6, 13)),
        ("Sqrt", "sqrt", (6, 13)), ("Tanh", "tanh", (6, 13)), ("Sigmoid", "sigmoid", (6, 13)),
        ("Erf", "erf", (9, 13)), ("Sin", "sin", (7,)), ("Cos", "cos", (7,)), ("Tan", "tan", (7,)),
        ("Asin", "asin", (7,)), ("Acos", "acos", (7,)), ("Atan", "atan", (7,)), ("Sinh", "sinh", (9,)),
        ("Cosh", "cosh", (9,)), ("Asinh", "asinh", (9,)), ("Acosh", "acosh", (9,)), ("Atanh", "atanh", (9,)),
        ("Floor", "floor", (6, 13)), ("Ceil", "ceil", (6, 13)), ("Round", "round", (11,)),
        ("Softplus", "softplus", (1,)), ("Softsign", "softsign", (1,)), ("Mish", "mish", (18,)),
        ("Relu", "relu", (6,)), ("Not", "not_", (1,)), ("BitwiseNot", "bitwise_not", (18,))]},
    "Reciprocal": (_plain("Reciprocal", "reciprocal", check="no_int"), (6,)),
    "IsNaN": (_plain("IsNaN", "isnan", out_dtype=BOOL), (9,)),
    "HardSwish": (bind_hardswish, (14,)), "IsInf": (bind_isinf, (10,)), "Elu": (bind_elu, (6,)),
    "Selu": (bind_selu, (6,)), "Celu": (bind_celu, (12,)), "LeakyRelu": (bind_leakyrelu, (6,)),
    "HardSigmoid": (bind_hardsigmoid, (6,)), "ThresholdedRelu": (bind_thresholdedrelu, (10,)),
    "Shrink": (bind_shrink, (9,)), "Gelu": (bind_gelu, (20,)), "Swish": (bind_swish, (24,)),
}


def cpu_kernel(kernel: str) -> str:
    """The CPU kernel of a unary op's ``kernel``: with ``ONNX_NUMBA_MLAS_ORDER`` (read when a node is planned),
    Sigmoid takes MLAS's logistic (``_fastmath.fsigmoid_mlas``) and tanh-Gelu onnxruntime's formula over MLAS's
    tanh (``_fastmath.fgelu_tanh_mlas``): onnxruntime's float32 bits on x86-64."""
    if kernel in ("sigmoid", "gelu_tanh") and mlas_order():
        return kernel + "_mlas"
    return kernel


def unary_cpu(u: Unary, ctx):
    """The CPU implementation of every unary op: its ``_elementwise_kernels`` kernel over the flat input, into
    the plan's buffer when it has one."""
    buf = ctx.out[0] if ctx.out else None
    kern = getattr(K, "u_" + cpu_kernel(u.kernel))
    no_int = u.check == "no_int"
    name, p0, p1, out_dtype = u.op, u.p0, u.p1, u.out_dtype  # closure cells: read once per call

    def run(x):
        if no_int and x.dtype.kind in "iu":
            raise InvalidArgumentError(f"{name} expects a floating-point input, got {x.dtype}")
        return run_unary(kern, x, buf, p0, p1, out_dtype)
    return run


# The unary ops a compiled region runs (float32): the same kernels, called from the generated code.
FORM_UNARY = ("Sigmoid", "Tanh", "Relu", "Exp", "Neg", "Sqrt", "Erf", "Abs", "Reciprocal", "Gelu")


def unary_form(e, u: Unary):
    float_only(e, 0)
    k = e.use("ops._elementwise_kernels", "u_" + cpu_kernel(u.kernel))
    e.line("{o0} = np.empty_like({i0})",
           f"{k}({{i0}}.reshape(({{i0}}.size,)), {{o0}}.reshape(({{o0}}.size,)), {u.p0!r}, {u.p1!r})")
    e.declare(0, F32, e.rank(0))


for _name, (_bind, _vers) in UNARY.items():
    for _v in _vers:
        op(_name, _v, bind=_bind, writes_out=True)(unary_cpu)
        if _name in FORM_UNARY:
            form(_name, since=_v, bind=_bind)(unary_form)


@op("Sign", 9, factory=True)
def Sign(ctx):
    buf = ctx.out[0] if ctx.out else None

    def run(x):
        if x.dtype.kind == "f" or lowp(x.dtype):
            return run_unary(K.u_sign_f, x, buf)
        if x.dtype == BOOL:
            return x.copy()
        return run_unary(K.u_sign, x, buf)
    return run


# -- binary ----------------------------------------------------------------------------------------

class Binary(NamedTuple):
    """A binary elementwise op bound to its node: ``kernel`` names the flat and 4-d broadcasting kernels
    ``_elementwise_kernels.b_<kernel>`` / ``b4_<kernel>`` (Div and Pow pick theirs by dtype); ``out_dtype``: the
    result's dtype when it is not the inputs'."""
    op: str
    kernel: str
    out_dtype: Any = None


def _plain_binary(op_type, kernel, out_dtype=None):
    def bind(ctx):
        return Binary(op_type, kernel, out_dtype)
    bind.__name__ = f"bind_{kernel}"
    return bind


def binary_cpu(b: Binary, ctx):
    """The CPU implementation of the binary ops with one kernel: flat for equal shapes, else 4-d broadcasting."""
    buf = ctx.out[0] if ctx.out else None
    flat, nd = getattr(K, "b_" + b.kernel), getattr(K, "b4_" + b.kernel)
    out_dtype, name = b.out_dtype, b.op  # closure cells: read once per call

    def run(a, c):
        return run_binary(flat, nd, a, c, buf, out_dtype, name)
    return run


BINARY = {name: (_plain_binary(name, kernel, out), vers) for name, kernel, out, vers in [
    ("Add", "add", None, (7, 13, 14)), ("Sub", "sub", None, (7, 13, 14)), ("Mul", "mul", None, (7, 13, 14)),
    ("Equal", "equal", BOOL, (7, 11, 13, 19)), ("Less", "less", BOOL, (7, 9, 13)),
    ("LessOrEqual", "less_equal", BOOL, (12, 16)), ("Greater", "greater", BOOL, (7, 9, 13)),
    ("GreaterOrEqual", "greater_equal", BOOL, (12, 16)), ("And", "and_", BOOL, (7,)), ("Or", "or_", BOOL, (7,)),
    ("Xor", "xor", BOOL, (7,)), ("BitwiseAnd", "bitwise_and", None, (18,)), ("BitwiseOr", "bitwise_or", None, (18,)),
    ("BitwiseXor", "bitwise_xor", None, (18,))]}
for _name, (_bind, _vers) in BINARY.items():
    for _v in _vers:
        op(_name, _v, bind=_bind, writes_out=True)(binary_cpu)


def _no_zero_divisor(b, op_type):
    """Integer Div and Mod refuse a zero divisor, as onnxruntime does (a float one follows IEEE 754)."""
    if b.size and not b.all():
        at = np.unravel_index(int(np.argmin(b != 0)), b.shape)
        what = "division" if op_type == "Div" else "modulo"
        raise InvalidArgumentError(f"{op_type}: integer {what} by zero: the divisor B ({b.dtype}{list(b.shape)}) "
                                   f"is 0 at index {[int(i) for i in at]}")


def div_cpu(b: Binary, ctx):
    """Div: integer division (refusing a zero divisor) or IEEE float division, by the inputs' dtype."""
    buf = ctx.out[0] if ctx.out else None

    def run(a, c):
        if a.dtype.kind in "iu":
            _no_zero_divisor(c, "Div")
            return run_binary(K.b_div_i, K.b4_div_i, a, c, buf, None, "Div")
        return run_binary(K.b_div_f, K.b4_div_f, a, c, buf, None, "Div")
    return run


BINARY["Div"] = (_plain_binary("Div", "div"), (7, 13, 14))
for _v in BINARY["Div"][1]:
    op("Div", _v, bind=BINARY["Div"][0], writes_out=True)(div_cpu)


@op("Mod", 10, factory=True)
def Mod(ctx, fmod=0):
    buf = ctx.out[0] if ctx.out else None
    if fmod not in (0, 1):
        raise InvalidAttributeError(f"Mod: fmod must be 0 or 1, got {fmod}")

    def run(a, b):
        isint = a.dtype.kind in "iu"
        if isint:
            _no_zero_divisor(b, "Mod")
        if fmod:
            k = (K.b_fmod_i, K.b4_fmod_i) if isint else (K.b_fmod_f, K.b4_fmod_f)
        else:
            k = (K.b_mod_i, K.b4_mod_i) if isint else (K.b_mod_f, K.b4_mod_f)
        return run_binary(k[0], k[1], a, b, buf, None, "Mod")
    return run


op("Mod", 13, factory=True)(Mod)


def pow_cpu(b: Binary, ctx):
    """Pow: in the base's dtype (an integer base through float64, a mixed exponent converted first)."""
    buf = ctx.out[0] if ctx.out else None

    def run(a, c):
        if c.dtype == a.dtype and c.size == 1 and c.ndim <= a.ndim and a.dtype.kind == "f" and c.reshape(-1)[0] == 2:
            # a square: x * x is powf(x, 2)'s correctly rounded result, NaN, infinities and -0 alike, in a
            # same-shape pass instead of a broadcast one calling pow per element
            return run_binary(K.b_mul, K.b4_mul, a, a, buf, None, "Pow")
        if c.dtype != a.dtype:
            c = c.astype(a.dtype if a.dtype.kind == "f" or lowp(a.dtype) else np.float64)
            if c.dtype != a.dtype:
                r = run_binary(K.b_pow, K.b4_pow, a.astype(np.float64), c, None, None, "Pow")
                return r.astype(a.dtype)
        if a.dtype.kind in "iu":
            r = run_binary(K.b_pow, K.b4_pow, a.astype(np.float64), c.astype(np.float64), None, None, "Pow")
            return r.astype(a.dtype)
        return run_binary(K.b_pow, K.b4_pow, a, c, buf, None, "Pow")
    return run


BINARY["Pow"] = (_plain_binary("Pow", "pow"), (7, 12, 13, 15))
for _v in BINARY["Pow"][1]:
    op("Pow", _v, bind=BINARY["Pow"][0], writes_out=True)(pow_cpu)

@op("BitShift", 11, factory=True)
def BitShift(ctx, direction=""):
    if direction not in ("LEFT", "RIGHT"):
        raise InvalidAttributeError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    return binary_cpu(Binary("BitShift", "shl" if direction == "LEFT" else "shr"), ctx)


@op("PRelu", 7, factory=True)
def PRelu(ctx):
    buf = ctx.out[0] if ctx.out else None

    def run(x, slope):
        return run_binary(K.b_prelu, K.b4_prelu, x, slope.astype(x.dtype), buf, None, "PRelu")
    return run


for _v in (9, 16):
    op("PRelu", _v, factory=True)(PRelu)


# -- variadic --------------------------------------------------------------------------------------

def _variadic(flat, nd, name, mean=False):
    def factory(ctx):
        def run(*xs):
            if not xs:
                raise InvalidArgumentError(f"{name} needs at least one input")
            acc = xs[0]
            if len(xs) == 1:
                acc = acc.copy()
            for x in xs[1:]:
                acc = run_binary(flat, nd, acc, x, None, None, name)
            if mean:
                acc = (acc / np.asarray(len(xs), acc.dtype)).astype(xs[0].dtype)
            return acc
        return run
    return factory


for _v in (8, 12, 13):
    op("Max", _v, factory=True)(_variadic(K.b_max, K.b4_max, "Max"))
    op("Min", _v, factory=True)(_variadic(K.b_min, K.b4_min, "Min"))
for _v in (8, 13):
    op("Sum", _v, factory=True)(_variadic(K.b_add, K.b4_add, "Sum"))
    op("Mean", _v, factory=True)(_variadic(K.b_add, K.b4_add, "Mean", mean=True))


# -- Clip ------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _clip_kernel(xs, out, lo, hi):
    # min(max(x, lo), hi): with lo > hi everything becomes hi.  NaN passes through.
    for i in range(xs.shape[0]):
        x = xs[i]
        v = lo if x < lo else x
        out[i] = hi if v > hi else v


def _clip_run(x, lo, hi, buf):
    dt = x.dtype
    if lowp(dt):
        return _clip_run(x.astype(F32), np.float32(lo), np.float32(hi), None).astype(dt)
    o = out_buffer(buf, x.shape, dt)
    if x.size:
        _clip_kernel(x.reshape(-1), o.reshape(-1), dt.type(lo), dt.type(hi))
    return o


def _bound(v, dt, upper):
    if v is None or (isinstance(v, np.ndarray) and v.size == 0):
        if dt.kind == "f" or lowp(dt):
            return np.inf if upper else -np.inf
        info = np.iinfo(dt)
        return info.max if upper else info.min
    a = np.asarray(v)
    if a.size != 1:
        raise InvalidArgumentError(f"Clip: min and max must be scalars, got shape {list(a.shape)}")
    return a.reshape(-1)[0]


@op("Clip", 6, factory=True)
def Clip6(ctx, min=-3.4028234663852886e38, max=3.4028234663852886e38):
    buf = ctx.out[0] if ctx.out else None

    def run(x):
        return _clip_run(x, min, max, buf)
    return run


@op("Clip", 11, factory=True)
def Clip(ctx):
    buf = ctx.out[0] if ctx.out else None

    def run(x, lo=None, hi=None):
        return _clip_run(x, _bound(lo, x.dtype, False), _bound(hi, x.dtype, True), buf)
    return run


for _v in (12, 13):
    op("Clip", _v, factory=True)(Clip)
