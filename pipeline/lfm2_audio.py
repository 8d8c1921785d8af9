"""LFM2-Audio (``model.type`` ``lfm2_audio``) as onnxruntime-genai 0.18 runs it: audio in through a speech encoder,
and, when the config has ``model.audio_output``, audio out through a depthformer.

The processor (``MultiModalProcessor`` for such a model, ``pipeline/multimodal.py``):

- each clip (``Audios``) decoded to mono at its own rate (``pipeline/audio.py``, nothing cut off), brought to
  ``sample_rate`` by torchaudio's windowed-sinc ``resample`` (up or down, ``resample``), then NeMo's
  log-mel (``lfm2_mel``): pre-emphasis ``y[n] = x[n] - preemph * x[n-1]`` (``x[-1] = 0``), ``fft_size / 2`` zeros
  on both sides, frames every ``hop_length`` of ``win_length`` samples centred in ``fft_size`` under a symmetric
  Hann window, the power spectrum, a Slaney mel bank, ``ln(mel + log_eps)``; ``(samples + 2 * (fft_size / 2) -
  fft_size) / hop_length + 1`` frames, of which all but the last are valid: each band normalised over the valid
  ones (mean, standard deviation with ``n - 1`` degrees of freedom, plus ``norm_eps``), the rest zeroed.  Fewer
  than two valid frames is onnxruntime-genai's error.  The mel keys default to the published checkpoints'
  (``MelConfig``); ``model.num_mels`` ... ``model.norm_eps`` override them;
- the prompt is cut at each ``<|audio|>`` (one per clip, in order; another count is its error); each piece is
  tokenized alone and clip ``i`` puts ``ceil(frames_i / subsampling_factor)`` copies of ``model.audio_token_id``
  (``subsampling_factor`` default 8) after its piece;
- out: ``input_ids`` ``[1, n]`` int32, ``audio_embeds`` ``[clips, longest, num_mels]`` (zero-padded, in the speech
  model's input type), ``audio_lengths`` ``[clips]`` (mel frames) and ``audio_sizes`` ``[clips]`` (placeholders)
  int64; with no clip only ``input_ids`` and ``audio_sizes`` ``[0]``.

The speech model runs on the whole batch for one clip, else once per clip on its own frames (``run_per_clip``);
its features, concatenated in clip order, go to the embedding model as ``[tokens, hidden]`` rows.

Speech output (``SpeechOutput``; onnxruntime-genai's ``Lfm2AudioOutput``).  The answer starts in text.  Each model
run begins with ``begin_step`` on the ids it takes: the prompt, or several ids, start a new turn in text;
otherwise, after a text run, the id just chosen may turn the answer to speech: ``audio_start_token_id``, or with
``audio_interleaved`` when ``interleaved_n_text`` text positions are used up or once ``text_end_token_id`` came
(from then on the rest of the turn is speech).  A run in speech reads the decoder's last hidden state
(``hidden_states``, or ``model.decoder.outputs.hidden_states``) and samples one frame of ``num_codebooks`` codes
with the depthformer, one run per code, each given the code before it (its keys and values carried, the first
run's ``depth_slices`` handed back in); a code is the argmax of the first ``codebook_size`` logits
(``audio_temperature`` <= 0 or ``audio_top_k`` 1), else drawn among the ``audio_top_k`` best (0: all) with weights
``exp((logit - best) / audio_temperature)`` by ``std::discrete_distribution`` over a ``std::mt19937`` seeded with
``random_seed`` (``MT19937``).  With ``audio_interleaved`` the turn goes back to text after ``interleaved_n_audio``
frames (unless ``text_end`` came); a frame whose first code is ``codebook_size - 1`` ends the speech (recorded as
that code in every codebook, not kept).  The frame's codes, offset by ``codebook * codebook_size``, go through the
audio embedding model; their summed rows are the decoder's next input in place of the embedding model's (rounded
to float16 as onnxruntime-genai rounds, ``to_half``, for a float16 decoder).  The run
returns logits that pick ``audio_token_id`` (0 there, the lowest float elsewhere), so the sequence holds one
placeholder per frame.  ``get_output("audio_codes")`` is every kept frame, ``[frames, num_codebooks]`` int64.
Defaults as in onnxruntime-genai: 8 codebooks of 2049 codes, ``audio_start_token_id`` 128, ``text_end_token_id``
130, 6 text and 12 audio positions, ``audio_temperature`` 1, ``audio_top_k`` 4.  Speech output needs one sequence
and no beams.

Differences, and why: the FFT is numpy's (double precision) where onnxruntime-genai's is single precision, so a
feature differs from its by about 1e-5 (the tests bound it at 1e-4; the tokens and codes are equal), more in a band
left empty by up-sampling; ``std::partial_sort`` leaves equal code logits in an order of its own, here they are in
id order.  Ids appended after generating start a new turn in text here; onnxruntime-genai 0.18 fails on such a
multimodal sequence (its next decoder run finds the cache one position short).

Invariants: the depthformer and the audio embedding are components like the others (``native=`` names them
``depthformer`` and ``audio_embedding``); the sampler of the codes owns its generator, apart from the text's; the
decoder's hidden state is read only in a speech run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .spec import RequestError

__all__ = ["MARKER", "MelConfig", "lfm2_mel", "mel_frames", "resample", "AudioOutputConfig", "SpeechOutput", "MT19937",
           "run_per_clip", "to_half"]

MARKER = "<|audio|>"
_F = np.float32
_LOWEST = np.finfo(np.float32).min


@dataclass
class MelConfig:
    """NeMo's ``AudioToMelSpectrogramPreprocessor`` as the published checkpoints set it."""
    num_mels: int = 128
    fft_size: int = 512
    win_length: int = 400
    hop_length: int = 160
    sample_rate: int = 16000
    preemph: float = 0.97
    log_eps: float = 5.960464477539063e-08
    norm_eps: float = 1e-5

    @classmethod
    def from_model(cls, model: dict) -> "MelConfig":
        """The defaults, with each of the model section's keys that is positive in its place."""
        cfg = cls()
        for k, cast in (("num_mels", int), ("fft_size", int), ("win_length", int), ("hop_length", int),
                        ("sample_rate", int), ("preemph", float), ("log_eps", float), ("norm_eps", float)):
            v = model.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                setattr(cfg, k, cast(v))
        return cfg


