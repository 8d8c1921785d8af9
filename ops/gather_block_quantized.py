"""com.microsoft GatherBlockQuantized, written once: its bind, its checks, its CPU wrapper and its region form (the
CUDA launch in ``ops/cuda/contrib_quant.py`` shares the bind and the checks).

It gathers slices of a block-quantized table along ``gather_axis`` and dequantizes them (blocks run along
``quantize_axis``).  uint8 data packs ``8/bits`` codes per byte along the last axis (which must then be the
quantize axis) with default zero point ``2**(bits-1)``; int4/uint4 data (one code per element) has default zero
point 0.  Indices may be negative (counted from the end) and are validated: ``IndexOutOfRangeError``.

Invariants: inputs are never written; the output is a fresh array of the scales' dtype; 16-bit floats are
computed in float32.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import F32, check_indices
from .contrib_quant import unpack_codes
from .forms import Decline, raise_on, form
from .registry import op

__all__ = ["Gbq", "bind_gbq", "gbq_layout", "gbq_indices", "gather_block_quantized", "gbq_f32"]

MS = "com.microsoft"


# -- the CPU wrapper --------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _gbq_dequant(q3, sc3, zf3, has_zp, zdef, bs, out3):
    """out3[o, t, i] = (q3[o, t, i] - z) * s with s, z from block t // bs of sc3/zf3 [outer, nbq, inner]."""
    outer, qn, inner = out3.shape
    for o in range(outer):
        for t in range(qn):
            blk = t // bs
            for i in range(inner):
                z = zf3[o, blk, i] if has_zp else zdef
                out3[o, t, i] = (np.float32(q3[o, t, i]) - z) * sc3[o, blk, i]


