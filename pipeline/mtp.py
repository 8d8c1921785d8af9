"""onnxruntime-genai's ``MtpGenerator``: self-speculative decoding with a multi-token-prediction head.

The main decoder has a hidden-state output (``model.mtp.main_hidden_states``); the MTP head is a small decoder
package of its own whose inputs are token ids and hidden states (``model.decoder.inputs.hidden_states``).  The
head reads pairs ``(h_j, t_{j+1})``, the main decoder's hidden state at position ``j`` and the token after it,
and predicts ``t_{j+2}``.  It is run as a proposer of ``pipeline/speculative.py`` (``Speculator`` kind
``mtp``), so the rounds, the acceptance rule (greedy or sampled), the statistics and the handling of recurrent
state are those of draft-model speculation:

- the head's context is every position of the sequence (the prompt's pairs included), fed as it grows; each
  round the head is cut back to the pairs the sequence still holds (``_Head.cut``) and fed the new ones;
- the first proposal comes from the last pair, ``(h_{L-2}, t_{L-1})`` for a sequence of ``L`` tokens; with
  ``max_draft_tokens`` N > 1 the head is chained: its own hidden output (``model.mtp.outputs.hidden_states``)
  paired with its last proposal gives the next one (a head without that output runs N = 1 only);
- the main decoder keeps a copy of its hidden-state output of every run (``DecoderComponent.capture``), by
  position (``Generator._hidden``).

The tokens are the main decoder's own (greedy: plain greedy decoding's); only the speed depends on the head.
How many proposals are accepted may differ from onnxruntime-genai's, whose head starts at the first generated
token and is fed in a different order.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .spec import RequestError
from .speculative import SpeculativeOptions, Speculator

__all__ = ["MtpGenerator"]


class _Head:
    """The MTP head's decoder, fed (hidden state, token) pairs; ``tokens`` holds the token of each pair in its
    caches.  Its feedback output, when chained, is kept through ``DecoderComponent.capture``."""

    def __init__(self, model, max_length: int):
        self.pipe = model.pipeline_for(max_length)
        self.max_length = max_length
        dec = self.pipe.decoder
        self.input = model.spec.hidden_states_input or "hidden_states"
        if self.input not in dec.inputs:
            raise RequestError(f"MtpGenerator: the MTP head has no hidden-states input {self.input!r} "
                               f"(model.decoder.inputs.hidden_states)")
        from .components import np_type
        self.dtype = np_type(dec.inputs[self.input].type)
        self.tokens = []

    def cut(self, n: int):
        if n < len(self.tokens):
            if n:
                self.pipe.decoder.rewind(n)
            del self.tokens[n:]

    def run(self, hidden, tokens):
        """Feed pairs (``hidden`` [n, H], ``tokens`` [n]); the last pair's logits [vocab] and the head's hidden
        output there (None without the feedback output)."""
        cur = np.asarray([tokens], np.int64)
        ext = {self.input: np.ascontiguousarray(np.asarray(hidden, self.dtype)[None])}
        first = not self.tokens
        if first:
            self.pipe.begin(cur, ext, self.max_length)
        logits = np.asarray(self.pipe.forward(cur, ext, first, want="all"), np.float32)
        self.tokens += list(tokens)
        fb = self.pipe.decoder.captured
        return logits.reshape(-1, logits.shape[-1])[-1], None if fb is None else np.asarray(fb)[0, -1]


def propose(spec: Speculator, seq: list, k: int):
    """The head's proposals after ``seq``: up to ``k`` tokens with their distributions (sampling) or Nones."""
    g, head = spec.gen, spec.head
    hidden = g._hidden
    pairs = len(seq) - 1  # pairs j = 0 .. L-2: (h_j, t_{j+1})
    valid = 0
    for a, b in zip(head.tokens, seq[1:]):
        if a != b:
            break
        valid += 1
    head.cut(valid)
    if pairs < 1 or any(j not in hidden for j in range(valid, pairs)):
        return [], []
    if valid < pairs:
        logits, fb = head.run(np.stack([hidden[j] for j in range(valid, pairs)]), seq[valid + 1:pairs + 1])
    else:  # nothing new (the sequence was cut back onto the head's last pair): that pair again
        head.cut(pairs - 1)
        logits, fb = head.run(hidden[pairs - 1][None], seq[pairs:pairs + 1])
    drafts, dists, hist = [], [], list(seq)
    for i in range(k):
        tok, dist = spec._pick(logits, hist)
        drafts.append(tok)
        dists.append(dist)
        hist.append(tok)
        if i == k - 1 or fb is None:
            break
        logits, fb = head.run(fb[None], [tok])  # chained: the head's own hidden with its proposal
    head.cut(pairs)  # the chained pairs are proposals, not the sequence's
    spec.stats["draft_forward_passes"] += len(drafts)
    return drafts, dists


