"""Integer dot products that Numba's loops cannot express: 4-bit weight codes against int8 activations.

``dot_q4`` and ``dot_q4_zp`` are Numba intrinsics: they emit LLVM IR directly.  On a host with AVX2 the IR is
``vpmaddubsw``/``vpmaddwd`` (32 code-by-activation products summed into 16-bit pairs in one instruction, where
a Numba loop converts every code to float first).  Elsewhere they emit portable vector IR (widen, multiply,
add) that any LLVM target compiles.  Both forms compute the same exact integer block dots and then the same
float operations in the same order, so their results are identical bit for bit; ``dot_q4_portable`` /
``dot_q4_zp_portable`` always emit the portable IR, so tests check that on any host.  Where the host also has
VNNI (AVX-VNNI, or AVX512-VNNI with VL), ``vpdpbusd`` adds each lane's four code-by-activation products to a
32-bit sum in one instruction, in place of ``vpmaddubsw`` + ``vpmaddwd`` + an add: the same exact integers.

Layout (see ``contrib_quant.int4_layout``): output columns in groups of 8, each 32-bit lane of a vector one
column, so a block's 8 column dots accumulate with vertical adds only.  ``qi[g, blk, j]`` (32 bytes) holds, in
byte ``4i + t``, column ``8g + i``'s codes for ``k = blk*bs + 8j + t`` (low nibble) and ``k + 4`` (high
nibble), t = 0..3; a block is ``bs // 8`` such vectors.  Activations ``aq`` are the int8 quantized row in
natural order (``nb * bs`` of them, zeros past K): the 4 activations of a nibble half are broadcast to every
lane.  Per block and column the float result is ``out += (ascale[blk] * scale) * (dot - zero * asum[blk])``,
accumulated over blocks in order; zero is ``zdef`` or ``zf[g, blk, i]``.  Without zero points the term
``- zdef * asum[blk]`` is one integer per row and block: the kernels then take it in ``asum``'s place (int32,
``contrib_quant.zero_terms``) and start the block's integer sum from it, so the float update is two products
and an add (``dot`` and ``zdef * asum`` are integers below 2**24, so their float difference is exact and the
bits are those of the float form; at 8 rows a pass with the float update left out took 70% of the time, so the
update is about 30% of a pass of several rows, and each product taken out of it counts).  Scales and zero points are
``[G, nb, 8]``: a group's blocks one after another, so the codes and the scales of a column group are two
sequential streams (a scale table ordered by block first is read at a stride of the whole width: 896x4864
products streamed from memory took 184 us against 156).  Codes are 0..15 and activations
-127..127: a ``vpmaddubsw`` pair sum is at most 3810 in magnitude, and 16-bit partial sums are widened to 32
bits every 4 vectors (at most 8 pair sums, 30480 < 32767), so nothing saturates or wraps.

``dot_q4_rows``/``dot_q4_zp_rows`` take ``ROWS`` rows of activations through one pass over the codes (a prefill):
each vector of codes is loaded and unpacked once for all of them, and each row's arithmetic is the single-row
kernel's, so every row's result is the same bits.  On a host with 512-bit ``vpdpbusd`` (``VNNI512``) and from
``WIDE_MIN_BLOCKS`` blocks along K, the pass takes two column groups per 512-bit vector (lanes 0-7 the first,
8-15 the second): per lane the same integers and the same float operations in the same order, so the same
bits, in half the instructions; ``dot_q4_rows_vnni256`` is the 256-bit pass, for tests.

Invariant: the kernels read ``qi[g0:g1]`` and ``aq[:nb * bs]`` and write ``out[8*g0:8*g1]`` only; callers
check the shapes.
"""
from __future__ import annotations

import llvmlite.binding as _llb
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

__all__ = ["AVX2", "AVX512", "VNNI", "VNNI512", "ROWS", "WIDE_MIN_BLOCKS", "dot_q4", "dot_q4_zp", "dot_q4_rows", "dot_q4_zp_rows"]


def target_features() -> dict:
    """The CPU features Numba compiles for, ``{name: bool}`` as LLVM spells them: ``NUMBA_CPU_FEATURES`` when set
    (``+avx2,-avx512f,...``; empty for a portable ``NUMBA_CPU_NAME=generic`` cache), else the host's.  Every
    choice of instructions and of which of onnxruntime's MLAS kernels to reproduce reads them, so a target
    describes a host: ``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=+avx,+avx2,+fma,+f16c`` builds and runs, on
    any newer x86 host, what an AVX2-only host runs (Numba keeps its caches per target).  Features a named CPU
    implies but the list leaves out count as absent."""
    listed = numba.config.CPU_FEATURES
    if listed is None:
        try:
            return {k: bool(v) for k, v in _llb.get_host_cpu_features().items()}
        except Exception:  # pragma: no cover - a host LLVM cannot describe
            return {}
    return {f.strip()[1:]: f.strip()[0] == "+" for f in listed.split(",") if f.strip()[:1] in ("+", "-")}


def _host_has_avx2() -> bool:
    return bool(target_features().get("avx2", False))


def _host_has_vnni() -> bool:
    """The host has ``vpdpbusd`` on 256-bit vectors (AVX-VNNI, or AVX512-VNNI with AVX512-VL)."""
    if not _host_has_avx2():
        return False
    f = target_features()
    return bool(f.get("avxvnni", False) or (f.get("avx512vnni", False) and f.get("avx512vl", False)))


def _host_has_all(*features) -> bool:
    """The host has AVX2 and every one of the LLVM ``features``."""
    if not _host_has_avx2():
        return False
    f = target_features()
    return all(f.get(x, False) for x in features)


def _host_has_avx512() -> bool:
    """The host runs 512-bit float vectors natively (AVX-512 F with DQ, BW and VL, as every AVX-512 core since
    Skylake-SP has): the blocked float32 products of ``_panels`` keep 16 of them as accumulators."""
    return _host_has_all("avx512f", "avx512dq", "avx512bw", "avx512vl")


