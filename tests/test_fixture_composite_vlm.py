"""The composite VLM fixture: it builds, its closed form gives EXPECTED, and so do its ONNX files under onnxruntime."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from fixtures import composite_vlm as vlm


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return vlm.build_package(str(tmp_path_factory.mktemp("composite_vlm")))


def test_package_builds(package):
    for name in ("vision_encoder.onnx", "embedding.onnx", "decoder.onnx", "inference_metadata.yaml",
                 "tokenizer.json"):
        assert os.path.isfile(os.path.join(package, name)), name
    import onnx
    for name in ("vision_encoder", "embedding", "decoder"):
        m = onnx.load(os.path.join(package, f"{name}.onnx"))
        assert [(o.domain, o.version) for o in m.opset_import] == [("", vlm.OPSET)]
        assert vlm.OPSET >= 17
        assert all(n.domain == "" for n in m.graph.node)


def test_closed_form():
    feats = vlm.image_features(vlm.PIXELS)
    np.testing.assert_allclose(feats, np.array([[[4, 5, 6, 7]]], np.float32) / 12, rtol=1e-6)
    x = vlm.embed(np.array([vlm.PROMPT_IDS]), feats)
    np.testing.assert_allclose(x[0, -1], np.array([16, 5, 6, 19], np.float32) / 12, rtol=1e-6)
    np.testing.assert_allclose(vlm.logits(x)[0, -1] - vlm.LM_BIAS,
                               np.array([35, 16, 5, 6, 19, 21, 11, 25], np.float32) / 12, rtol=1e-6)
    assert vlm.greedy_reference() == vlm.EXPECTED == [0, 5, 6, 7]
    # An absent (zero-token) image contributes nothing, even on the placeholder.
    np.testing.assert_array_equal(vlm.embed(np.array([[7]]), np.zeros((1, 0, 4), np.float32)), vlm.EMBED[[[7]]])


def _sessions(package):
    import onnxruntime as ort
    return [ort.InferenceSession(os.path.join(package, f"{n}.onnx"), providers=["CPUExecutionProvider"])
            for n in ("vision_encoder", "embedding", "decoder")]


def test_onnxruntime_greedy(package):
    vision, embedding, decoder = _sessions(package)
    (feats,) = vision.run(None, {"pixel_values": vlm.PIXELS})
    assert feats.shape == (1, 1, 4)
    np.testing.assert_allclose(feats, vlm.image_features(vlm.PIXELS), rtol=1e-6)
    absent = np.zeros((1, 0, 4), np.float32)

    ids = np.array([vlm.PROMPT_IDS], np.int64)
    image = feats
    past_k = past_v = np.zeros((1, 1, 0, 4), np.float32)
    total, out = 0, []
    for _ in range(len(vlm.EXPECTED)):
        (x,) = embedding.run(None, {"input_ids": ids, "image_features": image})
        np.testing.assert_allclose(x, vlm.embed(ids, image), rtol=1e-6)
        total += ids.shape[1]
        logits, past_k_new, past_v_new = decoder.run(None, {
            "inputs_embeds": x, "attention_mask": np.ones((1, total), np.int64),
            "past_key_values.0.key": past_k, "past_key_values.0.value": past_v})
        assert logits.shape == (1, ids.shape[1], 8)
        # The cache is a real pass-through: present = concat(past, new).
        assert past_k_new.shape == (1, 1, total, 4)
        np.testing.assert_array_equal(past_k_new[:, :, :-ids.shape[1]], past_k)
        np.testing.assert_array_equal(past_v_new[:, :, -ids.shape[1]:], x[:, None])
        past_k, past_v = past_k_new, past_v_new
        tok = int(np.argmax(logits[0, -1]))
        out.append(tok)
        ids, image = np.array([[tok]], np.int64), absent
    assert out == vlm.EXPECTED
    assert vlm.EOS_TOKEN not in out


def test_metadata_structure(package):
    import yaml
    with open(os.path.join(package, "inference_metadata.yaml")) as f:
        meta = yaml.safe_load(f)
    p = meta["pipeline"]
    assert list(p["models"]) == ["vision_encoder", "embedding", "decoder"]
    for name, m in p["models"].items():
        assert m["type"] == name
        assert os.path.isfile(os.path.join(package, m["filename"]))
    assert p["models"]["embedding"]["io"]["token_input"] == "input_ids"
    assert p["models"]["embedding"]["io"]["optional_inputs"] == {
        "image_features": {"shape": [1, 0, 4], "dtype": "float32"}}
    dio = p["models"]["decoder"]["io"]
    assert dio["sequence_source"] == "inputs_embeds" and dio["inputs_embeds_input"] == "inputs_embeds"
    assert dio["logits_output"] == "logits" and dio["attention_mask_input"] == "attention_mask"
    assert dio["kv_inputs"] == ["past_key_values.0.key", "past_key_values.0.value"]
    assert dio["kv_outputs"] == ["present.0.key", "present.0.value"]
    assert p["dataflow"] == [
        {"from": "vision_encoder.image_features", "to": "embedding.image_features", "dtype": "float32"},
        {"from": "embedding.inputs_embeds", "to": "decoder.inputs_embeds", "dtype": "float32"}]
    s = p["strategy"]
    assert s["kind"] == "composite"
    assert [(st["name"], st["strategy"]["kind"], st["run_on"]) for st in s["stages"]] == [
        ("vision", "single_pass", "prompt_only"), ("embed", "single_pass", "every_step"),
        ("decode", "autoregressive", "every_step")]
    assert s["stages"][2]["strategy"] == {"kind": "autoregressive", "decoder": "decoder", "max_tokens": 4}
    assert p["eos_token_id"] not in vlm.EXPECTED

    # Dataflow ports and io names exist in the ONNX files.
    import onnx
    ports = {}
    for name, m in p["models"].items():
        g = onnx.load(os.path.join(package, m["filename"])).graph
        ports[name] = ({i.name for i in g.input}, {o.name for o in g.output})
    for e in p["dataflow"]:
        src, sport = e["from"].split(".", 1)
        dst, dport = e["to"].split(".", 1)
        assert sport in ports[src][1] and dport in ports[dst][0]
    assert set(dio["kv_inputs"]) | {"inputs_embeds", "attention_mask"} == ports["decoder"][0]
    assert set(dio["kv_outputs"]) | {"logits"} == ports["decoder"][1]


def test_tokenizer(package):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(package, "tokenizer.json"))
    assert tok.get_vocab_size() == 8
    assert tok.encode("t3 <image>").ids == vlm.PROMPT_IDS
    assert tok.decode(vlm.EXPECTED) == "t0 t5 t6 <image>"
    with open(os.path.join(package, "tokenizer.json")) as f:
        assert json.load(f)["model"]["type"] == "WordLevel"


def test_entry_point(tmp_path):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "pkg"
    subprocess.run([sys.executable, "-m", "fixtures.composite_vlm", str(out)], cwd=root, check=True,
                   capture_output=True)
    assert (out / "inference_metadata.yaml").is_file() and (out / "decoder.onnx").is_file()
