"""The planned executor.

``Plan`` compiles a graph once: nodes in topological order, every value given
an integer slot, every kernel bound to its attributes and plan-time context,
buffers of statically shaped intermediates assigned from an arena whose
blocks are recycled once the value (and every view of it) is dead.  ``run``
is then a short loop over tuples with no dictionary look-ups.  A step is the
plain tuple ``(fn, get, out, frees)``: ``fn(*get(values))`` writes slot
``out`` (an int, or a tuple of them), then the slots in ``frees`` are cleared
(a plain tuple, not a named one: the run loop unpacks it once per node, and
CPython unpacks only exact tuples on its fast path).

Invariants:
- slot 0 always holds None and stands for absent optional inputs; results of
  outputs a node leaves unnamed go to a separate discard slot;
- a value slot is cleared right after the last step that reads it;
- an arena block is handed to a new value only on a step after the last read
  of every value that may alias it, so a kernel never sees its output share
  memory with one of its inputs;
- graph outputs never live in the arena, and an output that is an
  initializer or a feed (or a view of one) is copied before it is returned.
"""
from __future__ import annotations

import contextvars
import math
import threading
import time
from operator import itemgetter
from typing import Callable, NamedTuple

import numpy as np

from ops import registry
from .errors import UnsupportedOpError
from .ir import Graph, free_names, subgraphs
from .planner import KernelError, Slots, bind_node, check_static_sizes, frees_of, liveness, node_context, \
    node_inputs, observed, raise_at
from .providers import PROVIDERS
from .region_tuner import RegionTuner
from .segments import Segment, find_segments

__all__ = ["Plan", "DirectCall", "KernelError", "liveness", "raise_at"]


def _getter(slots):
    if len(slots) == 1:
        return itemgetter(slice(slots[0], slots[0] + 1))
    if len(slots) == 0:
        return itemgetter(slice(0, 0))
    return itemgetter(*slots)


def _observed(steps, observer) -> list:
    """``steps`` with each function wrapped to call ``observer.before(k)`` and ``observer.after(k, args, result,
    t0_ns)`` around it (one run's worth: profiling, ``RunOptions.terminate``)."""
    return [(observed(k, fn, observer), get, out, frees) for k, (fn, get, out, frees) in enumerate(steps)]


def regions_mode(session_options, provider) -> str:
    """"on", "off" or "auto" (the tuner's choice, ``RegionTuner``): compiled regions run on the CPU provider, when
    the graph is optimized, as ``SessionOptions.compiled_regions`` asks (True, False, or None for auto)."""
    if provider != "CPUExecutionProvider" or int(getattr(session_options, "graph_optimization_level", 99)) <= 0:
        return "off"
    asked = getattr(session_options, "compiled_regions", None)
    return "auto" if asked is None else ("on" if asked else "off")


def _fused_runs(graph, bound, regions, session_options, provider):
    """(segments, nodes in a region, nodes in a segment): runs of small elementwise nodes outside ``regions``
    become one compiled segment each.  ``graph_optimization_level`` 0 (ORT_DISABLE_ALL) runs every node as its
    own kernel."""
    segments = []
    optimize = int(getattr(session_options, "graph_optimization_level", 99)) > 0
    cpu = provider == "CPUExecutionProvider"
    in_region = {i for a, b, _ in regions for i in range(a, b)}
    if optimize and cpu and getattr(session_options, "fused_segments", True):
        segments = [(a, b) for a, b in find_segments(graph.nodes, bound, graph.value_info, graph.initializers)
                    if not in_region.intersection(range(a, b))]
    in_segment = {i for a, b in segments for i in range(a, b)}
    return segments, in_region, in_segment


class DirectCall(NamedTuple):
    """A plan made of compiled regions only, as one call: set ``args[0]`` (a copy of the list) to ``nthreads()``
    and ``args[pos]`` to feed ``k`` for each ``(pos, k)`` in ``dyn``; output ``j`` of ``fn(*args)`` is at
    ``pick[j]``; ``on_error(e)`` re-raises an exception of ``fn`` with the node that raised it named."""
    fn: Callable
    args: list
    dyn: tuple
    pick: tuple
    on_error: Callable
    nthreads: Callable


