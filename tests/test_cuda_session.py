"""``InferenceSession(..., providers=["CUDAExecutionProvider"])``: the CUDA plan (runtime/cuda_plan.py) against
the CPU session on small graphs, placement (device kernels, host shape subgraphs, allowed CPU nodes), the
no-silent-fallback rules, IO binding with device arrays, transfer accounting, runs of one session from several
threads (which overlap) and ``OrtValue``'s CUDA factories.

Without a GPU the kernels run on Numba's CUDA simulator, where every CUDA thread is a Python thread, so
shapes are tiny.

Numba picks the simulator or the real driver when ``numba.cuda`` is first imported, and ``runtime.cuda``
defers that import to first use, so setting ``NUMBA_ENABLE_CUDASIM`` here works under xdist too: no other
module imports ``numba.cuda`` (``import ops`` imports only ``ops/cuda/__init__.py``, which loads no kernel).

When numba-cuda is missing (or finds no GPU and the simulator is off) the module is skipped, unless
``ONNX_NUMBA_REQUIRE_CUDA=1``, in which case collecting it fails.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import cuda as rc  # importing runtime.cuda never imports numba.cuda

from cuda_target import use_cuda_or_skip  # noqa: E402

use_cuda_or_skip("CUDA session")

from runtime import InferenceSession, SessionOptions  # noqa: E402
from runtime.cuda import CudaUnavailableError  # noqa: E402
from runtime.errors import UnsupportedOpError  # noqa: E402

RNG = np.random.default_rng(0)
MS = "com.microsoft"
F = TensorProto.FLOAT
I64 = TensorProto.INT64
CUDA = ["CUDAExecutionProvider"]


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    return m.SerializeToString()


def _both(model, feeds, options=None):
    cpu = InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    s = InferenceSession(model, options, providers=CUDA)
    got = s.run(None, feeds)
    assert len(got) == len(cpu)
    for g, w in zip(got, cpu):
        assert isinstance(g, np.ndarray)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return s


def _mlp():
    k, n = 12, 8
    inits = [("W", RNG.standard_normal((k, n)).astype(np.float32) * 0.3),
             ("b", RNG.standard_normal(n).astype(np.float32)),
             ("g", RNG.standard_normal(n).astype(np.float32))]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
             helper.make_node("Sigmoid", ["hb"], ["sg"], name="sig"),
             helper.make_node("Mul", ["hb", "sg"], ["silu"], name="mul"),
             helper.make_node("SimplifiedLayerNormalization", ["silu", "g"], ["nrm"], name="rms", axis=-1,
                              epsilon=1e-5),
             helper.make_node("Softmax", ["nrm"], ["y"], name="sm", axis=-1)]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["B", k])],
                  [helper.make_tensor_value_info("y", F, None)], inits)


def test_mlp_block_matches_cpu():
    m = _mlp()
    s = _both(m, {"x": RNG.standard_normal((3, 12)).astype(np.float32)})
    _both(m, {"x": RNG.standard_normal((1, 12)).astype(np.float32)})  # one row: the GEMV
    assert s.get_providers() == CUDA and s.device.kind == "cuda"
    assert set(s.get_placement().values()) == {"cuda"}
    assert s.cpu_round_trips() == {}


def test_view_chain_and_gather_match_cpu():
    table = RNG.standard_normal((10, 6)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="gather", axis=0),      # (2, 3, 6)
             helper.make_node("Reshape", ["e", "shp"], ["r"], name="reshape"),               # (6, 6)
             helper.make_node("Unsqueeze", ["r", "ax"], ["u"], name="unsq"),                 # (1, 6, 6)
             helper.make_node("Flatten", ["u"], ["f"], name="flat", axis=2),                 # (6, 6)
             helper.make_node("Squeeze", ["u", "ax"], ["q"], name="sq"),                     # (6, 6)
             helper.make_node("Add", ["f", "q"], ["y"], name="add")]
    m = _model(nodes, [helper.make_tensor_value_info("ids", I64, [2, 3])],
               [helper.make_tensor_value_info("y", F, None)],
               [("table", table), ("shp", np.array([-1, 0], np.int64)), ("ax", np.array([0], np.int64))])
    s = _both(m, {"ids": np.array([[1, -2, 3], [0, 9, 4]], np.int64)})
    assert set(s.get_placement().values()) == {"cuda"}
    from runtime.errors import IndexOutOfRangeError
    with pytest.raises(IndexOutOfRangeError, match="gather"):
        s.run(None, {"ids": np.array([[1, 2, 3], [0, 10, 4]], np.int64)})


def test_shape_subgraph_stays_on_host():
    # y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) * 2, run on the device
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["d0"], name="g0", axis=0),
             helper.make_node("Unsqueeze", ["d0", "ax"], ["d0u"], name="unsq"),
             helper.make_node("Concat", ["d0u", "minus1"], ["shp"], name="concat", axis=0),
             helper.make_node("Reshape", ["x", "shp"], ["r"], name="reshape"),
             helper.make_node("Mul", ["r", "two"], ["y"], name="mul")]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["B", 3, 4])],
               [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("shp", I64, None)],
               [("zero", np.array(0, np.int64)), ("ax", np.array([0], np.int64)),
                ("minus1", np.array([-1], np.int64)), ("two", np.array([2.0], np.float32))])
    opts = SessionOptions()
    opts.graph_optimization_level = 0  # keep the shape subgraph (nothing is constant anyway)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    s = _both(m, {"x": x}, opts)
    pl = s.get_placement()
    assert pl["shape"] == pl["g0"] == pl["unsq"] == pl["concat"] == "cpu(shape)"
    assert pl["reshape"] == pl["mul"] == "cuda"
    with rc.TransferCounter() as tc:
        s.run(None, {"x": x})
    # x up, y and shp down: the shape subgraph itself moves nothing
    assert tc.h2d == x.nbytes and tc.h2d_calls == 1
    assert tc.d2h == x.nbytes and tc.d2h_calls == 1
    assert s.cpu_round_trips() == {}


def _pool_model():
    """Relu, then a node without a CUDA kernel (MaxPool with its indices: 3 values and indices per row), then
    Neg on its values."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["v", "i"], name="pool_node", kernel_shape=[3], strides=[2]),
             helper.make_node("Neg", ["v"], ["y"], name="neg")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 1, 8])],
                  [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("i", I64, None)])


