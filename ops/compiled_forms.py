"""Compiled forms of ops: the code a node contributes to a generated region function.

The emitter and the forms' registry are ``ops.forms``; ops written to the one contract keep their form
in their own family module.  The forms here call the same typed kernels as the op's wrapper (the GQA
kernels, the generated elementwise loops) or numpy expressions Numba compiles to the same IEEE arithmetic.
MatMul against a float32 initializer packs it into column panels at plan time (``ops._panels``): one row
takes the wrapper's panel GEMV, several rows four-row register tiles, equal to the wrapper's BLAS up to
summation order; against a computed weight, one row takes the wrapper's row GEMV and several rows pack it
at run time.

A form raises ``Decline`` for anything it does not express (a dtype, an
attribute value, an unknown rank); the node then runs through its wrapper.
Forms must keep the invariants stated in ``runtime/regions.py``: contiguous
values, no writes into inputs, views only where the wrapper returns views,
and errors that name the node.

Serial twins: the parallel kernels wake every worker thread on each call,
which costs more than a decode-sized problem; forms pick the serial twin of a
kernel (the same source compiled without ``parallel``, cached under its own
name) below a work threshold.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ._common import mlas_order, serial_twin
from runtime.errors import InvalidAttributeError
from .elementwise import BINARY
from .movement import bind_transpose, transpose_perm
from .shape import VIEW_BINDS, bind_shape, bind_shape_1, shape_dims
from .forms import Decline, float_only, np_type, product_expr, quote, emit, form
from . import indexing as _ix
from .indexing import GATHER_VERSIONS, bind_gather
from . import matmul as _mm
from .matmul import bind_matmul
from ._mlas_attention import ort_threads
from ._mlas_sgemm import pack_slices, sgemm_mlas, sgemm_packed_mlas
from ._panels import gemm_panels_par, gemv_panels, pack_panels, panel_threads
from . import reduce as _rd
from .reduce import REDUCE_BINDS
from .split_slice import SPLIT_BINDS

__all__ = ["Decline", "emit", "form", "serial_twin"]

MS = "com.microsoft"
F32 = np.dtype(np.float32)
_OPTS = dict(cache=True, nogil=True, error_model="numpy")
PARALLEL_WORK = 1 << 16  # multiply-adds below which a serial kernel beats waking the thread pool


# -- kernels the forms call ------------------------------------------------------------------------



@njit(**_OPTS)
def indices_ok(idx, n):
    """Every index in [-n, n)."""
    for i in range(idx.size):
        v = idx.flat[i]
        if v < -n or v >= n:
            return False
    return True


@njit(**_OPTS)
def first_bad_index(idx, n):
    """The first index outside [-n, n) (``indices_ok`` said there is one)."""
    for i in range(idx.size):
        v = idx.flat[i]
        if v < -n or v >= n:
            return np.int64(v)
    return np.int64(0)


@njit(**_OPTS)
def gather3(d3, idx):
    """d3 (outer, n, inner), idx flat (validated, may be negative) -> (outer, len(idx), inner), through the
    Gather wrapper's kernel."""
    n = d3.shape[1]
    k = np.empty(idx.shape[0], np.int64)
    for j in range(idx.shape[0]):
        k[j] = idx[j] + n if idx[j] < 0 else idx[j]
    out = np.empty((d3.shape[0], idx.shape[0], d3.shape[2]), d3.dtype)
    _ix.k_gather(d3, k, out)
    return out


reduce3 = _rd.reduce3


gemv_rows = _mm.gemv_rows
gemv_par = _mm.gemv_par
gemv_threads = _mm.gemv_threads


@njit(**_OPTS)
def matmul_mlas(a2, wflat, K, N, nthreads):
    """(M, K) @ a constant weight packed by ``_mlas_sgemm.pack_slices``, in MLAS's packed order (onnxruntime's
    bits; ``ONNX_NUMBA_MLAS_ORDER=1``)."""
    return sgemm_packed_mlas(np.ascontiguousarray(a2), wflat, K, N)


@njit(**_OPTS)
def matmul_mlas_rt(a2, w, ort_nthreads, nthreads):
    """(M, K) @ a computed (K, N) weight as onnxruntime's MatMul computes it (``_mlas_sgemm.sgemm_mlas`` on
    onnxruntime's thread count ``ort_nthreads``, a literal of the generated source: ``ort_threads()`` at plan time;
    not the region's)."""
    a2 = np.ascontiguousarray(a2)
    w = np.ascontiguousarray(w)
    M, K = a2.shape
    N = w.shape[1]
    out = np.empty((M, N), np.float32)
    one = np.zeros(1, np.int64)
    sgemm_mlas(a2.reshape((1, M, K)), w.reshape((1, K, N)), one, one, out.reshape((1, M, N)), ort_nthreads)
    return out


