"""An OpenAI-compatible HTTP server over the serving engine (``pipeline/engine.py``).

    app = make_app(Engine("path/to/package"), None, "my-model")   # a Starlette app
    serve("path/to/package", "127.0.0.1", 8000, max_batch=8)     # or run it with uvicorn

Endpoints: ``POST /v1/completions`` (``prompt``: a string, a list of token ids, or a list holding one string),
``POST /v1/chat/completions`` (``messages`` rendered by the package's chat template with the generation prompt
added), each answered whole or, with ``stream: true``, as server-sent events (OpenAI's chunk objects, then
``data: [DONE]``); ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text, from ``engine.stats()``).
Options: OpenAI's ``max_tokens`` (completions: 16; chat: what the context has left), ``temperature`` (1.0),
``top_p``, ``seed``, ``stop``, ``n`` (``n`` engine requests, seeded ``seed + i``), ``stream_options.include_usage``;
and as extensions ``top_k``, ``repetition_penalty``, ``ignore_eos``, ``stop_token_ids`` and ``return_token_ids``
(each choice's token ids beside its text).  OpenAI's options that would change a result and that this server does
not implement (``logprobs``, ``echo``, penalties, ``logit_bias``, tools, ...) are refused unless given their no-op
value; other unknown fields are ignored.

Invariants:
- a choice's streamed text deltas concatenate to the text the same request gets unstreamed: each delta is what
  ``decode(all output so far)`` adds to the text already sent (decoded a window at a time: the text of the
  tokens past the settled text, read after a few tokens of context, so a token costs the same late in a long
  output as early), holding back a trailing incomplete character
  (U+FFFD while its bytes are split over tokens) and any tail that could begin a stop string; this rests on the
  decode of a token prefix being a prefix of the decode of the whole, as it is for byte-level BPE;
- a stop string ends a choice at the first place any stop string completes: its text is cut just before that
  string, its token count is the fewest tokens whose text holds it, its finish reason is ``stop``, and its engine
  request is cancelled at once (its KV blocks go back to the pool);
- every engine request a call submitted is cancelled however the call ends: finished, refused half-way, the
  client gone (mid-stream or while waiting for a whole answer), the server stopping;
- the handlers never block the event loop: the engine steps on its own thread (started and stopped by the app's
  lifespan), tokenizing and the engine calls (submit, cancel, stats: none waits for a step) run on worker
  threads, and waiting for tokens is an ``asyncio.Event`` the engine sets through ``loop.call_soon_threadsafe``;
- every error is OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for malformed JSON, a
  missing or mistyped field or a request the engine refuses (``RequestError``, its message kept), 404 for an
  unknown model (code ``model_not_found``) or route, 500 (type ``server_error``) when generation itself failed.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from typing import NamedTuple

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .engine import Engine, SamplingParams
from .spec import RequestError

__all__ = ["make_app", "serve", "InvalidRequestError"]

log = logging.getLogger(__name__)

_REPLACEMENT = "\ufffd"
_DISCONNECT_POLL_S = 0.25  # how often a call waiting for a whole answer checks that its client is still there
_LOOKBACK = 6  # tokens decoded before the unsettled ones, so that their text is read in context
_MAX_N = 128

# OpenAI options this server does not implement: accepted only with one of these no-op values.
_NO_OP = {"echo": (False,), "suffix": (None, ""), "logprobs": (None, False), "top_logprobs": (None,),
          "best_of": (None, 1), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
          "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"),
          "response_format": (None, {"type": "text"})}

# engine.stats() key -> (metric name, type, help)
_METRICS = {
    "requests": ("requests_total", "counter", "Requests submitted to the engine."),
    "finished": ("requests_finished_total", "counter", "Requests ended by a stop token or their length."),
    "cancelled": ("requests_cancelled_total", "counter",
                  "Requests cancelled (a stop string matched, the client went away, the server stopped)."),
    "errors": ("request_errors_total", "counter", "Requests ended by a failed engine step."),
    "preemptions": ("preemptions_total", "counter", "Requests preempted because the KV pool was full."),
    "prompt_tokens": ("prompt_tokens_total", "counter", "Prompt tokens submitted."),
    "computed_prompt_tokens": ("prompt_tokens_computed_total", "counter",
                               "Prompt tokens computed (the others came from the prefix cache)."),
    "generated_tokens": ("generation_tokens_total", "counter", "Tokens generated."),
    "steps": ("engine_steps_total", "counter", "Engine steps run."),
    "waiting": ("requests_waiting", "gauge", "Requests queued for admission."),
    "running": ("requests_running", "gauge", "Requests in the running batch."),
    "kv_blocks_in_use": ("kv_blocks_in_use", "gauge", "KV cache blocks held by running requests."),
    "kv_blocks_total": ("kv_blocks_total", "gauge", "KV cache blocks in the pool."),
    "kv_blocks_cached": ("kv_blocks_cached", "gauge", "Free KV blocks that still hold a reusable prefix."),
    "prefix_hit_blocks": ("prefix_cache_hit_blocks_total", "counter", "Prompt blocks taken from the prefix cache."),
    "kv_evictions": ("kv_evictions_total", "counter", "Cached prefix blocks evicted for reuse."),
}
_METRIC_PREFIX = "onnx_numba_"


class InvalidRequestError(ValueError):
    """A request the server refuses before the engine sees it: malformed JSON, a missing or mistyped field, an
    unknown model.  ``param`` names the field; ``code`` is OpenAI's error code, when it has one."""

    def __init__(self, message: str, param=None, code=None, status: int = 400):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


