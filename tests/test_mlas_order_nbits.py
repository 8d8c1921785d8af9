"""Level-4 MatMulNBits in MLAS's AVX-512 order for every block size of its int8 kernels (16 to 256) and for 8-bit
codes (ops/contrib_quant.gemv_q4i8_mlas, ops/contrib_quant._MlasLanes): bit for bit a reference written from the
order in numpy, on every path (one row; two-row passes and an odd last row; several rows per pass; N not a multiple
of 4 or 8; K not a multiple of the block or of a kernel's step of blocks), the host's instructions equal to the
portable IR, and, on hosts where onnxruntime takes MLAS's AVX-512 kernels, bit for bit onnxruntime's MatMulNBits
(node by node and inside a compiled region).  Blocks of 32 with 4-bit codes are tests/test_mlas_order.py's.
The same for accuracy levels 0 to 3 (float A: ops/contrib_quant.gemv_fp_mlas), against onnxruntime on one
thread.  MLAS's AVX2 order (ops/contrib_quant._Avx2Lanes and the AVX2 one-row float kernel) against a reference
written out here too, the host's instructions against the portable IR; onnxruntime's own AVX2 bits are
tests/test_emulated_host.py's."""
import re

import numpy as np
import pytest
from numba import njit
from onnx import TensorProto as T, helper as h, numpy_helper as nh

from ops import _mlas_sgemm, _simd
from ops import contrib_quant as Q
from ops._common import mlas_order

F = np.float32
BLOCKS = (16, 32, 64, 128, 256)


