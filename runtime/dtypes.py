"""ONNX element types and their numpy counterparts.

Facts live in tables keyed by the ONNX enum.  bfloat16 and the float8 types
are the ``ml_dtypes`` numpy dtypes, as ``onnx.numpy_helper`` produces them.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

__all__ = ["np_dtype", "onnx_type", "type_string", "type_proto_string", "FLOAT_TYPES", "is_low_precision_float"]

_NP_BY_ONNX: dict[int, np.dtype] = {}
for _k in TensorProto.DataType.values():
    if _k == TensorProto.UNDEFINED:
        continue
    try:
        _NP_BY_ONNX[_k] = np.dtype(helper.tensor_dtype_to_np_dtype(_k))
    except Exception:  # pragma: no cover - types numpy cannot represent
        pass
_NP_BY_ONNX[TensorProto.STRING] = np.dtype(object)

_ONNX_BY_NP: dict[np.dtype, int] = {}
for _k, _v in _NP_BY_ONNX.items():
    _ONNX_BY_NP.setdefault(_v, _k)
_ONNX_BY_NP[np.dtype(object)] = TensorProto.STRING

_NAMES = {v: k.lower() for k, v in TensorProto.DataType.items()}
_ORT_NAMES = {
    TensorProto.FLOAT: "float", TensorProto.DOUBLE: "double", TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16", TensorProto.BOOL: "bool", TensorProto.STRING: "string",
}

FLOAT_TYPES = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def np_dtype(elem_type: int) -> np.dtype:
    """Numpy dtype of an ONNX element type; raises ``TypeError`` if none."""
    try:
        return _NP_BY_ONNX[elem_type]
    except KeyError:
        raise TypeError(f"ONNX element type {elem_type} has no numpy dtype") from None


def onnx_type(dtype) -> int:
    """ONNX element type of a numpy dtype."""
    dt = np.dtype(dtype)
    try:
        return _ONNX_BY_NP[dt]
    except KeyError:
        if dt.kind in "US":
            return TensorProto.STRING
        raise TypeError(f"numpy dtype {dt} has no ONNX element type") from None


def type_string(elem_type: int) -> str:
    """onnxruntime's spelling of a tensor type, e.g. ``tensor(float)``."""
    name = _ORT_NAMES.get(elem_type) or _NAMES.get(elem_type, "undefined")
    return f"tensor({name})"


def is_low_precision_float(dtype) -> bool:
    """True for 16-bit and 8-bit floats that kernels compute in float32."""
    dt = np.dtype(dtype)
    return dt == np.float16 or (dt.kind == "V" or dt.name in ("bfloat16",) or dt.name.startswith("float8") or dt.name.startswith("float4"))


def type_proto_string(tp) -> str:
    """onnxruntime's spelling of any value type: ``tensor(float)``, ``seq(tensor(int64))``,
    ``optional(seq(tensor(float)))``, ``map(string,tensor(float))``, ``sparse_tensor(float)``."""
    which = tp.WhichOneof("value") if tp is not None else None
    if which == "tensor_type":
        return type_string(tp.tensor_type.elem_type)
    if which == "sequence_type":
        return f"seq({type_proto_string(tp.sequence_type.elem_type)})"
    if which == "optional_type":
        return f"optional({type_proto_string(tp.optional_type.elem_type)})"
    if which == "map_type":
        key = type_string(tp.map_type.key_type)[len("tensor("):-1]
        return f"map({key},{type_proto_string(tp.map_type.value_type)})"
    if which == "sparse_tensor_type":
        return "sparse_" + type_string(tp.sparse_tensor_type.elem_type)
    return "undefined"
