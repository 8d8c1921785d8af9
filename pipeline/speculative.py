"""Speculative decoding: a draft model or the sequence's n-grams propose, the decoder checks several at a time.

As onnxruntime-genai 0.18 configures and runs it.

Two proposers, chosen as onnxruntime-genai chooses them:

- a **draft model** (``model.draft`` in ``genai_config.json``, a decoder section of its own): it runs one token at a
  time ahead of the decoder and proposes ``K`` tokens;
- **n-gram lookup** (``ngram_size`` > 0, no draft): the most recent earlier occurrence of the sequence's last
  ``ngram_size - 1`` tokens proposes what followed it (``NGramLookup``, onnxruntime-genai's rule: the latest
  occurrence wins; with ``ngram_chained_lookup`` the lookup continues from its own proposals).

A round (``Speculator.round``): the proposer gives ``d_0 .. d_{k-1}`` (``k`` = ``max_draft_tokens``, fewer near
``max_length``); the decoder runs once over its unfed token and the proposals, which gives the logits ``p_0 .. p_k``
of the positions after the sequence and after each proposal; the longest agreeing prefix ``d_0 .. d_{a-1}`` is
kept, followed by one token of the decoder's own (the correction from ``p_a`` when ``a < k``, else a bonus token
from ``p_k``).  The decoder's caches are cut back to the kept proposals (``rewind``), and ``Generator``
hands the round's tokens out one per ``generate_next_token``.

Invariants:
- **greedy** (``do_sample`` false or temperature 0): ``d_j`` agrees when it is the argmax of ``p_j`` after the same
  processing a plain step applies (repetition penalty, ``min_length``, ``no_repeat_ngram_size``) over the sequence
  it would extend; the tokens are those of plain greedy decoding, up to the rounding difference between a
  several-position run and one-position runs;
- **sampling** with a draft: Leviathan and Chen's rule over the truncated distributions (top-k, top-p, min-p,
  temperature): accept ``d_j`` with probability ``min(1, p_j(d_j) / q_j(d_j))`` (``q_j`` the draft's
  distribution), else draw from ``max(0, p_j - q_j)`` normalized.  The proposals and the bonus token take their
  ``random()`` values from the generator's sampler, in the order plain sampling would; the acceptance tests take
  theirs from a second generator seeded from the same seed.  So a draft that proposes from the decoder's own
  distribution reproduces plain sampling's tokens for the same seed.  A round cut short (``append_tokens``,
  ``rewind_to``, ``set_logits``, the end) takes back the draws of the tokens it never handed out;
- **sampling** with n-grams (a proposal with no distribution): each position draws from ``p_j`` as a plain step
  would, and the proposal is kept when the draw equals it; the tokens are plain sampling's for the same seed;
- the draft model is a ``Generator`` of its own; each round it is cut back to what it shares with the sequence and
  fed the rest, so it never runs over a token twice unless a rejection forces it;
- recurrent state (a hybrid decoder's linear attention or convolutions) cannot be cut back: the decoder's
  state before the checking run is kept (``DecoderComponent.snapshot``), and when proposals are dropped it goes
  back to it and runs the kept ids again (one more run, ``target_reconciliation_forward_passes``); a recurrent
  draft keeps a snapshot at the sequence (``Generator.snapshot_state``) and comes back to it each round;
- refused, with onnxruntime-genai's messages: ``batch_size`` > 1, beam search, a draft together with n-grams,
  guidance, sliding caches, decoders that give the last position's logits only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .package_checks import graph_ports
from .spec import RequestError

__all__ = ["SpeculativeOptions", "SPECULATIVE_KEYS", "set_speculative_option", "speculative_options",
           "NGramLookup", "Speculator", "empty_stats"]

_MIN_K, _MAX_K = 1, 16  # onnxruntime-genai's range of max_draft_tokens (and of the n-gram size)


@dataclass
class SpeculativeOptions:
    max_draft_tokens: int = 4
    ngram_size: int = 0
    ngram_chained_lookup: bool = False
    min_adaptive_k: int = 0  # > 0: the number of proposals adapts between this and 16 (AdaptiveK)
    cooldown: bool = False   # three rounds in a row with nothing accepted: one plain step (Cooldown)


SPECULATIVE_KEYS = {"max_draft_tokens": int, "ngram_size": int, "ngram_chained_lookup": bool,
                    "min_adaptive_k": int, "cooldown": bool}


def set_speculative_option(opts: SpeculativeOptions, name: str, value) -> None:
    """Set one option, with onnxruntime-genai's checks and messages."""
    kind = SPECULATIVE_KEYS.get(name)
    if kind is None:
        raise RequestError(f"Unknown value \"{name}\" (the speculative options are "
                           f"{', '.join(sorted(SPECULATIVE_KEYS))})")
    if kind is bool:
        if not isinstance(value, (bool, np.bool_)):
            raise RequestError(f"{name} - Expected a bool but saw a number")
        setattr(opts, name, bool(value))
        return
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise RequestError(f"Unknown speculative option type, must be bool, int, or float: {name}")
    if float(value) != int(value):
        raise RequestError(f"Field '{name}' value {value:g} is not an integer")
    v = int(value)
    if name == "max_draft_tokens" and not _MIN_K <= v <= _MAX_K:
        raise RequestError(f"speculative.max_draft_tokens must be between {_MIN_K} and {_MAX_K} Got: {v}.")
    if name == "ngram_size" and v != 0 and not 2 <= v <= _MAX_K:
        raise RequestError(f"speculative.ngram_size must be 0 or between 2 and {_MAX_K}. Got: {v}.")
    if name == "min_adaptive_k" and not 0 <= v <= _MAX_K:
        raise RequestError(f"speculative.min_adaptive_k must be 0 or between {_MIN_K} and {_MAX_K}. Got: {v}.")
    setattr(opts, name, v)