@njit(**_OPTS)
def matmul_panels(a2, wp, N, nthreads):
    """(M, K) @ a constant weight packed by ``_panels.pack_panels``, in float32: the MatMul wrapper's one-row
    kernel and thread split for M = 1 (so decode results equal the per-node plan's), the panel product split
    over the threads for several rows."""
    a2 = np.ascontiguousarray(a2)
    M, K = a2.shape
    out = np.empty((M, N), np.float32)
    if M == 1:
        gemv_panels(a2, wp, out, panel_threads(wp.shape[0], K, nthreads))
    else:  # split over the threads at any size (the serial product gives the same bits: one kernel to compile)
        gemm_panels_par(a2, wp, out)
    return out


@njit(**_OPTS)
def matmul2(a2, w, nthreads):
    """(M, K) @ a computed (K, N) weight in float32.  One row: the MatMul wrapper's row GEMV (serial below 2 MiB
    of weight per thread, the same partition above), so decode results equal the per-node plan's; several rows:
    the weight packed into panels here and ``matmul_panels``.  (Numba's ``np.dot`` is not used: it crashes on
    read-only, memory-mapped weights.)"""
    M, K = a2.shape
    N = w.shape[1]
    if M == 1:
        out = np.empty((M, N), np.float32)
        nt = gemv_threads(K, N, 4, nthreads)
        if nt == 1:
            gemv_rows(a2[0], w, out[0], 0, K)
        else:
            part = np.empty((nt, N), np.float32)
            gemv_par(a2[0], w, out[0], part)
        return out
    return matmul_panels(a2, pack_panels(w), N, nthreads)


# -- shape and index ops ---------------------------------------------------------------------------

def _shape(e, b):
    dims = list(shape_dims(e.rank(0), b))
    e.line(f"{{o0}} = np.empty({len(dims)}, np.int64)")
    e.declare(0, np.int64, 1)
    for k, d in enumerate(dims):
        e.line(f"{{o0}}[{k}] = {{i0}}.shape[{d}]")


form("Shape", since=1, bind=bind_shape_1)(_shape)
form("Shape", since=15, bind=bind_shape)(_shape)


def _gather(e, b):
    rd, ri = e.rank(0), e.rank(1)
    if rd == 0 or e.dtype(1).kind not in "iu":
        raise Decline("gather")
    np_type(e.dtype(0))
    axis = b.axis + rd if b.axis < 0 else b.axis
    ok = e.use(__name__, "indices_ok")
    g3 = e.use(__name__, "gather3")
    e.use("runtime.errors", "IndexOutOfRangeError")
    outer = product_expr([f"{{i0}}.shape[{d}]" for d in range(axis)])
    inner = product_expr([f"{{i0}}.shape[{d}]" for d in range(axis + 1, rd)])
    bad = e.use(__name__, "first_bad_index")
    e.line(f"if not {ok}({{i1}}, {{i0}}.shape[{axis}]):",
           f"    raise IndexOutOfRangeError__runtime_errors(\"{quote(e.node)}: index\", "
           f"{bad}({{i1}}, {{i0}}.shape[{axis}]), \"is out of range for axis {axis} of extent\", "
           f"{{i0}}.shape[{axis}], \"(valid indices are -extent to extent - 1)\")",
           f"{{p}}_g = {g3}({{i0}}.reshape(({outer}, {{i0}}.shape[{axis}], {inner})), "
           f"{{i1}}.reshape(({{i1}}.size,)).astype(np.int64))")
    shape = [f"{{i0}}.shape[{d}]" for d in range(axis)] + [f"{{i1}}.shape[{d}]" for d in range(ri)] + \
        [f"{{i0}}.shape[{d}]" for d in range(axis + 1, rd)]
    e.line(f"{{o0}} = {{p}}_g.reshape(({', '.join(shape)}{',' if len(shape) == 1 else ''}))")
    e.declare(0, e.dtype(0), len(shape))


for _v in GATHER_VERSIONS:
    form("Gather", since=_v, bind=bind_gather)(_gather)


def _reshape(e, b):
    rout = e.out_rank(0)
    allowzero = b.allowzero
    c = e.const(1) if b.from_input else (None if b.given is None else np.asarray(b.given, np.int64))
    if c is None or c.ndim != 1 or len(c) != rout:
        raise Decline("runtime shape")
    rin = e.rank(0)
    dims = []
    infer = None
    for k, d in enumerate(int(v) for v in c):
        if d == 0 and not allowzero:
            if k >= rin:
                raise Decline("zero past the input rank")
            dims.append(f"{{i0}}.shape[{k}]")
        elif d == -1:
            if infer is not None:
                raise Decline("two -1")
            infer = k
            dims.append(None)
        elif d < 0:
            raise Decline("negative dim")
        else:
            dims.append(str(d))
    if infer is not None:
        known = product_expr([x for x in dims if x is not None])
        e.line(f"{{p}}_k = {known}",
               "{p}_n = {i0}.size // {p}_k if {p}_k else 0")
        dims[infer] = "{p}_n"
    e.line(f"{{o0}} = {{i0}}.reshape(({', '.join(dims)}{',' if len(dims) == 1 else ''}))")
    e.declare(0, e.dtype(0), len(dims))


