"""pipeline.metadata: genai_config.json and inference_metadata.yaml packages, rejections, text-only admission.

Every package is synthetic: tiny ONNX graphs whose only purpose is to carry the right input/output names.
"""
import json
import os

import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from pipeline.metadata import load_package
from pipeline.spec import AbsentValue, IncompletePackageError, MetadataError, StatePair

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _onnx(path, inputs, outputs):
    """A graph whose outputs are Identity copies of its first input: only the port names and shapes matter."""
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    outs = [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs]
    nodes = [helper.make_node("Identity", [inputs[0][0]], [o[0]]) for o in outputs]
    m = helper.make_model(helper.make_graph(nodes, "g", ins, outs), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path))


def _kv(i, past=True):
    shape = ["batch", 2, "past" if past else "total", 8]
    return (f"past_key_values.{i}.key", F, shape), (f"past_key_values.{i}.value", F, shape)


def _present(i):
    shape = ["batch", 2, "total", 8]
    return (f"present.{i}.key", F, shape), (f"present.{i}.value", F, shape)


def _genai_cfg(**decoder_over):
    dec = {"filename": "model.onnx", "head_size": 8, "hidden_size": 16, "num_attention_heads": 2,
           "num_hidden_layers": 2, "num_key_value_heads": 2,
           "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                      "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
           "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                       "present_value_names": "present.%d.value"}}
    dec.update(decoder_over)
    return {"model": {"bos_token_id": 1, "context_length": 256, "decoder": dec, "eos_token_id": [2, 5],
                      "pad_token_id": 3, "type": "llama", "vocab_size": 32},
            "search": {"diversity_penalty": 0.0, "do_sample": True, "early_stopping": True, "length_penalty": 1.0,
                       "max_length": 64, "min_length": 2, "no_repeat_ngram_size": 0, "num_beams": 1,
                       "num_return_sequences": 1, "past_present_share_buffer": True, "repetition_penalty": 1.1,
                       "temperature": 0.7, "top_k": 40, "top_p": 0.9}}


def _llama_pkg(d, cfg=None):
    ins = [("input_ids", I64, ["batch", "seq"]), ("attention_mask", I64, ["batch", "total"]), *_kv(0), *_kv(1)]
    outs = [("logits", F, ["batch", "seq", 32]), *_present(0), *_present(1)]
    _onnx(d / "model.onnx", ins, outs)
    (d / "genai_config.json").write_text(json.dumps(cfg or _genai_cfg()))
    (d / "tokenizer.json").write_text("{}")
    return d


# ------------------------------------------------------------------------------------------------ genai_config

def test_genai_config_llama(tmp_path):
    spec = load_package(_llama_pkg(tmp_path))
    assert spec.source == "genai_config" and spec.model_type == "llama"
    dec = spec.decoder
    assert dec.name == "decoder" and dec.type == "decoder" and dec.filename == str(tmp_path / "model.onnx")
    assert dec.io.token_input == "input_ids" and dec.io.logits_output == "logits"
    assert dec.io.attention_mask_input == "attention_mask" and dec.io.position_ids_input is None
    assert dec.io.kv_inputs == ["past_key_values.0.key", "past_key_values.0.value",
                                "past_key_values.1.key", "past_key_values.1.value"]
    assert dec.io.kv_outputs == ["present.0.key", "present.0.value", "present.1.key", "present.1.value"]
    assert dec.io.state_pairs == []
    assert [(s.name, s.kind, s.model, s.run_on, s.max_tokens) for s in spec.stages] == \
        [("decode", "autoregressive", "decoder", "every_step", None)]
    assert spec.eos_token_ids == [2, 5] and spec.bos_token_id == 1 and spec.pad_token_id == 3
    assert spec.context_length == 256 and spec.num_layers == 2 and spec.num_kv_heads == 2 and spec.head_size == 8
    s = spec.search
    assert (s.max_length, s.min_length, s.do_sample, s.top_k, s.top_p, s.temperature, s.repetition_penalty,
            s.past_present_share_buffer) == (64, 2, True, 40, 0.9, 0.7, 1.1, True)
    assert spec.tokenizer_dir == str(tmp_path) and spec.positions is None and not spec.text_only


def test_genai_config_int_eos_and_no_tokenizer(tmp_path):
    cfg = _genai_cfg()
    cfg["model"]["eos_token_id"] = 7
    _llama_pkg(tmp_path, cfg)
    os.remove(tmp_path / "tokenizer.json")
    spec = load_package(tmp_path / "genai_config.json")
    assert spec.eos_token_ids == [7] and spec.tokenizer_dir is None


def test_genai_config_hybrid_pairs_only_existing_layers(tmp_path):
    # qwen3.5 layout: layer 0 linear attention (conv + recurrent state), layer 1 full attention (KV cache)
    ins = [("input_ids", I64, ["batch", "seq"]), ("attention_mask", I64, ["batch", "total"]),
           ("position_ids", I64, [3, "batch", "seq"]), *_kv(1),
           ("past.0.conv", F, ["batch", 32, 3]), ("past.0.recurrent", F, ["batch", 2, 8, 8])]
    outs = [("logits", F, ["batch", "seq", 32]), *_present(1),
            ("present.0.conv", F, ["batch", 32, 3]), ("present.0.recurrent", F, ["batch", 2, 8, 8])]
    _onnx(tmp_path / "model.onnx", ins, outs)
    cfg = _genai_cfg()
    dec = cfg["model"]["decoder"]
    dec["inputs"].update(position_ids="position_ids", past_conv_names="past.%d.conv",
                         past_recurrent_names="past.%d.recurrent")
    dec["outputs"].update(present_conv_names="present.%d.conv", present_recurrent_names="present.%d.recurrent")
    cfg["model"]["type"] = "qwen3_5_text"
    (tmp_path / "genai_config.json").write_text(json.dumps(cfg))
    spec = load_package(tmp_path)
    io = spec.decoder.io
    assert io.kv_inputs == ["past_key_values.1.key", "past_key_values.1.value"]
    assert io.kv_outputs == ["present.1.key", "present.1.value"]
    assert io.state_pairs == [StatePair("past.0.conv", "present.0.conv"),
                              StatePair("past.0.recurrent", "present.0.recurrent")]
    assert spec.positions.input == "position_ids" and spec.positions.rank == 3
    assert spec.positions.continuation == "linear_increment"


def test_genai_config_hybrid_states_under_names_derived_from_the_kv_template(tmp_path):
    """onnxruntime-genai's qwen3.5 test package: the config names only the KV templates (and a position_ids
    the graph does not take); the states are past_key_values.N.conv_state / .recurrent_state, and the config's
    num_hidden_layers (1) undercounts the graph's layers (3)."""
    ins = [("input_ids", I64, ["batch", "seq"]), ("attention_mask", I64, ["batch", "total"]), *_kv(2),
           *[(f"past_key_values.{i}.{k}", F, ["batch", 4, 3]) for i in (0, 1) for k in ("conv_state",
                                                                                         "recurrent_state")]]
    outs = [("logits", F, ["batch", "seq", 32]), *_present(2),
            *[(f"present.{i}.{k}", F, ["batch", 4, 3]) for i in (0, 1) for k in ("conv_state", "recurrent_state")]]
    _onnx(tmp_path / "model.onnx", ins, outs)
    cfg = _genai_cfg(num_hidden_layers=1)
    cfg["model"]["decoder"]["inputs"]["position_ids"] = "position_ids"
    (tmp_path / "genai_config.json").write_text(json.dumps(cfg))
    spec = load_package(tmp_path)
    io = spec.decoder.io
    assert spec.num_layers == 3 and io.position_ids_input is None
    assert io.kv_inputs == ["past_key_values.2.key", "past_key_values.2.value"]
    assert io.state_pairs == [StatePair(f"past_key_values.{i}.{k}", f"present.{i}.{k}")
                              for i in (0, 1) for k in ("conv_state", "recurrent_state")]


def test_genai_config_layer_without_cache_is_incomplete(tmp_path):
    """Caches for layers 0 and 2: layer 1 has none."""
    ins = [("input_ids", I64, ["batch", "seq"]), ("attention_mask", I64, ["batch", "total"]), *_kv(0), *_kv(2)]
    outs = [("logits", F, ["batch", "seq", 32]), *_present(0), *_present(2)]
    _onnx(tmp_path / "model.onnx", ins, outs)
    (tmp_path / "genai_config.json").write_text(json.dumps(_genai_cfg()))
    with pytest.raises(IncompletePackageError, match=r"layers \[1\]"):
        load_package(tmp_path)


def test_genai_config_missing_decoder_file(tmp_path):
    (tmp_path / "genai_config.json").write_text(json.dumps(_genai_cfg()))
    with pytest.raises(IncompletePackageError, match="model.decoder.filename"):
        load_package(tmp_path)


def test_genai_config_filename_escaping_package(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    _llama_pkg(pkg)
    os.replace(pkg / "model.onnx", tmp_path / "model.onnx")
    (pkg / "genai_config.json").write_text(json.dumps(_genai_cfg(filename="../model.onnx")))
    with pytest.raises(IncompletePackageError, match="escapes"):
        load_package(pkg)
    (pkg / "genai_config.json").write_text(json.dumps(_genai_cfg(filename=str(tmp_path / "model.onnx"))))
    with pytest.raises(IncompletePackageError, match="absolute"):
        load_package(pkg)


def test_genai_config_beam_search_is_read_and_checked(tmp_path):
    cfg = _genai_cfg()
    cfg["search"].update(num_beams=4, num_return_sequences=2, length_penalty=0.5, early_stopping=False)
    _llama_pkg(tmp_path, cfg)
    s = load_package(tmp_path).search
    assert (s.num_beams, s.num_return_sequences, s.length_penalty, s.early_stopping) == (4, 2, 0.5, False)
    cfg["search"]["num_return_sequences"] = 5
    _llama_pkg(tmp_path, cfg)
    with pytest.raises(MetadataError, match="search.num_return_sequences"):
        load_package(tmp_path)
    cfg["search"].update(num_return_sequences=1, num_beams=2.5)
    _llama_pkg(tmp_path, cfg)
    with pytest.raises(MetadataError, match="search.num_beams: expected int"):
        load_package(tmp_path)


def _vlm_genai(d, processor, kind="qwen2_5_vl"):
    """A split VLM as onnxruntime-genai configures Qwen2.5-VL: vision, embedding, decoder sections."""
    _onnx(d / "vision.onnx", [("pixel_values", F, ["patches", 12]), ("image_grid_thw", I64, ["images", 3])],
          [("image_features", F, ["image_tokens", 16])])
    _onnx(d / "embedding.onnx", [("input_ids", I64, ["batch", "seq"]), ("image_features", F, ["image_tokens", 16])],
          [("inputs_embeds", F, ["batch", "seq", 16])])
    ins = [("inputs_embeds", F, ["batch", "seq", 16]), ("attention_mask", I64, ["batch", "total"]),
           ("position_ids", I64, [3, "batch", "seq"]), *_kv(0), *_kv(1)]
    _onnx(d / "decoder.onnx", ins, [("logits", F, ["batch", "seq", 32]), *_present(0), *_present(1)])
    cfg = _genai_cfg(filename="decoder.onnx")
    dec_in = cfg["model"]["decoder"]["inputs"]
    del dec_in["input_ids"]
    dec_in.update(inputs_embeds="inputs_embeds", position_ids="position_ids")
    cfg["model"].update(type=kind, embedding={
        "filename": "embedding.onnx", "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
        "outputs": {"inputs_embeds": "inputs_embeds"}}, vision={
        "filename": "vision.onnx", "spatial_merge_size": 2,
        "inputs": {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"},
        "outputs": {"image_features": "image_features"}})
    (d / "genai_config.json").write_text(json.dumps(cfg))
    if processor is not None:
        (d / "processor_config.json").write_text(json.dumps(processor))
    return d


QWEN_PROCESSOR = {"processor": {"name": "qwen2_5_image_processor", "transforms": [
    {"operation": {"name": "decode_image", "type": "DecodeImage", "attrs": {"color_space": "RGB"}}},
    {"operation": {"name": "resize", "type": "Resize", "attrs": {"smart_resize": 1, "min_pixels": 3136,
                                                                 "max_pixels": 12845056}}}]}}


def test_genai_config_vlm_with_a_processor_keeps_vision_images_optional(tmp_path):
    """A type whose processor is implemented (pipeline/multimodal.py) keeps its vision side; a prompt may come
    without images (the embedding's image features then absent), and positions carry the image grid's maxima."""
    spec = load_package(_vlm_genai(tmp_path, QWEN_PROCESSOR))
    assert not spec.text_only and list(spec.components) == ["vision", "embedding", "decoder"]
    assert spec.components["embedding"].io.optional_inputs == {"image_features": AbsentValue([0, 16], "float32")}
    assert [(s.model, s.run_on) for s in spec.stages] == \
        [("vision", "prompt_only"), ("embedding", "every_step"), ("decoder", "every_step")]
    assert (spec.positions.rank, spec.positions.continuation) == (3, "carry_max")


def test_genai_config_vlm_admitted_text_only(tmp_path):
    spec = load_package(_vlm_genai(tmp_path, QWEN_PROCESSOR, kind="some_vl"))
    assert spec.text_only and "smart" in spec.text_only_reason
    assert list(spec.components) == ["embedding", "decoder"]
    emb, dec = spec.components["embedding"], spec.decoder
    assert emb.io.token_input == "input_ids"
    assert emb.io.optional_inputs == {"image_features": AbsentValue([0, 16], "float32")}
    assert dec.io.sequence_source == "inputs_embeds" and dec.io.inputs_embeds_input == "inputs_embeds"
    assert [(e.src, e.src_port, e.dst, e.dst_port) for e in spec.dataflow] == \
        [("embedding", "inputs_embeds", "decoder", "inputs_embeds")]
    assert [(s.kind, s.model, s.run_on) for s in spec.stages] == \
        [("single_pass", "embedding", "every_step"), ("autoregressive", "decoder", "every_step")]
    assert (spec.positions.input, spec.positions.rank, spec.positions.continuation) == \
        ("position_ids", 3, "linear_increment")


def test_genai_config_vlm_incomplete_still_refused(tmp_path):
    _vlm_genai(tmp_path, QWEN_PROCESSOR)
    os.remove(tmp_path / "vision.onnx")
    with pytest.raises(IncompletePackageError, match="model.vision.filename"):
        load_package(tmp_path)


# ------------------------------------------------------------------------------------------------ inference_metadata

def _composite(d, processor=QWEN_PROCESSOR):
    """vision -> embedding -> decoder composite; returns the yaml document (written by _write)."""
    _vlm_genai(d, processor)
    os.remove(d / "genai_config.json")
    (d / "tokenizer.json").write_text("{}")
    kv_in = [n for i in range(2) for n in (f"past_key_values.{i}.key", f"past_key_values.{i}.value")]
    kv_out = [n for i in range(2) for n in (f"present.{i}.key", f"present.{i}.value")]
    return {"pipeline": {
        "models": {
            "vision": {"filename": "vision.onnx", "type": "vision_encoder"},
            "embedding": {"filename": "embedding.onnx", "type": "embedding", "io": {"token_input": "input_ids"}},
            "decoder": {"filename": "decoder.onnx", "type": "decoder", "io": {
                "sequence_source": "inputs_embeds", "inputs_embeds_input": "inputs_embeds",
                "logits_output": "logits", "attention_mask_input": "attention_mask",
                "position_ids_input": "position_ids", "kv_inputs": kv_in, "kv_outputs": kv_out}}},
        "dataflow": [
            {"from": "vision.image_features", "to": "embedding.image_features", "dtype": "float32"},
            {"from": "embedding.inputs_embeds", "to": "decoder.inputs_embeds", "dtype": "float32"}],
        "strategy": {"kind": "composite", "stages": [
            {"name": "vision", "strategy": {"kind": "single_pass", "model": "vision"}, "run_on": "prompt_only"},
            {"name": "embed", "strategy": {"kind": "single_pass", "model": "embedding"}, "run_on": "every_step"},
            {"name": "decode", "strategy": {"kind": "autoregressive", "decoder": "decoder", "max_tokens": 32},
             "run_on": "every_step"}]},
        "positions": {"input": "position_ids", "rank": 3, "continuation": "carry_max"}},
        "search": {"max_length": 48, "do_sample": False}, "eos_token_id": [2], "bos_token_id": 1,
        "context_length": 128, "tokenizer": "."}


def _write(d, doc):
    (d / "inference_metadata.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


def _text_composite(d):
    """embedding -> decoder composite (no vision): loads without admission."""
    doc = _composite(d)
    p = doc["pipeline"]
    del p["models"]["vision"]
    p["dataflow"] = p["dataflow"][1:]
    p["strategy"]["stages"] = p["strategy"]["stages"][1:]
    p["models"]["embedding"]["io"]["optional_inputs"] = {"image_features": {"shape": [0, 16], "dtype": "float32"}}
    return doc


def test_composite_loads(tmp_path):
    spec = load_package(_write(tmp_path, _text_composite(tmp_path)))
    assert spec.source == "inference_metadata" and not spec.text_only
    assert list(spec.components) == ["embedding", "decoder"]
    assert spec.components["embedding"].io.optional_inputs["image_features"] == AbsentValue([0, 16], "float32")
    assert spec.decoder.io.kv_outputs[1] == "present.0.value"
    assert spec.stages[-1].max_tokens == 32
    assert (spec.positions.rank, spec.positions.continuation) == (3, "carry_max")
    assert spec.search.max_length == 48 and spec.eos_token_ids == [2] and spec.context_length == 128
    assert spec.tokenizer_dir == str(tmp_path)


def test_composite_vlm_admitted_text_only(tmp_path):
    spec = load_package(_write(tmp_path, _composite(tmp_path)))
    assert spec.text_only
    assert "vision" not in spec.components and all("vision" not in (e.src, e.dst) for e in spec.dataflow)
    assert [s.name for s in spec.stages] == ["embed", "decode"]
    emb = spec.components["embedding"]
    assert emb.io.token_input == "input_ids"
    assert emb.io.optional_inputs == {"image_features": AbsentValue([0, 16], "float32")}
    assert (spec.positions.rank, spec.positions.continuation) == (3, "linear_increment")


def test_composite_vlm_with_representable_preprocessing_kept(tmp_path):
    fixed = {"processor": {"name": "gemma_3_image_processing", "transforms": [
        {"operation": {"name": "resize", "type": "Resize", "attrs": {"height": 64, "width": 64}}}]}}
    spec = load_package(_write(tmp_path, _composite(tmp_path, processor=fixed)))
    assert not spec.text_only and list(spec.components) == ["vision", "embedding", "decoder"]
    assert len(spec.dataflow) == 2


def test_composite_incomplete_vlm_refused_not_admitted(tmp_path):
    doc = _composite(tmp_path)
    os.remove(tmp_path / "vision.onnx")
    with pytest.raises(IncompletePackageError, match="pipeline.models.vision.filename"):
        load_package(_write(tmp_path, doc))


def _mutate(path, value):
    """Set (or with value=KeyError, delete) the key at a dotted path; list items are [i]."""
    def fn(doc):
        keys = path.split(".")
        node = doc
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        last = keys[-1]
        if value is KeyError:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return fn


REJECTIONS = [
    ("unknown top-level key", _mutate("colour", "blue"), "colour"),
    ("unknown io key", _mutate("pipeline.models.decoder.io.kv_cache", []), r"pipeline\.models\.decoder\.io\.kv_cache"),
    ("unknown model key", _mutate("pipeline.models.embedding.precision", "fp16"),
     r"pipeline\.models\.embedding\.precision"),
    ("kv lists of different lengths", _mutate("pipeline.models.decoder.io.kv_outputs", ["present.0.key"]),
     r"pipeline\.models\.decoder\.io\.kv_inputs"),
    ("inputs_embeds without inputs_embeds_input", _mutate("pipeline.models.decoder.io.inputs_embeds_input", KeyError),
     r"pipeline\.models\.decoder\.io\.inputs_embeds_input"),
    ("bad sequence_source", _mutate("pipeline.models.decoder.io.sequence_source", "pixels"),
     r"pipeline\.models\.decoder\.io\.sequence_source"),
    ("state pair init", _mutate("pipeline.models.decoder.io.state_pairs",
                                [{"input": "a", "output": "b", "init": "ones"}]),
     r"pipeline\.models\.decoder\.io\.state_pairs\[0\]\.init"),
    ("optional input negative shape", _mutate("pipeline.models.embedding.io.optional_inputs",
                                              {"image_features": {"shape": [-1, 16]}}),
     r"pipeline\.models\.embedding\.io\.optional_inputs\.image_features\.shape"),
    ("autoregressive decoder not a model", _mutate("pipeline.strategy.stages.1.strategy.decoder", "llm"),
     r"pipeline\.strategy\.stages\[1\]\.strategy\.decoder"),
    ("no autoregressive stage", _mutate("pipeline.strategy.stages.1", {
        "name": "x", "strategy": {"kind": "single_pass", "model": "decoder"}, "run_on": "final_only"}),
     r"pipeline\.strategy\.stages"),
    ("two autoregressive stages", _mutate("pipeline.strategy.stages.0", {
        "name": "x", "strategy": {"kind": "autoregressive", "decoder": "decoder"}, "run_on": "every_step"}),
     r"pipeline\.strategy\.stages"),
    ("bad run_on", _mutate("pipeline.strategy.stages.0.run_on", "sometimes"),
     r"pipeline\.strategy\.stages\[0\]\.run_on"),
    ("strategy kind", _mutate("pipeline.strategy.kind", "sequential"), r"pipeline\.strategy\.kind"),
    ("position rank", _mutate("pipeline.positions.rank", 2), r"pipeline\.positions\.rank"),
    ("position rank contradicts graph", _mutate("pipeline.positions.rank", 1), r"pipeline\.positions\.rank"),
    ("position continuation", _mutate("pipeline.positions.continuation", "jump"),
     r"pipeline\.positions\.continuation"),
    ("positions input contradicts io", _mutate("pipeline.positions.input", "pos"), r"pipeline\.positions\.input"),
    ("unknown search key", _mutate("search.beam_width", 3), r"search\.beam_width"),
    ("search out of range", _mutate("search.top_p", 0.0), r"search\.top_p"),
    ("bad edge endpoint", _mutate("pipeline.dataflow.0.from", "embedding"), r"pipeline\.dataflow\[0\]\.from"),
    ("missing filename", _mutate("pipeline.models.decoder.filename", KeyError),
     r"pipeline\.models\.decoder\.filename"),
    ("eos not int", _mutate("eos_token_id", ["</s>"]), "eos_token_id"),
]


@pytest.mark.parametrize("what,mutate,key", REJECTIONS, ids=[r[0] for r in REJECTIONS])
def test_composite_rejections(tmp_path, what, mutate, key):
    doc = _text_composite(tmp_path)
    mutate(doc)
    with pytest.raises(MetadataError, match=key):
        load_package(_write(tmp_path, doc))


INCOMPLETE = [
    ("missing component file", _mutate("pipeline.models.decoder.filename", "nope.onnx"),
     r"pipeline\.models\.decoder\.filename"),
    ("edge to unknown component", _mutate("pipeline.dataflow.0.to", "llm.inputs_embeds"),
     r"pipeline\.dataflow\[0\]\.to"),
    ("edge port not in graph", _mutate("pipeline.dataflow.0.from", "embedding.hidden"),
     r"pipeline\.dataflow\[0\]\.from"),
    ("edge port on the wrong side", _mutate("pipeline.dataflow.0.to", "decoder.logits"),
     r"pipeline\.dataflow\[0\]\.to"),
    ("io port not in graph", _mutate("pipeline.models.decoder.io.logits_output", "scores"),
     r"pipeline\.models\.decoder\.io\.logits_output"),
    ("kv port not in graph", _mutate("pipeline.models.decoder.io.kv_inputs.0", "past.9.key"),
     r"pipeline\.models\.decoder\.io\.kv_inputs"),
    ("path escapes", _mutate("pipeline.models.decoder.filename", "../decoder.onnx"),
     r"pipeline\.models\.decoder\.filename"),
    ("absolute path", _mutate("pipeline.models.decoder.filename", "/etc/passwd"),
     r"pipeline\.models\.decoder\.filename"),
    ("tokenizer escapes", _mutate("tokenizer", ".."), "tokenizer"),
    ("tokenizer folder lacks tokenizer.json", _mutate("pipeline.models.decoder.tokenizer", "sub"),
     r"pipeline\.models\.decoder\.tokenizer"),
]


@pytest.mark.parametrize("what,mutate,key", INCOMPLETE, ids=[r[0] for r in INCOMPLETE])
def test_composite_incomplete(tmp_path, what, mutate, key):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "sub").mkdir()
    doc = _text_composite(pkg)
    mutate(doc)
    with pytest.raises(IncompletePackageError, match=key):
        load_package(_write(pkg, doc))


def test_symlink_escape_refused(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    doc = _text_composite(pkg)
    os.replace(pkg / "decoder.onnx", tmp_path / "outside.onnx")
    os.symlink(tmp_path / "outside.onnx", pkg / "decoder.onnx")
    with pytest.raises(IncompletePackageError, match="escapes"):
        load_package(_write(pkg, doc))


def test_empty_folder_is_incomplete(tmp_path):
    with pytest.raises(IncompletePackageError, match="neither"):
        load_package(tmp_path)


def test_run_keys_under_pipeline_and_tokenizer_file(tmp_path):
    doc = _text_composite(tmp_path)
    for k in ("eos_token_id", "tokenizer"):
        del doc[k]
    doc["pipeline"].update(eos_token_id=9, tokenizer="tokenizer.json")
    spec = load_package(_write(tmp_path, doc))
    assert spec.eos_token_ids == [9] and spec.tokenizer_dir == str(tmp_path)


def test_run_key_contradiction_between_levels(tmp_path):
    doc = _text_composite(tmp_path)
    doc["pipeline"]["eos_token_id"] = 9
    with pytest.raises(MetadataError, match=r"pipeline\.eos_token_id"):
        load_package(_write(tmp_path, doc))


def test_vlm_without_processor_config_kept_as_declared(tmp_path):
    doc = _composite(tmp_path, processor=None)
    spec = load_package(_write(tmp_path, doc))
    assert not spec.text_only and "vision" in spec.components


@pytest.mark.parametrize("key,value,match", [
    ("num_key_value_heads", 4, r"num_key_value_heads is 4 but the graph's 'past_key_values.0.key' has 2 heads"),
    ("head_size", 16, r"head_size is 16 but the graph's 'past_key_values.0.key' has head size 8"),
])
def test_genai_config_contradicting_the_graph_is_refused(tmp_path, key, value, match):
    with pytest.raises(MetadataError, match=match):
        load_package(str(_llama_pkg(tmp_path, _genai_cfg(**{key: value}))))


def test_the_graph_s_cache_layers_count_over_num_hidden_layers(tmp_path):
    """onnxruntime-genai counts the layers the graph's caches name; the config's num_hidden_layers is read only
    for a decoder without caches."""
    for declared in (1, 5):
        assert load_package(str(_llama_pkg(tmp_path, _genai_cfg(num_hidden_layers=declared)))).num_layers == 2
    cfg = _genai_cfg()
    del cfg["model"]["decoder"]["num_hidden_layers"]
    assert load_package(str(_llama_pkg(tmp_path, cfg))).num_layers == 2


def test_genai_config_head_count_checked_against_attention_nodes(tmp_path):
    import shutil
    src = os.path.join(os.path.dirname(__file__), "..", "fixtures", "packages", "llama_fp32")
    pkg = tmp_path / "pkg"
    shutil.copytree(src, pkg)
    cfg = json.loads((pkg / "genai_config.json").read_text())
    load_package(str(pkg))  # as built: consistent
    cfg["model"]["decoder"]["num_attention_heads"] *= 2
    (pkg / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(MetadataError, match=r"num_attention_heads is \d+ but node '.*GroupQueryAttention' .* num_heads"):
        load_package(str(pkg))