def speculative_options(section) -> SpeculativeOptions:
    """The ``speculative`` section of a genai_config.json (absent: the defaults)."""
    opts = SpeculativeOptions()
    if section is None:
        return opts
    if not isinstance(section, dict):
        raise RequestError("genai_config.speculative: expected a mapping")
    for k, v in section.items():
        set_speculative_option(opts, k, v)
    return opts


class NGramLookup:
    """The sequence's (n-1)-token keys, each mapped to the start of its latest occurrence that has a token after it."""

    def __init__(self, ngram_size: int):
        if ngram_size < 2:
            raise RequestError("NGramLookup requires ngram_size >= 2.")
        self.key = ngram_size - 1
        self.history: list = []
        self.starts: dict = {}

    def append(self, tokens) -> None:
        h, n = self.history, self.key
        for t in tokens:
            h.append(int(t))
            if len(h) > n:
                start = len(h) - n - 1
                self.starts[tuple(h[start:start + n])] = start

    def reset(self, tokens=()) -> None:
        self.history, self.starts = [], {}
        self.append(tokens)

    def sync(self, seq) -> int:
        """Bring the history to ``seq``: appended when it extends the history, else rebuilt.  Returns how many
        tokens were indexed."""
        h, n = self.history, len(self.history)
        if len(seq) >= n and list(seq[:n]) == h:
            self.append(seq[n:])
            return len(seq) - n
        self.reset(seq)
        return len(seq)

    def propose(self, max_tokens: int, chained: bool = False) -> list:
        h, n = self.history, self.key
        if max_tokens <= 0 or len(h) < n:
            return []
        context = tuple(h[len(h) - n:])
        start = self.starts.get(context)
        if start is None:
            return []
        if not chained:
            at = start + n
            return h[at:at + max_tokens]
        out = []
        while start is not None and len(out) < max_tokens:
            tok = h[start + n]
            out.append(tok)
            context = context[1:] + (tok,)
            start = self.starts.get(context)
        return out