class _ClientGone(Exception):
    """The client disconnected while its call was waiting for tokens."""


def _error(status: int, message: str, kind: str = "invalid_request_error", param=None, code=None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


# -- request fields ---------------------------------------------------------------------------------------
_MISSING = object()
_KINDS = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
          "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list)}


def _json_kind(v) -> str:
    if v is None:
        return "null"
    return next((k for k in ("boolean", "integer", "number", "string", "array", "object") if _KINDS[k](v)),
                type(v).__name__)


def _field(body: dict, name: str, kind: str, default=_MISSING):
    """``body[name]`` checked to be a JSON ``kind``; null or absent gives ``default`` (required when none)."""
    v = body.get(name)
    if v is None:
        if default is _MISSING:
            raise InvalidRequestError(f"'{name}' is a required property", name, "missing_required_parameter")
        return default
    if not _KINDS[kind](v):
        raise InvalidRequestError(f"'{name}' must be {'an' if kind[0] in 'aeio' else 'a'} {kind}, got {_json_kind(v)}",
                                  name, "invalid_type")
    return v


def _stops(body: dict) -> tuple:
    v = body.get("stop")
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise InvalidRequestError(f"'stop' must be a string or a list of strings, got {_json_kind(v)}", "stop",
                                  "invalid_type")
    if any(s == "" for s in items):
        raise InvalidRequestError("'stop' strings must not be empty", "stop", "invalid_value")
    return tuple(dict.fromkeys(items))


def _token_ids(v) -> list | None:
    """``v`` when it is a non-empty list of integers that could be token ids (the engine checks the vocabulary)."""
    if isinstance(v, list) and v and all(_KINDS["integer"](t) and 0 <= t < 2 ** 31 for t in v):
        return v
    return None


def _check_no_ops(body: dict):
    for name, allowed in _NO_OP.items():
        if name in body and body[name] not in allowed:
            raise InvalidRequestError(f"'{name}' is not supported by this server (got {body[name]!r})", name,
                                      "unsupported_parameter")


class _Call(NamedTuple):
    """One API call's options, after checking."""
    n: int
    params: list          # SamplingParams per choice
    stops: tuple
    stream: bool
    include_usage: bool
    return_token_ids: bool


def _options(body: dict, default_max_tokens: int, max_tokens_names=("max_tokens",)) -> _Call:
    _check_no_ops(body)
    max_tokens = default_max_tokens
    for name in max_tokens_names:  # the last one given wins
        max_tokens = _field(body, name, "integer", max_tokens)
    n = _field(body, "n", "integer", 1)
    if not 1 <= n <= _MAX_N:
        raise InvalidRequestError(f"'n' must be between 1 and {_MAX_N}, got {n}", "n", "invalid_value")
    seed = _field(body, "seed", "integer", None)
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and not (isinstance(stop_ids, list) and all(_KINDS["integer"](t) for t in stop_ids)):
        raise InvalidRequestError("'stop_token_ids' must be a list of integers", "stop_token_ids", "invalid_type")
    stream = _field(body, "stream", "boolean", False)
    stream_options = _field(body, "stream_options", "object", {})
    base = dict(max_tokens=max_tokens, temperature=float(_field(body, "temperature", "number", 1.0)),
                top_p=float(_field(body, "top_p", "number", 1.0)), top_k=_field(body, "top_k", "integer", 0),
                repetition_penalty=float(_field(body, "repetition_penalty", "number", 1.0)),
                stop_token_ids=tuple(stop_ids or ()), ignore_eos=_field(body, "ignore_eos", "boolean", False))
    params = [SamplingParams(seed=None if seed is None else seed + i, **base) for i in range(n)]
    return _Call(n, params, _stops(body), stream, bool(stream_options.get("include_usage", False)),
                 _field(body, "return_token_ids", "boolean", False))


def _message_text(m: dict, i: int) -> str:
    content = m.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise InvalidRequestError(f"messages[{i}].content: only text parts are supported", f"messages[{i}]",
                                          "unsupported_content")
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequestError(f"messages[{i}].content must be a string or a list of text parts, got "
                              f"{_json_kind(content)}", f"messages[{i}]", "invalid_type")


def _messages(body: dict) -> list:
    msgs = _field(body, "messages", "array")
    if not msgs:
        raise InvalidRequestError("'messages' must hold at least one message", "messages", "invalid_value")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidRequestError(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]",
                                      "invalid_type")
        out.append(dict(m, content=_message_text(m, i)))
    return out


