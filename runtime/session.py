"""``InferenceSession``: onnxruntime's API shape over the planned executor.

Building a session: load (path, bytes or ModelProto), infer shapes, expand
function-bodied ops that have no kernel, fold constants, drop identities and
dead nodes, infer again, then compile a ``Plan`` for the chosen provider.
A node without a kernel makes construction fail with ``UnsupportedOpError``;
nothing falls back to another runtime or device.

Feeds are checked against the graph's declared inputs before anything runs:
the name, the dtype, the rank and every static dimension.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

import ops  # noqa: F401  (registers every kernel)
from ops import registry
from .dtypes import onnx_type, type_string
from .errors import InvalidFeedError
from .decode_sibling import batch_symbols, build_sibling, find_scan_symbol, flag_from_environment, parse_flag, route_to_sibling, \
    symbol_positions
from .executor import Plan
from .ir import Graph
from .loader import load_graph
from .passes import EliminateDeadNodes, EliminateIdentity, ExpandFunctions, FoldConstants, InferShapes
from .providers import PROVIDERS, normalize_providers

__all__ = ["InferenceSession", "SessionOptions", "NodeArg", "IOBinding", "build_graph"]


_UNSET = object()


class SessionOptions:
    """The subset of onnxruntime's options the native runtime honours."""

    def __init__(self):
        self.graph_optimization_level = 99
        self.strict_shape_inference = False
        self.preallocate = True
        self.fused_segments = True
        # Decode sibling (single-trip Scan inlining); None: read ONNX_NUMBA_DECODE_INLINE_SCAN.
        self.decode_inline_scan = None
        self.intra_op_num_threads = 0
        self.log_severity_level = 2
        self.enable_profiling = False


@dataclass
class NodeArg:
    name: str
    type: str
    shape: list

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


def _arg(v) -> NodeArg:
    if v.kind != "tensor":
        return NodeArg(v.name, v.kind, None)
    shape = None if v.shape is None else [d for d in v.shape]
    return NodeArg(v.name, type_string(v.elem_type or (onnx_type(v.dtype) if v.dtype is not None else 0)), shape)


def build_graph(model, options: SessionOptions | None = None, provider: str = "CPUExecutionProvider") -> Graph:
    """Load and optimize ``model`` into a plannable IR graph."""
    options = options or SessionOptions()
    graph = model if isinstance(model, Graph) else load_graph(model)
    strict = bool(getattr(options, "strict_shape_inference", False))
    InferShapes(strict=strict)(graph)

    def has_kernel(node):
        return registry.resolve(node.domain, node.op_type, node.opset, provider) is not None

    if ExpandFunctions(has_kernel)(graph).modified:
        graph.toposort()
        InferShapes(strict=False)(graph)
    if getattr(options, "graph_optimization_level", 99):
        changed = FoldConstants()(graph).modified
        changed |= EliminateIdentity()(graph).modified
        changed |= EliminateDeadNodes()(graph).modified
        if changed:
            InferShapes(strict=False)(graph)
    return graph


