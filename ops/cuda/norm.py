"""CUDA norms without a contrib twin: LayerNormalization (opset 17), RMSNormalization (23), com.microsoft
GatedRMSNorm, LpNormalization, and the channel norms BatchNormalization (inference), InstanceNormalization,
GroupNormalization and MeanVarianceNormalization; LRN.  (The contrib row norms, and the row kernel LayerNormalization runs, are
``ops/cuda/contrib_norm.py``.)

Each op here is written once, to the one op contract, in its CPU module: these launches are registered with
the CPU wrapper's bind and read its record (``ops.normalization``'s ``LayerNorm`` and ``LpNorm``,
``ops.contrib_norm``'s ``GatedNorm``), and share the CPU's geometry and checks (``row_view``, ``lp_view``,
``gated_geometry``).

LayerNormalization sees the canonical ``(rows, n)`` view (``contrib_norm.launch_rows``: a two-pass mean and
centred variance, like the CPU, then the affine step).  GatedRMSNorm sees ``(rows * groups, C)`` (C = scale
length; the last axis may hold several groups) and multiplies by ``act(gate)`` (silu or sigmoid).
LpNormalization sees ``(outer, n, inner)``, one block per (outer, inner) column; a zero norm gives 0.
The channel norms see ``(N, C, S)``: InstanceNormalization and GroupNormalization run ``_group_rows``, one
block per (sample, group), whose elements are contiguous (two-pass mean and centred variance, then the
per-channel affine); MeanVarianceNormalization moves its reduced axes last and runs the same kernel with one
group and no affine (``1 / (sqrt(var) + 1e-9)``, as the CPU); BatchNormalization folds its four per-channel
inputs into ``a = scale / sqrt(var + eps)``, ``b = B - mean * a`` on the host (float64, as the CPU) and runs one
elementwise pass.  Their per-channel inputs are read on the host (``host_inputs``), checked by the CPU's
``_chan`` and uploaded as float32; BatchNormalization in training mode is refused.

Invariants (match ``ops/normalization.py`` / ``ops/contrib_norm.py``):
- ``Y`` has the input dtype; statistics have shape ``x.shape[:axis] + (1,) * (rank - axis)`` and float32
  dtype (stash_type 1) unless the graph declares another; statistics nothing reads are zeros, not computed;
- LayerNormalization's scale / bias that broadcast to the normalized shape are expanded on the device
  (``shape.broadcast_to``);
- everything is computed in float32 (float64 inputs too); all tensors are device arrays, nothing is read back.
"""
from __future__ import annotations

import math

import numpy as np

from ops.contrib_norm import GatedNorm, bind_gated_rms, gated_geometry
from ops._common import as_int_list, norm_axes
from ops.normalization import (LP_VERSIONS, LayerNorm, LpNorm, _chan, _ncs, bind_layer_norm17, bind_lp, lp_view,
                               row_view)
from ops.reduce import canon3
from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from .contrib_norm import launch_rows, zeros
from ._common import FLOATS, MAX_ROW_THREADS, block_sum, check_device, flat, grid1d, host_array, row_threads
from .shape import broadcast_to, view_copy

__all__ = ["launch_layer_norm", "launch_gated", "launch_lp", "channel_norm", "batch_norm"]

CUDA = "CUDAExecutionProvider"
MS = "com.microsoft"
F32 = np.dtype(np.float32)


# -- kernels ---------------------------------------------------------------------------------------

@jit
def _gated_rows(x, gate, scale, y, C, eps, sigmoid):
    """One block per row of C: y = x * rsqrt(mean(x^2) + eps) * scale * act(gate)."""
    sh = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    base = row * C
    acc = np.float32(0.0)
    for j in range(tid, C, nt):
        v = np.float32(x[base + j])
        acc += v * v
    inv = np.float32(1.0) / math.sqrt(block_sum(sh, tid, nt, acc) / np.float32(C) + eps)
    for j in range(tid, C, nt):
        z = np.float32(gate[base + j])
        s = np.float32(1.0) / (np.float32(1.0) + math.exp(-z))
        if not sigmoid:
            s *= z
        y[base + j] = np.float32(x[base + j]) * inv * np.float32(scale[j]) * s


