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
each step over the next ``TIMED_RUNS`` runs and counts the elements it returns, and then keeps the regions in
which no step returned more than ``SMALL_ELEMENTS`` elements (below that the kernels run on one thread anyway)
and that replace at least two steps, provided that what they save, estimated as ``DISPATCH_NS`` per replaced
step, is at least ``MIN_GAIN`` of the run's time.  Otherwise the plan stays as it is and is never timed again.

Invariants:
- the choice changes which steps run, never a result: a region's blocks call the kernels the steps call;
- it is made once per plan (a control-flow body's plan chooses for itself), from runs without an observer
  (profiling and ``RunOptions`` runs are neither counted nor timed);
- runs that overlap the switch finish on the steps they started with (``Plan.use_regions``).
"""
from __future__ import annotations

import threading
import time

import numpy as np

__all__ = ["RegionTuner", "WARM_RUNS", "TIMED_RUNS", "SMALL_ELEMENTS", "DISPATCH_NS", "MIN_GAIN"]

WARM_RUNS = 2  # runs before timing: the first loads or compiles each kernel, a control-flow body its own regions
TIMED_RUNS = 2  # runs timed step by step; each step's fastest time counts
SMALL_ELEMENTS = 1 << 14  # a step returning at most this many elements is small (ops._shifted's parallel bound)
DISPATCH_NS = 1_500  # what a region saves per step it replaces (estimate)
MIN_GAIN = 0.03  # regions are turned on when they save at least this fraction of a run


class _StepTimer:
    """An observer (``Plan.run``'s protocol) that keeps each step's time and the elements it returned."""

    __slots__ = ("ns", "elements")

    def __init__(self, nsteps: int):
        self.ns = [0] * nsteps
        self.elements = [0] * nsteps

    def before(self, k: int) -> None:
        pass

    def after(self, k: int, args, result, t0_ns: int) -> None:
        self.ns[k] = time.perf_counter_ns() - t0_ns
        self.elements[k] = _elements(result)


def _elements(result) -> int:
    """The elements of a step's result: an array, or a tuple or list (several outputs, a sequence) of them."""
    if isinstance(result, np.ndarray):
        return result.size
    if isinstance(result, (tuple, list)):
        return sum(_elements(r) for r in result)
    return 0


class RegionTuner:
    """Counts a plan's runs, times the sampled ones and makes the choice (``decide``) after the last."""

    def __init__(self):
        self.runs = 0
        self.timed = 0
        self.best = None  # per step: its fastest time over the timed runs (ns)
        self.elements = None  # per step: the most elements it returned in a timed run
        self.wall = None  # the fastest timed run (ns)
        self.choice = None  # after deciding: what was found, chosen and estimated (``Plan.region_choice``)
        self._lock = threading.Lock()

    def run(self, plan, feeds, outer=()) -> list:
        with self._lock:
            k = self.runs
            self.runs += 1
        if not WARM_RUNS <= k < WARM_RUNS + TIMED_RUNS:
            return plan._run_steps(feeds, outer)
        timer = _StepTimer(len(plan.steps))
        t0 = time.perf_counter_ns()
        out = plan._run_steps(feeds, outer, observer=timer)
        wall = time.perf_counter_ns() - t0
        with self._lock:
            first = self.best is None
            self.best = timer.ns if first else [min(a, b) for a, b in zip(self.best, timer.ns)]
            self.elements = timer.elements if first else [max(a, b) for a, b in zip(self.elements, timer.elements)]
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
            if len(steps) >= 2 and all(elements[k] <= SMALL_ELEMENTS for k in steps):
                chosen.append((a, b, em))
                saved += (len(steps) - 1) * DISPATCH_NS
        on = bool(chosen) and saved >= MIN_GAIN * wall
        self.choice = {"candidates": len(candidates), "small": len(chosen), "saved_ns": saved, "run_ns": wall,
                       "on": on}
        if on:
            plan.use_regions(chosen)
        plan._tuner = None
        plan.region_choice = self.choice
        return self.choice