# -- incremental decoding ---------------------------------------------------------------------------------
def _first_stop(text: str, stops, start: int = 0) -> int | None:
    """Where ``text`` is cut for the stop string that completes first (ties: the one that starts first), among
    those that begin at ``start`` or later."""
    best = None
    for s in stops:
        p = text.find(s, start)
        if p >= 0 and (best is None or (p + len(s), p) < best):
            best = (p + len(s), p)
    return None if best is None else best[1]


def _held(text: str, stops) -> int:
    """The length of the longest tail of ``text`` that begins some stop string (not sent until it is settled)."""
    n = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), n, -1):
            if text.endswith(s[:k]):
                n = k
                break
    return n


class _Delta(NamedTuple):
    index: int
    text: str              # new text since the choice's last delta
    token_ids: list        # new token ids since the choice's last delta
    finish_reason: str | None


class _Choice:
    """One engine request decoded into text: ``advance()`` takes what the engine produced since its last call."""

    def __init__(self, index: int, request, tokenizer, stops: tuple):
        self.index = index
        self.request = request
        self.tokenizer = tokenizer
        self.stops = stops
        self.seen = 0               # output tokens decoded so far
        self.sent = ""              # text handed out so far
        self.ids_sent = 0
        self.text = ""              # the final text, once finish_reason is set
        self.completion_tokens = 0
        self.finish_reason = None
        self.stopped = False        # a stop string ended it (its engine request may still be running)
        self._prefix = 0            # tokens whose text is settled (no later token changes it) ...
        self._done = ""             # ... and that text

    @property
    def pending(self) -> bool:
        """Output (or the end) is there that ``advance`` has not taken yet."""
        return self.finish_reason is None and (self.request.done or len(self.request.output) > self.seen)

    def _decoded(self, ids) -> str:
        """``decode(ids)``, decoding only the tokens past the settled text (and ``_LOOKBACK`` before them, whose
        text is subtracted): a step's work does not grow with the output.  Text ending in an incomplete
        character is not settled.  A tokenizer whose window text does not extend the text of the tokens before
        is decoded whole."""
        n0 = self._prefix
        w0 = max(0, n0 - _LOOKBACK)
        head = self.tokenizer.decode(ids[w0:n0]) if n0 > w0 else ""
        window = self.tokenizer.decode(ids[w0:])
        if not window.startswith(head):
            self._done, self._prefix = "", 0
            return self.tokenizer.decode(ids)
        text = self._done + window[len(head):]
        if len(text) > len(self._done) and not text.endswith(_REPLACEMENT):
            self._done, self._prefix = text, len(ids)
        return text

    def advance(self, one: bool = False) -> _Delta | None:
        """What the engine produced since the last call (``one``: its next token only)."""
        if self.finish_reason is not None:
            return None
        r = self.request
        done = r.done               # read before the output: once done, the output is complete
        ids = list(r.output)
        if one and len(ids) > self.seen + 1:
            ids, done = ids[:self.seen + 1], False
        if len(ids) == self.seen and not done:
            return None
        before = self._done
        text = self._decoded(ids)
        # Stops wholly inside the settled text were looked for already: only those reaching past it can be new.
        start = max(0, len(before) - max((len(x) for x in self.stops), default=1) + 1) \
            if text.startswith(before) else 0
        if self.stops and _first_stop(text, self.stops, start) is not None:
            for k in range(min(self.seen + 1, len(ids)), len(ids) + 1):  # the fewest tokens whose text holds it
                t = text if k == len(ids) else self.tokenizer.decode(ids[:k])
                cut = _first_stop(t, self.stops)
                if cut is not None:
                    break
            ids, text = ids[:k], t[:cut]
            self.finish_reason, self.stopped = "stop", True
        elif done:
            self.finish_reason = r.finish_reason
        self.seen = len(ids)
        if self.finish_reason is None:
            settled = text.rstrip(_REPLACEMENT)
            settled = settled[:len(settled) - _held(settled, self.stops)]
        else:
            settled = self.text = text
            self.completion_tokens = len(ids)
        delta = ""
        if len(settled) > len(self.sent) and settled.startswith(self.sent):
            delta, self.sent = settled[len(self.sent):], settled
        new_ids, self.ids_sent = ids[self.ids_sent:], len(ids)
        if not delta and not new_ids and self.finish_reason is None:
            return None
        return _Delta(self.index, delta, new_ids, self.finish_reason)


