"""Speculative decoding (pipeline/speculative.py): a draft model or n-gram lookup proposes, the decoder checks.

Compared with onnxruntime-genai 0.18 in the same test: greedy tokens equal to its speculative run and to plain
decoding, on both backends; the options, their checks and the refusals with its messages.  Sampling is checked
against plain sampling (a draft that proposes from the decoder's own distribution reproduces its tokens) and
the acceptance rule against its target distribution.
"""
import json
import os
import shutil

import numpy as np
import pytest

import pipeline as pg
from pipeline.sampling import Sampler
from pipeline.spec import SearchOptions
from pipeline.speculative import NGramLookup, Speculator

PKGS = os.path.join(os.path.dirname(__file__), "..", "fixtures", "packages")
PROMPT = [5, 7, 9, 11]


def _with_draft(tmp_path, draft="llama_int4", k=3, target="llama_fp32"):
    """The target package with ``draft``'s decoder as its ``model.draft`` (in a subfolder)."""
    dst = tmp_path / f"{target}+{draft}"
    shutil.copytree(os.path.join(PKGS, target), dst)
    (dst / "draft").mkdir()
    for f in os.listdir(os.path.join(PKGS, draft)):
        if f.startswith("model.onnx"):
            shutil.copy(os.path.join(PKGS, draft, f), dst / "draft" / f)
    cfg = json.loads((dst / "genai_config.json").read_text())
    sec = json.loads(open(os.path.join(PKGS, draft, "genai_config.json")).read())["model"]["decoder"]
    cfg["model"]["draft"] = dict(sec, filename="draft/model.onnx")
    cfg["speculative"] = {"max_draft_tokens": k}
    (dst / "genai_config.json").write_text(json.dumps(cfg))
    return str(dst)


def _decode(og, path, native=None, prompt=PROMPT, speculative=None, ops=(), **search):
    m = og.Model(path) if native is None else og.Model(path, native=native)
    p = og.GeneratorParams(m)
    p.set_search_options(**search)
    if speculative:
        p.set_speculative_options(**speculative)
    g = og.Generator(m, p)
    g.append_tokens(np.asarray(prompt, np.int32))
    seen = []
    for op in ops:  # ("gen", n) | ("logits",) | ("append", ids) | ("rewind", back)
        if op[0] == "gen":
            for _ in range(op[1]):
                g.generate_next_token()
        elif op[0] == "logits":
            seen.append(g.get_logits().copy())
        elif op[0] == "append":
            g.append_tokens(np.asarray(op[1], np.int32))
        else:
            g.rewind_to(len(g.get_sequence(0)) - op[1])
    while not g.is_done():
        g.generate_next_token()
    return g.get_sequence(0).tolist(), g.get_speculative_stats(), seen


@pytest.mark.parametrize("speculative", [None, {"max_draft_tokens": 1}, {"max_draft_tokens": 6}])
def test_a_draft_model_gives_onnxruntime_genais_tokens(ort_genai, tmp_path, speculative):
    """An int4 draft for the fp32 target: the draft is often wrong, so rounds end in corrections as well as
    bonus tokens.  Tokens equal onnxruntime-genai's speculative run and plain decoding, on both backends."""
    path = _with_draft(tmp_path)
    want, og_stats, _ = _decode(ort_genai, path, speculative=speculative, max_length=30)
    plain, _, _ = _decode(pg, os.path.join(PKGS, "llama_fp32"), "all", max_length=30)
    assert want == plain
    for native in ("all", "none"):
        got, st, _ = _decode(pg, path, native, speculative=speculative, max_length=30)
        assert got == want, native
        k = (speculative or {}).get("max_draft_tokens", 3)
        assert st["effective_k"] == k and st["formula_supported"]
        assert st["rounds"] == st["target_forward_passes"] and st["rounds"] > 1
        assert st["correction_tokens"] > 0 and st["draft_tokens_accepted"] > 0
        # every round gives its accepted proposals and one token of the decoder's own
        assert st["tokens_queued"] == st["draft_tokens_accepted"] + st["correction_tokens"] + st["bonus_tokens"]
        assert st["tokens_emitted"] + st["tokens_discarded"] - st["standard_fallback_steps"] == st["tokens_queued"]
        assert len(got) - len(PROMPT) == st["tokens_emitted"]
        assert set(st) == set(og_stats)
    # the repetition penalty and min_length apply at every checked position as at a plain step
    want, _, _ = _decode(ort_genai, path, max_length=30, repetition_penalty=1.3, min_length=25)
    assert _decode(pg, path, "all", max_length=30, repetition_penalty=1.3, min_length=25)[0] == want


