"""Next-token selection (pipeline.sampling) and the tokenizer wrapper (pipeline.tokenizer).

Sampling masks are checked by drawing many seeded tokens from hand-made
distributions and looking at which ids ever come out; the tokenizer tests build
a tiny byte-level BPE tokenizer in code (no package on disk is needed).
"""
import json

import numpy as np
import pytest

from pipeline.sampling import Sampler, greedy_argmax
from pipeline.spec import SearchOptions


F32 = np.float32


def logits_from_probs(p):
    return np.log(np.asarray(p, dtype=np.float64)).astype(F32)


def draws(opts, logits, n=2000, history=None):
    s = Sampler(opts)
    return np.array([s.next_token(logits, history) for _ in range(n)])


def sample_opts(**kw):
    kw.setdefault("seed", 1234)
    return SearchOptions(do_sample=True, **kw)


# ---------------------------------------------------------------------------------------------
# greedy
# ---------------------------------------------------------------------------------------------

def test_greedy_first_max_on_ties():
    x = np.array([0.5, 2.0, -1.0, 2.0, 2.0], F32)
    assert Sampler(SearchOptions()).next_token(x) == 1
    assert int(greedy_argmax(x)) == 1
    assert greedy_argmax(x).shape == ()


def test_greedy_nan_is_minus_inf():
    x = np.array([np.nan, -3.0, np.nan, -1.0, -1.0], F32)
    assert Sampler(SearchOptions()).next_token(x) == 3
    assert int(greedy_argmax(np.full(4, np.nan, F32))) == 0
    assert int(greedy_argmax(np.array([-np.inf, np.nan, -np.inf], F32))) == 0
    assert int(greedy_argmax(np.array([np.nan, np.inf, 1.0], F32))) == 1


def test_greedy_argmax_batched_and_dtypes():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3000)).astype(F32)
    x[2, 7] = x[2, 9] = 100.0
    got = greedy_argmax(x)
    assert got.dtype == np.int64 and got.shape == (5,)
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))
    assert got[2] == 7
    np.testing.assert_array_equal(greedy_argmax(x.astype(np.float16)), np.argmax(x.astype(np.float16), axis=1))
    np.testing.assert_array_equal(Sampler(SearchOptions()).next_tokens(x), np.argmax(x, axis=1))


def test_temperature_zero_is_greedy():
    x = np.array([0.0, 1.0, 3.0, 3.0], F32)
    assert set(draws(sample_opts(temperature=0.0, top_k=0), x, 50)) == {2}


# ---------------------------------------------------------------------------------------------
# repetition penalty
# ---------------------------------------------------------------------------------------------

def test_repetition_penalty_exact_values():
    # the penalized logits decide the greedy winner; check each case exactly on a copy
    s = Sampler(SearchOptions(repetition_penalty=2.0))
    x = np.array([4.0, -2.0, 3.0, 1.0, -0.5], F32)
    before = x.copy()
    got = s._prepare(x, np.array([0, 1, 0, 0, 1, 4], np.int64))
    np.testing.assert_array_equal(got, np.array([2.0, -4.0, 3.0, 1.0, -1.0], F32))
    np.testing.assert_array_equal(x, before)  # the caller's logits are untouched
    # 4 -> 2 loses to 3
    assert s.next_token(x, np.array([0, 0, 0])) == 2
    assert s.next_token(x, np.array([], np.int64)) == 0
    assert s.next_token(x, None) == 0
    # penalty < 1 boosts
    s2 = Sampler(SearchOptions(repetition_penalty=0.5))
    np.testing.assert_array_equal(s2._prepare(x, np.array([3, 1])), np.array([4.0, -1.0, 3.0, 2.0, -0.5], F32))


def test_repetition_penalty_float32_division():
    s = Sampler(SearchOptions(repetition_penalty=1.3))
    x = np.array([0.7, -0.7, 0.0], F32)
    got = s._prepare(x, np.array([0, 1, 2]))
    np.testing.assert_array_equal(got, np.array([F32(0.7) / F32(1.3), F32(-0.7) * F32(1.3), 0.0], F32))


