"""Normalization ops: LayerNormalization, RMSNormalization, MeanVarianceNormalization, LpNormalization,
BatchNormalization, InstanceNormalization, GroupNormalization, LRN.

Canonical views keep the kernels few: row ops (LayerNorm, RMSNorm, MVN) see
``(rows, n)``; channel ops (Batch/Instance/Group norm, LRN) see ``(N, C, S)``;
LpNormalization sees ``(outer, n, inner)``.  Statistics accumulate in
float64 with a two-pass mean/variance; 16-bit floats are computed in
float32.  Scale, bias and running statistics are small, so wrappers convert
them to contiguous vectors (broadcast to the normalized extent): float64 for
the channel ops, the compute dtype for the row ops, whose affine step runs in
the input dtype.  Large row ops use a ``parallel=True`` kernel over rows.
Reduction kernels are compiled with ``FAST`` (reassociation and contraction,
never nnan/ninf) so their sums vectorize.

LayerNormalization (opset 17) and LpNormalization are written to the one op contract (``ops/registry.py``):
one bind each (``bind_layer_norm17``, ``bind_lp``: the attributes with their defaults, the plan-time checks)
returns the record (``LayerNorm``, ``LpNorm``) that the CPU wrapper here, LpNormalization's region form here
and the CUDA launches (``ops/cuda/norm.py``) all read; ``row_view`` and ``lp_view`` are the one geometry (and
axis check) of both providers.  (The contrib LayerNormalization onnxruntime registers from opset 1 is
``ops.contrib_norm``'s: scale of exactly the normalized size, its own kernels.)
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, as_int_list, lowp, mlas_order, norm_axes, norm_axis, out_buffer
from ._fastmath import FAST
from .forms import Decline, float_only, form, product_expr
from .reduce import canon3
from .registry import op

_OPTS = dict(cache=True, nogil=True, error_model="numpy")
_PARALLEL_MIN = 1 << 18  # elements
F64 = np.dtype(np.float64)
LAYER, RMS, MVN = 0, 1, 2
EMPTY = np.empty(0, F64)


# -- kernels ---------------------------------------------------------------------------------------

@njit(fastmath=FAST, **_OPTS)
def row_stats(x, r, centered):
    """(mean, sum of squared deviations from it) of row ``r`` of ``x`` (rows, n): float64, two passes
    (vectorized by reassociation).  Without ``centered`` (RMS norms) the mean is 0 and not computed."""
    n = x.shape[1]
    mean = 0.0
    if centered:
        s = 0.0
        for j in range(n):
            s += x[r, j]
        mean = s / n
    q = 0.0
    for j in range(n):
        d = x[r, j] - mean
        q += d * d
    return mean, q


@njit(fastmath=FAST, **_OPTS)
def put_stats(x, r, mean, inv, mean_out, inv_out):
    """Store row ``r``'s mean and inverse deviation in the statistics outputs that are wanted (non-empty); return
    both in ``x``'s dtype, for the affine step."""
    if mean_out.shape[0]:
        mean_out[r] = mean
    if inv_out.shape[0]:
        inv_out[r] = inv
    return x.dtype.type(mean), x.dtype.type(inv)


@njit(fastmath=FAST, **_OPTS)
def _norm_row(x, r, scale, bias, y, mean_out, inv_out, eps, mode):
    """Normalize row ``r``: ``row_stats``, then the affine step in the input dtype (``scale``/``bias`` have
    the input dtype)."""
    n = x.shape[1]
    mean, q = row_stats(x, r, mode != RMS)
    var = q / n
    if math.isinf(x.dtype.type(var)):  # past the input type's range: onnxruntime's float32 statistics overflow
        var = math.inf
    if mode == MVN:
        inv = 1.0 / (math.sqrt(var) + eps)
    else:
        inv = 1.0 / math.sqrt(var + eps)
    m, iv = put_stats(x, r, mean, inv, mean_out, inv_out)
    if scale.shape[0] and bias.shape[0]:
        for j in range(n):
            y[r, j] = (x[r, j] - m) * (iv * scale[j]) + bias[j]
    elif scale.shape[0]:
        for j in range(n):
            y[r, j] = (x[r, j] - m) * (iv * scale[j])
    else:
        for j in range(n):
            y[r, j] = (x[r, j] - m) * iv


