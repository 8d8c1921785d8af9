"""Loading: paths, bytes, ModelProto, external data (mapped, never copied) and its safety checks."""
import os
import signal

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession
from runtime.errors import ExternalDataPathError, ExternalDataRangeError, ModelLoadError
from runtime.loader import load_graph


def _model(weight=None):
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) if weight is None else weight, "W")
    g = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _save_external(m, folder, location="w.bin"):
    path = os.path.join(folder, "model.onnx")
    onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                    size_threshold=0)
    return path


def _set_location(path, location=None, offset=None, length=None):
    m = onnx.load(path, load_external_data=False)
    t = m.graph.initializer[0]
    for e in t.external_data:
        if e.key == "location" and location is not None:
            e.value = location
        if e.key == "offset" and offset is not None:
            e.value = str(offset)
        if e.key == "length" and length is not None:
            e.value = str(length)
    if offset is not None and not any(e.key == "offset" for e in t.external_data):
        t.external_data.add(key="offset", value=str(offset))
    onnx.save_model(m, path)


x = np.ones((3, 4), np.float32)
expected = x + np.arange(12, dtype=np.float32).reshape(3, 4)


def test_path_bytes_and_proto_agree(tmp_path):
    m = _model()
    p = str(tmp_path / "m.onnx")
    onnx.save_model(m, p)
    for src in (p, m, m.SerializeToString()):
        np.testing.assert_array_equal(InferenceSession(src).run(None, {"x": x})[0], expected)


def test_external_data_is_memory_mapped(tmp_path):
    path = _save_external(_model(), str(tmp_path))
    g = load_graph(path)
    w = g.initializers["W"]
    base = w
    while getattr(base, "base", None) is not None and not isinstance(base, np.memmap):
        base = base.base
    assert isinstance(base, np.memmap), "external weights must be views of a memory map"
    assert not w.flags.writeable
    np.testing.assert_array_equal(InferenceSession(path).run(None, {"x": x})[0], expected)


@pytest.mark.parametrize("location", ["../w.bin", "/etc/passwd", "sub/../../w.bin"])
def test_external_data_outside_folder_is_refused(tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    path = _save_external(_model(), str(folder))
    (tmp_path / "w.bin").write_bytes(b"\0" * 48)
    _set_location(path, location=location)
    with pytest.raises(ExternalDataPathError):
        InferenceSession(path)


def test_external_data_symlink_escape_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    path = _save_external(_model(), str(folder))
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"\0" * 48)
    os.symlink(outside, folder / "link.bin")
    _set_location(path, location="link.bin")
    with pytest.raises(ExternalDataPathError, match="outside the model folder"):
        InferenceSession(path)


def test_external_data_past_end_of_file_is_refused(tmp_path):
    path = _save_external(_model(), str(tmp_path))
    _set_location(path, offset=16)  # 48 bytes needed, only 32 remain
    with pytest.raises(ExternalDataRangeError):
        InferenceSession(path)
    _set_location(path, offset=0, length=4096)
    with pytest.raises(ExternalDataRangeError, match="past the end"):
        InferenceSession(path)


def test_external_data_from_bytes_has_no_folder(tmp_path):
    path = _save_external(_model(), str(tmp_path))
    with pytest.raises(ExternalDataPathError, match="not loaded from a path"):
        InferenceSession(open(path, "rb").read())