def _host_has_vnni512() -> bool:
    """The host has ``vpdpbusd`` on 512-bit vectors (AVX512-VNNI with AVX-512 F, BW and VL)."""
    return _host_has_all("avx512vnni", "avx512f", "avx512bw", "avx512vl")


AVX2 = _host_has_avx2()
AVX512 = _host_has_avx512()
VNNI = _host_has_vnni()
VNNI512 = _host_has_vnni512()
AVX512F = _host_has_all("avx512f")  # onnxruntime's MLAS then takes its AVX-512 kernels

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V32I8 = ir.VectorType(_I8, 32)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)
_V32I32 = ir.VectorType(_I32, 32)
_V8F = ir.VectorType(_F32, 8)
_V64I8 = ir.VectorType(_I8, 64)
_V16I32 = ir.VectorType(_I32, 16)
_V16F = ir.VectorType(_F32, 16)


def _splat(ty, v):
    return ir.Constant(ty, [ir.Constant(ty.element, v)] * ty.count)


def _fn(builder, name, ret, args):
    mod = builder.module
    f = mod.globals.get(name)
    return f if f is not None else ir.Function(mod, ir.FunctionType(ret, args), name)


def _shuffle(builder, a, b, idx):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _broadcast(builder, s):
    v = builder.insert_element(ir.Constant(_V8F, None), s, ir.Constant(_I32, 0))
    return _shuffle(builder, v, ir.Constant(_V8F, None), [0] * 8)