class Plan:
    """A graph compiled for one provider."""

    def __init__(self, graph: Graph, provider: str = "CPUExecutionProvider", *, preallocate: bool = True,
                 session_options=None, outer_slots: dict | None = None):
        self.graph = graph
        self.provider = provider
        self.device = PROVIDERS[provider]
        self.session_options = session_options
        sl = Slots(graph)
        slot_of, values = sl.slot_of, sl.values
        self.init_slots, self.input_names, self.input_slots = sl.init_slots, sl.input_names, sl.input_slots
        self.outer_names, self.outer_slots = sl.outer_names, sl.outer_slots
        bound = []
        for node in graph.nodes:
            bound.append(registry.resolve(node.domain, node.op_type, node.opset, provider))
            sl.produce(node)
        unsupported = [(n.name, n.op_type, n.domain, n.opset) for n, impl in zip(graph.nodes, bound) if impl is None]
        if unsupported:
            raise UnsupportedOpError(unsupported, provider)
        check_static_sizes(graph, session_options)
        self.output_names, self.output_slots = sl.outputs(graph)
        self.slot_of = slot_of
        nsteps = len(graph.nodes)
        INF = nsteps + 1

        step_reads, last_use, roots = liveness(graph, bound, slot_of, len(values), self.output_slots)
        end = [-1] * len(values)
        for s in range(len(values)):
            for r in roots[s]:
                end[r] = max(end[r], last_use[s])
        discard = sl.discard()
        self._layout = dict(graph=graph, bound=bound, preallocate=preallocate, provider=provider,
                            session_options=session_options, slot_of=slot_of, end=end, INF=INF, roots=roots,
                            last_use=last_use, step_reads=step_reads, discard=discard)
        self.template = values
        self.nslots = len(values)
        self._gen = 0  # bumped when the steps are rebound (the tuner turning regions on): older spares are dropped
        self._busy = threading.Lock()  # held by the run using ``steps``
        self._spare_lock = threading.Lock()
        mode = regions_mode(session_options, provider)
        self._tuner = RegionTuner() if mode == "auto" else None
        self.region_choice = None  # in auto mode, once made: the tuner's choice (runtime/region_tuner.py)
        self._configure(self._find_regions() if mode == "on" else [])

    def _find_regions(self) -> list:
        """The compiled regions of this graph: [start, end) runs of nodes with compiled forms, with their code."""
        from .regions import find_regions
        L = self._layout
        graph, slot_of, last_use = L["graph"], L["slot_of"], L["last_use"]
        read_later = {n for n in slot_of if n and last_use[slot_of[n]] >= 0}
        donated = graph.donatable_inputs() if getattr(L["session_options"], "kv_share_buffer", False) else set()
        return find_regions(graph.nodes, L["bound"], graph.value_info, graph.initializers, read_later,
                            donated=donated)

    def _configure(self, regions) -> None:
        """Bind the steps around ``regions`` (fused segments take the runs of elementwise nodes outside them)."""
        L = self._layout
        graph, slot_of = L["graph"], L["slot_of"]
        segments, in_region, in_segment = _fused_runs(graph, L["bound"], regions, L["session_options"],
                                                      L["provider"])
        seg_values = {slot_of[o] for i in in_segment for o in graph.nodes[i].outputs if o}
        # Views of a feed, an initializer or segment scratch that are returned must be copied.
        protected = self.init_slots | set(self.input_slots) | set(self.outer_slots) | seg_values
        self.copy_out = [any(r in protected for r in L["roots"][s]) for s in self.output_slots]
        L.update(regions=regions, segments=segments, in_region=in_region, in_segment=in_segment,
                 seg_values=seg_values)
        L.pop("returned_at", None)
        self._region_steps = {}
        (self.steps, self.step_nodes, self.segments, self.regions, self.step_region,
         self.arena_bytes, self._plain) = self._bind_steps()
        self._groups = {k: reg.nodes for k, reg in self.step_region.items()}
        at = {id(n): k for k, n in enumerate(self.step_nodes)}
        for seg in self.segments:
            self._groups[at[id(seg.nodes[0])]] = seg.nodes
        self._run_state()

    def _run_state(self):
        """What runs keep between calls: spare step lists, IOBinding's rebound steps, the parallel schedule, the
        direct call of a plan of regions and the kinds its first run compiles."""
        self._spare = []  # step lists for runs that overlap the one using ``steps`` (built on demand)
        self._into_cache = {}  # IOBinding's bound outputs -> steps writing into them (run_into)
        self._deps = None  # run_parallel's schedule
        self._pool = getattr(self, "_pool", None)  # (kept when the steps are rebound)
        self._pool_size = getattr(self, "_pool_size", 0)
        self._free_lists = []  # step lists without arena buffers, for run_parallel
        self._into_bufs = {}
        self._direct = self._direct_region()
        self._cold = None  # before the first run of a plan with regions: the kinds it compiles (maybe none)
        self.compile_seconds = {}  # region module -> seconds its first call took, when this plan compiled it
        if self.regions:
            from .regions import cold_kinds
            self._cold = cold_kinds(self.regions)

    def _bind_steps(self, arena: bool = True):
        """One list of steps, bound to arena buffers of its own (segments too have scratch of their own), so
        that two step lists can run at once; compiled regions are stateless and shared by every list.  Without
        ``arena`` every kernel returns fresh arrays (the steps may then run in any order their data allows)."""
        L = self._layout
        graph = L["graph"]
        outs_buffers, arena_bytes = self._arena(L["preallocate"] and arena)
        steps, step_nodes, seg_objs, reg_objs = [], [], [], []
        plain = {}  # step index -> (node index, its output buffers) for steps that run one node
        seg_start = {a: b for a, b in L["segments"]}
        region_at = {a: (b, em) for a, b, em in L["regions"]}
        step_region = {}  # step index -> the Region it calls
        i_skip = -1
        for i, node in enumerate(graph.nodes):
            if i < i_skip:
                continue
            if i in region_at:
                if i not in self._region_steps:  # a Region is stateless: every step list shares it
                    self._region_steps[i] = self._region_step(i, *region_at[i])
                step, reg, i_skip = self._region_steps[i]
                step_region[len(steps)] = reg
                reg_objs.append(reg)
            elif i in seg_start:
                step, seg, i_skip = self._segment_step(i, seg_start[i])
                seg_objs.append(seg)
            else:
                plain[len(steps)] = (i, outs_buffers[i])
                step = self._node_step(i, outs_buffers[i])
            steps.append(step)
            step_nodes.append(node)
        return steps, step_nodes, seg_objs, reg_objs, step_region, arena_bytes, plain

    def _arena(self, preallocate: bool):
        """Output buffers per node (None where the kernel allocates) and the arena's bytes: statically shaped
        outputs of kernels that can write into a buffer, a block reused once every alias of its value is dead."""
        L = self._layout
        graph, bound, slot_of, end, INF, roots = L["graph"], L["bound"], L["slot_of"], L["end"], L["INF"], L["roots"]
        arena_free: dict[int, list] = {}
        release_at: dict[int, list] = {}
        arena_bytes = 0
        outs_buffers = []
        for i, (node, impl) in enumerate(zip(graph.nodes, bound)):
            for blk in release_at.pop(i, ()):
                arena_free.setdefault(blk.nbytes, []).append(blk)
            bufs = []
            can_write = preallocate and impl.takes_buffers \
                and not impl.views and i not in L["in_segment"] and i not in L["in_region"]
            for o in node.outputs:
                buf = None
                vi = graph.value_info.get(o) if o else None
                s = slot_of.get(o, 0)
                if can_write and vi is not None and vi.dtype is not None and vi.dtype != object \
                        and vi.static_shape is not None and 0 <= end[s] < INF and roots[s] == (s,):
                    dt = np.dtype(vi.dtype)
                    shape = vi.static_shape
                    nbytes = int(math.prod(shape)) * dt.itemsize
                    if nbytes > 0:
                        pool = arena_free.get(nbytes)
                        blk = pool.pop() if pool else None
                        if blk is None:
                            blk = np.empty(nbytes, np.uint8)
                            arena_bytes += nbytes
                        buf = blk.view(dt).reshape(shape)
                        release_at.setdefault(end[s] + 1, []).append(blk)
                bufs.append(buf)
            outs_buffers.append(bufs)
        return outs_buffers, arena_bytes

    def _group_step(self, i, end_i, run, in_slots, out_slots, keep=frozenset()):
        """The step running nodes [i, end_i) as one call: it frees what they read last (``keep`` aside)."""
        L = self._layout
        last_use, step_reads = L["last_use"], L["step_reads"]
        out = out_slots[0] if len(out_slots) == 1 else out_slots
        fn = run if len(out_slots) != 1 else (lambda *xs, _r=run: _r(*xs)[0])
        frees = tuple(sorted({s for k in range(i, end_i) for s in step_reads[k]
                              if i <= last_use[s] < end_i and s not in self.init_slots and s not in keep}))
        return fn, _getter(in_slots), out, frees

    def _read_after(self, i, end_i):
        L = self._layout
        names = [o for k in range(i, end_i) for o in L["graph"].nodes[k].outputs if o]
        return {n for n in names if L["last_use"][L["slot_of"][n]] >= end_i}

    def _returned(self, i, end_i):
        """The values the region over nodes [i, end_i) returns: those read after it, and those at the positions
        any region of its node signatures returns, so that regions of one structure generate one source (a
        value nobody reads is then returned and dropped, never a second compile)."""
        L = self._layout
        if "returned_at" not in L:
            by_kind, produced_at = {}, {}
            for a, b, em in L["regions"]:
                produced = [o for k in range(a, b) for o in L["graph"].nodes[k].outputs if o]
                read = self._read_after(a, b)
                key = tuple(e.signature() for e in em)
                by_kind.setdefault(key, set()).update(j for j, o in enumerate(produced) if o in read)
                produced_at[a] = (key, produced)
            L["returned_at"] = {a: {produced[j] for j in by_kind[key]} for a, (key, produced) in produced_at.items()}
        return self._read_after(i, end_i) | L["returned_at"].get(i, set())

    def _region_step(self, i, end_i, emitted):
        """(step, Region, end_i) for the compiled region over nodes [i, end_i)."""
        from .regions import Region
        L = self._layout
        reg = Region(L["graph"].nodes[i:end_i], emitted, self._returned(i, end_i), L["slot_of"])
        return self._group_step(i, end_i, reg.run, reg.in_slots, reg.out_slots), reg, end_i

    def _segment_step(self, i, end_i):
        """(step, Segment, end_i) for the fused elementwise segment over nodes [i, end_i)."""
        L = self._layout
        graph = L["graph"]
        seg = Segment(graph.nodes[i:end_i], graph.value_info, graph.initializers, self._read_after(i, end_i),
                      L["slot_of"])
        return self._group_step(i, end_i, seg.run, seg.in_slots, seg.out_slots, L["seg_values"]), seg, end_i

    def _node_step(self, i, bufs):
        """The step running node ``i`` alone, its kernel bound to write its outputs into ``bufs`` (None: fresh)."""
        L = self._layout
        graph, impl, node, slot_of = L["graph"], L["bound"][i], L["graph"].nodes[i], L["slot_of"]
        ins, captured, in_slots = node_inputs(node, slot_of)
        ctx = node_context(node, graph, ins, captured, provider=L["provider"], session_options=L["session_options"],
                           out=bufs)
        fn = bind_node(impl, ctx, node)
        outs = [slot_of[o] if o else L["discard"] for o in node.outputs]
        out = outs[0] if len(outs) == 1 else tuple(outs)
        frees = frees_of(i, L["step_reads"], L["last_use"], self.init_slots)
        return fn, _getter(in_slots), out, frees

    def _steps_into(self, bound: dict):
        """``steps`` with the kernels that produce the outputs in ``bound`` ({output position: array}) bound to
        write into those arrays; None when none can (its shape is not static, the kernel cannot write into a
        buffer, or the node runs in a segment or region), then ``run_into`` copies."""
        key = tuple(sorted((j, id(a)) for j, a in bound.items()))
        hit = self._into_cache.get(key)
        if hit is not None:
            return hit[0]
        L = self._layout
        graph, impls = L["graph"], L["bound"]
        producer = {o: k for k, (i, _) in self._plain.items() for o in graph.nodes[i].outputs if o}
        steps, changed = list(self.steps), False
        for j, arr in bound.items():
            name = self.output_names[j]
            k = producer.get(name)
            if k is None or self.copy_out[j] or not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous \
                    or not arr.flags.writeable:
                continue
            i, bufs = self._plain[k]
            impl, vi = impls[i], graph.value_info.get(name)
            if not impl.takes_buffers or impl.views or vi is None or vi.static_shape is None \
                    or tuple(arr.shape) != tuple(vi.static_shape) or vi.dtype is None or arr.dtype != vi.dtype:
                continue
            bufs = list(bufs if steps[k] is self.steps[k] else self._into_bufs[k])
            bufs[graph.nodes[i].outputs.index(name)] = arr
            self._into_bufs[k] = bufs
            steps[k] = self._node_step(i, bufs)
            changed = True
        result = steps if changed else None
        if len(self._into_cache) >= 8:
            self._into_cache.clear()
        self._into_cache[key] = (result, list(bound.values()))  # the arrays stay alive while their ids are keys
        return result

    def _dependencies(self):
        """(steps each step waits for, readers left per slot at a run's start, slots a run may drop), for
        ``run_parallel``; computed once."""
        if self._deps is not None:
            return self._deps
        slot_of = self.slot_of
        produced_by = {}
        for k, (_, _, out, _) in enumerate(self.steps):
            for o in ((out,) if out.__class__ is int else out):
                produced_by[o] = k
        waits, readers = [], {}
        for k in range(len(self.steps)):
            group = self.step_group(k)
            inside = {o for n in group for o in n.outputs if o}
            names = {x for n in group for x in n.inputs if x and x not in inside}
            names |= {x for n in group for g in subgraphs(n) for x in free_names(g) if x in slot_of and x not in inside}
            slots = {slot_of[x] for x in names}
            waits.append(({produced_by[q] for q in slots if q in produced_by and produced_by[q] != k}, tuple(slots)))
            for q in slots:
                readers[q] = readers.get(q, 0) + 1
        keep = set(self.output_slots) | self.init_slots | set(self.input_slots) | set(self.outer_slots)
        self._deps = (waits, readers, keep)
        return self._deps

    def run_parallel(self, feeds, workers: int, call=None, observer=None) -> list:
        """``run`` with independent steps on up to ``workers`` threads at once (``ExecutionMode.ORT_PARALLEL``).

        Steps run as soon as the steps producing their inputs have finished, on a step list bound without the
        arena (whose blocks are reused in sequential order); a value is dropped when its last reader has run.
        ``call(fn, *args)`` runs each kernel (the session's per-thread thread counts)."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
        if self._cold is not None or len(self.steps) < 2 or workers < 2 or self.outer_slots:
            return self.run(feeds, observer=observer)
        waits, readers, keep = self._dependencies()
        with self._spare_lock:
            if self._pool is None or self._pool_size != workers:
                self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="onnx_numba-inter-op")
                self._pool_size = workers
            steps = self._free_lists.pop() if self._free_lists else self._bind_steps(arena=False)[0]
            gen = self._gen
        call = call or (lambda fn, *a: fn(*a))
        vals = self.template[:]
        for q, v in zip(self.input_slots, feeds):
            vals[q] = v
        left = dict(readers)
        pending = [len(w) for w, _ in waits]
        after = [[] for _ in steps]
        for k, (w, _) in enumerate(waits):
            for d in w:
                after[d].append(k)
        clock = time.perf_counter_ns

        def one(k):
            if observer is not None:
                observer.before(k)
            fn, get, out, _ = steps[k]
            args = get(vals)
            t0 = clock()
            r = call(fn, *args)
            if observer is not None:
                observer.after(k, args, r, t0)
            return r

        running = {}
        try:
            for k, n in enumerate(pending):
                if n == 0:
                    running[self._pool.submit(contextvars.copy_context().run, one, k)] = k
            while running:  # (each task runs in a copy of this thread's context: the session's output limit)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    k = running.pop(f)
                    try:
                        r = f.result()
                    except Exception as e:
                        for g in running:
                            g.cancel()
                        wait(running)
                        self.raise_at_step(k, e)
                    out = steps[k][2]
                    if out.__class__ is int:
                        vals[out] = r
                    else:
                        for o, x in zip(out, r):
                            vals[o] = x
                    for q in waits[k][1]:
                        left[q] -= 1
                        if left[q] == 0 and q not in keep:
                            vals[q] = None
                    for nxt in after[k]:
                        pending[nxt] -= 1
                        if pending[nxt] == 0:
                            running[self._pool.submit(contextvars.copy_context().run, one, nxt)] = nxt
        finally:
            with self._spare_lock:
                if gen == self._gen:
                    self._free_lists.append(steps)
        res = [vals[q] for q in self.output_slots]
        for j, c in enumerate(self.copy_out):
            if c and isinstance(res[j], np.ndarray):
                res[j] = res[j].copy()
        return res

    def run_into(self, feeds, bound: dict, observer=None) -> list:
        """``run``, with the outputs in ``bound`` ({output position: numpy array}) written straight into those
        arrays by the kernels that produce them where they can (see ``_steps_into``); the caller copies the
        rest."""
        if self._cold is not None or not bound or any(
                isinstance(f, np.ndarray) and np.shares_memory(f, a) for f in feeds for a in bound.values()):
            return self.run(feeds, observer=observer)
        steps = self._steps_into(bound)
        if steps is None:
            return self.run(feeds, observer=observer)
        with self._busy:
            return self._execute(steps, feeds, (), observer)

    def _direct_region(self):
        """For a plan that is compiled regions only, reading feeds and initializers (a decoder step), a
        ``DirectCall``: ``run`` then calls it with no slot bookkeeping."""
        if not self.regions or len(self.steps) != len(self.regions) or self.outer_slots:
            return None
        if len(self.regions) > 1:
            return self._direct_chain()
        reg = self.regions[0]
        feed_at = {s: k for k, s in enumerate(self.input_slots)}
        args, dyn = [None], []
        for pos, s in enumerate(reg.in_slots, start=1):
            if s in feed_at:
                dyn.append((pos, feed_at[s]))
                args.append(None)
            elif s in self.init_slots:
                args.append(self.template[s])
            else:
                return None
        args += list(reg.constants)
        out_at = {s: k for k, s in enumerate(reg.out_slots)}
        pick = []
        for s in self.output_slots:
            if s not in out_at:
                return None
            pick.append(out_at[s])

        def on_error(e):
            self.raise_at_step(0, e)

        return DirectCall(reg.fn, args, tuple(dyn), tuple(pick), on_error, reg.nthreads)

    def _direct_chain(self):
        """Several regions (one per layer kind occurrence) called in turn over a list of values; each value is
        dropped after its last reader, as in ``run``, so a long prefill holds one layer's intermediates, not all."""
        from .regions import Region
        calls = tuple((reg.fn, get, reg.out_slots, tuple(reg.constants), frees)
                      for reg, (_, get, _, frees) in zip(self.regions, self.steps))
        feed_slots, out_slots, template = tuple(self.input_slots), tuple(self.output_slots), self.template
        raise_at_step = self.raise_at_step

        def chain(nthreads, *feeds):
            vals = template[:]
            for s, v in zip(feed_slots, feeds):
                vals[s] = v
            k = 0
            try:
                for fn, get, outs, consts, frees in calls:
                    r = fn(nthreads, *get(vals), *consts)
                    for o, x in zip(outs, r):
                        vals[o] = x
                    for f in frees:
                        vals[f] = None
                    k += 1
            except Exception as e:
                raise_at_step(k, e)
            return tuple([vals[s] for s in out_slots])

        def on_error(e):
            raise e  # ``chain`` has named the node already

        n = len(feed_slots)
        return DirectCall(chain, [None] * (n + 1), tuple((k + 1, k) for k in range(n)),
                          tuple(range(len(out_slots))), on_error, Region.nthreads)

    def step_group(self, k) -> list:
        """The nodes step ``k`` runs: one, or those of its fused segment or compiled region."""
        return self._groups.get(k) or [self.step_nodes[k]]

    def raise_at_step(self, k, e):
        """Re-raise ``e`` from step ``k`` naming its node (inside a region, the node whose block raised)."""
        reg = self.step_region.get(k)
        if reg is not None:
            node, e = reg.locate(e)
            raise_at(node, e)
        raise_at(self.step_nodes[k], e)

    def compile(self, feeds, outer=()) -> list:
        """``run``, showing a progress bar over the region kinds that this first run compiles (none when they
        are all cached); a damaged Numba cache file a step reads is deleted and the step called again."""
        from .regions import CompileProgress
        cold, self._cold = self._cold, None
        progress = CompileProgress(cold or ())
        steps = [(self._first_call(k, fn, progress), get, out, frees)
                 for k, (fn, get, out, frees) in enumerate(self.steps)]
        try:
            return self._run_steps(feeds, outer, steps)
        finally:
            progress.close()
            self.compile_seconds = dict(progress.seconds)

    def _first_call(self, k, fn, progress, retries: int = 8):
        """Step ``k``'s function for its first call: timed for ``progress`` and repaired by ``repair_cache``."""
        from .regions import repair_cache
        reg = self.step_region.get(k)

        def first(*args):
            t0 = time.perf_counter()
            for attempt in range(retries + 1):
                try:
                    r = fn(*args)
                    break
                except Exception as e:
                    if attempt == retries or repair_cache(e) is None:
                        raise
            if reg is not None:
                progress.done(reg.module_name, time.perf_counter() - t0)
            return r

        return first

    def run(self, feeds, outer=(), observer=None) -> list:
        """Run with ``feeds`` aligned to ``input_names``; returns arrays aligned to ``output_names``.

        Runs may overlap (several threads): the first uses ``steps`` and its arena, each overlapping one a step
        list of its own (built once, then kept for reuse).  ``observer`` (``before(k)``, ``after(k, args, result,
        t0_ns)``) sees every step: it can stop the run (``RunOptions.terminate``) or time it (profiling)."""
        if self._tuner is not None and observer is None:
            return self._tuner.run(self, feeds, outer)
        return self._run(feeds, outer, observer)

    def _run(self, feeds, outer=(), observer=None) -> list:
        if self._cold is not None:
            return self.compile(feeds, outer)
        if self._direct is not None and observer is None:
            return self._run_direct(feeds)
        return self._run_steps(feeds, outer, observer=observer)

    def run_on(self, steps, feeds, outer=()) -> list:
        """A run on ``steps``, a step list this plan had before ``use_regions`` (the tuner's check)."""
        return self._execute(steps, feeds, outer, None)

    def use_regions(self, regions) -> None:
        """Rebind the steps around ``regions`` (some of ``_find_regions``: the tuner's choice); runs in progress
        finish on the steps they started with."""
        with self._busy, self._spare_lock:
            self._gen += 1
            self._configure(regions)

    def _run_steps(self, feeds, outer=(), steps=None, observer=None) -> list:
        if steps is not None:  # the first run's timed steps (compile) are bound to the main arena
            with self._busy:
                return self._execute(steps, feeds, outer, observer)
        if self._busy.acquire(blocking=False):
            try:
                return self._execute(self.steps, feeds, outer, observer)
            finally:
                self._busy.release()
        with self._spare_lock:  # (bound under the lock: ``use_regions`` may be rebinding the layout)
            steps = self._spare.pop() if self._spare else self._bind_steps()[0]
            gen = self._gen
        try:
            return self._execute(steps, feeds, outer, observer)
        finally:
            with self._spare_lock:
                if gen == self._gen:
                    self._spare.append(steps)

    def _execute(self, steps, feeds, outer, observer) -> list:
        vals = self.template[:]
        for s, v in zip(self.input_slots, feeds):
            vals[s] = v
        for s, v in zip(self.outer_slots, outer):
            vals[s] = v
        ndarray = np.ndarray
        step = None
        if observer is not None:
            steps = _observed(steps, observer)
        try:
            for step in steps:
                fn, get, out, frees = step
                r = fn(*get(vals))
                if out.__class__ is int:
                    vals[out] = r
                else:
                    for o, x in zip(out, r):
                        vals[o] = x
                for f in frees:
                    vals[f] = None
        except Exception as e:
            if step is None:
                raise
            self.raise_at_step(steps.index(step), e)
        res = [vals[s] for s in self.output_slots]
        for k, c in enumerate(self.copy_out):
            if c and isinstance(res[k], ndarray):
                res[k] = res[k].copy()
        return res

    def _run_direct(self, feeds) -> list:
        d = self._direct
        args = d.args[:]
        args[0] = d.nthreads()
        for pos, k in d.dyn:
            args[pos] = feeds[k]
        try:
            r = d.fn(*args)
        except Exception as e:
            d.on_error(e)
        res = [r[k] for k in d.pick]
        for k, c in enumerate(self.copy_out):
            if c and isinstance(res[k], np.ndarray):
                res[k] = res[k].copy()
        return res
