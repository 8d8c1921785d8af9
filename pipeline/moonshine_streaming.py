"""Moonshine streaming speech recognition as onnxruntime-genai 0.18 runs it: packages of type
``streaming_enc_dec_asr``, five models (a causal frontend, an encoder over a sliding window, an adapter, the
cross-attention projection and a decoder with a self-attention cache), streamed with the API of
``pipeline/streaming_asr.py``:

    model = og.Model(path)
    processor = og.StreamingProcessor(model)        # raw audio in; one chunk_samples chunk cut per call
    generator = og.Generator(model, og.GeneratorParams(model))
    for chunk in chunks:
        inputs = processor.process(chunk)           # NamedTensors {audio_chunk, is_silent, is_final} or None
        if inputs is not None:
            generator.set_inputs(inputs)
            while not generator.is_done():
                generator.generate_next_token()     # at most one committed token; get_next_tokens() is [] or [id]
    inputs = processor.flush()                      # the rest (maybe none), is_final set: always NamedTensors

Reproduced from onnxruntime-genai 0.18 (the messages are its wording):

- config: ``model.sample_rate``, ``chunk_samples``, ``bos_token_id``, ``eos_token_id`` (the first of a list);
  ``model.encoder.hidden_size`` (the frontend's feature width E; the conv buffers have E and 2E channels);
  ``model.decoder`` ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``head_size``;
  ``model.moonshine``: the five ``*_filename`` keys (each required), ``sample_buffer_size``, ``conv1_buffer_size``,
  ``conv2_buffer_size``, ``total_lookahead``, ``left_context_frames``, ``max_seq_len``, ``tokens_per_second``,
  ``seconds_per_memory_frame``, ``max_segment_memory_frames``, ``min_segment_memory_frames``, and per model an
  optional ``inputs`` / ``outputs`` mapping of nominal names to graph names (``PORTS`` holds the defaults).  Every
  float input and output named there must be float32; the integer inputs int64.
- the processor buffers audio and cuts one ``chunk_samples`` chunk per ``process`` call; with a voice activity
  detector (``model.vad``, ``pipeline/streaming_asr.SileroVad``) the chunk's verdict goes out as ``is_silent``
  (nothing is dropped here: the generator segments on it).  ``flush`` sends what is left, possibly nothing, with
  ``is_final`` 1.  The options are the Nemotron processor's.
- the generator, per chunk (at its first ``generate_next_token``): the frontend runs on the chunk's samples with
  its five state buffers carried (skipped for an empty chunk); its feature frames accumulate.  All frames but the
  last ``total_lookahead`` (all of them on a final chunk) are stable; the new stable frames are encoded in a window
  that starts ``left_context_frames`` before them and runs to the last frame, sliced out of the encoder's output,
  and passed through the adapter with ``pos_offset`` the frames committed before; its memory frames accumulate and
  the cross-attention caches grow by the new frames' projections.  Then a pass decodes greedily from BOS over all
  the memory: the tokens emitted so far are teacher-forced in one decoder call, then one token per call, up to
  ``min(ceil(memory_frames * seconds_per_memory_frame * tokens_per_second), max_seq_len)`` tokens (float32
  arithmetic) or EOS.  The tokens of the pass that agree with the previous pass (their common prefix) are
  committed; at a segment's close all of them are.  ``generate_next_token`` hands out one committed token per call.
- segments: a final chunk closes one; so does a chunk whose memory reaches ``max_segment_memory_frames``: its
  held-back lookahead is released at once (encoded as at a flush: 0.18 does so, where an earlier published
  source of it only schedules the reset) and every token of its pass committed.  The next chunk starts afresh (frontend
  state, features, memory, caches and committed tokens).  A silent chunk past ``min_segment_memory_frames`` of
  memory releases the lookahead and closes the segment; before any memory it is skipped; otherwise it is encoded
  as speech.
- the generator's other calls: ``get_next_tokens`` is [] or [id] and ``get_sequence`` every committed token (int32);
  ``get_input(name)`` the value last fed to a model's input of that name (the frontend's state inputs: the state
  carried now); ``get_output`` and ``rewind_to`` are onnxruntime-genai's errors; runtime options are accepted.

Differences: where onnxruntime-genai 0.18 reads a model output of an unexpected shape as raw memory, this raises
a ``RequestError`` naming the output and the shape; where it crashes the process (``append_tokens``,
``get_logits``) this raises a ``RequestError`` that says what to do instead.

Invariants: the five models run on the session layer of the other components (``native=`` picks this runtime or
onnxruntime per component, never silently another); every state buffer and cache is replaced only by a model's
own output; memory and caches only grow within a segment, and a segment's committed tokens are never taken back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .spec import MetadataError, RequestError
from .streaming_asr import NemotronConfig, StreamingBase, TransducerGenerator, TransducerModel

__all__ = ["MODEL_TYPE", "COMPONENTS", "PORTS", "MoonshineConfig", "MoonshineModel", "MoonshineStreamingProcessor",
           "MoonshineGenerator"]

MODEL_TYPE = "streaming_enc_dec_asr"
COMPONENTS = ("frontend", "encoder", "adapter", "cross_kv", "decoder_kv")
_F = np.float32

# per model: the nominal names of its inputs and outputs with onnxruntime-genai's default graph names
PORTS = {
    "frontend": ({"audio_chunk": "audio_chunk", "sample_buffer": "sample_buffer", "sample_len": "sample_len",
                  "conv1_buffer": "conv1_buffer", "conv2_buffer": "conv2_buffer", "frame_count": "frame_count"},
                 {"features": "features", "sample_buffer": "sample_buffer_out", "sample_len": "sample_len_out",
                  "conv1_buffer": "conv1_buffer_out", "conv2_buffer": "conv2_buffer_out",
                  "frame_count": "frame_count_out"}),
    "encoder": ({"features": "features"}, {"encoded": "encoded"}),
    "adapter": ({"encoded": "encoded", "pos_offset": "pos_offset"}, {"memory": "memory"}),
    "cross_kv": ({"memory": "memory"}, {"k_cross": "k_cross", "v_cross": "v_cross"}),
    "decoder_kv": ({"token": "token", "k_self": "k_self", "v_self": "v_self", "k_cross": "out_k_cross",
                    "v_cross": "out_v_cross"},
                   {"logits": "logits", "k_self": "out_k_self", "v_self": "out_v_self", "k_cross": "out_k_cross",
                    "v_cross": "out_v_cross"}),
}
# the ports that carry float32 and int64 tensors (the others are int64 too: sample_len, frame_count, pos_offset)
_INT_INPUTS = (("frontend", "sample_len"), ("frontend", "frame_count"), ("adapter", "pos_offset"),
               ("decoder_kv", "token"))
_INT_OUTPUTS = (("frontend", "sample_len"), ("frontend", "frame_count"))
_NUMBERS = ("sample_buffer_size", "conv1_buffer_size", "conv2_buffer_size", "total_lookahead", "left_context_frames",
            "max_seq_len", "tokens_per_second", "seconds_per_memory_frame", "max_segment_memory_frames",
            "min_segment_memory_frames")


@dataclass
class MoonshineConfig:
    """The values onnxruntime-genai's ``MoonshineConfig`` takes from ``genai_config.json``."""
    sample_rate: int
    chunk_samples: int
    bos_token_id: int
    eos_token_id: int
    encoder_dim: int
    decoder_dim: int
    num_decoder_layers: int
    num_decoder_heads: int
    decoder_head_size: int
    sample_buffer_size: int
    conv1_buffer_size: int
    conv2_buffer_size: int
    total_lookahead: int
    left_context_frames: int
    max_seq_len: int
    tokens_per_second: np.float32
    seconds_per_memory_frame: np.float32
    max_segment_memory_frames: int
    min_segment_memory_frames: int
    files: dict    # component -> file name
    ports: dict    # component -> {"in.<nominal>": graph name, "out.<nominal>": graph name}
    vad: dict | None

    @classmethod
    def from_json(cls, doc: dict) -> "MoonshineConfig":
        model = doc.get("model") or {}

        def sec(d, name, where):
            s = d.get(name, {})
            if not isinstance(s, dict):
                raise MetadataError(f"{where}.{name}: expected a mapping, got {type(s).__name__}")
            return s

        def num(d, key, where, kind=int):
            v = d.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise MetadataError(f"{where}.{key}: expected a number, got {v!r}")
            return kind(v)

        ms = sec(model, "moonshine", "model")
        enc, dec = sec(model, "encoder", "model"), sec(model, "decoder", "model")
        files = {}
        for comp in COMPONENTS:
            fn = ms.get(f"{comp}_filename")
            if not fn:
                raise MetadataError(f"moonshine streaming model: genai_config.json must set model.moonshine."
                                    f"{comp}_filename")
            if not isinstance(fn, str):
                raise MetadataError(f"model.moonshine.{comp}_filename: expected a file name, got {fn!r}")
            files[comp] = fn
        ports = {}
        for comp, (ins, outs) in PORTS.items():
            s = sec(ms, comp, "model.moonshine")
            got_in = sec(s, "inputs", f"model.moonshine.{comp}")
            got_out = sec(s, "outputs", f"model.moonshine.{comp}")
            for where, got, known in (("inputs", got_in, ins), ("outputs", got_out, outs)):
                for key in got:
                    if key not in known:
                        raise MetadataError(f"model.moonshine.{comp}.{where}.{key}: not one of the {comp} model's "
                                            f"{where} ({', '.join(known)})")
            names = {"in." + k: str(got_in.get(k) or d) for k, d in ins.items()}
            names.update({"out." + k: str(got_out.get(k) or d) for k, d in outs.items()})
            ports[comp] = names
        for key in ms:
            if key not in _NUMBERS and key not in PORTS and not key.endswith("_filename"):
                raise MetadataError(f"model.moonshine.{key}: not a key of the moonshine section")
        eos = model.get("eos_token_id", 0)
        eos = eos[0] if isinstance(eos, list) and eos else (0 if isinstance(eos, list) else eos)
        vad = NemotronConfig.vad_section(model)
        values = {k: num(ms, k, "model.moonshine", float if k in ("tokens_per_second", "seconds_per_memory_frame")
                         else int) for k in _NUMBERS}
        values["tokens_per_second"] = _F(values["tokens_per_second"])
        values["seconds_per_memory_frame"] = _F(values["seconds_per_memory_frame"])
        return cls(sample_rate=num(model, "sample_rate", "model"), chunk_samples=num(model, "chunk_samples", "model"),
                   bos_token_id=num(model, "bos_token_id", "model"), eos_token_id=int(eos),
                   encoder_dim=num(enc, "hidden_size", "model.encoder"),
                   decoder_dim=num(dec, "hidden_size", "model.decoder"),
                   num_decoder_layers=num(dec, "num_hidden_layers", "model.decoder"),
                   num_decoder_heads=num(dec, "num_attention_heads", "model.decoder"),
                   decoder_head_size=num(dec, "head_size", "model.decoder"),
                   files=files, ports=ports, vad=vad, **values)

    def port(self, comp: str, key: str) -> str:
        return self.ports[comp][key]


