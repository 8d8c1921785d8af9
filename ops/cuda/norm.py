"""CUDA norms without a contrib twin: LayerNormalization (opset 17), com.microsoft GatedRMSNorm, and
LpNormalization.  (The contrib row norms, and the row kernel LayerNormalization runs, are
``ops/cuda/contrib_norm.py``.)

Each op here is written once, to the one op contract, in its CPU module: these launches are registered with
the CPU wrapper's bind and read its record (``ops.normalization``'s ``LayerNorm`` and ``LpNorm``,
``ops.contrib_norm``'s ``GatedNorm``), and share the CPU's geometry and checks (``row_view``, ``lp_view``,
``gated_geometry``).

LayerNormalization sees the canonical ``(rows, n)`` view (``contrib_norm.launch_rows``: a two-pass mean and
centred variance, like the CPU, then the affine step).  GatedRMSNorm sees ``(rows * groups, C)`` (C = scale
length; the last axis may hold several groups) and multiplies by ``act(gate)`` (silu or sigmoid).
LpNormalization sees ``(outer, n, inner)``, one block per (outer, inner) column; a zero norm gives 0.

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
from ops.normalization import LP_VERSIONS, LayerNorm, LpNorm, bind_layer_norm17, bind_lp, lp_view, row_view
from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError, ShapeMismatchError
from .contrib_norm import launch_rows, zeros
from ._common import FLOATS, MAX_ROW_THREADS, block_sum, check_device, flat, row_threads
from .shape import broadcast_to

__all__ = ["launch_layer_norm", "launch_gated", "launch_lp"]

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
