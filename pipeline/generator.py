"""onnxruntime-genai's ``Generator`` over a ``Pipeline``: one sequence that grows by appended and generated tokens.

The decoder has seen the first ``_fed`` tokens of the sequence; the ones after (the token just generated) go
in with the next model run.  ``_logits`` are the logits of the position after the whole sequence, or None
until a run computes them:

- ``append_tokens(ids)`` runs the model at once over the unfed tokens and ``ids`` (the first run is the
  prefill, after the prompt-only stages), so a conversation continues from its cached prefix, at any time;
- ``generate_next_token()`` picks the next token from the current logits (running the model over the unfed
  token first when they are stale) with the search options, and appends it;
- ``get_logits()`` / ``set_logits()`` read and replace the current logits: logits set before
  ``generate_next_token`` are the ones it picks from;
- ``rewind_to(n)`` truncates the sequence and the decoder's caches to ``n`` tokens without recomputing the
  prefix (a decoder with recurrent state, which has no history, starts over from the kept tokens);
- ``get_output(name)`` is the last run's output: ``logits`` for every position it ran, a cache's present
  (the rows so far) or a recurrent state.

As in onnxruntime-genai: token ids come back as int32 arrays, logits as float32 ``[batch, 1, vocab]``; the
sequence never passes ``max_length`` (checked before a run, with its messages); ``min_length`` keeps the EOS
ids from being picked until the sequence is that long.  One sequence (``batch_size`` 1) with greedy search or
sampling: batches and beam search are refused with an error that says so.
"""
from __future__ import annotations

import numpy as np

from .sampling import Sampler, without_ids
from .spec import RequestError

__all__ = ["Generator"]

# the search options whose other values this generator does not implement, with the value it runs
_ONE_SEQUENCE = {"batch_size": 1, "num_beams": 1, "num_return_sequences": 1}


