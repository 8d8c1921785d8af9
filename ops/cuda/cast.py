"""CUDA Cast between the numeric dtypes (float16/32/64, int8/16/32/64, uint8/16/32/64, bool).

Invariants: input and output are C-contiguous device arrays of the same shape; float conversions round to
nearest even (the hardware conversion, as numpy's ``astype``); float to integer truncates toward zero (as
numpy's C cast; out-of-range values are undefined there too); to bool is ``x != 0``; string, 8-bit float and
4-bit types raise.
"""
from __future__ import annotations

import numpy as np

from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ._common import check_device, copy_cast, flat, grid1d

__all__ = ["Cast", "fill_ones"]

_NUMERIC = {np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                                   np.uint8, np.uint16, np.uint32, np.uint64, np.bool_)}
_BOOL = np.dtype(np.bool_)


@jit
def _to_bool(x, out):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, x.size, step):
        out[i] = x[i] != 0


@jit
def fill_ones(out):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = 1


def Cast(input, to, saturate=1, *, out=None):
    """``input`` converted to ``to`` (a numpy dtype or an ONNX TensorProto type number)."""
    check_device("Cast", input=input)
    if isinstance(to, (int, np.integer)):
        from onnx import helper
        dst = np.dtype(helper.tensor_dtype_to_np_dtype(int(to)))
    else:
        dst = np.dtype(to)
    src = np.dtype(input.dtype)
    if src not in _NUMERIC or dst not in _NUMERIC:
        raise InvalidArgumentError(f"Cast: the CUDA kernel converts between numeric dtypes, got {src} -> {dst}")
    y = rc.device_empty(tuple(input.shape), dst) if out is None else out
    if input.size:
        blocks, threads = grid1d(input.size)
        (_to_bool if dst == _BOOL and src != _BOOL else copy_cast)[blocks, threads](flat(input), flat(y))
    return y
