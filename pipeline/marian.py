"""Marian encoder-decoder packages (onnxruntime-genai's ``marian-ssru`` type), run as onnxruntime-genai runs them.

The package's ``genai_config.json`` has an ``encoder`` and a ``decoder`` section.  A sequence's prompt is the
source text; the decoder writes the translation after it, one token per row per step:

- the prompt rows ``[rows, n]`` (right-padded with ``pad_token_id``) are each cut at their first pad, the first
  EOS id appended, and padded back to ``n + 1``; the encoder runs once on them, its ``attention_mask`` 1 where
  a token is not the pad id (the decoder's ``encoder_attention_mask`` is the same mask);
- the decoder's first step takes ``bos_token_id`` on every row, each later step the token generated;
  ``past_key_values_length`` is 0 on the first step and counts up by one; ``rnn_states_prev`` starts at zeros
  ``[3, rows, encoder.hidden_size]`` and is the previous step's ``rnn_states`` after that (beam search
  reorders it by the parents' rows).

``MarianPipeline`` offers what ``Generator`` asks of a pipeline (``begin``, ``forward``, ``decoder.reorder``);
its encoder and decoder run natively or on onnxruntime as the model's ``BackendChoice`` says.  Invariant: the
decoder takes exactly one new token per row after the prompt, so appending several tokens later is refused.
"""
from __future__ import annotations

import numpy as np

from .package_checks import component_spec, int_value, required, search_options, eos_list
from .spec import ComponentSpec, MetadataError, PipelineSpec, RequestError, Stage

__all__ = ["is_marian", "load_marian_config", "MarianPipeline"]

_RNN_SLOTS = 3  # onnxruntime-genai's SSRU decoders carry three state slots
_ENCODER_PORTS = {"input_ids": "input_ids", "attention_mask": "attention_mask",
                  "encoder_outputs": "encoder_outputs"}
_DECODER_PORTS = {"input_ids": "input_ids", "encoder_hidden_states": "encoder_hidden_states",
                  "encoder_attention_mask": "encoder_attention_mask", "rnn_states_prev": "rnn_states_prev",
                  "past_key_values_length": "past_key_values_length", "logits": "logits",
                  "rnn_states": "rnn_states"}


def is_marian(model: dict) -> bool:
    return isinstance(model.get("type"), str) and model["type"].startswith("marian")


def _ports(sec: dict, defaults: dict) -> dict:
    names = dict(defaults)
    for part in ("inputs", "outputs"):
        given = sec.get(part) or {}
        if not isinstance(given, dict):
            raise MetadataError(f"{part}: expected a mapping")
        names.update({k: v for k, v in given.items() if k in defaults})
    return names


def load_marian_config(root: str, cfg: dict, model: dict, files: dict | None = None) -> PipelineSpec:
    """The spec of a Marian package: components ``encoder`` and ``decoder``, their port names and the encoder's
    hidden size (the recurrent state's last axis); ``files``: model files given in memory, by name."""
    enc_sec = required(model, "encoder", "model")
    dec_sec = required(model, "decoder", "model")
    components = {}
    for name, sec in (("encoder", enc_sec), ("decoder", dec_sec)):
        if not isinstance(sec, dict):
            raise MetadataError(f"model.{name}: expected a mapping")
        components[name] = component_spec(root, sec, f"model.{name}", name, name, files or {})
    hidden = int_value(required(enc_sec, "hidden_size", "model.encoder"), "model.encoder.hidden_size",
                       optional=False, minimum=1)
    bos = int_value(required(model, "bos_token_id", "model"), "model.bos_token_id", optional=False)
    eos = eos_list(required(model, "eos_token_id", "model"), "model.eos_token_id")
    pad = int_value(required(model, "pad_token_id", "model"), "model.pad_token_id", optional=False)
    components["encoder"].io.token_input = _ports(enc_sec, _ENCODER_PORTS)["input_ids"]
    components["decoder"].io.token_input = _ports(dec_sec, _DECODER_PORTS)["input_ids"]
    components["decoder"].io.logits_output = _ports(dec_sec, _DECODER_PORTS)["logits"]
    spec = PipelineSpec(
        root=root, components=components,
        stages=[Stage("decode", "autoregressive", "decoder", "every_step")],
        search=search_options(cfg.get("search"), "search", strict=False), eos_token_ids=eos, bos_token_id=bos,
        pad_token_id=pad, context_length=int_value(model.get("context_length"), "model.context_length", minimum=1),
        tokenizer_dir=None, model_type=model["type"], hidden_size=hidden, vocab_size=model.get("vocab_size"),
        marian_ports=(_ports(enc_sec, _ENCODER_PORTS), _ports(dec_sec, _DECODER_PORTS)))
    return spec


