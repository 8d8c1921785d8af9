"""Helpers shared by the op wrappers: broadcasting, output buffers, dtypes, axes.

Wrappers keep kernels few and typed: they reshape inputs to a canonical
rank (flat, or 4-d for broadcasting) so each kernel compiles once per dtype,
compute 16-bit floats in float32, and hand kernels the preallocated output
buffer when the planner gave one whose shape and dtype match.
"""
from __future__ import annotations

import contextvars
import math
import os
import types as _pytypes
from typing import NamedTuple

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, ShapeMismatchError

__all__ = ["mlas_order", "window_geometry", "pad3", "broadcast_shape", "to4", "out_buffer", "lowp", "F32", "norm_axis", "norm_axes", "as_int_list",
           "check_same_dtype", "check_indices", "Plain", "bind_plain", "value_key", "Resolved"]

F32 = np.dtype(np.float32)
_LOWP_NAMES = {"float16", "bfloat16"}


_LOWP_CACHE: dict = {}


def mlas_order() -> bool:
    """Whether the kernels that reproduce onnxruntime's CPU arithmetic (MLAS's order on x86 hosts, AVX2 or
    AVX-512) run in its order (int4 products, MatMul against a constant weight, GroupQueryAttention, Sigmoid and
    SiLU, tanh-GELU, and the hybrid decoders' CausalConvWithState, LpNormalization, LinearAttentionGate,
    GatedRMSNorm and rotary embeddings): ``ONNX_NUMBA_MLAS_ORDER`` when set, else on x86 hosts with AVX2 (where
    onnxruntime runs the MLAS kernels reproduced) and off elsewhere.  ``ONNX_NUMBA_MLAS_ORDER=0`` selects the
    project's own order: faster prompt steps and first compiles, logits within float rounding of onnxruntime's
    instead of equal.  Callers read it once, when a node is planned or a region generated, never per run."""
    from runtime.settings import flag, text
    if text("ONNX_NUMBA_MLAS_ORDER") is None:
        from ._simd import AVX2
        return AVX2
    return flag("ONNX_NUMBA_MLAS_ORDER")


def lowp(dtype) -> bool:
    """16-bit (and 8-bit) floats are computed in float32 by the wrappers."""
    hit = _LOWP_CACHE.get(dtype)
    if hit is None:
        dt = np.dtype(dtype)
        hit = dt.name in _LOWP_NAMES or dt.name.startswith("float8") or dt.name.startswith("float4")
        _LOWP_CACHE[dtype] = hit
    return hit


def broadcast_shape(*shapes) -> tuple:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeMismatchError(f"shapes {[list(s) for s in shapes]} cannot be broadcast together") from None


_TO4_CACHE: dict = {}


def to4(out_shape: tuple, shapes: tuple) -> tuple | None:
    """Canonical 4-d shapes for a broadcast: (out4, [in4...]) or None if it needs more than 4 axes.

    Axes are merged where every operand either spans or broadcasts both, so
    most broadcasts collapse to two or three axes.
    """
    key = (out_shape, shapes)
    hit = _TO4_CACHE.get(key)
    if hit is not None:
        return hit
    r = len(out_shape)
    padded = [(1,) * (r - len(s)) + tuple(s) for s in shapes]
    groups = []  # (out_extent, [extent per operand], pattern)
    for ax in range(r):
        n = out_shape[ax]
        if n == 1:
            continue
        pat = tuple(p[ax] == n for p in padded)
        if groups and groups[-1][2] == pat:
            g = groups[-1]
            groups[-1] = (g[0] * n, [e * (p[ax]) for e, p in zip(g[1], padded)], pat)
        else:
            groups.append((n, [p[ax] for p in padded], pat))
    if len(groups) > 4:
        res = None
    else:
        pad = 4 - len(groups)
        out4 = (1,) * pad + tuple(g[0] for g in groups)
        ins4 = [(1,) * pad + tuple(g[1][k] for g in groups) for k in range(len(shapes))]
        res = (out4, ins4)
    if len(_TO4_CACHE) < 4096:
        _TO4_CACHE[key] = res
    return res


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


# The largest output a kernel may allocate: half the machine's memory, or the running session's
# ``SessionOptions.max_output_bytes`` (set for the duration of its runs).  0: no limit.
DEFAULT_MAX_OUTPUT_BYTES = _physical_memory() // 2
MAX_OUTPUT_BYTES = contextvars.ContextVar("onnx_numba_max_output_bytes", default=DEFAULT_MAX_OUTPUT_BYTES)


def check_output_size(shape, dtype) -> None:
    """Refuse an output past ``MAX_OUTPUT_BYTES`` before it is allocated (a shape computed from data can ask for
    terabytes; numpy would fail late or the machine would swap)."""
    limit = MAX_OUTPUT_BYTES.get()
    if not limit:
        return
    # (kernels call this on every allocation: math.prod, and no np.dtype() call for a dtype already made)
    nbytes = math.prod(shape) * (dtype.itemsize if isinstance(dtype, np.dtype) else np.dtype(dtype).itemsize)
    if nbytes > limit:
        raise InvalidArgumentError(f"an output of shape {[int(d) for d in shape]} ({np.dtype(dtype)}) would take "
                                   f"{nbytes / 2**30:.1f} GiB, more than the limit of {limit / 2**30:.1f} GiB "
                                   f"(SessionOptions.max_output_bytes; by default half the machine's memory)")