@njit(fastmath=FAST, **_OPTS)
def _norm_rows(x, scale, bias, y, mean_out, inv_out, eps, mode):
    """Normalize each row of ``x`` (rows, n) into ``y``; empty ``scale``/``bias``/stat outputs are skipped."""
    for r in range(x.shape[0]):
        _norm_row(x, r, scale, bias, y, mean_out, inv_out, eps, mode)


@njit(parallel=True, fastmath=FAST, **_OPTS)
def _norm_rows_par(x, scale, bias, y, mean_out, inv_out, eps, mode):
    for r in prange(x.shape[0]):
        _norm_row(x, r, scale, bias, y, mean_out, inv_out, eps, mode)


@njit(fastmath=FAST, **_OPTS)
def _affine_chan(x, a, b, y):
    """``y[n, c, s] = x[n, c, s] * a[c] + b[c]`` for (N, C, S) views."""
    N, C, S = x.shape
    for n in range(N):
        for c in range(C):
            ac = a[c]
            bc = b[c]
            for s in range(S):
                y[n, c, s] = x[n, c, s] * ac + bc


@njit(fastmath=FAST, **_OPTS)
def _chan_stats(x, mean, var):
    """Population mean and variance of each channel of ``x`` (N, C, S) over N and S."""
    N, C, S = x.shape
    cnt = N * S
    for c in range(C):
        s = 0.0
        for n in range(N):
            for j in range(S):
                s += x[n, c, j]
        m = s / cnt
        q = 0.0
        for n in range(N):
            for j in range(S):
                d = x[n, c, j] - m
                q += d * d
        mean[c] = m
        var[c] = q / cnt


@njit(fastmath=FAST, **_OPTS)
def _group_norm(x, scale, bias, y, eps, groups):
    """Normalize ``x`` (N, C, S) over each (sample, group of C/groups channels); per-channel affine."""
    N, C, S = x.shape
    cpg = C // groups
    cnt = cpg * S
    for n in range(N):
        for g in range(groups):
            c0 = g * cpg
            s = 0.0
            for c in range(c0, c0 + cpg):
                for j in range(S):
                    s += x[n, c, j]
            m = s / cnt
            q = 0.0
            for c in range(c0, c0 + cpg):
                for j in range(S):
                    d = x[n, c, j] - m
                    q += d * d
            inv = 1.0 / math.sqrt(q / cnt + eps)
            for c in range(c0, c0 + cpg):
                a = inv * scale[c]
                b = bias[c] - m * a
                for j in range(S):
                    y[n, c, j] = x[n, c, j] * a + b


@njit(**_OPTS)
def _lrn(x, y, alpha, beta, bias, size):
    """Local response normalization across channels of ``x`` (N, C, S)."""
    N, C, S = x.shape
    lo = (size - 1) // 2
    hi = size - 1 - lo
    sq = np.empty(S, np.float64)
    k = alpha / size
    for n in range(N):
        for c in range(C):
            for j in range(S):
                sq[j] = 0.0
            for cc in range(max(0, c - lo), min(C, c + hi + 1)):
                for j in range(S):
                    v = x[n, cc, j]
                    sq[j] += v * v
            for j in range(S):
                y[n, c, j] = x[n, c, j] / (bias + k * sq[j]) ** beta


@njit(**_OPTS)
def _lp3(x, y, p, acc):
    """``y = x / ||x||_p`` along axis 1 of (outer, n, inner) views (0 where the norm is 0); ``acc``: (inner,),
    whose dtype the sums, the square root and the divisions take: float64 by default; float32 under
    ``ONNX_NUMBA_MLAS_ORDER=1`` for float32 inputs, onnxruntime's order (Eigen's ``lpNorm`` over a strided row:
    ``|x|`` or ``x * x`` summed one after the other in float32, ``sqrtf``, then ``x / norm``)."""
    outer, n, inner = x.shape
    for o in range(outer):
        for i in range(inner):
            acc[i] = 0.0
        for k in range(n):
            for i in range(inner):
                v = x[o, k, i]
                acc[i] += abs(v) if p == 1 else v * v
        if p == 2:
            for i in range(inner):
                acc[i] = math.sqrt(acc[i])
        for k in range(n):
            for i in range(inner):
                y[o, k, i] = x[o, k, i] / acc[i] if acc[i] != 0 else 0.0


# -- helpers ---------------------------------------------------------------------------------------

def _check_float(name, x):
    if x.dtype.kind != "f" and not lowp(x.dtype):
        raise InvalidArgumentError(f"{name} expects a floating-point input, got {x.dtype}")


