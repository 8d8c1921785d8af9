"""``InferenceSession``: onnxruntime's API shape over the planned executor.

Building a session: load (path, bytes or ModelProto), infer shapes, expand
function-bodied ops that have no kernel, fold constants, drop identities and
dead nodes, infer again, then compile a ``Plan`` for the chosen provider
(a ``CudaPlan`` for ``CUDAExecutionProvider``, which needs a GPU or Numba's
CUDA simulator and otherwise raises ``CudaUnavailableError``).
A node without a kernel makes construction fail with ``UnsupportedOpError``;
nothing falls back to another runtime or device (a CUDA session runs a node
on the CPU only when ``SessionOptions.cuda_cpu_ops`` names it).

Feeds are checked against the graph's declared inputs before anything runs:
the name, the dtype, the rank and every static dimension.  A CUDA session
also takes device arrays as feeds (checked the same way, never copied), and
its ``IOBinding`` can keep outputs on the device.

onnxruntime's options are honoured where they mean something here (see
``runtime/options.py``): ``intra_op_num_threads`` caps the threads this
session's kernels use (Numba's thread count is per calling thread, so other
sessions keep theirs) and is the thread count whose split of onnxruntime's
work the MLAS-order kernels follow (``ops._mlas_attention.ort_threads``),
the optimization level, the optimized-model file,
initializer and free-dimension overrides, logging, profiling and
``RunOptions.terminate``; a session with ``use_per_session_threads = False``
takes its thread counts from ``set_global_thread_pool_sizes`` (``runtime/environment.py``).  Runs of one
session from several threads overlap; each overlapping run gets buffers of its own (``Plan.run``,
``CudaPlan.run``).  A sparse tensor fed where a tensor is expected is refused (``InvalidFeedError``).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

import numba
import numpy as np

import ops  # noqa: F401  (registers every kernel)
from ops import registry
from ops._common import MAX_OUTPUT_BYTES
from ops._mlas_attention import SESSION_INTRA_OP_THREADS
from .dtypes import onnx_type, type_proto_string, type_string
from .errors import InvalidArgumentError, InvalidFeedError, ModelLoadError
from .decode_sibling import batch_symbols, build_sibling, find_scan_symbol, flag_from_environment, parse_flag, route_to_sibling, \
    symbol_positions
from .executor import Plan
from .ir import Graph
from .loader import load_graph, release_pages
from .options import (CURRENT_RUN_OPTIONS, HONOURED_CONFIG, RunOptions, SessionOptions, options_from_model,
                      severity_to_logging)
from .environment import global_thread_pool_sizes
from .devices import OrtDevice, runtime_device
from .ortvalue import OrtValue, OrtValueVector
from .sparse import SparseTensor
from .passes import EliminateDeadNodes, ExpandFunctions, InferShapes, simplify
from .profiling import Profiler, RunObserver
from .threads import call_with_threads
from .providers import CUDA_PROVIDER, choose_provider
from . import cuda as rc

__all__ = ["InferenceSession", "SessionOptions", "RunOptions", "NodeArg", "IOBinding", "ModelMetadata",
           "OrtEpAssignedNode", "OrtEpAssignedSubgraph", "build_graph", "set_default_logger_severity"]


_UNSET = object()


_default_severity = [2]


def set_default_logger_severity(severity: int) -> None:
    """The log severity of sessions whose ``log_severity_level`` is -1 (0 verbose, 1 info, 2 warning, 3 error,
    4 fatal), as onnxruntime's."""
    sev = int(severity)
    if not 0 <= sev <= 4:
        raise RuntimeError(f"severity must be between 0 and 4, got {severity!r}")
    _default_severity[0] = sev


def _session_logger(options) -> logging.Logger:
    """The Python logger of one session, named ``onnx_numba.session[.<logid>]``, at the options' severity.

    Each session gets a logger object of its own (outside ``logging``'s registry, its records propagating to the
    handlers of ``onnx_numba.session`` and above), so one session's severity never changes another's."""
    logid = getattr(options, "logid", "") or ""
    parent = logging.getLogger("onnx_numba.session")
    logger = logging.Logger(parent.name + (f".{logid}" if logid else ""))
    logger.parent = parent
    sev = int(getattr(options, "log_severity_level", -1))
    logger.setLevel(severity_to_logging(_default_severity[0] if sev < 0 else sev))
    return logger


@dataclass
class ModelMetadata:
    """onnxruntime's ``ModelMetadata``: the model's descriptive fields."""
    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = (1 << 63) - 1
    custom_metadata_map: dict = None


@dataclass
class NodeArg:
    name: str
    type: str
    shape: list

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


def _arg(v) -> NodeArg:
    """onnxruntime's ``NodeArg``: its type string, and its shape as a list (``[]`` when unknown, as onnxruntime)."""
    if v.kind != "tensor":
        return NodeArg(v.name, type_proto_string(v.type_proto), [])
    shape = [] if v.shape is None else [d for d in v.shape]
    return NodeArg(v.name, type_string(v.elem_type or (onnx_type(v.dtype) if v.dtype is not None else 0)), shape)


