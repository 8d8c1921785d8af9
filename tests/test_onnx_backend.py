"""The official ONNX node test suite, run through ``onnx.backend.test.BackendTest``.

Only the node tests run (the model-zoo kinds need downloads).  Every
excluded test is listed in ``backend_exclusions.py`` with its reason.
"""
import os
import re
import warnings

import onnx.backend.test
from onnx.backend.test.loader import load_node_model_tests

from runtime.backend import NumbaBackend
from backend_exclusions import EXCLUDED

warnings.filterwarnings("ignore", category=RuntimeWarning)

_NODE_NAMES = sorted({c.name for c in load_node_model_tests()})

backend_test = onnx.backend.test.BackendTest(NumbaBackend, __name__)
backend_test.include(r"^(" + "|".join(re.escape(n) for n in _NODE_NAMES) + r")_cpu$")
for pattern in EXCLUDED:
    backend_test.exclude(pattern)

globals().update(backend_test.test_cases)
