"""uint8 x int8 products summed as onnxruntime's MLAS sums them on x86 hosts: ``vpmaddubsw``, or ``vpdpbusd``.

``vpmaddubsw`` multiplies 32 unsigned bytes by 32 signed bytes and adds each adjacent pair of products into
16 bits with saturation; ``vpmaddwd`` against ones then adds the two pair sums of each 32-bit lane exactly.
MLAS packs B so that a lane holds one column's four consecutive k, so the pairs are (k, k + 1) for even k,
and a pair sum past the int16 range is clamped before the column's 32-bit total takes it.
``ops.rnn._saturating_dot`` states the same arithmetic in float lanes; this module runs it in the instruction
itself (32 products per instruction instead of 8 lanes of float work).

``pack(W)`` lays int8 weights ``W [K, N]`` out as ``[G, K4, 32]``: column group ``g`` (8 columns), k quad
``kk``, byte ``4i + t`` = ``W[4kk + t, 8g + i]``; K and N are padded with zeros to multiples of 4 and 8 (a
zero weight adds a zero product, so a pair with a padded k sums as the lone product it holds).  ``sat_gemm(A,
Wp, out)`` writes ``out[m, 8g + i]`` (int32) = the saturated pair sums of uint8 row ``A[m]`` (``4 * K4``
codes, zeros past K) against column ``8g + i``.  On hosts with AVX2 it is a Numba intrinsic emitting
``vpmaddubsw``/``vpmaddwd``; elsewhere ``sat_gemm_portable``, the same integers from a Numba loop (tests
compare the two on AVX2 hosts).  ``SATURATES``: whether onnxruntime's uint8 x int8 products saturate on this
host, so that its LSTM, MatMulInteger and QLinearMatMul results are reproduced by these kernels.

On hosts with VNNI, MLAS adds every product exactly (``vpdpbusd``, 4 products per 32-bit lane); ``dot_gemm``
runs that instruction over the same packed weights (``dot_gemm_portable`` elsewhere), so the exact product
costs one instruction per 32 products there instead of the int16 pairs' two.  ``host_gemm`` is the host's
form (saturating or exact; meaningful where ``PACKED``), ``host_gemm_tasks`` spreads it over the threads.

Invariant: callers pass C-contiguous arrays of the shapes above (``out`` [M, 8G], ``A`` [M, 4 K4]); the
kernels read and write nothing else.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from . import _simd

__all__ = ["pack", "pack_lanes", "emit_lane_gemm", "lane_gemm_signature", "lane_gemm", "sat_gemm", "sat_gemm_portable",
           "dot_gemm", "dot_gemm_portable", "host_gemm", "host_gemm_tasks", "zero_point_terms", "AVX2", "VNNI", "SATURATES", "PACKED"]

AVX2 = _simd.AVX2
VNNI = _simd.VNNI

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_V32I8 = ir.VectorType(_I8, 32)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)


def pack_lanes(W: np.ndarray, t: int) -> np.ndarray:
    """``W [K, N]`` for kernels that hold one output column per 32-bit lane, 8 lanes a vector, and ``t``
    consecutive k per lane: ``[G, ceil(K / t), 8 t]`` with element ``t i + r`` of (g, kk) = ``W[t kk + r, 8 g + i]``,
    K and N zero-padded to multiples of ``t`` and 8."""
    K, N = W.shape
    Kt, G = -(-K // t), -(-N // 8)
    Wz = np.zeros((t * Kt, 8 * G), W.dtype)
    Wz[:K, :N] = W
    return np.ascontiguousarray(Wz.reshape(Kt, t, G, 8).transpose(2, 0, 3, 1).reshape(G, Kt, 8 * t))


def pack(W: np.ndarray) -> np.ndarray:
    """int8 ``W [K, N]`` as ``[G, K4, 32]`` (see the module docstring), zero-padded."""
    return pack_lanes(np.asarray(W, np.int8), 4)


@njit(cache=True, nogil=True)
def sat_gemm_portable(A, Wp, out):
    """``sat_gemm`` by a Numba loop: each pair of products added in 32 bits, then clamped to int16."""
    _lanes_portable(A, Wp, out, 0, Wp.shape[0], True)


@njit(cache=True, nogil=True)
def _lanes_portable(A, Wp, out, g0, g1, saturate):
    """The lane products over column groups [g0, g1) by a Numba loop: each pair of products added in 32 bits,
    clamped to int16 when ``saturate`` (``vpmaddubsw``), then added to the column's total (exactly otherwise)."""
    M = A.shape[0]
    K4 = Wp.shape[1]
    for m in range(M):
        for g in range(g0, g1):
            for i in range(8):
                acc = np.int32(0)
                for kk in range(K4):
                    for t in range(0, 4, 2):
                        s = np.int32(A[m, 4 * kk + t]) * np.int32(Wp[g, kk, 4 * i + t]) \
                            + np.int32(A[m, 4 * kk + t + 1]) * np.int32(Wp[g, kk, 4 * i + t + 1])
                        acc += min(max(s, np.int32(-32768)), np.int32(32767)) if saturate else s
                out[m, 8 * g + i] = acc


