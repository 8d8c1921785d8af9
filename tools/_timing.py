"""Median wall time of a call, shared by the benchmark tools."""
from __future__ import annotations

import statistics
import time

__all__ = ["median_seconds"]


def median_seconds(fn, runs: int, warmup: int) -> float:
    """The median wall time in seconds of ``runs`` calls of ``fn``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)
