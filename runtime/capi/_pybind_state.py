"""The names onnxruntime's C layer (``onnxruntime.capi._pybind_state``) exposes, as this runtime provides them."""
from ..adapters import AdapterFormat, LoraAdapter
from ..devices import OrtDevice, OrtMemoryInfo
from ..options import RunOptions, SessionOptions
from ..ortvalue import OrtValue, OrtValueVector, is_dlpack_uint8_tensor
from ..providers import available_providers as get_available_providers
from ..session import IOBinding as SessionIOBinding
from .onnxruntime_pybind11_state import (EPFail, Fail, InvalidArgument, InvalidGraph, InvalidProtobuf, NoSuchFile,
                                         NotImplemented)

__all__ = ["AdapterFormat", "LoraAdapter", "OrtDevice", "OrtMemoryInfo", "RunOptions", "SessionOptions", "OrtValue",
           "OrtValueVector", "is_dlpack_uint8_tensor", "get_available_providers", "SessionIOBinding", "EPFail",
           "Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf", "NoSuchFile", "NotImplemented",
           "get_default_session_options"]


def get_default_session_options() -> SessionOptions:
    """A fresh ``SessionOptions`` with onnxruntime's defaults."""
    return SessionOptions()
