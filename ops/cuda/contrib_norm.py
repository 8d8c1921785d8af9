"""CUDA RMS norms: SimplifiedLayerNormalization and com.microsoft SkipSimplifiedLayerNormalization.

The ops are written once in ``ops/contrib_norm.py`` (their bind, ``RowNorm``, and ``row_geometry``'s checks
and messages); this module is their launch.

One block per row of the canonical ``(rows, n)`` view (n = the normalized trailing extent):
``y = x * rsqrt(mean(x^2) + eps) * scale``, accumulated in float32.  The skip form first forms
``s = input + skip (+ bias)`` (a skip with fewer leading rows broadcasts as ``row % skip_rows``, like the CPU
kernel) and may also return ``s``.

Invariants (match ``ops/contrib_norm.py``):
- ``Y`` has the dtype of ``scale`` for SimplifiedLayerNormalization and of ``input`` for the skip form;
- ``inv_std_var`` is float32 of shape ``x.shape[:axis] + (1,) * (rank - axis)``; the skip form's ``mean``
  output is zeros (onnxruntime does not compute it);
- all tensors are C-contiguous device arrays; nothing is read back to the host.
"""
from __future__ import annotations

import math

import numpy as np

from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ops import contrib_norm as cn
from ops._common import norm_axis
from ops.registry import op
from ._common import FLOATS, MAX_ROW_THREADS, block_sum, check_device, fill0, flat, grid1d, row_threads

__all__ = ["launch", "geometry"]

CUDA = "CUDAExecutionProvider"
MS = "com.microsoft"


@jit
def _rms_rows(x, skip, skip_rows, bias, has_skip, has_bias, scale, y, ssum, want_sum, inv_out, n, eps):
    sh = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    base = row * n
    sbase = (row % skip_rows) * n
    acc = np.float32(0.0)
    for j in range(tid, n, nt):
        v = np.float32(x[base + j])
        if has_skip:
            v += np.float32(skip[sbase + j])
            if has_bias:
                v += np.float32(bias[j])
            if want_sum:
                ssum[base + j] = v
        acc += v * v
    total = block_sum(sh, tid, nt, acc)
    inv = np.float32(1.0) / math.sqrt(total / np.float32(n) + eps)
    if tid == 0:
        inv_out[row] = inv
    for j in range(tid, n, nt):
        v = np.float32(x[base + j])
        if has_skip:
            v += np.float32(skip[sbase + j])
            if has_bias:
                v += np.float32(bias[j])
        y[base + j] = v * inv * np.float32(scale[j])


def _launch(x, rows, n, scale, skip, skip_rows, bias, ydt, eps, want_sum):
    y = rc.device_empty(tuple(x.shape), ydt)
    inv = rc.device_empty((rows,), np.float32)
    ssum = rc.device_empty(tuple(x.shape), x.dtype) if want_sum else rc.device_empty((1,), x.dtype)
    if rows and n:
        dummy = flat(x)
        _rms_rows[rows, row_threads(n)](
            flat(x), flat(skip) if skip is not None else dummy, skip_rows,
            flat(bias) if bias is not None else dummy, skip is not None, bias is not None,
            flat(scale), flat(y), flat(ssum), bool(want_sum), inv, n, np.float32(eps))
    return y, inv, ssum


def geometry(b: cn.RowNorm, x, skip, scale, beta, bias):
    """The bound op's ``(ax, rows, n, skip_rows)`` for these device arrays: the CPU's checks and messages."""
    ax = norm_axis(b.axis, x.ndim)
    shape = tuple(x.shape) or (1,)
    rows, n, skip_rows, err = cn.row_geometry(shape, ax, scale.size, -1 if beta is None else beta.size,
                                              -1 if bias is None else bias.size,
                                              shape if skip is None else tuple(skip.shape), skip is not None)
    if err:
        cn.raise_norm_error(b, err)
    return ax, rows, n, skip_rows


def launch(b: cn.RowNorm, ctx=None):
    """The CUDA implementation of the RMS norms (SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization):
    the bound op's per-run callable.  Outputs the graph leaves unnamed are returned as None and cost nothing;
    the skip form's zero ``mean`` is otherwise one more launch."""
    used = list(ctx.outputs_used) if ctx is not None and ctx.outputs_used else [True] * b.n_outputs

    def run(*args):
        x, skip, scale, _, bias = b.operands(args)
        check_device(b.op, input=x, skip=skip, scale=scale, bias=bias)
        if np.dtype(x.dtype) not in FLOATS or np.dtype(scale.dtype) not in FLOATS:
            raise InvalidArgumentError(f"{b.op}: expected float tensors, got {x.dtype} and {scale.dtype}")
        for name, t in (("skip", skip), ("gamma", scale if b.skip else None), ("bias", bias)):
            if t is not None and t.dtype != x.dtype:
                raise InvalidArgumentError(f"{b.op}: {name} must have the input dtype {x.dtype}, got {t.dtype}")
        ax, rows, n, skip_rows = geometry(b, x, skip, scale, None, bias)
        ydt = x.dtype if b.skip else scale.dtype
        y, inv, ssum = _launch(x, rows, n, scale, skip, skip_rows, bias, ydt, b.eps, b.want_sum)
        if b.n_outputs == 1:
            return y
        ss = tuple(x.shape)[:ax] + (1,) * (x.ndim - ax)
        if not b.skip:
            return y, inv.reshape(ss)
        mean = None
        if len(used) < 2 or used[1]:
            mean = rc.device_empty(ss, np.float32)
            if mean.size:
                blocks, threads = grid1d(mean.size)
                fill0[blocks, threads](flat(mean))
        return (y, mean, inv.reshape(ss), ssum)[:b.n_outputs]
    return run


for _dom in ("", MS):
    op("SimplifiedLayerNormalization", 1, domain=_dom, provider=CUDA, bind=cn.bind_simplified)(launch)
op("SkipSimplifiedLayerNormalization", 1, domain=MS, provider=CUDA, bind=cn.bind_skip_simplified)(launch)