@njit(cache=True, nogil=True)
def _sat_part_portable(A, Wp, out, g0, g1):
    _lanes_portable(A, Wp, out, g0, g1, True)


def _intrinsic_fn(builder, name, ret, args):
    mod = builder.module
    return mod.globals.get(name) or ir.Function(mod, ir.FunctionType(ret, args), name)


_ROW_BLOCK, _GROUP_BLOCK = 4, 2  # rows x column groups per block of ``emit_lane_gemm``: 8 accumulators


def emit_lane_gemm(context, builder, sig, args, product):
    """The IR of a lane product over packed weights (``pack_lanes``): for column groups g in [args[3],
    args[4]) and every row m of ``A`` (args[0], 4 bytes of it per k step, broadcast to the 8 lanes), the int32
    lane sums ``product(builder, a, w)`` of that broadcast (<8 x i32>) against group g's next 32 bytes of
    weights (args[1], a <32 x i8> load) accumulated over the k steps, stored to ``out[m, 8g:8g + 8]`` (args[2]).
    Blocks of 4 rows by 2 groups share each load (the weights' once per 4 rows, a row's broadcast once per 2
    groups) and keep 8 independent accumulators; the rows and the group past whole blocks take smaller blocks.
    The sums of one lane are added in k order whatever the block, so every block gives the same integers."""
    A, W, O = (context.make_array(t)(context, builder, v) for t, v in zip(sig.args[:3], args[:3]))
    M, Kp = cgutils.unpack_tuple(builder, A.shape, 2)
    _, steps, _ = cgutils.unpack_tuple(builder, W.shape, 3)
    N = cgutils.unpack_tuple(builder, O.shape, 2)[1]
    intp = M.type
    lo = context.cast(builder, args[3], sig.args[3], types.intp)
    hi = context.cast(builder, args[4], sig.args[4], types.intp)
    abytes = context.get_abi_sizeof(context.get_data_type(sig.args[0].dtype))
    wbytes = context.get_abi_sizeof(context.get_data_type(sig.args[1].dtype))

    def c(v):
        return ir.Constant(intp, v)
    i8p = _I8.as_pointer()
    zero = ir.Constant(_V8I32, [ir.Constant(_I32, 0)] * 8)
    accs = [[cgutils.alloca_once(builder, _V8I32) for _ in range(_GROUP_BLOCK)] for _ in range(_ROW_BLOCK)]
    wstride = builder.mul(steps, c(32))
    arow = builder.mul(Kp, c(abytes))

    def block(g, m, nr, ng):
        """Rows [m, m + nr) against groups [g, g + ng)."""
        wbase = [builder.gep(builder.bitcast(W.data, i8p), [builder.mul(builder.add(g, c(j)), wstride)])
                 for j in range(ng)]
        abase = [builder.gep(builder.bitcast(A.data, i8p), [builder.mul(builder.add(m, c(r)), arow)])
                 for r in range(nr)]
        for r in range(nr):
            for j in range(ng):
                builder.store(zero, accs[r][j])
        with cgutils.for_range(builder, steps, intp=intp) as lk:
            k = lk.index
            wv = [builder.load(builder.bitcast(builder.gep(wb, [builder.mul(k, c(32))]), _V32I8.as_pointer()),
                               align=wbytes) for wb in wbase]
            for r in range(nr):
                a4 = builder.load(builder.bitcast(builder.gep(abase[r], [builder.mul(k, c(4))]),
                                                  _I32.as_pointer()), align=abytes)
                av = builder.insert_element(ir.Constant(_V8I32, None), a4, ir.Constant(_I32, 0))
                av = builder.shuffle_vector(av, ir.Constant(_V8I32, None),
                                            ir.Constant(ir.VectorType(_I32, 8), [0] * 8))
                for j in range(ng):
                    builder.store(builder.add(builder.load(accs[r][j]), product(builder, av, wv[j])), accs[r][j])
        for r in range(nr):
            for j in range(ng):
                optr = builder.gep(O.data, [builder.add(builder.mul(builder.add(m, c(r)), N),
                                                        builder.mul(builder.add(g, c(j)), c(8)))])
                builder.store(builder.load(accs[r][j]), builder.bitcast(optr, _V8I32.as_pointer()), align=4)

    def rows(g, ng):
        mb = builder.mul(builder.sdiv(M, c(_ROW_BLOCK)), c(_ROW_BLOCK))
        with cgutils.for_range_slice(builder, c(0), mb, c(_ROW_BLOCK), intp=intp) as (m, _):
            block(g, m, _ROW_BLOCK, ng)
        with cgutils.for_range_slice(builder, mb, M, c(1), intp=intp) as (m, _):
            block(g, m, 1, ng)

    gb = builder.add(lo, builder.mul(builder.sdiv(builder.sub(hi, lo), c(_GROUP_BLOCK)), c(_GROUP_BLOCK)))
    with cgutils.for_range_slice(builder, lo, gb, c(_GROUP_BLOCK), intp=intp) as (g, _):
        rows(g, _GROUP_BLOCK)
    with cgutils.for_range_slice(builder, gb, hi, c(1), intp=intp) as (g, _):
        rows(g, 1)
    return context.get_dummy_value()


