"""onnxruntime's exception classes (onnxruntime's own: every error of this runtime derives from the one that
onnxruntime raises for the same defect) and the C-level ``RunOptions`` and ``OrtValueVector``."""
from onnxruntime.capi.onnxruntime_pybind11_state import (EPFail, Fail, InvalidArgument, InvalidGraph,
                                                         InvalidProtobuf, ModelLoaded, NoModel, NoSuchFile,
                                                         NotImplemented, RuntimeException)

from ..options import RunOptions
from ..ortvalue import OrtValueVector

__all__ = ["EPFail", "Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf", "ModelLoaded", "NoModel",
           "NoSuchFile", "NotImplemented", "RuntimeException", "RunOptions", "OrtValueVector"]
