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


def test_the_stream_says_done_with_its_last_token(package):
    """``Decoding.done`` turns True as the last token is yielded (an EOS here, the limit below), and the
    ``Generator`` stops on it: the stop rules are applied in one place."""
    model = og.Model(package, native="none")
    model.spec.eos_token_ids = [V.EXPECTED[2]]
    stream = model.pipeline.tokens(V.PROMPT_IDS, 4, external={"pixel_values": V.PIXELS})
    seen = [(t, stream.done) for t in stream]
    assert seen == [(V.EXPECTED[0], False), (V.EXPECTED[1], False), (V.EXPECTED[2], True)]
    stream = model.pipeline.tokens(V.PROMPT_IDS, 2, external={"pixel_values": V.PIXELS})
    assert [(t, stream.done) for t in stream] == [(V.EXPECTED[0], False), (V.EXPECTED[1], True)]
    params = og.GeneratorParams(model)
    params.set_inputs(pixel_values=V.PIXELS)
    gen = og.Generator(model, params)
    gen.append_tokens(V.PROMPT_IDS)
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(gen.get_next_tokens()[0])
    assert out == V.EXPECTED[:3]


def test_unknown_search_option_is_refused(package):
    params = og.GeneratorParams(og.Model(package))
    with pytest.raises(ValueError, match="top_kk"):
        params.set_search_options(top_kk=3)


def test_impossible_requests_fail_at_once_with_onnxruntime_genais_words(package):
    model = og.Model(package)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=0)
    with pytest.raises(RuntimeError, match="search max_length is 0"):
        og.Generator(model, params)
    if model.spec.context_length:
        params.set_search_options(max_length=model.spec.context_length + 1)
        with pytest.raises(RuntimeError, match="cannot be greater than model context_length"):
            og.Generator(model, params)
    params.set_search_options(max_length=len(V.PROMPT_IDS))
    params.set_inputs(pixel_values=V.PIXELS)
    gen = og.Generator(model, params)
    with pytest.raises(RuntimeError, match=rf"input_ids size \({len(V.PROMPT_IDS) + 1}\) \+ current sequence length "
                                           rf"\(0\) exceeds max length \({len(V.PROMPT_IDS)}\)"):
        gen.append_tokens(V.PROMPT_IDS + [1])
    gen.append_tokens(V.PROMPT_IDS)
    with pytest.raises(RuntimeError, match="already at max_length"):
        gen.generate_next_token()
    pipe = model.pipeline
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        list(pipe.tokens(V.PROMPT_IDS, -1))
    with pytest.raises(ValueError, match="leaves no room to generate"):
        list(pipe.tokens(list(range(pipe.max_length)), 1))


def test_command_line_refuses_negative_token_counts(package, capsys):
    from pipeline.__main__ import main
    with pytest.raises(SystemExit) as exit_:
        main(["generate", package, "--max-new-tokens", "-3"])
    assert exit_.value.code == 2 and "expected a count >= 0, got -3" in capsys.readouterr().err
