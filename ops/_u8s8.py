"""uint8 x int8 products summed as onnxruntime's MLAS sums them on x86 hosts without VNNI: ``vpmaddubsw``.

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
compare the two on AVX2 hosts); ``sat_gemm_rows`` spreads rows over the threads.  ``SATURATES``: whether
onnxruntime's uint8 x int8 products saturate on this host, so that its LSTM, MatMulInteger and QLinearMatMul
results are reproduced by these kernels.

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

__all__ = ["pack", "pack_lanes", "sat_gemm", "sat_gemm_rows", "sat_gemm_portable", "AVX2", "SATURATES"]

AVX2 = _simd.AVX2

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
    M = A.shape[0]
    G, K4 = Wp.shape[0], Wp.shape[1]
    for m in range(M):
        for g in range(G):
            for i in range(8):
                acc = np.int32(0)
                for kk in range(K4):
                    for t in range(0, 4, 2):
                        s = np.int32(A[m, 4 * kk + t]) * np.int32(Wp[g, kk, 4 * i + t]) \
                            + np.int32(A[m, 4 * kk + t + 1]) * np.int32(Wp[g, kk, 4 * i + t + 1])
                        acc += min(max(s, np.int32(-32768)), np.int32(32767))
                out[m, 8 * g + i] = acc


@intrinsic
def _sat_gemm_avx2(typingctx, a, w, out):
    if not (isinstance(a, types.Array) and a.dtype == types.uint8 and a.ndim == 2 and a.layout == "C"
            and isinstance(w, types.Array) and w.dtype == types.int8 and w.ndim == 3 and w.layout == "C"
            and isinstance(out, types.Array) and out.dtype == types.int32 and out.ndim == 2 and out.layout == "C"):
        return None
    sig = types.void(a, w, out)

    def codegen(context, builder, sig, args):
        A, W, O = (context.make_array(t)(context, builder, v) for t, v in zip(sig.args, args))
        M, Kp = cgutils.unpack_tuple(builder, A.shape, 2)
        G, K4, _ = cgutils.unpack_tuple(builder, W.shape, 3)
        N = cgutils.unpack_tuple(builder, O.shape, 2)[1]
        intp = M.type
        c = lambda v: ir.Constant(intp, v)  # noqa: E731
        mod = builder.module
        mub = mod.globals.get("llvm.x86.avx2.pmadd.ub.sw") or ir.Function(
            mod, ir.FunctionType(_V16I16, [_V32I8, _V32I8]), "llvm.x86.avx2.pmadd.ub.sw")
        mwd = mod.globals.get("llvm.x86.avx2.pmadd.wd") or ir.Function(
            mod, ir.FunctionType(_V8I32, [_V16I16, _V16I16]), "llvm.x86.avx2.pmadd.wd")
        ones = ir.Constant(_V16I16, [ir.Constant(_I16, 1)] * 16)
        accp = cgutils.alloca_once(builder, _V8I32)
        with cgutils.for_range(builder, G, intp=intp) as lg:
            wbase = builder.gep(W.data, [builder.mul(lg.index, builder.mul(K4, c(32)))])
            with cgutils.for_range(builder, M, intp=intp) as lm:
                abase = builder.gep(A.data, [builder.mul(lm.index, Kp)])
                builder.store(ir.Constant(_V8I32, [ir.Constant(_I32, 0)] * 8), accp)
                with cgutils.for_range(builder, K4, intp=intp) as lk:
                    k = lk.index
                    a4 = builder.load(builder.bitcast(builder.gep(abase, [builder.mul(k, c(4))]),
                                                      _I32.as_pointer()), align=1)
                    av = builder.insert_element(ir.Constant(_V8I32, None), a4, ir.Constant(_I32, 0))
                    av = builder.shuffle_vector(av, ir.Constant(_V8I32, None),
                                                ir.Constant(ir.VectorType(_I32, 8), [0] * 8))
                    wv = builder.load(builder.bitcast(builder.gep(wbase, [builder.mul(k, c(32))]),
                                                      _V32I8.as_pointer()), align=1)
                    pairs = builder.call(mub, [builder.bitcast(av, _V32I8), wv])
                    builder.store(builder.add(builder.load(accp), builder.call(mwd, [pairs, ones])), accp)
                optr = builder.gep(O.data, [builder.add(builder.mul(lm.index, N), builder.mul(lg.index, c(8)))])
                builder.store(builder.load(accp), builder.bitcast(optr, _V8I32.as_pointer()), align=1)
        return context.get_dummy_value()
    return sig, codegen


@njit(cache=True, nogil=True)
def _sat_gemm_host(A, Wp, out):
    _sat_gemm_avx2(A, Wp, out)


sat_gemm = _sat_gemm_host if AVX2 else sat_gemm_portable

_ROWS = 64  # rows of A per task of ``sat_gemm_rows``


@njit(cache=True, nogil=True, parallel=True)
def sat_gemm_rows(A, Wp, out):
    """``sat_gemm`` in tasks of ``_ROWS`` rows over the threads."""
    M = A.shape[0]
    for c in prange((M + _ROWS - 1) // _ROWS):
        r0 = c * _ROWS
        r1 = min(M, r0 + _ROWS)
        sat_gemm(A[r0:r1], Wp, out[r0:r1])


def _host_saturates() -> bool:
    """Whether onnxruntime's uint8 x int8 products saturate here: MLAS sums them by ``vpmaddubsw`` (adjacent
    pairs into 16 bits, with saturation) on x86 hosts with AVX2 and without VNNI, and exactly elsewhere
    (``vpdpbusd`` with VNNI, widened products on other hosts, and for uint8 weights)."""
    import platform
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        import llvmlite.binding as llb
        f = llb.get_host_cpu_features()
    except Exception:  # pragma: no cover - a host LLVM cannot describe
        return False
    return bool(f.get("avx2", False) and not (f.get("avxvnni", False) or f.get("avx512vnni", False)))


SATURATES = _host_saturates()