def _fma(a, b, c):
    """f32(a * b + c) rounded once (the float64 product of two float32 values is exact; the sum rounds to
    float64 first, which changes the float32 result only on an exact tie, not met by these data)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F)


def _quantize(A, nb, bs):
    """QuantizeARow_CompInt8: per block scale max|a|/127, codes round-half-even(a * 127/max), zeros past K."""
    M, K = A.shape
    qa = np.zeros((M, nb * bs), np.int64)
    sa = np.zeros((M, nb), F)
    for m in range(M):
        for b in range(nb):
            x = A[m, bs * b:min(K, bs * b + bs)]
            mx = np.abs(x).max()
            sa[m, b] = mx / F(127)
            inv = F(127) / mx if mx != 0 else F(0)
            qa[m, bs * b:bs * b + x.size] = np.rint(x * inv)
    return qa, sa


def _window_lanes(quads, b, pattern):
    """16 lanes from the quad sums ``quads`` [N, blocks, quads] of the update starting at block ``b``: lane L adds
    the quads ``pattern[L] = (block offset, (quad, quad))``."""
    return np.stack([quads[:, b + o, x] + quads[:, b + o, y] for o, (x, y) in pattern], 1), \
        [b + o for o, _ in pattern]


# MLAS's AVX-512 lanes (sqnbitgemm_kernel_avx512_int8_blklen{16,32,64,128}.h): lane L of an update as (block
# offset, the two quads, of 4 codes each, of that block it adds)
_B16 = [lane for i in range(4) for lane in ((i, (0, 2)), (i, (1, 3)), (i + 4, (0, 2)), (i + 4, (1, 3)))]
_B32 = [(w // 8, (w % 8, w % 8 + 2)) for i in range(4) for w in (4 * i, 4 * i + 1, 16 + 4 * i, 17 + 4 * i)]
_B64 = [lane for i in range(4) for lane in ((0, (4 * i, 4 * i + 2)), (1, (4 * i, 4 * i + 2)),
                                            (0, (4 * i + 1, 4 * i + 3)), (1, (4 * i + 1, 4 * i + 3)))]


def _fold8(x, N):
    """Eight lanes [N, 8] into a column each: ``((l0+l1)+l2)+l3 + (((l4+l5)+l6)+l7)`` below N rounded down to 4,
    ``((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`` past it."""
    x = x.T
    c4 = ((((x[0] + x[1]) + x[2]) + x[3]) + (((x[4] + x[5]) + x[6]) + x[7])).astype(F)
    tail = (((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7]))).astype(F)
    return np.where(np.arange(N) < N - N % 4, c4, tail).astype(F)


def _fold16(x, N, c4_fold):
    """16 lanes [N, 16]: the halving tree past N rounded down to 4 (and below it unless ``c4_fold``), else
    ``(v0+v2) + (v1+v3)`` of the 4-lane chains ``v_j = ((l[4j]+l[4j+1])+l[4j+2])+l[4j+3]``."""
    x = x.T.astype(F)
    hh = [(x[i] + x[i + 8]).astype(F) for i in range(8)]
    q = [(hh[i] + hh[i + 4]).astype(F) for i in range(4)]
    tail = ((q[0] + q[2]).astype(F) + (q[1] + q[3]).astype(F)).astype(F)
    v = [((((x[4 * j] + x[4 * j + 1]).astype(F) + x[4 * j + 2]).astype(F) + x[4 * j + 3]).astype(F)) for j in range(4)]
    c4 = ((v[0] + v[2]).astype(F) + (v[1] + v[3]).astype(F)).astype(F) if c4_fold else tail
    return np.where(np.arange(N) < N - N % 4, c4, tail).astype(F)


def reference(A, codes, scales, zps, bias, bits, bs):
    """MLAS's AVX-512 order, written out: ``codes`` [N, nb*bs] unsigned, ``scales`` [N, nb], ``zps`` [N, nb] or
    None (the default 2**(bits-1)).  Per row and column 16 lanes updated by fused multiply-adds of exact integer
    lane sums times ``f32(ascale * scale)``; blocks of 16 and 32 then halve into 8 lanes and take their last blocks
    one at a time; the fold, the bias, then the zero points' share as a chain of fused multiply-adds over the
    blocks, added last."""
    M, K = A.shape
    N, nb = scales.shape
    qa, sa = _quantize(A, nb, bs)
    z = np.full((N, nb), 1 << (bits - 1)) if zps is None else zps
    out = np.zeros((M, N), F)
    for m in range(M):
        prod = codes * qa[m]  # exact
        quads = prod.reshape(N, nb, bs // 4, 4).sum(-1)
        s = (sa[m] * scales).astype(F)
        acc = np.zeros((N, 16), F)
        one_row = m == M - 1 and M % 2 == 1  # MLAS's kernels take the rows in pairs, an odd last one alone
        if bs in (16, 32):
            per, pattern = (8, _B16) if bs == 16 else (4, _B32)
            b = 0
            while nb - b >= per:
                lanes, blks = _window_lanes(quads, b, pattern)
                acc = _fma(lanes.astype(F), s[:, blks], acc)
                b += per
            x8 = (acc[:, :8] + acc[:, 8:]).astype(F)
            for b in range(b, nb):
                p = prod[:, bs * b:bs * b + bs]
                lanes = p.reshape(N, 8, 2).sum(-1) if bs == 16 else p.reshape(N, 8, 4).sum(-1)
                x8 = _fma(lanes.astype(F), s[:, b:b + 1], x8)
            y = _fold8(x8, N)
        else:
            if bs == 64:
                b = 0
                while nb - b >= 2:
                    lanes, blks = _window_lanes(quads, b, _B64)
                    acc = _fma(lanes.astype(F), s[:, blks], acc)
                    b += 2
                if b < nb:
                    acc = _fma(quads[:, b].astype(F), s[:, b:b + 1], acc)
            else:
                for b in range(nb):
                    for u in range(bs // 128):
                        q = quads[:, b, 32 * u:32 * u + 32]
                        acc = _fma((q[:, :16] + q[:, 16:]).astype(F), s[:, b:b + 1], acc)
            y = _fold16(acc, N, one_row or (bits == 8 and bs == 64))
        if bias is not None:
            y = (y + bias).astype(F)
        out[m] = _plus_zero_share(y, sa[m], qa[m], scales, z)
    return out


def _plus_zero_share(y, sa, qa, scales, z):
    """``y`` plus the zero points' share of unsigned codes: per block ``f32(scale_a * sum(qa))`` times
    ``f32(-scale_b * zero)``, chained by fused multiply-adds over the blocks, then added to ``y``."""
    nb = scales.shape[1]
    absum = (sa * qa.reshape(nb, -1).sum(-1).astype(F)).astype(F)
    bz = (-(scales * z.astype(F))).astype(F)
    chain = np.zeros(y.shape[0], F)
    for b in range(nb):
        chain = _fma(absum[b], bz[:, b], chain)
    return (chain + y).astype(F)


# MLAS's AVX2 lanes (sqnbitgemm_kernel_avx2_int8_blklen{16,32,64}.h): lane L of an update as (block offset, the two
# quads of that block it adds).  The ``vpmaddubsw`` + ``vphaddw`` interleave of 64 codes takes their 8-code groups
# in the order 0, 1, 4, 5, 2, 3, 6, 7 (4-bit codes, blocks of 16: the blocks 0, 2, 1, 3 in pairs of lanes); 8-bit
# codes in blocks of 64 and more add quads i and i + 8; in blocks of 32, ``vphaddd`` pairs two blocks' quads.
_A16 = [(g // 2, (2 * (g % 2), 2 * (g % 2) + 1)) for g in (0, 1, 4, 5, 2, 3, 6, 7)]
_A32 = [(0, (0, 1)), (0, (2, 3)), (1, (0, 1)), (1, (2, 3)), (0, (4, 5)), (0, (6, 7)), (1, (4, 5)), (1, (6, 7))]
_A64 = {4: [(0, (2 * g, 2 * g + 1)) for g in (0, 1, 4, 5, 2, 3, 6, 7)], 8: [(0, (i, i + 8)) for i in range(8)]}


def reference_avx2(A, codes, scales, zps, bias, bits, bs, threads=1):
    """MLAS's AVX2 order (no VNNI needed: the integers are exact either way), written out: per row and column 8
    lanes updated by fused multiply-adds of exact integer lane sums times ``f32(ascale * scale)``, the fold of
    ``_fold8``, the bias, then for unsigned codes the zero points' share as in ``reference``.  A row alone in its
    range of onnxruntime on ``threads`` intra-op threads (M = 1; with more than one, ranges of 128 rows, so also
    the last of M = 1 mod 128) of 4-bit codes in blocks of 64 and more takes MLAS's one-row kernel: codes minus
    zero points, no share."""
    M, K = A.shape
    N, nb = scales.shape
    qa, sa = _quantize(A, nb, bs)
    z = np.full((N, nb), 1 << (bits - 1)) if zps is None else zps
    out = np.zeros((M, N), F)
    lone = M == 1 or (threads > 1 and M % 128 == 1)
    for m in range(M):
        signed = lone and m == M - 1 and bits == 4 and bs >= 64
        prod = (codes - (np.repeat(z, bs, 1) if signed else 0)) * qa[m]  # exact
        quads = prod.reshape(N, nb, bs // 4, 4).sum(-1)
        s = (sa[m] * scales).astype(F)
        acc = np.zeros((N, 8), F)
        if bs <= 32:
            per, plan = (4, _A16) if bs == 16 else (2, _A32)
            b = 0
            while nb - b >= per:
                lanes = np.stack([quads[:, b + o, x] + quads[:, b + o, y] for o, (x, y) in plan], 1)
                acc = _fma(lanes.astype(F), s[:, [b + o for o, _ in plan]], acc)
                b += per
            for b in range(b, nb):  # lane i: codes 2i, 2i + 1 (blocks of 16), the quad i (32)
                lanes = prod[:, bs * b:bs * b + bs].reshape(N, 8, bs // 8).sum(-1)
                acc = _fma(lanes.astype(F), s[:, b:b + 1], acc)
        else:
            for b in range(nb):
                for u in range(bs // 64):
                    q = quads[:, b, 16 * u:16 * u + 16]
                    lanes = np.stack([q[:, x] + q[:, y] for _, (x, y) in _A64[bits]], 1)
                    acc = _fma(lanes.astype(F), s[:, b:b + 1], acc)
        y = _fold8(acc, N)
        if bias is not None:
            y = (y + bias).astype(F)
        out[m] = y if signed else _plus_zero_share(y, sa[m], qa[m], scales, z)
    return out


def _case(bits, bs, K, N, M, zp, seed):
    rng = np.random.default_rng(seed)
    nb = (K + bs - 1) // bs
    blob = rng.integers(0, 256, (N, nb, bs * bits // 8)).astype(np.uint8)
    sc = (rng.random((N, nb)) * 0.02 + 1e-3).astype(F)
    z = rng.integers(0, 1 << bits, (N, nb)) if zp else None
    A = rng.standard_normal((M, K)).astype(F)
    A[0, :3] = 0.0
    if M > 1 and K > bs:
        A[1, :bs] = 0.0  # an all-zero block
    if bits == 4:
        codes = np.stack([blob & 15, blob >> 4], -1).reshape(N, nb * bs).astype(np.int64)
    else:
        codes = blob.reshape(N, nb * bs).astype(np.int64)
    return A, blob, sc, z, codes


def _layout(bits, blob, sc, z):
    zf = z.astype(F) if z is not None else np.zeros((1, 1), F)
    return (Q.int4_layout if bits == 4 else Q.int8_layout)(blob, sc, zf, z is not None)


# (K, N, M): K past a multiple of the block and of each kernel's step of blocks (8 blocks of 16, 4 of 32, 2 of 64),
# N not a multiple of 4 or 8, one row, a row pair with an odd one, several rows per pass with an odd one.
SHAPES = {16: (150, 13, 1), 32: (200, 21, 3), 64: (170, 14, 5), 128: (300, 11, 3), 256: (300, 6, 2)}
CASES = [(bits, bs) for bits in (4, 8) for bs in BLOCKS if (bits, bs) != (4, 32)]


@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("bits,bs", CASES)
def test_equal_to_the_order_written_out(bits, bs, zp):
    K, N, M = SHAPES[bs]
    A, blob, sc, z, codes = _case(bits, bs, K, N, M, zp, seed=bits * 1000 + bs + zp)
    bias = np.linspace(-1, 1, N).astype(F) if zp else None
    want = reference(A, codes, sc, z, bias, bits, bs)
    qi, sct, zft = _layout(bits, blob, sc, z)
    zdef = F(1 << (bits - 1))
    for parallel in (False, True):
        got = np.empty((M, N), F)
        Q.gemv_q4i8_mlas(A, qi, sct, zft, z is not None, zdef, bs, got, parallel,
                         bias if bias is not None else np.zeros(1, F), bias is not None, Q.ORDER_AVX512, 2)
        np.testing.assert_array_equal(got, want)


AVX2_CASES = [(bits, bs) for bits in (4, 8) for bs in BLOCKS if (bits, bs) != (4, 32)]


@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("bits,bs", AVX2_CASES)
def test_avx2_equal_to_the_order_written_out(bits, bs, zp):
    """``ORDER_AVX2`` (``_Avx2Lanes``) against ``reference_avx2``, on SHAPES' rows, on one row, and on 129 rows
    for onnxruntime on one thread and on several (a last range of one row)."""
    K, N, M = SHAPES[bs]
    for rows in sorted({M, 1, 129}):
        A, blob, sc, z, codes = _case(bits, bs, K, N, rows, zp, seed=bits * 1000 + bs + zp + rows)
        bias = np.linspace(-1, 1, N).astype(F) if zp else None
        qi, sct, zft = _layout(bits, blob, sc, z)
        for threads in ((1, 2) if rows == 129 else (2,)):
            want = reference_avx2(A, codes, sc, z, bias, bits, bs, threads)
            for parallel in (False, True):
                got = np.empty((rows, N), F)
                Q.gemv_q4i8_mlas(A, qi, sct, zft, z is not None, F(1 << (bits - 1)), bs, got, parallel,
                                 bias if bias is not None else np.zeros(1, F), bias is not None, Q.ORDER_AVX2,
                                 threads)
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bits,bs", [(4, 16), (4, 64), (8, 16), (8, 32), (8, 128)])
def test_avx2_host_instructions_equal_the_portable_ir(bits, bs):
    """The ``_Avx2Lanes`` kernels in the host's instructions (``vpmaddubsw``, or ``vpdpbusd`` where the host has
    VNNI) and in the portable IR: the same bits, unsigned over ``ORT_ROWS`` rows and signed over one."""
    K, N, _ = SHAPES[bs]
    R = _simd.ORT_ROWS
    fam = min(bs, 64)
    A, blob, sc, z, _ = _case(bits, bs, K, N, R, True, seed=bs + bits + 7)
    qi, sct, zft = _layout(bits, blob, sc, z)
    G, nb = qi.shape[0], sct.shape[1]
    aq = np.empty((R, nb * bs), np.int8)
    ascale = np.empty((R, nb), F)
    gsum = np.empty((R, nb * bs // 4), F)
    absum = np.empty((R, nb), F)
    for r in range(R):
        Q._prep_a_i8_groups(A[r], bs, aq[r], ascale[r], gsum[r], absum[r])
    kinds = [(R, False, False)] + ([(1, True, False), (1, True, True)] if bits == 4 and bs >= 64 else [])
    for rows, signed, has_zp in kinds:
        ys = []
        for portable in (False, True):
            kernel = Q.make_avx2_lanes(bits, fam, rows, signed, has_zp, portable)
            zero = zft if has_zp else F(8.0)
            y = np.empty((R, 8 * G), F)

            @njit
            def run(qi, aq, ascale, gsum, zero, sct, y, n4):
                kernel(qi, aq, ascale, gsum, zero, sct, y, 0, qi.shape[0], n4)
            if rows == 1:
                run(qi, aq[0], ascale[0], gsum[0], zero, sct, y[0], N - N % 4)
                y = y[:1]
            else:
                run(qi, aq, ascale, gsum, zero, sct, y, N - N % 4)
            ys.append(y)
        np.testing.assert_array_equal(ys[0], ys[1])


def test_the_orders_differ():
    """The folds tell the row kinds apart: MLAS's one-row and two-row kernels give different bits here."""
    A, blob, sc, z, codes = _case(4, 64, 512, 12, 2, False, seed=3)
    two = reference(A, codes, sc, None, None, 4, 64)
    one = np.concatenate([reference(A[m:m + 1], codes, sc, None, None, 4, 64) for m in range(2)])
    assert not np.array_equal(one, two)


def _wrapped(bits, fam, portable):
    """A jitted call of the ``ORT_ROWS``-row ``_MlasLanes`` kernel (the host's or the portable one) over every
    column group."""
    kernel = Q.make_mlas_lanes(bits, fam, _simd.ORT_ROWS, portable)

    @njit
    def run(qi, aq, ascale, sct, y, n4, c4):
        kernel(qi, aq, ascale, ascale, np.float32(0.0), sct, y, 0, qi.shape[0], n4, c4)
    return run


@pytest.mark.parametrize("bits,bs", CASES)
def test_host_instructions_equal_the_portable_ir(bits, bs):
    K, N, _ = SHAPES[bs]
    R = _simd.ORT_ROWS
    A, blob, sc, z, _ = _case(bits, bs, K, N, R, False, seed=bs + bits)
    qi, sct, _ = _layout(bits, blob, sc, None)
    nb = sct.shape[1]
    aq = np.empty((R, nb * bs), np.int8)
    ascale = np.empty((R, nb), F)
    asum = np.empty(nb, F)
    for r in range(R):
        Q._prep_a_i8(A[r], bs, aq[r], ascale[r], asum)
    G = qi.shape[0]
    forms = [_wrapped(bits, min(bs, 128), portable) for portable in (False, True)]
    for c4 in (0, 1):
        ys = [np.empty((R, 8 * G), F) for _ in forms]
        for form, y in zip(forms, ys):
            form(qi, aq, ascale, sct, y, N - N % 4, c4)
        np.testing.assert_array_equal(ys[0], ys[1])


def test_mlas_path(monkeypatch):
    """The setting off: the blockwise order everywhere; on: MLAS's for the block sizes of its int8 kernels; unset:
    on exactly on x86 hosts with AVX2."""
    monkeypatch.delenv("ONNX_NUMBA_MLAS_ORDER", raising=False)
    assert mlas_order() == _simd.AVX2
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "0")
    assert all(Q.mlas_path(bs, bits) == 0 for bs in BLOCKS for bits in (4, 8))
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    assert Q.mlas_path(512, 4) == 0 and Q.mlas_path(64, 2) == 0
    if Q.mlas_avx512_host():
        assert all(Q.mlas_path(bs, bits) == Q.ORDER_AVX512 for bs in BLOCKS for bits in (4, 8))
    # as on an AVX2 host without AVX-512: MLAS's AVX2 order for every product of its int8 and float kernels
    monkeypatch.setattr(Q, "mlas_avx512_host", lambda: False)
    monkeypatch.setattr(Q, "mlas_avx2_host", lambda: True)
    assert all(Q.mlas_path(bs, bits, level4) == Q.ORDER_AVX2 for bs in BLOCKS for bits in (4, 8)
               for level4 in (False, True))
    assert Q.mlas_path(512, 4) == 0 and Q.mlas_path(512, 4, False) == Q.ORDER_AVX2