class _Emitter:
    """The IR of one call of a ``_make`` intrinsic: ``codegen``'s context, builder and arguments with the
    factory's flags.  The constructor emits the prologue (array pointers, row pointers, accumulator slots);
    ``emit`` the loops over column groups, each group through ``run``."""

    def __init__(self, context, builder, sig, args, has_zp, portable, vnni, rows, groups, wide=False):
        self.context, self.builder, self.sig, self.args = context, builder, sig, args
        self.has_zp, self.portable, self.vnni, self.rows, self.groups = has_zp, portable, vnni, rows, groups
        self.wide = wide
        qi_a = self.arr(0)
        shape = cgutils.unpack_tuple(builder, qi_a.shape, 4)
        self.nb, self.nj = nb, nj = shape[1], shape[2]
        self.intp = nb.type
        self.qp, self.sp = qi_a.data, self.arr(5).data
        if has_zp:
            self.zp_ptr = self.arr(4).data
        else:
            self.zdef = _broadcast(builder, args[4])  # the ``_OrtEmitter`` kernels' zero; ``_make``'s take zero terms
        self.aps, self.asps, self.ssps, self.ops_ = [self.row_ptrs(k) for k in (1, 2, 3, 6)]
        self.c4, self.c8 = c4, c8 = self.const(4), self.const(8)
        self.m15, self.four = _splat(_V32I8, 15), _splat(_V32I8, 4)
        self.accp = [[cgutils.alloca_once(builder, _V8F) for _ in range(rows)] for _ in range(groups)]
        self.s32p = [[cgutils.alloca_once(builder, _V8I32) for _ in range(rows)] for _ in range(groups)]
        self.nq = builder.udiv(nj, c4)
        self.bs = builder.mul(nj, c8)
        if wide:
            self.m15w, self.fourw = _splat(_V64I8, 15), _splat(_V64I8, 4)
            self.accw = [cgutils.alloca_once(builder, _V16F) for _ in range(rows)]
            self.s32w = [cgutils.alloca_once(builder, _V16I32) for _ in range(rows)]

    def arr(self, k):
        return self.context.make_array(self.sig.args[k])(self.context, self.builder, self.args[k])

    def const(self, v):
        return ir.Constant(self.intp, v)

    def row_ptrs(self, k):
        """Row r's data pointer of argument ``k``, for r < rows."""
        builder = self.builder
        a = self.arr(k)
        if self.rows == 1:
            return [a.data]
        width = cgutils.unpack_tuple(builder, a.shape, 2)[1]
        return [builder.gep(a.data, [builder.mul(self.const(r), width)]) for r in range(self.rows)]

    def vload(self, ptr, off, ty, align):
        builder = self.builder
        return builder.load(builder.bitcast(builder.gep(ptr, [off]), ty.as_pointer()), align=align)

    def splat4(self, ap, off):
        """The 4 activations at ``ap[off:off + 4]`` in every 32-bit lane."""
        builder = self.builder
        x = builder.load(builder.bitcast(builder.gep(ap, [off]), _I32.as_pointer()), align=1)
        v = builder.insert_element(ir.Constant(_V8I32, None), x, ir.Constant(_I32, 0))
        return builder.bitcast(_shuffle(builder, v, ir.Constant(_V8I32, None), [0] * 8), _V32I8)

    def codes(self, vec):
        """The vector of codes ``vec``: its low and its high nibbles."""
        builder, m15 = self.builder, self.m15
        w = self.vload(self.qp, builder.mul(vec, self.const(32)), _V32I8, 1)
        return builder.and_(w, m15), builder.and_(builder.lshr(w, self.four), m15)

    def products(self, lo, hi, ap, k):
        """Codes ``lo``/``hi`` against row ``ap``'s activations from ``k``: <16 x i16> pair sums (AVX2)
        or <8 x i32> lane sums (portable)."""
        builder = self.builder
        alo, ahi = self.splat4(ap, k), self.splat4(ap, builder.add(k, self.c4))
        if not self.portable:
            mub = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
            return builder.add(builder.call(mub, [lo, alo]), builder.call(mub, [hi, ahi]))
        p = builder.add(builder.mul(builder.zext(lo, _V32I32), builder.sext(alo, _V32I32)),
                        builder.mul(builder.zext(hi, _V32I32), builder.sext(ahi, _V32I32)))
        parts = [_shuffle(builder, p, p, [4 * i + t for i in range(8)]) for t in range(4)]
        return builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))

    def dpbusd(self, acc, lo, hi, ap, k):
        """``acc`` plus the code-by-activation dots, four products per 32-bit lane added in one
        ``vpdpbusd`` per nibble half (the same exact integers as the pair sums)."""
        builder = self.builder
        dp = _fn(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [_V8I32, _V8I32, _V8I32])
        alo = builder.bitcast(self.splat4(ap, k), _V8I32)
        ahi = builder.bitcast(self.splat4(ap, builder.add(k, self.c4)), _V8I32)
        acc = builder.call(dp, [acc, builder.bitcast(lo, _V8I32), alo])
        return builder.call(dp, [acc, builder.bitcast(hi, _V8I32), ahi])

    def widen(self, s):
        if self.portable:
            return s
        builder = self.builder
        mwd = _fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
        return builder.call(mwd, [s, _splat(_V16I16, 1)])

    def emit(self):
        """Column groups [g0, g1): ``groups`` of them side by side while that many remain, then one at a time."""
        builder, groups, const = self.builder, self.groups, self.const
        g0, g1 = self.args[7], self.args[8]
        if self.wide:  # two groups per 512-bit vector, then the odd one out on the 256-bit path
            pairs = builder.sdiv(builder.sub(g1, g0), const(2))
            long_k = builder.icmp_signed(">=", self.nb, const(WIDE_MIN_BLOCKS))
            pairs = builder.select(long_k, pairs, const(0))
            with cgutils.for_range(builder, pairs, intp=self.intp) as lt:
                self.run_wide(builder.add(g0, builder.mul(lt.index, const(2))))
            g0 = builder.add(g0, builder.mul(pairs, const(2)))
        full = builder.sdiv(builder.sub(g1, g0), const(groups)) if groups > 1 else None
        tail0 = g0
        if groups > 1:
            with cgutils.for_range(builder, full, intp=self.intp) as lt:
                gb = builder.add(g0, builder.mul(lt.index, const(groups)))
                self.run([builder.add(gb, const(gi)) for gi in range(groups)])
            tail0 = builder.add(g0, builder.mul(full, const(groups)))
        with cgutils.for_range_slice(builder, tail0, g1, const(1), intp=self.intp) as (g, _):
            self.run([g])

    def run(self, gs):
        """The column groups ``gs`` (IR indices) through every block: one accumulator chain each."""
        builder, rows, accp, c8 = self.builder, self.rows, self.accp, self.c8
        G = len(gs)
        for gi in range(G):
            for r in range(rows):
                builder.store(_splat(_V8F, 0.0), accp[gi][r])
        with cgutils.for_range(builder, self.nb, intp=self.intp) as lb:
            self.block(gs, lb.index)
        for gi in range(G):
            for r in range(rows):
                optr = builder.bitcast(builder.gep(self.ops_[r], [builder.mul(gs[gi], c8)]), _V8F.as_pointer())
                builder.store(builder.load(accp[gi][r]), optr, align=4)

    def start(self, r, blk, ty):
        """Row ``r``'s integer sum at the start of block ``blk``: 0, or its zero term without zero points."""
        if self.has_zp:
            return _splat(ty, 0)
        builder = self.builder
        v = builder.insert_element(ir.Constant(ty, None), builder.load(builder.gep(self.ssps[r], [blk])),
                                   ir.Constant(_I32, 0))
        return _shuffle(builder, v, ir.Constant(ty, None), [0] * ty.count)

    def block(self, gs, blk):
        """Block ``blk`` of the column groups ``gs``: the exact integer dots, then the float update."""
        builder, nb, nj = self.builder, self.nb, self.nj
        for r in range(self.rows):
            s0 = self.start(r, blk, _V8I32)
            for gi in range(len(gs)):
                builder.store(s0, self.s32p[gi][r])
        vbase = [builder.mul(builder.add(builder.mul(g, nb), blk), nj) for g in gs]
        kb = builder.mul(blk, self.bs)
        if self.vnni:
            self.dots_vnni(vbase, kb)
        else:
            self.dots_pairs(vbase, kb)
        self.update(gs, blk)

    def dots_vnni(self, vbase, kb):
        """The block's dots by ``vpdpbusd``, one vector of codes at a time."""
        builder, c8, s32p = self.builder, self.c8, self.s32p
        with cgutils.for_range(builder, self.nj, intp=self.intp) as lj:
            j = lj.index
            k = builder.add(kb, builder.mul(j, c8))
            for gi in range(len(vbase)):
                lo, hi = self.codes(builder.add(vbase[gi], j))
                for r in range(self.rows):
                    s32 = self.dpbusd(builder.load(s32p[gi][r]), lo, hi, self.aps[r], k)
                    builder.store(s32, s32p[gi][r])

    def dots_pairs(self, vbase, kb):
        """The block's dots by pair sums (or the portable lane sums), widened to 32 bits every 4 vectors."""
        builder, rows, c4, c8, s32p, aps = self.builder, self.rows, self.c4, self.c8, self.s32p, self.aps
        nq, const = self.nq, self.const
        with cgutils.for_range(builder, nq, intp=self.intp) as lq:  # 4 vectors, widened once
            j0 = builder.mul(lq.index, c4)
            for gi in range(len(vbase)):
                sums = [None] * rows
                for u in range(4):
                    j = builder.add(j0, const(u))
                    lo, hi = self.codes(builder.add(vbase[gi], j))
                    k = builder.add(kb, builder.mul(j, c8))
                    for r in range(rows):
                        d = self.products(lo, hi, aps[r], k)
                        sums[r] = d if sums[r] is None else builder.add(sums[r], d)
                for r in range(rows):
                    builder.store(builder.add(builder.load(s32p[gi][r]), self.widen(sums[r])), s32p[gi][r])
        with cgutils.for_range_slice(builder, builder.mul(nq, c4), self.nj, const(1), intp=self.intp) as (j, _):
            k = builder.add(kb, builder.mul(j, c8))
            for gi in range(len(vbase)):
                lo, hi = self.codes(builder.add(vbase[gi], j))
                for r in range(rows):
                    d = self.products(lo, hi, aps[r], k)
                    builder.store(builder.add(builder.load(s32p[gi][r]), self.widen(d)), s32p[gi][r])

    # -- two column groups per 512-bit vector (``wide``): per lane the same integers and the same float
    # operations in the same order as two groups on the 256-bit path, in half the instructions

    def run_wide(self, g):
        """Column groups ``g`` and ``g + 1`` through every block, lanes 0-7 the first, 8-15 the second."""
        builder, c8 = self.builder, self.c8
        for r in range(self.rows):
            builder.store(_splat(_V16F, 0.0), self.accw[r])
        with cgutils.for_range(builder, self.nb, intp=self.intp) as lb:
            self.block_wide(g, lb.index)
        for r in range(self.rows):  # columns 8g .. 8g + 15: both groups, contiguous
            optr = builder.gep(self.ops_[r], [builder.mul(g, c8)])
            builder.store(builder.load(self.accw[r]), builder.bitcast(optr, _V16F.as_pointer()), align=4)

    def pair(self, ptr, off0, off1, ty, wide_ty, align):
        """The vectors of ``ty`` at ``ptr[off0]`` and ``ptr[off1]`` as one ``wide_ty``."""
        a, b = self.vload(ptr, off0, ty, align), self.vload(ptr, off1, ty, align)
        return _shuffle(self.builder, a, b, list(range(wide_ty.count)))

    def splat16(self, ap, off):
        """The 4 activations at ``ap[off:off + 4]`` in every 32-bit lane of a 512-bit vector."""
        builder = self.builder
        x = builder.load(builder.bitcast(builder.gep(ap, [off]), _I32.as_pointer()), align=1)
        v = builder.insert_element(ir.Constant(_V16I32, None), x, ir.Constant(_I32, 0))
        return _shuffle(builder, v, ir.Constant(_V16I32, None), [0] * 16)

    def block_wide(self, g, blk):
        """Block ``blk`` of groups ``g`` and ``g + 1``: the dots by 512-bit ``vpdpbusd``, then the float update."""
        builder, nb, nj, c8, const = self.builder, self.nb, self.nj, self.c8, self.const
        for r in range(self.rows):
            builder.store(self.start(r, blk, _V16I32), self.s32w[r])
        g1 = builder.add(g, const(1))
        vb0 = builder.mul(builder.add(builder.mul(g, nb), blk), nj)
        vb1 = builder.mul(builder.add(builder.mul(g1, nb), blk), nj)
        kb = builder.mul(blk, self.bs)
        dp = _fn(builder, "llvm.x86.avx512.vpdpbusd.512", _V16I32, [_V16I32, _V16I32, _V16I32])
        c32 = const(32)
        with cgutils.for_range(builder, nj, intp=self.intp) as lj:
            j = lj.index
            k = builder.add(kb, builder.mul(j, c8))
            w = self.pair(self.qp, builder.mul(builder.add(vb0, j), c32), builder.mul(builder.add(vb1, j), c32),
                          _V32I8, _V64I8, 1)
            lo = builder.bitcast(builder.and_(w, self.m15w), _V16I32)
            hi = builder.bitcast(builder.and_(builder.lshr(w, self.fourw), self.m15w), _V16I32)
            for r in range(self.rows):
                acc = builder.call(dp, [builder.load(self.s32w[r]), lo, self.splat16(self.aps[r], k)])
                acc = builder.call(dp, [acc, hi, self.splat16(self.aps[r], builder.add(k, self.c4))])
                builder.store(acc, self.s32w[r])
        col0 = builder.mul(builder.add(builder.mul(g, nb), blk), c8)
        col1 = builder.mul(builder.add(builder.mul(g1, nb), blk), c8)
        wsc = self.pair(self.sp, col0, col1, _V8F, _V16F, 4)
        z = self.pair(self.zp_ptr, col0, col1, _V8F, _V16F, 4) if self.has_zp else None
        for r in range(self.rows):
            dot = builder.sitofp(builder.load(self.s32w[r]), _V16F)
            a_s = _shuffle(builder, _broadcast(builder, builder.load(builder.gep(self.asps[r], [blk]))),
                           ir.Constant(_V8F, None), [0] * 16)
            if z is not None:
                a_sum = _shuffle(builder, _broadcast(builder, builder.load(builder.gep(self.ssps[r], [blk]))),
                                 ir.Constant(_V8F, None), [0] * 16)
                dot = builder.fsub(dot, builder.fmul(z, a_sum))
            term = builder.fmul(builder.fmul(a_s, wsc), dot)
            builder.store(builder.fadd(builder.load(self.accw[r]), term), self.accw[r])

    def update(self, gs, blk):
        """``acc += (ascale[blk] * scale) * (dot - zero * asum[blk])`` for block ``blk`` of the groups ``gs``
        (without zero points the integer sum already holds the zero term)."""
        builder, nb, c8, accp = self.builder, self.nb, self.c8, self.accp
        for gi in range(len(gs)):
            col = builder.mul(builder.add(builder.mul(gs[gi], nb), blk), c8)
            wsc = self.vload(self.sp, col, _V8F, 4)
            z = self.vload(self.zp_ptr, col, _V8F, 4) if self.has_zp else None
            for r in range(self.rows):
                dot = builder.sitofp(builder.load(self.s32p[gi][r]), _V8F)
                a_s = _broadcast(builder, builder.load(builder.gep(self.asps[r], [blk])))
                if z is not None:
                    a_sum = _broadcast(builder, builder.load(builder.gep(self.ssps[r], [blk])))
                    dot = builder.fsub(dot, builder.fmul(z, a_sum))
                term = builder.fmul(builder.fmul(a_s, wsc), dot)
                builder.store(builder.fadd(builder.load(accp[gi][r]), term), accp[gi][r])


