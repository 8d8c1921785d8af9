"""onnxruntime-genai's ``Generator`` over a ``Pipeline``: sequences that grow by appended and generated tokens.

The decoder runs the sequences as the rows of one batch: the batch's prompts (``batch_size``), each on
``num_beams`` rows with beam search (``pipeline/beam_search.py``: each step reorders the caches between
beams).  It has seen the first ``_fed`` tokens of every row; the ones after (the token just generated) go in with the next
model run.  ``_logits`` are the logits of the position after the whole sequence, or None
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

As in onnxruntime-genai: token ids come back as int32 arrays, logits as float32 ``[rows, 1, vocab]``; the
sequence never passes ``max_length`` (checked before a run, with its messages); ``min_length`` keeps the EOS
ids from being picked until the sequence is that long.  A batch is right-padded (``Tokenizer.encode_batch``):
each row keeps its own length in the decoder, a finished row takes pads, and ``rewind_to`` takes 0 only.  Beam
search runs each prompt of the batch on ``num_beams`` rows with greedy scores (sampling options are refused,
as onnxruntime-genai refuses them, except ``top_k`` 1); ``get_sequence(i)`` is then prompt
``i // num_return_sequences``'s ``i % num_return_sequences``-th best hypothesis, pads kept where the padded
batch put them.
"""
from __future__ import annotations

import numpy as np

from . import environment as env
from .beam_search import BeamSearch
from .sampling import Sampler, repeated_ngram_ends, without_ids
from .spec import RequestError
from .speculative import Speculator, check_speculative, empty_stats

__all__ = ["Generator"]

def _unpadded(ids: np.ndarray, pad: int) -> np.ndarray:
    """Each row's ids before its trailing pads (a right-padded [rows, n] block)."""
    if ids.shape[1] == 0:
        return np.zeros(ids.shape[0], np.int64)
    real = ids != pad
    return np.where(real.any(axis=1), ids.shape[1] - np.argmax(real[:, ::-1], axis=1), 0)


# model type -> the sequence length at which onnxruntime-genai re-runs the prompt with long rotary factors
_ROPE_SWITCH = {"phi3": 4097, "phimoe": 4097, "phi3small": 8193}


