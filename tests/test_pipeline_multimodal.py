"""onnxruntime-genai's ``Images`` and ``MultiModalProcessor`` (``pipeline/multimodal.py``,
``pipeline/image_transforms.py``) on the Phi-3-vision style fixture (``fixtures/phi3v_package.py``), against
onnxruntime-genai's own processor and generator in the same test.

Tolerances, fixed before comparing: the 336 x 336 crops and every integer output are equal; the bicubic global
view is within 1e-5 (float32 results of a float64 accumulation, values below 2.2 in magnitude)."""
import os

import numpy as np
import pytest

import pipeline as og
from fixtures import phi3v_package as P

PROMPT = "<|user|>\n<|image_1|>\nwhat is it?<|end|>\n<|assistant|>\n"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return P.build(str(tmp_path_factory.mktemp("phi3v")))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    return {"wide": P.png(str(d / "wide.png"), 1, (700, 300)),            # padded in height
            "tall": P.png(str(d / "tall.png"), 2, (90, 400), "P"),        # a palette image, padded in width
            "small": P.png(str(d / "small.png"), 3, (40, 30))}


def _process(api, package, prompt, paths):
    """The processor's outputs as arrays (``paths``: the images, none for a text prompt)."""
    proc = api.Model(package).create_multimodal_processor()
    out = proc(prompt, images=api.Images.open(*paths) if paths else None)
    return {k: np.asarray(out[k].as_numpy()) for k in out.keys()}


def _decode(api, package, prompt, paths, more=8, **kw):
    """The whole sequence of a greedy run over the processor's inputs, ``more`` tokens past the prompt."""
    m = api.Model(package, **kw)
    inputs = m.create_multimodal_processor()(prompt, images=api.Images.open(*paths) if paths else None)
    params = api.GeneratorParams(m)
    params.set_search_options(max_length=inputs["input_ids"].as_numpy().shape[1] + more)
    g = api.Generator(m, params)
    g.set_inputs(inputs)
    while not g.is_done():
        g.generate_next_token()
    return g.get_sequence(0).tolist()


def _same_inputs(got, ref):
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and np.array_equal(got[k], ref[k]), k


