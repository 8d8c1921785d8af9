"""CUDA CumSum and CumProd along one axis, with ``exclusive`` and ``reverse`` (``ops/cumulative.py``'s twin).

The input is viewed as ``(outer, n, inner)`` with the scanned axis in the middle; one thread per
``(outer, inner)`` column runs the scan in order, keeping the running value in the output's dtype (integers
wrap, as the CPU kernel); 16-bit floats are scanned in float32.  The axis is a host input.

Invariants: input and output are C-contiguous device arrays of one shape; nothing is read back.
"""
from __future__ import annotations

import math

import numpy as np

from ops._common import as_int_list, norm_axis
from ops.registry import op
from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ._common import F16, F32, check_device, flat, grid1d, host_array
from .elementwise import cast_to

__all__ = ["scan"]

CUDA = "CUDAExecutionProvider"


@jit
def _scan_cols(x, out, outer, n, inner, prod, exclusive, reverse, first):
    """``first``: the exclusive scan's first value (0, or 1 for a product) in the dtype."""
    for j in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
        o = j // inner
        i = j - o * inner
        base = o * n * inner + i
        for t in range(n):
            k = n - 1 - t if reverse else t
            at = base + k * inner
            if t == 0:
                out[at] = first if exclusive else x[at]
                continue
            prev = at + inner if reverse else at - inner
            src = prev if exclusive else at
            out[at] = out[prev] * x[src] if prod else out[prev] + x[src]


def scan(name: str, x, axis: int, prod: bool, exclusive, reverse):
    """The running sum (``prod``: product) of the device array ``x`` along ``axis``."""
    check_device(name, x=x)
    dt = np.dtype(x.dtype)
    if dt.kind not in "fiu":
        raise InvalidArgumentError(f"{name} expects a numeric tensor, got {dt}")
    if dt == F16:
        return cast_to(scan(name, cast_to(x, F32), axis, prod, exclusive, reverse), F16)
    shape = tuple(int(d) for d in x.shape)
    ax = norm_axis(axis, len(shape))
    out = rc.device_empty(shape, dt)
    if x.size:
        outer, n, inner = int(math.prod(shape[:ax])), shape[ax], int(math.prod(shape[ax + 1:]))
        blocks, threads = grid1d(outer * inner)
        _scan_cols[blocks, threads](flat(x), flat(out), outer, n, inner, bool(prod), bool(exclusive), bool(reverse),
                                     dt.type(1 if prod else 0))
    return out


def _factory(prod: bool):
    def factory(ctx, exclusive=0, reverse=0):
        name = ctx.op_type

        def run(x, axis):
            ax_list = as_int_list(host_array(name, "axis", axis))
            if len(ax_list) != 1:
                raise InvalidArgumentError(f"{name}: axis must hold exactly one integer, got {ax_list}")
            return scan(name, x, ax_list[0], prod, exclusive, reverse)
        return run
    return factory


for _v in (11, 14):
    op("CumSum", _v, provider=CUDA, factory=True, host_inputs=(1,))(_factory(False))
op("CumProd", 26, provider=CUDA, factory=True, host_inputs=(1,))(_factory(True))
