"""Text ops: StringConcat, StringSplit, StringNormalizer, RegexFullMatch, TfIdfVectorizer.

String tensors are numpy object arrays of ``str``; the work is per string
and stays in plain Python (numba has no object arrays).  Outputs are fresh
object arrays.  TfIdfVectorizer builds its n-gram table once at plan time
and counts with dictionary look-ups; it accepts int32/int64 or string input.
"""
from __future__ import annotations

import re

import numpy as np

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import broadcast_shape
from .registry import op

__all__ = ["StringConcat", "StringSplit", "StringNormalizer", "RegexFullMatch", "TfIdfVectorizer"]

OBJ = np.dtype(object)


def _s(v):
    return v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else v


def _strings(op_name, x):
    if x.dtype != OBJ and x.dtype.kind not in "US":
        raise InvalidArgumentError(f"{op_name} expects a string tensor, got {x.dtype}")
    return x


@op("StringConcat", 20)
def StringConcat(X, Y):
    _strings("StringConcat", X)
    _strings("StringConcat", Y)
    shape = broadcast_shape(X.shape, Y.shape)
    out = np.empty(shape, OBJ)
    a = np.broadcast_to(X, shape).reshape(-1)
    b = np.broadcast_to(Y, shape).reshape(-1)
    o = out.reshape(-1)
    for i in range(o.shape[0]):
        o[i] = _s(a[i]) + _s(b[i])
    return out


@op("StringSplit", 20)
def StringSplit(X, *, ctx, delimiter=None, maxsplit=None):
    _strings("StringSplit", X)
    sep = delimiter if delimiter else None
    ms = -1 if maxsplit is None else int(maxsplit)
    flat = X.reshape(-1)
    parts = [_s(v).split(sep, ms) if _s(v) else [] for v in flat]  # "" has no substrings
    width = max((len(p) for p in parts), default=0)
    Y = np.full((flat.shape[0], width), "", OBJ)
    Z = np.empty(flat.shape[0], np.int64)
    for i, p in enumerate(parts):
        Y[i, :len(p)] = p
        Z[i] = len(p)
    Y = Y.reshape(X.shape + (width,))
    Z = Z.reshape(X.shape)
    return Y if ctx.n_outputs == 1 else (Y, Z)


@op("StringNormalizer", 10)
def StringNormalizer(X, *, case_change_action="NONE", is_case_sensitive=0, locale="", stopwords=None):
    _strings("StringNormalizer", X)
    if case_change_action not in ("NONE", "LOWER", "UPPER"):
        raise InvalidAttributeError(f"StringNormalizer: case_change_action must be NONE, LOWER or UPPER, "
                                    f"got {case_change_action!r}")
    if X.ndim == 2 and X.shape[0] != 1 or X.ndim not in (1, 2):
        raise ShapeMismatchError(f"StringNormalizer expects [C] or [1, C], got {list(X.shape)}")
    stops = set(stopwords or [])
    if not is_case_sensitive:
        stops = {w.lower() for w in stops}
    kept = []
    for v in X.reshape(-1):
        v = _s(v)
        if (v if is_case_sensitive else v.lower()) in stops:
            continue
        if case_change_action == "LOWER":
            v = v.lower()
        elif case_change_action == "UPPER":
            v = v.upper()
        kept.append(v)
    if not kept:
        kept = [""]
    out = np.empty(len(kept), OBJ)
    out[:] = kept
    return out.reshape(1, -1) if X.ndim == 2 else out


_RE_CACHE: dict = {}


@op("RegexFullMatch", 20)
def RegexFullMatch(X, *, pattern=None):
    _strings("RegexFullMatch", X)
    if pattern is None:
        raise InvalidAttributeError("RegexFullMatch needs a pattern attribute")
    rx = _RE_CACHE.get(pattern)
    if rx is None:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise InvalidAttributeError(f"RegexFullMatch: invalid pattern {pattern!r}: {e}") from None
        _RE_CACHE[pattern] = rx
    out = np.empty(X.shape, np.bool_)
    o = out.reshape(-1)
    for i, v in enumerate(X.reshape(-1)):
        o[i] = rx.fullmatch(_s(v)) is not None
    return out


@op("TfIdfVectorizer", 9, factory=True)
def TfIdfVectorizer(ctx, *, max_gram_length, max_skip_count, min_gram_length, mode, ngram_counts, ngram_indexes,
                    pool_int64s=None, pool_strings=None, weights=None):
    if mode not in ("TF", "IDF", "TFIDF"):
        raise InvalidAttributeError(f"TfIdfVectorizer: mode must be TF, IDF or TFIDF, got {mode!r}")
    pool = [int(v) for v in pool_int64s] if pool_int64s else [_s(v) for v in (pool_strings or [])]
    counts = list(ngram_counts) + [len(pool)]
    table = {}
    gid = 0
    for k in range(len(ngram_counts)):
        n = k + 1
        items = pool[counts[k]:counts[k + 1]]
        for g in range(len(items) // n):
            if min_gram_length <= n <= max_gram_length:
                table[tuple(items[g * n:(g + 1) * n])] = int(ngram_indexes[gid])
            gid += 1
    size = max(ngram_indexes) + 1 if len(ngram_indexes) else 0
    w = np.asarray(weights, np.float32) if weights else None
    strings = not pool_int64s

    def run(X):
        if X.ndim not in (1, 2):
            raise ShapeMismatchError(f"TfIdfVectorizer expects [C] or [N, C], got {list(X.shape)}")
        rows = X.reshape(1, -1) if X.ndim == 1 else X
        out = np.zeros((rows.shape[0], size), np.float32)
        for r in range(rows.shape[0]):
            toks = [_s(v) for v in rows[r]] if strings else [int(v) for v in rows[r]]
            C = len(toks)
            lo = min_gram_length
            for skip in range(1, max_skip_count + 2):
                for start in range(C):
                    for n in range(max(lo, 1), max_gram_length + 1):
                        end = start + (n - 1) * skip
                        if end >= C:
                            break
                        idx = table.get(tuple(toks[start:end + 1:skip]))
                        if idx is not None:
                            out[r, idx] += 1.0
                if lo == 1:
                    lo = 2
                if lo > max_gram_length:
                    break
        if mode == "IDF":
            out = (out > 0).astype(np.float32) * (w if w is not None else np.float32(1))
        elif mode == "TFIDF" and w is not None:
            out = out * w
        return out.reshape(-1) if X.ndim == 1 else out
    return run
