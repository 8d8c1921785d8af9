"""onnxruntime-genai's ``Engine`` API: conversations in turns, stepped by the caller, tokens handed back as events.

It runs on the serving engine (``pipeline/engine.py``: continuous batching over a paged KV cache, prefix reuse),
natively.

    engine = og.Engine(model)
    request = engine.create_request()
    options = og.TurnOptions(request); options.set_max_generated_tokens(32)
    request.begin_turn(tokenizer.encode(prompt), options)
    buffer = engine.create_event_buffer(16)
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            ...  # event.request, event.token, event.flags, event.finish_reason, event.usage

What onnxruntime-genai 0.18 does, and this module does too:
- ``run(buffer)``, when no event is waiting, takes every running request one token further (a new request's
  prompt is computed whole and gives its first token), then hands back at most ``capacity`` events, in the order
  the requests were created; the rest wait for the next ``run``.
- one ``TOKEN`` event per generated token; the turn's last event also has ``TURN_FINISHED``, its
  ``finish_reason`` and its ``usage`` (the turn's prompt tokens, generated tokens, prompt tokens taken from the
  prefix cache).  An EOS is not a token: the turn ends with a ``TURN_FINISHED`` event whose ``token`` is None, and
  the EOS does not join the conversation.  A cancelled turn ends the same way.
- a later turn continues the conversation: its tokens follow every token so far (the last generated one
  included), and only they are computed; ``rewind_to_start_of_turn`` cuts the conversation back to where a turn
  began.  ``max_session_tokens`` (default and ceiling: the package's ``search.max_length``) bounds the whole
  conversation (``MAX_SESSION_TOKENS``); ``set_max_generated_tokens`` bounds one turn (``MAX_GENERATED_TOKENS``).
- turn options are checked when the turn begins, with onnxruntime-genai's messages; the defaults are the
  package's ``search`` section.

Where it differs, on purpose:
- onnxruntime-genai batches a package without an ``engine.dynamic_batching`` section statically (a batch runs to
  its end before the next is admitted) and refuses per-turn seeds and stop strings there.  This engine is always
  continuous and paged, so both are served on every package; a request's tokens are the same either way (every
  kernel computes a row from that row alone).  Likewise a prompt reuses cached prefix blocks on every package,
  and ``cached_prompt_tokens`` counts them as onnxruntime-genai's paged engine does (its static path says 0).
- a request whose turn has ended holds no batch slot: onnxruntime-genai 0.18's paged engine counts every open
  request against ``max_batch_size`` and, past it, reports ``CAPACITY_BLOCKED`` (with no request) at every run
  until a request is closed; here a new turn waits only for a running one to end.
- token ids outside the vocabulary are refused by ``begin_turn`` (onnxruntime-genai fails the turn at run time).
- speculative draft tokens are refused: they are not implemented here (``max_draft_tokens_per_proposal()`` is 0).
  A turn's grammar (``set_guidance``) constrains its tokens through llguidance (``pipeline/guidance.py``).
- the decoder runs natively; a ``Model`` whose decoder was explicitly put on onnxruntime is refused, never run
  natively behind the caller's back.  Decoders the paged engine cannot serve are refused with its reason.
"""
from __future__ import annotations

import enum
import json
import math
import os
from collections import deque

import numpy as np

from .engine import Engine as _ServingEngine
from .engine import SamplingParams
from .spec import RequestError

__all__ = ["Engine", "Request", "RequestOptions", "TurnOptions", "TurnUsage", "EngineEvent", "EngineEventBuffer",
           "EngineEventFlags", "EngineCapabilities", "FinishReason", "EngineErrorCode"]

_STATIC_MAX_BATCH = 4   # onnxruntime-genai's batch when the package configures none
_MAX_STOP_STRINGS = 16
_MAX_STOP_BYTES = 16 * 1024


class FinishReason(enum.IntEnum):
    __str__ = enum.Enum.__str__  # "FinishReason.EOS", as onnxruntime-genai's enums print (not the number)
    NONE = 0
    EOS = 1
    STOP_STRING = 2
    MAX_GENERATED_TOKENS = 3
    MAX_SESSION_TOKENS = 4
    CANCELLED = 5
    FAILED = 6


