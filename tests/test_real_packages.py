"""Real-architecture packages from the onnxruntime-genai model builder (fixtures/packages).

The pipeline's onnxruntime backend must produce the same greedy tokens as
onnxruntime-genai's own generator on the same package and prompt, and the
fully native pipeline the same tokens as onnxruntime.
"""
import os

import pytest

from pipeline.backends import BackendChoice
from pipeline.metadata import load_package
from pipeline.runner import Pipeline
from tools.parity_matrix import genai_tokens


HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "packages")
PACKAGES = ["llama_fp32", "qwen35_fp32", "llama_int4", "qwen35_int4"]
# Prompts avoid the pad id (3): onnxruntime-genai masks a trailing pad token of the prompt, a convention the
# pipeline does not copy.
PROMPTS = [[1, 45, 77, 12, 300, 9], [7, 5, 11]]


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", PACKAGES)
def test_onnxruntime_backend_matches_onnxruntime_genai(name, prompt):
    path = os.path.join(HERE, name)
    n = 20
    expected = genai_tokens(path, prompt, n)
    pipe = Pipeline(load_package(path), BackendChoice(set(), False, "cpu"))
    assert pipe.generate(prompt, n) == expected


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", PACKAGES)
def test_native_backend_matches_onnxruntime(name, prompt):
    """Fully native decoding (every contrib op on its own kernel) gives onnxruntime's tokens."""
    spec = load_package(os.path.join(HERE, name))
    n = 16
    native = Pipeline(spec, BackendChoice(set(), True, "cpu"))
    assert native.decoder.backend == "native"
    ref = Pipeline(spec, BackendChoice(set(), False, "cpu")).generate(prompt, n)
    assert native.generate(prompt, n) == ref