def _override_dims(graph, by_name: dict, by_denotation: dict) -> None:
    """Fix the graph inputs' symbolic dimensions that ``add_free_dimension_override_by_*`` named."""
    if not by_name and not by_denotation:
        return
    for v in graph.inputs:
        if v.kind != "tensor" or v.shape is None:
            continue
        dims = v.type_proto.tensor_type.shape.dim if v.type_proto is not None else ()
        shape = list(v.shape)
        for ax, d in enumerate(shape):
            den = dims[ax].denotation if ax < len(dims) else ""
            if isinstance(d, str) and d in by_name:
                shape[ax] = by_name[d]
            elif not isinstance(d, int) and den and den in by_denotation:
                shape[ax] = by_denotation[den]
        v.shape = tuple(shape)
        if v.name in graph.value_info:
            graph.value_info[v.name].shape = v.shape


def build_graph(model, options: SessionOptions | None = None, provider: str = "CPUExecutionProvider",
                disabled_optimizers=()) -> Graph:
    """Load and optimize ``model`` into a plannable IR graph; ``disabled_optimizers`` names passes to skip
    (onnxruntime's names ``ConstantFolding``, ``EliminateIdentity``, ``GatedActivationFusion``, or the passes'
    class names)."""
    disabled = set(disabled_optimizers or ())
    options = options or SessionOptions()
    folder = (getattr(options, "_config", None) or {}).get("session.model_external_initializers_file_folder_path")
    graph = model if isinstance(model, Graph) else load_graph(model, getattr(options, "_initializers", None),
                                                              bool(getattr(options, "_overridable_inputs", False)),
                                                              getattr(options, "_external_files", None), folder)
    _override_dims(graph, getattr(options, "_dim_by_name", {}), getattr(options, "_dim_by_denotation", {}))
    strict = bool(getattr(options, "strict_shape_inference", False))
    InferShapes(strict=strict)(graph)
    allow = set(getattr(options, "cuda_cpu_ops", None) or ()) if provider == CUDA_PROVIDER else set()
    if provider == CUDA_PROVIDER:
        import ops.cuda
        ops.cuda.load()

    def has_kernel(node):
        if registry.resolve(node.domain, node.op_type, node.opset, provider) is not None:
            return True
        # A CUDA node the options allow on the CPU keeps its CPU kernel rather than being expanded.
        return (node.op_type in allow or node.name in allow) and \
            registry.resolve(node.domain, node.op_type, node.opset, "CPUExecutionProvider") is not None

    if ExpandFunctions(has_kernel)(graph).modified:
        graph.toposort()
        InferShapes(strict=False)(graph)
    if getattr(options, "graph_optimization_level", 99):
        if simplify(disabled)(graph).modified:
            InferShapes(strict=False)(graph)
        from .passes.conv_fusions import FuseConvBatchNorm
        if not disabled & {"ConvBNFusion", "FuseConvBatchNorm"} and FuseConvBatchNorm()(graph).modified:
            EliminateDeadNodes()(graph)  # the unfused weights, unless another node reads them
    if int(getattr(options, "graph_optimization_level", 99)) >= 2:
        # The decomposed forms of encoder exports as one node each (runtime/passes/encoder_fusions.py; CPU kernels),
        # first: a Gelu so written then joins the Conv before it.
        from .passes.encoder_fusions import ONNXRUNTIME_NAMES, FuseAttention, FuseGelu, FuseLayerNormalization, \
            FuseMatMulAdd
        fused = False
        for ort_name, cls in zip(ONNXRUNTIME_NAMES, (FuseLayerNormalization, FuseGelu, FuseMatMulAdd, FuseAttention)):
            if provider != CUDA_PROVIDER and not disabled & {ort_name, cls.__name__}:
                fused |= cls()(graph).modified
        if fused:
            EliminateDeadNodes()(graph)
        # A Conv and the activation after it as one kernel that applies the activation per tile (CPU kernels)
        from .passes.conv_fusions import FuseConvActivation, FuseConvAddActivation, FuseHardSwishRelu6
        if provider != CUDA_PROVIDER and "FuseHardSwishRelu6" not in disabled:
            FuseHardSwishRelu6()(graph)
        if provider != CUDA_PROVIDER and not disabled & {"ConvAddActivationFusion", "FuseConvAddActivation"}:
            FuseConvAddActivation()(graph)
        if provider != CUDA_PROVIDER and not disabled & {"ConvActivationFusion", "FuseConvActivation"}:
            FuseConvActivation()(graph)
        # The feed-forward gate as one kernel (runtime/passes/cuda_fusions.py): on the CPU one pass over memory
        # where the export has three; on a GPU also the gate and value products merged (launch-bound steps).
        from .passes.cuda_fusions import FuseGatedActivation, FuseGatedMatMul, FuseGatedMatMulNBits
        if not disabled & {"GatedActivationFusion", "FuseGatedActivation"} and \
                FuseGatedActivation()(graph).modified and provider == CUDA_PROVIDER:
            FuseGatedMatMul()(graph)
            FuseGatedMatMulNBits()(graph)
    if getattr(options, "graph_optimization_level", 99) and getattr(options, "compiled_regions", False) \
            and provider != CUDA_PROVIDER:
        # The last layer's closing norm exposes the residual sum as the others do: one region kind, not two.
        from .passes.layer_kinds import ExposeSkipSums
        ExposeSkipSums()(graph)
    return graph