def test_malformed_models_are_refused(tmp_path):
    with pytest.raises(ModelLoadError):
        InferenceSession(b"\x08\x07garbage-that-is-not-protobuf\xff\xff")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model at all \xff\xfe")
    with pytest.raises(ModelLoadError):
        InferenceSession(str(bad))
    with pytest.raises(ModelLoadError, match="does not exist"):
        InferenceSession(str(tmp_path / "missing.onnx"))
    g = helper.make_graph([helper.make_node("Add", ["x", "nowhere"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    with pytest.raises(ModelLoadError, match="nowhere"):
        InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_model_local_functions_are_inlined():
    f = helper.make_function("local", "AddTwice", ["a", "b"], ["c"],
                             [helper.make_node("Add", ["a", "b"], ["t"]), helper.make_node("Add", ["t", "b"], ["c"])],
                             [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("AddTwice", ["x", "x"], ["y"], domain="local")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                          functions=[f])
    out = InferenceSession(m).run(None, {"x": np.array([1, 2], np.float32)})[0]
    np.testing.assert_array_equal(out, [3, 6])


def test_versions_newer_than_the_runtime_are_refused():
    import onnx as _onnx
    from runtime.loader import newest_opsets
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    newest = newest_opsets()[""]
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 99)])
    with pytest.raises(ModelLoadError, match=f"opset 99 of domain 'ai.onnx'; the newest this runtime supports is {newest}"):
        load_graph(m)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", newest)])
    m.ir_version = 99
    with pytest.raises(ModelLoadError, match=f"IR version is 99; the newest this runtime supports is {_onnx.IR_VERSION}"):
        load_graph(m)
    m.ir_version = _onnx.IR_VERSION
    load_graph(m)  # the newest ones load


def test_initializers_with_negative_dims_are_refused():
    t = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    t.dims[0] = -2
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [t])
    with pytest.raises(ModelLoadError, match=r"initializer 'w' has negative dimensions \[-2\]"):
        load_graph(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("node,inputs,why", [
    (helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=-2),
     [("x", TensorProto.FLOAT, [2, 3]), ("i", TensorProto.INT64, [2, 1])], "batch_dims must be >= 0, got -2"),
    (helper.make_node("Einsum", ["x"], ["y"], equation="..nii ->...i"), [("x", TensorProto.FLOAT, [2, 3, 3])],
     "is not an Einsum equation"),
    (helper.make_node("Split", ["x"], ["y", "z"], axis=0, num_outputs=3), [("x", TensorProto.FLOAT, [6])],
     "num_outputs is 3 but the node has 2 outputs"),
])
def test_nodes_that_crash_onnx_shape_inference_are_refused_before_it(node, inputs, why):
    """onnx's C++ shape inference segfaults on the first, hangs on the second and aborts on some builds on the
    third; the loader names the defect instead of calling it."""
    node.name = "bad"
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node.output]
    m = helper.make_model(helper.make_graph([node], "g", ins, outs), opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(ModelLoadError, match=f"node 'bad' \\({node.op_type}\\): .*{why}"):
        load_graph(m)
    # inside a subgraph too
    body = helper.make_graph([node], "body", [], outs)
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    outer = helper.make_graph([helper.make_node("If", ["c"], list(node.output), then_branch=body, else_branch=body)],
                              "g", [cond] + ins, outs)
    with pytest.raises(ModelLoadError, match=why):
        load_graph(helper.make_model(outer, opset_imports=[helper.make_opsetid("", 18)]))


# -- onnx's C++ runs isolated: a model that crashes or hangs it fails its own load, nothing else ---------------

STEPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "isolate_steps.py")


def test_isolated_steps_report_each_way_a_step_can_end():
    import signal
    from runtime import isolate
    from runtime.errors import OnnxCrashError
    assert isolate.call("answer", (b"answer",), "step", steps=STEPS) == b"answer"
    assert isolate.call("answer", (None,), "step", steps=STEPS) is None
    with pytest.raises(isolate.IsolatedStepError, match="ZeroDivisionError: integer division") as e:
        isolate.call("divide", (1, 0), "step", steps=STEPS)
    assert e.value.kind == "ZeroDivisionError"
    with pytest.raises(OnnxCrashError, match=r"onnx's step crashed on this model \(SIGABRT"):
        isolate.call("abort", (), "step", steps=STEPS)
    with pytest.raises(OnnxCrashError, match=r"onnx's step did not finish within 0.5 s"):
        isolate.call("sleep", (30,), "step", timeout=0.5, steps=STEPS)
    assert signal.getsignal(signal.SIGINT) is not None  # the caller carries on
    assert isolate.call("answer", (b"after",), "step", steps=STEPS) == b"after"