def _compute(x):
    """(array to compute on, dtype to return): 16-bit floats go through float32."""
    return (x.astype(F32), x.dtype) if lowp(x.dtype) else (x, x.dtype)


def _vec(name, what, p, shape) -> np.ndarray:
    """``p`` broadcast to ``shape`` as a flat contiguous float64 vector."""
    try:
        b = np.broadcast_to(np.asarray(p, F64), shape)
    except ValueError:
        raise ShapeMismatchError(f"{name}: {what} of shape {list(np.shape(p))} does not broadcast to "
                                 f"{list(shape)}") from None
    return np.ascontiguousarray(b).reshape(-1)


def _chan(name, what, p, C) -> np.ndarray:
    v = np.asarray(p, F64).reshape(-1)
    if v.size == 1 and C != 1:
        v = np.full(C, v[0])
    if v.size != C:
        raise ShapeMismatchError(f"{name}: {what} must have {C} elements (one per channel), got shape "
                                 f"{list(np.shape(p))}")
    return v


def _ncs(x) -> tuple:
    if x.ndim < 2:
        raise ShapeMismatchError(f"expected an input of rank >= 2 (N, C, ...), got shape {list(x.shape)}")
    return x.shape[0], x.shape[1], int(math.prod(x.shape[2:]))


def declared_dtype(ctx, k):
    """The dtype the graph declares for output ``k`` of the node, or None."""
    vi = ctx.output_types[k] if len(ctx.output_types) > k else None
    dt = getattr(vi, "dtype", None) if vi is not None else None
    return None if dt is None else np.dtype(dt)


def output_used(ctx, k) -> bool:
    """Output ``k`` exists and is read (every output counts as read when the context does not say)."""
    used = ctx.outputs_used
    return ctx.n_outputs > k and (not used or len(used) <= k or bool(used[k]))


def row_view(shape, axis) -> tuple:
    """``(ax, rows, n, stat_shape)`` of a row norm over axes ``axis``.. of ``shape``: the first normalized axis
    (checked to be in range), the canonical ``(rows, n)`` view, and the statistics' shape
    ``shape[:ax] + (1,) * (rank - ax)``."""
    shape = tuple(shape)
    ax = norm_axis(axis, len(shape))
    return ax, int(math.prod(shape[:ax])), int(math.prod(shape[ax:])), shape[:ax] + (1,) * (len(shape) - ax)


def _run_rows(name, x, axis, scale, bias, eps, mode, buf=None, stat_dtypes=None):
    """Row normalization over axes ``axis..`` of ``x``; returns (y, mean, inv) (stats None unless asked)."""
    _check_float(name, x)
    ax, rows, n, stat_shape = row_view(x.shape, axis)
    xc, dt = _compute(x)
    norm_shape = x.shape[ax:]
    # Scale and bias in the compute dtype: the affine step runs in it (one specialization per dtype).
    cdt = xc.dtype
    sc = np.empty(0, cdt) if scale is None else _vec(name, "scale", scale, norm_shape).astype(cdt)
    bi = np.empty(0, cdt) if bias is None else _vec(name, "bias", bias, norm_shape).astype(cdt)
    y = out_buffer(buf, x.shape, dt) if xc is x else np.empty(x.shape, xc.dtype)
    # Statistics are produced in float64 (one kernel specialization per input dtype) and cast after.
    m64 = np.full(rows, np.nan) if stat_dtypes is not None else EMPTY
    i64 = np.full(rows, np.nan) if stat_dtypes is not None else EMPTY
    if x.size:
        kern = _norm_rows_par if x.size >= _PARALLEL_MIN and rows > 1 else _norm_rows
        kern(xc.reshape(rows, n), sc, bi, y.reshape(rows, n), m64, i64, float(eps), mode)
    mean = inv = None
    if stat_dtypes is not None:
        mean = m64.astype(stat_dtypes[0]).reshape(stat_shape)
        inv = i64.astype(stat_dtypes[1]).reshape(stat_shape)
    if y.dtype != dt:
        y = y.astype(dt)
    return y, mean, inv


# -- row ops ---------------------------------------------------------------------------------------

