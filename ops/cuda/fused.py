"""CUDA kernels of the CUDA plan's fusions (``runtime/passes/cuda_fusions.py``), domain ``onnx_numba``.

On a GPU a small decode step is bound by launches (about 7 us each plus 3.5 us per array argument in
numba-cuda), so the feed-forward gate ``act(x @ Wg) * (x @ Wu)``, five launches as exported, runs as one:

- ``GatedActivation(g, u, activation)``: ``act(g) * u`` elementwise, one launch where the export has two or
  three (``Sigmoid``, ``Mul``, ``Mul`` for SiLU; ``Gelu``/``FastGelu``, ``Mul`` for GELU).  With one input
  ``gu`` of last axis ``2N`` it is ``act(gu[..., :N]) * gu[..., N:]``: the form the pass gives a gate and a
  value computed by one MatMulNBits over their concatenated weights (two launches where the export has four);
- ``GatedMatMul(x, Wg, Wu, activation)``: the same of two products sharing ``x`` with constant ``(K, N)``
  weights.  One row (decode) is one GEMV launch that walks both weights with the matmul GEMV's geometry
  (32 adjacent columns per warp, 8 warps splitting K) and applies the gate to the two sums; several rows (prefill) run
  the two tiled GEMMs and ``GatedActivation``: three launches where the export has five.

``activation``: ``silu`` (``v * sigmoid(v)``), ``gelu`` (erf) or ``gelu_tanh``.  Values are computed in float32
(the products accumulate in float32 as the GEMV does) and stored in the operands' dtype.

The one op contract: both launches are registered with their CPU twins' bind, ``ops.fused.bind_gated`` (the
``activation`` attribute, checked at plan time), receive its ``GatedOp`` and make the run-time checks through
that module's public helpers (``gated_out_shape``, ``gated_matmul_shape``, ``same_float``), so the CPU and CUDA
implementations raise the same errors with the same messages.

Invariants: operands are C-contiguous device arrays of one float dtype (float32 or float16); ``g`` and ``u`` have
one shape (the pass fuses only such pairs; the launch checks it again); results are fresh device arrays.
"""
from __future__ import annotations

import math

import numpy as np

from ops.fused import DOMAIN, GELU, SILU, GatedOp, bind_gated, gated_matmul_shape, gated_out_shape, same_float
from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from ._common import check_device, flat, grid1d
from . import matmul as kmm

__all__ = ["launch_gated", "launch_gated_matmul", "gated"]

CUDA = "CUDAExecutionProvider"


@jit(device=True)
def _gate(v, act):
    one = np.float32(1.0)
    half = np.float32(0.5)
    if act == SILU:
        # Two branches so exp never overflows (as the Sigmoid kernel).
        if v >= 0:
            return v * (one / (one + math.exp(-v)))
        e = math.exp(v)
        return v * (e / (one + e))
    if act == GELU:
        return half * v * (one + math.erf(v * np.float32(0.7071067811865476)))
    return half * v * (one + math.tanh(np.float32(0.7978845608028654) * (v + np.float32(0.044715) * v * v * v)))


@jit
def _gated(g, u, y, act):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, y.size, step):
        y[i] = _gate(np.float32(g[i]), act) * np.float32(u[i])


@jit
def _gated_halves(gu, y, N, act):
    """y[r, n] = act(gu[r, n]) * gu[r, N + n]: the gate and the value as the two halves of one product's row."""
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, y.size, step):
        r = i // N
        n = i - r * N
        y[i] = _gate(np.float32(gu[r * 2 * N + n]), act) * np.float32(gu[r * 2 * N + N + n])


_SCRATCH = kmm.GEMV_SCRATCH  # a global of this module: a compile-time constant in the kernel


@jit
def _gemv_gated(x, wg, wu, y, K, N, act):
    sh = cuda.shared.array(_SCRATCH, np.float32)
    for n0 in range(cuda.blockIdx.x * cuda.blockDim.x, N, cuda.gridDim.x * cuda.blockDim.x):  # block-uniform
        n = n0 + cuda.threadIdx.x
        ag = kmm.gemv_column_sums(x, wg, n, N, K, sh, 0)
        au = kmm.gemv_column_sums(x, wu, n, N, K, sh, 1)
        if cuda.threadIdx.y == 0 and n < N:
            y[n] = _gate(ag, act) * au


def gated(g, u, act: int):
    """``act(g) * u`` for device arrays of one shape (no broadcasting)."""
    y = rc.device_empty(tuple(g.shape), g.dtype)
    if y.size:
        blocks, threads = grid1d(y.size)
        _gated[blocks, threads](flat(g), flat(u), flat(y), act)
    return y


def launch_gated(b: GatedOp, ctx=None):
    """The CUDA implementation of GatedActivation (its bind is ``ops.fused``'s)."""

    def run(g, u=None):
        if u is None:  # one product holding the gate and the value as the halves of its last axis
            check_device(b.op, gate_and_value=g)
            same_float(b.op, g)
            y = rc.device_empty(gated_out_shape(b, g, None), g.dtype)
            if y.size:
                blocks, threads = grid1d(y.size)
                _gated_halves[blocks, threads](flat(g), flat(y), tuple(y.shape)[-1], b.act)
            return y
        check_device(b.op, g=g, u=u)
        same_float(b.op, g, u)
        gated_out_shape(b, g, u)
        return gated(g, u, b.act)
    return run


def launch_gated_matmul(b: GatedOp, ctx=None):
    """The CUDA implementation of GatedMatMul (its bind is ``ops.fused``'s): one GEMV launch for one row, the
    two tiled GEMMs and the gate for several."""

    def run(x, wg, wu):
        check_device(b.op, x=x, wg=wg, wu=wu)
        rows, K, N, lead = gated_matmul_shape(b, x, wg, wu)
        if rows != 1:
            a = x.reshape((rows, K))
            return gated(kmm.gemm(a, wg), kmm.gemm(a, wu), b.act).reshape(lead + (N,))
        y = rc.device_empty(lead + (N,), x.dtype)
        if N:
            blocks, threads = kmm.gemv_geometry(N)
            _gemv_gated[blocks, threads](flat(x), flat(wg), flat(wu), flat(y), K, N, b.act)
        return y
    return run


op("GatedActivation", 1, domain=DOMAIN, provider=CUDA, bind=bind_gated)(launch_gated)
op("GatedMatMul", 1, domain=DOMAIN, provider=CUDA, bind=bind_gated)(launch_gated_matmul)
