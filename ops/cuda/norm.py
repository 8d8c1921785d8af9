"""CUDA norms without a contrib twin: LayerNormalization (opset 17), com.microsoft GatedRMSNorm, and
LpNormalization.  (The contrib row norms, and the row kernel LayerNormalization runs, are
``ops/cuda/contrib_norm.py``.)

LayerNormalization sees the canonical ``(rows, n)`` view (``contrib_norm.launch_rows``: a two-pass mean and
centred variance, like the CPU, then the affine step).  GatedRMSNorm sees ``(rows * groups, C)`` (C = scale
length; the last axis may hold several groups) and multiplies by ``act(gate)`` (silu or sigmoid).
LpNormalization sees ``(outer, n, inner)``, one block per (outer, inner) column; a zero norm gives 0.

Invariants (match ``ops/normalization.py`` / ``ops/contrib_norm.py``):
- ``Y`` has the input dtype; statistics have shape ``x.shape[:axis] + (1,) * (rank - axis)`` and float32
  dtype (stash_type 1) unless the graph declares another;
- LayerNormalization's scale / bias that broadcast to the normalized shape are expanded on the device
  (``shape.broadcast_to``);
- everything is computed in float32 (float64 inputs too); all tensors are device arrays, nothing is read back.
"""
from __future__ import annotations

import math

import numpy as np

from ops._common import norm_axis
from ops.contrib_norm import GatedNorm, bind_gated_rms, gated_geometry
from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from .contrib_norm import launch_rows, zeros
from ._common import FLOATS, MAX_ROW_THREADS, block_sum, check_device, flat, row_threads
from .shape import broadcast_to

__all__ = ["LayerNormalization", "launch_gated", "LpNormalization"]

CUDA = "CUDAExecutionProvider"
MS = "com.microsoft"
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


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


def _stat_dtype(ctx, k, stash_type, x_dtype):
    vi = ctx.output_types[k] if ctx is not None and len(ctx.output_types) > k else None
    if vi is not None and getattr(vi, "dtype", None) is not None:
        return np.dtype(vi.dtype)
    return F32 if stash_type == 1 else np.dtype(x_dtype)


def _used(ctx, k) -> bool:
    used = ctx.outputs_used
    return ctx.n_outputs > k and (not used or len(used) <= k or bool(used[k]))


# -- LayerNormalization ----------------------------------------------------------------------------

def _layer_norm(ctx, X, Scale, B, axis, epsilon, stash_type):
    name = "LayerNormalization"
    check_device(name, X=X, Scale=Scale, B=B)
    _check_float(name, X)
    ax = norm_axis(axis, X.ndim)
    shape = tuple(X.shape)
    rows = int(np.prod(shape[:ax], dtype=np.int64))
    n = int(np.prod(shape[ax:], dtype=np.int64))
    sc = _vec(name, "scale", Scale, shape[ax:])
    be = None if B is None else _vec(name, "bias", B, shape[ax:])
    want_stats = ctx.n_outputs > 1 and (_used(ctx, 1) or _used(ctx, 2))
    sd = (_stat_dtype(ctx, 1, stash_type, X.dtype), _stat_dtype(ctx, 2, stash_type, X.dtype)) if want_stats else None
    y, _, mean, inv = launch_rows(X, rows, n, sc, be, None, 1, None, X.dtype, epsilon, False, sd, False)
    if ctx.n_outputs == 1:
        return y
    ss = shape[:ax] + (1,) * (X.ndim - ax)
    if not want_stats:
        mean = zeros(ss, _stat_dtype(ctx, 1, stash_type, X.dtype))
        inv = zeros(ss, _stat_dtype(ctx, 2, stash_type, X.dtype))
    return (y, mean.reshape(ss), inv.reshape(ss))[:ctx.n_outputs]


@op("LayerNormalization", 17, provider=CUDA)
def LayerNormalization(X, Scale, B=None, axis=-1, epsilon=1e-5, stash_type=1, *, ctx):
    return _layer_norm(ctx, X, Scale, B, axis, epsilon, stash_type)


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

def _lp(input, axis, p):
    if p not in (1, 2):
        raise InvalidAttributeError(f"LpNormalization: p must be 1 or 2, got {p}")
    check_device("LpNormalization", input=input)
    _check_float("LpNormalization", input)
    ax = norm_axis(axis, input.ndim)
    shape = tuple(input.shape)
    outer = int(np.prod(shape[:ax], dtype=np.int64))
    n = shape[ax]
    inner = int(np.prod(shape[ax + 1:], dtype=np.int64))
    y = rc.device_empty(shape, input.dtype)
    if input.size:
        _lp_cols[outer * inner, row_threads(n)](flat(input), flat(y), n, inner, int(p))
    return y


@op("LpNormalization", 1, provider=CUDA)
def LpNormalization_1(input, axis=-1, p=2):
    return _lp(input, axis, p)


@op("LpNormalization", 22, provider=CUDA)
def LpNormalization(input, axis=-1, p=2):
    return _lp(input, axis, p)
