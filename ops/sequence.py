"""Sequence ops: tensor sequences are Python lists of numpy arrays.

Lists are never mutated in place: every op that changes a sequence returns a
new list.  Ops that put their input tensors into a list (or take one out)
are registered with ``views=True`` so the planner keeps those tensors'
buffers alive as long as the sequence.
"""
from __future__ import annotations

import numpy as np

from runtime.errors import IndexOutOfRangeError, InvalidArgumentError
from runtime.subgraph import plan_subgraph
from ._common import norm_axis
from .registry import op


def _position(seq, pos, op_name, allow_end=False):
    n = len(seq)
    p = int(np.asarray(pos).reshape(-1)[0])
    hi = n if allow_end else n - 1
    if p < -n or p > hi:
        raise IndexOutOfRangeError(f"{op_name}: position {p} is out of range for a sequence of length {n}; "
                                   f"valid range is [{-n}, {hi}]")
    return p + n if p < 0 else p


@op("SequenceEmpty", 11)
def SequenceEmpty(dtype=1):
    return []


@op("SequenceConstruct", 11, views=True)
def SequenceConstruct(*tensors):
    if tensors and any(t.dtype != tensors[0].dtype for t in tensors):
        raise InvalidArgumentError(f"SequenceConstruct: tensors must share one dtype, got "
                                   f"{sorted({str(t.dtype) for t in tensors})}")
    return list(tensors)


@op("SequenceInsert", 11, views=True)
def SequenceInsert(seq, tensor, position=None):
    out = list(seq)
    if position is None:
        out.append(tensor)
    else:
        out.insert(_position(seq, position, "SequenceInsert", allow_end=True), tensor)
    return out


@op("SequenceAt", 11, views=True)
def SequenceAt(seq, position):
    return seq[_position(seq, position, "SequenceAt")]


@op("SequenceErase", 11, views=True)
def SequenceErase(seq, position=None):
    out = list(seq)
    if not out:
        raise IndexOutOfRangeError("SequenceErase: the sequence is empty")
    del out[-1 if position is None else _position(seq, position, "SequenceErase")]
    return out


@op("SequenceLength", 11)
def SequenceLength(seq):
    return np.array(len(seq), dtype=np.int64)


@op("SplitToSequence", 11)
def SplitToSequence(x, split=None, axis=0, keepdims=1):
    ax = norm_axis(axis, x.ndim)
    n = x.shape[ax]
    if split is None:
        parts = [np.take(x, i, axis=ax) if not keepdims else np.take(x, [i], axis=ax) for i in range(n)]
        return [np.ascontiguousarray(p) if p.ndim else np.array(p) for p in parts]
    s = np.asarray(split).astype(np.int64)
    if s.ndim == 0:
        size = int(s)
        if size <= 0:
            raise InvalidArgumentError(f"SplitToSequence: split must be positive, got {size}")
        bounds = list(range(size, n, size))
    else:
        if int(s.sum()) != n:
            raise InvalidArgumentError(f"SplitToSequence: split sizes {s.tolist()} do not sum to the axis length {n}")
        bounds = list(np.cumsum(s)[:-1])
    return [np.ascontiguousarray(p) for p in np.split(x, bounds, axis=ax)]


@op("ConcatFromSequence", 11)
def ConcatFromSequence(seq, axis=0, new_axis=0):
    if not seq:
        raise InvalidArgumentError("ConcatFromSequence: the sequence is empty")
    if new_axis:
        return np.stack(seq, axis=norm_axis(axis, seq[0].ndim + 1))
    return np.concatenate(seq, axis=norm_axis(axis, seq[0].ndim))


@op("SequenceMap", 17, factory=True)
def SequenceMap(ctx, body=None):
    child = plan_subgraph(body, ctx)
    n_in = ctx.n_inputs
    n_out = len(child.output_names)

    def run(*args):
        inputs = args[:n_in]
        captured = args[n_in:]
        n = len(inputs[0])
        outs = [[] for _ in range(n_out)]
        for i in range(n):
            feeds = [x[i] if isinstance(x, list) else x for x in inputs]
            for k, r in enumerate(child.run(feeds, captured)):
                outs[k].append(r)
        return outs[0] if n_out == 1 else tuple(outs)
    return run
