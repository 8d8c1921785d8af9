"""onnxruntime's own Python API tests (``onnxruntime/test/python/onnxruntime_test_python.py`` and
``onnxruntime_test_python_iobinding.py`` of its repository) against ``runtime``, through the plugin
``tests/ort_shim/onnx_numba_as_ort.py``.

Their files are not part of this repository: set ``ONNX_NUMBA_ORT_TESTS`` to the folder holding them (with its
``helper.py``, as in a checkout of onnxruntime) to run this.  Without it the test is skipped, and counts as nothing.
The models the tests open from ``testdata`` are built by ``fixtures/ort_testdata.py`` into a fresh folder, where
the tests run.  Every test must pass or be one that cannot apply here, listed below with its reason; the tests'
own early returns (other execution providers, CUDA devices) stay theirs.
"""
import os
import re
import subprocess
import sys

import pytest

FOLDER = os.environ.get("ONNX_NUMBA_ORT_TESTS")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FILES = ("onnxruntime_test_python.py", "onnxruntime_test_python_iobinding.py")

# test name -> why it cannot pass here
CANNOT_APPLY = {
    "test_register_custom_ops_library": "loads onnxruntime's custom-op shared library (libcustom_op_library.so, a "
                                        "native plug-in built with onnxruntime); this runtime has no native "
                                        "plug-ins: every op has a kernel of its own",
    "test_create_allocator": "configures onnxruntime's arena allocator (OrtArenaCfg); this runtime's buffers come "
                             "from its planner's arena, which has no allocator objects",
    "test_shared_allocator_using_create_and_register_allocator": "registers an onnxruntime allocator shared "
                                                                 "between sessions (create_and_register_allocator)"
                                                                 "; there is no allocator object to share here",
    "test_run_session_owned_output_is_zero_copy": "checks that an output is a numpy view over memory onnxruntime "
                                                  "owns (a non-None .base); here the kernel's own numpy array is "
                                                  "returned, not a copy, so it owns its memory and has no base",
    "test_bind_input_only": "binds OrtValues on a CUDA device: needs a GPU (it fails in onnxruntime's CPU "
                            "package too)",
    "test_bind_input_and_preallocated_output": "binds OrtValues on a CUDA device: needs a GPU",
    "test_bind_input_and_non_preallocated_output": "binds OrtValues on a CUDA device: needs a GPU",
    "test_bind_input_and_bind_output_with_ortvalues": "binds OrtValues on a CUDA device: needs a GPU",
}


@pytest.mark.skipif(not FOLDER, reason="ONNX_NUMBA_ORT_TESTS (onnxruntime's test/python folder) is not set")
def test_onnxruntime_s_api_tests_pass(tmp_path):
    from fixtures.ort_testdata import build
    build(str(tmp_path))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "ort_shim"), ROOT, FOLDER]))
    env.pop("ORT_LOAD_CONFIG_FROM_MODEL", None)
    files = [os.path.join(FOLDER, f) for f in FILES if os.path.exists(os.path.join(FOLDER, f))]
    assert files, f"none of {FILES} is in {FOLDER}"
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "onnx_numba_as_ort", "-p", "no:cacheprovider",
                          "-q", "-rA", "--rootdir", str(tmp_path), *files],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=1800)
    outcomes = re.findall(r"^(PASSED|FAILED|ERROR|SUBFAILED\S*) (\S+)", run.stdout, re.M)
    assert outcomes, run.stdout[-3000:] + run.stderr[-3000:]
    assert any(o == "PASSED" for o, _ in outcomes), run.stdout[-3000:]
    unexpected = [(o, t) for o, t in outcomes if o != "PASSED" and t.split("::")[-1] not in CANNOT_APPLY]
    assert not unexpected, run.stdout[-6000:]