class InferenceSession:
    """Run an ONNX model natively; the API follows ``onnxruntime.InferenceSession``."""

    def __init__(self, path_or_bytes, sess_options: SessionOptions | None = None, providers=None,
                 provider_options=None, **kwargs):
        self._options = sess_options or SessionOptions()
        provs = normalize_providers(providers)
        self._provider = provs[0][0]
        self._model_path = os.fspath(path_or_bytes) if isinstance(path_or_bytes, (str, os.PathLike)) else None
        self._graph = build_graph(path_or_bytes, self._options, self._provider)
        self._plan = Plan(self._graph, self._provider, preallocate=getattr(self._options, "preallocate", True),
                          session_options=self._options)
        self._inputs = [_arg(v) for v in self._graph.inputs]
        self._outputs = [_arg(v) for v in self._graph.outputs]
        flag = getattr(self._options, "decode_inline_scan", None)
        self._decode_flag = flag_from_environment() if flag is None else parse_flag(flag)
        self._scan_symbol = _UNSET
        self._scan_positions = []
        self._sibling = _UNSET
        self._siblings = {}
        self.plan_runs = {"main": 0, "sibling": 0}
        self._input_info = {v.name: v for v in self._graph.inputs}
        self._input_index = {v.name: k for k, v in enumerate(self._graph.inputs)}
        self._output_index = {v.name: k for k, v in enumerate(self._graph.outputs)}

    # -- introspection -------------------------------------------------------------------------
    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_overridable_initializers(self):
        return []

    def get_providers(self):
        return [self._provider]

    def get_session_options(self):
        return self._options

    @property
    def device(self):
        return PROVIDERS[self._provider]

    @property
    def plan(self) -> Plan:
        return self._plan

    # -- running -------------------------------------------------------------------------------
    def _check_feed(self, name, value):
        vi = self._input_info[name]
        if vi.kind != "tensor":
            return value
        if not isinstance(value, np.ndarray):
            if np.isscalar(value) or isinstance(value, (list, tuple)):
                value = np.asarray(value, dtype=vi.dtype) if vi.dtype is not None else np.asarray(value)
            else:
                raise InvalidFeedError(f"input {name!r}: expected a numpy array, got {type(value).__name__}")
        if vi.dtype is not None and value.dtype != vi.dtype:
            if not (vi.dtype == object and value.dtype.kind in "OUS"):
                raise InvalidFeedError(
                    f"input {name!r}: expected dtype {type_string(vi.elem_type)} ({vi.dtype}), got {value.dtype}")
            value = value.astype(object)
        if vi.shape is not None:
            if value.ndim != len(vi.shape):
                raise InvalidFeedError(
                    f"input {name!r}: expected rank {len(vi.shape)} with shape {list(vi.shape)}, "
                    f"got rank {value.ndim} with shape {list(value.shape)}")
            for ax, (want, got) in enumerate(zip(vi.shape, value.shape)):
                if isinstance(want, int) and want != got:
                    raise InvalidFeedError(
                        f"input {name!r}: expected shape {list(vi.shape)}, got {list(value.shape)} "
                        f"(axis {ax}: expected {want}, got {got})")
        if not value.flags.c_contiguous:
            value = np.ascontiguousarray(value)
        return value

    def _feeds(self, input_feed: dict) -> list:
        if not isinstance(input_feed, dict):
            raise InvalidFeedError(f"input_feed must be a dict of name -> array, got {type(input_feed).__name__}")
        for name in input_feed:
            if name not in self._input_index:
                raise InvalidFeedError(
                    f"input {name!r} is not an input of this model; expected one of {list(self._input_index)}")
        feeds = []
        for v in self._graph.inputs:
            if v.name not in input_feed:
                raise InvalidFeedError(f"input {v.name!r} is missing from the feed; the model expects "
                                       f"{[x.name for x in self._graph.inputs]}")
            feeds.append(self._check_feed(v.name, input_feed[v.name]))
        return feeds

    # -- decode sibling ------------------------------------------------------------------------------
    @property
    def decode_sibling(self):
        """The single-token sibling plan: None if there is none, or if it has not been built yet."""
        return None if self._sibling is _UNSET else self._sibling

    def _scan_extent(self, feeds):
        if self._scan_symbol is _UNSET:
            self._scan_symbol = find_scan_symbol(self._graph)
            self._scan_positions = symbol_positions(self._graph, self._scan_symbol) if self._scan_symbol else []
            self._batch_syms = batch_symbols(self._graph, exclude=(self._scan_symbol,))
            # One position per batch symbol is enough to read its value from the feeds.
            self._batch_positions = [symbol_positions(self._graph, b)[0] for b in self._batch_syms]
        if not self._scan_positions:
            return None
        extents = {feeds[k].shape[ax] for k, ax in self._scan_positions if hasattr(feeds[k], "shape")}
        return extents.pop() if len(extents) == 1 else None

    def _select_plan(self, feeds) -> Plan:
        if not self._decode_flag:
            self.plan_runs["main"] += 1
            return self._plan
        extent = self._scan_extent(feeds)
        if extent == 1:
            # One sibling per batch size: the batch symbols are pinned so the inlined interior is static.
            key = tuple(feeds[k].shape[ax] for k, ax in self._batch_positions)
            if key not in self._siblings:
                fixed = dict(zip(self._batch_syms, key))
                g = build_sibling(self._graph, self._scan_symbol, fixed)
                self._siblings[key] = None if g is None else Plan(g, self._provider, session_options=self._options)
            self._sibling = self._siblings[key]
        sibling = self.decode_sibling
        if route_to_sibling(self._decode_flag, sibling is not None, extent):
            self.plan_runs["sibling"] += 1
            return sibling
        self.plan_runs["main"] += 1
        return self._plan

    def run(self, output_names, input_feed, run_options=None):
        feeds = self._feeds(input_feed)
        results = self._select_plan(feeds).run(feeds)
        if not output_names:
            return results
        idx = []
        for n in output_names:
            if n not in self._output_index:
                raise InvalidFeedError(f"output {n!r} is not an output of this model; expected one of "
                                       f"{list(self._output_index)}")
            idx.append(self._output_index[n])
        return [results[i] for i in idx]

    def io_binding(self) -> "IOBinding":
        return IOBinding(self)

    def run_with_iobinding(self, binding: "IOBinding", run_options=None) -> None:
        binding._run()