_STAT_KEYS = ("rounds", "completed_rounds", "interrupted_rounds", "active_rounds", "draft_tokens_proposed",
              "draft_tokens_evaluated", "draft_tokens_accepted", "correction_tokens", "bonus_tokens",
              "tokens_queued", "tokens_emitted", "tokens_discarded", "tokens_buffered", "draft_forward_passes",
              "target_forward_passes", "effective_k", "adaptive_k_increases", "adaptive_k_decreases",
              "adaptive_k_observations", "adaptive_k_probes", "cooldown_entries", "cooldown_steps",
              "cooldown_remaining", "standard_fallback_steps", "mtp_failures", "dflash2_failures",
              "dflash2_disables", "dflash2_admission_misses", "full_accept_rounds", "partial_accept_rounds",
              "zero_accept_rounds", "target_verify_forward_passes", "target_reanchor_forward_passes",
              "target_reconciliation_forward_passes", "ngram_lookup_hits", "ngram_lookup_misses",
              "ngram_lookup_tokens_proposed", "ngram_chained_tokens_proposed", "ngram_grammar_candidate_rejections",
              "ngram_history_syncs", "ngram_history_tokens_synced")
_TIME_KEYS = ("total_draft_ms", "total_target_ms", "total_reconciliation_ms", "total_target_verify_ms",
              "total_target_reanchor_ms", "total_ngram_history_sync_ms", "total_ngram_lookup_ms")
_HISTOGRAM_BINS = 8


def empty_stats() -> dict:
    """onnxruntime-genai's statistics of a generator that does not decode speculatively: every key, all zero."""
    out = {k: 0 for k in _STAT_KEYS}
    out["formula_supported"] = False
    out.update({k: 0.0 for k in _TIME_KEYS})
    out.update({k: 0.0 for k in ("avg_draft_ms_per_token", "acceptance_rate", "avg_draft_tokens_per_round",
                                 "mean_emitted_tokens_per_round", "expected_tokens_per_round",
                                 "avg_target_ms_per_round", "target_baseline_ms_per_token",
                                 "target_overhead_ratio", "estimated_speedup", "observed_speedup",
                                 "adaptive_k_throughput")})
    out["acceptance_length_histogram"] = [0] * _HISTOGRAM_BINS
    return out


class AdaptiveK:
    """How many tokens a round proposes, onnxruntime-genai's policy.  Fixed at ``max_draft_tokens`` unless
    ``min_adaptive_k`` > 0; then it starts there and moves by one within [min_adaptive_k, 16]:

    - each completed round that proposed the current width in full is one observation of that width: committed
      tokens, milliseconds (proposing and checking) and acceptance, smoothed with weight 1/4 for the new one;
    - with two observations of the width (and two rounds since the last move), acceptance below 1/2 tries one
      less, 3/4 or more tries one more: a probe;
    - a probe is judged after two observations of the new width: kept when its throughput (tokens per ms) is at
      least 97% of the width it left and, going up, acceptance stays at 3/4 or more; dropped at once when its
      throughput falls below 80%.  After a kept probe one round passes before the next decision, after a dropped
      one six.  Only acceptance and the measured throughput decide, so the tokens never depend on it.
    """
    TOP = 16
    WEIGHT, HIGH, LOW, KEEP, SEVERE = 0.25, 0.75, 0.50, 0.97, 0.80
    SAMPLES, PROBE_SAMPLES, WAIT_KEPT, WAIT_DROPPED = 2, 2, 1, 6

    def __init__(self, fixed_k: int, min_k: int):
        self.enabled = min_k > 0
        self.lo = min_k if self.enabled else fixed_k
        self.hi = self.TOP if self.enabled else fixed_k
        self.increases = self.decreases = self.observations = self.probes = 0
        self.reset()

    def reset(self):
        self.k = self.lo
        self.est = {}          # width -> [tokens, ms, acceptance, samples]
        self.origin = 0        # the width a probe left (0: no probe)
        self.probe_seen = 0
        self.stable = 0
        self.wait = 0

    def _rate(self, k) -> float:
        e = self.est.get(k)
        return e[0] / e[1] if e and e[1] > 0 else 0.0

    def throughput(self) -> float:
        if self.k in self.est:
            return self._rate(self.k)
        return self._rate(self.origin) if self.origin else 0.0

    def _move(self, k):
        if k > self.k:
            self.increases += 1
        elif k < self.k:
            self.decreases += 1
        self.k = k

    def _probe(self, k):
        self.origin, self.probe_seen, self.stable = self.k, 0, 0
        self.probes += 1
        self._move(k)

    def _settle_probe(self, keep: bool):
        if not keep:
            self._move(self.origin)
        self.origin, self.probe_seen, self.stable = 0, 0, 0
        self.wait = self.WAIT_KEPT if keep else self.WAIT_DROPPED

    def record(self, k, evaluated, accepted, committed, filled, ms):
        if not self.enabled or k != self.k or evaluated <= 0 or committed == 0 or not filled or not ms > 0:
            return
        acc = accepted / evaluated
        e = self.est.get(k)
        if e is None:
            e = self.est[k] = [float(committed), ms, acc, 1]
        else:
            e[0] += self.WEIGHT * (committed - e[0])
            e[1] += self.WEIGHT * (ms - e[1])
            e[2] += self.WEIGHT * (acc - e[2])
            e[3] += 1
        self.observations += 1
        if self.origin:
            self.probe_seen += 1
            base, now = self._rate(self.origin), self._rate(k)
            if base > 0 and now < base * self.SEVERE:
                self._settle_probe(False)
            elif self.probe_seen >= self.PROBE_SAMPLES:
                self._settle_probe((base <= 0 or now >= base * self.KEEP)
                                   and (self.k < self.origin or e[2] >= self.HIGH))
            return
        self.stable += 1
        if self.wait > 0:
            self.wait -= 1
            return
        if e[3] < self.SAMPLES:
            return
        if e[2] < self.LOW and self.k > self.lo:
            self._probe(self.k - 1)
        elif e[2] >= self.HIGH and self.k < self.hi and self.stable >= self.SAMPLES:
            self._probe(self.k + 1)


