"""A pytest plugin that puts ``runtime`` in place of ``onnxruntime``, so that onnxruntime's own Python API tests
(``onnxruntime/test/python/onnxruntime_test_python.py`` and ``onnxruntime_test_python_iobinding.py``) run against
this runtime unchanged (``-p onnx_numba_as_ort`` with this folder on the path).

``runtime.capi`` stands in for ``onnxruntime.capi`` and its submodules.  onnxruntime itself stays importable as
``onnxruntime_reference``.  The stored copy of the iobinding test file imports ``onnx.mapping``, which newer onnx
releases dropped; its one table is supplied from ``onnx.helper`` when it is missing.
"""
import sys
import types

import runtime
import runtime.capi
import runtime.capi._pybind_state
import runtime.capi.onnxruntime_inference_collection
import runtime.capi.onnxruntime_pybind11_state

sys.modules["onnxruntime_reference"] = sys.modules["onnxruntime"]
sys.modules["onnxruntime"] = runtime
for _name in ("", "._pybind_state", ".onnxruntime_pybind11_state", ".onnxruntime_inference_collection"):
    sys.modules["onnxruntime.capi" + _name] = sys.modules["runtime.capi" + _name]

try:
    import onnx.mapping  # noqa: F401
except ImportError:
    import numpy as np
    import onnx
    from onnx import helper
    _mapping = types.ModuleType("onnx.mapping")
    _mapping.NP_TYPE_TO_TENSOR_TYPE = {np.dtype(helper.tensor_dtype_to_np_dtype(t)): t
                                       for t in helper.get_all_tensor_dtypes()
                                       if t not in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED)}
    sys.modules["onnx.mapping"] = _mapping
    onnx.mapping = _mapping