@jit
def _lp_cols(x, y, n, inner, p):
    """One block per (outer, inner) column of the (outer, n, inner) view: y = x / ||x||_p (0 if the norm is 0)."""
    sh = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    col = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    o = col // inner
    i = col % inner
    base = o * n * inner + i
    acc = np.float32(0.0)
    for k in range(tid, n, nt):
        v = np.float32(x[base + k * inner])
        acc += abs(v) if p == 1 else v * v
    nrm = block_sum(sh, tid, nt, acc)
    if p == 2:
        nrm = math.sqrt(nrm)
    for k in range(tid, n, nt):
        idx = base + k * inner
        y[idx] = np.float32(x[idx]) / nrm if nrm != 0 else np.float32(0.0)


# -- helpers ---------------------------------------------------------------------------------------

def _check_float(name, x):
    if np.dtype(x.dtype) not in FLOATS:
        raise InvalidArgumentError(f"{name} expects a floating-point input, got {x.dtype}")


def _vec(name, what, p, shape):
    """``p`` (a device array) broadcast to ``shape``, flat; no copy when it already has that many elements
    in that shape."""
    shape = tuple(int(s) for s in shape)
    ps = tuple(p.shape)
    while len(ps) > len(shape) and ps[0] == 1:
        ps = ps[1:]
    if ps == shape:
        return flat(p)
    try:
        return flat(broadcast_to(name, p, shape))
    except ShapeMismatchError:
        raise ShapeMismatchError(f"{name}: {what} of shape {list(p.shape)} does not broadcast to "
                                 f"{list(shape)}") from None


# -- LayerNormalization ----------------------------------------------------------------------------

def launch_layer_norm(b: LayerNorm, ctx=None):
    """The CUDA implementation of LayerNormalization (opset 17), its bind ``ops.normalization``'s."""
    name = "LayerNormalization"

    def run(X, Scale, B=None):
        check_device(name, X=X, Scale=Scale, B=B)
        _check_float(name, X)
        shape = tuple(X.shape)
        ax, rows, n, ss = row_view(shape, b.axis)
        sc = _vec(name, "scale", Scale, shape[ax:])
        be = None if B is None else _vec(name, "bias", B, shape[ax:])
        sd = b.stat_dtypes(X.dtype)
        y, _, mean, inv = launch_rows(X, rows, n, sc, be, None, 1, None, X.dtype, b.eps, False,
                                      sd if b.want_stats else None, False)
        if b.n_outputs == 1:
            return y
        if not b.want_stats:
            mean, inv = zeros(ss, sd[0]), zeros(ss, sd[1])
        return (y, mean.reshape(ss), inv.reshape(ss))[:b.n_outputs]
    return run


op("LayerNormalization", 17, provider=CUDA, bind=bind_layer_norm17)(launch_layer_norm)


# -- GatedRMSNorm ----------------------------------------------------------------------------------

def launch_gated(g: GatedNorm, ctx=None):
    """The CUDA implementation of GatedRMSNorm, written once in ``ops/contrib_norm.py`` (its bind, its checks)."""

    def run(X, scale, gate):
        name = "GatedRMSNorm"
        check_device(name, X=X, scale=scale, gate=gate)
        _check_float(name, X)
        rows = gated_geometry(X, scale, gate)
        C = int(scale.size)
        y = rc.device_empty(tuple(X.shape), X.dtype)
        if rows:
            _gated_rows[rows, row_threads(C)](flat(X), flat(gate), flat(scale), flat(y), C, np.float32(g.eps),
                                              g.sigmoid)
        return y
    return run


op("GatedRMSNorm", 1, domain=MS, provider=CUDA, bind=bind_gated_rms)(launch_gated)


# -- LpNormalization -------------------------------------------------------------------------------

def launch_lp(b: LpNorm, ctx=None):
    """The CUDA implementation of LpNormalization, its bind (and the check of ``p``) ``ops.normalization``'s."""

    def run(input):
        check_device("LpNormalization", input=input)
        _check_float("LpNormalization", input)
        outer, n, inner = lp_view(input.shape, b.axis)
        y = rc.device_empty(tuple(input.shape), input.dtype)
        if input.size:
            _lp_cols[outer * inner, row_threads(n)](flat(input), flat(y), n, inner, b.p)
        return y
    return run


for _v in LP_VERSIONS:
    op("LpNormalization", _v, provider=CUDA, bind=bind_lp)(launch_lp)