class Generator:
    def __new__(cls, model=None, params=None):
        if getattr(model, "transducer", None) is not None:   # a streaming speech model: its own loop
            from .streaming_asr import transducer_generator
            return transducer_generator(model, params)
        return super().__new__(cls)

    def __init__(self, model, params):
        s = params.search
        ml = int(s.max_length)
        if ml <= 0:  # onnxruntime-genai's wording
            raise RequestError(f"search max_length is {ml}")
        ctx = model.spec.context_length
        if ctx and ml > int(ctx):
            raise RequestError(f"max_length ({ml}) cannot be greater than model context_length ({ctx})")
        nb, nrs = int(s.num_beams), int(s.num_return_sequences)
        if nb < 1 or not 1 <= nrs <= nb:
            raise RequestError(f"num_beams ({nb}) must be >= 1 and num_return_sequences ({nrs}) from 1 to num_beams")
        if int(s.batch_size) < 1:
            raise RequestError(f"batch_size must be >= 1, got {s.batch_size}")
        if nb > 1 and s.do_sample and int(s.top_k) != 1:  # onnxruntime-genai's rule and wording
            raise RequestError("TopK and TopP cannot be used with a beam search")
        varlen = model.spec.decoder.io.varlen
        if varlen:
            raise RequestError(f"decoder {model.spec.decoder.name!r} takes onnxruntime-genai's paged format (packed "
                               f"ids and the inputs {sorted(varlen.values())}): it runs through og.Engine, not "
                               f"og.Generator")
        self.model, self.params, self.search = model, params, s
        self.max_length = ml
        self.prompts = int(s.batch_size)
        # one search per prompt, over its num_beams rows (prompt b's beams are rows b * nb .. b * nb + nb - 1)
        self.beams = None if nb == 1 else [
            BeamSearch(nb, s.length_penalty, s.early_stopping, model.spec.eos_token_ids or [], model.pad_token_id)
            for _ in range(self.prompts)]
        self.batch = self.prompts * nb  # the decoder's rows
        self.pipe = model.pipeline_for(ml, self.batch)
        self.sampler = Sampler(s)
        self.external = dict(params.extra_inputs)
        self._adapters = None  # the Adapters container this generator takes adapters from
        self._terminated = False  # set_runtime_option("terminate_session", "1"): no model run until "0"
        self._guidance = None
        if params.guidance is not None:  # constrained decoding (pipeline/guidance.py), one grammar per row
            if nb > 1:
                raise RequestError("guidance is not supported with beam search (num_beams > 1)")
            from .guidance import Guidance
            self._guidance = Guidance(model.spec, params.guidance[0], params.guidance[1], self.batch)
        self._eos = [int(t) for t in (model.spec.eos_token_ids or [])]
        self._pad = model.pad_token_id
        self._rows = [[] for _ in range(self.batch)]  # each row's token ids (a padded row keeps its pads)
        self._fed = 0          # how many of them the decoder has seen (the same for every row)
        self._logits = None    # [batch, 1, vocab] float32 for the position after the sequence, None when stale
        self._outputs = {}     # the last run's logits, every position it ran
        self._last_ids = None
        self._finished = [False] * self.batch
        self._done = False
        self._next = None  # the last step's tokens (get_next_tokens), None when the rows' last ids are
        self._runs = 0     # model runs so far
        # onnxruntime-genai's Phi-3 rule (one row): when the sequence reaches the length where the rotary factors
        # switch from short to long, the model runs over the whole sequence again before the next step
        self._rope_at = _ROPE_SWITCH.get(model.spec.model_type or "", 0) if self.batch == 1 else 0
        self._hidden = None  # position -> the decoder's captured hidden state there (MtpGenerator), when kept
        self._snapshot = None  # snapshot_state(): (length, the decoder's snapshot, the logits after it, the ids)
        self._round_base = None  # a speculative round on recurrent state: (fed, snapshot, the ids run) before it
        # speculative decoding (pipeline/speculative.py): the round's tokens still to hand out, each with the
        # logits of the position after it; while any are left the decoder has seen past the sequence
        kind = check_speculative(model, params)
        self._spec = Speculator(self, kind) if kind else None
        self._queue = []
        self._speech = self._speech_output()

    def _speech_output(self):
        """LFM2-Audio's speech output (``pipeline/lfm2_audio.py``) when the package has one: the decoder's hidden
        states are kept from every run for it."""
        cfg = self.model.spec.audio_output
        if cfg is None:
            return None
        from .lfm2_audio import SpeechOutput
        comps = self.pipe.components
        out = SpeechOutput(cfg, comps["depthformer"], comps["audio_embedding"], int(self.model.spec.vocab_size or 0),
                           self.search, self.batch)
        if cfg.hidden_states in self.pipe.decoder.output_names:
            self.pipe.decoder.capture(cfg.hidden_states)
        return out

    @property
    def _seq(self) -> list:
        return self._rows[0]

    # -- feeding the model -------------------------------------------------------------------------
    def _run(self, new: np.ndarray):
        """The model over the unfed tokens plus ``new`` [batch, n]; the current logits become each row's last
        real position's.  A batch's rows may end in pads (right-padded, as ``Tokenizer.encode_batch`` gives)."""
        if self._terminated:
            raise RequestError("Session in Terminated state, exiting!")
        unfed = np.asarray([r[self._fed:] for r in self._rows], np.int64).reshape(self.batch, -1)
        cur = np.concatenate([unfed, new], axis=1)
        lengths = None
        if self.batch > 1:  # each row's real ids: the unfed token and the new ids before the padding
            lengths = unfed.shape[1] + _unpadded(new, self._pad)
            if lengths.min() < 1:
                raise RequestError(f"append_tokens: row {int(np.argmin(lengths))} holds only pads "
                                   f"({self._pad}); each row needs at least one token")
        self._next = None
        self._runs += 1
        first = self._fed == 0
        if first:
            self._expand_for_beams()
            self.pipe.begin(cur, self.external, self.max_length)
        frame = {}
        if self._speech is not None:
            self._speech.begin_step(cur, first)
            if self._speech.pending is not None:  # the last audio frame goes in in place of its placeholder
                frame["embeds"] = self._speech.take_pending(self._embeds_type())
        logits = np.asarray(self.pipe.forward(cur, self.external, first, want="all", lengths=lengths, **frame),
                            np.float32)
        self._note_hidden(self._fed)
        if logits.ndim == 2:  # a decoder whose logits have no sequence axis
            logits = logits[:, None, :]
        for r, ids in zip(self._rows, new.tolist()):
            r.extend(ids)
        self._fed = len(self._rows[0])
        self._outputs = {"logits": logits}
        if logits.shape[1] == 1:  # the decoder gave the last position only (an encoder-decoder's step)
            at = np.zeros(self.batch, np.int64)
        else:
            at = np.full(self.batch, cur.shape[1] - 1) if lengths is None else lengths - 1
        self._logits = np.ascontiguousarray(logits[np.arange(self.batch), at][:, None, :])
        self._last_ids = cur
        if self._speech is not None and self._speech.in_audio:  # a frame: the logits pick its placeholder
            hidden = self.pipe.decoder.captured
            if hidden is None:
                name = self.model.spec.audio_output.hidden_states
                raise RequestError(f"Speech output needs the decoder's \"{name}\" output. Build the decoder with "
                                   f"--extra_options include_hidden_states=true.")
            self._logits = self._speech.sample_frame(hidden).copy()

    def _embeds_type(self):
        """The numpy type of the decoder's input embeddings."""
        port = self.pipe.decoder.io.inputs_embeds_input
        t = self.pipe.decoder.inputs[port].type if port in self.pipe.decoder.inputs else "tensor(float)"
        return np.float16 if t == "tensor(float16)" else np.float32

    def _expand_for_beams(self):
        """An audio encoder's inputs (one row per prompt) repeated for each prompt's beams, as onnxruntime-genai
        expands them: the encoder then gives every beam its cross caches."""
        nb = int(self.search.num_beams)
        if nb == 1:
            return
        for comp in self.model.spec.components.values():
            if comp.type != "audio_encoder":
                continue
            for name in list(self.external):
                a = np.asarray(self.external[name])
                if a.ndim and a.shape[0] == self.prompts and name in self.pipe.components[comp.name].input_names:
                    self.external[name] = np.repeat(a, nb, axis=0)

    def _current_logits(self):
        if self._logits is None:
            self._run(np.zeros((self.batch, 0), np.int64))
        return self._logits

    # -- onnxruntime-genai's calls -----------------------------------------------------------------
    def append_tokens(self, ids):
        """Token ids for every row: [n] with one row, else [batch, n] (a ``Tensor`` from ``encode_batch``:
        right-padded with the pad id)."""
        a = np.asarray(ids.as_numpy() if hasattr(ids, "as_numpy") else ids, np.int64)
        self._settle()
        if a.ndim <= 1:
            a = a.reshape(1, -1)
        if self.beams is not None:  # each prompt on every one of its beams' rows
            if self._seq:
                raise RequestError("beam search takes its prompts once, before generating")
            if a.shape[0] != self.prompts:
                raise RequestError(f"append_tokens: expected token ids for {self.prompts} prompt(s), got shape "
                                   f"{list(a.shape)}")
            a = np.repeat(a, self.search.num_beams, axis=0)
        if a.ndim != 2 or a.shape[0] != self.batch:
            raise RequestError(f"append_tokens: expected token ids for {self.batch} row(s), got shape {list(a.shape)}")
        n = len(self._seq)
        if n + a.shape[1] > self.max_length:
            raise RequestError(f"input_ids size ({a.shape[1]}) + current sequence length ({n}) exceeds "
                               f"max length ({self.max_length})")
        if not a.shape[1]:
            return
        self._run(a)
        if env.logging_of("append_next_tokens"):
            env.log("append_next_tokens", " ".join(str(t) for t in a.reshape(-1).tolist()) + " ")
        self._finished = [False] * self.batch
        self._done = False

    def is_done(self) -> bool:
        return self._done

    def generate_next_token(self):
        if len(self._seq) >= self.max_length:
            raise RequestError(f"GenerateNextToken called with sequence length already at max_length "
                               f"({self.max_length})")
        if not self._seq:
            raise RequestError("append_tokens must come before generate_next_token: the sequence is empty")
        if self._rope_at and len(self._seq) == self._rope_at:
            self._refill()
        if self._spec is not None and not self._queue and not self._spec.plain_step():
            self._queue = self._spec.round() or []
        after, from_round = None, bool(self._queue)
        if from_round:  # a speculative round's next token, and the logits of the position after it
            tok, after = self._queue.pop(0)
            picked = [tok]
        else:
            logits = self._current_logits()[:, -1, :]
            if env.logging_of("generate_next_token"):
                s = self.search
                env.log("generate_next_token", f"do_sample: {int(bool(s.do_sample))} top_k: {int(s.top_k)} top_p: "
                                               f"{float(s.top_p):g} temperature: {float(s.temperature):g} "
                                               f"sequence length: {len(self._seq)}")
            if (self._eos and len(self._seq) < int(self.search.min_length)) or int(self.search.no_repeat_ngram_size):
                logits = np.stack([self._processed(logits[b], row) for b, row in enumerate(self._rows)])
            if self._guidance is not None:
                logits = self._guidance.mask(logits)
            if self.beams is not None:
                self._beam_step(logits)
                return
            picked = self.sampler.next_tokens(logits, [np.asarray(r, np.int64) for r in self._rows])
            if self._guidance is not None:  # each row's grammar advances by its token (a row already ended: no more)
                self._guidance.commit([t if not done else None for t, done in
                                       zip(np.asarray(picked).reshape(-1).tolist(), self._finished)])
        tokens = []
        for b, tok in enumerate(np.asarray(picked).reshape(-1).tolist()):
            if self._finished[b]:  # a row that has ended takes pads, as onnxruntime-genai's do
                tok = self._pad
            elif tok in self._eos:
                self._finished[b] = True
                if env.logging_of("hit_eos"):
                    env.log("hit_eos", f"EOS seen on batch {b}")
            tokens.append(int(tok))
        self._next = tokens
        if env.logging_of("append_next_tokens"):
            env.log("append_next_tokens", " ".join(map(str, tokens)) + " ")
        # The step that ends the last row is not appended (onnxruntime-genai 0.18: a prompt of one row never
        # holds its EOS; in a batch, the rows that ended before hold theirs and then pads).
        appended = not all(self._finished)
        if appended:
            for row, tok in zip(self._rows, tokens):
                row.append(tok)
            self._logits = None if after is None else np.ascontiguousarray(after, np.float32).reshape(1, 1, -1)
            if from_round:
                self._spec.emitted()
        self._done = all(self._finished) or len(self._seq) >= self.max_length
        if self._spec is not None:
            if self._done or len(self._seq) == self._rope_at:
                # the round's tokens past the end or past the rotary switch are dropped (an EOS it ended on too)
                self._settle(also=int(from_round and not appended))
            elif not self._queue:
                self._spec.finish()
        if len(self._seq) >= self.max_length and env.logging_of("hit_max_length"):
            env.log("hit_max_length", "greedy cpu hit")

    def _beam_step(self, logits):
        """One beam-search step of every prompt: the new beams continue their parents' rows (within the
        prompt's rows), caches reordered to match."""
        nb = int(self.search.num_beams)
        self._next = None
        tokens, parents = [], []
        for b, search in enumerate(self.beams):
            at = slice(b * nb, (b + 1) * nb)
            t, p = search.step(logits[at], self._rows[at])
            tokens += t
            parents += [b * nb + q for q in p]
        if parents != list(range(self.batch)):
            self.pipe.decoder.reorder(parents)
        self._rows = [self._rows[p] + [t] for p, t in zip(parents, tokens)]
        self._logits = None
        self._done = all(search.done for search in self.beams) or len(self._seq) >= self.max_length

    def _processed(self, logits, row) -> np.ndarray:
        """One row of next-position logits [vocab] with what a step applies before the sampler over the
        sequence ``row``: EOS ids masked below ``min_length``, ``no_repeat_ngram_size``'s repeats masked."""
        if self._eos and len(row) < int(self.search.min_length):
            logits = without_ids(logits, self._eos)
        n = int(self.search.no_repeat_ngram_size)
        if n > 0:
            logits = without_ids(np.array(logits, np.float32), repeated_ngram_ends(row, n))
        return logits

    # -- speculative rounds (pipeline/speculative.py) ----------------------------------------------
    def _verify(self, drafts: list) -> list:
        """The decoder over its unfed tokens and ``drafts``, in one run: the logits [vocab] of the position after
        the sequence and after each draft (``len(drafts) + 1`` rows).  The caches then hold the drafts too."""
        if self._terminated:
            raise RequestError("Session in Terminated state, exiting!")
        row = self._rows[0]
        unfed = row[self._fed:]
        if not unfed and self._logits is None:
            unfed = row[-1:]
            self.pipe.decoder.rewind(len(row) - 1)
            self._fed = len(row) - 1
        cur = np.asarray([unfed + list(drafts)], np.int64)
        dec = self.pipe.decoder
        # recurrent state cannot be cut back: what it was before the run is kept, to run the kept ids again
        self._round_base = (self._fed, dec.snapshot(), cur[0].tolist()) if dec.io.state_pairs else None
        self._runs += 1
        logits = np.asarray(self.pipe.forward(cur, self.external, False, want="all"), np.float32)
        self._note_hidden(self._fed)
        if logits.ndim != 3 or logits.shape[1] != cur.shape[1]:
            raise RequestError(f"speculative decoding needs the decoder's logits for every position it runs; it "
                               f"gave shape {list(logits.shape)} for {cur.shape[1]} positions")
        self._outputs = {"logits": logits}
        self._last_ids = cur
        self._fed = len(row) + len(drafts)
        first = [self._logits[0, -1]] if not unfed else []
        return first + list(logits[0, max(len(unfed) - 1, 0):])

    def _keep_verified(self, n: int):
        """Cut the decoder's caches back to the first ``n`` positions (the sequence and the kept drafts).  A
        decoder with recurrent state goes back to where the round began and runs the kept ids again."""
        if self._fed <= n:
            return
        if self._round_base is None:
            self.pipe.decoder.rewind(n)
            self._fed = n
            return
        fed, snap, ids = self._round_base
        self.pipe.decoder.restore(snap)
        self._fed = fed
        if n > fed:
            self._runs += 1
            self.pipe.forward(np.asarray([ids[:n - fed]], np.int64), self.external, False, want="all")
            self._note_hidden(fed)
            self._fed = n
            if self._spec is not None:
                self._spec.reconciled()

    def _note_hidden(self, start: int):
        """Keep the captured hidden states of the run over positions ``start``, ``start + 1``, ... (one row)."""
        if self._hidden is not None:
            h = self.pipe.decoder.captured
            for i, row in enumerate(np.asarray(h).reshape(-1, h.shape[-1])):
                self._hidden[start + i] = row

    def _settle(self, reset=False, also=0):
        """Drop what is left of a speculative round (and ``also`` tokens taken from it but not kept): the caches go
        back to the sequence; the current logits (the position after it) stay.  ``reset``: the sequence is being
        cut back, the round policies start over."""
        if self._spec is None:
            return
        dropped, self._queue = len(self._queue) + also, []
        self._spec.reset(dropped) if reset else self._spec.finish(dropped)
        self._keep_verified(len(self._seq))

    def _refill(self):
        """The model over the whole sequence again (the caches rebuilt from the start)."""
        seq = list(self._rows[0])
        self._settle()
        self._fed = 0
        del self._rows[0][:]
        self._logits = None
        self.append_tokens(np.asarray(seq, np.int64))

    def get_speculative_stats(self) -> dict:
        """onnxruntime-genai's speculative statistics (every key; all zero when not decoding speculatively)."""
        return self._spec.report() if self._spec is not None else empty_stats()

    def get_next_tokens(self) -> np.ndarray:
        if self._next is not None:
            return np.asarray(self._next, np.int32)
        return np.asarray([r[-1] for r in self._rows] if self._seq else [], np.int32)

    def get_sequence(self, index: int = 0) -> np.ndarray:
        if self.beams is not None:  # prompt index // nrs's (index % nrs)-th best (open beams count at the end)
            nrs, nb = int(self.search.num_return_sequences), int(self.search.num_beams)
            if not 0 <= index < nrs * self.prompts:
                raise RequestError(f"get_sequence({index}): beam search returns {nrs} sequence(s) for each of "
                                   f"{self.prompts} prompt(s)")
            b = index // nrs
            self.beams[b].finish(self._rows[b * nb:(b + 1) * nb])
            return np.asarray(self.beams[b].hypothesis(index % nrs), np.int32)
        if not 0 <= index < self.batch:
            raise RequestError(f"get_sequence({index}): the batch holds {self.batch} sequence(s)")
        return np.asarray(self._rows[index], np.int32)

    def token_count(self) -> int:
        return len(self._seq)

    def get_logits(self) -> np.ndarray:
        """The logits of the next position, [batch, 1, vocab] float32 (the model runs first if they are stale)."""
        return self._current_logits().copy()

    def set_logits(self, logits):
        """Replace the next position's logits (what ``generate_next_token`` picks from)."""
        self._settle()
        cur = self._current_logits()
        a = np.asarray(logits, np.float32)
        if a.size != cur.size:
            raise RequestError(f"set_logits: expected {cur.size} logits (shape {list(cur.shape)}), got shape "
                               f"{list(a.shape)}")
        self._logits = np.ascontiguousarray(a.reshape(cur.shape))

    def get_output(self, name: str) -> np.ndarray:
        """The last run's output ``name``: ``logits`` [1, positions run, vocab], a present (the cache's rows so
        far) or a recurrent state."""
        self._settle()
        if name == "audio_codes" and self._speech is not None:
            return self._speech.audio_codes()
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
        """A multimodal package's inputs, as a processor returns them: ``input_ids`` are appended (the prompt,
        image placeholders included); the others (``pixel_values``, ``image_sizes``, ...) go to the components
        that take them.  A package with only a decoder takes no inputs this way (onnxruntime-genai's rule)."""
        if len(self.model.spec.components) == 1:
            raise RequestError(f"Please use generator.AppendTokens for {self.model.spec.model_type}. SetInputs is "
                               f"not supported for this model type.")
        nb = int(self.search.num_beams)
        if self.model.spec.model_type == "lfm2_audio" and "speech" in self.model.spec.components and nb > 1:
            raise RequestError(f"Lfm2AudioSpeechState: beam search is not supported for lfm2_audio; got num_beams "
                               f"{nb}. Set num_beams to 1.")
        ids = None
        for k, v in dict(named or {}, **more).items():
            v = v.as_numpy() if hasattr(v, "as_numpy") else v
            if k == "input_ids":
                ids = v
            else:
                self.external[self.model.spec.input_aliases.get(k, k)] = v
        if ids is not None:
            self.append_tokens(ids)

    def set_runtime_option(self, key: str, value: str):
        """onnxruntime-genai's run options: ``terminate_session`` "1" makes every later model run fail (another
        thread may set it to stop a generation), "0" lifts it; other keys are accepted and change nothing, as
        there."""
        if key == "terminate_session":
            self._terminated = str(value) == "1"

    def set_model_input(self, name: str, value):
        """An input of the model's sessions by name (the decoder's own extra inputs included)."""
        self.external[name] = value.as_numpy() if hasattr(value, "as_numpy") else value

    def set_hidden_states(self, hidden_states):
        """The decoder's ``hidden_states`` input (``model.decoder.inputs.hidden_states`` names it; an MTP head
        reads the main model's last hidden state there) for the next runs, until set again, as in
        onnxruntime-genai; a no-op for a decoder without that input."""
        dec = self.pipe.decoder
        name = self.model.spec.hidden_states_input or "hidden_states"
        if name in dec.inputs:
            a = hidden_states.as_numpy() if hasattr(hidden_states, "as_numpy") else hidden_states
            self.external[name] = np.array(a, copy=True)

    def set_active_adapter(self, adapters, name: str):
        """Feed adapter ``name``'s parameters (``pipeline/adapters.py``) to the decoder at every step from now on;
        the adapter stays in use while this generator lives."""
        import weakref
        if self._adapters is None:
            self._adapters = adapters
        elif self._adapters is not adapters:
            raise RequestError("Generator state can only register a single Adapters container.")
        params = adapters._acquire(name)
        weakref.finalize(self, adapters._release, name)
        dec = self.pipe.decoder
        unknown = sorted(set(params) - set(dec.inputs) - set(dec.overridable))
        if unknown:
            adapters._release(name)
            raise RequestError(f"adapter {name!r}: {unknown[:5]} are not inputs of the decoder")
        self.external.update(params)

    def snapshot_state(self):
        """Keep the decoder's recurrent state at the current length, so that ``rewind_to`` that length comes back
        to it without running the sequence again (onnxruntime-genai's call for speculative decoding on hybrid
        models).  The one snapshot replaces the last; a decoder without recurrent state needs none (a no-op)."""
        dec = self.pipe.decoder
        if not dec.io.state_pairs or not self._seq:
            return
        self._settle()
        logits = self._current_logits()  # the decoder runs over the unfed ids: it has seen the whole sequence
        self._snapshot = (len(self._seq), dec.snapshot(), logits.copy(), list(self._rows[0]))

    def rewind_to(self, length: int):
        """Keep the first ``length`` tokens; the decoder's caches are truncated, not recomputed."""
        length = int(length)
        self._settle(reset=True)
        if not 0 <= length <= len(self._seq):
            raise RequestError(f"rewind_to({length}): the sequence holds {len(self._seq)} tokens")
        if self.beams is not None:
            raise RequestError("RewindToLength is not supported with beam search")
        if not getattr(self.pipe, "rewindable", True):
            raise RequestError(f"rewind_to: a {self.model.spec.model_type} encoder-decoder runs its prompt once "
                               f"through the encoder; start a new Generator instead")
        if self.batch > 1 and length != 0:  # onnxruntime-genai's rule and wording
            raise RequestError("RewindToLength must be called with new_length=0 when batch_size > 1")
        keep = length - 1  # the last kept token is fed again: its logits are the next position's
        dec = self.pipe.decoder
        snap = self._snapshot
        restored = bool(dec.io.state_pairs and snap is not None and snap[0] == length and self._fed >= length
                        and dec.kv_length >= length and self._rows[0][:length] == snap[3])
        if restored:
            dec.restore(snap[1])  # the state after the kept tokens: nothing runs again
            self._fed = length
        elif keep <= 0 or keep > min(self._fed, dec.kv_length) or dec.io.state_pairs:
            self._fed = 0  # start over from the kept tokens (recurrent state has no history)
        else:
            dec.rewind(keep)
            self._fed = keep
        for r in self._rows:
            del r[length:]
        self._logits = snap[2].copy() if restored else None
        self._next = None
        self._finished = [False] * self.batch
        self._done = False
        if self._guidance is not None:  # as onnxruntime-genai: the grammar starts over
            self._guidance.reset()