def test_a_round_interrupted_by_logits_appends_and_rewinds(ort_genai, tmp_path):
    """get_logits in the middle of a round gives the logits of the position after the sequence (as the plain
    generator's, to 1e-4); append_tokens and rewind_to there drop the rest of the round.  The tokens follow
    onnxruntime-genai's plain generator."""
    path = _with_draft(tmp_path, draft="llama_fp32", k=4)  # the draft agrees: rounds are long
    ops = [("gen", 2), ("logits",), ("append", [9, 4]), ("gen", 3), ("logits",), ("rewind", 2), ("gen", 5),
           ("logits",)]
    want = _decode(ort_genai, os.path.join(PKGS, "llama_fp32"), ops=ops, max_length=40)[0]
    for native in ("all", "none"):
        plain, _, want_logits = _decode(pg, os.path.join(PKGS, "llama_fp32"), native, ops=ops, max_length=40)
        assert plain == want
        got, st, logits = _decode(pg, path, native, ops=ops, max_length=40)
        assert got == want, native
        assert st["interrupted_rounds"] > 0 and st["tokens_discarded"] > 0
        for a, b in zip(logits, want_logits):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_ngram_lookup_gives_onnxruntime_genais_tokens(ort_genai):
    path = os.path.join(PKGS, "llama_fp32")
    prompt = [5, 7, 9, 11, 5, 7, 9]
    for spec in ({"ngram_size": 2, "max_draft_tokens": 3}, {"ngram_size": 3, "ngram_chained_lookup": True}):
        want, og_stats, _ = _decode(ort_genai, path, prompt=prompt, speculative=spec, max_length=40)
        got, st, _ = _decode(pg, path, "all", prompt=prompt, speculative=spec, max_length=40)
        assert got == want
        assert st["ngram_lookup_hits"] > 0 and st["draft_forward_passes"] == 0
        assert st["rounds"] == og_stats["rounds"]


def test_ngram_lookup_proposes_the_latest_continuation():
    lk = NGramLookup(3)
    lk.append([1, 2, 3, 1, 2, 4, 5, 1, 2])
    assert lk.propose(3) == [4, 5, 1]       # the latest "1 2" with something after it
    assert lk.propose(1) == [4]
    chained = NGramLookup(2)
    chained.append([1, 2, 1, 3, 4, 1])
    assert chained.propose(4) == [3, 4, 1]  # what followed the latest "1", as far as the history goes
    assert chained.propose(4, chained=True) == [3, 4, 1, 3]
    assert NGramLookup(3).propose(2) == []
    assert lk.sync([1, 2, 3, 1, 2, 4, 5, 1, 2, 7]) == 1 and lk.sync([9, 9]) == 2 and lk.history == [9, 9]


