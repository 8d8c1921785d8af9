"""CUDA block-quantized contrib ops (com.microsoft): MatMulNBits and GatherBlockQuantized.

MatMulNBits: ``Y = A @ dequant(B)^T (+ bias)`` with ``B`` uint8 ``[N, n_blocks, blob]`` holding ``bits``-bit
codes packed low bits first along K; element ``(n, k)`` is ``(q - zp[n, g(k)]) * scale[n, g(k)]`` with
``g(k) = k // block_size`` (or ``g_idx[k]``), zero points absent (``2**(bits-1)``), packed uint8 or floats of
A's type (with a g_idx packed zero points are ignored, as on the CPU and in onnxruntime).  One kernel serves
decode and prefill: a block owns ``cols`` output columns, ``lanes`` threads per column stream that column's
packed bytes once (adjacent lanes read adjacent bytes: coalesced), dequantize on the fly and accumulate up to
``_ROWS`` rows of A at a time in registers; a segmented shared-memory reduction finishes each column.  The
grid's second axis walks A's rows ``_ROWS`` at a time, so a GEMV (M = 1) reads the weight exactly once and a
prefill re-reads it once per ``_ROWS`` rows (correctness first; a dequantize-in-tile GEMM is the follow-up).
Accumulation is float32 on dequantized weights for every ``accuracy_level`` (onnxruntime's level-4 int8
quantization of A, which the CPU twin reproduces, is not applied: at level 4 results differ from the CPU by
that quantization error).

GatherBlockQuantized: uint8 data (``8/bits`` codes per byte along the last axis, default zero point
``2**(bits-1)``), gathered along ``gather_axis`` and dequantized with blocks along ``quantize_axis``; one thread
per output element.  int4/uint4 element types are not supported on the device (InvalidArgumentError).  The
indices are validated on the host: a device ``indices`` tensor is copied back through ``runtime.cuda.to_host``
(counted), then the normalized indices are uploaded as int64.  A device ``g_idx`` is read back the same way
for its range check.

Invariants (match ``ops/contrib_quant.py``): inputs are C-contiguous device arrays and are never written;
outputs are new device arrays of A's dtype (MatMulNBits) or the scales' dtype (GatherBlockQuantized);
float16 is computed in float32; shape/attribute errors are the CPU twin's.
"""
from __future__ import annotations

import math

import numpy as np

from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ops.contrib_quant import Mnb, bind_mnb, check_inputs, groups_of
from ops.gather_block_quantized import Gbq, bind_gbq, gbq_indices, gbq_layout
from ops.registry import op
from ._common import MAX_ROW_THREADS, check_device, flat, grid1d

__all__ = ["launch_mnb", "launch_gbq"]

_MS = "com.microsoft"
_CUDA = "CUDAExecutionProvider"
_ROWS = 8  # rows of A accumulated per pass over the packed weight
_SH = MAX_ROW_THREADS * _ROWS  # float32 shared scratch of the column reductions


# -- MatMulNBits -------------------------------------------------------------------------------------

