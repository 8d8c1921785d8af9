"""Pad (opsets 1, 2, 11 and later): constant, edge, reflect and wrap modes, negative pads cropping.

Like the other data-movement ops (``ops/movement.py``, whose ``strided_copy`` and byte views it shares) the
kernels work on unsigned-integer views of the element bytes, so each compiles at most four times whatever the
dtype.  The constant mode copies the input into a filled output; the modes that repeat data gather through
per-axis offset maps (``_gather6``: an entry < 0 reads the fill value).

Invariants: the output is a fresh C-contiguous array; the input is never written; pads and axes coming from
tensors are validated before a kernel reads memory.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, InvalidAttributeError
from ._common import Resolved, as_int_list, norm_axis, out_buffer, value_key
from .movement import I64, MAXR, OBJ, contig, out_of, strided_copy, uview
from .registry import op

__all__ = ["pad_geometry", "pad_maps", "pad_fill"]


@njit(cache=True)
def _gather6(src, maps, mstart, n, dst, fill):
    """dst (C order over box n) = src[sum_k maps[mstart[k] + i_k]], or ``fill`` where any map entry is < 0."""
    o = 0
    for a in range(n[0]):
        ma = maps[mstart[0] + a]
        for b in range(n[1]):
            mb = maps[mstart[1] + b]
            for c in range(n[2]):
                mc = maps[mstart[2] + c]
                for d in range(n[3]):
                    md = maps[mstart[3] + d]
                    for e in range(n[4]):
                        me = maps[mstart[4] + e]
                        neg = ma < 0 or mb < 0 or mc < 0 or md < 0 or me < 0
                        base = ma + mb + mc + md + me
                        m5 = mstart[5]
                        for f in range(n[5]):
                            mf = maps[m5 + f]
                            if neg or mf < 0:
                                dst[o] = fill
                            else:
                                dst[o] = src[base + mf]
                            o += 1


# -- Pad -------------------------------------------------------------------------------------------

def _pad_map(d, before, after, mode, stride):
    """Per-axis source offsets (element units) for each output index; -1 marks the constant fill."""
    n = d + before + after
    i = np.arange(n, dtype=I64) - before
    if mode == "constant":
        m = np.where((i >= 0) & (i < d), i, -1)
    elif d == 0:
        if n:
            raise InvalidArgumentError(f"Pad: mode {mode!r} cannot pad an axis of size 0")
        m = i
    elif mode == "edge":
        m = np.clip(i, 0, d - 1)
    elif mode == "wrap":
        m = np.mod(i, d)
    else:  # reflect
        if d == 1:
            m = np.zeros(n, I64)
        else:
            period = 2 * (d - 1)
            j = np.mod(i, period)
            m = np.where(j < d, j, period - j)
    return np.where(m >= 0, m * stride, -1).astype(I64)


def pad_geometry(shape, pads, mode, axes=None):
    """Pad's ``(before, after)`` per axis of an input of ``shape`` (negative entries crop), checked."""
    r = len(shape)
    p = as_int_list(pads)
    ax = list(range(r)) if axes is None else [norm_axis(a, r) for a in as_int_list(axes)]
    if len(p) != 2 * len(ax):
        raise InvalidArgumentError(f"Pad: pads {p} must hold 2 x {len(ax)} entries")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise InvalidAttributeError(f"Pad: mode must be constant, reflect, edge or wrap, got {mode!r}")
    before = [0] * r
    after = [0] * r
    for k, a in enumerate(ax):
        before[a] = p[k]
        after[a] = p[k + len(ax)]
    for i, (d, b, a) in enumerate(zip(shape, before, after)):
        if d + b + a < 0:
            raise InvalidArgumentError(f"Pad: pads {before[i]} and {after[i]} on axis {i} remove more than its {d} "
                                       f"element(s) (the output extent would be {d + b + a})")
    return before, after


def pad_maps(shape, before, after, mode) -> list:
    """Per-axis source offsets (elements of the C-contiguous input of ``shape``) of each output index, -1 for the
    fill: negative pads crop first, then the mode pads the cropped extent, as ``_pad`` does."""
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * int(shape[k + 1])
    maps = []
    for d, b, a, st in zip(shape, before, after, strides):
        lo, hi = max(-b, 0), d + min(a, 0)
        m = _pad_map(hi - lo, max(b, 0), max(a, 0), mode, st)
        maps.append(np.where(m >= 0, m + lo * st, -1).astype(I64))
    return maps