def test_sampling_with_a_draft_that_agrees_reproduces_plain_sampling(tmp_path):
    """The proposals and the bonus token draw from the sampler in plain sampling's order; the acceptance tests
    draw from a second generator.  A draft that is the decoder itself therefore gives plain sampling's tokens."""
    path = _with_draft(tmp_path, draft="llama_fp32", k=3)
    for search in ({"top_k": 8}, {"top_p": 0.9, "temperature": 0.7}):
        plain, _, _ = _decode(pg, os.path.join(PKGS, "llama_fp32"), "all", max_length=30, do_sample=True,
                              random_seed=5, **search)
        got, st, _ = _decode(pg, path, "all", max_length=30, do_sample=True, random_seed=5, **search)
        assert got == plain and st["draft_tokens_accepted"] > 10
    # a draft that disagrees: the same seed gives the same tokens run to run
    path4 = _with_draft(tmp_path, draft="llama_int4", k=3)
    a = _decode(pg, path4, "all", max_length=30, do_sample=True, random_seed=3, top_k=20)[0]
    assert a == _decode(pg, path4, "all", max_length=30, do_sample=True, random_seed=3, top_k=20)[0]


class _Gen:
    """What Speculator._accept reads of a generator."""

    def __init__(self, **search):
        self.search = SearchOptions(do_sample=True, seed=11, **search)
        self.sampler = Sampler(self.search)

    @staticmethod
    def _processed(logits, hist):
        return logits


@pytest.mark.parametrize("search", [{"top_k": 0}, {"top_k": 4, "temperature": 0.8}])
def test_the_acceptance_rule_draws_from_the_decoders_distribution(search):
    """Leviathan and Chen's rule: whatever the draft's distribution q, the token that comes out is distributed as
    the decoder's p.  Empirical over 6000 rounds: total variation below 0.03 (fixed before running)."""
    gen = _Gen(**search)
    spec = Speculator.__new__(Speculator)
    spec.gen, spec._accept_rng, spec.kind, spec.marks = gen, None, "draft", []
    p_logits = np.log(np.asarray([0.05, 0.3, 0.1, 0.25, 0.2, 0.1], np.float32))
    ids, w = gen.sampler.distribution(p_logits)
    p = np.zeros(6)
    p[ids] = w / w.sum()
    q_ids, q_w = np.asarray([0, 1, 2, 5]), np.asarray([0.4, 0.1, 0.2, 0.3])  # puts mass where p has little
    rng = np.random.default_rng(0)
    counts = np.zeros(6)
    n = 6000
    for _ in range(n):
        d = int(q_ids[np.searchsorted(np.cumsum(q_w), rng.random() * q_w.sum(), side="right")])
        counts[spec._accept(p_logits, [], d, (q_ids, q_w))] += 1
    assert 0.5 * np.abs(counts / n - p).sum() < 0.03
    # an n-gram proposal (no distribution): a plain draw, kept when it equals the proposal
    spec.kind = "ngram"
    counts[:] = 0
    for _ in range(n):
        counts[spec._accept(p_logits, [], 1, None)] += 1
    assert 0.5 * np.abs(counts / n - p).sum() < 0.03