def test_isolated_steps_run_in_one_kept_worker_that_holds_none_of_the_callers_state():
    """The worker is a fresh interpreter kept between steps: a lock another thread of the caller holds is not
    held there (a forked child would wait on it until its deadline), and the worker runs no other thread."""
    import threading
    from runtime import isolate
    import isolate_steps
    first = isolate.call("pid", (), "step", steps=STEPS)
    assert first != os.getpid() and isolate.call("pid", (), "step", steps=STEPS) == first
    assert isolate.call("threads", (), "step", steps=STEPS) == 1
    held, done = threading.Event(), threading.Event()

    def hold():
        with isolate_steps.LOCK:
            held.set()
            done.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    try:
        held.wait(10)
        assert isolate.call("take_lock", (), "step", timeout=20, steps=STEPS) == "free"
    finally:
        done.set()
        t.join()


@pytest.mark.parametrize("node,inputs,how", [
    (helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=-2),
     [("x", TensorProto.FLOAT, [2, 3]), ("i", TensorProto.INT64, [2, 1])], r"crashed on this model \(SIGSEGV"),
    (helper.make_node("Einsum", ["x"], ["y"], equation="..nii ->...i"), [("x", TensorProto.FLOAT, [2, 3, 3])],
     "did not finish within 1 s"),
])
def test_a_model_that_crashes_or_hangs_onnx_fails_only_its_load(monkeypatch, node, inputs, how):
    """With the loader's own checks of these nodes turned off, onnx's shape inference meets them in a child
    process: it never returns on the Einsum; on the GatherND it reads out of range, which faults on most runs but
    not all (the read is undefined behaviour), so there the child's shape inference is made to fault for certain.
    The load fails with a named error and this process goes on loading and running models."""
    import runtime.isolate
    import runtime.loader
    from runtime.errors import OnnxCrashError
    monkeypatch.setattr(runtime.loader, "_node_defects", lambda n, opsets: None)
    if "SIGSEGV" in how:
        monkeypatch.setattr(runtime.isolate, "ONNX_STEPS", STEPS)  # its ``infer_shapes`` faults
    monkeypatch.setenv("ONNX_NUMBA_ISOLATE_TIMEOUT", "1")
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node.output]
    m = helper.make_model(helper.make_graph([node], "g", ins, outs), opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(OnnxCrashError, match=f"onnx's shape inference {how}"):
        InferenceSession(m)
    monkeypatch.undo()
    out = InferenceSession(_model()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(out, expected)


def test_inlining_keeps_the_initializers_data():
    """The inliner runs isolated on the model without initializer data; the data is put back by name."""
    f = helper.make_function("local", "AddTwice", ["a", "b"], ["c"],
                             [helper.make_node("Add", ["a", "b"], ["t"]), helper.make_node("Add", ["t", "b"], ["c"])],
                             [helper.make_opsetid("", 17)])
    w = numpy_helper.from_array(np.array([10, 20], np.float32), "W")
    g = helper.make_graph([helper.make_node("AddTwice", ["x", "W"], ["y"], domain="local")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                          functions=[f])
    out = InferenceSession(m).run(None, {"x": np.array([1, 2], np.float32)})[0]
    np.testing.assert_array_equal(out, [21, 42])


def test_weights_overwritten_midway_are_reported(tmp_path, monkeypatch):
    """Random bytes over the middle of a data file hold NaN as floats; the load names the tensor and the byte."""
    from runtime.errors import ExternalDataDamagedError
    weight = np.linspace(-1, 1, 4096, dtype=np.float32).reshape(64, 64)
    m = _model(weight)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 64
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 64
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 64
    m.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 64
    path = _save_external(m, str(tmp_path))
    InferenceSession(path)  # intact: loads
    data = tmp_path / "w.bin"
    raw = bytearray(data.read_bytes())
    raw[8000:9024] = np.random.default_rng(0).integers(0, 256, 1024, dtype=np.uint8).tobytes()
    data.write_bytes(bytes(raw))
    with pytest.raises(ExternalDataDamagedError, match=r"tensor 'W': element \d+ \(byte \d+ of 'w.bin'\) is NaN"):
        InferenceSession(path)
    monkeypatch.setenv("ONNX_NUMBA_CHECK_WEIGHTS", "0")  # the user's way out, named in the message
    InferenceSession(path)


def test_damage_no_value_check_can_see_is_caught_by_the_digest_record(tmp_path, monkeypatch):
    """int8 weights rewritten with other valid codes load silently; once the data file has a digest record
    (``runtime.digests``), the load names the tensor and the damaged byte range, and a file whose size changed
    is refused.  ``ONNX_NUMBA_CHECK_WEIGHTS=0`` loads anyway; a record that cannot be read or written is a
    warning."""
    import warnings
    from runtime import digests
    from runtime.errors import ExternalDataDamagedError
    rng = np.random.default_rng(3)
    a, b = (rng.integers(-100, 100, (64, 64), dtype=np.int8) for _ in range(2))
    g = helper.make_graph([helper.make_node("Add", ["x", "A"], ["t"]), helper.make_node("Add", ["t", "B"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.INT8, [64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.INT8, [64, 64])],
                          [numpy_helper.from_array(a, "A"), numpy_helper.from_array(b, "B")])
    path = _save_external(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path))
    x = np.zeros((64, 64), np.int8)
    expected = (a.astype(np.int16) + b).astype(np.int8)
    assert digests.record(path, chunk=1024) == [str(tmp_path / "w.bin") + digests.SUFFIX]
    np.testing.assert_array_equal(InferenceSession(path).run(None, {"x": x})[0], expected)  # intact: loads

    data = tmp_path / "w.bin"
    intact = data.read_bytes()
    off_b = next(int(e.value) for t in onnx.load(path, load_external_data=False).graph.initializer if t.name == "B"
                 for e in t.external_data if e.key == "offset")
    raw = bytearray(intact)
    raw[off_b + 2000:off_b + 2100] = bytes((v + 1) % 256 for v in raw[off_b + 2000:off_b + 2100])  # valid codes
    data.write_bytes(bytes(raw))
    lo = (off_b + 2000) // 1024 * 1024
    with pytest.raises(ExternalDataDamagedError,
                       match=rf"tensor 'B': bytes \[{lo}, {lo + 1024}\) of 'w.bin' differ from its digest record"):
        InferenceSession(path)
    monkeypatch.setenv("ONNX_NUMBA_CHECK_WEIGHTS", "0")  # the user's way out, named in the message
    assert not np.array_equal(InferenceSession(path).run(None, {"x": x})[0], expected)  # what the record caught
    monkeypatch.delenv("ONNX_NUMBA_CHECK_WEIGHTS")

    data.write_bytes(intact + b"\0" * 16)
    with pytest.raises(ExternalDataDamagedError, match=rf"'w.bin' holds {len(intact) + 16} bytes, but its digest "
                                                       rf"record .* says {len(intact)}"):
        InferenceSession(path)
    data.write_bytes(intact)
    (tmp_path / ("w.bin" + digests.SUFFIX)).write_text("{not json")
    with pytest.warns(RuntimeWarning, match="cannot be read; 'w.bin' loads unchecked"):
        InferenceSession(path)

    def refuse(*args):
        raise PermissionError("read-only folder")

    monkeypatch.setattr(digests.os, "replace", refuse)
    with pytest.warns(RuntimeWarning, match="could not write the digest record"):
        assert digests.record(path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "w.bin", "w.bin" + digests.SUFFIX]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the damaged record was left as it was: still a warning, not a failure
        with pytest.raises(RuntimeWarning):
            InferenceSession(path)


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    """Digest records, region modules and Numba's cached runtime module are written through ``write_atomic``."""
    from runtime import atomic
    path = tmp_path / "record.json"
    atomic.write_atomic(str(path), "old")
    atomic.write_atomic(str(path), b"new")
    assert path.read_bytes() == b"new"

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", refuse)
    with pytest.raises(OSError):
        atomic.write_atomic(str(path), "half")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["record.json"]