def _unpack_last(x, bits, length):
    """uint8 codes packed ``8/bits`` per byte along the last axis -> int32 codes, last axis cut to ``length``."""
    x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    length = min(length, x2.shape[1] * (8 // bits))
    out = np.empty((x2.shape[0], length), np.int32)
    unpack_codes(x2, bits, length, out)
    return out.reshape(x.shape[:-1] + (length,))


class Gbq(NamedTuple):
    """A GatherBlockQuantized node bound at plan time."""

    gather_axis: int
    quantize_axis: int
    bs: int
    bits: int


def bind_gbq(ctx, gather_axis=0, quantize_axis=1, block_size=128, bits=4) -> Gbq:
    bs = int(block_size)
    if bs < 16 or bs & (bs - 1):
        raise InvalidAttributeError(f"GatherBlockQuantized: block_size must be a power of two >= 16, got {bs}")
    return Gbq(int(gather_axis), int(quantize_axis), bs, int(bits))


class GbqLayout(NamedTuple):
    """One call's layout: the axes, codes per byte, the default zero point, the logical (unpacked) data shape
    and the quantized extent's blocks."""

    ga: int
    qa: int
    per: int
    zdef: float
    packed: bool
    lshape: tuple
    nbq: int


def gbq_layout(g: Gbq, data, scales, zero_points) -> GbqLayout:
    """The checks every implementation makes on the data, scales and zero points (host or device arrays)."""
    name = "GatherBlockQuantized"
    r = data.ndim
    if r == 0:
        raise ShapeMismatchError(f"{name}: data must have rank >= 1, got a scalar")
    ga = g.gather_axis + r if g.gather_axis < 0 else g.gather_axis
    qa = g.quantize_axis + r if g.quantize_axis < 0 else g.quantize_axis
    if not (0 <= ga < r and 0 <= qa < r):
        raise InvalidAttributeError(f"{name}: gather_axis {g.gather_axis} / quantize_axis {g.quantize_axis} out "
                                    f"of range for data of rank {r}")
    dt = np.dtype(data.dtype)
    if dt == np.uint8:
        if g.bits not in (4, 8):
            raise InvalidAttributeError(f"{name}: bits must be 4 or 8 for uint8 data, got {g.bits}")
        if g.bits == 4 and qa != r - 1:
            raise InvalidAttributeError(f"{name}: packed uint8 data needs quantize_axis = last axis ({r - 1}), "
                                        f"got {g.quantize_axis}")
        per, zdef, packed = 8 // g.bits, float(1 << (g.bits - 1)), True
    elif dt.name in ("int4", "uint4"):
        per, zdef, packed = 1, 0.0, False
    else:
        raise InvalidArgumentError(f"{name}: data must be uint8, int4 or uint4, got {dt}")
    dshape = tuple(int(v) for v in data.shape)
    lshape = dshape[:-1] + (dshape[-1] * per,)
    nbq = (lshape[qa] + g.bs - 1) // g.bs
    want = lshape[:qa] + (nbq,) + lshape[qa + 1:]
    sshape = tuple(int(v) for v in scales.shape)
    if sshape != want:
        raise ShapeMismatchError(f"{name}: scales must have shape {list(want)}, got {list(sshape)}")
    if zero_points is not None:
        zshape = sshape[:-1] + ((sshape[-1] + per - 1) // per,) if packed else sshape
        if tuple(zero_points.shape) != zshape:
            raise ShapeMismatchError(f"{name}: zero_points must have shape {list(zshape)}, got "
                                     f"{list(zero_points.shape)}")
    return GbqLayout(ga, qa, per, zdef, packed, lshape, nbq)


def gbq_indices(lay: GbqLayout, indices) -> np.ndarray:
    """Host indices checked against the gathered extent and made non-negative (int64, their shape kept)."""
    idx = np.asarray(indices)
    if idx.dtype.kind not in "iu":
        raise InvalidArgumentError(f"GatherBlockQuantized: indices must be int32 or int64, got {idx.dtype}")
    gn = lay.lshape[lay.ga]
    check_indices("GatherBlockQuantized", idx, -gn, gn)
    return np.where(idx < 0, idx + gn, idx).astype(np.int64)


@op("GatherBlockQuantized", 1, domain="com.microsoft", bind=bind_gbq)
def _gbq_cpu(g: Gbq, ctx):
    def run(data, indices, scales, zero_points=None):
        return gather_block_quantized(g, data, indices, scales, zero_points)
    return run


def gather_block_quantized(g: Gbq, data, indices, scales, zero_points=None):
    lay = gbq_layout(g, data, scales, zero_points)
    ga, qa, packed, lshape, bits, bs = lay.ga, lay.qa, lay.packed, lay.lshape, g.bits, g.bs
    zdef = np.float32(lay.zdef)
    idx = gbq_indices(lay, indices)

    def codes(x, length):  # logical int32 codes
        return _unpack_last(x, bits, length) if packed else x.astype(np.int32)

    if ga != qa:
        q = codes(np.take(data, idx.reshape(-1), axis=ga), lshape[-1])
        s = np.take(scales, idx.reshape(-1), axis=ga)
        zs = None
        if zero_points is not None:
            zs = codes(np.take(zero_points, idx.reshape(-1), axis=ga), scales.shape[-1])
    else:
        # Gathering along the quantized axis: blocks follow the gathered positions.
        q = np.take(codes(data, lshape[-1]), idx.reshape(-1), axis=ga)
        s = np.take(scales, idx.reshape(-1) // bs, axis=ga)
        zs = None
        if zero_points is not None:
            zs = np.take(codes(zero_points, scales.shape[-1]), idx.reshape(-1) // bs, axis=ga)
        bs = 1
    odt = scales.dtype
    outer = int(math.prod(q.shape[:qa]))
    inner = int(math.prod(q.shape[qa + 1:]))
    qn2 = q.shape[qa]
    nb2 = s.shape[qa]
    q3 = np.ascontiguousarray(q).reshape(outer, qn2, inner)
    s3 = np.ascontiguousarray(s, dtype=F32).reshape(outer, nb2, inner)
    has_zp = zs is not None
    z3 = np.ascontiguousarray(zs, dtype=F32).reshape(outer, nb2, inner) if has_zp else np.zeros((1, 1, 1), F32)
    out = np.empty((outer, qn2, inner), F32)
    _gbq_dequant(q3, s3, z3, has_zp, zdef, bs, out)
    out = out.reshape(q.shape)
    # q has the gathered (flattened) indices on axis ga: restore the indices' shape.
    out = out.reshape(lshape[:ga] + tuple(idx.shape) + lshape[ga + 1:])
    return out if odt == F32 else out.astype(odt)


# -- the region form --------------------------------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def gbq_f32(data, idx, scales, zp, has_zp, bits, bs):
    """uint8 data (G, W) packing 8/bits codes per byte along the quantized last axis, gathered along axis 0:
    (out (len(idx), W * 8/bits), error code)."""
    G, W = data.shape
    per = 8 // bits
    L = W * per
    nbq = (L + bs - 1) // bs
    if scales.shape[0] != G or scales.shape[1] != nbq:
        return np.empty((0, 0), np.float32), 1
    for j in range(idx.size):
        v = idx[j]
        if v < -G or v >= G:
            return np.empty((0, 0), np.float32), 2
    if has_zp and (zp.shape[0] != G or zp.shape[1] != (nbq + per - 1) // per):
        return np.empty((0, 0), np.float32), 3
    zdef = np.float32(1 << (bits - 1))
    m = idx.size
    q = np.empty((m, L), np.float32)
    sc = np.empty((m, nbq), np.float32)
    zf = np.empty((m, nbq), np.float32)
    for j in range(m):
        g = idx[j]
        if g < 0:
            g += G
        unpack_codes(data[g:g + 1], bits, L, q[j:j + 1])
        if has_zp:
            unpack_codes(zp[g:g + 1], bits, nbq, zf[j:j + 1])
        sc[j] = scales[g]
    out = np.empty((m, L), np.float32)
    _gbq_dequant(q.reshape((m, L, 1)), sc.reshape((m, nbq, 1)), zf.reshape((m, nbq, 1)), has_zp, zdef, bs,
                     out.reshape((m, L, 1)))
    return out, 0


def _gbq(e, g):
    """The region form of the bound GatherBlockQuantized: 2-d packed uint8 data gathered along axis 0."""
    bits, bs = g.bits, g.bs
    if bits not in (4, 8):
        raise Decline("attributes")
    if e.dtype(0) != np.uint8 or e.rank(0) != 2 or e.dtype(1).kind not in "iu" or e.dtype(2) != F32 \
            or e.rank(2) != 2:
        raise Decline("types")
    if g.gather_axis not in (0, -2) or g.quantize_axis not in (1, -1):
        raise Decline("axes")
    if e.has(3) and (e.dtype(3) != np.uint8 or e.rank(3) != 2):
        raise Decline("zero points")
    k = e.use(__name__, "gbq_f32")
    ri = e.rank(1)
    zp = "{i3}" if e.has(3) else "np.zeros((1, 1), np.uint8)"
    e.line(f"{{p}}_y, {{p}}_err = {k}({{i0}}, {{i1}}.reshape(({{i1}}.size,)).astype(np.int64), {{i2}}, {zp}, "
           f"{e.has(3)}, {bits}, {bs})")
    raise_on(e, "{p}_err", [
        (1, "ShapeMismatchError", "scales do not match data and block_size"),
        (2, "IndexOutOfRangeError", "an index is out of range for the gather axis"),
        (3, "ShapeMismatchError", "zero_points do not match the scales")])
    shape = [f"{{i1}}.shape[{d}]" for d in range(ri)] + ["{p}_y.shape[1]"]
    e.line(f"{{o0}} = {{p}}_y.reshape(({', '.join(shape)},))")


form("GatherBlockQuantized", domain=MS, bind=bind_gbq)(_gbq)
