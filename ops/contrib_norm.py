"""onnxruntime contrib normalization and GELU-family ops.

Ops: SimplifiedLayerNormalization (default domain and com.microsoft), SkipSimplifiedLayerNormalization,
SkipLayerNormalization, LayerNormalization (the contrib form onnxruntime registers in the DEFAULT domain from
opset 1; there is no com.microsoft LayerNormalization), GatedRMSNorm, and the com.microsoft activations
Gelu, BiasGelu, FastGelu, QuickGelu.

Canonical views keep the kernels few: every row norm sees ``(rows, n)`` (skip tensors that broadcast over
the batch are indexed as ``row % skip_rows``), GatedRMSNorm sees ``(rows * groups, C)``, the activations see
``(rows, n)`` with an optional bias of length ``n``.  16-bit floats are computed in float32; statistics
accumulate in float64 (cheap next to the memory traffic, and it matches onnxruntime to the last ulp more
often).  Reductions are compiled with ``FAST`` (reassociation, never nnan/ninf).  These kernels run on every
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

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, lowp, norm_axis, out_buffer
from ._fastmath import FAST, fexp
from .registry import op

_OPTS = dict(cache=True, nogil=True, error_model="numpy")
_PARALLEL_MIN = 1 << 18  # elements
F64 = np.dtype(np.float64)
EMPTY = np.empty(0, F64)
MS = "com.microsoft"


# -- kernels ---------------------------------------------------------------------------------------

@njit(fastmath=FAST, **_OPTS)
def _norm_row(src, r, scale, beta, y, mean_out, inv_out, eps, simplified):
    """Normalize row ``r`` of ``src`` into ``y``: float64 two-pass statistics, affine step in src's dtype."""
    n = src.shape[1]
    mean = 0.0
    if not simplified:
        s = 0.0
        for j in range(n):
            s += src[r, j]
        mean = s / n
    q = 0.0
    for j in range(n):
        d = src[r, j] - mean
        q += d * d
    inv = 1.0 / math.sqrt(q / n + eps)
    if mean_out.shape[0]:
        mean_out[r] = mean
    if inv_out.shape[0]:
        inv_out[r] = inv
    m = src.dtype.type(mean)
    iv = src.dtype.type(inv)
    if beta.shape[0]:
        for j in range(n):
            y[r, j] = (src[r, j] - m) * iv * scale[j] + beta[j]
    else:
        for j in range(n):
            y[r, j] = (src[r, j] - m) * iv * scale[j]


@njit(fastmath=FAST, **_OPTS)
def _skip_row(x, skip, bias, ssum, r):
    """``ssum[r] = x[r] + skip[r % skip_rows] (+ bias)``."""
    n = x.shape[1]
    rs = r % skip.shape[0]
    if bias.shape[0]:
        for j in range(n):
            ssum[r, j] = x[r, j] + skip[rs, j] + bias[j]
    else:
        for j in range(n):
            ssum[r, j] = x[r, j] + skip[rs, j]


@njit(fastmath=FAST, **_OPTS)
def _rows(x, skip, bias, ssum, scale, beta, y, mean_out, inv_out, eps, simplified):
    """Row norms of ``x`` (rows, n), or of ``x + skip (+ bias)`` (kept in ``ssum``) when ``skip`` has rows."""
    if skip.shape[0]:
        for r in range(x.shape[0]):
            _skip_row(x, skip, bias, ssum, r)
            _norm_row(ssum, r, scale, beta, y, mean_out, inv_out, eps, simplified)
    else:
        for r in range(x.shape[0]):
            _norm_row(x, r, scale, beta, y, mean_out, inv_out, eps, simplified)


@njit(parallel=True, fastmath=FAST, **_OPTS)
def _rows_par(x, skip, bias, ssum, scale, beta, y, mean_out, inv_out, eps, simplified):
    if skip.shape[0]:
        for r in prange(x.shape[0]):
            _skip_row(x, skip, bias, ssum, r)
            _norm_row(ssum, r, scale, beta, y, mean_out, inv_out, eps, simplified)
    else:
        for r in prange(x.shape[0]):
            _norm_row(x, r, scale, beta, y, mean_out, inv_out, eps, simplified)


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


@njit(fastmath=FAST, **_OPTS)
def _gated_rows(x, gate, scale, y, eps, act):
    for r in range(x.shape[0]):
        _gated_row(x, gate, r, scale, y, eps, act)


@njit(parallel=True, fastmath=FAST, **_OPTS)
def _gated_rows_par(x, gate, scale, y, eps, act):
    for r in prange(x.shape[0]):
        _gated_row(x, gate, r, scale, y, eps, act)


GELU_ERF, GELU_TANH, GELU_QUICK = 0, 1, 2


@njit(**_OPTS)
def _gelu(x, bias, y, mode, alpha):
    """GELU family over (rows, n) with an optional bias of length n added first."""
    rows, n = x.shape
    one = x.dtype.type(1.0)
    half = x.dtype.type(0.5)
    rs2 = x.dtype.type(1.0 / math.sqrt(2.0))
    c0 = x.dtype.type(0.7978845608028654)
    c1 = x.dtype.type(0.044715 * 0.7978845608028654)
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
                y[r, j] = half * v * (one + math.tanh(v * (c0 + c1 * v * v)))
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


