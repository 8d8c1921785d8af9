"""CUDA reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax and ArgMin.

The reductions take ``ops.reduce``'s canonical form: the input viewed as ``(outer, n, inner)`` reducing the
middle axis, the output ``(outer, inner)``.  Reduced axes that are not adjacent are reduced one adjacent run at
a time for the modes that compose (sum, max, min, prod, float mean), or moved last by a device transpose for the
others.  Two kernels: ``_reduce_rows`` (``inner == 1``, float input: one block per output, the block's threads
stride the row and fold in shared memory) and ``_reduce_cols`` (anything else: one thread per output, walking
its column).  Floats accumulate in float64 and integers in int64/uint64 (wrapping), as the CPU kernels do, and
the finishing step is theirs too: a mean or log-sum whose sum overflows the output type is infinite, a
log-sum-exp takes the maximum first.  16-bit floats are reduced in float32 and converted back; an empty
reduction writes the op's identity.

ArgMax and ArgMin over any axis: ``_arg_cols`` walks each ``(outer, inner)`` column (first or last tie, a NaN is
never selected after the first element, as ``ops.reduce._arg3``).  ArgMax over the last axis keeps its block
kernel below (greedy sampling over a vocabulary).

ArgMax over the last axis, one block per row of the canonical ``(rows, n)`` view; each thread scans a strided slice keeping the first
maximum it sees, then the block reduces (value, index) pairs preferring the larger value and, on ties, the
smaller index, so the result is the FIRST maximum like numpy and onnxruntime.  NaNs are never selected
(unlike numpy's argmax, which returns the first NaN); a row of all -inf returns index 0.

Invariants: the input is a C-contiguous float device array; the output is a new int64 device array of
shape ``input.shape[:-1]`` (+ ``(1,)`` when ``keepdims``).
"""
from __future__ import annotations

import math

import numpy as np

from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ops._common import norm_axis
from ._common import (ARGMAX, F16, F32, FLOATS, MAX_ROW_THREADS, block_fold, check_device, flat, grid1d,
                      row_threads)

__all__ = ["ArgMax", "arg_reduce", "reduce"]


@jit
def _argmax_rows(x, out, n):
    sv = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    si = cuda.shared.array(MAX_ROW_THREADS, np.int64)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    base = row * n
    best = np.float32(-math.inf)
    bi = n  # sentinel: loses every tie against a real index
    for j in range(tid, n, nt):
        v = np.float32(x[base + j])
        if v > best or (v == best and j < bi):
            best = v
            bi = j
    sv[tid] = best
    si[tid] = bi
    block_fold(sv, si, tid, nt, ARGMAX)
    if tid == 0:
        out[row] = si[0] if si[0] < n else 0


def ArgMax(data, axis=-1, keepdims=1, select_last_index=0):
    check_device("ArgMax", data=data)
    if np.dtype(data.dtype) not in FLOATS:
        raise InvalidArgumentError(f"ArgMax: the CUDA kernel takes float tensors, got {data.dtype}")
    if data.ndim == 0 or norm_axis(axis, data.ndim) != data.ndim - 1:
        raise InvalidArgumentError(f"ArgMax: the CUDA kernel reduces the last axis only, got axis={axis} "
                                   f"for rank {data.ndim}")
    if select_last_index:
        raise InvalidArgumentError("ArgMax: select_last_index=1 is not supported by the CUDA kernel")
    n = tuple(data.shape)[-1]
    if n == 0:
        raise InvalidArgumentError("ArgMax: cannot reduce an empty axis")
    shape = tuple(data.shape)[:-1] + ((1,) if keepdims else ())
    y = rc.device_empty(shape, np.int64)
    rows = data.size // n
    if rows:
        _argmax_rows[rows, row_threads(n)](flat(data), flat(y) if y.ndim else y.reshape(1), n)
    return y


# -- reductions ------------------------------------------------------------------------------------

