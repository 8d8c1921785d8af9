"""Level-4 int4 products in MLAS's orders (ops/contrib_quant.gemv_q4i8_mlas, ops/_simd._OrtEmitter), its AVX2 one
and its AVX-512 one: bit for bit a reference written from each order in numpy, on every path (one row with signed
codes, with and without zero points; unsigned codes with the zero points' share added after; several rows per
pass; N not a multiple of 4; K not a multiple of the block or of 4 blocks), the host's instructions equal to the
portable IR, and, on hosts where onnxruntime takes the order, bit for bit onnxruntime's MatMulNBits."""
import re

import numpy as np
import pytest
from numba import njit
from onnx import TensorProto as T, helper as h, numpy_helper as nh

from ops import _simd
from ops import contrib_quant as Q

F = np.float32


def _fma(a, b, c):
    """f32(a * b + c) rounded once (the float64 product of two float32 values is exact; the sum rounds to
    float64 first, which changes the float32 result only on an exact tie, not met by these data)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F)


def reference(A, codes, scales, zps, bias, threads=2):
    """MLAS's AVX2 order, written out: ``codes`` [N, nb*32] 0..15, ``scales`` [N, nb], ``zps`` [N, nb] or None.
    onnxruntime on ``threads`` intra-op threads: with more than one, ranges of 128 rows, and a range of one row
    (M = 1 mod 128) takes the one-row kernel (signed codes); on one, only M = 1 does."""
    M, N, nb, qa, sa, z, out = _setup(A, scales, zps)
    for m in range(M):
        signed = m == M - 1 and (M == 1 or (threads > 1 and M % 128 == 1))
        c = codes - (np.repeat(z, 32, axis=1) if signed else 0)
        prod = c * qa[m]  # [N, nb*32], exact
        quads = prod.reshape(N, nb, 8, 4).sum(-1)  # lane sums of 4
        lanes = np.zeros((N, 8), F)
        s = (sa[m] * scales).astype(F)  # [N, nb]
        pairs = not (signed and zps is not None)
        b = 0
        while b < nb:
            if pairs and b + 1 < nb:
                e0 = quads[:, b].reshape(N, 4, 2).sum(-1)  # 8-sums of vectors j = 0..3
                e1 = quads[:, b + 1].reshape(N, 4, 2).sum(-1)
                vals = np.stack([e0[:, 0], e0[:, 1], e1[:, 0], e1[:, 1], e0[:, 2], e0[:, 3], e1[:, 2], e1[:, 3]], 1)
                sc = np.stack([s[:, b], s[:, b], s[:, b + 1], s[:, b + 1]] * 2, 1)
                lanes = _fma(vals.astype(F), sc, lanes)
                b += 2
            else:
                lanes = _fma(quads[:, b].astype(F), s[:, b:b + 1], lanes)
                b += 1
        out[m] = _finish(lanes.T, N, bias, sa[m], qa[m], scales, z, signed)
    return out


_QUAD_LANE = np.array([0, 0, 2, 2, 0, 0, 2, 2, 1, 1, 3, 3, 1, 1, 3, 3])  # the block (of 4) of each of 16 lanes


def reference512(A, codes, scales, zps, bias):
    """MLAS's AVX-512 order, written out from its kernels' vector operations: per 4 blocks (128 products) two
    ``vpdpbusd`` of 64 bytes (lanes of 4 products), their 64-bit halves interleaved and added into 16 lanes, each
    times its block's combined scale added by a fused multiply-add; the halves of the 16 lanes added; the blocks
    past a multiple of 4 into those 8 lanes; folds, bias and the zero points' share as the AVX2 order's rows of
    unsigned codes, on every row."""
    M, N, nb, qa, sa, z, out = _setup(A, scales, zps)
    for m in range(M):
        prod = codes * qa[m]
        s = (sa[m] * scales).astype(F)
        acc = np.zeros((N, 16), F)
        for c in range(nb // 4):
            pc = prod[:, 128 * c:128 * c + 128]
            d0 = pc[:, :64].reshape(N, 16, 4).sum(-1)  # vpdpbusd lanes: blocks 0, 1
            d1 = pc[:, 64:].reshape(N, 16, 4).sum(-1)  # blocks 2, 3
            lanes = np.zeros((N, 16), np.int64)
            for i in range(4):  # unpacklo/unpackhi_epi64 per 128-bit lane, then added
                lanes[:, 4 * i] = d0[:, 4 * i] + d0[:, 4 * i + 2]
                lanes[:, 4 * i + 1] = d0[:, 4 * i + 1] + d0[:, 4 * i + 3]
                lanes[:, 4 * i + 2] = d1[:, 4 * i] + d1[:, 4 * i + 2]
                lanes[:, 4 * i + 3] = d1[:, 4 * i + 1] + d1[:, 4 * i + 3]
            acc = _fma(lanes.astype(F), s[:, 4 * c + _QUAD_LANE], acc)
        x8 = (acc[:, :8] + acc[:, 8:]).astype(F)
        for b in range(nb - nb % 4, nb):
            x8 = _fma(prod[:, 32 * b:32 * b + 32].reshape(N, 8, 4).sum(-1).astype(F), s[:, b:b + 1], x8)
        out[m] = _finish(x8.T, N, bias, sa[m], qa[m], scales, z)
    return out


def _setup(A, scales, zps):
    """(M, N, blocks, quantized A, its scales, the zero points (8 where none are given), the output)."""
    M = A.shape[0]
    N, nb = scales.shape
    qa, sa = _quantize(A, nb)
    return M, N, nb, qa, sa, (np.full((N, nb), 8) if zps is None else zps), np.zeros((M, N), F)


def _quantize(A, nb):
    M, K = A.shape
    qa = np.zeros((M, nb * 32), np.int64)
    sa = np.zeros((M, nb), F)
    for m in range(M):
        for b in range(nb):
            x = A[m, 32 * b:min(K, 32 * b + 32)]
            mx = np.abs(x).max()
            sa[m, b] = mx / F(127)
            inv = F(127) / mx if mx != 0 else F(0)
            qa[m, 32 * b:32 * b + x.size] = np.rint(x * inv)
    return qa, sa


def _finish(x, N, bias, sa, qa, scales, z, signed=False):
    """Eight lanes [8, N] folded (4 columns at once below N rounded down to 4, one by one past it), the bias, and
    for unsigned codes the zero points' share as a chain of fused multiply-adds over the blocks."""
    nb = scales.shape[1]
    fold = ((((x[0] + x[1]) + x[2]) + x[3]) + (((x[4] + x[5]) + x[6]) + x[7])).astype(F)
    hsum = (((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7]))).astype(F)
    y = np.where(np.arange(N) < N - N % 4, fold, hsum).astype(F)
    if bias is not None:
        y = (y + bias).astype(F)
    if not signed:
        absum = (sa * qa.reshape(nb, 32).sum(-1).astype(F)).astype(F)
        bblk = (-scales * z.astype(F)).astype(F)
        chain = np.zeros(N, F)
        for b in range(nb):
            chain = _fma(absum[b], bblk[:, b], chain)
        y = (chain + y).astype(F)
    return y


