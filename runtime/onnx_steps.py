"""The calls into onnx's C++ that the loader makes on untrusted models, as plain functions of bytes.

``runtime.isolate`` runs them in its worker process, which loads this file by path.  The file loads onnx's C++
extension alone, not the ``onnx`` package (whose import pulls numpy and ml_dtypes and takes about a second):
the worker is ready in a tenth of that and holds no threads, kernels or device contexts.  Run in this process
instead (isolation off), it takes the extension that ``onnx`` already loaded.  Each step takes and returns bytes
(serialized protos), so a request and its answer are cheap to send and carry no live objects.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

__all__ = ["infer_shapes", "inline_local_functions", "context_dependent_body"]

_NAME = "onnx.onnx_cpp2py_export"


def _extension():
    mod = sys.modules.get(_NAME)
    if mod is None and "onnx" in sys.modules:
        import onnx.onnx_cpp2py_export as mod  # noqa: F811 - the package's own, already loaded with it
    if mod is None:
        folder = os.path.dirname(importlib.util.find_spec("onnx").origin)  # found, not imported
        so = next(f for f in sorted(os.listdir(folder))
                  if f.startswith("onnx_cpp2py_export") and f.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)))
        loader = importlib.machinery.ExtensionFileLoader(_NAME, os.path.join(folder, so))
        spec = importlib.util.spec_from_file_location(_NAME, loader.path, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        sys.modules[_NAME] = mod
    return mod


C = _extension()


def infer_shapes(model: bytes, strict: bool, data_prop: bool) -> bytes:
    """onnx's shape and type inference of serialized ``model``; the inferred model, serialized."""
    return C.shape_inference.infer_shapes(model, strict, strict, data_prop)


def inline_local_functions(model: bytes) -> bytes:
    """Serialized ``model`` with its model-local functions inlined by onnx, serialized."""
    return C.inliner.inline_local_functions(model, False)


def context_dependent_body(op_type: str, opset: int, domain: str, version: int, node: bytes, types: list) -> bytes:
    """The context-dependent function body that the schema of ``op_type`` (at ``opset``) builds at ``version`` for
    serialized ``node`` whose inputs have the serialized ``types``; empty bytes when it builds none."""
    s = C.defs.get_schema(op_type, opset, domain)
    return s.get_context_dependent_function_with_opset_version(version, node, types) or b""
