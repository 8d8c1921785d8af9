import os
import sys
import zlib

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(autouse=True)
def _order_independent_random_data(request):
    """Reseed module-level random generators per test, so a test's data never depends on which tests ran
    before it in the same worker (pytest-xdist distributes tests differently from run to run)."""
    seed = zlib.crc32(request.node.nodeid.encode())
    mod = request.module
    for name, val in list(vars(mod).items()):
        if isinstance(val, np.random.Generator):
            setattr(mod, name, np.random.default_rng(seed))
    np.random.seed(seed)
    yield


@pytest.fixture(autouse=True)
def _own_arithmetic_order(monkeypatch):
    """The suite runs the project's own arithmetic order (``ONNX_NUMBA_MLAS_ORDER=0``), which its kernel and form
    tests pin; onnxruntime's order, the default on x86 hosts with AVX2, is pinned bit for bit against onnxruntime
    by the tests that set the variable themselves (``test_mlas_*.py``, ``test_real_packages.py``).  Run before any
    of a test's own ``monkeypatch`` calls, so theirs win."""
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "0")


@pytest.fixture
def numba_threads_seen(monkeypatch):
    """The Numba thread count each ``Plan.run`` of the test ran with, in order."""
    import numba
    from runtime.executor import Plan
    seen = []
    real = Plan.run

    def spy(self, *a, **k):
        seen.append(numba.get_num_threads())
        return real(self, *a, **k)

    monkeypatch.setattr(Plan, "run", spy)
    return seen


@pytest.fixture(scope="session")
def ort_genai():
    """onnxruntime-genai itself, the reference the pipeline tests compare against.  A test dependency
    (``.[test]``): its absence fails those tests rather than skipping them, so a missing reference never reads
    as agreement."""
    import onnxruntime_genai
    return onnxruntime_genai
