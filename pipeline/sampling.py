"""Next-token selection from decoder logits, following onnxruntime-genai's search options.

``Sampler(options).next_token(logits, history)`` picks one token id from a
``[vocab]`` row of logits; ``next_tokens`` does the same for a ``[batch, vocab]``
array, one history per row.  The steps, in order:

1. repetition penalty: every distinct token id in ``history`` has its logit
   divided by ``repetition_penalty`` when positive and multiplied by it when
   negative (each id once, however often it repeats);
2. greedy (``do_sample`` false, or ``temperature == 0``): the index of the
   largest logit, the FIRST one on ties, NaN counting as ``-inf``;
3. sampling: logits / ``temperature``; top-k (``top_k <= 0`` or ``>= vocab``
   means no limit); top-p over the descending softmax of what top-k kept
   (renormalized), keeping the smallest prefix whose cumulative probability
   reaches ``top_p``; min-p, dropping tokens whose probability is below
   ``min_p`` times the largest; then one draw from what is left,
   renormalized.  At least one token always survives.

Invariants:
- the caller's logits and history are never written; the kernels work on a
  float32 copy (float16/float64 logits are converted once);
- NaN logits are ``-inf`` everywhere (never drawn, never the argmax unless
  the whole row is NaN/-inf, where the answer is index 0 for greedy);
- candidate order is descending logit, ties by ascending token id, so the
  heap top-k and the full sort agree and draws are reproducible;
- each draw consumes exactly one ``Generator.random()`` value from a
  ``numpy`` PCG64 generator seeded with ``options.seed`` (``None`` or a
  negative seed, onnxruntime-genai's ``-1``, mean fresh OS entropy), so the
  same seed and the same logits give the same tokens;
- the vocabulary-sized work (argmax, penalty, softmax normalizer, top-k heap,
  cumulative top-p, the wide-nucleus gather) runs in ``@njit(cache=True)`` kernels compiled for
  float32 logits and int64 ids only.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .spec import SearchOptions

__all__ = ["Sampler", "greedy_argmax", "without_ids", "repeated_ngram_ends"]

_OPTS = dict(cache=True, nogil=True)
# top-p without a top-k limit first tries the best _NUCLEUS_PROBE tokens (heap, no sort); when they do
# not reach top_p, a value histogram bounds the nucleus and only the tokens above that bound are sorted.
_NUCLEUS_PROBE = 1024
_NUCLEUS_BINS = 4096  # value bins of the wide-nucleus gather


def without_ids(logits, ids):
    """A copy of ``logits`` [..., vocab] with the ids (those inside the vocabulary) at ``-inf``: what
    ``min_length`` does to the EOS ids before the sequence is long enough."""
    out = np.array(logits, dtype=np.float32, copy=True)
    vocab = out.shape[-1]
    for i in ids:
        if 0 <= int(i) < vocab:
            out[..., int(i)] = -np.inf
    return out


def repeated_ngram_ends(row, n: int) -> list:
    """The ids that would end an ``n``-gram already in ``row`` (``no_repeat_ngram_size``): those that follow,
    somewhere in the row, the row's last ``n - 1`` ids."""
    if n <= 0 or len(row) < n - 1:
        return []
    tail = list(row[len(row) - (n - 1):]) if n > 1 else []
    return sorted({int(row[i + n - 1]) for i in range(len(row) - n + 1) if list(row[i:i + n - 1]) == tail})


# ---------------------------------------------------------------------------------------------
# kernels (float32 logits, int64 ids)
# ---------------------------------------------------------------------------------------------

@njit(**_OPTS)
def _argmax_rows(x, out):
    """``out[r]`` = first index of the largest value of row ``r`` of ``x`` [rows, n]; NaN is -inf."""
    rows, n = x.shape
    for r in range(rows):
        best = -np.inf
        bi = 0
        for k in range(n):
            v = x[r, k]
            if v > best:  # NaN compares false; strict '>' keeps the first maximum
                best = v
                bi = k
        out[r] = bi