for _v, _bind in VIEW_BINDS["Reshape"]:
    form("Reshape", since=_v, bind=_bind)(_reshape)


def _transpose(e, b):
    r = e.rank(0)
    try:
        perm = transpose_perm(r, b)
    except InvalidAttributeError:  # the wrapper reports it, naming the node
        raise Decline("perm") from None
    e.line(f"{{o0}} = np.ascontiguousarray(np.transpose({{i0}}, ({', '.join(map(str, perm))},)))")
    e.declare(0, e.dtype(0), r)


form("Transpose", bind=bind_transpose)(_transpose)


def _split(e, b):
    r = e.rank(0)
    axis = b.axis + r if b.axis < 0 else b.axis
    n = b.n_out
    sizes = None
    if e.has(1):
        c = e.const(1)
        if c is None:
            raise Decline("runtime split")
        sizes = [int(v) for v in c]
    elif b.sizes is not None:
        sizes = list(b.sizes)
    e.use("runtime.errors", "InvalidArgumentError")
    if sizes is not None:
        if len(sizes) != n or min(sizes, default=0) < 0:
            raise Decline("split sizes")  # the wrapper reports them
        e.line(f"if {{i0}}.shape[{axis}] != {sum(sizes)}:",
               f"    raise InvalidArgumentError__runtime_errors(\"{quote(e.node)}: Split: split {sizes} must be {n} "
               f"non-negative sizes summing to \", {{i0}}.shape[{axis}])")
        offs = [sum(sizes[:k]) for k in range(n + 1)]
        bounds = [(str(offs[k]), str(offs[k + 1])) for k in range(n)]
    else:  # the bind checked num_outputs against the outputs
        e.line(f"{{p}}_c = -(-{{i0}}.shape[{axis}] // {n})")
        bounds = [(f"min({k} * {{p}}_c, {{i0}}.shape[{axis}])", f"min({k + 1} * {{p}}_c, {{i0}}.shape[{axis}])")
                  for k in range(n)]
        if not b.ceil:
            e.line(f"if {{i0}}.shape[{axis}] % {n}:",
                   f"    raise InvalidArgumentError__runtime_errors(\"{quote(e.node)}: Split: axis {axis} of size\", "
                   f"{{i0}}.shape[{axis}], \"cannot be split into {n} equal parts\")")
    for k, (lo, hi) in enumerate(bounds):
        idx = ", ".join([":"] * axis + [f"{lo}:{hi}"])
        e.line(f"{{o{k}}} = np.ascontiguousarray({{i0}}[{idx}])")
        e.declare(k, e.dtype(0), r)


for _v, _bind in SPLIT_BINDS:
    form("Split", since=_v, bind=_bind)(_split)


def _reduce_sum(e, b):
    r = e.rank(0)
    keep = b.keepdims
    if b.from_input:
        if not e.has(1):
            raise Decline("all axes")
        c = e.const(1)
        if c is None:
            raise Decline("runtime axes")
        axes = [int(v) for v in np.asarray(c).reshape(-1)]
    else:
        if b.axes is None:
            raise Decline("all axes")
        axes = list(b.axes)
    axes = sorted(a + r if a < 0 else a for a in axes)
    if len(axes) != 1:
        raise Decline("one axis")
    ax = axes[0]
    dt = e.dtype(0)
    if dt.kind not in "iuf":
        raise Decline("dtype")
    # The wrapper's kernel and accumulator: float64 for floats, 64-bit integers otherwise.
    red = e.use(__name__, "reduce3")
    acc = "np.float64" if dt.kind == "f" else "np.int64" if dt.kind == "i" else "np.uint64"
    outer = product_expr([f"{{i0}}.shape[{d}]" for d in range(ax)])
    inner = product_expr([f"{{i0}}.shape[{d}]" for d in range(ax + 1, r)])
    e.line(f"{{p}}_x3 = {{i0}}.reshape(({outer}, {{i0}}.shape[{ax}], {inner}))",
           f"{{p}}_s = np.empty(({{p}}_x3.shape[0], {{p}}_x3.shape[2]), {np_type(dt)})",
           "if {p}_x3.shape[1] == 0:",
           "    {p}_s[:] = 0",
           "else:",
           f"    {red}({{p}}_x3, {{p}}_s, np.zeros((2, {{p}}_x3.shape[2]), {acc}), {_rd.SUM})")
    shape = [f"{{i0}}.shape[{d}]" if d != ax else "1" for d in range(r) if keep or d != ax]
    e.line(f"{{o0}} = {{p}}_s.reshape(({', '.join(shape)}{',' if len(shape) == 1 else ''}))")
    e.declare(0, dt, len(shape))