def test_repetition_penalty_bad_history_and_options():
    s = Sampler(SearchOptions(repetition_penalty=1.5))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        s.next_token(np.zeros(4, F32), np.array([1, 4]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        s.next_token(np.zeros(4, F32), np.array([-1]))
    with pytest.raises(ValueError, match="repetition_penalty"):
        Sampler(SearchOptions(repetition_penalty=0.0))
    with pytest.raises(ValueError, match="temperature"):
        Sampler(SearchOptions(do_sample=True, temperature=-1.0))


# ---------------------------------------------------------------------------------------------
# sampling masks
# ---------------------------------------------------------------------------------------------

P = [0.05, 0.30, 0.02, 0.25, 0.18, 0.12, 0.08]  # sorted: 1 (.30), 3 (.25), 4 (.18), 5 (.12), 6 (.08), 0, 2


def test_full_distribution_frequencies():
    d = draws(sample_opts(top_k=0), logits_from_probs(P), 6000)
    freq = np.bincount(d, minlength=len(P)) / len(d)
    np.testing.assert_allclose(freq, P, atol=0.02)


def test_top_k_mask():
    d = draws(sample_opts(top_k=3), logits_from_probs(P))
    assert set(d) == {1, 3, 4}
    freq = np.bincount(d, minlength=len(P)) / len(d)
    np.testing.assert_allclose(freq[[1, 3, 4]], np.array([0.30, 0.25, 0.18]) / 0.73, atol=0.03)
    # k <= 0 or k >= vocab: no limit
    for k in (0, -1, len(P), 100):
        assert set(draws(sample_opts(top_k=k), logits_from_probs(P), 3000)) == set(range(len(P)))


def test_top_k_ties_prefer_low_ids():
    x = np.array([1.0, 5.0, 5.0, 5.0, 0.0], F32)
    assert set(draws(sample_opts(top_k=2), x, 400)) == {1, 2}
    assert set(draws(sample_opts(top_k=1), x, 50)) == {1}


@pytest.mark.parametrize("top_p,allowed", [(0.5, {1, 3}), (0.55, {1, 3}), (0.56, {1, 3, 4}),
                                            (0.3, {1}), (0.1, {1}), (0.0, {1}), (1.0, set(range(7)))])
def test_top_p_mask(top_p, allowed):
    # cumulative sorted mass: .30, .55, .73, .85, .93, .98, 1.0
    assert set(draws(sample_opts(top_k=0, top_p=top_p), logits_from_probs(P), 3000)) == allowed


def test_top_p_after_top_k_is_renormalized():
    # top-k 3 keeps .30/.25/.18 -> renormalized .411/.342/.247; top_p .7 keeps 1 and 3 (.753)
    assert set(draws(sample_opts(top_k=3, top_p=0.7), logits_from_probs(P))) == {1, 3}
    # without renormalization .30 + .25 = .55 < .7 would also keep 4
    assert set(draws(sample_opts(top_k=0, top_p=0.7), logits_from_probs(P))) == {1, 3, 4}


@pytest.mark.parametrize("min_p,allowed", [(0.0, set(range(7))), (0.59, {1, 3, 4}), (0.61, {1, 3}),
                                            (0.9, {1}), (1.0, {1}), (2.0, {1})])
def test_min_p_mask(min_p, allowed):
    # relative to the max .30: .25 -> .83, .18 -> .6, .12 -> .4, .08 -> .27
    for k in (0, 5):
        got = set(draws(sample_opts(top_k=k, min_p=min_p), logits_from_probs(P), 3000))
        assert got == (allowed if k == 0 else allowed & {1, 3, 4, 5, 6}), k


def test_combined_masks_with_penalty():
    x = logits_from_probs(P)
    # log(.30) < 0, so the penalty multiplies it: -1.2 -> -3.6 sinks token 1 below the nucleus
    got = set(draws(sample_opts(top_k=0, top_p=0.5, repetition_penalty=3.0), x, 2000, history=np.array([1, 1])))
    assert 1 not in got and got == {3, 4}


def test_nan_never_drawn():
    x = np.array([np.nan, 1.0, np.nan, 1.0, -np.inf], F32)
    for opts in (sample_opts(top_k=0), sample_opts(top_k=3), sample_opts(top_k=0, top_p=0.9),
                 sample_opts(top_k=0, min_p=0.1)):
        assert set(draws(opts, x, 500)) == {1, 3}
    assert set(draws(sample_opts(top_k=0), np.full(4, np.nan, F32), 20)) == {0}


def test_temperature_effect():
    x = np.array([2.0, 1.0, 0.0], F32)
    def freq(t):
        d = draws(sample_opts(top_k=0, temperature=t), x, 4000)
        return np.bincount(d, minlength=3) / len(d)
    for t in (0.5, 1.0, 2.0):
        want = np.exp(x / t) / np.exp(x / t).sum()
        np.testing.assert_allclose(freq(t), want, atol=0.025)
    assert freq(0.05)[0] > 0.99


def test_wide_nucleus_large_vocab():
    # a flat 50k vocabulary: the nucleus exceeds the heap probe and goes through the histogram gather
    rng = np.random.default_rng(3)
    x = rng.standard_normal(50000).astype(F32)
    p = np.exp(x.astype(np.float64) - x.max())
    p /= p.sum()
    order = np.lexsort((np.arange(len(x)), -x))
    cum = np.cumsum(p[order])
    keep = int(np.searchsorted(cum, 0.6)) + 1
    allowed = set(order[:keep].tolist())
    d = draws(sample_opts(top_k=0, top_p=0.6), x, 400)
    assert set(d) <= allowed
    assert len(set(d)) > 300
    # just past the probe (1024 best tokens): still exact
    p_probe = float(cum[1030])
    keep = int(np.searchsorted(cum, p_probe)) + 1
    assert set(draws(sample_opts(top_k=0, top_p=p_probe), x, 300)) <= set(order[:keep].tolist())


def test_large_vocab_top_k_matches_sort():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(100000).astype(F32)
    x[[10, 20, 30]] = 9.0
    x[[40, 50]] = 8.0
    got = set(draws(sample_opts(top_k=4, temperature=0.3), x, 1000))
    assert got == {10, 20, 30, 40}


# ---------------------------------------------------------------------------------------------
# seeding and batching
# ---------------------------------------------------------------------------------------------

def test_seed_reproducibility():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(5000).astype(F32)
    for kw in (dict(top_k=0), dict(top_k=40), dict(top_k=0, top_p=0.8), dict(top_k=0, min_p=0.05)):
        a = draws(sample_opts(seed=7, **kw), x, 100)
        b = draws(sample_opts(seed=7, **kw), x, 100)
        c = draws(sample_opts(seed=8, **kw), x, 100)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
    # no seed (or onnxruntime-genai's -1): fresh entropy, still valid ids
    for seed in (None, -1):
        d = draws(sample_opts(seed=seed, top_k=0), x, 50)
        assert d.min() >= 0 and d.max() < len(x)


def test_batched_matches_single_rows():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 800)).astype(F32)
    hist = [np.array([1, 2, 3]), np.array([], np.int64), np.array([799, 799])]
    opts = sample_opts(seed=11, top_k=20, top_p=0.9, temperature=0.8, repetition_penalty=1.2)
    sb, s1 = Sampler(opts), Sampler(opts)
    for _ in range(20):
        got = sb.next_tokens(x, hist)
        assert got.dtype == np.int64 and got.shape == (3,)
        want = [s1.next_token(x[b], hist[b]) for b in range(3)]
        np.testing.assert_array_equal(got, want)
    g = Sampler(SearchOptions(repetition_penalty=1.5))
    want = [g.next_token(x[b], hist[b]) for b in range(3)]
    np.testing.assert_array_equal(g.next_tokens(x, hist), want)
    with pytest.raises(ValueError, match="histories"):
        g.next_tokens(x, hist[:2])
    with pytest.raises(ValueError, match="batch, vocab"):
        g.next_tokens(x[0])


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------