@pytest.mark.parametrize("names", [["wide"], ["tall"], ["small"], ["tall", "wide"]])
def test_the_processor_gives_onnxruntime_genai_s_inputs(package, images, ort_genai, names):
    paths = [images[n] for n in names]
    prompt = "<|user|>\n" + "".join(f"<|image_{i + 1}|>\n" for i in range(len(paths))) + "Compare them.<|end|>\n"
    got, ref = _process(og, package, prompt, paths), _process(ort_genai, package, prompt, paths)
    assert sorted(got) == sorted(ref)
    for k in ("input_ids", "image_sizes", "num_image_tokens"):
        assert got[k].dtype == ref[k].dtype and np.array_equal(got[k], ref[k]), k
    assert got["pixel_values"].shape == ref["pixel_values"].shape and got["pixel_values"].dtype == np.float32
    assert np.array_equal(got["pixel_values"][:, 1:], ref["pixel_values"][:, 1:])
    np.testing.assert_allclose(got["pixel_values"][:, 0], ref["pixel_values"][:, 0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("name", ["wide", "tall"])
def test_image_prompts_decode_as_onnxruntime_genai_decodes_them(package, images, ort_genai, native, name):
    assert _decode(og, package, PROMPT, [images[name]], native=native) == \
        _decode(ort_genai, package, PROMPT, [images[name]])


def test_image_tags_must_name_each_image_once(package, images, ort_genai):
    for api in (og, ort_genai):
        proc = api.Model(package).create_multimodal_processor()
        with pytest.raises(RuntimeError, match="Number of unique image tags does not match the number of images"):
            proc("<|image_1|><|image_2|>", images=api.Images.open(images["wide"]))
        with pytest.raises(RuntimeError, match="Expected a value <= 1. Actual value: 3"):
            proc("<|image_3|>", images=api.Images.open(images["wide"]))


def test_what_the_processor_and_set_inputs_refuse(package, images):
    with pytest.raises(RuntimeError, match="Image path does not exist"):
        og.Images.open(images["wide"] + ".missing")
    text = og.Model(os.path.join(os.path.dirname(P.__file__), "packages", "llama_fp32"))
    with pytest.raises(RuntimeError, match="is not a registered multi-modal model type"):
        text.create_multimodal_processor()
    params = og.GeneratorParams(text)
    with pytest.raises(RuntimeError, match="Please use generator.AppendTokens"):
        og.Generator(text, params).set_inputs(og.NamedTensors())
    proc = og.Model(package).create_multimodal_processor()
    with pytest.raises(ValueError, match="cannot be decoded"):
        proc(PROMPT, images=og.Images.open_bytes(b"not an image"))


# ---------------------------------------------------------------------------------------------------------------
# Qwen2.5-VL: smart resize, patches, <|image_pad|> expansion (fixtures/qwen_vl_package.py); every output equal


@pytest.fixture(scope="module")
def qwen_package(tmp_path_factory):
    from fixtures import qwen_vl_package
    return qwen_vl_package.build(str(tmp_path_factory.mktemp("qwen_vl")))


@pytest.fixture(scope="module")
def qwen_images(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen_images")
    return {"wide": P.png(str(d / "wide.png"), 1, (700, 300)),
            "tall": P.png(str(d / "tall.png"), 2, (90, 400), "P"),
            "small": P.png(str(d / "small.png"), 3, (40, 30)),        # below min_pixels: scaled up
            "big": P.png(str(d / "big.png"), 4, (1000, 800)),          # above max_pixels: scaled down
            "odd": P.png(str(d / "odd.png"), 5, (70, 125)),   # widened, narrowed in height: the passes' order shows
            "half": P.png(str(d / "half.png"), 6, (70, 126))}  # 2.5 and 4.5 patch groups: halves round up


@pytest.mark.parametrize("names,prompt", [
    (["wide"], "<|vision_start|><|image_pad|><|vision_end|>Describe this image"),
    (["tall"], "Hi <|vision_start|><|vision_end|> and"),
    (["small"], "<|vision_start|>x"),
    (["big"], ""),
    (["odd"], "<|vision_start|><|vision_end|>"),
    (["half"], "<|vision_start|><|vision_end|>"),
    (["wide", "tall"], "A<|vision_start|><|image_pad|><|vision_end|>B<|vision_start|><|image_pad|><|vision_end|>C"),
    ([], "no image here"),
])
def test_the_qwen_processor_gives_onnxruntime_genai_s_inputs(qwen_package, qwen_images, ort_genai, names, prompt):
    paths = [qwen_images[n] for n in names]
    _same_inputs(_process(og, qwen_package, prompt, paths), _process(ort_genai, qwen_package, prompt, paths))


def test_the_qwen_processor_counts_vision_spans_against_images(qwen_package, qwen_images, ort_genai):
    for api in (og, ort_genai):
        proc = api.Model(qwen_package).create_multimodal_processor()
        with pytest.raises(RuntimeError, match="Prompt contained 2 vision_start tokens but received 1 images"):
            proc("<|vision_start|><|vision_start|>", images=api.Images.open(qwen_images["wide"]))


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("names,prompt", [
    (["wide"], "<|vision_start|><|image_pad|><|vision_end|>Describe this image"),
    (["tall"], "Hi there, describe <|vision_start|><|vision_end|> please"),
    ([], "just text, no image"),
])
def test_qwen_image_prompts_decode_as_onnxruntime_genai_decodes_them(qwen_package, qwen_images, ort_genai, native,
                                                                      names, prompt):
    """The image tokens' 3-D positions (``pipeline/rope_index.py``), decoding on from their maximum, and a prompt
    without images (the vision component does not run)."""
    paths = [qwen_images[n] for n in names]
    assert _decode(og, qwen_package, prompt, paths, 10, native=native) == \
        _decode(ort_genai, qwen_package, prompt, paths, 10)


def test_a_phi3v_prompt_without_images_decodes_as_onnxruntime_genai(package, ort_genai):
    prompt = "<|user|>\njust text<|end|>\n"
    assert _decode(og, package, prompt, [], native="all") == _decode(ort_genai, package, prompt, [])


def test_a_decoder_that_takes_the_ids_beside_the_embeddings(package, ort_genai, tmp_path):
    """onnxruntime-genai feeds a decoder that declares both inputs_embeds and input_ids the token ids too."""
    import json
    import shutil

    import onnx
    from onnx import TensorProto, helper, numpy_helper
    folder = shutil.copytree(package, tmp_path / "ids")
    m = onnx.load(str(folder / "decoder.onnx"))
    g = m.graph
    g.input.append(helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]))
    g.initializer.append(numpy_helper.from_array(np.linspace(-1, 1, P.VOCAB).astype(np.float32)[None], "idw"))
    logits = next(n for n in g.node if n.output[0] == "logits")
    logits.output[0] = "logits0"
    g.node.extend([helper.make_node("Cast", ["input_ids"], ["idsf"], to=TensorProto.FLOAT),
                   helper.make_node("Unsqueeze", ["idsf", "last_axis"], ["ids3"]),
                   helper.make_node("Mul", ["ids3", "idw"], ["id_term"]),
                   helper.make_node("Add", ["logits0", "id_term"], ["logits"])])
    g.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "last_axis"))
    onnx.save(m, str(folder / "decoder.onnx"))
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["decoder"]["inputs"]["input_ids"] = "input_ids"
    (folder / "genai_config.json").write_text(json.dumps(cfg))

    prompt = "<|user|>\nids too<|end|>\n"
    assert _decode(og, str(folder), prompt, [], native="all") == _decode(og, str(folder), prompt, [], native="none") \
        == _decode(ort_genai, str(folder), prompt, [])


