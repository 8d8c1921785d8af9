"""Integer dot products that Numba's loops cannot express: 4-bit weight codes against int8 activations.

``dot_q4`` and ``dot_q4_zp`` are Numba intrinsics: they emit LLVM IR directly.  On a host with AVX2 the IR is
``vpmaddubsw``/``vpmaddwd``/``vphaddd`` (32 codes-by-activations products summed in two instructions, where
a Numba loop converts every code to float first: measured 1.45-1.7x slower on one thread).  Elsewhere they
emit portable vector IR (widen, multiply, add) that any LLVM target compiles.  Both forms compute the same
exact integer block dots and then the same float operations in the same order, so their results are
identical bit for bit; ``dot_q4_portable`` / ``dot_q4_zp_portable`` always emit the portable IR, so tests
check that on any host.

Layout (see ``contrib_quant.int4_layout``): output columns in groups of 8; for group ``g``, block ``blk`` and
16-byte chunk ``c`` of a column's block, ``qi[g, blk, c, p]`` holds 32 bytes: column ``8g + p``'s chunk, then
column ``8g + p + 4``'s (p = 0..3), so that three horizontal adds leave the 8 column sums in column order.
Activations: ``alo[blk, c]`` / ``ahi[blk, c]`` are the block's even / odd int8 activations of chunk ``c``,
16 bytes repeated twice (low nibbles pair with even k, high nibbles with odd k).  Per block and column the
float result is ``out += (ascale[blk] * scale) * (dot - zero * asum[blk])``, accumulated over blocks in order;
zero is ``zdef`` or ``zf[blk, col]``.  Codes are 0..15 and activations -127..127, so ``vpmaddubsw``'s
16-bit pair sums (at most 3810) never saturate.

Invariant: the kernels read ``qi[g0:g1]`` and write ``out[8*g0:8*g1]`` only; callers check the shapes.
"""
from __future__ import annotations

import llvmlite.binding as _llb
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

__all__ = ["AVX2", "dot_q4", "dot_q4_zp"]


def _host_has_avx2() -> bool:
    if numba.config.CPU_NAME not in (None, "host"):  # a portable cache (NUMBA_CPU_NAME=generic, ...)
        return False
    try:
        return bool(_llb.get_host_cpu_features().get("avx2", False))
    except Exception:  # pragma: no cover - a host LLVM cannot describe
        return False


AVX2 = _host_has_avx2()

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V32I8 = ir.VectorType(_I8, 32)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)
_V32I32 = ir.VectorType(_I32, 32)
_V8F = ir.VectorType(_F32, 8)


def _splat(ty, v):
    return ir.Constant(ty, [ir.Constant(ty.element, v)] * ty.count)


def _fn(builder, name, ret, args):
    mod = builder.module
    f = mod.globals.get(name)
    return f if f is not None else ir.Function(mod, ir.FunctionType(ret, args), name)


def _shuffle(builder, a, b, idx):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _pair_dots(builder, lo, hi, alo, ahi, portable):
    """<8 x i32>: lane i = sum of the products of bytes 4i..4i+3 (codes lo/hi by activations alo/ahi)."""
    if not portable:
        mub = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
        mwd = _fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
        s16 = builder.add(builder.call(mub, [lo, alo]), builder.call(mub, [hi, ahi]))
        return builder.call(mwd, [s16, _splat(_V16I16, 1)])
    p = builder.add(builder.mul(builder.zext(lo, _V32I32), builder.sext(alo, _V32I32)),
                    builder.mul(builder.zext(hi, _V32I32), builder.sext(ahi, _V32I32)))
    parts = [_shuffle(builder, p, p, [4 * i + t for i in range(8)]) for t in range(4)]
    return builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))


def _hadd(builder, x, y, portable):
    """AVX2 ``vphaddd``: [x0+x1, x2+x3, y0+y1, y2+y3, x4+x5, x6+x7, y4+y5, y6+y7]."""
    if not portable:
        return builder.call(_fn(builder, "llvm.x86.avx2.phadd.d", _V8I32, [_V8I32, _V8I32]), [x, y])
    ev = _shuffle(builder, x, y, [0, 2, 8, 10, 4, 6, 12, 14])
    od = _shuffle(builder, x, y, [1, 3, 9, 11, 5, 7, 13, 15])
    return builder.add(ev, od)


def _broadcast(builder, s):
    v = builder.insert_element(ir.Constant(_V8F, None), s, ir.Constant(_I32, 0))
    return _shuffle(builder, v, ir.Constant(_V8F, None), [0] * 8)


