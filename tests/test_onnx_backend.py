"""The official ONNX node test suite, run through ``onnx.backend.test.BackendTest``.

Only the node tests run on the CPU (the model-zoo kinds need downloads, and
the CUDA variants belong to the CUDA provider).  Every excluded test is
listed in ``backend_exclusions.py`` with its reason, and is reported as
skipped with that reason.
"""
import re
import unittest
import warnings

import onnx.backend.test
from onnx.backend.test.loader import load_node_model_tests

from runtime.backend import NumbaBackend
from backend_exclusions import EXCLUDED

warnings.filterwarnings("ignore", category=RuntimeWarning)

NODE_TESTS = sorted({c.name for c in load_node_model_tests()})

backend_test = onnx.backend.test.BackendTest(NumbaBackend, __name__)
_node_case = backend_test.test_cases["OnnxBackendNodeModelTest"]
_wanted = {f"{n}_cpu" for n in NODE_TESTS}
_patterns = [(re.compile(p), why) for p, why in EXCLUDED.items()]

for _name in list(vars(_node_case)):
    if not _name.startswith("test_"):
        continue
    if _name not in _wanted:
        delattr(_node_case, _name)
        continue
    for _rx, _why in _patterns:
        if _rx.search(_name):
            setattr(_node_case, _name, unittest.skip(_why)(getattr(_node_case, _name)))
            break

OnnxBackendNodeModelTest = _node_case
del _node_case
