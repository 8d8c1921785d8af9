"""onnxruntime-genai's legacy GPT-2 format (fixtures/gpt2_legacy.py: combined ``past_%d`` caches,
EmbedLayerNormalization, com.microsoft Attention) through ``pipeline``, natively and on onnxruntime, against
onnxruntime-genai in the same test."""
import numpy as np
import pytest

import pipeline as og
from fixtures import gpt2_legacy


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return gpt2_legacy.build(str(tmp_path_factory.mktemp("gpt2_legacy")))


def _generate(api, path, prompt, **search):
    m = api.Model(path, **({"native": search.pop("native")} if "native" in search else {}))
    params = api.GeneratorParams(m)
    params.set_search_options(**search)
    g = api.Generator(m, params)
    g.append_tokens(np.array([prompt], np.int32))
    while not g.is_done():
        g.generate_next_token()
    n = int(search.get("num_return_sequences", 1))
    return [g.get_sequence(i).tolist() for i in range(n)]


def test_the_combined_caches_are_read_from_the_config(package):
    from pipeline.genai_config import load_genai_config
    io = load_genai_config(package).components["decoder"].io
    assert io.kv_inputs == [f"past_{i}" for i in range(gpt2_legacy.LAYERS)]
    assert io.kv_outputs == [f"present_{i}" for i in range(gpt2_legacy.LAYERS)] and io.kv_batch_axis == 1


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("prompt", [[1, 7, 8, 9], [1, 45, 77, 12, 300, 9]])  # the second ends at EOS
def test_greedy_tokens_are_onnxruntime_genai_s(package, ort_genai, native, prompt):
    got = _generate(og, package, prompt, max_length=30, native=native)
    assert got == _generate(ort_genai, package, prompt, max_length=30)
    assert len(got[0]) > len(prompt) + 1


@pytest.mark.parametrize("native", ["all", "none"])
def test_beams_reorder_the_combined_caches_as_onnxruntime_genai_does(package, ort_genai, native):
    kw = dict(max_length=20, num_beams=3, num_return_sequences=2, early_stopping=True)
    assert _generate(og, package, [1, 7, 8, 9], native=native, **kw) == \
        _generate(ort_genai, package, [1, 7, 8, 9], **kw)


def test_a_padded_batch_is_refused_with_combined_caches(package):
    m = og.Model(package)
    params = og.GeneratorParams(m)
    params.set_search_options(max_length=20, batch_size=2)
    g = og.Generator(m, params)
    with pytest.raises(NotImplementedError, match="combined key-and-value caches"):
        g.append_tokens(np.array([[1, 7, 8, 9], [1, 7, 3, 3]], np.int32))


def test_ports_the_config_leaves_out_take_onnxruntime_genai_s_default_names(package, ort_genai, tmp_path):
    """onnxruntime-genai's own tiny GPT-2 config names only its caches: input_ids, attention_mask, position_ids
    and logits are found under their default names."""
    import json
    import shutil
    from pipeline.genai_config import load_genai_config
    folder = shutil.copytree(package, tmp_path / "defaults")
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["decoder"]["inputs"] = {"past_names": "past_%d"}
    cfg["model"]["decoder"]["outputs"] = {"present_names": "present_%d"}
    (folder / "genai_config.json").write_text(json.dumps(cfg))
    io = load_genai_config(str(folder)).components["decoder"].io
    assert (io.token_input, io.attention_mask_input, io.position_ids_input, io.logits_output) == \
        ("input_ids", "attention_mask", "position_ids", "logits")
    assert _generate(og, str(folder), [1, 7, 8, 9], max_length=16, native="all") == \
        _generate(ort_genai, str(folder), [1, 7, 8, 9], max_length=16)


def test_the_tokenizer_adds_no_special_token_unless_asked_as_onnxruntime_genai(package, ort_genai, tmp_path):
    """onnxruntime-genai creates its tokenizer with add_special_tokens off: a post-processor that adds <s> is not
    applied by encode; ``update_options(add_special_tokens="true")`` turns it on."""
    import shutil
    from test_pipeline_sampling import make_tokenizer
    folder = shutil.copytree(package, tmp_path / "bos")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    make_tokenizer(folder, config={"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>"})
    ours, ref = og.Tokenizer(og.Model(str(folder))), ort_genai.Tokenizer(ort_genai.Model(str(folder)))
    assert ours.encode("hello world").tolist() == ref.encode("hello world").tolist()
    assert ours.encode_batch(["hello", "hello world"]).as_numpy().tolist() == \
        ref.encode_batch(["hello", "hello world"]).as_numpy().tolist()
    ours.update_options(add_special_tokens="true")
    assert ours.encode("hello world").tolist()[0] == 0
    for tok in (ours, ref):
        tok.update_options(skip_special_tokens="false")
    assert ours.decode([0, 70, 71, 1]) == ref.decode([0, 70, 71, 1]) == "<s>ef</s>"
