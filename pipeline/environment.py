"""Process-wide calls of onnxruntime-genai's module: providers on hand, logging, telemetry, the current GPU.

- ``is_cuda_available()`` is True when the native CUDA provider can run here (a GPU, or Numba's simulator);
  the providers this runtime has no kernels for (DirectML, OpenVINO, QNN, WebGPU) are never available.
- ``set_log_options(**options)`` takes onnxruntime-genai's option names (``enabled``, ``generate_next_token``,
  ``append_next_tokens``, ``hit_eos``, ``hit_max_length``, ``model_output_shapes``, ... and ``filename``); an
  unknown name or a value of the wrong type is a ``RuntimeError`` naming it, as there.  Log lines go to the file
  named by ``filename`` when one is set, else to the callback of ``set_log_callback``, else to standard error.
  Each line is onnxruntime-genai's: ``"  label   text\\n"``.
- ``enable_telemetry_events`` / ``disable_telemetry_events`` are accepted: this runtime sends no telemetry.
- ``set_current_gpu_device_id(i)`` names the CUDA device that models loaded afterwards run on;
  ``get_current_gpu_device_id()`` returns it (0 until set).

Invariant: the generator asks ``logging_of(label)`` before it formats anything, so disabled logging costs one
dictionary read per event.
"""
from __future__ import annotations

import sys
import threading

__all__ = ["is_cuda_available", "is_dml_available", "is_openvino_available", "is_qnn_available",
           "is_webgpu_available", "set_log_options", "set_log_callback", "enable_telemetry_events",
           "disable_telemetry_events", "get_current_gpu_device_id", "set_current_gpu_device_id",
           "register_execution_provider_library", "unregister_execution_provider_library", "logging_of", "log"]

# onnxruntime-genai's boolean log options and their defaults.
_BOOL_OPTIONS = {"enabled": False, "ansi_tags": True, "warning": True, "generate_next_token": False,
                 "append_next_tokens": False, "hit_eos": False, "hit_max_length": False,
                 "model_input_values": False, "model_output_shapes": False, "model_output_values": False,
                 "model_logits": False, "ort_lib": False, "value_stats": True}
_STRING_OPTIONS = {"filename": ""}

_options = dict(_BOOL_OPTIONS, **_STRING_OPTIONS)
_callback = None
_lock = threading.Lock()
_gpu_device = 0


def is_cuda_available() -> bool:
    from runtime import cuda as rc
    return rc.available()


def is_dml_available() -> bool:
    return False


def is_openvino_available() -> bool:
    return False


def is_qnn_available() -> bool:
    return False


def is_webgpu_available() -> bool:
    return False


def set_log_options(**options) -> None:
    for name, value in options.items():
        if name in _BOOL_OPTIONS:
            if not isinstance(value, bool):
                raise RuntimeError(f"Unknown log option type, can be bool/string:{name}")
        elif name in _STRING_OPTIONS:
            if not isinstance(value, str):
                raise RuntimeError(f"Unknown log option type, can be bool/string:{name}")
        else:
            raise RuntimeError(f"Unknown log option {name!r}; known options: "
                               f"{', '.join(sorted(_BOOL_OPTIONS) + sorted(_STRING_OPTIONS))}")
    with _lock:
        _options.update(options)


def set_log_callback(callback) -> None:
    if callback is not None and not callable(callback):
        raise TypeError(f"set_log_callback: expected a callable or None, got {type(callback).__name__}")
    global _callback
    _callback = callback


def logging_of(label: str) -> bool:
    """Whether lines labelled ``label`` are logged now."""
    return _options["enabled"] and _options.get(label, False)


def log(label: str, text: str) -> None:
    """One log line, to the file, else the callback, else standard error."""
    line = f"  {label}   {text}\n"
    with _lock:
        filename = _options["filename"]
        if filename:
            with open(filename, "a", encoding="utf-8") as f:
                f.write(line)
            return
        callback = _callback
    if callback is not None:
        callback(line)
    else:
        sys.stderr.write(line)


def enable_telemetry_events() -> None:
    """Accepted; this runtime sends no telemetry."""


def disable_telemetry_events() -> None:
    """Accepted; this runtime sends no telemetry."""


def get_current_gpu_device_id() -> int:
    return _gpu_device


def set_current_gpu_device_id(device_id: int) -> None:
    global _gpu_device
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
        raise RuntimeError(f"set_current_gpu_device_id: expected a device index >= 0, got {device_id!r}")
    _gpu_device = device_id


def register_execution_provider_library(name: str, path: str) -> None:
    raise RuntimeError(f"register_execution_provider_library({name!r}, {path!r}): this runtime loads no "
                       f"execution-provider libraries; its providers are the native CPU and CUDA ones")


def unregister_execution_provider_library(name: str) -> None:
    raise RuntimeError(f"unregister_execution_provider_library({name!r}): no execution-provider library "
                       f"was registered")
