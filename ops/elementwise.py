"""Elementwise ops: unary math and activations, binary arithmetic, comparison and logic, variadic Max/Min/Sum/Mean.

Wrappers flatten same-shape operands and canonicalize broadcasts to 4-d, so
each kernel in ``_elementwise_kernels`` compiles once per dtype.  16-bit
floats are computed in float32 and rounded back.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, InvalidAttributeError
from . import _elementwise_kernels as K
from ._common import F32, broadcast_shape, lowp, out_buffer, to4
from .registry import op

BOOL = np.dtype(bool)


# -- drivers ---------------------------------------------------------------------------------------

def run_unary(kern, x, buf=None, p0=0.0, p1=0.0, out_dtype=None):
    dt = x.dtype
    if lowp(dt):
        xf = x.astype(F32)
        o = np.empty(x.shape, F32 if out_dtype is None else out_dtype)
        kern(xf.reshape(-1), o.reshape(-1), p0, p1)
        return o.astype(dt) if out_dtype is None else o
    o = out_buffer(buf, x.shape, dt if out_dtype is None else out_dtype)
    if x.ndim == 1:
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
        if a.ndim == 1:
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
    nd(a.reshape(a4), b.reshape(b4), o.reshape(out4))
    return o


_OBJECT_OPS = {"b_equal": np.equal}


def _run_object(flat, a, b, name):
    """String tensors: only equality is defined on them."""
    f = _OBJECT_OPS.get(getattr(flat, "__name__", ""))
    if f is None:
        raise InvalidArgumentError(f"{name} is not defined for string tensors")
    return np.asarray(f(a, b), dtype=bool)


def _unary(kern, float_only=False, out_dtype=None, p0=0.0, p1=0.0, name=""):
    # ONNX float attributes are float32: a default written in a signature (alpha=0.01) is rounded as the model's
    # own value would be, so float64 inputs see the same constant as onnxruntime's kernels
    p0, p1 = float(np.float32(p0)), float(np.float32(p1))

    def factory(ctx, **attrs):
        buf = ctx.out[0] if ctx.out else None

        def run(x):
            if float_only and x.dtype.kind != "f" and not lowp(x.dtype):
                raise InvalidArgumentError(f"{ctx.op_type} expects a floating-point input, got {x.dtype}")
            return run_unary(kern, x, buf, p0, p1, out_dtype)
        return run
    return factory


def _binary(flat, nd, out_dtype=None):
    def factory(ctx):
        buf = ctx.out[0] if ctx.out else None
        name = ctx.op_type

        def run(a, b):
            return run_binary(flat, nd, a, b, buf, out_dtype, name)
        return run
    return factory


# -- unary math ------------------------------------------------------------------------------------

def _reg_unary(onnx_name, versions, kern, **kw):
    f = _unary(kern, **kw)
    for v in versions:
        op(onnx_name, v, factory=True)(f)


_reg_unary("Abs", (6, 13), K.u_abs)
_reg_unary("Neg", (6, 13), K.u_neg)
for _n, _k, _v in [("Exp", K.u_exp, (6, 13)), ("Log", K.u_log, (6, 13)), ("Sqrt", K.u_sqrt, (6, 13)),
                   ("Tanh", K.u_tanh, (6, 13)), ("Sigmoid", K.u_sigmoid, (6, 13)), ("Erf", K.u_erf, (9, 13)),
                   ("Sin", K.u_sin, (7,)), ("Cos", K.u_cos, (7,)), ("Tan", K.u_tan, (7,)),
                   ("Asin", K.u_asin, (7,)), ("Acos", K.u_acos, (7,)), ("Atan", K.u_atan, (7,)),
                   ("Sinh", K.u_sinh, (9,)), ("Cosh", K.u_cosh, (9,)), ("Asinh", K.u_asinh, (9,)),
                   ("Acosh", K.u_acosh, (9,)), ("Atanh", K.u_atanh, (9,)),
                   ("Floor", K.u_floor, (6, 13)), ("Ceil", K.u_ceil, (6, 13)), ("Round", K.u_round, (11,)),
                   ("Softplus", K.u_softplus, (1,)), ("Softsign", K.u_softsign, (1,)), ("Mish", K.u_mish, (18,))]:
    _reg_unary(_n, _v, _k)


@op("HardSwish", 14, factory=True)
def HardSwish(ctx):
    """x * HardSigmoid(x) with alpha 1/6 (as a float32 attribute) and beta 0.5, as the spec defines it."""
    return _unary(K.u_hardswish, p0=1 / 6, p1=0.5)(ctx)


@op("Reciprocal", 6, factory=True)
def Reciprocal(ctx):
    buf = ctx.out[0] if ctx.out else None

    def run(x):
        if x.dtype.kind in "iu":
            raise InvalidArgumentError(f"Reciprocal expects a floating-point input, got {x.dtype}")
        return run_unary(K.u_reciprocal, x, buf)
    return run


@op("Relu", 6, factory=True)
def Relu(ctx):
    return _unary(K.u_relu)(ctx)


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


@op("Not", 1, factory=True)
def Not(ctx):
    return _unary(K.u_not_)(ctx)


@op("BitwiseNot", 18, factory=True)
def BitwiseNot(ctx):
    return _unary(K.u_bitwise_not)(ctx)


@op("IsNaN", 9, factory=True)
def IsNaN(ctx):
    return _unary(K.u_isnan, out_dtype=BOOL)(ctx)


@op("IsInf", 10, factory=True)
def IsInf(ctx, detect_negative=1, detect_positive=1):
    return _unary(K.u_isinf, out_dtype=BOOL, p0=float(detect_positive), p1=float(detect_negative))(ctx)


@op("Elu", 6, factory=True)
def Elu(ctx, alpha=1.0):
    return _unary(K.u_elu, p0=alpha)(ctx)


@op("Selu", 6, factory=True)
def Selu(ctx, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return _unary(K.u_selu, p0=alpha, p1=gamma)(ctx)


@op("Celu", 12, factory=True)
def Celu(ctx, alpha=1.0):
    return _unary(K.u_celu, p0=alpha)(ctx)


@op("LeakyRelu", 6, factory=True)
def LeakyRelu(ctx, alpha=0.01):
    return _unary(K.u_leakyrelu, p0=alpha)(ctx)


@op("HardSigmoid", 6, factory=True)
def HardSigmoid(ctx, alpha=0.2, beta=0.5):
    return _unary(K.u_hardsigmoid, p0=alpha, p1=beta)(ctx)


@op("ThresholdedRelu", 10, factory=True)
def ThresholdedRelu(ctx, alpha=1.0):
    return _unary(K.u_thresholdedrelu, p0=alpha)(ctx)


@op("Shrink", 9, factory=True)
def Shrink(ctx, bias=0.0, lambd=0.5):
    return _unary(K.u_shrink, p0=bias, p1=lambd)(ctx)


@op("Gelu", 20, factory=True)
def Gelu(ctx, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise InvalidAttributeError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary(K.u_gelu_tanh if approximate == "tanh" else K.u_gelu)(ctx)


@op("Swish", 24, factory=True)
def Swish(ctx, alpha=1.0):
    return _unary(K.u_swish, p0=alpha)(ctx)


# -- binary ----------------------------------------------------------------------------------------

for _name, _fl, _nd, _vers in [("Add", K.b_add, K.b4_add, (7, 13, 14)), ("Sub", K.b_sub, K.b4_sub, (7, 13, 14)),
                               ("Mul", K.b_mul, K.b4_mul, (7, 13, 14))]:
    for _v in _vers:
        op(_name, _v, factory=True)(_binary(_fl, _nd))


def _no_zero_divisor(b, op_type):
    """Integer Div and Mod refuse a zero divisor, as onnxruntime does (a float one follows IEEE 754)."""
    if b.size and not b.all():
        at = np.unravel_index(int(np.argmin(b != 0)), b.shape)
        what = "division" if op_type == "Div" else "modulo"
        raise InvalidArgumentError(f"{op_type}: integer {what} by zero: the divisor B ({b.dtype}{list(b.shape)}) "
                                   f"is 0 at index {[int(i) for i in at]}")


def _div_factory(ctx):
    buf = ctx.out[0] if ctx.out else None

    def run(a, b):
        if a.dtype.kind in "iu":
            _no_zero_divisor(b, "Div")
            return run_binary(K.b_div_i, K.b4_div_i, a, b, buf, None, "Div")
        return run_binary(K.b_div_f, K.b4_div_f, a, b, buf, None, "Div")
    return run


for _v in (7, 13, 14):
    op("Div", _v, factory=True)(_div_factory)


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


@op("Pow", 7, factory=True)
def Pow(ctx):
    buf = ctx.out[0] if ctx.out else None

    def run(a, b):
        if b.dtype != a.dtype:
            b = b.astype(a.dtype if a.dtype.kind == "f" or lowp(a.dtype) else np.float64)
            if b.dtype != a.dtype:
                r = run_binary(K.b_pow, K.b4_pow, a.astype(np.float64), b, None, None, "Pow")
                return r.astype(a.dtype)
        if a.dtype.kind in "iu":
            r = run_binary(K.b_pow, K.b4_pow, a.astype(np.float64), b.astype(np.float64), None, None, "Pow")
            return r.astype(a.dtype)
        return run_binary(K.b_pow, K.b4_pow, a, b, buf, None, "Pow")
    return run


for _v in (12, 13, 15):
    op("Pow", _v, factory=True)(Pow)

for _name, _fl, _nd, _vers in [
        ("Equal", K.b_equal, K.b4_equal, (7, 11, 13, 19)), ("Less", K.b_less, K.b4_less, (7, 9, 13)),
        ("LessOrEqual", K.b_less_equal, K.b4_less_equal, (12, 16)),
        ("Greater", K.b_greater, K.b4_greater, (7, 9, 13)),
        ("GreaterOrEqual", K.b_greater_equal, K.b4_greater_equal, (12, 16)),
        ("And", K.b_and_, K.b4_and_, (7,)), ("Or", K.b_or_, K.b4_or_, (7,)), ("Xor", K.b_xor, K.b4_xor, (7,))]:
    for _v in _vers:
        op(_name, _v, factory=True)(_binary(_fl, _nd, BOOL))

for _name, _fl, _nd in [("BitwiseAnd", K.b_bitwise_and, K.b4_bitwise_and),
                        ("BitwiseOr", K.b_bitwise_or, K.b4_bitwise_or),
                        ("BitwiseXor", K.b_bitwise_xor, K.b4_bitwise_xor)]:
    op(_name, 18, factory=True)(_binary(_fl, _nd))


@op("BitShift", 11, factory=True)
def BitShift(ctx, direction=""):
    if direction not in ("LEFT", "RIGHT"):
        raise InvalidAttributeError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    k = (K.b_shl, K.b4_shl) if direction == "LEFT" else (K.b_shr, K.b4_shr)
    return _binary(*k)(ctx)


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