from .elementwise import cast_to  # noqa: E402
from .shape import view_copy  # noqa: E402
from ops.reduce import (L1, L2, LOGSUM, LOGSUMEXP, MAX, MEAN, MIN, PROD, SUM, SUMSQ,  # noqa: E402
                        _identity, adjacent_runs, canon3, reduce_shape)


@jit(device=True)
def _mapped(v, mode):
    """An element as the mode accumulates it (squared, absolute, or as it is)."""
    if mode == SUMSQ or mode == L2:
        return v * v
    if mode == L1:
        return abs(v)
    return v


@jit(device=True)
def _combine(a, v, mode):
    if mode == MAX or mode == LOGSUMEXP:
        return v if (v > a or v != v) else a
    if mode == MIN:
        return v if (v < a or v != v) else a
    if mode == PROD:
        return a * v
    return a + v


@jit(device=True)
def _finish(a, n, mode, fmax):
    """The output value of the accumulated ``a`` over ``n`` elements (``fmax``: the output type's largest
    finite value, for the overflow rule of MEAN and LOGSUM)."""
    if mode == L2:
        return math.sqrt(a)
    if mode == MEAN:
        return a if abs(a) > fmax else a / n
    if mode == LOGSUM:
        if a > fmax:
            return math.inf
        if a > 0:
            return math.log(a)
        return -math.inf if a == 0 else math.nan
    return a


@jit
def _reduce_cols(x, out, outer, n, inner, mode, zero, fmax):
    """out[o*inner+i] = the reduction of x[o, :, i]; one thread per output, grid-stride."""
    for j in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
        o = j // inner
        i = j - o * inner
        base = o * n * inner + i
        if mode == MAX or mode == MIN or mode == LOGSUMEXP:
            a = x[base] + zero
            for k in range(1, n):
                a = _combine(a, x[base + k * inner] + zero, mode)
            if mode == LOGSUMEXP:
                if math.isinf(a):
                    out[j] = a
                else:
                    s = zero
                    for k in range(n):
                        s += math.exp(x[base + k * inner] - a)
                    out[j] = a + math.log(s)
            else:
                out[j] = a
            continue
        a = zero + 1 if mode == PROD else zero
        for k in range(n):
            a = _combine(a, _mapped(x[base + k * inner] + zero, mode), mode)
        out[j] = _finish(a, n, mode, fmax)


@jit
def _reduce_rows(x, out, n, mode, fmax):
    """out[row] = the reduction of the float row x[row*n:(row+1)*n]; one block per row (power-of-two threads)."""
    sh = cuda.shared.array(MAX_ROW_THREADS, np.float64)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    base = row * n
    comb = MAX if mode == LOGSUMEXP else mode
    a = np.float64(1.0) if mode == PROD else np.float64(0.0)
    first = True
    for k in range(tid, n, nt):
        v = np.float64(x[base + k])
        if comb == MAX or comb == MIN:
            a = v if first else _combine(a, v, comb)
            first = False
        else:
            a = _combine(a, _mapped(v, mode), mode)
    if first and (comb == MAX or comb == MIN):
        a = np.float64(x[base])  # fewer elements than threads: stand in with one that is in the row
    sh[tid] = a
    a = _fold(sh, tid, nt, comb)
    if mode == LOGSUMEXP:
        m = a
        s = np.float64(0.0)
        if not math.isinf(m):
            for k in range(tid, n, nt):
                s += math.exp(np.float64(x[base + k]) - m)
        sh[tid] = s
        s = _fold(sh, tid, nt, SUM)
        if tid == 0:
            out[row] = m if math.isinf(m) else m + math.log(s)
    elif tid == 0:
        out[row] = _finish(a, n, mode, fmax)


@jit(device=True)
def _fold(sh, tid, nt, mode):
    """Fold ``sh[0:nt]`` into ``sh[0]`` by ``_combine`` (each thread wrote its slot); the result to every thread."""
    cuda.syncthreads()
    s = nt // 2
    while s > 0:
        if tid < s:
            sh[tid] = _combine(sh[tid], sh[tid + s], mode)
        cuda.syncthreads()
        s //= 2
    r = sh[0]
    cuda.syncthreads()
    return r


