"""The decode loop over any mix of onnxruntime and native components.

``Pipeline(spec, ...)`` creates one session per component (native or
onnxruntime as chosen) and runs the package's stages:

- ``prompt_only`` stages run once before decoding;
- ``every_step`` single-pass stages run over the whole prompt at prefill and
  over the one new token at each step (a component with ``io.token_input``
  gets the prompt ids, then the running token);
- the autoregressive stage's decoder takes its sequence either as token ids
  or as the embeddings a dataflow edge brings it;
- ``final_only`` stages run once after decoding, on the last values.

``tokens(prompt_ids, ...)`` is an iterator that streams generated ids; it
stops at an EOS id or after ``max_new_tokens``.
"""
from __future__ import annotations

import numpy as np

from .backends import BackendChoice, choice_from_environment, native_providers
from .components import NativeComponent, NativeDecoder, OrtComponent, OrtDecoder
from .sampling import Sampler
from .spec import IncompletePackageError, PipelineSpec, SearchOptions

__all__ = ["Pipeline"]


class Pipeline:
    def __init__(self, spec: PipelineSpec, choice: BackendChoice | None = None, max_length: int | None = None,
                 batch: int = 1, session_options=None, ort_providers=None):
        """``ort_providers``: onnxruntime's providers for the components that run on onnxruntime (default
        its CPU provider)."""
        self.spec = spec
        dec = spec.decoder
        self.decoder_name = dec.name
        self.stateless = [n for n in spec.components if n != dec.name]
        self.choice = choice if choice is not None else choice_from_environment(self.stateless, dec.name)
        providers = native_providers(self.choice.device) if (self.choice.native_components or
                                                             self.choice.native_decoder) else None
        self.components = {}
        for name in self.stateless:
            cs = spec.components[name]
            self.components[name] = (NativeComponent(cs, providers, session_options)
                                     if name in self.choice.native_components else OrtComponent(cs, ort_providers))
        ml = int(max_length or spec.search.max_length or spec.context_length or 2048)
        if spec.context_length:
            ml = min(ml, int(spec.context_length))
        self.max_length = ml
        if not self.choice.native_decoder:
            self.decoder = OrtDecoder(dec, spec, ml, batch, ort_providers)
        elif self.choice.device.startswith("cuda"):
            from .device_decoder import CudaDecoder  # caches and state resident on the device
            self.decoder = CudaDecoder(dec, spec, ml, batch, providers, session_options)
        else:
            self.decoder = NativeDecoder(dec, spec, ml, batch, providers, session_options)
        self.batch = batch
        self._by_target = {(e.dst, e.dst_port): e for e in spec.dataflow}
        self.values = {}

    # -- one component -----------------------------------------------------------------------------
    def _feeds_for(self, name, tokens, external):
        comp = self.components[name]
        io = self.spec.components[name].io
        feeds = {}
        for port in comp.input_names:
            if io.token_input == port:
                feeds[port] = np.asarray(tokens, dtype=np.int64).reshape(self.batch, -1)
            elif (name, port) in self._by_target:
                e = self._by_target[(name, port)]
                if (e.src, e.src_port) in self.values:
                    feeds[port] = self.values[(e.src, e.src_port)]
                elif port in (io.optional_inputs or {}):
                    a = io.optional_inputs[port]
                    feeds[port] = np.zeros(a.shape, a.dtype)
                else:
                    raise IncompletePackageError(f"{name}.{port} reads {e.src}.{e.src_port}, which has not run")
            elif port in external:
                feeds[port] = external[port]
            elif port in (io.optional_inputs or {}):
                a = io.optional_inputs[port]
                feeds[port] = np.zeros(a.shape, a.dtype)
            else:
                raise IncompletePackageError(f"component {name!r}: nothing provides input {port!r} (no dataflow "
                                             f"edge, no token input, not given by the caller)")
        return feeds

    def _run_component(self, name, tokens, external):
        out = self.components[name].run(self._feeds_for(name, tokens, external))
        for port, v in out.items():
            self.values[(name, port)] = v

    def _decoder_input(self, tokens):
        io = self.spec.components[self.decoder_name].io
        if io.sequence_source == "inputs_embeds":
            e = self._by_target.get((self.decoder_name, io.inputs_embeds_input))
            if e is None or (e.src, e.src_port) not in self.values:
                raise IncompletePackageError(f"decoder input {io.inputs_embeds_input!r} has no producer")
            return {"embeds": self.values[(e.src, e.src_port)]}
        return {"tokens": tokens}

    def _stages(self, run_on):
        for st in self.spec.stages:
            if st.kind == "single_pass" and st.run_on == run_on and st.model in self.components:
                yield st

    # -- the loop ----------------------------------------------------------------------------------
    def tokens(self, prompt_ids, max_new_tokens=None, sampler: Sampler | None = None, external=None,
               search: SearchOptions | None = None, want_argmax=True, with_logits=False):
        """Yield generated token ids one at a time (with ``with_logits``: (id, last-position logits) pairs)."""
        search = search or self.spec.search
        sampler = sampler or Sampler(search)
        external = dict(external or {})
        prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(self.batch, -1)
        if prompt.shape[1] == 0:
            raise ValueError("the prompt is empty: give at least one token")
        if prompt.shape[1] >= self.max_length:
            raise ValueError(f"the prompt has {prompt.shape[1]} tokens, which leaves no room to generate within "
                             f"max_length {self.max_length} (the package's max_length or context_length)")
        if max_new_tokens is not None and int(max_new_tokens) < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        limit = max_new_tokens
        ar = next(st for st in self.spec.stages if st.kind == "autoregressive")
        if limit is None:
            limit = ar.max_tokens if ar.max_tokens else self.max_length - prompt.shape[1]
        limit = min(limit, self.max_length - prompt.shape[1])
        self.decoder.reset()
        self.decoder.reserve(prompt.shape[1] + limit)
        self.values = {}
        for st in self._stages("prompt_only"):
            self._run_component(st.model, prompt, external)
        history = [list(r) for r in prompt]
        greedy = not search.do_sample and search.repetition_penalty == 1.0 and want_argmax and not with_logits
        cur = prompt
        eos = set(self.spec.eos_token_ids or [])
        if greedy and self.batch == 1 and not any(self._stages("every_step")) and \
                self.spec.components[self.decoder_name].io.sequence_source != "inputs_embeds":
            yield from self._greedy_tokens(prompt, limit, history[0], eos, external)
            return
        for i in range(limit):
            for st in self._stages("every_step"):
                self._run_component(st.model, cur, external)
            fwd = self.decoder.prefill if i == 0 else self.decoder.step
            logits = None
            if greedy:
                nxt = fwd(**self._decoder_input(cur), want="argmax")
            else:
                logits = fwd(**self._decoder_input(cur))
                nxt = sampler.next_tokens(logits, [np.asarray(h, np.int64) for h in history])
            nxt = np.asarray(nxt, dtype=np.int64).reshape(self.batch)
            for b in range(self.batch):
                history[b].append(int(nxt[b]))
            tok = int(nxt[0]) if self.batch == 1 else nxt
            yield (tok, logits) if with_logits else tok
            if all(int(t) in eos for t in nxt):
                break
            cur = nxt.reshape(self.batch, 1)
        for st in self._stages("final_only"):
            self._run_component(st.model, cur, external)

    def _greedy_tokens(self, prompt, limit, history, eos, external):
        """The greedy batch-1 loop over token ids (``tokens``' loop, step for step): after the prefill each step
        is ``decoder.greedy_step``."""
        cur = prompt
        if limit > 0:
            tok = int(self.decoder.prefill(tokens=prompt, want="argmax")[0])
            history.append(tok)
            yield tok
            step = self.decoder.greedy_step
            n = 1
            while tok not in eos:
                cur = tok
                if n == limit:
                    break
                tok = step(tok)
                n += 1
                history.append(tok)
                yield tok
        for st in self._stages("final_only"):
            self._run_component(st.model, np.asarray(cur, np.int64).reshape(1, -1), external)

    def generate(self, prompt_ids, max_new_tokens=None, **kw) -> list:
        return list(self.tokens(prompt_ids, max_new_tokens, **kw))