def lane_gemm_signature(a, w, out, g0, g1, adt, wdt):
    """The signature of an ``emit_lane_gemm`` intrinsic for these argument types, or None."""
    def arr(x, dt, nd):
        return isinstance(x, types.Array) and x.dtype == dt and x.ndim == nd and x.layout == "C"
    if arr(a, adt, 2) and arr(w, wdt, 3) and arr(out, types.int32, 2) and isinstance(g0, types.Integer) \
            and isinstance(g1, types.Integer):
        return types.void(a, w, out, g0, g1)
    return None


def lane_gemm(name, adt, wdt, product):
    """A Numba intrinsic ``name(A, Wp, out, g0, g1)``: ``emit_lane_gemm`` with ``product`` for ``A`` of ``adt`` and
    packed weights of ``wdt`` (the typing refuses other operands)."""
    def impl(typingctx, a, w, out, g0, g1):
        sig = lane_gemm_signature(a, w, out, g0, g1, adt, wdt)
        if sig is None:
            return None
        return sig, lambda context, builder, sig, args: emit_lane_gemm(context, builder, sig, args, product)
    impl.__name__ = name
    return intrinsic(impl)


def _maddubs(builder, av, wv):
    """The 4 uint8 x int8 products of each lane: pairs saturated to int16 (``vpmaddubsw``), added (``vpmaddwd``)."""
    mub = _intrinsic_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
    mwd = _intrinsic_fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
    pairs = builder.call(mub, [builder.bitcast(av, _V32I8), wv])
    return builder.call(mwd, [pairs, ir.Constant(_V16I16, [ir.Constant(_I16, 1)] * 16)])


_sat_gemm_avx2 = lane_gemm("sat_gemm_avx2", types.uint8, types.int8, _maddubs)


@njit(cache=True, nogil=True)
def _sat_part_host(A, Wp, out, g0, g1):
    _sat_gemm_avx2(A, Wp, out, g0, g1)


_sat_part = _sat_part_host if AVX2 else _sat_part_portable


@njit(cache=True, nogil=True)
def sat_gemm(A, Wp, out):
    """The saturated pair sums over every column group: ``vpmaddubsw`` on AVX2 hosts, the portable loop
    elsewhere."""
    _sat_part(A, Wp, out, 0, Wp.shape[0])


@njit(cache=True, nogil=True)
def dot_gemm_portable(A, Wp, out):
    """``dot_gemm`` by a Numba loop: every product added exactly in 32 bits."""
    _lanes_portable(A, Wp, out, 0, Wp.shape[0], False)


@njit(cache=True, nogil=True)
def _dot_part_portable(A, Wp, out, g0, g1):
    _lanes_portable(A, Wp, out, g0, g1, False)


