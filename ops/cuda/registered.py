"""Registrations of the CUDA kernel wrappers of ``elementwise``, ``cast``, ``softmax``,
``matmul``, ``indexing`` and ``reduce`` (ArgMax, ArgMin and the ten reductions) with ``ops.registry`` (provider ``CUDAExecutionProvider``), plus the
view ops Reshape, Squeeze, Unsqueeze, Flatten and Identity.

The kernel modules' wrappers take ``n_outputs=`` where the registry hands a ``ctx``, and spell some
attribute defaults for their own use (ArgMax's ``axis=-1``); the thin functions here adapt them, with
each op's ONNX attribute names and defaults copied from its CPU twin, at the same since-versions the CPU
twin registers.

Invariants:
- inputs arrive as C-contiguous device arrays except the positions named in ``host_inputs`` (Reshape's
  shape, Squeeze/Unsqueeze's axes, Gather's indices), which arrive as host numpy arrays;
- results are fresh device arrays, except the view ops (``views=True``), whose results are reshaped views
  of their input (``DeviceNDArray.reshape`` on a contiguous array shares its memory);
- Gather validates its host indices before launch (``IndexOutOfRangeError``); indices that are an
  initializer are validated and uploaded once, other indices are uploaded per run (a counted transfer);
- configurations the kernels do not cover (float Mod, Pow of a bool, Cast to or from the 8-bit floats and the
  packed 4- and 2-bit types, Dropout in training) raise ``InvalidArgumentError`` when the node is planned or
  runs.
"""
from __future__ import annotations

import math

import numpy as np

from ops._common import Plain, check_indices, norm_axis
from ops.cast import CastOp, bind_cast, bind_cast_1
from ops.elementwise import BINARY, UNARY, Binary, Unary, _bound
from ops.indexing import GATHER_VERSIONS, GatherOp, bind_gather
from ops.matmul import bind_matmul, matmul_shapes
from ops.reduce import REDUCE_BINDS, ArgOp, ReduceOp, bind_argmax, bind_argmin, reduce_axes
from ops.registry import op
from ops.movement import bind_where
from ops.shape import VIEW_BINDS, FlattenOp, ViewOp, bind_flatten, bind_identity, flatten_shape, identity, view_shape
from ops.softmax import SOFTMAX_BINDS, SoftmaxOp
from runtime import cuda as rc
from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from . import cast as kcast
from . import elementwise as kel
from . import indexing as kidx
from . import matmul as kmm
from . import shape as kshape
from .contrib_norm import zeros
from . import reduce as kred
from . import softmax as ksm
from ._common import check_device, flat, grid1d, host_array, upload_small

__all__ = ["CUDA", "reshape_device"]

CUDA = "CUDAExecutionProvider"
MS = "com.microsoft"


def reshape_device(a, shape):
    """A view of the contiguous device array ``a`` with ``shape`` (0-d included)."""
    shape = tuple(int(d) for d in shape)
    if tuple(a.shape) == shape:
        return a
    return a.reshape(shape)


# -- elementwise -----------------------------------------------------------------------------------

def launch_binary(b: Binary, ctx=None):
    """The CUDA implementation of the binary ops ``ops.cuda.elementwise`` computes (their bind is
    ``ops.elementwise``'s)."""
    if b.op == "Pow":
        return kel.power

    def run(A, B):
        return kel.binary(b.op, A, B, kernel=b.kernel, out_dtype=b.out_dtype)
    return run


def launch_unary(u: Unary, ctx=None):
    """The CUDA implementation of the unary ops and activations ``ops.cuda.elementwise`` computes (their bind is
    ``ops.elementwise``'s: attribute defaults and checks written once there)."""
    kel.check_unary(u.kernel)  # a kernel the device tables lack is refused at plan time
    no_int = u.check == "no_int"

    def run(X):
        if no_int and np.dtype(X.dtype).kind in "iu":
            raise InvalidArgumentError(f"{u.op} expects a floating-point input, got {X.dtype}")
        return kel.unary(u.op, X, kernel=u.kernel, p0=u.p0, p1=u.p1, out_dtype=u.out_dtype)
    return run


for _table, _names, _launch in ((BINARY, kel.BINARY_OPS, launch_binary), (UNARY, kel.UNARY_OPS, launch_unary)):
    for _name in _names:
        _bind, _vers = _table[_name]
        for _v in _vers:
            op(_name, _v, provider=CUDA, bind=_bind)(_launch)


