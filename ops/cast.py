"""Type conversion ops: Cast and CastLike.

Conversions between numpy and ``ml_dtypes`` types (float16, bfloat16, the
float8/float4 formats, int4/uint4/int2/uint2) go through ``astype``, whose
inner loops are compiled C; the rules the spec adds on top are applied here:
- ``saturate=1`` (the default) clamps values that overflow a float8 format
  to its largest finite magnitude (NaN stays NaN; infinities clamp too);
  ``saturate=0`` keeps the plain conversion (overflow to inf or NaN);
- FLOAT8E8M0 is produced by the ``_to_e8m0`` kernel with the op's
  ``round_mode`` ("up", "down", "nearest");
- numbers become strings as onnxruntime prints them (``NaN``, ``INF``,
  ``-INF``) and strings are parsed as numbers.

Invariants: the result is always a new array (a same-type Cast copies) and
the input is never written.
"""
from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np
from numba import njit
from onnx import TensorProto

from runtime.dtypes import np_dtype
from runtime.errors import InvalidArgumentError, InvalidAttributeError
from .forms import Decline, np_type, form
from .registry import op

F32 = np.dtype(np.float32)
OBJ = np.dtype(object)
_F8 = frozenset(np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
                                      ml_dtypes.float8_e5m2fnuz))
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_ROUND = {"up": 0, "down": 1, "nearest": 2}
# numpy's own types (ml_dtypes types report kind "f"/"i" too, so kinds cannot tell them apart).
_NATIVE = frozenset(np.dtype(c) for c in "?bBhHiIlLqQefdFD")


@njit(cache=True)
def _to_e8m0(bits, out, mode, saturate):
    """float32 bit patterns -> E8M0 exponent bytes (NaN and Inf map to 0xFF)."""
    for i in range(bits.size):
        b = bits[i]
        e = (b >> np.uint32(23)) & np.uint32(0xFF)
        if e == 0xFF:
            out[i] = 0xFF
            continue
        up = False
        if mode == 0:
            up = (b & np.uint32(0x7FFFFF)) != 0
        elif mode == 2:
            g = (b & np.uint32(0x400000)) != 0
            r = (b & np.uint32(0x200000)) != 0
            s = (b & np.uint32(0x1FFFFF)) != 0
            up = g and (r or s or e > 0)
        if up and not (saturate and e == 0xFE):
            e += np.uint32(1)
        out[i] = np.uint8(e & np.uint32(0xFF))


def _number_to_string(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, dtype=OBJ)
    flat = out.reshape(-1)
    src = x.reshape(-1)
    if x.dtype.kind == "f" or "float" in x.dtype.name:
        for i, v in enumerate(src if x.dtype in _NATIVE else src.astype(F32)):
            if np.isnan(v):
                flat[i] = "NaN"
            elif np.isinf(v):
                flat[i] = "INF" if v > 0 else "-INF"
            else:
                flat[i] = str(v)
    else:
        for i, v in enumerate(src):
            flat[i] = str(v)
    return out


def _string_to_number(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    vals = [s.decode() if isinstance(s, bytes) else str(s) for s in x.reshape(-1)]
    if dt == np.bool_:
        return np.array([v.strip().lower() not in ("0", "false", "") for v in vals], dtype=bool).reshape(x.shape)
    if dt.kind in "iu":
        res = np.array([int(float(v)) if any(c in v for c in ".eEnN") else int(v) for v in vals], dtype=np.int64)
        return res.astype(dt).reshape(x.shape)
    res = np.array(vals, dtype=np.str_).astype(np.float64) if vals else np.empty(0, np.float64)
    return cast_array(res.reshape(x.shape), dt, 1, "up")


def cast_array(x: np.ndarray, dt: np.dtype, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    """``x`` converted to ``dt`` with ONNX Cast semantics; always a new array."""
    src = x.dtype
    if dt == OBJ:
        if src == OBJ:
            return x.copy()
        return _number_to_string(x)
    if src == OBJ or src.kind in "US":
        return _string_to_number(x, dt)
    if dt == E8M0:
        if round_mode not in _ROUND:
            raise InvalidAttributeError(f"Cast: round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
        if src == E8M0:
            return x.copy()
        xf = np.ascontiguousarray(x, dtype=F32) if src != F32 else np.ascontiguousarray(x)
        out = np.empty(x.shape, np.uint8)
        if x.size:
            _to_e8m0(xf.reshape(-1).view(np.uint32), out.reshape(-1), _ROUND[round_mode], bool(saturate))
        return out.view(E8M0)
    if dt in _F8 and saturate and src != dt:
        work = x if src == np.float64 else x.astype(F32)
        lim = float(ml_dtypes.finfo(dt).max)
        return np.clip(work, -lim, lim).astype(dt)
    if src not in _NATIVE and dt not in _NATIVE and src != dt:
        # Between two ml_dtypes types: go through float32, which holds every value of each exactly.
        return x.astype(F32).astype(dt)
    return x.astype(dt)


def _target(to) -> np.dtype:
    try:
        return np_dtype(int(to))
    except TypeError:
        raise InvalidAttributeError(f"Cast: 'to' = {to} is not a tensor element type this runtime supports "
                                    f"({TensorProto.DataType.Name(int(to)) if int(to) in TensorProto.DataType.values() else 'unknown'})") from None


class CastOp(NamedTuple):
    """A Cast node bound at plan time (its CPU wrapper, region form and CUDA launch read this)."""

    dtype: np.dtype
    saturate: int
    round_mode: str


def bind_cast(ctx, to=None, saturate=1, round_mode="up") -> CastOp:
    if to is None:
        raise InvalidAttributeError("Cast: the 'to' attribute is required")
    return CastOp(_target(to), int(saturate), round_mode)


def bind_cast_1(ctx, to=None) -> CastOp:
    if isinstance(to, str):  # opset 1 spelled the type as a string
        to = TensorProto.DataType.Value(to.upper())
    return bind_cast(ctx, to)


def _cpu(c: CastOp, ctx):
    dt = c.dtype
    buf = ctx.out[0] if ctx.out else None
    native = dt in _NATIVE

    def run(input):
        if native and input.dtype in _NATIVE and buf is not None and buf.shape == input.shape \
                and buf.dtype == dt:
            np.copyto(buf, input, casting="unsafe")
            return buf
        return cast_array(input, dt, c.saturate, c.round_mode)
    return run


def _form(e, c: CastOp):
    """The region form: numpy's conversion between the numeric dtypes (bool aside)."""
    src, dst = e.dtype(0), c.dtype
    np_type(src)
    if dst.kind == "b" or src.kind == "b":
        raise Decline("bool casts")
    e.line(f"{{o0}} = {{i0}}.astype({np_type(dst)})")
    e.declare(0, dst, e.rank(0))


for _since, _bind in ((1, bind_cast_1), (6, bind_cast)):
    op("Cast", _since, bind=_bind, writes_out=True)(_cpu)
    form("Cast", since=_since, bind=_bind)(_form)


@op("CastLike", 15)
def CastLike(input, target_type, saturate=1, round_mode="up"):
    if target_type is None:
        raise InvalidArgumentError("CastLike: the target_type input is required")
    return cast_array(input, target_type.dtype, saturate, round_mode)