def test_speculative_options_and_refusals_as_onnxruntime_genai(ort_genai, tmp_path):
    path = os.path.join(PKGS, "llama_fp32")
    m, om = pg.Model(path, native="all"), ort_genai.Model(path)
    p, op = pg.GeneratorParams(m), ort_genai.GeneratorParams(om)
    assert p.get_speculative_options() == op.get_speculative_options()
    p.set_speculative_options(max_draft_tokens=7, ngram_chained_lookup=True)
    op.set_speculative_options(max_draft_tokens=7, ngram_chained_lookup=True)
    assert p.get_speculative_options() == op.get_speculative_options()
    for bad in ({"max_draft_tokens": 0}, {"max_draft_tokens": 17}, {"ngram_size": 1}, {"min_adaptive_k": 20},
                {"max_draft_tokens": 2.5}, {"max_draft_tokens": "3"}, {"cooldown": 1}):
        with pytest.raises(RuntimeError) as want:
            op.set_speculative_options(**bad)
        with pytest.raises(RuntimeError) as got:
            p.set_speculative_options(**bad)
        assert str(got.value) == str(want.value)
    with pytest.raises(RuntimeError, match='Unknown value "foo"'):
        p.set_speculative_options(foo=1)
    draft = _with_draft(tmp_path, draft="llama_fp32")
    for search, spec in (({"batch_size": 2}, None), ({"num_beams": 2}, None), ({}, {"ngram_size": 2})):
        om, m = ort_genai.Model(draft), pg.Model(draft, native="all")
        op, p = ort_genai.GeneratorParams(om), pg.GeneratorParams(m)
        for params in (op, p):
            params.set_search_options(max_length=20, **search)
            if spec:
                params.set_speculative_options(**spec)
        with pytest.raises(RuntimeError) as want:
            ort_genai.Generator(om, op)
        with pytest.raises(RuntimeError) as got:
            pg.Generator(m, p)
        assert str(got.value) == str(want.value)
    # the config's section is checked when the package loads
    bad = tmp_path / "bad"
    shutil.copytree(os.path.join(PKGS, "llama_fp32"), bad)
    cfg = json.loads((bad / "genai_config.json").read_text())
    cfg["speculative"] = {"max_draft_tokens": 40}
    (bad / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="speculative.max_draft_tokens must be between 1 and 16 Got: 40."):
        pg.Model(str(bad))
    # without speculation the statistics are all zero, with onnxruntime-genai's keys
    g = pg.Generator(m := pg.Model(path, native="all"), pg.GeneratorParams(m))
    want = ort_genai.Generator(om := ort_genai.Model(path), ort_genai.GeneratorParams(om)).get_speculative_stats()
    assert g.get_speculative_stats() == want


# -- tiny decoders without caches: the next token's logits are a table row of the current token -------------

def _tiny(directory, table, model_type="llama", context_length=64, draft_table=None, prefill_bonus=None,
          prune=False):
    """A package whose decoder maps each token to ``table[token]`` (no layers, no caches); ``draft_table``: a
    draft decoder of its own; ``prefill_bonus``: a token whose logit gains 100 whenever the run covers more than
    one position (so a re-run over the whole sequence shows in the tokens)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    directory.mkdir(parents=True, exist_ok=True)

    def save(name, tab):
        tab = np.asarray(tab, np.float32)
        v = tab.shape[1]
        ins = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "sequence"]),
               helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch", "total"])]
        out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1 if prune else "sequence", v])
        inits = [numpy_helper.from_array(tab, "table")]
        nodes = [helper.make_node("Gather", ["table", "input_ids"], ["base"], axis=0)]
        last = "base"
        if prefill_bonus is not None:
            bonus = np.zeros(v, np.float32)
            bonus[prefill_bonus] = 100.0
            inits += [numpy_helper.from_array(bonus, "bonus"), numpy_helper.from_array(np.array([1], np.int64), "ax"),
                      numpy_helper.from_array(np.array([1], np.int64), "one")]
            nodes += [helper.make_node("Shape", ["input_ids"], ["shp"]),
                      helper.make_node("Gather", ["shp", "ax"], ["n"], axis=0),
                      helper.make_node("Greater", ["n", "one"], ["many"]),
                      helper.make_node("Cast", ["many"], ["manyf"], to=TensorProto.FLOAT),
                      helper.make_node("Mul", ["manyf", "bonus"], ["add"]),
                      helper.make_node("Add", ["base", "add"], ["with_bonus"])]
            last = "with_bonus"
        if prune:
            inits.append(numpy_helper.from_array(np.array([-1], np.int64), "lastpos"))
            nodes.append(helper.make_node("Gather", [last, "lastpos"], ["logits"], axis=1))
        else:
            nodes.append(helper.make_node("Identity", [last], ["logits"]))
        g = helper.make_graph(nodes, "tiny", ins, [out], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 10
        onnx.save(m, str(directory / name))

    save("model.onnx", table)
    dec = {"filename": "model.onnx", "head_size": 1, "hidden_size": 1, "num_attention_heads": 1,
           "num_key_value_heads": 1, "num_hidden_layers": 0,
           "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}, "outputs": {"logits": "logits"}}
    model = {"type": model_type, "vocab_size": int(np.shape(table)[1]), "context_length": context_length,
             "bos_token_id": 0, "eos_token_id": [9], "pad_token_id": 0, "decoder": dec}
    if draft_table is not None:
        save("draft.onnx", draft_table)
        model["draft"] = dict(dec, filename="draft.onnx")
    (directory / "genai_config.json").write_text(json.dumps({"model": model, "search": {"max_length": 16}}))
    return str(directory)


def _chain(transitions, v=10):
    """Token t's logits favour transitions.get(t, t + 1) (by 40)."""
    tab = np.full((v, v), -20.0, np.float32)
    for t in range(v):
        tab[t, transitions.get(t, (t + 1) % (v - 1))] = 20.0
    return tab


