"""DepthToSpace and SpaceToDepth: blocks of channels moved into space and back.

Both take a 4-D (N, C, H, W) input and a ``blocksize`` b; ``mode`` DCR or CRD
orders the moved channels as the spec says.  The result is a fresh contiguous
array (the plan's buffer when it gives one): a strided copy of a reshaped,
transposed view of the input (``depth_to_space_view``, ``space_to_depth_view``, which the CUDA launches
share).
"""
from __future__ import annotations

from runtime.errors import InvalidArgumentError, InvalidAttributeError
from ._common import out_buffer
from .movement import contig, out_of, strided_copy
from .registry import op

__all__ = ["depth_to_space_view", "space_to_depth_view"]


def _blocks(input, name):
    """The contiguous 4-D input, or the error naming ``name``."""
    x = contig(input)
    if x.ndim != 4:
        raise InvalidArgumentError(f"{name}: input must be 4-D (N, C, H, W), got shape {list(x.shape)}")
    return x


def _moved(x, v, shape, ctx):
    """The view ``v`` of ``x`` copied into a fresh (or the plan's) array of ``shape``."""
    out = out_buffer(out_of(ctx), shape, x.dtype)
    strided_copy(out, out.reshape(v.shape), x, v)
    return out


def depth_to_space_view(x, blocksize, mode="DCR"):
    """(the view of the 4-D array ``x`` whose C-order copy is DepthToSpace's result, the result's shape)."""
    b = int(blocksize)
    N, C, H, W = x.shape
    if b <= 0 or C % (b * b):
        raise InvalidArgumentError(f"DepthToSpace: channels {C} are not divisible by blocksize^2 = {b * b}")
    c = C // (b * b)
    if mode == "DCR":
        v = x.reshape(N, b, b, c, H, W).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        v = x.reshape(N, c, b, b, H, W).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise InvalidAttributeError(f"DepthToSpace: mode must be 'DCR' or 'CRD', got {mode!r}")
    return v, (N, c, H * b, W * b)


def space_to_depth_view(x, blocksize, mode="DCR"):
    """(the view of the 4-D array ``x`` whose C-order copy is SpaceToDepth's result, the result's shape)."""
    b = int(blocksize)
    N, C, H, W = x.shape
    if b <= 0 or H % b or W % b:
        raise InvalidArgumentError(f"SpaceToDepth: H={H} and W={W} must be divisible by blocksize {b}")
    v = x.reshape(N, C, H // b, b, W // b, b)
    if mode == "DCR":
        v = v.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        v = v.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise InvalidAttributeError(f"SpaceToDepth: mode must be 'DCR' or 'CRD', got {mode!r}")
    return v, (N, C * b * b, H // b, W // b)


@op("DepthToSpace", 1)
def DepthToSpace(input, blocksize=None, mode="DCR", *, ctx=None):
    x = _blocks(input, "DepthToSpace")
    v, shape = depth_to_space_view(x, blocksize, mode)
    return _moved(x, v, shape, ctx)


@op("SpaceToDepth", 1)
def SpaceToDepth(input, blocksize=None, mode="DCR", *, ctx=None):
    x = _blocks(input, "SpaceToDepth")
    v, shape = space_to_depth_view(x, blocksize, mode)
    return _moved(x, v, shape, ctx)
