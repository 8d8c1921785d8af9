"""More of onnxruntime's module as ``import runtime as ort``: ``OrtDevice`` and ``OrtMemoryInfo`` (and the factories
of ``OrtValue`` that name devices), ``SparseTensor``, and the process-wide settings (logger callback and verbosity,
seed, global thread pools).  onnxruntime itself is the reference wherever it runs the same call on a CPU build;
tiny graphs built in code."""
from __future__ import annotations

import logging

import numba
import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto as T, helper as h
from onnxruntime.capi import onnxruntime_pybind11_state as ortstate

import runtime as ort
from runtime import environment


def _relu(shape=(2, 3)):
    m = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                                  [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                                  [h.make_tensor_value_info("y", T.FLOAT, list(shape))]),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def test_names_and_enums_match_onnxruntime():
    for name in ["OrtDevice", "OrtMemoryInfo", "SparseTensor", "set_default_logger_callback",
                 "set_default_logger_verbosity", "set_seed", "set_global_thread_pool_sizes"]:
        assert hasattr(ort, name) and hasattr(onnxruntime, name), name
    for enum in ["OrtAllocatorType", "OrtMemType", "OrtDeviceMemoryType", "OrtDeviceVendorId",
                 "OrtMemoryInfoDeviceType", "OrtSparseFormat"]:
        ours, theirs = getattr(ort, enum), getattr(onnxruntime, enum)
        assert {k: int(v) for k, v in ours.__members__.items()} == {k: int(v) for k, v in theirs.__members__.items()}


# -- OrtDevice, OrtMemoryInfo ----------------------------------------------------------------------------------------
def _accessors(d):
    return d.device_type(), d.device_id(), d.device_vendor_id(), d.device_mem_type()


@pytest.mark.parametrize("args", [("cpu", 0), ("cpu", 3, 5), ("cuda", 1), ("gpu", 0, 0x10DE), ("gpu", 2), ("npu", 0),
                                  ("dml", 0), ("cann", 1), ("webgpu", 0)])
def test_ort_device_make_matches_onnxruntime(args):
    ours = ort.OrtDevice.make(*args)
    assert _accessors(ours) == _accessors(onnxruntime.OrtDevice.make(*args))
    assert _accessors(ort.OrtDevice(ours._get_c_device())) == _accessors(ours)  # onnxruntime's C device and back


def test_ort_device_refusals_and_interop():
    with pytest.raises(RuntimeError, match="unsupported device type 'xpu'"):
        ort.OrtDevice.make("xpu", 0)
    with pytest.raises(Exception, match="Unsupported device type"):
        onnxruntime.OrtDevice.make("xpu", 0)
    # onnxruntime's own calls take our device (they read it through _get_c_device)
    st = onnxruntime.SparseTensor.sparse_coo_from_numpy([3], np.array([1.0], np.float32), np.array([1], np.int64),
                                                        ort.OrtDevice.make("cpu", 0))
    assert st.device_name() == "cpu"
    assert ort.OrtDevice(onnxruntime.OrtDevice.make("cuda", 1)) == ort.OrtDevice.make("cuda", 1)


def test_ortvalue_factories_read_devices_as_ort_device_does():
    a = np.arange(6, dtype=np.float32)
    v = ort.OrtValue.ortvalue_from_numpy(a, "cpu", 3)  # onnxruntime takes any CPU index
    assert v.device_name() == "cpu" and v.numpy() is a
    for args in [("gpu", 0, int(ort.OrtDeviceVendorId.AMD)), ("npu", 0), ("dml", 0)]:
        with pytest.raises(ort.NotSupportedError, match="CPU or an NVIDIA GPU"):
            ort.OrtValue.ortvalue_from_numpy(a, *args)
        with pytest.raises(ort.NotSupportedError, match="CPU or an NVIDIA GPU"):
            ort.OrtValue.ortvalue_from_shape_and_type([2], np.float32, *args)
    with pytest.raises(RuntimeError, match="unsupported device type"):
        ort.OrtValue.ortvalue_from_numpy(a, "xpu")


def _memory_fields(m):
    return (m.name, int(m.allocator_type), m.device_id, int(m.mem_type), int(m.device_mem_type), m.device_vendor_id)


@pytest.mark.parametrize("name,alloc,dev,mem", [("Cpu", 1, 2, 0), ("Cpu", 0, 0, -2), ("Cuda", 0, 1, -1),
                                                ("CudaPinned", 0, 0, 0)])
