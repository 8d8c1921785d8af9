"""com.microsoft RotaryEmbedding and MRotaryEmbedding, written once: their binds, their checks, their typed
driver, their CPU wrapper and their region form (the CUDA launch in ``ops/cuda/contrib_attention.py`` shares
the binds and the checks).

The input is 3-d ``(batch, sequence, hidden)`` (heads of ``hidden / num_heads``, or of the rotary width when
``num_heads`` is 0) or 4-d ``(batch, heads, sequence, head_size)``; the first ``rot = 2 * cos_cache width`` dims
of every head are rotated, pairwise as halves or interleaved.  RotaryEmbedding's positions are
``position_ids`` of shape ``(batch, sequence)``, or one element (the first row's position, the rest follow).
MRotaryEmbedding's are ``(3, batch, sequence)``: the T/H/W streams, picked per rotary half-dim by
``mrope_section`` (sectioned, layout 0, or interleaved, layout 1).

Invariants: the input is never rotated in place (the driver rotates a float32 copy); 16-bit floats are
computed in float32; every position is checked against the caches before a cache row is read
(``IndexOutOfRangeError``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from runtime.errors import InvalidAttributeError, ShapeMismatchError
from ._common import mlas_order, raise_coded
from .attention import rope_tok_kernel
from .forms import Decline, float_only, raise_on, form
from .registry import op

__all__ = ["Rope", "bind_rope", "bind_mrope", "rope_inputs", "rope_geometry", "rope_check", "rope_f32",
           "ROPE_ERRORS", "raise_rope_error"]

MS = "com.microsoft"
_OPTS = dict(cache=True, nogil=True, error_model="numpy")


class Rope(NamedTuple):
    """A (M)RotaryEmbedding node bound at plan time."""

    op: str
    mrope: bool
    H: int              # num_heads (0: heads of the rotary width)
    rot_attr: int       # rotary_embedding_dim (0: twice the caches' width)
    interleaved: bool
    s0: int             # mrope_section
    s1: int
    s2: int
    layout: int         # mrope_layout


def _check_packed(name, is_packed_batching):
    if int(is_packed_batching):
        raise InvalidAttributeError(f"{name}: is_packed_batching=1 is not supported by this kernel")


def bind_rope(ctx, interleaved=0, is_packed_batching=0, num_heads=0, rotary_embedding_dim=0, scale=1.0) -> Rope:
    _check_packed("RotaryEmbedding", is_packed_batching)
    return Rope("RotaryEmbedding", False, int(num_heads), int(rotary_embedding_dim), bool(int(interleaved)),
                0, 0, 0, 0)


def bind_mrope(ctx, mrope_section=(), mrope_layout=0, interleaved=0, is_packed_batching=0, num_heads=0,
               rotary_embedding_dim=0, scale=1.0) -> Rope:
    name = "MRotaryEmbedding"
    _check_packed(name, is_packed_batching)
    sec = [int(v) for v in mrope_section]
    if len(sec) != 3 or min(sec) < 0:
        raise InvalidAttributeError(f"{name}: mrope_section must be 3 non-negative integers, got {sec}")
    if int(mrope_layout) not in (0, 1):
        raise InvalidAttributeError(f"{name}: mrope_layout must be 0 (sectioned) or 1 (interleaved), "
                                    f"got {mrope_layout}")
    return Rope(name, True, int(num_heads), int(rotary_embedding_dim), bool(int(interleaved)), sec[0], sec[1],
                sec[2], int(mrope_layout))


ROPE_ERRORS = {
    1: ("ShapeMismatchError", "rotary_embedding_dim needs cos/sin caches of half its width"),
    2: ("ShapeMismatchError", "the hidden size is not a multiple of the head size"),
    3: ("ShapeMismatchError", "the rotary dim does not fit the head size"),
    4: ("ShapeMismatchError", "position_ids do not match the input's batch and sequence"),
    5: ("ShapeMismatchError", "cos_cache and sin_cache must have the same shape"),
    6: ("IndexOutOfRangeError", "a position id is out of bounds of the cos/sin caches"),
    7: ("InvalidAttributeError", "mrope_section must sum to half the rotary dim"),
}


def raise_rope_error(b: Rope, code: int):
    raise_coded(ROPE_ERRORS, code, b.op)


def rope_inputs(b: Rope, x, cos_cache, sin_cache):
    """The checks on ranks that a form makes statically."""
    if x.ndim not in (3, 4):
        raise ShapeMismatchError(f"{b.op}: input must be 3-d (batch, seq, hidden) or 4-d (batch, heads, seq, "
                                 f"head_size), got shape {list(x.shape)}")
    if x.ndim == 3 and b.rot_attr and b.H <= 0:
        raise InvalidAttributeError(f"{b.op}: rotary_embedding_dim needs num_heads for a 3-d input")
    if cos_cache.ndim != 2 or sin_cache.ndim != 2:
        raise ShapeMismatchError(f"{b.op}: cos_cache and sin_cache must be 2-d, got shapes "
                                 f"{list(cos_cache.shape)} and {list(sin_cache.shape)}")


def positions_of(pos):
    """position_ids as the driver reads them: ``(flat int64, p0, pb, ps)``; (p0, pb, ps) is (3, B, S) for a
    3-d array, (1, B, S) for a 2-d one, (1, -1, -1) otherwise (then only one element fits)."""
    pos = np.asarray(pos)
    p0, pb, ps = pos.shape if pos.ndim == 3 else (1,) + pos.shape if pos.ndim == 2 else (1, -1, -1)
    return np.ascontiguousarray(pos, dtype=np.int64).reshape(-1), p0, pb, ps


@njit(**_OPTS)
def rope_geometry(xshape, H, rot_attr, cos_width):
    """``(error code, B, S, heads, D, rot, seq_second)`` of a 3-d or 4-d input shape."""
    rot = rot_attr if rot_attr else 2 * cos_width
    if len(xshape) == 4:
        B, nh, S, D = xshape[0], xshape[1], xshape[2], xshape[len(xshape) - 1]
        seq_second = False
    else:
        B, S, hid = xshape[0], xshape[1], xshape[len(xshape) - 1]
        D = hid // H if H > 0 else rot
        if D <= 0 or hid % D:
            return 2, B, S, 0, D, rot, True
        nh = hid // D
        seq_second = True
    if rot != 2 * cos_width:
        return 1, B, S, nh, D, rot, seq_second
    if rot > D or rot % 2:
        return 3, B, S, nh, D, rot, seq_second
    return 0, B, S, nh, D, rot, seq_second


@njit(**_OPTS)
def rope_check(pos, p0, pb, ps, B, S, cos_shape, sin_shape, half, mrope, s0, s1, s2):
    """Positions and caches against the step: an error code (0: every position indexes the caches)."""
    if mrope:
        if s0 + s1 + s2 != half:
            return 7
        if p0 != 3 or pb != B or ps != S:
            return 4
    elif pos.size != 1 and (pb != B or ps != S):
        return 4
    if sin_shape[0] != cos_shape[0] or sin_shape[1] != cos_shape[1]:
        return 5
    n = cos_shape[0]
    if pos.size == 1 and not mrope:  # the first row's position; the rest follow it
        for s in range(S):
            if pos[0] + s < 0 or pos[0] + s >= n:
                return 6
    else:
        for j in range(pos.size):
            if pos[j] < 0 or pos[j] >= n:
                return 6
    return 0


@njit(**_OPTS)
def _apply(x4, seq_second, B, S, pos, cosc, sinc, interleaved, rot, mrope, s0, s1, s2, layout, ort):
    """Rotate the float32 copy x4 in place at the checked positions; ``ort``: in MLAS's order
    (``ONNX_NUMBA_MLAS_ORDER=1``, ``attention.rope_tok_kernel``'s ``mlas``)."""
    half = rot // 2
    which = np.zeros(half, np.int64)
    if mrope:
        for t in range(half):
            if layout == 0:
                if s0 <= t < s0 + s1:
                    which[t] = 1
                elif t >= s0 + s1:
                    which[t] = 2
            else:
                if t % 3 == 1 and t < 3 * s1:
                    which[t] = 1
                elif t % 3 == 2 and t < 3 * s2:
                    which[t] = 2
    cos_t = np.empty((B, S, half), np.float32)
    sin_t = np.empty((B, S, half), np.float32)
    for b in range(B):
        for s in range(S):
            for t in range(half):
                if mrope:
                    p = pos[(which[t] * B + b) * S + s]
                elif pos.size == 1:
                    p = pos[0] + s
                else:
                    p = pos[b * S + s]
                cos_t[b, s, t] = cosc[p, t]
                sin_t[b, s, t] = sinc[p, t]
    rope_tok_kernel(x4, cos_t, sin_t, x4, seq_second, interleaved, rot, ort)


@njit(**_OPTS)
def rope_f32(x, pos, p0, pb, ps, cosc, sinc, H, rot_attr, interleaved, mrope, s0, s1, s2, layout, ort):
    """The driver: ``(error code, the rotated float32 copy of x)``; ``ort``: MLAS's order."""
    err, B, S, nh, D, rot, seq_second = rope_geometry(x.shape, H, rot_attr, cosc.shape[1])
    if err == 0:
        err = rope_check(pos, p0, pb, ps, B, S, cosc.shape, sinc.shape, rot // 2, mrope, s0, s1, s2)
    y = x.copy()
    if err == 0:
        x4 = y.reshape((B, S, nh, D)) if seq_second else y.reshape((B, nh, S, D))
        _apply(x4, seq_second, B, S, pos, cosc, sinc, interleaved, rot, mrope, s0, s1, s2, layout, ort)
    return err, y


# -- the CPU wrapper and the region form -------------------------------------------------------------

def _f32(x):
    return np.ascontiguousarray(x, dtype=np.float32)


def _cpu(b: Rope, ctx):
    ort = mlas_order()

    def run(input, position_ids, cos_cache, sin_cache):
        rope_inputs(b, input, cos_cache, sin_cache)
        pos, p0, pb, ps = positions_of(position_ids)
        err, y = rope_f32(_f32(input), pos, p0, pb, ps, _f32(cos_cache), _f32(sin_cache), b.H, b.rot_attr,
                          b.interleaved, b.mrope, b.s0, b.s1, b.s2, b.layout, ort)
        if err:
            raise_rope_error(b, err)
        return y.astype(input.dtype, copy=False)
    return run


def _form(e, b: Rope):
    float_only(e, 0, 2, 3)
    r, rp = e.rank(0), e.rank(1)
    if r not in (3, 4) or e.rank(2) != 2 or e.rank(3) != 2 or e.dtype(1).kind not in "iu":
        raise Decline("ranks")
    if r == 3 and b.rot_attr and b.H <= 0:
        raise Decline("rotary_embedding_dim without num_heads")
    shape = ("{i1}.shape[0], {i1}.shape[1], {i1}.shape[2]" if rp == 3 else
             "1, {i1}.shape[0], {i1}.shape[1]" if rp == 2 else "1, -1, -1")
    k = e.use(__name__, "rope_f32")
    e.line(f"{{p}}_err, {{o0}} = {k}({{i0}}, {{i1}}.reshape(({{i1}}.size,)).astype(np.int64), {shape}, {{i2}}, "
           f"{{i3}}, {b.H}, {b.rot_attr}, {b.interleaved}, {b.mrope}, {b.s0}, {b.s1}, {b.s2}, {b.layout}, "
           f"{mlas_order()})")
    raise_on(e, "{p}_err", [(c, cls, msg) for c, (cls, msg) in ROPE_ERRORS.items()])


for _name, _bind in (("RotaryEmbedding", bind_rope), ("MRotaryEmbedding", bind_mrope)):
    op(_name, 1, domain=MS, bind=_bind)(_cpu)
    form(_name, domain=MS, bind=_bind)(_form)