@njit(**_OPTS)
def _apply_penalty(x, history, penalty):
    """Penalize, in place, the logit of every distinct id of ``history`` (ids already checked)."""
    h = np.sort(history)
    prev = -1
    for j in range(h.shape[0]):
        t = h[j]
        if t == prev:
            continue
        prev = t
        v = x[t]
        if v < 0:
            x[t] = v * penalty
        else:
            x[t] = v / penalty


@njit(**_OPTS)
def _worse(va, ia, vb, ib):
    """Candidate a ranks below b: a smaller value, or an equal value at a larger id."""
    return va < vb or (va == vb and ia > ib)


@njit(**_OPTS)
def _swap(hv, hi, a, b):
    """Exchange candidates ``a`` and ``b`` (value in ``hv``, id in ``hi``)."""
    tv = hv[a]
    ti = hi[a]
    hv[a] = hv[b]
    hi[a] = hi[b]
    hv[b] = tv
    hi[b] = ti


@njit(**_OPTS)
def _sift_up(hv, hi, pos):
    """Restore the min-heap ``hv``/``hi`` above a candidate just placed at ``pos``."""
    while pos > 0:
        par = (pos - 1) // 2
        if not _worse(hv[pos], hi[pos], hv[par], hi[par]):
            return
        _swap(hv, hi, par, pos)
        pos = par


@njit(**_OPTS)
def _sift_down(hv, hi, pos, n):
    while True:
        c = 2 * pos + 1
        if c >= n:
            return
        if c + 1 < n and _worse(hv[c + 1], hi[c + 1], hv[c], hi[c]):
            c += 1
        if _worse(hv[c], hi[c], hv[pos], hi[pos]):
            _swap(hv, hi, c, pos)
            pos = c
        else:
            return


@njit(**_OPTS)
def _top_k(x, k, vals, idxs):
    """Write the ``k`` best (value, id) of ``x`` into ``vals``/``idxs``, best first, without sorting ``x``.

    A size-``k`` min-heap whose root is the worst kept candidate: O(n log k), and
    most elements only cost one comparison against the root.  NaN counts as -inf."""
    n = x.shape[0]
    m = 0
    for i in range(n):
        v = x[i]
        if v != v:
            v = -np.inf
        if m < k:  # push
            vals[m] = v
            idxs[m] = i
            _sift_up(vals, idxs, m)
            m += 1
        elif _worse(vals[0], idxs[0], v, i):
            vals[0] = v
            idxs[0] = i
            _sift_down(vals, idxs, 0, k)
    # heap sort in place: repeatedly move the worst to the end, so the array ends best first
    for end in range(k - 1, 0, -1):
        _swap(vals, idxs, 0, end)
        _sift_down(vals, idxs, 0, end)


@njit(**_OPTS)
def _nucleus_gather(x, inv_t, total, top_p, nbins):
    """The best tokens of ``x`` whose mass reaches ``top_p``, best first (ties by id), without sorting ``x``.

    One pass bins the finite values into ``nbins`` equal-width bins from the max
    down and sums each bin's probability; the bins are taken from the top until
    their mass reaches ``top_p``; only the tokens in them are gathered and
    sorted.  A bin index is monotone in the value, so what is gathered is a
    prefix of the sorted order and holds the whole nucleus.  NaN is -inf."""
    n = x.shape[0]
    m = -np.inf
    lo = np.inf
    for i in range(n):
        v = x[i]
        if v > -np.inf and v < np.inf:
            if v > m:
                m = v
            if v < lo:
                lo = v
    width = (m - lo) / nbins
    if not width > 0.0:
        width = 1.0  # one value (or none): everything lands in bin 0
    mass = np.zeros(nbins, np.float64)
    for i in range(n):
        v = x[i]
        if v > -np.inf:
            b = min(int((m - v) / width), nbins - 1)
            mass[b] += math.exp((v - m) * inv_t)
    goal = top_p * total
    c = 0.0
    last = nbins - 1
    for b in range(nbins):
        c += mass[b]
        if c >= goal:
            last = b
            break
    cnt = 0
    for i in range(n):
        v = x[i]
        if v > -np.inf and min(int((m - v) / width), nbins - 1) <= last:
            cnt += 1
    neg = np.empty(cnt, np.float32)
    pos = np.empty(cnt, np.int64)
    j = 0
    for i in range(n):
        v = x[i]
        if v > -np.inf and min(int((m - v) / width), nbins - 1) <= last:
            neg[j] = -v
            pos[j] = i
            j += 1
    order = np.argsort(neg, kind="mergesort")  # stable: ties stay in ascending id order
    vals = np.empty(max(cnt, 1), np.float32)
    idxs = np.zeros(max(cnt, 1), np.int64)
    vals[0] = -np.inf
    for j in range(cnt):
        vals[j] = -neg[order[j]]
        idxs[j] = pos[order[j]]
    return vals, idxs


