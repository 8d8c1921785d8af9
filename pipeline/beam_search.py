"""Beam search over one prompt, with onnxruntime-genai's scoring.

``BeamSearch(num_beams, length_penalty, early_stopping, eos)`` keeps ``num_beams`` rows (the decoder runs them
as a batch) and their running sums of log-probabilities.  ``step(logits, rows)`` takes each row's next-token
logits and token ids and returns ``(tokens, parents)``: the next token of each new beam and the row it
continues (the caller reorders the decoder's caches by ``parents``).  The rules are onnxruntime-genai's:

- scores are each row's log-softmax plus the row's sum so far; at the first step only the first row counts
  (the others start at -1e9, so the beams do not all pick one token);
- the best ``2 * num_beams`` (row, token) pairs are taken in descending score; an EOS among the first
  ``num_beams`` of them ends a hypothesis (the row's ids without the EOS, scored by its sum divided by its
  length to the power ``length_penalty``, the prompt counted); the other pairs fill the new beams, in order,
  until there are ``num_beams``;
- the search is done once ``num_beams`` hypotheses are kept and, without ``early_stopping``, the best pair's
  sum divided by the current length to that power cannot beat the worst of them; once done, the beams take
  pads;
- ``finish(rows)`` (at the end) adds the open beams as hypotheses with their sums; ``hypothesis(i)`` is the
  i-th best.

Invariants: sums are float32 as onnxruntime-genai keeps them; the best pairs are taken as onnxruntime-genai's
``std::partial_sort`` over the flat indices (row-major over rows and tokens) takes them, ties included
(``top_pairs`` follows libstdc++'s heap select and heap sort step by step); at most ``num_beams`` hypotheses
are kept, best first.
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["BeamSearch", "log_softmax", "top_pairs"]


@njit(cache=True, nogil=True)
def _adjust_heap(h, hole, n, value, scores):
    """libstdc++'s ``__adjust_heap`` then ``__push_heap`` on the index heap ``h[:n]``, the comparator being
    ``scores[a] > scores[b]`` (so the heap's top is its worst score)."""
    top = hole
    child = hole
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if scores[h[child]] > scores[h[child - 1]]:
            child -= 1
        h[hole] = h[child]
        hole = child
    if n % 2 == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        h[hole] = h[child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and scores[h[parent]] > scores[value]:
        h[hole] = h[parent]
        hole = parent
        parent = (hole - 1) // 2
    h[hole] = value


@njit(cache=True, nogil=True)
def _partial_sort(scores, k):
    """``std::partial_sort`` of the indices 0..n-1 by ``scores[a] > scores[b]``, first ``k`` (libstdc++: heap
    select, then heap sort)."""
    n = scores.shape[0]
    h = np.arange(k, dtype=np.int64)
    for parent in range((k - 2) // 2, -1, -1):  # make_heap
        _adjust_heap(h, parent, k, h[parent], scores)
    for i in range(k, n):  # __pop_heap(first, middle, i): i enters when it beats the worst, which leaves
        if scores[i] > scores[h[0]]:
            _adjust_heap(h, 0, k, i, scores)
    for last in range(k - 1, 0, -1):  # sort_heap
        value = h[last]
        h[last] = h[0]
        _adjust_heap(h, 0, last, value, scores)
    return h


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Each row's log-softmax in onnxruntime-genai's float32 steps: x - max, the exponentials summed one after
    the other from the first (a cumulative sum, not numpy's pairwise sum), their log subtracted.  Each exp and
    log is rounded from float64, as the C library's float functions round them."""
    d = x - x.max(axis=1, keepdims=True)
    total = np.cumsum(np.exp(d.astype(np.float64)).astype(np.float32), axis=1, dtype=np.float32)[:, -1:]
    return d - np.log(total.astype(np.float64)).astype(np.float32)


def top_pairs(scores: np.ndarray, k: int) -> np.ndarray:
    """The flat indices of the ``k`` best scores in the order ``std::partial_sort`` (libstdc++) leaves them
    with the comparator ``scores[a] > scores[b]`` over indices 0..n-1: a heap of the first ``k`` indices, each
    later index that beats the heap's worst replacing it, then a heap sort.  Equal scores therefore come out
    as onnxruntime-genai's beam search takes them."""
    x = np.ascontiguousarray(scores, np.float32)
    return _partial_sort(x, min(int(k), x.shape[0]))


class BeamSearch:
    def __init__(self, num_beams: int, length_penalty: float, early_stopping: bool, eos, pad: int):
        self.num_beams = int(num_beams)
        self.length_penalty = float(length_penalty)
        self.early_stopping = bool(early_stopping)
        self.eos = {int(t) for t in eos}
        self.pad = int(pad)
        self.sums = np.full(self.num_beams, -1e9, np.float32)
        self.sums[0] = 0.0
        self.hypotheses = []  # (score, ids), best first
        self.done = False
        self._finished = False

    def _score(self, total: float, length: int) -> float:
        return float(np.float32(total) / np.float32(length) ** np.float32(self.length_penalty))

    def _add(self, ids: list, total: float):
        score = self._score(total, len(ids))
        if len(self.hypotheses) == self.num_beams:
            if score <= self.hypotheses[-1][0]:
                return
            self.hypotheses.pop()
        at = len(self.hypotheses)
        while at > 0 and score > self.hypotheses[at - 1][0]:
            at -= 1
        self.hypotheses.insert(at, (score, list(ids)))

    def step(self, logits: np.ndarray, rows: list) -> tuple:
        """The next token of each beam and the row it continues (``logits``: [num_beams, vocab])."""
        nb = self.num_beams
        if self.done:
            return [self.pad] * nb, list(range(nb))
        x = np.asarray(logits, np.float32)
        logp = log_softmax(x)
        scores = (logp + self.sums[:, None]).astype(np.float32).reshape(-1)
        top = top_pairs(scores, 2 * nb)
        vocab = x.shape[1]
        tokens, parents, sums = [], [], []
        for j, flat in enumerate(top.tolist()):
            parent, token, total = flat // vocab, flat % vocab, scores[flat]
            if token in self.eos:
                if j < nb:
                    self._add(rows[parent], total)
            else:
                tokens.append(token)
                parents.append(parent)
                sums.append(total)
            if len(tokens) == nb:
                break
        self.sums = np.asarray(sums, np.float32)
        if len(self.hypotheses) == nb:
            best = float(scores[top].max())
            if self.early_stopping or not self.hypotheses[-1][0] < self._score(best, len(rows[0])):
                self.done = True
        return tokens, parents

    def finish(self, rows: list):
        """Add the open beams (``rows``: their ids) as hypotheses, once."""
        if not self._finished and not self.done:
            for ids, total in zip(rows, self.sums.tolist()):
                self._add(ids, total)
        self._finished = True

    def hypothesis(self, i: int) -> list:
        return self.hypotheses[i][1]
