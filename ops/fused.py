"""CPU kernels of the fusion passes (``runtime/passes/cuda_fusions.py``), domain ``onnx_numba``, and the
contract the CUDA kernels (``ops/cuda/fused.py``) share.

``GatedActivation(g, u, activation)`` is a feed-forward gate ``act(g) * u`` in one pass, where the export has
two or three elementwise nodes (``Sigmoid``, ``Mul``, ``Mul`` for SiLU): one output array instead of three and
one walk over memory instead of three, split over the threads.  A prefill makes these arrays large (2048
tokens by 4864 columns is 40 MB each), so the three passes and their fresh pages cost more than the gate's
arithmetic.  With one input ``gu`` of last axis ``2N`` it is ``act(gu[..., :N]) * gu[..., N:]``.

``GatedMatMul(x, Wg, Wu, activation)`` is ``act(x @ Wg) * (x @ Wu)`` for ``x (..., K)`` and two ``(K, N)``
weights.  The pass creates it for CUDA plans only; this CPU twin (the two products in float32, then the
gate's kernel) is the reference its CUDA kernel is held to.

``activation``: ``silu`` (``v * sigmoid(v)``, with the Sigmoid kernel's ``fsigmoid``, so a float32 gate gives
the bits of the three nodes it replaces), ``gelu`` (erf) or ``gelu_tanh``.  Values are computed in float32 and
stored in the operands' dtype.

The one op contract (``ops/registry.py``): both ops bind with ``bind_gated`` (the ``activation`` attribute and
its default, checked once at plan time) into a ``GatedOp``; the CPU wrappers, the region form and the CUDA
launches are called with that record.  The run-time checks every implementation makes are the public helpers
``gated_out_shape`` (the gate's shapes) and ``gated_matmul_shape`` / ``same_float`` (GatedMatMul's shapes
and dtypes), which take host or device arrays.

Invariants: ``g`` and ``u`` have one shape (the pass fuses only such pairs; the wrappers and the form check it
again before a kernel reads memory); GatedMatMul's operands share float32 or float16, as on CUDA; results are
fresh arrays.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, lowp, mlas_order
from ._fastmath import fgelu_tanh, fgelu_tanh_mlas, fsigmoid, fsigmoid_mlas
from ._simd import AVX512F
from .forms import Decline, float_only, quote, form
from .registry import op

__all__ = ["GatedOp", "bind_gated", "gated_cpu", "gated_matmul_cpu", "gated_out_shape", "gated_matmul_shape",
           "same_float", "ACTIVATIONS", "SILU", "GELU", "GELU_TANH", "DOMAIN", "gated_flat", "gated_halves"]

DOMAIN = "onnx_numba"
SILU, GELU, GELU_TANH = 0, 1, 2
SILU_MLAS = 3  # SiLU with MLAS's logistic (``cpu_act``): the CPU kernels' code, never an attribute's
GELU_TANH_MLAS = 4  # tanh-GELU in onnxruntime's order (``cpu_act``), likewise
# onnxruntime's SiLU on hosts with AVX-512 F (MLAS's AVX-512 SiLU kernel) also clamps that logistic to at most 1
_SILU_TO_ONE = AVX512F
ACTIVATIONS = {"silu": SILU, "gelu": GELU, "gelu_tanh": GELU_TANH}
_CHUNK = 1 << 14  # elements per task
F16 = np.dtype(np.float16)


@njit(cache=True, nogil=True, inline="always")
def _act(v, act):
    if act == SILU:
        return v * fsigmoid(v)
    if act == SILU_MLAS:
        s = fsigmoid_mlas(v)
        if _SILU_TO_ONE:
            s = min(s, np.float32(1.0))
        return v * s
    half = np.float32(0.5)
    one = np.float32(1.0)
    if act == GELU:
        return half * v * (one + math.erf(v * np.float32(0.7071067811865476)))
    if act == GELU_TANH_MLAS:
        return fgelu_tanh_mlas(v)
    return fgelu_tanh(v)


@njit(cache=True, nogil=True, parallel=True)
def gated_flat(g, u, y, act):
    """y = act(g) * u over flat float32 arrays of one length."""
    n = y.shape[0]
    if n <= _CHUNK:  # a decode step's gate: no thread launch
        for i in range(n):
            y[i] = _act(g[i], act) * u[i]
        return
    for t in prange((n + _CHUNK - 1) // _CHUNK):
        for i in range(np.uint64(t * _CHUNK), np.uint64(min(n, (t + 1) * _CHUNK))):  # unsigned: vectorizes
            y[i] = _act(g[i], act) * u[i]


@njit(cache=True, nogil=True, parallel=True)
def gated_halves(gu, y, act):
    """y (rows, N) = act(gu[:, :N]) * gu[:, N:] for gu (rows, 2N), float32."""
    rows, n = y.shape
    if rows * n <= _CHUNK:
        for r in range(rows):
            for j in range(n):
                y[r, j] = _act(gu[r, j], act) * gu[r, n + j]
        return
    for r in prange(rows):
        for j in range(n):
            y[r, j] = _act(gu[r, j], act) * gu[r, n + j]


# -- the contract ----------------------------------------------------------------------------------

class GatedOp(NamedTuple):
    """A GatedActivation or GatedMatMul node bound at plan time."""

    op: str   # the node's op type, for messages
    act: int  # SILU, GELU or GELU_TANH


def bind_gated(ctx, activation="silu") -> GatedOp:
    """The bind of both ops: ``activation`` must name one of ``ACTIVATIONS`` (``InvalidAttributeError``)."""
    name = ctx.op_type
    a = activation.decode() if isinstance(activation, bytes) else str(activation)
    if a not in ACTIVATIONS:
        raise InvalidAttributeError(f"{name}: activation must be one of {sorted(ACTIVATIONS)}, got {a!r}")
    return GatedOp(name, ACTIVATIONS[a])


def gated_out_shape(b: GatedOp, g, u) -> tuple:
    """GatedActivation's output shape after its shape checks (host or device arrays; ``u`` None for the one
    input ``gu`` whose last axis holds the gate and the value)."""
    if u is None:
        n2 = tuple(g.shape)[-1] if g.ndim else 1
        if g.ndim == 0 or n2 % 2:
            raise ShapeMismatchError(f"{b.op}: a single input must have an even last axis (gate, value), got "
                                     f"shape {list(g.shape)}")
        return tuple(g.shape)[:-1] + (n2 // 2,)
    if tuple(g.shape) != tuple(u.shape):
        raise ShapeMismatchError(f"{b.op}: the gate and the value must have one shape, got {list(g.shape)} "
                                 f"and {list(u.shape)}")
    return tuple(g.shape)


def same_float(name, *arrays) -> None:
    """The operands (host or device arrays) share float32 or float16 (``InvalidArgumentError``)."""
    dt = np.dtype(arrays[0].dtype)
    if dt not in (F32, F16) or any(np.dtype(a.dtype) != dt for a in arrays):
        raise InvalidArgumentError(f"{name}: operands must share float32 or float16, got "
                                   f"{[str(a.dtype) for a in arrays]}")


def gated_matmul_shape(b: GatedOp, x, wg, wu) -> tuple:
    """``(rows, K, N, lead)`` of GatedMatMul after its dtype and shape checks (host or device arrays): ``x``
    is ``lead + (K,)``, the weights ``(K, N)``, the result ``lead + (N,)`` with ``rows = prod(lead)``."""
    same_float(b.op, x, wg, wu)
    if wg.ndim != 2 or tuple(wu.shape) != tuple(wg.shape) or x.ndim < 1 or tuple(x.shape)[-1] != wg.shape[0]:
        raise ShapeMismatchError(f"{b.op}: expected x (..., K) and two (K, N) weights, got {list(x.shape)}, "
                                 f"{list(wg.shape)} and {list(wu.shape)}")
    K, N = (int(v) for v in wg.shape)
    lead = tuple(x.shape)[:-1]
    return int(np.prod(lead, dtype=np.int64)), K, N, lead


# -- the CPU wrappers and the region form ----------------------------------------------------------

def _f32(name, x):
    if x.dtype != F32 and not (x.dtype.kind == "f" or lowp(x.dtype)):
        raise InvalidArgumentError(f"{name} expects floating-point inputs, got {x.dtype}")
    return np.ascontiguousarray(x, dtype=F32)


def cpu_act(act: int) -> int:
    """The CPU kernels' activation code for float32 gates: with ``ONNX_NUMBA_MLAS_ORDER`` (read at plan time) SiLU
    takes MLAS's logistic and tanh-GELU onnxruntime's formula over MLAS's tanh (the bits of the onnxruntime nodes
    they replace)."""
    if act in (SILU, GELU_TANH) and mlas_order():
        return SILU_MLAS if act == SILU else GELU_TANH_MLAS
    return act


def gated_cpu(b: GatedOp, ctx):
    """GatedActivation on the CPU: ``act(g) * u``, or ``act(gu[..., :N]) * gu[..., N:]`` with one input."""
    act32 = cpu_act(b.act)

    def run(g, u=None):
        dt = g.dtype
        act = act32 if dt == F32 else b.act
        shape = gated_out_shape(b, g, u)
        y = np.empty(shape, F32)
        if u is None:
            n2 = g.shape[-1]
            gated_halves(_f32(b.op, g).reshape(-1, n2), y.reshape(-1, n2 // 2), act)
        else:
            gf, uf = _f32(b.op, g), _f32(b.op, u)
            gated_flat(gf.reshape(-1), uf.reshape(-1), y.reshape(-1), act)
        return y if dt == F32 else y.astype(dt)
    return run


def gated_matmul_cpu(b: GatedOp, ctx):
    """GatedMatMul on the CPU: the two products in float32 (as the CUDA kernel accumulates), then the gate."""

    def run(x, wg, wu):
        rows, K, N, lead = gated_matmul_shape(b, x, wg, wu)
        a = np.ascontiguousarray(x, dtype=F32).reshape(rows, K)
        g = a @ np.ascontiguousarray(wg, dtype=F32)
        u = a @ np.ascontiguousarray(wu, dtype=F32)
        y = np.empty(lead + (N,), F32)
        gated_flat(g.reshape(-1), u.reshape(-1), y.reshape(-1), b.act)  # matmul results are C-contiguous
        return y if x.dtype == F32 else y.astype(x.dtype)
    return run


def _gated_form(e, b: GatedOp):
    float_only(e, 0, 1)
    act = cpu_act(b.act) if e.dtype(0) == F32 else b.act  # an unknown one failed the bind (the wrapper reports it)
    who = quote(e.node).replace("{", "{{").replace("}", "}}")
    err = e.use("runtime.errors", "ShapeMismatchError")
    if e.has(1):
        k = e.use(__name__, "gated_flat")
        e.line("if {i0}.shape != {i1}.shape:",
               f"    raise {err}(\"{who}: the gate and the value must have one shape\")",
               "{o0} = np.empty({i0}.shape, np.float32)",
               f"{k}(np.ascontiguousarray({{i0}}).reshape({{i0}}.size), "
               f"np.ascontiguousarray({{i1}}).reshape({{i1}}.size), {{o0}}.reshape({{o0}}.size), {act})")
        e.declare(0, F32, e.rank(0))
        return
    r = e.rank(0)
    if r == 0:
        raise Decline("scalar")
    k = e.use(__name__, "gated_halves")
    lead = ", ".join(f"{{i0}}.shape[{d}]" for d in range(r - 1))
    e.line(f"{{p}}_n2 = {{i0}}.shape[{r - 1}]",
           "if {p}_n2 % 2:",
           f"    raise {err}(\"{who}: a single input must have an even last axis\")",
           f"{{o0}} = np.empty(({lead}{', ' if lead else ''}{{p}}_n2 // 2), np.float32)",
           f"{k}(np.ascontiguousarray({{i0}}).reshape(({{i0}}.size // max({{p}}_n2, 1), {{p}}_n2)), "
           f"{{o0}}.reshape(({{o0}}.size // max({{p}}_n2 // 2, 1), {{p}}_n2 // 2)), {act})")
    e.declare(0, F32, r)


op("GatedActivation", 1, domain=DOMAIN, bind=bind_gated)(gated_cpu)
form("GatedActivation", domain=DOMAIN, bind=bind_gated)(_gated_form)
op("GatedMatMul", 1, domain=DOMAIN, bind=bind_gated)(gated_matmul_cpu)