class _OrtEmitter(_Emitter):
    """onnxruntime's accumulation order (MLAS's int8 kernels for blocks of 32, signed or unsigned codes; see
    ``contrib_quant.gemv_q4i8_mlas``): per row and column eight float lane accumulators, each a chain of fused
    multiply-adds over the blocks, folded into the output at the end.  ``quads``: MLAS's AVX-512 kernels, 16 lanes
    over 4 blocks at a time (``quad``) added into the eight before the blocks past a multiple of 4."""

    def __init__(self, context, builder, sig, args, has_zp, portable, vnni, rows, signed, quads=False, share=False):
        super().__init__(context, builder, sig, args, has_zp, portable, vnni, rows, 1)
        self.signed = signed
        self.pairs = not (signed and has_zp)  # MLAS's zero-point kernel updates one block at a time
        self.quads = quads  # MLAS's AVX-512 kernels: 16 lanes over 4 blocks at a time, then single blocks
        self.lanes = [[cgutils.alloca_once(builder, _V8F) for _ in range(8)] for _ in range(rows)]
        if quads:
            self.lanes16 = [[cgutils.alloca_once(builder, _V8F) for _ in range(16)] for _ in range(rows)]
        self.fma = _fn(builder, "llvm.fma.v8f32", _V8F, [_V8F, _V8F, _V8F])
        self.share = share  # the zero points' share and the bias taken in the same pass (``share_setup``)
        if share:
            self.share_setup()

    def share_setup(self):
        """The share's operands (arguments 10-13: ``zft``, ``has_zp``, ``bias``, ``has_bias``; ``asum`` then holds
        the blocks' ``f32(ascale * sum)``): a chain per row and column, ``fma(absum[blk], f32(-(scale * zero)),
        chain)`` over the blocks in order from 0, and the output ``chain + (fold + bias)``, as
        ``contrib_quant.ort_zero_point_rows`` adds them after the product.  Without zero points the zero is the
        scalar ``zdef`` (a slot of it, read where the table would be); without a bias, -0.0 (``x + -0.0`` is ``x``
        for every x, -0.0 and NaN included)."""
        builder, context = self.builder, self.context
        self.zft_ptr = self.arr(10).data
        self.share_zp = builder.icmp_signed("!=", context.cast(builder, self.args[11], self.sig.args[11],
                                                               types.intp), self.const(0))
        self.zslot = cgutils.alloca_once(builder, _V8F)
        builder.store(self.zdef, self.zslot)
        self.bias_ptr = self.arr(12).data
        self.share_bias = builder.icmp_signed("!=", context.cast(builder, self.args[13], self.sig.args[13],
                                                                 types.intp), self.const(0))
        self.nzslot = cgutils.alloca_once(builder, _V8F)
        builder.store(_splat(_V8F, -0.0), self.nzslot)
        self.chains = [cgutils.alloca_once(builder, _V8F) for _ in range(self.rows)]

    def share_block(self, col, blk):
        """Every row's share chain through block ``blk`` (its scales and zero points at ``col``)."""
        builder = self.builder
        zp = builder.bitcast(builder.gep(self.zft_ptr, [col]), _V8F.as_pointer())
        z = builder.load(builder.select(self.share_zp, zp, self.zslot), align=4)
        f = builder.fneg(builder.fmul(self.vload(self.sp, col, _V8F, 4), z))
        for r in range(self.rows):
            a = _broadcast(builder, builder.load(builder.gep(self.ssps[r], [blk])))
            builder.store(builder.call(self.fma, [a, f, builder.load(self.chains[r])]), self.chains[r])

    def emit(self):
        builder = self.builder
        g0, g1 = self.args[7], self.args[8]
        with cgutils.for_range_slice(builder, g0, g1, self.const(1), intp=self.intp) as (g, _):
            self.run([g])

    def half(self, c, ap, k):
        """<8 x i32>: per column lane, its 4 codes ``c`` (one nibble half) dotted with ``ap[k:k + 4]``."""
        builder = self.builder
        a = self.splat4(ap, k)
        if self.vnni:
            dp = _fn(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [_V8I32, _V8I32, _V8I32])
            return builder.call(dp, [_splat(_V8I32, 0), builder.bitcast(c, _V8I32), builder.bitcast(a, _V8I32)])
        if not self.portable:
            mub = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
            return self.widen(builder.call(mub, [c, a]))
        p = builder.mul(builder.zext(c, _V32I32), builder.sext(a, _V32I32))
        parts = [_shuffle(builder, p, p, [4 * i + t for i in range(8)]) for t in range(4)]
        return builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))

    def both(self, lo, hi, ap, k):
        """<8 x i32>: per column lane, its 8 codes dotted with ``ap[k:k + 8]``; on AVX2 the two halves' pair sums
        are added in 16 bits before one widening (at most 4 * 15 * 127 = 7620: exact)."""
        if self.vnni or self.portable:
            return self.builder.add(self.half(lo, ap, k), self.half(hi, ap, self.builder.add(k, self.c4)))
        return self.widen(self.products(lo, hi, ap, k))

    def group_sum(self, r, blk, q, width):
        """The sum of row r's activations over the ``width`` (4 or 8) of block ``blk`` from group ``q`` (of 4),
        broadcast: ``asum`` holds the sums of every 4 activations in order."""
        builder = self.builder
        i = builder.add(builder.mul(blk, self.c8), self.const(q))
        s = builder.load(builder.gep(self.ssps[r], [i]))
        if width == 8:
            s = builder.fadd(s, builder.load(builder.gep(self.ssps[r], [builder.add(i, self.const(1))])))
        return _broadcast(builder, s)

    def scale(self, g, blk, r):
        """f32(ascale[blk] * scale) per column: the combined scale MLAS multiplies once per block."""
        builder = self.builder
        col = builder.mul(builder.add(builder.mul(g, self.nb), blk), self.c8)
        wsc = self.vload(self.sp, col, _V8F, 4)
        return builder.fmul(_broadcast(builder, builder.load(builder.gep(self.asps[r], [blk]))), wsc), col

    def zero(self, col):
        return self.vload(self.zp_ptr, col, _V8F, 4) if self.has_zp else self.zdef

    def lane(self, r, L, v, s):
        builder = self.builder
        builder.store(builder.call(self.fma, [v, s, builder.load(self.lanes[r][L])]), self.lanes[r][L])

    def value(self, d, r, blk, q, width, z):
        """An exact integer lane sum as float32, with the zero point's share taken out when codes are signed."""
        builder = self.builder
        v = builder.sitofp(d, _V8F)
        if self.signed:
            v = builder.fsub(v, builder.fmul(z, self.group_sum(r, blk, q, width)))
        return v

    def setup(self, g, blk):
        """Block ``blk`` of group ``g``: its first code vector, its first activation, each row's (combined scale,
        scale offset), and the zero points when codes are signed."""
        builder = self.builder
        vb = builder.mul(builder.add(builder.mul(g, self.nb), blk), self.nj)
        sc = [self.scale(g, blk, r) for r in range(self.rows)]
        if self.share:
            self.share_block(sc[0][1], blk)
        return vb, builder.mul(blk, self.bs), sc, self.zero(sc[0][1]) if self.signed else None

    def single(self, g, blk):
        """One block, lane L = the 4 products of group L (``vpmaddubsw`` + ``vpmaddwd`` of one 32-byte load)."""
        builder = self.builder
        vb, kb, sc, z = self.setup(g, blk)
        for j in range(4):
            lo, hi = self.codes(builder.add(vb, self.const(j)))
            k = builder.add(kb, builder.mul(self.const(j), self.c8))
            for r in range(self.rows):
                s = sc[r][0]
                self.lane(r, 2 * j, self.value(self.half(lo, self.aps[r], k), r, blk, 2 * j, 4, z), s)
                self.lane(r, 2 * j + 1, self.value(self.half(hi, self.aps[r], builder.add(k, self.c4)), r, blk,
                                                   2 * j + 1, 4, z), s)

    # lane of (block of the pair, vector j) in MLAS's hadd layout of two blocks
    _PAIR = {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3, (0, 2): 4, (0, 3): 5, (1, 2): 6, (1, 3): 7}

    def pair(self, g, blk0):
        """Blocks blk0 and blk0 + 1: lane of (block, vector j) as ``_PAIR``, each the 8 products of a vector."""
        builder = self.builder
        for h in range(2):
            blk = builder.add(blk0, self.const(h))
            vb, kb, sc, z = self.setup(g, blk)
            for j in range(4):
                lo, hi = self.codes(builder.add(vb, self.const(j)))
                k = builder.add(kb, builder.mul(self.const(j), self.c8))
                for r in range(self.rows):
                    d = self.both(lo, hi, self.aps[r], k)
                    self.lane(r, self._PAIR[h, j], self.value(d, r, blk, 2 * j, 8, z), sc[r][0])

    def quad(self, g, blk0):
        """Blocks blk0 .. blk0 + 3 into the 16 lanes of MLAS's AVX-512 layout: a block b's 32 products in groups
        of 4 u = 0..7 (u = 2j for vector j's low half, 2j + 1 for its high half) go to lane
        ``base(b) + 4 (u // 4) + u % 2`` (base 0, 8, 2, 10), two groups each, their exact integer sum times the
        block's combined scale added by one fused multiply-add."""
        builder = self.builder
        for b in range(4):
            blk = builder.add(blk0, self.const(b))
            vb, kb, sc, _ = self.setup(g, blk)
            base = (0, 8, 2, 10)[b]
            sums = [[[None, None] for _ in range(2)] for _ in range(self.rows)]
            for j in range(4):
                lo, hi = self.codes(builder.add(vb, self.const(j)))
                k = builder.add(kb, builder.mul(self.const(j), self.c8))
                for r in range(self.rows):
                    for t, (c, kk) in enumerate(((lo, k), (hi, builder.add(k, self.c4)))):
                        d = self.half(c, self.aps[r], kk)
                        old = sums[r][j // 2][t]
                        sums[r][j // 2][t] = d if old is None else builder.add(old, d)
            for r in range(self.rows):
                for h in range(2):
                    for t in range(2):
                        L = base + 4 * h + t
                        v = builder.sitofp(sums[r][h][t], _V8F)
                        builder.store(builder.call(self.fma, [v, sc[r][0], builder.load(self.lanes16[r][L])]),
                                      self.lanes16[r][L])

    def run(self, gs):
        builder, const = self.builder, self.const
        g = gs[0]
        for r in range(self.rows):
            for L in range(8):
                builder.store(_splat(_V8F, 0.0), self.lanes[r][L])
            if self.share:
                builder.store(_splat(_V8F, 0.0), self.chains[r])
        if self.quads:
            for r in range(self.rows):
                for L in range(16):
                    builder.store(_splat(_V8F, 0.0), self.lanes16[r][L])
            nquads = builder.sdiv(self.nb, const(4))
            with cgutils.for_range(builder, nquads, intp=self.intp) as lq:
                self.quad(g, builder.mul(lq.index, const(4)))
            for r in range(self.rows):  # the two 256-bit halves added, lane by lane
                for L in range(8):
                    builder.store(builder.fadd(builder.load(self.lanes16[r][L]), builder.load(self.lanes16[r][L + 8])),
                                  self.lanes[r][L])
            with cgutils.for_range_slice(builder, builder.mul(nquads, const(4)), self.nb, const(1),
                                         intp=self.intp) as (blk, _):
                self.single(g, blk)
        elif self.pairs:
            npairs = builder.sdiv(self.nb, const(2))
            with cgutils.for_range(builder, npairs, intp=self.intp) as lp:
                self.pair(g, builder.mul(lp.index, const(2)))
            odd = builder.icmp_signed("!=", builder.mul(npairs, const(2)), self.nb)
            with builder.if_then(odd):
                self.single(g, builder.sub(self.nb, const(1)))
        else:
            with cgutils.for_range(builder, self.nb, intp=self.intp) as lb:
                self.single(g, lb.index)
        n4 = self.args[9]
        cols = builder.add(_broadcast_i(builder, builder.trunc(builder.mul(g, self.c8), _I32)),
                           ir.Constant(_V8I32, list(range(8))))
        full = builder.icmp_signed("<", cols, _broadcast_i(builder, builder.trunc(n4, _I32)))
        for r in range(self.rows):
            x = [builder.load(self.lanes[r][L]) for L in range(8)]
            fold = builder.fadd(builder.fadd(builder.fadd(builder.fadd(x[0], x[1]), x[2]), x[3]),
                                builder.fadd(builder.fadd(builder.fadd(x[4], x[5]), x[6]), x[7]))
            hsum = builder.fadd(builder.fadd(builder.fadd(x[0], x[4]), builder.fadd(x[2], x[6])),
                                builder.fadd(builder.fadd(x[1], x[5]), builder.fadd(x[3], x[7])))
            res = builder.select(full, fold, hsum)
            if self.share:
                bp = builder.bitcast(builder.gep(self.bias_ptr, [builder.mul(g, self.c8)]), _V8F.as_pointer())
                b = builder.load(builder.select(self.share_bias, bp, self.nzslot), align=4)
                res = builder.fadd(builder.load(self.chains[r]), builder.fadd(res, b))
            optr = builder.bitcast(builder.gep(self.ops_[r], [builder.mul(g, self.c8)]), _V8F.as_pointer())
            builder.store(res, optr, align=4)


def _broadcast_i(builder, s):
    v = builder.insert_element(ir.Constant(_V8I32, None), s, ir.Constant(_I32, 0))
    return _shuffle(builder, v, ir.Constant(_V8I32, None), [0] * 8)


def _operands_fit(has_zp, rows, qi, aq, ascale, asum, zero, sct, out, asum_type=types.float32) -> bool:
    """Whether the array operands of a dot intrinsic have its types: the IR indexes raw data pointers, so
    C-contiguous arrays of these dtypes and ranks only; ``zero`` a float32 scalar, or [G, nb, 8] with ``has_zp``."""
    nd = 1 if rows == 1 else 2
    want = ((qi, types.uint8, 4), (aq, types.int8, nd), (ascale, types.float32, nd),
            (asum, asum_type, nd), (sct, types.float32, 3), (out, types.float32, nd))
    if has_zp:
        want += ((zero, types.float32, 3),)
    elif zero != types.float32:
        return False
    return all(isinstance(t, types.Array) and t.dtype == dt and t.ndim == n and t.layout == "C" for t, dt, n in want)


def _make_ort(has_zp: bool, portable: bool, vnni: bool, rows: int, signed: bool, quads: bool = False):
    def impl(typingctx, qi, aq, ascale, asum, zero, sct, out, g0, g1, n4):
        """As ``_make``'s, with ``asum`` the sums of every 4 activations (``nb * 8`` per row) and ``n4`` the
        columns below which MLAS folds 4 columns at once (N rounded down to 4); the rest it sums one by one."""
        if not (_operands_fit(has_zp, rows, qi, aq, ascale, asum, zero, sct, out)
                and all(isinstance(x, types.Integer) for x in (g0, g1, n4))):
            return None
        sig = types.void(qi, aq, ascale, asum, zero, sct, out, types.intp, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            _OrtEmitter(context, builder, sig, args, has_zp, portable, vnni, rows, signed, quads).emit()
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = (f"dot_q4_ort{'_s' if signed else '_u'}{'4' if quads else ''}{'_zp' if has_zp else ''}"
                     f"{'_portable' if portable else ''}"
                     f"{'_vnni' if vnni else ''}{f'_rows{rows}' if rows > 1 else ''}")
    return intrinsic(impl)


def _make_ort_share(portable: bool, vnni: bool, rows: int):
    def impl(typingctx, qi, aq, ascale, absum, zdef, sct, out, g0, g1, n4, zft, has_zp, bias, has_bias):
        """MLAS's AVX-512 lanes (``_OrtEmitter`` with ``quads``), unsigned codes, with the zero points' share and
        the bias in the same pass: ``absum`` each row's blocks' ``f32(ascale * sum)`` ([rows, nb], or [nb] for
        one row), ``zdef`` the zero without zero points, ``zft`` [G, nb, 8] the zero points where ``has_zp``,
        ``bias`` at least ``8 * g1`` long where ``has_bias``."""
        if not (_operands_fit(False, rows, qi, aq, ascale, absum, zdef, sct, out)
                and all(isinstance(x, types.Integer) for x in (g0, g1, n4))
                and all(isinstance(x, (types.Integer, types.Boolean)) for x in (has_zp, has_bias))
                and all(isinstance(t, types.Array) and t.dtype == types.float32 and t.ndim == n and t.layout == "C"
                        for t, n in ((zft, 3), (bias, 1)))):
            return None
        sig = types.void(qi, aq, ascale, absum, zdef, sct, out, types.intp, types.intp, types.intp, zft, has_zp,
                         bias, has_bias)

        def codegen(context, builder, sig, args):
            _OrtEmitter(context, builder, sig, args, False, portable, vnni, rows, False, True, True).emit()
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = (f"dot_q4_ort_u4_share{'_portable' if portable else ''}{'_vnni' if vnni else ''}"
                     f"{f'_rows{rows}' if rows > 1 else ''}")
    return intrinsic(impl)


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c in float32, rounded once (``llvm.fma.f32``: one instruction where the target has FMA)."""
    if not all(x == types.float32 for x in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        f = _fn(builder, "llvm.fma.f32", _F32, [_F32, _F32, _F32])
        return builder.call(f, args)

    return types.float32(types.float32, types.float32, types.float32), codegen


def _make(has_zp: bool, portable: bool, vnni: bool = False, rows: int = 1, groups: int = 1, wide: bool = False):
    def impl(typingctx, qi, aq, ascale, asum, zero, sct, out, g0, g1):
        """With ``has_zp``: ``asum`` the blocks' activation sums (float32) and ``zero`` the zero points
        [G, nb, 8].  Without: ``asum`` the blocks' zero terms ``- zdef * sum`` (int32) and ``zero`` a float32
        scalar, unused (one signature for both kinds).  With ``rows`` > 1, ``aq``/``ascale``/``asum``/``out``
        have a leading axis of at least ``rows`` rows, which share every load and unpacking of the codes."""
        if not _operands_fit(has_zp, rows, qi, aq, ascale, asum, zero, sct, out,
                             types.float32 if has_zp else types.int32):
            return None
        if not (isinstance(g0, types.Integer) and isinstance(g1, types.Integer)):
            return None
        sig = types.void(qi, aq, ascale, asum, zero, sct, out, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            _Emitter(context, builder, sig, args, has_zp, portable, vnni, rows, groups, wide).emit()
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = (f"dot_q4{'_zp' if has_zp else ''}{'_portable' if portable else ''}{'_vnni' if vnni else ''}"
                     f"{f'_rows{rows}' if rows > 1 else ''}{f'_g{groups}' if groups > 1 else ''}{'_w' if wide else ''}")
    return intrinsic(impl)


ROWS = 8  # rows of A that ``dot_q4_rows`` takes through one pass over the codes
# The 512-bit rows pass runs from this many blocks along K: 8 rows of 24 weights of 4864x896 (152 blocks of 32)
# took 7.8 ms on one thread against 10.8 on 256-bit vectors, but 896x9728 (28 blocks) 17.6 against 15.5.
WIDE_MIN_BLOCKS = 64
GROUPS = 4  # column groups that one-row ``dot_q4`` runs side by side (one accumulator chain each)
dot_q4 = _make(False, not AVX2, VNNI, 1, GROUPS)
dot_q4_zp = _make(True, not AVX2, VNNI, 1, GROUPS)
dot_q4_rows = _make(False, not AVX2, VNNI, ROWS, 1, VNNI512)
dot_q4_zp_rows = _make(True, not AVX2, VNNI, ROWS, 1, VNNI512)
# The other forms, for tests: the pair sums on a VNNI host (the portable IR where the host has no AVX2), the
# portable several-row pass.
dot_q4_avx2 = _make(False, not AVX2)
dot_q4_zp_avx2 = _make(True, not AVX2)
dot_q4_rows_avx2 = _make(False, not AVX2, False, ROWS)
dot_q4_rows_portable = _make(False, True, False, ROWS)
dot_q4_rows_vnni256 = _make(False, not AVX2, VNNI, ROWS)
dot_q4_zp_rows_vnni256 = _make(True, not AVX2, VNNI, ROWS)
dot_q4_portable = _make(False, True)
dot_q4_zp_portable = _make(True, True)

# onnxruntime's order (``_OrtEmitter``), blocks of 32 only: one row with signed codes (MLAS's one-row kernel), one
# row or ``ORT_ROWS`` rows with unsigned codes (its several-row kernel; the zero points then come in through
# ``contrib_quant.ort_zero_point_rows``).
ORT_ROWS = 4
# MLAS's AVX-512 order (``quads``) keeps 16 float lanes per column: two rows per pass keep them in registers (per
# row of 896x4864, 0.040-0.042 ms on one thread against 0.045-0.051 for four rows; 512-bit vectors over two
# column groups gained under 5% on this AVX-512 host, which splits them in two, and were not kept).
ORT4_ROWS = 2
dot_q4_ort_s = _make_ort(False, not AVX2, VNNI, 1, True)
dot_q4_ort_s_zp = _make_ort(True, not AVX2, VNNI, 1, True)
dot_q4_ort_u = _make_ort(False, not AVX2, VNNI, 1, False)
dot_q4_ort_u_rows = _make_ort(False, not AVX2, VNNI, ORT_ROWS, False)
dot_q4_ort_s_portable = _make_ort(False, True, False, 1, True)
dot_q4_ort_s_zp_portable = _make_ort(True, True, False, 1, True)
dot_q4_ort_u_rows_portable = _make_ort(False, True, False, ORT_ROWS, False)
# MLAS's AVX-512 order (``_OrtEmitter.quad``): unsigned codes on every row.  One row takes the zero points' share
# and the bias in the same pass (``_make_ort_share``: per row of 896x4864, 0.07 ms with the share after, 0.06 with
# it in the pass, own order 0.06); several rows take them after, through ``contrib_quant.ort_zero_point_rows``
# (two rows' 16 lanes fill the 32 vector registers: the share's chains in the pass spilled them, 64 rows 1.7 ->
# 2.9 ms).
dot_q4_ort_u4 = _make_ort_share(not AVX2, VNNI, 1)
dot_q4_ort_u4_rows = _make_ort(False, not AVX2, VNNI, ORT4_ROWS, False, True)
dot_q4_ort_u4_portable = _make_ort_share(True, False, 1)
dot_q4_ort_u4_rows_portable = _make_ort(False, True, False, ORT4_ROWS, False, True)