def _dpbusd(builder, av, wv):
    """The 4 uint8 x int8 products of each lane added exactly (``vpdpbusd`` into zero; the caller's add keeps the
    accumulator's chain one cycle long)."""
    dp = _intrinsic_fn(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [_V8I32, _V8I32, _V8I32])
    return builder.call(dp, [ir.Constant(_V8I32, [ir.Constant(_I32, 0)] * 8), av, builder.bitcast(wv, _V8I32)])


_dot_gemm_vnni = lane_gemm("dot_gemm_vnni", types.uint8, types.int8, _dpbusd)


@njit(cache=True, nogil=True)
def _dot_part_host(A, Wp, out, g0, g1):
    _dot_gemm_vnni(A, Wp, out, g0, g1)


_dot_part = _dot_part_host if VNNI else _dot_part_portable


@njit(cache=True, nogil=True)
def dot_gemm(A, Wp, out):
    """``sat_gemm``'s operands and layout, every product added exactly (as onnxruntime's MLAS adds them with
    VNNI): ``vpdpbusd`` on VNNI hosts, 32 products per instruction; the portable loop elsewhere."""
    _dot_part(A, Wp, out, 0, Wp.shape[0])


def _host_saturates() -> bool:
    """Whether onnxruntime's uint8 x int8 products saturate here: MLAS sums them by ``vpmaddubsw`` (adjacent
    pairs into 16 bits, with saturation) on x86 hosts with AVX2 and without VNNI, and exactly elsewhere
    (``vpdpbusd`` with VNNI, widened products on other hosts, and for uint8 weights)."""
    import platform
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    f = _simd.target_features()
    return bool(f.get("avx2", False) and not (f.get("avxvnni", False) or f.get("avx512vnni", False)))


SATURATES = _host_saturates()

# Whether int8-weight products take the packed uint8 x int8 form here: with the saturating pair sums where
# onnxruntime's are saturated, exactly by ``vpdpbusd`` on VNNI hosts.  ``host_gemm`` is that product (only
# meaningful where ``PACKED``); elsewhere callers take the exact int16 pairs of ``ops._i16pairs``.
PACKED = SATURATES or VNNI
host_gemm = sat_gemm if SATURATES else dot_gemm
_host_part = _sat_part if SATURATES else _dot_part

_ROWS = 64  # rows of A per task of ``host_gemm_tasks``
_GROUPS = 16  # at most this many column groups per task where the rows are few


@njit(cache=True, nogil=True, parallel=True)
def host_gemm_tasks(A, Wp, out):
    """``host_gemm`` in tasks over the threads: of ``_ROWS`` rows where A has several such, otherwise of at most
    ``_GROUPS`` column groups (at least 8 tasks where the groups allow)."""
    M = A.shape[0]
    G = Wp.shape[0]
    if M >= 2 * _ROWS:
        for c in prange((M + _ROWS - 1) // _ROWS):
            r0 = c * _ROWS
            r1 = min(M, r0 + _ROWS)
            _host_part(A[r0:r1], Wp, out[r0:r1], 0, G)
        return
    per = max(1, min(_GROUPS, (G + 7) // 8))
    for t in prange((G + per - 1) // per):
        _host_part(A, Wp, out, t * per, min(G, (t + 1) * per))


@njit(cache=True, nogil=True)
def zero_point_terms(acc, a, cb, za, zb, shift, out):
    """out = acc - (zb[j] - shift) * sum_k a[i, k] - za[i] * cb[j] + K * za[i] * zb[j] (``cb``: B's column sums;
    ``acc`` the product with B's codes less ``shift``), in int32 (wrapping as onnxruntime's int32 sums do);
    ``za``/``zb`` have one element or one per row / column."""
    m, k = a.shape
    n = out.shape[1]
    ra = np.zeros(m, np.int32)
    for i in range(m):
        for kk in range(k):
            ra[i] += np.int32(a[i, kk])
    for i in range(m):
        zi = np.int32(za[i if za.shape[0] > 1 else 0])
        for j in range(n):
            zj = np.int32(zb[j if zb.shape[0] > 1 else 0])
            out[i, j] = np.int32(acc[i, j] - (zj - np.int32(shift)) * ra[i] - zi * cb[j] + np.int32(k) * zi * zj)
