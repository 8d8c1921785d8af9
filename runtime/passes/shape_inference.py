"""Shape and type inference over the IR.

Uses onnx's inference engine (with data propagation, so shape vectors that
are computed in the graph still resolve) and writes what it learns into
``Graph.value_info``.  Dims are ints, symbolic names or None.

- ``strict=True``: a contradiction (an op whose inputs cannot have the types
  or shapes the graph gives them) raises ``ShapeInferenceError``.
- ``strict=False`` (permissive): contradictions and ops without a schema
  (contrib ops) leave their outputs unknown; planning goes on.

onnx runs in a worker process (``runtime.isolate``): a model that crashes or hangs its C++ fails the load with
``OnnxCrashError`` and leaves the caller running.

Large initializers travel to the engine as typed inputs rather than data, so
inference never copies weights.
"""
from __future__ import annotations

import onnx

from .. import isolate
from ..errors import ShapeInferenceError
from ..isolate import IsolatedStepError
from ..ir import Graph, model_to_proto, valueinfo_from_proto
from .base import Pass, PassResult

__all__ = ["InferShapes"]

_SMALL = 4096


class InferShapes(Pass):
    name = "infer_shapes"

    def __init__(self, strict: bool = False):
        self.strict = strict

    def call(self, graph: Graph) -> PassResult:
        model = model_to_proto(graph, small_init_limit=_SMALL)
        # Values we already know stay as hints; onnx refines them.  onnx runs isolated (runtime.isolate): a model
        # that crashes or hangs it fails this load with OnnxCrashError and nothing else.
        try:
            inferred = _infer(model, strict=self.strict, data_prop=True)
        except IsolatedStepError as e:
            if self.strict:
                raise ShapeInferenceError(f"shape inference failed: {e}") from None
            try:
                inferred = _infer(model, strict=False, data_prop=False)
            except IsolatedStepError:
                return PassResult(False, ["inference unavailable"])
        modified = False
        g = inferred.graph
        for vi in list(g.value_info) + list(g.output):
            new = valueinfo_from_proto(vi)
            old = graph.value_info.get(vi.name)
            if old is None or _better(new, old):
                if old is not None and old.shape is not None and new.shape is not None:
                    new.shape = tuple(o if isinstance(o, int) else n for o, n in zip(old.shape, new.shape)) \
                        if len(old.shape) == len(new.shape) else new.shape
                graph.value_info[vi.name] = new
                modified = True
        for name, arr in graph.initializers.items():
            from ..ir import ValueInfo
            from ..dtypes import onnx_type
            if name not in graph.value_info and arr.dtype != object:
                graph.value_info[name] = ValueInfo(name, arr.dtype, tuple(arr.shape), onnx_type(arr.dtype))
        return PassResult(modified)


def _infer(model: onnx.ModelProto, strict: bool, data_prop: bool) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.ParseFromString(isolate.call("infer_shapes", (model.SerializeToString(), strict, data_prop),
                                     "shape inference"))
    return out


def _rank_known(v):
    return v.shape is not None


def _known_dims(v):
    return 0 if v.shape is None else sum(isinstance(d, int) for d in v.shape)


def _better(new, old) -> bool:
    if old.dtype is None and new.dtype is not None:
        return True
    if not _rank_known(old) and _rank_known(new):
        return True
    return _rank_known(new) and _rank_known(old) and len(new.shape) == len(old.shape) and _known_dims(new) > _known_dims(old)