def _steps(og, path, prompt, max_length, steps=None, **opts):
    m = og.Model(path)
    p = og.GeneratorParams(m)
    spec = {k: opts.pop(k) for k in list(opts) if k in ("max_draft_tokens", "min_adaptive_k", "cooldown",
                                                          "ngram_size")}
    p.set_search_options(max_length=max_length, **opts)
    if spec:
        p.set_speculative_options(**spec)
    g = og.Generator(m, p)
    g.append_tokens(np.asarray([prompt], np.int32))
    n = 0
    while not g.is_done() and (steps is None or n < steps):
        g.generate_next_token()
        n += 1
    return g.get_sequence(0).tolist(), g.get_speculative_stats()


_POLICY = ("rounds", "completed_rounds", "interrupted_rounds", "active_rounds", "draft_tokens_proposed",
           "draft_tokens_evaluated", "draft_tokens_accepted", "effective_k", "adaptive_k_increases",
           "adaptive_k_decreases", "adaptive_k_observations", "adaptive_k_probes", "cooldown_entries",
           "cooldown_steps", "cooldown_remaining", "standard_fallback_steps", "tokens_queued", "tokens_emitted",
           "tokens_discarded", "tokens_buffered", "full_accept_rounds", "partial_accept_rounds",
           "zero_accept_rounds")


def test_adaptive_width_and_cooldown_follow_onnxruntime_genai(ort_genai, tmp_path):
    """The round policies (min_adaptive_k's widths and probes, cooldown's plain steps) and the round accounting,
    step by step against onnxruntime-genai."""
    agree = _tiny(tmp_path / "agree", _chain({}), draft_table=_chain({}))
    disagree = _tiny(tmp_path / "disagree", _chain({}), draft_table=_chain({t: 4 for t in range(10)}))
    cases = [(agree, dict(max_draft_tokens=4, min_adaptive_k=2), [1, 3, 6, 9]),
             (agree, dict(max_draft_tokens=4, min_adaptive_k=1), [2, 5]),
             (disagree, dict(max_draft_tokens=2, cooldown=True), [3, 4, 6])]
    for path, opts, marks in cases:
        for steps in marks:
            want = _steps(ort_genai, path, [1], 16, steps, **opts)
            got = _steps(pg, path, [1], 16, steps, **opts)
            assert got[0] == want[0], (opts, steps)
            assert {k: got[1][k] for k in _POLICY} == {k: want[1][k] for k in _POLICY}, (opts, steps)


def test_phi3_runs_the_whole_sequence_again_at_the_rotary_switch(ort_genai, tmp_path):
    """onnxruntime-genai re-runs a phi3 sequence from the start when it reaches 4097 tokens (the long rotary
    factors); the model here shows it by favouring token 5 in any run of several positions."""
    for model_type in ("phi3", "llama"):
        path = _tiny(tmp_path / model_type, _chain({}), model_type=model_type, context_length=4200,
                     prefill_bonus=5)
        prompt = [1 + (i % 3) for i in range(4094)]
        want = _steps(ort_genai, path, prompt, 4104)[0][4094:]
        assert _steps(pg, path, prompt, 4104)[0][4094:] == want, model_type
        # the prompt's run gives 5; the fourth token is picked at 4097 tokens, after the re-run (phi3 only)
        assert want[0] == 5 and (want[3] == 5) == (model_type == "phi3")


