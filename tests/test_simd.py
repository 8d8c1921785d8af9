"""The int8-activation MatMulNBits kernels (ops/_simd.py, ops/contrib_quant.gemv_q4i8): the host's form (AVX2
instructions where the host has them) and the portable IR give the same bits, and both equal the float rows
kernel's level-4 result to float rounding (the integer block dots are exact; only the order of float
operations differs)."""
import numpy as np
import pytest
from numba import njit

from ops import _simd
from ops import contrib_quant as Q

RNG = np.random.default_rng(11)


@njit(cache=True)
def _rows_by(form, a2, qi, sct, zft, has_zp, zdef, bs, out):
    """Row by row on one form of the single-row kernel: 0 the portable IR, 1 the AVX2 pair sums."""
    G, nb = qi.shape[0], qi.shape[1]
    aq = np.empty(nb * bs, np.int8)
    ascale = np.empty(nb, np.float32)
    asum = np.empty(nb, np.float32)
    zt = np.empty(nb, np.int32)
    y = np.empty(8 * G, np.float32)
    for m in range(a2.shape[0]):
        Q._prep_a_i8(a2[m], bs, aq, ascale, asum)
        Q.zero_terms(asum, np.float32(zdef), zt)
        if form == 0 and has_zp:
            _simd.dot_q4_zp_portable(qi, aq, ascale, asum, zft, sct, y, 0, G)
        elif form == 0:
            _simd.dot_q4_portable(qi, aq, ascale, zt, np.float32(zdef), sct, y, 0, G)
        elif has_zp:
            _simd.dot_q4_zp_avx2(qi, aq, ascale, asum, zft, sct, y, 0, G)
        else:
            _simd.dot_q4_avx2(qi, aq, ascale, zt, np.float32(zdef), sct, y, 0, G)
        for n in range(out.shape[1]):
            out[m, n] = y[n]


def _portable_rows(a2, qi, sct, zft, has_zp, zdef, bs, out):
    _rows_by(0, a2, qi, sct, zft, has_zp, zdef, bs, out)


def _avx2_rows(a2, qi, sct, zft, has_zp, zdef, bs, out):
    _rows_by(1, a2, qi, sct, zft, has_zp, zdef, bs, out)


