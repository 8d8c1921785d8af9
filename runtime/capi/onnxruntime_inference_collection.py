"""onnxruntime's Python-layer classes and helpers (``onnxruntime.capi.onnxruntime_inference_collection``)."""
from ..adapters import AdapterFormat
from ..ortvalue import OrtValue
from ..providers import check_and_normalize_provider_args
from ..session import InferenceSession, IOBinding
from ..sparse import SparseTensor

__all__ = ["AdapterFormat", "OrtValue", "check_and_normalize_provider_args", "InferenceSession", "IOBinding",
           "SparseTensor"]