class MoonshineModel(TransducerModel):
    """The package's five models (and the voice activity detector if any) on the chosen backends, and its
    config; checks onnxruntime-genai's rules on the models' ports when loaded."""

    def _check_ports(self):
        c = self.cfg
        for comp in COMPONENTS:
            s = self.sessions[comp]
            for key, name in c.ports[comp].items():
                have = s.inputs if key.startswith("in.") else s.output_names
                if name not in have:
                    where = "inputs" if key.startswith("in.") else "outputs"
                    raise MetadataError(f"model.moonshine.{comp}.{where}.{key[key.index('.') + 1:]}: {name!r} is "
                                        f"not among the {comp} graph's {where} {sorted(have)}")
        ints = {(comp, "in." + k) for comp, k in _INT_INPUTS} | {(comp, "out." + k) for comp, k in _INT_OUTPUTS}
        floats = []
        for comp in COMPONENTS:
            for key, name in c.ports[comp].items():
                t = self._type(comp, key, name)
                if (comp, key) not in ints:
                    floats.append(t)
                elif key.startswith("in.") and t != "tensor(int64)":
                    raise RequestError(f"Moonshine streaming: integer input '{name}' must be int64.")
        if floats[0] != "tensor(float)":
            raise RequestError("Moonshine streaming: only float32 I/O is supported (fp16 requires additional "
                               "data-path work)")
        if any(t != floats[0] for t in floats):
            raise RequestError("Moonshine streaming: requires homogeneous floating-point I/O across all sessions")
        self.float_type = np.float32

    def _type(self, comp, key, name):
        s = self.sessions[comp]
        return (s.inputs if key.startswith("in.") else s.outputs)[name].type