# -- RMSNormalization ------------------------------------------------------------------------------

def _rms(ctx, axis=-1, epsilon=1e-5, stash_type=1):
    name = "RMSNormalization"

    def run(X, scale):
        check_device(name, X=X, scale=scale)
        _check_float(name, X)
        shape = tuple(X.shape)
        ax, rows, n, _ = row_view(shape, axis)
        sc = _vec(name, "scale", scale, shape[ax:])
        return launch_rows(X, rows, n, sc, None, None, 1, None, X.dtype, epsilon, False, None, True)[0]
    return run


op("RMSNormalization", 23, provider=CUDA, factory=True)(_rms)


# -- channel norms ---------------------------------------------------------------------------------

@jit
def _group_rows(x, scale, bias, y, C, S, groups, eps, affine, mvn):
    """One block per (sample, group) of x (N, C, S): normalize the group's C/groups*S contiguous elements."""
    sh = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    n = row // groups
    g = row - n * groups
    cpg = C // groups
    cnt = cpg * S
    base = (n * C + g * cpg) * S
    acc = np.float32(0.0)
    for j in range(tid, cnt, nt):
        acc += np.float32(x[base + j])
    m = block_sum(sh, tid, nt, acc) / np.float32(cnt)
    acc = np.float32(0.0)
    for j in range(tid, cnt, nt):
        d = np.float32(x[base + j]) - m
        acc += d * d
    var = block_sum(sh, tid, nt, acc) / np.float32(cnt)
    inv = np.float32(1.0) / (math.sqrt(var) + eps) if mvn else np.float32(1.0) / math.sqrt(var + eps)
    for j in range(tid, cnt, nt):
        v = (np.float32(x[base + j]) - m) * inv
        if affine:
            c = g * cpg + j // S
            v = v * scale[c] + bias[c]
        y[base + j] = v


