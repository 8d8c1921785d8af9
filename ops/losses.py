"""Loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Invariants:
- inputs are viewed as (N, C, D) scores/log-probabilities and (N, D) targets, so each kernel compiles once per
  float dtype whatever the rank; 16-bit floats are computed in float32 and rounded back;
- every target that is not ``ignore_index`` is checked against [0, C) in the wrapper before a kernel reads
  memory, raising ``IndexOutOfRangeError`` naming the op, the offending target and the valid range;
- ``mean`` divides the summed loss by the summed weight of the non-ignored targets (weight 1 when no weight
  input), as the spec states; sums accumulate in float64.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from runtime.errors import IndexOutOfRangeError, InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, lowp
from .registry import op

I64 = np.dtype(np.int64)


@njit(cache=True)
def _k_nll(x, t, w, ii, use_ii, loss):
    """loss[n, d] = -x[n, t, d] * w[t] (0 where t == ii); returns (sum of loss, sum of applied weights)."""
    N, C, D = x.shape
    lsum = 0.0
    wsum = 0.0
    for n in range(N):
        for d in range(D):
            c = t[n, d]
            if use_ii and c == ii:
                loss[n, d] = 0.0
                continue
            wc = w[c]
            v = -x[n, c, d] * wc
            loss[n, d] = v
            lsum += v
            wsum += wc
    return lsum, wsum


@njit(cache=True)
def _k_log_softmax(x, y):
    """y = log_softmax(x) over axis 1 of (N, C, D)."""
    N, C, D = x.shape
    for n in range(N):
        for d in range(D):
            m = -np.inf
            for c in range(C):
                if x[n, c, d] > m:
                    m = x[n, c, d]
            s = 0.0
            for c in range(C):
                s += np.exp(np.float64(x[n, c, d] - m))
            ls = np.log(s)
            for c in range(C):
                y[n, c, d] = np.float64(x[n, c, d] - m) - ls


def _prepare(opname, x, target, weight, ignore_index, reduction):
    if reduction not in ("none", "sum", "mean"):
        raise InvalidAttributeError(f"{opname}: reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    if x.ndim < 2:
        raise ShapeMismatchError(f"{opname}: input must have shape (N, C, d1, ...), got {list(x.shape)}")
    if x.dtype.kind != "f" and not lowp(x.dtype):
        raise InvalidArgumentError(f"{opname}: input must be floating point, got {x.dtype}")
    N, C = x.shape[0], x.shape[1]
    if target.shape != (N,) + x.shape[2:]:
        raise ShapeMismatchError(f"{opname}: target must have shape {[N, *x.shape[2:]]}, got {list(target.shape)}")
    if target.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{opname}: target must be integers, got {target.dtype}")
    t = target.astype(I64)
    check = t if ignore_index is None else t[t != int(ignore_index)]
    if check.size:
        lo, hi = check.min(), check.max()
        if lo < 0 or hi >= C:
            bad = int(lo if lo < 0 else hi)
            raise IndexOutOfRangeError(f"{opname}: target {bad} is out of bounds; valid range is [0, {C - 1}]"
                                       + ("" if ignore_index is None else f" or ignore_index {int(ignore_index)}"))
    cdt = F32 if lowp(x.dtype) else x.dtype
    if weight is None:
        w = np.ones(C, cdt)
    else:
        if weight.shape != (C,):
            raise ShapeMismatchError(f"{opname}: weight must have shape [{C}], got {list(weight.shape)}")
        w = weight.astype(cdt)
    D = 1
    for s in x.shape[2:]:
        D *= s
    return t.reshape(N, D), w, cdt, (N, C, D)


def _nll(x3, t2, w, ignore_index, reduction, target_shape, cdt, out_dtype):
    loss = np.empty(t2.shape, cdt)
    ii = 0 if ignore_index is None else int(ignore_index)
    lsum, wsum = _k_nll(x3, t2, w, ii, ignore_index is not None, loss)
    if reduction == "none":
        return loss.reshape(target_shape).astype(out_dtype, copy=False)
    if reduction == "sum":
        return np.array(lsum, out_dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.array(np.float64(lsum) / np.float64(wsum), out_dtype)


@op("NegativeLogLikelihoodLoss", 12)
def NegativeLogLikelihoodLoss(input, target, weight=None, ignore_index=None, reduction="mean"):
    x = input
    t2, w, cdt, shape3 = _prepare("NegativeLogLikelihoodLoss", x, target, weight, ignore_index, reduction)
    x3 = np.ascontiguousarray(x.astype(cdt, copy=False)).reshape(shape3)
    return _nll(x3, t2, w, ignore_index, reduction, target.shape, cdt, x.dtype)


op("NegativeLogLikelihoodLoss", 13)(NegativeLogLikelihoodLoss)
op("NegativeLogLikelihoodLoss", 22)(NegativeLogLikelihoodLoss)


@op("SoftmaxCrossEntropyLoss", 12)
def SoftmaxCrossEntropyLoss(scores, labels, weights=None, ignore_index=None, reduction="mean", *, ctx=None):
    x = scores
    t2, w, cdt, shape3 = _prepare("SoftmaxCrossEntropyLoss", x, labels, weights, ignore_index, reduction)
    x3 = np.ascontiguousarray(x.astype(cdt, copy=False)).reshape(shape3)
    logp = np.empty(shape3, cdt)
    _k_log_softmax(x3, logp)
    loss = _nll(logp, t2, w, ignore_index, reduction, labels.shape, cdt, x.dtype)
    if ctx is not None and ctx.n_outputs > 1:
        if not ctx.outputs_used[1]:
            return loss, None
        return loss, logp.reshape(x.shape).astype(x.dtype, copy=False)
    return loss


op("SoftmaxCrossEntropyLoss", 13)(SoftmaxCrossEntropyLoss)