class InferenceSession:
    """Run an ONNX model natively; the API follows ``onnxruntime.InferenceSession``."""

    def __init__(self, path_or_bytes, sess_options: SessionOptions | None = None, providers=None,
                 provider_options=None, **kwargs):
        unknown = set(kwargs) - {"disabled_optimizers", "read_config_from_model"}
        if unknown:
            raise TypeError(f"InferenceSession got unexpected keyword argument(s) {sorted(unknown)}")
        self._options = sess_options or SessionOptions()
        if kwargs.get("read_config_from_model", os.environ.get("ORT_LOAD_CONFIG_FROM_MODEL", "0") == "1"):
            self._options = options_from_model(path_or_bytes, self._options)
        self._logger = _session_logger(self._options)
        self._profiler = Profiler(getattr(self._options, "profile_file_prefix", "onnxruntime_profile_")) \
            if getattr(self._options, "enable_profiling", False) else None
        # set_providers reloads a model given by path; one given as bytes or a ModelProto is not kept (it may be
        # large): the loaded graph is planned again instead.
        self._model = path_or_bytes if isinstance(path_or_bytes, (str, os.PathLike)) else None
        self._disabled = list(kwargs.get("disabled_optimizers") or ())
        self._model_path = os.fspath(path_or_bytes) if isinstance(path_or_bytes, (str, os.PathLike)) else None
        n = int(getattr(self._options, "intra_op_num_threads", 0) or 0)
        inter = int(getattr(self._options, "inter_op_num_threads", 0) or 0)
        if not getattr(self._options, "use_per_session_threads", True):
            n, inter = global_thread_pool_sizes()  # onnxruntime's global pools replace the session's own
        if n < 0:
            raise ValueError(f"intra_op_num_threads must be >= 0, got {n}")
        self._ort_nthreads = n  # onnxruntime's split of its work over n threads, which its order follows
        self._nthreads = min(n, numba.config.NUMBA_NUM_THREADS) if n else 0
        limit = int(getattr(self._options, "max_output_bytes", 0) or 0)
        if limit < 0:
            raise ValueError(f"max_output_bytes must be >= 0, got {limit}")
        self._max_output = limit or None  # None: the process default (half the machine's memory)
        # ExecutionMode.ORT_PARALLEL: independent nodes run on inter_op_num_threads threads (0: one per core).
        parallel = int(getattr(self._options, "execution_mode", 0) or 0) == 1
        if inter < 0:
            raise ValueError(f"inter_op_num_threads must be >= 0, got {inter}")
        self._parallel = (inter or os.cpu_count() or 1) if parallel else 0
        t0 = time.perf_counter_ns()
        self._build(providers, provider_options, path_or_bytes)
        if self._profiler is not None:
            self._profiler.event("Session", "session_initialization", t0, time.perf_counter_ns())
        self._logger.info("session for %s on %s: %d nodes planned", self._model_path or type(path_or_bytes).__name__,
                          self._provider, len(self._graph.nodes))

    def _build(self, providers, provider_options, source) -> None:
        """Choose the provider, load and optimize the graph, plan it (also ``set_providers``), the kernels that
        follow onnxruntime's thread split planned for this session's ``intra_op_num_threads``."""
        token = SESSION_INTRA_OP_THREADS.set(self._ort_nthreads)
        try:
            self._build_graph_and_plan(providers, provider_options, source)
        finally:
            SESSION_INTRA_OP_THREADS.reset(token)

    def _build_graph_and_plan(self, providers, provider_options, source) -> None:
        self._provider, self._provider_options, self._device = choose_provider(providers, provider_options,
                                                                               self._logger)
        self._graph = build_graph(source, self._options, self._provider, self._disabled)
        self._save_optimized()
        self._plan = self._make_plan(self._graph)
        release_pages(self._graph.initializers.values())  # planning read the weights it repacked
        self._inputs = [_arg(v) for v in self._graph.inputs]
        self._outputs = [_arg(v) for v in self._graph.outputs]
        flag = getattr(self._options, "decode_inline_scan", None)
        self._decode_flag = flag_from_environment() if flag is None else parse_flag(flag)
        self._scan_symbol = _UNSET
        self._scan_positions = []
        self._sibling = _UNSET
        self._siblings = {}
        self._sibling_lock = threading.Lock()
        self.plan_runs = {"main": 0, "sibling": 0}
        self._input_info = {v.name: v for v in self._graph.inputs}
        self._input_index = {v.name: k for k, v in enumerate(self._graph.inputs)}
        self._output_index = {v.name: k for k, v in enumerate(self._graph.outputs)}
        # onnxruntime's overridable initializers: constants here until a run feeds one, which then runs on a
        # twin session that plans them as inputs (their initializers the values of those not fed)
        self._defaults = dict(getattr(self._graph, "input_defaults", None) or {})
        kept = bool(getattr(self._options, "_overridable_inputs", False))
        self._overridable = [] if kept else [_arg(v) for v in getattr(self._graph, "overridable", None) or []]
        self._overridable_names = frozenset(a.name for a in self._overridable)
        self._source = source if self._overridable else None
        self._twin = None

    def _save_optimized(self) -> None:
        path = getattr(self._options, "optimized_model_filepath", "") or ""
        if not path:
            return
        cfg = getattr(self._options, "_config", {}) or {}
        fmt = cfg.get("session.save_model_format", "ONNX").upper()
        if fmt != "ONNX" and not path.lower().endswith(".onnx"):
            raise ValueError(f"session.save_model_format {fmt!r}: only ONNX models can be written")
        from .export import save_model
        save_model(self._graph, os.fspath(path),
                   cfg.get("session.optimized_model_external_initializers_file_name") or None,
                   int(cfg.get("session.optimized_model_external_initializers_min_size_in_bytes", 1024)))
        self._logger.info("optimized model written to %s", path)

    # -- introspection -------------------------------------------------------------------------
    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_overridable_initializers(self):
        """The graph inputs that have an initializer (IR version 4 on): a run may feed them."""
        return list(self._overridable)

    def get_input_memory_infos(self) -> list:
        """Where each input is expected: the session's device memory (``OrtMemoryInfo``)."""
        return [self._memory_info() for _ in self._inputs]

    def get_output_memory_infos(self) -> list:
        return [self._memory_info() for _ in self._outputs]

    def get_input_epdevices(self) -> list:
        """onnxruntime's per-input plugin device of the EP that consumes it; None for each here (this runtime has
        no plugin execution providers), one entry per input as onnxruntime gives."""
        return [None for _ in self._inputs]

    def _memory_info(self):
        from .devices import OrtAllocatorType, OrtMemoryInfo, OrtMemType
        name = "Cuda" if self._provider == CUDA_PROVIDER else "Cpu"
        index = getattr(self._device, "index", 0) or 0
        return OrtMemoryInfo(name, OrtAllocatorType.ORT_ARENA_ALLOCATOR, index, OrtMemType.DEFAULT)

    def get_provider_graph_assignment_info(self) -> list:
        """The nodes of the planned graph by execution provider, one ``OrtEpAssignedSubgraph`` per node
        (onnxruntime assigns each node of a CPU session alone); needs the session config entry
        ``session.record_ep_graph_assignment_info`` = "1", as in onnxruntime."""
        cfg = getattr(self._options, "_config", {}) or {}
        if cfg.get("session.record_ep_graph_assignment_info") != "1":
            raise InvalidArgumentError("Session configuration entry 'session.record_ep_graph_assignment_info' must "
                                       "be set to \"1\" to retrieve EP graph assignment information.")
        placement = self.get_placement()
        out = []
        for i, n in enumerate(self._graph.nodes):
            where = placement.get(n.name or f"#{i}", "cpu")
            ep = CUDA_PROVIDER if where == "cuda" else "CPUExecutionProvider"
            out.append(OrtEpAssignedSubgraph(ep, [OrtEpAssignedNode(n.domain or "", n.op_type, n.name or "")]))
        return out

    def disable_fallback(self) -> None:
        """onnxruntime's switch for retrying a failed session on the CPU provider: this runtime never does (a
        node without a kernel on the chosen provider is an error), so it is always off."""

    def enable_fallback(self) -> None:
        from .errors import NotSupportedError
        raise NotSupportedError("enable_fallback: this runtime does not fall back to another provider; a node "
                                "without a kernel on the chosen one is an error (SessionOptions.cuda_cpu_ops "
                                "names the nodes a CUDA session may run on the CPU)")

    @property
    def _sess(self) -> "_CSession":
        """onnxruntime's C session under its Python one, with the C calls' argument order."""
        return _CSession(self)

    def get_modelmeta(self) -> ModelMetadata:
        meta = dict(getattr(self._graph, "model_meta", None) or {})
        meta.setdefault("graph_name", self._graph.name)
        meta["custom_metadata_map"] = dict(meta.get("custom_metadata_map") or {})
        return ModelMetadata(**meta)

    def get_providers(self):
        return [self._provider]

    def set_providers(self, providers=None, provider_options=None) -> None:
        """Rebuild the session for ``providers`` (an ordered preference, as at construction)."""
        if not providers:
            providers = [self._provider]
        self._build(providers, provider_options, self._model if self._model is not None else self._graph)

    def get_profiling_start_time_ns(self) -> int:
        return self._profiler.start_ns if self._profiler is not None else 0

    def end_profiling(self) -> str:
        """Write the profile (onnxruntime's Chrome-trace format) and return its path; '' when not profiling."""
        if self._profiler is None or self._profiler.ended:
            return ""
        return self._profiler.end()

    def get_provider_options(self):
        return {self._provider: {k: str(v) for k, v in self._provider_options.items()}}

    def _make_plan(self, graph, main=True):
        if self._provider == CUDA_PROVIDER:
            from .cuda_plan import CudaPlan
            return CudaPlan(graph, self._provider, session_options=self._options, device=self._device)
        if main:
            return Plan(graph, self._provider, preallocate=getattr(self._options, "preallocate", True),
                        session_options=self._options)
        return Plan(graph, self._provider, session_options=self._options)

    def get_placement(self) -> dict:
        """{node name: "cuda" | "cpu(shape)" | "cpu(allowed)"} for a CUDA session; every node "cpu" otherwise."""
        if hasattr(self._plan, "get_placement"):
            return self._plan.get_placement()
        return {(n.name or f"#{i}"): "cpu" for i, n in enumerate(self._graph.nodes)}

    def cpu_round_trips(self) -> dict:
        """Per node of a CUDA session, the host round trips so far: {name: {bytes_down, bytes_up, calls, ...}}."""
        out = {}
        for p in [self._plan] + [x for x in self._siblings.values() if x is not None]:
            for k, v in getattr(p, "round_trips", {}).items():
                if k in out:
                    out[k] = {f: (out[k][f] + v[f] if isinstance(v[f], int) else v[f]) for f in v}
                else:
                    out[k] = dict(v)
        return out

    def get_session_options(self):
        return self._options

    @property
    def device(self):
        return self._device

    @property
    def plan(self) -> Plan:
        return self._plan

    # -- running -------------------------------------------------------------------------------
    def _check_feed(self, name, value):
        vi = self._input_info[name]
        if isinstance(value, OrtValue):
            value = value.value()
        if isinstance(value, SparseTensor):
            raise InvalidFeedError(f"input {name!r}: expected {_arg(vi).type}, got a sparse tensor "
                                   f"({value.data_type()}); no input of this runtime takes one, feed its dense "
                                   f"form (SparseTensor.to_dense)")
        if vi.kind != "tensor":
            return value
        if not isinstance(value, np.ndarray) and rc.is_device_array(value):
            return self._check_device_feed(name, vi, value)
        if not isinstance(value, np.ndarray):
            if np.isscalar(value) or isinstance(value, (list, tuple)):
                value = np.asarray(value, dtype=vi.dtype) if vi.dtype is not None else np.asarray(value)
            else:
                raise InvalidFeedError(f"input {name!r}: expected a numpy array, got {type(value).__name__}")
        if vi.dtype is not None and value.dtype != vi.dtype:
            if not (vi.dtype == object and value.dtype.kind in "OUSV"):
                raise InvalidFeedError(
                    f"input {name!r}: expected dtype {type_string(vi.elem_type)} ({vi.dtype}), got {value.dtype}")
            value = _strings(name, value)
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

    def _check_device_feed(self, name, vi, value):
        """A device array feed: the same dtype/rank/shape checks as a numpy one, and no copy."""
        if self._provider != CUDA_PROVIDER:
            raise InvalidFeedError(f"input {name!r}: a device array was fed to a {self._provider} session; "
                                   f"copy it to the host first (runtime.cuda.to_host)")
        dt = np.dtype(value.dtype)
        if vi.dtype is not None and dt != vi.dtype:
            raise InvalidFeedError(
                f"input {name!r}: expected dtype {type_string(vi.elem_type)} ({vi.dtype}), got {dt}")
        shape = tuple(value.shape)
        if vi.shape is not None:
            if len(shape) != len(vi.shape):
                raise InvalidFeedError(
                    f"input {name!r}: expected rank {len(vi.shape)} with shape {list(vi.shape)}, "
                    f"got rank {len(shape)} with shape {list(shape)}")
            for ax, (want, got) in enumerate(zip(vi.shape, shape)):
                if isinstance(want, int) and want != got:
                    raise InvalidFeedError(
                        f"input {name!r}: expected shape {list(vi.shape)}, got {list(shape)} "
                        f"(axis {ax}: expected {want}, got {got})")
        if not value.is_c_contiguous():
            raise InvalidFeedError(f"input {name!r}: device arrays must be C-contiguous")
        return value

    def _feeds(self, input_feed: dict) -> list:
        if not isinstance(input_feed, dict):
            raise InvalidFeedError(f"input_feed must be a dict of name -> array, got {type(input_feed).__name__}")
        missing = [v.name for v in self._graph.inputs if v.name not in input_feed and v.name not in self._defaults]
        if missing:  # onnxruntime's wording
            raise InvalidFeedError(f"Required inputs ({missing}) are missing from input feed ({list(input_feed)}).")
        for name in input_feed:
            if name not in self._input_index:
                raise InvalidFeedError(
                    f"input {name!r} is not an input of this model; expected one of {list(self._input_index)}")
        return [self._check_feed(v.name, input_feed[v.name]) if v.name in input_feed else self._defaults[v.name]
                for v in self._graph.inputs]

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
                with self._sibling_lock:
                    if key not in self._siblings:
                        fixed = dict(zip(self._batch_syms, key))
                        g = build_sibling(self._graph, self._scan_symbol, fixed)
                        self._siblings[key] = None if g is None else self._make_plan(g, main=False)
            self._sibling = self._siblings[key]
        sibling = self.decode_sibling
        if route_to_sibling(self._decode_flag, sibling is not None, extent):
            self.plan_runs["sibling"] += 1
            return sibling
        self.plan_runs["main"] += 1
        return self._plan

    def run_prepared(self, feeds: list) -> list:
        """Run with ``feeds`` already aligned to ``get_inputs()`` and valid (right dtype, rank and extents,
        C-contiguous); returns every output.  For callers that build their feeds themselves each step (the
        pipeline's decoder), so the per-feed checks of ``run`` are not paid on every token."""
        return self._threads(self._select_plan(feeds).run, feeds)

    def _call_kernel(self, fn, *args):
        """One kernel on an inter-op worker thread, with this session's intra-op thread count."""
        return call_with_threads(self._nthreads, fn, *args)

    def _threads(self, fn, *args, **kwargs):
        """``fn(*args)`` with this session's ``intra_op_num_threads`` (Numba's and BLAS's, per calling thread;
        and onnxruntime's, ``ops._mlas_attention.ort_threads``) and its ``max_output_bytes``."""
        if self._ort_nthreads:
            token = SESSION_INTRA_OP_THREADS.set(self._ort_nthreads)
            try:
                return self._threads_limited(fn, *args, **kwargs)
            finally:
                SESSION_INTRA_OP_THREADS.reset(token)
        return self._threads_limited(fn, *args, **kwargs)

    def _threads_limited(self, fn, *args, **kwargs):
        limit = self._max_output
        if limit is not None:
            token = MAX_OUTPUT_BYTES.set(limit)
            try:
                return call_with_threads(self._nthreads, fn, *args, **kwargs)
            finally:
                MAX_OUTPUT_BYTES.reset(token)
        if not self._nthreads:
            return fn(*args, **kwargs)
        return call_with_threads(self._nthreads, fn, *args, **kwargs)

    def run(self, output_names, input_feed, run_options=None):
        """onnxruntime's ``run``: outputs named by ``output_names`` (all when None or empty) as numpy arrays
        (lists for sequences).  The parameters of ``run_options``' active adapters are fed by name, before
        ``input_feed`` (which wins where both give a name)."""
        adapters = getattr(run_options, "_adapters", None)
        if adapters:
            merged = {}
            for a in adapters:
                merged.update(a.parameters)
            merged.update(input_feed)
            input_feed = merged
        over = self._overridable_names
        if over and isinstance(input_feed, dict) and not over.isdisjoint(input_feed):
            return self._overriding().run(output_names, input_feed, run_options)
        idx = self._output_positions(output_names)
        feeds = self._feeds(input_feed)
        results = self._run_plan(feeds, run_options)
        return results if idx is None else [results[i] for i in idx]

    def _overriding(self):
        """The twin session whose plan takes this model's overridable initializers as inputs (built once, on the
        first run that feeds one of them)."""
        with self._sibling_lock:
            if self._twin is None:
                import copy
                options = copy.copy(self._options)
                options._overridable_inputs = True
                options.optimized_model_filepath = ""
                self._twin = InferenceSession(self._source, options,
                                              providers=[(self._provider, self._provider_options or {})])
        return self._twin

    def _output_positions(self, output_names):
        if not output_names:
            return None
        idx = []
        for n in output_names:
            if n not in self._output_index:
                raise InvalidFeedError(f"output {n!r} is not an output of this model; expected one of "
                                       f"{list(self._output_index)}")
            idx.append(self._output_index[n])
        return idx

    def _run_plan(self, feeds, run_options=None, into=None, **kw) -> list:
        """Run the plan for ``feeds``; ``into`` ({output position: array}, an ``IOBinding``'s bound outputs) are
        written in place where the plan can (``Plan.run_into``)."""
        plan = self._select_plan(feeds)
        if into and hasattr(plan, "run_into"):
            run = plan.run_into
            kw["bound"] = into
        elif self._parallel and hasattr(plan, "run_parallel") and not kw:
            run = plan.run_parallel
            kw = {"workers": self._parallel, "call": self._call_kernel}
        else:
            run = plan.run
        prof = self._profiler if self._profiler is not None and not self._profiler.ended else None
        if run_options is not None:
            logger = self._logger
            sev = int(getattr(run_options, "log_severity_level", -1))
            if sev >= 0 and logger.isEnabledFor(severity_to_logging(sev)):
                logger.log(severity_to_logging(sev), "run %r starts", getattr(run_options, "logid", ""))
        if run_options is None and prof is None:
            return self._threads(run, feeds, **kw)
        observer = RunObserver(plan, run_options, prof)
        t0 = time.perf_counter_ns()
        token = CURRENT_RUN_OPTIONS.set(run_options)
        try:
            return self._threads(run, feeds, observer=observer, **kw)
        finally:
            CURRENT_RUN_OPTIONS.reset(token)
            if prof is not None:
                prof.event("Session", "model_run", t0, time.perf_counter_ns())

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None) -> list:
        """``run`` with ``OrtValue`` feeds (numpy arrays are taken too), returning ``OrtValue`` results."""
        return OrtValueVector(OrtValue(r) for r in self.run(output_names, input_dict_ort_values, run_options))

    def run_async(self, output_names, input_feed, callback, user_data=None, run_options=None) -> None:
        """Run on a worker thread and call ``callback(results, user_data, error)`` there: ``error`` is '' on
        success, else the error's message (and ``results`` empty), as onnxruntime's ``run_async``."""
        if not callable(callback):
            raise TypeError(f"run_async: callback must be callable, got {type(callback).__name__}")

        def work():
            try:
                res = self.run(output_names, input_feed, run_options)
            except Exception as e:  # reported to the callback, as onnxruntime does
                self._logger.error("run_async failed: %s", e)
                callback([], user_data, f"{type(e).__name__}: {e}")
                return
            callback(res, user_data, "")

        threading.Thread(target=work, name="onnx_numba-run_async", daemon=True).start()

    def io_binding(self) -> "IOBinding":
        return IOBinding(self)

    def run_with_iobinding(self, binding: "IOBinding", run_options=None) -> None:
        binding._run(run_options)


