"""onnxruntime's ``onnxruntime.capi`` namespace for this runtime, so that code importing from it (``from
onnxruntime.capi.onnxruntime_pybind11_state import Fail``, ``from onnxruntime.capi import _pybind_state as C``)
runs unchanged when ``runtime`` stands in for ``onnxruntime`` (``sys.modules`` aliasing, as the test shim does).

Each submodule only re-exports: ``_pybind_state`` (the classes and functions onnxruntime's C layer exposes),
``onnxruntime_pybind11_state`` (its exception classes, which are onnxruntime's own, and ``RunOptions``,
``OrtValueVector``), ``onnxruntime_inference_collection`` (the Python-layer helpers).
"""
from . import _pybind_state, onnxruntime_inference_collection, onnxruntime_pybind11_state

__all__ = ["_pybind_state", "onnxruntime_inference_collection", "onnxruntime_pybind11_state"]