def mel_frames(samples: int, cfg: MelConfig) -> tuple:
    """(frames, valid frames) of a clip of ``samples``."""
    padded = samples + 2 * (cfg.fft_size // 2)
    if padded < cfg.fft_size:
        return 0, 0
    return (padded - cfg.fft_size) // cfg.hop_length + 1, (padded - cfg.fft_size) // cfg.hop_length


def lfm2_mel(pcm: np.ndarray, cfg: MelConfig) -> np.ndarray:
    """The clip's normalised log-mel ``[frames, num_mels]`` float32 (the module docstring)."""
    from .streaming_asr import hann_symmetric, mel_filterbank
    c = cfg
    if c.num_mels <= 0 or c.fft_size <= 0 or c.hop_length <= 0 or c.win_length < 2 or c.win_length > c.fft_size:
        raise RequestError(f"Lfm2AudioProcessor: invalid mel configuration (num_mels {c.num_mels}, fft_size "
                           f"{c.fft_size}, win_length {c.win_length}, hop_length {c.hop_length}).")
    x = np.asarray(pcm, _F).reshape(-1)
    frames, valid = mel_frames(x.size, c)
    if valid < 2:
        raise RequestError(f"Lfm2AudioProcessor: audio clip is too short ({x.size} samples at {c.sample_rate} Hz); "
                           f"at least {2 * c.hop_length} samples are needed.")
    pre = np.empty_like(x)
    pre[0] = x[0]
    pre[1:] = x[1:] - _F(c.preemph) * x[:-1]
    half = c.fft_size // 2
    padded = np.concatenate([np.zeros(half, _F), pre, np.zeros(half, _F)])
    offset = (c.fft_size - c.win_length) // 2
    starts = offset + c.hop_length * np.arange(frames)
    windowed = padded[starts[:, None] + np.arange(c.win_length)] * hann_symmetric(c.win_length)
    spec = np.fft.rfft(windowed.astype(np.float64), n=c.fft_size, axis=1)
    re, im = spec.real.astype(_F), spec.imag.astype(_F)
    power = re * re + im * im
    bank = mel_filterbank(c.num_mels, c.fft_size, c.sample_rate)
    mel = (power.astype(np.float64) @ bank.T.astype(np.float64)).astype(_F)
    mel = np.log(mel + _F(c.log_eps)).astype(_F)
    v = mel[:valid]
    mean = (v.astype(np.float64).sum(axis=0) / valid).astype(_F)
    var = ((v.astype(np.float64) - mean.astype(np.float64)) ** 2).sum(axis=0)
    std = (np.sqrt(var / (valid - 1)).astype(_F) + _F(c.norm_eps)).astype(_F)
    out = np.zeros_like(mel)
    out[:valid] = (v - mean) / std
    return out


def resample(pcm: np.ndarray, source: int, target: int, dtype=np.float64) -> np.ndarray:
    """torchaudio's ``resample`` (``sinc_interp_hann``, ``lowpass_filter_width`` 6, ``rolloff`` 0.99): the rates
    reduced by their gcd, each output phase's windowed-sinc kernel over the clip zero-padded by the kernel's
    width, ``ceil(target * samples / source)`` samples kept; float32 out."""
    if source <= 0 or target <= 0:
        raise RequestError(f"Lfm2AudioProcessor: cannot resample from {source} Hz to {target} Hz.")
    x = np.asarray(pcm, np.float32).reshape(-1)
    if source == target:
        return x.copy()
    g = math.gcd(int(source), int(target))
    orig, new = int(source) // g, int(target) // g
    width_factor = 6
    base = min(orig, new) * 0.99
    width = math.ceil(width_factor * orig / base)
    idx = np.arange(-width, width + orig, dtype=dtype)[None, :] / orig
    t = (np.arange(0, -new, -1, dtype=dtype)[:, None] / new + idx) * base
    t = np.clip(t, -width_factor, width_factor)
    window = np.cos(t * math.pi / width_factor / 2) ** 2
    t = t * math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        kernels = np.where(t == 0, 1.0, np.sin(t) / t)
    kernels = (kernels * (window * (base / orig))).astype(dtype)                        # [new, 2 * width + orig]
    padded = np.concatenate([np.zeros(width, dtype), x.astype(dtype), np.zeros(width + orig, dtype)])
    frames = (padded.size - kernels.shape[1]) // orig + 1
    starts = np.arange(frames) * orig
    windows = padded[starts[:, None] + np.arange(kernels.shape[1])]                    # [frames, taps]
    out = (windows @ kernels.T).reshape(-1)
    return out[:math.ceil(new * x.size / orig)].astype(np.float32)


def run_per_clip(component, feeds: dict, mel_port: str, lengths_port: str, features_port: str, sizes) -> dict:
    """The speech model over each clip's own frames (``feeds[mel_port]`` ``[clips, longest, mels]``,
    ``feeds[lengths_port]`` their frame counts): its ``features_port`` outputs, ``[1, tokens, hidden]`` each,
    concatenated in clip order (its other outputs are not read); one clip runs as it is."""
    mel, lengths = np.asarray(feeds[mel_port]), np.asarray(feeds[lengths_port]).reshape(-1)
    sizes = np.asarray(sizes).reshape(-1)
    if mel.ndim != 3:
        raise RequestError(f"Lfm2AudioSpeechState: expected a 3D [num_clips, num_frames, num_mels] mel tensor, got "
                           f"rank {mel.ndim}.")
    if mel.shape[0] != sizes.size:
        raise RequestError(f"Lfm2AudioSpeechState: the mel tensor holds {mel.shape[0]} clips but audio_sizes has "
                           f"{sizes.size} entries.")
    if lengths.size != mel.shape[0]:
        raise RequestError(f"Lfm2AudioSpeechState: the mel tensor holds {mel.shape[0]} clips but {lengths_port} has "
                           f"{lengths.size} entries.")
    if sizes.size <= 1:
        return component.run(feeds)
    parts = []
    for clip in range(mel.shape[0]):
        n = int(lengths[clip])
        if n <= 0 or n > mel.shape[1]:
            raise RequestError(f"Lfm2AudioSpeechState: clip {clip} reports {n} mel frames, outside the "
                               f"1..{mel.shape[1]} the mel tensor holds.")
        out = component.run(dict(feeds, **{mel_port: np.ascontiguousarray(mel[clip:clip + 1, :n]),
                                           lengths_port: np.array([n], np.int64)}))
        v, want = np.asarray(out[features_port]), int(sizes[clip])
        if v.ndim < 2 or v.shape[-2] != want:
            raise RequestError(f"Lfm2AudioSpeechState: clip {clip} gave {features_port} of shape {list(v.shape)}, "
                               f"expected {want} rows (its audio_sizes)")
        parts.append(v.reshape(1, want, -1))
    return {features_port: np.concatenate(parts, axis=1)}


# -- std::mt19937 and std::discrete_distribution (libstdc++) ----------------------------------------------------
class MT19937:
    """``std::mt19937`` seeded with a 32-bit value; ``canonical()`` is libstdc++'s ``generate_canonical<double,
    53>`` (two outputs, ``(a + b * 2**32) / 2**64``, below 1)."""

    def __init__(self, seed: int):
        mt = [0] * 624
        mt[0] = seed & 0xFFFFFFFF
        for i in range(1, 624):
            mt[i] = (1812433253 * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i) & 0xFFFFFFFF
        self.mt, self.index = mt, 624

    def _twist(self):
        mt = self.mt
        for i in range(624):
            y = (mt[i] & 0x80000000) | (mt[(i + 1) % 624] & 0x7FFFFFFF)
            mt[i] = mt[(i + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        self.index = 0

    def __call__(self) -> int:
        if self.index >= 624:
            self._twist()
        y = self.mt[self.index]
        self.index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return y ^ (y >> 18)

    def canonical(self) -> float:
        a = self()
        b = self()
        r = (float(a) + float(b) * 4294967296.0) / 18446744073709551616.0
        return r if r < 1.0 else math.nextafter(1.0, 0.0)


def discrete_draw(weights, rng: MT19937) -> int:
    """``std::discrete_distribution<size_t>(weights)(rng)`` as libstdc++ computes it: the weights normalised by
    their sum, the running sums with the last set to 1, the first at or above a canonical draw.  One weight: 0,
    with no draw."""
    w = [float(x) for x in weights]
    if len(w) < 2:
        return 0
    total = 0.0
    for x in w:
        total += x
    cum, run = [], 0.0
    for x in w:
        run += x / total
        cum.append(run)
    cum[-1] = 1.0
    p = rng.canonical()
    for i, c in enumerate(cum):
        if not c < p:
            return i
    return len(cum)


# -- speech output --------------------------------------------------------------------------------------------
@dataclass
class AudioOutputConfig:
    """``model.audio_output`` with onnxruntime-genai's defaults."""
    depthformer: str
    embedding: str
    num_codebooks: int = 8
    codebook_size: int = 2049
    audio_start_token_id: int = 128
    text_end_token_id: int = 130
    interleaved_n_text: int = 6
    interleaved_n_audio: int = 12
    audio_token_id: int = 0            # model.audio_token_id: the placeholder each frame puts in the sequence
    hidden_states: str = "hidden_states"  # the decoder output the depthformer reads

    @classmethod
    def from_model(cls, model: dict) -> "AudioOutputConfig | None":
        """None without an ``audio_output`` section; its errors as onnxruntime-genai's."""
        from .package_checks import MetadataError
        sec = model.get("audio_output")
        if not isinstance(sec, dict):
            return None
        files = [(sec.get(k) or {}).get("filename") if isinstance(sec.get(k), dict) else None
                 for k in ("depthformer", "embedding")]
        if not all(files):
            raise MetadataError("model.audio_output needs both depthformer.filename and embedding.filename.")
        out = cls(*files)
        for k in ("num_codebooks", "codebook_size", "audio_start_token_id", "text_end_token_id",
                  "interleaved_n_text", "interleaved_n_audio"):
            if k in sec:
                v = sec[k]
                if isinstance(v, bool) or not isinstance(v, int):
                    raise MetadataError(f"model.audio_output.{k}: expected an integer, got {v!r}")
                setattr(out, k, v)
        token = model.get("audio_token_id", 0)
        out.audio_token_id = token if isinstance(token, int) and not isinstance(token, bool) else 0
        dec_out = (model.get("decoder") or {}).get("outputs") if isinstance(model.get("decoder"), dict) else None
        if isinstance(dec_out, dict) and dec_out.get("hidden_states"):
            out.hidden_states = dec_out["hidden_states"]
        eos = model.get("eos_token_id")
        eos = eos if isinstance(eos, list) else [eos]
        if out.audio_start_token_id in eos:
            raise MetadataError(f"model.eos_token_id holds {out.audio_start_token_id}, which model.audio_output uses "
                                f"to start speech. Remove it from eos_token_id.")
        return out


class SpeechOutput:
    """One generator's speech output (the module docstring).  ``depthformer`` and ``embedding`` are the two
    components (``run(feeds) -> outputs``); ``search`` the generator's options."""

    def __init__(self, cfg: AudioOutputConfig, depthformer, embedding, vocab: int, search, rows: int):
        if rows != 1:
            raise RequestError("Lfm2AudioOutput: speech output needs a batch size of 1 and no beam search.")
        ins = depthformer.inputs
        shapes = [ins[k].shape if k in ins else None for k in ("hidden_states", "depth_slices_in", "past_keys")]
        for k, s in zip(("hidden_states", "depth_slices_in", "past_keys"), shapes):
            if s is None:
                raise RequestError(f"Lfm2AudioOutput: the depthformer model has no input named \"{k}\".")
        hidden, slices, keys = shapes
        if len(hidden) != 2 or len(slices) != 3 or len(keys) != 5 or cfg.num_codebooks <= 0 or \
                slices[1] != cfg.num_codebooks:
            raise RequestError(f"Lfm2AudioOutput: the depthformer model does not have the expected inputs for "
                               f"{cfg.num_codebooks} codebooks.")
        if cfg.codebook_size <= 0:
            raise RequestError(f"Lfm2AudioOutput: model.audio_output.codebook_size {cfg.codebook_size} must be "
                               f"positive.")
        placeholder = cfg.audio_token_id
        if placeholder <= 0 or placeholder >= vocab:
            raise RequestError(f"Lfm2AudioOutput: model.audio_token_id {placeholder} must be set to a token inside "
                               f"the vocabulary of {vocab} tokens.")
        self.cfg, self.depthformer, self.embedding = cfg, depthformer, embedding
        self.hidden_size, self.depth_size = hidden[1], slices[2]
        self.layers, self.kv_heads, self.head_size = keys[0], keys[2], keys[4]
        self.interleaved = bool(search.audio_interleaved)
        self.temperature = float(np.float32(search.audio_temperature))
        self.top_k = int(search.audio_top_k)
        seed = search.seed
        self.rng = MT19937(int(np.random.SeedSequence().entropy) & 0xFFFFFFFF if seed is None or seed == -1
                           else int(seed))
        self.placeholder_logits = np.full((1, 1, vocab), _LOWEST, np.float32)
        self.placeholder_logits[0, 0, placeholder] = 0.0
        self.codes = []
        self.pending = None
        self._audio, self._previous_text, self._text_done = False, False, False
        self._left = cfg.interleaved_n_text

    @property
    def in_audio(self) -> bool:
        return self._audio

    def begin_step(self, tokens, first: bool):
        """At the top of a model run over ``tokens`` (the ids it takes)."""
        tokens = np.asarray(tokens).reshape(-1)
        c = self.cfg
        if first or tokens.size != 1:
            self._audio, self._previous_text, self._text_done = False, False, False
            self._left = c.interleaved_n_text
            self.pending = None
        elif self._previous_text:
            token = int(tokens[0])
            if self.interleaved:
                self._text_done = self._text_done or token == c.text_end_token_id
                if self._left == 0 or self._text_done:
                    self._audio, self._left = True, c.interleaved_n_audio
            elif token == c.audio_start_token_id:
                self._audio = True
        self._left -= 1
        self._previous_text = not self._audio

    def take_pending(self, dtype) -> np.ndarray:
        """The last frame's embedding as the decoder's ``[1, 1, hidden]`` input (in ``dtype``; float16 rounded as
        onnxruntime-genai rounds it, ``to_half``), once."""
        frame, self.pending = self.pending, None
        out = to_half(frame) if np.dtype(dtype) == np.float16 else frame.astype(dtype)
        return out.reshape(1, 1, -1)

    def sample_frame(self, hidden) -> np.ndarray:
        """The next frame from the decoder's hidden states (their last position); the placeholder's logits."""
        h = np.asarray(hidden)
        if h.ndim == 0 or h.shape[-1] != self.hidden_size:
            raise RequestError(f"Lfm2AudioOutput: the decoder's hidden states do not match the depthformer's input "
                               f"of {self.hidden_size} values.")
        if h.dtype not in (np.float32, np.float16):
            raise RequestError("Lfm2AudioOutput: the decoder's hidden states must be float or float16.")
        frame = self._depthformer(h.reshape(-1)[-self.hidden_size:].astype(np.float32))
        c = self.cfg
        if self.interleaved and self._left == 0 and not self._text_done:
            self._audio, self._left = False, c.interleaved_n_text
        end = c.codebook_size - 1
        if frame[0] == end:
            frame = [end] * len(frame)
            self._audio = False
        else:
            self.codes.append(frame)
        self._embed(frame)
        return self.placeholder_logits

    def _depthformer(self, hidden: np.ndarray) -> list:
        c = self.cfg
        shape = (self.layers, 1, self.kv_heads, 0, self.head_size)
        keys, values = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        slices = np.zeros((1, c.num_codebooks, self.depth_size), np.float32)
        frame, previous = [], 0
        for step in range(c.num_codebooks):
            out = self.depthformer.run({
                "hidden_states": hidden.reshape(1, -1), "depth_slices_in": slices,
                "step_idx": np.array(step, np.int64), "prev_token": np.array([previous], np.int64),
                "past_keys": keys, "past_values": values, "seqlens_k": np.array([step], np.int32),
                "total_seq_len": np.array(step + 1, np.int32)})
            logits = np.asarray(out["logits"])
            if logits.dtype != np.float32:
                raise RequestError(f"Lfm2AudioOutput: the depthformer's logits must be float, got {logits.dtype}")
            if logits.ndim == 0 or logits.shape[-1] < c.codebook_size:
                raise RequestError(f"Lfm2AudioOutput: model.audio_output.codebook_size is {c.codebook_size}, but "
                                   f"the depthformer produces {logits.shape[-1] if logits.ndim else 0} logits.")
            previous = self._code(logits.reshape(-1)[:c.codebook_size])
            frame.append(previous)
            if step == 0:
                slices = np.asarray(out["depth_slices"], np.float32)
            keys, values = np.asarray(out["new_keys"], np.float32), np.asarray(out["new_values"], np.float32)
        return frame

    def _code(self, logits: np.ndarray) -> int:
        if self.temperature <= 0.0 or self.top_k == 1:
            return int(np.argmax(logits))
        order = np.argsort(-logits, kind="stable")
        kept = min(self.top_k, order.size) if self.top_k > 0 else order.size
        order = order[:kept]
        best = logits[order[0]]
        weights = [math.exp(float(np.float32(logits[i] - best)) / self.temperature) for i in order]
        return int(order[discrete_draw(weights, self.rng)])

    def _embed(self, frame: list):
        rows = np.array([[code + k * self.cfg.codebook_size for k, code in enumerate(frame)]], np.int64)
        out = np.asarray(self.embedding.run({"audio_codes": rows})["audio_embeds"])
        if out.dtype != np.float32 or out.ndim == 0 or out.size != len(frame) * out.shape[-1]:
            raise RequestError("Lfm2AudioOutput: the audio embedding model must produce one float embedding per "
                               "codebook.")
        self.pending = _ordered_sum(out.reshape(len(frame), -1))

    def audio_codes(self) -> np.ndarray:
        return np.array(self.codes, np.int64).reshape(-1, self.cfg.num_codebooks)


def to_half(x: np.ndarray) -> np.ndarray:
    """float32 to float16 as onnxruntime-genai's ``FastFloat32ToFloat16``: half a unit of the last kept place added,
    then truncated (a tie rounds away from zero, not to even), subnormals rounded the same way, overflow saturated
    to the all-ones pattern; no NaN or infinity handling."""
    b = np.asarray(x, np.float32).view(np.uint32) + np.uint32(0x1000)
    e = (b & np.uint32(0x7F800000)) >> np.uint32(23)
    m = b & np.uint32(0x007FFFFF)
    normal = np.where(e > 112, (((e - np.uint32(112)) << np.uint32(10)) & np.uint32(0x7C00)) | (m >> np.uint32(13)), 0)
    shift = np.clip(125 - e.astype(np.int64), 0, 31).astype(np.uint32)
    sub = np.where((e < 113) & (e > 101), (((np.uint32(0x007FF000) + m) >> shift) + np.uint32(1)) >> np.uint32(1), 0)
    half = ((b & np.uint32(0x80000000)) >> np.uint32(16)) | normal | sub | np.where(e > 143, 0x7FFF, 0)
    return half.astype(np.uint16).view(np.float16)


def _ordered_sum(rows: np.ndarray) -> np.ndarray:
    """The rows' sum in float32, first row first (onnxruntime-genai's order)."""
    acc = np.zeros(rows.shape[1], np.float32)
    for r in rows:
        acc = acc + r
    return acc