def make_tokenizer(folder, config=None, bos_post_processor=True):
    """A byte-level BPE tokenizer: 256 byte tokens, a few merges, <s>/</s> specials."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, processors

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<s>": 0, "</s>": 1}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    if bos_post_processor:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                           special_tokens=[("<s>", 0)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_tokenizer_round_trip(tmp_path):
    from pipeline.tokenizer import Tokenizer

    tok = Tokenizer(make_tokenizer(tmp_path / "tok"))
    plain = tok.encode("hello world")  # onnxruntime-genai's default: no special token
    assert tok.id_to_token(int(plain[0])) == "hello"
    tok.update_options(add_special_tokens="true")
    ids = tok.encode("hello world")
    assert ids.dtype == np.int64
    assert ids[0] == 0 and list(ids[1:]) == list(plain)  # <s> from the post-processor
    assert tok.id_to_token(int(ids[1])) == "hello"
    assert tok.decode(ids) == "hello world"
    assert tok.decode(np.append(ids, 1)) == "hello world"  # </s> skipped
    text = "héllo wörld ✓ 日本 🙂"
    assert tok.decode(tok.encode(text)) == text
    assert [list(e) for e in tok.encode_batch(["hello", "he"])] == [list(tok.encode("hello")), list(tok.encode("he"))]
    # a path to the json file itself works too
    assert list(Tokenizer(tmp_path / "tok" / "tokenizer.json").encode("hello")) == list(tok.encode("hello"))[1:]
    tok.update_options(skip_special_tokens=False)
    assert tok.decode(np.append(ids, 1)) == "<s>hello world</s>"
    with pytest.raises(RuntimeError, match="Invalid tokenizer option key: foo"):
        tok.update_options(foo="1")


def test_tokenizer_config_bos_hint(tmp_path):
    from pipeline.tokenizer import Tokenizer

    def special(folder):
        t = Tokenizer(folder)
        t.update_options(add_special_tokens="true")
        return t
    plain = special(make_tokenizer(tmp_path / "a", bos_post_processor=False))
    assert plain.encode("hello")[0] != 0
    hinted = special(make_tokenizer(tmp_path / "b", config={"add_bos_token": True, "bos_token": "<s>"},
                                    bos_post_processor=False))
    assert list(hinted.encode("hello")) == [0] + list(plain.encode("hello"))
    # the post-processor already adds <s>: not doubled
    both = special(make_tokenizer(tmp_path / "c", config={"add_bos_token": True, "bos_token": {"content": "<s>"}}))
    ids = both.encode("hello")
    assert ids[0] == 0 and ids[1] != 0
    assert both.bos_token_id == 0


def test_tokenizer_missing_file(tmp_path):
    from pipeline.tokenizer import Tokenizer

    with pytest.raises(FileNotFoundError, match=str(tmp_path).replace("\\", "\\\\")):
        Tokenizer(tmp_path)


def test_tokenizer_stream_pieces(tmp_path):
    from pipeline.tokenizer import Tokenizer

    tok = Tokenizer(make_tokenizer(tmp_path / "tok"))
    tok.update_options(add_special_tokens=True)
    text = "hello wé 日本🙂!"
    ids = tok.encode(text)
    stream = tok.create_stream()
    pieces = [stream.decode(int(i)) for i in ids]
    assert "".join(pieces) == text
    assert pieces[0] == ""  # <s>
    assert "hello" in pieces
    assert not any("\ufffd" in p for p in pieces)
    # each multi-byte character arrives whole, on the token carrying its last byte
    for ch in "é日本🙂":
        assert ch in pieces
        nbytes = len(ch.encode("utf-8"))
        k = pieces.index(ch)
        assert pieces[k - nbytes + 1:k] == [""] * (nbytes - 1)
    # a fresh stream (or reset) starts over
    stream.reset()
    assert "".join(stream.decode(int(i)) for i in tok.encode("hello")) == "hello"