def _case(K, N, bs, zp, M=3):
    nb = (K + bs - 1) // bs
    b3 = RNG.integers(0, 256, (N, nb, bs // 2)).astype(np.uint8)
    sc = (RNG.random((N, nb)) * 0.02).astype(np.float32)
    zf = RNG.integers(0, 16, (N, nb)).astype(np.float32) if zp else np.zeros((1, 1), np.float32)
    a = RNG.standard_normal((M, K)).astype(np.float32)
    a[0, :5] = 0.0  # a block with zeros; an all-zero block below
    if K >= 2 * bs and M > 1:
        a[1, bs:2 * bs] = 0.0
    return a, b3, sc, zf


@pytest.mark.parametrize("K,N,bs,zp", [(256, 2048, 32, False), (96, 40, 32, True), (250, 37, 64, False),
                                       (512, 300, 128, True), (512, 64, 256, False), (33, 9, 32, False),
                                       (72, 19, 16, False), (40, 8, 16, True)])
def test_int8_kernels_agree(K, N, bs, zp):
    a, b3, sc, zf = _case(K, N, bs, zp, M=_simd.ROWS + 2)  # one pass of ROWS rows, then two rows alone
    M, nb = a.shape[0], b3.shape[1]
    qi, sct, zft = Q.int4_layout(b3, sc, zf, zp)
    host = np.empty((M, N), np.float32)
    Q.gemv_q4i8(a, qi, sct, zft, zp, 8.0, bs, host, False)
    par = np.empty((M, N), np.float32)
    Q.gemv_q4i8(a, qi, sct, zft, zp, 8.0, bs, par, True)
    port = np.empty((M, N), np.float32)
    _portable_rows(a, qi, sct, zft, zp, 8.0, bs, port)
    np.testing.assert_array_equal(host, port)
    np.testing.assert_array_equal(host, par)
    # The float rows kernel on the same int8 activations.
    ae = np.empty((M, nb, bs // 2), np.float32)
    ao = np.empty_like(ae)
    asum = np.empty((M, nb), np.float32)
    asc = np.empty_like(asum)
    Q.prep_a4(a, nb, bs, True, ae, ao, asum, asc)
    ref = np.empty((M, N), np.float32)
    Q.rows_q4(b3, ae, ao, asum, asc, sc, zf, zp, np.float32(8.0), ref)
    np.testing.assert_allclose(host, ref, rtol=1e-5, atol=1e-6 * float(np.abs(ref).max()))
    # And the dequantized product (the activations' int8 rounding bounds the difference).
    w = (np.stack([(b3 & 15), (b3 >> 4)], -1).reshape(N, nb, bs).astype(np.float32)
         - (zf[:, :, None] if zp else 8.0)) * sc[:, :, None]
    exact = a @ w.reshape(N, nb * bs)[:, :a.shape[1]].T
    np.testing.assert_allclose(host, exact, rtol=0, atol=0.02 * float(np.abs(exact).max()))


@pytest.mark.parametrize("K,N,bs,zp,M", [(64 * 32 + 40, 40, 32, False, _simd.ROWS + 2), (200, 19, 32, True, 4),
                                         (96, 24, 16, False, 1), (256, 16, 128, False, 3)])
def test_the_blockwise_order_bit_for_bit(K, N, bs, zp, M):
    """gemv_q4i8 against its order written out in numpy float32: per column, blocks in order,
    ``acc + (ascale * scale) * (dot - zero * asum)``.  Without zero points the kernels start each block's
    integer sum from ``- zero * asum`` (``zero_terms``); the bits must stay those of the float form."""
    a, b3, sc, zf = _case(K, N, bs, zp, M=M)
    nb = b3.shape[1]
    qi, sct, zft = Q.int4_layout(b3, sc, zf, zp)
    out = np.empty((M, N), np.float32)
    Q.gemv_q4i8(a, qi, sct, zft, zp, 8.0, bs, out, True)
    codes = np.stack([(b3 & 15), (b3 >> 4)], -1).reshape(N, nb, bs).astype(np.int64)
    z = zf if zp else np.full((N, nb), 8.0, np.float32)
    for m in range(M):
        aq = np.empty(nb * bs, np.int8)
        ascale = np.empty(nb, np.float32)
        asum = np.empty(nb, np.float32)
        Q._prep_a_i8(a[m], bs, aq, ascale, asum)
        dots = np.einsum("nbk,bk->nb", codes, aq.reshape(nb, bs).astype(np.int64)).astype(np.float32)
        acc = np.zeros(N, np.float32)
        for blk in range(nb):
            acc = acc + (ascale[blk] * sc[:, blk]) * (dots[:, blk] - z[:, blk] * asum[blk])
        np.testing.assert_array_equal(out[m], acc)


def test_layout_rejects_non_contiguous_arrays():
    a, b3, sc, zf = _case(64, 16, 32, False, M=1)
    qi, sct, zft = Q.int4_layout(b3, sc, zf, False)

    @njit
    def call(qi):
        nb = qi.shape[1]
        y = np.empty(8 * qi.shape[0], np.float32)
        aq = np.zeros(nb * 8 * qi.shape[2], np.int8)
        _simd.dot_q4(qi, aq, np.ones(nb, np.float32), np.zeros(nb, np.int32), np.float32(8), sct, y, 0, 1)
        return y

    with pytest.raises(Exception, match="dot_q4"):
        call(qi[:, :, :, ::-1])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_activations_give_nan_rows(bad):
    """A NaN or an infinity in A makes its row of the product NaN (float arithmetic would), never finite
    garbage from converting a NaN to int8; the other rows are untouched."""
    a, b3, sc, zf = _case(96, 24, 32, False)
    a[1, 40] = bad
    qi, sct, zft = Q.int4_layout(b3, sc, zf, False)
    out = np.empty((a.shape[0], 24), np.float32)
    Q.gemv_q4i8(a, qi, sct, zft, False, 8.0, 32, out, False)
    assert np.isnan(out[1]).all()
    clean = np.empty((1, 24), np.float32)
    Q.gemv_q4i8(np.ascontiguousarray(a[[0]]), qi, sct, zft, False, 8.0, 32, clean, False)
    np.testing.assert_array_equal(out[0], clean[0])
    assert np.isfinite(out[[0, 2]]).all()


@pytest.mark.parametrize("K,bs", [(256, 32), (100, 32), (40, 16), (300, 128)])
def test_activation_quantization_matches_numpy(K, bs):
    """A is quantized per block exactly as numpy's round-half-even of a * (127 / max|a|), ties included; zeros
    fill the last block past K; the block sums are the codes' sums."""
    a = (RNG.standard_normal(K) * RNG.choice([1e-3, 1.0, 1e3], K)).astype(np.float32)
    nb = (K + bs - 1) // bs
    for blk in range(nb):  # exact ties: values at half-integers of the block's step
        x = a[blk * bs:(blk + 1) * bs]
        step = np.abs(x).max() / np.float32(127.0)
        x[:4] = np.array([0.5, 1.5, -2.5, 126.5], np.float32) * step
    aq = np.empty(nb * bs, np.int8)
    ascale = np.empty(nb, np.float32)
    asum = np.empty(nb, np.float32)
    Q._prep_a_i8(a, bs, aq, ascale, asum)
    pad = np.zeros(nb * bs, np.float32)
    pad[:K] = a
    for blk in range(nb):
        x = pad[blk * bs:(blk + 1) * bs]
        amax = np.abs(x).max()
        ref = np.rint(x * (np.float32(127.0) / amax)).astype(np.int8)
        np.testing.assert_array_equal(aq[blk * bs:(blk + 1) * bs], ref)
        assert ascale[blk] == amax / np.float32(127.0)
        assert asum[blk] == ref.astype(np.int64).sum()


@pytest.mark.skipif(not _simd.VNNI, reason="the host has no VNNI: the kernels use the pair sums themselves")
@pytest.mark.parametrize("K,N,bs,zp", [(256, 64, 32, False), (96, 40, 32, True), (250, 37, 64, False),
                                       (72, 19, 16, True)])
def test_vnni_dots_equal_the_pair_sums(K, N, bs, zp):
    """vpdpbusd adds the same exact integers as vpmaddubsw + vpmaddwd: the results are equal bit for bit (codes
    and activations at their extremes included)."""
    a, b3, sc, zf = _case(K, N, bs, zp, M=_simd.ROWS + 1)
    a[0, :bs] = np.where(np.arange(bs) % 2, 1.0, -1.0)  # activations at -127 and 127
    b3[:2] = 255                                         # codes at 15
    qi, sct, zft = Q.int4_layout(b3, sc, zf, zp)
    vnni = np.empty((a.shape[0], N), np.float32)
    Q.gemv_q4i8(a, qi, sct, zft, zp, 8.0, bs, vnni, False)
    pairs = np.empty_like(vnni)
    _avx2_rows(a, qi, sct, zft, zp, 8.0, bs, pairs)
    np.testing.assert_array_equal(vnni, pairs)


@njit(cache=True)
def _rows_pass(kernel_id, qi, aqr, ascr, asur, zdef, sct, yr):
    G = qi.shape[0]
    zt = np.empty(asur.shape, np.int32)
    Q.zero_terms(asur, np.float32(zdef), zt)
    if kernel_id == 0:
        _simd.dot_q4_rows_portable(qi, aqr, ascr, zt, np.float32(zdef), sct, yr, 0, G)
    else:
        _simd.dot_q4_rows_avx2(qi, aqr, ascr, zt, np.float32(zdef), sct, yr, 0, G)


def _quantized_rows(a, nb, bs):
    """``_simd.ROWS`` rows of A quantized as the kernels take them: codes, scales and block sums."""
    aqr = np.empty((_simd.ROWS, nb * bs), np.int8)
    ascr = np.empty((_simd.ROWS, nb), np.float32)
    asur = np.empty((_simd.ROWS, nb), np.float32)
    for r in range(_simd.ROWS):
        Q._prep_a_i8(a[r], bs, aqr[r], ascr[r], asur[r])
    return aqr, ascr, asur


@pytest.mark.parametrize("form", ["portable", "avx2"])
def test_every_form_of_the_rows_pass_gives_each_rows_bits(form):
    """The several-row pass in its portable and pair-sum forms (the host runs only one of the three) equals the
    single-row kernel row by row."""
    if form == "avx2" and not _simd.AVX2:
        pytest.skip("the pair-sum form needs AVX2")
    K, N, bs = 200, 48, 32
    a, b3, sc, zf = _case(K, N, bs, False, M=_simd.ROWS)
    qi, sct, zft = Q.int4_layout(b3, sc, zf, False)
    aqr, ascr, asur = _quantized_rows(a, qi.shape[1], bs)
    yr = np.empty((_simd.ROWS, 8 * qi.shape[0]), np.float32)
    _rows_pass(0 if form == "portable" else 1, qi, aqr, ascr, asur, 8.0, sct, yr)
    one = np.empty((_simd.ROWS, N), np.float32)
    _portable_rows(a, qi, sct, zft, False, 8.0, bs, one)
    np.testing.assert_array_equal(yr[:, :N], one)


@njit(cache=True)
def _rows_wide_or_not(wide, has_zp, qi, aqr, ascr, asur, zdef, zft, sct, yr):
    G = qi.shape[0]
    zt = np.empty(asur.shape, np.int32)
    Q.zero_terms(asur, np.float32(zdef), zt)
    if wide and has_zp:
        _simd.dot_q4_zp_rows(qi, aqr, ascr, asur, zft, sct, yr, 0, G)
    elif wide:
        _simd.dot_q4_rows(qi, aqr, ascr, zt, np.float32(zdef), sct, yr, 0, G)
    elif has_zp:
        _simd.dot_q4_zp_rows_vnni256(qi, aqr, ascr, asur, zft, sct, yr, 0, G)
    else:
        _simd.dot_q4_rows_vnni256(qi, aqr, ascr, zt, np.float32(zdef), sct, yr, 0, G)


@pytest.mark.parametrize("K,N,zp", [(64 * 32 + 40, 40, False), (64 * 32, 72, True), (96, 24, False)])
def test_the_512_bit_rows_pass_gives_the_256_bit_bits(K, N, zp):
    """Two column groups per 512-bit vector (from WIDE_MIN_BLOCKS blocks; an odd group count leaves one to the
    256-bit path) against the 256-bit pass: every output equal, bit for bit."""
    if not _simd.VNNI512:
        pytest.skip("the 512-bit pass needs AVX512-VNNI")
    bs = 32
    a, b3, sc, zf = _case(K, N, bs, zp, M=_simd.ROWS)
    qi, sct, zft = Q.int4_layout(b3, sc, zf, zp)
    aqr, ascr, asur = _quantized_rows(a, qi.shape[1], bs)
    wide = np.full((_simd.ROWS, 8 * qi.shape[0]), np.nan, np.float32)
    narrow = np.full_like(wide, np.nan)
    _rows_wide_or_not(True, zp, qi, aqr, ascr, asur, 8.0, zft, sct, wide)
    _rows_wide_or_not(False, zp, qi, aqr, ascr, asur, 8.0, zft, sct, narrow)
    assert not np.isnan(wide).any()
    np.testing.assert_array_equal(wide, narrow)


@pytest.mark.parametrize("M", [3, 5, 8, 11])
def test_a_batch_of_rows_gives_each_rows_bits_alone(M):
    """gemv_q4i8 over M rows (a full pass, a padded pass of 3 to 7, or both) equals each row run alone, bit for
    bit: a decode batch's tokens do not depend on what else is in it."""
    K, N, bs = 64 * 32 + 40, 48, 32
    a, b3, sc, zf = _case(K, N, bs, False, M=M)
    qi, sct, zft = Q.int4_layout(b3, sc, zf, False)
    together = np.empty((M, N), np.float32)
    Q.gemv_q4i8(a, qi, sct, zft, False, np.float32(8), bs, together, False)
    for m in range(M):
        alone = np.empty((1, N), np.float32)
        Q.gemv_q4i8(a[m:m + 1], qi, sct, zft, False, np.float32(8), bs, alone, False)
        np.testing.assert_array_equal(together[m], alone[0])