class EngineErrorCode(enum.IntEnum):
    __str__ = enum.Enum.__str__
    NONE = 0
    CAPACITY_DEFERRED = 1
    EXECUTION_CAPACITY_EXCEEDED = 2
    RETRYABLE_EXECUTION = 3
    REQUEST_UNSERVICEABLE = 4
    ENGINE_CONTRACT_FAILURE = 5
    ENGINE_EXECUTION_FAILURE = 6


class EngineEventFlags(enum.IntFlag):
    __str__ = enum.Enum.__str__
    NONE = 0
    TOKEN = 1
    TURN_FINISHED = 2
    CAPACITY_BLOCKED = 4
    FAILED = 8
    RETRYABLE = 16


class TurnUsage:
    """What a finished turn consumed; all zero on the events before its last."""

    __slots__ = ("prompt_tokens", "generated_tokens", "cached_prompt_tokens")

    def __init__(self, prompt_tokens=0, generated_tokens=0, cached_prompt_tokens=0):
        self.prompt_tokens = int(prompt_tokens)
        self.generated_tokens = int(generated_tokens)
        self.cached_prompt_tokens = int(cached_prompt_tokens)

    def __repr__(self):
        return (f"TurnUsage(prompt_tokens={self.prompt_tokens}, generated_tokens={self.generated_tokens}, "
                f"cached_prompt_tokens={self.cached_prompt_tokens})")


class EngineEvent:
    __slots__ = ("request", "turn_id", "token", "flags", "finish_reason", "error_code", "matched_stop_string_index",
                 "usage")

    def __init__(self, request, turn_id, token, flags, finish_reason=FinishReason.NONE,
                 error_code=EngineErrorCode.NONE, matched_stop_string_index=None, usage=None):
        self.request = request
        self.turn_id = turn_id
        self.token = token
        self.flags = EngineEventFlags(flags)
        self.finish_reason = finish_reason
        self.error_code = error_code
        self.matched_stop_string_index = matched_stop_string_index
        self.usage = usage if usage is not None else TurnUsage()

    def __repr__(self):
        return (f"EngineEvent(turn_id={self.turn_id}, token={self.token}, flags={self.flags!r}, "
                f"finish_reason={self.finish_reason.name})")