class _CSession:
    """``InferenceSession._sess``: onnxruntime's C-session calls, argument order included."""

    def __init__(self, session: InferenceSession):
        self.session = session

    def run_with_ort_values(self, feeds: dict, output_names, run_options=None) -> OrtValueVector:
        return self.session.run_with_ort_values(output_names, feeds, run_options)

    def run(self, output_names, feeds, run_options=None) -> list:
        return self.session.run(output_names, feeds, run_options)

    def run_with_iobinding(self, binding: "IOBinding", run_options=None) -> None:
        binding._run(run_options)


@dataclass
class OrtEpAssignedNode:
    """A node of ``get_provider_graph_assignment_info``: its domain, op type and name."""
    domain: str
    op_type: str
    name: str


@dataclass
class OrtEpAssignedSubgraph:
    """Nodes that one execution provider runs (``get_provider_graph_assignment_info``)."""
    ep_name: str
    nodes: list

    def get_nodes(self) -> list:
        return list(self.nodes)


def _strings(name, value: np.ndarray) -> np.ndarray:
    """A string feed (``str``, ``bytes`` or ``np.void`` items) as the object array of ``str`` kernels read."""
    if value.dtype.kind == "U" or value.dtype == object:
        return value.astype(object)
    out = np.empty(value.shape, dtype=object)
    flat = value.reshape(-1)
    res = out.reshape(-1)
    for i in range(flat.size):
        b = bytes(flat[i])
        if value.dtype.kind == "V":
            b = b.rstrip(b"\0")
        try:
            res[i] = b.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidFeedError(f"input {name!r}: string element {i} is not valid UTF-8") from None
    return out


