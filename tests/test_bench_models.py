"""The model benchmark's offline parts: every manifest entry is pinned and names an .onnx member, and its feeds
come out with the shapes, dtypes and ranges the models take (no download here)."""
import numpy as np
import pytest

from tools import bench_models as B


def test_every_entry_is_pinned_and_names_a_model():
    for name, (req, member, spec) in B.MANIFEST.items():
        assert "==" in req and member.endswith(".onnx") and spec, name


def test_feeds_follow_the_spec_and_the_declared_types():
    spec = {"x": (1, 3, 4, 4), "sr": ("int", 16000), "state": ("zeros", (2, 1, 8)), "*": ("ids", (1, 5), 7)}
    f = B.feeds(spec, [("x", "tensor(float16)"), ("sr", "tensor(int64)"), ("state", "tensor(float)"),
                       ("tokens", "tensor(int32)")])
    assert f["x"].shape == (1, 3, 4, 4) and f["x"].dtype == np.float16 and np.abs(f["x"]).max() <= 1
    assert f["sr"].shape == () and int(f["sr"]) == 16000
    assert not f["state"].any() and f["state"].dtype == np.float32
    assert f["tokens"].dtype == np.int32 and f["tokens"].max() < 7 and f["tokens"].min() >= 0
    audio = B.feeds({"input": ("audio", (2, 8))}, [("input", "tensor(float)")])["input"]
    assert audio.shape == (2, 8) and np.abs(audio).max() <= 0.5
    with pytest.raises(KeyError, match="no feed for input 'other'"):
        B.feeds({"x": (1,)}, [("other", "tensor(float)")])


def test_list_prints_the_manifest(capsys):
    assert B.main(["--list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(B.MANIFEST)
