"""Random generators: RandomUniform, RandomNormal, RandomUniformLike, RandomNormalLike (1, 22),
Bernoulli (15, 22) and Multinomial (7, 22); and Dropout (1, 10, 12), whose training mode draws its mask.

Every node owns its generator: a splitmix64 state (one uint64 in a small
array) created when the node is bound, seeded from the ``seed`` attribute
or, without one, from fresh OS entropy.  Each run advances the node's state,
so repeated runs draw new numbers, and two sessions built with the same seed
draw the same sequence (as onnxruntime's kernels do).  Nothing touches
numpy's or numba's global random state.

Invariants:
- the numbers are not those of any other implementation: the spec says
  these ops may differ between implementations even with a seed;
- uniform draws lie in [low, high); normal draws use Box-Muller on 53-bit
  uniforms; 16-bit outputs are drawn in float32 and rounded once;
- Bernoulli returns 1 where u < p (so p <= 0 never and p >= 1 always fires);
- Multinomial treats each row of its input as unnormalized log-probabilities
  and returns class indices (batch, sample_size) in ``dtype`` (int32/int64);
- outputs are fresh arrays (Dropout, registered with ``views=True``, may return its input); the generator
  state is guarded by the plan's lock;
- Dropout with a seed draws as the ONNX reference does (numpy's legacy MT19937), so seeded runs reproduce it;
  without one, a fresh stream.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from runtime.dtypes import np_dtype
from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, lowp
from .registry import op

F64 = np.dtype(np.float64)
_FLOAT_OUT = {"float16", "float32", "float64", "bfloat16"}
_INV53 = 1.0 / 9007199254740992.0  # 2**-53


# -- kernels ---------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def _uniform_kernel(state, out, low, high):
    """out (flat, float32/float64) <- U[low, high); advances state[0] by out.size steps."""
    s = state[0]
    step = np.uint64(0x9E3779B97F4A7C15)
    span = high - low
    for i in range(out.size):
        s += step
        u = np.float64(_mix(s) >> np.uint64(11)) * _INV53
        v = low + span * u
        if v >= high and span > 0.0:  # rounding of low + span*u may reach high
            v = low
        out[i] = v
    state[0] = s


@njit(cache=True, nogil=True)
def _normal_kernel(state, out, mean, scale):
    """out (flat, float32/float64) <- N(mean, scale^2) by Box-Muller; advances state[0]."""
    s = state[0]
    step = np.uint64(0x9E3779B97F4A7C15)
    n = out.size
    i = 0
    while i < n:
        s += step
        u1 = 1.0 - np.float64(_mix(s) >> np.uint64(11)) * _INV53  # (0, 1]
        s += step
        u2 = np.float64(_mix(s) >> np.uint64(11)) * _INV53
        r = math.sqrt(-2.0 * math.log(u1))
        out[i] = mean + scale * r * math.cos(2.0 * math.pi * u2)
        if i + 1 < n:
            out[i + 1] = mean + scale * r * math.sin(2.0 * math.pi * u2)
        i += 2
    state[0] = s


@njit(cache=True, nogil=True)
def _bernoulli_kernel(state, p, out):
    """out (flat bool) <- u < p[i] with u ~ U[0, 1); p flat float32/float64."""
    s = state[0]
    step = np.uint64(0x9E3779B97F4A7C15)
    for i in range(p.size):
        s += step
        u = np.float64(_mix(s) >> np.uint64(11)) * _INV53
        out[i] = u < p[i]
    state[0] = s


@njit(cache=True, nogil=True)
def _multinomial_kernel(state, logits, out, cdf):
    """logits (batch, C) float32/float64, out (batch, n) int64, cdf (C,) float64 scratch."""
    s = state[0]
    step = np.uint64(0x9E3779B97F4A7C15)
    batch, C = logits.shape
    n = out.shape[1]
    for b in range(batch):
        m = -np.inf
        for c in range(C):
            if logits[b, c] > m:
                m = logits[b, c]
        tot = 0.0
        for c in range(C):
            if m == -np.inf or logits[b, c] == -np.inf:
                e = 0.0
            else:
                e = math.exp(np.float64(logits[b, c]) - m)
            tot += e
            cdf[c] = tot
        for k in range(n):
            s += step
            u = np.float64(_mix(s) >> np.uint64(11)) * _INV53 * tot
            # first class whose cumulative mass exceeds u (binary search)
            lo = 0
            hi = C - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if cdf[mid] > u:
                    hi = mid
                else:
                    lo = mid + 1
            out[b, k] = lo
    state[0] = s


# -- helpers ---------------------------------------------------------------------------------------

def _new_state(seed) -> np.ndarray:
    """A one-word generator state: from ``seed`` (a float attribute) when given, else from the process-wide
    seed of ``runtime.set_seed`` when one was set (every unseeded node then starts from it, as in onnxruntime),
    else fresh entropy."""
    if seed is None:
        from runtime.environment import seed as global_seed
        seed = global_seed()
    if seed is None:
        word = np.random.SeedSequence().generate_state(1, np.uint64)[0]
    else:
        bits = np.array([float(seed)], np.float64).view(np.uint64)[0]
        word = np.uint64(0x2545F4914F6CDD1D) ^ bits
    return np.array([word], np.uint64)


def _float_dtype(op_name, dtype) -> np.dtype:
    try:
        dt = np_dtype(int(dtype))
    except TypeError:
        dt = None
    if dt is None or dt.name not in _FLOAT_OUT:
        raise InvalidAttributeError(f"{op_name}: dtype must be float16, bfloat16, float or double, got {dtype}")
    return dt


def _shape(op_name, shape) -> tuple:
    if shape is None:
        raise InvalidAttributeError(f"{op_name}: the shape attribute is required")
    shp = tuple(int(d) for d in shape)
    if any(d < 0 for d in shp):
        raise InvalidAttributeError(f"{op_name}: shape dims must be nonnegative, got {list(shp)}")
    return shp


def _draw(kernel, state, shape, dt, a, b) -> np.ndarray:
    cd = F64 if dt == F64 else F32
    out = np.empty(shape, cd)
    kernel(state, out.reshape(-1), float(a), float(b))
    return out if cd == dt else out.astype(dt)


# -- ops -------------------------------------------------------------------------------------------

@op("RandomUniform", 1, factory=True)
@op("RandomUniform", 22, factory=True)
def RandomUniform(ctx, dtype=1, high=1.0, low=0.0, seed=None, shape=None):
    dt, shp, state = _float_dtype("RandomUniform", dtype), _shape("RandomUniform", shape), _new_state(seed)
    return lambda: _draw(_uniform_kernel, state, shp, dt, low, high)


@op("RandomNormal", 1, factory=True)
@op("RandomNormal", 22, factory=True)
def RandomNormal(ctx, dtype=1, mean=0.0, scale=1.0, seed=None, shape=None):
    dt, shp, state = _float_dtype("RandomNormal", dtype), _shape("RandomNormal", shape), _new_state(seed)
    return lambda: _draw(_normal_kernel, state, shp, dt, mean, scale)


def _like_dtype(op_name, input, dtype):
    if dtype is not None:
        return _float_dtype(op_name, dtype)
    if input.dtype.name not in _FLOAT_OUT:
        raise InvalidAttributeError(f"{op_name}: without a dtype attribute the input must be a float tensor, "
                                    f"got {input.dtype}")
    return input.dtype


def _draw_like(op_name, kernel, dtype, seed, a, b):
    """The per-run callable of a ``*Like`` generator: ``kernel``'s draws in the shape (and, without a
    ``dtype``, the float type) of its input."""
    if dtype is not None:
        _float_dtype(op_name, dtype)
    state = _new_state(seed)
    return lambda input: _draw(kernel, state, input.shape, _like_dtype(op_name, input, dtype), a, b)


@op("RandomUniformLike", 1, factory=True)
@op("RandomUniformLike", 22, factory=True)
def RandomUniformLike(ctx, dtype=None, high=1.0, low=0.0, seed=None):
    return _draw_like("RandomUniformLike", _uniform_kernel, dtype, seed, low, high)


@op("RandomNormalLike", 1, factory=True)
@op("RandomNormalLike", 22, factory=True)
def RandomNormalLike(ctx, dtype=None, mean=0.0, scale=1.0, seed=None):
    return _draw_like("RandomNormalLike", _normal_kernel, dtype, seed, mean, scale)


@op("Bernoulli", 15, factory=True)
@op("Bernoulli", 22, factory=True)
def Bernoulli(ctx, dtype=None, seed=None):
    out_dt = None if dtype is None else np_dtype(int(dtype))
    state = _new_state(seed)

    def run(input):
        if input.dtype.name not in _FLOAT_OUT:
            raise InvalidArgumentError(f"Bernoulli: input must hold float probabilities, got {input.dtype}")
        p = input if input.dtype in (F32, F64) else input.astype(F32)
        hits = np.empty(input.shape, np.bool_)
        _bernoulli_kernel(state, np.ascontiguousarray(p).reshape(-1), hits.reshape(-1))
        return hits.astype(out_dt if out_dt is not None else input.dtype)
    return run


@op("Multinomial", 7, factory=True)
@op("Multinomial", 22, factory=True)
def Multinomial(ctx, dtype=6, sample_size=1, seed=None):
    out_dt = np_dtype(int(dtype))
    if out_dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise InvalidAttributeError(f"Multinomial: dtype must be int32 (6) or int64 (7), got {dtype}")
    n = int(sample_size)
    if n < 0:
        raise InvalidAttributeError(f"Multinomial: sample_size must be nonnegative, got {n}")
    state = _new_state(seed)

    def run(input):
        if input.ndim != 2:
            raise ShapeMismatchError(f"Multinomial: input must be 2-d (batch_size, class_size), got shape "
                                     f"{list(input.shape)}")
        if input.dtype.name not in _FLOAT_OUT:
            raise InvalidArgumentError(f"Multinomial: input must hold float log-probabilities, got {input.dtype}")
        batch, C = input.shape
        if C == 0 and batch and n:
            raise ShapeMismatchError("Multinomial: class_size must be at least 1 to draw samples")
        x = input if input.dtype in (F32, F64) else input.astype(F32)
        out = np.empty((batch, n), np.int64)
        if out.size:
            _multinomial_kernel(state, np.ascontiguousarray(x), out, np.empty(C, np.float64))
        return out if out_dt == out.dtype else out.astype(out_dt)
    return run


@njit(cache=True)
def _dropout_apply(x, u, ratio, scale, y, mask):
    for i in range(x.size):
        keep = u[i] >= ratio
        mask[i] = keep
        y[i] = x[i] * scale if keep else x[i] * 0


# -- Dropout ---------------------------------------------------------------------------------------

def _dropout(x, ratio, training, seed, ctx, mask_dtype):
    """(output, mask) when the node has a mask output (mask None when unused), else the output alone."""
    n_out = ctx.n_outputs if ctx is not None else 1
    want_mask = n_out > 1 and ctx.outputs_used[1]
    if not training or ratio == 0:
        if n_out == 1:
            return x
        return x, (np.ones(x.shape, mask_dtype) if want_mask else None)
    if not 0 <= ratio < 1:
        raise InvalidArgumentError(f"Dropout: ratio must lie in [0, 1), got {ratio}")
    # With a seed, draw exactly as the ONNX reference does (legacy MT19937 uniform doubles) so seeded runs
    # are reproducible against it; without one, any fresh stream will do.
    if seed is not None:
        u = np.random.RandomState(int(seed)).uniform(0.0, 1.0, x.size)
    else:
        u = np.random.default_rng().random(x.size)
    xf = np.ascontiguousarray(x, dtype=F32) if (lowp(x.dtype) or x.dtype.kind != "f") else np.ascontiguousarray(x)
    y = np.empty(x.shape, xf.dtype)
    mask = np.empty(x.shape, np.bool_)
    if x.size:
        _dropout_apply(xf.reshape(-1), u, float(ratio), xf.dtype.type(1.0 / (1.0 - ratio)), y.reshape(-1),
                       mask.reshape(-1))
    if y.dtype != x.dtype:
        y = y.astype(x.dtype)
    if n_out == 1:
        return y
    return y, (mask.astype(mask_dtype) if want_mask else None)


@op("Dropout", 1, views=True)
def Dropout_1(data, is_test=0, ratio=0.5, consumed_inputs=None, *, ctx):
    # Old Dropout only ran for training; runtimes treat it as inference (identity).
    return _dropout(data, ratio, False, None, ctx, data.dtype)


@op("Dropout", 10, views=True)
def Dropout_10(data, ratio=0.5, *, ctx):
    return _dropout(data, ratio, False, None, ctx, np.bool_)


@op("Dropout", 12, views=True)
def Dropout(data, ratio=None, training_mode=None, seed=None, *, ctx):
    r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
    t = False if training_mode is None else bool(np.asarray(training_mode).reshape(-1)[0])
    return _dropout(data, r, t, seed, ctx, np.bool_)
