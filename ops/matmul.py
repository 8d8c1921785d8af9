"""Matrix products: MatMul, Gemm, Einsum, MatMulInteger.

Wrappers canonicalize every product to a batched 3-d one, ``(nb, M, K) @
(nb, K, N)``, where batch broadcasting becomes two small index maps (which
batch of A and of B each output batch reads).  A 2-d right operand (a
weight) folds the left operand's batch into M, so ``(B, S, K) @ (K, N)`` is
one GEMM.  Float32/float64 GEMMs call numpy's matmul (BLAS) from the wrapper
(measured faster than Numba's ``np.dot``, which also crashes on read-only
inputs, and than a hand-blocked kernel on every shape tried); a single
row (M=1 after folding) against a float32 initializer takes the panel GEMV of
``ops._panels`` over a copy of the weight packed at the node's first one-row
call (the compiled form calls the same kernel), and against any other weight a GEMV kernel that
streams the weight once: each thread owns a contiguous range of weight rows
and accumulates axpys into a private output row (vectorized by
reassociation), the rows summed at the end.  Integer products use a
plain typed kernel that wraps around like numpy.  16-bit floats are
computed in float32 and rounded back.

Invariants: kernels never write to inputs; outputs are fresh arrays (or the
planner's buffer); shapes are validated in the wrappers, which raise
``ShapeMismatchError`` naming both shapes.
"""
from __future__ import annotations

import numba
import math

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, Plain, bind_plain, broadcast_shape, lowp, mlas_order, out_buffer
from ._mlas_sgemm import pack_slices, sgemm_mlas, sgemm_packed_mlas
from ._fastmath import FAST
from . import _i16pairs, _u8s8
from ._panels import gemm_panels_par, gemv_panels, pack_panels, panel_threads
from .registry import op