@jit
def _chan_affine(x, a, b, y, C, S):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        c = (i // S) % C
        y[i] = np.float32(x[i]) * a[c] + b[c]


def _f32(v):
    return rc.to_device(np.ascontiguousarray(v, np.float32))


def channel_norm(name, X, scale, bias, eps, groups, mvn=False):
    """Normalize the device array ``X`` (N, C, ...) over each (sample, group of C/groups channels), then the
    per-channel affine of the host vectors ``scale`` and ``bias`` (None: none)."""
    check_device(name, X=X)
    _check_float(name, X)
    N, C, S = _ncs(X)
    if groups <= 0 or C % groups:
        raise InvalidAttributeError(f"{name}: the {C} channels do not split into {groups} equal groups")
    y = rc.device_empty(tuple(X.shape), X.dtype)
    if X.size:
        affine = scale is not None
        sc = _f32(scale) if affine else flat(X)
        bi = _f32(bias) if affine else flat(X)
        _group_rows[N * groups, row_threads(C // groups * S)](flat(X), sc, bi, flat(y), C, S, groups,
                                                            np.float32(eps), affine, bool(mvn))
    return y


def _instance(ctx, epsilon=1e-5, consumed_inputs=None):
    name = "InstanceNormalization"

    def run(input, scale, B):
        C = tuple(input.shape)[1] if input.ndim >= 2 else 0
        return channel_norm(name, input, _chan(name, "scale", host_array(name, "scale", scale, False), C),
                            _chan(name, "B", host_array(name, "B", B, False), C), epsilon, max(C, 1))
    return run


def _group(ctx, num_groups, epsilon=1e-5, stash_type=1):
    name = "GroupNormalization"
    per_group = ctx.opset < 21

    def run(X, scale, bias):
        C = tuple(X.shape)[1] if X.ndim >= 2 else 0
        sc = np.asarray(host_array(name, "scale", scale, False), np.float64).reshape(-1)
        bi = np.asarray(host_array(name, "bias", bias, False), np.float64).reshape(-1)
        if per_group and sc.size == num_groups and num_groups and C % num_groups == 0:
            sc, bi = np.repeat(sc, C // num_groups), np.repeat(bi, C // num_groups)
        return channel_norm(name, X, _chan(name, "scale", sc, C), _chan(name, "bias", bi, C), epsilon,
                            int(num_groups))
    return run


def _mvn(ctx, axes=(0, 2, 3)):
    name = "MeanVarianceNormalization"

    def run(X):
        check_device(name, X=X)
        _check_float(name, X)
        shape = tuple(X.shape)
        red = norm_axes(as_int_list(axes), len(shape))
        (outer, n, inner), perm = canon3(shape, red)
        if perm is None and inner == 1:
            return channel_norm(name, X.reshape((outer, 1, n)), None, None, 1e-9, 1, mvn=True).reshape(shape)
        kept = [a for a in range(len(shape)) if a not in red]
        perm = tuple(kept) + tuple(red)
        tshape = tuple(shape[a] for a in perm)
        xt = view_copy(name, X, lambda p: (p.transpose(perm), tshape))
        yt = channel_norm(name, xt.reshape((-1, 1, n)), None, None, 1e-9, 1, mvn=True).reshape(tshape)
        return view_copy(name, yt, lambda p: (p.transpose(np.argsort(perm)), shape))
    return run


def batch_norm(X, a, b):
    """y = X * a[c] + b[c] over the channels of the device array ``X`` (N, C, ...); ``a``, ``b`` host vectors."""
    check_device("BatchNormalization", X=X)
    _check_float("BatchNormalization", X)
    N, C, S = _ncs(X)
    y = rc.device_empty(tuple(X.shape), X.dtype)
    if X.size:
        blocks, threads = grid1d(X.size)
        _chan_affine[blocks, threads](flat(X), _f32(a), _f32(b), flat(y), C, S)
    return y


def _batch(ctx, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1, is_test=0, consumed_inputs=None):
    name = "BatchNormalization"
    if training_mode or (ctx.opset < 14 and ctx.n_outputs > 1 and not is_test):
        raise InvalidArgumentError(f"{name}: the CUDA kernel runs inference mode only (training_mode=0, one output)")
    if not spatial:
        raise InvalidArgumentError(f"{name}: the CUDA kernel runs spatial=1 only")

    def run(X, scale, B, input_mean, input_var):
        C = tuple(X.shape)[1] if X.ndim >= 2 else 0
        sc, bi, mean, var = (_chan(name, w, host_array(name, w, p, False), C) for w, p in
                             (("scale", scale), ("B", B), ("input_mean", input_mean), ("input_var", input_var)))
        a = sc / np.sqrt(var + epsilon)
        return batch_norm(X, a, bi - mean * a)
    return run


for _v in (1, 6, 22):
    op("InstanceNormalization", _v, provider=CUDA, factory=True, host_inputs=(1, 2))(_instance)
for _v in (18, 21):
    op("GroupNormalization", _v, provider=CUDA, factory=True, host_inputs=(1, 2))(_group)
for _v in (9, 13):
    op("MeanVarianceNormalization", _v, provider=CUDA, factory=True)(_mvn)
for _v in (1, 6, 7, 9, 14, 15):
    op("BatchNormalization", _v, provider=CUDA, factory=True, host_inputs=(1, 2, 3, 4))(_batch)


# -- LRN -------------------------------------------------------------------------------------------

@jit
def _lrn(x, y, C, S, alpha, beta, bias, size):
    """y = x / (bias + alpha / size * sum of squares over the channel window) ** beta, in float64 as the CPU."""
    lo = (size - 1) // 2
    hi = size - 1 - lo
    for t in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        j = t % S
        c = (t // S) % C
        n = t // (S * C)
        sq = 0.0
        for cc in range(max(0, c - lo), min(C, c + hi + 1)):
            v = np.float64(x[(n * C + cc) * S + j])
            sq += v * v
        y[t] = np.float64(x[t]) / (bias + alpha / size * sq) ** beta


def _lrn_factory(ctx, size, alpha=0.0001, beta=0.75, bias=1.0):
    if size <= 0:
        raise InvalidAttributeError(f"LRN: size must be positive, got {size}")

    def run(X):
        check_device("LRN", X=X)
        _check_float("LRN", X)
        N, C, S = _ncs(X)
        y = rc.device_empty(tuple(X.shape), X.dtype)
        if X.size:
            blocks, threads = grid1d(X.size)
            _lrn[blocks, threads](flat(X), flat(y), C, S, float(alpha), float(beta), float(bias), int(size))
        return y
    return run


for _v in (1, 13):
    op("LRN", _v, provider=CUDA, factory=True)(_lrn_factory)