class LayerNorm(NamedTuple):
    """A LayerNormalization (opset 17) node bound at plan time: ``(X, Scale[, B]) -> (Y[, Mean, InvStdDev])``
    over axes ``axis``.., Scale and B broadcast to the normalized shape."""

    axis: int             # the first normalized axis, as given (negative counts from the end)
    eps: float
    n_outputs: int
    want_stats: bool      # Mean or InvStdDev is read
    stat_types: tuple     # (Mean, InvStdDev): the dtype the graph declares, or None
    stash_type: int

    def stat_dtypes(self, x_dtype) -> tuple:
        """The dtypes of (Mean, InvStdDev) for an input of ``x_dtype``: the declared ones, else float32
        (``stash_type`` 1) or the input's."""
        rule = F32 if self.stash_type == 1 else np.dtype(x_dtype)
        return tuple(rule if d is None else d for d in self.stat_types)


def bind_layer_norm17(ctx, axis=-1, epsilon=1e-5, stash_type=1) -> LayerNorm:
    return LayerNorm(int(axis), float(epsilon), ctx.n_outputs, output_used(ctx, 1) or output_used(ctx, 2),
                     (declared_dtype(ctx, 1), declared_dtype(ctx, 2)), int(stash_type))


def layer_norm_cpu(b: LayerNorm, ctx):
    """LayerNormalization (opset 17) on the CPU; the statistics outputs are None when nothing reads them."""
    buf = ctx.out[0] if ctx.out else None

    def run(X, Scale, B=None):
        sd = b.stat_dtypes(X.dtype) if b.want_stats else None
        if X.dtype == F32 and X.ndim and Scale.dtype == F32 and (B is None or B.dtype == F32):
            ax, rows, n, stat_shape = row_view(X.shape, b.axis)
            if Scale.size == n and (B is None or B.size == n) and _mlas_rows(n):
                return _ort_rows(b, X, Scale, B, ax, stat_shape, sd, buf)
        y, mean, inv = _run_rows("LayerNormalization", X, b.axis, Scale, B, b.eps, LAYER, buf, sd)
        if b.n_outputs == 1:
            return y
        return (y, mean, inv)[:b.n_outputs]
    return run


def _mlas_rows(n) -> bool:
    """Whether onnxruntime runs MLAS's AVX2 layer-norm kernel on rows of ``n``: hosts with AVX2, 16 and more."""
    from . import contrib_norm as cn
    return bool(cn._simd.AVX2) and n >= cn.MLAS_NORM_MIN


def _ort_rows(b: LayerNorm, X, Scale, B, ax, stat_shape, sd, buf):
    """float32 LayerNormalization with a scale (and bias) of the normalized size where ``_mlas_rows``: MLAS's
    kernel order (``ops.contrib_norm._mlas_norm_row``), onnxruntime's bits.  Other rows keep ``_run_rows`` (float64
    statistics), within float rounding of onnxruntime's."""
    from . import contrib_norm as cn
    x = np.ascontiguousarray(X)
    y = out_buffer(buf, X.shape, F32)
    flat = lambda v: np.ascontiguousarray(v, dtype=F32).reshape(-1)  # noqa: E731
    empty = np.empty(0, F32)
    err, _, m, inv = cn.row_norm(x, x, flat(Scale), empty if B is None else flat(B), empty, y.reshape(x.shape), ax,
                                 b.eps, False, False, B is not None, False, sd is not None, bool(cn._simd.AVX2))
    if err:  # the geometry was checked by the caller; a code here is a defect, reported as the kernels word it
        cn.raise_coded(cn.NORM_ERRORS, err, "LayerNormalization")
    if b.n_outputs == 1:
        return y
    mean = m.astype(sd[0]).reshape(stat_shape) if sd is not None else None
    iv = inv.astype(sd[1]).reshape(stat_shape) if sd is not None else None
    return (y, mean, iv)[:b.n_outputs]


op("LayerNormalization", 17, bind=bind_layer_norm17, writes_out=True)(layer_norm_cpu)


@op("RMSNormalization", 23, factory=True)
def RMSNormalization(ctx, axis=-1, epsilon=1e-5, stash_type=1):
    buf = ctx.out[0] if ctx.out else None

    def run(X, scale):
        return _run_rows("RMSNormalization", X, axis, scale, None, epsilon, RMS, buf)[0]
    return run


