"""Session profiling in onnxruntime's format: a Chrome-trace JSON array of complete events.

One event (``"ph": "X"``) per line, times in microseconds since the profiler started.

Events: ``model_loading_uri`` and ``session_initialization`` once (category ``Session``), ``model_run`` per run,
and per run one ``<node name>_kernel_time`` event per step (category ``Node``) whose ``args`` hold the op
type, the provider and the input and output types and shapes, as onnxruntime writes them
(``[{"float": [3, 2]}]``).  A step that runs a fused segment or a compiled region lists the nodes it ran in
``args.nodes`` and is named for its first node.

Invariants: recording is thread-safe (runs may overlap); the file is written once, by ``end``; nothing is
recorded after ``end``.
"""
from __future__ import annotations

import json
import os
import threading
import time

import numpy as np

from .errors import RunTerminatedError

__all__ = ["Profiler", "RunObserver"]


def _type_shape(v):
    if isinstance(v, (list, tuple)) and not hasattr(v, "dtype"):
        return {"seq": [_type_shape(x) for x in v]}
    dt = getattr(v, "dtype", None)
    if dt is None:
        return {"none": []}
    name = np.dtype(dt).name if np.dtype(dt) != np.dtype(object) else "string"
    return {{"float32": "float", "float64": "double"}.get(name, name): [int(d) for d in v.shape]}


class Profiler:
    """Collects events for one session and writes them with ``end``."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.start_ns = time.time_ns()
        self._t0 = time.perf_counter_ns()
        self._events: list = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.ended = False

    def _us(self, t_ns: int) -> int:
        return (t_ns - self._t0) // 1000

    def event(self, cat: str, name: str, t0_ns: int, t1_ns: int, args: dict | None = None) -> None:
        if self.ended:
            return
        ev = {"cat": cat, "pid": self._pid, "tid": threading.get_native_id(), "dur": max(0, (t1_ns - t0_ns) // 1000),
              "ts": self._us(t0_ns), "ph": "X", "name": name, "args": args or {}}
        with self._lock:
            self._events.append(ev)

    def end(self) -> str:
        """Write the trace to ``<prefix>_<date>_<time>.json`` in the working directory and return its path."""
        self.ended = True
        path = f"{self.prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
        k = 0
        while os.path.exists(path):
            k += 1
            path = f"{self.prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S')}_{k}.json"
        with self._lock:
            lines = [json.dumps(e, separators=(",", ":")) for e in self._events]
        with open(path, "w") as f:
            f.write("[\n" + ",\n".join(lines) + "\n]\n")
        return path


class RunObserver:
    """What ``Plan.run`` calls around every step of one run: stops it when ``run_options.terminate`` is set, and
    records a node event per step when the session profiles."""

    __slots__ = ("plan", "run_options", "profiler", "provider")

    def __init__(self, plan, run_options=None, profiler: Profiler | None = None):
        self.plan = plan
        self.run_options = run_options
        self.profiler = profiler
        self.provider = plan.provider

    def before(self, k: int) -> None:
        if self.run_options is not None and self.run_options.terminate:
            raise RunTerminatedError("the run was stopped before this node: RunOptions.terminate is set")

    def after(self, k: int, args, result, t0_ns: int) -> None:
        if self.profiler is None:
            return
        t1 = time.perf_counter_ns()
        node = self.plan.step_nodes[k]
        outs = result if isinstance(result, (list, tuple)) and len(node.outputs) != 1 else [result]
        info = {"op_name": node.op_type, "provider": self.provider,
                "input_type_shape": [_type_shape(a) for a in args],
                "output_type_shape": [_type_shape(o) for o in outs]}
        group = self.plan.step_group(k)
        if len(group) > 1:
            info["nodes"] = [n.name for n in group]
        self.profiler.event("Node", f"{node.name}_kernel_time", t0_ns, t1, info)