def _stat_dtype(ctx, k, stash_type, x_dtype):
    vi = ctx.output_types[k] if len(ctx.output_types) > k else None
    if vi is not None and getattr(vi, "dtype", None) is not None:
        return np.dtype(vi.dtype)
    return F32 if stash_type == 1 else np.dtype(x_dtype)


def _used(ctx, k) -> bool:
    used = ctx.outputs_used
    return ctx.n_outputs > k and (not used or len(used) <= k or bool(used[k]))


def _run(name, x, skip, bias, scale, beta, axis, eps, simplified, ydt, ybuf, want_sum, want_stats):
    """The shared driver: returns (y, ssum or None, mean64 or None, inv64 or None, stat_shape)."""
    _check_float(name, x)
    ax = norm_axis(axis, x.ndim)
    rows = math.prod(x.shape[:ax])
    n = math.prod(x.shape[ax:])
    cdt = _cdt(x.dtype)
    xc = (x if x.dtype == cdt and x.flags.c_contiguous else np.ascontiguousarray(x, dtype=cdt)).reshape(rows, n)
    norm_shape = x.shape[ax:]
    sc = _vec(name, "scale", scale, norm_shape, cdt)
    be = _empty(cdt) if beta is None else _vec(name, "beta", beta, norm_shape, cdt)
    if skip is not None:
        sq = tuple(skip.shape)
        while len(sq) > 1 and sq[0] == 1:
            sq = sq[1:]
        if len(sq) > x.ndim or sq != x.shape[x.ndim - len(sq):] or sq[-1] != n:
            raise ShapeMismatchError(f"{name}: skip of shape {list(skip.shape)} does not match input "
                                     f"{list(x.shape)}")
        sk = (skip if skip.dtype == cdt and skip.flags.c_contiguous
              else np.ascontiguousarray(skip, dtype=cdt)).reshape(-1, n)
        bi = _empty(cdt) if bias is None else _vec(name, "bias", bias, (n,), cdt)
        direct = cdt == x.dtype and want_sum
        ssum = np.empty((rows, n), cdt)
    else:
        sk = _empty(cdt, n)
        bi = _empty(cdt)
        ssum = sk
        direct = False
    y = out_buffer(ybuf, x.shape, ydt) if ydt == cdt else np.empty(x.shape, cdt)
    m64 = np.zeros(rows) if want_stats else EMPTY
    i64 = np.zeros(rows) if want_stats else EMPTY
    if x.size:
        kern = _rows_par if x.size >= _PARALLEL_MIN and rows > 1 else _rows
        kern(xc, sk, bi, ssum, sc, be, y.reshape(rows, n), m64, i64, float(eps), simplified)
    if y.dtype != ydt:
        y = y.astype(ydt)
    s = None
    if want_sum and skip is not None:
        s = (ssum if direct else ssum.astype(x.dtype)).reshape(x.shape)
    stat_shape = x.shape[:ax] + (1,) * (x.ndim - ax)
    return y, s, (m64 if want_stats else None), (i64 if want_stats else None), stat_shape


# -- row norms -------------------------------------------------------------------------------------

def _simplified_factory(ctx, axis=-1, epsilon=1e-5, stash_type=1):
    buf = ctx.out[0] if ctx.out else None
    want_inv = _used(ctx, 1)

    def run(X, scale):
        ydt = scale.dtype if scale.dtype.kind == "f" or lowp(scale.dtype) else X.dtype
        y, _, _, inv, ss = _run("SimplifiedLayerNormalization", X, None, None, scale, None, axis, epsilon, True,
                                ydt, buf, False, want_inv)
        if ctx.n_outputs == 1:
            return y
        inv = inv.astype(_stat_dtype(ctx, 1, stash_type, X.dtype)).reshape(ss) if want_inv \
            else np.zeros(ss, _stat_dtype(ctx, 1, stash_type, X.dtype))
        return y, inv
    return run


op("SimplifiedLayerNormalization", 1, factory=True)(_simplified_factory)
op("SimplifiedLayerNormalization", 1, domain=MS, factory=True)(_simplified_factory)


@op("LayerNormalization", 1, factory=True)
def LayerNormalization_contrib(ctx, axis=-1, epsilon=1e-5, stash_type=1):
    """onnxruntime's pre-opset-17 contrib LayerNormalization (same semantics as the opset-17 op)."""
    buf = ctx.out[0] if ctx.out else None
    want = _used(ctx, 1) or _used(ctx, 2)

    def run(X, Scale, B=None):
        y, _, m, inv, ss = _run("LayerNormalization", X, None, None, Scale, B, axis, epsilon, False, X.dtype, buf,
                                False, want)
        if ctx.n_outputs == 1:
            return y
        if not want:
            m = inv = np.zeros(int(math.prod(ss)))
        outs = (y, m.astype(_stat_dtype(ctx, 1, stash_type, X.dtype)).reshape(ss),
                inv.astype(_stat_dtype(ctx, 2, stash_type, X.dtype)).reshape(ss))
        return outs[:ctx.n_outputs]
    return run


