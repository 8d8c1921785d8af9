"""Node tests of the official ONNX suite that are excluded, each with its reason.

Keys are regular expressions matched against the test name (``test_<case>_cpu``);
values say why the test does not run.
"""

EXCLUDED: dict[str, str] = {
}
