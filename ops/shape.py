"""Metadata ops: Constant, Identity, Reshape, Shape, Size, Squeeze, Unsqueeze, Flatten.

None of these touches element data.  Reshape, Squeeze, Unsqueeze, Flatten and
Identity are registered with ``views=True`` and return numpy views of their
(C-contiguous) input, so they cost O(rank); the planner treats their output
as an alias of the input.  Shape and Size return fresh int64 arrays.
Constant returns a fresh copy of its attribute each run, so a caller that
mutates a returned graph output never mutates the model.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import Plain, Resolved, as_int_list, bind_plain, norm_axis, value_key
from .registry import op

I64 = np.dtype(np.int64)


# -- Constant --------------------------------------------------------------------------------------

def _constant_value(value, value_float, value_floats, value_int, value_ints, value_string, value_strings,
                    sparse_value):
    given = [(k, v) for k, v in (("value", value), ("value_float", value_float), ("value_floats", value_floats),
                                 ("value_int", value_int), ("value_ints", value_ints),
                                 ("value_string", value_string), ("value_strings", value_strings),
                                 ("sparse_value", sparse_value)) if v is not None]
    if len(given) != 1:
        raise InvalidAttributeError(f"Constant needs exactly one value attribute, got {[k for k, _ in given]}")
    k, v = given[0]
    if k in ("value", "sparse_value"):
        return np.asarray(v)
    if k == "value_float":
        return np.array(v, dtype=np.float32)
    if k == "value_floats":
        return np.array(v, dtype=np.float32).reshape(-1)
    if k == "value_int":
        return np.array(v, dtype=np.int64)
    if k == "value_ints":
        return np.array(v, dtype=np.int64).reshape(-1)
    if k == "value_string":
        return np.array(v if isinstance(v, str) else bytes(v).decode(), dtype=object)
    arr = np.empty(len(v), dtype=object)
    arr[:] = [s if isinstance(s, str) else bytes(s).decode() for s in v]
    return arr


@op("Constant", 1, factory=True)
def Constant(ctx, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None,
             value_string=None, value_strings=None, sparse_value=None):
    arr = _constant_value(value, value_float, value_floats, value_int, value_ints, value_string, value_strings,
                          sparse_value)

    def run():
        return arr.copy()
    return run


# -- Identity --------------------------------------------------------------------------------------

bind_identity = bind_plain("Identity")


def _same(x):
    # Tensors, sequences (lists) and optionals (None or a value) all pass through unchanged.
    return x


def identity(b: Plain, ctx=None):
    """Identity on any provider: the input itself (a view, as the registration says)."""
    return _same


op("Identity", 1, views=True, bind=bind_identity)(identity)


# -- Reshape ---------------------------------------------------------------------------------------

def reshape_target(in_shape: tuple, shape, allowzero: int = 0) -> tuple:
    """The output shape of Reshape: 0 copies the input dim (unless allowzero), -1 is inferred."""
    dims = as_int_list(shape)
    out = []
    infer = -1
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                raise ShapeMismatchError(f"Reshape: shape {dims} copies dim {i} (0) but the input has rank "
                                         f"{len(in_shape)}")
            out.append(in_shape[i])
        elif d == -1:
            if infer >= 0:
                raise ShapeMismatchError(f"Reshape: shape {dims} has more than one -1")
            infer = i
            out.append(1)
        elif d < 0:
            raise ShapeMismatchError(f"Reshape: shape {dims} has the invalid dim {d}")
        else:
            out.append(d)
    if allowzero and infer >= 0 and 0 in dims:
        raise ShapeMismatchError(f"Reshape: shape {dims} has both -1 and 0 with allowzero=1")
    total = int(math.prod(in_shape))
    if infer >= 0:
        known = int(math.prod(out))
        if known == 0 or total % known:
            raise ShapeMismatchError(f"Reshape: cannot reshape input of shape {list(in_shape)} to {dims}")
        out[infer] = total // known
    elif int(math.prod(out)) != total:
        raise ShapeMismatchError(f"Reshape: cannot reshape input of shape {list(in_shape)} ({total} elements) "
                                 f"to {dims} ({int(math.prod(out))} elements)")
    return tuple(out)


class ViewOp(NamedTuple):
    """Reshape, Squeeze or Unsqueeze bound.  Before opsets 5 (Reshape) and 13 (Squeeze, Unsqueeze) the shape or
    axes are an attribute (``given``); from then on they are the second input (``from_input``)."""
    op: str
    given: Any
    from_input: bool
    allowzero: int = 0


def _ints(v):
    return None if v is None else tuple(int(d) for d in v)


def bind_reshape_1(ctx, shape=None, consumed_inputs=None):
    return ViewOp("Reshape", _ints(shape), False)


def bind_reshape(ctx, allowzero=0):
    return ViewOp("Reshape", None, True, int(allowzero))


def bind_squeeze_1(ctx, axes=None):
    return ViewOp("Squeeze", _ints(axes), False)


def bind_squeeze(ctx):
    return ViewOp("Squeeze", None, True)


def bind_unsqueeze_1(ctx, axes=None):
    if axes is None:
        raise InvalidAttributeError("Unsqueeze: the axes attribute is required before opset 13")
    return ViewOp("Unsqueeze", _ints(axes), False)


def bind_unsqueeze(ctx):
    return ViewOp("Unsqueeze", None, True)


VIEW_BINDS = {"Reshape": ((1, bind_reshape_1), (5, bind_reshape)),
              "Squeeze": ((1, bind_squeeze_1), (13, bind_squeeze)),
              "Unsqueeze": ((1, bind_unsqueeze_1), (13, bind_unsqueeze))}


def view_shape(b: ViewOp, in_shape: tuple, second=None) -> tuple:
    """The output shape of a Reshape, Squeeze or Unsqueeze of an input of ``in_shape`` (``second``: its second
    input, when the op takes one): shared by the CPU views and the CUDA ones."""
    arg = second if b.from_input else b.given
    if b.op == "Reshape":
        return reshape_target(in_shape, arg, b.allowzero)
    if b.op == "Squeeze":
        return squeeze_shape(in_shape, arg)
    if arg is None:
        raise InvalidArgumentError("Unsqueeze: the axes input is required from opset 13")
    return unsqueeze_shape(in_shape, arg)


def view_cpu(b: ViewOp, ctx=None):
    """The view on the CPU; the output shape resolved for an input shape and the second input's values is kept
    (a few of them: a model reshapes the same way every run)."""
    resolved = Resolved()

    def run(data, second=None):
        return data.reshape(resolved.get((data.shape, value_key(second)), lambda: view_shape(b, data.shape, second)))
    return run


# -- Shape and Size --------------------------------------------------------------------------------

class ShapeOp(NamedTuple):
    """Shape bound: the dims [start, end) it returns (end None: to the last), negatives from the end."""
    start: int
    end: Any


def bind_shape_1(ctx):
    return ShapeOp(0, None)


def bind_shape(ctx, start=0, end=None):
    return ShapeOp(int(start), None if end is None else int(end))


def shape_dims(rank: int, b: ShapeOp) -> range:
    """The axes Shape returns for an input of ``rank``: [start, end) clamped to [0, rank], as the spec says."""
    s = b.start + rank if b.start < 0 else b.start
    e = rank if b.end is None else (b.end + rank if b.end < 0 else b.end)
    return range(min(max(s, 0), rank), min(max(e, 0), rank))


def shape_cpu(b: ShapeOp, ctx=None):
    def run(data):
        shape = data.shape
        return np.array([shape[d] for d in shape_dims(data.ndim, b)], dtype=I64)
    return run


op("Shape", 1, bind=bind_shape_1)(shape_cpu)
op("Shape", 15, bind=bind_shape)(shape_cpu)


@op("Size", 1)
def Size(data):
    return np.array(data.size, dtype=I64)


# -- Squeeze / Unsqueeze / Flatten -----------------------------------------------------------------

def squeeze_shape(shape: tuple, axes) -> tuple:
    """Squeeze's output shape: the given extent-1 axes dropped (every extent-1 axis when none are given)."""
    shape = tuple(shape)
    if axes is None or len(as_int_list(axes)) == 0:
        return tuple(d for d in shape if d != 1)
    ax = sorted({norm_axis(a, len(shape)) for a in as_int_list(axes)})
    for a in ax:
        if shape[a] != 1:
            raise ShapeMismatchError(f"Squeeze: axis {a} of shape {list(shape)} has size {shape[a]}, expected 1")
    return tuple(d for i, d in enumerate(shape) if i not in ax)