def _model(bits, bs, K, N, blob, sc, z, bias, level=4):
    nb = blob.shape[1]
    inits = [nh.from_array(blob, "B"), nh.from_array(sc.reshape(-1), "S")]
    ins = ["A", "B", "S"]
    if z is not None:
        if bits == 4:
            zz = np.zeros((N, (nb + 1) // 2 * 2), np.uint8)
            zz[:, :nb] = z
            zb = (zz[:, 0::2] | (zz[:, 1::2] << 4)).astype(np.uint8)
        else:
            zb = z.astype(np.uint8)
        inits.append(nh.from_array(zb.reshape(-1), "Z"))
        ins.append("Z")
    if bias is not None:
        ins += [""] * (5 - len(ins)) + ["bias"]
        inits.append(nh.from_array(bias, "bias"))
    node = h.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=K, N=N, bits=bits, block_size=bs,
                       accuracy_level=level)
    g = h.make_graph([node], "g", [h.make_tensor_value_info("A", T.FLOAT, ["M", K])],
                     [h.make_tensor_value_info("Y", T.FLOAT, ["M", N])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])


def _ort(model, A, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"A": A})[0]


_AVX512_ONLY = pytest.mark.skipif(not Q.mlas_avx512_host(), reason="onnxruntime takes MLAS's AVX-512 int8 kernels "
                                  "only on x86 hosts with AVX-512 (the reference comparisons above run everywhere)")


