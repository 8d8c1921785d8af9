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

Invariants: operands are C-contiguous device arrays of one float dtype (float32 or float16); ``g`` and ``u`` have
one shape (the pass fuses only such pairs; the wrapper checks it again); results are fresh device arrays.
"""
from __future__ import annotations

import math

import numpy as np

from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F16, F32, check_device, flat, grid1d
from . import matmul as kmm

__all__ = ["GatedActivation", "GatedMatMul", "ACTIVATIONS", "DOMAIN"]

DOMAIN = "onnx_numba"
CUDA = "CUDAExecutionProvider"
SILU, GELU, GELU_TANH = 0, 1, 2
ACTIVATIONS = {"silu": SILU, "gelu": GELU, "gelu_tanh": GELU_TANH}


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


@jit
def _gemv_gated(x, wg, wu, y, K, N, act):
    sh = cuda.shared.array((2 * kmm.GEMV_SLICES, kmm.GEMV_COLS), np.float32)
    for n0 in range(cuda.blockIdx.x * cuda.blockDim.x, N, cuda.gridDim.x * cuda.blockDim.x):  # block-uniform
        n = n0 + cuda.threadIdx.x
        ag = kmm.gemv_column_sums(x, wg, n, N, K, sh, 0)
        au = kmm.gemv_column_sums(x, wu, n, N, K, sh, 1)
        if cuda.threadIdx.y == 0 and n < N:
            y[n] = _gate(ag, act) * au


def _activation(name, activation) -> int:
    a = activation.decode() if isinstance(activation, bytes) else str(activation)
    if a not in ACTIVATIONS:
        raise InvalidAttributeError(f"{name}: activation must be one of {sorted(ACTIVATIONS)}, got {a!r}")
    return ACTIVATIONS[a]


def _float_dtype(name, *arrays):
    dt = np.dtype(arrays[0].dtype)
    if dt not in (F32, F16) or any(np.dtype(a.dtype) != dt for a in arrays):
        raise InvalidArgumentError(f"{name}: operands must share float32 or float16, got "
                                   f"{[str(a.dtype) for a in arrays]}")


def gated(g, u, act: int):
    """``act(g) * u`` for device arrays of one shape (no broadcasting)."""
    y = rc.device_empty(tuple(g.shape), g.dtype)
    if y.size:
        blocks, threads = grid1d(y.size)
        _gated[blocks, threads](flat(g), flat(u), flat(y), act)
    return y


@op("GatedActivation", 1, domain=DOMAIN, provider=CUDA)
def GatedActivation(g, u=None, activation="silu"):
    name = "GatedActivation"
    act = _activation(name, activation)
    if u is None:  # one product holding the gate and the value as the halves of its last axis
        check_device(name, gate_and_value=g)
        _float_dtype(name, g)
        n2 = tuple(g.shape)[-1] if g.ndim else 1
        if g.ndim == 0 or n2 % 2:
            raise ShapeMismatchError(f"{name}: a single input must have an even last axis (gate, value), got "
                                     f"shape {list(g.shape)}")
        y = rc.device_empty(tuple(g.shape)[:-1] + (n2 // 2,), g.dtype)
        if y.size:
            blocks, threads = grid1d(y.size)
            _gated_halves[blocks, threads](flat(g), flat(y), n2 // 2, act)
        return y
    check_device(name, g=g, u=u)
    _float_dtype(name, g, u)
    if tuple(g.shape) != tuple(u.shape):
        raise ShapeMismatchError(f"{name}: the gate and the value must have one shape, got {list(g.shape)} and "
                                 f"{list(u.shape)}")
    return gated(g, u, act)


@op("GatedMatMul", 1, domain=DOMAIN, provider=CUDA)
def GatedMatMul(x, wg, wu, activation="silu"):
    name = "GatedMatMul"
    act = _activation(name, activation)
    check_device(name, x=x, wg=wg, wu=wu)
    _float_dtype(name, x, wg, wu)
    if wg.ndim != 2 or tuple(wu.shape) != tuple(wg.shape) or x.ndim < 1 or tuple(x.shape)[-1] != wg.shape[0]:
        raise ShapeMismatchError(f"{name}: expected x (..., K) and two (K, N) weights, got {list(x.shape)}, "
                                 f"{list(wg.shape)} and {list(wu.shape)}")
    K, N = (int(v) for v in wg.shape)
    lead = tuple(x.shape)[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    if rows != 1:
        a = x.reshape((rows, K))
        return gated(kmm.gemm(a, wg), kmm.gemm(a, wu), act).reshape(lead + (N,))
    y = rc.device_empty(lead + (N,), x.dtype)
    if N:
        blocks, threads = kmm.gemv_geometry(N)
        _gemv_gated[blocks, threads](flat(x), flat(wg), flat(wu), flat(y), K, N, act)
    return y