def test_ort_memory_info_matches_onnxruntime(name, alloc, dev, mem):
    ours = ort.OrtMemoryInfo(name, ort.OrtAllocatorType(alloc), dev, ort.OrtMemType(mem))
    theirs = onnxruntime.OrtMemoryInfo(name, onnxruntime.OrtAllocatorType(alloc), dev, onnxruntime.OrtMemType(mem))
    assert _memory_fields(ours) == _memory_fields(theirs)
    with pytest.raises(AttributeError):
        ours.name = "x"  # read-only, as onnxruntime's properties


def test_ort_memory_info_v2_and_refusals():
    for dtype, dm in [("GPU", "DEFAULT"), ("CPU", "HOST_ACCESSIBLE"), ("NPU", "DEFAULT")]:
        made = []
        for lib in (ort, onnxruntime):
            made.append(lib.OrtMemoryInfo.create_v2("m", lib.OrtMemoryInfoDeviceType.__members__[dtype], 0x10DE, 2,
                                                    lib.OrtDeviceMemoryType.__members__[dm], 64,
                                                    lib.OrtAllocatorType.ORT_ARENA_ALLOCATOR))
        assert _memory_fields(made[0]) == _memory_fields(made[1])
    with pytest.raises(RuntimeError, match="memory name 'cpu'.*'Cpu', 'Cuda', 'CudaPinned'"):
        ort.OrtMemoryInfo("cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    with pytest.raises(ValueError, match="mem_type must be an OrtMemType, got 7"):
        ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, 7)


# -- SparseTensor ----------------------------------------------------------------------------------------------------
VALS = np.array([1, 2, 3], np.float32)
DENSE = np.array([[0, 1, 0], [2, 0, 3]], np.float32)


def _coo(lib, indices):
    return lib.SparseTensor.sparse_coo_from_numpy(np.array([2, 3], np.int64), VALS, indices,
                                                  lib.OrtDevice.make("cpu", 0))


def _csr(lib, inner, outer):
    return lib.SparseTensor.sparse_csr_from_numpy([2, 3], VALS, inner, outer, lib.OrtDevice.make("cpu", 0))


@pytest.mark.parametrize("indices", [np.array([1, 3, 5], np.int64), np.array([[0, 1], [1, 0], [1, 2]], np.int64)])
def test_sparse_coo_matches_onnxruntime(indices):
    ours, theirs = _coo(ort, indices), _coo(onnxruntime, indices)
    assert int(ours.format()) == int(theirs.format()) == int(ort.OrtSparseFormat.ORT_SPARSE_COO)
    for f in ("dense_shape", "data_type", "device_name"):
        assert getattr(ours, f)() == getattr(theirs, f)(), f
    for mine, ref, src in [(ours.values(), theirs.values(), VALS),
                           (ours.as_coo_view().indices(), theirs.as_coo_view().indices(), indices)]:
        np.testing.assert_array_equal(mine, ref)
        assert np.shares_memory(mine, src) and not mine.flags.writeable  # zero-copy, read-only, as onnxruntime
    np.testing.assert_array_equal(ours.to_dense(), DENSE)


def test_sparse_csr_matches_onnxruntime():
    inner, outer = np.array([1, 0, 2], np.int64), np.array([0, 1, 3], np.int64)
    ours, theirs = _csr(ort, inner, outer), _csr(onnxruntime, inner, outer)
    assert int(ours.format()) == int(theirs.format()) == int(ort.OrtSparseFormat.ORT_SPARSE_CSRC)
    assert ours.dense_shape() == theirs.dense_shape() and ours.data_type() == theirs.data_type()
    np.testing.assert_array_equal(ours.as_csrc_view().inner(), theirs.as_csrc_view().inner())
    np.testing.assert_array_equal(ours.as_csrc_view().outer(), theirs.as_csrc_view().outer())
    np.testing.assert_array_equal(ours.to_dense(), DENSE)
    strings = ort.SparseTensor.sparse_coo_from_numpy([3], np.array(["a", "b"]), np.array([0, 2]),
                                                     ort.OrtDevice.make("cpu", 0))
    assert strings.data_type() == "sparse_tensor(string)" and list(strings.values()) == ["a", "b"]


