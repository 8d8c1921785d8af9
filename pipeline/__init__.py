"""GenAI pipelines: run genai_config.json and inference_metadata.yaml packages natively or on onnxruntime.

The API follows onnxruntime-genai: ``Config``, ``Model``, ``Tokenizer``, ``GeneratorParams``, ``Generator``,
``Tensor``, ``NamedTensors``, a one-call ``generate``, LoRA ``Adapters`` (``pipeline/adapters.py``), ``Images``,
``Audios`` and ``Model.create_multimodal_processor()`` (``pipeline/multimodal.py``, ``pipeline/audio.py``), the
``Engine`` of requests in turns and its events (``pipeline/engine_api.py``, over the serving engine
``pipeline/engine.py``); the process-wide calls (providers on hand, logging, telemetry) are in
``pipeline/environment.py``.  ``python -m pipeline parity|generate`` are the command-line entry points.
Submodules load on first use, so ``import pipeline.spec`` stays light.
"""
_API = ["Config", "Model", "Tokenizer", "GeneratorParams", "Generator", "Tensor", "NamedTensors", "generate"]
_TOKENIZER = ["TokenizerStream"]
_ADAPTERS = ["Adapters"]
_MULTIMODAL = ["Images", "MultiModalProcessor"]
_AUDIO = ["Audios"]
_ENGINE = ["Engine", "Request", "RequestOptions", "TurnOptions", "TurnUsage", "EngineEvent", "EngineEventBuffer",
           "EngineEventFlags", "EngineCapabilities", "FinishReason", "EngineErrorCode"]
_ENVIRONMENT = ["is_cuda_available", "is_dml_available", "is_openvino_available", "is_qnn_available",
                "is_webgpu_available", "set_log_options", "set_log_callback", "enable_telemetry_events",
                "disable_telemetry_events", "get_current_gpu_device_id", "set_current_gpu_device_id",
                "register_execution_provider_library", "unregister_execution_provider_library"]
__all__ = _API + _TOKENIZER + _ADAPTERS + _MULTIMODAL + _AUDIO + _ENGINE + _ENVIRONMENT


def __getattr__(name):
    if name in _API:
        from . import api
        return getattr(api, name)
    if name in _TOKENIZER:
        from . import tokenizer
        return getattr(tokenizer, name)
    if name in _ADAPTERS:
        from . import adapters
        return getattr(adapters, name)
    if name in _MULTIMODAL:
        from . import multimodal
        return getattr(multimodal, name)
    if name in _AUDIO:
        from . import audio
        return getattr(audio, name)
    if name in _ENGINE:
        from . import engine_api
        return getattr(engine_api, name)
    if name in _ENVIRONMENT:
        from . import environment
        return getattr(environment, name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