def test_unsupported_op_fails_creation_naming_the_node():
    with pytest.raises(UnsupportedOpError) as e:
        InferenceSession(_pool_model(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    msg = str(e.value)
    assert "pool_node" in msg and "MaxPool" in msg and "CUDAExecutionProvider" in msg and "opset 21" in msg
    assert "cuda_cpu_ops" in msg


@pytest.mark.parametrize("allow", ["MaxPool", "pool_node"])
def test_allowed_cpu_op_runs_and_counts_round_trips(allow):
    opts = SessionOptions()
    opts.cuda_cpu_ops = {allow}
    x = RNG.standard_normal((2, 1, 8)).astype(np.float32)
    s = _both(_pool_model(), {"x": x}, opts)
    assert s.get_placement() == {"relu": "cuda", "pool_node": "cpu(allowed)", "neg": "cuda"}
    rt = s.cpu_round_trips()
    assert set(rt) == {"pool_node"}
    t = rt["pool_node"]
    # Relu's result came down once; only the values went back up (for Neg); the indices stay on the host
    assert t["calls"] == 1 and t["bytes_down"] == x.nbytes and t["bytes_up"] == 2 * 3 * 4
    s.run(None, {"x": x})
    assert s.cpu_round_trips()["pool_node"]["calls"] == 2


def test_io_binding_with_device_arrays_moves_nothing_after_the_first_run():
    m = _mlp()
    s = InferenceSession(m, providers=CUDA)
    x = RNG.standard_normal((2, 12)).astype(np.float32)
    want = InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    dx = rc.to_device(x)
    b = s.io_binding()
    b.bind_input("x", dx)
    b.bind_output("y", "cuda")
    s.run_with_iobinding(b)
    with rc.TransferCounter() as tc:
        s.run_with_iobinding(b)
        out = b.get_output_arrays()[0]
    assert tc.h2d == tc.d2h == 0, tc
    assert rc.is_device_array(out)
    np.testing.assert_allclose(b.copy_outputs_to_cpu()[0], want, rtol=1e-5, atol=1e-6)
    # a device buffer bound as the output is written in place
    buf = rc.device_empty(want.shape, np.float32)
    b.bind_output("y", buf)
    s.run_with_iobinding(b)
    assert b.get_output_arrays()[0] is buf
    np.testing.assert_allclose(rc.to_host(buf), want, rtol=1e-5, atol=1e-6)
    # a numpy-bound output is downloaded into the array
    host = np.empty_like(want)
    b.bind_output("y", host)
    s.run_with_iobinding(b)
    np.testing.assert_allclose(host, want, rtol=1e-5, atol=1e-6)


def test_a_capturing_block_runs_device_work_and_names_the_node_that_needs_the_host():
    """Under ``launch_stream(..., capturing=True)`` a run whose inputs and outputs are bound on the device
    launches its kernels on the block's stream and copies nothing, so it could be captured into a CUDA graph;
    a node placed on the CPU needs its input downloaded, and the CaptureError names that node."""
    m = _mlp()
    s = InferenceSession(m, providers=CUDA)
    x = RNG.standard_normal((2, 12)).astype(np.float32)
    want = InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    b = s.io_binding()
    b.bind_input("x", rc.to_device(x))
    b.bind_output("y", "cuda")
    with rc.launch_stream(rc.cuda.stream(), capturing=True), rc.TransferCounter() as tc:
        s.run_with_iobinding(b)
    assert (tc.h2d_calls, tc.d2h_calls) == (0, 0) and tc.launches > 0
    np.testing.assert_allclose(rc.to_host(b.get_output_arrays()[0]), want, rtol=1e-5, atol=1e-6)

    opts = SessionOptions()
    opts.cuda_cpu_ops = {"MaxPool"}
    t = InferenceSession(_pool_model(), opts, providers=CUDA)
    b = t.io_binding()
    b.bind_input("x", rc.to_device(RNG.standard_normal((2, 1, 8)).astype(np.float32)))
    b.bind_output("y", "cuda")
    b.bind_output("i", "cuda")
    t.run_with_iobinding(b)  # outside a capture: the round trips run
    with rc.launch_stream(rc.cuda.stream(), capturing=True):
        with pytest.raises(rc.CaptureError, match=r"pool_node.*MaxPool.*device-to-host copy of \[2, 1, 8\] float32"):
            t.run_with_iobinding(b)


def test_device_feeds_are_checked():
    from runtime.errors import InvalidFeedError
    s = InferenceSession(_mlp(), providers=CUDA)
    with pytest.raises(InvalidFeedError, match="dtype"):
        s.run(None, {"x": rc.to_device(np.zeros((2, 12), np.float64))})
    with pytest.raises(InvalidFeedError, match="axis 1"):
        s.io_binding().bind_input("x", rc.to_device(np.zeros((2, 5), np.float32)))
    got = s.run(None, {"x": rc.to_device(np.ones((2, 12), np.float32))})[0]
    assert isinstance(got, np.ndarray) and got.shape == (2, 8)


def test_initializers_are_uploaded_once():
    m = _mlp()
    with rc.TransferCounter() as tc:
        s = InferenceSession(m, providers=CUDA)
    w_bytes = (12 * 8 + 8 + 8) * 4
    assert tc.h2d == s.plan.init_upload_bytes == w_bytes
    x = RNG.standard_normal((2, 12)).astype(np.float32)
    s.run(None, {"x": x})
    with rc.TransferCounter() as tc:
        s.run(None, {"x": x})
    assert tc.h2d == x.nbytes and tc.h2d_calls == 1  # the feed only
    assert tc.d2h == 2 * 8 * 4 and tc.d2h_calls == 1  # the output only


def test_cuda_unavailable_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(rc, "available", lambda: False)
    monkeypatch.setattr(rc, "unavailable_reason", lambda: "no GPU (test)")
    with pytest.raises(CudaUnavailableError, match="no GPU \\(test\\)"):
        InferenceSession(_mlp(), providers=["CUDAExecutionProvider"])
    # An ordered preference that lists the CPU after it runs there, with a warning naming the skipped provider
    # and why (onnxruntime's behaviour); nothing is skipped without one.
    with pytest.warns(UserWarning, match="CUDAExecutionProvider \\(no GPU \\(test\\)\\)"):
        s = InferenceSession(_mlp(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert s.get_providers() == ["CPUExecutionProvider"]
    # the CPU provider is unaffected
    assert InferenceSession(_mlp(), providers=["CPUExecutionProvider"]).get_providers() == \
        ["CPUExecutionProvider"]


def test_provider_options_device_id():
    s = InferenceSession(_mlp(), providers=[("CUDAExecutionProvider", {"device_id": 0})])
    assert str(s.device) == "cuda:0"
    with pytest.raises(CudaUnavailableError, match="device_id 7"):
        InferenceSession(_mlp(), providers=[("CUDAExecutionProvider", {"device_id": 7})])


def _one(op_type, inputs, n_out=1, domain="", inits=(), opset=21, **attrs):
    """A one-node model: inputs are (name, array) feeds; inits (name, array) initializers."""
    node = helper.make_node(op_type, [n for n, _ in inputs] + [n for n, _ in inits],
                            [f"o{k}" for k in range(n_out)], name="node", domain=domain, **attrs)
    from runtime.dtypes import onnx_type
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info(n, onnx_type(a.dtype), list(a.shape)) for n, a in inputs],
                          [helper.make_empty_tensor_value_info(f"o{k}") for k in range(n_out)],
                          [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    return m.SerializeToString(), dict(inputs)


def _r(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


CASES = [
    ("matmul_batched", lambda: _one("MatMul", [("a", _r(2, 3, 5)), ("b", _r(2, 5, 4))])),
    ("matmul_weight", lambda: _one("MatMul", [("a", _r(2, 3, 5)), ("b", _r(5, 4))])),
    ("matmul_a_shared", lambda: _one("MatMul", [("a", _r(3, 5)), ("b", _r(2, 5, 4))])),
    ("matmul_broadcast", lambda: _one("MatMul", [("a", _r(2, 1, 3, 5)), ("b", _r(1, 3, 5, 4))])),
    ("matmul_vec", lambda: _one("MatMul", [("a", _r(5)), ("b", _r(5, 4))])),
    ("matmul_mat_vec", lambda: _one("MatMul", [("a", _r(3, 5)), ("b", _r(5))])),
    ("matmul_f16", lambda: _one("MatMul", [("a", _r(1, 1, 6, dtype=np.float16)), ("b", _r(6, 3, dtype=np.float16))])),
    ("sub_div_broadcast", lambda: _one("Div", [("a", _r(2, 3, 4)), ("b", _r(3, 1) + 3)])),
    ("sub", lambda: _one("Sub", [("a", _r(2, 3))], inits=[("b", _r(3))])),
    ("tanh", lambda: _one("Tanh", [("a", _r(3, 5))])),
    ("relu", lambda: _one("Relu", [("a", _r(3, 5))])),
    ("exp_neg", lambda: _one("Exp", [("a", _r(3, 5))])),
    ("neg", lambda: _one("Neg", [("a", _r(3, 5))])),
    ("where", lambda: _one("Where", [("c", RNG.random((2, 3)) > 0.5), ("a", _r(2, 3)), ("b", _r(3))])),
    ("cast_f16", lambda: _one("Cast", [("a", _r(3, 5))], to=TensorProto.FLOAT16)),
    ("cast_to_int32", lambda: _one("Cast", [("a", _r(3, 5) * 10)], to=TensorProto.INT32)),
    ("cast_to_bool", lambda: _one("Cast", [("a", np.array([[0.0, 1.5, -2.0, 0.0]], np.float32))],
                                  to=TensorProto.BOOL)),
    ("cast_f16_f64", lambda: _one("Cast", [("a", _r(3, 5, dtype=np.float16))], to=TensorProto.DOUBLE)),
    ("sqrt", lambda: _one("Sqrt", [("a", np.abs(_r(3, 5)))])),
    ("erf", lambda: _one("Erf", [("a", _r(3, 5))])),
    ("abs", lambda: _one("Abs", [("a", _r(3, 5))])),
    ("log", lambda: _one("Log", [("a", np.abs(_r(3, 5)) + 0.1)])),
    ("reciprocal", lambda: _one("Reciprocal", [("a", _r(3, 5) + 5)])),
    ("sin", lambda: _one("Sin", [("a", _r(3, 5))])),
    ("cos", lambda: _one("Cos", [("a", _r(3, 5))])),
    ("floor", lambda: _one("Floor", [("a", _r(3, 5) * 4)])),
    ("ceil", lambda: _one("Ceil", [("a", _r(3, 5) * 4)])),
    ("pow_broadcast", lambda: _one("Pow", [("a", np.abs(_r(2, 3)) + 0.5)], inits=[("b", _r(3))])),
    ("softmax_13", lambda: _one("Softmax", [("a", _r(2, 3, 5))])),
    ("softmax_1_coerce", lambda: _one("Softmax", [("a", _r(2, 3, 5))], opset=11, axis=1)),
    ("argmax", lambda: _one("ArgMax", [("a", _r(3, 7))], axis=-1, keepdims=1)),
    ("argmax_nokeep", lambda: _one("ArgMax", [("a", _r(3, 7))], axis=1, keepdims=0)),
    ("rms_2out", lambda: _one("SimplifiedLayerNormalization", [("a", _r(2, 3, 8)), ("s", _r(8))], n_out=2)),
    ("rms_ms", lambda: _one("SimplifiedLayerNormalization", [("a", _r(2, 8)), ("s", _r(8))], domain=MS)),
    ("skip_rms", lambda: _one("SkipSimplifiedLayerNormalization",
                              [("a", _r(2, 3, 8)), ("k", _r(2, 3, 8)), ("g", _r(8)), ("bias", _r(8))],
                              n_out=4, domain=MS)),
    ("reshape_allowzero", lambda: _one("Reshape", [("a", _r(2, 0, 3))], inits=[("s", np.array([0, 3, 2], np.int64))],
                                       allowzero=1)),
    ("unsqueeze_11", lambda: _one("Unsqueeze", [("a", _r(2, 3))], opset=11, axes=[0, -1])),
    ("squeeze_11", lambda: _one("Squeeze", [("a", _r(1, 3, 1))], opset=11, axes=[2])),
    ("identity_of_feed", lambda: _one("Identity", [("a", _r(2, 3))])),
    ("gather_axis1", lambda: _one("Gather", [("a", _r(3, 4, 2))], inits=[("i", np.array([3, -1, 0], np.int64))],
                                  axis=1)),
]


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_one_node_matches_cpu(case):
    model, feeds = dict(CASES)[case]()
    opts = SessionOptions()
    opts.graph_optimization_level = 0
    s = _both(model, feeds, opts)
    assert s.get_placement() == {"node": "cuda"}


def test_weight_bytes_per_run_counts_each_weight_read_in_full_once():
    """The floor of a run's memory traffic: initializers a device kernel reads in full, each once however many
    nodes read it; an embedding table read only through Gather (just the indexed rows) is left out, and counted
    when a MatMul also reads it (a tied output projection)."""
    table = RNG.standard_normal((10, 4)).astype(np.float32)
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    n = helper.make_node
    nodes = [n("Gather", ["table", "ids"], ["e"]), n("MatMul", ["e", "w"], ["y"]), n("MatMul", ["e", "w"], ["z"]),
             n("Add", ["y", "z"], ["out"])]
    ins = [helper.make_tensor_value_info("ids", I64, [1, 2])]
    outs = [helper.make_tensor_value_info("out", F, None)]
    s = InferenceSession(_model(nodes, ins, outs, [("table", table), ("w", w)]), providers=CUDA)
    assert s._plan.weight_bytes_per_run() == w.nbytes
    tied = nodes + [n("MatMul", ["x", "table"], ["t"])]
    s = InferenceSession(_model(tied, ins + [helper.make_tensor_value_info("x", F, [1, 10])],
                                outs + [helper.make_tensor_value_info("t", F, None)],
                                [("table", table), ("w", w)]), providers=CUDA)
    assert s._plan.weight_bytes_per_run() == w.nbytes + table.nbytes


# -- overlapping runs ------------------------------------------------------------------------------------------------
def _tiny():
    """y = relu(x * w), both nodes on the device."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["a"], name="mul"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 4])],
                  [helper.make_tensor_value_info("y", F, [2, 4])], [("w", np.arange(4, dtype=np.float32) - 1)])


def test_four_threads_give_the_serial_results():
    """Device steps and a host round trip (MaxPool allowed on the CPU) from four threads at once: each run gets the
    results of a run alone, and the round trips are all counted."""
    import threading
    opts = SessionOptions()
    opts.cuda_cpu_ops = {"MaxPool"}
    s = InferenceSession(_pool_model(), opts, providers=CUDA)
    xs = [RNG.standard_normal((2, 1, 8)).astype(np.float32) for _ in range(4)]
    want = [s.run(None, {"x": x}) for x in xs]
    bad, errors = [], []

    def worker(k):
        try:
            for _ in range(20):
                got = s.run(None, {"x": xs[k]})
                if not all(np.array_equal(g, w) for g, w in zip(got, want[k])):
                    bad.append(k)
        except Exception as e:  # reported below: an exception in a thread would not fail the test
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not bad
    assert s.cpu_round_trips()["pool_node"]["calls"] == 4 + 4 * 20


def test_runs_overlap_instead_of_waiting_for_each_other(monkeypatch):
    """Two runs that each wait, inside the run, for the other to have started can only finish side by side."""
    import threading
    from runtime import RunOptions
    from runtime.profiling import RunObserver
    s = InferenceSession(_tiny(), providers=CUDA)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    want = s.run(None, {"x": x})[0]
    both = threading.Barrier(2, timeout=5)
    seen, got, errors = [], [], []
    real = RunObserver.before

    def before(self, k):
        real(self, k)
        if k == 0:
            seen.append(threading.current_thread().name)
            both.wait()  # runs that take turns wait here until the barrier breaks (BrokenBarrierError after 5 s)

    def one():
        try:
            got.append(s.run(None, {"x": x}, RunOptions())[0])
        except Exception as e:
            errors.append(e)

    monkeypatch.setattr(RunObserver, "before", before)
    threads = [threading.Thread(target=one, name=f"run-{k}") for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert sorted(seen) == ["run-0", "run-1"] and len(got) == 2
    for g in got:
        np.testing.assert_array_equal(g, want)


def test_ortvalue_factories_place_cuda_devices_as_ort_device_names_them():
    from runtime import OrtValue
    a = np.arange(6, dtype=np.float32)
    for args in [("cuda", 0), ("gpu", 0, 0x10DE)]:  # an NVIDIA GPU, by name or by vendor
        v = OrtValue.ortvalue_from_numpy(a, *args)
        assert v.device_name() == "cuda" and rc.is_device_array(v.value())
        np.testing.assert_array_equal(v.numpy(), a)
    assert OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32, "cuda", 0).device_name() == "cuda"
    n = len(rc.cuda.gpus)
    with pytest.raises(CudaUnavailableError, match=f"CUDA device {n} does not exist; {n} found"):
        OrtValue.ortvalue_from_numpy(a, "cuda", n)


def test_control_flow_runs_its_subgraphs_on_the_device():
    """If, Loop and Scan run their bodies as child CUDA plans: a device condition read back once, a device value
    captured by the bodies, loop-carried and scan outputs stacked on the device; all equal to the CPU session."""
    v = lambda n, t=F, s=None: helper.make_tensor_value_info(n, t, s)  # noqa: E731
    then_g = helper.make_graph([helper.make_node("Mul", ["h", "two"], ["o"])], "then", [], [v("o", s=[3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["h"], ["o"])], "else", [], [v("o", s=[3])])
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "h"], ["acc2"]), helper.make_node("Identity", ["c"], ["c2"]),
         helper.make_node("Mul", ["acc2", "two"], ["scan_out"])],
        "body", [v("i", I64, []), v("c", TensorProto.BOOL, []), v("acc", s=[3])],
        [v("c2", TensorProto.BOOL, []), v("acc2", s=[3]), v("scan_out", s=[3])])
    sbody = helper.make_graph(
        [helper.make_node("Add", ["st", "xs"], ["st2"]), helper.make_node("Sub", ["xs", "st2"], ["ys"])],
        "sbody", [v("st", s=[3]), v("xs", s=[3])], [v("st2", s=[3]), v("ys", s=[3])])
    nodes = [helper.make_node("Relu", ["x"], ["h"]),
             helper.make_node("ReduceSum", ["h"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "one"], ["cond"]),
             helper.make_node("If", ["cond"], ["y_if"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Loop", ["trip", "", "h"], ["y_acc", "y_scan"], body=body),
             helper.make_node("Scan", ["h", "xs"], ["s_st", "s_ys"], body=sbody, num_scan_inputs=1,
                              scan_input_axes=[1], scan_output_axes=[1])]
    m = _model(nodes, [v("x", s=[3]), v("xs", s=[3, 4]), v("trip", I64, [])],
               [v("y_if", s=[3]), v("y_acc", s=[3]), v("y_scan", s=[None, 3]), v("s_st", s=[3]),
                v("s_ys", s=[3, 4])],
               [("one", np.array(1.0, np.float32)), ("two", np.array(2.0, np.float32))])
    xs = RNG.standard_normal((3, 4)).astype(np.float32)
    for x in (np.array([1.0, -2.0, 3.0], np.float32), np.array([0.1, -2.0, 0.2], np.float32)):  # then, else
        for trip in (3, 0):
            s = _both(m, {"x": x, "xs": xs, "trip": np.array(trip, np.int64)})
    assert [k for k, p in s.get_placement().items() if p != "cuda"] == []