@njit(**_OPTS)
def _softmax_total(x, inv_t):
    """Max of ``x`` (NaN skipped) and the softmax normalizer ``sum exp((x - max) * inv_t)`` in float64."""
    m = -np.inf
    for i in range(x.shape[0]):
        v = x[i]
        if v > m:
            m = v
    if m == -np.inf:
        return m, 0.0
    s = 0.0
    for i in range(x.shape[0]):
        v = x[i]
        if v > -np.inf:  # skips -inf and NaN
            s += math.exp((v - m) * inv_t)
    return m, s


@njit(**_OPTS)
def _nucleus_size(vals, n, inv_t, total, top_p):
    """Length of the shortest prefix of ``vals[:n]`` (best first) whose probability mass reaches ``top_p``.

    ``total`` is the softmax normalizer relative to ``vals[0]``; returns ``n + 1``
    when even all ``n`` candidates fall short (the caller then needs more of them),
    and the count of finite candidates when they run out first (rounding)."""
    m = vals[0]
    goal = top_p * total
    c = 0.0
    for j in range(n):
        v = vals[j]
        if not v > -np.inf:
            return max(j, 1)  # the rest have probability 0: the whole finite mass is in
        c += math.exp((v - m) * inv_t)
        if c >= goal:
            return j + 1
    return n + 1


@njit(**_OPTS)
def _sorted_weights(vals, n, inv_t, min_p, w):
    """The draw's weights over ``vals[:n]`` (best first) after min-p, into ``w``; returns how many are kept.

    Weights are relative to the best candidate (``w[0] == 1``); the kept ones are a prefix, all positive."""
    m = vals[0]
    w[0] = 1.0
    if not m > -np.inf:
        return 1
    floor = min_p  # probabilities relative to the best one, whose relative probability is 1
    keep = 1
    for j in range(1, n):
        v = vals[j]
        if not v > -np.inf:
            break
        e = math.exp((v - m) * inv_t)
        if e < floor:
            break  # sorted: everything after is smaller still
        w[j] = e
        keep = j + 1
    return keep


@njit(**_OPTS)
def _full_weights(x, inv_t, min_p, e):
    """The draw's weights over all of ``x`` (no top-k, no top-p) after min-p, into ``e``; NaN is -inf.
    Returns False when every logit is -inf (the draw is then index 0)."""
    n = x.shape[0]
    m = -np.inf
    for i in range(n):
        v = x[i]
        if v > m:
            m = v
    if m == -np.inf:
        return False
    for i in range(n):
        v = x[i]
        w = 0.0
        if v > -np.inf:
            w = math.exp((v - m) * inv_t)
            if w < min_p:
                w = 0.0
        e[i] = w
    return True


@njit(**_OPTS)
def _draw_weights(w, n, u):
    """The index into ``w[:n]`` that ``u`` uniform in [0, 1) draws: the first whose running sum passes
    ``u`` times the total (both summed in index order), else the last positive weight."""
    s = 0.0
    for i in range(n):
        s += w[i]
    target = u * s
    c = 0.0
    last = 0
    for i in range(n):
        v = w[i]
        if v > 0.0:
            last = i
            c += v
            if c > target:
                return i
    return last