def _mvn_factory(ctx, axes=(0, 2, 3)):
    def run(X):
        _check_float("MeanVarianceNormalization", X)
        red = norm_axes(as_int_list(axes), X.ndim)
        (outer, n, inner), perm = canon3(X.shape, red)
        if perm is None and inner == 1:
            return _run_rows("MeanVarianceNormalization", X.reshape(outer, n), 1, None, None, 1e-9, MVN)[0] \
                .reshape(X.shape)
        kept = [a for a in range(X.ndim) if a not in red]
        perm = tuple(kept) + red
        xt = np.ascontiguousarray(X.transpose(perm))
        yt = _run_rows("MeanVarianceNormalization", xt.reshape(-1, n), 1, None, None, 1e-9, MVN)[0]
        return np.ascontiguousarray(yt.reshape(xt.shape).transpose(np.argsort(perm)))
    return run


op("MeanVarianceNormalization", 9, factory=True)(_mvn_factory)
op("MeanVarianceNormalization", 13, factory=True)(_mvn_factory)


class LpNorm(NamedTuple):
    """An LpNormalization node bound at plan time: ``y = x / ||x||_p`` along ``axis`` (0 where the norm is 0)."""

    axis: int             # as given (negative counts from the end)
    p: int                # 1 or 2


LP_VERSIONS = (1, 22)


def bind_lp(ctx, axis=-1, p=2) -> LpNorm:
    if p not in (1, 2):
        raise InvalidAttributeError(f"LpNormalization: p must be 1 or 2, got {p}")
    return LpNorm(int(axis), int(p))


def lp_view(shape, axis) -> tuple:
    """The ``(outer, n, inner)`` view of an input of ``shape`` normalized along ``axis`` (checked in range)."""
    shape = tuple(shape)
    ax = norm_axis(axis, len(shape))
    return int(math.prod(shape[:ax])), shape[ax], int(math.prod(shape[ax + 1:]))


def lp_accumulator(dtype, ort: bool) -> np.dtype:
    """``_lp3``'s accumulator dtype for an input dtype; ``ort``: ``mlas_order()``, read once per node."""
    return np.dtype(F32) if ort and np.dtype(dtype) == F32 else np.dtype(F64)


def lp_cpu(b: LpNorm, ctx):
    """LpNormalization on the CPU."""
    buf = ctx.out[0] if ctx.out else None
    ort = mlas_order()

    def run(input):
        _check_float("LpNormalization", input)
        shp3 = lp_view(input.shape, b.axis)
        xc, dt = _compute(input)
        y = out_buffer(buf, input.shape, dt) if xc is input else np.empty(input.shape, xc.dtype)
        if input.size:
            _lp3(xc.reshape(shp3), y.reshape(shp3), b.p, np.empty(shp3[2], lp_accumulator(input.dtype, ort)))
        return y.astype(dt) if y.dtype != dt else y
    return run


def _lp_form(e, b: LpNorm):
    """The region form: float32 input of known rank, ``_lp3`` on its (outer, n, inner) view."""
    float_only(e, 0)
    r = e.rank(0)
    if r < 1 or not -r <= b.axis < r:
        raise Decline("rank or axis")
    ax = b.axis + r if b.axis < 0 else b.axis
    k = e.use(__name__, "_lp3")
    outer = product_expr([f"{{i0}}.shape[{d}]" for d in range(ax)])
    inner = product_expr([f"{{i0}}.shape[{d}]" for d in range(ax + 1, r)])
    e.line(f"{{p}}_s = ({outer}, {{i0}}.shape[{ax}], {inner})",
           "{o0} = np.empty({i0}.shape, np.float32)",
           "if {i0}.size:",
           f"    {k}({{i0}}.reshape({{p}}_s), {{o0}}.reshape({{p}}_s), {b.p}, np.empty({{p}}_s[2], "
           f"np.{lp_accumulator(F32, mlas_order()).name}))")


for _v in LP_VERSIONS:
    op("LpNormalization", _v, bind=bind_lp, writes_out=True)(lp_cpu)
    form("LpNormalization", since=_v, bind=bind_lp)(_lp_form)


# -- channel ops -----------------------------------------------------------------------------------

