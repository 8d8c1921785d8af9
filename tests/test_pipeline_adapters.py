"""LoRA adapters (``pipeline/adapters.py``) and the decoder's extra inputs, against onnxruntime-genai in the same
test.  The tiny llama package is rewritten as onnxruntime-genai's own adapter test rewrites its model: two vectors
``adapter_a`` and ``adapter_b`` (graph inputs with zero initializers) added to the logits; adapter files are written
with ``onnxruntime.AdapterFormat``.  A batch of three prompts decodes to the same tokens as onnxruntime-genai's with
no adapter, one file holding both parameters, and two files holding one each."""
import gc
import os
import shutil

import numpy as np
import onnx
import onnxruntime
import pytest

import pipeline as pg
from pipeline.adapters import read_adapter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(ROOT, "fixtures", "packages", "llama_fp32")
VOCAB = 512
PROMPTS = [[285, 79, 339, 321], [5, 9, 13, 100, 7], [7, 2, 20]]


def _rewrite(folder, extra=None):
    """The package in ``folder`` with adapter inputs added to its logits (``extra``: also a scalar int64 input of
    that name, cast and added, as onnxruntime-genai's preset-input test does)."""
    shutil.copytree(LLAMA, folder)
    path = os.path.join(folder, "model.onnx")
    model = onnx.load(path)
    for node in model.graph.node:
        if "logits" in node.output:
            node.output[list(node.output).index("logits")] = "logits_0"
    for name in ("adapter_a", "adapter_b"):
        model.graph.input.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [VOCAB]))
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(VOCAB, np.float32), name))
    nodes = [onnx.helper.make_node("Add", ["adapter_a", "adapter_b"], ["adapter_sum"]),
             onnx.helper.make_node("Add", ["adapter_sum", "logits_0"], ["logits" if extra is None else "logits_1"])]
    if extra is not None:
        model.graph.input.append(onnx.helper.make_tensor_value_info(extra, onnx.TensorProto.INT64, []))
        nodes += [onnx.helper.make_node("Cast", [extra], ["extra_f"], to=onnx.TensorProto.FLOAT),
                  onnx.helper.make_node("Add", ["extra_f", "logits_1"], ["logits"])]
    model.graph.node.extend(nodes)
    os.remove(os.path.join(folder, "model.onnx.data"))
    onnx.save(model, path, save_as_external_data=True, location="model.onnx.data")
    return folder


def _write_adapter(path, params):
    fmt = onnxruntime.AdapterFormat()
    fmt.set_adapter_version(1)
    fmt.set_model_version(1)
    fmt.set_parameters({k: onnxruntime.OrtValue.ortvalue_from_numpy(v) for k, v in params.items()})
    fmt.export_adapter(path)
    return path


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    folder = _rewrite(str(root / "pkg"))
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(VOCAB).astype(np.float32) * 4 for _ in range(2))
    both = _write_adapter(str(root / "both.onnx_adapter"), {"adapter_a": a, "adapter_b": b})
    one = [_write_adapter(str(root / f"one_{k}.onnx_adapter"), {n: v})
           for k, (n, v) in enumerate((("adapter_a", a), ("adapter_b", b)))]
    return folder, {"none": [], "both": [both], "split": one}, (a, b)


def _decode(mod, model, files, n=6):
    adapters = mod.Adapters(model)
    for i, f in enumerate(files):
        adapters.load(f, f"adapter_{i}")
    params = mod.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPTS[1]) + n, batch_size=len(PROMPTS))
    g = mod.Generator(model, params)
    for i in range(len(files)):
        g.set_active_adapter(adapters, f"adapter_{i}")
    ids = np.zeros((len(PROMPTS), max(map(len, PROMPTS))), np.int32)
    for r, p in enumerate(PROMPTS):
        ids[r, :len(p)] = p
    g.append_tokens(ids)
    while not g.is_done():
        g.generate_next_token()
    return [g.get_sequence(r).tolist() for r in range(len(PROMPTS))]


@pytest.mark.parametrize("native", ["none", "all"])
@pytest.mark.parametrize("which", ["none", "both", "split"])
def test_adapters_decode_as_onnxruntime_genai(package, ort_genai, which, native):
    folder, files, _ = package
    ref = _decode(ort_genai, ort_genai.Model(folder), files[which])
    assert _decode(pg, pg.Model(folder, native=native), files[which]) == ref
    if which == "both":
        assert ref != _decode(ort_genai, ort_genai.Model(folder), [])  # the adapter changes the tokens


def test_adapter_file_reads_back(package):
    _, files, (a, b) = package
    got = read_adapter(files["both"][0])
    assert sorted(got) == ["adapter_a", "adapter_b"]
    np.testing.assert_array_equal(got["adapter_a"], a)
    np.testing.assert_array_equal(got["adapter_b"], b)


def test_adapter_refusals_say_what_onnxruntime_genai_says(package, ort_genai, tmp_path):
    folder, files, _ = package
    found = []
    for mod in (ort_genai, pg):
        model = mod.Model(folder)
        adapters = mod.Adapters(model)
        adapters.load(files["both"][0], "x")
        messages = []
        for call in (lambda: adapters.load(files["both"][0], "x"), lambda: adapters.unload("nope")):
            with pytest.raises(RuntimeError) as e:
                call()
            messages.append(str(e.value))
        g = mod.Generator(model, mod.GeneratorParams(model))
        g.set_active_adapter(adapters, "x")
        with pytest.raises(RuntimeError) as e:
            adapters.unload("x")
        messages.append(str(e.value))
        with pytest.raises(RuntimeError) as e:
            g.set_active_adapter(mod.Adapters(model), "x")
        messages.append(str(e.value))
        del e, g  # the exception's traceback holds the generator too
        gc.collect()
        adapters.unload("x")  # free once its generator is gone
        found.append(messages)
    assert found[1] == found[0]
    bad = tmp_path / "bad.onnx_adapter"
    bad.write_bytes(b"\x08\x00\x00\x00XXXX" + bytes(16))
    with pytest.raises(RuntimeError, match="not an onnxruntime adapter file"):
        pg.Adapters(pg.Model(folder)).load(str(bad), "bad")


@pytest.mark.parametrize("extra", ["num_logits_to_keep", "onnx::Neg_67", "abcde"])
def test_preset_extra_inputs(tmp_path, ort_genai, extra):
    """onnxruntime-genai fills a decoder input named ``num_logits_to_keep`` (or ``onnx::Neg_*``) with 0 and reports
    any other input nothing provides as missing; ``set_model_input`` provides one."""
    folder = _rewrite(str(tmp_path / "pkg"), extra)
    results = []
    for mod, kw in ((ort_genai, {}), (pg, {"native": "none"}), (pg, {"native": "all"})):
        model = mod.Model(folder, **kw)
        params = mod.GeneratorParams(model)
        params.set_search_options(max_length=12)
        g = mod.Generator(model, params)
        try:
            g.append_tokens(np.array([PROMPTS[0]], np.int32))
            while not g.is_done():
                g.generate_next_token()
            results.append(g.get_sequence(0).tolist())
        except RuntimeError as e:
            results.append(f"Missing Input: {extra}" in str(e))
    assert results[1] == results[2] == results[0]
    if extra == "abcde":
        g = pg.Generator(pg.Model(folder, native="all"), pg.GeneratorParams(pg.Model(folder, native="all")))
        g.set_model_input("abcde", np.array(0, np.int64))
        g.append_tokens(np.array([PROMPTS[0]], np.int32))
        g.generate_next_token()
