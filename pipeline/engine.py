"""The serving engine: many requests share one decoder, joining and leaving the running batch between steps.

    engine = Engine("path/to/package", max_batch=8)
    req = engine.submit(prompt_ids, SamplingParams(max_tokens=64, temperature=0.7, seed=1))
    engine.run()                        # or engine.start() to step on a thread of its own
    print(req.output, req.finish_reason)

Each step (``step``): new requests are admitted while the batch has room and the pool has the blocks for
their prompt (first come, first served); one prefill chunk of at most ``prefill_chunk`` tokens runs for the
oldest request still in its prompt, alone; then one decode step runs for every request past its prompt,
together, one new token each.  Requests are sampled each with its own ``Sampler`` (their own seed, so a seeded
request gives the same tokens whatever else runs).

The KV cache is paged (``pipeline/paged.py``, ``pipeline/paged_kv.py``): a request's blocks are allocated as its
positions need them and returned when it finishes or is cancelled.  With the prefix cache on, a prompt's
leading full blocks that an earlier request computed (a shared system prompt, an earlier turn) are reused and
only the rest is computed.  When a decode step needs a block and none is free, the most recently admitted
request is preempted: its blocks are returned and it waits to be computed again from its tokens so far
(it resumes with the tokens it already streamed, none repeated).

Hybrid decoders (recurrent or convolution state pairs) keep each request's state beside its blocks; their
prefix cache is off (a block's keys would not restore the state), and the engine says so in its log.

Conversations (``submit(..., keep=True)``): a kept request that ends is parked with its blocks and state, and
``extend(request, tokens, params)`` continues it from where it stopped (only the new tokens are computed);
``truncate`` cuts its sequence back, ``release`` gives its blocks back.  A kept request's sequence leaves out
the EOS that ended it (the EOS is never in the cache: it is in ``output`` only).  When the pool is short, parked
requests give their blocks back first, oldest first; a parked request without blocks is computed again from its
tokens when it is extended.

Greedy output of a request does not depend on its batch: every kernel computes a row from that row alone.

Invariants: blocks in use are exactly the blocks of running and parked requests (``pool.in_use()`` is 0 once every
request has ended and none is parked); a request's token stream never repeats or skips a token; errors in a step
fail the requests that were in it (``finish_reason == "error"``, the error kept in ``error``), never the engine.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from .paged import PagedDecoder
from .paged_kv import BlockPool, PoolExhausted, chain_keys
from .sampling import Sampler, repeated_ngram_ends, without_ids
from .spec import RequestError, SearchOptions

__all__ = ["Engine", "Request", "SamplingParams", "WAITING", "RUNNING", "FINISHED"]

log = logging.getLogger(__name__)
WAITING, RUNNING, FINISHED = "waiting", "running", "finished"
HISTORY = 1024  # ended requests ``Engine.requests`` keeps, most recent


@dataclass
class SamplingParams:
    """A request's generation options (OpenAI's names): ``temperature`` 0 is greedy; ``top_k`` 0 is no limit;
    ``stop_token_ids`` end the request besides the package's EOS ids (unless ``ignore_eos``); ``min_tokens``: no
    EOS before that many output tokens; ``no_repeat_ngram_size``: no n-gram of the sequence (prompt included)
    twice; ``guidance``: only what its grammar allows."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    repetition_penalty: float = 1.0
    stop_token_ids: tuple = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    no_repeat_ngram_size: int = 0
    guidance: object = None  # a one-row ``pipeline.guidance.Guidance``: the tokens its grammar allows

    def check(self):
        if int(self.max_tokens) < 1:
            raise RequestError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not (float(self.temperature) >= 0):
            raise RequestError(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < float(self.top_p) <= 1):
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if int(self.top_k) < 0:
            raise RequestError(f"top_k must be >= 0, got {self.top_k}")
        if not (float(self.repetition_penalty) > 0):
            raise RequestError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if int(self.min_tokens) < 0 or int(self.no_repeat_ngram_size) < 0:
            raise RequestError(f"min_tokens and no_repeat_ngram_size must be >= 0, got {self.min_tokens} and "
                               f"{self.no_repeat_ngram_size}")

    def search_options(self) -> SearchOptions:
        sample = float(self.temperature) > 0
        return SearchOptions(do_sample=sample, temperature=float(self.temperature) if sample else 1.0,
                             top_p=float(self.top_p), top_k=int(self.top_k), seed=self.seed,
                             repetition_penalty=float(self.repetition_penalty))


