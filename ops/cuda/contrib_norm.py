"""CUDA row norms: one kernel for LayerNormalization and RMS normalization, and the launch of the contrib row
norms (SimplifiedLayerNormalization, the contrib LayerNormalization, com.microsoft SkipSimplifiedLayerNormalization
and SkipLayerNormalization).

Those ops are written once in ``ops/contrib_norm.py`` (their binds, ``RowNorm``, and ``row_geometry``'s checks
and messages); ``launch`` is their CUDA implementation.  ``launch_rows`` also serves opset-17
LayerNormalization (``ops/cuda/norm.py``).

One block per row of the canonical ``(rows, n)`` view, float32 accumulation through the shared block
reductions: ``v = x (+ skip (+ bias))`` (a skip with fewer leading rows broadcasts as ``row % skip_rows``,
like the CPU), stored as ``input_skip_bias_sum`` when asked; then a two-pass mean and centred variance
(RMS: the mean is 0 and the second pass is the mean square), ``y = (v - mean) * rsqrt(var + eps) * scale
(+ beta)``.

Invariants (match ``ops/contrib_norm.py``):
- ``Y`` has the dtype of ``scale`` for SimplifiedLayerNormalization and of the input otherwise;
- statistics have shape ``x.shape[:axis] + (1,) * (rank - axis)`` and the dtype the bound op states; the
  simplified skip norm's ``mean`` is zeros (onnxruntime does not compute it), one launch when the graph names
  it; an output the graph leaves unnamed is None and costs nothing;
- all tensors are C-contiguous device arrays; nothing is read back to the host.
"""
from __future__ import annotations

import math

import numpy as np

from runtime import cuda as rc
from runtime.cuda import cuda, jit
from runtime.errors import InvalidArgumentError
from ops import contrib_norm as cn
from ops._common import norm_axis
from ops.registry import op
from ._common import FLOATS, MAX_ROW_THREADS, block_sum, check_device, fill0, flat, grid1d, row_threads

__all__ = ["launch", "launch_rows", "geometry", "zeros"]

CUDA = "CUDAExecutionProvider"
MS = "com.microsoft"
F32 = np.dtype(np.float32)


@jit(device=True)
def _in(x, skip, bias, has_skip, has_bias, base, sbase, j):
    v = np.float32(x[base + j])
    if has_skip:
        v += np.float32(skip[sbase + j])
        if has_bias:
            v += np.float32(bias[j])
    return v


@jit
def _rows(x, skip, skip_rows, bias, has_skip, has_bias, scale, beta, has_beta, y, ssum, want_sum, mean_out,
          inv_out, want_stats, n, eps, simplified):
    """One block per row: y = (v - mean) * rsqrt(var + eps) * scale (+ beta), v = x (+ skip (+ bias))."""
    sh = cuda.shared.array(MAX_ROW_THREADS, np.float32)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    base = row * n
    sbase = (row % skip_rows) * n
    mean = np.float32(0.0)
    if not simplified:
        acc = np.float32(0.0)
        for j in range(tid, n, nt):
            v = _in(x, skip, bias, has_skip, has_bias, base, sbase, j)
            if want_sum:
                ssum[base + j] = v
            acc += v
        mean = block_sum(sh, tid, nt, acc) / np.float32(n)
    acc = np.float32(0.0)
    for j in range(tid, n, nt):
        v = _in(x, skip, bias, has_skip, has_bias, base, sbase, j)
        if simplified and want_sum:
            ssum[base + j] = v
        d = v - mean
        acc += d * d
    var = block_sum(sh, tid, nt, acc) / np.float32(n)
    inv = np.float32(1.0) / math.sqrt(var + eps)
    if want_stats and tid == 0:
        if not simplified:
            mean_out[row] = mean
        inv_out[row] = inv
    for j in range(tid, n, nt):
        d = (_in(x, skip, bias, has_skip, has_bias, base, sbase, j) - mean) * inv * np.float32(scale[j])
        if has_beta:
            d += np.float32(beta[j])
        y[base + j] = d


