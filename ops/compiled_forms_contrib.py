"""The compiled (region) form of com.microsoft MatMulNBits, the contrib op whose form needs kernels of its own.

The other contrib ops keep their forms beside their wrappers (``contrib_norm``, ``group_query_attention``,
``rotary_embedding``, ``gather_block_quantized``, ``contrib_recurrent``, ``linear_attention``); see
``ops/forms.py`` for the emitter and ``runtime/regions.py`` for the invariants.  The kernels here are the
wrapper's Python logic translated into ``@njit`` functions that allocate their outputs and call the same typed
kernels the wrapper calls, so a region computes bit for bit what the per-node plan computes.

Forms cover the float32 configurations the model builder emits and decline the rest (other dtypes, g_idx,
attribute values the wrapper rejects, unknown ranks); a declined node runs through its wrapper.  Bad inputs
(an index out of range, a shape that does not fit) are detected in the kernels, which return an error code;
the generated code turns the code into the wrapper's error class with the node named.

MatMulNBits follows the wrapper's path choice exactly: the int8-activation kernels for any number of
rows (4 bits at level 4, over ``_cq.int4_layout`` constants prepared at plan time) or the one-pass rows kernels
for at most ``ROWS_MAX`` rows of A, the dequantized tiles + BLAS otherwise; the rows kernel runs serially (its serial twin) where
the wrapper would run it on one thread (packed weight below ``2 * BYTES_PER_THREAD``), the parallel
kernel above.  Each output element is computed by the same loop either way, so both give the same bits.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


from . import compiled_forms as _cf
from . import contrib_quant as _cq
from ._common import constant_twin
from ._glue import GlueCompiler
from ._mlas_attention import ort_threads
from .compiled_forms import F32, MS, serial_twin
from .forms import Decline, float_only, product_expr, raise_on, form

__all__ = ["mnb_f32", "mnb_f32_mlas"]

_OPTS = dict(cache=True, nogil=True, error_model="numpy")
_MLAS = False  # MLAS's int4 order compiled in (the ``_mlas`` twins; see ``_common.constant_twin``)
_MLAS32 = False  # only its 4-bit codes in blocks of 32 (the ``_mlas32`` twin)


def _s(x):
    return x.decode() if isinstance(x, bytes) else str(x)


# -- MatMulNBits -----------------------------------------------------------------------------------

rows_q4_serial = serial_twin(_cq.rows_q4)
rows_q8_serial = serial_twin(_cq.rows_q8)
dequant_tile_serial = serial_twin(_cq.dequant_tile)
rows_q4_par = _cq.rows_q4
rows_q8_par = _cq.rows_q8
dequant_tile_par = _cq.dequant_tile
ROWS_MAX = _cq.ROWS_MAX
_SERIAL_BYTES = 2 * _cq.BYTES_PER_THREAD   # one thread below this many packed bytes times rows (up to ROWS_MAX)
TILE_ELEMS = _cq.TILE_ELEMS


@njit(**_OPTS)
def mnb_f32(a2, b, scales, zp, zp_mode, bias, has_bias, K, N, bits, bs, quant, mlas, threads):
    """MatMulNBits over A (M, K) float32: (out (M, N), error code into ``MNB_ERRORS``).  zp_mode 0 none, 1 packed
    uint8, 2 float; ``mlas``: the int4 path's order (``_cq.mlas_path``: 0 blockwise, else MLAS's for a host),
    which only the twin ``mnb_f32_mlas`` compiles (``_MLAS``), for onnxruntime on ``threads`` threads."""
    nb = (K + bs - 1) // bs
    blob = bs * bits // 8
    M = a2.shape[0]
    err = _cq.mnb_check(a2.shape[1], True, b.size, scales.size, zp_mode, zp.size, bias.size if has_bias else -1,
                        K, N, bits, nb, blob)
    if err:
        return np.empty((0, 0), np.float32), err
    sc = scales.reshape((N, nb))
    has_zp = zp_mode != 0
    if zp_mode == 1:
        zf = np.empty((N, nb), np.float32)
        _cq.unpack_codes(zp.reshape((N, (nb * bits + 7) // 8)), bits, nb, zf)
    elif zp_mode == 2:
        zf = zp.reshape((N, nb)).astype(np.float32)
    else:
        zf = np.zeros((1, 1), np.float32)
    zdef = np.float32(1 << (bits - 1))
    b3 = b.reshape((N, nb, blob))
    out = np.empty((M, N), np.float32)
    if M == 0:
        pass
    elif bits == 4 and quant and bs % 16 == 0:  # _cq.int4_path
        qi, sct, zft = _cq.int4_layout(b3, sc, zf, has_zp)
        if _MLAS and mlas:
            if has_bias and bias.size != N:
                return np.empty((0, 0), np.float32), 5
            _cq.gemv_q4i8_mlas(a2, qi, sct, zft, has_zp, zdef, bs, out, b3.size >= _SERIAL_BYTES, bias, has_bias,
                               mlas, threads)
            return out, 0
        _cq.gemv_q4i8(a2, qi, sct, zft, has_zp, zdef, bs, out, b3.size >= _SERIAL_BYTES)
    elif M <= ROWS_MAX:
        asum = np.empty((M, nb), np.float32)
        ascale = np.empty((M, nb), np.float32)
        serial = b3.size < _SERIAL_BYTES
        if bits == 4:
            ae = np.empty((M, nb, bs // 2), np.float32)
            ao = np.empty((M, nb, bs // 2), np.float32)
            _cq.prep_a4(a2, nb, bs, quant, ae, ao, asum, ascale)
            if serial:
                rows_q4_serial(b3, ae, ao, asum, ascale, sc, zf, has_zp, zdef, out)
            else:
                rows_q4_par(b3, ae, ao, asum, ascale, sc, zf, has_zp, zdef, out)
        else:
            ap = np.empty((M, nb, bs), np.float32)
            _cq.prep_a8(a2, nb, bs, quant, ap, asum, ascale)
            if serial:
                rows_q8_serial(b3, ap, asum, ascale, sc, zf, has_zp, zdef, out)
            else:
                rows_q8_par(b3, ap, asum, ascale, sc, zf, has_zp, zdef, out)
    else:
        af = a2
        if quant:
            af = np.empty((M, K), np.float32)
            _cq.fake_quant_a(a2, bs, af)
        g = np.arange(K) // bs
        tile = max(1, min(N, TILE_ELEMS // max(K, 1)))
        for n0 in range(0, N, tile):
            rows = min(tile, N - n0)
            wt = np.empty((rows, K), np.float32)
            if rows * K < _cf.PARALLEL_WORK:
                dequant_tile_serial(b3, bits, sc, zf, has_zp, zdef, g, n0, wt)
            else:
                dequant_tile_par(b3, bits, sc, zf, has_zp, zdef, g, n0, wt)
            out[:, n0:n0 + rows] = np.dot(af, wt.T)
    if has_bias:
        out += bias.reshape((1, N))
    return out, 0


# Decode GEMV over weights repacked at plan time to (n_blocks, blob, N): still the packed 4/8-bit codes, read
# once, but consecutive bytes belong to consecutive output columns, so the dequantizing loop runs over N
# (long, vectorised) instead of over one block's 16 bytes.  A's preparation and the per-block arithmetic are
# the wrapper's (``prep_a4``/``prep_a8``): in accuracy_level 4 every block dot is an exact integer, so the
# results equal the wrapper's.

_FAST = {"reassoc", "contract", "arcp", "nsz"}
_COLS = 256  # output columns per task


# The column window [n0, n1) is taken as slices, so the inner loops index from 0 with a range counter: an index
# ``n0 + c`` with a run-time n0 keeps Numba's negative-index wraparound in the loop, which stops it from
# vectorising (measured 6x slower).

@njit(fastmath=_FAST, **_OPTS)
def _q_block_sum(tot, d, s, sm, sc_row, zf_row, has_zp, zdef):
    """tot[c] += s * scale[c] * (d[c] - zero[c] * sm) over one block's columns; the zero-point choice is made
    once, outside the loop (a per-element select on a run-time flag keeps the loop from vectorising)."""
    w = tot.shape[0]
    if has_zp:
        for c in range(w):
            tot[c] += (s * sc_row[c]) * (d[c] - zf_row[c] * sm)
    else:
        zs = zdef * sm
        for c in range(w):
            tot[c] += (s * sc_row[c]) * (d[c] - zs)


@njit(fastmath=_FAST, **_OPTS)
def _qt_cols(bits, bt, ae, ao, asum, ascale, sct, zft, has_zp, zdef, out, n0, n1):
    """out[n0:n1] for repacked 4-bit (``ae``/``ao`` from ``prep_a4``) or 8-bit (``ae`` from ``prep_a8``)
    codes: per block, the code-by-activation dot of each column, then the block's scale and zero point."""
    nb, rows, _ = bt.shape
    w = n1 - n0
    tot = np.zeros(w, np.float32)
    d = np.empty(w, np.float32)
    for blk in range(nb):
        for c in range(w):
            d[c] = 0.0
        for j in range(rows):
            ev = ae[0, blk, j]
            row = bt[blk, j, n0:n1]
            if bits == 4:  # byte * even + (byte >> 4) * (odd - 16 even) = lo * even + hi * odd
                ov = ao[0, blk, j]
                for c in range(w):
                    f = np.float32(row[c])
                    d[c] += f * ev + np.floor(f * np.float32(0.0625)) * ov
            else:
                for c in range(w):
                    d[c] += np.float32(row[c]) * ev
        _q_block_sum(tot, d, ascale[0, blk], asum[0, blk], sct[blk, n0:n1], zft[blk, n0:n1] if has_zp else
                     zft[0, 0:0], has_zp, zdef)
    o = out[n0:n1]
    for c in range(w):
        o[c] = tot[c]


