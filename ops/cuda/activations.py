"""CUDA activations: com.microsoft Gelu, BiasGelu, FastGelu, QuickGelu; onnx Gelu (opset 20), Softplus,
Softsign, HardSigmoid, LeakyRelu.

One grid-stride kernel over the flat tensor with an optional bias of length ``n`` (the last axis, indexed as
``i % n``) added first; the activation is a run-time code uniform across the grid, so ``_act`` compiles once
per dtype for the whole family.  Values are computed in float32 (float16 and float64 too) and stored in the
input dtype.

Invariants (match ``ops/contrib_norm.py`` / ``ops/elementwise.py``): float inputs only (``InvalidArgumentError``
otherwise); a bias must be 1-d with the length of X's last axis (``ShapeMismatchError``); outputs are fresh
device arrays of X's shape and dtype.
"""
from __future__ import annotations

import math

import numpy as np

from ops.contrib_norm import GeluOp, bind_bias_gelu, bind_fast_gelu, bind_gelu, bind_quick_gelu, gelu_check
from ops.elementwise import UNARY, Unary
from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ._common import FLOATS, check_device, flat, grid1d

__all__ = ["launch_gelu", "launch_activation"]

CUDA = "CUDAExecutionProvider"
MS = "com.microsoft"
GELU_ERF, GELU_TANH, QUICK, SOFTPLUS, SOFTSIGN, HARDSIGMOID, LEAKYRELU = range(7)


@jit
def _act(x, bias, has_bias, n, y, mode, p0, p1):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    one = np.float32(1.0)
    half = np.float32(0.5)
    for i in range(start, x.size, step):
        v = np.float32(x[i])
        if has_bias:
            v += np.float32(bias[i % n])
        if mode == GELU_ERF:
            r = half * v * (one + math.erf(v * np.float32(0.7071067811865476)))
        elif mode == GELU_TANH:
            r = half * v * (one + math.tanh(np.float32(0.7978845608028654) * (v + np.float32(0.044715) * v * v * v)))
        elif mode == QUICK:
            r = v / (one + math.exp(-p0 * v))
        elif mode == SOFTPLUS:
            r = v + math.log1p(math.exp(-v)) if v > 0 else math.log1p(math.exp(v))
        elif mode == SOFTSIGN:
            r = v / (one + abs(v))
        elif mode == HARDSIGMOID:
            r = v if v != v else max(np.float32(0.0), min(one, p0 * v + p1))
        else:
            r = v if v >= 0 else p0 * v
        y[i] = r


def _launch(X, bias, n, mode, p0=0.0, p1=0.0):
    y = rc.device_empty(tuple(X.shape), X.dtype)
    if X.size:
        blocks, threads = grid1d(X.size)
        xf = flat(X)
        _act[blocks, threads](xf, bias if bias is not None else xf, bias is not None, max(n, 1), flat(y), mode,
                              np.float32(p0), np.float32(p1))
    return y


def _run(name, X, bias, mode, p0=0.0, p1=0.0):
    check_device(name, X=X, bias=bias)
    if np.dtype(X.dtype) not in FLOATS:
        raise InvalidArgumentError(f"{name} expects a floating-point input, got {X.dtype}")
    return _launch(X, None, tuple(X.shape)[-1] if X.ndim else 1, mode, p0, p1)


def launch_gelu(g: GeluOp, ctx=None):
    """The CUDA implementation of the com.microsoft GELU family, written once in ``ops/contrib_norm.py``."""

    def run(X, bias=None):
        check_device(g.op, X=X, bias=bias)
        if np.dtype(X.dtype) not in FLOATS:
            raise InvalidArgumentError(f"{g.op} expects a floating-point input, got {X.dtype}")
        n = gelu_check(g, X, bias)
        return _launch(X, bias, n, g.mode, g.alpha)
    return run


for _name, _bind in (("Gelu", bind_gelu), ("BiasGelu", bind_bias_gelu), ("FastGelu", bind_fast_gelu),
                     ("QuickGelu", bind_quick_gelu)):
    op(_name, 1, domain=MS, provider=CUDA, bind=_bind)(launch_gelu)


# The default-domain activations this kernel computes: the ``_elementwise_kernels`` name of each (its bound
# ``Unary.kernel``) -> the kernel's mode.
_MODES = {"gelu": GELU_ERF, "gelu_tanh": GELU_TANH, "softplus": SOFTPLUS, "softsign": SOFTSIGN,
          "hardsigmoid": HARDSIGMOID, "leakyrelu": LEAKYRELU}


def launch_activation(u: Unary, ctx=None):
    """The CUDA implementation of Gelu (opset 20), Softplus, Softsign, HardSigmoid and LeakyRelu (their bind is
    ``ops.elementwise``'s: attribute defaults and checks written once there)."""
    mode = _MODES[u.kernel]

    def run(X):
        return _run(u.op, X, None, mode, u.p0, u.p1)
    return run


for _name in ("Gelu", "Softplus", "Softsign", "HardSigmoid", "LeakyRelu"):
    _bind, _vers = UNARY[_name]
    for _v in _vers:
        op(_name, _v, provider=CUDA, bind=_bind)(launch_activation)
