"""An ``onnx.backend.base.Backend`` over the native runtime.

``onnx.backend.test.BackendTest(NumbaBackend, __name__)`` runs the official
ONNX node suite against it (see tests/test_onnx_backend.py).
"""
from __future__ import annotations

import numpy as np
from onnx.backend.base import Backend, BackendRep

from .session import InferenceSession

__all__ = ["NumbaBackend", "NumbaBackendRep", "prepare", "run_model", "supports_device"]


class NumbaBackendRep(BackendRep):
    def __init__(self, session: InferenceSession):
        self.session = session
        self.input_names = [i.name for i in session.get_inputs()]

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feed = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feed = dict(zip(self.input_names, inputs))
        return self.session.run(None, feed)


class NumbaBackend(Backend):
    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().startswith("CPU")

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        return NumbaBackendRep(InferenceSession(model.SerializeToString() if hasattr(model, "SerializeToString")
                                                else model))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        raise NotImplementedError("run_node is not supported; build a model instead")


prepare = NumbaBackend.prepare
run_model = NumbaBackend.run_model
supports_device = NumbaBackend.supports_device
