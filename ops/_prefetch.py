"""Software prefetch for kernels whose reads jump between small blocks (the paged KV cache).

The hardware prefetchers follow a stream within a 4 KiB page and restart at every jump; a paged cache's block of
16 rows of 64 float32 is one such page, so a task that walks a block table waits on memory at every block.
``prefetch_line(a, i)`` asks for the cache line holding element ``i`` of the C-contiguous array ``a`` (flat
index) to be brought into every cache level (``llvm.prefetch``: a hint, no fault, no effect on results);
``prefetch_all(a)`` does so for every line of ``a``.
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["prefetch_line", "prefetch_all"]

_I32 = ir.IntType(32)
_I8P = ir.IntType(8).as_pointer()


@intrinsic
def prefetch_line(typingctx, a, i):
    """Prefetch the line of ``a``'s element ``i`` (flat, C order) for reading, into all levels."""
    if not (isinstance(a, types.Array) and a.layout == "C" and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(arr.data, [args[1]]), _I8P)
        mod = builder.module
        fn = mod.globals.get("llvm.prefetch.p0")
        if fn is None:
            fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [_I8P, _I32, _I32, _I32]), "llvm.prefetch.p0")
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()

    return types.void(a, types.intp), codegen


@njit(cache=True, nogil=True, inline="always")
def prefetch_all(a):
    """Prefetch every 64-byte line of the C-contiguous array ``a``."""
    step = max(1, 64 // a.itemsize)
    for i in range(0, a.size, step):
        prefetch_line(a, i)
