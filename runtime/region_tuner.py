"""Compiled regions where they pay: the choice a plan makes from its own timed runs when the session leaves
``SessionOptions.compiled_regions`` unset.

A compiled region (``runtime/regions.py``) saves the per-node cost of the executor's loop and of each kernel's
Python wrapper, about ``DISPATCH_NS`` per step it replaces on the machines measured (a chain of 40 small nodes:
1.6 us per node; a voice-activity model's recurrent cell: 2.9).  That pays where the steps are small: a
voice-activity model's control-flow bodies, whose nodes take microseconds.  It does not pay, and can cost, where
tensors are large: an elementwise node or a copy inside a region runs its loop on one thread where its own kernel
runs in parallel (an OCR detector's feature maps: 1.13 times slower with every region on), and each region kind
costs seconds of compile on an empty cache.

So a plan in auto mode runs its first ``WARM_RUNS`` runs step by step (they load or compile the kernels), times
the next ``TIMED_RUNS`` runs and counts the elements each of their steps returns, and then keeps the regions in
which no step returned more than ``SMALL_ELEMENTS`` elements (below that the kernels run on one thread anyway)
and that replace at least two steps, provided that what they save, estimated as ``DISPATCH_NS`` per replaced
step, is at least ``MIN_GAIN`` of the run's time.  Otherwise the plan stays as it is and is never timed again.

Invariants:
- the choice changes which steps run, never a result: only regions whose every block gives its node's wrapper's
  bits are candidates (``Emitted.exact``: a MatMul's panel product is not), and the first run on the regions is
  checked against the steps they replace, on the same feeds; one differing bit turns them off for good;
- it is made once per plan (a control-flow body's plan chooses for itself), from runs without an observer
  (profiling and ``RunOptions`` runs are neither counted nor timed);
- runs that overlap the switch finish on the steps they started with (``Plan.use_regions``).
"""
from __future__ import annotations

import threading
import time

import numpy as np

__all__ = ["RegionTuner", "WARM_RUNS", "TIMED_RUNS", "SMALL_ELEMENTS", "DISPATCH_NS", "MIN_GAIN", "SETTLE_RUNS"]

WARM_RUNS = 2  # runs before timing: the first loads or compiles each kernel, a control-flow body its own regions
TIMED_RUNS = 2  # runs timed (the fastest counts), with the elements each step returns
SMALL_ELEMENTS = 1 << 14  # a step returning at most this many elements is small (ops._shifted's parallel bound)
DISPATCH_NS = 1_500  # what a region saves per step it replaces (estimate)
MIN_GAIN = 0.03  # regions are turned on when they save at least this fraction of a run
SETTLE_RUNS = WARM_RUNS + TIMED_RUNS  # runs (one after another) after which a plan has chosen; the next
# compiles what it chose


class _StepSizes:
    """An observer (``Plan.run``'s protocol) that keeps the elements each step returned."""

    __slots__ = ("elements",)

    def __init__(self, nsteps: int):
        self.elements = [0] * nsteps

    def before(self, k: int) -> None:
        pass

    def after(self, k: int, args, result, t0_ns: int) -> None:
        self.elements[k] = _elements(result)


def _elements(result) -> int:
    """The elements of a step's result: an array, or a tuple or list (several outputs, a sequence) of them."""
    if isinstance(result, np.ndarray):
        return result.size
    if isinstance(result, (tuple, list)):
        return sum(_elements(r) for r in result)
    return 0


class RegionTuner:
    """Counts a plan's runs, times the sampled ones (and the sizes of their steps), makes the choice (``decide``)
    after the last and checks it on the run that follows (``check``)."""

    def __init__(self):
        self.finished = 0  # runs that have returned
        self.started = 0  # timed runs started
        self.timed = 0  # timed runs finished
        self.elements = None  # per step: the most elements it returned in a timed run
        self.wall = None  # the fastest timed run (ns)
        self.choice = None  # after deciding: what was found, chosen and estimated (``Plan.region_choice``)
        self._before = None  # the step list the regions replaced, until the run that checks them
        self._lock = threading.Lock()

    def run(self, plan, feeds, outer=()) -> list:
        # A run is timed only once WARM_RUNS runs have returned: runs that overlap the first ones (other
        # threads) would time their compiles.
        with self._lock:
            timed = self.finished >= WARM_RUNS and self.started < TIMED_RUNS
            self.started += timed
            before, self._before = self._before, None
        if before is not None:
            return self.check(plan, before, feeds, outer)
        if not timed:
            out = plan._run(feeds, outer)
            with self._lock:
                self.finished += 1
            return out
        sizes = _StepSizes(len(plan.steps))
        t0 = time.perf_counter_ns()
        out = plan._run(feeds, outer, sizes)
        wall = time.perf_counter_ns() - t0
        with self._lock:
            self.finished += 1
            first = self.elements is None
            self.elements = sizes.elements if first else [max(a, b) for a, b in zip(self.elements, sizes.elements)]
            self.wall = wall if self.wall is None else min(self.wall, wall)
            self.timed += 1
            last = self.timed == TIMED_RUNS
        if last:
            self.decide(plan)
        return out

    def decide(self, plan) -> dict:
        """Turn on the regions that pay (see the module's docstring); returns the choice."""
        elements, wall = self.elements, self.wall
        step_of = {id(n): k for k in range(len(plan.steps)) for n in plan.step_group(k)}
        nodes = plan.graph.nodes
        candidates = plan._find_regions()
        chosen, saved = [], 0
        for a, b, em in candidates:
            steps = {step_of[id(n)] for n in nodes[a:b]}
            if len(steps) >= 2 and all(e.exact for e in em) and all(elements[k] <= SMALL_ELEMENTS for k in steps):
                chosen.append((a, b, em))
                saved += (len(steps) - 1) * DISPATCH_NS
        on = bool(chosen) and saved >= MIN_GAIN * wall
        self.choice = {"candidates": len(candidates), "small": len(chosen), "saved_ns": saved, "run_ns": wall,
                       "on": on}
        plan.region_choice = self.choice
        if on:
            with self._lock:  # the next run to start checks the regions
                self._before = plan.steps
                plan.use_regions(chosen)
        else:
            plan._tuner = None
        return self.choice

    def check(self, plan, before, feeds, outer) -> list:
        """The first run on the regions (it compiles them), checked against the steps they replaced on the same
        feeds: a result that differs in one bit turns them off again for good (``choice["same"]``)."""
        try:
            out = plan._run(feeds, outer)
            ref = plan.run_on(before, feeds, outer)
        except BaseException:  # (a bad feed, say): the next run checks instead; nothing unchecked runs
            with self._lock:
                self._before = before
            raise
        same = len(out) == len(ref) and all(_same(a, b) for a, b in zip(out, ref))
        self.choice["same"] = same
        if not same:
            self.choice["on"] = False
            plan.use_regions([])
        plan._tuner = None
        return ref


def _same(a, b) -> bool:
    """Bit for bit (NaN equal to NaN); values that are not arrays compare equal when ``==`` says so."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and \
            np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value that cannot say: not the same
        return False