class Generator:
    def __init__(self, model, params):
        s = params.search
        ml = int(s.max_length)
        if ml <= 0:  # onnxruntime-genai's wording
            raise RequestError(f"search max_length is {ml}")
        ctx = model.spec.context_length
        if ctx and ml > int(ctx):
            raise RequestError(f"max_length ({ml}) cannot be greater than model context_length ({ctx})")
        for k, v in _ONE_SEQUENCE.items():
            if int(getattr(s, k)) != v:
                raise NotImplementedError(f"search option {k}={getattr(s, k)}: this generator runs one sequence "
                                          f"with greedy search or sampling ({k} must be {v})")
        self.model, self.params, self.search = model, params, s
        self.max_length = ml
        self.pipe = model.pipeline_for(ml)
        self.sampler = Sampler(s)
        self.external = dict(params.extra_inputs)
        self._eos = [int(t) for t in (model.spec.eos_token_ids or [])]
        self._seq = []        # the sequence's token ids
        self._fed = 0         # how many of them the decoder has seen
        self._logits = None   # [1, 1, vocab] float32 for the position after the sequence, None when stale
        self._outputs = {}    # the last run's logits, every position it ran
        self._last_ids = None
        self._done = False

    # -- feeding the model -------------------------------------------------------------------------
    def _run(self, ids: list):
        """The model over the unfed tokens plus ``ids``; the current logits become the last position's."""
        cur = np.asarray(self._seq[self._fed:] + ids, np.int64).reshape(1, -1)
        first = self._fed == 0
        if first:
            self.pipe.begin(cur, self.external, self.max_length)
        logits = self.pipe.forward(cur, self.external, first, want="all")
        self._seq.extend(ids)
        self._fed = len(self._seq)
        all_logits = np.asarray(logits, np.float32)
        if all_logits.ndim == 2:  # a decoder whose logits have no sequence axis
            all_logits = all_logits[:, None, :]
        self._outputs = {"logits": all_logits}
        self._logits = np.ascontiguousarray(all_logits[:, -1:, :])
        self._last_ids = cur

    def _current_logits(self):
        if self._logits is None:
            self._run([])
        return self._logits

    # -- onnxruntime-genai's calls -----------------------------------------------------------------
    def append_tokens(self, ids):
        ids = [int(t) for t in np.asarray(ids).reshape(-1)]
        if len(self._seq) + len(ids) > self.max_length:
            raise RequestError(f"input_ids size ({len(ids)}) + current sequence length ({len(self._seq)}) exceeds "
                               f"max length ({self.max_length})")
        if not ids:
            return
        self._run(ids)
        self._done = False

    def is_done(self) -> bool:
        return self._done

    def generate_next_token(self):
        if len(self._seq) >= self.max_length:
            raise RequestError(f"GenerateNextToken called with sequence length already at max_length "
                               f"({self.max_length})")
        if not self._seq:
            raise RequestError("append_tokens must come before generate_next_token: the sequence is empty")
        logits = self._current_logits()[:, -1, :]
        if self._eos and len(self._seq) < int(self.search.min_length):
            logits = without_ids(logits, self._eos)
        tok = int(self.sampler.next_tokens(logits, [np.asarray(self._seq, np.int64)])[0])
        self._seq.append(tok)
        self._logits = None
        self._done = tok in self._eos or len(self._seq) >= self.max_length

    def get_next_tokens(self) -> np.ndarray:
        return np.asarray(self._seq[-1:], np.int32)

    def get_sequence(self, index: int = 0) -> np.ndarray:
        if index != 0:
            raise RequestError(f"get_sequence({index}): the batch holds one sequence (index 0)")
        return np.asarray(self._seq, np.int32)

    def token_count(self) -> int:
        return len(self._seq)

    def get_logits(self) -> np.ndarray:
        """The logits of the next position, [1, 1, vocab] float32 (the model runs first if they are stale)."""
        return self._current_logits().copy()

    def set_logits(self, logits):
        """Replace the next position's logits (what ``generate_next_token`` picks from)."""
        cur = self._current_logits()
        a = np.asarray(logits, np.float32)
        if a.size != cur.size:
            raise RequestError(f"set_logits: expected {cur.size} logits (shape {list(cur.shape)}), got shape "
                               f"{list(a.shape)}")
        self._logits = np.ascontiguousarray(a.reshape(cur.shape))

    def get_output(self, name: str) -> np.ndarray:
        """The last run's output ``name``: ``logits`` [1, positions run, vocab], a present (the cache's rows so
        far) or a recurrent state."""
        if name in self._outputs:
            return self._outputs[name].copy()
        value = self.pipe.decoder.output_value(name)
        if value is None:
            raise RequestError(f"get_output: the model has no output {name!r} (it has logits and "
                               f"{', '.join(self.pipe.decoder.output_names)})")
        return value

    def get_input(self, name: str) -> np.ndarray:
        """The last run's token ids (the decoder's token input), or an input given with ``set_inputs``."""
        if name in self.external:
            return np.asarray(self.external[name])
        dec = self.pipe.decoder
        if name == dec.io.token_input and self._last_ids is not None:
            return self._last_ids.astype(np.int64)
        raise RequestError(f"get_input: no input {name!r} to report (the token input is {dec.io.token_input!r})")

    def set_inputs(self, named=None, **more):
        """Inputs of the prompt-only components (e.g. pixel_values), for the sequence's first run."""
        self.external.update(dict(named or {}), **more)

    def set_model_input(self, name: str, value):
        self.external[name] = value

    def rewind_to(self, length: int):
        """Keep the first ``length`` tokens; the decoder's caches are truncated, not recomputed."""
        length = int(length)
        if not 0 <= length <= len(self._seq):
            raise RequestError(f"rewind_to({length}): the sequence holds {len(self._seq)} tokens")
        keep = length - 1  # the last kept token is fed again: its logits are the next position's
        dec = self.pipe.decoder
        if keep <= 0 or keep > min(self._fed, dec.kv_length) or dec.io.state_pairs:
            self._fed = 0  # start over from the kept tokens (recurrent state has no history)
        else:
            dec.rewind(keep)
            self._fed = keep
        del self._seq[length:]
        self._logits = None
        self._done = False