def _session(spec: ComponentSpec, native: bool, providers):
    from .components import NativeComponent, OrtComponent
    return NativeComponent(spec, providers) if native else OrtComponent(spec)


class _MarianDecoder:
    """The decoder's per-step state: the encoder's outputs and mask, the step count and the recurrent state."""

    def __init__(self, spec: ComponentSpec, native: bool, providers, ports: dict, rows: int, hidden: int):
        self.io = spec.io
        self.ports = ports
        self.component = _session(spec, native, providers)
        self.output_names = self.component.output_names
        self.rows, self.hidden = rows, hidden
        self.reset()

    def reset(self):
        self.encoder_states = self.mask = self.rnn = None
        self.steps = 0
        self.outputs = {}

    def reorder(self, parents):
        self.rnn = np.ascontiguousarray(self.rnn[:, np.asarray(parents, np.int64)])

    def output_value(self, name: str):
        value = self.outputs.get(name)
        return None if value is None else np.array(value)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        p, ins = self.ports, self.component.inputs
        feeds = {p["input_ids"]: tokens.astype(_dtype(ins[p["input_ids"]])),
                 p["encoder_hidden_states"]: self.encoder_states,
                 p["encoder_attention_mask"]: self.mask.astype(_dtype(ins[p["encoder_attention_mask"]])),
                 p["rnn_states_prev"]: self.rnn,
                 p["past_key_values_length"]: np.array([self.steps], _dtype(ins[p["past_key_values_length"]]))}
        out = self.component.run(feeds)
        self.outputs = out
        self.rnn = np.ascontiguousarray(out[p["rnn_states"]])
        self.steps += 1
        return np.asarray(out[p["logits"]], np.float32)


def _dtype(node_arg) -> np.dtype:
    from .components import np_type
    return np.dtype(np_type(node_arg.type))


class MarianPipeline:
    """What ``Generator`` runs for a Marian package: ``begin`` encodes the prompt rows, ``forward`` runs one
    decoder step and returns its logits ``[rows, 1, vocab]``.  Not rewindable: the prompt is the encoder's."""

    rewindable = False

    def __init__(self, spec: PipelineSpec, choice, max_length: int | None = None, batch: int = 1):
        from .backends import native_providers
        self.spec, self.batch = spec, int(batch)
        self.max_length = int(max_length or spec.search.max_length)
        enc_ports, dec_ports = spec.marian_ports
        providers = native_providers(choice.device)
        self.encoder = _session(spec.components["encoder"], "encoder" in choice.native_components, providers)
        self.encoder_ports = enc_ports
        self.decoder = _MarianDecoder(spec.components["decoder"], choice.native_decoder, providers, dec_ports,
                                      self.batch, int(spec.hidden_size))

    def begin(self, ids, external=None, max_length=None):
        self.decoder.reset()

    def forward(self, ids, external=None, first=False, want="last", lengths=None) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        dec = self.decoder
        if first:
            self._encode(ids)
            tokens = np.full(self.batch, self.spec.bos_token_id, np.int64)
        else:
            if ids.shape[1] != 1:
                raise RequestError(f"a Marian decoder takes one token per row after the prompt, got "
                                   f"{ids.shape[1]}")
            tokens = ids[:, 0]
        return dec.step(tokens)[:, None, :]

    def _encode(self, prompt: np.ndarray):
        pad, eos = int(self.spec.pad_token_id), int(self.spec.eos_token_ids[0])
        rows, n = prompt.shape
        ext = np.full((rows, n + 1), pad, np.int64)
        for r in range(rows):
            cut = np.flatnonzero(prompt[r] == pad)
            length = int(cut[0]) if cut.size else n
            ext[r, :length] = prompt[r, :length]
            ext[r, length] = eos
        mask = (ext != pad)
        p, ins = self.encoder_ports, self.encoder.inputs
        out = self.encoder.run({p["input_ids"]: ext.astype(_dtype(ins[p["input_ids"]])),
                                p["attention_mask"]: mask.astype(_dtype(ins[p["attention_mask"]]))})
        dec = self.decoder
        dec.encoder_states = np.ascontiguousarray(out[p["encoder_outputs"]])
        dec.mask = mask
        dec.rnn = np.zeros((_RNN_SLOTS, rows, dec.hidden), _dtype(dec.component.inputs[dec.ports["rnn_states_prev"]]))