class EngineEventBuffer:
    """Where ``Engine.run`` puts the events of one call (at most ``capacity``); iterate it."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self._events = []

    def __iter__(self):
        return iter(list(self._events))

    def __len__(self):
        return len(self._events)


class EngineCapabilities:
    __slots__ = ("configured_max_batch_size", "max_request_length", "max_scheduled_tokens")

    def __init__(self, configured_max_batch_size, max_request_length, max_scheduled_tokens):
        self.configured_max_batch_size = int(configured_max_batch_size)
        self.max_request_length = int(max_request_length)
        self.max_scheduled_tokens = int(max_scheduled_tokens)


class RequestOptions:
    def __init__(self):
        self.max_session_tokens = 0

    def set_max_session_tokens(self, n: int):
        """Total tokens (prompt plus generated, across every turn) the request may reach; 0: the package's
        ``search.max_length``."""
        self.max_session_tokens = int(n)


class TurnOptions:
    """One turn's options; unset ones take the package's ``search`` values.  Values are checked when the turn
    begins (``Request.begin_turn``), as onnxruntime-genai does."""

    def __init__(self, request: Request):
        self._request = request
        self.reset()

    def reset(self):
        self.do_sample = self.temperature = self.top_k = self.top_p = self.seed = None
        self.repetition_penalty = self.no_repeat_ngram_size = None
        self.max_generated_tokens = self.min_generated_tokens = 0
        self.stop_strings = []
        self.guidance = None

    def set_do_sample(self, value: bool):
        self.do_sample = bool(value)

    def set_temperature(self, value: float):
        self.temperature = float(value)

    def set_top_k(self, value: int):
        self.top_k = int(value)

    def set_top_p(self, value: float):
        self.top_p = float(value)

    def set_seed(self, value: int):
        self.seed = int(value)

    def clear_seed(self):
        self.seed = None

    def set_repetition_penalty(self, value: float):
        self.repetition_penalty = float(value)

    def set_no_repeat_ngram_size(self, value: int):
        self.no_repeat_ngram_size = int(value)

    def set_max_generated_tokens(self, value: int):
        self.max_generated_tokens = _unsigned(value, "set_max_generated_tokens")

    def set_min_generated_tokens(self, value: int):
        self.min_generated_tokens = _unsigned(value, "set_min_generated_tokens")

    def set_stop_strings(self, strings):
        strings = [str(s) for s in strings]
        if len(strings) > _MAX_STOP_STRINGS:
            raise RequestError(f"Too many stop strings: {len(strings)}, the maximum is {_MAX_STOP_STRINGS}.")
        for i, s in enumerate(strings):
            if not s:
                raise RequestError(f"Stop string at index {i} is empty.")
            if "\0" in s:
                raise RequestError(f"Stop string at index {i} contains a NUL byte.")
        if sum(len(s.encode()) for s in strings) > _MAX_STOP_BYTES:
            raise RequestError(f"Stop strings total more than {_MAX_STOP_BYTES} bytes.")
        self.stop_strings = strings

    def set_guidance(self, kind: str, value: str):
        from .guidance import check_kind
        check_kind(kind)
        self.guidance = (str(kind), str(value))

    def clear_guidance(self):
        self.guidance = None


def _unsigned(value, what):
    v = int(value)
    if v < 0:
        raise TypeError(f"{what}(): expected an unsigned integer, got {v}")
    return v


class Request:
    """One conversation, created by ``Engine.create_request``: turns begin with ``begin_turn`` and end with an
    event whose flags include ``TURN_FINISHED``."""

    def __init__(self, engine: Engine, options: RequestOptions | None):
        self._engine = engine
        limit = engine._max_session
        n = int(options.max_session_tokens) if options is not None else 0
        if n < 0 or n > limit:
            raise RequestError(f"max_session_tokens ({n}) must be greater than zero and no greater than the "
                               f"model-configured search.max_length ({limit}).")
        self._max_session = n or limit
        self._serving = None        # the serving engine's request, from the first turn on
        self._turns = []            # (turn id, conversation length before its tokens)
        self._next_turn = 1
        self._turn = None           # the active turn: id, its prompt length, its cap, stop strings
        self._seen = 0              # output tokens of the active turn already turned into events
        self._closed = False
        self._number = 0            # its place among the engine's requests (set by create_request)

    # -- the caller's calls ------------------------------------------------------------------------
    def begin_turn(self, tokens, turn_options: TurnOptions | None = None) -> int:
        """Append ``tokens`` to the conversation and generate after them; returns the turn's id."""
        if self._closed:
            raise RequestError("Cannot begin a turn for a closed request.")
        if self._turn is not None:
            raise RequestError("BeginTurn is only valid for a new request or after the current turn is complete.")
        if turn_options is not None and turn_options._request is not self:
            raise RequestError("Turn options belong to a different or destroyed Request.")
        ids = np.asarray(tokens).reshape(-1)
        if ids.size == 0:
            raise RequestError("Expected at least one input token for generation. Received 0.")
        if ids.dtype.kind not in "iu":
            raise RequestError(f"begin_turn expects integer token ids, got {ids.dtype}")
        length = self._length()
        if length + ids.size >= self._max_session:
            raise RequestError(f"Appending input_tokens_count ({ids.size}) to current_sequence_length ({length}) "
                               f"must leave room for at least one generated token before max_session_tokens "
                               f"({self._max_session}).")
        opts = turn_options if turn_options is not None else TurnOptions(self)
        params, cap = self._engine._params(opts, self._max_session - length - int(ids.size))
        eng = self._engine._serving
        if self._serving is None:
            self._serving = eng.submit(ids, params, keep=True)
        else:
            eng.extend(self._serving, ids, params)
        tid = self._next_turn
        self._next_turn += 1
        self._turns.append((tid, length))
        self._turn = _Turn(tid, int(ids.size), cap, opts.stop_strings, length)
        self._seen = 0
        if opts.stop_strings:
            self._serving.stop_check = self._turn.stop_checker(self._engine._tokenizer()._tok)
        else:
            self._serving.stop_check = None
        self._engine._active.append(self)
        return tid

    def cancel_turn(self, turn_id: int) -> bool:
        """End the active turn ``turn_id``; False when it is not the active turn."""
        if self._closed or self._turn is None or self._turn.id != int(turn_id) or self._serving.done:
            return False
        return self._engine._serving.cancel(self._serving)

    def rewind_to_start_of_turn(self, turn_id: int):
        """Cut the conversation back to its length before turn ``turn_id`` began (a finished request only)."""
        if self._closed:
            raise RequestError("Cannot rewind a closed request.")
        if self._turn is not None:
            raise RequestError("Request rewind is only valid after the current turn is complete.")
        at = next((k for k, (tid, _) in enumerate(self._turns) if tid == int(turn_id)), None)
        if at is None:
            raise RequestError(f"Cannot rewind to unknown Turn ID {int(turn_id)}.")
        start = self._turns[at][1]
        del self._turns[at:]
        self._engine._serving.truncate(self._serving, start)

    def set_draft_tokens(self, tokens):
        if self._turn is None or self._closed:
            raise RequestError("Speculative draft tokens may only be proposed when the request is ready to decode.")
        raise RequestError("this engine does not decode speculatively (max_draft_tokens_per_proposal() is 0): "
                           "draft tokens cannot be proposed")

    def close(self):
        """End the request: an active turn stops without further events, and its cache goes back to the pool."""
        if self._closed:
            return
        self._closed = True
        if self._serving is not None:
            self._engine._serving.release(self._serving)
        self._turn = None
        self._engine._drop(self)

    # -- for the engine ----------------------------------------------------------------------------
    def _length(self) -> int:
        return len(self._serving.tokens) if self._serving is not None else 0

    def _events(self):
        """The events of the active turn since the last call; the turn ends when the serving request has."""
        r, turn = self._serving, self._turn
        out = list(r.output)
        done = r.done
        reason = r.finish_reason if done else None
        eos = reason == "stop" and out and out[-1] in r._stop
        new = out[self._seen:len(out) - 1] if eos else out[self._seen:]
        self._seen = len(out)
        tokens_flag = EngineEventFlags.TOKEN
        events = [EngineEvent(self, turn.id, int(t), tokens_flag) for t in new]
        if not done:
            return events, False
        generated = len(out) - (1 if eos else 0)
        cached = max(0, min(int(r.reused) - turn.before, turn.prompt))
        usage = TurnUsage(turn.prompt, generated, cached)
        finish = {"stop_string": FinishReason.STOP_STRING, "cancelled": FinishReason.CANCELLED,
                  "error": FinishReason.FAILED}.get(reason)
        if eos:
            finish = FinishReason.EOS
        elif reason == "length":
            finish = (FinishReason.MAX_GENERATED_TOKENS if turn.cap and generated >= turn.cap
                      else FinishReason.MAX_SESSION_TOKENS)
        if finish is None:
            finish = FinishReason.EOS
        last_token = finish in (FinishReason.STOP_STRING, FinishReason.MAX_GENERATED_TOKENS,
                                FinishReason.MAX_SESSION_TOKENS) and events
        if last_token:
            e = events[-1]
        else:
            e = EngineEvent(self, turn.id, None, EngineEventFlags.NONE)
            events.append(e)
        e.flags |= EngineEventFlags.TURN_FINISHED
        e.finish_reason = finish
        e.usage = usage
        if finish == FinishReason.STOP_STRING:
            e.matched_stop_string_index = turn.matched
        if finish == FinishReason.FAILED:
            e.flags |= EngineEventFlags.FAILED
            e.error_code = EngineErrorCode.ENGINE_EXECUTION_FAILURE
        self._turn = None
        return events, True


