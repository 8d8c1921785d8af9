"""Compiled regions: runs of nodes generated into Numba functions, one per layer kind, so a step is a few calls.

A small decoder step is a few dozen nodes whose arithmetic takes microseconds;
calling one Python wrapper per node costs more than the arithmetic.  When a
session asks for it (``SessionOptions.compiled_regions``; the pipeline's
native decoder does), the planner finds maximal runs of consecutive steps
whose nodes all have a *compiled form* (``ops.compiled_forms``) and replaces
each run with one step that calls a generated ``@njit`` function.  The
function's body is the forms' code, one block per node, in plan order; it
calls the same typed kernels the wrappers call, so results match the
per-node plan.

A form is specialised on what the plan knows statically: each input's dtype
and rank, the attributes, and the values of initializers it reads as
parameters (shapes, axes, split sizes).  Extents stay dynamic, so one
compiled function serves prefill and decode.  A form that cannot express a
node (an attribute it does not cover, an unknown rank) declines, and the node
runs through its wrapper between two regions; nothing changes numerically.

Layer kinds: a run is cut at the graph's repeated structure (``layer_pieces``: the longest stretch that
repeats with some period, one piece per period, the rest cut the same way in turn), and no piece has more
than ``MAX_NODES`` nodes.  The generated source names values by position and nodes by index (error
messages carry ``@nodeK@``, which ``Region.locate`` turns back into the node's name) and takes weights as
arguments, so equal layers generate the same text, hence the same module, compiled once; a 4-layer and a
48-layer model of one width share every function, and compile time and memory do not grow with depth.  A piece
returns every value that any piece of its node structure returns (the planner's ``_returned``), so a layer whose
output nobody reads after it still generates its kind's text.
The first run of a plan shows a progress bar over the kinds it compiles (``CompileProgress``) and deletes
and recompiles a damaged Numba cache file it reads (``repair_cache``); a cache folder that cannot be
written costs a warning, never the session.  The functions compile under ``region_compiler.RegionCompiler``,
which types the constants a block passes to a kernel plainly, so that blocks differing only in flag values
(and the wrappers, calling from Python) share each kernel's one compile, and lowers them as glue: the kernels
they link are not optimized a second time.

Invariants:
- every array inside a region is C-contiguous (feeds are made contiguous by
  the session, forms copy where a slice or a transpose would not be);
- a form never writes into an input; an output may be a view of an input only
  where the node's wrapper is registered with ``views=True`` (the planner's
  alias analysis relies on that);
- the generated source is a pure function of the region's structure (node
  ops, wiring by position, types, attributes, parameter values, never names)
  and of the kernel sources' fingerprint (``ops._cache_epoch``), written
  atomically under the cache folder and imported from there, so Numba's on-disk cache makes a second start compile nothing
  and a changed kernel is never linked from a stale cache;
- errors a form detects (an index out of range, a cache that does not fit)
  raise the project's error classes with the node named in the message.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import threading

import numpy as np
from numba import get_num_threads

from ops.forms import NODE as NODE_TOKEN
from .atomic import write_atomic
from .segments import runs_of

__all__ = ["find_regions", "layer_pieces", "Region", "cache_dir", "cold_kinds", "CompileProgress", "repair_cache",
           "MIN_NODES", "MAX_NODES"]

MIN_NODES = 2
MAX_NODES = 48  # nodes in one generated function at most: compile time and memory stay bounded at any depth
MIN_UNIT = 6  # nodes a repeated unit has at least (shorter periods are grouped), so calls stay few
_lock = threading.Lock()


def cache_dir(quiet: bool = False) -> str:
    """Where generated region modules live (``ONNX_NUMBA_REGION_DIR``, else beside Numba's cache).  Created on
    demand; ``quiet`` only names it."""
    from . import settings
    d = settings.text("ONNX_NUMBA_REGION_DIR")
    if not d:
        base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "onnx-numba")
        d = os.path.join(base, "regions")
    if not quiet:
        os.makedirs(d, exist_ok=True)
    return d


class _Types:
    """Static facts the forms read: dtype and rank per value, initializer arrays."""

    def __init__(self, value_info, initializers, donated=frozenset()):
        self.value_info = value_info
        self.initializers = initializers
        self.donated = frozenset(donated)  # graph inputs read by one node only, which may write into them
        self.declared = {}  # name -> (dtype, rank) a form stated for an output shape inference left unknown

    def dtype(self, name):
        if name in self.declared and self.declared[name][0] is not None:
            return self.declared[name][0]
        if name in self.initializers:
            return np.asarray(self.initializers[name]).dtype
        vi = self.value_info.get(name)
        return None if vi is None or vi.dtype is None or vi.dtype == object else np.dtype(vi.dtype)

    def rank(self, name):
        if name in self.declared and self.declared[name][1] is not None:
            return self.declared[name][1]
        if name in self.initializers:
            return np.asarray(self.initializers[name]).ndim
        vi = self.value_info.get(name)
        return None if vi is None or vi.shape is None else len(vi.shape)

    def const(self, name):
        return self.initializers.get(name)


def _emit_all(nodes, types, used_after):
    """Try every node's form; returns per node an Emitted or None (declined)."""
    from ops import compiled_forms as cf
    from .loader import release_pages
    res = []
    for node in nodes:
        e = cf.emit(node, types, used_after)
        if e is not None and e.constants:  # it repacked initializers: their mapped pages are not needed now
            release_pages([types.initializers[x] for x in node.inputs if x in types.initializers], whole=False)
        res.append(e)
    return res


def find_regions(nodes, impls, value_info, initializers, outputs_read_after, min_nodes: int = MIN_NODES,
                 donated=frozenset(), max_nodes: int | None = None):
    """[start, end) runs of nodes that all have a compiled form, with their emitted code, cut into pieces at
    the graph's repeated structure (``layer_pieces``) so that no piece exceeds ``max_nodes`` and repeated
    layers generate the same function.  ``donated``: graph inputs, each read by one node, that the caller lets
    that node overwrite."""
    types = _Types(value_info, initializers, donated)
    emitted = _emit_all(nodes, types, outputs_read_after)
    runs = runs_of([e is not None and impl is not None and impl.provider == "CPUExecutionProvider"
                    for impl, e in zip(impls, emitted)], min_nodes)
    pieces = []
    for a, b in runs:
        sigs = _intern([e.signature() for e in emitted[a:b]])
        for pa, pb in layer_pieces(sigs, max_nodes or MAX_NODES):
            pieces.append((a + pa, a + pb, emitted[a + pa:a + pb]))
    return pieces


def _intern(keys):
    ids = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


def layer_pieces(sigs, max_nodes: int = None, min_unit: int = None):
    """Cut a run of node signatures into [start, end) pieces of at most ``max_nodes`` nodes: the longest
    stretch where the run repeats with some period (a stack of identical layers) becomes one piece per
    period (several periods, when one is shorter than ``min_unit`` nodes), and what precedes and follows it
    is cut the same way in turn.  Repeats of a unit are cut at the same offsets, so equal layers give equal
    pieces whatever the depth."""
    max_nodes = max_nodes or MAX_NODES
    min_unit = min(min_unit or MIN_UNIT, max_nodes)
    n = len(sigs)
    if n == 0:
        return []
    best = None  # (covered, -period, start, units)
    for p in range(1, n // 2 + 1):
        run = 0
        for i in range(n - p):
            if sigs[i] == sigs[i + p]:
                run += 1
                if run >= p:
                    units = (run + p) // p
                    cand = (units * p, -p, i - run + 1, units)
                    if best is None or cand[:2] > best[:2]:
                        best = cand
            else:
                run = 0
    if best is None:
        return _chunks(0, n, max_nodes)
    _, neg_p, s0, units = best
    p = -neg_p
    group = -(-min_unit // p)  # periods per unit
    if units < 2 * group and p < min_unit:
        return _chunks(0, n, max_nodes)
    unit = p * group
    units //= group
    out = [(a, b) for a, b in layer_pieces(sigs[:s0], max_nodes, min_unit)]
    for u in range(units):
        a = s0 + u * unit
        out += _chunks(a, a + unit, max_nodes)
    tail = s0 + units * unit
    out += [(tail + a, tail + b) for a, b in layer_pieces(sigs[tail:], max_nodes, min_unit)]
    return out


def _chunks(a, b, size):
    """[a, b) in pieces of at most ``size``, as equal as possible."""
    k = -(-(b - a) // size) if b > a else 0
    edges = [a + (b - a) * j // k for j in range(k + 1)] if k else []
    return list(zip(edges[:-1], edges[1:]))


_NODE_REF = re.compile(re.escape(NODE_TOKEN[:-1]) + r"(\d+)@")


class Region:
    """One compiled run of nodes; ``run(*external_inputs)`` returns the values read after it.

    The generated source depends on the run's structure alone (values are named by position, nodes by
    index, weights arrive as arguments), so repeated layers, and models that share a layer shape, load the
    same module and compile it once."""

    def __init__(self, nodes, emitted, read_after: set, slot_of: dict, label: str = "region"):
        produced = [o for n in nodes for o in n.outputs if o]
        produced_set = set(produced)
        external = []
        for n in nodes:
            for x in n.inputs:
                if x and x not in produced_set and x not in external:
                    external.append(x)
        self.external = external
        self.escaping = [o for o in produced if o in read_after]
        names = {x: f"v{k}" for k, x in enumerate(external + produced)}
        imports = {}
        body = []
        const_names, constants = [], []
        for j, e in enumerate(emitted):
            const_names += e.constant_names(f"t{j}")
            constants += e.constants
        # Plan-time constants travel packed, one flat array per dtype, and are unpacked by slicing at the top of
        # the function: every argument costs Numba's dispatcher a type check and an unboxing per call.  Large
        # ones (repacked weights) travel as they are, so no weight is held twice.
        pack_names, self.constants, unpack = _pack(constants, const_names)
        body += ["    " + ln for ln in unpack]
        for j, (n, e) in enumerate(zip(nodes, emitted)):
            body.append(f"    # {j}: {n.op_type}")
            for line in e.render(names, f"t{j}"):
                body.append("    " + line.replace(NODE_TOKEN, f"{NODE_TOKEN[:-1]}{j}@"))
            imports.update(e.imports)
        # ``nthreads`` (Numba's current thread count) is an argument: reading it inside compiled code would
        # reference the threading layer's address, which keeps a function out of the on-disk cache.
        args = ", ".join(["nthreads"] + [names[x] for x in external] + pack_names)
        rets = ", ".join(names[x] for x in self.escaping)
        from ops._cache_epoch import fingerprint
        head = [f'"""Generated by runtime.regions for {len(nodes)} nodes; do not edit."""',
                f"# kernel sources {fingerprint()}: the module name changes with them, so a cache never links "
                "stale kernels",
                "import math", "import numpy as np", "from numba import njit",
                "from runtime.region_compiler import RegionCompiler"]
        for alias, (mod, attr) in sorted(imports.items()):
            head.append(f"from {mod} import {attr} as {alias}")
        src = "\n".join(head) + "\n\n\n@njit(cache=True, nogil=True, error_model='numpy', " \
            "pipeline_class=RegionCompiler)\n" \
            f"def region({args}):\n" + "\n".join(body) + f"\n    return ({rets}{',' if len(self.escaping) == 1 else ''})\n"
        self.source = src
        digest = hashlib.sha1(src.encode()).hexdigest()[:20]
        self.module_name = f"onnx_numba_region_{digest}"
        self.fn = _load(self.module_name, src)
        self.in_slots = tuple(slot_of[x] for x in external)
        self.out_slots = tuple(slot_of[x] for x in self.escaping)
        self.nodes = nodes
        self.label = label

    def run(self, *xs):
        return self.fn(_nthreads(), *xs, *self.constants)

    @staticmethod
    def nthreads() -> int:
        return _nthreads()

    def cold(self) -> bool:
        """Whether Numba has no cached compilation of this region's function yet (its first call compiles)."""
        if self.fn.signatures:
            return False
        cache = getattr(self.fn, "_cache", None)
        index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
        return index is None or not os.path.exists(index)

    def locate(self, e):
        """``(node, exception)`` for an exception the generated function raised: the node whose block raised it
        (the message names it by index) and the exception with the node's name put back; the run's first node
        and ``e`` itself when the message names none."""
        # A block may raise with values computed at run time as further arguments (the index out of range):
        # they join the message.
        msg = " ".join(str(a) for a in e.args) if len(e.args) > 1 else str(e)
        m = _NODE_REF.search(msg)
        if m is None:
            return self.nodes[0], e
        node = self.nodes[int(m.group(1))]
        text = _NODE_REF.sub(lambda mm: self.nodes[int(mm.group(1))].name, msg)
        own = f"node '{node.name}' ({node.op_type}): "  # raise_at names the node again, with its domain and opset
        if text.startswith(own):
            text = text[len(own):]
        try:
            err = type(e)(text)
        except TypeError:
            err = e
        return node, err


def cold_kinds(regions) -> list:
    """The distinct generated functions among ``regions`` that Numba has not compiled or cached yet."""
    seen, cold = set(), []
    for r in regions:
        if r.module_name not in seen:
            seen.add(r.module_name)
            if r.cold():
                cold.append(r.module_name)
    return cold


def repair_cache(exc) -> str | None:
    """When ``exc`` arose while Numba read one of its cache files (a truncated or overwritten index or data
    file, of a region or of a kernel it calls), delete that function's cache files, warn, and return the index
    path, so that a retry compiles afresh; None for any other exception."""
    tb = exc.__traceback__
    target = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace(os.sep, "/").endswith("numba/core/caching.py"):
            owner = tb.tb_frame.f_locals.get("self")
            if getattr(owner, "_index_path", None):
                target = owner
        tb = tb.tb_next
    if target is None:
        return None
    index = target._index_path
    stem = os.path.basename(index)[:-len(".nbi")]
    folder = os.path.dirname(index)
    try:
        for name in os.listdir(folder):
            if name == stem + ".nbi" or (name.startswith(stem + ".") and name.endswith(".nbc")):
                os.unlink(os.path.join(folder, name))
    except OSError:
        return None
    import warnings
    warnings.warn(f"onnx-numba: a damaged Numba cache file ({index}: {type(exc).__name__}: {exc}) was deleted and "
                  "its function is compiled again", RuntimeWarning, stacklevel=2)
    return index


class CompileProgress:
    """A progress bar over the region kinds a first run compiles, with a note that this happens once.
    Shown on standard error when there is something to compile and the ``ONNX_NUMBA_PROGRESS`` flag is on
    (``runtime.settings``)."""

    def __init__(self, kinds, what: str = "model"):
        self.pending = set(kinds)
        self.seconds = {}  # module name -> seconds its first call took
        self.bar = None
        from . import settings
        if self.pending and settings.flag("ONNX_NUMBA_PROGRESS"):
            from tqdm import tqdm
            print(f"onnx-numba: compiling {len(self.pending)} region kind(s) of this {what}; this happens once, "
                  f"later starts load them from the cache ({cache_dir(quiet=True)})", file=sys.stderr, flush=True)
            self.bar = tqdm(total=len(self.pending), desc="compiling", unit="kind", file=sys.stderr, leave=True)

    def done(self, module_name: str, seconds: float = 0.0) -> None:
        """The first call of ``module_name`` returned after ``seconds`` (compiling or loading it)."""
        if module_name in self.pending:
            self.pending.discard(module_name)
            self.seconds[module_name] = seconds
            if self.bar is not None:
                self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


_ALIGN = 64  # bytes: packed constants start at offsets that are multiples of this
_OWN_ARGUMENT = 1 << 16  # bytes from which a constant is an argument of its own rather than packed


def _pack(constants, names):
    """(argument names, arrays, unpacking lines): constants of at least ``_OWN_ARGUMENT`` bytes as arguments of
    their own; the rest grouped by dtype into one C-contiguous array each, every constant at a byte offset that
    is a multiple of ``_ALIGN``, with a line per constant that takes it back as a slice reshaped to its shape."""
    by_dt = {}
    args, packs, lines = [], [], []
    for name, c in zip(names, constants):
        if c.nbytes >= _OWN_ARGUMENT:
            args.append(name)
            packs.append(np.ascontiguousarray(c))
        else:
            by_dt.setdefault(np.dtype(c.dtype), []).append((name, np.ascontiguousarray(c)))
    for k, (dt, items) in enumerate(sorted(by_dt.items(), key=lambda kv: kv[0].str)):
        step = max(1, _ALIGN // dt.itemsize)
        offs, n = [], 0
        for _, c in items:
            offs.append(n)
            n += -(-max(c.size, 1) // step) * step
        flat = np.zeros(n, dt)
        pname = f"const_pack{k}"
        for (name, c), off in zip(items, offs):
            flat[off:off + c.size] = c.reshape(-1)
            shape = "".join(f"{d}, " for d in c.shape)
            lines.append(f"{name} = {pname}[{off}:{off + c.size}].reshape(({shape}))")
        args.append(pname)
        packs.append(flat)
    return args, packs, lines


def _nthreads() -> int:
    # numba.get_num_threads() checks the threading layer on every call; once it has answered, its ctypes
    # getter (which reads the calling thread's current setting) is all it does.
    global _nthreads
    n = get_num_threads()
    from numba.np.ufunc import parallel
    getter = getattr(parallel, "_get_num_threads", None)
    if getter is not None and getter() == n:
        _nthreads = getter
    return n


def _load(module_name, src):
    """The generated module's ``region`` function, imported once per process.  The source is written
    atomically under ``cache_dir()`` (two processes writing the same module write the same text); where that
    folder cannot be written (read-only, full) it goes to a private temporary folder, and where nothing can be
    written it is compiled from memory without Numba's cache, each with a warning, never a failure."""
    with _lock:
        mod = sys.modules.get(module_name)
        if mod is None:
            mod = None
            for folder, where in ((cache_dir, "the region cache"), (_private_dir, "a temporary folder")):
                try:
                    mod = _import_file(module_name, src, folder())
                    break
                except (OSError, RuntimeError) as e:
                    _warn(f"generated region {module_name} could not be cached in {where} ({type(e).__name__}: {e})")
            if mod is None:
                mod = _import_memory(module_name, src)
            sys.modules[module_name] = mod
        return mod.region


def _import_file(module_name, src, folder):
    path = os.path.join(folder, module_name + ".py")
    try:
        with open(path) as f:
            current = f.read() == src
    except (OSError, UnicodeDecodeError):
        current = False
    if not current:  # absent, or damaged: write it anew
        write_atomic(path, src)
    spec = importlib.util.spec_from_file_location(module_name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # RuntimeError when Numba finds no folder to cache it in
    return mod


_PRIVATE = None


def _private_dir() -> str:
    global _PRIVATE
    if _PRIVATE is None:
        import tempfile
        _PRIVATE = tempfile.mkdtemp(prefix="onnx-numba-regions-")
    return _PRIVATE


def _import_memory(module_name, src):
    import types
    mod = types.ModuleType(module_name)
    exec(compile(src.replace("@njit(cache=True,", "@njit(cache=False,"), f"<{module_name}>", "exec"), mod.__dict__)
    return mod


_warned = set()


def _warn(msg):
    if msg not in _warned:
        _warned.add(msg)
        import warnings
        warnings.warn(f"onnx-numba: {msg}; the session works, but this region is compiled again by later "
                      "processes", RuntimeWarning, stacklevel=3)