__all__ = ["matmul_nd", "einsum"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


# -- kernels ---------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _mm_generic(a, b, o):
    """o = a @ b for any numeric dtype, accumulating in o's dtype (axpys over the rows of ``b``)."""
    m, n = o.shape
    kk = a.shape[1]
    for i in range(m):
        for j in range(n):
            o[i, j] = 0
        for k in range(kk):
            aik = a[i, k]
            for j in range(n):
                o[i, j] += aik * b[k, j]


@njit(cache=True, nogil=True)
def _bmm_generic(a3, b3, ia, ib, out3):
    """out3[t] = a3[ia[t]] @ b3[ib[t]] for any numeric dtype, accumulating in the output dtype."""
    for t in range(out3.shape[0]):
        _mm_generic(a3[ia[t]], b3[ib[t]], out3[t])


@njit(cache=True, nogil=True, fastmath=FAST)
def gemv_rows(a, b, acc, k0, k1):
    """acc[:] = sum_{k0 <= k < k1} a[k] * b[k, :]: axpys over contiguous weight rows, four at a time
    (one load/store of ``acc``, which stays in L1, per four streamed rows)."""
    n = b.shape[1]
    for j in range(n):
        acc[j] = 0
    k = k0
    while k + 4 <= k1:
        a0 = a[k]
        a1 = a[k + 1]
        a2 = a[k + 2]
        a3 = a[k + 3]
        for j in range(n):
            acc[j] += a0 * b[k, j] + a1 * b[k + 1, j] + a2 * b[k + 2, j] + a3 * b[k + 3, j]
        k += 4
    while k < k1:
        ak = a[k]
        for j in range(n):
            acc[j] += ak * b[k, j]
        k += 1


@njit(cache=True, nogil=True, parallel=True, fastmath=FAST)
def gemv_par(a, b, out, part):
    """out = a @ b; thread t streams the contiguous rows [t*K/nt, (t+1)*K/nt) of ``b`` into
    ``part[t]`` (nt = part.shape[0]), then the partial rows are summed."""
    nt = part.shape[0]
    kk = b.shape[0]
    n = b.shape[1]
    for t in prange(nt):
        gemv_rows(a, b, part[t], t * kk // nt, (t + 1) * kk // nt)
    for j in range(n):
        s = part[0, j]
        for t in range(1, nt):
            s += part[t, j]
        out[j] = s


@njit(cache=True, nogil=True, fastmath=FAST)
def _gemm_epilogue(c2, alpha, beta, out):
    """out = alpha * out + beta * c2 (c2 is (1|M, 1|N), read with broadcasting)."""
    m, n = out.shape
    cm, cn = c2.shape
    for i in range(m):
        ci = i if cm > 1 else 0
        if cn > 1:
            for j in range(n):
                out[i, j] = alpha * out[i, j] + beta * c2[ci, j]
        else:
            cv = beta * c2[ci, 0]
            for j in range(n):
                out[i, j] = alpha * out[i, j] + cv


@njit(cache=True, nogil=True)
def _gemm_generic(a, b, c2, alpha, beta, out):
    _mm_generic(a, b, out)
    m, n = out.shape
    cm, cn = c2.shape
    for i in range(m):
        ci = i if cm > 1 else 0
        for j in range(n):
            out[i, j] = alpha * out[i, j] + beta * c2[ci, j if cn > 1 else 0]


@njit(cache=True, nogil=True)
def _rowsum(x2, out):
    """out[p] = sum_q x2[p, q]."""
    for p in range(x2.shape[0]):
        s = out.dtype.type(0)
        for q in range(x2.shape[1]):
            s += x2[p, q]
        out[p] = s


# -- batched product driver ------------------------------------------------------------------------

_MAP_CACHE: dict = {}


def _batch_maps(abatch: tuple, bbatch: tuple, batch: tuple):
    key = (abatch, bbatch, batch)
    hit = _MAP_CACHE.get(key)
    if hit is not None:
        return hit
    r = len(batch)
    ia = np.broadcast_to(np.arange(int(math.prod(abatch)), dtype=np.int64)
                         .reshape((1,) * (r - len(abatch)) + abatch), batch).reshape(-1).copy()
    ib = np.broadcast_to(np.arange(int(math.prod(bbatch)), dtype=np.int64)
                         .reshape((1,) * (r - len(bbatch)) + bbatch), batch).reshape(-1).copy()
    if len(_MAP_CACHE) < 1024:
        _MAP_CACHE[key] = (ia, ib)
    return ia, ib


_ZERO_MAP = np.zeros(1, np.int64)


_GEMV_BYTES_PER_THREAD = 1 << 21


@njit(cache=True, nogil=True)
def gemv_threads(K, N, itemsize, nt_max):
    """Threads for a (K, N) GEMV: waking threads costs more than a small weight takes to stream, so one thread per
    2 MiB of weight (and at least 4 weight rows each), at most ``nt_max``."""
    return max(1, min(nt_max, (K * N * itemsize) // _GEMV_BYTES_PER_THREAD, K // 4))


def _gemv_run(a, b, out):
    nt_max = numba.get_num_threads()
    nt = gemv_threads(b.shape[0], b.shape[1], b.itemsize, nt_max)
    if nt == 1:
        gemv_rows(a, b, out, 0, b.shape[0])
        return
    part = np.empty((nt, b.shape[1]), out.dtype)
    if nt == nt_max:
        gemv_par(a, b, out, part)
        return
    numba.set_num_threads(nt)
    try:
        gemv_par(a, b, out, part)
    finally:
        numba.set_num_threads(nt_max)


def _mm_into(a3, b3, ia, ib, o3):
    """Integer (and other non-BLAS) batched products through the typed kernel."""
    _bmm_generic(a3, b3, ia, ib, o3)


def _blas_into(a, b, o):
    """Float32/float64 product into ``o``: the GEMV kernel for one row against a wide weight, else
    numpy's matmul (BLAS per 2-d slice, batch broadcasting in C).  numpy's BLAS measured faster
    than Numba's ``np.dot`` (a different OpenBLAS build), and it accepts read-only inputs (memory-
    mapped initializers), on which Numba's ``np.dot`` crashes."""
    if (a.ndim == 2 and b.ndim == 2 and a.shape[0] == 1 and b.shape[1] >= 256 and b.flags.c_contiguous
            and a.flags.c_contiguous):
        _gemv_run(a.reshape(-1), b, o.reshape(-1))
    else:
        np.matmul(a, b, out=o)


def matmul_shapes(a_shape, b_shape, name="MatMul") -> tuple:
    """numpy ``matmul``'s shapes (1-d operands promoted, then squeezed; batch dims broadcast), checked:
    ``(M, K, N, A's batch, B's batch, batch, (batch, M, N), output shape)``.  The CPU and CUDA kernels share
    them."""
    a_shape, b_shape = tuple(int(d) for d in a_shape), tuple(int(d) for d in b_shape)
    if not a_shape or not b_shape:
        raise ShapeMismatchError(f"{name}: inputs must have rank >= 1, got shapes {list(a_shape)} and "
                                 f"{list(b_shape)}")
    A = (1,) + a_shape if len(a_shape) == 1 else a_shape
    B = b_shape + (1,) if len(b_shape) == 1 else b_shape
    m, k = A[-2:]
    k2, n = B[-2:]
    if k != k2:
        raise ShapeMismatchError(f"{name}: inner dimensions differ: A has shape {list(a_shape)} (K={k}), B has "
                                 f"shape {list(b_shape)} (K={k2})")
    abatch, bbatch = A[:-2], B[:-2]
    try:
        batch = broadcast_shape(abatch, bbatch)
    except Exception:
        raise ShapeMismatchError(f"{name}: batch dimensions of {list(a_shape)} and {list(b_shape)} do not "
                                 f"broadcast") from None
    full = batch + (m, n)
    out_shape = full
    if len(a_shape) == 1:
        out_shape = out_shape[:-2] + out_shape[-1:]
    if len(b_shape) == 1:
        out_shape = out_shape[:-1]
    return m, k, n, abatch, bbatch, batch, full, out_shape


def _matmul_mlas(a: np.ndarray, b: np.ndarray, buf, name) -> np.ndarray:
    """float32 ``matmul_nd`` as onnxruntime's MatMul computes it (``_mlas_sgemm.sgemm_mlas``, on onnxruntime's
    thread count, ``_mlas_attention.ort_threads``): A's batch folded into its rows when B is one matrix (2-d, or batch dims all 1), else
    batch by batch; against a 1-d B every row of A is a product of its own."""
    from ._mlas_attention import ort_threads
    threads = ort_threads()
    A = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
    B = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
    m, k, n, abatch, bbatch, batch, full, out_shape = matmul_shapes(a.shape, b.shape, name)
    o = out_buffer(buf, out_shape, F32)
    if o.size == 0:
        return o
    A, B = np.ascontiguousarray(A), np.ascontiguousarray(B)
    if b.ndim == 1:  # a vector: every row of A a product of its own (one row: the one-row kernel)
        rows = A.size // k if k else int(math.prod(abatch)) * m
        sgemm_mlas(A.reshape(rows, 1, k), B.reshape(1, k, 1), np.arange(rows, dtype=np.int64),
                   np.zeros(rows, np.int64), o.reshape(rows, 1, 1), threads)
    elif int(math.prod(bbatch)) == 1 and abatch == batch:  # B one matrix: A's batch in its rows
        rows = int(math.prod(abatch)) * m
        sgemm_mlas(A.reshape(1, rows, k), B.reshape(1, k, n), _ZERO_MAP, _ZERO_MAP, o.reshape(1, rows, n),
                   threads)
    else:
        ia, ib = _batch_maps(abatch, bbatch, batch)
        sgemm_mlas(A.reshape(-1, m, k), B.reshape(-1, k, n), ia, ib, o.reshape(-1, m, n), threads)
    return o


def matmul_nd(a: np.ndarray, b: np.ndarray, buf=None, name="MatMul") -> np.ndarray:
    """numpy.matmul semantics: batch broadcasting, 1-d operands promoted then squeezed.  Two float32 operands
    under ``_common.mlas_order``: onnxruntime's arithmetic (``_matmul_mlas``)."""
    if a.dtype == F32 and b.dtype == F32 and a.ndim >= 1 and b.ndim >= 1 and mlas_order():
        return _matmul_mlas(a, b, buf, name)
    if (b.ndim == 2 and a.ndim >= 2 and a.dtype == b.dtype and a.dtype in _FLOATS and a.shape[-1] == b.shape[0]
            and b.shape[0] and a.size and b.size):
        # The common case, a weight on the right: one GEMM (or GEMV) with A's batch folded into its rows.
        k, n = b.shape
        o = out_buffer(buf, a.shape[:-1] + (n,), a.dtype)
        _blas_into(a.reshape(-1, k), b, o.reshape(-1, n))
        return o
    if a.dtype != b.dtype:
        raise InvalidArgumentError(f"{name}: both inputs must have one dtype, got {a.dtype} and {b.dtype}")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeMismatchError(f"{name}: inputs must have rank >= 1, got shapes {list(a.shape)} and {list(b.shape)}")
    dt = a.dtype
    if lowp(dt) or dt == np.float16:
        r = matmul_nd(a.astype(F32), b.astype(F32), None, name)
        return r.astype(dt)
    if dt.kind not in "fiu":
        raise InvalidArgumentError(f"{name}: expected a numeric dtype, got {dt}")
    A = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
    B = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
    m, k, n, abatch, bbatch, batch, full, out_shape = matmul_shapes(a.shape, b.shape, name)
    o = out_buffer(buf, out_shape, dt)
    if o.size == 0:
        return o
    if k == 0:
        o[...] = 0
        return o
    if int(math.prod(bbatch)) == 1 and abatch == batch:
        # A weight on the right: fold A's batch into its rows, one GEMM (or GEMV for one row).
        rows = int(math.prod(abatch)) * m
        if dt in _FLOATS:
            _blas_into(A.reshape(rows, k), B.reshape(k, n), o.reshape(rows, n))
            return o
        _mm_into(A.reshape(1, rows, k), B.reshape(1, k, n), _ZERO_MAP, _ZERO_MAP, o.reshape(1, rows, n))
        return o
    if dt in _FLOATS:
        np.matmul(A, B, out=o.reshape(full))
        return o
    ia, ib = _batch_maps(abatch, bbatch, batch)
    _mm_into(A.reshape(-1, m, k), B.reshape(-1, k, n), ia, ib, o.reshape(-1, m, n))
    return o


# -- MatMul ----------------------------------------------------------------------------------------

def _constant_weight(ctx, low: bool = False):
    """The node's B when it is a 2-d float32 initializer (packed into column panels for one-row calls), else None;
    with ``low``, when it is a 2-d float16 or bfloat16 one."""
    graph, node = getattr(ctx, "graph", None), getattr(ctx, "node", None)
    if graph is None or node is None or len(node.inputs) < 2:
        return None
    w = graph.initializers.get(node.inputs[1])
    if isinstance(w, np.ndarray) and w.ndim == 2 and w.size and \
            ((lowp(w.dtype) or w.dtype == np.float16) if low else w.dtype == F32):
        return w
    return None


def _widened_factory(w, buf):
    """A float16 or bfloat16 constant weight: its float32 copy, made at the first call and kept beside it, run as a
    float32 constant weight is (``_weight_runner``) on the activations converted to float32, the product rounded
    back to their dtype.  A call converts only the activations, not the weight; a weight mapped from external
    data gives its resident pages back once copied."""
    state = []  # (what the inner runner knows the weight by, the runner)

    def run(a, b):
        if b is w and a.dtype == w.dtype:
            if not state:
                from runtime.loader import release_pages
                w32 = np.ascontiguousarray(w, dtype=F32)
                release_pages([w], whole=False)  # a mapped weight's pages: the copy is what runs now
                # MLAS's order keeps only its packed slices, known by the original weight; the panels keep w32
                state.append((w, _mlas_factory(w32, None, ident=w)) if mlas_order() else
                             (w32, _weight_runner(w32, None)))
            key, inner = state[0]
            return inner(a.astype(F32), key).astype(a.dtype)
        return matmul_nd(a, b, buf)
    return run


def _matmul_factory(ctx):
    buf = ctx.out[0] if ctx.out else None
    w = _constant_weight(ctx)
    if w is not None:
        return _weight_runner(w, buf)
    low = _constant_weight(ctx, low=True)
    if low is not None:
        return _widened_factory(low, buf)

    def run(a, b):
        return matmul_nd(a, b, buf)
    return run


def _weight_runner(w, buf):
    """MatMul against the constant float32 weight ``w``: MLAS's packed order under ``mlas_order``, else its column
    panels for one-row calls (made at the first), else ``matmul_nd``."""
    if mlas_order():
        return _mlas_factory(w, buf)
    K, N = w.shape
    packed = []  # the panels, made at the first one-row call: a node only ever run on several rows keeps one copy

    def run_packed(a, b):
        # One row against the packed weight: the panel GEMV (the compiled form calls the same kernel).
        if b is w and a.dtype == F32 and a.ndim >= 1 and a.size == K and a.shape[-1] == K:
            if not packed:
                packed.append(pack_panels(w))
            wp = packed[0]
            o = out_buffer(buf, a.shape[:-1] + (N,), F32)
            nt = panel_threads(wp.shape[0], K, numba.get_num_threads())
            gemv_panels(np.ascontiguousarray(a).reshape(1, K), wp, o.reshape(1, N), nt)
            return o
        return matmul_nd(a, b, buf)
    return run_packed


def _mlas_factory(w, buf, ident=None):
    """A float32 product against the constant weight in MLAS's packed order (``ops/_mlas_sgemm``), as onnxruntime
    runs it; other dtypes as ``matmul_nd``.  ``ident``: the array a call passes as B for this weight (default ``w``;
    only its packed slices are kept)."""
    K, N = w.shape
    wflat = pack_slices(w)
    key = w if ident is None else ident

    def run(a, b):
        if b is key and a.dtype == F32 and a.ndim >= 1 and a.shape[-1] == K:
            o = out_buffer(buf, a.shape[:-1] + (N,), F32)
            o[...] = sgemm_packed_mlas(np.ascontiguousarray(a).reshape(-1, K), wflat, K, N).reshape(o.shape)
            return o
        return matmul_nd(a, b, buf)
    return run


bind_matmul = bind_plain("MatMul")


def matmul_cpu(b: Plain, ctx):
    """MatMul on the CPU: numpy's semantics, a constant float32 weight packed into panels at its first run (under
    ``ONNX_NUMBA_MLAS_ORDER=1``: in MLAS's slices, at plan time, multiplied in onnxruntime's order); a float16 or
    bfloat16 one converted to float32 once (``_widened_factory``)."""
    return _matmul_factory(ctx)


for _v in (1, 9, 13):
    op("MatMul", _v, bind=bind_matmul, writes_out=True)(matmul_cpu)


# -- Gemm ------------------------------------------------------------------------------------------

_PANEL_ROWS = 64  # a Gemm of at most this many rows against a constant weight runs on its packed panels


def _gemm_factory(ctx, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    buf = ctx.out[0] if ctx.out else None
    alpha = float(alpha)
    beta = float(beta)
    w = _constant_weight(ctx)
    packed = []  # op(B)'s panels, made at the first call with few rows (a classifier head: A has a row per step)

    def product(A, B, b, o):
        """o = op(A) @ op(B): few rows against the constant weight on its panels (streamed once, outputs kept
        in registers; numpy's BLAS packs a transposed weight first and ran 2.5x slower at 10 rows); else BLAS."""
        m, k = A.shape
        if b is w and not transA and A.dtype == F32 and 1 <= m <= _PANEL_ROWS and o.flags.c_contiguous:
            if not packed:
                packed.append(pack_panels(B))
            wp = packed[0]
            a2 = np.ascontiguousarray(A)
            if m == 1:
                gemv_panels(a2, wp, o, panel_threads(wp.shape[0], k, numba.get_num_threads()))
            else:
                gemm_panels_par(a2, wp, o)
            return
        _blas_into(A, B, o)

    def run(a, b, c=None):
        if a.ndim != 2 or b.ndim != 2:
            raise ShapeMismatchError(f"Gemm: A and B must be 2-d, got shapes {list(a.shape)} and {list(b.shape)}")
        if a.dtype != b.dtype or (c is not None and c.dtype != a.dtype):
            raise InvalidArgumentError(f"Gemm: inputs must share one dtype, got "
                                       f"{[str(x.dtype) for x in (a, b, c) if x is not None]}")
        dt = a.dtype
        if lowp(dt) or dt == np.float16:
            r = run_f(a.astype(F32), b.astype(F32), None if c is None else c.astype(F32), None)
            return r.astype(dt)
        return run_f(a, b, c, buf)

    def run_f(a, b, c, obuf):
        A = a.T if transA else a
        B = b.T if transB else b
        m, k = A.shape
        k2, n = B.shape
        if k != k2:
            raise ShapeMismatchError(f"Gemm: inner dimensions differ: op(A) is {[m, k]}, op(B) is {[k2, n]} "
                                     f"(transA={transA}, transB={transB})")
        dt = a.dtype
        if c is None or beta == 0.0:
            c2 = np.zeros((1, 1), dt)
        else:
            c2 = c.reshape((1,) * (2 - c.ndim) + c.shape) if c.ndim < 2 else c
            if c2.ndim != 2 or c2.shape[0] not in (1, m) or c2.shape[1] not in (1, n):
                raise ShapeMismatchError(f"Gemm: C of shape {list(c.shape)} cannot be broadcast to {[m, n]}")
        o = out_buffer(obuf, (m, n), dt)
        if o.size == 0:
            return o
        if k == 0:
            o[...] = 0
            A = np.zeros((m, 1), dt)
            B = np.zeros((1, n), dt)
        if dt in _FLOATS:
            if k:
                product(A, B, b, o)
            if alpha != 1.0 or (c is not None and beta != 0.0):
                _gemm_epilogue(c2, alpha, beta, o)
        else:
            _gemm_generic(np.ascontiguousarray(A), np.ascontiguousarray(B), c2, alpha, beta, o)
        return o

    return run


for _v in (1, 6, 7, 9, 11, 13):
    op("Gemm", _v, factory=True)(_gemm_factory)


# -- MatMulInteger ---------------------------------------------------------------------------------

def _zero_point_rows(z, batch_shape: tuple, rows: int, per_last: bool, name: str):
    """Zero point as a (nbatch|1, rows|1) int32 array: scalar, 1-d per row/column, or N-d with batch dims."""
    if z is None:
        return np.zeros((1, 1), np.int32)
    z = np.asarray(z)
    if z.ndim <= 1:
        if z.size not in (1, rows):
            raise ShapeMismatchError(f"{name}: zero point of shape {list(z.shape)} must be a scalar or have "
                                     f"{rows} elements")
        return z.astype(np.int32).reshape(1, -1)
    # N-d: [..., M, 1] for A or [..., 1, N] for B.
    zz = z.reshape(z.shape[:-2] + ((z.shape[-1],) if per_last else (z.shape[-2],)))
    nb = int(math.prod(batch_shape))
    try:
        zz = np.broadcast_to(zz, batch_shape + (zz.shape[-1],))
    except ValueError:
        raise ShapeMismatchError(f"{name}: zero point of shape {list(z.shape)} does not match the batch "
                                 f"{list(batch_shape)}") from None
    return np.ascontiguousarray(zz.astype(np.int32)).reshape(nb, -1)


def matmul_integer(a, b, za=None, zb=None, name="MatMulInteger", packed=None):
    for x, nm in ((a, "A"), (b, "B")):
        if x.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
            raise InvalidArgumentError(f"{name}: {nm} must be int8 or uint8, got {x.dtype}")
    A = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
    B = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
    m, k = A.shape[-2:]
    k2, n = B.shape[-2:]
    if k != k2:
        raise ShapeMismatchError(f"{name}: inner dimensions differ: A {list(a.shape)}, B {list(b.shape)}")
    abatch, bbatch = tuple(A.shape[:-2]), tuple(B.shape[:-2])
    batch = broadcast_shape(abatch, bbatch)
    out_shape = batch + (m, n)
    if a.ndim == 1:
        out_shape = out_shape[:-2] + out_shape[-1:]
    if b.ndim == 1:
        out_shape = out_shape[:-1]
    o = np.zeros(out_shape, np.int32)
    if o.size == 0 or k == 0:
        return o
    za2 = _zero_point_rows(za, abatch, m, False, name)
    zb2 = _zero_point_rows(zb, bbatch, n, True, name)
    if not bbatch and abatch and za2.shape[0] == 1:  # one B for every batch of A: one product of all A's rows
        nb = int(math.prod(abatch))
        za2 = np.tile(za2, (1, nb)) if za2.shape[1] > 1 else za2
        m, abatch, batch = nb * m, (), ()
    ia, ib = _batch_maps(abatch, bbatch, batch)
    A3, B3, o3 = A.reshape(-1, m, k), B.reshape(-1, k, n), o.reshape(-1, m, n)
    # a node's cache holds the packed forms of the first B it sees (an initializer); other Bs pack per run
    cache = packed if packed is not None and packed.setdefault("B", b) is b else {}
    if A.dtype == np.uint8 and (B.dtype == np.int8 and _u8s8.PACKED or B.dtype == np.uint8 and _u8s8.VNNI):
        _bmm_u8s8(A3, B3, za2, zb2, ia, ib, o3, cache)
    else:
        _bmm_exact(A3, B3, za2, zb2, ia, ib, o3, cache)
    return o


def _bmm_exact(A3, B3, za2, zb2, ia, ib, o3, packed):
    """out3[t, i, j] = sum_k (a - za[i]) * (b - zb[j]) in int32 (wrapping as onnxruntime's sums do): the codes
    minus their zero points as int16 pairs (``_i16pairs``), B's packed form kept in ``packed`` by batch index
    with the zero points it was made for (one entry per batch index, replaced when they change)."""
    nb, m, n = o3.shape
    k = A3.shape[2]
    k2, g = -(-k // 2), -(-n // 8)
    az = np.zeros((m, 2 * k2), np.int16)
    acc = None if n % 8 == 0 else np.empty((m, 8 * g), np.int32)
    for t in range(nb):
        za = za2[ia[t] if za2.shape[0] > 1 else 0]
        zb = zb2[ib[t] if zb2.shape[0] > 1 else 0]
        zkey = zb.tobytes()
        got = packed.get(int(ib[t]))
        if got is None or got[0] != zkey:
            got = packed[int(ib[t])] = (zkey, _i16pairs.pack(B3[ib[t]].astype(np.int16) - zb.astype(np.int16)[None, :]))
        bp = got[1]
        np.subtract(A3[ia[t]], za.astype(np.int16)[:, None], out=az[:, :k], dtype=np.int16)
        dst = o3[t] if acc is None else acc
        _i16pairs.gemm_groups(az, bp, dst)
        if acc is not None:
            o3[t] = acc[:, :n]


def _bmm_u8s8(A3, B3, za2, zb2, ia, ib, o3, packed):
    """``_bmm_exact``'s product as onnxruntime computes uint8 x int8 on hosts with AVX2 (``_u8s8.host_gemm``):
    the raw codes' products (their pair sums saturated to 16 bits where onnxruntime's are, exact by
    ``vpdpbusd`` on VNNI hosts), then the zero points through row and column sums (exact int32).  On VNNI
    hosts uint8 B takes the same exact form as int8 codes ``b - 128``, the 128 times A's row sums added back.
    ``packed`` maps B's batch index to (``("u8s8",)``, its packed form, its column sums), filled here."""
    nb, m, n = o3.shape
    k = A3.shape[2]
    k4, g = -(-k // 4), -(-n // 8)
    acc = np.empty((m, 8 * g), np.int32)
    ap = np.zeros((m, 4 * k4), np.uint8)
    shift = 128 if B3.dtype == np.uint8 else 0
    for t in range(nb):
        a, b = A3[ia[t]], B3[ib[t]]
        got = packed.get(int(ib[t]))
        if got is None or got[0] != "u8s8":
            codes = (b.astype(np.int16) - shift).astype(np.int8) if shift else b
            got = packed[int(ib[t])] = ("u8s8", _u8s8.pack(codes), b.sum(axis=0, dtype=np.int32))
        ap[:, :k] = a
        _u8s8.host_gemm_tasks(ap, got[1], acc)
        _u8s8.zero_point_terms(acc, a, got[2], za2[ia[t] if za2.shape[0] > 1 else 0],
                          zb2[ib[t] if zb2.shape[0] > 1 else 0], shift, o3[t])


def _matmul_integer_factory(ctx):
    packed = {}  # see matmul_integer

    def run(A, B, a_zero_point=None, b_zero_point=None):
        return matmul_integer(A, B, a_zero_point, b_zero_point, packed=packed)
    return run


op("MatMulInteger", 10, factory=True)(_matmul_integer_factory)


# -- Einsum ----------------------------------------------------------------------------------------

def _sum_axes(x: np.ndarray, labels: str, drop: set):
    """Sum x over the axes whose labels are in ``drop``; returns (array, remaining labels)."""
    keep = [i for i, c in enumerate(labels) if c not in drop]
    gone = [i for i, c in enumerate(labels) if c in drop]
    if not gone:
        return x, labels
    xt = np.ascontiguousarray(x.transpose(keep + gone))
    kshape = xt.shape[:len(keep)]
    p = int(math.prod(kshape))
    q = int(math.prod(xt.shape[len(keep):]))
    out = np.empty(p, x.dtype)
    if p and q:
        _rowsum(xt.reshape(p, q), out)
    else:
        out[...] = 0
    return out.reshape(kshape), "".join(labels[i] for i in keep)


def _diagonal(x: np.ndarray, labels: str):
    """Collapse repeated labels of one operand to their diagonal (a strided view)."""
    if len(set(labels)) == len(labels):
        return x, labels
    shape, strides, seen = [], [], {}
    for i, c in enumerate(labels):
        if c in seen:
            j = seen[c]
            if shape[j] != x.shape[i]:
                raise ShapeMismatchError(f"Einsum: repeated label {c!r} spans sizes {shape[j]} and {x.shape[i]}")
            strides[j] += x.strides[i]
        else:
            seen[c] = len(shape)
            shape.append(x.shape[i])
            strides.append(x.strides[i])
    v = np.lib.stride_tricks.as_strided(x, shape=tuple(shape), strides=tuple(strides), writeable=False)
    return v, "".join(seen)


def _parse(equation: str, ndims: list):
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, rhs = eq.split("->")
    else:
        lhs, rhs = eq, None
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise InvalidArgumentError(f"Einsum: equation {equation!r} names {len(terms)} operands, "
                                   f"{len(ndims)} were given")
    n_ell = 0
    for t, nd in zip(terms, ndims):
        if "..." in t:
            n_ell = max(n_ell, nd - (len(t) - 3))
    ell = "".join(chr(0x100 + i) for i in range(n_ell))
    out_terms = []
    for t, nd in zip(terms, ndims):
        if "..." in t:
            e = nd - (len(t) - 3)
            if e < 0:
                raise ShapeMismatchError(f"Einsum: term {t!r} has more labels than its operand's rank {nd}")
            t = t.replace("...", ell[n_ell - e:] if e else "")
        if len(t) != nd:
            raise ShapeMismatchError(f"Einsum: term {t!r} has {len(t)} labels but its operand has rank {nd}")
        out_terms.append(t)
    if rhs is None:
        counts: dict = {}
        for t in out_terms:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        rhs = ell + "".join(sorted(c for c, v in counts.items() if v == 1 and ord(c) < 0x100))
    else:
        rhs = rhs.replace("...", ell)
    return out_terms, rhs


def _contract(x, xl: str, y, yl: str, needed: set):
    """Contract two operands with unique labels; labels in ``needed`` survive."""
    batch = [c for c in xl if c in yl and c in needed]
    contr = [c for c in xl if c in yl and c not in needed]
    left = [c for c in xl if c not in yl]
    right = [c for c in yl if c not in xl]
    xs = dict(zip(xl, x.shape))
    ys = dict(zip(yl, y.shape))
    for c in contr:
        if xs[c] != ys[c]:
            raise ShapeMismatchError(f"Einsum: label {c!r} spans sizes {xs[c]} and {ys[c]}")
    xt = x.transpose([xl.index(c) for c in batch + left + contr])
    yt = y.transpose([yl.index(c) for c in batch + contr + right])
    L = int(math.prod([xs[c] for c in left]))
    R = int(math.prod([ys[c] for c in right]))
    C = int(math.prod([xs[c] for c in contr]))
    xb = tuple(xs[c] for c in batch)
    yb = tuple(ys[c] for c in batch)
    A = np.ascontiguousarray(xt).reshape(xb + (L, C))
    B = np.ascontiguousarray(yt).reshape(yb + (C, R))
    r = matmul_nd(A, B, None, "Einsum")
    bshape = r.shape[:len(batch)]
    r = r.reshape(bshape + tuple(xs[c] for c in left) + tuple(ys[c] for c in right))
    return r, "".join(batch + left + right)


def einsum(equation: str, *xs):
    terms, rhs = _parse(equation, [x.ndim for x in xs])
    dt = xs[0].dtype
    for x in xs:
        if x.dtype != dt:
            raise InvalidArgumentError(f"Einsum: inputs must share one dtype, got {[str(x.dtype) for x in xs]}")
    if lowp(dt) or dt == np.float16:
        return einsum(equation, *[x.astype(F32) for x in xs]).astype(dt)
    ops = []
    for x, t in zip(xs, terms):
        ops.append(_diagonal(x, t))
    cur, cl = ops[0]
    for i in range(1, len(ops) + 1):
        later = set(rhs)
        for _, t in ops[i:]:
            later |= set(t)
        cur, cl = _sum_axes(cur, cl, set(c for c in cl if c not in later))
        if i == len(ops):
            break
        y, yl = ops[i]
        later_y = set(rhs) | set(cl)
        for _, t in ops[i + 1:]:
            later_y |= set(t)
        y, yl = _sum_axes(y, yl, set(c for c in yl if c not in later_y))
        needed = set(rhs)
        for _, t in ops[i + 1:]:
            needed |= set(t)
        cur, cl = _contract(cur, cl, y, yl, needed)
    if set(cl) != set(rhs) or len(cl) != len(rhs):
        raise InvalidArgumentError(f"Einsum: output labels {rhs!r} are not a permutation of the result's {cl!r}")
    res = cur.transpose([cl.index(c) for c in rhs])
    if not res.flags.c_contiguous or any(np.may_share_memory(res, x) for x in xs):
        res = res.copy(order="C")
    return res


@op("Einsum", 12)
def Einsum(*inputs, equation=""):
    if not equation:
        raise InvalidAttributeError("Einsum: the 'equation' attribute is required")
    return einsum(equation, *inputs)