def _case(K, N, M, zp, seed):
    rng = np.random.default_rng(seed)
    nb = (K + 31) // 32
    b3 = rng.integers(0, 256, (N, nb, 16)).astype(np.uint8)
    sc = (rng.random((N, nb)) * 0.02 + 1e-3).astype(F)
    z = rng.integers(0, 16, (N, nb)) if zp else None
    A = rng.standard_normal((M, K)).astype(F)
    A[0, :5] = 0.0
    if M > 1 and K > 64:
        A[1, 32:64] = 0.0  # an all-zero block
    codes = np.zeros((N, nb * 32), np.int64)
    codes[:, 0::2] = (b3 & 15).reshape(N, -1)
    codes[:, 1::2] = (b3 >> 4).reshape(N, -1)
    return A, b3, sc, z, codes


CASES = [(224, 14, 1, False), (224, 14, 1, True), (200, 16, 1, False), (96, 9, 2, True), (224, 14, 3, False),
         (256, 24, 5, True), (160, 8, 9, False), (64, 12, 129, True), (480, 13, 2, False)]
ORDERS = {Q.ORDER_AVX2: reference, Q.ORDER_AVX512: reference512}


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("K,N,M,zp", CASES)
def test_equal_to_the_order_written_out(K, N, M, zp, order):
    A, b3, sc, z, codes = _case(K, N, M, zp, seed=K + N + M)
    bias = np.linspace(-1, 1, N).astype(F) if M % 2 else None
    zf = z.astype(F) if zp else np.zeros((1, 1), F)
    qi, sct, zft = Q.int4_layout(b3, sc, zf, zp)
    for threads in (1, 2):
        want = ORDERS[order](A, codes, sc, z, bias, threads) if order == Q.ORDER_AVX2 else \
            ORDERS[order](A, codes, sc, z, bias)
        for parallel in (False, True):
            got = np.empty((M, N), F)
            Q.gemv_q4i8_mlas(A, qi, sct, zft, zp, 8.0, 32, got, parallel,
                             bias if bias is not None else np.zeros(1, F), bias is not None, order, threads)
            np.testing.assert_array_equal(got, want)