class IOBinding:
    """Buffers bound by name that stay resident between runs.

    Bound inputs are read in place on every run.  A bound output buffer is
    written in place (its shape and dtype must match what the graph
    produces); an output bound without a buffer is returned fresh by
    ``get_outputs``.
    """

    def __init__(self, session: InferenceSession):
        self._s = session
        self._inputs: dict = {}
        self._outputs: dict = {}
        self._results: list = []

    def bind_cpu_input(self, name, array):
        self.bind_input(name, array)

    def bind_input(self, name, array, *args, **kwargs):
        if name not in self._s._input_index:
            raise InvalidFeedError(f"input {name!r} is not an input of this model; expected one of "
                                   f"{list(self._s._input_index)}")
        self._inputs[name] = self._s._check_feed(name, array)

    def bind_output(self, name, array=None, *args, **kwargs):
        if name not in self._s._output_index:
            raise InvalidFeedError(f"output {name!r} is not an output of this model; expected one of "
                                   f"{list(self._s._output_index)}")
        if array is not None and not isinstance(array, np.ndarray):
            raise InvalidFeedError(f"output {name!r}: bind a numpy array or None, got {type(array).__name__}")
        self._outputs[name] = array

    def clear_binding_inputs(self):
        self._inputs.clear()

    def clear_binding_outputs(self):
        self._outputs.clear()

    def _run(self):
        # Bound inputs were checked when they were bound; only completeness is left to check.
        names = [v.name for v in self._s._graph.inputs]
        missing = [n for n in names if n not in self._inputs]
        if missing:
            raise InvalidFeedError(f"input(s) {missing} are not bound; the model expects {names}")
        feeds = [self._inputs[n] for n in names]
        results = self._s._select_plan(feeds).run(feeds)
        names = list(self._outputs) or list(self._s._output_index)
        out = []
        for n in names:
            r = results[self._s._output_index[n]]
            buf = self._outputs.get(n)
            if buf is not None:
                if buf.shape != r.shape or buf.dtype != r.dtype:
                    raise InvalidFeedError(f"output {n!r}: bound buffer is {buf.dtype}{list(buf.shape)}, "
                                           f"the graph produced {r.dtype}{list(r.shape)}")
                if buf is not r:
                    np.copyto(buf, r)
                r = buf
            out.append(r)
        self._results = out

    def get_outputs(self):
        return list(self._results)

    def copy_outputs_to_cpu(self):
        return [np.array(r, copy=True) for r in self._results]
