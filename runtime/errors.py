"""Exception classes, each named for the defect it reports.

Every message says what was expected and what arrived, so that a user can
act on it without reading the runtime's source.
"""
from __future__ import annotations

__all__ = [
    "OnnxNumbaError",
    "ModelLoadError",
    "ExternalDataPathError",
    "ExternalDataRangeError",
    "UnsupportedOpError",
    "InvalidFeedError",
    "ShapeMismatchError",
    "ShapeInferenceError",
    "IndexOutOfRangeError",
    "InvalidAttributeError",
    "InvalidArgumentError",
]


class OnnxNumbaError(Exception):
    """Base class of every error the runtime raises on purpose."""


class ModelLoadError(OnnxNumbaError, ValueError):
    """The model could not be parsed or is structurally malformed."""


class ExternalDataPathError(ModelLoadError):
    """An external-data location resolves outside the model's folder."""


class ExternalDataRangeError(ModelLoadError):
    """An external-data offset/length reaches past the end of its file."""


class UnsupportedOpError(OnnxNumbaError, NotImplementedError):
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


class InvalidFeedError(OnnxNumbaError, ValueError):
    """A feed has a wrong name, dtype, rank or shape."""


class ShapeMismatchError(OnnxNumbaError, ValueError):
    """Tensor shapes are incompatible for an operation."""


class ShapeInferenceError(OnnxNumbaError, ValueError):
    """Strict shape inference found a contradiction."""


class IndexOutOfRangeError(OnnxNumbaError, IndexError):
    """An index input points outside the indexed tensor."""


class InvalidAttributeError(OnnxNumbaError, ValueError):
    """An attribute has a value the op does not accept."""


class InvalidArgumentError(OnnxNumbaError, ValueError):
    """An input tensor has a value the op does not accept."""
