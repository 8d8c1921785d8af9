"""``tools/cuda_node_suite``: the ONNX node suite on the CUDA provider, classified case by case.

A few cases of each outcome, run the way the tool runs them (under the simulator without a GPU): a pass that
exercises device kernels, a case that stays on the host, a node without a CUDA kernel, a configuration a
kernel refuses, and a mismatch made by corrupting a case's expected data.
"""
import copy
import warnings

import numpy as np
import pytest

from cuda_target import use_cuda_or_skip

use_cuda_or_skip("the CUDA node suite")

from onnx.backend.test.loader import load_node_model_tests  # noqa: E402

from tools.cuda_node_suite import run_case  # noqa: E402


@pytest.fixture(scope="module")
def cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the suite's generators divide by zero on purpose
        return {c.name: c for c in load_node_model_tests()}


@pytest.mark.parametrize("name,outcome", [
    ("test_reduce_log_sum_exp_do_not_keepdims_example", "pass"),
    ("test_constant_pad", "pass"),
    ("test_and_bcast4v4d", "pass"),
    ("test_shape", "host"),
    ("test_nonzero_example", "unsupported"),
    ("test_mod_mixed_sign_float32", "refused"),
])
def test_outcomes(cases, name, outcome):
    got, detail = run_case(cases[name])
    assert got == outcome, (name, got, detail)
    if outcome == "unsupported":
        assert "NonZero" in detail


def test_a_wrong_expected_value_is_a_mismatch(cases):
    case = copy.copy(cases["test_reduce_sum_square_default_axes_keepdims_example"])
    (inputs, outputs), = case.data_sets
    case.data_sets = [(inputs, [np.asarray(outputs[0]) * 1.01])]
    got, detail = run_case(case)
    assert got == "mismatch", detail