class Cooldown:
    """``cooldown``: after three completed rounds in a row that proposed the narrowest width and had nothing
    accepted, the next token comes from one plain step (the proposer then catches up)."""
    ROUNDS = 3

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.entries = self.steps = 0
        self.reset()

    def reset(self):
        self.misses = 0
        self.remaining = 0

    def record(self, k, narrowest, evaluated, accepted):
        if not self.enabled or evaluated <= 0:
            return
        if accepted > 0 or k != narrowest:
            self.misses = 0
            return
        self.misses += 1
        if self.misses == self.ROUNDS:
            self.misses, self.remaining = 0, 1
            self.entries += 1

    def take_step(self) -> bool:
        """Whether the next token is a plain step (and count it)."""
        if self.remaining <= 0:
            return False
        self.remaining -= 1
        self.steps += 1
        return True


def check_speculative(model, params) -> str | None:
    """Which proposer ``model`` and ``params`` call for ('draft', 'ngram' or None); refuses what cannot be
    decoded speculatively, with onnxruntime-genai's messages where it has one."""
    draft = model.spec.draft is not None
    opts = params.speculative
    if not draft and opts.ngram_size <= 0:
        return None
    s = params.search
    kind = "draft" if draft else "ngram"
    if draft and opts.ngram_size > 0:
        raise RequestError("N-gram decoding cannot be combined with draft-model speculative decoding.")
    if int(s.batch_size) != 1:
        raise RequestError(f"Speculative decoding does not support batch_size > 1 in this release. Got "
                           f"batch_size={int(s.batch_size)}" if draft else
                           "N-gram decoding requires batch_size=1 in this release.")
    if int(s.num_beams) != 1:
        raise RequestError(f"Speculative decoding does not support num_beams > 1 (beam search). Got "
                           f"num_beams={int(s.num_beams)}." if draft else
                           "N-gram decoding does not support beam search in this release.")
    if params.guidance is not None:
        raise RequestError("speculative decoding with guidance is not supported here: the grammar would have to "
                           "follow every proposal and step back on a rejection")
    spec = model.spec
    if len(spec.components) != 1 or spec.marian_ports is not None:
        raise RequestError("Speculative decoding does not support pipeline models in this release; target and "
                           "draft must be plain decoder-only LLMs.")
    sw = spec.sliding_window
    if isinstance(sw, dict) and sw.get("slide_key_value_cache"):
        raise RequestError("N-gram decoding requires a rewindable KV cache; sliding-window, hybrid, and "
                           "model-managed state are not supported in this release." if kind == "ngram" else
                           "Speculative decoding does not support physically sliding KV caches in this release; "
                           "WindowedKeyValueCache cannot rewind after discarding KV history.")
    dec = spec.decoder
    shape = graph_ports(dec.filename, dec.data)[1].get(dec.io.logits_output, (None,))[0]
    if shape and len(shape) == 3 and shape[1] == 1:
        raise RequestError("N-gram decoding requires target logits for every verified token; pruned last-token-only "
                           "logits are not supported in this release." if kind == "ngram" else
                           "speculative decoding needs the decoder's logits for every position it checks; this "
                           "decoder gives the last position's only")
    return kind


