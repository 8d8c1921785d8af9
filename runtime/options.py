"""``SessionOptions``, ``RunOptions`` and onnxruntime's option enums, with onnxruntime's names and defaults.

Invariants:
- Both option classes have a fixed set of attributes (``__slots__``): assigning a misspelt one raises
  ``AttributeError``, as onnxruntime's do.
- Every onnxruntime attribute exists.  Those that mean something here are read by the session (see the
  README's table); the rest (arena and memory-pattern switches, execution order) are kept and returned, since
  the planner's arena and order are not configurable.
- Session config entries are kept as strings and returned as set; the keys listed in ``HONOURED_CONFIG`` are
  read by the session.  An unknown key is kept, as onnxruntime keeps it.
"""
from __future__ import annotations

import contextvars
import enum

import numpy as np

__all__ = ["GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder", "SessionOptions", "RunOptions",
           "HONOURED_CONFIG", "severity_to_logging", "CURRENT_RUN_OPTIONS", "options_from_model"]

# The ``RunOptions`` of the run in progress in this context (None when the run was given none): a Loop checks its
# ``terminate`` between iterations, so a loop that never ends can still be stopped.
CURRENT_RUN_OPTIONS = contextvars.ContextVar("onnx_numba_run_options", default=None)


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


# Session config keys this runtime reads: key -> what it does.
HONOURED_CONFIG = {
    "session.save_model_format": "format of optimized_model_filepath: ONNX (ORT format is refused)",
    "session.load_model_format": "ONNX only; ORT format models are refused",
    "session.optimized_model_external_initializers_file_name":
        "optimized_model_filepath writes initializers to this file beside the model",
    "session.optimized_model_external_initializers_min_size_in_bytes":
        "initializers of at least this many bytes go to the external file (default 1024)",
    "session.disable_cpu_ep_fallback": "always effectively 1: a node without a kernel is an error",
    "session.model_external_initializers_file_folder_path":
        "the folder of the external data of a model given as bytes (a model file keeps its own folder)",
    "session.record_ep_graph_assignment_info": "\"1\": get_provider_graph_assignment_info() lists the nodes",
}


def severity_to_logging(severity: int) -> int:
    """onnxruntime's severity (0 verbose .. 4 fatal) as a ``logging`` level."""
    import logging
    return {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR}.get(int(severity),
                                                                                          logging.CRITICAL)