class MoonshineStreamingProcessor(StreamingBase):
    """onnxruntime-genai's ``StreamingProcessor`` for a ``streaming_enc_dec_asr`` model: raw float32 audio in, one
    chunk of samples out per call when a chunk is complete, with the detector's verdict; ``flush`` sends the rest."""

    def __init__(self, model):
        t = model.transducer
        self.cfg, self._model = t.cfg, t
        self._buffer = np.zeros(0, _F)
        self._init_vad(t)

    def _emit(self, audio: np.ndarray, silent: bool, final: bool):
        from .api import NamedTensors
        named = NamedTensors()
        named["audio_chunk"] = np.ascontiguousarray(audio, _F).reshape(1, -1)
        named["is_silent"] = np.array([1 if silent else 0], np.int64)
        named["is_final"] = np.array([1 if final else 0], np.int64)
        return named

    def process(self, audio_chunk):
        chunk = self._next_chunk(audio_chunk)
        return None if chunk is None else self._emit(chunk, self._is_silent(chunk), False)

    def flush(self):
        tail, self._buffer = self._buffer, np.zeros(0, _F)
        return self._emit(tail, tail.size > 0 and self._is_silent(tail), True)


class MoonshineGenerator(TransducerGenerator):
    """onnxruntime-genai's ``Generator`` for a ``streaming_enc_dec_asr`` model: committed tokens from audio chunks
    (module docstring)."""

    def __init__(self, model, params=None):
        self._model_type = model.type
        self._t = model.transducer
        self._cfg = self._t.cfg
        self._queued, self._first_inputs = [], True
        self._audio, self._silent, self._final, self._need_run = None, False, False, False
        self._chunk_done = True
        self._needs_reset = False
        self._reset_segment()
        self._pending, self._pending_idx = [], 0
        self._all, self._step = [], []
        self._fed = {}   # component -> its last feeds (get_input)

    # -- inputs
    def set_inputs(self, named=None, **more):
        super().set_inputs(named, **more)
        if self._first_inputs:   # onnxruntime-genai applies the first call's inputs at once (again at the step)
            self._apply(self._queued)
            self._first_inputs = False

    def _apply(self, queued):
        audio = silent = final = None
        for name, value in queued:
            if name == "audio_chunk":
                audio = np.asarray(value)
            elif name == "is_silent":
                silent = bool(np.asarray(value).reshape(-1)[:1].any())
            elif name == "is_final":
                final = bool(np.asarray(value).reshape(-1)[:1].any())
        if audio is None:
            return
        if audio.dtype != np.float32:
            raise RequestError(f"audio_chunk: expected float32 samples, got {audio.dtype}")
        # the last axis counts the samples (a scalar holds none), as onnxruntime-genai reads the chunk
        self._audio = audio.reshape(-1)[:audio.shape[-1]] if audio.ndim else np.zeros(0, _F)
        self._silent, self._final = bool(silent), bool(final)
        self._need_run, self._chunk_done = True, False

    def set_runtime_option(self, key: str, value: str):
        return   # onnxruntime-genai passes them to its run options; nothing here reads them

    def get_input(self, name: str):
        """The value last fed to a model's input ``name`` (the frontend's state inputs: the state it carries now),
        searched in the models' order; an error naming it when no model has fed it."""
        c = self._cfg
        state = {c.port("frontend", "in." + k): v for k, v in self._frontend.items()}
        if name in state:
            return np.array(state[name])
        for comp in COMPONENTS:
            if name in self._fed.get(comp, {}):
                return np.array(self._fed[comp][name])
        raise RequestError(f"Generator input '{name}' was not found.")

    def _run(self, comp: str, feeds: dict) -> dict:
        self._fed[comp] = feeds
        return self._t.run(comp, feeds)

    # -- the loop
    def generate_next_token(self):
        self._apply(self._queued)
        self._queued = []
        self._step = []
        if self._need_run:
            self._run_pipeline()
            self._need_run = False
        if self._pending_idx < len(self._pending):
            tok = self._pending[self._pending_idx]
            self._pending_idx += 1
            self._step = [tok]
            self._all.append(tok)
        self._chunk_done = self._pending_idx >= len(self._pending)

    def _reset_segment(self):
        c, ft = self._cfg, np.float32
        self._frontend = {"sample_buffer": np.zeros((1, c.sample_buffer_size), ft),
                          "sample_len": np.zeros(1, np.int64),
                          "conv1_buffer": np.zeros((1, c.encoder_dim, c.conv1_buffer_size), ft),
                          "conv2_buffer": np.zeros((1, 2 * c.encoder_dim, c.conv2_buffer_size), ft),
                          "frame_count": np.zeros(1, np.int64)}
        self._features = np.zeros((0, c.encoder_dim), ft)
        self._frames_committed = 0
        self._memory = np.zeros((0, c.decoder_dim), ft)
        self._k_cross = self._v_cross = None
        self._in_cross = 0
        self._previous, self._emitted = [], 0

    def _run_pipeline(self):
        c = self._cfg
        self._pending, self._pending_idx = [], 0
        if self._needs_reset:
            self._reset_segment()
            self._needs_reset = False
        audio = self._audio if self._audio is not None else np.zeros(0, _F)

        def encode(samples, final) -> bool:
            self._frontend_and_accumulate(samples, final)
            if len(self._memory) == 0:
                self._chunk_done = True
                return False
            self._refresh_cross_kv()
            return True

        if self._final:            # releases the held-back lookahead and closes the segment
            if not encode(audio, True):
                return
            self._needs_reset = True
        elif self._silent:        # (with memory, encoding never comes back empty)
            if 0 < c.min_segment_memory_frames <= len(self._memory):
                encode(np.zeros(0, _F), True)   # a pause: the lookahead is released and the segment closes
                self._needs_reset = True
            elif len(self._memory) == 0:
                self._chunk_done = True   # silence before the utterance: nothing is encoded
                return
            else:
                encode(audio, False)      # a short pause inside the segment is encoded as speech
        else:
            if not encode(audio, False):
                return
            if c.max_segment_memory_frames > 0 and len(self._memory) >= c.max_segment_memory_frames:
                encode(np.zeros(0, _F), True)   # the segment closes: its held-back lookahead is released
                self._needs_reset = True
        self._decode_and_queue(commit_all=self._needs_reset)

    def _out(self, out: dict, comp: str, key: str, ndim: int) -> np.ndarray:
        name = self._cfg.port(comp, "out." + key)
        a = np.asarray(out[name])
        if a.ndim != ndim:
            raise RequestError(f"Moonshine streaming: the {comp} model's output '{name}' must have rank {ndim}, "
                               f"got shape {list(a.shape)}")
        return a

    def _frontend_and_accumulate(self, audio: np.ndarray, final: bool):
        c = self._cfg
        if audio.size > 0:
            feeds = {c.port("frontend", "in.audio_chunk"): np.ascontiguousarray(audio, _F).reshape(1, -1)}
            feeds.update({c.port("frontend", "in." + k): v for k, v in self._frontend.items()})
            out = self._run("frontend", feeds)
            features = self._out(out, "frontend", "features", 3)
            for k in self._frontend:
                self._frontend[k] = out[c.port("frontend", "out." + k)]
            if features.shape[1] > 0:
                if features.shape[2] != c.encoder_dim:
                    raise RequestError(f"Moonshine streaming: the frontend's features have width {features.shape[2]}"
                                       f", model.encoder.hidden_size is {c.encoder_dim}")
                self._features = np.concatenate([self._features, features[0].astype(_F)])
        produced = len(self._features)
        stable = produced if final else max(0, produced - c.total_lookahead)
        new = stable - self._frames_committed
        if new <= 0:
            return
        start = max(0, self._frames_committed - c.left_context_frames)
        out = self._run("encoder", {c.port("encoder", "in.features"): self._features[start:][None]})
        encoded = self._out(out, "encoder", "encoded", 3)
        first = self._frames_committed - start
        new_encoded = np.ascontiguousarray(encoded[:, first:first + new], _F)
        out = self._run("adapter", {c.port("adapter", "in.encoded"): new_encoded,
                                c.port("adapter", "in.pos_offset"): np.array([self._frames_committed], np.int64)})
        memory = self._out(out, "adapter", "memory", 3)
        if memory.shape[1] > 0:
            self._memory = np.concatenate([self._memory, memory[0].reshape(memory.shape[1], -1).astype(_F)])
        self._frames_committed = stable

    def _refresh_cross_kv(self):
        c = self._cfg
        new = len(self._memory) - self._in_cross
        if new <= 0:
            return
        out = self._run("cross_kv", {c.port("cross_kv", "in.memory"): self._memory[self._in_cross:][None]})
        k, v = (self._out(out, "cross_kv", key, 5) for key in ("k_cross", "v_cross"))
        if self._in_cross == 0:
            self._k_cross, self._v_cross = k, v
        else:
            self._k_cross = np.concatenate([self._k_cross, k], axis=3)
            self._v_cross = np.concatenate([self._v_cross, v], axis=3)
        self._in_cross = len(self._memory)

    def _decode_and_queue(self, commit_all: bool):
        c = self._cfg
        shape = (c.num_decoder_layers, 1, c.num_decoder_heads, 0, c.decoder_head_size)
        self._k_self, self._v_self = np.zeros(shape, _F), np.zeros(shape, _F)
        duration = _F(len(self._memory)) * c.seconds_per_memory_frame
        cap = int(math.ceil(_F(duration * c.tokens_per_second)))
        max_tokens = min(cap, c.max_seq_len)
        current = list(self._previous[:self._emitted])
        token = self._decode(np.array([[c.bos_token_id, *current]], np.int64))
        for _ in range(max_tokens - self._emitted):
            if token == c.eos_token_id:
                break
            current.append(token)
            token = self._decode(np.array([[token]], np.int64))
        if commit_all:
            end = len(current)
        else:
            end = 0
            while end < min(len(self._previous), len(current)) and self._previous[end] == current[end]:
                end += 1
        if self._emitted < end <= len(current):
            self._pending = current[self._emitted:end]
            self._emitted = end
        self._previous = current
        self._chunk_done = not self._pending

    def _decode(self, tokens: np.ndarray) -> int:
        """One decoder call on ``tokens`` (the self caches fed and replaced); the argmax of the last position."""
        c = self._cfg
        feeds = {c.port("decoder_kv", "in.token"): tokens, c.port("decoder_kv", "in.k_self"): self._k_self,
                 c.port("decoder_kv", "in.v_self"): self._v_self, c.port("decoder_kv", "in.k_cross"): self._k_cross,
                 c.port("decoder_kv", "in.v_cross"): self._v_cross}
        out = self._run("decoder_kv", feeds)
        logits = np.asarray(out[c.port("decoder_kv", "out.logits")])
        self._k_self = out[c.port("decoder_kv", "out.k_self")]
        self._v_self = out[c.port("decoder_kv", "out.v_self")]
        if logits.ndim == 0 or logits.size == 0:
            raise RequestError(f"Moonshine streaming: the decoder's logits are empty (shape {list(logits.shape)})")
        last = logits.reshape(-1, logits.shape[-1])[-1]
        return int(np.argmax(last))