class _Job:
    """The engine requests of one API call (one per choice), woken on the event loop as tokens arrive."""

    def __init__(self, engine: Engine, tokenizer, requests: list, stops: tuple):
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        self.choices = [_Choice(i, r, tokenizer, stops) for i, r in enumerate(requests)]
        for r in requests:
            r.add_listener(self._wake)

    def _wake(self):
        # runs on the engine's thread, inside its step: it must never raise there
        try:
            self.loop.call_soon_threadsafe(self.event.set)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    def _cancel(self, request):
        if not request.done:
            self.loop.run_in_executor(None, self.engine.cancel, request)

    def cancel_all(self):
        """Cancel every request still running (idempotent; never waits)."""
        for c in self.choices:
            self._cancel(c.request)

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)

    async def updates(self, is_disconnected=None, per_token: bool = False):
        """Lists of ``_Delta`` as the engine produces tokens, until every choice has finished (``per_token``:
        each delta covers at most one token, so that a stream has a chunk per token however far the engine is
        ahead).  With ``is_disconnected`` (an async callable) a departed client raises ``_ClientGone``."""
        next_check = self.loop.time() + _DISCONNECT_POLL_S
        while True:
            self.event.clear()  # before reading, so that a token arriving meanwhile sets it again
            deltas = []
            for c in self.choices:
                d = c.advance(per_token)
                if d is not None:
                    deltas.append(d)
                    if c.stopped:
                        self._cancel(c.request)
            if deltas:
                yield deltas
            if self.finished:
                return
            if is_disconnected is not None and self.loop.time() >= next_check:  # by the clock: tokens may
                next_check = self.loop.time() + _DISCONNECT_POLL_S                # keep the event busy
                if await is_disconnected():
                    raise _ClientGone()
            if any(c.pending for c in self.choices):
                continue
            if is_disconnected is None:
                await self.event.wait()
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.event.wait(), _DISCONNECT_POLL_S)

    def usage(self, prompt_tokens: int) -> dict:
        done = sum(c.completion_tokens for c in self.choices)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}


class _EventStream(StreamingResponse):
    """Server-sent events whose engine requests are cancelled however the response ends: Starlette cancels the
    body when the client disconnects (the body may then be waiting on tokens, not sending, so a failing send
    alone would not notice), and a server stopping cancels it too."""

    media_type = "text/event-stream"

    def __init__(self, content, job: _Job):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel_all()


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


