"""onnxruntime's module below its session class, as ``import runtime as ort``: LoRA adapter files
(``AdapterFormat``, ``LoraAdapter``, ``RunOptions.add_active_adapter``), the C layer's forms (``runtime.capi``,
``sess._sess``, ``OrtDevice`` arguments, DLPack), session options carried by the model (``ORT_LOAD_CONFIG_FROM_MODEL``),
external-data files given in memory, the provider assignment record and the provider-argument check.

onnxruntime itself is the reference wherever it runs the same call on a CPU build; models come from
``fixtures/ort_testdata.py``, the ones onnxruntime's own API tests open.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as ortstate

import runtime as ort
from fixtures import ort_testdata as td
from runtime import adapters
from runtime.capi import _pybind_state as C
from runtime.capi.onnxruntime_inference_collection import check_and_normalize_provider_args


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return td.build(str(tmp_path_factory.mktemp("ortdata")))


# -- adapter files ---------------------------------------------------------------------------------------------------
PARAMS = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.arange(5, dtype=np.int64),
          "empty": np.zeros((4, 0), np.float32), "h": np.linspace(-1, 1, 3).astype(np.float16)}


def test_adapter_files_are_onnxruntimes_format_both_ways(tmp_path):
    ours, theirs = str(tmp_path / "ours.onnx_adapter"), str(tmp_path / "theirs.onnx_adapter")
    fmt = ort.AdapterFormat()
    fmt.set_adapter_version(3)
    fmt.set_model_version(7)
    fmt.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in PARAMS.items()})
    fmt.export_adapter(ours)
    read = onnxruntime.AdapterFormat.read_adapter(ours)   # onnxruntime reads what we write
    assert (read.get_adapter_version(), read.get_model_version()) == (3, 7)
    got = {k: v.numpy() for k, v in read.get_parameters().items()}
    assert set(got) == set(PARAMS)
    for k, v in PARAMS.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k
    ref = onnxruntime.AdapterFormat()                       # and we read what onnxruntime writes
    ref.set_adapter_version(2)
    ref.set_model_version(5)
    ref.set_parameters({k: onnxruntime.OrtValue.ortvalue_from_numpy(v) for k, v in PARAMS.items()})
    ref.export_adapter(theirs)
    back = ort.AdapterFormat.read_adapter(theirs)
    assert (back.get_adapter_version(), back.get_model_version(), adapters.read_adapter(theirs).format_version) \
        == (2, 5, 1)
    for k, v in back.get_parameters().items():
        assert v.numpy().dtype == PARAMS[k].dtype and np.array_equal(v.numpy(), PARAMS[k]), k


def test_big_endian_parameters_are_stored_as_their_values(tmp_path):
    path = str(tmp_path / "be.onnx_adapter")
    value = np.arange(6, dtype=">f4").reshape(2, 3)
    adapters.write_adapter(path, {"w": value})
    got = onnxruntime.AdapterFormat.read_adapter(path).get_parameters()["w"].numpy()
    assert got.dtype == np.float32 and np.array_equal(got, value)


def test_damaged_adapter_files_are_refused_naming_them(tmp_path):
    path = str(tmp_path / "x.onnx_adapter")
    adapters.write_adapter(path, PARAMS)
    data = open(path, "rb").read()
    for bad in (data[:-8], data[:40]):
        open(path, "wb").write(bad)
        with pytest.raises(ort.InvalidArgumentError, match="x.onnx_adapter"):
            adapters.read_adapter(path)
    open(path, "wb").write(b"\0" * 4 + b"ONNX" + data[8:])
    with pytest.raises(ort.InvalidArgumentError, match="not an onnxruntime adapter file"):
        adapters.read_adapter(path)


def test_lora_adapter_feeds_its_parameters_for_runs_that_activate_it(data):
    model = os.path.join(data, "lora", "two_params_lora_model.onnx")
    adapter_file = os.path.join(data, "lora", "two_params_lora_model.onnx_adapter")
    x = {"input_x": np.ones((4, 4), np.float32)}
    sess, ref = ort.InferenceSession(model), onnxruntime.InferenceSession(model)
    plain = sess.run(None, x)[0]
    assert np.array_equal(plain, np.tile(np.float32([28, 32, 36, 40]), (4, 1)))
    ours, theirs = ort.LoraAdapter(), onnxruntime.LoraAdapter()
    ours.Load(adapter_file)
    theirs.Load(adapter_file)
    ro, rro = ort.RunOptions(), onnxruntime.RunOptions()
    ro.add_active_adapter(ours)
    rro.add_active_adapter(theirs)
    with_adapter = sess.run(None, x, ro)[0]
    assert np.array_equal(with_adapter, np.tile(np.float32([154, 176, 198, 220]), (4, 1)))
    assert np.array_equal(with_adapter, ref.run(None, x, rro)[0])
    assert np.array_equal(sess.run(None, x)[0], plain)     # the adapter belongs to that run's options only
    binding = sess.io_binding()
    binding.bind_cpu_input("input_x", x["input_x"])
    binding.bind_output("output")
    with pytest.raises(ort.NotSupportedError, match="active LoRA adapters"):  # never silently without it
        sess.run_with_iobinding(binding, ro)


# -- the C layer's forms ---------------------------------------------------------------------------------------------
def test_c_layer_session_binding_and_devices(data):
    sess = ort.InferenceSession(os.path.join(data, "mul_1.onnx"))
    x = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    cpu = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    value = C.OrtValue.ortvalue_from_numpy(x, cpu)
    assert value._get_c_value() is value._ortvalue
    vect = sess._sess.run_with_ort_values({"X": value._get_c_value()}, ["Y"], ortstate.RunOptions())
    assert isinstance(vect, C.OrtValueVector) and np.array_equal(vect[0].numpy(), x * x)
    bind = C.SessionIOBinding(sess._sess)
    bind.bind_ortvalue_input("X", value)
    bind.bind_output("Y", cpu)
    sess._sess.run_with_iobinding(bind, None)
    assert np.array_equal(bind.get_outputs()[0].numpy(), x * x)
    assert [m.name for m in sess.get_input_memory_infos() + sess.get_output_memory_infos()] == ["Cpu", "Cpu"]
    assert sess.get_input_epdevices() == [None]


def test_dlpack_shares_memory_and_keeps_the_element_type():
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    value = ort.OrtValue.ortvalue_from_numpy(x)
    capsule = value._ortvalue.to_dlpack()
    assert not C.is_dlpack_uint8_tensor(capsule)
    back = C.OrtValue.from_dlpack(capsule, False)
    assert back.data_ptr() == value.data_ptr() and np.array_equal(back.numpy(), x)
    assert value.__dlpack_device__() == (1, 0)
    for arr in (np.array([True, False, True]), np.array([1, 2, 255], np.uint8), np.zeros((1, 8, 0, 4), np.float32)):
        src = ort.OrtValue.ortvalue_from_numpy(arr)
        dst = ort.OrtValue.from_dlpack(src)
        assert dst.numpy().dtype == arr.dtype and dst.shape() == list(arr.shape)
        assert np.array_equal(dst.numpy(), arr)
    assert C.is_dlpack_uint8_tensor(np.array([1, 2], np.uint8).__dlpack__())
    assert not C.is_dlpack_uint8_tensor(np.array([True]).__dlpack__())
    as_bool = C.OrtValue.from_dlpack(np.array([0, 1], np.uint8).__dlpack__(), True)
    assert as_bool.numpy().dtype == np.bool_


# -- options carried by the model, files in memory -------------------------------------------------------------------
def test_session_options_from_the_models_ort_config(data, monkeypatch):
    path = os.path.join(data, "model_with_valid_ort_config_json.onnx")
    monkeypatch.delenv("ORT_LOAD_CONFIG_FROM_MODEL", raising=False)
    assert ort.InferenceSession(path).get_session_options().inter_op_num_threads == 0   # off unless asked
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "1")
    given = ort.SessionOptions()
    sess = ort.InferenceSession(path, given)
    got = sess.get_session_options()
    assert (got.inter_op_num_threads, got.intra_op_num_threads, got.enable_profiling) == (5, 2, True)
    assert got.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL and given.inter_op_num_threads == 0
    profile = sess.end_profiling()
    assert profile and os.path.exists(profile)
    os.remove(profile)
    model = onnx.load(path)
    model.metadata_props[0].value = '{"session_options": {"intra_op_num_threads": "two"}}'
    with pytest.raises(ort.InvalidArgumentError, match="intra_op_num_threads option in the model file must be an int"):
        ort.InferenceSession(model.SerializeToString())


def test_external_data_files_given_in_memory(data):
    path = os.path.join(data, "model_with_external_initializer_come_from_user.onnx")
    pads = np.array([0, 1, 0, 1], np.int64).tobytes()
    so = ort.SessionOptions()
    so.add_external_initializers_from_files_in_memory(["Pads_not_on_disk.bin"], [pads], [len(pads)])
    x = np.array([[2.0, 3.0]], np.float32)
    assert np.array_equal(ort.InferenceSession(path, so).run(None, {"X": x})[0], [[0, 2, 3, 0]])
    with pytest.raises(ort.ModelLoadError, match="Pads_not_on_disk.bin"):
        ort.InferenceSession(path)                           # not on disk, not given
    short = ort.SessionOptions()
    short.add_external_initializers_from_files_in_memory(["Pads_not_on_disk.bin"], [pads], [16])
    with pytest.raises(ort.ExternalDataRangeError, match="Pads_not_on_disk"):
        ort.InferenceSession(path, short)


# -- providers -------------------------------------------------------------------------------------------------------
def test_provider_graph_assignment_is_recorded_when_asked(data):
    path = os.path.join(data, "add_mul_add.onnx")
    with pytest.raises(ortstate.Fail, match="session.record_ep_graph_assignment_info"):
        ort.InferenceSession(path).get_provider_graph_assignment_info()
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    got = ort.InferenceSession(path, so).get_provider_graph_assignment_info()
    assert sorted(f"{n.domain}:{n.op_type}/{n.name}" for s in got for n in s.get_nodes()) == \
        [":Add/add_0", ":Add/add_1", ":Mul/mul_0"]
    assert {s.ep_name for s in got} == {"CPUExecutionProvider"}
    assert all(isinstance(s, ort.OrtEpAssignedSubgraph) and isinstance(n, ort.OrtEpAssignedNode)
               for s in got for n in s.get_nodes())


def test_fallback_is_never_on(data):
    sess = ort.InferenceSession(os.path.join(data, "mul_1.onnx"))
    sess.disable_fallback()
    with pytest.raises(ort.NotSupportedError, match="does not fall back"):
        sess.enable_fallback()
    assert ort.capi._pybind_state.SessionIOBinding is ort.SessionIOBinding


def test_provider_arguments_are_normalized_as_onnxruntime_does(data):
    valid = ["a", "b", "c"]
    assert check_and_normalize_provider_args(None, None, valid) == ([], [])
    assert check_and_normalize_provider_args([("a", {1: 2}), "b"], None, valid) == (["a", "b"], [{"1": "2"}, {}])
    assert check_and_normalize_provider_args(["a", "b"], [{1: 2}, {}], valid) == (["a", "b"], [{"1": "2"}, {}])
    with pytest.warns(UserWarning, match="Duplicate provider 'a'"):
        assert check_and_normalize_provider_args(["a", "b", "a"], [{"x": 1}, {}, {"y": 2}], valid) == \
            (["a", "b"], [{"x": "1"}, {}])
    for providers, options in ((3, None), ([3], None), (["a"], 3), (["a"], ["not dict"]), (["a", "b"], [{1: 2}]),
                               ([("a", {1: 2})], [{3: 4}])):
        with pytest.raises(ValueError):
            check_and_normalize_provider_args(providers, options, valid)
    sess = ort.InferenceSession(os.path.join(data, "mul_1.onnx"))
    with pytest.raises(RuntimeError, match="Unknown Provider Type: InvalidProvider"):
        sess.set_providers(["InvalidProvider"])


def test_external_data_folder_of_a_model_given_as_bytes(data):
    raw = open(os.path.join(data, "model_with_orig_ext_data.onnx"), "rb").read()
    x = {"X": np.array([[2.0, 3.0]], np.float32)}
    with pytest.raises(ort.ExternalDataPathError, match="not loaded from a"):
        ort.InferenceSession(raw)
    ours, theirs = ort.SessionOptions(), onnxruntime.SessionOptions()
    for so in (ours, theirs):
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", data)
    got = ort.InferenceSession(raw, ours).run(None, x)[0]
    assert np.array_equal(got, onnxruntime.InferenceSession(raw, theirs).run(None, x)[0])
    assert np.array_equal(got, np.array([[2, 4, 6], [3, 6, 9]], np.float32) + np.arange(6).reshape(2, 3))
