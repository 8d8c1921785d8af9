"""Exception classes, each named for the defect it reports.

Every message says what was expected and what arrived, so that a user can
act on it without reading the runtime's source.

Each class also derives from the onnxruntime exception that onnxruntime raises
for the same defect (``onnxruntime.capi.onnxruntime_pybind11_state``): a
program written for onnxruntime that catches ``InvalidArgument``, ``Fail``,
``NoSuchFile``, ``InvalidProtobuf``, ``InvalidGraph`` or ``NotImplemented``
catches ours.
"""
from __future__ import annotations

from onnxruntime.capi import onnxruntime_pybind11_state as _ort

__all__ = [
    "OnnxNumbaError",
    "ModelLoadError",
    "ExternalDataPathError",
    "ExternalDataRangeError",
    "ExternalDataDamagedError",
    "UnsupportedOpError",
    "InvalidFeedError",
    "ShapeMismatchError",
    "ShapeInferenceError",
    "IndexOutOfRangeError",
    "InvalidAttributeError",
    "InvalidArgumentError",
    "ModelFileNotFoundError",
    "ModelParseError",
    "OnnxCrashError",
    "NotSupportedError",
    "RunTerminatedError",
    "UnknownProviderError",
]


class OnnxNumbaError(_ort.Fail):
    """Base class of every error the runtime raises on purpose."""


class ModelLoadError(OnnxNumbaError, ValueError, _ort.InvalidGraph):
    """The model could not be parsed or is structurally malformed."""


class ModelFileNotFoundError(ModelLoadError, FileNotFoundError, _ort.NoSuchFile):
    """The model path names no file."""


class ModelParseError(ModelLoadError, _ort.InvalidProtobuf):
    """The bytes are not a valid ONNX ``ModelProto``."""


class OnnxCrashError(ModelLoadError):
    """onnx's C++ code (shape inference, the function inliner or body builder) crashed or hung on the model; it ran in an
    isolated child process (``runtime.isolate``), so only the load failed."""


class ExternalDataPathError(ModelLoadError):
    """An external-data location resolves outside the model's folder."""


class ExternalDataRangeError(ModelLoadError):
    """An external-data offset/length reaches past the end of its file."""


class ExternalDataDamagedError(ModelLoadError):
    """External data holds values weights never hold (NaN in float weights): the file is damaged."""


class UnsupportedOpError(OnnxNumbaError, NotImplementedError, _ort.NotImplemented):
    """One or more nodes have no kernel on the requested provider.

    ``nodes`` holds one ``(node_name, op_type, domain, opset)`` tuple per node.
    """

    def __init__(self, nodes, provider="CPUExecutionProvider"):
        self.nodes = list(nodes)
        self.provider = provider
        lines = [
            f"  node {name!r}: op {op!r} domain {dom or 'ai.onnx'!r} opset {ver}"
            for name, op, dom, ver in self.nodes
        ]
        super().__init__(
            f"{len(self.nodes)} node(s) have no kernel on {provider}:\n" + "\n".join(lines)
        )


class InvalidFeedError(OnnxNumbaError, ValueError, _ort.InvalidArgument):
    """A feed has a wrong name, dtype, rank or shape."""


class ShapeMismatchError(OnnxNumbaError, ValueError):
    """Tensor shapes are incompatible for an operation."""


class ShapeInferenceError(OnnxNumbaError, ValueError):
    """Strict shape inference found a contradiction."""


class IndexOutOfRangeError(OnnxNumbaError, IndexError, _ort.InvalidArgument):
    """An index input points outside the indexed tensor."""


class InvalidAttributeError(OnnxNumbaError, ValueError):
    """An attribute has a value the op does not accept."""


class InvalidArgumentError(OnnxNumbaError, ValueError, _ort.InvalidArgument):
    """An input tensor has a value the op does not accept."""


class UnknownProviderError(OnnxNumbaError, ValueError, RuntimeError):
    """An execution provider name that neither this runtime nor onnxruntime knows (a ``RuntimeError`` as
    onnxruntime's, and a ``ValueError``)."""


class NotSupportedError(OnnxNumbaError, NotImplementedError, _ort.NotImplemented):
    """A feature of onnxruntime's API that this runtime cannot provide (custom-op libraries, ORT-format models)."""


class RunTerminatedError(OnnxNumbaError):
    """A run stopped because its ``RunOptions.terminate`` was set."""
