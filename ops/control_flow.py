"""Control flow: If, Loop and Scan, each running its subgraphs as child plans.

Child plans are built once at bind time (``runtime.subgraph.plan_subgraph``)
and see outer-scope values by name: the executor passes every captured value
after the node's declared inputs, in ``ctx.captured`` order.

Invariants:
- Loop and Scan outputs are fresh arrays (scan outputs are stacked copies);
- a Loop with zero iterations returns its initial loop-carried values and
  empty scan outputs of the body's declared dtype;
- Scan slices are made contiguous before the body sees them.
"""
from __future__ import annotations

import numpy as np

from runtime.errors import InvalidArgumentError, RunTerminatedError
from runtime.options import CURRENT_RUN_OPTIONS
from runtime.subgraph import plan_subgraph
from ._common import norm_axis
from .registry import op

_I64 = np.dtype(np.int64)


def _scalar_bool(x, what):
    if x is None:
        return True
    a = np.asarray(x)
    if a.size != 1:
        raise InvalidArgumentError(f"{what} must hold exactly one element, got shape {list(a.shape)}")
    return bool(a.reshape(-1)[0])


def _pack(outs):
    return outs[0] if len(outs) == 1 else tuple(outs)


@op("If", 1, factory=True)
def If(ctx, then_branch=None, else_branch=None):
    then_p = plan_subgraph(then_branch, ctx)
    else_p = plan_subgraph(else_branch, ctx)
    n = ctx.n_inputs

    def run(cond, *captured):
        branch = then_p if _scalar_bool(cond, "If condition") else else_p
        return _pack(branch.run([], captured[n - 1:] if n else captured))
    return run


for _v in (11, 13, 16, 19, 21, 23, 24, 25):
    op("If", _v, factory=True)(If)


def _empty_like_output(plan, k):
    vi = plan.plan.graph.outputs[k]
    dt = vi.dtype if vi.dtype is not None else np.dtype(np.float32)
    tail = tuple(d if isinstance(d, int) else 0 for d in (vi.shape or ()))
    return np.zeros((0,) + tail, dtype=dt)


def run_loop(child, m, cond, carried, captured, n_carried, n_scan, to_host=None, **run_kw):
    """Iterate a Loop body: ``(carried values, per-output lists of scan values)``.  ``to_host`` reads the body's
    condition where it is computed elsewhere (the CUDA form); ``run_kw`` goes to ``ChildPlan.run``."""
    trip = None if m is None else int(np.asarray(m).reshape(-1)[0])
    keep = _scalar_bool(cond, "Loop condition")
    scans = [[] for _ in range(n_scan)]
    i = 0
    while keep and (trip is None or i < trip):
        ro = CURRENT_RUN_OPTIONS.get()
        if ro is not None and ro.terminate:
            raise RunTerminatedError(f"the Loop was stopped at iteration {i}: RunOptions.terminate is set")
        outs = child.run([np.array(i, _I64), np.array(keep), *carried], captured, **run_kw)
        keep = _scalar_bool(outs[0] if to_host is None else to_host(outs[0]), "Loop body condition")
        carried = list(outs[1:1 + n_carried])
        for k in range(n_scan):
            scans[k].append(outs[1 + n_carried + k])
        i += 1
    return carried, scans


def _stack_loop(name, values):
    """A Loop scan output: a list of sequences stays a list; tensors are stacked along a new first axis."""
    return values if isinstance(values[0], list) else np.stack([np.asarray(x) for x in values])


def loop_factory(stack=_stack_loop, to_host=None, **run_kw):
    """Loop over a child plan of its body: ``stack(name, values)`` makes each scan output, ``to_host`` and
    ``run_kw`` go to ``run_loop`` (the CUDA form passes device ones)."""
    def factory(ctx, body=None):
        child = plan_subgraph(body, ctx)
        n_in = ctx.n_inputs
        n_carried = max(n_in - 2, 0)
        n_scan = len(child.output_names) - 1 - n_carried

        def run(*args):
            m, cond = (args + (None, None))[:2]
            res, scans = run_loop(child, m, cond, list(args[2:n_in]), args[n_in:], n_carried, n_scan, to_host,
                                  **run_kw)
            for k in range(n_scan):
                res.append(stack("Loop", scans[k]) if scans[k] else _empty_like_output(child, 1 + n_carried + k))
            return _pack(res)
        return run
    return factory


