"""CUDA kernels of the op families, one module per family beside its CPU twin.

``import ops`` imports this package (every public name under ``ops/`` is), so it must stay cheap and must
not import ``numba.cuda``: Numba fixes the choice between a real GPU and the simulator when ``numba.cuda``
is first imported, and a test has to be able to set ``NUMBA_ENABLE_CUDASIM=1`` before that.  The kernel
modules are therefore imported on demand (``load()`` or a plain ``import ops.cuda.elementwise``).

Invariants of every module here:
- ``numba.cuda`` is reached only through ``runtime.cuda`` (``from runtime.cuda import cuda``);
- wrappers take and return device arrays (C-contiguous), except the inputs a registration names in
  ``host_inputs`` (shapes, axes, indices, sequence lengths, positions: small integer tensors the wrapper
  validates on the host, where a decoder's shape subgraph computes them), so every host<->device copy goes
  through ``runtime.cuda.to_device``/``to_host`` and is counted; small integer tensors a kernel reads go up
  through ``_common.upload_small``, once per distinct content;
- wrappers reshape to a canonical rank (flat, 4-d broadcast, (rows, n)) so each kernel compiles once per
  dtype; 16-bit floats are computed in float32 inside the kernels;
- registrations with ``ops.registry`` (provider ``CUDAExecutionProvider``) happen on import, so they exist only
  after ``load()``; ``registered`` registers the wrappers of the first seven modules and the view ops, and
  ``runtime.cuda_plan.CudaPlan`` runs them.
"""
import importlib

__all__ = ["FAMILIES", "load"]

FAMILIES = ("elementwise", "cast", "softmax", "contrib_norm", "matmul", "indexing", "reduce", "registered",
            "shape", "norm", "contrib_recurrent", "activations",
            "contrib_quant", "contrib_attention", "fused", "paged_attention", "cumulative", "resize", "quantize", "topk", "control_flow")


def load() -> dict:
    """Import every CUDA kernel module (needs numba-cuda); returns {family: module}."""
    return {f: importlib.import_module(f"{__name__}.{f}") for f in FAMILIES}
