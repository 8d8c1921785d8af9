"""GenAI pipelines: run genai_config.json and inference_metadata.yaml packages natively or on onnxruntime.

The API follows onnxruntime-genai: ``Config``, ``Model``, ``Tokenizer``,
``GeneratorParams``, ``Generator``, ``Tensor``, ``NamedTensors`` and a one-call
``generate``.  ``python -m pipeline parity|generate``
are the command-line entry points.  Submodules load on first use, so
``import pipeline.spec`` stays light.
"""
__all__ = ["Config", "Model", "Tokenizer", "GeneratorParams", "Generator", "Tensor", "NamedTensors",
           "generate"]


def __getattr__(name):
    if name in __all__:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