for _v, _bind in REDUCE_BINDS["ReduceSum"]:
    form("ReduceSum", since=_v, bind=_bind)(_reduce_sum)


# -- elementwise -----------------------------------------------------------------------------------

_BIN = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}


def _operand(e, k):
    # A constant operand is read from its initializer, an argument like any weight, never written into the
    # source as a literal: blocks that differ only in a constant's value then generate one source, compiled once
    # (an image model's 60 scale-and-shift pairs were 54 kinds).
    if e.rank(k) == 0:
        return f"{{i{k}}}[()]"
    return f"{{i{k}}}"


def _binary(e, bound):
    a, b = e.dtype(0), e.dtype(1)
    if a != b or a.kind not in "iuf" or (a.kind != "f" and e.node.op_type == "Div"):
        raise Decline("dtype")
    np_type(a)
    x, y = _operand(e, 0), _operand(e, 1)
    if e.rank(0) == 0 and e.rank(1) == 0:
        e.line(f"{{o0}} = np.empty((), {np_type(a)})", f"{{o0}}[()] = {x} {_BIN[e.node.op_type]} {y}")
        return
    e.line(f"{{o0}} = {x} {_BIN[e.node.op_type]} {y}")
    e.declare(0, a, max(e.rank(0), e.rank(1)))


for _name in _BIN:  # the binds of ops.elementwise: the wrappers' and the CUDA launches'
    for _v in BINARY[_name][1]:
        form(_name, since=_v, bind=BINARY[_name][0])(_binary)


# -- matmul and norms ------------------------------------------------------------------------------

def _matmul(e, b):
    float_only(e, 0, 1)
    e.exact = False  # several rows: the panel product here, BLAS in the wrapper
    ra, rb = e.rank(0), e.rank(1)
    if rb != 2 or ra < 1:
        raise Decline("batched weights")
    w = e.const(1)
    if w is not None and (w.ndim != 2 or w.dtype != F32 or not w.size):
        w = None
    e.use("runtime.errors", "ShapeMismatchError")
    if w is not None and mlas_order():  # onnxruntime's packed order (ops/_mlas_sgemm)
        mm = e.use(__name__, "matmul_mlas")
        weight, inner, ncols = (f"{e.constant(pack_slices(w))}, np.int64({w.shape[0]}), np.int64({w.shape[1]})",
                                str(w.shape[0]), str(w.shape[1]))
    elif w is None and mlas_order():  # a computed weight, in onnxruntime's order (ops/_mlas_sgemm.sgemm_mlas)
        mm = e.use(__name__, "matmul_mlas_rt")
        weight, inner, ncols = f"{{i1}}, np.int64({ort_threads()})", "{i1}.shape[0]", "{i1}.shape[1]"
    elif w is not None:  # a constant weight: packed into column panels once, here
        mm = e.use(__name__, "matmul_panels")
        # A run-time int, not a literal: a literal argument makes Numba compile the callee once per value.
        weight, inner, ncols = f"{e.constant(pack_panels(w))}, np.int64({w.shape[1]})", str(w.shape[0]), str(w.shape[1])
    else:
        mm = e.use(__name__, "matmul2")
        weight, inner, ncols = "{i1}", "{i1}.shape[0]", "{i1}.shape[1]"
    e.line(f"if {{i0}}.shape[{ra - 1}] != {inner}:",
           f"    raise ShapeMismatchError__runtime_errors(\"{quote(e.node)}: the inner dimensions do not match\")")
    e.declare(0, F32, ra)
    if ra == 1:
        e.line(f"{{o0}} = {mm}({{i0}}.reshape((1, {{i0}}.shape[0])), {weight}, nthreads).reshape(({ncols},))")
        return
    lead = [f"{{i0}}.shape[{d}]" for d in range(ra - 1)]
    e.line(f"{{p}}_m = {product_expr(lead)}",
           f"{{o0}} = {mm}({{i0}}.reshape(({{p}}_m, {{i0}}.shape[{ra - 1}])), {weight}, nthreads).reshape(("
           f"{', '.join(lead)}, {ncols}))")


for _v in (1, 9, 13):
    form("MatMul", since=_v, bind=bind_matmul)(_matmul)
