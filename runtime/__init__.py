"""onnx-numba's runtime: load, optimize, plan and run ONNX models natively.

``import runtime as ort`` is a drop-in for onnxruntime's Python module: ``InferenceSession``,
``SessionOptions``, ``RunOptions``, ``OrtValue``, ``IOBinding``, ``NodeArg``, ``ModelMetadata``, the option
enums, the device and memory descriptions (``OrtDevice``, ``OrtMemoryInfo``), ``SparseTensor``, LoRA adapter
files (``AdapterFormat``, ``LoraAdapter``), the process-wide settings (logger callback, seed, global thread pools),
the provider queries and the exception classes (which also derive from onnxruntime's).  ``runtime.capi`` stands
in for ``onnxruntime.capi`` (its C-layer names, exception module and provider-argument helper).
"""
from . import cpu_env  # noqa: F401  (first: settings numpy and Numba read when they load)
from .errors import *  # noqa: F401,F403
from .adapters import AdapterFormat, LoraAdapter
from .errors import __all__ as _errors_all
from .options import ExecutionMode, ExecutionOrder, GraphOptimizationLevel, RunOptions, SessionOptions
from .devices import (OrtAllocatorType, OrtDevice, OrtDeviceMemoryType, OrtDeviceVendorId, OrtMemoryInfo,
                      OrtMemoryInfoDeviceType, OrtMemType)
from .environment import (set_default_logger_callback, set_default_logger_verbosity, set_global_thread_pool_sizes,
                          set_seed)
from .ortvalue import OrtValue
from .providers import ONNXRUNTIME_PROVIDERS as _ALL_PROVIDERS, available_providers as _available
from .session import (InferenceSession, IOBinding, ModelMetadata, NodeArg, OrtEpAssignedNode, OrtEpAssignedSubgraph,
                      build_graph, set_default_logger_severity)
from .sparse import OrtSparseFormat, SparseTensor

__version__ = "0.1.0"


def get_available_providers() -> list:
    """The execution providers a session can run on here, most preferred first."""
    return _available()


def get_all_providers() -> list:
    """Every provider name onnxruntime knows; those this runtime lacks are skipped, with a warning, when listed."""
    return list(_ALL_PROVIDERS)


def get_device() -> str:
    """'GPU' when a CUDA target is usable (a GPU or Numba's simulator), else 'CPU'."""
    return "GPU" if "CUDAExecutionProvider" in _available() else "CPU"


def get_version_string() -> str:
    return __version__


def get_build_info() -> str:
    """A line naming the runtime and the libraries that compile and run its kernels."""
    import numba
    import numpy
    return f"Build Info: onnx-numba {__version__}, numba {numba.__version__}, numpy {numpy.__version__}"


def disable_telemetry_events() -> None:
    """onnxruntime's switch; this runtime sends no telemetry, so there is nothing to turn off."""


def enable_telemetry_events() -> None:
    """onnxruntime's switch; this runtime sends no telemetry."""


__all__ = ["InferenceSession", "IOBinding", "NodeArg", "SessionOptions", "RunOptions", "OrtValue", "ModelMetadata",
           "GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder", "get_available_providers",
           "get_all_providers", "get_device", "get_version_string", "get_build_info", "disable_telemetry_events",
           "enable_telemetry_events", "set_default_logger_severity", "__version__",
           "OrtDevice", "OrtMemoryInfo", "OrtAllocatorType", "OrtMemType", "OrtDeviceMemoryType", "OrtDeviceVendorId",
           "OrtMemoryInfoDeviceType", "SparseTensor", "OrtSparseFormat", "set_default_logger_callback",
           "set_default_logger_verbosity", "set_seed", "set_global_thread_pool_sizes",
           "build_graph", "AdapterFormat", "LoraAdapter", "OrtEpAssignedNode", "OrtEpAssignedSubgraph",
           "SessionIOBinding", "capi", *_errors_all]

SessionIOBinding = IOBinding  # onnxruntime's C-layer name of the binding class
from . import capi  # noqa: E402  (onnxruntime.capi's stand-in, importable as an attribute as onnxruntime's is)
