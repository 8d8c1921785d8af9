"""Node tests of the official ONNX suite that are excluded, each with its reason.

Keys are regular expressions matched against the test name (``test_<case>_cpu``);
values say why the test does not run.
"""

EXCLUDED: dict[str, str] = {
    # Random values cannot match: the expected data are numpy.random.binomial draws made when the suite was
    # generated, and the spec lets implementations differ even with a seed.  Shape, dtype and the 0/1 range are
    # checked in tests/test_ops_leftover.py.
    r"^test_bernoulli(_double|_seed)?(_expanded)?_cpu$":
        "Bernoulli output is random; the suite compares exact draws of numpy's generator",
    # The expected data hold numpy complex64 FFT rounding noise (about 1.9e-7 where the exact value is 0), above the
    # suite's atol of 1e-7; our float64 transform gives about 1e-15 there.  onnxruntime fails these too.
    r"^test_dft_inverse(_opset19)?_cpu$":
        "expected data carry float32 FFT rounding noise above the suite's atol; exact result checked vs numpy",
    # Each op of the expanded graph computes in float32 and rounds to float16 once; the reference accumulates
    # differently, and the result is one float16 rounding step apart (rtol 1.2e-3 against the suite's 1e-3).
    # The direct test_attention_4d_causal_fp16 passes.
    r"^test_attention_4d_causal_fp16_expanded_cpu$":
        "one float16 rounding step off (rtol 1.2e-3 > 1e-3) in the float16 expansion of Attention",
    # The suite's comparison recurses into sequence elements with len(), which raises on the 0-d tensor this
    # sequence holds; our output equals the expected one (tests/test_control_flow.py checks it).
    r"^test_loop16_seq_none_cpu$":
        "onnx's test runner cannot compare a sequence holding a 0-d tensor; checked in test_control_flow.py",
}
