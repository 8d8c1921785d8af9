"""Constrained decoding: onnxruntime-genai's ``GeneratorParams.set_guidance(type, data)``, through llguidance.

``Guidance(spec, kind, data, rows)`` holds one llguidance matcher per row for a grammar of ``kind``
``json_schema``, ``regex`` or ``lark_grammar``; ``mask(logits)`` returns the logits with every token the grammar
does not allow next set to the lowest float32 (onnxruntime-genai's value, not -inf), ``commit(tokens)`` advances
each row by the token it took, and ``reset()`` starts the grammar over (a rewind does, as in onnxruntime-genai).

As onnxruntime-genai builds it: the llguidance tokenizer is the package's ``tokenizer.json`` with the config's
``vocab_size`` and its first EOS id; a row whose grammar has stopped may only take that EOS.  Forced
("fast-forward") tokens are not proposed (onnxruntime-genai proposes them only when asked, for one row).  The
llguidance tokenizer is built once per tokenizer file and kept.

llguidance is an optional dependency (``pip install -e ".[guidance]"``; in ``.[test]``); without it
``set_guidance`` is an error that says so.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from .spec import RequestError

__all__ = ["Guidance", "GUIDANCE_TYPES"]

GUIDANCE_TYPES = ("json_schema", "regex", "lark_grammar")
_LOWEST = np.finfo(np.float32).min
_TOKENIZERS = {}
_LOCK = threading.Lock()


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise RequestError("guidance needs the llguidance package (pip install -e \".[guidance]\")") from None
    return llguidance


def _tokenizer(path: str, vocab: int, eos: int):
    key = (os.path.abspath(path), os.path.getmtime(path), vocab, eos)
    with _LOCK:
        if key not in _TOKENIZERS:
            llg = _llguidance()
            with open(path, encoding="utf-8") as fh:
                _TOKENIZERS[key] = llg.LLTokenizer(fh.read(), n_vocab=vocab, eos_token=eos)
        return _TOKENIZERS[key]


def check_kind(kind: str):
    if kind not in GUIDANCE_TYPES:
        raise RequestError(f"Unsupported guidance type: {kind} (only json_schema, regex, and lark_grammar are "
                           f"supported).")


class Guidance:
    """One grammar matcher per row (see the module docstring)."""

    def __init__(self, spec, kind: str, data: str, rows: int):
        check_kind(kind)
        if not data:
            raise RequestError("Guidance type and data must be provided together")
        if not spec.tokenizer_dir or not spec.vocab_size or not spec.eos_token_ids:
            raise RequestError("guidance needs the package's tokenizer.json, model.vocab_size and model.eos_token_id")
        llg = _llguidance()
        self.vocab = int(spec.vocab_size)
        self.eos = int(spec.eos_token_ids[0])
        self._tok = _tokenizer(os.path.join(spec.tokenizer_dir, "tokenizer.json"), self.vocab, self.eos)
        make = {"json_schema": llg.LLMatcher.grammar_from_json_schema, "regex": llg.LLMatcher.grammar_from_regex,
                "lark_grammar": llg.LLMatcher.grammar_from_lark}[kind]
        self._grammar = make(data)
        self.rows = int(rows)
        self.reset()

    def reset(self):
        llg = _llguidance()
        self._matchers = [llg.LLMatcher(self._tok, self._grammar) for _ in range(self.rows)]
        for m in self._matchers:
            if m.is_error():
                raise RequestError(f"Error creating grammar: {m.get_error()}")

    def _allowed(self, m) -> np.ndarray:
        if m.is_stopped():
            out = np.zeros(self.vocab, bool)
            out[self.eos] = True
            return out
        bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")
        if m.is_error():
            raise RequestError(f"Error computing mask: {m.get_error()}")
        return bits[:self.vocab].astype(bool)

    def mask(self, logits) -> np.ndarray:
        """``logits`` [rows, vocab] (or [rows, 1, vocab]) with what each row's grammar forbids at the lowest
        float32; a copy."""
        out = np.array(logits, np.float32, copy=True)
        flat = out.reshape(self.rows, -1)
        for r, m in enumerate(self._matchers):
            allowed = self._allowed(m)
            row = flat[r, :self.vocab]
            row[~allowed[:row.shape[0]]] = _LOWEST
        return out

    def commit(self, tokens):
        """Each row's grammar advances by its token (None: the row has ended; a stopped grammar stays put)."""
        for m, t in zip(self._matchers, tokens):
            if t is None or m.is_stopped():
                continue
            if not m.consume_token(int(t)):
                raise RequestError(f"Error committing tokens: {m.get_error() or f'token {t} is not allowed'}")
