"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax, ArgMin.

Every reduction is canonicalized to a 3-d view ``(outer, n, inner)`` with the
reduced extent in the middle, so one kernel per dtype serves every rank and
axes set.  Reduced axes that are not adjacent (after dropping extent-1 axes)
are reduced one adjacent run at a time for the modes that compose (sum, max,
min, prod, float mean); the others first move them last with one transposing
copy.  16-bit floats are
computed in float32; floats accumulate in float64 and integers in their own
(wrapping) type.  A reduction over an empty set yields the op's identity
(0, 1, -inf, +inf, or the dtype's extreme for integers).

Axes arrive as an attribute up to opset 12 (ReduceSum) / 17 (the others) and
as an optional int64 input from 13 / 18; ``noop_with_empty_axes`` with no
axes reduces over nothing, i.e. applies the op's elementwise part only.

The reductions, ArgMax and ArgMin are written to the one op contract
(``ops/registry.py``): one bind per group of versions (``REDUCE_BINDS``:
``bind_reduce_1`` with the axes attribute, ``bind_reduce`` with the axes input
and ``noop_with_empty_axes``), shared by the CPU wrapper and, for ReduceSum,
the region form in ``ops/compiled_forms.py``.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError
from ._common import F32, Resolved, as_int_list, lowp, norm_axis, norm_axes, out_buffer, value_key
from ._fastmath import maxnum, minnum
from .registry import op

__all__ = ["canon3", "reduce_shape", "REDUCE_BINDS", "REDUCE_MODES", "ReduceOp", "reduce_axes", "reduce_cpu"]

_OPTS = dict(cache=True, nogil=True, error_model="numpy")

SUM, SUMSQ, L1, L2, MEAN, MAX, MIN, PROD, LOGSUM, LOGSUMEXP = range(10)
BOOL = np.dtype(bool)
F64 = np.dtype(np.float64)


# -- kernels ---------------------------------------------------------------------------------------

@njit(**_OPTS)
def _row_sum(x, o, n, mode, z):
    """Sum of ``x[o, :, 0]`` mapped by ``mode`` (plain, square, abs), with four accumulators of ``z``'s type."""
    s0 = z
    s1 = z
    s2 = z
    s3 = z
    n4 = n - n % 4
    if mode == SUMSQ or mode == L2:
        for k in range(0, n4, 4):
            a = x[o, k, 0]
            b = x[o, k + 1, 0]
            c = x[o, k + 2, 0]
            d = x[o, k + 3, 0]
            s0 += a * a
            s1 += b * b
            s2 += c * c
            s3 += d * d
        for k in range(n4, n):
            a = x[o, k, 0]
            s0 += a * a
    elif mode == L1:
        for k in range(0, n4, 4):
            s0 += abs(x[o, k, 0])
            s1 += abs(x[o, k + 1, 0])
            s2 += abs(x[o, k + 2, 0])
            s3 += abs(x[o, k + 3, 0])
        for k in range(n4, n):
            s0 += abs(x[o, k, 0])
    else:
        for k in range(0, n4, 4):
            s0 += x[o, k, 0]
            s1 += x[o, k + 1, 0]
            s2 += x[o, k + 2, 0]
            s3 += x[o, k + 3, 0]
        for k in range(n4, n):
            s0 += x[o, k, 0]
    return (s0 + s1) + (s2 + s3)


@njit(**_OPTS)
def reduce3(x, out, acc, mode):
    """Reduce ``x`` (outer, n, inner) over axis 1 into ``out`` (outer, inner).

    ``acc`` is (2, inner) scratch of the accumulator dtype, zeroed by the caller.
    """
    outer, n, inner = x.shape
    z = acc[1, 0]
    a = acc[0]
    for o in range(outer):
        if mode == MAX or mode == MIN or mode == LOGSUMEXP:
            for i in range(inner):
                a[i] = x[o, 0, i]
            if mode == MIN:
                for k in range(1, n):
                    for i in range(inner):
                        v = x[o, k, i]
                        if v < a[i] or v != v:
                            a[i] = v
            else:
                for k in range(1, n):
                    for i in range(inner):
                        v = x[o, k, i]
                        if v > a[i] or v != v:
                            a[i] = v
            if mode == LOGSUMEXP:
                s = acc[1]
                for i in range(inner):
                    s[i] = 0.0
                for k in range(n):
                    for i in range(inner):
                        s[i] += math.exp(x[o, k, i] - a[i])
                for i in range(inner):
                    m = a[i]
                    out[o, i] = m if math.isinf(m) else m + math.log(s[i])
            else:
                for i in range(inner):
                    out[o, i] = a[i]
            continue
        if mode == PROD:
            for i in range(inner):
                a[i] = z + 1
            for k in range(n):
                for i in range(inner):
                    a[i] *= x[o, k, i]
        elif inner == 1:
            a[0] = _row_sum(x, o, n, mode, z)
        else:
            for i in range(inner):
                a[i] = z
            if mode == SUMSQ or mode == L2:
                for k in range(n):
                    for i in range(inner):
                        v = x[o, k, i]
                        a[i] += v * v
            elif mode == L1:
                for k in range(n):
                    for i in range(inner):
                        a[i] += abs(x[o, k, i])
            else:
                for k in range(n):
                    for i in range(inner):
                        a[i] += x[o, k, i]
        if mode == L2 or mode == MEAN or mode == LOGSUM:
            for i in range(inner):
                out[o, i] = _finish(out, a[i], n, mode)
        else:  # integer sums stay integers
            for i in range(inner):
                out[o, i] = a[i]


@njit(inline="always", **_OPTS)
def _finish(out, a, n, mode):
    """The output value of a float sum ``a`` of ``n`` terms (``mode``: its square root, mean or log; else as
    is)."""
    if mode == L2:
        return math.sqrt(a)
    if mode == MEAN:
        # a sum past the output type's range is infinite, as in onnxruntime's float32 accumulation
        return a if math.isinf(out.dtype.type(a)) else a / n
    if mode == LOGSUM:
        v = out.dtype.type(a) if math.isinf(out.dtype.type(a)) else a
        return math.log(v) if v > 0 else (-math.inf if v == 0 else math.nan)
    return a


_ROWS_PARALLEL_MIN = 1 << 16  # elements from which ``reduce_rows`` spreads its rows over the threads


@njit(parallel=True, **_OPTS)
def reduce_rows(x, out, mode):
    """Float ``x`` (outer, n) reduced over its rows into ``out`` (outer,) for the summing modes (sum, square,
    abs, L2, mean, log-sum): each row's float64 sum with its additions reassociated, so the loop vectorizes (the
    in-order sums ran at one element per add's latency); rows over the threads for large inputs."""
    outer, n = x.shape
    if outer * n < _ROWS_PARALLEL_MIN:
        for o in range(outer):
            out[o] = _finish(out, _fast_sum(x[o], mode), n, mode)
    else:
        for o in prange(outer):
            out[o] = _finish(out, _fast_sum(x[o], mode), n, mode)


@njit(parallel=True, **_OPTS)
def extreme_rows(x, out, is_max):
    """Float ``x`` (outer, n) reduced to each row's max (``is_max``) or min, with ``reduce3``'s bits: a NaN past
    the first element gives the last such NaN, a first-element NaN stays, otherwise the extreme, and of equal
    extremes the first (a zero keeps its sign).  The extreme is a ``maxnum``/``minnum`` reduction and the NaN
    test an or-reduction, both vectorized; the rare rows with a NaN or a zero extreme are scanned again."""
    outer, n = x.shape
    if outer * n < _ROWS_PARALLEL_MIN:
        for o in range(outer):
            out[o] = _extreme(x[o], is_max)
    else:
        for o in prange(outer):
            out[o] = _extreme(x[o], is_max)


@njit(**_OPTS)
def _extreme(r, is_max):
    n = r.shape[0]
    m = r[0]
    nan = False
    if is_max:
        for k in range(n):
            m = maxnum(m, r[k])
            nan |= r[k] != r[k]
    else:
        for k in range(n):
            m = minnum(m, r[k])
            nan |= r[k] != r[k]
    if nan:
        for k in range(n - 1, 0, -1):
            if r[k] != r[k]:
                return r[k]
        return r[0]
    if m == 0:
        for k in range(n):
            if r[k] == 0:
                return r[k]
    return m


@njit(fastmath={"reassoc"}, **_OPTS)
def _fast_sum(r, mode):
    acc = 0.0
    if mode == SUMSQ or mode == L2:
        for k in range(r.shape[0]):
            acc += r[k] * r[k]
    elif mode == L1:
        for k in range(r.shape[0]):
            acc += abs(r[k])
    else:
        for k in range(r.shape[0]):
            acc += r[k]
    return acc


@njit(**_OPTS)
def _arg3(x, out, is_max, last):
    """Index of the max (``is_max``) or min along axis 1 of ``x`` (outer, n, inner); first or ``last`` tie wins."""
    outer, n, inner = x.shape
    for o in range(outer):
        for i in range(inner):
            best = x[o, 0, i]
            bi = 0
            if is_max and last:
                for k in range(1, n):
                    if x[o, k, i] >= best:
                        best = x[o, k, i]
                        bi = k
            elif is_max:
                for k in range(1, n):
                    if x[o, k, i] > best:
                        best = x[o, k, i]
                        bi = k
            elif last:
                for k in range(1, n):
                    if x[o, k, i] <= best:
                        best = x[o, k, i]
                        bi = k
            else:
                for k in range(1, n):
                    if x[o, k, i] < best:
                        best = x[o, k, i]
                        bi = k
            out[o, i] = bi


# -- canonicalization ------------------------------------------------------------------------------

def canon3(shape: tuple, axes: tuple):
    """``((outer, n, inner), perm)`` for reducing sorted ``axes`` of ``shape``.

    ``perm`` is None when the reduced axes are adjacent once extent-1 axes are
    ignored (the input reshapes in place); otherwise it is the transpose that
    moves them last (then ``inner == 1``).
    """
    red = set(axes)
    live = [ax for ax in range(len(shape)) if shape[ax] != 1]
    rl = [ax for ax in live if ax in red]
    n = int(math.prod([shape[a] for a in rl])) if rl else 1
    if not rl:
        return (int(math.prod(shape)), 1, 1), None
    first, lastr = live.index(rl[0]), live.index(rl[-1])
    if lastr - first + 1 == len(rl):
        outer = int(math.prod([shape[a] for a in live[:first]]))
        inner = int(math.prod([shape[a] for a in live[lastr + 1:]]))
        return (outer, n, inner), None
    kept = [ax for ax in range(len(shape)) if ax not in red]
    perm = tuple(kept) + tuple(sorted(red))
    outer = int(math.prod([shape[a] for a in kept]))
    return (outer, n, 1), perm


def adjacent_runs(axes) -> list:
    """Sorted axes grouped into runs of adjacent ones (the modes that compose reduce one run at a time)."""
    runs: list = []
    for ax in axes:
        if runs and runs[-1][-1] == ax - 1:
            runs[-1].append(ax)
        else:
            runs.append([ax])
    return runs


def reduce_shape(shape: tuple, axes: tuple, keepdims) -> tuple:
    if keepdims:
        return tuple(1 if ax in axes else d for ax, d in enumerate(shape))
    return tuple(d for ax, d in enumerate(shape) if ax not in axes)


def view3(x: np.ndarray, axes: tuple) -> np.ndarray:
    """``x`` as a C-contiguous (outer, n, inner) array reducing ``axes`` over its middle axis."""
    shp3, perm = canon3(x.shape, axes)
    if perm is not None:
        x = x.transpose(perm)
    return np.ascontiguousarray(x).reshape(shp3)


def _identity(mode: int, dt: np.dtype):
    if mode in (SUM, SUMSQ, L1, L2):
        return 0
    if mode == PROD:
        return 1
    if mode == MEAN:
        return np.nan if dt.kind == "f" else 0
    if mode in (LOGSUM, LOGSUMEXP):
        return -np.inf if dt.kind == "f" else np.iinfo(dt).min
    if dt == BOOL:
        return mode == MIN
    if dt.kind == "f":
        return -np.inf if mode == MAX else np.inf
    info = np.iinfo(dt)
    return info.min if mode == MAX else info.max


def run_reduce(mode: int, x: np.ndarray, axes: tuple, keepdims, buf=None) -> np.ndarray:
    """Reduce ``x`` over normalized, sorted ``axes`` with ``mode``."""
    dt = x.dtype
    oshape = reduce_shape(x.shape, axes, keepdims)
    if dt == BOOL:
        if mode not in (MAX, MIN):
            raise InvalidArgumentError(f"reduction mode {mode} does not accept bool inputs")
        if canon3(x.shape, axes)[0][1] == 0:
            return np.full(oshape, mode == MIN, BOOL)
        return run_reduce(mode, x.view(np.uint8), axes, keepdims).view(BOOL)
    if lowp(dt):
        return run_reduce(mode, x.astype(F32), axes, keepdims).astype(dt)
    if dt.kind not in "fiu":
        raise InvalidArgumentError(f"reductions expect a numeric tensor, got {dt}")
    out = out_buffer(buf, oshape, dt)
    if out.size == 0:
        return out
    shp3, perm = canon3(x.shape, axes)
    if shp3[1] == 0:
        out.fill(_identity(mode, dt))
        return out
    if perm is not None and (mode in (SUM, MAX, MIN, PROD) or (mode == MEAN and dt.kind == "f")):
        # These modes compose: reduce each run of adjacent axes in place, last run first, instead of
        # transposing the whole input.
        y = x
        for r in reversed(adjacent_runs(axes)):
            y = run_reduce(mode, y, tuple(r), 1)
        out[...] = y.reshape(oshape)
        return out
    x3 = view3(x, axes)
    if shp3[2] == 1 and dt.kind == "f" and mode in (SUM, SUMSQ, L1, L2, MEAN, LOGSUM):
        reduce_rows(x3.reshape(shp3[0], shp3[1]), out.reshape(shp3[0]), mode)
        return out
    if shp3[2] == 1 and dt.kind == "f" and mode in (MAX, MIN):
        extreme_rows(x3.reshape(shp3[0], shp3[1]), out.reshape(shp3[0]), mode == MAX)
        return out
    float_acc = dt.kind == "f" or mode in (L2, LOGSUM, LOGSUMEXP)
    acc = np.zeros((2, shp3[2]), F64 if float_acc else (np.int64 if dt.kind == "i" else np.uint64))
    reduce3(x3, out.reshape(shp3[0], shp3[2]), acc, mode)
    return out


# -- wrappers --------------------------------------------------------------------------------------

_ROW_MODES = {SUM: reduce_rows, SUMSQ: reduce_rows, L1: reduce_rows, L2: reduce_rows, MEAN: reduce_rows,
              LOGSUM: reduce_rows, MAX: extreme_rows, MIN: extreme_rows}

REDUCE_MODES = {"ReduceSum": SUM, "ReduceMean": MEAN, "ReduceMax": MAX, "ReduceMin": MIN, "ReduceProd": PROD,
                "ReduceL1": L1, "ReduceL2": L2, "ReduceLogSum": LOGSUM, "ReduceLogSumExp": LOGSUMEXP,
                "ReduceSumSquare": SUMSQ}


class ReduceOp(NamedTuple):
    """A reduction bound: its mode, keepdims, and where its axes come from: the ``axes`` attribute (None: all
    axes) before the version that takes them as an input (``from_input``), whose ``noop_with_empty_axes`` makes
    no axes mean none rather than all."""
    mode: int
    axes: Any
    from_input: bool
    keepdims: int
    noop_with_empty_axes: int


def bind_reduce_1(ctx, axes=None, keepdims=1):
    return ReduceOp(REDUCE_MODES[ctx.op_type], None if axes is None else tuple(as_int_list(axes)), False,
                    int(keepdims), 0)


def bind_reduce(ctx, keepdims=1, noop_with_empty_axes=0):
    return ReduceOp(REDUCE_MODES[ctx.op_type], None, True, int(keepdims), int(noop_with_empty_axes))


# The axes become an input at ReduceSum-13 and at 18 for the others.
REDUCE_BINDS = {name: ((1, bind_reduce_1), (13 if name == "ReduceSum" else 18, bind_reduce)) for name in REDUCE_MODES}


def reduce_axes(b: ReduceOp, rank: int, axes=None) -> tuple:
    """The sorted, normalized axes a reduction of a rank-``rank`` input reduces (``axes``: its axes input)."""
    given = as_int_list(b.axes if axes is None else axes)
    if not given:
        return () if b.noop_with_empty_axes else tuple(range(rank))
    return norm_axes(given, rank)


def _rows_route(b: ReduceOp, data, axes):
    """(output shape, (outer, n), kernel) when a float reduction of ``data`` over ``axes`` is one call of
    ``reduce_rows`` or ``extreme_rows`` over its rows in place, else False (``run_reduce`` decides)."""
    ax = reduce_axes(b, data.ndim, axes)
    dt = data.dtype
    if not ax or dt.kind != "f" or lowp(dt) or b.mode not in _ROW_MODES:
        return False
    shp3, perm = canon3(data.shape, ax)
    oshape = reduce_shape(data.shape, ax, b.keepdims)
    if perm is not None or shp3[2] != 1 or shp3[1] == 0 or math.prod(oshape) == 0:
        return False
    return oshape, (shp3[0], shp3[1]), _ROW_MODES[b.mode]


def reduce_cpu(b: ReduceOp, ctx):
    """The reductions on the CPU (ReduceSum's region form shares the bind).  Where a float reduction is one
    kernel call over rows of the input in place, the route is kept per input shape (a few of them)."""
    buf = ctx.out[0] if ctx.out else None
    routes = Resolved()
    mode = b.mode

    def run(data, axes=None):
        key = (data.shape, data.dtype, None if axes is None else value_key(axes))
        route = routes.get(key, lambda: _rows_route(b, data, axes))
        if route is False:
            return run_reduce(mode, data, reduce_axes(b, data.ndim, axes), b.keepdims, buf)
        oshape, rows, kernel = route
        out = out_buffer(buf, oshape, data.dtype)
        x = data if data.flags.c_contiguous else np.ascontiguousarray(data)
        if kernel is reduce_rows:
            reduce_rows(x.reshape(rows), out.reshape(rows[0]), mode)
        else:
            extreme_rows(x.reshape(rows), out.reshape(rows[0]), mode == MAX)
        return out
    return run


for _name, _binds in REDUCE_BINDS.items():
    for _v, _bind in _binds:
        op(_name, _v, bind=_bind, writes_out=True)(reduce_cpu)


class ArgOp(NamedTuple):
    """ArgMax or ArgMin bound."""
    op: str
    is_max: bool
    axis: int
    keepdims: int
    select_last_index: bool


def bind_argmax(ctx, axis=0, keepdims=1, select_last_index=0):
    return ArgOp("ArgMax", True, int(axis), int(keepdims), bool(select_last_index))


def bind_argmin(ctx, axis=0, keepdims=1, select_last_index=0):
    return ArgOp("ArgMin", False, int(axis), int(keepdims), bool(select_last_index))


def arg_cpu(b: ArgOp, ctx):
    """ArgMax and ArgMin on the CPU (the CUDA ArgMax shares the bind: ``ops/cuda/registered.py``)."""
    buf = ctx.out[0] if ctx.out else None
    name, axis, keepdims, is_max, last = b.op, b.axis, b.keepdims, b.is_max, b.select_last_index

    def run(data):
        ax = norm_axis(axis, data.ndim)
        x = data
        if x.dtype == BOOL:
            x = x.view(np.uint8)
        elif lowp(x.dtype):
            x = x.astype(F32)
        oshape = reduce_shape(data.shape, (ax,), keepdims)
        out = out_buffer(buf, oshape, np.dtype(np.int64))
        if out.size == 0:
            return out
        if data.shape[ax] == 0:
            raise InvalidArgumentError(f"{name}: axis {axis} has extent 0; there is no element to select")
        outer = int(math.prod(data.shape[:ax]))
        x3 = np.ascontiguousarray(x).reshape(outer, data.shape[ax], -1)
        _arg3(x3, out.reshape(outer, -1), is_max, last)
        return out
    return run


op("ArgMax", 1, bind=bind_argmax, writes_out=True)(arg_cpu)
op("ArgMin", 1, bind=bind_argmin, writes_out=True)(arg_cpu)
