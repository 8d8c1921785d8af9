"""LinearAttention's pass over the old state in MLAS's fused order, with its chains held in vector registers.

``state_rows(R)`` is a Numba intrinsic for ``R`` weight rows: ``state_rows(R)(S, W, acc, m0)`` sets
``acc[r, m0:m0 + 32] = sum_i W[r, i] * S[i, m0:m0 + 32]`` for r < R, each element one chain of fused multiply-adds
over i from 0 to ``S.shape[0]`` in order, starting at zero: the readouts (``W`` the decayed queries) and the
retrieval (the decayed key) of ``ops/linear_attention._mlas_head``, as MLAS's AVX-512 kernel computes them.  Each
column is its own chain, so holding 32 columns of every row as two 16-float vectors (``llvm.fma.v16f32``) changes
no bit; what it changes is where the chains live: in registers across the loop over i, where the Numba loop kept
them in memory (a load and a store per multiply-add).  LLVM splits the vectors where the target is narrower, with
the same lanes and so the same bits.

Invariants: ``S`` (dk, dv), ``W`` (R or more rows, dk) and ``acc`` (R or more rows, dv) are C-contiguous float32;
the caller keeps ``m0 + 32 <= dv``; only ``acc[:R, m0:m0 + 32]`` is written.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

__all__ = ["PANEL", "MAX_ROWS", "state_rows", "update_rows"]

PANEL = 32  # columns per call: two 16-float vectors per row
MAX_ROWS = 9  # up to 8 query heads per KV head, and the key
_F32 = ir.FloatType()
_V16 = ir.VectorType(_F32, 16)


def _c2f32(t) -> bool:
    return isinstance(t, types.Array) and t.ndim == 2 and t.dtype == types.float32 and t.layout == "C"


def _c1f32(t) -> bool:
    return isinstance(t, types.Array) and t.ndim == 1 and t.dtype == types.float32 and t.layout == "C"


def _emit(context, builder, R, S, W, acc, m0v, upd=None):
    """The loop over the state's rows for the 32 columns from ``m0v``: with ``upd`` = (k, dec, u, gating) each
    row is first updated in place (``fma(dec_i, row, f32(k_i * u))`` with ``gating``, else ``fma(k_i, u, row)``)
    and the chains take the new row."""
    intp = context.get_value_type(types.intp)
    i32 = ir.IntType(32)
    dk, dv = cgutils.unpack_tuple(builder, S.shape, 2)
    kw = cgutils.unpack_tuple(builder, W.shape, 2)[1]
    ow = cgutils.unpack_tuple(builder, acc.shape, 2)[1]
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16, _V16, _V16]), "llvm.fma.v16f32")
    zero = ir.Constant(_V16, [ir.Constant(_F32, 0.0)] * 16)

    def c(v):
        return ir.Constant(intp, v)

    def splat(x):
        v = builder.insert_element(ir.Constant(_V16, None), x, ir.Constant(i32, 0))
        return builder.shuffle_vector(v, ir.Constant(_V16, None), ir.Constant(ir.VectorType(i32, 16), [0] * 16))

    def vptr(data, off):
        return builder.bitcast(builder.gep(data, [off]), _V16.as_pointer())

    # allocas in the entry block (alloca_once), which mem2reg turns into registers
    slots = [[cgutils.alloca_once(builder, _V16) for _ in range(2)] for _ in range(R)]
    for row in slots:
        for slot in row:
            builder.store(zero, slot)
    if upd is not None:
        kk, dec, u, gating = upd
        uv = [builder.load(vptr(u.data, builder.add(m0v, c(16 * v))), align=4) for v in range(2)]
    with cgutils.for_range(builder, dk, intp=intp) as loop:
        i = loop.index
        base = builder.add(builder.mul(i, dv), m0v)
        ptrs = [vptr(S.data, builder.add(base, c(16 * v))) for v in range(2)]
        vec = [builder.load(p, align=4) for p in ptrs]
        if upd is not None:
            ki = splat(builder.load(builder.gep(kk.data, [i])))
            if gating:
                di = splat(builder.load(builder.gep(dec.data, [i])))
                vec = [builder.call(fma, [di, vec[v], builder.fmul(ki, uv[v])]) for v in range(2)]
            else:
                vec = [builder.call(fma, [ki, uv[v], vec[v]]) for v in range(2)]
            for v in range(2):
                builder.store(vec[v], ptrs[v], align=4)
        for r in range(R):
            wv = splat(builder.load(builder.gep(W.data, [builder.add(builder.mul(c(r), kw), i)])))
            for v in range(2):
                builder.store(builder.call(fma, [wv, vec[v], builder.load(slots[r][v])]), slots[r][v])
    for r in range(R):
        for v in range(2):
            off = builder.add(builder.add(builder.mul(c(r), ow), m0v), c(16 * v))
            builder.store(builder.load(slots[r][v]), vptr(acc.data, off), align=4)


@functools.lru_cache(maxsize=None)
def state_rows(R: int):
    """The intrinsic for ``R`` weight rows (see the module)."""

    def impl(typingctx, S, W, acc, m0):
        if not (_c2f32(S) and _c2f32(W) and _c2f32(acc) and isinstance(m0, types.Integer)):
            return None
        sig = types.void(S, W, acc, types.intp)

        def codegen(context, builder, sig, args):
            arrs = [context.make_array(t)(context, builder, v) for t, v in zip(sig.args[:3], args[:3])]
            _emit(context, builder, R, *arrs, args[3])
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = f"la_state_rows_{R}"
    return intrinsic(impl)


@functools.lru_cache(maxsize=None)
def update_rows(R: int, gating: bool):
    """``update_rows(R, gating)(S, W, acc, m0, k, dec, u)``: the state's 32 columns from ``m0`` updated by the key
    ``k`` (dk) and ``u`` (dv), with the decay ``dec`` (dk) where ``gating``, each row as
    ``_mlas_head``'s second pass updates it; then ``state_rows`` over the new rows, in the same pass (the next
    token's first pass, whose chains read each row once it is final)."""

    def impl(typingctx, S, W, acc, m0, k, dec, u):
        if not (_c2f32(S) and _c2f32(W) and _c2f32(acc) and isinstance(m0, types.Integer)
                and _c1f32(k) and _c1f32(dec) and _c1f32(u)):
            return None
        sig = types.void(S, W, acc, types.intp, k, dec, u)

        def codegen(context, builder, sig, args):
            arrs = [context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 1, 2, 4, 5, 6)]
            _emit(context, builder, R, arrs[0], arrs[1], arrs[2], args[3], (arrs[3], arrs[4], arrs[5], gating))
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = f"la_update_rows_{R}_{'g' if gating else 'p'}"
    return intrinsic(impl)
