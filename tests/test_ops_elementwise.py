"""Elementwise kernels against onnxruntime on realistic shapes, per dtype."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from runtime import InferenceSession
from runtime.dtypes import onnx_type

TOL = {np.float32: (1e-5, 1e-6), np.float16: (1e-3, 1e-3), np.float64: (1e-12, 1e-12)}


def _run_both(op, arrays, attrs=None, opset=20, out_type=None):
    names = [f"x{i}" for i in range(len(arrays))]
    et = onnx_type(arrays[0].dtype)
    node = helper.make_node(op, names, ["y"], **(attrs or {}))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, onnx_type(a.dtype), list(a.shape))
                                        for n, a in zip(names, arrays)],
                          [helper.make_tensor_value_info("y", out_type or et, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    feeds = dict(zip(names, arrays))
    ours = InferenceSession(m).run(None, feeds)[0]
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return ours, theirs


rng = np.random.default_rng(0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_broadcast_rows(op, dtype):
    a = rng.standard_normal((128, 4096)).astype(dtype)
    b = (rng.standard_normal(4096) + 3).astype(dtype)
    ours, theirs = _run_both(op, [a, b])
    np.testing.assert_allclose(ours, theirs, *TOL[dtype])


@pytest.mark.parametrize("shapes", [((8, 1, 64), (1, 32, 64)), ((4, 16, 1, 128), (16, 32, 1)),
                                    ((2, 3, 4, 5, 6, 7), (1, 3, 1, 5, 1, 7))])
def test_binary_general_broadcast(shapes):
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32)
    ours, theirs = _run_both("Mul", [a, b])
    np.testing.assert_allclose(ours, theirs, *TOL[np.float32])


@pytest.mark.parametrize("op,opset", [("Sigmoid", 13), ("Tanh", 13), ("Exp", 13), ("Erf", 13), ("Gelu", 20),
                                      ("Softplus", 1), ("Relu", 14), ("HardSwish", 14), ("Mish", 18)])
def test_unary_large(op, opset):
    x = (rng.standard_normal(1 << 20) * 4).astype(np.float32)
    ours, theirs = _run_both(op, [x], opset=opset)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Less", "Greater", "Equal"])
def test_comparisons(op):
    a = rng.integers(-5, 5, (64, 512)).astype(np.int64)
    b = rng.integers(-5, 5, (512,)).astype(np.int64)
    ours, theirs = _run_both(op, [a, b], out_type=TensorProto.BOOL)
    np.testing.assert_array_equal(ours, theirs)


def test_integer_div_and_mod_follow_onnxruntime():
    a = rng.integers(-100, 100, 1000).astype(np.int32)
    b = rng.integers(1, 9, 1000).astype(np.int32) * rng.choice([-1, 1], 1000).astype(np.int32)
    for op, attrs in [("Div", None), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})]:
        ours, theirs = _run_both(op, [a, b], attrs)
        np.testing.assert_array_equal(ours, theirs)


def test_generated_modules_are_what_the_generator_writes():
    """The CPU kernels, the segment row op and the CUDA device functions come from one table
    (tools/gen_elementwise.py): the committed modules must be what it writes now."""
    import os

    from tools import gen_elementwise as gen
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    for rel, make in gen.OUTPUTS.items():
        with open(os.path.join(root, rel)) as f:
            assert f.read() == make(), f"{rel} is stale: run python tools/gen_elementwise.py"


@pytest.mark.parametrize("op,shapes,twin", [("Tanh", [(3, 1000)], "pu_tanh"), ("Sigmoid", [(2, 517)], "pu_sigmoid"),
                                            ("Add", [(7, 300), (7, 300)], "pb_add"),
                                            ("Mul", [(3, 1, 5, 70), (1, 4, 5, 1)], "pb4_mul"),
                                            ("Sub", [(2, 3, 4, 5, 6), (3, 1, 1, 6)], "pb4_sub")])
def test_parallel_twins_give_the_serial_bits(monkeypatch, op, shapes, twin):
    """From ``PARALLEL_MIN`` elements the kernels' parallel twins run (on two threads) and give the bits of the
    serial kernels, odd extents and broadcasts included."""
    import runtime as rt
    from ops import _elementwise_kernels as K, elementwise as E
    arrays = [rng.standard_normal(s).astype(np.float32) * 3 for s in shapes]
    names = [f"x{i}" for i in range(len(arrays))]
    g = helper.make_graph([helper.make_node(op, names, ["y"])], "g",
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in
                           zip(names, arrays)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    so = rt.SessionOptions()
    so.intra_op_num_threads = 2
    sess, feeds = InferenceSession(m, so), dict(zip(names, arrays))
    (serial,) = sess.run(None, feeds)
    calls = []
    real = getattr(K, twin)
    monkeypatch.setattr(K, twin, lambda *a: (calls.append(1), real(*a))[1])
    monkeypatch.setattr(E, "_TWINS", {})
    monkeypatch.setattr(E, "PARALLEL_MIN", 64)
    (par,) = sess.run(None, feeds)
    assert calls
    np.testing.assert_array_equal(par.view(np.uint32), serial.view(np.uint32))
    (ref,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(par, ref, rtol=1e-5, atol=1e-6)
