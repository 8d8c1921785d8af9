"""CPU kernels of the fusion passes (``runtime/passes/cuda_fusions.py``), domain ``onnx_numba``.

``GatedActivation(g, u, activation)`` is a feed-forward gate ``act(g) * u`` in one pass, where the export has
two or three elementwise nodes (``Sigmoid``, ``Mul``, ``Mul`` for SiLU): one output array instead of three and
one walk over memory instead of three, split over the threads.  A prefill makes these arrays large (2048
tokens by 4864 columns is 40 MB each), so the three passes and their fresh pages cost more than the gate's
arithmetic.  With one input ``gu`` of last axis ``2N`` it is ``act(gu[..., :N]) * gu[..., N:]``.

``activation``: ``silu`` (``v * sigmoid(v)``, with the Sigmoid kernel's ``fsigmoid``, so a float32 gate gives
the bits of the three nodes it replaces), ``gelu`` (erf) or ``gelu_tanh``.  Values are computed in float32 and
stored in the operands' dtype.  The wrapper and the region form call the same kernels.

Invariants: ``g`` and ``u`` have one shape (the pass fuses only such pairs; the wrapper and the form check it
again before a kernel reads memory); results are fresh arrays.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, lowp
from ._fastmath import fsigmoid
from .forms import Decline, float_only, quote, form
from .registry import op

__all__ = ["GatedActivation", "ACTIVATIONS", "DOMAIN", "gated_flat", "gated_halves"]

DOMAIN = "onnx_numba"
SILU, GELU, GELU_TANH = 0, 1, 2
ACTIVATIONS = {"silu": SILU, "gelu": GELU, "gelu_tanh": GELU_TANH}
_CHUNK = 1 << 14  # elements per task


@njit(cache=True, nogil=True, inline="always")
def _act(v, act):
    if act == SILU:
        return v * fsigmoid(v)
    half = np.float32(0.5)
    one = np.float32(1.0)
    if act == GELU:
        return half * v * (one + math.erf(v * np.float32(0.7071067811865476)))
    return half * v * (one + math.tanh(np.float32(0.7978845608028654) * (v + np.float32(0.044715) * v * v * v)))


@njit(cache=True, nogil=True, parallel=True)
def gated_flat(g, u, y, act):
    """y = act(g) * u over flat float32 arrays of one length."""
    n = y.shape[0]
    if n <= _CHUNK:  # a decode step's gate: no thread launch
        for i in range(n):
            y[i] = _act(g[i], act) * u[i]
        return
    for t in prange((n + _CHUNK - 1) // _CHUNK):
        for i in range(t * _CHUNK, min(n, (t + 1) * _CHUNK)):
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


def _activation(name, activation):
    a = activation.decode() if isinstance(activation, bytes) else str(activation)
    if a not in ACTIVATIONS:
        raise InvalidAttributeError(f"{name}: activation must be one of {sorted(ACTIVATIONS)}, got {a!r}")
    return ACTIVATIONS[a]


def _f32(name, x):
    if x.dtype != F32 and not (x.dtype.kind == "f" or lowp(x.dtype)):
        raise InvalidArgumentError(f"{name} expects floating-point inputs, got {x.dtype}")
    return np.ascontiguousarray(x, dtype=F32)


@op("GatedActivation", 1, domain=DOMAIN)
def GatedActivation(g, u=None, activation="silu"):
    name = "GatedActivation"
    act = _activation(name, activation)
    dt = g.dtype
    if u is None:
        n2 = g.shape[-1] if g.ndim else 1
        if g.ndim == 0 or n2 % 2:
            raise ShapeMismatchError(f"{name}: a single input must have an even last axis (gate, value), got "
                                     f"shape {list(g.shape)}")
        gu = _f32(name, g)
        y = np.empty(g.shape[:-1] + (n2 // 2,), F32)
        gated_halves(gu.reshape(-1, n2), y.reshape(-1, n2 // 2), act)
    else:
        if g.shape != u.shape:
            raise ShapeMismatchError(f"{name}: the gate and the value must have one shape, got {list(g.shape)} "
                                     f"and {list(u.shape)}")
        gf, uf = _f32(name, g), _f32(name, u)
        y = np.empty(g.shape, F32)
        gated_flat(gf.reshape(-1), uf.reshape(-1), y.reshape(-1), act)
    return y if dt == F32 else y.astype(dt)


@form("GatedActivation", domain=DOMAIN)
def _gated_form(e):
    float_only(e, 0, 1)
    try:
        act = _activation("GatedActivation", e.attrs.get("activation", "silu"))
    except InvalidAttributeError as err:
        raise Decline(str(err))
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