def test_an_embedding_that_takes_int32_ids(package, images, ort_genai, tmp_path):
    """Token ids go to a component in its graph's integer type (onnxruntime-genai's test packages use int32)."""
    import shutil

    import onnx
    from onnx import TensorProto
    folder = shutil.copytree(package, tmp_path / "int32")
    m = onnx.load(str(folder / "embedding.onnx"))
    next(i for i in m.graph.input if i.name == "input_ids").type.tensor_type.elem_type = TensorProto.INT32
    onnx.save(m, str(folder / "embedding.onnx"))

    paths = [images["tall"]]
    assert _decode(og, str(folder), PROMPT, paths, native="all") == _decode(og, str(folder), PROMPT, paths,
                                                                           native="none") \
        == _decode(ort_genai, str(folder), PROMPT, paths)


# ---------------------------------------------------------------------------------------------------------------
# Gemma 3: fixed 896 x 896 resize, channels first, 256 soft tokens per <start_of_image> (fixtures/gemma3_vl_package)


@pytest.fixture(scope="module")
def gemma_package(tmp_path_factory):
    from fixtures import gemma3_vl_package
    return gemma3_vl_package.build(str(tmp_path_factory.mktemp("gemma3")))


@pytest.mark.parametrize("names,prompt", [(["wide"], "<start_of_image>Describe"),
                                          (["wide", "tall"], "A <start_of_image> B <start_of_image> C"),
                                          (["tall"], ""), ([], "text only")])
def test_the_gemma3_processor_gives_onnxruntime_genai_s_inputs(gemma_package, images, ort_genai, names, prompt):
    paths = [images[n] for n in names]
    _same_inputs(_process(og, gemma_package, prompt, paths), _process(ort_genai, gemma_package, prompt, paths))


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("names,prompt", [(["wide"], "<start_of_image>Describe"), ([], "text only")])
def test_gemma3_image_prompts_decode_as_onnxruntime_genai_decodes_them(gemma_package, images, ort_genai, native,
                                                                        names, prompt):
    paths = [images[n] for n in names]
    assert _decode(og, gemma_package, prompt, paths, native=native) == _decode(ort_genai, gemma_package, prompt, paths)


def test_the_gemma3_processor_counts_image_tokens_against_images(gemma_package, images, ort_genai):
    for api in (og, ort_genai):
        proc = api.Model(gemma_package).create_multimodal_processor()
        with pytest.raises(RuntimeError, match="Prompt contained 2 image tokens but received 1 images"):
            proc("<start_of_image><start_of_image>", images=api.Images.open(images["wide"]))


def test_the_command_line_takes_an_image_through_the_processor(package, images, ort_genai, capsys):
    from pipeline.__main__ import main
    assert main(["generate", package, "--prompt", PROMPT, "--image", images["tall"], "--max-new-tokens", "6",
                 "--native", "none"]) == 0
    printed = capsys.readouterr().out.splitlines()[-1]
    n = _process(ort_genai, package, PROMPT, [images["tall"]])["input_ids"].shape[1]
    assert printed == f"token_ids: {_decode(ort_genai, package, PROMPT, [images['tall']], 6)[n:]}"
    assert main(["generate", package, "--prompt", "no tag", "--image", images["tall"], "--native", "none"]) == 2
    assert "Number of unique image tags" in capsys.readouterr().err