def alloc(shape, dtype) -> np.ndarray:
    """``np.empty`` after ``check_output_size``."""
    check_output_size(shape, dtype)
    return np.empty(shape, dtype)


def out_buffer(buf, shape, dtype):
    """``buf`` if it has exactly this shape and dtype, else a fresh array (within ``MAX_OUTPUT_BYTES``)."""
    if buf is not None and buf.shape == shape and buf.dtype == dtype:
        return buf
    return alloc(shape, dtype)


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    a = int(axis)
    if a < -rank or a >= max(rank, 1):
        raise InvalidArgumentError(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return a + rank if a < 0 else a


def norm_axes(axes, rank: int) -> tuple:
    out = tuple(sorted(norm_axis(a, rank) for a in axes))
    if len(set(out)) != len(out):
        raise InvalidArgumentError(f"axes {list(axes)} repeat an axis")
    return out


def as_int_list(x) -> list:
    if x is None:
        return []
    a = np.asarray(x).reshape(-1)
    if a.dtype.kind in "iu":
        return a.tolist()  # Python ints already, without a numpy scalar per element
    return [int(v) for v in a.tolist()]


def value_key(v):
    """A hashable key of a small input's dtype, shape and values (None for an absent input): what a kernel keys
    the plan it resolves from such inputs by (shape targets, slice bounds)."""
    return None if v is None else (v.dtype.str, v.shape, v.tobytes())


class Resolved:
    """A few resolved plans by key (a model resolves the same ones every run); emptied when it holds ``limit``."""

    def __init__(self, limit: int = 16):
        self.limit, self.plans = limit, {}

    def get(self, key, make):
        got = self.plans.get(key)
        if got is None:
            got = make()
            if len(self.plans) >= self.limit:
                self.plans.clear()
            self.plans[key] = got
        return got


def check_same_dtype(op: str, *arrays) -> None:
    dt = arrays[0].dtype
    for a in arrays[1:]:
        if a.dtype != dt:
            raise InvalidArgumentError(f"{op}: inputs must share one dtype, got {[str(x.dtype) for x in arrays]}")


def check_indices(op: str, idx: np.ndarray, lo: int, hi: int, what: str = "index") -> None:
    """Raise ``IndexOutOfRangeError`` unless every index lies in [lo, hi)."""
    from runtime.errors import IndexOutOfRangeError
    if idx.size == 0:
        return
    mn = idx.min()
    mx = idx.max()
    if mn < lo or mx >= hi:
        bad = mn if mn < lo else mx
        raise IndexOutOfRangeError(f"{op}: {what} {int(bad)} is out of bounds; valid range is [{lo}, {hi - 1}]")


def pad3(vals, fill) -> np.ndarray:
    """Spatial values of a 1-to-3-d window op, left-padded to 3 (int64), so kernels see one rank."""
    vals = list(vals)
    return np.array([fill] * (3 - len(vals)) + vals, np.int64)


def window_geometry(name, xshape, kernel, auto_pad="NOTSET", dilations=None, pads=None, strides=None,
                    ceil_mode=False):
    """(kernel, strides, dilations, pads_begin, pads_end, out_spatial) of a conv or pooling window.

    SAME_UPPER / SAME_LOWER pad so the output is ceil(in / stride), the odd pad at the end or the start;
    with explicit pads the output is floor (or, with ``ceil_mode``, ceil, dropping a last window that would
    start in the trailing padding).
    """
    from runtime.errors import InvalidAttributeError
    nd = len(xshape) - 2
    if nd < 1 or nd > 3:
        raise InvalidArgumentError(f"{name}: expected 1 to 3 spatial axes, got input of shape {list(xshape)}")
    k = [int(v) for v in kernel]
    if len(k) != nd:
        raise InvalidAttributeError(f"{name}: kernel_shape {k} must have {nd} entries for input {list(xshape)}")
    s = as_int_list(strides) or [1] * nd
    d = as_int_list(dilations) or [1] * nd
    if len(s) != nd or len(d) != nd:
        raise InvalidAttributeError(f"{name}: strides {s} / dilations {d} must have {nd} entries")
    ins = list(xshape[2:])
    ek = [(k[i] - 1) * d[i] + 1 for i in range(nd)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-ins[i] // s[i]) for i in range(nd)]
        tot = [max((out[i] - 1) * s[i] + ek[i] - ins[i], 0) for i in range(nd)]
        pb = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in tot]
        pe = [tot[i] - pb[i] for i in range(nd)]
    else:
        if auto_pad == "VALID":
            p = [0] * (2 * nd)
        elif auto_pad in ("NOTSET", "", None):
            p = as_int_list(pads) or [0] * (2 * nd)
        else:
            raise InvalidAttributeError(f"{name}: auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, "
                                        f"got {auto_pad!r}")
        if len(p) != 2 * nd:
            raise InvalidAttributeError(f"{name}: pads {p} must have {2 * nd} entries")
        pb, pe = p[:nd], p[nd:]
        out = []
        for i in range(nd):
            span = ins[i] + pb[i] + pe[i] - ek[i]
            if ceil_mode:
                o = -(-span // s[i]) + 1
                if (o - 1) * s[i] >= ins[i] + pb[i]:  # the last window must start inside the image or its front pad
                    o -= 1
            else:
                o = span // s[i] + 1
            out.append(o)
    if any(o < 0 for o in out):
        raise ShapeMismatchError(f"{name}: input spatial shape {ins} is smaller than the dilated kernel {ek}")
    return k, s, d, pb, pe, out


@njit(cache=True, nogil=True)
def tap_runs(k, dil, pb, st, n, on):
    """For each of the ``k`` taps along an axis of ``n`` inputs (dilation ``dil``, ``pb`` padding before, stride
    ``st``) with ``on`` outputs: the outputs [lo, hi) whose input for that tap lies inside the axis, as two
    arrays.  Row kernels run each tap over its run without a bounds test per element."""
    los = np.empty(k, np.int64)
    his = np.empty(k, np.int64)
    for e in range(k):
        off = e * dil - pb  # the input of output 0's tap
        los[e] = max(0, -(off // st))
        his[e] = min(on, (n - 1 - off) // st + 1) if n - 1 - off >= 0 else 0
    return los, his


@njit(cache=True, nogil=True)
def window_taps(o0, dil, k, n, pe):
    """For a window from ``o0`` along an axis of ``n`` with ``pe`` padding at its end: the taps [t0, t1) that land
    inside the axis, and how many land before the padding's end (the taps an average with pads counts).  The
    loops then visit only real elements, in the same order, however large the kernel."""
    if o0 >= n + pe:
        upto = 0
    else:
        upto = min(k, (n + pe - o0 + dil - 1) // dil)
    t0 = 0 if o0 >= 0 else (-o0 + dil - 1) // dil
    t1 = 0 if o0 >= n else min(upto, (n - o0 + dil - 1) // dil)
    return t0, max(t0, t1), upto


def _renamed(f, suffix, globals_):
    g = _pytypes.FunctionType(f.__code__, globals_, f.__name__ + suffix, f.__defaults__, f.__closure__)
    g.__qualname__ = f.__qualname__ + suffix  # the name the cache index is kept under
    g.__module__ = f.__module__
    return g


def serial_twin(dispatcher, suffix="_serial"):
    """``dispatcher``'s source compiled without ``parallel`` (``prange`` becomes ``range``), cached apart."""
    f = dispatcher.py_func
    opts = {k: v for k, v in dispatcher.targetoptions.items() if k not in ("parallel", "nopython", "boundscheck")}
    return njit(cache=True, pipeline_class=dispatcher._compiler.pipeline_class, **opts)(
        _renamed(f, suffix, f.__globals__))


def constant_twin(dispatcher, suffix, **constants):
    """``dispatcher``'s source compiled with some of its module's globals given other values, cached apart.

    Numba reads a global as a compile-time constant and drops a branch on one (``if _MLAS:``, ``if _MLAS and x:``)
    before typing, so the kernels only the dropped branch calls are neither typed nor compiled nor linked into
    the caller.  An option fixed at plan time (onnxruntime's order, say) thus picks one of two dispatchers, and
    the default one carries none of the other's code.  The globals are copied when the twin is made: make it
    after everything the function reads is defined."""
    f = dispatcher.py_func
    missing = sorted(set(constants) - set(f.__globals__))
    if missing:
        raise NameError(f"constant_twin of {f.__qualname__}: no module global {', '.join(missing)} to replace")
    opts = {k: v for k, v in dispatcher.targetoptions.items() if k not in ("nopython", "boundscheck")}
    cached = type(dispatcher._cache).__name__ != "NullCache"  # cached and compiled as the original is
    return njit(cache=cached, pipeline_class=dispatcher._compiler.pipeline_class, **opts)(
        _renamed(f, suffix, {**f.__globals__, **constants}))


class Plain(NamedTuple):
    """An op without attributes, bound: its implementations need only its type."""
    op: str


def bind_plain(op_type: str):
    """The bind of an op without attributes (each implementation registers this same function)."""
    def bind(ctx):
        return Plain(op_type)
    bind.__name__ = f"bind_{op_type.lower()}"
    return bind


def raise_coded(table: dict, code: int, op: str, detail: str = ""):
    """Raise the error a typed check returned: ``table[code]`` is (class name in ``runtime.errors``, message),
    the one table an op's CPU wrapper, region form and CUDA launch all raise from."""
    from runtime import errors
    cls, msg = table[code]
    raise getattr(errors, cls)(f"{op}: {msg}{detail}")
