"""CUDA Cast between float32 and float16.

Invariants: input and output are C-contiguous device arrays of the same shape; the conversion rounds to
nearest even (the hardware conversion, as numpy's ``astype``); other dtype pairs raise.
"""
from __future__ import annotations

import numpy as np

from runtime import cuda as rc
from runtime.cuda import cuda
from runtime.errors import InvalidArgumentError
from ._common import F16, F32, check_device, flat, grid1d

__all__ = ["Cast"]

_PAIRS = {(F32, F16), (F16, F32), (F32, F32), (F16, F16)}


@cuda.jit
def _convert(x, out):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, x.size, step):
        out[i] = x[i]


def Cast(input, to, saturate=1, *, out=None):
    """``input`` converted to ``to`` (a numpy dtype or an ONNX TensorProto type number)."""
    check_device("Cast", input=input)
    if isinstance(to, (int, np.integer)):
        from onnx import helper
        dst = np.dtype(helper.tensor_dtype_to_np_dtype(int(to)))
    else:
        dst = np.dtype(to)
    src = np.dtype(input.dtype)
    if (src, dst) not in _PAIRS:
        raise InvalidArgumentError(f"Cast: the CUDA kernel converts float32<->float16 only, got {src} -> {dst}")
    y = rc.device_empty(tuple(input.shape), dst) if out is None else out
    if input.size:
        blocks, threads = grid1d(input.size)
        _convert[blocks, threads](flat(input), flat(y))
    return y
