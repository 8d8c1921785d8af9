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

``tokens(prompt_ids, ...)`` returns a ``Decoding``: an iterator that streams
generated ids and stops at an EOS id (in every row) or after
``max_new_tokens``, whose ``done`` says whether the last id has come.  The
loop has gpt-fast's three parts: ``prefill`` (prompt stages and the decoder
over the prompt: the first token), ``decode_one_token`` and
``decode_n_tokens``; batch-1 greedy decoding over token ids steps with the
decoder's ``greedy_step``.
"""
from __future__ import annotations

import itertools

import numpy as np

from .backends import BackendChoice, choice_from_environment, native_providers
from .components import NativeComponent, NativeDecoder, OrtComponent, OrtDecoder
from .sampling import Sampler, without_ids
from .spec import IncompletePackageError, PipelineSpec, RequestError, SearchOptions

__all__ = ["Pipeline"]


class Pipeline:
    def __init__(self, spec: PipelineSpec, choice: BackendChoice | None = None, max_length: int | None = None,
                 batch: int = 1, session_options=None, ort_providers=None):
        """``ort_providers``: onnxruntime's providers for the components that run on onnxruntime (default
        its CPU provider)."""
        if spec.marian_ports is not None:
            raise NotImplementedError("a Marian encoder-decoder package runs through og.Model and og.Generator "
                                      "(pipeline/marian.py), not through this decode loop")
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
        self._token_types = {n: np.int32 if c.inputs.get(spec.components[n].io.token_input) is not None
                             and c.inputs[spec.components[n].io.token_input].type == "tensor(int32)" else np.int64
                             for n, c in self.components.items()}
        self._decoder_edges = [e for e in spec.dataflow if e.dst == dec.name and e.dst_port != dec.io.inputs_embeds_input]
        port = dec.io.ids_beside_embeds  # (port, integer type) of a decoder that takes the ids beside embeddings
        self._ids_beside = None if port is None else (
            port, np.int32 if self.decoder.inputs[port].type == "tensor(int32)" else np.int64)
        self._free_required, self._free_optional = self._free_decoder_inputs()
        self.values = {}
        # Mistral 3 (Pixtral): the vision model runs once per image, on its own size (pipeline/multimodal.py)
        self._per_image = None
        vc = spec.vision_config or {}
        if spec.model_type == "mistral3" and "vision" in spec.components:
            self._per_image = ("vision", (vc.get("inputs") or {}).get("pixel_values", "pixel_values"),
                               spec.input_aliases.get("image_sizes", "image_sizes"))
        # speech models whose [B, T, hidden] output onnxruntime-genai hands on as [B * T, hidden] rows
        self._speech_rows = {n for n, c in spec.components.items() if c.type == "speech_encoder"} \
            if spec.source == "genai_config" else set()
        # LFM2-Audio: the speech model runs once per clip, on its own frames (pipeline/lfm2_audio.py)
        self._per_clip = None
        if spec.model_type == "lfm2_audio" and "speech" in spec.components:
            sin = (spec.speech_config or {}).get("inputs") or {}
            sout = (spec.speech_config or {}).get("outputs") or {}
            self._per_clip = (sin.get("audio_embeds", "audio_embeds"), sin.get("audio_lengths", "audio_lengths"),
                              sout.get("audio_features", "audio_features"),
                              spec.input_aliases.get("audio_sizes", "audio_sizes"))

    def _free_decoder_inputs(self):
        """The decoder's inputs that neither it nor a dataflow edge fills: the required ones (a caller's
        ``set_model_input``, onnxruntime-genai's preset ``num_logits_to_keep``, else "Missing Input") and those
        with an initializer (a LoRA adapter's parameters, fed when the caller gives them)."""
        dec = self.spec.components[self.decoder_name]
        io, pos = dec.io, self.spec.positions
        managed = {io.token_input, io.inputs_embeds_input, io.attention_mask_input, io.position_ids_input,
                   pos.input if pos is not None else None, *io.kv_inputs, *(p.input for p in io.state_pairs),
                   *(io.optional_inputs or {}), *(e.dst_port for e in self.spec.dataflow if e.dst == dec.name),
                   self._ids_beside[0] if self._ids_beside else None}
        required = [n for n in self.decoder.inputs if n not in managed and n not in self.decoder.input_defaults]
        return required, [n for n in self.decoder.overridable if n not in managed]

    def _caller_inputs(self, external) -> dict:
        add = {}
        for n in self._free_required:
            if n in external:
                add[n] = external[n]
            elif n == "num_logits_to_keep" or n.startswith("onnx::Neg_"):  # onnxruntime-genai's preset: 0, all
                shape = [1] * len(self.decoder.inputs[n].shape or ())
                add[n] = np.zeros(shape, np.int64)
            else:
                raise RequestError(f"Missing Input: {n}")
        for n in self._free_optional:
            if n in external:
                add[n] = external[n]
        return add

    # -- one component -----------------------------------------------------------------------------
    def _feeds_for(self, name, tokens, external):
        comp = self.components[name]
        io = self.spec.components[name].io
        feeds = {}
        for port in comp.input_names:
            if io.token_input == port:  # in the graph's integer type (int64, or int32 as some exports take)
                feeds[port] = np.asarray(tokens, dtype=self._token_types[name]).reshape(self.batch, -1)
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
        feeds = self._feeds_for(name, tokens, external)
        if self._per_image is not None and name == self._per_image[0]:
            from .multimodal import run_per_image
            _, port, sizes = self._per_image
            out = run_per_image(self.components[name], feeds, port, external.get(sizes))
        elif self._per_clip is not None and name == "speech":
            from .lfm2_audio import run_per_clip
            mel, lengths, features, sizes = self._per_clip
            out = run_per_clip(self.components[name], feeds, mel, lengths, features, external.get(sizes, []))
        else:
            out = self.components[name].run(feeds)
        speech = name in self._speech_rows
        for port, v in out.items():
            if speech and np.ndim(v) == 3:
                v = np.asarray(v).reshape(-1, np.shape(v)[-1])
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

    # -- the loop ---------------------------------------------------------------------------------
    def tokens(self, prompt_ids, max_new_tokens=None, sampler: Sampler | None = None, external=None,
               search: SearchOptions | None = None, want_argmax=True, with_logits=False) -> "Decoding":
        """Yield generated token ids one at a time (with ``with_logits``: (id, last-position logits) pairs); the
        returned ``Decoding``'s ``done`` turns True as the last one is yielded."""
        search = search or self.spec.search
        return Decoding(self, lambda: _Run(self, prompt_ids, max_new_tokens, sampler or Sampler(search),
                                           dict(external or {}), search, want_argmax, with_logits))

    def begin(self, prompt, external, positions: int):
        """Start a sequence: reset the decoder (caches sized for ``positions``), then the prompt-only stages
        over ``prompt`` [batch, n]."""
        self.decoder.reset()
        self.decoder.reserve(positions)
        self.values = {}
        for st in self._stages("prompt_only"):
            if self._without_images(st.model, external):
                continue
            self._run_component(st.model, prompt, external)

    def _without_images(self, name, external) -> bool:
        """In an onnxruntime-genai package, a vision (or speech) component none of whose caller inputs were given
        does not run (a prompt without images or clips): the inputs it would feed take their absent values.  Some
        of them given is an error (``_feeds_for``), and so is any missing in an inference_metadata package."""
        from .text_only import is_media
        if self.spec.source != "genai_config" or not is_media(self.spec.components[name]):
            return False
        io = self.spec.components[name].io
        always = self.spec.input_aliases.get("audio_projection_mode", "audio_projection_mode")  # every prompt has it
        own = [p for p in self.components[name].input_names
               if p != io.token_input and (name, p) not in self._by_target and p != always]
        return bool(own) and not any(p in external for p in own)

    def forward(self, cur, external, first: bool, want="logits", lengths=None, embeds=None):
        """The every-step stages and the decoder over the new ids ``cur`` [batch, n], appended to what the
        decoder has seen (``first``: the sequence's first run, its prefill): what ``want`` asks of the decoder
        (the last position's logits, their argmax, or ``"all"`` positions' logits).  ``lengths``: each row's
        real new ids in a right-padded batch (``DecoderComponent.prefill``).  ``embeds``: the decoder's input
        embeddings given (an LFM2-Audio frame's): the every-step stages do not run."""
        if embeds is None:
            for st in self._stages("every_step"):
                self._run_component(st.model, cur, external)
        fwd = self.decoder.prefill if first else self.decoder.step
        extra = self._image_positions(cur, external) if first else None
        if self._ids_beside is not None:
            port, t = self._ids_beside
            extra = dict(extra or {}, **{port: np.asarray(cur, t).reshape(self.batch, -1)})
        if self._decoder_edges:  # inputs another component computed once (a Whisper encoder's cross caches)
            extra = dict(extra or {}, **{e.dst_port: self.values[(e.src, e.src_port)] for e in self._decoder_edges})
        if self._free_required or self._free_optional:
            extra = dict(extra or {}, **self._caller_inputs(external))
        feed = self._decoder_input(cur) if embeds is None else {"embeds": embeds}
        return fwd(**feed, extra=extra, want=want, lengths=lengths)

    def _image_positions(self, cur, external):
        """A Qwen-VL prompt with images: its 3-D positions (``pipeline/rope_index.py``) for the prefill, and the
        decoder told to continue from their maximum; None otherwise (the decoder counts text positions)."""
        vc = self.spec.vision_config or {}
        pos = self.spec.positions
        grid = external.get((vc.get("inputs") or {}).get("image_grid_thw", "image_grid_thw"))
        if grid is None or pos is None or pos.rank != 3 or "image_token_id" not in vc:
            return None
        if self.batch != 1:
            raise RequestError("a prompt with images takes one sequence (batch_size 1) here")
        from .rope_index import qwen_rope_index
        ids, top = qwen_rope_index(cur, grid, vc["image_token_id"], vc.get("vision_start_token_id", -1),
                                   int(vc.get("spatial_merge_size", 2)), self.spec.pad_token_id)
        self.decoder.carry_positions(int(top[0]))
        return {pos.input: ids}

    def prefill(self, run: "_Run"):
        """The prompt-only stages, then the decoder over the whole prompt: the first new token."""
        self.begin(run.prompt, run.external, run.prompt.shape[1] + run.limit)
        return self._next(run, run.prompt, True)

    def decode_one_token(self, run: "_Run", cur):
        """One step over the last token(s): the next."""
        if run.fast and not run.suppress_eos():
            return self.decoder.greedy_step(cur)
        return self._next(run, np.asarray(cur, np.int64).reshape(self.batch, 1), False)

    def decode_n_tokens(self, run: "_Run", cur, n: int):
        """Up to ``n`` more tokens after ``cur``, stopping after an EOS (every row's, with a batch)."""
        for _ in range(n):
            if run.finished(cur):
                return
            cur = self.decode_one_token(run, cur)
            yield cur

    def _next(self, run, cur, first):
        suppress = run.suppress_eos()
        if run.greedy and not suppress:
            nxt = self.forward(cur, run.external, first, want="argmax")
            logits = None
        else:
            logits = self.forward(cur, run.external, first)
            if suppress:
                logits = without_ids(logits, run.eos)
            nxt = run.sampler.next_tokens(logits, [np.asarray(h, np.int64) for h in run.history])
        nxt = np.asarray(nxt, dtype=np.int64).reshape(self.batch)
        for b in range(self.batch):
            run.history[b].append(int(nxt[b]))
        run.logits = logits
        return int(nxt[0]) if self.batch == 1 else nxt

    def finish(self, run: "_Run", last):
        """The final-only stages, on the last token fed or generated before an EOS (the prompt if none)."""
        for st in self._stages("final_only"):
            self._run_component(st.model, np.asarray(last, np.int64).reshape(self.batch, -1), run.external)

    def generate(self, prompt_ids, max_new_tokens=None, **kw) -> list:
        return list(self.tokens(prompt_ids, max_new_tokens, **kw))


class _Run:
    """One request: its prompt, token limit, sampler and running history (checked here)."""

    def __init__(self, pipe: Pipeline, prompt_ids, max_new_tokens, sampler, external, search, want_argmax,
                 with_logits):
        prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(pipe.batch, -1)
        n = prompt.shape[1]
        if n == 0:
            raise RequestError("the prompt is empty: give at least one token")
        if n >= pipe.max_length:
            raise RequestError(f"the prompt has {n} tokens, which leaves no room to generate within "
                             f"max_length {pipe.max_length} (the package's max_length or context_length)")
        if max_new_tokens is not None and int(max_new_tokens) < 0:
            raise RequestError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        limit = max_new_tokens
        if limit is None:
            ar = next(st for st in pipe.spec.stages if st.kind == "autoregressive")
            limit = ar.max_tokens if ar.max_tokens else pipe.max_length - n
        self.limit = min(int(limit), pipe.max_length - n)
        self.prompt, self.sampler, self.external = prompt, sampler, external
        self.history = [list(r) for r in prompt]
        self.greedy = not search.do_sample and search.repetition_penalty == 1.0 and want_argmax and not with_logits
        # Batch-1 greedy decoding over token ids steps with the decoder's greedy_step (ints in, ints out).
        self.fast = self.greedy and pipe.batch == 1 and not any(pipe._stages("every_step")) and \
            pipe.spec.components[pipe.decoder_name].io.sequence_source != "inputs_embeds"
        self.with_logits = with_logits
        self.eos = set(pipe.spec.eos_token_ids or [])
        self.min_length = int(search.min_length)
        self.logits = None

    def suppress_eos(self) -> bool:
        """The sequence (prompt included) is shorter than ``min_length``: no EOS may come next."""
        return bool(self.eos) and len(self.history[0]) < self.min_length

    def finished(self, tok) -> bool:
        """``tok`` (an id, or one per row) ends the request: an EOS in every row."""
        if tok.__class__ is int:  # batch 1: no array round trip per token
            return tok in self.eos
        return all(int(t) in self.eos for t in np.asarray(tok).reshape(-1))


class Decoding:
    """The token stream of one request (``Pipeline.tokens``): ``prefill``, ``decode_n_tokens``, then the
    final-only stages, run as the stream is consumed.  ``done`` turns True as the last token is yielded (an EOS
    in every row, the token limit or ``max_length``): the one place the stop rules are applied."""

    def __init__(self, pipe: Pipeline, make_run):
        self.done = False
        self._it = self._tokens(pipe, make_run)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._it)
        except StopIteration:
            self.done = True
            raise

    def _tokens(self, pipe, make_run):
        run = make_run()
        last = run.prompt
        if run.limit > 0:
            first = pipe.prefill(run)
            for n, tok in enumerate(itertools.chain([first], pipe.decode_n_tokens(run, first, run.limit - 1)), 1):
                ended = run.finished(tok)
                if not ended:
                    last = tok
                self.done = ended or n == run.limit
                yield (tok, run.logits) if run.with_logits else tok
        self.done = True
        pipe.finish(run, last)
