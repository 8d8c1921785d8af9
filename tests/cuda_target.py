"""The CUDA test modules' common start: the simulator when there is no GPU, a skip when neither can run.

Numba picks the simulator or the real driver when ``numba.cuda`` is first imported, and ``runtime.cuda``
defers that import to first use, so calling ``use_cuda_or_skip`` at the top of a test module (before it
imports any ``ops.cuda`` module) works under xdist too.  With ``ONNX_NUMBA_REQUIRE_CUDA=1`` a missing target
fails the module instead of skipping it, so a skip never reads as a pass on a machine with a GPU.
"""
import os

import pytest

from runtime import cuda as rc  # importing runtime.cuda never imports numba.cuda


def use_cuda_or_skip(what: str) -> None:
    if rc.SIM_ENV not in os.environ and not rc.gpu_present():
        os.environ[rc.SIM_ENV] = "1"
    reason = rc.unavailable_reason()
    if reason:
        rc.require_cuda()  # with ONNX_NUMBA_REQUIRE_CUDA=1 this raises: a failure, never a skip
        pytest.skip(f"{what} not tested: {reason}", allow_module_level=True)