def test_sparse_refusals_name_the_defect():
    with pytest.raises(ort.InvalidArgumentError, match="3 linear indices or 6 .* got 2"):
        _coo(ort, np.array([1, 3], np.int64))
    with pytest.raises(ort.IndexOutOfRangeError, match="linear index 9 lies outside dense shape"):
        _coo(ort, np.array([1, 3, 9], np.int64))  # onnxruntime accepts it and leaves the damage to a kernel
    with pytest.raises(ort.InvalidArgumentError, match="rows \\+ 1 = 3 entries, got 2"):
        _csr(ort, np.array([1, 0, 2]), np.array([0, 1]))
    with pytest.raises(ort.InvalidArgumentError, match="never decrease"):
        _csr(ort, np.array([1, 0, 2]), np.array([0, 3, 3])[::-1].copy())
    st = _coo(ort, np.array([1, 3, 5], np.int64))
    with pytest.raises(ort.InvalidArgumentError, match="COO format, not CSR"):
        st.as_csrc_view()
    with pytest.raises(RuntimeError, match="live on the CPU"):  # onnxruntime's CPU build refuses with RuntimeError
        st.to_cuda(ort.OrtDevice.make("cuda", 0))
    with pytest.raises(RuntimeError, match="live on the CPU"):
        ort.SparseTensor.sparse_coo_from_numpy([3], VALS[:1], np.array([0]), ort.OrtDevice.make("cuda", 0))


def test_sparse_ortvalue_and_feeding_it():
    st = _coo(ort, np.array([1, 3, 5], np.int64))
    ov = ort.OrtValue.ort_value_from_sparse_tensor(st)
    ref = onnxruntime.OrtValue.ort_value_from_sparse_tensor(_coo(onnxruntime, np.array([1, 3, 5], np.int64)))
    for f in ("is_sparse_tensor", "is_tensor", "data_type", "device_name", "shape", "element_type", "has_value"):
        assert getattr(ov, f)() == getattr(ref, f)(), f
    assert ov.as_sparse_tensor() is st
    with pytest.raises(ortstate.InvalidArgument, match="sparse tensor"):
        ov.numpy()
    with pytest.raises(ortstate.InvalidArgument, match="does not hold a sparse tensor; it holds tensor\\(float\\)"):
        ort.OrtValue.ortvalue_from_numpy(VALS).as_sparse_tensor()
    # a session refuses it where a tensor is expected, as onnxruntime does (InvalidArgument)
    with pytest.raises(ortstate.InvalidArgument, match="received a sparse tensor"):
        onnxruntime.InferenceSession(_relu(), providers=["CPUExecutionProvider"]).run_with_ort_values(
            None, {"x": ref})
    s = ort.InferenceSession(_relu())
    msg = r"input 'x': expected tensor\(float\), got a sparse tensor \(sparse_tensor\(float\)\)"
    with pytest.raises(ortstate.InvalidArgument, match=msg):
        s.run_with_ort_values(None, {"x": ov})
    with pytest.raises(ortstate.InvalidArgument, match=msg):
        s.io_binding().bind_ortvalue_input("x", ov)
    np.testing.assert_array_equal(s.run(None, {"x": st.to_dense()})[0], DENSE)


# -- process-wide settings -------------------------------------------------------------------------------------------
@pytest.fixture
def _restore_environment():
    yield
    ort.set_default_logger_callback(None)
    ort.set_default_logger_severity(2)
    ort.set_global_thread_pool_sizes(0, 0)


def test_logger_callback_gets_records_with_onnxruntimes_signature(_restore_environment):
    theirs = []
    onnxruntime.set_default_logger_callback(lambda *a: theirs.append(a), 1)
    try:
        so = onnxruntime.SessionOptions()
        so.logid = "cb"
        onnxruntime.InferenceSession(_relu(), so, providers=["CPUExecutionProvider"])
    finally:
        onnxruntime.set_default_logger_callback(None)
        onnxruntime.set_default_logger_severity(2)
    got = []

    def callback(*args):
        got.append(args)
        logging.getLogger("onnx_numba.session.cb").warning("from the callback")  # no recursion

    ort.set_default_logger_callback(callback, 1)
    so = ort.SessionOptions()
    so.logid = "cb"
    ort.InferenceSession(_relu(), so)
    ref = [a for a in theirs if a[2] == "cb"][0]
    mine = [a for a in got if "nodes planned" in a[4]]
    assert len(mine) == 1
    sev, category, logid, where, _ = mine[0]
    assert [type(x) for x in mine[0]] == [type(x) for x in ref]
    assert (sev, category, logid) == (1, ref[1], "cb") and where.startswith("session.py:")
    assert not [a for a in got if a[4] == "from the callback"]
    n = len(got)
    ort.set_default_logger_callback(None)
    ort.InferenceSession(_relu(), so)
    assert len(got) == n  # removed
    with pytest.raises(RuntimeError, match="between 0 .* and 4"):
        ort.set_default_logger_callback(callback, 7)
    with pytest.raises(TypeError, match="callable"):
        ort.set_default_logger_callback(3)


