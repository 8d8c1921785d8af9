"""Float32 products against a weight packed at plan time into column panels.

A constant (K, N) weight is repacked once into ``wp[P, K, 16]`` (``pack_panels``): panel ``p`` holds columns
``16p .. 16p + 15`` row after row, zeros past N.  A product then streams each panel front to back, one
contiguous run of memory, and keeps its 16 output columns of up to four rows in vector registers for the whole
of K.  The row-major axpy GEMV it replaces reloaded and stored its output row every four weight rows and
followed four weight rows at once; on a decoder's 9 MB of weights (in L3) the panels stream at about 65 GB/s
against 50.

``tile1``..``tile4`` are Numba intrinsics (LLVM vector IR, fused multiply-adds where the target has them):
``tileR(wp, a2, out, r0, p0, p1)`` sets ``out[r0:r0+R, 16*p0 : min(16*p1, N)]`` to ``a2[r0:r0+R] @ W`` for
those panels.  One row keeps four partial sums per column (k mod 4, added in order at the end) so the
multiply-add latency does not bound it; several rows keep one each.  ``out`` is (M, N) with any N: a last
panel's columns past N are computed from the zero padding and not stored.

Several rows on a host with AVX-512 take the blocked product instead (``gemm_blocked``), when N is a whole
number of panels: ``block_RxQ`` keeps R rows by Q panels (4 x 4 = 16 zmm registers) of output in registers over
a chunk of ``KC`` weight rows, so each broadcast activation feeds four multiply-adds and each loaded weight
vector four; chunks of K keep the Q panels' slice of the weight (128 KiB) in L2 while every row tile passes
over it, the first chunk storing its sums and the later ones adding to them.  On 2 Zen 5 cores it ran the
shapes of a 256-token prefill at 340 to 420 GFLOP/s against the four-row tiles' 100 to 190 (numpy's BLAS with
its AVX-512 kernels: about 390).  The chunk order is fixed, so a thread split never changes a result's bits.

Invariants: the intrinsics read ``a2[r0:r0+R, :K]`` and ``wp[p0:p1]`` and write only those rows and columns of
``out``; they index raw pointers, so their arrays are C-contiguous float32 (the typing refuses anything else)
and the callers check ``a2.shape[1] == wp.shape[1]``, ``r0 + R <= M`` and ``p1 <= P`` with ``16*P >= N``.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from ._simd import AVX512

__all__ = ["PANEL", "pack_panels", "pack_panels_into", "panel_threads", "gemv_panels", "gemm_panels", "gemm_panels_par", "gemm_blocked",
           "blocked_cols"]

PANEL = 16
_ROWS = 4  # rows per register tile of a several-row product
_SETS = 4  # partial sums per column of a one-row product
BYTES_PER_THREAD = 1 << 21
_I32, _F32 = ir.IntType(32), ir.FloatType()
_V8F = ir.VectorType(_F32, 8)
_V16F = ir.VectorType(_F32, 16)
KC = 512  # weight rows per chunk of the blocked product
_RB, _QB = 4, 4  # its register tile: rows by panels
_CONTRACT = ("contract",)


@njit(cache=True, nogil=True)
def pack_panels(w):
    """(K, N) float32 -> (ceil(N/16), K, 16), zeros past N.  Compiled, so a product against a computed weight can
    pack it at run time too (K*N copies, against K*N*M multiply-adds)."""
    K, N = w.shape
    wp = np.empty(((N + PANEL - 1) // PANEL, K, PANEL), np.float32)
    pack_panels_into(w, wp)
    return wp


@njit(cache=True, nogil=True)
def pack_panels_into(w, wp):
    """``pack_panels`` into a given (ceil(N/16), K, 16) buffer (any ``w`` layout, a transposed view too): every
    element written, zeros past N, so a scratch buffer can be reused."""
    K, N = w.shape
    for p in range(wp.shape[0]):
        c0 = p * PANEL
        for k in range(K):
            for c in range(PANEL):
                wp[p, k, c] = w[k, c0 + c] if c0 + c < N else 0.0


def _panel_arrays(wp, a2, out) -> bool:
    """The typing rule of every intrinsic here: C-contiguous float32 arrays of ranks 3, 2 and 2."""
    return all(isinstance(t, types.Array) and t.dtype == types.float32 and t.ndim == nd and t.layout == "C"
               for t, nd in ((wp, 3), (a2, 2), (out, 2)))


def _unpack(context, builder, sig, args):
    """(K, N, intp, weight, activation and output data pointers) of an intrinsic's first three arguments."""
    wa, aa, oa = (context.make_array(sig.args[k])(context, builder, args[k]) for k in range(3))
    K = cgutils.unpack_tuple(builder, wa.shape, 3)[1]
    N = cgutils.unpack_tuple(builder, oa.shape, 2)[1]
    return K, N, K.type, wa.data, aa.data, oa.data