@jit
def _mnb_kernel(a, b, sc, zp, zmode, grp, has_g, bias, has_bias, y, M, K, N, nb, blob, bits, bs, lanes, zrow):
    """y[m, n] for the block's columns and rows [blockIdx.y * _ROWS, +_ROWS).

    zmode: 0 none (default 2**(bits-1)), 1 packed uint8 (``zrow`` bytes per column), 2 float [N, nb]."""
    sh = cuda.shared.array(_SH, np.float32)
    acc = cuda.local.array(_ROWS, np.float32)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    cols = nt // lanes
    c = tid // lanes
    lane = tid - c * lanes
    n = cuda.blockIdx.x * cols + c
    m0 = cuda.blockIdx.y * _ROWS
    mr = min(_ROWS, M - m0)
    for r in range(_ROWS):
        acc[r] = np.float32(0.0)
    per = 8 // bits
    mask = (1 << bits) - 1
    zdef = np.float32(1 << (bits - 1))
    if n < N:
        nbytes = nb * blob
        rowb = n * nbytes
        for i in range(lane, nbytes, lanes):
            byte = np.int32(b[rowb + i])
            blk = i // blob
            k0 = blk * bs + (i - blk * blob) * per
            for u in range(per):
                k = k0 + u
                if k < K:
                    q = np.float32((byte >> (u * bits)) & mask)
                    g = blk
                    if has_g:
                        g = np.int64(grp[k])  # grp is a float dummy when has_g is False
                    s = np.float32(sc[n * nb + g])
                    z = zdef
                    if zmode == 1:
                        z = np.float32((np.int32(zp[n * zrow + g // per]) >> ((g % per) * bits)) & mask)
                    elif zmode == 2:
                        z = np.float32(zp[n * nb + g])
                    w = (q - z) * s
                    for r in range(mr):
                        acc[r] += w * np.float32(a[(m0 + r) * K + k])
    for r in range(_ROWS):
        sh[r * nt + tid] = acc[r]
    cuda.syncthreads()
    st = lanes // 2
    while st > 0:
        if lane < st:
            for r in range(_ROWS):
                sh[r * nt + tid] += sh[r * nt + tid + st]
        cuda.syncthreads()
        st //= 2
    if lane == 0 and n < N:
        bb = np.float32(bias[n]) if has_bias else np.float32(0.0)
        for r in range(mr):
            y[(m0 + r) * N + n] = sh[r * nt + tid] + bb


def _mnb_geometry(nbytes):
    """(threads per block, lanes per column): power-of-two lanes, 32 (a warp) on a GPU."""
    if rc.simulator():
        lanes = 1 << max(0, min(2, math.ceil(math.log2(max(nbytes, 1)))))
        return lanes * 2, lanes
    return 256, 32


def launch_mnb(m: Mnb, ctx=None):
    """The CUDA implementation of MatMulNBits, written once in ``ops/contrib_quant.py`` (its bind, its checks
    and messages): ``A @ dequant(B)^T (+ bias)`` in float32 accumulation; see the module docstring."""

    def run(A, B, scales, zero_points=None, g_idx=None, bias=None):
        name = "MatMulNBits"
        check_device(name, A=A, B=B, scales=scales, zero_points=zero_points, g_idx=g_idx, bias=bias)
        if np.dtype(A.dtype) not in (np.dtype(np.float32), np.dtype(np.float16)):
            raise InvalidArgumentError(f"{name}: A must be float32 or float16, got {A.dtype}")
        gi = None if g_idx is None else rc.to_host(g_idx)  # a small range check on the host (see docstring)
        zmode = check_inputs(m, A, B, scales, zero_points, gi, bias)
        grp = groups_of(m, gi)
        zrow = (m.nb * m.bits + 7) // 8 if zmode == 1 else 0
        zarr = flat(zero_points) if zmode else flat(scales)
        ashape = tuple(A.shape)
        M = int(np.prod(ashape[:-1], dtype=np.int64))
        y = rc.device_empty(ashape[:-1] + (m.N,), A.dtype)
        if M == 0 or m.N == 0:
            return y
        threads, lanes = _mnb_geometry(m.nb * m.blob)
        cols = threads // lanes
        grid = (-(-m.N // cols), -(-M // _ROWS))
        _mnb_kernel[grid, threads](flat(A), flat(B), flat(scales), zarr, zmode,
                                   flat(g_idx) if grp is not None else flat(scales), grp is not None,
                                   flat(bias) if bias is not None else flat(scales), bias is not None, flat(y),
                                   M, m.K, m.N, m.nb, m.blob, m.bits, m.bs, lanes, zrow)
        return y
    return run


op("MatMulNBits", 1, domain=_MS, provider=_CUDA, bind=bind_mnb)(launch_mnb)


# -- GatherBlockQuantized ----------------------------------------------------------------------------

@jit
def _gbq_kernel(data, idx, sc, zp, has_zp, y, total, post, nidx, gn, qn, inner_q, nbq, bs, bits, dlast, llast,
                slast, zlast):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    per = 8 // bits
    mask = (1 << bits) - 1
    zdef = np.float32(1 << (bits - 1))
    for o in range(start, total, step):
        pi = o % post
        rest = o // post
        ii = rest % nidx
        pre = rest // nidx
        L = (pre * gn + idx[ii]) * post + pi          # flat logical (unpacked) source index
        row = L // llast
        cl = L - row * llast
        q = np.float32((np.int32(data[row * dlast + cl // per]) >> ((cl % per) * bits)) & mask)
        iq = L % inner_q
        rq = L // inner_q
        tq = rq % qn
        oq = rq // qn
        si = (oq * nbq + tq // bs) * inner_q + iq
        z = zdef
        if has_zp:
            srow = si // slast
            scl = si - srow * slast
            z = np.float32((np.int32(zp[srow * zlast + scl // per]) >> ((scl % per) * bits)) & mask)
        y[o] = (q - z) * np.float32(sc[si])


def launch_gbq(g: Gbq, ctx=None):
    """The CUDA implementation of GatherBlockQuantized, written once in ``ops/contrib_quant.py`` (its bind and its
    checks): rows of a block-quantized uint8 table gathered and dequantized; indices validated on the host."""

    def run(data, indices, scales, zero_points=None):
        name = "GatherBlockQuantized"
        check_device(name, data=data, scales=scales, zero_points=zero_points)
        if np.dtype(data.dtype) != np.uint8:
            raise InvalidArgumentError(f"{name}: the CUDA kernel takes uint8 (packed) data, got {data.dtype}")
        if zero_points is not None and np.dtype(zero_points.dtype) != np.uint8:
            raise InvalidArgumentError(f"{name}: the CUDA kernel takes uint8 (packed) zero_points, got "
                                       f"{zero_points.dtype}")
        lay = gbq_layout(g, data, scales, zero_points)
        idx = gbq_indices(lay, rc.to_host(indices) if rc.is_device_array(indices) else indices)
        ga, qa, lshape = lay.ga, lay.qa, lay.lshape
        sshape = tuple(scales.shape)
        oshape = lshape[:ga] + tuple(idx.shape) + lshape[ga + 1:]
        y = rc.device_empty(oshape, scales.dtype)
        total = int(np.prod(oshape, dtype=np.int64))
        if total == 0:
            return y
        norm = idx.reshape(-1)
        blocks, threads = grid1d(total)
        _gbq_kernel[blocks, threads](flat(data), rc.to_device(norm), flat(scales),
                                     flat(zero_points) if zero_points is not None else flat(data),
                                     zero_points is not None, flat(y), total,
                                     int(np.prod(lshape[ga + 1:], dtype=np.int64)), norm.size, lshape[ga],
                                     lshape[qa], int(np.prod(lshape[qa + 1:], dtype=np.int64)), lay.nbq, g.bs,
                                     g.bits, int(data.shape[data.ndim - 1]), lshape[-1], sshape[-1],
                                     (sshape[-1] + lay.per - 1) // lay.per)
        return y
    return run


op("GatherBlockQuantized", 1, domain=_MS, provider=_CUDA, bind=bind_gbq)(launch_gbq)