def _skip_factory(name, simplified):
    def factory(ctx, epsilon=1e-12):
        buf = ctx.out[0] if ctx.out else None
        want_stats = _used(ctx, 1) or _used(ctx, 2)
        want_sum = _used(ctx, 3)
        n_out = ctx.n_outputs

        def run(input, skip, gamma, *rest):
            if simplified:
                beta, bias = None, (rest[0] if rest else None)
            else:
                beta = rest[0] if rest else None
                bias = rest[1] if len(rest) > 1 else None
            if input.ndim not in (2, 3):
                raise ShapeMismatchError(f"{name}: input must be 2-d or 3-d, got shape {list(input.shape)}")
            y, s, m, inv, ss = _run(name, input, skip, bias, gamma, beta, -1, epsilon, simplified, input.dtype, buf,
                                    want_sum, want_stats)
            if n_out == 1:
                return y
            sdt = F32 if input.dtype != F64 else F64
            if want_stats:
                mean = (np.zeros(ss, sdt) if simplified else m.astype(sdt).reshape(ss))
                inv = inv.astype(sdt).reshape(ss)
            else:
                mean = inv = np.zeros(ss, sdt)
            if s is None:
                s = np.zeros(input.shape, input.dtype)
            return (y, mean, inv, s)[:n_out]
        return run
    return factory


op("SkipSimplifiedLayerNormalization", 1, domain=MS, factory=True)(
    _skip_factory("SkipSimplifiedLayerNormalization", True))
op("SkipLayerNormalization", 1, domain=MS, factory=True)(_skip_factory("SkipLayerNormalization", False))


@op("GatedRMSNorm", 1, domain=MS, factory=True)
def GatedRMSNorm(ctx, activation="silu", epsilon=1e-5):
    act = activation.decode() if isinstance(activation, bytes) else str(activation)
    if act not in ("silu", "swish", "sigmoid"):
        raise InvalidAttributeError(f"GatedRMSNorm: activation must be 'silu', 'swish' or 'sigmoid', got {act!r}")
    mode = 1 if act == "sigmoid" else 0

    def run(X, scale, gate):
        _check_float("GatedRMSNorm", X)
        C = int(np.size(scale))
        if X.ndim < 1 or C == 0 or X.shape[-1] % C:
            raise ShapeMismatchError(f"GatedRMSNorm: the last axis of X {list(X.shape)} must be a multiple of the "
                                     f"scale length {C}")
        if gate.shape != X.shape:
            raise ShapeMismatchError(f"GatedRMSNorm: gate must have X's shape {list(X.shape)}, got "
                                     f"{list(gate.shape)}")
        rows = X.size // C
        x = np.ascontiguousarray(X, dtype=F32).reshape(rows, C)
        g = np.ascontiguousarray(gate, dtype=F32).reshape(rows, C)
        sc = np.ascontiguousarray(scale, dtype=F32).reshape(C)
        y = np.empty((rows, C), F32)
        if X.size:
            kern = _gated_rows_par if X.size >= _PARALLEL_MIN else _gated_rows
            kern(x, g, sc, y, float(epsilon), mode)
        return y.reshape(X.shape).astype(X.dtype, copy=False)
    return run


# -- GELU family -----------------------------------------------------------------------------------

def _gelu_run(name, X, bias, mode, alpha=1.0):
    _check_float(name, X)
    cdt = _cdt(X.dtype)
    n = X.shape[-1] if X.ndim else 1
    if bias is not None:
        if bias.ndim != 1 or X.ndim == 0 or bias.shape[0] != n:
            raise ShapeMismatchError(f"{name}: bias must be 1-d of length {n} (X's last axis), got shape "
                                     f"{list(bias.shape)}")
        b = np.ascontiguousarray(bias, dtype=cdt)
    else:
        b = np.empty(0, cdt)
    rows = X.size // n if n else 0
    x = np.ascontiguousarray(X, dtype=cdt).reshape(rows, n)
    y = np.empty((rows, n), cdt)
    if X.size:
        _gelu(x, b, y, mode, float(alpha))
    return y.reshape(X.shape).astype(X.dtype, copy=False)


@op("Gelu", 1, domain=MS)
def Gelu(X):
    return _gelu_run("Gelu", X, None, GELU_ERF)


@op("BiasGelu", 1, domain=MS)
def BiasGelu(A, B):
    return _gelu_run("BiasGelu", A, B, GELU_ERF)


@op("FastGelu", 1, domain=MS)
def FastGelu(X, bias=None):
    return _gelu_run("FastGelu", X, bias, GELU_TANH)


@op("QuickGelu", 1, domain=MS)
def QuickGelu(X, *, alpha=1.702):
    return _gelu_run("QuickGelu", X, None, GELU_QUICK, alpha)