def _tile(R: int, S: int):
    def impl(typingctx, wp, a2, out, r0, p0, p1):
        if not _panel_arrays(wp, a2, out) or not all(isinstance(x, types.Integer) for x in (r0, p0, p1)):
            return None
        sig = types.void(wp, a2, out, types.intp, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            K, N, intp, wptr, aptr, optr = _unpack(context, builder, sig, args)

            def c(v):
                return ir.Constant(intp, v)

            zero = ir.Constant(_V8F, [ir.Constant(_F32, 0.0)] * 8)
            accs = [[[cgutils.alloca_once(builder, _V8F) for _ in range(2)] for _ in range(R)] for _ in range(S)]
            tmp = cgutils.alloca_once(builder, _F32, size=PANEL)
            rows = [builder.add(args[3], c(r)) for r in range(R)]
            arow = [builder.mul(x, K) for x in rows]
            orow = [builder.mul(x, N) for x in rows]

            def bcast(off):
                s = builder.load(builder.gep(aptr, [off]))
                v = builder.insert_element(ir.Constant(_V8F, None), s, ir.Constant(_I32, 0))
                return builder.shuffle_vector(v, ir.Constant(_V8F, None), ir.Constant(ir.VectorType(_I32, 8), [0] * 8))

            def vptr(ptr, off):
                return builder.bitcast(builder.gep(ptr, [off]), _V8F.as_pointer())

            def step(base, k, acc):
                at = builder.add(base, builder.mul(k, c(PANEL)))
                w = [builder.load(vptr(wptr, builder.add(at, c(8 * v))), align=4) for v in range(2)]
                for r in range(R):
                    x = bcast(builder.add(arow[r], k))
                    for v in range(2):
                        prod = builder.fmul(x, w[v], flags=_CONTRACT)
                        builder.store(builder.fadd(builder.load(acc[r][v]), prod, flags=_CONTRACT), acc[r][v])

            ks = builder.mul(builder.udiv(K, c(S)), c(S))
            with cgutils.for_range_slice(builder, args[4], args[5], c(1), intp=intp) as (p, _):
                base = builder.mul(p, builder.mul(K, c(PANEL)))
                for s in range(S):
                    for r in range(R):
                        for v in range(2):
                            builder.store(zero, accs[s][r][v])
                with cgutils.for_range_slice(builder, c(0), ks, c(S), intp=intp) as (k, _):
                    for s in range(S):
                        step(base, builder.add(k, c(s)), accs[s])
                with cgutils.for_range_slice(builder, ks, K, c(1), intp=intp) as (k, _):
                    step(base, k, accs[0])
                col = builder.mul(p, c(PANEL))
                full = builder.icmp_signed("<=", builder.add(col, c(PANEL)), N)
                for r in range(R):
                    sums = []
                    for v in range(2):
                        t = builder.load(accs[0][r][v])
                        for s in range(1, S):
                            t = builder.fadd(t, builder.load(accs[s][r][v]))
                        sums.append(t)
                    dst = builder.add(orow[r], col)
                    with builder.if_else(full) as (then, other):
                        with then:
                            for v in range(2):
                                builder.store(sums[v], vptr(optr, builder.add(dst, c(8 * v))), align=4)
                        with other:
                            for v in range(2):
                                builder.store(sums[v], vptr(tmp, c(8 * v)), align=4)
                            with cgutils.for_range(builder, builder.sub(N, col), intp=intp) as lc:
                                x = builder.load(builder.gep(tmp, [lc.index]))
                                builder.store(x, builder.gep(optr, [builder.add(dst, lc.index)]))
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = f"tile{R}"
    return intrinsic(impl)


tile1 = _tile(1, _SETS)
tile2 = _tile(2, 1)
tile3 = _tile(3, 1)
tile4 = _tile(_ROWS, 1)


def _block(R: int, Q: int):
    """``block_RxQ(wp, a2, out, r0, p0, k0, k1, first)``: ``out[r0:r0+R, 16*p0 : 16*(p0+Q)]`` (all full panels)
    set to (``first``) or increased by (otherwise) ``a2[r0:r0+R, k0:k1] @ W[k0:k1]`` for those columns."""
    def impl(typingctx, wp, a2, out, r0, p0, k0, k1, first):
        if not _panel_arrays(wp, a2, out) or \
                not all(isinstance(x, (types.Integer, types.Boolean)) for x in (r0, p0, k0, k1, first)):
            return None
        sig = types.void(wp, a2, out, types.intp, types.intp, types.intp, types.intp, types.boolean)

        def codegen(context, builder, sig, args):
            K, N, intp, wptr, aptr, optr = _unpack(context, builder, sig, args)
            r0, p0, k0, k1, first = args[3:]

            def c(v):
                return ir.Constant(intp, v)

            def vptr(ptr, off):
                return builder.bitcast(builder.gep(ptr, [off]), _V16F.as_pointer())

            acc = [[cgutils.alloca_once(builder, _V16F) for _ in range(Q)] for _ in range(R)]
            arow = [builder.mul(builder.add(r0, c(r)), K) for r in range(R)]
            dst = [[builder.add(builder.mul(builder.add(r0, c(r)), N), builder.mul(builder.add(p0, c(q)), c(PANEL)))
                    for q in range(Q)] for r in range(R)]
            base = [builder.mul(builder.add(p0, c(q)), builder.mul(K, c(PANEL))) for q in range(Q)]
            zero = ir.Constant(_V16F, [ir.Constant(_F32, 0.0)] * 16)
            with builder.if_else(first) as (then, other):
                with then:
                    for r in range(R):
                        for q in range(Q):
                            builder.store(zero, acc[r][q])
                with other:
                    for r in range(R):
                        for q in range(Q):
                            builder.store(builder.load(vptr(optr, dst[r][q]), align=4), acc[r][q])
            with cgutils.for_range_slice(builder, k0, k1, c(1), intp=intp) as (k, _):
                kk = builder.mul(k, c(PANEL))
                w = [builder.load(vptr(wptr, builder.add(base[q], kk)), align=4) for q in range(Q)]
                for r in range(R):
                    s = builder.load(builder.gep(aptr, [builder.add(arow[r], k)]))
                    x = builder.insert_element(ir.Constant(_V16F, None), s, ir.Constant(_I32, 0))
                    x = builder.shuffle_vector(x, ir.Constant(_V16F, None),
                                               ir.Constant(ir.VectorType(_I32, 16), [0] * 16))
                    for q in range(Q):
                        prod = builder.fmul(x, w[q], flags=_CONTRACT)
                        builder.store(builder.fadd(builder.load(acc[r][q]), prod, flags=_CONTRACT), acc[r][q])
            for r in range(R):
                for q in range(Q):
                    builder.store(builder.load(acc[r][q]), vptr(optr, dst[r][q]), align=4)
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = f"block_{R}x{Q}"
    return intrinsic(impl)


block_full = _block(_RB, _QB)
block_rowsleft = _block(1, _QB)
block_panelsleft = _block(_RB, 1)
block_one = _block(1, 1)


@njit(cache=True, nogil=True)
def panel_threads(P, K, nt_max):
    """Threads for a one-row product over (P, K, 16) panels: waking threads costs more than a small weight
    takes to stream, so one thread per 2 MiB of panels, at most ``nt_max`` and ``P``."""
    return max(1, min(nt_max, (P * K * PANEL * 4) // BYTES_PER_THREAD, P))


@njit(cache=True, nogil=True)
def _rows_range(a2, wp, out, p0, p1):
    """All rows of ``a2`` against panels [p0, p1): per panel, four-row tiles then the 1..3 rows left."""
    M = a2.shape[0]
    for p in range(p0, p1):
        r = 0
        while r + _ROWS <= M:
            tile4(wp, a2, out, r, p, p + 1)
            r += _ROWS
        left = M - r
        if left == 3:
            tile3(wp, a2, out, r, p, p + 1)
        elif left == 2:
            tile2(wp, a2, out, r, p, p + 1)
        elif left == 1:
            tile1(wp, a2, out, r, p, p + 1)


@njit(cache=True, nogil=True, parallel=True)
def gemv_par(a2, wp, out, nt):
    P = wp.shape[0]
    for t in prange(nt):
        tile1(wp, a2, out, 0, t * P // nt, (t + 1) * P // nt)


@njit(cache=True, nogil=True)
def gemv_panels(a2, wp, out, nt):
    """out (1, N) = a2 (1, K) @ the panels, on ``nt`` threads (each a contiguous range of panels)."""
    if nt <= 1:
        tile1(wp, a2, out, 0, 0, wp.shape[0])
    else:
        gemv_par(a2, wp, out, nt)


@njit(cache=True, nogil=True, inline="always")
def _rows_of(wp, a2, out, p, k0, k1, first, wide):
    """Every row of ``a2`` against four panels from ``p`` (``wide``) or panel ``p`` alone: four-row tiles, then
    the rows left over."""
    M = a2.shape[0]
    r = 0
    while r + _RB <= M:
        if wide:
            block_full(wp, a2, out, r, p, k0, k1, first)
        else:
            block_panelsleft(wp, a2, out, r, p, k0, k1, first)
        r += _RB
    while r < M:
        if wide:
            block_rowsleft(wp, a2, out, r, p, k0, k1, first)
        else:
            block_one(wp, a2, out, r, p, k0, k1, first)
        r += 1


@njit(cache=True, nogil=True)
def blocked_cols(a2, wp, out, p0, p1, k0, k1, first):
    """``out[:, 16*p0 : 16*p1]`` (all full panels) set to (``first``) or increased by ``a2[:, k0:k1] @ W[k0:k1]``
    for those columns: four-by-four register tiles, then the rows and panels left over.  ``a2.shape[1]`` is
    the panels' K."""
    p = p0
    while p < p1:
        wide = p + _QB <= p1
        _rows_of(wp, a2, out, p, k0, k1, first, wide)
        p += _QB if wide else 1


@njit(cache=True, nogil=True)
def gemm_blocked(a2, wp, out, g0, g1):
    """``out[:, 64*g0 : 64*g1]`` (M, N with N = 16 * P) = a2 @ the panels, over panel groups [g0, g1) of four
    (the last group may hold fewer): chunk by chunk of K, each group's row tiles over that chunk."""
    K = a2.shape[1]
    P = wp.shape[0]
    for k0 in range(0, K, KC):
        k1 = min(K, k0 + KC)
        for g in range(g0, g1):
            blocked_cols(a2, wp, out, g * _QB, min(P, (g + 1) * _QB), k0, k1, k0 == 0)


@njit(cache=True, nogil=True, parallel=True)
def _gemm_blocked_par(a2, wp, out, nchunk):
    G = (wp.shape[0] + _QB - 1) // _QB
    for t in prange(nchunk):
        gemm_blocked(a2, wp, out, t * G // nchunk, (t + 1) * G // nchunk)


@njit(cache=True, nogil=True)
def _blocked(wp, out):
    return AVX512 and out.shape[1] == wp.shape[0] * PANEL


@njit(cache=True, nogil=True)
def gemm_panels(a2, wp, out):
    """out (M, N) = a2 (M, K) @ the panels, on one thread."""
    if _blocked(wp, out):
        gemm_blocked(a2, wp, out, 0, (wp.shape[0] + _QB - 1) // _QB)
    else:
        _rows_range(a2, wp, out, 0, wp.shape[0])


@njit(cache=True, nogil=True, parallel=True)
def gemm_panels_par(a2, wp, out):
    """out (M, N) = a2 (M, K) @ the panels, panels split over the thread pool."""
    P = wp.shape[0]
    if _blocked(wp, out):
        _gemm_blocked_par(a2, wp, out, min((P + _QB - 1) // _QB, 64))
        return
    nchunk = min(P, 64)
    for t in prange(nchunk):
        _rows_range(a2, wp, out, t * P // nchunk, (t + 1) * P // nchunk)
