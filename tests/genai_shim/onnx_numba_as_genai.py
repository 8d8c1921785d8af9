"""A pytest plugin that puts ``pipeline`` in place of ``onnxruntime_genai``, so that onnxruntime-genai's own Python
API tests run against this runtime unchanged (``-p onnx_numba_as_genai`` with this folder on the path).

The backend comes from the environment as for any ``og.Model`` (``ONNX_NUMBA_NATIVE_DECODER``,
``ONNX_NUMBA_NATIVE_COMPONENTS``).  onnxruntime-genai itself stays importable as ``onnxruntime_genai_reference``
for tests that compare.
"""
import sys

import runtime  # noqa: F401  (before numpy-heavy imports, as the project's entry points do)
import pipeline

try:
    import onnxruntime_genai as _reference
    sys.modules["onnxruntime_genai_reference"] = _reference
except ImportError:  # the shim does not need it
    pass
sys.modules["onnxruntime_genai"] = pipeline
