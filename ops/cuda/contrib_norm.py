"""CUDA RMS norms: SimplifiedLayerNormalization and com.microsoft SkipSimplifiedLayerNormalization.

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
from runtime.errors import InvalidArgumentError, ShapeMismatchError
from ops._common import norm_axis
from ._common import FLOATS, MAX_ROW_THREADS, block_sum, check_device, fill0, flat, grid1d, row_threads

__all__ = ["SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"]


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


def _check_vec(op, what, v, n):
    if v.size != n:
        raise ShapeMismatchError(f"{op}: {what} must have {n} elements (the normalized extent), "
                                 f"got shape {list(v.shape)}")


def _launch(op, x, rows, n, scale, skip, skip_rows, bias, ydt, eps, want_sum):
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


def SimplifiedLayerNormalization(X, scale, axis=-1, epsilon=1e-5, stash_type=1, *, n_outputs=1):
    """RMSNorm over the axes from ``axis`` on; returns ``Y`` or ``(Y, inv_std_var)``."""
    op = "SimplifiedLayerNormalization"
    check_device(op, X=X, scale=scale)
    if np.dtype(X.dtype) not in FLOATS or np.dtype(scale.dtype) not in FLOATS:
        raise InvalidArgumentError(f"{op}: expected float tensors, got {X.dtype} and {scale.dtype}")
    ax = norm_axis(axis, X.ndim)
    n = int(np.prod(tuple(X.shape)[ax:], dtype=np.int64))
    rows = int(np.prod(tuple(X.shape)[:ax], dtype=np.int64))
    _check_vec(op, "scale", scale, n)
    y, inv, _ = _launch(op, X, rows, n, scale, None, 1, None, scale.dtype, epsilon, False)
    if n_outputs == 1:
        return y
    return y, inv.reshape(tuple(X.shape)[:ax] + (1,) * (X.ndim - ax))


def SkipSimplifiedLayerNormalization(input, skip, gamma, bias=None, epsilon=1e-12, *, n_outputs=1,
                                     outputs_used=None):
    """RMSNorm of ``input + skip (+ bias)`` over the last axis; returns up to (output, mean, inv_std_var, sum).

    ``outputs_used`` (one bool per output, as the node declares them): an output the graph leaves unnamed is
    returned as None and costs nothing; the zero ``mean`` is otherwise one more launch."""
    op = "SkipSimplifiedLayerNormalization"
    check_device(op, input=input, skip=skip, gamma=gamma, bias=bias)
    if input.ndim not in (2, 3):
        raise ShapeMismatchError(f"{op}: input must be 2-d or 3-d, got shape {list(input.shape)}")
    for name, t in (("skip", skip), ("gamma", gamma), ("bias", bias)):
        if t is not None and t.dtype != input.dtype:
            raise InvalidArgumentError(f"{op}: {name} must have the input dtype {input.dtype}, got {t.dtype}")
    n = tuple(input.shape)[-1]
    rows = input.size // n if n else 0
    sq = tuple(skip.shape)
    while len(sq) > 1 and sq[0] == 1:
        sq = sq[1:]
    if len(sq) > input.ndim or sq != tuple(input.shape)[input.ndim - len(sq):] or sq[-1] != n:
        raise ShapeMismatchError(f"{op}: skip of shape {list(skip.shape)} does not match input {list(input.shape)}")
    skip_rows = max(skip.size // n, 1) if n else 1
    _check_vec(op, "gamma", gamma, n)
    if bias is not None:
        _check_vec(op, "bias", bias, n)
    want_sum = n_outputs >= 4
    y, inv, ssum = _launch(op, input, rows, n, gamma, skip, skip_rows, bias, input.dtype, epsilon, want_sum)
    if n_outputs == 1:
        return y
    ss = tuple(input.shape)[:-1] + (1,)
    if outputs_used is not None and not outputs_used[1]:
        mean = None
    else:
        mean = rc.device_empty(ss, np.float32)
    if mean is not None and mean.size:
        blocks, threads = grid1d(mean.size)
        fill0[blocks, threads](flat(mean))
    return (y, mean, inv.reshape(ss), ssum)[:n_outputs]