def _sign(ctx):
    """Sign: the float, integer or bool form by the input's dtype."""
    def run(X):
        kind = kel._kind(X.dtype)
        if kind == "b":
            return kel._copy(X)
        return kel.unary("Sign", X, kernel="sign_f" if kind == "f" else "sign")
    return run


def _variadic(name, kernel, mean=False):
    def factory(ctx):
        def run(*xs):
            return kel.variadic(name, kernel, xs, mean)
        return run
    return factory


def _mod(ctx, fmod=0):
    if fmod not in (0, 1):
        raise InvalidAttributeError(f"Mod: fmod must be 0 or 1, got {fmod}")

    def run(A, B):
        if kel._kind(A.dtype) != "i":
            raise InvalidArgumentError(f"Mod: the CUDA kernel takes integer operands, got {A.dtype}")
        return kel.binary("Mod", A, B, kernel="fmod_i" if fmod else "mod_i")
    return run


def _prelu(ctx):
    def run(X, slope):
        return kel.binary("PRelu", X, slope, kernel="prelu")
    return run


def _clip6(ctx, min=-3.4028234663852886e38, max=3.4028234663852886e38):
    def run(X):
        return kel.clip(X, min, max)
    return run


def _clip(ctx):
    def run(X, lo=None, hi=None):
        dt = np.dtype(X.dtype)
        return kel.clip(X, _bound(None if lo is None else host_array("Clip", "min", lo, False), dt, False),
                        _bound(None if hi is None else host_array("Clip", "max", hi, False), dt, True))
    return run


def _bitshift(ctx, direction=""):
    if direction not in ("LEFT", "RIGHT"):
        raise InvalidAttributeError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    return lambda A, B: kel.bitshift(A, B, direction == "LEFT")


op("BitShift", 11, provider=CUDA, factory=True)(_bitshift)
op("Sign", 9, provider=CUDA, factory=True)(_sign)
for _v in (8, 12, 13):
    op("Max", _v, provider=CUDA, factory=True)(_variadic("Max", "max"))
    op("Min", _v, provider=CUDA, factory=True)(_variadic("Min", "min"))
for _v in (8, 13):
    op("Sum", _v, provider=CUDA, factory=True)(_variadic("Sum", "add"))
    op("Mean", _v, provider=CUDA, factory=True)(_variadic("Mean", "add", mean=True))
for _v in (10, 13):
    op("Mod", _v, provider=CUDA, factory=True)(_mod)
for _v in (7, 9, 16):
    op("PRelu", _v, provider=CUDA, factory=True)(_prelu)
op("Clip", 6, provider=CUDA, factory=True)(_clip6)
for _v in (11, 12, 13):
    op("Clip", _v, provider=CUDA, factory=True, host_inputs=(1, 2))(_clip)


def launch_where(b: Plain, ctx=None):
    """The CUDA implementation of Where (its bind is ``ops.movement``'s)."""
    return kel.Where


op("Where", 9, provider=CUDA, bind=bind_where)(launch_where)


# -- Cast ------------------------------------------------------------------------------------------

def launch_cast(c: CastOp, ctx=None):
    """The CUDA implementation of Cast (its bind is ``ops.cast``'s)."""
    def run(input):
        return kcast.Cast(input, c.dtype, c.saturate)
    return run


for _since, _bind in ((1, bind_cast_1), (6, bind_cast)):
    op("Cast", _since, provider=CUDA, bind=_bind)(launch_cast)


@op("CastLike", 15, provider=CUDA)
def cast_like(input, target_type, saturate=1, round_mode="up"):
    """CastLike: Cast to ``target_type``'s dtype (only its dtype is read; nothing crosses)."""
    if target_type is None:
        raise InvalidArgumentError("CastLike: the target_type input is required")
    return kcast.Cast(input, np.dtype(target_type.dtype), saturate)


# -- Softmax ---------------------------------------------------------------------------------------