class MtpGenerator:
    """``og.MtpGenerator(main_model, mtp_model, params)``: ``append_tokens`` once, then ``generate_next_token``
    until ``is_done``; ``get_sequence()`` and ``get_stats()`` (onnxruntime-genai's speculative statistics with
    ``forwards``, ``accepts`` and ``trials``).  Checks and messages are onnxruntime-genai's."""

    def __init__(self, main_model, mtp_model, params):
        from .generator import Generator
        s = params.search
        if int(s.batch_size) != 1 or int(s.num_beams) != 1 or int(s.num_return_sequences) != 1:
            raise RequestError("MtpGenerator supports only batch_size=1, num_beams=1, and num_return_sequences=1")
        if params.guidance is not None:
            raise RequestError("MtpGenerator does not support guided generation")
        if main_model.device_type != mtp_model.device_type:
            raise RequestError("MtpGenerator requires the main model and MTP head on the same device type")
        if main_model.spec.vocab_size != mtp_model.spec.vocab_size:
            raise RequestError("MtpGenerator requires matching main-model and MTP-head vocabulary sizes")
        if main_model.spec.hidden_size != mtp_model.spec.hidden_size:
            raise RequestError("MtpGenerator requires matching main-model and MTP-head hidden sizes")
        mtp = main_model.spec.mtp or {}
        main_hidden = mtp.get("main_hidden_states") or ""
        main_params = _copy_params(params)
        main_params.speculative = SpeculativeOptions(max_draft_tokens=max(1, params.speculative.max_draft_tokens),
                                                     min_adaptive_k=params.speculative.min_adaptive_k,
                                                     cooldown=params.speculative.cooldown)
        self.gen = Generator(main_model, main_params)
        dec = self.gen.pipe.decoder
        if not main_hidden or main_hidden not in dec.output_names:
            raise RequestError("MtpGenerator: model.mtp.main_hidden_states must name a main-model output")
        head = _Head(mtp_model, self.gen.max_length)
        out_type = _output_type(dec, main_hidden)
        if out_type is not None and out_type != head.dtype:
            raise RequestError("MtpGenerator requires matching hidden-state tensor types")
        n = int(main_params.speculative.max_draft_tokens)
        feedback = (mtp.get("outputs") or {}).get("hidden_states") or ""
        if n > 1:
            if not feedback or feedback not in head.pipe.decoder.output_names:
                raise RequestError(f"MtpGenerator: max_draft_tokens={n} requires the configured MTP feedback "
                                   f"output '{feedback}' (model.mtp.outputs.hidden_states)")
            head.pipe.decoder.capture(feedback)
        dec.capture(main_hidden)
        self.gen._hidden = {}
        self.gen._spec = Speculator(self.gen, "mtp", head=head)
        self._primed = False

    def append_tokens(self, tokens):
        a = np.asarray(tokens.as_numpy() if hasattr(tokens, "as_numpy") else tokens)
        if a.ndim != 1:
            raise RequestError("input_ids must be a 1D array")
        if self._primed:
            raise RequestError("MtpGenerator: AppendTokens can only be called once")
        self.gen.append_tokens(a.astype(np.int64))
        self._primed = True

    def generate_next_token(self):
        if not self._primed:
            raise RequestError("MtpGenerator: AppendTokens must be called before GenerateNextToken")
        self.gen.generate_next_token()

    def is_done(self) -> bool:
        return self.gen.is_done()

    def get_sequence(self) -> np.ndarray:
        return self.gen.get_sequence(0)

    def get_stats(self) -> dict:
        d = self.gen.get_speculative_stats()
        d["forwards"] = d["target_forward_passes"]
        d["accepts"] = d["draft_tokens_accepted"]
        d["trials"] = d["draft_tokens_evaluated"]
        return d


def _copy_params(params):
    """A shallow copy of a ``GeneratorParams`` with its own search and speculative options."""
    import copy
    p = copy.copy(params)
    p.search = dataclasses.replace(params.search)
    return p


def _output_type(dec, name):
    """The numpy dtype of decoder output ``name``, when its session says."""
    from .components import np_type
    for o in dec.session.get_outputs():
        if o.name == name:
            return np_type(o.type)
    return None
