"""Constrained decoding (``pipeline/guidance.py``, llguidance) against onnxruntime-genai's guidance in the same
test, on the tiny llama package: regex, JSON-schema and Lark grammars, one row and a batch of two, through the
``Generator`` (both backends) and through an ``Engine`` turn; the grammar's end admits only the EOS."""
import json

import numpy as np
import pytest

import pipeline as pg
from test_pipeline_engine_api import LLAMA

SCHEMA = json.dumps({"type": "object",
                     "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 5}},
                     "required": ["a", "b"], "additionalProperties": False})
GRAMMARS = {"regex": ("regex", "(cat|dog) [0-9]{2}"), "json": ("json_schema", SCHEMA),
            "lark": ("lark_grammar", 'start: "hello" " " NAME\nNAME: /[a-z]{2,6}/')}
PROMPTS = [[285, 79, 339], [5, 9, 13]]


def _generate(mod, model, kind, data, batch):
    params = mod.GeneratorParams(model)
    params.set_search_options(max_length=30, batch_size=batch)
    params.set_guidance(kind, data)
    g = mod.Generator(model, params)
    g.append_tokens(np.array(PROMPTS[:batch], np.int32))
    while not g.is_done():
        g.generate_next_token()
    return [g.get_sequence(i).tolist() for i in range(batch)]


@pytest.fixture(scope="module")
def models(ort_genai):
    return ort_genai.Model(LLAMA), {n: pg.Model(LLAMA, native=n) for n in ("none", "all")}


@pytest.mark.parametrize("native", ["none", "all"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("grammar", list(GRAMMARS))
def test_generator_equals_onnxruntime_genai(models, ort_genai, grammar, batch, native):
    ref_model, ours = models
    kind, data = GRAMMARS[grammar]
    ref = _generate(ort_genai, ref_model, kind, data, batch)
    assert _generate(pg, ours[native], kind, data, batch) == ref
    if grammar == "regex":  # "cat 11" then the EOS: the grammar ended the sequence before max_length
        assert len(ref[0]) < 30


def _turns(mod, model):
    engine = mod.Engine(model)
    buf = engine.create_event_buffer(64)
    out = []
    for prompt, grammar in zip(PROMPTS, ("regex", "lark")):
        r = engine.create_request()
        for n, guided in ((20, True), (3, False)):  # a guided turn, then an unguided one
            t = mod.TurnOptions(r)
            t.set_max_generated_tokens(n)
            if guided:
                t.set_guidance(*GRAMMARS[grammar])
            r.begin_turn(np.array(prompt if guided else [5], np.int32), t)
            while engine.has_pending_requests():
                out += [(e.token, int(e.flags), int(e.finish_reason)) for e in engine.run(buf)]
    return out


def test_engine_turns_equal_onnxruntime_genai(models, ort_genai):
    ref_model, ours = models
    assert _turns(pg, ours["all"]) == _turns(ort_genai, ref_model)


def test_refusals(models, ort_genai):
    ref_model, ours = models
    messages = []
    for mod, model in ((ort_genai, ref_model), (pg, ours["all"])):
        found = []
        for kind, data in (("bogus", "x"), ("regex", "(")):
            with pytest.raises(RuntimeError) as e:
                params = mod.GeneratorParams(model)
                params.set_guidance(kind, data)
                mod.Generator(model, params)
            found.append(str(e.value))
        messages.append(found)
    assert messages[1] == messages[0]
    params = pg.GeneratorParams(ours["all"])
    params.set_guidance("regex", "a+")
    params.set_search_options(num_beams=2)
    with pytest.raises(RuntimeError, match="not supported with beam search"):
        pg.Generator(ours["all"], params)
