"""The model benchmark's offline parts: the manifest, the input recipes on a tiny model built in code, the
decoders, extraction from a wheel already in the cache, and the table.  Nothing here downloads or runs a
native session."""
import json
import math
import os
import zipfile

import numpy as np
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper

from tools import bench_models as B


def test_manifest_entries_are_pinned_named_once_and_complete():
    names = [e["name"] for e in B.MANIFEST]
    assert len(names) == len(set(names))
    for e in B.MANIFEST:
        assert set(e) == {"name", "req", "member", "inputs", "decode"}, e["name"]
        dist, _, version = e["req"].partition("==")
        assert dist and version and all(p.isdigit() for p in version.split(".")), e["req"]
        assert e["member"].endswith(".onnx") and not e["member"].startswith("/"), e["member"]
        assert e["inputs"] and all(callable(getattr(r, "make", None)) for r in e["inputs"].values()), e["name"]
        assert callable(e["decode"]), e["name"]


def tiny_model():
    """Token ids through a 7-row embedding, an image, a recurrent state and a sample rate, as graph inputs; one
    initializer that is also listed as an input (not to be fed)."""
    emb = numpy_helper.from_array(np.arange(7 * 3, dtype=np.float32).reshape(7, 3), "emb")
    g = h.make_graph(
        [h.make_node("Gather", ["emb", "ids"], ["e"]), h.make_node("Identity", ["x"], ["y"])], "tiny",
        [h.make_tensor_value_info("ids", T.INT64, [1, 5]), h.make_tensor_value_info("x", T.FLOAT, [1, 1, 8, 12]),
         h.make_tensor_value_info("state", T.FLOAT16, [2, 1, 4]), h.make_tensor_value_info("sr", T.INT64, []),
         h.make_tensor_value_info("emb", T.FLOAT, [7, 3])],
        [h.make_tensor_value_info("e", T.FLOAT, [1, 5, 3]), h.make_tensor_value_info("y", T.FLOAT, [1, 1, 8, 12])],
        [emb])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_recipes_follow_the_model_inputs_types_and_vocabulary():
    recipes = {"ids": B.Tokens((1, 5)), "x": B.TextLine(8, 12, "7", "unit", channels=1),
               "state": B.Zeros((2, 1, 4)), "sr": B.Scalar(16000)}
    f = B.synthesize(recipes, tiny_model())
    assert set(f) == {"ids", "x", "state", "sr"}
    assert f["ids"].dtype == np.int64 and f["ids"].shape == (1, 5) and 2 <= f["ids"].min() and f["ids"].max() < 7
    assert f["x"].dtype == np.float32 and f["x"].shape == (1, 1, 8, 12) and 0 <= f["x"].min() < f["x"].max() <= 1
    assert f["state"].dtype == np.float16 and not f["state"].any()
    assert f["sr"].shape == () and f["sr"].dtype == np.int64 and int(f["sr"]) == 16000
    again = B.synthesize(recipes, tiny_model())
    assert all(np.array_equal(f[k], again[k]) for k in f)  # fixed seeds
    with pytest.raises(KeyError, match=r"no recipe for \['sr'\]"):
        B.synthesize({k: v for k, v in recipes.items() if k != "sr"}, tiny_model())
    with pytest.raises(KeyError, match=r"no input for \['other'\]"):
        B.synthesize(dict(recipes, other=B.Scalar(1)), tiny_model())


def test_images_audio_and_file_bytes_are_in_range():
    pm1 = B.Page(40, 32, "pm1").make(None)
    assert pm1.shape == (1, 3, 40, 32) and -1 <= pm1.min() < 0 < pm1.max() <= 1
    assert B.Page(40, 32, "raw").make(None).max() <= 255
    line = B.text_line(42, 120, "0123")
    assert line[:, :6].min() > 200 and line.min() < 40  # dark digits on light paper
    vad = B.Speech(3, frame=8, context=2).make(None)
    assert vad.shape == (3, 10) and np.abs(vad).max() <= 0.52
    assert not vad[0, :2].any() and np.array_equal(vad[1, :2], vad[0, -2:])  # silero's context framing
    fb = B.FileBytes(b"  ab\n", beg=4, end=3).make(None)
    assert fb.tolist() == [[97, 98, 256, 256, 256, 97, 98]]


