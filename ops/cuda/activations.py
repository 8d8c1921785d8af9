"""CUDA activations of the com.microsoft GELU family: Gelu, BiasGelu, FastGelu, QuickGelu.

One grid-stride kernel over the flat tensor with an optional bias of length ``n`` (the last axis, indexed as
``i % n``) added first; the activation is the generated device function of the default-domain op with the
same formula (``ops/cuda/_elementwise_device.py``: gelu, gelu_tanh, quick_gelu), a run-time code uniform
across the grid, so ``_act`` compiles once per dtype for the whole family.  Values are computed in float32
(float16 and float64 too) and stored in the input dtype.  The default-domain activations (Gelu at opset 20,
Softplus, HardSigmoid, ...) are unary ops of ``ops/cuda/elementwise.py``.

Invariants (match ``ops/contrib_norm.py``): float inputs only (``InvalidArgumentError`` otherwise); a bias
must be 1-d with the length of X's last axis (``ShapeMismatchError``); outputs are fresh device arrays of X's
shape and dtype.
"""
from __future__ import annotations

import numpy as np

from ops.contrib_norm import (GELU_ERF, GELU_QUICK, GELU_TANH, GeluOp, bind_bias_gelu, bind_fast_gelu, bind_gelu,
                              bind_quick_gelu, gelu_check)
from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ._common import FLOATS, check_device, flat, grid1d
from ._elementwise_device import unary_store
from .elementwise import unary_code

__all__ = ["launch_gelu"]

CUDA = "CUDAExecutionProvider"
MS = "com.microsoft"
# GeluOp.mode -> the run-time code of the generated device function with that formula
_CODES = {GELU_ERF: unary_code("gelu"), GELU_TANH: unary_code("gelu_tanh"), GELU_QUICK: unary_code("quick_gelu")}


@jit
def _act(x, bias, has_bias, n, y, code, p0, p1):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, x.size, step):
        v = np.float32(x[i])
        if has_bias:
            v += np.float32(bias[i % n])
        unary_store(code, v, p0, p1, y, i)


def _launch(X, bias, n, mode, p0=0.0, p1=0.0):
    y = rc.device_empty(tuple(X.shape), X.dtype)
    if X.size:
        blocks, threads = grid1d(X.size)
        xf = flat(X)
        _act[blocks, threads](xf, bias if bias is not None else xf, bias is not None, max(n, 1), flat(y), mode,
                              np.float32(p0), np.float32(p1))
    return y


def launch_gelu(g: GeluOp, ctx=None):
    """The CUDA implementation of the com.microsoft GELU family, written once in ``ops/contrib_norm.py``."""

    def run(X, bias=None):
        check_device(g.op, X=X, bias=bias)
        if np.dtype(X.dtype) not in FLOATS:
            raise InvalidArgumentError(f"{g.op} expects a floating-point input, got {X.dtype}")
        n = gelu_check(g, X, bias)
        return _launch(X, bias, n, _CODES[g.mode], g.alpha)
    return run


for _name, _bind in (("Gelu", bind_gelu), ("BiasGelu", bind_bias_gelu), ("FastGelu", bind_fast_gelu),
                     ("QuickGelu", bind_quick_gelu)):
    op(_name, 1, domain=MS, provider=CUDA, bind=_bind)(launch_gelu)