class _Turn:
    __slots__ = ("id", "prompt", "cap", "stops", "before", "matched")

    def __init__(self, tid, prompt, cap, stops, before):
        self.id, self.prompt, self.cap, self.stops, self.before = tid, prompt, cap, list(stops), before
        self.matched = None

    def stop_checker(self, tokenizer):
        """``fn(token)``: 'stop_string' once the text of the turn's generated tokens contains a stop string (the
        first listed one it contains).  The tokens are decoded together, not streamed (a token's text can depend
        on the tokens after it: a stream would see the match one token late), but only a tail of them: a match
        that a token completes ends in that tail.  The tail is widened until its text is well past the longest
        stop string, so the first token of the tail, whose leading space a decoder may drop, never touches it.
        ``tokenizer``: ``pipeline/tokenizer.Tokenizer``, whose text keeps going past bytes that are not UTF-8 (a
        tail may begin inside a character)."""
        ids = []
        longest = max(len(s) for s in self.stops)

        def check(token):
            ids.append(int(token))
            k = 4 * longest + 8
            while True:
                start = max(0, len(ids) - k)
                text = tokenizer.decode(np.asarray(ids[start:], np.int32))
                if start == 0 or len(text) >= longest + 8:
                    break
                k *= 2
            for i, s in enumerate(self.stops):
                if s in text:
                    self.matched = i
                    return "stop_string"
            return None
        return check