def _pad(x, pads, mode, value, axes=None, buf=None):
    x = contig(x)
    key = (x.shape, x.dtype, mode, _key(pads), _key(axes))
    plan = _PLANS.get(key, lambda: _PadPlan(x.shape, x.dtype, x.strides, pads, mode, axes))
    if plan.crop is not None:  # negative pads crop first
        x = np.ascontiguousarray(x[plan.crop])
    out = out_buffer(buf, plan.out_shape, x.dtype)
    if out.size == 0:
        return out
    if mode == "constant":
        out[...] = pad_fill(value, x.dtype)
        strided_copy(out, out[plan.inner], x, x)
        return out
    if plan.gather is None:
        out[...] = np.pad(x, list(zip(plan.before, plan.after)), mode=mode)
        return out
    u = uview(x)[0]
    _gather6(u, *plan.gather, out.reshape(-1).view(u.dtype), u.dtype.type(0))
    return out


def _key(v):
    """A hashable key of pads or axes given as an attribute (a list) or an input (an array)."""
    return v if v is None else value_key(v) if isinstance(v, np.ndarray) else tuple(v)


class _PadPlan:
    """Pad's geometry for one input shape and one value of pads and axes, worked out once (a model pads the same
    way every run, and this costs more than the copy of a small input): the crop of negative pads, the
    (before, after) pads of the cropped input, the output shape, and for the modes that repeat data the
    gather maps of ``_gather6`` (None where numpy's pad runs instead)."""

    def __init__(self, shape, dtype, strides, pads, mode, axes):
        before, after = pad_geometry(shape, pads, mode, axes)
        self.crop = None
        if any(b < 0 or a < 0 for b, a in zip(before, after)):
            self.crop = tuple(slice(-b if b < 0 else 0, shape[i] + a if a < 0 else None)
                              for i, (b, a) in enumerate(zip(before, after)))
            shape = tuple(len(range(*sl.indices(d))) for sl, d in zip(self.crop, shape))
            strides = tuple(int(np.prod(shape[k + 1:])) * dtype.itemsize for k in range(len(shape)))
            before = [max(b, 0) for b in before]
            after = [max(a, 0) for a in after]
        self.before, self.after = before, after
        self.out_shape = tuple(d + b + a for d, b, a in zip(shape, before, after))
        self.inner = tuple(slice(b, b + d) for b, d in zip(before, shape))
        self.gather = None
        if mode != "constant" and dtype != OBJ and not dtype.hasobject and len(shape) <= MAXR and (
                dtype.itemsize in (1, 2, 4, 8)):
            self.gather = _gather_plan(shape, tuple(s // dtype.itemsize for s in strides), tuple(before),
                                       tuple(after), mode)


def _gather_plan(shape, strides, before, after, mode):
    """``_gather6``'s maps (concatenated), their starts and lengths for one geometry.  The kernel only reads
    them."""
    maps = [_pad_map(d, b, a, mode, s) for d, b, a, s in zip(shape, before, after, strides)]
    maps = [np.zeros(1, I64)] * (MAXR - len(shape)) + maps
    n = np.array([len(m) for m in maps], I64)
    mstart = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(I64)
    return np.concatenate(maps), mstart, n


_PLANS = Resolved(64)


def pad_fill(value, dtype):
    """The constant mode's fill as a 0-d array of ``dtype`` (0 when no value is given)."""
    if value is None:
        return np.zeros((), dtype)
    fill = np.asarray(value).reshape(-1)
    return np.array(fill[0] if fill.size else 0).astype(dtype) if dtype != OBJ else np.array(fill[0], OBJ)


@op("Pad", 1)
def Pad_1(data, mode="constant", paddings=None, value=0.0, *, ctx=None):
    return _pad(data, paddings, mode, value, None, out_of(ctx))


@op("Pad", 2)
def Pad_2(data, mode="constant", pads=None, value=0.0, *, ctx=None):
    return _pad(data, pads, mode, value, None, out_of(ctx))


@op("Pad", 11)
def Pad(data, pads, constant_value=None, axes=None, mode="constant", *, ctx=None):
    return _pad(data, pads, mode, constant_value, axes, out_of(ctx))
