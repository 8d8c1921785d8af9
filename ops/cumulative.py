"""CumSum and CumProd along one axis, with ``exclusive`` and ``reverse``.

The input is viewed as (outer, n, inner) with the scanned axis in the
middle, so one kernel per dtype serves every rank and axis.  The running
value is kept in the output's own dtype (integers wrap like onnxruntime's);
16-bit floats are computed in float32.  The axis arrives as a 0-d or
1-element integer tensor.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError
from ._common import F32, as_int_list, lowp, norm_axis, out_buffer
from .registry import op

_OPTS = dict(cache=True, nogil=True, error_model="numpy")


@njit(**_OPTS)
def _scan3(x, out, prod, exclusive, reverse):
    """Inclusive/exclusive running sum (or ``prod``) of ``x`` (outer, n, inner) along axis 1 into ``out``."""
    outer, n, inner = x.shape
    for o in range(outer):
        for t in range(n):
            k = n - 1 - t if reverse else t
            if t == 0:
                for i in range(inner):
                    out[o, k, i] = (1 if prod else 0) if exclusive else x[o, k, i]
                continue
            kp = k + 1 if reverse else k - 1
            src = kp if exclusive else k
            for i in range(inner):
                if prod:
                    out[o, k, i] = out[o, kp, i] * x[o, src, i]
                else:
                    out[o, k, i] = out[o, kp, i] + x[o, src, i]


def _scan_factory(prod: bool):
    def factory(ctx, exclusive=0, reverse=0):
        buf = ctx.out[0] if ctx.out else None
        name = ctx.op_type

        def run(x, axis):
            ax_list = as_int_list(axis)
            if len(ax_list) != 1:
                raise InvalidArgumentError(f"{name}: axis must hold exactly one integer, got {ax_list}")
            if x.dtype.kind not in "fiu" and not lowp(x.dtype):
                raise InvalidArgumentError(f"{name} expects a numeric tensor, got {x.dtype}")
            ax = norm_axis(ax_list[0], x.ndim)
            dt = x.dtype
            xc = x.astype(F32) if lowp(dt) else x
            out = out_buffer(buf, x.shape, dt) if xc is x else np.empty(x.shape, F32)
            if x.size:
                shp3 = (int(math.prod(x.shape[:ax])), x.shape[ax],
                        int(math.prod(x.shape[ax + 1:])))
                _scan3(xc.reshape(shp3), out.reshape(shp3), prod, bool(exclusive), bool(reverse))
            return out.astype(dt) if out.dtype != dt else out
        return run
    return factory


op("CumSum", 11, factory=True)(_scan_factory(False))
op("CumSum", 14, factory=True)(_scan_factory(False))
op("CumProd", 26, factory=True)(_scan_factory(True))