def unsqueeze_shape(shape: tuple, axes) -> tuple:
    """Unsqueeze's output shape: extent-1 axes inserted at ``axes`` (of the output's rank)."""
    ax_list = as_int_list(axes)
    r = len(shape) + len(ax_list)
    ax = [norm_axis(a, r) for a in ax_list]
    if len(set(ax)) != len(ax):
        raise InvalidArgumentError(f"Unsqueeze: axes {ax_list} repeat an axis")
    out = list(shape)
    for a in sorted(ax):
        out.insert(a, 1)
    return tuple(out)


for _name, _binds in VIEW_BINDS.items():
    for _v, _bind in _binds:
        op(_name, _v, views=True, bind=_bind)(view_cpu)


class FlattenOp(NamedTuple):
    axis: int


def bind_flatten(ctx, axis=1):
    return FlattenOp(int(axis))


def flatten_shape(shape: tuple, axis: int) -> tuple:
    """Flatten's 2-d output shape for an input of ``shape``: the dims before ``axis`` and from it on."""
    r = len(shape)
    a = axis + r if axis < 0 else axis
    if a < 0 or a > r:
        raise InvalidAttributeError(f"Flatten: axis {axis} is out of range for rank {r}; expected [-{r}, {r}]")
    return int(math.prod(shape[:a])), int(math.prod(shape[a:]))


def flatten_cpu(b: FlattenOp, ctx=None):
    def run(input):
        return input.reshape(flatten_shape(input.shape, b.axis))
    return run


op("Flatten", 1, views=True, bind=bind_flatten)(flatten_cpu)
