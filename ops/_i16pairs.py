"""Exact products of 8-bit integer codes minus their zero points, in int16 pairs: ``vpmaddwd``.

A code minus a zero point lies in [-255, 255], so it fits int16, and ``vpmaddwd`` multiplies 16 such pairs and
adds each adjacent pair of products into an int32 lane, exactly.  This is how onnxruntime's MLAS computes
uint8 x uint8 products on AVX2 (and every 8-bit product on hosts where the ``vpmaddubsw`` form would saturate
does not apply); the sums are the exact integers, wrapping in int32 as MLAS's do.

``pack(Bz)`` lays an int16 matrix ``Bz [K, N]`` (codes minus zero points) out as ``[G, K2, 16]``: column group
``g`` (8 columns), k pair ``kk``, element ``2i + t`` = ``Bz[2kk + t, 8g + i]``, zero-padded to even K and whole
groups.  ``gemm(Az, Bp, out)`` writes ``out[m, 8g + i]`` (int32) = the dot of int16 row ``Az[m]`` (``2 * K2``
values, zeros past K) with column ``8g + i``: on AVX2 hosts a Numba intrinsic, elsewhere ``gemm_portable``
(tests compare the two).  ``gemm_groups`` spreads column groups over the threads (the rows of an 8-bit product
are few, its columns many).

Invariant: callers pass C-contiguous arrays of the shapes above; the kernels read and write nothing else.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types

from . import _simd
from ._u8s8 import lane_gemm, pack_lanes

__all__ = ["pack", "gemm", "gemm_groups", "gemm_portable", "AVX2"]

AVX2 = _simd.AVX2

_I16, _I32 = ir.IntType(16), ir.IntType(32)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)


def pack(Bz: np.ndarray) -> np.ndarray:
    """int16 ``Bz [K, N]`` as ``[G, K2, 16]`` (see the module docstring), zero-padded."""
    return pack_lanes(np.asarray(Bz, np.int16), 2)


@njit(cache=True, nogil=True)
def gemm_portable(Az, Bp, out, g0, g1):
    """``gemm`` over column groups [g0, g1) by a Numba loop."""
    M = Az.shape[0]
    K2 = Bp.shape[1]
    for g in range(g0, g1):
        for m in range(M):
            for i in range(8):
                acc = np.int32(0)
                for kk in range(K2):
                    acc += np.int32(Az[m, 2 * kk]) * np.int32(Bp[g, kk, 2 * i]) \
                        + np.int32(Az[m, 2 * kk + 1]) * np.int32(Bp[g, kk, 2 * i + 1])
                out[m, 8 * g + i] = acc


def _maddwd(builder, av, wv):
    """The 2 int16 x int16 products of each lane, added exactly (``vpmaddwd``)."""
    mod = builder.module
    mwd = mod.globals.get("llvm.x86.avx2.pmadd.wd") or ir.Function(
        mod, ir.FunctionType(_V8I32, [_V16I16, _V16I16]), "llvm.x86.avx2.pmadd.wd")
    return builder.call(mwd, [builder.bitcast(av, _V16I16), builder.bitcast(wv, _V16I16)])


_gemm_avx2 = lane_gemm("gemm_i16_avx2", types.int16, types.int16, _maddwd)


@njit(cache=True, nogil=True)
def _gemm_host(Az, Bp, out, g0, g1):
    _gemm_avx2(Az, Bp, out, g0, g1)


gemm = _gemm_host if AVX2 else gemm_portable

_GROUPS = 16  # at most this many column groups per task of ``gemm_groups``, and at least 8 tasks where G allows


@njit(cache=True, nogil=True, parallel=True)
def gemm_groups(Az, Bp, out):
    """``gemm`` over all column groups in tasks over the threads."""
    G = Bp.shape[0]
    per = max(1, min(_GROUPS, (G + 7) // 8))
    for t in prange((G + per - 1) // per):
        gemm(Az, Bp, out, t * per, min(G, (t + 1) * per))
