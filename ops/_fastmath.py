"""Vectorizable math helpers shared by the hot kernels (softmax, normalization, matmul).

``math.exp`` does not vectorize in Numba (no SVML here), so loops that call it run one scalar libm
call per element.  ``exp32`` is a branch-free float32 exp that LLVM inlines and vectorizes:
Cephes-style range reduction ``x = n*ln2 + r`` (round-to-nearest by the 1.5*2**23 trick, ln2 split
in a high and a low part), a degree-6 near-minimax polynomial for ``e**r`` on ``|r| <= ln2/2``
(6 FMAs), and ``2**n`` built by writing biased exponents into float32 bit patterns (a bitcast: no
call, no branch).  The scale is applied as two factors ``2**(n//2) * 2**(n - n//2)`` so results
that are subnormal, and the overflow to ``inf``, come out of one correctly rounded multiply.

Accuracy: within 2 ulp of the correctly rounded result over the whole float32 range, subnormal
results included (measured: at most 1.03 ulp from the exact value; checked densely in
``tests/test_ops_fastmath.py``); ``exp32(+inf) = inf``, ``exp32(-inf) = 0``,
``exp32(nan) = nan``, overflow gives ``inf`` and underflow ``0``.

``maxnum(a, b)`` / ``minnum(a, b)`` are LLVM's ``maxnum``/``minnum`` (IEEE maxNum/minNum: a NaN
operand is ignored).  Unlike
``a if a > b else b`` a loop of it vectorizes as a max-reduction without the ``nnan`` flag; a
NaN in the data must then be propagated by the caller's later arithmetic (softmax does, through
``exp(x - max)``).

``fexp`` dispatches on the argument type: float32 goes to ``exp32``, anything else to ``math.exp``
(float64 kernels keep libm accuracy).  ``exp32_normal`` / ``fexp_normal`` drop the clamps and the
subnormal-safe scaling for callers that have checked their arguments lie in [-86, 88] (or NaN):
about 1.6x faster, same accuracy there.

``fsigmoid``, ``fsigmoid_mlas``, ``ftanh`` and ``fgelu_tanh`` take the same float32 / other split.  Their
float32 bodies are plain ``@njit`` functions with Numba's numpy error model (``sigmoid32`` and the others),
and the overloads only forward to them.  An overload's implementation is cached on disk by its argument
types alone, with the flags of the kernel that first compiled it: a body written inside the overload would
keep that kernel's error model, and under Numba's default one every float division checks for zero, which
leaves the loop of any kernel compiled later scalar (Sigmoid 7 times slower).  No division here can be by
zero (the denominators are at least 1, or a polynomial with positive coefficients in ``v**2``).

Invariant: these helpers are compiled without reassociation flags (the rounding trick relies on
``(t + M) - M`` not being simplified); callers may use any fastmath set except nnan/ninf, since
Numba compiles each callee with its own flags.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from ._simd import fma32

__all__ = ["exp32", "exp32_normal", "fexp", "fexp_normal", "fsigmoid", "fsigmoid_mlas", "ftanh", "fgelu_tanh", "fgelu_tanh_mlas",
           "maxnum", "minnum", "FAST"]

# Fastmath flags for reductions: reassociation (vectorized sums) and FMA contraction, never
# nnan/ninf (NaN and inf inputs must keep their IEEE results).  Numba wants a set; do not mutate.
FAST = {"reassoc", "contract", "nsz", "arcp"}


@intrinsic
def _scale_by_rounded(typingctx, p, t):
    """``p * 2**n1 * 2**n2`` where ``n = bits(t) - bits(1.5 * 2**23)`` (t = v + 1.5 * 2**23 holds
    ``round(v)`` in its low mantissa bits), ``n1 = n >> 1`` and ``n2 = n - n1``.  All integer work is
    int32 in the IR (Numba would widen it to int64, halving the vector width)."""
    if p != types.float32 or t != types.float32:
        return None

    def codegen(context, builder, sig, args):
        pv, tv = args
        i32 = ir.IntType(32)
        f32 = ir.FloatType()
        n = builder.sub(builder.bitcast(tv, i32), ir.Constant(i32, 0x4B400000))
        n1 = builder.ashr(n, ir.Constant(i32, 1))
        n2 = builder.sub(n, n1)

        def pow2(k):
            # Only NaN inputs put k outside [-75, 64] (the shift then wraps, no UB): their ``p``
            # is NaN, and NaN times any scale is NaN.
            e = builder.add(k, ir.Constant(i32, 127))
            return builder.bitcast(builder.shl(e, ir.Constant(i32, 23)), f32)
        return builder.fmul(builder.fmul(pv, pow2(n1)), pow2(n2))
    return types.float32(types.float32, types.float32), codegen


def _float_binary(name, a, b):
    """Typing of an intrinsic that calls the LLVM intrinsic ``name`` on two floats of one type."""
    if a != b or not isinstance(a, types.Float):
        return None

    def codegen(context, builder, sig, args):
        t = args[0].type
        fn = builder.module.declare_intrinsic(name, [t], ir.FunctionType(t, [t, t]))
        return builder.call(fn, args)
    return a(a, b), codegen


@intrinsic
def maxnum(typingctx, a, b):
    """IEEE maxNum of two floats of one type (returns the other operand when one is NaN)."""
    return _float_binary("llvm.maxnum", a, b)


@intrinsic
def _add_exponent(typingctx, p, t):
    """``p * 2**n`` as an integer add into the exponent field, ``n`` read from ``t`` as in
    ``_scale_by_rounded``: ``bits(t) << 23 == n << 23`` since the magic number's low 9 bits are 0.
    Exact only while the result stays normal (the caller bounds n)."""
    if p != types.float32 or t != types.float32:
        return None

    def codegen(context, builder, sig, args):
        pv, tv = args
        i32 = ir.IntType(32)
        e = builder.shl(builder.bitcast(tv, i32), ir.Constant(i32, 23))
        return builder.bitcast(builder.add(builder.bitcast(pv, i32), e), ir.FloatType())
    return types.float32(types.float32, types.float32), codegen


@intrinsic
def minnum(typingctx, a, b):
    """IEEE minNum of two floats of one type (returns the other operand when one is NaN)."""
    return _float_binary("llvm.minnum", a, b)


_MAGIC = np.float32(12582912.0)       # 1.5 * 2**23: adding it rounds |v| < 2**22 to an integer
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)     # exact in 9 bits, so n * _LN2_HI is exact for |n| <= 2**15
_LN2_LO = np.float32(-2.12194440e-4)
_HI = np.float32(89.0)                # exp(89) > FLT_MAX: everything above overflows to inf
_LO = np.float32(-104.0)              # exp(-104) < FLT_TRUE_MIN/2: everything below underflows to 0
# e**r ~= 1 + r * (Q0 + Q1 r + ... + Q5 r**5) on |r| <= ln2/2: near-minimax for relative error
# (Lawson-reweighted least squares on Chebyshev nodes), 0.29 ulp after rounding the coefficients.
_Q0 = np.float32(1.0)
_Q1 = np.float32(0.49999994)
_Q2 = np.float32(0.16666432)
_Q3 = np.float32(0.041668)
_Q4 = np.float32(0.0083741555)
_Q5 = np.float32(0.0013843654)
_ONE = np.float32(1.0)


@njit(cache=True, nogil=True, fastmath={"contract"})
def _reduce_poly(x):
    """The common core of ``exp32`` and ``exp32_normal``: ``(p, t)`` with ``x = n*ln2 + r``, ``p = e**r`` by
    the polynomial and ``t = n + 1.5 * 2**23`` (``n`` in its low mantissa bits); the caller applies ``2**n``."""
    t = x * _LOG2E + _MAGIC
    fn = t - _MAGIC                           # n = round(x / ln2)
    r = x - fn * _LN2_HI
    r = r - fn * _LN2_LO
    q = _Q5 * r + _Q4
    q = q * r + _Q3
    q = q * r + _Q2
    q = q * r + _Q1
    q = q * r + _Q0
    p = q * r + _ONE
    return p, t


@njit(cache=True, nogil=True, fastmath={"contract"})
def exp32(x):
    """Branch-free float32 ``e**x`` (see the module docstring for range and accuracy)."""
    x = np.float32(x)
    # Clamp with comparisons that are false for NaN, so NaN flows through to the polynomial.
    # Written as ``c < x ? c : x`` and ``c > x ? c : x``, which map to one vminps / vmaxps each.
    x = _HI if _HI < x else x
    x = _LO if _LO > x else x
    p, t = _reduce_poly(x)                    # n = round(x / ln2), in [-150, 128]
    return _scale_by_rounded(p, t)


@njit(cache=True, nogil=True, fastmath={"contract"})
def exp32_normal(x):
    """``exp32`` for a caller that guarantees ``-86 <= x <= 88`` or NaN (e.g. ``x - max`` over a row
    whose spread it has measured): no clamps, and ``2**n`` applied by one integer add, so about
    half the instructions.  Same polynomial, same accuracy on that range; NaN gives NaN."""
    p, t = _reduce_poly(np.float32(x))
    # ``p - p`` is 0, or NaN for a NaN ``x``: the exponent add alone could turn a NaN whose payload
    # has low bits set into a number.
    return _add_exponent(p, t) + (p - p)


def _by_float_type(x, f32, other):
    """An ``@overload``'s implementation for an argument of type ``x``: ``f32`` for float32, ``other`` for the
    other floats (the function's pure Python fallback: its body is the same), none for anything else."""
    if x == types.float32:
        return f32
    if isinstance(x, types.Float):
        return other
    return None


def fexp(x):
    """``e**x``: the vectorizable ``exp32`` for float32, ``math.exp`` otherwise (pure Python fallback)."""
    return math.exp(x)


@overload(fexp, jit_options={"cache": True})
def _fexp_impl(x):
    return _by_float_type(x, lambda x: exp32(x), fexp)


def fexp_normal(x):
    """``e**x`` for ``-86 <= x <= 88`` or NaN: ``exp32_normal`` for float32, ``math.exp`` otherwise."""
    return math.exp(x)


@overload(fexp_normal, jit_options={"cache": True})
def _fexp_normal_impl(x):
    return _by_float_type(x, lambda x: exp32_normal(x), fexp_normal)


def fsigmoid(x):
    """``1 / (1 + e**-x)`` without overflow: float32 through ``exp32`` in float32 arithmetic (a loop of it
    vectorizes), other floats through ``math.exp`` (pure Python fallback)."""
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


@njit(cache=True, nogil=True, error_model="numpy")
def sigmoid32(x):
    """``fsigmoid`` of a float32."""
    e = exp32(-abs(x))                 # in (0, 1]: no overflow either way
    s = _ONE / (_ONE + e)
    return s if x >= 0 else e * s      # e / (1 + e) for negative x; NaN: e and s are NaN


@overload(fsigmoid, jit_options={"cache": True})
def _fsigmoid_impl(x):
    return _by_float_type(x, lambda x: sigmoid32(x), fsigmoid)


# MLAS's logistic (onnxruntime's float32 Sigmoid on x86-64: its FMA3 kernel): Eigen's rational approximation.
_SIG_LO = np.float32(-18.0)
_SIG_HI = np.float32(18.0)
_SIG_A = (np.float32(4.37031012579801e-11), np.float32(1.15627324459942e-07), np.float32(6.08574864600143e-05),
          np.float32(8.51377133304701e-03), np.float32(2.48287947061529e-01))
_SIG_B = (np.float32(6.10247389755681e-13), np.float32(5.76102136993427e-09), np.float32(6.29106785017040e-06),
          np.float32(1.70198817374094e-03), np.float32(1.16817656904453e-01), np.float32(9.93151921023180e-01))
_HALF = np.float32(0.5)
_ZERO = np.float32(0.0)


@njit(inline="always", cache=True, nogil=True)
def _horner(c, v2):
    """``c[0] v2^(n-1) + ... + c[n-1]`` by fused multiply-adds from the highest coefficient (Eigen's and MLAS's
    order); ``c`` a tuple of float32 constants."""
    p = fma32(v2, c[0], c[1])
    for k in range(2, len(c)):
        p = fma32(p, v2, c[k])
    return p


@njit(inline="always", cache=True, nogil=True)
def _odd_rational(x, lo, hi, a, b):
    """MLAS's rational approximations (Eigen's): ``v = clamp(x, lo, hi)``, ``v * P(v^2) / Q(v^2)`` with the
    coefficients ``a`` of P and ``b`` of Q from the highest power down."""
    v = min(max(x, lo), hi)
    v2 = v * v
    return _horner(a, v2) * v / _horner(b, v2)


def fsigmoid_mlas(x):
    """The logistic function in onnxruntime's order (MLAS, x86-64 FMA3): float32 ``v`` clamped to [-18, 18],
    ``p = v * (a9 v^8 + ... + a1)`` and ``q = b10 v^10 + ... + b0`` by fused multiply-adds in ``v^2`` (Horner),
    ``max(p / q + 0.5, 0)`` (no upper clamp: it may return 1 + 1 ulp); NaN stays NaN.  Other floats take
    ``fsigmoid`` (pure Python fallback)."""
    return fsigmoid(x)


@njit(cache=True, nogil=True, error_model="numpy")
def sigmoid32_mlas(x):
    """``fsigmoid_mlas`` of a float32."""
    r = _odd_rational(x, _SIG_LO, _SIG_HI, _SIG_A, _SIG_B) + _HALF
    r = r if r > _ZERO else _ZERO
    return r if x == x else x          # a select, not a branch: the loop stays vectorizable


@overload(fsigmoid_mlas, jit_options={"cache": True})
def _fsigmoid_mlas_impl(x):
    return _by_float_type(x, lambda x: sigmoid32_mlas(x), fsigmoid)


# MLAS's tanh (onnxruntime's float32 Tanh on x86-64: its FMA3 kernel), Eigen's rational approximation.
_TANH_LO = np.float32(-9.0)
_TANH_HI = np.float32(9.0)
_TANH_A = (np.float32(-2.76076847742355e-16), np.float32(2.00018790482477e-13), np.float32(-8.60467152213735e-11),
           np.float32(5.12229709037114e-08), np.float32(1.48572235717979e-05), np.float32(6.37261928875436e-04),
           np.float32(4.89352455891786e-03))
_TANH_B = (np.float32(1.19825839466702e-06), np.float32(1.18534705686654e-04), np.float32(2.26843463243900e-03),
           np.float32(4.89352518554385e-03))


def ftanh(x):
    """The hyperbolic tangent: float32 in onnxruntime's order (MLAS, x86-64 FMA3): ``v`` clamped to [-9, 9],
    ``p = v * (a13 v^12 + ... + a1)`` and ``q = b6 v^6 + ... + b0`` by fused multiply-adds in ``v^2``
    (Horner), ``p / q``; within 3.6e-7 of the exact value, and a loop of it vectorizes.  NaN stays NaN.
    Other floats take ``math.tanh`` (pure Python fallback)."""
    return math.tanh(x)


@njit(cache=True, nogil=True, error_model="numpy")
def tanh32(x):
    """``ftanh`` of a float32."""
    r = _odd_rational(x, _TANH_LO, _TANH_HI, _TANH_A, _TANH_B)
    return r if x == x else x


@overload(ftanh, jit_options={"cache": True})
def _ftanh_impl(x):
    return _by_float_type(x, lambda x: tanh32(x), ftanh)


_GT0 = np.float32(2.0 * 0.7978845608028654)
_GT1 = np.float32(2.0 * 0.7978845608028654 * 0.044715)
_GB = np.float32(0.7978845608028654)     # sqrt(2 / pi)
_GC = np.float32(0.035677408136300125)   # 0.044715 sqrt(2 / pi)


def fgelu_tanh(x):
    """GELU's tanh approximation ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x**3)))`` (pure Python fallback)."""
    return 0.5 * x * (1 + math.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


@njit(cache=True, nogil=True, error_model="numpy")
def gelu_tanh32(x):
    """``fgelu_tanh`` of a float32."""
    # (1 + tanh(z)) / 2 == sigmoid(2 z): one vectorizable exp, no cancellation near tanh = -1.
    e = exp32(-abs(x * (_GT0 + _GT1 * x * x)))
    s = _ONE / (_ONE + e)
    return x * (s if x >= 0 else e * s)   # 2 z has the sign of x


def fgelu_tanh_mlas(x):
    """``fgelu_tanh`` in onnxruntime's order (its Gelu and FastGelu kernels, x86-64): float32 ``u = x * ((C x) x
    + B)`` rounded at each step (B = sqrt(2/pi), C = 0.044715 B), ``t`` = MLAS's tanh of ``u`` (``tanh32``),
    ``(x / 2) * (t + 1)``: as accurate as that tanh in absolute terms (3.6e-7), less than ``fgelu_tanh`` in
    relative terms where t is near -1.  Other floats take ``fgelu_tanh`` (pure Python fallback)."""
    return fgelu_tanh(x)


@njit(cache=True, nogil=True, error_model="numpy")
def gelu_tanh32_mlas(x):
    """``fgelu_tanh_mlas`` of a float32."""
    t = tanh32(x * (_GC * x * x + _GB))
    return np.float32(0.5) * x * (t + _ONE)


@overload(fgelu_tanh_mlas, jit_options={"cache": True})
def _fgelu_tanh_mlas_impl(x):
    return _by_float_type(x, lambda x: gelu_tanh32_mlas(x), fgelu_tanh)


@overload(fgelu_tanh, jit_options={"cache": True})
def _fgelu_tanh_impl(x):
    return _by_float_type(x, lambda x: gelu_tanh32(x), fgelu_tanh)