def launch_rows(x, rows, n, scale, beta, skip, skip_rows, bias, ydt, eps, want_sum, stat_dts, simplified):
    """Run ``_rows``: ``(y, input_skip_bias_sum or None, mean (rows,) or None, inv (rows,) or None)`` (the
    statistics when ``stat_dts`` gives their dtypes)."""
    y = rc.device_empty(tuple(x.shape), ydt)
    want_stats = stat_dts is not None
    mean = rc.device_empty((rows if want_stats else 1,), stat_dts[0] if want_stats else F32)
    inv = rc.device_empty((rows if want_stats else 1,), stat_dts[1] if want_stats else F32)
    ssum = rc.device_empty(tuple(x.shape), x.dtype) if want_sum else rc.device_empty((1,), x.dtype)
    if rows and n:
        dummy = flat(x)
        _rows[rows, row_threads(n)](
            flat(x), dummy if skip is None else flat(skip), skip_rows, dummy if bias is None else flat(bias),
            skip is not None, bias is not None, flat(scale), dummy if beta is None else flat(beta), beta is not None,
            flat(y), flat(ssum), bool(want_sum), mean, inv, want_stats, n, np.float32(eps), bool(simplified))
    return y, (ssum if want_sum else None), (mean if want_stats else None), (inv if want_stats else None)


def zeros(shape, dt):
    """A zero-filled device array; no transfer."""
    z = rc.device_empty(shape, dt)
    if z.size:
        blocks, threads = grid1d(z.size)
        fill0[blocks, threads](flat(z))
    return z


def geometry(b: cn.RowNorm, x, skip, scale, beta, bias):
    """The bound op's ``(ax, rows, n, skip_rows)`` for these device arrays: the CPU's checks and messages."""
    ax = norm_axis(b.axis, x.ndim)
    shape = tuple(x.shape) or (1,)
    rows, n, skip_rows, err = cn.row_geometry(shape, ax, scale.size, -1 if beta is None else beta.size,
                                              -1 if bias is None else bias.size,
                                              shape if skip is None else tuple(skip.shape), skip is not None)
    if err:
        cn.raise_norm_error(b, err)
    return ax, rows, n, skip_rows


def _check_dtypes(b: cn.RowNorm, x, skip, scale, beta, bias):
    if np.dtype(x.dtype) not in FLOATS or np.dtype(scale.dtype) not in FLOATS:
        raise InvalidArgumentError(f"{b.op}: expected float tensors, got {x.dtype} and {scale.dtype}")
    if b.skip:
        for name, t in (("skip", skip), ("gamma", scale), ("beta", beta), ("bias", bias)):
            if t is not None and t.dtype != x.dtype:
                raise InvalidArgumentError(f"{b.op}: {name} must have the input dtype {x.dtype}, got {t.dtype}")


def launch(b: cn.RowNorm, ctx=None):
    """The CUDA implementation of the contrib row norms: the bound op's per-run callable."""
    used = list(ctx.outputs_used) if ctx is not None and ctx.outputs_used else [True] * b.n_outputs
    used += [True] * (b.n_outputs - len(used))

    def run(*args):
        x, skip, scale, beta, bias = b.operands(args)
        check_device(b.op, input=x, skip=skip, scale=scale, beta=beta, bias=bias)
        _check_dtypes(b, x, skip, scale, beta, bias)
        ax, rows, n, skip_rows = geometry(b, x, skip, scale, beta, bias)
        ydt = scale.dtype if b.simplified and not b.skip else x.dtype
        sd = (b.stat_dtype(1, x.dtype), b.stat_dtype(b.stat_index(), x.dtype))
        y, s, mean, inv = launch_rows(x, rows, n, scale, beta, skip, skip_rows, bias, ydt, b.eps, b.want_sum,
                                      sd if b.want_stats else None, b.simplified)
        if b.n_outputs == 1:
            return y
        ss = tuple(x.shape)[:ax] + (1,) * (x.ndim - ax)
        outs = [y]
        for k in range(1, b.stat_index() + 1):  # (mean,) inv_std_var
            is_inv = k == b.stat_index()
            if not used[k]:
                outs.append(None)
            elif b.want_stats and (is_inv or not b.simplified):
                outs.append((inv if is_inv else mean).reshape(ss))
            else:
                outs.append(zeros(ss, b.stat_dtype(k, x.dtype)))
        if b.skip:
            outs.append(s)
        return tuple(outs[:b.n_outputs])
    return run


for _dom in ("", MS):
    op("SimplifiedLayerNormalization", 1, domain=_dom, provider=CUDA, bind=cn.bind_simplified)(launch)
op("LayerNormalization", 1, provider=CUDA, bind=cn.bind_layer_norm)(launch)
op("SkipSimplifiedLayerNormalization", 1, domain=MS, provider=CUDA, bind=cn.bind_skip_simplified)(launch)
op("SkipLayerNormalization", 1, domain=MS, provider=CUDA, bind=cn.bind_skip_layer_norm)(launch)