def test_the_two_orders_differ():
    """The cases tell the orders apart: on one of them the AVX2 and AVX-512 orders give different bits."""
    A, b3, sc, z, codes = _case(480, 13, 2, False, seed=495)
    assert not np.array_equal(reference(A, codes, sc, None, None), reference512(A, codes, sc, None, None))


@njit(cache=True)
def _one_row(form, a, qi, sct, zft, has_zp, n4, y):
    G, nb = qi.shape[0], qi.shape[1]
    aq = np.empty(nb * 32, np.int8)
    ascale = np.empty(nb, np.float32)
    gs = np.empty(nb * 8, np.float32)
    absum = np.empty(nb, np.float32)
    Q._prep_a_i8_groups(a, 32, aq, ascale, gs, absum)
    z = np.float32(8.0)
    if form == 0:
        if has_zp:
            _simd.dot_q4_ort_s_zp_portable(qi, aq, ascale, gs, zft, sct, y, 0, G, n4)
        else:
            _simd.dot_q4_ort_s_portable(qi, aq, ascale, gs, z, sct, y, 0, G, n4)
    elif has_zp:
        _simd.dot_q4_ort_s_zp(qi, aq, ascale, gs, zft, sct, y, 0, G, n4)
    else:
        _simd.dot_q4_ort_s(qi, aq, ascale, gs, z, sct, y, 0, G, n4)


@njit(cache=True)
def _prep_rows(a2, nb):
    """Every row of ``a2`` quantized as MLAS does: (codes, scales, sums of every 4 codes)."""
    R = a2.shape[0]
    aq = np.empty((R, nb * 32), np.int8)
    ascale = np.empty((R, nb), np.float32)
    gs = np.empty((R, nb * 8), np.float32)
    absum = np.empty((R, nb), np.float32)
    for r in range(R):
        Q._prep_a_i8_groups(a2[r], 32, aq[r], ascale[r], gs[r], absum[r])
    return aq, ascale, gs, absum


@njit(cache=True)
def _rows(form, a2, qi, sct, y):
    G, nb = qi.shape[0], qi.shape[1]
    aq, ascale, gs, _ = _prep_rows(a2, nb)
    n4 = y.shape[1]
    if form == 0:
        _simd.dot_q4_ort_u_rows_portable(qi, aq, ascale, gs, np.float32(8.0), sct, y, 0, G, n4)
    else:
        _simd.dot_q4_ort_u_rows(qi, aq, ascale, gs, np.float32(8.0), sct, y, 0, G, n4)


@pytest.mark.parametrize("zp", [False, True])
def test_host_instructions_equal_the_portable_ir(zp):
    A, b3, sc, z, _ = _case(160, 21, _simd.ORT_ROWS, zp, seed=5)
    zf = z.astype(F) if zp else np.zeros((1, 1), F)
    qi, sct, zft = Q.int4_layout(b3, sc, zf, zp)
    G = qi.shape[0]
    ys = [np.empty(8 * G, F) for _ in range(2)]
    for form in (0, 1):
        _one_row(form, A[0], qi, sct, zft, zp, 20, ys[form])
    np.testing.assert_array_equal(ys[0], ys[1])
    yr = [np.empty((_simd.ORT_ROWS, 8 * G), F) for _ in range(2)]
    for form in (0, 1):
        _rows(form, A, qi, sct, yr[form])
    np.testing.assert_array_equal(yr[0], yr[1])


@njit(cache=True)
def _quads(form, a2, qi, sct, zft, has_zp, bias, has_bias, y):
    """MLAS's AVX-512 lanes over ``a2``'s rows in the host's instructions (form 1) or the portable IR (form 0): one
    row at a time, the zero points' share and the bias taken in the same pass, and ``ORT4_ROWS`` per pass, the
    share and the bias added after."""
    G, nb = qi.shape[0], qi.shape[1]
    R = a2.shape[0]
    aq, ascale, _, absum = _prep_rows(a2, nb)
    n4 = y.shape[2]
    z = np.float32(8.0)
    for r in range(R):
        if form == 0:
            _simd.dot_q4_ort_u4_portable(qi, aq[r], ascale[r], absum[r], z, sct, y[0, r], 0, G, n4, zft, has_zp,
                                         bias, has_bias)
        else:
            _simd.dot_q4_ort_u4(qi, aq[r], ascale[r], absum[r], z, sct, y[0, r], 0, G, n4, zft, has_zp, bias,
                                has_bias)
    if form == 0:
        _simd.dot_q4_ort_u4_rows_portable(qi, aq, ascale, absum, z, sct, y[1], 0, G, n4)
    else:
        _simd.dot_q4_ort_u4_rows(qi, aq, ascale, absum, z, sct, y[1], 0, G, n4)
    Q.ort_zero_point_rows(absum, sct, zft, has_zp, z, y[1], R, bias, has_bias, False)