def test_set_seed_makes_unseeded_random_ops_repeat(monkeypatch):
    """onnxruntime seeds a random node without a ``seed`` attribute from its global seed: after ``set_seed``,
    two sessions of such a node draw the same numbers (as onnxruntime's do); without it they differ."""
    m = h.make_model(h.make_graph([h.make_node("RandomNormal", [], ["y"], shape=[64])], "g", [],
                                  [h.make_tensor_value_info("y", T.FLOAT, [64])]),
                     opset_imports=[h.make_opsetid("", 17)])
    mb = m.SerializeToString()
    monkeypatch.setitem(environment._state, "seed", None)

    def draws(api):
        providers = ["CPUExecutionProvider"]
        return [api.InferenceSession(mb, providers=providers).run(None, {})[0] for _ in range(2)]
    a, b = draws(ort)
    assert not np.array_equal(a, b)
    for api in (ort, onnxruntime):
        api.set_seed(1234)
        a, b = draws(api)
        np.testing.assert_array_equal(a, b)
    ort.set_default_logger_verbosity(3)
    assert environment.default_logger_verbosity() == 3
    ort.set_default_logger_verbosity(0)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two Numba threads to tell 1 from the default")
def test_global_thread_pool_sizes_apply_to_sessions_without_their_own(numba_threads_seen, _restore_environment):
    seen = numba_threads_seen
    ort.set_global_thread_pool_sizes(intra_op_num_threads=1)
    shared = ort.SessionOptions()
    shared.use_per_session_threads = False
    shared.intra_op_num_threads = 2  # onnxruntime ignores a session's own count when it uses the global pools
    x = {"x": np.ones((2, 3), np.float32)}
    ort.InferenceSession(_relu(), shared).run(None, x)
    ort.InferenceSession(_relu()).run(None, x)
    assert seen == [1, numba.get_num_threads()]
    with pytest.raises(ValueError, match="must be >= 0"):
        ort.set_global_thread_pool_sizes(-1, 0)


def test_callback_exceptions_do_not_reach_the_session(_restore_environment, monkeypatch):
    monkeypatch.setattr(logging, "raiseExceptions", False)  # handleError stays quiet

    def boom(*args):
        raise ValueError("callback failed")

    ort.set_default_logger_callback(boom, 1)
    s = ort.InferenceSession(_relu())
    np.testing.assert_array_equal(s.run(None, {"x": -DENSE})[0], np.zeros_like(DENSE))



def _overridable(ir_version=8):
    """Y = X + A * 2, where A is both a graph input and an initializer (onnxruntime's overridable initializer)."""
    from onnx import numpy_helper
    g = h.make_graph([h.make_node("Mul", ["A", "two"], ["A2"]), h.make_node("Add", ["X", "A2"], ["Y"])], "g",
                     [h.make_tensor_value_info("X", T.FLOAT, [3]), h.make_tensor_value_info("A", T.FLOAT, [3])],
                     [h.make_tensor_value_info("Y", T.FLOAT, [3])],
                     [numpy_helper.from_array(np.array([1, 2, 3], np.float32), "A"),
                      numpy_helper.from_array(np.array(2, np.float32), "two")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = ir_version
    return m.SerializeToString()


def test_overridable_initializers_are_listed_and_fed_as_onnxruntime_does():
    model = _overridable()
    ours = ort.InferenceSession(model)
    ref = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    describe = lambda s: ([i.name for i in s.get_inputs()],  # noqa: E731
                          [(i.name, i.type, i.shape) for i in s.get_overridable_initializers()])
    assert describe(ours) == describe(ref) == (["X"], [("A", "tensor(float)", [3])])
    x, a = np.ones(3, np.float32), np.array([5, -1, 0.5], np.float32)
    for feeds in ({"X": x}, {"X": x, "A": a}, {"X": x}):  # fed, then the initializer again when it is not
        np.testing.assert_array_equal(ours.run(None, feeds)[0], ref.run(None, feeds)[0])
    np.testing.assert_array_equal(ours.run(None, {"X": x, "A": a})[0], x + 2 * a)
    with pytest.raises(ortstate.InvalidArgument):  # a fed value is checked like any feed
        ours.run(None, {"X": x, "A": np.ones(4, np.float32)})
    old = ort.InferenceSession(_overridable(ir_version=3))  # before IR version 4 initializers are constants
    assert old.get_overridable_initializers() == []