class IOBinding:
    """Buffers bound by name that stay resident between runs.

    Bound inputs are read in place on every run (numpy arrays, or device arrays on a CUDA session).  A
    bound output buffer is written in place (its shape and dtype must match what the graph produces); an
    output bound without a buffer is returned fresh by ``get_outputs``.  On a CUDA session an output bound
    with ``device_type="cuda"`` (or to a device array) stays on the device: ``get_outputs`` returns device
    arrays for it and ``copy_outputs_to_cpu`` downloads it.
    """

    def __init__(self, session: InferenceSession):
        self._s = session.session if isinstance(session, _CSession) else session
        self._inputs: dict = {}
        self._outputs: dict = {}  # name -> (buffer or None, on_device)
        self._results: list = []

    def bind_cpu_input(self, name, array):
        self.bind_input(name, array)

    def bind_input(self, name, array, *args, **kwargs):
        if name not in self._s._input_index:
            raise InvalidFeedError(f"input {name!r} is not an input of this model; expected one of "
                                   f"{list(self._s._input_index)}")
        self._inputs[name] = self._s._check_feed(name, array)

    def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None, buffer_ptr=None):
        """onnxruntime's signature; ``device_type`` may also be an ``OrtDevice`` (onnxruntime's C form), or a
        numpy or device array to write into."""
        if name not in self._s._output_index:
            raise InvalidFeedError(f"output {name!r} is not an output of this model; expected one of "
                                   f"{list(self._s._output_index)}")
        if buffer_ptr is not None:
            raise InvalidFeedError(f"output {name!r}: binding a raw buffer_ptr is not supported; bind a numpy "
                                   f"array or a device array instead")
        buf = None
        if isinstance(device_type, OrtDevice):
            device_type = runtime_device(device_type, f"output {name!r}").kind
        if device_type is None or isinstance(device_type, str):
            kind = (device_type or "cpu").lower()
            if kind not in ("cpu", "cuda", "gpu"):
                raise InvalidFeedError(f"output {name!r}: device_type must be 'cpu' or 'cuda', got {device_type!r}")
            on_device = kind != "cpu"
        elif isinstance(device_type, np.ndarray):
            buf, on_device = device_type, False
        elif rc.is_device_array(device_type):
            buf, on_device = device_type, True
        else:
            raise InvalidFeedError(f"output {name!r}: bind a numpy array, a device array, 'cpu' or 'cuda', got "
                                   f"{type(device_type).__name__}")
        if on_device and self._s._provider != CUDA_PROVIDER:
            raise InvalidFeedError(f"output {name!r}: a {self._s._provider} session cannot keep outputs on a "
                                   f"device; bind it to 'cpu' or a numpy array")
        self._outputs[name] = (buf, on_device)

    def bind_ortvalue_input(self, name, ortvalue):
        self.bind_input(name, ortvalue.value() if isinstance(ortvalue, OrtValue) else ortvalue)

    def bind_ortvalue_output(self, name, ortvalue):
        """Bind an output to the tensor of ``ortvalue``: the run writes its result there."""
        v = ortvalue.value() if isinstance(ortvalue, OrtValue) else ortvalue
        self.bind_output(name, v)

    def synchronize_inputs(self):
        """Bound inputs are read where they are (host arrays, or device arrays on this session's stream)."""
        if self._s._provider == CUDA_PROVIDER:
            rc.cuda.synchronize()

    def synchronize_outputs(self):
        """Wait until the outputs of the last run are complete (device work finished)."""
        if self._s._provider == CUDA_PROVIDER:
            rc.cuda.synchronize()

    def get_outputs_as_ortvaluevector(self):
        return [OrtValue(r) for r in self._results]

    def clear_binding_inputs(self):
        self._inputs.clear()

    def clear_binding_outputs(self):
        self._outputs.clear()

    def _run(self, run_options=None):
        if getattr(run_options, "_adapters", None):
            from .errors import NotSupportedError
            raise NotSupportedError("run_with_iobinding: active LoRA adapters are fed by run() and "
                                    "run_with_ort_values(); a binding run takes bound inputs only")
        # Bound inputs were checked when they were bound; only completeness is left to check.
        names = [v.name for v in self._s._graph.inputs]
        missing = [n for n in names if n not in self._inputs]
        if missing:
            raise InvalidFeedError(f"input(s) {missing} are not bound; the model expects {names}")
        feeds = [self._inputs[n] for n in names]
        names = list(self._outputs) or list(self._s._output_index)
        index = self._s._output_index
        on_device = {index[n] for n, (_, dev) in self._outputs.items() if dev}
        kw = {"device_outputs": on_device} if on_device else {}
        into = {index[n]: buf for n, (buf, dev) in self._outputs.items() if isinstance(buf, np.ndarray)}
        if into and not on_device:
            kw = {"into": into}
        results = self._s._run_plan(feeds, run_options, **kw)
        out = []
        for n in names:
            r = results[index[n]]
            buf = self._outputs.get(n, (None, False))[0]
            if buf is not None:
                if tuple(buf.shape) != tuple(r.shape) or np.dtype(buf.dtype) != np.dtype(r.dtype):
                    raise InvalidFeedError(f"output {n!r}: bound buffer is {buf.dtype}{list(buf.shape)}, "
                                           f"the graph produced {r.dtype}{list(r.shape)}")
                if buf is not r:
                    if isinstance(buf, np.ndarray):
                        np.copyto(buf, r)
                    else:
                        rc.copy_device(buf, r)  # device to device
                r = buf
            out.append(r)
        self._results = out

    def get_outputs(self):
        """The last run's outputs as ``OrtValue``s (onnxruntime's type), in binding order."""
        return [OrtValue(r) for r in self._results]

    def get_output_arrays(self) -> list:
        """The last run's outputs as the arrays themselves (numpy, or device arrays kept on the device)."""
        return list(self._results)

    def copy_outputs_to_cpu(self):
        return [np.array(r, copy=True) if isinstance(r, np.ndarray) else rc.to_host(r) for r in self._results]