class Request:
    """One request: its tokens (prompt, then output), its blocks and its stream.  ``output`` grows as tokens
    are sampled; ``stream()`` yields them as they come; ``wait()`` blocks until the request ends."""

    def __init__(self, rid, prompt, params: SamplingParams, eos: tuple, keep: bool = False):
        self.id = rid
        self.keep = keep            # parked with its blocks when it ends, for ``Engine.extend``
        self.stop_check = None      # optional ``fn(token) -> reason | None``, asked after each token
        self.prompt = [int(t) for t in prompt]
        self.params = params
        self.tokens = list(self.prompt)
        self.output = []
        self.status = WAITING
        self.finish_reason = None   # "stop", "length", "cancelled", "error"
        self.error = None
        self.blocks = []            # block table
        self.keys = []              # chain keys of the full blocks computed so far
        self.computed = 0           # positions in the cache
        self.prefilled = False
        self.state = None           # a hybrid decoder's recurrent state (batch 1)
        self.cancelled = False
        self.preemptions = 0
        self.reused = 0             # prompt positions taken from the prefix cache at the last admission
        self.sampler = Sampler(params.search_options())
        self._eos = tuple(eos)
        self._stop = set(int(t) for t in params.stop_token_ids) | (set() if params.ignore_eos else set(eos))
        self.arrival = time.perf_counter()
        self.first_token_at = None
        self.finished_at = None
        self._cond = threading.Condition()
        self._listeners = []

    # -- for the engine ----------------------------------------------------------------------------
    def _emit(self, token: int):
        with self._cond:
            self.tokens.append(token)
            self.output.append(token)
            if self.first_token_at is None:
                self.first_token_at = time.perf_counter()
            self._cond.notify_all()
        self._notify()

    def _end(self, reason: str, error=None):
        with self._cond:
            self.status = FINISHED
            self.finish_reason = reason
            self.error = error
            self.finished_at = time.perf_counter()
            self._cond.notify_all()
        self._notify()

    def _notify(self):
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:  # a listener's failure is its own, never the step's
                log.exception("listener of %s failed", self.id)

    def _done_after(self, token: int) -> str | None:
        if token in self._stop:
            return "stop"
        if self.stop_check is not None:
            reason = self.stop_check(token)
            if reason is not None:
                return reason
        if len(self.output) >= int(self.params.max_tokens):
            return "length"
        return None

    def _row(self, logits):
        """``logits`` with what ``min_tokens`` and ``no_repeat_ngram_size`` forbid at this step set to -inf."""
        p = self.params
        if int(p.min_tokens) > len(self.output) and self._eos:
            logits = without_ids(logits, self._eos)
        if int(p.no_repeat_ngram_size) > 0:
            logits = without_ids(logits, repeated_ngram_ends(self.tokens, int(p.no_repeat_ngram_size)))
        if p.guidance is not None:
            logits = p.guidance.mask(np.asarray(logits)[None])[0]
        return logits

    # -- for the caller ----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.status == FINISHED

    def add_listener(self, fn):
        """``fn()`` is called (on the engine's thread) after each new token and when the request ends."""
        self._listeners.append(fn)

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.status == FINISHED, timeout)

    def stream(self, timeout: float | None = None):
        """The output tokens as they are sampled, until the request ends."""
        k = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: len(self.output) > k or self.status == FINISHED, timeout)
                new = self.output[k:]
                ended = self.status == FINISHED
            yield from new
            k += len(new)
            if ended and k == len(self.output):
                return

    def __repr__(self):
        return f"Request({self.id!r}, {self.status}, prompt={len(self.prompt)}, output={len(self.output)})"


