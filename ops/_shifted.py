"""Float32 convolutions of one group as register-tiled products over shifted rows of the input, with the bias
and an activation applied to each tile of the output while it is in cache.

For a 2-d convolution (1-d ones are 2-d with one row) the padded input of each channel is copied once into
stride-phase planes (``make_planes``: plane (pr, pc) holds the padded rows pr, pr + s1, ... and columns pc,
pc + s2, ..., ``RW`` wide).  Output pixel (oh, ow) at grid position ``j = oh * RW + ow`` then reads, for the
weight column ``k = (c, kh, kw)``, the plane element ``offs[k] + j``: one fixed offset per column.  So the
columns of im2col are never written: a tile of 64 grid positions is ``W (M, K) @ X_tile (K, 64)`` whose row k
is the contiguous stretch ``planes[offs[k] + j0 : offs[k] + j0 + 64]``.  The ``row_tile`` intrinsics keep R = 6,
4 or 1 output rows by 4 vectors of 16 positions in registers over the whole of K (chunks of ``KC`` columns for
deep inputs): one thread of a Zen 4 core ran 113-115 GFLOP/s at 64 to 516 rows and 256 to 1280 columns (its
peak is about 118), and 6 rows against 4 took 24 rows of 108 columns (a first YOLOX convolution) from 65 to 87.
Grid columns ``OW .. RW-1`` are computed from the padding and dropped.  A 1x1 convolution of stride 1 without
padding reads the input itself (``offs[k] = k * H * W``; its last, partial tile from a padded copy) and writes
whole tiles straight into the output.  Against im2col written to memory and multiplied (``ops/_panels.py``)
this reads each input element from cache instead of writing and reading nine copies of it: on 2 Zen 4 cores 3x3
convolutions of 12 to 512 channels ran 1.1 to 1.8 times faster.

A depthwise convolution (``depthwise2d``) is one row per channel: its planes, then its grid's tiles with the
channel's taps as the weight row.  ``ops/conv.py`` also multiplies outputs of a few pixels on these tiles, with
the roles turned: the pixels' columns are the rows and the vectors run over the output channels.

Every output sums ``w[m, k] * x`` over k in order from zero and then adds the bias, as im2col's product and the
bias pass did, so the bits are those of the panel path.  The activation is the unary op's own expression
(``_elementwise_kernels``), so a fused Conv and activation give the bits of the two nodes.

Invariants: the arrays are C-contiguous float32 (the intrinsic's typing refuses others); the driver checks
nothing (``ops/conv.py`` does); ``row_tile`` reads ``xf[offs[k] + j0 : + 64]`` for k in [k0, k1) and writes
``out[r0:r0+R, o0:o0+64]`` only, and the planes are laid out so that every read stays inside them.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from ._common import serial_twin
from ._fastmath import fsigmoid, fsigmoid_mlas, ftanh

__all__ = ["ACTIVATIONS", "NO_ADD", "TILE", "act_value", "activate", "add_activate", "conv2d", "depthwise2d", "finish",
           "finish_run", "make_planes", "product_tile", "row_tile"]

TILE = 64  # grid positions per tile: 4 vectors of 16
KC = 512  # weight columns per chunk of a tile's product
_R, _Q = 4, 4
_I32, _F32 = ir.IntType(32), ir.FloatType()
_V16F = ir.VectorType(_F32, 16)
_CONTRACT = ("contract",)
_OPTS = dict(cache=True, nogil=True, error_model="numpy")

# activation -> code; its parameters p0, p1 are those of the unary op (``ops/elementwise.py``)
# ("SiLU" is x * Sigmoid(x), Sigmoid then Mul; the "_mlas" codes take MLAS's logistic, as Sigmoid does under
# ``ONNX_NUMBA_MLAS_ORDER``)
# "HardSwishRelu6" is the form Paddle exports write, x * Clip(x + 3, 0, 6) / 6: its four float32 steps in order.
ACTIVATIONS = {"": 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "HardSigmoid": 4, "HardSwish": 5, "Sigmoid": 6,
               "Tanh": 7, "SiLU": 8, "Sigmoid_mlas": 9, "SiLU_mlas": 10, "HardSwishRelu6": 11, "Gelu": 12}
_THREE, _SIX, _ZERO = np.float32(3), np.float32(6), np.float32(0)
_HALF, _ONE, _RS2 = np.float32(0.5), np.float32(1.0), np.float32(1.0 / math.sqrt(2.0))
NO_ADD = np.float32(-0.0)  # the bias of none: x + -0.0 is x for every x, -0.0 included (x + 0.0 is not)


def _row_tile(R: int):
    """``row_tile(xf, offs, w, out, r0, j0, o0, k0, k1, first)``: for r < R and i < 64,
    ``out[r0 + r, o0 + i]`` set to (``first``) or increased by ``sum_{k0 <= k < k1} w[r0 + r, k] * xf[offs[k] +
    j0 + i]``, k in order, one fused multiply-add per term."""
    def impl(typingctx, xf, offs, w, out, r0, j0, o0, k0, k1, first):
        ok = (isinstance(xf, types.Array) and xf.dtype == types.float32 and xf.ndim == 1 and xf.layout == "C"
              and isinstance(offs, types.Array) and offs.dtype == types.int64 and offs.ndim == 1
              and offs.layout == "C"
              and all(isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 2 and a.layout == "C"
                      for a in (w, out)))
        if not ok:
            return None
        sig = types.void(xf, offs, w, out, types.intp, types.intp, types.intp, types.intp, types.intp,
                         types.boolean)

        def codegen(context, builder, sig, args):
            xa, fa, wa, oa = (context.make_array(sig.args[i])(context, builder, args[i]) for i in range(4))
            K = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            N = cgutils.unpack_tuple(builder, oa.shape, 2)[1]
            intp = K.type
            r0, j0, o0, k0, k1, first = args[4:]

            def c(v):
                return ir.Constant(intp, v)

            def vptr(p, off):
                return builder.bitcast(builder.gep(p, [off]), _V16F.as_pointer())

            acc = [[cgutils.alloca_once(builder, _V16F) for _ in range(_Q)] for _ in range(R)]
            wrow = [builder.mul(builder.add(r0, c(r)), K) for r in range(R)]
            dst = [[builder.add(builder.add(builder.mul(builder.add(r0, c(r)), N), o0), c(16 * q))
                    for q in range(_Q)] for r in range(R)]
            zero = ir.Constant(_V16F, [ir.Constant(_F32, 0.0)] * 16)
            with builder.if_else(first) as (then, other):
                with then:
                    for r in range(R):
                        for q in range(_Q):
                            builder.store(zero, acc[r][q])
                with other:
                    for r in range(R):
                        for q in range(_Q):
                            builder.store(builder.load(vptr(oa.data, dst[r][q]), align=4), acc[r][q])
            with cgutils.for_range_slice(builder, k0, k1, c(1), intp=intp) as (k, _):
                at = builder.add(builder.load(builder.gep(fa.data, [k])), j0)
                xv = [builder.load(vptr(xa.data, builder.add(at, c(16 * q))), align=4) for q in range(_Q)]
                for r in range(R):
                    s = builder.load(builder.gep(wa.data, [builder.add(wrow[r], k)]))
                    v = builder.insert_element(ir.Constant(_V16F, None), s, ir.Constant(_I32, 0))
                    v = builder.shuffle_vector(v, ir.Constant(_V16F, None),
                                               ir.Constant(ir.VectorType(_I32, 16), [0] * 16))
                    for q in range(_Q):
                        prod = builder.fmul(v, xv[q], flags=_CONTRACT)
                        builder.store(builder.fadd(builder.load(acc[r][q]), prod, flags=_CONTRACT), acc[r][q])
            for r in range(R):
                for q in range(_Q):
                    builder.store(builder.load(acc[r][q]), vptr(oa.data, dst[r][q]), align=4)
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = f"row_tile{R}"
    return intrinsic(impl)


row_tile = _row_tile(_R)
_row_tile6 = _row_tile(6)
_row_tile1 = _row_tile(1)


@njit(inline="always", **_OPTS)
def act_value(v, act, p0, p1):
    """The activation ``act`` (``ACTIVATIONS``) of ``v``, by the expression of its unary kernel."""
    if act == 0:
        return v
    if act == 1:
        return v if v > 0 or v != v else 0
    if act == 2:
        return v if v >= 0 else p0 * v
    if act == 3:  # Clip's kernel: NaN passes, and lo > hi gives hi
        c = p0 if v < p0 else v
        return p1 if c > p1 else c
    if act == 4:
        return (p0 * v + p1) if (p0 * v + p1) != (p0 * v + p1) else max(0, min(1, p0 * v + p1))
    if act == 5:
        return v * ((p0 * v + p1) if (p0 * v + p1) != (p0 * v + p1) else max(0, min(1, p0 * v + p1)))
    if act == 6:
        return fsigmoid(v)
    if act == 7:
        return ftanh(v)
    if act == 8:
        return v * fsigmoid(v)
    if act == 9:
        return fsigmoid_mlas(v)
    if act == 10:
        return v * fsigmoid_mlas(v)
    if act == 12:  # com.microsoft Gelu's float32 expression (ops/contrib_norm.py)
        return _HALF * v * (_ONE + math.erf(v * _RS2))
    t = v + _THREE  # Add, Clip, Mul, Div as their kernels compute them in float32
    t = _ZERO if t < _ZERO else t
    t = _SIX if t > _SIX else t
    return (v * t) / _SIX


@njit(**_OPTS)
def finish_run(src, s0, dst, d0, n, bv, act, p0, p1):
    """dst[d0 + i] = act(src[s0 + i] + bv) for i < n: two different flat arrays.  One loop per activation, each
    indexing with unsigned integers, so that each vectorizes (a test of ``act`` per element, or an index that may
    be negative, keeps a loop scalar: Sigmoid runs at 0.37 ns an element here) without making views of the runs.
    Called, not inlined: its twelve vectorized loops compiled into every caller took a first convolution's
    compile from 18 to 41 s."""
    s = np.uint64(s0)
    d = np.uint64(d0)
    m = np.uint64(n)
    if act == 0:
        for i in range(m):
            dst[d + i] = src[s + i] + bv
    elif act == 1:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 1, p0, p1)
    elif act == 2:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 2, p0, p1)
    elif act == 3:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 3, p0, p1)
    elif act == 4:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 4, p0, p1)
    elif act == 5:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 5, p0, p1)
    elif act == 6:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 6, p0, p1)
    elif act == 7:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 7, p0, p1)
    elif act == 8:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 8, p0, p1)
    elif act == 9:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 9, p0, p1)
    elif act == 10:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 10, p0, p1)
    elif act == 11:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 11, p0, p1)
    else:
        for i in range(m):
            dst[d + i] = act_value(src[s + i] + bv, 12, p0, p1)


@njit(**_OPTS)
def _finish_in_place(buf, o, n, bv, act, p0, p1):
    """buf[o + i] = act(buf[o + i] + bv) for i < n, unsigned indices into the one array (with the run passed as a
    source and a destination that may alias, the loops stayed scalar: Sigmoid 7 times slower)."""
    s = np.uint64(o)
    d = s
    m = np.uint64(n)
    if act == 0:
        for i in range(m):
            buf[d + i] = buf[s + i] + bv
    elif act == 1:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 1, p0, p1)
    elif act == 2:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 2, p0, p1)
    elif act == 3:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 3, p0, p1)
    elif act == 4:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 4, p0, p1)
    elif act == 5:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 5, p0, p1)
    elif act == 6:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 6, p0, p1)
    elif act == 7:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 7, p0, p1)
    elif act == 8:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 8, p0, p1)
    elif act == 9:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 9, p0, p1)
    elif act == 10:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 10, p0, p1)
    elif act == 11:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 11, p0, p1)
    else:
        for i in range(m):
            buf[d + i] = act_value(buf[s + i] + bv, 12, p0, p1)


_FINISH_PARALLEL_MIN = 1 << 14  # elements from which ``finish`` and ``activate`` spread over the threads


@njit(parallel=True, **_OPTS)
def _activate_par(x, out, act, p0, p1, nchunk):
    n = x.shape[0]
    for t in prange(nchunk):
        i0, i1 = t * n // nchunk, (t + 1) * n // nchunk
        finish_run(x, i0, out, i0, i1 - i0, NO_ADD, act, p0, p1)


@njit(**_OPTS)
def activate(x, out, act, p0, p1):
    """out = act(x) over flat float32 arrays (a fused activation that follows no convolution), over the threads
    from ``_FINISH_PARALLEL_MIN`` elements."""
    n = x.shape[0]
    if n >= _FINISH_PARALLEL_MIN:
        _activate_par(x, out, act, p0, p1, max(1, min(64, n // (_FINISH_PARALLEL_MIN // 2))))
    else:
        finish_run(x, 0, out, 0, n, NO_ADD, act, p0, p1)


@njit(**_OPTS)
def _add_act_run(y, z, i0, i1, act, p0, p1):
    """y[i] = act(y[i] + z[i]) for i0 <= i < i1: one loop per common activation (the test hoisted out of it, and
    unsigned indices, so that it vectorizes), the others through ``act_value``."""
    a = np.uint64(i0)
    m = np.uint64(i1 - i0)
    if act == 0:
        for i in range(m):
            y[a + i] = y[a + i] + z[a + i]
    elif act == 1:
        for i in range(m):
            y[a + i] = act_value(y[a + i] + z[a + i], 1, p0, p1)
    elif act == 3:
        for i in range(m):
            y[a + i] = act_value(y[a + i] + z[a + i], 3, p0, p1)
    else:
        for i in range(m):
            y[a + i] = act_value(y[a + i] + z[a + i], act, p0, p1)


@njit(parallel=True, **_OPTS)
def _add_act_par(y, z, act, p0, p1, nchunk):
    n = y.shape[0]
    for t in prange(nchunk):
        _add_act_run(y, z, t * n // nchunk, (t + 1) * n // nchunk, act, p0, p1)


@njit(**_OPTS)
def add_activate(y, z, act, p0, p1):
    """y = act(y + z) in place over flat float32 arrays of one length, in one pass (a convolution fused with the
    residual Add and the activation after it), the Add's then the activation's float32 steps; over the threads
    from ``_FINISH_PARALLEL_MIN`` elements."""
    n = y.shape[0]
    if n >= _FINISH_PARALLEL_MIN:
        _add_act_par(y, z, act, p0, p1, max(1, min(64, n // (_FINISH_PARALLEL_MIN // 2))))
    else:
        _add_act_run(y, z, 0, n, act, p0, p1)


@njit(parallel=True, **_OPTS)
def _finish_par(out, bias, act, p0, p1):
    N, M, L = out.shape
    nb = bias.shape[0] > 0
    of = out.reshape(-1)
    for nm in prange(N * M):
        bv = bias[nm % M] if nb else NO_ADD
        _finish_in_place(of, nm * L, L, bv, act, p0, p1)


_finish_serial = serial_twin(_finish_par)


@njit(**_OPTS)
def finish(out, bias, act, p0, p1):
    """out (N, M, L) = act(out + bias[m]) in place; ``bias`` empty for none.  The epilogue of the convolutions
    that do not take it per tile: over the threads from ``_FINISH_PARALLEL_MIN`` elements, in this thread below
    (a voice-activity model's convolutions of a few hundred outputs paid a thread-pool launch each)."""
    if out.size >= _FINISH_PARALLEL_MIN:
        _finish_par(out, bias, act, p0, p1)
    else:
        _finish_serial(out, bias, act, p0, p1)


@njit(**_OPTS)
def _channel_planes(xf, xb, H, W, planes, base, used, s1, s2, pt, pl, RH, RW, PS):
    """The stride-phase planes of the H x W input plane at ``xf[xb:]``, written from ``planes[base]`` on (see
    ``make_planes``).  Unsigned indices: with signed ones Numba's negative-index wraparound kept the copy loops
    scalar (a 64-channel 56 x 56 input took 184 us to copy, 13 us unsigned)."""
    for pr in range(s1):
        for pc in range(s2):
            if not used[pr * s2 + pc]:
                continue
            pb = base + (pr * s2 + pc) * PS
            # columns j whose input column j*s2 + pc - pl lies inside the image
            j_lo = min(max(0, (pl - pc + s2 - 1) // s2), RW)
            j_hi = max(j_lo, min(RW, (W - 1 + pl - pc) // s2 + 1)) if W - 1 + pl - pc >= 0 else j_lo
            for i in range(RH):
                ih = i * s1 + pr - pt
                rb = np.uint64(pb + i * RW)
                if ih < 0 or ih >= H:
                    for j in range(np.uint64(RW)):
                        planes[rb + j] = 0
                    continue
                src = xb + ih * W + pc - pl  # >= 0 from column j_lo on
                for j in range(np.uint64(j_lo)):
                    planes[rb + j] = 0
                if s2 == 1:
                    for j in range(j_lo, j_hi):
                        planes[np.uint64(pb + i * RW + j)] = xf[np.uint64(src + j)]
                else:
                    for j in range(j_lo, j_hi):
                        planes[np.uint64(pb + i * RW + j)] = xf[np.uint64(src + j * s2)]
                for j in range(np.uint64(j_hi), np.uint64(RW)):
                    planes[rb + j] = 0
            for j in range(np.uint64(pb + RH * RW), np.uint64(pb + PS)):
                planes[j] = 0


@njit(parallel=True, **_OPTS)
def make_planes(x, planes, used, s1, s2, pt, pl, RH, RW, PS):
    """The stride-phase planes of every channel of x (C, H, W): ``planes[((c*s1 + pr)*s2 + pc)*PS + i*RW + j]``
    is padded element (i*s1 + pr, j*s2 + pc), zero outside the image and past each plane's RH*RW elements.
    Phases whose ``used[pr*s2 + pc]`` is False (no tap reads them: a 1x1 of stride 2 reads one of four) are
    left unwritten."""
    C, H, W = x.shape
    xf = x.reshape(-1)
    for c in prange(C):
        _channel_planes(xf, c * H * W, H, W, planes, c * s1 * s2 * PS, used, s1, s2, pt, pl, RH, RW, PS)


@njit(**_OPTS)
def _grid(OH, OW, KH, KW, s1, s2, d1, d2):
    """(RH, RW, G, PS): a phase plane's rows and columns, the grid positions of the output (OH rows RW wide) and
    a plane's length, room for the furthest tap's stretch of the last tile included."""
    RH = ((OH - 1) * s1 + (KH - 1) * d1 + s1) // s1
    RW = ((OW - 1) * s2 + (KW - 1) * d2 + s2) // s2
    G = OH * RW
    maxshift = ((KH - 1) * d1 // s1) * RW + (KW - 1) * d2 // s2
    return RH, RW, G, max((G + TILE - 1) // TILE * TILE + maxshift, RH * RW)


@njit(**_OPTS)
def _taps(C, KH, KW, s1, s2, d1, d2, RW, PS, offs, used):
    """offs[k] for weight column k = (c, b, e): where its stretch starts in the planes of C channels; ``used``
    set for the phases some tap reads."""
    for b in range(KH):
        for e in range(KW):
            used[(b * d1 % s1) * s2 + e * d2 % s2] = True
    k = 0
    for c in range(C):
        for b in range(KH):
            for e in range(KW):
                r, q = b * d1, e * d2
                offs[k] = ((c * s1 + r % s1) * s2 + q % s2) * PS + (r // s1) * RW + q // s2
                k += 1


@njit(parallel=True, **_OPTS)
def depthwise2d(x, w, out, bias, act, p0, p1, KH, KW, s1, s2, pt, pl, d1, d2, nthreads):
    """out (N, C, OH, OW) = act(depthwise conv(x (N, C, H, W), w (C, KH*KW)) + bias) with one filter per
    channel; ``bias`` empty for none.  Each of up to ``nthreads`` tasks takes a run of channels; a channel's
    planes are made in the task's scratch and every tile of its grid is one row of ``row_tile`` over the taps
    (the sums in tap order from zero, one fused multiply-add per tap, then the bias), then each output row is
    finished from the grid."""
    N, C, H, W = x.shape
    OH, OW = out.shape[2], out.shape[3]
    K = KH * KW
    RH, RW, G, PS = _grid(OH, OW, KH, KW, s1, s2, d1, d2)
    GP = (G + TILE - 1) // TILE * TILE
    offs = np.empty(K, np.int64)
    used = np.zeros(s1 * s2, np.bool_)
    _taps(1, KH, KW, s1, s2, d1, d2, RW, PS, offs, used)
    NC = N * C
    T = max(1, min(nthreads, NC))
    xf = x.reshape(-1)
    of = out.reshape(-1)
    nb = bias.shape[0] > 0
    for t in prange(T):
        planes = np.empty(s1 * s2 * PS, np.float32)
        grid = np.empty((1, GP), np.float32)
        gf = grid.reshape(-1)
        for nc in range(t * NC // T, (t + 1) * NC // T):
            c = nc % C
            _channel_planes(xf, nc * H * W, H, W, planes, 0, used, s1, s2, pt, pl, RH, RW, PS)
            wr = w[c:c + 1]
            for j0 in range(0, G, TILE):
                _row_tile1(planes, offs, wr, grid, 0, j0, j0, 0, K, True)
            bv = bias[c] if nb else NO_ADD
            for oh in range(OH):
                finish_run(gf, oh * RW, of, (nc * OH + oh) * OW, OW, bv, act, p0, p1)


@njit(**_OPTS)
def product_tile(xf, offs, w, ot, r0, r1, j0, o0):
    """``ot[r0:r1, o0:o0+64]`` = ``w[r0:r1] @`` the tile at grid position j0, chunk by chunk of K."""
    K = w.shape[1]
    for k0 in range(0, K, KC):
        k1 = min(K, k0 + KC)
        r = r0
        while r + 6 <= r1:
            _row_tile6(xf, offs, w, ot, r, j0, o0, k0, k1, k0 == 0)
            r += 6
        while r + _R <= r1:
            row_tile(xf, offs, w, ot, r, j0, o0, k0, k1, k0 == 0)
            r += _R
        while r < r1:
            _row_tile1(xf, offs, w, ot, r, j0, o0, k0, k1, k0 == 0)
            r += 1


@njit(parallel=True, **_OPTS)
def _tiles(xf, offs, tail, tail_offs, w, out, bias, act, p0, p1, RW, OW, G, direct, nthreads):
    """Every tile of one image: ``out`` (M, OH*OW).  ``direct``: the grid is the output's layout (RW == OW), so
    whole tiles are written in place and only the last partial one, read from ``tail``, goes through a scratch."""
    M = w.shape[0]
    ntile = (G + TILE - 1) // TILE
    mb = 1  # row blocks per tile: enough tasks for the threads when the image has few tiles
    while ntile * mb < 2 * nthreads and M // (mb * 2) >= 16:
        mb *= 2
    RB = ((M + mb - 1) // mb + _R - 1) // _R * _R
    mb = (M + RB - 1) // RB
    ntask = ntile * mb
    NT = max(1, min(ntask, nthreads))
    nb = bias.shape[0] > 0
    L = out.shape[1]
    of = out.reshape(-1)
    for t in prange(NT):
        ot = np.empty((M, TILE), np.float32)
        otf = ot.reshape(-1)
        for task in range(t * ntask // NT, (t + 1) * ntask // NT):
            tile = task // mb
            r0 = (task - tile * mb) * RB
            r1 = min(M, r0 + RB)
            j0 = tile * TILE
            j1 = min(G, j0 + TILE)
            if direct and j1 - j0 == TILE:
                product_tile(xf, offs, w, out, r0, r1, j0, j0)
                for r in range(r0, r1):
                    _finish_in_place(of, r * L + j0, TILE, bias[r] if nb else NO_ADD, act, p0, p1)
                continue
            if direct:
                product_tile(tail, tail_offs, w, ot, r0, r1, 0, 0)
            else:
                product_tile(xf, offs, w, ot, r0, r1, j0, 0)
            oh = j0 // RW
            ow0 = j0 - oh * RW
            j = j0
            while j < j1:
                n = min(RW - ow0, j1 - j)
                hi = min(ow0 + n, OW)
                if hi > ow0:
                    for r in range(r0, r1):
                        finish_run(otf, r * TILE + j - j0, of, r * L + oh * OW + ow0, hi - ow0,
                                    bias[r] if nb else NO_ADD, act, p0, p1)
                j += n
                oh += 1
                ow0 = 0


@njit(**_OPTS)
def conv2d(x, w, out, bias, act, p0, p1, KH, KW, s1, s2, pt, pl, d1, d2, nthreads):
    """out (N, M, OH, OW) = act(conv(x (N, C, H, W), w (M, C*KH*KW)) + bias) for one group; ``bias`` empty for
    none.  Padding ``pt`` rows above and ``pl`` columns left (the far sides follow from the output's size)."""
    N, C, H, W = x.shape
    M, K = w.shape
    OH, OW = out.shape[2], out.shape[3]
    RH, RW, G, PS = _grid(OH, OW, KH, KW, s1, s2, d1, d2)
    direct = KH == 1 and KW == 1 and s1 == 1 and s2 == 1 and pt == 0 and pl == 0 and H == OH and W == OW
    offs = np.empty(K, np.int64)
    if direct:
        PS = H * W
        tail = np.zeros(C * TILE, np.float32)
        tail_offs = np.arange(C).astype(np.int64) * TILE
        planes = tail[:0]
        used = np.zeros(0, np.bool_)
        for k in range(K):
            offs[k] = k * PS
    else:
        planes = np.empty(C * s1 * s2 * PS, np.float32)
        tail = planes[:0]
        tail_offs = offs[:0]
        used = np.zeros(s1 * s2, np.bool_)
        _taps(C, KH, KW, s1, s2, d1, d2, RW, PS, offs, used)
    for n in range(N):
        o2 = out[n].reshape((M, OH * OW))
        if direct:
            xf = x[n].reshape(-1)
            j0 = (G // TILE) * TILE
            if j0 < G:
                for c in range(C):
                    tail[c * TILE:c * TILE + G - j0] = xf[c * PS + j0:c * PS + G]
            _tiles(xf, offs, tail, tail_offs, w, o2, bias, act, p0, p1, RW, OW, G, True, nthreads)
        else:
            make_planes(x[n], planes, used, s1, s2, pt, pl, RH, RW, PS)
            _tiles(planes, offs, tail, tail_offs, w, o2, bias, act, p0, p1, RW, OW, G, False, nthreads)