# ---------------------------------------------------------------------------------------------
# wrappers
# ---------------------------------------------------------------------------------------------

def greedy_argmax(logits) -> np.ndarray:
    """First index of the maximum along the last axis (NaN counts as -inf).

    ``[vocab]`` gives a 0-d int64 array, ``[batch, vocab]`` an int64 array of ``batch`` ids."""
    x = np.asarray(logits)
    if x.ndim not in (1, 2) or x.shape[-1] == 0:
        raise ValueError(f"greedy_argmax expects logits [vocab] or [batch, vocab] with vocab > 0, "
                         f"got shape {x.shape}")
    x2 = np.ascontiguousarray(x.reshape(-1, x.shape[-1]), dtype=np.float32)
    out = np.empty(x2.shape[0], np.int64)
    _argmax_rows(x2, out)
    return out.reshape(()) if x.ndim == 1 else out


class Sampler:
    """Picks next tokens under one ``SearchOptions``; owns the seeded random generator.

    Options are checked once, here: ``temperature >= 0`` (0 means greedy),
    ``repetition_penalty > 0``, ``top_p`` and ``min_p`` finite.  A ``top_p <= 0``
    keeps only the best token; a ``min_p >= 1`` keeps only the tokens tied with it."""

    def __init__(self, options: SearchOptions | None = None):
        o = options if options is not None else SearchOptions()
        for name in ("temperature", "repetition_penalty", "top_p", "min_p"):
            v = getattr(o, name)
            if not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(float(v)):
                raise ValueError(f"SearchOptions.{name} must be a finite number, got {v!r}")
        if o.temperature < 0:
            raise ValueError(f"SearchOptions.temperature must be >= 0 (0 means greedy), got {o.temperature}")
        if o.repetition_penalty <= 0:
            raise ValueError(f"SearchOptions.repetition_penalty must be > 0, got {o.repetition_penalty}")
        self.options = o
        self.greedy = (not o.do_sample) or o.temperature == 0
        self._penalty = float(o.repetition_penalty)
        self._inv_t = 1.0 if self.greedy else 1.0 / float(o.temperature)
        self._top_k = int(o.top_k)
        self._top_p = float(o.top_p)
        self._min_p = min(max(0.0, float(o.min_p)), 1.0)  # above 1 keeps the best token(s) only, as 1 does
        seed = o.seed
        self.rng = np.random.default_rng(None if seed is None or seed < 0 else int(seed))

    # -- one row ---------------------------------------------------------------------------------
    def _prepare(self, row, history):
        """A float32 copy of ``row`` with the repetition penalty applied."""
        x = np.array(row, dtype=np.float32, copy=True, order="C")
        if self._penalty != 1.0 and history is not None:
            h = np.ascontiguousarray(np.asarray(history).reshape(-1), dtype=np.int64)
            if h.size:
                lo, hi = int(h.min()), int(h.max())
                if lo < 0 or hi >= x.shape[0]:
                    bad = lo if lo < 0 else hi
                    raise ValueError(f"history holds token id {bad}, outside the vocabulary [0, {x.shape[0]})")
                _apply_penalty(x, h, np.float32(self._penalty))
        return x

    def _pick(self, x) -> int:
        if self.greedy:
            out = np.empty(1, np.int64)
            _argmax_rows(x.reshape(1, -1), out)
            return int(out[0])
        u = float(self.rng.random())
        ids, w = self._weights(x)
        j = _draw_weights(w, w.shape[0], u)
        return int(j if ids is None else ids[j])

    def _weights(self, x):
        """What a draw from the prepared row ``x`` picks from: candidate ids and their weights (float64,
        unnormalized), in the order the draw walks them; ids None when they are the indices themselves (the
        whole vocabulary: no id array is built on that path)."""
        n = x.shape[0]
        k = self._top_k
        top_p = self._top_p
        if 0 < k < n:
            vals = np.empty(k, np.float32)
            idxs = np.empty(k, np.int64)
            _top_k(x, k, vals, idxs)
            if top_p < 1.0:
                _, total = _softmax_total(vals, self._inv_t)  # renormalized over the kept k
                k = min(_nucleus_size(vals, k, self._inv_t, total, top_p), k)
            return self._kept(vals, idxs, k)
        if top_p >= 1.0:
            e = np.empty(n, np.float64)
            if not _full_weights(x, self._inv_t, self._min_p, e):
                return np.zeros(1, np.int64), np.ones(1)
            return None, e
        _, total = _softmax_total(x, self._inv_t)
        probe = min(_NUCLEUS_PROBE, n)
        vals = np.empty(probe, np.float32)
        idxs = np.empty(probe, np.int64)
        _top_k(x, probe, vals, idxs)
        keep = _nucleus_size(vals, probe, self._inv_t, total, top_p)
        if keep > probe and probe < n:  # the best `probe` tokens fall short of top_p: a wide nucleus
            vals, idxs = _nucleus_gather(x, self._inv_t, total, top_p, _NUCLEUS_BINS)
            keep = _nucleus_size(vals, vals.shape[0], self._inv_t, total, top_p)
        return self._kept(vals, idxs, min(keep, vals.shape[0]))

    def _kept(self, vals, idxs, n):
        w = np.zeros(n, np.float64)
        keep = _sorted_weights(vals, n, self._inv_t, self._min_p, w)
        return idxs[:keep], w[:keep]

    def distribution(self, logits, history=None):
        """The distribution the next pick draws from, after the penalty, temperature, top-k, top-p and min-p:
        ``(ids int64, weights float64)``, the weights positive and unnormalized (the probabilities are
        ``weights / weights.sum()``), in the order a draw walks them.  Greedy: the argmax alone, weight 1.
        ``draw(ids, weights)`` then picks exactly what ``next_token`` would with the same ``random()`` value."""
        x = self._prepare(np.asarray(logits).reshape(-1), history)
        if self.greedy:
            out = np.empty(1, np.int64)
            _argmax_rows(x.reshape(1, -1), out)
            return out, np.ones(1)
        ids, w = self._weights(x)
        pos = w > 0.0
        ids = np.flatnonzero(pos) if ids is None else ids[pos]
        return np.ascontiguousarray(ids, np.int64), np.ascontiguousarray(w[pos])

    def draw(self, ids, weights) -> int:
        """One id drawn from ``ids`` with ``weights`` (any positive scale), consuming one ``random()`` value."""
        u = float(self.rng.random())
        w = np.ascontiguousarray(weights, np.float64)
        return int(ids[_draw_weights(w, w.shape[0], u)])

    def next_token(self, logits, history=None) -> int:
        """The next token id for one ``[vocab]`` row of logits (a ``[1, vocab]`` array is accepted too)."""
        x = np.asarray(logits)
        if x.ndim == 2 and x.shape[0] == 1:
            x = x[0]
        if x.ndim != 1 or x.shape[0] == 0:
            raise ValueError(f"next_token expects logits [vocab] with vocab > 0, got shape {np.shape(logits)}")
        return self._pick(self._prepare(x, history))

    def next_tokens(self, logits, histories=None) -> np.ndarray:
        """Next token ids (int64 [batch]) for ``[batch, vocab]`` logits; ``histories[b]`` belongs to row ``b``.

        Rows draw in order from the one generator, so a batch of one draws
        exactly what ``next_token`` would."""
        x = np.asarray(logits)
        if x.ndim != 2 or x.shape[1] == 0:
            raise ValueError(f"next_tokens expects logits [batch, vocab] with vocab > 0, got shape {x.shape}")
        batch = x.shape[0]
        if histories is not None and len(histories) != batch:
            raise ValueError(f"next_tokens got {len(histories)} histories for a batch of {batch}")
        if self.greedy and (self._penalty == 1.0 or histories is None):
            return greedy_argmax(x)
        out = np.empty(batch, np.int64)
        for b in range(batch):
            out[b] = self._pick(self._prepare(x[b], None if histories is None else histories[b]))
        return out