class Engine:
    """onnxruntime-genai's ``Engine`` over a ``Model``: ``create_request``, ``run``, ``has_pending_requests``.
    The package's ``engine.dynamic_batching`` section, if any, sets the block size, the number of blocks and the
    batch."""

    def __init__(self, model):
        from .backends import native_providers
        self._model = model
        spec = model.spec
        if getattr(model, "decoder_on_onnxruntime", False):
            raise RequestError(f"og.Engine runs the decoder natively, and this Model puts decoder "
                               f"{spec.decoder.name!r} on onnxruntime: create the Model with native='all' (or "
                               f"ONNX_NUMBA_NATIVE_DECODER unset) to use the Engine")
        ctx = int(spec.context_length or spec.search.max_length)
        self._max_session = int(min(int(spec.search.max_length), ctx))
        dyn = _dynamic_batching(model.path)
        block = int(dyn.get("block_size", 16))
        batch = int(dyn.get("max_batch_size", _STATIC_MAX_BATCH))
        blocks = int(dyn["num_blocks"]) if "num_blocks" in dyn else None
        self._serving = _ServingEngine(spec, block_size=block, num_blocks=blocks, max_batch=batch,
                                       max_model_len=self._max_session,
                                       providers=native_providers(model.choice.device))
        self._active = []     # requests with a turn whose end is not reported yet
        self._created = 0
        self._queue = deque()
        self._tok = None

    def create_request(self, *, options: RequestOptions | None = None) -> Request:
        r = Request(self, options)
        r._number = self._created  # events come in the order the requests were created
        self._created += 1
        return r

    def create_event_buffer(self, capacity: int) -> EngineEventBuffer:
        if int(capacity) < 0:
            raise RequestError(f"the event buffer's capacity must be 0 or more, got {capacity}")
        return EngineEventBuffer(capacity)

    def get_capabilities(self) -> EngineCapabilities:
        s = self._serving
        return EngineCapabilities(s.max_batch, s.max_model_len, s.prefill_chunk + s.max_batch - 1)

    def max_draft_tokens_per_proposal(self) -> int:
        return 0

    def get_speculative_stats(self) -> dict:
        """Speculative decoding's statistics, with onnxruntime-genai's keys: all zero, as the engine does not
        decode speculatively (onnxruntime-genai's does not either)."""
        from .speculative import empty_stats
        return empty_stats()

    def has_pending_requests(self) -> bool:
        return bool(self._queue or self._active)

    def run(self, buffer: EngineEventBuffer) -> EngineEventBuffer:
        """One engine step when no event is waiting; then up to ``buffer.capacity`` events into ``buffer``."""
        if not isinstance(buffer, EngineEventBuffer):
            raise RequestError(f"run expects an EngineEventBuffer (from create_event_buffer), got "
                               f"{type(buffer).__name__}")
        if not self._queue and self._active:
            self._serving.round()
            self._collect()
        n = min(buffer.capacity, len(self._queue))
        buffer._events = [self._queue.popleft() for _ in range(n)]
        return buffer

    # -- internals ---------------------------------------------------------------------------------
    def _collect(self):
        for r in sorted(self._active, key=lambda q: q._number):
            events, ended = r._events()
            self._queue.extend(events)
            if ended:
                self._active.remove(r)

    def _drop(self, r: Request):
        if r in self._active:
            self._active.remove(r)
        self._queue = deque(e for e in self._queue if e.request is not r)

    def _tokenizer(self):
        if self._tok is None:
            from .api import Tokenizer
            self._tok = Tokenizer(self._model)
        return self._tok

    def _params(self, o: TurnOptions, room: int):
        """The serving engine's options for a turn of options ``o`` with ``room`` tokens left in the session,
        checked with onnxruntime-genai's messages; and the turn's own cap (0: none)."""
        s = self._model.spec.search
        temperature = s.temperature if o.temperature is None else o.temperature
        top_p = s.top_p if o.top_p is None else o.top_p
        top_k = s.top_k if o.top_k is None else o.top_k
        penalty = s.repetition_penalty if o.repetition_penalty is None else o.repetition_penalty
        ngram = s.no_repeat_ngram_size if o.no_repeat_ngram_size is None else o.no_repeat_ngram_size
        if not (math.isfinite(temperature) and temperature >= 0):
            raise RequestError(f"temperature ({temperature:f}) must be finite and 0 or greater.")
        if not (math.isfinite(top_p) and 0 <= top_p <= 1):
            raise RequestError(f"top_p ({top_p:f}) must be finite and between 0.0 and 1.0.")
        if not (math.isfinite(penalty) and penalty > 0):
            raise RequestError(f"repetition_penalty ({penalty:f}) must be finite and greater than zero.")
        if top_k < 0:
            raise RequestError(f"top_k ({top_k}) must be 0 or greater.")
        if ngram < 0:
            raise RequestError(f"no_repeat_ngram_size ({ngram}) must be 0 or greater.")
        cap = int(o.max_generated_tokens)
        if cap and o.min_generated_tokens > cap:
            raise RequestError(f"min_generated_tokens ({o.min_generated_tokens}) must not exceed "
                               f"max_generated_tokens ({cap}).")
        sample = bool(s.do_sample if o.do_sample is None else o.do_sample) and temperature > 0
        seed = o.seed if o.seed is not None else s.seed
        params = SamplingParams(max_tokens=min(cap, room) if cap else room,
                                temperature=float(temperature) if sample else 0.0,
                                top_p=float(top_p) if sample else 1.0, top_k=int(top_k) if sample else 0,
                                seed=seed, repetition_penalty=float(penalty),
                                min_tokens=int(o.min_generated_tokens), no_repeat_ngram_size=int(ngram))
        if o.guidance is not None:  # the turn's own grammar, from the turn's first token
            from .guidance import Guidance
            params.guidance = Guidance(self._model.spec, o.guidance[0], o.guidance[1], 1)
        return params, cap


def _dynamic_batching(path) -> dict:
    """The package's ``engine.dynamic_batching`` section (block_size, num_blocks, max_batch_size), or {}."""
    cfg = os.path.join(str(path), "genai_config.json")
    if not os.path.isfile(cfg):
        return {}
    with open(cfg, encoding="utf-8") as f:
        section = (json.load(f).get("engine") or {}).get("dynamic_batching") or {}
    out = {}
    for k in ("block_size", "num_blocks", "max_batch_size"):
        if k in section:
            v = section[k]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise RequestError(f"genai_config.json: engine.dynamic_batching.{k} must be a positive integer, "
                                   f"got {v!r}")
            out[k] = v
    return out