@_AVX512_ONLY
@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("bits,bs", [(bits, bs) for bits in (4, 8) for bs in BLOCKS])
def test_bit_for_bit_onnxruntime(bits, bs, M, monkeypatch):
    """Random shapes (K not a multiple of the block, N not of 16), zero points or not, a bias or not; onnxruntime
    on one thread and on its default pool (its result does not depend on the threads here)."""
    import runtime as rt
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    rng = np.random.default_rng(bits * 7919 + bs * 31 + M)
    for trial in range(2):
        nb = int(rng.integers(1, 2048 // bs + 2))
        K = (nb - 1) * bs + int(rng.integers(1, bs))
        N = int(rng.integers(1, 40)) + 16 * int(rng.integers(0, 3))
        zp, with_bias = trial == 1, (M + trial) % 2 == 1
        A, blob, sc, z, _ = _case(bits, bs, K, N, M, zp, seed=int(rng.integers(1 << 30)))
        bias = rng.standard_normal(N).astype(F) if with_bias else None
        model = _model(bits, bs, K, N, blob, sc, z, bias).SerializeToString()
        want = _ort(model, A, 1)
        np.testing.assert_array_equal(_ort(model, A, 0), want)
        got = rt.InferenceSession(model).run(None, {"A": A})[0]
        np.testing.assert_array_equal(got, want)


@_AVX512_ONLY
@pytest.mark.parametrize("bs", [16, 64, 256])
def test_compiled_region_bit_for_bit_onnxruntime(bs, monkeypatch):
    """4-bit products inside a compiled region (the decoders' path) follow the setting as the node wrapper does."""
    import runtime as rt
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    K, N, M = 3 * bs - 5, 19, 5
    A, blob, sc, z, _ = _case(4, bs, K, N, M, True, seed=bs)
    m = _model(4, bs, K, N, blob, sc, z, None)
    m.graph.node[0].output[0] = "p"
    m.graph.node.append(h.make_node("Relu", ["p"], ["Y"]))
    m.graph.value_info.append(h.make_tensor_value_info("p", T.FLOAT, [None, None]))  # contrib ops infer no shapes
    model = m.SerializeToString()
    want = _ort(model, A, 1)
    so = rt.SessionOptions()
    so.compiled_regions = True
    sess = rt.InferenceSession(model, so)
    assert sum(len(r.nodes) for r in sess.plan.regions) == 2
    twins = {m for r in sess.plan.regions for m in re.findall(r"\b(gemv_q4i8_t\w*?)__ops", r.source)}
    assert twins == {"gemv_q4i8_t_mlas"}  # the general twin: other block sizes
    np.testing.assert_array_equal(sess.run(None, {"A": A})[0], want)


@_AVX512_ONLY
@pytest.mark.parametrize("bits,level", [(8, 4), (4, 0), (8, 0)])
def test_products_the_region_does_not_reproduce_run_in_the_wrapper(bits, level, monkeypatch):
    """In a compiled region, MLAS's order of 8-bit codes at level 4 and of levels 0 to 3 is the node wrapper's:
    the region form declines the node (only with the setting on), and the result is onnxruntime's bit for bit."""
    import runtime as rt
    bs, K, N, M = 32, 3 * 32 - 5, 19, 5
    A, blob, sc, z, _ = _case(bits, bs, K, N, M, True, seed=bits + level)
    m = _model(bits, bs, K, N, blob, sc, z, None, level=level)
    m.graph.node[0].output[0] = "p"
    m.graph.node.append(h.make_node("Relu", ["p"], ["Y"]))
    m.graph.value_info.append(h.make_tensor_value_info("p", T.FLOAT, [None, None]))
    model = m.SerializeToString()
    so = rt.SessionOptions()
    so.compiled_regions = True
    assert sum(len(r.nodes) for r in rt.InferenceSession(model, so).plan.regions) == 2  # setting off: in the region
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    sess = rt.InferenceSession(model, so)
    assert sum(len(r.nodes) for r in sess.plan.regions) <= 1
    np.testing.assert_array_equal(sess.run(None, {"A": A})[0], _ort(model, A, 1))


# -- accuracy levels 0 to 3: A float, B dequantized ----------------------------------------------------------------

def _fp_ranges(M, N, K, compfp32, threads):
    """onnxruntime's ranges on ``threads`` intra-op threads, (m0, rows, n0, columns): MlasQNBitGemmBatch's
    (``compfp32``) ranges of 128 rows with a thread pool, one range without; MlasGemmBatch's
    ``min(M*N*K / 65536 + 1, threads)`` parts, along N in blocks of 16 columns when N > M, else along M, the first
    ``total % parts`` one larger."""
    if compfp32:
        step = 128 if threads > 1 else M
        return [(m0, min(M, m0 + step) - m0, 0, N) for m0 in range(0, M, step)]
    parts = min(M * N * K // 65536 + 1, threads)

    def split(total, n):
        q, r = divmod(total, n)
        return [(i * q + min(i, r), q + (i < r)) for i in range(n)]
    if N > M:
        blocks = -(-N // 16)
        return [(0, M, 16 * b0, min(N - 16 * b0, 16 * cb)) for b0, cb in split(blocks, min(parts, blocks)) if cb]
    return [(m0, cm, 0, N) for m0, cm in split(M, min(parts, M)) if cm]


def reference_fp(A, codes, scales, zps, bias, bits, bs, avx2=False, threads=1):
    """onnxruntime's float path written out: ``w = f32((code - zero) * scale)``, then each of its ranges on
    ``threads`` threads (``_fp_ranges``) through ``_reference_fp_range``."""
    M, K = A.shape
    N, nb = scales.shape
    z = np.full((N, nb), 1 << (bits - 1)) if zps is None else zps
    w = ((codes - np.repeat(z, bs, 1)).astype(F) * np.repeat(scales, bs, 1)).astype(F)[:, :K]
    compfp32 = bits == 4 and bs in BLOCKS
    out = np.empty((M, N), F)
    for m0, cm, n0, cn in _fp_ranges(M, N, K, compfp32, threads):
        sk = K if compfp32 else _mlas_sgemm.k_stride(cn, K)  # the slicing rule is MLAS's
        out[m0:m0 + cm, n0:n0 + cn] = _reference_fp_range(A[m0:m0 + cm], w[n0:n0 + cn],
                                                          None if bias is None else bias[n0:n0 + cn], compfp32,
                                                          avx2, sk)
    return out


def _reference_fp_range(A, w, bias, compfp32, avx2, sk):
    """One range: one row through 16 lanes of fused
    multiply-adds (4-bit codes, MLAS's CompFp32 kernel; ``avx2``: its AVX2 one, 8 lanes folded as ``_fold8`` below
    N rounded down to 4 and ``((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7))`` past it) or 8 lanes of rounded products
    added (its SGEMM's AVX one-row kernel), each folded as MLAS folds them, then the bias (or +0); several rows as
    chains of fused multiply-adds over slices of ``sk`` along K, added in turn to C, which starts at the bias or at
    the first slice."""
    M, K = A.shape
    N = w.shape[0]
    n4 = N - N % 4
    if M == 1:
        L = 16 if compfp32 and not avx2 else 8
        Kp = -(-K // L) * L
        a = np.zeros(Kp, F)
        a[:K] = A[0]
        wp = np.zeros((N, Kp), F)
        wp[:, :K] = w
        x = np.zeros((N, L), F)
        for k0 in range(0, Kp, L):
            if compfp32:
                x = _fma(wp[:, k0:k0 + L], a[k0:k0 + L], x)
            else:
                x = (x + (wp[:, k0:k0 + L] * a[k0:k0 + L]).astype(F)).astype(F)
        if compfp32 and avx2:
            x = x.T
            y = _fold8(x.T, N)
            tail = (((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]))).astype(F)
            y[n4:] = tail[n4:]
        elif compfp32:
            y = _fold16(x, N, True)
        else:
            x = x.T
            y = _fold8(x.T, N)
            pair = (((x[0] + x[2]) + (x[4] + x[6])) + ((x[1] + x[3]) + (x[5] + x[7]))).astype(F)
            one = (((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]))).astype(F)
            if N % 4 >= 2:
                y[n4:n4 + 2] = pair[n4:n4 + 2]
            if N % 2:
                y[N - 1] = one[N - 1]
        return (y + (bias if bias is not None else F(0)))[None].astype(F)
    out = np.zeros((M, N), F)
    for k0 in range(0, K, sk):
        acc = np.zeros((M, N), F)
        for k in range(k0, min(K, k0 + sk)):
            acc = _fma(A[:, k:k + 1], w[:, k], acc)
        if k0 > 0:
            out = (out + acc).astype(F)
        else:
            out = (acc + bias).astype(F) if bias is not None else acc
    return out


FP_SHAPES = [(4, 64, 300, 21, 1), (4, 16, 70, 13, 3), (4, 256, 300, 6, 2), (8, 32, 900, 19, 1), (8, 128, 700, 37, 3),
             (8, 16, 300, 200, 2)]  # the last two: several slices of K (N < K, then N >= K)


@pytest.mark.parametrize("order", [Q.ORDER_AVX512, Q.ORDER_AVX2])
@pytest.mark.parametrize("bits,bs,K,N,M", FP_SHAPES)
def test_float_path_equal_to_the_order_written_out(bits, bs, K, N, M, order):
    for zp in (False, True):
        A, blob, sc, z, codes = _case(bits, bs, K, N, M, zp, seed=K + N + M + zp)
        bias = np.linspace(-1, 1, N).astype(F) if zp else None
        want = reference_fp(A, codes, sc, z, bias, bits, bs, order == Q.ORDER_AVX2)
        zf = z.astype(F) if zp else np.zeros((1, 1), F)
        ct, st, zt = Q.fp_layout(blob, bits, sc, zf, zp, F(1 << (bits - 1)))
        path = Q.fp_order_path(bits, bs, order)
        got = np.empty((M, N), F)
        Q.gemv_fp_mlas(A, ct, st, zt, bs, path, 1, bias if zp else np.zeros(1, F), zp, got)
        np.testing.assert_array_equal(got, want)


# Shapes where onnxruntime's result depends on its threads (bits, block, M, K, N): a last range of one row (4-bit
# codes), N split in two (the slices of K follow each part's width: 128 for 100 columns, 256 for 64), M split into
# two rows and one (the one row through the one-row kernel)
FP_THREAD_SHAPES = [(4, 64, 129, 300, 21), (4, 16, 257, 200, 24), (8, 32, 8, 3000, 100), (8, 16, 3, 20000, 3)]


@pytest.mark.parametrize("bits,bs,M,K,N", FP_THREAD_SHAPES)
def test_float_path_threads_equal_to_the_order_written_out(bits, bs, M, K, N):
    """The float path on one intra-op thread of onnxruntime and on two, against ``reference_fp`` for each; the two
    differ on every shape."""
    A, blob, sc, z, codes = _case(bits, bs, K, N, M, True, seed=K + N + M)
    ct, st, zt = Q.fp_layout(blob, bits, sc, z.astype(F), True, F(1 << (bits - 1)))
    path = Q.fp_order_path(bits, bs, Q.ORDER_AVX512)
    wants = []
    for threads in (1, 2):
        wants.append(reference_fp(A, codes, sc, z, None, bits, bs, False, threads))
        got = np.empty((M, N), F)
        Q.gemv_fp_mlas(A, ct, st, zt, bs, path, threads, np.zeros(1, F), False, got)
        np.testing.assert_array_equal(got, wants[-1])
    assert not np.array_equal(wants[0], wants[1])


@_AVX512_ONLY
@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("bits,bs", [(4, 16), (4, 64), (4, 256), (8, 16), (8, 64), (8, 256)])
def test_float_path_bit_for_bit_onnxruntime(bits, bs, M, monkeypatch):
    """Accuracy levels 0 to 3 (alike on this path), random shapes as above, against onnxruntime on its default
    threads (what the runtime follows: ``ort_threads``)."""
    import runtime as rt
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    rng = np.random.default_rng(bits * 131 + bs + M)
    for trial in range(2):
        nb = int(rng.integers(1, 1500 // bs + 2))
        K = (nb - 1) * bs + int(rng.integers(1, bs))
        N = int(rng.integers(1, 40)) + 16 * int(rng.integers(0, 3))
        zp = trial == 1
        A, blob, sc, z, _ = _case(bits, bs, K, N, M, zp, seed=int(rng.integers(1 << 30)))
        bias = rng.standard_normal(N).astype(F) if (M + trial) % 2 else None
        model = _model(bits, bs, K, N, blob, sc, z, bias, level=trial).SerializeToString()
        want = _ort(model, A, 0)
        np.testing.assert_array_equal(rt.InferenceSession(model).run(None, {"A": A})[0], want)


@_AVX512_ONLY
@pytest.mark.parametrize("bits,bs,M,K,N", FP_THREAD_SHAPES)
def test_float_path_threads_bit_for_bit_onnxruntime(bits, bs, M, K, N, monkeypatch):
    """The shapes whose result depends on onnxruntime's threads, against onnxruntime on one thread and on two
    (``ONNX_NUMBA_ORT_THREADS`` naming the same count), on any host."""
    import runtime as rt
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    A, blob, sc, z, _ = _case(bits, bs, K, N, M, True, seed=K + N + M)
    model = _model(bits, bs, K, N, blob, sc, z, None, level=0).SerializeToString()
    for threads in (1, 2):
        monkeypatch.setenv("ONNX_NUMBA_ORT_THREADS", str(threads))
        np.testing.assert_array_equal(rt.InferenceSession(model).run(None, {"A": A})[0], _ort(model, A, threads))


# -- float zero points and g_idx: onnxruntime dequantizes B, then its SGEMM ---------------------------------------

def _gidx_model(K, N, bs, M, zp, gidx, bias, level, seed, region=False):
    """A 4-bit MatMulNBits with float (``zp`` "f") or packed (``"u8"``) zero points or none, a permuted g_idx or
    none, a bias or none; with ``region`` followed by a Relu, so that a compiled region can take it."""
    rng = np.random.default_rng(seed)
    nb = (K + bs - 1) // bs
    codes = rng.integers(0, 16, (N, nb, bs)).astype(np.uint8)
    inits = [nh.from_array((codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8), "B"),
             nh.from_array((rng.random(N * nb) * 0.1 + 0.01).astype(F), "S")]
    ins = ["A", "B", "S", "", "", ""]
    if zp == "f":
        inits.append(nh.from_array((rng.random(N * nb) * 15).astype(F), "Z"))
        ins[3] = "Z"
    elif zp == "u8":
        inits.append(nh.from_array(rng.integers(0, 256, N * ((nb + 1) // 2)).astype(np.uint8), "Z"))
        ins[3] = "Z"
    if gidx:
        inits.append(nh.from_array(rng.permutation(np.arange(K) // bs).astype(np.int32), "G"))
        ins[4] = "G"
    if bias:
        inits.append(nh.from_array(rng.standard_normal(N).astype(F), "C"))
        ins[5] = "C"
    while ins[-1] == "":
        ins.pop()
    nodes = [h.make_node("MatMulNBits", ins, ["p" if region else "Y"], domain="com.microsoft", K=K, N=N, bits=4,
                         block_size=bs, accuracy_level=level)]
    if region:
        nodes.append(h.make_node("Relu", ["p"], ["Y"]))
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("A", T.FLOAT, [None, K])],
                     [h.make_tensor_value_info("Y", T.FLOAT, [None, N])], inits)
    if region:
        g.value_info.append(h.make_tensor_value_info("p", T.FLOAT, [None, None]))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString(), rng.standard_normal((M, K)).astype(F)


@_AVX512_ONLY
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("zp,gidx", [("f", False), ("f", True), ("u8", True), (None, True)])
def test_float_zero_points_and_g_idx_bit_for_bit_onnxruntime(zp, gidx, level, monkeypatch):
    """onnxruntime keeps A float and dequantizes B first (``q * s + (-s * z)``, a packed zero point beside a g_idx
    read as 8), then runs its SGEMM: bit for bit, one row and several, with a bias and without, node by node and
    in a compiled region (which leaves the node to its wrapper)."""
    import runtime as rt
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    for i, (M, bias, bs, K) in enumerate([(1, True, 32, 200), (5, False, 16, 133), (3, True, 128, 300)]):
        model, A = _gidx_model(K, 72, bs, M, zp, gidx, bias, level, seed=i + 10 * level)
        np.testing.assert_array_equal(rt.InferenceSession(model).run(None, {"A": A})[0], _ort(model, A, 1))
    model, A = _gidx_model(200, 40, 32, 4, zp, gidx, True, level, seed=99, region=True)
    so = rt.SessionOptions()
    so.compiled_regions = True
    sess = rt.InferenceSession(model, so)
    assert sum(len(r.nodes) for r in sess.plan.regions) <= 1
    np.testing.assert_array_equal(sess.run(None, {"A": A})[0], _ort(model, A, 1))


@_AVX512_ONLY
@pytest.mark.parametrize("bits,level", [(4, 4), (8, 4), (4, 0), (8, 0)])
def test_float16_activations_bit_for_bit_onnxruntime(bits, level, monkeypatch):
    """float16 A, scales and bias: onnxruntime converts them to float32, runs the float32 product and rounds the
    result to float16; so does this runtime, bit for bit."""
    import runtime as rt
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    rng = np.random.default_rng(bits + level)
    K, N, bs = 200, 72, 32
    nb = (K + bs - 1) // bs
    for M, zp, bias in ((1, True, True), (3, False, False)):
        inits = [nh.from_array(rng.integers(0, 256, (N, nb, bs * bits // 8)).astype(np.uint8), "B"),
                 nh.from_array((rng.random(N * nb) * 0.05 + 0.01).astype(np.float16), "S")]
        ins = ["A", "B", "S", "", "", ""]
        if zp:
            inits.append(nh.from_array(rng.integers(0, 256, N * ((nb + 1) // 2 if bits == 4 else nb))
                                       .astype(np.uint8), "Z"))
            ins[3] = "Z"
        if bias:
            inits.append(nh.from_array(rng.standard_normal(N).astype(np.float16), "C"))
            ins[5] = "C"
        while ins[-1] == "":
            ins.pop()
        g = h.make_graph([h.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=K, N=N, bits=bits,
                                      block_size=bs, accuracy_level=level)], "g",
                         [h.make_tensor_value_info("A", T.FLOAT16, [None, K])],
                         [h.make_tensor_value_info("Y", T.FLOAT16, [None, N])], inits)
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
        m.ir_version = 10
        model = m.SerializeToString()
        A = rng.standard_normal((M, K)).astype(np.float16)
        got = rt.InferenceSession(model).run(None, {"A": A})[0]
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, _ort(model, A, 1))