@jit
def _fill(a, v):
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        a[i] = v


_COMPOSE = (SUM, MAX, MIN, PROD)
_BOOL = np.dtype(np.bool_)


def reduce(name: str, mode: int, x, axes: tuple, keepdims) -> object:
    """Reduce the device array ``x`` over normalized, sorted ``axes`` with ``mode`` (``ops.reduce``'s modes)."""
    check_device(name, data=x)
    dt = np.dtype(x.dtype)
    if dt == _BOOL and mode not in (MAX, MIN):
        raise InvalidArgumentError(f"{name}: bool inputs are reduced only by ReduceMax and ReduceMin, got bool")
    if dt.kind not in "fiub" or (dt.kind == "f" and dt not in FLOATS):
        raise InvalidArgumentError(f"{name}: the CUDA kernels reduce float16/32/64, integer and bool tensors, "
                                   f"got {dt}")
    if dt == F16:
        return cast_to(reduce(name, mode, cast_to(x, F32), axes, keepdims), F16)
    shape = tuple(x.shape)
    oshape = reduce_shape(shape, axes, keepdims)
    out = rc.device_empty(oshape, dt)
    if out.size == 0:
        return out
    shp3, perm = canon3(shape, axes)
    outer, n, inner = shp3
    if n == 0:
        blocks, threads = grid1d(out.size)
        _fill[blocks, threads](flat(out), dt.type(_identity(mode, dt)))
        return out
    if perm is not None:
        if mode in _COMPOSE or (mode == MEAN and dt.kind == "f"):
            y = x
            for r in reversed(adjacent_runs(axes)):
                y = reduce(name, mode, y, tuple(r), 1)
            return y.reshape(oshape)
        x = view_copy(name, x, lambda p: (p.transpose(perm), tuple(shape[a] for a in perm)))
    fmax = float(np.finfo(dt).max) if dt.kind == "f" else math.inf
    if inner == 1 and dt.kind == "f" and n > 1:
        _reduce_rows[outer, row_threads(n)](flat(x), flat(out), n, mode, fmax)
    else:
        # the accumulator's type: uint64 stays unsigned (with int64 Numba would widen it to float64)
        zero = (np.float64(0) if dt.kind == "f" else False if dt == _BOOL
                else np.uint64(0) if dt == np.uint64 else np.int64(0))
        blocks, threads = grid1d(outer * inner)
        _reduce_cols[blocks, threads](flat(x), flat(out), outer, n, inner, mode, zero, fmax)
    return out


@jit
def _arg_cols(x, out, outer, n, inner, is_max, last):
    for j in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
        o = j // inner
        i = j - o * inner
        base = o * n * inner + i
        best = x[base]
        bi = 0
        for k in range(1, n):
            v = x[base + k * inner]
            if is_max:
                better = v >= best if last else v > best
            else:
                better = v <= best if last else v < best
            if better:
                best = v
                bi = k
        out[j] = bi


def arg_reduce(name: str, data, axis: int, keepdims, is_max: bool, last: bool):
    """ArgMax/ArgMin of the device array ``data`` over ``axis`` (int64 indices)."""
    check_device(name, data=data)
    dt = np.dtype(data.dtype)
    if dt.kind not in "fiub" or (dt.kind == "f" and dt not in FLOATS):
        raise InvalidArgumentError(f"{name}: the CUDA kernel takes float16/32/64, integer and bool tensors, got {dt}")
    shape = tuple(data.shape)
    ax = norm_axis(axis, len(shape))
    y = rc.device_empty(reduce_shape(shape, (ax,), keepdims), np.int64)
    if y.size == 0:
        return y
    if shape[ax] == 0:
        raise InvalidArgumentError(f"{name}: axis {axis} has extent 0; there is no element to select")
    outer = int(math.prod(shape[:ax]))
    inner = int(math.prod(shape[ax + 1:]))
    blocks, threads = grid1d(outer * inner)
    _arg_cols[blocks, threads](flat(data), flat(y), outer, shape[ax], inner, bool(is_max), bool(last))
    return y
