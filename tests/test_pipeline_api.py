"""The onnxruntime-genai-shaped API over the composite VLM fixture."""
import numpy as np
import pytest

import pipeline as og
from fixtures import composite_vlm as V


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return V.build_package(str(tmp_path_factory.mktemp("vlm_api")))


@pytest.mark.parametrize("native", ["none", "all", "embedding,decoder"])
def test_generator_loop(package, native):
    model = og.Model(package, native=native)
    tok = og.Tokenizer(model)
    ids = tok.encode("t3 <image>")
    assert list(ids) == V.PROMPT_IDS
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 4, do_sample=False)
    params.set_inputs(pixel_values=V.PIXELS)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(gen.get_next_tokens()[0])
    assert out == V.EXPECTED
    assert gen.get_sequence(0) == V.PROMPT_IDS + V.EXPECTED
    assert tok.decode(out) == "t0 t5 t6 <image>"
    gen.rewind_to(3)  # keep [3, 7, 0] and regenerate
    gen.generate_next_token()
    assert gen.get_next_tokens()[0] == 5


def test_one_call_generate_and_stream(package):
    model = og.Model(package, native="all")
    assert og.generate(model, V.PROMPT_IDS, 4, inputs={"pixel_values": V.PIXELS}) == V.EXPECTED
    with pytest.raises(Exception, match="pixel_values"):
        og.generate(model, V.PROMPT_IDS, 4)  # the vision encoder's input is nobody's to invent
    pipe = model.pipeline
    streamed = []
    for t in pipe.tokens(V.PROMPT_IDS, 4, external={"pixel_values": V.PIXELS}):
        streamed.append(t)
    assert streamed == V.EXPECTED


def test_unknown_search_option_is_refused(package):
    params = og.GeneratorParams(og.Model(package))
    with pytest.raises(ValueError, match="top_kk"):
        params.set_search_options(top_kk=3)