def _make(has_zp: bool, portable: bool):
    def impl(typingctx, qi, alo, ahi, ascale, asum, zero, sct, out, g0, g1):
        """zero: the default zero point (float32 scalar), or zero points [nb, N8] when ``has_zp``."""
        want = ((qi, types.uint8, 5), (alo, types.int8, 3), (ahi, types.int8, 3), (ascale, types.float32, 1),
                (asum, types.float32, 1), (sct, types.float32, 2), (out, types.float32, 1))
        if has_zp:
            want += ((zero, types.float32, 2),)
        elif zero != types.float32:
            return None
        for t, dt, nd in want:  # the IR indexes raw data pointers: C-contiguous arrays of these types only
            if not (isinstance(t, types.Array) and t.dtype == dt and t.ndim == nd and t.layout == "C"):
                return None
        if not (isinstance(g0, types.Integer) and isinstance(g1, types.Integer)):
            return None
        sig = types.void(qi, alo, ahi, ascale, asum, zero, sct, out, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            arrs = {}
            for k, name in ((0, "qi"), (1, "alo"), (2, "ahi"), (3, "ascale"), (4, "asum"), (6, "sct"), (7, "out")):
                arrs[name] = context.make_array(sig.args[k])(context, builder, args[k])
            qi_a = arrs["qi"]
            shape = cgutils.unpack_tuple(builder, qi_a.shape, 5)
            nb, nc = shape[1], shape[2]
            intp = nb.type
            n8 = cgutils.unpack_tuple(builder, arrs["sct"].shape, 2)[1]
            qp, lp, hp = qi_a.data, arrs["alo"].data, arrs["ahi"].data
            asp, ssp, sp, op = arrs["ascale"].data, arrs["asum"].data, arrs["sct"].data, arrs["out"].data
            if has_zp:
                zp_ptr = context.make_array(sig.args[5])(context, builder, args[5]).data
            else:
                zdef = _broadcast(builder, args[5])
            g0_, g1_ = args[8], args[9]
            c8 = ir.Constant(intp, 8)
            m15, four = _splat(_V32I8, 15), _splat(_V32I8, 4)

            def vload(ptr, off, ty, align):
                return builder.load(builder.bitcast(builder.gep(ptr, [off]), ty.as_pointer()), align=align)

            accp = cgutils.alloca_once(builder, _V8F)
            sums = [cgutils.alloca_once(builder, _V8I32) for _ in range(4)]
            with cgutils.for_range_slice(builder, g0_, g1_, ir.Constant(intp, 1), intp=intp) as (g, _):
                builder.store(_splat(_V8F, 0.0), accp)
                with cgutils.for_range(builder, nb, intp=intp) as lb:
                    blk = lb.index
                    for s in sums:
                        builder.store(_splat(_V8I32, 0), s)
                    with cgutils.for_range(builder, nc, intp=intp) as lc:
                        chunk = builder.add(builder.mul(blk, nc), lc.index)
                        aoff = builder.mul(chunk, ir.Constant(intp, 32))
                        av_lo = vload(lp, aoff, _V32I8, 1)
                        av_hi = vload(hp, aoff, _V32I8, 1)
                        base = builder.mul(builder.add(builder.mul(builder.mul(g, nb), nc), chunk),
                                           ir.Constant(intp, 128))
                        for p in range(4):
                            w = vload(qp, builder.add(base, ir.Constant(intp, 32 * p)), _V32I8, 1)
                            d = _pair_dots(builder, builder.and_(w, m15), builder.and_(builder.lshr(w, four), m15),
                                           av_lo, av_hi, portable)
                            builder.store(builder.add(builder.load(sums[p]), d), sums[p])
                    x = _hadd(builder, _hadd(builder, builder.load(sums[0]), builder.load(sums[1]), portable),
                              _hadd(builder, builder.load(sums[2]), builder.load(sums[3]), portable), portable)
                    dot = builder.sitofp(x, _V8F)
                    col = builder.add(builder.mul(blk, n8), builder.mul(g, c8))
                    wsc = vload(sp, col, _V8F, 4)
                    a_s = _broadcast(builder, builder.load(builder.gep(asp, [blk])))
                    a_sum = _broadcast(builder, builder.load(builder.gep(ssp, [blk])))
                    z = vload(zp_ptr, col, _V8F, 4) if has_zp else zdef
                    term = builder.fmul(builder.fmul(a_s, wsc), builder.fsub(dot, builder.fmul(z, a_sum)))
                    builder.store(builder.fadd(builder.load(accp), term), accp)
                optr = builder.bitcast(builder.gep(op, [builder.mul(g, c8)]), _V8F.as_pointer())
                builder.store(builder.load(accp), optr, align=4)
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = f"dot_q4{'_zp' if has_zp else ''}{'_portable' if portable else ''}"
    return intrinsic(impl)


dot_q4 = _make(False, not AVX2)
dot_q4_zp = _make(True, not AVX2)
dot_q4_portable = _make(False, True)
dot_q4_zp_portable = _make(True, True)