def test_ngram_sampling_is_plain_sampling_even_when_a_round_is_cut(tmp_path):
    """An n-gram position draws as a plain step would; a round cut short by append_tokens takes back the draws of
    the tokens it never handed out, so the tokens stay plain sampling's for the same seed."""
    tab = np.full((10, 10), -20.0, np.float32)
    tab[:, 1:5] = [0.0, 0.2, 0.4, 0.6]  # every token: a draw among 1..4
    tab[1], tab[2] = _chain({1: 2})[1], _chain({2: 1})[2]  # except 1 -> 2 -> 1, which the n-grams get right
    path = _tiny(tmp_path / "sampled", tab)
    seen = set()
    for seed in range(8):
        runs = []
        for spec in ({}, {"ngram_size": 2, "max_draft_tokens": 4}):
            m = pg.Model(path)
            p = pg.GeneratorParams(m)
            p.set_search_options(max_length=20, do_sample=True, top_k=4, temperature=0.8, random_seed=seed)
            if spec:
                p.set_speculative_options(**spec)
            g = pg.Generator(m, p)
            g.append_tokens(np.asarray([[1, 2, 1, 2]], np.int32))
            g.generate_next_token()  # a round of four accepted proposals, one handed out
            g.append_tokens(np.asarray([[7]], np.int32))  # cuts it
            while not g.is_done():
                g.generate_next_token()
            runs.append((g.get_sequence(0).tolist(), g.get_speculative_stats()))
        assert runs[0][0] == runs[1][0], seed
        assert runs[1][1]["interrupted_rounds"] >= 1
        seen.add(tuple(runs[0][0]))
    assert len(seen) > 1  # the seeds matter


def test_a_decoder_that_gives_the_last_positions_logits_only_is_refused(ort_genai, tmp_path):
    path = _tiny(tmp_path / "pruned", _chain({}), prune=True)
    for og in (ort_genai, pg):
        m = og.Model(path)
        p = og.GeneratorParams(m)
        p.set_search_options(max_length=12)
        p.set_speculative_options(ngram_size=3)
        with pytest.raises(RuntimeError, match="pruned last-token-only logits"):
            og.Generator(m, p)


def test_recurrent_state_is_taken_back_to_the_rounds_start(ort_genai, tmp_path):
    """qwen3.5's linear-attention state cannot be cut back: a round that drops proposals goes back to the state
    before its checking run and runs the kept ids again.  The tokens are plain greedy decoding's
    (onnxruntime-genai's), with n-grams and with a recurrent draft, on both backends."""
    path = os.path.join(PKGS, "qwen35_fp32")
    draft = _with_draft(tmp_path, draft="qwen35_int4", target="qwen35_fp32", k=3)
    want = _decode(ort_genai, path, max_length=40)[0]
    for native in ("all", "none"):
        got, st, _ = _decode(pg, path, native, speculative={"ngram_size": 2, "max_draft_tokens": 3}, max_length=40)
        assert got == want and st["rounds"] > 0, native
        got, st, _ = _decode(pg, draft, native, max_length=40)
        assert got == want and st["draft_tokens_accepted"] > 0, native
        assert st["target_reconciliation_forward_passes"] > 0
        assert st["target_forward_passes"] == st["rounds"] + st["target_reconciliation_forward_passes"]


