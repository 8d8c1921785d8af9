"""GenAI pipelines: run genai_config.json and inference_metadata.yaml packages natively or on onnxruntime.

The API follows onnxruntime-genai: ``Config``, ``Model``, ``Tokenizer``, ``GeneratorParams``, ``Generator``,
``Tensor``, ``NamedTensors``, a one-call ``generate``, LoRA ``Adapters`` (``pipeline/adapters.py``), ``Images``,
``Audios`` and ``Model.create_multimodal_processor()`` (``pipeline/multimodal.py``, ``pipeline/audio.py``),
``StreamingProcessor`` (streaming speech recognition, ``pipeline/streaming_asr.py``), the
``Engine`` of requests in turns and its events (``pipeline/engine_api.py``, over the serving engine
``pipeline/engine.py``), ``MtpGenerator`` (``pipeline/mtp.py``); the process-wide calls (providers on hand, logging, telemetry) are in
``pipeline/environment.py``.  ``python -m pipeline parity|generate`` are the command-line entry points.
Submodules load on first use, so ``import pipeline.spec`` stays light.
"""
# the public names, by the submodule that holds them (loaded on first use)
_EXPORTS = {
    "api": ["Config", "Model", "Tokenizer", "GeneratorParams", "Generator", "Tensor", "NamedTensors", "generate"],
    "tokenizer": ["TokenizerStream"],
    "adapters": ["Adapters"],
    "mtp": ["MtpGenerator"],
    "multimodal": ["Images", "MultiModalProcessor"],
    "audio": ["Audios"],
    "streaming_asr": ["StreamingProcessor"],
    "engine_api": ["Engine", "Request", "RequestOptions", "TurnOptions", "TurnUsage", "EngineEvent",
                   "EngineEventBuffer", "EngineEventFlags", "EngineCapabilities", "FinishReason", "EngineErrorCode"],
    "environment": ["is_cuda_available", "is_dml_available", "is_openvino_available", "is_qnn_available",
                    "is_webgpu_available", "set_log_options", "set_log_callback", "enable_telemetry_events",
                    "disable_telemetry_events", "get_current_gpu_device_id", "set_current_gpu_device_id",
                    "register_execution_provider_library", "unregister_execution_provider_library"],
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_HOME)


def __getattr__(name):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f".{module}", __name__), name)