def test_decoders():
    ctc = np.eye(4)[[0, 2, 2, 0, 2, 3, 3]][None]  # (1, steps, classes)
    assert B.CTC()([ctc]) == [2, 2, 3]
    assert B.Top1()([np.array([[0.1, 0.7, 0.2]])]) == [1]
    assert B.Above(0.5)([np.array([[0.2], [0.9]])]) == [0, 1]
    bitmap = np.zeros((1, 1, 6, 6))
    bitmap[0, 0, :2, :2] = bitmap[0, 0, 4:, 4:] = 0.9
    assert B.Regions(0.3)([bitmap]) == 2
    assert B.PicoDet(0.4, heads=2)([np.array([[[0.5, 0.1]]]), np.array([[[0.6, 0.7]]]), np.ones((1, 1, 8))]) == 3
    v8 = np.zeros((1, 6, 3))
    v8[0, 4:, 1] = (0.1, 0.3)
    assert B.YoloV8(0.2)([v8]) == 1
    yx = np.zeros((1, 2, 7))
    yx[0, :, 4] = (0.5, 0.9)
    yx[0, :, 5:] = ((0.1, 0.1), (0.5, 0.2))
    assert B.YoloX(0.1)([yx]) == 1
    assert B.Gated()([np.array([[0.9, -0.1]]), np.array([[[0, 3.0], [5.0, 0]]])]) == [1, 0]


def test_fetch_extracts_from_a_cached_wheel(tmp_path):
    """A wheel already in the cache is not downloaded again; its member lands under the cache once."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "some_pkg-1.2.0-py3-none-any.whl", "w") as z:
        z.writestr("some_pkg/m.onnx", b"model bytes")
    entry = {"name": "m", "req": "Some-Pkg==1.2.0", "member": "some_pkg/m.onnx"}
    path = B.fetch(entry, str(tmp_path))
    assert open(path, "rb").read() == b"model bytes" and path.startswith(str(tmp_path))
    assert B.fetch(entry, str(tmp_path)) == path
    assert not [f for f in os.listdir(os.path.dirname(path)) if f.endswith(".part")]
    with pytest.raises(FileNotFoundError, match="has no member some_pkg/other.onnx"):
        B.fetch(dict(entry, member="some_pkg/other.onnx"), str(tmp_path))
    assert B.locate(entry, "/nonexistent", str(tmp_path / "some_pkg-1.2.0")) == path  # --models-dir


def test_table_rows_errors_and_median():
    ok = B.Row("a", "p==1", "m.onnx", 0.5, 2.0, 3.0, 1.5, [1e-6, 0.0], [1], [1], True)
    slow = B.Row("b", "p==1", "m.onnx", 0.5, 2.0, 9.0, 1.0, [2e-6], [1], [2], False)
    bad = B.Row("c", "p==1", "m.onnx", error="UnsupportedOpError: no kernel for com.microsoft DynamicQuantizeLSTM")
    lines = B.table([ok, slow, bad]).splitlines()
    assert lines[0].split()[:3] == ["model", "load", "s"] and len(lines) == 5
    assert lines[1].split()[-3:] == ["2.00", "1.0e-06", "yes"] and lines[2].split()[-1] == "NO"
    assert "error: UnsupportedOpError: no kernel" in lines[3]
    assert lines[4] == "median ratio native/onnxruntime 5.50 over 2 of 3 models"
    assert B.summary([bad]) == "no model ran natively"
    row = B.Row("d", "p==1", "m.onnx")
    B.compare(row, B.Top1(), [np.array([[0.0, 1.0]]), np.zeros(2)], [np.array([[0.0, 1.5]]), np.zeros(3)])
    assert row.max_abs_diff[0] == 0.5 and math.isnan(row.max_abs_diff[1]) and row.agrees is False
    json.dumps(B.Row("e", "p==1", "m.onnx", error="x").__dict__)


def test_list_and_unknown_names(capsys):
    assert B.main(["--list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(B.MANIFEST)
    with pytest.raises(SystemExit):
        B.main(["--only", "no-such-model"])