class SessionOptions:
    """onnxruntime's ``SessionOptions``; the native runtime's own switches follow its attributes."""

    __slots__ = (
        # onnxruntime's
        "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse", "enable_profiling", "execution_mode",
        "execution_order", "graph_optimization_level", "inter_op_num_threads", "intra_op_num_threads",
        "log_severity_level", "log_verbosity_level", "logid", "optimized_model_filepath", "profile_file_prefix",
        "use_deterministic_compute", "use_per_session_threads",
        "_config", "_initializers", "_external_files", "_dim_by_name", "_dim_by_denotation", "_providers",
        "_overridable_inputs",
        # the native runtime's
        "strict_shape_inference", "preallocate", "fused_segments", "compiled_regions", "kv_share_buffer",
        "decode_inline_scan", "cuda_cpu_ops", "max_output_bytes",
    )

    def __init__(self):
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.enable_profiling = False
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.inter_op_num_threads = 0
        # 0: every thread Numba has; n: this session's kernels use n of them (other sessions keep theirs).
        self.intra_op_num_threads = 0
        self.log_severity_level = -1  # -1: the default logger's severity (set_default_logger_severity)
        self.log_verbosity_level = 0
        self.logid = ""
        self.optimized_model_filepath = ""
        self.profile_file_prefix = "onnxruntime_profile_"
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self._config = {}
        self._initializers = {}
        self._external_files = {}
        self._overridable_inputs = False  # overridable initializers planned as inputs (see InferenceSession.run)
        self._dim_by_name = {}
        self._dim_by_denotation = {}
        self._providers = []
        self.strict_shape_inference = False
        self.preallocate = True
        self.fused_segments = True
        # Runs of nodes with compiled forms run as one generated function each (runtime/regions.py).  None: the
        # caller's default (for a session, each plan turns on those that pay, measured on its own runs:
        # runtime/region_tuner.py; the pipeline's native decoder turns them all on).
        self.compiled_regions = None
        # GroupQueryAttention nodes whose past_key/past_value are graph inputs read by nothing else write the new
        # rows into those buffers and return them as present when they have room for the total sequence (past and
        # present share one max-length buffer, onnxruntime-genai's past_present_share_buffer): the caller donates
        # the buffers.  Compiled regions only; a past with no room is copied as usual.  None: the caller's default
        # (off for a session; the pipeline's native decoder turns it on).
        self.kv_share_buffer = None
        # Decode sibling (single-trip Scan inlining); None: read ONNX_NUMBA_DECODE_INLINE_SCAN.
        self.decode_inline_scan = None
        # CUDA provider: op types or node names without a CUDA kernel that may run on the CPU (their data is
        # copied across and counted, see InferenceSession.cpu_round_trips); empty: such nodes are errors.
        self.cuda_cpu_ops = set()
        # A node output larger than this many bytes is refused before it is allocated (ops/_common.py); 0: the
        # process default, half the machine's memory.
        self.max_output_bytes = 0

    def __copy__(self):
        new = SessionOptions.__new__(SessionOptions)
        for k in SessionOptions.__slots__:
            v = getattr(self, k)
            setattr(new, k, dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else
                    set(v) if isinstance(v, set) else v)
        return new

    def __repr__(self):
        return "SessionOptions(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in SessionOptions.__slots__
                                             if not k.startswith("_")) + ")"

    # -- config entries ------------------------------------------------------------------------------------------
    def add_session_config_entry(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"add_session_config_entry takes two strings, got {type(key).__name__} and "
                            f"{type(value).__name__}")
        if key == "session.load_model_format" and value.upper() == "ORT":
            raise ValueError("session.load_model_format: ORT format models are not supported; load the .onnx model")
        self._config[key] = value

    def get_session_config_entry(self, key: str) -> str:
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeError(f"SessionOptions does not have configuration with key: {key}") from None

    def session_config(self) -> dict:
        """Every config entry set so far."""
        return dict(self._config)

    # -- initializers and dimensions -----------------------------------------------------------------------------
    def add_initializer(self, name: str, value) -> None:
        """Replace the model's initializer ``name`` with ``value`` (an ``OrtValue`` or a numpy array).

        As in onnxruntime, the value's data is used as it is and must stay alive as long as the session."""
        arr = value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else value
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"initializer {name!r}: expected an OrtValue or a numpy array, got {type(value).__name__}")
        self._initializers[str(name)] = arr

    def add_external_initializers(self, names, values) -> None:
        if len(names) != len(values):
            raise ValueError(f"add_external_initializers: {len(names)} names for {len(values)} values")
        for n, v in zip(names, values):
            self.add_initializer(n, v)

    def add_external_initializers_from_files_in_memory(self, names, buffers, lengths) -> None:
        """Content of external-data files, by the file name the model's initializers give as their location: the
        loader reads these bytes instead of the files (which need not exist)."""
        if not len(names) == len(buffers) == len(lengths):
            raise ValueError(f"add_external_initializers_from_files_in_memory: {len(names)} names, {len(buffers)} "
                             f"buffers and {len(lengths)} lengths; expected one of each per file")
        for name, buf, n in zip(names, buffers, lengths):
            data = bytes(memoryview(buf).cast("B"))
            if int(n) < 0 or int(n) > len(data):
                raise ValueError(f"external initializer file {name!r}: length {n} for a buffer of {len(data)} "
                                 f"bytes")
            self._external_files[str(name)] = data[:int(n)]

    def add_free_dimension_override_by_name(self, name: str, value: int) -> None:
        """Fix the symbolic dimension ``name`` of the graph inputs to ``value``."""
        self._dim_by_name[str(name)] = _dim(name, value)

    def add_free_dimension_override_by_denotation(self, denotation: str, value: int) -> None:
        """Fix every input dimension whose denotation is ``denotation`` (e.g. ``DATA_BATCH``) to ``value``."""
        self._dim_by_denotation[str(denotation)] = _dim(denotation, value)

    # -- providers and custom ops (not applicable here) ----------------------------------------------------------
    def has_providers(self) -> bool:
        return bool(self._providers)

    def add_provider(self, name: str, options: dict | None = None) -> None:
        self._providers.append((name, dict(options or {})))

    def register_custom_ops_library(self, path: str) -> None:
        from .errors import NotSupportedError
        raise NotSupportedError(f"custom-op libraries ({path!r}) are native onnxruntime plug-ins; this runtime cannot "
                                f"load them: every op needs a kernel of its own here")


