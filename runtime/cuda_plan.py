"""The CUDA plan: a graph compiled for ``CUDAExecutionProvider``, every value placed on the host or the device.

``CudaPlan`` has the public surface the session uses from ``executor.Plan`` (``input_names``,
``output_names``, ``run``, ``graph``, ``provider``, ``device``, ``steps``, ``step_nodes``, ``slot_of``).
Placement is decided once, per node, in topological order:

- ``cuda``: the node has a CUDA registration (``ops.cuda.load()`` is called first so every one exists).
  Inputs listed in the impl's ``host_inputs`` are handed over as host numpy arrays, the others as device
  arrays; results are device arrays.
- ``cpu(shape)``: shape computations stay on the host, as onnxruntime's CUDA provider keeps them on the CPU:
  ``Shape``/``Size`` (they read only metadata, so a device input is never copied) and ``Constant`` always;
  ``SHAPE_OPS`` on int32/int64/bool tensors whose inputs are all host-resident (initializers, feeds,
  results of other host nodes), even when a CUDA kernel exists.  No data crosses for these.
- ``cpu(allowed)``: a node without a CUDA kernel that ``SessionOptions.cuda_cpu_ops`` names (op type or node
  name) runs its CPU kernel; device inputs are downloaded and results uploaded when a device kernel reads
  them, and every such host round trip is counted per node in ``round_trips``.
- anything else makes construction fail with ``UnsupportedOpError``: nothing silently runs on the CPU.

Invariants:
- every host<->device copy goes through ``runtime.cuda.to_device``/``to_host`` and is counted;
- initializers read by a device kernel are uploaded once, at construction (their host array stays for
  host readers); other host values a device kernel reads are uploaded once per run, however many device
  kernels read them; a device value a host reader needs is downloaded once per run (a round trip);
- with ``SessionOptions.kv_share_buffer``, a graph input that exactly one node reads (and that is not an
  output) is donated to that node's CUDA kernel (``OpContext.donated``): GroupQueryAttention writes the new
  rows into such a past cache and returns it as present, so the caller's device buffer changes in place;
- feeds may be numpy or device arrays; a value slot (and its copy on the other side) is cleared right after
  the last step that reads it;
- ``run`` returns numpy arrays except for the outputs named in ``device_outputs``, which stay (or are put)
  on the device; an output that is an initializer or a feed, or a view of one, is copied first;
- runs of one plan overlap, with no lock around a run: every CUDA kernel allocates its outputs (none is bound
  to a plan buffer), so a run's values and the copies it makes across are its own, and the initializers'
  device copies, which every run reads, are never written.  Only the ``round_trips`` counts are shared (a lock
  of their own), and on Numba's CUDA simulator, which can run one kernel at a time per process, each CUDA step
  holds a process-wide lock: runs there interleave step by step.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, NamedTuple

import numpy as np

from ops import registry
from . import cuda as rc
from .errors import UnsupportedOpError
from .ir import Graph
from .planner import Slots, bind_node, frees_of, liveness, node_context, node_inputs, observed, raise_at, store
from .providers import CUDA_PROVIDER, PROVIDERS

__all__ = ["CudaPlan", "DeviceStep", "SHAPE_OPS", "CUDA", "CPU_SHAPE", "CPU_ALLOWED", "H", "D"]

CUDA, CPU_SHAPE, CPU_ALLOWED = "cuda", "cpu(shape)", "cpu(allowed)"
CPU_PROVIDER = "CPUExecutionProvider"

# Ops that run on the host when every input is host-resident and every tensor is int32/int64/bool.
SHAPE_OPS = frozenset({"Gather", "Concat", "Slice", "Squeeze", "Unsqueeze", "Cast", "Add", "Sub", "Mul", "Div",
                       "Equal", "Where", "Range", "ReduceSum", "ReduceProd", "ConstantOfShape", "Expand",
                       "Reshape", "Identity"})
_METADATA_OPS = frozenset({"Shape", "Size"})
_SHAPE_DTYPES = frozenset({np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_)})
H, D = "h", "d"  # where a step wants an input: host, device (None: either, metadata only)
# Inputs whose kernels read only the rows the indices pick (weight_bytes_per_run leaves them out).
_ROW_READS = {"Gather": (0,), "GatherBlockQuantized": (0, 2, 3)}


class DeviceStep(NamedTuple):
    """One step of a CUDA plan: ``fn`` reads ``in_slots``, each where ``wants`` says (``H`` host, ``D`` device,
    None either), and writes slot ``out`` (an int, or a tuple of them); ``frees`` are cleared after it."""
    fn: Callable
    in_slots: tuple
    wants: tuple
    out: Any
    frees: tuple


def _nbytes(a) -> int:
    return int(a.size) * np.dtype(a.dtype).itemsize


def upload(a):
    """``rc.to_device`` keeping 0-d arrays 0-d (``np.ascontiguousarray`` inside it makes them 1-d)."""
    d = rc.to_device(a)
    if a.ndim == 0 and d.ndim != 0:
        d = d.reshape(())
    return d


# Numba's CUDA simulator runs one kernel at a time in the whole process (a launch made while another kernel runs
# is taken for a device-function call, and fails), so there a CUDA step holds this lock while it runs; runs still
# overlap between steps.  A GPU takes launches from any thread, and nothing is locked.  Re-entrant: a step may
# run a child plan.
_SIMULATOR_LOCK = threading.RLock()


def _one_kernel_at_a_time(fn):
    def call(*args):
        with _SIMULATOR_LOCK:
            return fn(*args)
    return call


def _device_copy(d):
    c = rc.device_empty(tuple(d.shape), d.dtype)
    rc.copy_device(c, d)  # device to device: no host transfer
    return c


class CudaPlan:
    """A graph compiled for the CUDA provider (see the module docstring)."""

    def __init__(self, graph: Graph, provider: str = CUDA_PROVIDER, *, session_options=None,
                 device=None, **_ignored):
        import ops.cuda
        ops.cuda.load()
        self.graph = graph
        self.provider = provider
        self.device = device or PROVIDERS[provider]
        self.session_options = session_options
        sl = Slots(graph)
        self.init_slots, self.input_names, self.input_slots = sl.init_slots, sl.input_names, sl.input_slots
        self.outer_names, self.outer_slots = sl.outer_names, sl.outer_slots
        placement, impls = self._place(graph, sl, set(getattr(session_options, "cuda_cpu_ops", None) or ()))
        self.output_names, self.output_slots = sl.outputs(graph)
        self.slot_of = sl.slot_of
        self.placement = {(node.name or f"#{i}"): kind for i, (node, kind) in enumerate(zip(graph.nodes, placement))}
        step_reads, last_use, roots = liveness(graph, impls, sl.slot_of, len(sl.values), self.output_slots)
        protected = self.init_slots | set(self.input_slots) | set(self.outer_slots)
        self.copy_out = [any(r in protected for r in roots[s]) for s in self.output_slots]
        discard = sl.discard()
        self.producer = [None] * len(sl.values)  # slot -> step index of the node that writes it
        self.steps, self.step_nodes, device_readers = [], [], set()
        donated_names = graph.donatable_inputs() if getattr(session_options, "kv_share_buffer", False) else set()
        simulated = rc.simulator()
        for i, (node, impl, kind) in enumerate(zip(graph.nodes, impls, placement)):
            ins, captured, in_slots = node_inputs(node, sl.slot_of)
            if kind == CUDA:
                # values a subgraph captures pass through as they are (host or device): the child CUDA plan
                # reads each where its own steps want it
                wants = tuple(H if k in impl.host_inputs else D for k in range(len(ins))) + (None,) * len(captured)
                device_readers.update(s for s, w in zip(in_slots, wants) if w == D)
            else:
                wants = ((None,) if node.op_type in _METADATA_OPS else (H,)) * len(in_slots)
            ctx = node_context(node, graph, ins, captured, provider=provider if kind == CUDA else CPU_PROVIDER,
                               session_options=session_options,
                               donated=(k for k, x in enumerate(ins) if x in donated_names and kind == CUDA))
            fn = bind_node(impl, ctx, node)
            if kind == CUDA and simulated:
                fn = _one_kernel_at_a_time(fn)
            outs = [sl.slot_of[o] if o else discard for o in node.outputs]
            for s in outs:
                self.producer[s] = i
            out = outs[0] if len(outs) == 1 else tuple(outs)
            self.steps.append(DeviceStep(fn, in_slots, wants, out, frees_of(i, step_reads, last_use, self.init_slots)))
            self.step_nodes.append(node)
        self.step_kind = placement
        self.nslots = len(sl.values)
        self.template = sl.values
        # Initializers a device kernel reads: uploaded once, here.
        self.shadow_template = [None] * len(sl.values)
        self.init_upload_bytes = 0
        for s in sorted(device_readers & self.init_slots):
            v = sl.values[s]
            if isinstance(v, np.ndarray):
                self.shadow_template[s] = upload(v)
                self.init_upload_bytes += _nbytes(v)
        self.round_trips: dict = {}
        self._trips_lock = threading.Lock()  # overlapping runs count into one round_trips

    def _place(self, graph, sl, allow) -> tuple[list, list]:
        """Each node's placement (``CUDA``, ``CPU_SHAPE``, ``CPU_ALLOWED``) and kernel, and its output slots;
        ``UnsupportedOpError`` for nodes with neither (nothing falls back to the CPU silently)."""
        dtype_of = {name: np.dtype(arr.dtype) if isinstance(arr, np.ndarray) else None
                    for name, arr in graph.initializers.items()}

        def shape_dtype(name):
            dt = dtype_of[name] if name in dtype_of else graph.value_info.get(name)
            dt = getattr(dt, "dtype", dt)
            return dt is None or np.dtype(dt) in _SHAPE_DTYPES

        where = dict.fromkeys(list(graph.initializers) + sl.input_names + sl.outer_names, H)  # static residence
        placement, impls, unsupported = [], [], []
        for node in graph.nodes:
            ins = [x for x in node.inputs if x]
            cuda_impl = registry.resolve(node.domain, node.op_type, node.opset, self.provider)
            std = node.domain in ("", "ai.onnx")
            kind = impl = None
            if std and (node.op_type in _METADATA_OPS or node.op_type == "Constant"):
                kind = CPU_SHAPE
            elif std and node.op_type in SHAPE_OPS and all(where.get(x) == H for x in ins) \
                    and all(shape_dtype(x) for x in ins) and all(shape_dtype(o) for o in node.outputs if o):
                kind = CPU_SHAPE
            elif cuda_impl is not None:
                kind, impl = CUDA, cuda_impl
            elif node.op_type in allow or (node.name and node.name in allow):
                kind = CPU_ALLOWED
            if kind in (CPU_SHAPE, CPU_ALLOWED):
                impl = registry.resolve(node.domain, node.op_type, node.opset, CPU_PROVIDER)
                if impl is None:
                    kind = None
            if kind is None:
                unsupported.append((node.name, node.op_type, node.domain, node.opset))
            sl.produce(node)
            where.update((o, D if kind == CUDA else H) for o in node.outputs if o)
            placement.append(kind)
            impls.append(impl)
        if unsupported:
            err = UnsupportedOpError(unsupported, self.provider)
            err.args = (err.args[0] + "\n(no node falls back to the CPU silently; to run these on the CPU with "
                        "their inputs copied across, name their op types or node names in "
                        "SessionOptions.cuda_cpu_ops)",)
            raise err
        return placement, impls

    # -- introspection ---------------------------------------------------------------------------
    def reads_input_on(self, name) -> set:
        """Where the steps read graph input ``name``: a set of ``H`` (host), ``D`` (device) and None (metadata
        only); empty when nothing reads it."""
        slot = self.slot_of.get(name)
        return {w for step in self.steps for s, w in zip(step.in_slots, step.wants) if s == slot}

    def weight_bytes_per_run(self) -> int:
        """Bytes of the device-resident initializers that device kernels read in full on every run, each counted
        once (a weight shared by two nodes, as a tied embedding, is read twice but counted once): the floor of
        the memory traffic of a decode step.  A table read only as Gather's or GatherBlockQuantized's data,
        whose kernels read just the indexed rows, is left out."""
        full = set()
        for (_, in_slots, wants, _, _), node, kind in zip(self.steps, self.step_nodes, self.step_kind):
            if kind != CUDA:
                continue
            rows = _ROW_READS.get(node.op_type, ())
            full.update(s for k, (s, w) in enumerate(zip(in_slots, wants))
                        if w == D and s in self.init_slots and k not in rows)
        return sum(_nbytes(self.template[s]) for s in full if isinstance(self.template[s], np.ndarray))

    def get_placement(self) -> dict:
        """{node name: "cuda" | "cpu(shape)" | "cpu(allowed)"} (unnamed nodes as ``#index``)."""
        return dict(self.placement)

    def _trip(self, step_index: int, what: str, nbytes: int) -> None:
        with self._trips_lock:
            self._count_trip(step_index, what, nbytes)

    def _count_trip(self, step_index: int, what: str, nbytes: int) -> None:
        node = self.step_nodes[step_index]
        key = node.name or f"#{step_index}"
        rt = self.round_trips.get(key)
        if rt is None:
            rt = self.round_trips[key] = {"op_type": node.op_type, "placement": self.step_kind[step_index],
                                          "bytes_down": 0, "bytes_up": 0, "downloads": 0, "uploads": 0,
                                          "calls": 0}
        if what == "down":
            rt["bytes_down"] += nbytes
            rt["downloads"] += 1
        elif what == "up":
            rt["bytes_up"] += nbytes
            rt["uploads"] += 1
        else:
            rt["calls"] += 1

    # -- running ---------------------------------------------------------------------------------
    def step_group(self, k) -> list:
        """The nodes step ``k`` runs (one: a CUDA plan fuses nothing at run time)."""
        return [self.step_nodes[k]]

    def run(self, feeds, outer=(), device_outputs=(), observer=None) -> list:
        """Run with ``feeds`` (numpy or device arrays) aligned to ``input_names``.

        Returns values aligned to ``output_names``: numpy arrays, except the output positions in
        ``device_outputs``, which are device arrays.  ``observer`` is ``Plan.run``'s (its times are of the
        launches: kernels run asynchronously).  Runs may overlap (several threads): what a run writes (its value
        list, the copies it makes across, every kernel's outputs) is its own, and what runs share (the plan's
        steps, the initializers' device copies) is only read.
        """
        vals = self.template[:]
        other = self.shadow_template[:]  # the copy of a value on the other side, made at most once per run
        for s, v in zip(self.input_slots, feeds):
            vals[s] = v
        for s, v in zip(self.outer_slots, outer):
            vals[s] = v
        ndarray = np.ndarray
        producer, kinds = self.producer, self.step_kind
        k = -1
        try:
            for k, (fn, in_slots, wants, out, frees) in enumerate(self.steps):
                args = []
                for s, w in zip(in_slots, wants):
                    v = vals[s]
                    if v is None or w is None:
                        pass
                    elif w == D:
                        if isinstance(v, ndarray):
                            d = other[s]
                            if d is None:
                                d = other[s] = upload(v)
                                p = producer[s]
                                if p is not None and kinds[p] == CPU_ALLOWED:
                                    self._trip(p, "up", _nbytes(v))
                            v = d
                    elif not isinstance(v, ndarray) and rc.is_device_array(v):
                        h = other[s]
                        if h is None:
                            h = other[s] = rc.to_host(v)
                            self._trip(k, "down", _nbytes(h))
                        v = h
                    args.append(v)
                if kinds[k] == CPU_ALLOWED:
                    self._trip(k, "call", 0)
                store(vals, out, fn(*args) if observer is None else observed(k, fn, observer)(*args))
                for f in frees:
                    vals[f] = None
                    other[f] = None
        except Exception as e:
            if k < 0:
                raise
            raise_at(self.step_nodes[k], e, f", on {self.step_kind[k]}")
        keep = set(device_outputs)
        res = []
        for j, s in enumerate(self.output_slots):
            v = vals[s]
            on_host = isinstance(v, ndarray)
            if j in keep:
                if on_host:
                    v = other[s] if other[s] is not None and s not in self.init_slots else upload(v)
                elif self.copy_out[j]:
                    v = _device_copy(v)
            elif not on_host and rc.is_device_array(v):
                v = other[s] if other[s] is not None else rc.to_host(v)
            elif on_host and self.copy_out[j]:
                v = v.copy()
            res.append(v)
        return res