# -- the app ----------------------------------------------------------------------------------------------
class _Server:
    def __init__(self, engine: Engine, tokenizer, model_name: str, chat_template: str | None):
        from .chat_template import SPECIAL_TOKEN_KEYS, find_template
        from .tokenizer import token_text
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.created = int(time.time())
        self.template = chat_template or find_template(os.path.dirname(tokenizer.path), tokenizer.config)
        special = {k: token_text(tokenizer.config.get(k)) for k in SPECIAL_TOKEN_KEYS}
        self.special_tokens = {k: v for k, v in special.items() if v is not None}

    # -- shared steps ------------------------------------------------------------------------------
    async def _body(self, request: HTTPRequest) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidRequestError(f"the request body must be a JSON object, got {_json_kind(body)}")
        model = _field(body, "model", "string", self.model_name)
        if model != self.model_name:
            raise InvalidRequestError(f"The model `{model}` does not exist (this server has `{self.model_name}`).",
                                      "model", "model_not_found", 404)
        return body

    def _submit_all(self, call_id: str, prompt: list, params: list) -> list:
        """Submit one engine request per choice (on a worker thread: submit takes the engine's lock)."""
        reqs = []
        try:
            for i, p in enumerate(params):
                reqs.append(self.engine.submit(prompt, p, request_id=f"{call_id}-{i}"))
        except BaseException:
            for r in reqs:
                self.engine.cancel(r)
            raise
        return reqs

    async def _run(self, request: HTTPRequest, prompt: list, call: _Call, chat: bool):
        call_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        reqs = await run_in_threadpool(self._submit_all, call_id, prompt, call.params)
        job = _Job(self.engine, self.tokenizer, reqs, call.stops)
        head = {"id": call_id, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name}
        if call.stream:
            if chat:
                head["object"] = "chat.completion.chunk"
            return _EventStream(self._events(job, head, len(prompt), call, chat), job)
        try:
            async for _ in job.updates(request.is_disconnected):
                pass
        except _ClientGone:
            return Response(status_code=499)  # nobody reads it
        finally:
            job.cancel_all()
        failed = next((c for c in job.choices if c.finish_reason == "error"), None)
        if failed is not None:
            return _error(500, f"generation failed: {failed.request.error}", "server_error")
        choices = []
        for c in job.choices:
            choice = {"index": c.index}
            if chat:
                choice["message"] = {"role": "assistant", "content": c.text}
            else:
                choice["text"] = c.text
            choice.update(logprobs=None, finish_reason=c.finish_reason)
            if call.return_token_ids:
                choice["token_ids"] = list(c.request.output[:c.completion_tokens])
            choices.append(choice)
        out = dict(head, choices=choices, usage=job.usage(len(prompt)))
        if call.return_token_ids:
            out["prompt_token_ids"] = prompt
        return JSONResponse(out)

    async def _events(self, job: _Job, head: dict, prompt_tokens: int, call: _Call, chat: bool):
        def chunk(index, text, ids, finish, role=False):
            if chat:
                delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
                choice = {"index": index, "delta": delta}
            else:
                choice = {"index": index, "text": text}
            choice.update(logprobs=None, finish_reason=finish)
            if call.return_token_ids:
                choice["token_ids"] = ids
            return _sse(dict(head, choices=[choice]))

        if chat:
            for c in job.choices:
                yield chunk(c.index, "", [], None, role=True)
        async for deltas in job.updates(per_token=True):
            for d in deltas:
                if d.finish_reason == "error":
                    err = job.choices[d.index].request.error
                    yield _sse({"error": {"message": f"generation failed: {err}", "type": "server_error",
                                          "param": None, "code": None}})
                    yield "data: [DONE]\n\n"
                    return
                if d.text or d.finish_reason is not None or call.return_token_ids:  # no empty chunks
                    yield chunk(d.index, d.text, d.token_ids, d.finish_reason)
        if call.include_usage:
            yield _sse(dict(head, choices=[], usage=job.usage(prompt_tokens)))
        yield "data: [DONE]\n\n"

    def _encode(self, text: str) -> list:
        return [int(t) for t in self.tokenizer.encode(text)]

    def _chat_prompt(self, messages: list) -> list:
        from .chat_template import render
        if not self.template:
            raise InvalidRequestError(f"the model `{self.model_name}` has no chat template: use /v1/completions",
                                      "messages", "no_chat_template")
        try:
            text = render(self.template, messages, None, True, self.special_tokens)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), "messages", "invalid_value") from None
        ids = self._encode(text)
        bos = self.tokenizer.bos_token_id
        if len(ids) > 1 and bos is not None and ids[0] == ids[1] == bos:
            ids = ids[1:]  # the template wrote the BOS token and the tokenizer added its own
        return ids

    # -- endpoints ---------------------------------------------------------------------------------
    async def completions(self, request: HTTPRequest):
        body = await self._body(request)
        if "prompt" not in body or body["prompt"] is None:
            raise InvalidRequestError("'prompt' is a required property", "prompt", "missing_required_parameter")
        p = body["prompt"]
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]
        if isinstance(p, str):
            prompt = await run_in_threadpool(self._encode, p)
        elif _token_ids(p) is not None:
            prompt = list(p)
        else:
            raise InvalidRequestError(f"'prompt' must be a string, a list of token ids or a list with one string, "
                                      f"got {_json_kind(p)}", "prompt", "invalid_type")
        call = _options(body, 16)
        return await self._run(request, prompt, call, chat=False)

    async def chat_completions(self, request: HTTPRequest):
        body = await self._body(request)
        messages = _messages(body)
        prompt = await run_in_threadpool(self._chat_prompt, messages)
        left = max(1, self.engine.max_model_len - len(prompt))  # a prompt that fills the context: the engine says so
        call = _options(body, left, ("max_tokens", "max_completion_tokens"))
        return await self._run(request, prompt, call, chat=True)

    async def models(self, request: HTTPRequest):
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: HTTPRequest):
        name = request.path_params["model"]
        if name != self.model_name:
            raise InvalidRequestError(f"The model `{name}` does not exist.", "model", "model_not_found", 404)
        return JSONResponse(self._model_card())

    def _model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "onnx-numba",
                "max_model_len": self.engine.max_model_len}

    async def health(self, request: HTTPRequest):
        if not self.engine.alive:
            return _error(503, "the engine is not running", "server_error")
        return JSONResponse({"status": "ok"})

    async def metrics(self, request: HTTPRequest):
        stats = await run_in_threadpool(self.engine.stats)
        label = self.model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lines = []
        for key, (name, kind, help_text) in _METRICS.items():
            if key in stats:
                full = _METRIC_PREFIX + name
                lines += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}",
                          f'{full}{{model_name="{label}"}} {stats[key]}']
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8")


