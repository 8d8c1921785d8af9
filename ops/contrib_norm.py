"""onnxruntime contrib normalization and GELU-family ops.

Ops: SimplifiedLayerNormalization (default domain and com.microsoft), SkipSimplifiedLayerNormalization,
SkipLayerNormalization, LayerNormalization (the contrib form onnxruntime registers in the DEFAULT domain from
opset 1; there is no com.microsoft LayerNormalization), GatedRMSNorm, and the com.microsoft activations
Gelu, BiasGelu, FastGelu, QuickGelu.

Canonical views keep the kernels few: every row norm sees ``(rows, n)`` (skip tensors that broadcast over
the batch are indexed as ``row % skip_rows``), GatedRMSNorm sees ``(rows * groups, C)``, the activations see
``(rows, n)`` with an optional bias of length ``n``.  16-bit floats are computed in float32.  The row norms
follow onnxruntime's CPU kernels operation for operation (``_norm_row``: sums in the input's float type, one
element after the other; a division per element), so their float32 results are onnxruntime's bits; the other
reductions are compiled with ``FAST`` (reassociation, never nnan/ninf).  These kernels run on every
decode step, so large inputs (prefill) use ``parallel=True`` variants over rows and small ones a serial loop.

Invariants:
- ``Y`` of the simplified norms has the dtype of ``scale`` (onnxruntime's ``V``), like onnxruntime;
- the statistics outputs (``mean``, ``inv_std_var``) have shape ``x.shape[:axis] + (1,) * (rank - axis)``
  and dtype float32 (``stash_type`` 1) unless the graph declares another;
- the skip ops' ``input_skip_bias_sum`` is ``input + skip (+ bias)`` in the input dtype; the ``mean`` output
  of SkipSimplifiedLayerNormalization is not computed by onnxruntime's CPU kernel and is returned as zeros.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from . import _simd
from ._common import F32, lowp, norm_axis, out_buffer, raise_coded
from ._fastmath import FAST, fexp, fgelu_tanh, fgelu_tanh_mlas, sigmoid32_mlas
from ._common import mlas_order as mlas_setting
from .forms import Decline, float_only, raise_on, form
from .normalization import declared_dtype, output_used
from .registry import op

_OPTS = dict(cache=True, nogil=True, error_model="numpy")
_PARALLEL_MIN = 1 << 18  # elements
F64 = np.dtype(np.float64)
EMPTY = np.empty(0, F64)
EMPTY_OF = {dt: np.empty(0, dt) for dt in (F32, F64)}  # an absent operand
MS = "com.microsoft"
MLAS_NORM_MIN = 16  # shorter rows take onnxruntime's plain loop even where it has MLAS's kernel (measured: 15 and 16)


# -- kernels ---------------------------------------------------------------------------------------

@njit(**_OPTS)
def _norm_row(src, r, scale, beta, y, mean_out, inv_out, eps, simplified):
    """Normalize row ``r`` of ``src`` into ``y`` in onnxruntime's CPU order, in src's dtype: the sum and the sum of
    squares one element after the other (``q += v * v``, no fused multiply-add), ``d = sqrt(q / n + eps)``
    (``sqrt(q / n - mean * mean + eps)`` centred), then ``y = v / d * scale`` (``(v - mean) / d * scale + beta``)
    with a division per element; ``inv_std_var`` is ``1 / d``.  Compiled without fastmath flags, so that LLVM
    keeps this order."""
    n = src.shape[1]
    s = src.dtype.type(0.0)
    q = src.dtype.type(0.0)
    for j in range(n):
        v = src[r, j]
        s += v
        q += v * v
    nf = src.dtype.type(n)
    e = src.dtype.type(eps)
    mean = s / nf
    if simplified:
        d = np.sqrt(q / nf + e)
    else:
        d = np.sqrt(q / nf - mean * mean + e)
    if mean_out.shape[0]:
        mean_out[r] = mean
    if inv_out.shape[0]:
        inv_out[r] = src.dtype.type(1.0) / d
    if simplified:
        for j in range(n):
            y[r, j] = src[r, j] / d * scale[j]
    elif beta.shape[0]:
        for j in range(n):
            y[r, j] = (src[r, j] - mean) / d * scale[j] + beta[j]
    else:
        for j in range(n):
            y[r, j] = (src[r, j] - mean) / d * scale[j]


@njit(**_OPTS)
def _sq_lanes(src, r, n, mean):
    """MLAS's sum of squares of ``src[r] - mean`` (float32): fused multiply-adds into 8 lanes over whole chunks of
    8, the lanes summed ``((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))``, the rest fused in one by one.
    Scalar lanes: no allocation per row."""
    f = np.float32
    z = f(0.0)
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = z
    whole = n - n % 8
    for i in range(0, whole, 8):
        d0 = f(src[r, i]) - mean
        d1 = f(src[r, i + 1]) - mean
        d2 = f(src[r, i + 2]) - mean
        d3 = f(src[r, i + 3]) - mean
        d4 = f(src[r, i + 4]) - mean
        d5 = f(src[r, i + 5]) - mean
        d6 = f(src[r, i + 6]) - mean
        d7 = f(src[r, i + 7]) - mean
        a0 = _simd.fma32(d0, d0, a0)
        a1 = _simd.fma32(d1, d1, a1)
        a2 = _simd.fma32(d2, d2, a2)
        a3 = _simd.fma32(d3, d3, a3)
        a4 = _simd.fma32(d4, d4, a4)
        a5 = _simd.fma32(d5, d5, a5)
        a6 = _simd.fma32(d6, d6, a6)
        a7 = _simd.fma32(d7, d7, a7)
    s = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
    for i in range(whole, n):
        d = f(src[r, i]) - mean
        s = _simd.fma32(d, d, s)
    return s


@njit(**_OPTS)
def _mlas_norm_row(src, r, scale, beta, y, mean_out, inv_out, eps, simplified):
    """Row ``r`` of a float32 ``src`` in MLAS's AVX2 layer-norm kernel order (``MlasLayerNormKernelAvx2``, which
    onnxruntime's LayerNormalization and SimplifiedLayerNormalization run on x86 hosts with AVX2): squares summed
    as ``_sq_lanes`` (of ``x``, or of ``x - mean`` centred); the centred form's mean a float64 sum in 4 lanes
    (``(l0 + l2) + (l1 + l3)``, then the rest) rounded to float32 after the division; ``inv = 1 / sqrt(s / n +
    eps)`` in float32; ``y = x * inv * scale`` (``fma((x - mean) * inv, scale, beta)``).  Reads are cast to
    float32, so the function also compiles (unused) for float64 rows."""
    n = src.shape[1]
    f = np.float32
    mean = f(0.0)
    if not simplified:
        d0 = d1 = d2 = d3 = 0.0
        w4 = n - n % 4
        for i in range(0, w4, 4):
            d0 += np.float64(src[r, i])
            d1 += np.float64(src[r, i + 1])
            d2 += np.float64(src[r, i + 2])
            d3 += np.float64(src[r, i + 3])
        ds = (d0 + d2) + (d1 + d3)
        for i in range(w4, n):
            ds += np.float64(src[r, i])
        mean = f(ds / np.float64(n))
    s = _sq_lanes(src, r, n, mean)
    inv = f(1.0) / np.sqrt(s / f(n) + f(eps))
    if mean_out.shape[0]:
        mean_out[r] = mean
    if inv_out.shape[0]:
        inv_out[r] = inv
    if simplified:
        for j in range(n):
            y[r, j] = f(src[r, j]) * inv * f(scale[j])
    elif beta.shape[0]:
        for j in range(n):
            y[r, j] = _simd.fma32((f(src[r, j]) - mean) * inv, f(scale[j]), f(beta[j]))
    else:
        for j in range(n):
            y[r, j] = (f(src[r, j]) - mean) * inv * f(scale[j])


@njit(**_OPTS)
def _skip_row(x, skip, bias, ssum, r):
    """``ssum[r] = (x[r] + skip[r % skip_rows]) (+ bias)``, added in that order (onnxruntime's)."""
    n = x.shape[1]
    rs = r % skip.shape[0]
    if bias.shape[0]:
        for j in range(n):
            ssum[r, j] = (x[r, j] + skip[rs, j]) + bias[j]
    else:
        for j in range(n):
            ssum[r, j] = x[r, j] + skip[rs, j]


@njit(**_OPTS)
def _row(x, skip, bias, ssum, scale, beta, y, mean_out, inv_out, eps, simplified, mlas, r):
    """Row norm ``r`` of ``x`` (rows, n), or of ``x + skip (+ bias)`` (kept in ``ssum``) when ``skip`` has rows;
    ``mlas``: in ``_mlas_norm_row``'s order (float32, no skip, rows of ``MLAS_NORM_MIN`` and more, as onnxruntime
    chooses that kernel), else ``_norm_row``'s."""
    if skip.shape[0]:
        _skip_row(x, skip, bias, ssum, r)
        _norm_row(ssum, r, scale, beta, y, mean_out, inv_out, eps, simplified)
    elif mlas and x.shape[1] >= MLAS_NORM_MIN:
        _mlas_norm_row(x, r, scale, beta, y, mean_out, inv_out, eps, simplified)
    else:
        _norm_row(x, r, scale, beta, y, mean_out, inv_out, eps, simplified)


@njit(**_OPTS)
def _rows(x, skip, bias, ssum, scale, beta, y, mean_out, inv_out, eps, simplified, mlas):
    """Every row norm of ``x`` (see ``_row``).  Both drivers pass the row as uint64 (the type ``prange`` gives
    it), so ``_row`` and the kernels below it compile once for the two."""
    for r in range(x.shape[0]):
        _row(x, skip, bias, ssum, scale, beta, y, mean_out, inv_out, eps, simplified, mlas, np.uint64(r))


@njit(parallel=True, **_OPTS)
def _rows_par(x, skip, bias, ssum, scale, beta, y, mean_out, inv_out, eps, simplified, mlas):
    for r in prange(x.shape[0]):
        _row(x, skip, bias, ssum, scale, beta, y, mean_out, inv_out, eps, simplified, mlas, np.uint64(r))


@njit(fastmath=FAST, **_OPTS)
def _gated_row(x, gate, r, scale, y, eps, act):
    """float32 row of C elements: ``x * rsqrt(mean(x^2) + eps) * scale * act(gate)`` (act 0 silu, 1 sigmoid)."""
    n = x.shape[1]
    q = 0.0
    for j in range(n):
        v = np.float64(x[r, j])
        q += v * v
    iv = np.float32(1.0 / math.sqrt(q / n + eps))
    if act == 0:
        for j in range(n):
            z = gate[r, j]
            y[r, j] = x[r, j] * iv * scale[j] * (z / (np.float32(1.0) + fexp(-z)))
    else:
        for j in range(n):
            z = gate[r, j]
            y[r, j] = x[r, j] * iv * scale[j] / (np.float32(1.0) + fexp(-z))


@njit(**_OPTS)
def _gated_rows_ort(x, gate, scale, y, eps, act):
    """``_gated_row`` for every row in onnxruntime's float32 order (``ONNX_NUMBA_MLAS_ORDER=1``): the squares
    summed one after the other, ``1 / sqrtf(sum / n + eps)``, ``(x * inv) * scale`` times ``z * sigmoid(z)``
    (silu) or ``sigmoid(z)``, the logistic by MLAS's kernel (``sigmoid32_mlas``); each operation rounded."""
    n = x.shape[1]
    e = np.float32(eps)
    one = np.float32(1.0)
    for r in range(x.shape[0]):
        s = np.float32(0.0)
        for j in range(n):
            s = np.float32(s + np.float32(x[r, j] * x[r, j]))
        iv = np.float32(one / np.float32(math.sqrt(np.float32(np.float32(s / np.float32(n)) + e))))
        for j in range(n):
            z = gate[r, j]
            g = sigmoid32_mlas(z)
            nrm = np.float32(np.float32(x[r, j] * iv) * scale[j])
            y[r, j] = np.float32(nrm * np.float32(z * g)) if act == 0 else np.float32(nrm * g)


@njit(fastmath=FAST, **_OPTS)
def _gated_rows(x, gate, scale, y, eps, act):
    for r in range(x.shape[0]):
        _gated_row(x, gate, r, scale, y, eps, act)


@njit(parallel=True, fastmath=FAST, **_OPTS)
def _gated_rows_par(x, gate, scale, y, eps, act):
    for r in prange(x.shape[0]):
        _gated_row(x, gate, r, scale, y, eps, act)


GELU_ERF, GELU_TANH, GELU_QUICK = 0, 1, 2
GELU_TANH_MLAS = 3  # GELU_TANH in onnxruntime's order (``cpu_mode``): the CPU kernels' code, never a bind's


@njit(**_OPTS)
def _gelu(x, bias, y, mode, alpha):
    """GELU family over (rows, n) with an optional bias of length n added first."""
    rows, n = x.shape
    one = x.dtype.type(1.0)
    half = x.dtype.type(0.5)
    rs2 = x.dtype.type(1.0 / math.sqrt(2.0))
    a = x.dtype.type(alpha)
    hb = bias.shape[0] > 0
    for r in range(rows):
        for j in range(n):
            v = x[r, j]
            if hb:
                v += bias[j]
            if mode == GELU_ERF:
                y[r, j] = half * v * (one + math.erf(v * rs2))
            elif mode == GELU_TANH:
                y[r, j] = fgelu_tanh(v)
            elif mode == GELU_TANH_MLAS:
                y[r, j] = fgelu_tanh_mlas(v)
            else:
                y[r, j] = v / (one + fexp(-a * v))


# -- helpers ---------------------------------------------------------------------------------------

def _check_float(name, x):
    if x.dtype.kind != "f" and not lowp(x.dtype):
        raise InvalidArgumentError(f"{name} expects a floating-point input, got {x.dtype}")


_EMPTY_BY_DT: dict = {}


def _empty(dt, n=None):
    """Shared empty vectors ((0,) or (0, n)) that stand for a missing operand."""
    key = (dt, n)
    e = _EMPTY_BY_DT.get(key)
    if e is None:
        e = np.empty(0 if n is None else (0, n), dt)
        _EMPTY_BY_DT[key] = e
    return e


def _cdt(dt):
    return F32 if lowp(dt) else np.dtype(dt)


def _vec(name, what, p, shape, cdt) -> np.ndarray:
    """``p`` broadcast to ``shape`` as a flat contiguous vector of dtype ``cdt``."""
    if p.shape == shape and p.dtype == cdt and p.flags.c_contiguous:  # the usual case: no copy
        return p.reshape(-1)
    try:
        b = np.broadcast_to(np.asarray(p), shape)
    except ValueError:
        raise ShapeMismatchError(f"{name}: {what} of shape {list(np.shape(p))} does not broadcast to "
                                 f"{list(shape)}") from None
    return np.ascontiguousarray(b, dtype=cdt).reshape(-1)


# -- the row norms' contract -----------------------------------------------------------------------
# SimplifiedLayerNormalization, the contrib LayerNormalization and the two skip norms are one op written
# once: a bind per op type (its attributes and defaults), one record it returns (``RowNorm``), one typed
# driver (``row_norm``) whose checks return codes into ``NORM_ERRORS``, and the three implementations that
# read the record: the CPU wrapper (``_cpu``), the region form (``_form``) and the CUDA launch
# (``ops.cuda.contrib_norm``), which shares ``row_geometry``.

class RowNorm(NamedTuple):
    """A row-norm node bound at plan time."""

    op: str               # the op type, for messages
    simplified: bool      # RMS: no mean, no beta
    skip: bool            # the skip form: (input, skip, gamma[, beta][, bias]) over the last axis
    axis: int             # the first normalized axis, as given (negative counts from the end)
    eps: float
    n_outputs: int
    want_stats: bool      # mean or inv_std_var is read
    want_sum: bool        # input_skip_bias_sum is read
    stat_types: tuple     # per statistics output: a declared np.dtype, or None (the op's rule, ``stat_dtype``)
    stash_type: int

    def operands(self, args):
        """(x, skip, scale, beta, bias) from the node's inputs, None where absent."""
        args = tuple(args) + (None,) * (5 - len(args))
        if not self.skip:
            return args[0], None, args[1], (None if self.simplified else args[2]), None
        if self.simplified:
            return args[0], args[1], args[2], None, args[3]
        return args[0], args[1], args[2], args[3], args[4]

    def stat_dtype(self, k, x_dtype):
        """The dtype of statistics output ``k`` (1: mean, 2: inv_std_var) for an input of ``x_dtype``."""
        if self.skip:
            return F64 if np.dtype(x_dtype) == F64 else F32
        declared = self.stat_types[k - 1] if k - 1 < len(self.stat_types) else None
        if declared is not None:
            return declared
        return F32 if self.stash_type == 1 else np.dtype(x_dtype)

    def stat_index(self):
        """The output position of inv_std_var (SimplifiedLayerNormalization has no mean output)."""
        return 1 if self.simplified and not self.skip else 2


def bind_simplified(ctx, axis=-1, epsilon=1e-5, stash_type=1) -> RowNorm:
    """SimplifiedLayerNormalization (default domain and com.microsoft): ``(X, scale) -> (Y[, inv_std_var])``."""
    return RowNorm("SimplifiedLayerNormalization", True, False, int(axis), float(epsilon), ctx.n_outputs,
                   output_used(ctx, 1), False, (declared_dtype(ctx, 1),), int(stash_type))


def bind_layer_norm(ctx, axis=-1, epsilon=1e-5, stash_type=1) -> RowNorm:
    """onnxruntime's pre-opset-17 contrib LayerNormalization: ``(X, Scale[, B]) -> (Y[, mean, inv_std_var])``."""
    return RowNorm("LayerNormalization", False, False, int(axis), float(epsilon), ctx.n_outputs,
                   output_used(ctx, 1) or output_used(ctx, 2), False, (declared_dtype(ctx, 1), declared_dtype(ctx, 2)), int(stash_type))


def bind_skip_simplified(ctx, epsilon=1e-12) -> RowNorm:
    """``(input, skip, gamma[, bias]) -> (output[, mean, inv_std_var, input_skip_bias_sum])``."""
    return RowNorm("SkipSimplifiedLayerNormalization", True, True, -1, float(epsilon), ctx.n_outputs,
                   output_used(ctx, 1) or output_used(ctx, 2), output_used(ctx, 3), (), 1)


def bind_skip_layer_norm(ctx, epsilon=1e-12) -> RowNorm:
    """``(input, skip, gamma[, beta][, bias]) -> (output[, mean, inv_std_var, input_skip_bias_sum])``."""
    return RowNorm("SkipLayerNormalization", False, True, -1, float(epsilon), ctx.n_outputs,
                   output_used(ctx, 1) or output_used(ctx, 2), output_used(ctx, 3), (), 1)


# The error codes of ``row_geometry``: (exception class name, message), written once for every implementation.
NORM_ERRORS = {
    1: ("ShapeMismatchError", "input must be 2-d or 3-d"),
    2: ("ShapeMismatchError", "scale must have as many elements as the normalized extent"),
    3: ("ShapeMismatchError", "beta must have as many elements as the normalized extent"),
    4: ("ShapeMismatchError", "bias must have as many elements as the normalized extent"),
    5: ("ShapeMismatchError", "skip does not match input (its trailing dims must be input's, its leading "
                              "ones 1 or input's)"),
}


@njit(**_OPTS)
def row_geometry(xshape, ax, scale_size, beta_size, bias_size, skip_shape, skip):
    """``(rows, n, skip_rows, error code)`` of a row norm over axes ``ax``.. of ``xshape`` (``ax`` already in
    range); ``beta_size``/``bias_size`` are -1 for an absent operand, ``skip_shape`` is read when ``skip``."""
    rank = len(xshape)
    rows = 1
    n = 1
    for d in range(rank):
        if d < ax:
            rows *= xshape[d]
        else:
            n *= xshape[d]
    if skip and (rank < 2 or rank > 3):
        return rows, n, 1, 1
    if scale_size != n:
        return rows, n, 1, 2
    if beta_size >= 0 and beta_size != n:
        return rows, n, 1, 3
    if bias_size >= 0 and bias_size != n:
        return rows, n, 1, 4
    skip_rows = 1
    if skip:
        k = len(skip_shape)
        lead = 0
        while lead < k - 1 and skip_shape[lead] == 1:
            lead += 1
        if k - lead > rank:
            return rows, n, 1, 5
        size = 1
        for j in range(k - lead):
            if skip_shape[k - 1 - j] != xshape[rank - 1 - j]:
                return rows, n, 1, 5
            size *= skip_shape[k - 1 - j]
        skip_rows = size // n if n else 1
    return rows, n, skip_rows, 0


@njit(**_OPTS)
def row_norm(x, skip, scale, beta, bias, y, ax, eps, simplified, has_skip, has_beta, has_bias, want_stats, mlas):
    """One row-norm node on contiguous arrays of one float dtype, ``y`` of x's shape given: checks, then the
    kernels (``mlas``: see ``_row``).  Returns ``(error code, input_skip_bias_sum (rows, n), mean, inv_std_var)`` (float64 statistics,
    empty unless ``want_stats``; the sum is empty without a skip)."""
    rows, n, skip_rows, err = row_geometry(x.shape, ax, scale.size, beta.size if has_beta else -1,
                                           bias.size if has_bias else -1, skip.shape, has_skip)
    m = np.zeros(rows if want_stats else 0)
    inv = np.zeros(rows if want_stats else 0)
    if err:
        return err, np.empty((0, n), x.dtype), m, inv
    x2 = x.reshape((rows, n))
    if has_skip:
        sk = skip.reshape((skip_rows, n))
        ssum = np.empty((rows, n), x.dtype)
    else:
        sk = np.empty((0, n), x.dtype)
        ssum = sk
    be = beta.reshape((n,)) if has_beta else np.empty(0, x.dtype)
    bi = bias.reshape((n,)) if has_bias and has_skip else np.empty(0, x.dtype)
    if x.size >= _PARALLEL_MIN and rows > 1:
        _rows_par(x2, sk, bi, ssum, scale.reshape((n,)), be, y.reshape((rows, n)), m, inv, eps, simplified, mlas)
    elif x.size:
        _rows(x2, sk, bi, ssum, scale.reshape((n,)), be, y.reshape((rows, n)), m, inv, eps, simplified, mlas)
    return 0, ssum, m, inv


def mlas_order(b: RowNorm, dt) -> bool:
    """Whether a row norm over inputs of dtype ``dt`` runs in MLAS's AVX2 layer-norm order: onnxruntime takes that
    kernel for float32 LayerNormalization and SimplifiedLayerNormalization on x86 hosts with AVX2 (its skip norms
    and other dtypes keep the plain loop of ``_norm_row``)."""
    return _simd.AVX2 and not b.skip and np.dtype(dt) == F32


def raise_norm_error(b: RowNorm, code: int):
    raise_coded(NORM_ERRORS, code, b.op)


def _flat(p, cdt):
    return np.ascontiguousarray(p, dtype=cdt).reshape(-1)


def _cpu(b: RowNorm, ctx):
    """The CPU wrapper: dtype conversions around ``row_norm`` (16-bit floats are computed in float32), the
    output buffer from the arena, and the outputs the node declares."""
    buf = ctx.out[0] if ctx.out else None

    def run(*args):
        x, skip, scale, beta, bias = b.operands(args)
        _check_float(b.op, x)
        ax = norm_axis(b.axis, x.ndim)
        cdt = _cdt(x.dtype)
        xc = x if x.dtype == cdt and x.flags.c_contiguous else np.ascontiguousarray(x, dtype=cdt)
        if xc.ndim == 0:
            xc = xc.reshape(1)
        if b.simplified and not b.skip:
            ydt = scale.dtype if scale.dtype.kind == "f" or lowp(scale.dtype) else x.dtype
        else:
            ydt = x.dtype
        y = out_buffer(buf, x.shape, ydt) if ydt == cdt else np.empty(x.shape, cdt)
        sk = xc if skip is None else (skip if skip.dtype == cdt and skip.flags.c_contiguous
                                      else np.ascontiguousarray(skip, dtype=cdt))
        err, ssum, m, inv = row_norm(xc, sk, _flat(scale, cdt), EMPTY_OF[cdt] if beta is None else _flat(beta, cdt),
                                     EMPTY_OF[cdt] if bias is None else _flat(bias, cdt), y.reshape(xc.shape), ax,
                                     b.eps, b.simplified, skip is not None, beta is not None, bias is not None,
                                     b.want_stats, mlas_order(b, x.dtype))
        if err:
            raise_norm_error(b, err)
        if y.dtype != ydt:
            y = y.astype(ydt)
        if b.n_outputs == 1:
            return y
        ss = x.shape[:ax] + (1,) * (x.ndim - ax)
        outs = [y]
        for k in range(1, b.stat_index() + 1):  # (mean,) inv_std_var; the simplified norms' mean is zeros
            sdt = b.stat_dtype(k, x.dtype)
            is_inv = k == b.stat_index()
            if b.want_stats and (is_inv or not b.simplified):
                outs.append((inv if is_inv else m).astype(sdt).reshape(ss))
            else:
                outs.append(np.zeros(ss, sdt))
        if b.skip:
            outs.append(ssum.astype(x.dtype, copy=False).reshape(x.shape) if b.want_sum
                        else np.zeros(x.shape, x.dtype))
        return tuple(outs[:b.n_outputs])
    return run


def _form(e, b: RowNorm):
    """The region form: float32 operands, ``row_norm`` called on them, its codes raised as the wrapper raises
    them, the statistics cast and shaped as the wrapper does."""
    n_in = 2 + (2 if b.skip else 0) + (0 if b.simplified else 1)
    float_only(e, *range(n_in))
    r = e.rank(0)
    if r < 1 or any(e.used(k) and b.stat_dtype(k, F32) != F32 for k in range(1, min(len(e.node.outputs), 3))):
        raise Decline("rank or statistics dtype")
    ax = norm_axis(b.axis, r)
    ins = [f"{{i{k}}}" if e.has(k) else None for k in range(5)]
    x, skip, scale, beta, bias = b.operands(ins)
    empty = "np.empty(0, np.float32)"
    k = e.use(__name__, "row_norm")
    e.line(f"{{o0}} = np.empty({x}.shape, np.float32)",
           f"{{p}}_err, {{p}}_ss, {{p}}_m, {{p}}_inv = {k}({x}, {skip or x}, {scale}.reshape(({scale}.size,)), "
           f"{beta or empty}, {bias or empty}, {{o0}}, {ax}, {b.eps!r}, {b.simplified}, {skip is not None}, "
           f"{beta is not None}, {bias is not None}, {b.want_stats}, {mlas_order(b, F32)})")
    raise_on(e, "{p}_err", [(c, cls, msg) for c, (cls, msg) in NORM_ERRORS.items()])
    e.declare(0, F32, r)
    stat = "(" + "".join(f"{x}.shape[{d}], " for d in range(ax)) + "1, " * (r - ax) + ")"
    for j in range(1, b.stat_index() + 1):
        if e.used(j):
            src = "{p}_inv" if j == b.stat_index() else ("{p}_m" if not b.simplified else None)
            e.line(f"{{o{j}}} = {src}.astype(np.float32).reshape({stat})" if src and b.want_stats
                   else f"{{o{j}}} = np.zeros({stat}, np.float32)")
            e.declare(j, F32, r)
    if b.skip and e.used(3):
        e.line(f"{{o3}} = {{p}}_ss.reshape({x}.shape)")
        e.declare(3, F32, r)


for _dom in ("", MS):
    op("SimplifiedLayerNormalization", 1, domain=_dom, bind=bind_simplified, writes_out=True)(_cpu)
    form("SimplifiedLayerNormalization", domain=_dom, bind=bind_simplified)(_form)
op("LayerNormalization", 1, bind=bind_layer_norm, writes_out=True)(_cpu)
op("SkipSimplifiedLayerNormalization", 1, domain=MS, bind=bind_skip_simplified, writes_out=True)(_cpu)
form("SkipSimplifiedLayerNormalization", domain=MS, bind=bind_skip_simplified)(_form)
op("SkipLayerNormalization", 1, domain=MS, bind=bind_skip_layer_norm, writes_out=True)(_cpu)


# -- GatedRMSNorm: the contract ---------------------------------------------------------------------

class GatedNorm(NamedTuple):
    """A GatedRMSNorm node bound at plan time: ``x * rsqrt(mean(x^2) + eps) * scale * act(gate)`` per group of
    C = scale length along the last axis."""

    eps: float
    sigmoid: bool         # act: sigmoid, else silu


def bind_gated_rms(ctx, activation="silu", epsilon=1e-5) -> GatedNorm:
    act = activation.decode() if isinstance(activation, bytes) else str(activation)
    if act not in ("silu", "swish", "sigmoid"):
        raise InvalidAttributeError(f"GatedRMSNorm: activation must be 'silu', 'swish' or 'sigmoid', got {act!r}")
    return GatedNorm(float(epsilon), act == "sigmoid")


GATED_ERRORS = {
    1: ("ShapeMismatchError", "the last axis of X must be a multiple of the scale length"),
    2: ("ShapeMismatchError", "gate must have the shape of X"),
}


def gated_geometry(x, scale, gate) -> int:
    """The rows of C the node normalizes, after the checks every implementation makes (host or device
    arrays)."""
    C = int(scale.size)
    shape = tuple(x.shape)
    if not shape or C == 0 or shape[-1] % C:
        raise_coded(GATED_ERRORS, 1, "GatedRMSNorm", f": X {list(shape)}, scale length {C}")
    if tuple(gate.shape) != shape:
        raise_coded(GATED_ERRORS, 2, "GatedRMSNorm", f" {list(shape)}, got {list(gate.shape)}")
    return int(x.size) // C


@njit(**_OPTS)
def gated_rms(x, scale, gate, eps, sigmoid, ort):
    """The driver, on float32 arrays of X's rank: ``(error code, y flat)``; ``ort``: onnxruntime's order
    (``_gated_rows_ort``)."""
    C = scale.size
    n = x.shape[x.ndim - 1]
    if C == 0 or n % C:
        return 1, np.empty(0, np.float32)
    if gate.shape != x.shape:
        return 2, np.empty(0, np.float32)
    rows = x.size // C
    y = np.empty((rows, C), np.float32)
    if x.size:
        xs, gs, sc, mode = x.reshape((rows, C)), gate.reshape((rows, C)), scale.reshape((C,)), 1 if sigmoid else 0
        if ort:
            _gated_rows_ort(xs, gs, sc, y, eps, mode)
        elif x.size >= _PARALLEL_MIN:
            _gated_rows_par(xs, gs, sc, y, eps, mode)
        else:
            _gated_rows(xs, gs, sc, y, eps, mode)
    return 0, y.reshape((x.size,))


def _gated_cpu(g: GatedNorm, ctx):
    ort = mlas_setting()

    def run(X, scale, gate):
        _check_float("GatedRMSNorm", X)
        gated_geometry(X, scale, gate)
        err, y = gated_rms(np.ascontiguousarray(X, dtype=F32), np.ascontiguousarray(scale, dtype=F32).reshape(-1),
                           np.ascontiguousarray(gate, dtype=F32), g.eps, g.sigmoid, ort)
        if err:
            raise_coded(GATED_ERRORS, err, "GatedRMSNorm")
        return y.reshape(X.shape).astype(X.dtype, copy=False)
    return run


def _gated_form(e, g: GatedNorm):
    float_only(e, 0, 1, 2)
    if e.rank(0) < 1 or e.rank(2) != e.rank(0):
        raise Decline("ranks")
    k = e.use(__name__, "gated_rms")
    e.line(f"{{p}}_err, {{p}}_y = {k}({{i0}}, {{i1}}.reshape(({{i1}}.size,)), {{i2}}, {g.eps!r}, {g.sigmoid}, "
           f"{mlas_setting()})")
    raise_on(e, "{p}_err", [(c, cls, msg) for c, (cls, msg) in GATED_ERRORS.items()])
    e.line("{o0} = {p}_y.reshape({i0}.shape)")


op("GatedRMSNorm", 1, domain=MS, bind=bind_gated_rms)(_gated_cpu)
form("GatedRMSNorm", domain=MS, bind=bind_gated_rms)(_gated_form)


# -- GELU family -----------------------------------------------------------------------------------

class GeluOp(NamedTuple):
    """A com.microsoft GELU-family node bound at plan time."""

    op: str
    mode: int             # GELU_ERF, GELU_TANH or GELU_QUICK
    alpha: float          # QuickGelu's
    has_bias_input: bool  # BiasGelu's B, FastGelu's optional bias


def bind_gelu(ctx) -> GeluOp:
    return GeluOp("Gelu", GELU_ERF, 1.0, False)


def bind_bias_gelu(ctx) -> GeluOp:
    return GeluOp("BiasGelu", GELU_ERF, 1.0, True)


def bind_fast_gelu(ctx) -> GeluOp:
    return GeluOp("FastGelu", GELU_TANH, 1.0, True)


def bind_quick_gelu(ctx, alpha=1.702) -> GeluOp:
    return GeluOp("QuickGelu", GELU_QUICK, float(alpha), False)


GELU_ERRORS = {1: ("ShapeMismatchError", "bias must be 1-d with X's last extent")}


def gelu_check(g: GeluOp, X, bias) -> int:
    """X's last extent (1 for a scalar), after the checks every implementation makes (host or device arrays)."""
    n = tuple(X.shape)[-1] if X.ndim else 1
    if bias is not None and (bias.ndim != 1 or X.ndim == 0 or tuple(bias.shape)[0] != n):
        raise_coded(GELU_ERRORS, 1, g.op, f" ({n}), got shape {list(bias.shape)}")
    return n


@njit(**_OPTS)
def gelu_rows(x, bias, has_bias, mode, alpha):
    """The driver: the activation over x viewed as (rows, n) (n its last extent), a bias of length n added
    first: ``(error code, y of x's shape)``."""
    n = x.shape[x.ndim - 1] if x.ndim else 1
    if has_bias and bias.size != n:
        return 1, np.empty_like(x)
    y = np.empty_like(x)
    if x.size:
        b = bias.reshape((bias.size,)) if has_bias else np.empty(0, x.dtype)
        _gelu(x.reshape((x.size // n, n)), b, y.reshape((x.size // n, n)), mode, alpha)
    return 0, y


def cpu_mode(mode: int) -> int:
    """The CPU kernels' GELU mode: tanh-GELU in onnxruntime's order with ``ONNX_NUMBA_MLAS_ORDER`` (read when a
    node is planned)."""
    return GELU_TANH_MLAS if mode == GELU_TANH and mlas_setting() else mode


def _gelu_cpu(g: GeluOp, ctx):
    mode = cpu_mode(g.mode)

    def run(X, bias=None):
        _check_float(g.op, X)
        gelu_check(g, X, bias)
        cdt = _cdt(X.dtype)
        x = np.ascontiguousarray(X, dtype=cdt)
        err, y = gelu_rows(x, x if bias is None else np.ascontiguousarray(bias, dtype=cdt), bias is not None,
                           mode, g.alpha)
        if err:
            raise_coded(GELU_ERRORS, err, g.op)
        return y.astype(X.dtype, copy=False)
    return run


def _gelu_form(e, g: GeluOp):
    float_only(e, 0, 1)
    if e.rank(0) < 1:
        raise Decline("rank")
    k = e.use(__name__, "gelu_rows")
    has = g.has_bias_input and e.has(1)
    e.line(f"{{p}}_err, {{o0}} = {k}({{i0}}, {'{i1}' if has else '{i0}'}, {has}, {cpu_mode(g.mode)}, {g.alpha!r})")
    raise_on(e, "{p}_err", [(c, cls, msg) for c, (cls, msg) in GELU_ERRORS.items()])
    e.declare(0, F32, e.rank(0))


for _name, _bind in (("Gelu", bind_gelu), ("BiasGelu", bind_bias_gelu), ("FastGelu", bind_fast_gelu),
                     ("QuickGelu", bind_quick_gelu)):
    op(_name, 1, domain=MS, bind=_bind)(_gelu_cpu)
    form(_name, domain=MS, bind=_bind)(_gelu_form)