def _softmax(input, axis, coerce_2d, name="Softmax"):
    check_device(name, input=input)
    mode = {"Softmax": ksm.SOFTMAX, "LogSoftmax": ksm.LOG_SOFTMAX, "Hardmax": ksm.HARDMAX}[name]
    shape = tuple(input.shape)
    if input.ndim == 0:
        return ksm.Softmax(input.reshape((1,)), mode=mode, name=name).reshape(())
    ax = norm_axis(axis, input.ndim)
    inner = int(math.prod(shape[ax + 1:]))
    if input.size == 0:
        return rc.device_empty(shape, input.dtype)
    if coerce_2d or inner == 1:
        # opset < 13: over the flattened trailing block [axis:]; an inner axis followed only by extent-1 axes is
        # the last axis of a (rows, n) view
        n = int(math.prod(shape[ax:])) if coerce_2d else shape[ax]
        return ksm.Softmax(input.reshape((input.size // n, n)), mode=mode, name=name).reshape(shape)
    # another axis: moved last by a device copy, and back
    moved = kshape.view_copy(name, input, lambda p: (np.moveaxis(p, ax, -1), np.moveaxis(p, ax, -1).shape))
    y = ksm.Softmax(moved, mode=mode, name=name)
    return kshape.view_copy(name, y, lambda p: (np.moveaxis(p, -1, ax), shape))


def launch_softmax(b: SoftmaxOp, ctx=None):
    """The CUDA implementation of Softmax, LogSoftmax and Hardmax (their bind is ``ops.softmax``'s)."""
    def run(input):
        return _softmax(input, b.axis, b.coerce_2d, b.op)
    return run


for _since, _bind in SOFTMAX_BINDS:
    for _name in ("Softmax", "LogSoftmax", "Hardmax"):
        op(_name, _since, provider=CUDA, bind=_bind)(launch_softmax)



# -- MatMul ----------------------------------------------------------------------------------------

def launch_matmul(b: Plain, ctx=None):
    """The CUDA implementation of MatMul (its bind is ``ops.matmul``'s)."""
    return MatMul


def MatMul(A, B):
    """numpy ``matmul`` semantics: 1-d operands promoted and squeezed, leading (batch) dims broadcast.

    One row in all (M == 1 after folding the batch into rows) with a 2-d ``B`` runs the GEMV; everything
    else the tiled GEMM, in one launch when the batches fold into strides, else one launch per batch.
    """
    check_device("MatMul", A=A, B=B)
    M, K, N, ba, bb, bc, out_shape, final = matmul_shapes(A.shape, B.shape)
    kmm._check_dtypes("MatMul", A, B)
    pa, pb, pc = int(math.prod(ba)), int(math.prod(bb)), int(math.prod(bc))
    C = rc.device_empty(out_shape, A.dtype)
    if C.size == 0:
        return reshape_device(C, final)
    fa, fb, fc = flat(A), flat(B), flat(C)
    if pb == 1 and pa == pc:
        rows = pa * M  # a weight shared by every batch: fold the batch into rows
        if rows == 1:
            kmm.launch_gemv(fa, fb, None, fc, K, N)
        else:
            _gemm(fa, fb, fc, rows, N, K, 0, 0, 1)
    elif (pa == 1 or pa == pc) and pb == pc:  # batches line up, or A is shared by every batch of B
        _gemm(fa, fb, fc, M, N, K, M * K if pa > 1 else 0, K * N if pb > 1 else 0, pc)
    else:  # general broadcast: one launch per output batch
        nd = len(bc)
        ia = np.arange(pa).reshape((1,) * (nd - len(ba)) + ba)
        ib = np.arange(pb).reshape((1,) * (nd - len(bb)) + bb)
        ja = np.broadcast_to(ia, bc).reshape(-1)
        jb = np.broadcast_to(ib, bc).reshape(-1)
        for z in range(pc):
            a0, b0 = int(ja[z]) * M * K, int(jb[z]) * K * N
            _gemm(fa[a0:a0 + M * K], fb[b0:b0 + K * N], fc[z * M * N:(z + 1) * M * N], M, N, K, 0, 0, 1)
    return reshape_device(C, final)


def _gemm(a, b, c, M, N, K, a_stride, b_stride, batch):
    grid = (-(-N // kmm.TILE), -(-M // kmm.TILE), batch)
    kmm._gemm_tiled[grid, (kmm.TILE, kmm.TILE)](a, b, c, M, N, K, a_stride, b_stride)


for _v in (1, 9, 13):
    op("MatMul", _v, provider=CUDA, bind=bind_matmul)(launch_matmul)


# -- Gemm ------------------------------------------------------------------------------------------

def _transposed(x):
    return kshape.view_copy("Gemm", x, lambda p: (p.T, p.T.shape))


def gemm_factory(ctx, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    """Gemm as MatMul of the (transposed) operands, then ``alpha`` and ``beta * C`` by the elementwise kernels;
    the checks and messages are the CPU's (``ops.matmul``)."""
    alpha, beta = float(alpha), float(beta)

    def run(a, b, c=None):
        check_device("Gemm", A=a, B=b, C=c)
        if a.ndim != 2 or b.ndim != 2:
            raise ShapeMismatchError(f"Gemm: A and B must be 2-d, got shapes {list(a.shape)} and {list(b.shape)}")
        if a.dtype != b.dtype or (c is not None and c.dtype != a.dtype):
            raise InvalidArgumentError(f"Gemm: inputs must share one dtype, got "
                                       f"{[str(x.dtype) for x in (a, b, c) if x is not None]}")
        A = _transposed(a) if transA else a
        B = _transposed(b) if transB else b
        (m, k), (k2, n) = tuple(A.shape), tuple(B.shape)
        if k != k2:
            raise ShapeMismatchError(f"Gemm: inner dimensions differ: op(A) is {[m, k]}, op(B) is {[k2, n]} "
                                     f"(transA={transA}, transB={transB})")
        if c is not None and beta != 0.0:
            cs = (1,) * (2 - c.ndim) + tuple(c.shape)
            if len(cs) != 2 or cs[0] not in (1, m) or cs[1] not in (1, n):
                raise ShapeMismatchError(f"Gemm: C of shape {list(c.shape)} cannot be broadcast to {[m, n]}")
        y = MatMul(A, B) if k else zeros((m, n), a.dtype)
        dt = np.dtype(a.dtype)
        if alpha != 1.0:
            y = kel.binary("Mul", y, upload_small(np.array(alpha, dt)))
        if c is not None and beta != 0.0:
            cb = c if beta == 1.0 else kel.binary("Mul", c, upload_small(np.array(beta, dt)))
            y = kel.binary("Add", y, cb)
        return y
    return run


for _v in (1, 6, 7, 9, 11, 13):
    op("Gemm", _v, provider=CUDA, factory=True)(gemm_factory)


# -- Gather ----------------------------------------------------------------------------------------

def launch_gather(b: GatherOp, ctx):
    """The CUDA implementation of Gather (its bind is ``ops.indexing``'s), with host indices; indices that are an
    initializer are checked and uploaded once."""
    node, graph, axis = ctx.node, ctx.graph, b.axis
    const = node is not None and graph is not None and len(node.inputs) > 1 and \
        node.inputs[1] in getattr(graph, "initializers", {})
    cache = {}

    def run(data, indices):
        check_device("Gather", data=data)
        if data.ndim == 0:
            raise InvalidArgumentError("Gather: data must have rank >= 1, got a scalar")
        if rc.is_device_array(indices):  # only when a caller bypasses host_inputs
            indices = rc.to_host(indices)
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            raise InvalidArgumentError(f"Gather: indices must be int32 or int64, got {idx.dtype}")
        ax = norm_axis(axis, data.ndim)
        axis_n = tuple(data.shape)[ax]
        d_idx = cache.get(axis_n) if const else None
        if d_idx is None:
            check_indices("Gather", idx, -axis_n, axis_n)
            norm = np.where(idx < 0, idx + axis_n, idx).astype(np.int64).reshape(-1)
            d_idx = rc.to_device(norm) if norm.size else None
            if const:
                cache[axis_n] = d_idx
        shape = tuple(data.shape)[:ax] + tuple(idx.shape) + tuple(data.shape)[ax + 1:]
        out = rc.device_empty(shape, data.dtype)
        if out.size:
            inner = int(math.prod(tuple(data.shape)[ax + 1:]))
            blocks, threads = grid1d(out.size)
            kidx._gather3[blocks, threads](flat(data), d_idx, flat(out), axis_n, idx.size, inner)
        return out
    return run


for _v in GATHER_VERSIONS:
    op("Gather", _v, provider=CUDA, host_inputs=(1,), bind=bind_gather)(launch_gather)


# -- ArgMax ----------------------------------------------------------------------------------------

def launch_argmax(b: ArgOp, ctx=None):
    """The CUDA implementation of ArgMax (its bind is ``ops.reduce``'s)."""
    def run(data):
        return argmax(data, b.axis, b.keepdims, int(b.select_last_index))
    return run


def argmax(data, axis, keepdims, select_last_index):
    check_device("ArgMax", data=data)
    if np.dtype(data.dtype) not in kred.FLOATS or select_last_index:
        return kred.arg_reduce("ArgMax", data, axis, keepdims, True, bool(select_last_index))
    if data.ndim:
        ax = norm_axis(axis, data.ndim)
        if ax != data.ndim - 1 and int(math.prod(tuple(data.shape)[ax + 1:])) == 1:
            # only extent-1 axes follow: reduce the last axis of a view, then restore the kept axes
            shape = tuple(data.shape)
            y = kred.ArgMax(data.reshape(shape[:ax + 1]), -1, keepdims, select_last_index)
            return reshape_device(y, shape[:ax] + ((1,) if keepdims else ()) + shape[ax + 1:])
        if ax != data.ndim - 1:
            return kred.arg_reduce("ArgMax", data, axis, keepdims, True, False)
    return kred.ArgMax(data, axis, keepdims, select_last_index)


def launch_argmin(b: ArgOp, ctx=None):
    """The CUDA implementation of ArgMin (its bind is ``ops.reduce``'s)."""
    def run(data):
        return kred.arg_reduce("ArgMin", data, b.axis, b.keepdims, False, b.select_last_index)
    return run


op("ArgMax", 1, provider=CUDA, bind=bind_argmax)(launch_argmax)
op("ArgMin", 1, provider=CUDA, bind=bind_argmin)(launch_argmin)


# -- reductions ------------------------------------------------------------------------------------

def launch_reduce(b: ReduceOp, ctx):
    """The CUDA implementation of the reductions (their binds are ``ops.reduce``'s); the axes input, from
    ReduceSum-13 and the others' 18, is read on the host."""
    name = ctx.op_type

    def run(data, axes=None):
        if axes is not None:
            axes = host_array(name, "axes", axes)
        return kred.reduce(name, b.mode, data, reduce_axes(b, data.ndim, axes), b.keepdims)
    return run


for _name, _binds in REDUCE_BINDS.items():
    for _v, _bind in _binds:
        op(_name, _v, provider=CUDA, bind=_bind, host_inputs=(1,) if _v > 1 else ())(launch_reduce)


# -- Dropout (inference) ---------------------------------------------------------------------------

def _dropout(ctx, ratio=0.5, seed=None, is_test=0, consumed_inputs=None):
    """Dropout outside training: its input (a view) and, when asked for, a mask of ones (old opsets: the data's
    dtype, then bool).  A training run is refused: the CUDA provider has no random kernels."""
    mask_dt = np.dtype(np.bool_) if ctx.opset >= 10 else None
    want_mask = ctx.n_outputs > 1 and ctx.outputs_used[1]

    def run(data, ratio_in=None, training_mode=None):
        if training_mode is not None and bool(host_array("Dropout", "training_mode", training_mode, False)
                                              .reshape(-1)[0]):
            r = 0.5 if ratio_in is None else float(host_array("Dropout", "ratio", ratio_in, False).reshape(-1)[0])
            if r != 0:
                raise InvalidArgumentError("Dropout: the CUDA provider runs Dropout outside training only "
                                           "(training_mode is true)")
        if ctx.n_outputs == 1:
            return data
        mask = None
        if want_mask:
            mask = rc.device_empty(tuple(data.shape), mask_dt or data.dtype)
            if mask.size:
                blocks, threads = grid1d(mask.size)
                kcast.fill_ones[blocks, threads](flat(mask))
        return data, mask
    return run


op("Dropout", 1, provider=CUDA, factory=True, views=True)(_dropout)
op("Dropout", 10, provider=CUDA, factory=True, views=True)(_dropout)
op("Dropout", 12, provider=CUDA, factory=True, views=True, host_inputs=(1, 2))(_dropout)


# -- views -----------------------------------------------------------------------------------------

op("Identity", 1, views=True, provider=CUDA, bind=bind_identity)(identity)  # ops.shape's, on any array


def launch_view(b: ViewOp, ctx=None):
    """The CUDA implementation of Reshape, Squeeze and Unsqueeze: a view of the device array with the shape
    ``ops.shape.view_shape`` computes (their binds are ``ops.shape``'s); the shape or axes input is read on the
    host."""
    def run(data, second=None):
        return reshape_device(data, view_shape(b, tuple(data.shape), second))
    return run


for _name, _binds in VIEW_BINDS.items():
    for _v, _bind in _binds:
        op(_name, _v, views=True, provider=CUDA, host_inputs=(1,) if _v > 1 else (), bind=_bind)(launch_view)


def launch_flatten(b: FlattenOp, ctx=None):
    """The CUDA implementation of Flatten (its bind and shape are ``ops.shape``'s)."""
    def run(input):
        return reshape_device(input, flatten_shape(tuple(input.shape), b.axis))
    return run


op("Flatten", 1, views=True, provider=CUDA, bind=bind_flatten)(launch_flatten)