@pytest.mark.parametrize("zp", [False, True])
def test_avx512_lanes_host_instructions_equal_the_portable_ir(zp):
    A, b3, sc, z, _ = _case(480, 21, _simd.ORT4_ROWS, zp, seed=7)  # 15 blocks: 3 passes of 4, then 3 single
    qi, sct, zft = Q.int4_layout(b3, sc, z.astype(F) if zp else np.zeros((1, 1), F), zp)
    G = qi.shape[0]
    bias = np.linspace(-1, 1, 8 * G).astype(F)
    ys = [np.empty((2, _simd.ORT4_ROWS, 8 * G), F) for _ in range(2)]
    for form in (0, 1):
        _quads(form, A, qi, sct, zft, zp, bias, zp, ys[form])
    np.testing.assert_array_equal(ys[0], ys[1])
    # a row's bits do not depend on the rows beside it, nor on where it takes the share
    np.testing.assert_array_equal(ys[0][0], ys[0][1])


def _mnb_model(K, N, b3, sc, z, bias):
    nb = b3.shape[1]
    inits = [nh.from_array(b3, "B"), nh.from_array(sc.reshape(-1), "S")]
    ins = ["A", "B", "S"]
    if z is not None:
        zz = np.zeros((N, (nb + 1) // 2 * 2), np.uint8)
        zz[:, :nb] = z
        inits.append(nh.from_array((zz[:, 0::2] | (zz[:, 1::2] << 4)).astype(np.uint8).reshape(-1), "Z"))
        ins.append("Z")
    if bias is not None:
        ins += [""] * (5 - len(ins)) + ["bias"]
        inits.append(nh.from_array(bias, "bias"))
    node = h.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=K, N=N, bits=4, block_size=32,
                       accuracy_level=4)
    g = h.make_graph([node], "g", [h.make_tensor_value_info("A", T.FLOAT, ["M", K])],
                     [h.make_tensor_value_info("Y", T.FLOAT, ["M", N])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])


@pytest.mark.skipif(not (Q.mlas_avx2_host() or Q.mlas_avx512_host()), reason="onnxruntime takes MLAS's AVX2 or "
                    "AVX-512 int8 kernels only on x86 hosts (the reference comparisons above run everywhere)")
@pytest.mark.parametrize("K,N,M,zp", CASES)
def test_bit_for_bit_onnxruntime(K, N, M, zp, monkeypatch):
    import onnxruntime as ort
    import runtime as rt
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    A, b3, sc, z, _ = _case(K, N, M, zp, seed=K * N + M)
    bias = np.linspace(-1, 1, N).astype(F) if M % 2 else None
    model = _mnb_model(K, N, b3, sc, z, bias).SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"A": A})[0]
    got = rt.InferenceSession(model).run(None, {"A": A})[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(not (Q.mlas_avx2_host() or Q.mlas_avx512_host()), reason="onnxruntime takes MLAS's AVX2 or "
                    "AVX-512 int8 kernels only on x86 hosts (the reference comparisons above run everywhere)")
def test_compiled_region_bit_for_bit_onnxruntime(monkeypatch):
    """The product inside a compiled region (the decoders' path) follows the setting as the node wrapper does."""
    import onnxruntime as ort
    import runtime as rt
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    K, N, M = 224, 16, 5
    A, b3, sc, z, _ = _case(K, N, M, False, seed=31)
    m = _mnb_model(K, N, b3, sc, None, None)
    m.graph.node[0].output[0] = "p"
    m.graph.node.append(h.make_node("Relu", ["p"], ["Y"]))
    m.graph.value_info.append(h.make_tensor_value_info("p", T.FLOAT, [None, None]))  # contrib ops infer no shapes
    model = m.SerializeToString()
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"A": A})[0]
    so = rt.SessionOptions()
    so.compiled_regions = True  # as the pipeline's decoders run
    sess = rt.InferenceSession(model, so)
    assert sum(len(r.nodes) for r in sess.plan.regions) == 2
    twins = {m for r in sess.plan.regions for m in re.findall(r"\b(gemv_q4i8_t\w*?)__ops", r.source)}
    assert twins == {"gemv_q4i8_t_mlas32"}  # the twin of blocks of 32 only
    np.testing.assert_array_equal(sess.run(None, {"A": A})[0], want)