def _dim(name, value) -> int:
    v = int(value)
    if v < 0:
        raise ValueError(f"free dimension override {name!r}: expected a size >= 0, got {value!r}")
    return v


class RunOptions:
    """onnxruntime's ``RunOptions``: ``terminate`` stops a run in progress at its next node."""

    __slots__ = ("log_severity_level", "log_verbosity_level", "logid", "terminate", "only_execute_path_to_fetches",
                 "_config", "_adapters")

    def __init__(self):
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config = {}
        self._adapters = []

    @property
    def run_tag(self) -> str:
        """onnxruntime's older name of ``logid``: the tag of this run in the log."""
        return self.logid

    @run_tag.setter
    def run_tag(self, value: str) -> None:
        self.logid = str(value)

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def add_active_adapter(self, adapter) -> None:
        """Make a ``LoraAdapter`` active for runs with these options: its parameters are fed by name."""
        if not hasattr(adapter, "parameters"):
            raise TypeError(f"add_active_adapter: expected a LoraAdapter, got {type(adapter).__name__}")
        self._adapters.append(adapter)

    def get_run_config_entry(self, key: str) -> str:
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeError(f"RunOptions does not have configuration with key: {key}") from None


def options_from_model(source, options: SessionOptions) -> SessionOptions:
    """``options`` with the session options a model carries in its ``ort_config`` metadata (onnxruntime's
    ``ORT_LOAD_CONFIG_FROM_MODEL``): a copy, with ``intra_op_num_threads``, ``inter_op_num_threads``,
    ``execution_mode``, ``graph_optimization_level`` and ``enable_profiling`` taken from the JSON's
    ``session_options`` (integers, checked as onnxruntime checks them); other keys are ignored, as there."""
    import copy
    import json

    from .errors import InvalidArgumentError
    from .loader import load_model_proto
    proto, _ = load_model_proto(source)
    text = next((p.value for p in proto.metadata_props if p.key == "ort_config"), None)
    if text is None:
        return options
    try:
        config = json.loads(text)
    except ValueError as e:
        raise InvalidArgumentError(f"Json stored in the `ort_config` key cannot be parsed. Error message: "
                                   f"{e}") from None
    given = config.get("session_options") if isinstance(config, dict) else None
    if not isinstance(given, dict):
        return options
    out = copy.copy(options)
    allowed = {"intra_op_num_threads": lambda v: v >= 0, "inter_op_num_threads": lambda v: v >= 0,
               "execution_mode": lambda v: v in (0, 1), "graph_optimization_level": lambda v: v in (0, 1, 2, 99),
               "enable_profiling": lambda v: v in (0, 1)}
    for key, value in given.items():
        if key not in allowed:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgumentError(f"{key} option in the model file must be an integer")
        if not allowed[key](value):
            raise InvalidArgumentError(f"Unsupported value for {key} in ORT config: {value}")
        if key == "execution_mode":
            value = ExecutionMode(value)
        elif key == "graph_optimization_level":
            value = GraphOptimizationLevel(value)
        elif key == "enable_profiling":
            value = bool(value)
        setattr(out, key, value)
    return out
