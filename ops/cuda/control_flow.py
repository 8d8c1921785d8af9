"""CUDA If, Loop and Scan (opset 9 on): their subgraphs run as child CUDA plans (``runtime.subgraph``).

The conditions and trip counts are read on the host (If's condition and Loop's ``M``/``cond`` are host inputs;
a Loop body's condition output comes back to the host each iteration, one small copy).  Everything else stays on
the device: loop-carried values, the values the subgraphs capture from enclosing scopes (passed through as they
are), each iteration's outputs, and the stacked scan outputs (one device copy per iteration into the stack).
Scan slices its inputs with device copies.  The rules (zero iterations, empty scan outputs of the body's
declared type, directions, axes) are ``ops/control_flow.py``'s.

Invariants: results are device arrays, except values that were never on the device (a Loop that ran no
iteration returns its initial carried values; an empty scan output is made on the host).
"""
from __future__ import annotations

import numpy as np

from ops._common import norm_axis
from ops.control_flow import If, loop_factory, scan_factory
from ops.registry import op
from runtime import cuda as rc
from runtime.errors import InvalidArgumentError
from .shape import _cstrides, strided_copy, view_copy

__all__ = ["stack"]

CUDA = "CUDAExecutionProvider"


def _host(v):
    return rc.to_host(v) if rc.is_device_array(v) else v


def _device(v):
    return v if rc.is_device_array(v) else rc.to_device(np.ascontiguousarray(v))


def stack(name, parts, axis=0):
    """One device array: the equally shaped ``parts`` stacked along a new ``axis``."""
    parts = [_device(p) for p in parts]
    shape = tuple(int(d) for d in parts[0].shape)
    ax = norm_axis(axis, len(shape) + 1)
    out_shape = shape[:ax] + (len(parts),) + shape[ax:]
    out = rc.device_empty(out_shape, parts[0].dtype)
    dst = _cstrides(out_shape)
    for k, p in enumerate(parts):
        if tuple(p.shape) != shape:
            raise InvalidArgumentError(f"{name}: iteration {k} gives a scan output of shape {list(p.shape)}, "
                                       f"the first gave {list(shape)}")
        if p.size:
            strided_copy(name, p, 0, _cstrides(shape), out, k * dst[ax], dst[:ax] + dst[ax + 1:], shape)
    return out


def _stack_loop(name, values):
    if isinstance(values[0], list):
        raise InvalidArgumentError(f"{name}: the CUDA provider does not stack sequence scan outputs")
    return stack(name, values)


def _take(x, a, idx):
    """Slice ``idx`` of the device array ``x`` along axis ``a``, as a fresh device array."""
    return view_copy("Scan", _device(x), lambda p: (p[(slice(None),) * a + (slice(idx, idx + 1),)],
                                                    p.shape[:a] + p.shape[a + 1:]))


_scan = scan_factory(_take, stack)
_loop = loop_factory(_stack_loop, _host, host_outputs=(0,))
for _v in (1, 11, 13, 16, 19, 21, 23, 24, 25):
    op("If", _v, provider=CUDA, factory=True, host_inputs=(0,))(If)  # the CPU's: its branches plan on CUDA
    op("Loop", _v, provider=CUDA, factory=True, host_inputs=(0, 1))(_loop)
for _v in (9, 11, 16, 19, 21, 23, 24, 25):
    op("Scan", _v, provider=CUDA, factory=True)(_scan)
