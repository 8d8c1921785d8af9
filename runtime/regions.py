"""Compiled regions: runs of nodes generated into one Numba function, so a step is one call.

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

Invariants:
- every array inside a region is C-contiguous (feeds are made contiguous by
  the session, forms copy where a slice or a transpose would not be);
- a form never writes into an input; an output may be a view of an input only
  where the node's wrapper is registered with ``views=True`` (the planner's
  alias analysis relies on that);
- the generated source is a pure function of the region (node structure,
  types, attributes, parameter values) and of the kernel sources' fingerprint
  (``ops._cache_epoch``), written once under the cache folder and imported
  from there, so Numba's on-disk cache makes a second start compile nothing
  and a changed kernel is never linked from a stale cache;
- errors a form detects (an index out of range, a cache that does not fit)
  raise the project's error classes with the node named in the message.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading

import numpy as np
from numba import get_num_threads

__all__ = ["find_regions", "Region", "cache_dir", "MIN_NODES"]

MIN_NODES = 2
_lock = threading.Lock()


def cache_dir() -> str:
    """Where generated region modules live (``ONNX_NUMBA_REGION_DIR``, else beside Numba's cache)."""
    d = os.environ.get("ONNX_NUMBA_REGION_DIR")
    if not d:
        base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "onnx-numba")
        d = os.path.join(base, "regions")
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
    res = []
    for node in nodes:
        res.append(cf.emit(node, types, used_after))
    return res


def find_regions(nodes, impls, value_info, initializers, outputs_read_after, min_nodes: int = MIN_NODES,
                 donated=frozenset()):
    """Maximal [start, end) runs of nodes that all have a compiled form, with their emitted code.  ``donated``:
    graph inputs, each read by one node, that the caller lets that node overwrite."""
    types = _Types(value_info, initializers, donated)
    emitted = _emit_all(nodes, types, outputs_read_after)
    runs, start = [], None
    for i, (n, impl, e) in enumerate(zip(nodes, impls, emitted)):
        ok = e is not None and impl is not None and impl.provider == "CPUExecutionProvider"
        if ok:
            if start is None:
                start = i
        else:
            if start is not None and i - start >= min_nodes:
                runs.append((start, i))
            start = None
    if start is not None and len(nodes) - start >= min_nodes:
        runs.append((start, len(nodes)))
    return [(a, b, emitted[a:b]) for a, b in runs]


def _ident(name: str, k: int) -> str:
    safe = "".join(c if c.isalnum() else "_" for c in name)[:40]
    return f"v{k}_{safe}"


class Region:
    """One compiled run of nodes; ``run(*external_inputs)`` returns the values read after it."""

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
        names = {}
        for k, x in enumerate(external + produced):
            names[x] = _ident(x, k)
        imports = {}
        body = []
        const_names, constants = [], []
        for e in emitted:
            const_names += e.constant_names()
            constants += e.constants
        # Plan-time constants travel packed, one flat array per dtype, and are unpacked by slicing at the top of
        # the function: every argument costs Numba's dispatcher a type check and an unboxing per call.
        pack_names, self.constants, unpack = _pack(constants, const_names)
        body += ["    " + ln for ln in unpack]
        for n, e in zip(nodes, emitted):
            body.append(f"    # {n.op_type} {n.name}")
            for line in e.render(names):
                body.append("    " + line)
            imports.update(e.imports)
        # ``nthreads`` (Numba's current thread count) is an argument: reading it inside compiled code would
        # reference the threading layer's address, which keeps a function out of the on-disk cache.
        args = ", ".join(["nthreads"] + [names[x] for x in external] + pack_names)
        rets = ", ".join(names[x] for x in self.escaping)
        from ops._cache_epoch import fingerprint
        head = [f'"""Generated by runtime.regions for {len(nodes)} nodes; do not edit."""',
                f"# kernel sources {fingerprint()}: the module name changes with them, so a cache never links "
                "stale kernels",
                "import math", "import numpy as np", "from numba import njit"]
        for alias, (mod, attr) in sorted(imports.items()):
            head.append(f"from {mod} import {attr} as {alias}")
        src = "\n".join(head) + "\n\n\n@njit(cache=True, nogil=True, error_model='numpy')\n" \
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


_ALIGN = 64  # bytes: packed constants start at offsets that are multiples of this


def _pack(constants, names):
    """(argument names, flat arrays, unpacking lines): the constants grouped by dtype into one C-contiguous array
    each, every constant at a byte offset that is a multiple of ``_ALIGN``, and a line per constant that takes it back
    as a slice reshaped to its shape."""
    by_dt = {}
    for name, c in zip(names, constants):
        by_dt.setdefault(np.dtype(c.dtype), []).append((name, np.ascontiguousarray(c)))
    args, packs, lines = [], [], []
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
    with _lock:
        mod = sys.modules.get(module_name)
        if mod is None:
            path = os.path.join(cache_dir(), module_name + ".py")
            if not os.path.exists(path) or open(path).read() != src:
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    f.write(src)
                os.replace(tmp, path)
            spec = importlib.util.spec_from_file_location(module_name, path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            sys.modules[module_name] = mod
        return mod.region