@njit(parallel=True, **_OPTS)
def _qt_par(bits, bt, ae, ao, asum, ascale, sct, zft, has_zp, zdef, out):
    N = bt.shape[2]
    for t in prange((N + _COLS - 1) // _COLS):
        n0 = t * _COLS
        _qt_cols(bits, bt, ae, ao, asum, ascale, sct, zft, has_zp, zdef, out, n0, min(n0 + _COLS, N))


@njit(**_OPTS)
def gemv_nbits_t(a2, bt, sct, zft, has_zp, bits, bs, K, quant, bias, has_bias):
    """One row of A (1, K) against repacked weights: (out (1, N), error code)."""
    if a2.shape[1] != K:
        return np.empty((0, 0), np.float32), 1
    nb = bt.shape[0]
    N = bt.shape[2]
    asum = np.empty((1, nb), np.float32)
    ascale = np.empty((1, nb), np.float32)
    zdef = np.float32(1 << (bits - 1))
    out = np.empty((1, N), np.float32)
    if bits == 4:
        ae = np.empty((1, nb, bs // 2), np.float32)
        ao = np.empty((1, nb, bs // 2), np.float32)
        _cq.prep_a4(a2, nb, bs, quant, ae, ao, asum, ascale)
    else:
        ae = np.empty((1, nb, bs), np.float32)
        ao = ae
        _cq.prep_a8(a2, nb, bs, quant, ae, asum, ascale)
    if bt.size < _SERIAL_BYTES:
        _qt_cols(bits, bt, ae, ao, asum, ascale, sct, zft, has_zp, zdef, out[0], 0, N)
    else:
        # Run-time (not literal) flags: one specialisation of the parallel kernel, whoever calls it.
        _qt_par(np.int64(bits), bt, ae, ao, asum, ascale, sct, zft, has_zp != 0, np.float32(zdef), out[0])
    if has_bias:
        if bias.size != N:
            return np.empty((0, 0), np.float32), 5
        for n in range(N):
            out[0, n] += bias[n]
    return out, 0


@njit(pipeline_class=GlueCompiler, **_OPTS)
def gemv_q4i8_t(a2, qi, sct, zft, has_zp, zdef, bs, K, N, bias, has_bias, mlas, threads):
    """Rows of A (M, K) against ``_cq.int4_layout`` constants: (out (M, N), error code).  The twins
    ``gemv_q4i8_t_mlas`` and ``gemv_q4i8_t_mlas32`` (4-bit codes in blocks of 32) run MLAS's order ``mlas``
    (``_cq.gemv_q4i8_mlas``, which adds the bias itself) and compile no blockwise kernel; this one only those."""
    if a2.shape[1] != K:
        return np.empty((0, 0), np.float32), 1
    if has_bias and bias.size != N:
        return np.empty((0, 0), np.float32), 5
    out = np.empty((a2.shape[0], N), np.float32)
    parallel = qi.size * min(a2.shape[0], ROWS_MAX) >= _SERIAL_BYTES
    if _MLAS:  # (the twins run only where the plan asked for MLAS's order: the blockwise kernels compiled out)
        if _MLAS32:
            _cq.gemv_q4i8_mlas32(a2, qi, sct, zft, has_zp, zdef, bs, out, parallel, bias, has_bias, mlas, threads)
        else:
            _cq.gemv_q4i8_mlas(a2, qi, sct, zft, has_zp, zdef, bs, out, parallel, bias, has_bias, mlas, threads)
        return out, 0
    _cq.gemv_q4i8(a2, qi, sct, zft, has_zp, zdef, bs, out, parallel)
    if has_bias:
        for m in range(out.shape[0]):
            for n in range(N):
                out[m, n] += bias[n]
    return out, 0


mnb_f32_mlas = constant_twin(mnb_f32, "_mlas", _MLAS=True)
gemv_q4i8_t_mlas = constant_twin(gemv_q4i8_t, "_mlas", _MLAS=True)
gemv_q4i8_t_mlas32 = constant_twin(gemv_q4i8_t, "_mlas32", _MLAS=True, _MLAS32=True)  # 4-bit codes, blocks of 32


def _valid(m, b, scales, zp, zp_mode) -> bool:
    """The constant weights fit the bound attributes (when not, the run-time path reports it)."""
    b, scales = np.asarray(b), np.asarray(scales)
    return not _cq.mnb_check(m.K, b.dtype == np.uint8, b.size, scales.size, zp_mode,
                             0 if zp is None else np.asarray(zp).size, -1, m.K, m.N, m.bits, m.nb, m.blob)


def _zero_points(m, zp, zp_mode):
    return _cq.unpack_zero_points(np.asarray(zp), m.N, m.nb, m.bits) if zp_mode else None


def _repack_int4(m, b, scales, zp, zp_mode):
    """Plan-time ``_cq.int4_layout`` arrays; None if malformed."""
    if not _valid(m, b, scales, zp, zp_mode):
        return None
    sc = np.ascontiguousarray(np.asarray(scales, np.float32).reshape(m.N, m.nb))
    zf = _zero_points(m, zp, zp_mode) if zp_mode else np.zeros((1, 1), np.float32)
    return _cq.int4_layout(np.ascontiguousarray(np.asarray(b).reshape(m.N, m.nb, m.blob)), sc, zf, zp_mode != 0)


def _repack(m, b, scales, zp, zp_mode):
    """Plan-time (n_blocks, blob, N) codes, (n_blocks, N) scales and float zero points; None if malformed."""
    if not _valid(m, b, scales, zp, zp_mode):
        return None
    bt = np.ascontiguousarray(np.asarray(b).reshape(m.N, m.nb, m.blob).transpose(1, 2, 0))
    sct = np.ascontiguousarray(np.asarray(scales, np.float32).reshape(m.N, m.nb).T)
    zf = _zero_points(m, zp, zp_mode) if zp_mode else np.zeros((m.N, 1), np.float32)
    return bt, sct, np.ascontiguousarray(zf.T)


def _matmul_nbits(e, m):
    """The region form: the bound op's constants repacked at plan time when B, scales and zero points are
    initializers, its codes raised from ``MNB_ERRORS``."""
    float_only(e, 0, 2, 5)
    if m.K <= 0 or m.N <= 0 or e.dtype(1) != np.uint8 or e.has(4):
        raise Decline("sizes, B dtype or g_idx")
    K, N, bits, bs = m.K, m.N, m.bits, m.bs
    ra = e.rank(0)
    if ra < 1:
        raise Decline("rank")
    zp_mode = 0
    if e.has(3):
        zdt = e.dtype(3)
        zp_mode = 1 if zdt == np.uint8 else 2 if zdt == F32 else -1
        if zp_mode < 0:
            raise Decline("zero point dtype")
    quant = m.level4 and zp_mode != 2
    e.exact = quant  # integer block dots are exact in any order; float accumulation is not
    order = _cq.mlas_path(bs, bits, m.level4)
    threads = ort_threads()  # onnxruntime's, a literal of the source
    if order and ((not m.level4 and zp_mode != 2) or (bits == 8 and quant)
                  or (zp_mode == 2 and _cq.mlas_path(bs, bits, False))):
        # MLAS's order of 8-bit codes at level 4, of the float path (levels 0 to 3) and of float zero points
        # (onnxruntime's dequantized B and SGEMM) is the node wrapper's (``_cq.matmul_nbits``); this form
        # reproduces it for 4-bit codes at level 4 only
        raise Decline("MLAS's order of this product runs in the op's wrapper")
    k = e.use(__name__, "mnb_f32_mlas" if order else "mnb_f32")
    lead = [f"{{i0}}.shape[{d}]" for d in range(ra - 1)]
    zp = "{i3}.reshape(({i3}.size,))" if zp_mode else "np.zeros(1, np.float32)"
    bias = "{i5}.reshape(({i5}.size,))" if e.has(5) else "np.zeros(1, np.float32)"
    e.line(f"{{p}}_m = {product_expr(lead)}")
    packed = int4 = None
    if e.const(1) is not None and e.const(2) is not None and (zp_mode == 0 or e.const(3) is not None):
        if _cq.int4_path(bits, bs, quant, None):
            int4 = _repack_int4(m, e.const(1), e.const(2), e.const(3), zp_mode)
        else:
            packed = _repack(m, e.const(1), e.const(2), e.const(3), zp_mode)
    call = (f"{k}({{i0}}.reshape(({{p}}_m, {{i0}}.shape[{ra - 1}])), {{i1}}.reshape(({{i1}}.size,)), "
            f"{{i2}}.reshape(({{i2}}.size,)), {zp}, {zp_mode}, {bias}, {e.has(5)}, np.int64({K}), np.int64({N}), "
            f"{bits}, {bs}, {quant}, {order}, np.int64({threads}))")
    if int4 is not None:
        qi, sct, zft = (e.constant(x) for x in int4)
        g = e.use(__name__, ("gemv_q4i8_t_mlas32" if bits == 4 and bs == 32 else "gemv_q4i8_t_mlas") if order
                  else "gemv_q4i8_t")
        # Every row count runs over the repacked codes (prefill as fast as the dequantized tiles + BLAS, measured
        # at 256 rows), so the original B is never read after plan time and its pages can be released.
        e.line(f"{{p}}_y, {{p}}_err = {g}({{i0}}.reshape(({{p}}_m, {{i0}}.shape[{ra - 1}])), {qi}, {sct}, {zft}, "
               f"{zp_mode != 0}, {float(1 << (bits - 1))!r}, {bs}, np.int64({K}), np.int64({N}), {bias}, {e.has(5)}, "
               f"{order}, np.int64({threads}))")
    elif packed is not None:
        bt, sct, zft = (e.constant(x) for x in packed)
        g = e.use(__name__, "gemv_nbits_t")
        e.line("if {p}_m == 1:",
               f"    {{p}}_y, {{p}}_err = {g}({{i0}}.reshape((1, {{i0}}.size)), {bt}, {sct}, {zft}, {zp_mode != 0}, "
               f"{bits}, {bs}, np.int64({K}), {quant}, {bias}, {e.has(5)})",
               "else:",
               f"    {{p}}_y, {{p}}_err = {call}")
    else:
        e.line(f"{{p}}_y, {{p}}_err = {call}")
    raise_on(e, "{p}_err", [(c, cls, msg) for c, (cls, msg) in _cq.MNB_ERRORS.items() if c <= 5])
    e.line(f"{{o0}} = {{p}}_y.reshape(({', '.join(lead + [str(N)])},))")



form("MatMulNBits", domain=MS, bind=_cq.bind_mnb)(_matmul_nbits)


# -- LinearAttentionGate / CausalConvWithState / LinearAttention -------------------------------------
