"""Speech transducers as onnxruntime-genai 0.18 runs them: streaming recognition of ``nemotron_speech`` packages
(NVIDIA Nemotron cache-aware streaming RNNT: ``StreamingProcessor``, raw audio to log-mel chunks, and a
``Generator`` that runs the encoder per chunk with its caches and the greedy RNNT decode over its frames), and
offline recognition of ``parakeet_tdt`` packages (Parakeet TDT: ``create_multimodal_processor()``, one clip to
normalised log-mels, and a ``Generator`` that encodes them in chunks with context and runs the greedy
token-and-duration decode).

    model = og.Model(path)                          # three sessions: encoder, decoder (prediction network), joiner
    processor = og.StreamingProcessor(model)        # or model.create_streaming_processor()
    generator = og.Generator(model, og.GeneratorParams(model))
    for chunk in chunks:                            # any sizes; one chunk_samples chunk is cut per call
        inputs = processor.process(chunk)           # NamedTensors {"audio_features"} or None
        if inputs is not None:
            generator.set_inputs(inputs)
            while not generator.is_done():
                generator.generate_next_token()     # at most one symbol; get_next_tokens() is [] or [id]
    inputs = processor.flush()                      # the rest, padded with zeros to a chunk; None when empty

Reproduced from onnxruntime-genai 0.18 (every message below is its wording):

- config (``genai_config.json``): at ``model`` level ``sample_rate``, ``chunk_samples``, ``num_mels``, ``fft_size``,
  ``hop_length``, ``win_length``, ``preemph``, ``log_eps``, ``pre_encode_cache_size``, ``blank_id``,
  ``max_symbols_per_step`` (absent: 0, which lets one symbol per frame), ``vad``; ``model.encoder``
  ``hidden_size`` / ``num_hidden_layers`` and ``inputs`` ``audio_features`` (default ``audio_features``),
  ``input_lengths`` (``length``; fed only when the graph has it), ``cache_last_channel``, ``cache_last_time``,
  ``cache_last_channel_len``, ``lang_id`` (fed only when the graph has it) and ``outputs`` ``encoder_outputs``,
  ``output_lengths`` (``encoded_lengths``), ``cache_last_*_next``; ``model.decoder`` ``hidden_size`` /
  ``num_hidden_layers`` (the LSTM's) with ``inputs`` ``targets``, ``lstm_hidden_state``, ``lstm_cell_state`` and
  ``outputs`` ``outputs``, ``lstm_hidden_state``, ``lstm_cell_state`` (no defaults); ``model.joiner`` ``inputs``
  ``encoder_outputs``, ``decoder_outputs``, ``outputs`` ``logits`` (default ``outputs``); ``search.blank_penalty``;
  ``model.left_context`` / ``conv_context`` give the caches' shapes.
- the mel front end, per chunk of ``chunk_samples``: pre-emphasis ``y[n] = x[n] - preemph * x[n-1]`` carried over
  chunks; the last ``fft_size / 2`` pre-emphasized samples of the previous chunk (zeros at first) put before it,
  ``(fft_size - win_length) / 2`` zeros after; frames of ``win_length`` samples every ``hop_length`` from that
  offset, times a symmetric Hann window (float32 ``0.5 * (1 - cos(2 pi n / (N - 1)))``), zero-padded to
  ``fft_size``; the power spectrum; a Slaney mel filterbank (librosa's, in float32); ``log(mel + log_eps)``; no
  normalisation.  The chunk's frames go out time-major after the ``pre_encode_cache_size`` frames that ended the
  chunks before (zeros at first): ``audio_features`` ``[1, cache + frames, num_mels]`` in the encoder input's type.
- ``process(chunk)`` (cast to float32, one dimension) appends to a buffer and cuts at most one chunk per call;
  ``flush()`` pads (or cuts) what is left to one chunk, None when nothing is left.  Options ``use_vad``,
  ``vad_threshold``, ``silence_duration_ms``, ``prefix_padding_ms`` with their defaults, conversions and errors.
- voice activity detection, when the config has ``model.vad`` (``filename``, ``threshold`` 0.5,
  ``silence_duration_ms`` 500, ``prefix_padding_ms`` 300; or ``use_vad`` true later): a Silero VAD model
  (``SileroVad``) runs over each whole chunk ``process`` cuts, in windows of 512 samples at 16 kHz (256 at
  8 kHz; other rates are an error), each after the previous window's last 64 (32) samples, its state carried; a
  window at or above the threshold means speech.  Silent chunks in a row are counted; from the
  ``max(prefix, silence)``-th (each duration in whole chunks, at least one) a chunk is dropped: ``process``
  returns None and the chunk is never encoded.  ``flush`` is not checked.  ``use_vad`` false drops the detector;
  true makes a fresh one (zero state and context).  The detector is a component like the others (``native=``
  names it ``vad``).
- the decode: ``set_inputs`` queues the features (onnxruntime-genai also applies the first call's at once, which
  no call can tell apart: they are applied again, last, at the next step); ``is_done`` is False while anything is
  queued, else whether the chunk's frames are used up.  ``generate_next_token`` applies the
  queue (the last features win), runs the encoder over them when new (the caches fed and replaced by its
  outputs; the length input is the frame count) and then walks the frames ``min(steps, encoded_len)``: the
  prediction network on the last emitted token (the blank at first) and the LSTM state, the joiner on the frame and
  its output, the argmax of the logits with ``blank_penalty`` taken off the blank's (the first maximum).  A blank
  keeps the LSTM state and moves to the next frame; a symbol takes the network's new state, becomes the last
  token, and ends the call; after ``max_symbols_per_step`` symbols on one frame the frame is left.  A call that
  finds no frame left marks the chunk done and emits nothing.  ``get_sequence(i)`` is every symbol so far (``i``
  is not read), ``token_count`` their number.

``parakeet_tdt``, reproduced the same way: config ``model`` keys ``vocab_size`` (the token scores; the durations'
follow), ``blank_id`` (which must be among ``eos_token_id``: its message), ``tdt_durations``, ``chunk_samples``,
``left_context_samples``, ``right_context_samples``, ``subsampling_factor``, ``max_symbols_per_step``, the mel keys
and ``norm_eps``; the decoder also takes ``targets_length`` (1) and gives ``outputs_length``.  The processor decodes
one clip (``Audios``, ``pipeline/audio.py``) to mono at ``sample_rate``, runs the streaming mel above over it at
once, and normalises each band over the frames (mean, standard deviation with ``frames - 1`` degrees of freedom,
plus ``norm_eps``): ``audio_features`` ``[1, num_mels, frames]``.  The generator takes the first features it is
given (loaded at the first ``set_inputs``, later ones ignored), runs the prediction network once on the blank, then
cuts the clip (``frames * hop_length`` samples) into ``chunk_samples`` chunks, encodes each with its left and right
context (in mel frames, ``samples // hop_length``) and decodes the encoder frames of the chunk proper (the last
chunk: up to the encoder's length): the token is the argmax of the first ``vocab_size`` scores, the duration the
argmax of the next ``len(tdt_durations)`` (from the second when the token is the blank); a symbol runs the
prediction network and ends the call; the frame advances by the duration, or by one after
``max_symbols_per_step`` symbols in a row on it.  When the last chunk is used up the call emits nothing and
``is_done`` turns True.

Differences, and why: where onnxruntime-genai 0.18 crashes the process (``generate_next_token`` before any audio,
``append_tokens``, ``get_input``, ``get_logits``) this raises a ``RuntimeError`` that says what to do instead.  The
FFT is numpy's (double precision) where onnxruntime-genai's is a float32
one, so a log-mel feature differs from its where a band is quiet next to its frame's peak (by about 2e-5 on the
tests' clips; the tests bound this at 1e-4, and the tokens are equal).  The Parakeet processor decodes a clip
whole (no 30 s cap).  Runtime options other than ``lang_id`` are accepted and change nothing.

A Moonshine streaming package (``streaming_enc_dec_asr``) is loaded here too (``load_transducer``), and its
processor and generator are ``pipeline/moonshine_streaming.py``'s: ``StreamingProcessor(model)`` and
``Generator(model, params)`` give them for such a model.

Invariants: the models run on the session layer of the other components (``native=`` picks this runtime
or onnxruntime per component, never silently another); the caches and LSTM state are replaced only by the models'
own outputs; one ``generate_next_token`` emits at most one symbol.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from .spec import ComponentSpec, MetadataError, RequestError

__all__ = ["TRANSDUCER_TYPES", "NemotronConfig", "TdtConfig", "StreamingMel", "StreamingProcessor", "TransducerModel",
           "TransducerGenerator", "TdtGenerator", "ParakeetProcessor", "load_transducer", "read_model_type",
           "transducer_generator", "per_feature_normalize"]

TRANSDUCER_TYPES = {"nemotron_speech", "parakeet_tdt", "streaming_enc_dec_asr"}  # the last: Moonshine's
COMPONENTS = ("encoder", "decoder", "joiner")
AUDIO_FEATURES = "audio_features"   # the processor's output name (onnxruntime-genai's nominal name)
_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
_INTS = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


def read_model_type(root: str, overlay: dict | None = None) -> str | None:
    """``model.type`` of the package's ``genai_config.json`` (after ``overlay``), None without one."""
    import json
    path = os.path.join(os.fspath(root), "genai_config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError):
        return None   # the package loader reports it with its own words
    if overlay:
        from .genai_config import merged
        cfg = merged(cfg, overlay)
    model = cfg.get("model") if isinstance(cfg, dict) else None
    return model.get("type") if isinstance(model, dict) else None


# -- config --------------------------------------------------------------------------------------------------------

@dataclass
class NemotronConfig:
    """The values onnxruntime-genai's ``NemotronConfig`` takes from ``genai_config.json``."""
    num_encoder_layers: int
    hidden_dim: int
    left_context: int
    conv_context: int
    decoder_lstm_dim: int
    decoder_lstm_layers: int
    vocab_size: int
    blank_id: int
    blank_penalty: float
    sample_rate: int
    chunk_samples: int
    subsampling_factor: int
    max_symbols_per_step: int
    num_mels: int
    fft_size: int
    hop_length: int
    win_length: int
    preemph: np.float32
    log_eps: np.float32
    pre_encode_cache_size: int
    enc: dict      # nominal name -> graph name, the encoder's inputs and outputs
    dec: dict      # the prediction network's
    join: dict     # the joiner's
    vad: dict | None

    @classmethod
    def from_json(cls, cfg: dict) -> "NemotronConfig":
        model = cfg.get("model") or {}
        search = cfg.get("search") or {}

        def sec(name):
            s = model.get(name)
            if not isinstance(s, dict):
                raise MetadataError(f"model.{name}: expected a mapping (the {name} model of a nemotron_speech "
                                    f"package), got {type(s).__name__}")
            return s

        def num(d, key, where, kind=int, default=0):
            v = d.get(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise MetadataError(f"{where}.{key}: expected a number, got {v!r}")
            return kind(v)

        enc, dec, join = sec("encoder"), sec("decoder"), sec("joiner")
        ports = {}
        for what, s, ins, outs in (
                ("encoder", enc, {"audio_features": "audio_features", "input_lengths": "length",
                                  "cache_last_channel": "cache_last_channel", "cache_last_time": "cache_last_time",
                                  "cache_last_channel_len": "cache_last_channel_len", "lang_id": "lang_id"},
                 {"encoder_outputs": "encoder_outputs", "output_lengths": "encoded_lengths",
                  "cache_last_channel_next": "cache_last_channel_next",
                  "cache_last_time_next": "cache_last_time_next",
                  "cache_last_channel_len_next": "cache_last_channel_len_next"}),
                ("decoder", dec, {"targets": "", "lstm_hidden_state": "", "lstm_cell_state": ""},
                 {"outputs": "", "lstm_hidden_state": "", "lstm_cell_state": ""}),
                ("joiner", join, {"encoder_outputs": "encoder_outputs", "decoder_outputs": "decoder_outputs"},
                 {"logits": "outputs"})):
            got_in, got_out = s.get("inputs") or {}, s.get("outputs") or {}
            names = {"in." + k: str(got_in.get(k, d)) for k, d in ins.items()}
            names.update({"out." + k: str(got_out.get(k, d)) for k, d in outs.items()})
            ports[what] = names
        vad = cls.vad_section(model)
        return cls(num_encoder_layers=num(enc, "num_hidden_layers", "model.encoder"),
                   hidden_dim=num(enc, "hidden_size", "model.encoder"),
                   left_context=num(model, "left_context", "model"), conv_context=num(model, "conv_context", "model"),
                   decoder_lstm_dim=num(dec, "hidden_size", "model.decoder"),
                   decoder_lstm_layers=num(dec, "num_hidden_layers", "model.decoder"),
                   vocab_size=num(model, "vocab_size", "model"), blank_id=num(model, "blank_id", "model"),
                   blank_penalty=float(np.float32(num(search, "blank_penalty", "search", float, 0.0))),
                   sample_rate=num(model, "sample_rate", "model"), chunk_samples=num(model, "chunk_samples", "model"),
                   subsampling_factor=num(model, "subsampling_factor", "model"),
                   max_symbols_per_step=num(model, "max_symbols_per_step", "model"),
                   num_mels=num(model, "num_mels", "model"), fft_size=num(model, "fft_size", "model"),
                   hop_length=num(model, "hop_length", "model"), win_length=num(model, "win_length", "model"),
                   preemph=np.float32(num(model, "preemph", "model", float, 0.0)),
                   log_eps=np.float32(num(model, "log_eps", "model", float, 0.0)),
                   pre_encode_cache_size=num(model, "pre_encode_cache_size", "model"),
                   enc=ports["encoder"], dec=ports["decoder"], join=ports["joiner"], vad=vad)

    @staticmethod
    def vad_section(model: dict) -> dict | None:
        """``model.vad`` checked (its keys, their types), or None when the package has none."""
        vad = model.get("vad") if isinstance(model.get("vad"), dict) else None
        for key, v in (vad or {}).items():
            if key not in ("filename", "threshold", "silence_duration_ms", "prefix_padding_ms", "session_options",
                           "run_options"):
                raise MetadataError(f"model.vad.{key}: not a key of the voice activity detector's section (filename, "
                                    f"threshold, silence_duration_ms, prefix_padding_ms, session_options, "
                                    f"run_options)")
            if key != "filename" and not key.endswith("options") and (
                    isinstance(v, bool) or not isinstance(v, (int, float))):
                raise MetadataError(f"model.vad.{key}: expected a number, got {v!r}")
            elif key == "filename" and not isinstance(v, str):
                raise MetadataError(f"model.vad.filename: expected a file name, got {v!r}")
        return vad


# -- the mel front end -------------------------------------------------------------------------------------------

_F = np.float32


def _hz_to_mel(hz):
    # Slaney: linear below 1 kHz, logarithmic above; float32 throughout
    hz = _F(hz)
    if hz < _F(1000.0):
        return _F(hz / _F(200.0 / 3.0))
    return _F(_F(15.0) + _F(np.log(_F(hz / _F(1000.0)))) / _F(0.06875177742094912))


def _mel_to_hz(mel):
    mel = _F(mel)
    if mel < _F(15.0):
        return _F(mel * _F(200.0 / 3.0))
    return _F(_F(1000.0) * _F(np.exp(_F(_F(mel - _F(15.0)) * _F(0.06875177742094912)))))


def mel_filterbank(num_mels: int, fft_size: int, sample_rate: int) -> np.ndarray:
    """Triangular filters on the Slaney mel scale with Slaney area normalisation (librosa's), ``[mels, bins]``
    float32, computed in float32 in onnxruntime-genai's order."""
    bins = fft_size // 2 + 1
    low, high = _hz_to_mel(0.0), _hz_to_mel(_F(sample_rate) / _F(2.0))
    centres = np.array([_mel_to_hz(low + _F(_F(_F(high - low) * _F(i)) / _F(num_mels + 1)))
                        for i in range(num_mels + 2)], _F)
    fdiff = (centres[1:] - centres[:-1]).astype(_F)
    freqs = (np.arange(bins, dtype=_F) * _F(sample_rate) / _F(fft_size)).astype(_F)
    fb = np.zeros((num_mels, bins), _F)
    eps = _F(1e-10)
    for m in range(num_mels):
        lower = (freqs - centres[m]) / (fdiff[m] + eps)
        upper = (centres[m + 2] - freqs) / (fdiff[m + 1] + eps)
        row = np.maximum(_F(0.0), np.minimum(lower, upper)).astype(_F)
        fb[m] = row * (_F(2.0) / _F(centres[m + 2] - centres[m] + eps))
    return fb


def hann_symmetric(n: int) -> np.ndarray:
    """``0.5 * (1 - cos(2 pi k / (n - 1)))`` in float32 (torch's ``hann_window(n, periodic=False)``)."""
    k = np.arange(n, dtype=_F)
    return (_F(0.5) * (_F(1.0) - np.cos(_F(2.0) * _F(np.pi) * k / _F(n - 1)))).astype(_F)


class StreamingMel:
    """NeMo's log-mel, chunk by chunk: pre-emphasis and the last ``fft_size / 2`` samples carried between calls."""

    def __init__(self, cfg):
        self.cfg = cfg   # a NemotronConfig or TdtConfig: the mel fields are the same
        self.filters = mel_filterbank(cfg.num_mels, cfg.fft_size, cfg.sample_rate)
        self.window = hann_symmetric(cfg.win_length)
        self.reset()

    def reset(self):
        self.overlap = np.zeros(self.cfg.fft_size // 2, _F)
        self.last_sample = _F(0.0)

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """The chunk's log-mel frames, ``[frames, num_mels]`` float32."""
        c = self.cfg
        audio = np.asarray(audio, _F)
        pre = np.empty_like(audio)
        if audio.size:
            pre[0] = audio[0] - c.preemph * self.last_sample
            pre[1:] = audio[1:] - c.preemph * audio[:-1]
            self.last_sample = audio[-1]
        half, offset = c.fft_size // 2, (c.fft_size - c.win_length) // 2
        padded = np.concatenate([self.overlap, pre, np.zeros(offset, _F)])
        self.overlap = np.concatenate([self.overlap, pre])[-half:]
        if padded.size < offset + c.win_length:
            padded = np.concatenate([padded, np.zeros(offset + c.win_length - padded.size, _F)])
        n = (padded.size - offset - c.win_length) // c.hop_length + 1
        starts = offset + c.hop_length * np.arange(n)
        frames = padded[starts[:, None] + np.arange(c.win_length)] * self.window        # float32 products
        spec = np.fft.rfft(frames.astype(np.float64), n=c.fft_size, axis=1)
        re, im = spec.real.astype(_F), spec.imag.astype(_F)
        power = re * re + im * im
        mel = (power.astype(np.float64) @ self.filters.T.astype(np.float64)).astype(_F)
        return np.log(mel + c.log_eps).astype(_F)


# -- the streaming processor ------------------------------------------------------------------------------------

_STOF = re.compile(r"\s*[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.I)
_STOI = re.compile(r"\s*[+-]?\d+")


def _stof(value: str) -> float:
    m = _STOF.match(value)
    if not m:
        raise RequestError("stof")   # std::stof's exception text, as onnxruntime-genai passes it on
    return float(m.group(0))


def _stoi(value: str) -> int:
    m = _STOI.match(value)
    if not m:
        raise RequestError("stoi")
    return int(m.group(0))


class SileroVad:
    """onnxruntime-genai's Silero voice activity detector over the package's ``vad`` model (inputs ``input``
    ``[1, context + window]``, ``state`` ``[2, 1, 128]``, ``sr`` ``[1]`` int64; outputs ``output`` ``[1, 1]``, the
    speech probability, and ``stateN``): windows of 256 samples per 8 kHz (512 at 16 kHz), each after the last
    ``context`` samples (32 per 8 kHz) of the window before (zeros at first), the state carried between windows."""

    def __init__(self, model: "TransducerModel"):
        vad = model.cfg.vad or {}
        if not vad.get("filename"):
            raise RequestError("VAD filename must be specified in genai_config.json")
        sr = model.cfg.sample_rate
        if sr not in (8000, 16000):
            raise RequestError(f"SileroVad only supports a sample rate of 8,000 Hz or 16,000 Hz. Got: {sr}")
        self._model = model
        self.window, self.context = 256 * (sr // 8000), 32 * (sr // 8000)
        self.threshold = _F(vad.get("threshold", 0.5))
        self._state = np.zeros((2, 1, 128), _F)
        self._ctx = np.zeros(self.context, _F)
        self._sr = np.array([sr], np.int64)

    def set_threshold(self, value: float):
        self.threshold = _F(min(_F(1.0), max(_F(0.0), _F(value))))

    def window_probability(self, samples: np.ndarray) -> np.float32:
        """The speech probability of one window of ``self.window`` samples; the state and context move on."""
        out = self._model.run("vad", {"input": np.concatenate([self._ctx, samples])[None],
                                      "state": self._state, "sr": self._sr})
        self._state = np.ascontiguousarray(out["stateN"], _F).reshape(2, 1, 128)
        self._ctx = np.array(samples[-self.context:], _F)
        return _F(np.asarray(out["output"]).reshape(-1)[0])

    def contains_speech(self, chunk: np.ndarray) -> bool:
        """Whether a window of ``chunk`` (the last padded with zeros) reaches the threshold; stops at the first."""
        W, n = self.window, chunk.size
        for off in range(0, n - W + 1, W):
            if self.window_probability(chunk[off:off + W]) >= self.threshold:
                return True
        done = n // W * W
        if done < n:
            pad = np.zeros(W, _F)
            pad[:n - done] = chunk[done:]
            return bool(self.window_probability(pad) >= self.threshold)
        return False


class StreamingBase:
    """What the streaming processors share: the voice activity detector and onnxruntime-genai's options over it
    (``use_vad``, ``vad_threshold``, ``silence_duration_ms``, ``prefix_padding_ms``; the detector is on when the
    package has one), and the audio buffer cut into chunks.  ``_init_vad(model)`` sets the detector up;
    ``_is_silent(chunk)`` is its verdict (False without a detector); ``_next_chunk(audio)`` buffers and cuts."""

    def _init_vad(self, model):
        cfg = model.cfg
        # VAD settings in chunks, as onnxruntime-genai keeps them
        self._chunk_ms = _F(_F(_F(cfg.chunk_samples) / _F(cfg.sample_rate)) * _F(1000.0))
        self._silence_chunks, self._prefix_chunks = 5, 1
        self._vad, self._silent = None, 0
        if cfg.vad is not None and cfg.vad.get("filename"):
            self._vad = SileroVad(model)
            self._silence_chunks = self._chunks(cfg.vad.get("silence_duration_ms", 500))
            self._prefix_chunks = self._chunks(cfg.vad.get("prefix_padding_ms", 300))

    def _chunks(self, ms) -> int:
        return max(1, int(_F(_F(ms) / self._chunk_ms)))

    def _is_silent(self, chunk: np.ndarray) -> bool:
        return self._vad is not None and not self._vad.contains_speech(chunk)

    def _next_chunk(self, audio_chunk):
        """``audio_chunk`` (float32, one dimension) appended to the buffer, and one ``chunk_samples`` chunk cut
        from its front when it holds one (the rest waits), else None."""
        a = np.asarray(audio_chunk, dtype=np.float32)
        if a.ndim != 1:
            raise RequestError(f"audio_chunk must be a 1-D array, got {a.ndim}-D")
        self._buffer = np.concatenate([self._buffer, a])
        n = self.cfg.chunk_samples
        if self._buffer.size < n:
            return None
        chunk, self._buffer = self._buffer[:n], self._buffer[n:]
        return chunk

    def set_option(self, key: str, value: str):
        key, value = str(key), str(value)
        if key == "use_vad":
            if value in ("true", "1"):
                if self._vad is None:
                    if "vad" not in self._model.sessions:
                        raise RequestError("VAD filename must be specified in genai_config.json")
                    self._vad, self._silent = SileroVad(self._model), 0
            elif value in ("false", "0"):
                self._vad, self._silent = None, 0
            else:
                raise RequestError(f"Invalid value for use_vad: '{value}'. Expected 'true' or 'false'.")
        elif key == "vad_threshold":
            threshold = _stof(value)   # kept by nothing while VAD is off (as in onnxruntime-genai)
            if self._vad is not None:
                self._vad.set_threshold(threshold)
        elif key in ("silence_duration_ms", "prefix_padding_ms"):
            chunks = self._chunks(_stoi(value))
            if key == "silence_duration_ms":
                self._silence_chunks = chunks
            else:
                self._prefix_chunks = chunks
        else:
            raise RequestError(f"Unknown StreamingProcessor option: '{key}'")

    def get_option(self, key: str) -> str:
        key = str(key)
        if key == "use_vad":
            return "true" if self._vad is not None else "false"
        if key == "vad_threshold":
            if self._vad is not None:
                return f"{float(self._vad.threshold):.6f}"
            return f"{float(_F((self.cfg.vad or {}).get('threshold', 0.5))):.6f}"
        if key in ("silence_duration_ms", "prefix_padding_ms"):
            chunks = self._silence_chunks if key == "silence_duration_ms" else self._prefix_chunks
            return str(int(_F(_F(chunks) * self._chunk_ms)))
        raise RequestError(f"Unknown StreamingProcessor option: '{key}'")


class StreamingProcessor(StreamingBase):
    """onnxruntime-genai's ``StreamingProcessor`` for a ``nemotron_speech`` model: raw float32 PCM audio in,
    one chunk's ``audio_features`` out per call when a chunk is complete; with a voice activity detector, a chunk
    of prolonged silence is dropped (``process`` returns None for it).  Given a ``streaming_enc_dec_asr`` model it
    makes Moonshine's processor (``pipeline/moonshine_streaming.py``)."""

    def __new__(cls, model):
        if cls is StreamingProcessor and getattr(model, "type", None) == "streaming_enc_dec_asr" and \
                getattr(model, "transducer", None) is not None:
            from .moonshine_streaming import MoonshineStreamingProcessor
            return MoonshineStreamingProcessor(model)
        return super().__new__(cls)

    def __init__(self, model):
        t = getattr(model, "transducer", None)
        if t is None or model.type != "nemotron_speech":
            raise RequestError(f"CreateStreamingProcessor: unsupported model type '{model.type}'. StreamingProcessor "
                               f"supports 'streaming_enc_dec_asr' (Moonshine) and 'nemotron_speech' (Nemotron).")
        cfg = t.cfg
        if cfg.pre_encode_cache_size <= 0:
            raise RequestError(f"NemotronStreamingProcessor requires pre_encode_cache_size > 0. Got: "
                               f"{cfg.pre_encode_cache_size}")
        self.cfg, self._model = cfg, t
        self._mel = StreamingMel(cfg)
        self._cache = np.zeros((cfg.pre_encode_cache_size, cfg.num_mels), _F)
        self._buffer = np.zeros(0, _F)
        self._init_vad(t)

    def _drop(self, chunk: np.ndarray) -> bool:
        """The detector's verdict on a chunk: kept while speech is heard, and through the first
        ``max(prefix, silence)`` chunks of silence less one; dropped from there on."""
        if self._vad is None:
            return False
        if self._vad.contains_speech(chunk):
            self._silent = 0
            return False
        self._silent += 1
        return self._silent >= max(self._prefix_chunks, self._silence_chunks)

    def _chunk_features(self, audio: np.ndarray):
        from .api import NamedTensors
        dtype = self._model.input_dtype("encoder", self.cfg.enc["in.audio_features"])
        if dtype not in (np.float32, np.float16):
            raise RequestError(f"NemotronStreamingProcessor only supports float32 or float16 encoder input. Got "
                               f"type: {np.dtype(dtype).name}")
        mel = self._mel(audio)
        out = np.concatenate([self._cache, mel])[None].astype(dtype)
        keep = self.cfg.pre_encode_cache_size
        self._cache = np.concatenate([self._cache, mel])[-keep:]
        named = NamedTensors()
        named[AUDIO_FEATURES] = out
        return named

    def process(self, audio_chunk):
        chunk = self._next_chunk(audio_chunk)
        if chunk is None or self._drop(chunk):
            return None
        return self._chunk_features(chunk)

    def flush(self):
        if self._buffer.size == 0:
            return None
        n = self.cfg.chunk_samples
        chunk = np.zeros(n, _F)
        take = min(n, self._buffer.size)   # more than a chunk left: the rest is dropped, as onnxruntime-genai does
        chunk[:take] = self._buffer[:take]
        self._buffer = np.zeros(0, _F)
        return self._chunk_features(chunk)

# -- the model and its sessions ----------------------------------------------------------------------------------

class TransducerModel:
    """The package's models (encoder, decoder, joiner, and the voice activity detector if any) on the chosen
    backends, and its config."""

    def __init__(self, root: str, cfg: NemotronConfig, specs: dict, native: set, device: str):
        from .backends import native_providers
        from .components import NativeComponent, OrtComponent
        self.root, self.cfg, self.device = root, cfg, device
        providers = native_providers(device) if native else None   # the device is the native components'
        self.sessions = {name: (NativeComponent(specs[name], providers) if name in native
                                else OrtComponent(specs[name])) for name in specs}
        self.backends = {name: s.backend for name, s in self.sessions.items()}
        self._check_ports()

    def input_dtype(self, component: str, name: str):
        t = self.sessions[component].inputs[name].type
        return _FLOATS.get(t) or _INTS.get(t) or t

    def has_input(self, component: str, name: str) -> bool:
        return name in self.sessions[component].inputs

    def _check_ports(self):
        c = self.cfg
        self._check_names()
        if isinstance(c, TdtConfig):
            self.float_type = np.float32
            return
        floats = [self.input_dtype("encoder", c.enc[k]) for k in ("in.audio_features", "in.cache_last_channel",
                                                                   "in.cache_last_time")]
        floats += [self.input_dtype("decoder", c.dec[k]) for k in ("in.lstm_hidden_state", "in.lstm_cell_state")]
        floats += [self.input_dtype("joiner", c.join[k]) for k in ("in.encoder_outputs", "in.decoder_outputs")]
        if floats[0] not in (np.float32, np.float16):
            raise RequestError("Nemotron ASR only supports homogeneous float32 or float16 I/O")
        if any(f is not floats[0] for f in floats):
            raise RequestError("Nemotron ASR requires homogeneous floating-point I/O")
        if self.has_input("encoder", c.enc["in.lang_id"]) and \
                self.input_dtype("encoder", c.enc["in.lang_id"]) is not np.int64:
            raise RequestError("Encoder lang_id input must be int64")
        self.float_type = floats[0]

    def _check_names(self):
        c = self.cfg
        for comp, names in (("encoder", c.enc), ("decoder", c.dec), ("joiner", c.join)):
            s = self.sessions[comp]
            optional = {"in.input_lengths", "in.lang_id"} if comp == "encoder" else set()
            for key, name in names.items():
                have = s.inputs if key.startswith("in.") else s.output_names
                if key not in optional and name not in have:
                    where = "inputs" if key.startswith("in.") else "outputs"
                    raise MetadataError(f"model.{comp}.{where}.{key[key.index('.') + 1:]}: {name!r} is not among "
                                        f"the {comp} graph's {where} {sorted(have)}")

    def run(self, component: str, feeds: dict) -> dict:
        return self.sessions[component].run(feeds)


def load_transducer(root: str, overlay: dict | None, model_data: dict, native, device) -> tuple:
    """(``TransducerModel``, ``PipelineSpec``) of a streaming speech package; ``native``: 'all', 'none' (or None),
    or component names (``encoder``, ``decoder``, ``joiner``; Moonshine's ``frontend``, ``encoder``, ``adapter``,
    ``cross_kv``, ``decoder_kv``; ``vad``)."""
    import json
    from .backends import choice_from_environment, parse_components, parse_device
    from .genai_config import merged
    from .spec import PipelineSpec
    with open(os.path.join(root, "genai_config.json"), encoding="utf-8") as fh:
        doc = json.load(fh)
    if overlay:
        doc = merged(doc, overlay)
    model = doc["model"]
    kind = model.get("type")
    if kind == "streaming_enc_dec_asr":
        from .moonshine_streaming import COMPONENTS as names, MoonshineConfig, MoonshineModel
        cfg, model_class = MoonshineConfig.from_json(doc), MoonshineModel
        names, files = list(names), dict(cfg.files)
    else:
        cfg = (TdtConfig if kind == "parakeet_tdt" else NemotronConfig).from_json(doc)
        model_class, names = TransducerModel, list(COMPONENTS)
        files = {name: (model.get(name) or {}).get("filename") or f"{name}.onnx" for name in names}
    if getattr(cfg, "vad", None) and cfg.vad.get("filename"):
        names.append("vad")   # the voice activity detector: a component like the others
        files["vad"] = cfg.vad["filename"]
    specs = {}
    for name in names:
        fn = files[name]
        path = os.path.join(root, fn)
        data = model_data.get(fn)
        if data is None and not os.path.isfile(path):
            where = f"model.moonshine.{name}_filename" if kind == "streaming_enc_dec_asr" and name != "vad" \
                else f"model.{name}.filename"
            raise MetadataError(f"{where}: {path!r} does not exist")
        specs[name] = ComponentSpec(name, path, name, data=data)
    if native is None and device is None:
        dec = "decoder_kv" if kind == "streaming_enc_dec_asr" else "decoder"
        choice = choice_from_environment(names, dec)
        chosen = set(choice.native_components) | ({dec} if choice.native_decoder else set())
        device = choice.device
    else:   # as for the other packages: a device alone means every component native on it
        device = parse_device(device, "device")
        native = "all" if native is None else native
        chosen = set() if native == "none" else parse_components(native, names, "native")
    eos = model.get("eos_token_id")
    spec = PipelineSpec(root=root, components=specs, model_type=model.get("type"),
                        tokenizer_dir=root if os.path.isfile(os.path.join(root, "tokenizer.json")) else None,
                        bos_token_id=model.get("bos_token_id"), pad_token_id=model.get("pad_token_id"),
                        eos_token_ids=list(eos) if isinstance(eos, list) else ([eos] if eos is not None else []),
                        vocab_size=model.get("vocab_size"))
    if isinstance(cfg, TdtConfig) and cfg.blank_id not in cfg.eos_token_ids:
        raise RequestError(f"Parakeet TDT: model.blank_id ({cfg.blank_id}) must be present in model.eos_token_id so "
                           f"generation terminates correctly.")
    return model_class(root, cfg, specs, chosen, device), spec


# -- the generator -----------------------------------------------------------------------------------------------

class TransducerGenerator:
    """onnxruntime-genai's ``Generator`` for a transducer model: symbols from queued audio features."""

    def __init__(self, model, params=None):
        self._model_type = model.type
        self._t = t = model.transducer
        c = self._cfg = t.cfg
        ft = t.float_type
        self._caches = {c.enc["in.cache_last_channel"]: np.zeros((1, c.num_encoder_layers, c.left_context,
                                                                   c.hidden_dim), ft),
                        c.enc["in.cache_last_time"]: np.zeros((1, c.num_encoder_layers, c.hidden_dim,
                                                                c.conv_context), ft),
                        c.enc["in.cache_last_channel_len"]: np.zeros(
                            1, t.input_dtype("encoder", c.enc["in.cache_last_channel_len"]))}
        self._lang_id = np.zeros(1, np.int64)
        self._h = np.zeros((c.decoder_lstm_layers, 1, c.decoder_lstm_dim), ft)
        self._c = np.zeros_like(self._h)
        self._last_token = c.blank_id
        self._pred = None  # the prediction network's outputs for the current token and state (kept over blanks)
        self._queued = []            # (name, features) set but not yet applied
        self._mel = None
        self._encode = False
        self._chunk_done = True
        self._encoded, self._encoded_len = None, 0
        self._time, self._symbols = 0, 0
        self._all, self._step = [], []

    # -- inputs
    def set_inputs(self, named=None, **more):
        from .api import _arrays
        arrays = _arrays(dict(named or {}, **more))
        if "input_ids" in arrays:
            raise RequestError(f"input_ids: a {self._model_type} model takes no token ids; give set_inputs a "
                               f"StreamingProcessor's output")
        self._queued += list(arrays.items())

    def set_model_input(self, name: str, value):
        self.set_inputs({str(name): value})

    def _apply(self, queued):
        for name, value in queued:
            if name in (AUDIO_FEATURES, self._cfg.enc["in.audio_features"]):
                self._mel = np.asarray(value)
                self._encode = True
                self._chunk_done = False

    def set_runtime_option(self, key: str, value: str):
        if str(key) != "lang_id":
            return   # onnxruntime-genai passes other keys to its run options; nothing here reads them
        if value is None:
            raise RequestError('SetRuntimeOption("lang_id"): value must not be null.')
        m = _STOI.match(str(value))
        if not m:
            raise RequestError("stoi")
        if m.end() != len(str(value)):
            raise RequestError(f'SetRuntimeOption("lang_id"): invalid integer value "{value}".')
        if not self._t.has_input("encoder", self._cfg.enc["in.lang_id"]):
            raise RequestError("Cannot set lang_id: encoder graph has no lang_id input (this model is not a "
                               "prompt-conditioned multilingual model).")
        self._lang_id[0] = int(m.group(0))

    # -- the loop
    def is_done(self) -> bool:
        return False if self._queued else self._chunk_done

    def generate_next_token(self):
        self._apply(self._queued)
        self._queued = []
        if self._encode:
            self._run_encoder()
            self._encode = False
            self._time, self._symbols = 0, 0
        self._step = []
        if self._encoded is None:
            raise RequestError("generate_next_token: no audio features yet; call set_inputs with a "
                               "StreamingProcessor's output first")
        c, t = self._cfg, self._t
        steps = min(self._encoded.shape[1], self._encoded_len)
        while self._time < steps:
            frame = self._encoded[:, self._time].reshape(1, 1, -1)
            if self._pred is None:  # a blank changes neither the token nor the state: its outputs stand
                tdt = t.input_dtype("decoder", c.dec["in.targets"])
                self._pred = t.run("decoder", {c.dec["in.targets"]: np.full((1, 1), self._last_token, tdt),
                                               c.dec["in.lstm_hidden_state"]: self._h,
                                               c.dec["in.lstm_cell_state"]: self._c})
            pred = self._pred
            out = np.asarray(pred[c.dec["out.outputs"]])
            logits = t.run("joiner", {c.join["in.encoder_outputs"]: frame,
                                      c.join["in.decoder_outputs"]: out.reshape(1, 1, out.shape[1])})
            best = self._argmax(np.asarray(logits[c.join["out.logits"]]))
            if best == c.blank_id:   # the LSTM state stays: nothing was emitted
                self._time += 1
                self._symbols = 0
                continue
            self._last_token = best
            self._h, self._c = pred[c.dec["out.lstm_hidden_state"]], pred[c.dec["out.lstm_cell_state"]]
            self._pred = None
            self._symbols += 1
            if self._symbols >= c.max_symbols_per_step:
                self._time += 1
                self._symbols = 0
            self._step = [best]
            self._all.append(best)
            return
        self._chunk_done = True

    def _argmax(self, logits: np.ndarray) -> int:
        if logits.dtype not in (np.float32, np.float16):
            raise RequestError("NemotronArgMax only supports float32 or float16 logits")
        scores = logits.astype(np.float32).ravel().copy()
        b = self._cfg.blank_id
        if 0 <= b < scores.size:
            scores[b] = scores[b] - np.float32(self._cfg.blank_penalty)
        return int(np.argmax(scores))

    def _run_encoder(self):
        c, t = self._cfg, self._t
        mel = self._mel
        if mel.ndim != 3:
            raise RequestError(f"mel input must have rank 3 [batch, frames, mels], got rank {mel.ndim}")
        if mel.shape[0] != 1:
            raise RequestError(f"mel input batch dimension must be 1, got {mel.shape[0]}")
        if mel.shape[2] != c.num_mels:
            raise RequestError(f"mel input mels dimension ({mel.shape[2]}) does not match expected num_mels "
                               f"({c.num_mels})")
        feeds = {c.enc["in.audio_features"]: mel, **self._caches}
        if t.has_input("encoder", c.enc["in.input_lengths"]):
            feeds[c.enc["in.input_lengths"]] = np.full(1, mel.shape[1],
                                                       t.input_dtype("encoder", c.enc["in.input_lengths"]))
        if t.has_input("encoder", c.enc["in.lang_id"]):
            feeds[c.enc["in.lang_id"]] = self._lang_id
        out = t.run("encoder", feeds)
        encoded = np.asarray(out[c.enc["out.encoder_outputs"]])
        if encoded.ndim != 3:
            raise RequestError(f"Encoder output must have rank 3 [batch, time, channels], got rank {encoded.ndim}")
        self._encoded = encoded
        self._encoded_len = int(np.asarray(out[c.enc["out.output_lengths"]]).ravel()[0])
        for key in ("cache_last_channel", "cache_last_time", "cache_last_channel_len"):
            self._caches[c.enc["in." + key]] = out[c.enc[f"out.{key}_next"]]
        self._mel = None

    # -- results
    def get_next_tokens(self) -> np.ndarray:
        return np.asarray(self._step, np.int32)

    def get_sequence(self, index: int = 0) -> np.ndarray:
        return np.asarray(self._all, np.int32)   # every symbol so far; onnxruntime-genai does not read the index

    def token_count(self) -> int:
        return len(self._all)

    def get_output(self, name: str):
        raise RequestError(f"Generator output '{name}' was not found.")

    def rewind_to(self, length: int):
        raise RequestError(f"RewindTo is not supported for streaming ASR models ({self._model_type}).")

    def _unsupported(self, what):
        raise RequestError(f"{what} is not supported for streaming ASR models ({self._model_type}); feed audio "
                           f"with set_inputs(StreamingProcessor.process(chunk))")

    def append_tokens(self, ids):
        self._unsupported("append_tokens")

    def get_input(self, name: str):
        self._unsupported("get_input")

    def get_logits(self):
        self._unsupported("get_logits")

    def set_logits(self, logits):
        self._unsupported("set_logits")


# -- Parakeet TDT (offline: the whole clip's features, encoded in chunks with context) ------------------------------

@dataclass
class TdtConfig:
    """The values onnxruntime-genai's ``ParakeetTdtConfig`` (and its processor) take from ``genai_config.json``."""
    hidden_dim: int
    decoder_lstm_dim: int
    decoder_lstm_layers: int
    vocab_size: int
    blank_id: int
    eos_token_ids: list
    sample_rate: int
    chunk_samples: int
    left_context_samples: int
    right_context_samples: int
    subsampling_factor: int
    max_symbols_per_step: int
    tdt_durations: list
    num_mels: int
    fft_size: int
    hop_length: int
    win_length: int
    preemph: np.float32
    log_eps: np.float32
    norm_eps: np.float32
    enc: dict
    dec: dict
    join: dict

    @classmethod
    def from_json(cls, cfg: dict) -> "TdtConfig":
        model = cfg.get("model") or {}

        def num(d, key, where, kind=int):
            v = d.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise MetadataError(f"{where}.{key}: expected a number, got {v!r}")
            return kind(v)

        secs = {}
        for name in COMPONENTS:
            s = model.get(name)
            if not isinstance(s, dict):
                raise MetadataError(f"model.{name}: expected a mapping (the {name} model of a parakeet_tdt package), "
                                    f"got {type(s).__name__}")
            secs[name] = s
        ports = {}
        for what, ins, outs in (
                ("encoder", {"audio_features": "audio_features", "input_lengths": "length"},
                 {"encoder_outputs": "encoder_outputs", "output_lengths": "encoded_lengths"}),
                ("decoder", {"targets": "", "targets_length": "", "lstm_hidden_state": "", "lstm_cell_state": ""},
                 {"outputs": "", "outputs_length": "", "lstm_hidden_state": "", "lstm_cell_state": ""}),
                ("joiner", {"encoder_outputs": "encoder_outputs", "decoder_outputs": "decoder_outputs"},
                 {"logits": "outputs"})):
            got_in, got_out = secs[what].get("inputs") or {}, secs[what].get("outputs") or {}
            names = {"in." + k: str(got_in.get(k, d)) for k, d in ins.items()}
            names.update({"out." + k: str(got_out.get(k, d)) for k, d in outs.items()})
            ports[what] = names
        eos = model.get("eos_token_id")
        durations = model.get("tdt_durations") or []
        if not isinstance(durations, list) or not all(isinstance(d, int) for d in durations):
            raise MetadataError(f"model.tdt_durations: expected a list of integers, got {durations!r}")
        return cls(hidden_dim=num(secs["encoder"], "hidden_size", "model.encoder"),
                   decoder_lstm_dim=num(secs["decoder"], "hidden_size", "model.decoder"),
                   decoder_lstm_layers=num(secs["decoder"], "num_hidden_layers", "model.decoder"),
                   vocab_size=num(model, "vocab_size", "model"), blank_id=num(model, "blank_id", "model"),
                   eos_token_ids=list(eos) if isinstance(eos, list) else ([eos] if eos is not None else []),
                   sample_rate=num(model, "sample_rate", "model"), chunk_samples=num(model, "chunk_samples", "model"),
                   left_context_samples=num(model, "left_context_samples", "model"),
                   right_context_samples=num(model, "right_context_samples", "model"),
                   subsampling_factor=num(model, "subsampling_factor", "model"),
                   max_symbols_per_step=num(model, "max_symbols_per_step", "model"), tdt_durations=durations,
                   num_mels=num(model, "num_mels", "model"), fft_size=num(model, "fft_size", "model"),
                   hop_length=num(model, "hop_length", "model"), win_length=num(model, "win_length", "model"),
                   preemph=np.float32(num(model, "preemph", "model", float)),
                   log_eps=np.float32(num(model, "log_eps", "model", float)),
                   norm_eps=np.float32(num(model, "norm_eps", "model", float)),
                   enc=ports["encoder"], dec=ports["decoder"], join=ports["joiner"])


def per_feature_normalize(mel: np.ndarray, eps) -> np.ndarray:
    """NeMo's ``normalize_batch`` per feature on ``[mels, frames]``: each band less its mean over the frames, over
    its standard deviation (with ``frames - 1`` degrees of freedom) plus ``eps``; in double, rounded to float32."""
    x = mel.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    n = x.shape[1]
    std = np.sqrt(((x - mean) ** 2).sum(axis=1, keepdims=True) / max(n - 1, 1)) + float(eps)
    return ((x - mean) / std).astype(_F)


class ParakeetProcessor:
    """onnxruntime-genai's ``MultiModalProcessor`` of a ``parakeet_tdt`` model: one clip (``Audios``) to its
    normalised log-mel ``audio_features`` ``[1, num_mels, frames]``; ``decode`` is the tokenizer's."""

    def __init__(self, model):
        from .api import Tokenizer
        self.cfg = model.transducer.cfg
        self.tokenizer = Tokenizer(model)

    def __call__(self, prompt=None, images=None, audios=None, **kwargs):
        from .api import NamedTensors
        from .audio import decode_audio
        blobs = getattr(audios, "blobs", None)
        if not blobs:
            raise RequestError("ParakeetTdtProcessor::Process: no audio provided.")
        if len(blobs) != 1:
            raise RequestError(f"ParakeetTdtProcessor currently supports a single audio clip per call. Got: "
                               f"{len(blobs)}")
        c = self.cfg
        pcm = decode_audio(blobs[0], c.sample_rate, 1, max_samples=0).reshape(-1)
        mel = StreamingMel(c)(pcm)                       # [frames, mels]: the streaming mel over the whole clip
        if mel.shape[0] <= 0:
            raise RequestError("ParakeetTdtProcessor: audio is too short to produce mel frames.")
        named = NamedTensors()
        named[AUDIO_FEATURES] = per_feature_normalize(mel.T, c.norm_eps)[None]
        return named

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids)

    def create_stream(self):
        return self.tokenizer.create_stream()


class TdtGenerator(TransducerGenerator):
    """onnxruntime-genai's ``Generator`` for a ``parakeet_tdt`` model: the clip's features encoded chunk by chunk
    (each with its left and right context), then the token-and-duration greedy decode; the prediction network runs
    only on an emitted symbol, a blank's duration skips frames, ``is_done`` once the last chunk's frames are used."""

    def __init__(self, model, params=None):
        self._model_type = model.type
        self._t = t = model.transducer
        c = self._cfg = t.cfg
        self._h = np.zeros((c.decoder_lstm_layers, 1, c.decoder_lstm_dim), np.float32)
        self._c = np.zeros_like(self._h)
        self._queued, self._loaded_once = [], False
        self._mel = None              # [mels, frames] once loaded; later inputs are ignored
        self._audio = 0               # frames * hop: the clip's length in samples as the chunks count it
        self._next_start, self._finished, self._started = 0, False, False
        self._dec_out = None
        self._encoded = np.zeros((c.hidden_dim, 0), np.float32)
        self._t_frame, self._end_frame, self._symbols = 0, 0, 0
        self._chunk_done = False
        self._all, self._step = [], []

    def set_runtime_option(self, key: str, value: str):
        return   # no runtime option changes this model's decode

    def set_inputs(self, named=None, **more):
        """Queued as for the streaming model; the first call's features are also loaded at once, as
        onnxruntime-genai loads them, so that a wrong shape fails here (until one call succeeds)."""
        super().set_inputs(named, **more)
        if not self._loaded_once:
            self._load(self._queued)
            self._loaded_once = True

    def is_done(self) -> bool:
        return False if self._queued else self._chunk_done

    def _load(self, queued):
        if self._mel is not None:
            return
        mel = next((np.asarray(v) for name, v in queued if name == AUDIO_FEATURES), None)
        if mel is None:
            raise RequestError("ParakeetTdtState::SetExtraInputs: 'audio_features' input is missing.")
        if mel.ndim != 3 or mel.shape[0] != 1:
            raise RequestError("ParakeetTdtState::SetExtraInputs: audio_features must have shape [1, num_mels, T].")
        if mel.shape[1] != self._cfg.num_mels:
            raise RequestError("ParakeetTdtState::SetExtraInputs: mel num_mels mismatch with model config.")
        self._mel = np.asarray(mel[0], np.float32)
        self._audio = self._mel.shape[1] * self._cfg.hop_length
        self._finished = self._audio == 0

    def generate_next_token(self):
        self._load(self._queued)
        self._queued = []
        if not self._started:
            self._predict(self._cfg.blank_id)
            self._encode_next_chunk()
            self._started = True
        self._step = []
        token = self._emit()
        if token == self._cfg.blank_id:
            self._chunk_done = True
            return
        self._all.append(token)
        self._step = [token]

    def _predict(self, token: int):
        c, t = self._cfg, self._t
        out = t.run("decoder", {c.dec["in.targets"]: np.full((1, 1), token, np.int64),
                                c.dec["in.targets_length"]: np.ones(1, np.int64),
                                c.dec["in.lstm_hidden_state"]: self._h, c.dec["in.lstm_cell_state"]: self._c})
        self._h, self._c = out[c.dec["out.lstm_hidden_state"]], out[c.dec["out.lstm_cell_state"]]
        self._dec_out = np.asarray(out[c.dec["out.outputs"]])

    def _encode_next_chunk(self):
        c, t = self._cfg, self._t
        hop, sub = c.hop_length, c.subsampling_factor
        total_frames = self._mel.shape[1]
        start = self._next_start
        end = min(start + c.chunk_samples, self._audio)
        last = end >= self._audio
        win_left = start - c.left_context_samples if start > c.left_context_samples else 0
        win_right = min(end + c.right_context_samples, self._audio)
        left_mel, right_mel = win_left // hop, min(win_right // hop, total_frames)
        frames = right_mel - left_mel
        self._next_start = end
        if last:
            self._finished = True
        if frames <= 0:
            self._encoded = np.zeros((c.hidden_dim, 0), np.float32)
            self._t_frame = self._end_frame = 0
            return
        window = np.ascontiguousarray(self._mel[None, :, left_mel:right_mel])
        out = t.run("encoder", {c.enc["in.audio_features"]: window,
                                c.enc["in.input_lengths"]: np.full(1, frames, np.int64)})
        enc = np.asarray(out[c.enc["out.encoder_outputs"]])
        if enc.ndim != 3:
            raise RequestError(f"Encoder output must have rank 3 [batch, channels, time], got rank {enc.ndim}")
        if enc.shape[1] != c.hidden_dim:
            raise RequestError(f"Encoder output channel dimension ({enc.shape[1]}) does not match config hidden_dim "
                               f"({c.hidden_dim})")
        self._encoded = enc[0]
        total = int(np.asarray(out[c.enc["out.output_lengths"]]).ravel()[0])
        chunk_start_mel, chunk_end_mel = start // hop - left_mel, end // hop - left_mel
        first = chunk_start_mel // sub
        stop = total if last else min(chunk_end_mel // sub, total)
        self._t_frame, self._end_frame = first, max(stop, first)
        self._symbols = 0

    def _emit(self) -> int:
        c, t = self._cfg, self._t
        n_tok = c.vocab_size
        while True:
            while self._t_frame >= self._end_frame:
                if self._finished:
                    return c.blank_id
                self._encode_next_chunk()
            d = self._dec_out
            if d.ndim != 3:
                raise RequestError(f"Decoder output must have rank 3 [batch, decoder_lstm_dim, time], got rank "
                                   f"{d.ndim}")
            if d.shape != (1, c.decoder_lstm_dim, 1):
                raise RequestError(f"Decoder output must have shape [1, {c.decoder_lstm_dim}, 1], got "
                                   f"[{d.shape[0]}, {d.shape[1]}, {d.shape[2]}]")
            frame = np.ascontiguousarray(self._encoded[:, self._t_frame]).reshape(1, 1, -1)
            logits = np.asarray(t.run("joiner", {c.join["in.encoder_outputs"]: frame,
                                                 c.join["in.decoder_outputs"]: d.reshape(1, 1, -1)})[
                c.join["out.logits"]], np.float32).ravel()
            token = int(np.argmax(logits[:n_tok]))
            first = 1 if token == c.blank_id else 0   # a blank may not stay on its frame
            durs = logits[n_tok:n_tok + len(c.tdt_durations)]
            dur = first + int(np.argmax(durs[first:])) if durs.size > first else 0
            skip = c.tdt_durations[dur]
            emitted = token != c.blank_id
            if emitted:
                self._symbols += 1
                self._predict(token)
            if skip > 0:
                self._symbols = 0
            elif self._symbols >= c.max_symbols_per_step:
                self._symbols = 0
                skip = 1
            self._t_frame += skip
            if emitted:
                return token


def transducer_generator(model, params=None):
    """The generator of a streaming speech model: ``TdtGenerator`` for ``parakeet_tdt``, Moonshine's for
    ``streaming_enc_dec_asr`` (``pipeline/moonshine_streaming.py``), else ``TransducerGenerator``."""
    if model.type == "streaming_enc_dec_asr":
        from .moonshine_streaming import MoonshineGenerator
        return MoonshineGenerator(model, params)
    return (TdtGenerator if model.type == "parakeet_tdt" else TransducerGenerator)(model, params)
