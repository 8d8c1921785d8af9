"""Marian encoder-decoder packages (``pipeline/marian.py``, fixture ``fixtures/marian_ssru.py``) through
``pipeline``, natively and on onnxruntime, against onnxruntime-genai in the same test: greedy batches with
padded prompts, beam search (the recurrent state reordered between beams), and what the runner refuses."""
import numpy as np
import pytest

import pipeline as og
from fixtures import marian_ssru
from pipeline.beam_search import top_pairs
from pipeline.spec import RequestError


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return marian_ssru.build(str(tmp_path_factory.mktemp("marian")))


def _run(api, path, prompts, native=None, **search):
    m = api.Model(path, **({} if native is None else {"native": native}))
    params = api.GeneratorParams(m)
    params.set_search_options(batch_size=len(prompts), max_length=14, **search)
    g = api.Generator(m, params)
    g.append_tokens(np.array(prompts, np.int32))
    steps = []
    while not g.is_done():
        g.generate_next_token()
        steps.append(g.get_next_tokens().tolist())
    n = len(prompts) * int(search.get("num_return_sequences", 1))
    return steps, [g.get_sequence(i).tolist() for i in range(n)]


CASES = [
    ([[3, 4, 5]], {}),
    ([[3, 4, 5], [6, 7, 15]], {}),  # the second row padded: its EOS goes after 7, its mask counts 3
    ([[3, 4, 5], [6, 15, 15]], {"num_beams": 3, "num_return_sequences": 2}),
    ([[3, 4, 5, 6, 7]], {"num_beams": 4, "num_return_sequences": 3, "length_penalty": 0.5}),
]


@pytest.mark.parametrize("native", ["all", "none"])
@pytest.mark.parametrize("prompts,search", CASES)
def test_tokens_and_sequences_are_onnxruntime_genai_s(package, ort_genai, native, prompts, search):
    got = _run(og, package, prompts, native, **search)
    assert got == _run(ort_genai, package, prompts, **search)


def test_the_sequence_holds_the_prompt_then_the_translation(package):
    steps, seqs = _run(og, package, [[3, 4, 5], [6, 7, 15]], "all")
    assert seqs[0][:3] == [3, 4, 5] and seqs[1][:3] == [6, 7, 15]
    assert [s[0] for s in steps] == seqs[0][3:3 + len(steps)]


def test_what_a_marian_generator_refuses(package):
    """One token per row after the prompt, and no rewind (the prompt is the encoder's)."""
    m = og.Model(package, native="all")
    params = og.GeneratorParams(m)
    params.set_search_options(max_length=14)
    g = og.Generator(m, params)
    g.append_tokens(np.array([[3, 4, 5]], np.int32))
    g.generate_next_token()
    with pytest.raises(RequestError, match="one token per row"):
        g.append_tokens(np.array([[3, 4]], np.int32))
    with pytest.raises(RequestError, match="encoder-decoder"):
        g.rewind_to(3)


def test_top_pairs_take_ties_as_libstdcxx_partial_sort_does():
    """Expected orders from ``std::partial_sort`` (GCC's libstdc++) over iota indices with ``s[a] > s[b]``."""
    s = np.array([1, 1, 0, 1, 1, 1, 0, 1], np.float32)
    assert top_pairs(s, 4).tolist() == [1, 3, 4, 0]
    s = np.array([0, 2, 2, 1, 2, 2, 2], np.float32)
    assert top_pairs(s, 3).tolist() == [4, 1, 2]
    s = np.array([3, 1, 3, 3, 0, 3, 2, 3, 3, 1, 3, 3], np.float32)
    assert top_pairs(s, 5).tolist() == [3, 0, 5, 7, 2]
    s = np.random.default_rng(1).standard_normal(50).astype(np.float32)  # no ties: the plain descending order
    assert top_pairs(s, 6).tolist() == np.argsort(-s, kind="stable")[:6].tolist()


def test_log_softmax_sums_the_exponentials_in_order():
    """onnxruntime-genai adds the exponentials one after the other in float32; numpy's pairwise sum rounds
    otherwise on long rows, which moves beam scores that tie to the last bit."""
    from pipeline.beam_search import log_softmax
    x = np.random.default_rng(3).standard_normal((2, 3001)).astype(np.float32)
    for row, got in zip(x, log_softmax(x)):
        d = row - row.max()
        total = np.float32(0)
        for v in d.tolist():
            total = np.float32(total + np.float32(np.exp(np.float64(v))))
        assert np.array_equal(got, d - np.float32(np.log(np.float64(total))))


def test_the_one_call_generate_and_what_the_decode_loop_refuses(package, ort_genai):
    steps, seqs = _run(ort_genai, package, [[3, 4, 5]])
    assert og.generate(og.Model(package, native="all"), [3, 4, 5], max_new_tokens=11) == seqs[0][3:]
    from pipeline.__main__ import main
    assert main(["parity", package, "--prompt-ids", "3,4,5"]) == 2  # the step-by-step loop is decoder-only
