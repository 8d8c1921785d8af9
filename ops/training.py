"""Training ops of ``ai.onnx.preview.training``: Adagrad, Momentum, Adam.

Inputs are R (learning rate), T (update count) then the variadic groups
(X..., G..., [V...,] [H...]); each tensor group updates with one flat
elementwise kernel per rule, compiled per float dtype.  Outputs come grouped
the same way (new X..., then the new accumulators).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from .registry import op

__all__ = ["Adagrad", "Momentum", "Adam"]
DOMAIN = "ai.onnx.preview.training"


@njit(cache=True, nogil=True)
def _adagrad(x, g, h, r, eps, norm, xo, ho):
    for i in range(x.shape[0]):
        gr = norm * x[i] + g[i]
        hn = h[i] + gr * gr
        ho[i] = hn
        xo[i] = x[i] - r * gr / (math.sqrt(hn) + eps)


@njit(cache=True, nogil=True)
def _momentum(x, g, v, r, alpha, beta, norm, nesterov, xo, vo):
    for i in range(x.shape[0]):
        gr = norm * x[i] + g[i]
        vn = alpha * v[i] + beta * gr
        vo[i] = vn
        xo[i] = x[i] - r * (gr + alpha * vn if nesterov else vn)


@njit(cache=True, nogil=True)
def _adam(x, g, v, h, r, alpha, beta, eps, norm, norm_post, xo, vo, ho):
    for i in range(x.shape[0]):
        gr = norm * x[i] + g[i]
        vn = alpha * v[i] + (1.0 - alpha) * gr
        hn = beta * h[i] + (1.0 - beta) * gr * gr
        vo[i] = vn
        ho[i] = hn
        xo[i] = (1.0 - norm_post) * (x[i] - r * vn / (math.sqrt(hn) + eps))


def _groups(op_name, args, k):
    if len(args) % k:
        raise InvalidArgumentError(f"{op_name}: expected {k} equally sized input groups, got {len(args)} tensors")
    n = len(args) // k
    gs = [args[i * n:(i + 1) * n] for i in range(k)]
    for j in range(n):
        shapes = [g[j].shape for g in gs]
        if any(s != shapes[0] for s in shapes):
            raise ShapeMismatchError(f"{op_name}: tensor group {j} has mismatched shapes {shapes}")
    return n, gs


def _scalars(R, T):
    return float(np.asarray(R).reshape(-1)[0]), int(np.asarray(T).reshape(-1)[0])


def _flat(a):
    return np.ascontiguousarray(a).reshape(-1)


@op("Adagrad", 1, domain=DOMAIN)
def Adagrad(R, T, *inputs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    r, t = _scalars(R, T)
    r = r / (1.0 + t * decay_factor)
    n, (X, G, H) = _groups("Adagrad", inputs, 3)
    xs, hs = [], []
    for x, g, h in zip(X, G, H):
        xo, ho = np.empty_like(x), np.empty_like(h)
        _adagrad(_flat(x), _flat(g.astype(x.dtype, copy=False)), _flat(h), r, epsilon, norm_coefficient,
                 xo.reshape(-1), ho.reshape(-1))
        xs.append(xo)
        hs.append(ho)
    res = tuple(xs + hs)
    return res[0] if len(res) == 1 else res


@op("Momentum", 1, domain=DOMAIN)
def Momentum(R, T, *inputs, alpha, beta, mode, norm_coefficient):
    if mode not in ("standard", "nesterov"):
        raise InvalidAttributeError(f"Momentum: mode must be 'standard' or 'nesterov', got {mode!r}")
    r, t = _scalars(R, T)
    b = beta if t > 0 else 1.0
    n, (X, G, V) = _groups("Momentum", inputs, 3)
    xs, vs = [], []
    for x, g, v in zip(X, G, V):
        xo, vo = np.empty_like(x), np.empty_like(v)
        _momentum(_flat(x), _flat(g.astype(x.dtype, copy=False)), _flat(v), r, alpha, b, norm_coefficient,
                  mode == "nesterov", xo.reshape(-1), vo.reshape(-1))
        xs.append(xo)
        vs.append(vo)
    res = tuple(xs + vs)
    return res[0] if len(res) == 1 else res


@op("Adam", 1, domain=DOMAIN)
def Adam(R, T, *inputs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.0):
    r, t = _scalars(R, T)
    if t > 0:
        r = r * math.sqrt(1.0 - beta ** t) / (1.0 - alpha ** t)
    n, (X, G, V, H) = _groups("Adam", inputs, 4)
    xs, vs, hs = [], [], []
    for x, g, v, h in zip(X, G, V, H):
        xo, vo, ho = np.empty_like(x), np.empty_like(v), np.empty_like(h)
        _adam(_flat(x), _flat(g.astype(x.dtype, copy=False)), _flat(v), _flat(h), r, alpha, beta, epsilon,
              norm_coefficient, norm_coefficient_post, xo.reshape(-1), vo.reshape(-1), ho.reshape(-1))
        xs.append(xo)
        vs.append(vo)
        hs.append(ho)
    res = tuple(xs + vs + hs)
    return res[0] if len(res) == 1 else res