def _bn_factory(ctx, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1, is_test=0, consumed_inputs=None):
    buf = ctx.out[0] if ctx.out else None
    training = bool(training_mode) or (ctx.opset < 14 and ctx.n_outputs > 1 and not is_test)

    def run(X, scale, B, input_mean, input_var):
        _check_float("BatchNormalization", X)
        xc, dt = _compute(X)
        N, C, S = _ncs(X)
        if not spatial:
            C, S = C * S, 1
        params = [_chan("BatchNormalization", w, p, C) if spatial else _vec("BatchNormalization", w, p, X.shape[1:])
                  for w, p in (("scale", scale), ("B", B), ("input_mean", input_mean), ("input_var", input_var))]
        sc, bi, mean, var = params
        x3 = xc.reshape(N, C, S)
        if training:
            cur_mean = np.empty(C, F64)
            cur_var = np.empty(C, F64)
            if X.size:
                _chan_stats(x3, cur_mean, cur_var)
            mean, var = cur_mean, cur_var
        a = sc / np.sqrt(var + epsilon)
        b = bi - mean * a
        y = out_buffer(buf, X.shape, dt) if xc is X else np.empty(X.shape, xc.dtype)
        if X.size:
            _affine_chan(x3, a, b, y.reshape(N, C, S))
        if y.dtype != dt:
            y = y.astype(dt)
        if ctx.n_outputs == 1:
            return y
        mdt = np.asarray(input_mean).dtype
        vdt = np.asarray(input_var).dtype
        shp = np.shape(input_mean)
        run_mean = (np.asarray(input_mean, F64).reshape(-1) * momentum + mean * (1 - momentum)).astype(mdt)
        run_var = (np.asarray(input_var, F64).reshape(-1) * momentum + var * (1 - momentum)).astype(vdt)
        outs = (y, run_mean.reshape(shp), run_var.reshape(shp), mean.astype(mdt).reshape(shp),
                var.astype(vdt).reshape(shp))
        return outs[:ctx.n_outputs]
    return run


for _v in (1, 6, 7, 9, 14, 15):
    op("BatchNormalization", _v, factory=True)(_bn_factory)


def _group_run(name, X, scale, bias, epsilon, groups, buf):
    _check_float(name, X)
    xc, dt = _compute(X)
    N, C, S = _ncs(X)
    if groups <= 0 or C % groups:
        raise InvalidAttributeError(f"{name}: the {C} channels do not split into {groups} equal groups")
    y = out_buffer(buf, X.shape, dt) if xc is X else np.empty(X.shape, xc.dtype)
    if X.size:
        _group_norm(xc.reshape(N, C, S), scale, bias, y.reshape(N, C, S), float(epsilon), groups)
    return y.astype(dt) if y.dtype != dt else y


def _instance_factory(ctx, epsilon=1e-5, consumed_inputs=None):
    buf = ctx.out[0] if ctx.out else None

    def run(input, scale, B):
        C = input.shape[1] if input.ndim >= 2 else 0
        return _group_run("InstanceNormalization", input, _chan("InstanceNormalization", "scale", scale, C),
                          _chan("InstanceNormalization", "B", B, C), epsilon, max(C, 1), buf)
    return run


for _v in (1, 6, 22):
    op("InstanceNormalization", _v, factory=True)(_instance_factory)


def _group_factory(ctx, num_groups, epsilon=1e-5, stash_type=1):
    buf = ctx.out[0] if ctx.out else None
    per_group = ctx.opset < 21

    def run(X, scale, bias):
        C = X.shape[1] if X.ndim >= 2 else 0
        sc = np.asarray(scale, F64).reshape(-1)
        bi = np.asarray(bias, F64).reshape(-1)
        if per_group and sc.size == num_groups and num_groups and C % num_groups == 0:
            sc = np.repeat(sc, C // num_groups)
            bi = np.repeat(bi, C // num_groups)
        sc = _chan("GroupNormalization", "scale", sc, C)
        bi = _chan("GroupNormalization", "bias", bi, C)
        return _group_run("GroupNormalization", X, sc, bi, epsilon, int(num_groups), buf)
    return run


op("GroupNormalization", 18, factory=True)(_group_factory)
op("GroupNormalization", 21, factory=True)(_group_factory)


def _lrn_factory(ctx, size, alpha=0.0001, beta=0.75, bias=1.0):
    if size <= 0:
        raise InvalidAttributeError(f"LRN: size must be positive, got {size}")
    buf = ctx.out[0] if ctx.out else None

    def run(X):
        _check_float("LRN", X)
        xc, dt = _compute(X)
        N, C, S = _ncs(X)
        y = out_buffer(buf, X.shape, dt) if xc is X else np.empty(X.shape, xc.dtype)
        if X.size:
            _lrn(xc.reshape(N, C, S), y.reshape(N, C, S), float(alpha), float(beta), float(bias), int(size))
        return y.astype(dt) if y.dtype != dt else y
    return run


op("LRN", 1, factory=True)(_lrn_factory)
op("LRN", 13, factory=True)(_lrn_factory)