Loop = loop_factory()
op("Loop", 1, factory=True)(Loop)


for _v in (11, 13, 16, 19, 21, 23, 24, 25):
    op("Loop", _v, factory=True)(Loop)


def _take(x, a, idx):
    v = np.asarray(np.take(x, idx, axis=a))
    return v if v.flags.c_contiguous else v.copy()


def _stack(name, seq, axis):
    return np.stack(seq, axis=axis)


def _scan_core(child, states, xs, captured, in_axes, in_dirs, out_axes, out_dirs, n_state, take=_take,
               stack=_stack):
    """Run a Scan body over its inputs: ``take(x, axis, index)`` slices one input, ``stack(name, values, axis)``
    stacks one output's values (numpy here; the CUDA form passes device ones)."""
    if not xs:
        raise InvalidArgumentError("Scan needs at least one scan input")
    axes = [norm_axis(a, x.ndim, "scan_input_axes") for a, x in zip(in_axes, xs)]
    steps = int(xs[0].shape[axes[0]])
    for x, a in zip(xs, axes):
        if int(x.shape[a]) != steps:
            raise InvalidArgumentError(
                f"Scan inputs disagree on the sequence length: {steps} and {x.shape[a]}")
    n_out = len(child.output_names) - n_state
    outs_t = [[] for _ in range(n_out)]
    states = list(states)
    for t in range(steps):
        sl = [take(x, a, steps - 1 - t if d else t) for x, a, d in zip(xs, axes, in_dirs)]
        outs = child.run([*states, *sl], captured)
        states = list(outs[:n_state])
        for k in range(n_out):
            outs_t[k].append(outs[n_state + k])
    res = states
    for k in range(n_out):
        seq = outs_t[k][::-1] if out_dirs[k] else outs_t[k]
        if seq:
            rank = len(seq[0].shape) + 1
            res.append(stack("Scan", seq, norm_axis(out_axes[k], rank, "scan_output_axes")))
        else:
            res.append(_empty_like_output(child, n_state + k))
    return res


def scan_factory(take=_take, stack=_stack):
    """Scan (opset 9 on) over a child plan of its body, slicing with ``take`` and stacking with ``stack`` (the CUDA
    form passes device ones)."""
    def factory(ctx, body=None, num_scan_inputs=1, scan_input_axes=None, scan_input_directions=None,
                scan_output_axes=None, scan_output_directions=None):
        child = plan_subgraph(body, ctx)
        n_in = ctx.n_inputs
        m = int(num_scan_inputs)
        n_state = n_in - m
        n_out = len(child.output_names) - n_state
        in_axes = list(scan_input_axes or [0] * m)
        in_dirs = list(scan_input_directions or [0] * m)
        out_axes = list(scan_output_axes or [0] * n_out)
        out_dirs = list(scan_output_directions or [0] * n_out)

        def run(*args):
            return _pack(_scan_core(child, args[:n_state], args[n_state:n_in], args[n_in:], in_axes, in_dirs,
                                    out_axes, out_dirs, n_state, take=take, stack=stack))
        return run
    return factory


Scan = scan_factory()
op("Scan", 9, factory=True)(Scan)


for _v in (11, 16, 19, 21, 23, 24, 25):
    op("Scan", _v, factory=True)(Scan)


@op("Scan", 8, factory=True)
def Scan8(ctx, body=None, num_scan_inputs=1, directions=None):
    """Opset 8: a leading batch axis on every state and scan input, and optional sequence_lens."""
    child = plan_subgraph(body, ctx)
    n_in = ctx.n_inputs
    m = int(num_scan_inputs)
    n_state = n_in - 1 - m
    n_out = len(child.output_names) - n_state
    dirs = list(directions or [0] * m)

    def run(seq_lens, *args):
        states = args[:n_state]
        xs = args[n_state:n_in - 1]
        captured = args[n_in - 1:]
        batch = xs[0].shape[0]
        per = []
        for b in range(batch):
            L = xs[0].shape[1] if seq_lens is None else int(np.asarray(seq_lens).reshape(-1)[b])
            r = _scan_core(child, [s[b] for s in states], [x[b, :L] for x in xs], captured, [0] * m, dirs,
                           [0] * n_out, [0] * n_out, n_state)
            per.append(r)
        return _pack([np.stack([p[k] for p in per]) for k in range(n_state + n_out)])
    return run