def test_snapshot_state_comes_back_without_running_again():
    """``snapshot_state`` then ``rewind_to`` its length restores the recurrent state and the logits there: no
    model run, and the continuation is the plain one.  (onnxruntime-genai 0.18 runs the last kept token through
    the restored state once more, so its continuation there differs from its own plain one; it is not copied.)"""
    path = os.path.join(PKGS, "qwen35_fp32")
    for native in ("all", "none"):
        plain = _decode(pg, path, native, max_length=30)[0]
        m = pg.Model(path, native=native)
        p = pg.GeneratorParams(m)
        p.set_search_options(max_length=30)
        g = pg.Generator(m, p)
        g.append_tokens(np.asarray(PROMPT, np.int32))
        for _ in range(3):
            g.generate_next_token()
        g.snapshot_state()
        at = g.get_logits()
        for _ in range(4):
            g.generate_next_token()
        runs = g._runs
        g.rewind_to(len(PROMPT) + 3)
        assert np.array_equal(g.get_logits(), at) and g._runs == runs
        while not g.is_done():
            g.generate_next_token()
        assert g.get_sequence(0).tolist() == plain, native
        g.rewind_to(len(PROMPT) + 1)  # not the snapshot's length: the sequence runs again from the start
        assert g._fed == 0
    # a decoder without recurrent state: nothing to keep
    g = pg.Generator(m := pg.Model(os.path.join(PKGS, "llama_fp32")), pg.GeneratorParams(m))
    g.append_tokens(np.asarray(PROMPT, np.int32))
    g.snapshot_state()
    assert g._snapshot is None


def test_set_hidden_states_feeds_the_decoders_hidden_states_input(ort_genai, tmp_path):
    """An MTP head's decoder reads ``hidden_states`` beside the ids; ``set_hidden_states`` gives it for the next
    runs, until set again, as onnxruntime-genai does.  Here the logits are the ids' table rows plus
    ``hidden_states @ W``, so what was fed shows in the tokens."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    v, h = 10, 3
    tab = _chain({})
    w = np.zeros((h, v), np.float32)
    w[0, 7], w[1, 2] = 100.0, 100.0
    ins = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "sequence"]),
           helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch", "total"]),
           helper.make_tensor_value_info("hs", TensorProto.FLOAT, ["batch", "sequence", h])]
    g = helper.make_graph([helper.make_node("Gather", ["table", "input_ids"], ["base"], axis=0),
                           helper.make_node("MatMul", ["hs", "W"], ["hw"]),
                           helper.make_node("Add", ["base", "hw"], ["logits"])], "mtp", ins,
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", v])],
                          [numpy_helper.from_array(tab, "table"), numpy_helper.from_array(w, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.save(m, str(tmp_path / "model.onnx"))
    dec = {"filename": "model.onnx", "head_size": 1, "hidden_size": h, "num_attention_heads": 1,
           "num_key_value_heads": 1, "num_hidden_layers": 0, "outputs": {"logits": "logits"},
           "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "hidden_states": "hs"}}
    (tmp_path / "genai_config.json").write_text(json.dumps(
        {"model": {"type": "llama", "vocab_size": v, "context_length": 64, "bos_token_id": 0, "eos_token_id": [9],
                   "pad_token_id": 0, "decoder": dec}}))

    def run(og, native=None):
        model = og.Model(str(tmp_path)) if native is None else og.Model(str(tmp_path), native=native)
        p = og.GeneratorParams(model)
        p.set_search_options(max_length=10)
        gen = og.Generator(model, p)
        gen.set_hidden_states(np.zeros((1, 2, h), np.float32))
        gen.append_tokens(np.asarray([[1, 2]], np.int32))
        for row in (None, 0, None, 1):
            if row is not None:
                x = np.zeros((1, 1, h), np.float32)
                x[0, 0, row] = 1.0
                gen.set_hidden_states(x)
            gen.generate_next_token()
        return gen.get_sequence(0).tolist()

    want = run(ort_genai)
    assert want == [1, 2, 3, 7, 7, 2]
    assert run(pg, "all") == want and run(pg, "none") == want
    # a decoder without such an input: nothing happens
    g = pg.Generator(m := pg.Model(os.path.join(PKGS, "llama_fp32")), pg.GeneratorParams(m))
    g.set_hidden_states(np.zeros((1, 1, 64), np.float32))
    assert not g.external