class Speculator:
    """The rounds of one batch-of-one ``Generator`` (``pipeline/generator.py``), and their statistics."""

    def __init__(self, gen, kind: str, head=None):
        self.gen = gen
        self.head = head  # kind "mtp": the MTP head (pipeline/mtp.py)
        opts = gen.params.speculative
        self.adaptive = AdaptiveK(int(opts.max_draft_tokens), int(opts.min_adaptive_k))
        self.cooldown = Cooldown(bool(opts.cooldown))
        self.kind = kind
        self.stats = empty_stats()
        self.stats["formula_supported"] = True
        self.current = None  # the round being handed out: its counts, for the policies when it ends
        self.marks = []
        self._accept_rng = None
        if kind == "draft":
            from .api import GeneratorParams
            draft_model = gen.model.draft_model
            dp = GeneratorParams(draft_model)
            dp.search = gen.search
            dp.speculative = SpeculativeOptions()
            from .generator import Generator
            self.draft = Generator(draft_model, dp)
        elif kind == "ngram":
            self.lookup = NGramLookup(int(opts.ngram_size))
            self.chained = bool(opts.ngram_chained_lookup)

    # -- proposals -----------------------------------------------------------------------------------
    def _pick(self, logits, hist):
        """The proposal from one row of logits over ``hist``: (token, its distribution or None when greedy)."""
        g = self.gen
        x = g._processed(logits, hist)
        if g.sampler.greedy:
            return int(g.sampler.next_token(x, np.asarray(hist, np.int64))), None
        ids, w = g.sampler.distribution(x, np.asarray(hist, np.int64))
        self.marks.append(g.sampler.rng.bit_generator.state)
        return g.sampler.draw(ids, w), (ids, w)

    def _propose_draft(self, seq, k):
        d = self.draft
        t0 = time.perf_counter()
        runs = d._runs
        rows = d._rows[0]
        common = 0
        for a, b in zip(rows, seq):
            if a != b:
                break
            common += 1
        if d.pipe.decoder.io.state_pairs and d._snapshot is not None and d._snapshot[0] <= common:
            common = d._snapshot[0]  # recurrent state comes back only to its snapshot
        if common < len(rows):
            d.rewind_to(common)
        if common < len(seq):
            d.append_tokens(np.asarray(seq[common:], np.int64))
        d.snapshot_state()  # a recurrent draft's state at the sequence, for the next round (else a no-op)
        drafts, dists, hist = [], [], list(seq)
        for i in range(k):
            tok, dist = self._pick(d.get_logits()[0, -1], hist)
            drafts.append(tok)
            dists.append(dist)
            hist.append(tok)
            if i < k - 1:
                d.append_tokens(np.asarray([tok], np.int64))
        self.stats["draft_forward_passes"] += d._runs - runs
        self.stats["total_draft_ms"] += (time.perf_counter() - t0) * 1e3
        return drafts, dists

    def _propose_ngram(self, seq, k):
        st = self.stats
        t0 = time.perf_counter()
        st["ngram_history_tokens_synced"] += self.lookup.sync(seq)
        st["ngram_history_syncs"] += 1
        t1 = time.perf_counter()
        drafts = self.lookup.propose(k, self.chained)
        st["total_ngram_history_sync_ms"] += (t1 - t0) * 1e3
        st["total_ngram_lookup_ms"] += (time.perf_counter() - t1) * 1e3
        if drafts:
            st["ngram_lookup_hits"] += 1
            st["ngram_lookup_tokens_proposed"] += len(drafts)
            if self.chained:  # the tokens after the first, which the chain's later lookups gave
                st["ngram_chained_tokens_proposed"] += len(drafts) - 1
        else:
            st["ngram_lookup_misses"] += 1
        return drafts, [None] * len(drafts)

    # -- one round -----------------------------------------------------------------------------------
    def round(self) -> list | None:
        """Propose, check and accept: the round's tokens, each with the logits of the position after it (None for
        the last), or None when no round can run (no room before ``max_length``, or no proposal): the
        caller then takes a plain step."""
        g = self.gen
        st = self.stats
        seq = list(g._rows[0])
        k = min(self.adaptive.k, g.max_length - len(seq))
        if g._rope_at and len(seq) < g._rope_at:  # a round stops at the rotary switch (re-prefilled there)
            k = min(k, g._rope_at - len(seq))
        if k < 1:
            st["standard_fallback_steps"] += 1
            return None
        self.marks = []  # the sampler's state before each position's draw, in position order
        t_prop = time.perf_counter()
        if self.kind == "draft":
            drafts, dists = self._propose_draft(seq, k)
        elif self.kind == "mtp":
            from .mtp import propose
            drafts, dists = propose(self, seq, k)
        else:
            drafts, dists = self._propose_ngram(seq, k)
        propose_ms = (time.perf_counter() - t_prop) * 1e3
        if not drafts:
            st["standard_fallback_steps"] += 1
            return None
        filled = len(drafts) == k
        k = len(drafts)
        t0 = time.perf_counter()
        p = g._verify(drafts)
        g._logits = np.ascontiguousarray(p[0], np.float32).reshape(1, 1, -1)  # the position after the sequence
        st["total_target_ms"] += (time.perf_counter() - t0) * 1e3
        st["total_target_verify_ms"] = st["total_target_ms"]
        st["target_forward_passes"] += 1
        st["target_verify_forward_passes"] += 1
        out, hist = [], list(seq)
        for j in range(k):
            tok = self._accept(p[j], hist, drafts[j], dists[j])
            if tok != drafts[j]:
                out.append(tok)
                st["correction_tokens"] += 1
                break
            out.append(tok)
            hist.append(tok)
        else:
            out.append(self._accept(p[k], hist, None, None))
            st["bonus_tokens"] += 1
        a = len(out) - 1  # proposals kept
        evaluated = k if a == k else a + 1  # the comparisons made: up to the first disagreement
        g._keep_verified(len(seq) + a)
        st["rounds"] += 1
        st["draft_tokens_proposed"] += k
        st["draft_tokens_evaluated"] += evaluated
        st["draft_tokens_accepted"] += a
        st["tokens_queued"] += len(out)
        st["acceptance_length_histogram"][min(a, _HISTOGRAM_BINS - 1)] += 1
        self.current = dict(k=self.adaptive.k, evaluated=evaluated, accepted=a, emitted=0, filled=filled,
                            ms=propose_ms + (time.perf_counter() - t0) * 1e3)
        return [(t, p[j + 1] if j < a else None) for j, t in enumerate(out)]

    def _accept(self, logits, hist, proposed, dist):
        """The decoder's token at one position: ``proposed`` when the rule accepts it, else its own (the
        correction, or the bonus when nothing was proposed)."""
        g = self.gen
        x = g._processed(logits, hist)
        h = np.asarray(hist, np.int64)
        if g.sampler.greedy or dist is None:  # greedy, an n-gram proposal or the bonus: a plain pick
            if not g.sampler.greedy and self.kind == "ngram":
                self.marks.append(g.sampler.rng.bit_generator.state)
            return int(g.sampler.next_token(x, h))
        ids, w = g.sampler.distribution(x, h)
        pt = w / w.sum()
        p_d = float(pt[ids == proposed].sum())
        q_ids, q = dist[0], dist[1] / dist[1].sum()
        q_d = float(q[q_ids == proposed].sum())
        if self._accept_rng is None:
            seed = g.search.seed
            self._accept_rng = np.random.default_rng(None if seed is None or seed < 0 else [int(seed), 1])
        if q_d > 0 and self._accept_rng.random() < min(1.0, p_d / q_d):
            return int(proposed)
        dense = np.zeros(np.shape(logits)[-1])  # q over the vocabulary, read back at p's ids
        dense[q_ids] = q
        resid = np.maximum(pt - dense[ids], 0.0)
        if resid.sum() <= 0.0:
            return g.sampler.draw(ids, w)
        return g.sampler.draw(ids, resid)

    # -- bookkeeping -----------------------------------------------------------------------------------
    def reconciled(self):
        """The decoder ran the kept ids again after a round on recurrent state (``Generator._keep_verified``)."""
        self.stats["target_reconciliation_forward_passes"] += 1
        self.stats["target_forward_passes"] += 1

    def plain_step(self) -> bool:
        """Whether the next token comes from a plain step (a cooldown), counted as one."""
        if self.cooldown.take_step():
            self.stats["standard_fallback_steps"] += 1
            return True
        return False

    def emitted(self, n: int = 1):
        """``n`` of the round's tokens joined the sequence."""
        self.stats["tokens_emitted"] += n
        if self.current is not None:
            self.current["emitted"] += n

    def finish(self, dropped: int = 0):
        """The current round ends: drained, or with ``dropped`` tokens never handed out (interrupted)."""
        r, st = self.current, self.stats
        if r is None:
            return
        self.current = None
        if dropped:
            st["tokens_discarded"] += dropped
            st["interrupted_rounds"] += 1
            if r["emitted"] < len(self.marks):  # the draws for tokens never handed out are taken back
                self.gen.sampler.rng.bit_generator.state = self.marks[r["emitted"]]
            return
        st["completed_rounds"] += 1
        if r["evaluated"]:
            a = r["accepted"]
            st["zero_accept_rounds" if a == 0 else "full_accept_rounds" if a == r["evaluated"]
               else "partial_accept_rounds"] += 1
        self.cooldown.record(r["k"], self.adaptive.lo, r["evaluated"], r["accepted"])
        self.adaptive.record(r["k"], r["evaluated"], r["accepted"], r["emitted"], r["filled"], r["ms"])

    def reset(self, dropped: int = 0):
        """The sequence was cut back (``rewind_to``): the round is dropped and the policies start over."""
        self.finish(dropped)
        self.adaptive.reset()
        self.cooldown.reset()

    def report(self) -> dict:
        st = dict(self.stats)
        ak, cd = self.adaptive, self.cooldown
        st.update(effective_k=ak.k, adaptive_k_increases=ak.increases, adaptive_k_decreases=ak.decreases,
                  adaptive_k_observations=ak.observations, adaptive_k_probes=ak.probes,
                  adaptive_k_throughput=ak.throughput(), cooldown_entries=cd.entries, cooldown_steps=cd.steps,
                  cooldown_remaining=cd.remaining, active_rounds=int(self.current is not None),
                  tokens_buffered=len(self.gen._queue))
        st["acceptance_length_histogram"] = list(st["acceptance_length_histogram"])
        r = st["rounds"]
        if st["draft_tokens_evaluated"]:
            st["acceptance_rate"] = st["draft_tokens_accepted"] / st["draft_tokens_evaluated"]
        if r:
            st["avg_draft_tokens_per_round"] = st["draft_tokens_proposed"] / r
            st["mean_emitted_tokens_per_round"] = st["tokens_queued"] / r
            st["expected_tokens_per_round"] = (st["draft_tokens_accepted"] + r) / r
            st["avg_target_ms_per_round"] = st["total_target_ms"] / r
        if st["draft_tokens_proposed"]:
            st["avg_draft_ms_per_token"] = st["total_draft_ms"] / st["draft_tokens_proposed"]
        return st
