"""onnx-numba's runtime: load, optimize, plan and run ONNX models natively.

``from runtime import InferenceSession`` is a drop-in for onnxruntime's.
"""
from . import cpu_env  # noqa: F401  (first: settings numpy and Numba read when they load)
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .session import InferenceSession, IOBinding, NodeArg, SessionOptions, build_graph

__all__ = ["InferenceSession", "IOBinding", "NodeArg", "SessionOptions", "build_graph", *_errors_all]
