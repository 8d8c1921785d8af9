"""Fusions of a convolution with what follows it, as onnxruntime's basic optimizations do.

``FuseConvBatchNorm`` folds an inference ``BatchNormalization`` into the ``Conv`` that feeds it: with
``alpha = scale / sqrt(var + epsilon)`` per output channel, the weights become ``W * alpha`` (along the output
channels) and the bias ``(B - mean) * alpha + bias`` (``bias - mean * alpha`` when the Conv has none), each
step in the weights' float type, in onnxruntime's order (``ConvBNFusion``), so the fused model computes what
onnxruntime's fused model computes.  A whole normalization pass over the activations is saved per pair.

Invariants:
- fused only when the Conv's output is read by the BatchNormalization alone and is not a graph output, the
  BatchNormalization is in inference form (one output, no ``training_mode``, ``spatial`` 1), and the weights,
  Conv bias and the four statistics are float32 or float64 initializers of the shapes the ops require;
- the fused Conv keeps its name and attributes and produces the BatchNormalization's output value;
  the new weights get new initializer names (the old ones are dropped by dead-node elimination when nothing
  else reads them), so a weight shared with another node is never changed under it.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .base import Pass, PassResult
from .cuda_fusions import _readers

__all__ = ["FuseConvBatchNorm", "ONNXRUNTIME_NAMES"]

_STD = ("", "ai.onnx")
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# onnxruntime's names of these optimizers (InferenceSession's ``disabled_optimizers``)
ONNXRUNTIME_NAMES = {"ConvBNFusion": "FuseConvBatchNorm"}


class FuseConvBatchNorm(Pass):
    name = "fuse_conv_batchnorm"

    def call(self, graph: Graph) -> PassResult:
        readers = _readers(graph)
        producer = {o: n for n in graph.nodes for o in n.outputs if o}
        inits = graph.initializers
        fused, drop = [], set()
        for bn in graph.nodes:
            conv = self._pair(bn, producer, readers, inits)
            if conv is None:
                continue
            w, b = inits[conv.inputs[1]], inits[conv.inputs[2]] if len(conv.inputs) > 2 and conv.inputs[2] else None
            scale, bias, mean, var = (inits[x] for x in bn.inputs[1:5])
            eps = w.dtype.type(bn.attrs.get("epsilon", 1e-5))
            alpha = scale / np.sqrt(var + eps)
            new_w = (w * alpha.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
            new_b = ((b - mean) * alpha + bias if b is not None else bias - mean * alpha).astype(w.dtype)
            wname, bname = self._fresh(inits, f"{bn.name or bn.outputs[0]}_fused_W"), None
            inits[wname] = np.ascontiguousarray(new_w)
            bname = self._fresh(inits, f"{bn.name or bn.outputs[0]}_fused_B")
            inits[bname] = np.ascontiguousarray(new_b)
            conv.inputs = [conv.inputs[0], wname, bname]
            conv.outputs = [bn.outputs[0]]
            drop.add(id(bn))
            fused.append(conv.name)
        if not fused:
            return PassResult(False)
        graph.nodes = [n for n in graph.nodes if id(n) not in drop]
        return PassResult(True, fused)

    @staticmethod
    def _pair(bn: Node, producer: dict, readers: dict, inits: dict):
        """The Conv that ``bn`` can be folded into, or None."""
        if bn.op_type != "BatchNormalization" or bn.domain not in _STD or len(bn.inputs) < 5:
            return None
        if len([o for o in bn.outputs if o]) != 1 or bn.attrs.get("training_mode", 0) or \
                bn.attrs.get("spatial", 1) != 1:
            return None
        conv = producer.get(bn.inputs[0])
        if conv is None or conv.op_type != "Conv" or conv.domain not in _STD or len(conv.outputs) != 1:
            return None
        if readers.get(conv.outputs[0], 0) != 1 or len(conv.inputs) < 2:
            return None
        names = [conv.inputs[1]] + ([conv.inputs[2]] if len(conv.inputs) > 2 and conv.inputs[2] else []) \
            + list(bn.inputs[1:5])
        if not all(x in inits and inits[x].dtype in _FLOATS for x in names):
            return None
        w = inits[conv.inputs[1]]
        if w.ndim < 3 or any(inits[x].dtype != w.dtype for x in names):
            return None
        m = w.shape[0]
        return conv if all(inits[x].shape == (m,) for x in names[1:]) else None

    @staticmethod
    def _fresh(inits: dict, name: str) -> str:
        k, out = 0, name
        while out in inits:
            k += 1
            out = f"{name}_{k}"
        return out