class Engine:
    """Continuous batching over a paged KV cache for one GenAI package's decoder (run natively).

    ``block_size`` positions per block; ``num_blocks`` (default: ``max_batch`` full contexts of at most
    ``max_model_len`` positions); ``max_batch`` requests decode together; ``prefill_chunk`` prompt tokens at
    most per step; ``max_model_len`` (default the package's context length, capped at 4096) bounds prompt plus
    ``max_tokens``."""

    def __init__(self, package, *, block_size: int = 16, num_blocks: int | None = None, max_batch: int = 8,
                 prefix_cache: bool = True, prefill_chunk: int = 512, max_model_len: int | None = None,
                 providers=None, session_options=None):
        from .metadata import load_package
        self.spec = package if hasattr(package, "decoder") else load_package(package)
        spec = self.spec
        if max_batch < 1 or prefill_chunk < 1 or block_size < 1:
            raise ValueError("max_batch, prefill_chunk and block_size must be positive")
        ctx = int(spec.context_length or spec.search.max_length or 4096)
        self.max_model_len = int(max_model_len or min(ctx, 4096))
        self.block_size = int(block_size)
        self.max_batch = int(max_batch)
        self.prefill_chunk = int(prefill_chunk)
        self.max_blocks = -(-self.max_model_len // self.block_size)
        if num_blocks is None:
            num_blocks = self.max_batch * self.max_blocks
        self.decoder = PagedDecoder(spec, num_blocks, self.block_size, providers, session_options)
        hybrid = bool(self.decoder.state_inputs)
        if hybrid and prefix_cache:
            log.info("prefix cache off: decoder %r carries recurrent state (%s), which cached blocks cannot "
                     "restore", spec.decoder.name, ", ".join(self.decoder.state_inputs))
            prefix_cache = False
        self.hybrid = hybrid
        self.pool = BlockPool(int(num_blocks), self.block_size, prefix_cache)
        self.eos = tuple(int(t) for t in (spec.eos_token_ids or ()))
        self.vocab = spec.vocab_size
        self.waiting = deque()
        self.running = []
        self.parked = OrderedDict()  # id -> kept Request that ended with its blocks, oldest first
        self.requests = OrderedDict()  # id -> Request: those not ended, then the last ``HISTORY`` ended ones
        self._ids = itertools.count()
        self._lock = threading.RLock()           # held for a whole step
        self._inbox_lock = threading.Lock()      # held for moments: what submit and cancel hand over
        self._inbox = deque()                    # ("submit" | "cancel", request), taken at the next step
        self._wake = threading.Condition(self._inbox_lock)
        self._thread = None
        self._stop = False
        self.counters = dict(requests=0, finished=0, cancelled=0, errors=0, preemptions=0, prompt_tokens=0,
                             computed_prompt_tokens=0, generated_tokens=0, steps=0)

    # -- requests ----------------------------------------------------------------------------------
    def _checked(self, prompt, params, before: int = 0):
        """``prompt`` as ints, checked with ``params`` against the vocabulary, the context and the pool, after
        ``before`` tokens a request already holds."""
        params.check()
        prompt = [int(t) for t in np.asarray(prompt, np.int64).reshape(-1)]
        if not prompt:
            raise RequestError("the prompt is empty")
        if self.vocab and (min(prompt) < 0 or max(prompt) >= self.vocab):
            bad = [t for t in prompt if t < 0 or t >= self.vocab][:3]
            raise RequestError(f"prompt token ids {bad} are outside the vocabulary [0, {self.vocab})")
        total = before + len(prompt) + int(params.max_tokens)
        if total > self.max_model_len:
            held = f"{before} tokens so far, " if before else ""
            raise RequestError(f"{held}the prompt ({len(prompt)} tokens) plus max_tokens ({params.max_tokens}) "
                               f"exceeds the model's context of {self.max_model_len} tokens")
        need = -(-total // self.block_size)
        if need > self.pool.num_blocks:
            raise RequestError(f"the request needs {need} KV blocks; the pool has {self.pool.num_blocks}")
        return prompt

    def submit(self, prompt, params: SamplingParams | None = None, request_id=None, keep: bool = False) -> Request:
        """Queue a request; ``RequestError`` when it cannot be served (nothing is queued then).  ``keep``: park
        it with its blocks when it ends, for ``extend``."""
        params = params or SamplingParams()
        prompt = self._checked(prompt, params)
        with self._inbox_lock:
            rid = request_id if request_id is not None else f"req-{next(self._ids)}"
            if rid in self.requests and not self.requests[rid].done:
                raise RequestError(f"request id {rid!r} is already running")
            r = Request(rid, prompt, params, self.eos, keep)
            self.requests.pop(rid, None)
            self.requests[rid] = r
            self._inbox.append(("submit", r))
            self._wake.notify_all()
        return r

    def extend(self, r: Request, tokens, params: SamplingParams | None = None) -> Request:
        """Continue a kept request that has ended: ``tokens`` follow its sequence, and it generates under
        ``params`` (its random stream goes on unless ``params.seed`` is set).  Its parked blocks are reused;
        only the positions not yet in them are computed."""
        params = params or SamplingParams()
        with self._lock:
            if not r.keep or not r.done:
                raise RequestError(f"request {r.id!r} can be extended only when it was submitted with keep=True "
                                   f"and has ended; it is {r.status}")
            new = self._checked(tokens, params, len(r.tokens))
            sampler = Sampler(params.search_options())
            if params.seed is None:
                sampler.rng = r.sampler.rng
            with self._inbox_lock:
                self.parked.pop(r.id, None)
                r.params, r.sampler = params, sampler
                r._stop = set(int(t) for t in params.stop_token_ids) | (set() if params.ignore_eos else set(r._eos))
                r.prompt = new
                r.tokens.extend(new)
                r.output = []
                r.status, r.finish_reason, r.error = WAITING, None, None
                r.prefilled, r.cancelled = False, False
                r.arrival, r.first_token_at, r.finished_at = time.perf_counter(), None, None
                self.requests.pop(r.id, None)
                self.requests[r.id] = r
                self._inbox.append(("submit", r))
                self._wake.notify_all()
        return r

    def truncate(self, r: Request, length: int):
        """Cut an ended kept request's sequence to its first ``length`` tokens; its blocks go back to the pool
        (the next ``extend`` computes the kept tokens again, reusing cached prefix blocks)."""
        with self._lock:
            if not r.keep or not r.done:
                raise RequestError(f"request {r.id!r} can be truncated only when kept and ended; it is {r.status}")
            if not 0 <= int(length) <= len(r.tokens):
                raise RequestError(f"cannot truncate request {r.id!r} of {len(r.tokens)} tokens to {length}")
            self.parked.pop(r.id, None)
            self._free(r)
            del r.tokens[int(length):]

    def release(self, r: Request):
        """Give back a kept request's blocks for good: cancelled if it is still running, its parked blocks
        returned if it has ended."""
        r.keep = False
        if not r.done:
            self.cancel(r)
            return
        with self._lock:
            if self.parked.pop(r.id, None) is not None:
                self._free(r)

    def cancel(self, request) -> bool:
        """End a request (a ``Request`` or its id): at once when no step is running, else as soon as the running
        step ends; its blocks go back to the pool then.  False when it had already ended or is unknown."""
        r = request if isinstance(request, Request) else self.requests.get(request)
        if r is None or r.done or r.cancelled:
            return False
        r.cancelled = True
        with self._inbox_lock:
            self._inbox.append(("cancel", r))
            self._wake.notify_all()
        if self._lock.acquire(blocking=False):  # no step running: take it now
            try:
                self._take_inbox()
            finally:
                self._lock.release()
        return True

    def _take_inbox(self):
        """Queue what was submitted and end what was cancelled since the last step (the step lock held)."""
        with self._inbox_lock:
            items = list(self._inbox)
            self._inbox.clear()
        for kind, r in items:
            if kind == "submit":
                if not r.cancelled:
                    self.waiting.append(r)
                    self.counters["requests"] += 1
                    self.counters["prompt_tokens"] += len(r.prompt)
                continue
            if r.done:
                continue
            if r in self.waiting:
                self.waiting.remove(r)
            if r in self.running:
                self.running.remove(r)
            self._free(r)  # a kept request is computed again from its tokens if it is extended
            self.counters["cancelled"] += 1
            self._ended(r, "cancelled")

    def _ended(self, r: Request, reason: str, error=None):
        r._end(reason, error)
        with self._inbox_lock:  # keep the not-ended and the most recent HISTORY ended requests
            ended = [k for k, q in self.requests.items() if q.done]
            for k in ended[:max(0, len(ended) - HISTORY)]:
                del self.requests[k]

    def _free(self, r: Request):
        self.pool.release(r.blocks)
        r.blocks = []
        r.keys = []
        r.computed = 0
        r.prefilled = False
        r.state = None

    # -- scheduling --------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._inbox)

    @property
    def alive(self) -> bool:
        """The stepping thread (``start``) is running."""
        return self._thread is not None and self._thread.is_alive()

    def _reclaim(self, need: int) -> bool:
        """Take parked requests' blocks back, oldest first, until ``need`` blocks are free; False if they do
        not suffice."""
        while self.pool.free_blocks() < need and self.parked:
            _, victim = self.parked.popitem(last=False)
            self._free(victim)
            log.info("parked %s gave its blocks back: the KV pool is short", victim.id)
        return self.pool.free_blocks() >= need

    def _admit(self, r: Request) -> bool:
        """Give ``r`` the blocks of its tokens so far (reusing cached prefix blocks, or the blocks a kept request
        held); False when the pool is short (nothing more is held then)."""
        bs = self.block_size
        if r.blocks:  # a kept request extended: its parked blocks and state are still its own
            need = -(-len(r.tokens) // bs) - len(r.blocks)
            if not self._reclaim(need):
                return False
            r.blocks += [self.pool.allocate() for _ in range(need)]
            r.reused = 0
            return True
        keys = chain_keys(r.tokens[:len(r.tokens) - 1], bs) if self.pool.prefix_cache else []
        hit = self.pool.match(keys)
        need = -(-len(r.tokens) // bs) - len(hit)
        if not self._reclaim(need):
            self.pool.release(hit)
            self.pool.hits -= len(hit)  # not reused after all
            return False
        r.blocks = hit + [self.pool.allocate() for _ in range(need)]
        r.keys = keys[:len(hit)]
        r.computed = len(hit) * bs
        r.reused = r.computed
        r.state = self.decoder.state_zeros() if self.hybrid else None
        return True

    def _register(self, r: Request):
        """Key the request's newly full blocks, so later prompts that share them can reuse them."""
        if not self.pool.prefix_cache:
            return
        full = r.computed // self.block_size
        if full > len(r.keys):
            start = r.keys[-1] if r.keys else b""
            new = chain_keys(r.tokens, self.block_size, start, len(r.keys), full - len(r.keys))
            for i, k in enumerate(new, start=len(r.keys)):
                self.pool.register(r.blocks[i], k)
            r.keys.extend(new)

    def _preempt_one(self, keep: Request) -> bool:
        """Return the blocks of the most recently admitted running request other than ``keep``; it waits at
        the head of the queue to be computed again."""
        for victim in reversed(self.running):
            if victim is not keep:
                self.running.remove(victim)
                self._free(victim)
                victim.status = WAITING
                victim.preemptions += 1
                self.counters["preemptions"] += 1
                self.waiting.appendleft(victim)
                log.info("preempted %s: the KV pool is full", victim.id)
                return True
        return False

    def _slot(self, r: Request) -> bool:
        """A block for position ``r.computed``, preempting others if needed; False when ``r`` itself had to go."""
        if r.computed < len(r.blocks) * self.block_size:
            return True
        while True:
            try:
                r.blocks.append(self.pool.allocate())
                return True
            except PoolExhausted:
                if not self._reclaim(1) and not self._preempt_one(r):
                    return False

    # -- stepping ----------------------------------------------------------------------------------
    def step(self) -> bool:
        """One engine step (admission, one prefill chunk, one decode step); False when there was nothing to do."""
        with self._lock:
            self._take_inbox()
            self._admit_waiting()
            pre = next((r for r in self.running if not r.prefilled), None)
            if pre is not None:
                self._guarded([pre], self._prefill_chunk)
            return self._decode_step([r for r in self.running if r.prefilled], pre is not None)

    def round(self) -> bool:
        """Every running request one token further (onnxruntime-genai's engine step): admission, then each
        prompt not yet computed, whole (in chunks of ``prefill_chunk``), ending with its first token, then one
        decode step for the requests that were past their prompts before; False when there was nothing to do."""
        with self._lock:
            self._take_inbox()
            self._admit_waiting()
            dec = [r for r in self.running if r.prefilled]
            work = False
            for r in [r for r in self.running if not r.prefilled]:
                while r in self.running and not r.prefilled:
                    self._guarded([r], self._prefill_chunk)
                    work = True
            return self._decode_step([r for r in dec if r in self.running], work)

    def _decode_step(self, rows, work: bool) -> bool:
        """One decode step for ``rows`` (if any); counts the step when it or the prefill before it did work."""
        if rows:
            work = True
            self._guarded(rows, self._decode)
        if work:
            self.counters["steps"] += 1
        return work

    def _admit_waiting(self):
        while self.waiting and len(self.running) < self.max_batch:
            r = self.waiting[0]
            if not self._admit(r):
                break
            self.waiting.popleft()
            r.status = RUNNING
            self.running.append(r)
            self.counters["computed_prompt_tokens"] += len(r.tokens) - r.computed

    def _guarded(self, rows, fn):
        try:
            fn(rows)
        except Exception as exc:  # the rows' requests fail; the engine and the other requests go on
            log.exception("engine step failed for %s", [r.id for r in rows])
            for r in rows:
                if r in self.running:
                    self.running.remove(r)
                    self._free(r)
                    self.counters["errors"] += 1
                    self._ended(r, "error", exc)

    def _table(self, rows):
        width = max(len(r.blocks) for r in rows)
        t = np.full((len(rows), width), self.decoder.table_pad, np.int32)
        for i, r in enumerate(rows):
            t[i, :len(r.blocks)] = r.blocks
        return t

    def _prefill_chunk(self, rows):
        r = rows[0]
        n = min(len(r.tokens) - r.computed, self.prefill_chunk)
        toks = np.asarray(r.tokens[r.computed:r.computed + n], np.int64)[None, :]
        logits, states = self.decoder.run(toks, [r.computed + n], self._table([r]), r.state)
        if states:
            r.state = states
        r.computed += n
        self._register(r)
        if r.computed == len(r.tokens):
            r.prefilled = True
            self._sample([r], logits)

    def _decode(self, rows):
        for r in rows:
            if r in self.running and not self._slot(r):  # nothing else to preempt: ``r`` waits its turn
                self.running.remove(r)
                self._free(r)
                r.status = WAITING
                self.waiting.appendleft(r)
        rows = [r for r in rows if r in self.running]  # a later slot may have preempted an earlier row
        if not rows:
            return
        toks = np.asarray([[r.tokens[-1]] for r in rows], np.int64)
        totals = [r.computed + 1 for r in rows]
        states = None
        if self.hybrid:
            states = {k: np.concatenate([r.state[k] for r in rows], axis=0) for k in self.decoder.state_inputs}
        logits, new_states = self.decoder.run(toks, totals, self._table(rows), states)
        for i, r in enumerate(rows):
            r.computed += 1
            if new_states:
                r.state = {k: np.ascontiguousarray(v[i:i + 1]) for k, v in new_states.items()}
            self._register(r)
        self._sample(rows, logits)

    def _sample(self, rows, logits):
        for i, r in enumerate(rows):
            tok = int(r.sampler.next_token(r._row(logits[i]), r.tokens if r.params.repetition_penalty != 1 else None))
            if r.params.guidance is not None:
                r.params.guidance.commit([tok])
            r._emit(tok)
            self.counters["generated_tokens"] += 1
            reason = r._done_after(tok)
            if reason is None and len(r.tokens) >= self.max_model_len:
                reason = "length"
            if reason is not None:
                self.running.remove(r)
                if r.keep:  # parked: its blocks hold every token but the last, which is not computed yet
                    if tok in r._stop:
                        r.tokens.pop()  # the EOS ends the turn; it is not part of the conversation
                    self.parked[r.id] = r
                else:
                    self._free(r)
                self.counters["finished"] += 1
                self._ended(r, reason)

    # -- driving -----------------------------------------------------------------------------------
    def run(self):
        """Step until every submitted request has ended (on the calling thread)."""
        while self.step():
            pass

    def generate(self, prompts, params: SamplingParams | None = None) -> list:
        """Submit ``prompts`` (lists of ids), run them to the end, return each one's output ids."""
        reqs = [self.submit(p, params) for p in prompts]
        self.run()
        return [r.output for r in reqs]

    def start(self):
        """Step on a thread of this engine's own until ``shutdown``."""
        if self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="onnx-numba-engine", daemon=True)
        self._thread.start()

    def _loop(self):
        while True:
            with self._inbox_lock:
                while not self._stop and not (self._inbox or self.waiting or self.running):
                    self._wake.wait()
                if self._stop:
                    return
            self.step()

    def shutdown(self):
        """Stop the stepping thread; requests still queued or running are cancelled."""
        with self._inbox_lock:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            self._take_inbox()
            for r in list(self.waiting) + list(self.running):
                self.cancel(r)
            self._take_inbox()
            while self.parked:
                self._free(self.parked.popitem()[1])

    def stats(self) -> dict:
        """Counters and gauges; read without waiting for a running step (each value is current, together they
        may straddle a step)."""
        return dict(self.counters, waiting=len(self.waiting) + len(self._inbox), running=len(self.running),
                    kv_blocks_total=self.pool.num_blocks, kv_blocks_in_use=self.pool.in_use(),
                    kv_blocks_cached=self.pool.cached(), prefix_hit_blocks=self.pool.hits,
                    kv_evictions=self.pool.evictions)