async def _on_invalid(request, exc: InvalidRequestError):
    return _error(exc.status, str(exc), param=exc.param, code=exc.code)


async def _on_refused(request, exc: RequestError):
    return _error(400, str(exc))


async def _on_http(request, exc: HTTPException):
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return _error(exc.status_code, message, code=code)


async def _on_crash(request, exc: Exception):
    log.exception("request %s %s failed", request.method, request.url.path)
    return _error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


def make_app(engine: Engine, tokenizer=None, model_name: str | None = None, *, chat_template: str | None = None):
    """The Starlette app serving ``engine``.  ``tokenizer``: a ``pipeline.tokenizer.Tokenizer`` (default: the
    package's); ``model_name``: the name clients give (default: the package folder's name); ``chat_template``:
    Jinja2 text used instead of the package's.  The app's lifespan starts and stops the engine's thread."""
    from .spec import IncompletePackageError
    from .tokenizer import Tokenizer
    if tokenizer is None:
        if not engine.spec.tokenizer_dir:
            raise IncompletePackageError(f"package {engine.spec.root!r} has no tokenizer.json: the server needs one")
        tokenizer = Tokenizer(engine.spec.tokenizer_dir)
    model_name = model_name or os.path.basename(os.path.normpath(engine.spec.root))
    s = _Server(engine, tokenizer, model_name, chat_template)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        try:
            yield
        finally:
            await run_in_threadpool(engine.shutdown)

    routes = [Route("/v1/completions", s.completions, methods=["POST"]),
              Route("/v1/chat/completions", s.chat_completions, methods=["POST"]),
              Route("/v1/models", s.models, methods=["GET"]),
              Route("/v1/models/{model:path}", s.model, methods=["GET"]),
              Route("/health", s.health, methods=["GET"]),
              Route("/metrics", s.metrics, methods=["GET"])]
    handlers = {InvalidRequestError: _on_invalid, RequestError: _on_refused, HTTPException: _on_http,
                Exception: _on_crash}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.engine = engine
    app.state.model_name = model_name
    return app


def serve(package, host: str = "127.0.0.1", port: int = 8000, *, model_name: str | None = None,
          chat_template: str | None = None, log_level: str = "info", **engine_options):
    """Load ``package`` into an ``Engine`` (``engine_options``: its keyword arguments) and serve it with uvicorn
    until interrupted."""
    import uvicorn
    engine = Engine(package, **engine_options)
    app = make_app(engine, None, model_name, chat_template=chat_template)
    log.info("serving %s as %r on http://%s:%d", package, app.state.model_name, host, port)
    # streams still open at shutdown get this long to end before the engine cancels them
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
