"""Audio for onnxruntime-genai's speech processors: ``Audios``, the Whisper feature chain, Phi-4-multimodal's and
Gemma 4's, as onnxruntime-extensions computes them.

``Audios.open(*paths)`` / ``Audios.open_bytes(*blobs)`` hold encoded audio.  An ``audio_processor_config.json``
lists the steps, each a function here:

- ``AudioDecoder`` (``target_sample_rate`` 16000, ``stereo_to_mono`` 1, ``max_samples`` 480000): WAV (16-bit
  PCM, read by the standard library; samples as float32 ``x / 32768``), MP3 (``pipeline/mp3.py``: dr_mp3's
  float32 samples, bit for bit; a clip must begin with a frame sync, one opening with an ID3 tag is refused as
  there) or, when the ``soundfile`` package is installed, FLAC and what else libsndfile reads; two channels
  averaged; a higher rate brought down as onnxruntime-extensions does it (a 4-pole Butterworth low-pass at half
  the target rate, in float64, then Kaiser-windowed sinc interpolation, beta 6), a lower one refused; then cut to
  its first ``max_samples`` (30 s at 16 kHz; 0 keeps all);
- ``STFTNorm`` (``n_fft``, ``hop_length``): the power spectrum ``|rfft|**2`` of frames of ``n_fft`` samples every
  ``hop_length``, under a periodic Hann window, the signal zero-padded by ``n_fft / 2`` at both ends;
- ``LogMelSpectrum`` (``n_mel``, ``chunk_size`` seconds): Whisper's mel filters (Slaney scale, as
  onnxruntime-extensions builds them), the last frame dropped, ``log10`` of at least 1e-10, floored 8 below the
  maximum, ``(x + 4) / 4``; padded with the floor's value to ``chunk_size * 100`` frames (truncated past it).

Phi-4-multimodal's ``audio_feature_extraction.json`` (``phi4_audio_stack`` stacks its clips):

- ``AudioDecoderEx`` (``target_sample_rates``, e.g. ``[8000, 16000]``): decoded as ``AudioDecoder``, brought down to
  the highest target rate at or below the clip's (11.025 kHz to 8 kHz, 22.05 kHz to 16 kHz), at most 480000
  samples kept; ``(pcm, rate)``;
- ``Phi4AudioEmbed`` (``stft_normal/...``, ``logmel/...`` for 16 kHz, ``..._8k/...`` for 8 kHz): SpeechLib's
  features, unpadded frames with pre-emphasis under a Hamming window, dlib's float32 real FFT, SpeechLib's mel
  bank (``1127 ln(1 + f / 700)``), ``ln(max(1, x))``; ``(features [frames, 80], mask [frames], size)``.  These
  reproduce onnxruntime-extensions' float32 steps in its order (its FFT, ``logf``, its product order): equal to
  onnxruntime-genai's bit for bit on the clips tried.  A clip shorter than one frame is refused (onnxruntime-genai
  fails on it or reads past its end).

Gemma 4's ``audio_feature_extraction.json`` (one clip per prompt in onnxruntime-genai):

- ``AudioDecoder`` as above, then ``Gemma4LogMel`` (``feature_size`` 128, 20 ms frames every 10 ms): the clip
  padded by half a frame on the left, frames under a periodic Hann window (pre-emphasis optional), the magnitude
  ``|rfft|`` by onnxruntime-extensions' float64 radix-2 FFT, an HTK-scale mel bank, ``ln(mel + mel_floor)``
  (``logf``); ``(features [frames, 128], mask [frames])``, and ``gemma4_audio_sizes`` for ``audio_sizes``.  Equal
  to onnxruntime-genai 0.18's bit for bit on the clips and settings tried.  A clip of fewer than half a frame plus
  one sample (161 at 16 kHz) is refused (onnxruntime-genai dies on it).

WAV, FLAC and MP3 give onnxruntime-genai's samples bit for bit (MP3 Layer III only: Layers I and II are refused;
where dr_mp3 reads memory no frame wrote, in a corrupt mono header asking for intensity stereo or in mixed blocks
at 8 kHz, the samples may differ; see ``pipeline/mp3.py``).  Known difference: the FFT of ``STFTNorm`` is numpy's
(float64 internally), onnxruntime-extensions' dlib's in float32: Whisper's features agree within about 1e-5.
"""
from __future__ import annotations

import functools
import io
import math
import wave

import numpy as np
from numba import njit

from .mp3 import decode_mp3, is_mp3
from .multimodal import Blobs
from .spec import RequestError

__all__ = ["Audios", "decode_audio", "decode_clip", "stft_norm", "log_mel", "decode_audio_ex", "phi4_audio_embed",
           "phi4_audio_stack", "gemma4_log_mel", "gemma4_audio_sizes", "AUDIO_STEPS"]


class Audios(Blobs):
    """Encoded audio clips, in the order given."""

    WHAT = "Audio"


def _read(data: bytes) -> tuple:
    """(samples float32 [frames, channels], sample rate)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        try:
            with wave.open(io.BytesIO(data)) as w:
                width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
                raw = w.readframes(w.getnframes())
        except (wave.Error, EOFError) as exc:
            raise ValueError(f"AudioDecoder: the WAV data cannot be read ({exc})") from None
        if width != 2:
            raise NotImplementedError(f"AudioDecoder: {8 * width}-bit WAV is not read here (16-bit PCM is)")
        pcm = np.frombuffer(raw, "<i2").reshape(-1, channels)
        return pcm.astype(np.float32) / np.float32(32768.0), rate
    if is_mp3(data):
        return decode_mp3(data)
    if data[:3] == b"ID3":
        raise ValueError("AudioDecoder: the audio begins with an ID3 tag; onnxruntime-extensions detects MP3 only by "
                         "a frame sync at its first byte and refuses it (strip the tag to decode it)")
    try:
        import soundfile
    except ImportError:
        raise NotImplementedError("AudioDecoder: this audio is neither WAV nor MP3; FLAC and other formats need "
                                  "the soundfile package (pip install soundfile)") from None
    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as exc:  # libsndfile's errors carry no common type
        raise ValueError(f"AudioDecoder: the audio cannot be decoded ({exc})") from None
    return samples, rate


@njit(cache=True, nogil=True)
def _lowpass(x, b, a):
    """onnxruntime-extensions' 4-pole IIR: float64 state, float32 output."""
    out = np.empty(x.shape[0], np.float32)
    x1 = x2 = x3 = x4 = 0.0
    y1 = y2 = y3 = y4 = 0.0
    for i in range(x.shape[0]):
        xi = np.float64(x[i])
        y = (b[0] * xi + b[1] * x1 + b[2] * x2 + b[3] * x3 + b[4] * x4
             - a[1] * y1 - a[2] * y2 - a[3] * y3 - a[4] * y4)
        x4, x3, x2, x1 = x3, x2, x1, xi
        y4, y3, y2, y1 = y3, y2, y1, y
        out[i] = np.float32(y)
    return out


@njit(cache=True, nogil=True)
def _i0(x):
    total, term, q, n = 0.0, 1.0, x * x / 4.0, 0
    while term > 1e-8 * total:
        total += term
        n += 1
        term *= q / (n * n)
    return total


@njit(cache=True, nogil=True)
def _kaiser_resample(x, in_rate, out_rate):
    """onnxruntime-extensions' Kaiser-windowed sinc interpolation (beta 6), its float32 and float64 steps."""
    beta = 6.0
    factor = np.float32(np.float32(out_rate) / np.float32(in_rate))
    n_out = int(math.ceil(np.float32(np.float32(x.shape[0]) * factor)))
    out = np.empty(n_out, np.float32)
    i0_beta = _i0(beta)
    span = int(math.ceil(beta / (2.0 * np.float64(factor))))
    for i in range(n_out):
        index = np.float32(np.float32(i) / factor)
        whole = int(index)
        start = max(0, whole - span)
        end = min(x.shape[0] - 1, whole + span)
        length = end - start + 1
        acc = 0.0
        for j in range(start, end + 1):
            u = 2.0 * (j - start) / (length - 1.0) - 1.0
            w = _i0(beta * math.sqrt(1.0 - u * u)) / i0_beta
            distance = abs(np.float64(j) - np.float64(index))
            s = 1.0 if distance < np.float64(np.float32(1e-6)) else math.sin(math.pi * distance) / (math.pi * distance)
            acc += np.float64(x[j]) * (w * s)
        out[i] = np.float32(acc)
    return out


def _butterworth(cutoff: float):
    """The 4-pole low-pass coefficients (numerator b, denominator a) for a cutoff in cycles per sample."""
    poles, size = 4, 7
    a, b = [0.0] * size, [0.0] * size
    a[2] = b[2] = 1.0
    for p in range(1, poles // 2 + 1):
        rp = -math.cos(math.pi / (poles * 2.0) + (p - 1.0) * math.pi / poles)
        ip = math.sin(math.pi / (poles * 2.0) + (p - 1.0) * math.pi / poles)
        t = 2.0 * math.tan(0.5)
        w = 2.0 * math.pi * cutoff
        m = rp * rp + ip * ip
        d = 4.0 - 4.0 * rp * t + m * t * t
        x0, x1, x2 = t * t / d, 2.0 * t * t / d, t * t / d
        y1, y2 = (8.0 - 2.0 * m * t * t) / d, (-4.0 - 4.0 * rp * t - m * t * t) / d
        k = math.sin(0.5 - w / 2.0) / math.sin(0.5 + w / 2.0)
        d = 1.0 + y1 * k - y2 * k * k
        ap = [(x0 - x1 * k + x2 * k * k) / d, (-2.0 * x0 * k + x1 + x1 * k * k - 2.0 * x2 * k) / d,
              (x0 * k * k - x1 * k + x2) / d]
        bp = [0.0, (2.0 * k + y1 + y1 * k * k - 2.0 * y2 * k) / d, (-k * k - y1 * k + y2) / d]
        ta, tb = list(a), list(b)
        for i in range(2, poles + 3):
            a[i] = ap[0] * ta[i] + ap[1] * ta[i - 1] + ap[2] * ta[i - 2]
            b[i] = tb[i] - bp[1] * tb[i - 1] - bp[2] * tb[i - 2]
    b[2] = 0.0
    for i in range(poles + 1):
        a[i], b[i] = a[i + 2], -b[i + 2]
    gain = sum(a[:poles + 1]) / (1.0 - sum(b[:poles + 1]))
    num = np.array([a[i] / gain for i in range(poles + 1)], np.float64)
    den = np.array([-b[i] for i in range(poles + 1)], np.float64)
    den[0] = 1.0
    return num, den


def _decode(data: bytes, rates: list, stereo_to_mono, max_samples) -> tuple:
    """(float32 samples, rate): the clip mixed to mono and brought down to the highest of ``rates`` (sorted) at or
    below its own rate (no ``rates``, its own rate), its first ``max_samples`` kept (0: all), as
    onnxruntime-extensions' ``AudioDecoder``."""
    max_samples = int(max_samples)
    if max_samples < 0:
        raise RequestError(f"AudioDecoder: max_samples must be >= 0, got {max_samples}")
    samples, rate = _read(data)
    if stereo_to_mono and samples.shape[1] > 1:
        if samples.shape[1] != 2:
            raise NotImplementedError(f"AudioDecoder: {samples.shape[1]} channels are not mixed here (2 are)")
        pcm = ((samples[:, 0] + samples[:, 1]) / np.float32(2.0)).astype(np.float32)
    else:
        pcm = np.ascontiguousarray(samples.reshape(-1), np.float32)
    if rates and rate < rates[0]:
        raise RequestError(f"AudioDecoder: only down-sampling supported; the audio's sample rate {rate} is below "
                           f"{rates[0]}")
    target = rate
    for r in rates:
        if r > rate:
            break
        target = r
        if r == rate:
            break
    if target != rate:
        num, den = _butterworth(0.5 * target / rate)
        pcm = _kaiser_resample(_lowpass(pcm, num, den), float(rate), float(target))
    if max_samples and pcm.shape[0] > max_samples:
        pcm = pcm[:max_samples]
    return pcm, int(target)


def decode_audio(data: bytes, target_sample_rate: int = 16000, stereo_to_mono: int = 1,
                 target_sample_rates=None, max_samples: int = 480000) -> np.ndarray:
    """``[1, samples]`` float32 at the target rate, at most ``max_samples`` of them (onnxruntime-extensions'
    default, 30 s at 16 kHz; 0 keeps all) (see the module docstring)."""
    rates = sorted(target_sample_rates) if target_sample_rates else [int(target_sample_rate)]
    return _decode(data, rates, stereo_to_mono, max_samples)[0].reshape(1, -1)


def decode_clip(data: bytes, stereo_to_mono: int = 1) -> tuple:
    """``(float32 samples, rate)``: the whole clip at its own rate (mixed to mono by default), for a processor
    that resamples it itself (LFM2-Audio's, ``pipeline/lfm2_audio.py``)."""
    return _decode(data, [], stereo_to_mono, 0)


@functools.lru_cache(maxsize=8)
def _hann(n: int) -> np.ndarray:
    """onnxruntime-extensions' periodic Hann window, ``sin(pi i / n)**2`` in float64 rounded to float32 (ONNX's
    ``HannWindow`` in ``ops/signal.py`` takes ``0.5 - 0.5 cos``, which rounds differently).  Built once per size,
    read-only."""
    w = np.array([math.sin(math.pi * i / n) ** 2 for i in range(n)], np.float32)
    w.flags.writeable = False
    return w


def stft_norm(pcm: np.ndarray, n_fft: int = 400, hop_length: int = 160, frame_length: int | None = None,
              **_ignored) -> np.ndarray:
    """``[1, n_fft / 2 + 1, frames]`` power spectrum (see the module docstring)."""
    if frame_length not in (None, n_fft):
        raise ValueError(f"STFTNorm: frame_length ({frame_length}) must equal n_fft ({n_fft})")
    x = np.pad(np.asarray(pcm, np.float32).reshape(-1), (n_fft // 2, n_fft // 2))
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop_length] * _hann(n_fft)
    spec = np.fft.rfft(frames.astype(np.float32), axis=1)
    power = (spec.real ** 2 + spec.imag ** 2).astype(np.float32)
    return np.ascontiguousarray(power.T)[None]


@functools.lru_cache(maxsize=8)
def _mel_filters(n_fft: int, n_mels: int, sr: int = 16000) -> np.ndarray:
    """onnxruntime-extensions' mel filter bank (Slaney's scale, not the HTK scale of ONNX's ``MelWeightMatrix``),
    in its float32 steps; built once per shape, read-only."""
    f32 = np.float32
    freq_bins = np.array([f32(i * sr) / f32(n_fft) for i in range(n_fft // 2 + 1)], f32)
    max_mel = f32(45.245640471924965)  # a float parameter there
    mel = np.array([f32(0.0) + f32(i) * (max_mel - f32(0.0)) / f32(n_mels + 1) for i in range(n_mels + 2)], f32)
    f_sp = f32(200.0 / 3.0)
    freqs = (f32(0.0) + f_sp * mel).astype(f32)
    min_log_hz = f32(1000.0)
    min_log_mel = (min_log_hz - f32(0.0)) / f_sp
    logstep = f32(math.log(6.4) / 27.0)
    for i in range(n_mels + 2):
        if mel[i] >= min_log_mel:  # C's exp of a float argument, in double, times the float, stored as float
            freqs[i] = f32(float(min_log_hz) * math.exp(float(f32(logstep * (mel[i] - min_log_mel)))))
    spacing = (freqs[1:] - freqs[:-1]).astype(f32)
    ramps = (freqs[:, None] - freq_bins[None, :]).astype(f32)
    fb = np.zeros((n_mels, n_fft // 2 + 1), f32)
    for i in range(n_mels):
        fb[i] = np.maximum(f32(0.0), np.minimum(-ramps[i] / spacing[i], ramps[i + 2] / spacing[i + 1]))
        fb[i] *= f32(2.0) / (freqs[i + 2] - freqs[i])
    fb.flags.writeable = False
    return fb


def log_mel(power: np.ndarray, n_mel: int = 80, n_fft: int = 400, hop_length: int = 160, chunk_size: int = 30,
            feature_first: int = 1, no_padding: int = 0) -> np.ndarray:
    """``[n_mel, chunk_size * 16000 / hop_length]`` Whisper log-mel features (see the module docstring)."""
    p = np.asarray(power, np.float32)[0]
    if p.shape[1] < 2:
        raise ValueError("LogMelSpectrum: the audio is too short (fewer than 2 frames)")
    spec = _mel_filters(n_fft, n_mel) @ p[:, :-1]
    logs = np.log10(np.maximum(spec, np.float32(1e-10))).astype(np.float32)
    floor = np.float32(logs.max() - np.float32(8.0))
    logs = ((np.maximum(logs, floor) + np.float32(4.0)) / np.float32(4.0)).astype(np.float32)
    if no_padding:
        return logs if feature_first else np.ascontiguousarray(logs.T)
    frames = 16000 * int(chunk_size) // int(hop_length)
    out = np.full((n_mel, frames), (floor + np.float32(4.0)) / np.float32(4.0), np.float32)
    k = min(logs.shape[1], frames)
    out[:, :k] = logs[:, :k]
    return out




# ---------------------------------------------------------------------------------------------------------------
# Phi-4-multimodal: AudioDecoderEx -> Phi4AudioEmbed (onnxruntime-extensions' SpeechLib features).

_DECODER_EX_KEYS = {"target_sample_rate", "target_sample_rates", "stereo_to_mono", "max_samples"}


def decode_audio_ex(data: bytes, **attrs) -> tuple:
    """onnxruntime-extensions' ``AudioDecoderEx`` (``AudioDecoder::ComputeNoOpt2``): ``(pcm [1, samples] float32,
    rate)``.  The clip is decoded and mixed as ``AudioDecoder`` (``decode_audio``) does, then brought down to the
    highest of ``target_sample_rates`` (default ``[target_sample_rate]``, 16000) at or below its own rate: an
    11.025 kHz clip to 8 kHz, 22.05 or 44.1 kHz to 16 kHz; a rate below all of them is refused, an empty list keeps
    the clip's rate.  At most ``max_samples`` (default 480000, 0 for no limit) samples at that rate are kept."""
    unknown = sorted(set(attrs) - _DECODER_EX_KEYS)
    if unknown:
        raise RequestError(f"AudioDecoderEx: unknown attribute(s) {unknown} (known: {sorted(_DECODER_EX_KEYS)})")
    rates = [int(attrs.get("target_sample_rate", 16000))]
    if "target_sample_rates" in attrs:  # read after target_sample_rate there (the attributes are sorted by name)
        rates = sorted(int(r) for r in attrs["target_sample_rates"])
    pcm, rate = _decode(data, rates, attrs.get("stereo_to_mono", 1), attrs.get("max_samples", 480000))
    return pcm.reshape(1, -1), rate


@functools.lru_cache(maxsize=8)
def _hamming(n: int) -> np.ndarray:
    """onnxruntime-extensions' symmetric Hamming window, ``0.08 + 0.92 sin(pi i / (n - 1))**2`` in float64 rounded
    to float32; built once per size, read-only."""
    w = np.array([0.08 + 0.92 * math.sin(math.pi * i / (n - 1)) ** 2 for i in range(n)], np.float32)
    w.flags.writeable = False
    return w


@functools.lru_cache(maxsize=8)
def _kiss_plan(n_fft: int) -> tuple:
    """dlib's ``kiss_fftr`` plan for a real FFT of ``n_fft`` points: the half-size complex FFT's factors (radix 4
    first, then 2, 3, 5, ...: ``kf_factor``) as ``[p0, m0, p1, m1, ...]``, the input order its recursion reads
    (digit reversal), its twiddles ``exp(-2 pi i k / (n_fft / 2))`` and the real FFT's super-twiddles
    ``exp(-i pi ((k + 1) / (n_fft / 2) + 1 / 2))``, each taken in float64 and rounded to float32.  Read-only."""
    if n_fft < 4 or n_fft % 2:
        raise RequestError(f"Phi4AudioEmbed: n_fft must be even and at least 4, got {n_fft}")
    nh = n_fft // 2
    factors, n, p, root = [], nh, 4, math.floor(math.sqrt(nh))
    while True:
        while n % p:
            p = 2 if p == 4 else 3 if p == 2 else p + 2
            if p > root:
                p = n
        n //= p
        factors += [p, n]
        if n <= 1:
            break
    order = np.empty(nh, np.int64)

    def read(out, start, stride, level):
        radix, m = factors[2 * level], factors[2 * level + 1]
        for j in range(radix):
            if m == 1:
                order[out + j] = start + j * stride
            else:
                read(out + j * m, start + j * stride, stride * radix, level + 1)

    read(0, 0, 1, 0)
    tw = [complex(math.cos(-2.0 * math.pi * k / nh), math.sin(-2.0 * math.pi * k / nh)) for k in range(nh)]
    sup = [-math.pi * ((k + 1) / nh + 0.5) for k in range(nh // 2)]
    plan = (np.array(factors, np.int64), order,
            np.array([t.real for t in tw], np.float32), np.array([t.imag for t in tw], np.float32),
            np.array([math.cos(a) for a in sup], np.float32), np.array([math.sin(a) for a in sup], np.float32))
    for a in plan:
        a.flags.writeable = False
    return plan


@njit(cache=True, nogil=True)
def _kiss_stage(re, im, base, fstride, m, p, twr, twi, sr, si):
    """One ``kf_bfly2/3/4/5/generic`` recombination (forward) of ``p`` length-``m`` DFTs at ``base``, in float32
    (each complex product ``(ac - bd, ad + bc)``, as C++'s ``complex<float>``); ``sr``/``si`` are scratch."""
    half = np.float32(0.5)
    if p == 2:
        for i in range(m):
            a, b = base + i, base + m + i
            wr, wi = twr[i * fstride], twi[i * fstride]
            tr = re[b] * wr - im[b] * wi
            ti = re[b] * wi + im[b] * wr
            re[b] = re[a] - tr
            im[b] = im[a] - ti
            re[a] += tr
            im[a] += ti
    elif p == 3:
        er = twi[fstride * m]
        for k in range(m):
            a, b, c = base + k, base + k + m, base + k + 2 * m
            w1r, w1i, w2r, w2i = twr[k * fstride], twi[k * fstride], twr[2 * k * fstride], twi[2 * k * fstride]
            s1r = re[b] * w1r - im[b] * w1i
            s1i = re[b] * w1i + im[b] * w1r
            s2r = re[c] * w2r - im[c] * w2i
            s2i = re[c] * w2i + im[c] * w2r
            s3r, s3i = s1r + s2r, s1i + s2i
            s0r, s0i = s1r - s2r, s1i - s2i
            re[b] = re[a] - half * s3r
            im[b] = im[a] - half * s3i
            s0r *= er
            s0i *= er
            re[a] += s3r
            im[a] += s3i
            re[c] = re[b] + s0i
            im[c] = im[b] - s0r
            re[b] -= s0i
            im[b] += s0r
    elif p == 4:
        for k in range(m):
            a, b, c, d = base + k, base + m + k, base + 2 * m + k, base + 3 * m + k
            w1r, w1i = twr[k * fstride], twi[k * fstride]
            w2r, w2i = twr[2 * k * fstride], twi[2 * k * fstride]
            w3r, w3i = twr[3 * k * fstride], twi[3 * k * fstride]
            s0r = re[b] * w1r - im[b] * w1i
            s0i = re[b] * w1i + im[b] * w1r
            s1r = re[c] * w2r - im[c] * w2i
            s1i = re[c] * w2i + im[c] * w2r
            s2r = re[d] * w3r - im[d] * w3i
            s2i = re[d] * w3i + im[d] * w3r
            s5r, s5i = re[a] - s1r, im[a] - s1i
            re[a] += s1r
            im[a] += s1i
            s3r, s3i = s0r + s2r, s0i + s2i
            s4r, s4i = s0r - s2r, s0i - s2i
            re[c] = re[a] - s3r
            im[c] = im[a] - s3i
            re[a] += s3r
            im[a] += s3i
            re[b] = s5r + s4i
            im[b] = s5i - s4r
            re[d] = s5r - s4i
            im[d] = s5i + s4r
    elif p == 5:
        yar, yai = twr[fstride * m], twi[fstride * m]
        ybr, ybi = twr[2 * fstride * m], twi[2 * fstride * m]
        for u in range(m):
            f0, f1, f2, f3, f4 = base + u, base + m + u, base + 2 * m + u, base + 3 * m + u, base + 4 * m + u
            s0r, s0i = re[f0], im[f0]
            w = u * fstride
            s1r = re[f1] * twr[w] - im[f1] * twi[w]
            s1i = re[f1] * twi[w] + im[f1] * twr[w]
            s2r = re[f2] * twr[2 * w] - im[f2] * twi[2 * w]
            s2i = re[f2] * twi[2 * w] + im[f2] * twr[2 * w]
            s3r = re[f3] * twr[3 * w] - im[f3] * twi[3 * w]
            s3i = re[f3] * twi[3 * w] + im[f3] * twr[3 * w]
            s4r = re[f4] * twr[4 * w] - im[f4] * twi[4 * w]
            s4i = re[f4] * twi[4 * w] + im[f4] * twr[4 * w]
            s7r, s7i = s1r + s4r, s1i + s4i
            s10r, s10i = s1r - s4r, s1i - s4i
            s8r, s8i = s2r + s3r, s2i + s3i
            s9r, s9i = s2r - s3r, s2i - s3i
            re[f0] += s7r + s8r
            im[f0] += s7i + s8i
            s5r = s0r + s7r * yar + s8r * ybr
            s5i = s0i + s7i * yar + s8i * ybr
            s6r = s10i * yai + s9i * ybi
            s6i = -s10r * yai - s9r * ybi
            re[f1], im[f1] = s5r - s6r, s5i - s6i
            re[f4], im[f4] = s5r + s6r, s5i + s6i
            s11r = s0r + s7r * ybr + s8r * yar
            s11i = s0i + s7i * ybr + s8i * yar
            s12r = -s10i * ybi + s9i * yai
            s12i = s10r * ybi - s9r * yai
            re[f2], im[f2] = s11r + s12r, s11i + s12i
            re[f3], im[f3] = s11r - s12r, s11i - s12i
    else:
        n = twr.shape[0]
        for u in range(m):
            for q in range(p):
                sr[q] = re[base + u + q * m]
                si[q] = im[base + u + q * m]
            for q1 in range(p):
                k = u + q1 * m
                accr, acci = sr[0], si[0]
                idx = 0
                for q in range(1, p):
                    idx += fstride * k
                    if idx >= n:
                        idx -= n
                    accr += sr[q] * twr[idx] - si[q] * twi[idx]
                    acci += sr[q] * twi[idx] + si[q] * twr[idx]
                re[base + k] = accr
                im[base + k] = acci


@njit(cache=True, nogil=True)
def _kiss_power(frames, factors, order, twr, twi, supr, supi):
    """``[frames, n_fft / 2 + 1]`` float32 ``|fftr|**2`` of each float32 row (zero-padded to ``n_fft``), as dlib's
    ``kiss_fftr`` computes it in float32: the rows read as ``n_fft / 2`` complex points (even samples real, odd
    imaginary), their complex FFT by the plan's stages (deepest first), the two real spectra split with the
    super-twiddles; then ``std::norm``, ``re * re + im * im``."""
    nh = order.shape[0]
    n_fft = 2 * nh
    out = np.zeros((frames.shape[0], nh + 1), np.float32)
    re = np.empty(nh, np.float32)
    im = np.empty(nh, np.float32)
    width = 1
    for j in range(0, factors.shape[0], 2):
        width = max(width, factors[j])
    sr = np.empty(width, np.float32)
    si = np.empty(width, np.float32)
    half = np.float32(0.5)
    length = min(frames.shape[1], n_fft)
    levels = factors.shape[0] // 2
    for f in range(frames.shape[0]):
        for j in range(nh):
            t = 2 * order[j]
            re[j] = frames[f, t] if t < length else np.float32(0.0)
            im[j] = frames[f, t + 1] if t + 1 < length else np.float32(0.0)
        for level in range(levels - 1, -1, -1):
            fstride = 1
            for j in range(level):
                fstride *= factors[2 * j]
            p, m = factors[2 * level], factors[2 * level + 1]
            for b in range(fstride):
                _kiss_stage(re, im, b * p * m, fstride, m, p, twr, twi, sr, si)
        dc, ny = re[0] + im[0], re[0] - im[0]
        out[f, 0] = dc * dc
        out[f, nh] = ny * ny
        for k in range(1, nh // 2 + 1):
            pr, pi = re[k], im[k]
            nr, ni = re[nh - k], -im[nh - k]
            f1r, f1i = pr + nr, pi + ni
            f2r, f2i = pr - nr, pi - ni
            wr, wi = supr[k - 1], supi[k - 1]
            tr = f2r * wr - f2i * wi
            ti = f2r * wi + f2i * wr
            ar, ai = half * (f1r + tr), half * (f1i + ti)
            br, bi = half * (f1r - tr), -(half * (f1i - ti))
            out[f, k] = ar * ar + ai * ai
            out[f, nh - k] = br * br + bi * bi
    return out


def speechlib_stft_norm(pcm: np.ndarray, n_fft: int, frame_length: int, hop_length: int,
                        window: np.ndarray) -> np.ndarray:
    """``[frames, n_fft / 2 + 1]`` float32 power spectrum, onnxruntime-extensions'
    ``SpeechFeatures::SpeechLibSTFTNorm``: ``(len - frame_length) // hop_length + 1`` frames (no padding, the
    remainder dropped); in each frame, pre-emphasis ``(x[i] - 0.97 x[i-1]) * 32768`` with ``x[-1]`` taken as
    ``x[0]``, in float32; the window; ``|fftr|**2`` of the frame zero-padded (or cut) to ``n_fft``, by dlib's
    float32 kiss FFT reproduced step by step (``_kiss_power``)."""
    x = np.asarray(pcm, np.float32).reshape(-1)
    frames = np.lib.stride_tricks.sliding_window_view(x, frame_length)[::hop_length]
    prev = np.empty_like(frames)
    prev[:, 1:] = frames[:, :-1]
    prev[:, 0] = frames[:, 0]
    y = (frames - np.float32(0.97) * prev) * np.float32(32768.0)
    y = np.ascontiguousarray(y * window, np.float32)
    return _kiss_power(y, *_kiss_plan(int(n_fft)))


@njit(cache=True, nogil=True)
def _logf(x):
    """float32 natural logarithm of each float32 value, the C library's ``logf`` (which C++'s ``std::log(float)``
    calls there; numpy's float32 ``log`` differs from it in the last bit)."""
    out = np.empty_like(x)
    for i in range(x.size):
        out.flat[i] = math.log(x.flat[i])
    return out


@functools.lru_cache(maxsize=8)
def _speechlib_mel(n_fft: int, n_mels: int, sr: int = 16000, fmin: float = 0.0,
                   fmax: float = 7689.0) -> np.ndarray:
    """onnxruntime-extensions' ``SpeechLibLogMel::MelFilterBank`` (SpeechLib's ``FbankFC``): ``[n_mels, n_fft / 2 +
    1]`` triangles on the ``1127 ln(1 + f / 700)`` scale from ``fmin`` to ``fmax`` (7689 Hz there), over FFT bins
    ``f2bin(fmin) + 1`` .. ``f2bin(fmax) - 1``, in its float32 steps with ``logf`` (a triangle's foot is a small
    difference of two mel values, so a last-bit change of one moves a weight, and a feature, visibly); built once
    per shape, read-only."""
    f32 = np.float32

    def mel(f):  # f: float32 array
        return f32(1127.0) * _logf((f32(1.0) + f / f32(700.0)).astype(f32))

    def f2bin(f):
        return int(f32(f32(f32(f) * f32(n_fft)) / f32(sr) + f32(0.5)))

    klo = f2bin(fmin) + 1
    khi = max(f2bin(fmax), klo)
    mlo, mhi = mel(np.array([fmin, fmax], f32))
    step = f32((mhi - mlo) / f32(n_mels + 1))
    centers = (mlo + np.arange(n_mels + 2, dtype=f32) * step).astype(f32)
    width = n_fft // 2 + 1
    bins = np.arange(klo, min(khi, width))
    mbin = mel((bins.astype(f32) * f32(sr)).astype(f32) / f32(n_fft))
    fb = np.zeros((n_mels, width), f32)
    for m in range(n_mels):
        inside = (mbin > centers[m]) & (mbin < centers[m + 2])
        weight = f32(1.0) - np.abs(centers[m + 1] - mbin) / step
        fb[m, bins[inside]] = np.maximum(f32(0.0), weight[inside])
    fb.flags.writeable = False
    return fb


@njit(cache=True, nogil=True)
def _log_mel_rows(power, fb, keep):
    """``[frames, n_mel]`` ``logf(max(1, sum_j fb[m, j] * power[t, j]))`` over bins ``j < keep``, accumulated in
    float32 in bin order, as dlib's float32 matrix product does it (bins of zero weight add an exact zero, so each
    row's sum runs over its triangle only)."""
    n_mel = fb.shape[0]
    lo = np.zeros(n_mel, np.int64)
    hi = np.zeros(n_mel, np.int64)
    for m in range(n_mel):
        first, last = keep, 0
        for j in range(keep):
            if fb[m, j] != 0.0:
                first = min(first, j)
                last = j + 1
        lo[m], hi[m] = first, last
    out = np.empty((power.shape[0], n_mel), np.float32)
    one = np.float32(1.0)
    for t in range(power.shape[0]):
        for m in range(n_mel):
            acc = np.float32(0.0)
            for j in range(lo[m], hi[m]):
                acc += fb[m, j] * power[t, j]
            out[t, m] = math.log(max(acc, one))
    return out


def speechlib_log_mel(power: np.ndarray, n_fft: int, n_mel: int) -> np.ndarray:
    """``[frames, n_mel]`` float32, onnxruntime-extensions' ``SpeechLibLogMel::Compute``: ``ln(max(1, mel @
    power))`` with the filter bank of an ``n_fft`` FFT at 16 kHz.  A narrower spectrum (an 8 kHz clip's) is laid
    into that bank's bins as there: its first ``bank_bins - bins - 1`` bins kept, the rest zero (so an 8 kHz clip's
    two top bins, 3968 and 4000 Hz, are dropped).  The product in float32 in dlib's order, ``ln`` the C library's
    ``logf``."""
    fb = _speechlib_mel(int(n_fft), int(n_mel))
    bins, bank_bins = power.shape[1], fb.shape[1]
    keep, rows = (bank_bins - bins - 1, 2 * bins - 1) if bank_bins > bins else (bins, bins)
    if rows != bank_bins:
        raise RequestError(f"Phi4AudioEmbed: a {bins}-bin spectrum does not fit the log-mel bank of n_fft {n_fft} "
                           f"({bank_bins} bins)")
    return _log_mel_rows(np.ascontiguousarray(power, np.float32), fb, keep)


_STFT_KEYS = {"n_fft", "hop_length", "frame_length", "win_fn", "hann_win", "_comment"}
_LOGMEL_KEYS = {"n_fft", "hop_length", "n_mel", "chunk_size", "feature_first", "no_padding"}
_EMBED_GROUPS = {"stft_normal/": _STFT_KEYS, "logmel/": _LOGMEL_KEYS, "stft_normal_8k/": _STFT_KEYS,
                 "logmel_8k/": _LOGMEL_KEYS}


def _embed_config(attrs: dict) -> tuple:
    """Phi4AudioEmbed's attributes: ({group: {key: value}}, audio_compression_rate); unknown ones are an error."""
    groups = {g: {} for g in _EMBED_GROUPS}
    rate, unknown = 8, []
    for key, value in attrs.items():
        group = next((g for g in sorted(_EMBED_GROUPS, key=len, reverse=True) if key.startswith(g)), None)
        if group is not None and key[len(group):] in _EMBED_GROUPS[group]:
            groups[group][key[len(group):]] = value
        elif key == "audio_compression_rate":
            rate = int(value)
        elif key != "qformer_compression_rate":  # read there, not used
            unknown.append(key)
    if unknown:
        raise RequestError(f"Phi4AudioEmbed: unknown attribute(s) {sorted(unknown)}")
    for g, keys in (("stft_normal", ("n_fft", "frame_length", "hop_length")), ("logmel", ("n_fft", "n_mel"))):
        for suffix in ("/", "_8k/"):
            missing = [g + suffix + k for k in keys if k not in groups[g + suffix]]
            if missing:
                raise RequestError(f"Phi4AudioEmbed: missing attribute(s) {missing}")
        for suffix in ("/", "_8k/"):
            win = groups["stft_normal" + suffix].get("win_fn", "hann") if g == "stft_normal" else "hann"
            if win not in ("hann", "hamming"):
                raise RequestError(f"Phi4AudioEmbed: stft_normal{suffix}win_fn must be hann or hamming, got {win!r}")
    if rate < 1:
        raise RequestError(f"Phi4AudioEmbed: audio_compression_rate must be positive, got {rate}")
    return groups, rate


def phi4_audio_embed(decoded: tuple, **attrs) -> tuple:
    """onnxruntime-extensions' ``Phi4AudioEmbed`` for one clip ``(pcm [1, samples], rate)`` (``decode_audio_ex``'s):
    ``(audio_embeds float32 [frames, n_mel], audio_attention_mask bool [frames] (all true), audio_size)``.  The
    ``stft_normal/`` and ``logmel/`` attributes serve a 16 kHz clip, the ``_8k`` ones an 8 kHz clip (another rate
    is refused): ``speechlib_stft_norm`` under the configured window (``win_fn`` hamming or hann, or an explicit
    ``hann_win``), then ``speechlib_log_mel``; ``audio_size`` is ``ceil(frames / audio_compression_rate)``.  A clip
    shorter than one frame is refused (onnxruntime-extensions reads past its end, or fails)."""
    groups, compression = _embed_config(attrs)
    pcm, rate = decoded
    pcm = np.asarray(pcm, np.float32).reshape(-1)
    if rate not in (8000, 16000):
        raise RequestError(f"Phi4AudioEmbed: Only 8k and 16k Hz target sampling rate is supported (the clip is at "
                           f"{rate} Hz).")
    suffix = "_8k/" if rate == 8000 else "/"
    stft, mel = groups["stft_normal" + suffix], groups["logmel" + suffix]
    n_fft, frame_length, hop = int(stft["n_fft"]), int(stft["frame_length"]), int(stft["hop_length"])
    if hop < 1 or frame_length < 2 or n_fft < 2:
        raise RequestError(f"Phi4AudioEmbed: stft_normal{suffix}: n_fft {n_fft}, frame_length {frame_length} and "
                           f"hop_length {hop} must be positive (frame_length and n_fft at least 2)")
    if pcm.shape[0] == 0:
        raise RequestError("Phi4AudioEmbed: the audio clip is empty")
    if pcm.shape[0] < frame_length:
        raise RequestError(f"Phi4AudioEmbed: the audio clip is too short: {pcm.shape[0]} samples at {rate} Hz, "
                           f"fewer than one {frame_length}-sample frame")
    if "hann_win" in stft:
        window = np.asarray(stft["hann_win"], np.float64).astype(np.float32)
        if window.shape != (frame_length,):
            raise RequestError(f"Phi4AudioEmbed: stft_normal{suffix}hann_win has {window.size} values; "
                               f"frame_length is {frame_length}")
    else:
        window = _hamming(frame_length) if stft.get("win_fn", "hann") == "hamming" else _hann(frame_length)
    power = speechlib_stft_norm(pcm, n_fft, frame_length, hop, window)
    embeds = speechlib_log_mel(power, int(mel["n_fft"]), int(mel["n_mel"]))
    frames = embeds.shape[0]
    size = int(math.ceil(np.float32(frames) / np.float32(compression)))
    return embeds, np.ones(frames, np.bool_), size


def phi4_audio_stack(results: list) -> tuple:
    """Clips' ``phi4_audio_embed`` results stacked as onnxruntime-extensions' ``StackTensors`` does: ``(audio_embeds
    float32 [n, max_frames, n_mel], audio_attention_mask bool [n, max_frames], audio_sizes int64 [n])``, each clip's
    features padded with zeros and its mask with false to the longest clip's frames."""
    if not results:
        raise RequestError("No audios provided to process.")
    longest = max(r[0].shape[0] for r in results)
    n_mel = results[0][0].shape[1]
    embeds = np.zeros((len(results), longest, n_mel), np.float32)
    mask = np.zeros((len(results), longest), np.bool_)
    for i, (e, m, _) in enumerate(results):
        embeds[i, :e.shape[0]] = e
        mask[i, :m.shape[0]] = m
    return embeds, mask, np.array([r[2] for r in results], np.int64)


# ---------------------------------------------------------------------------------------------------------------
# Gemma 4: AudioDecoder -> Gemma4LogMel (onnxruntime-extensions' ``shared/api/gemma4_audio_features.hpp``).

# name: (default, kind); the kind is the JSON type onnxruntime-extensions reads the attribute as
_GEMMA4_ATTRS = {"feature_size": (128, "int"), "sampling_rate": (16000, "int"), "frame_length_ms": (20.0, "float"),
                 "hop_length_ms": (10.0, "float"), "min_frequency": (0.0, "float"),
                 "max_frequency": (8000.0, "float"), "preemphasis": (0.0, "float"),
                 "preemphasis_htk_flavor": (1, "int"), "fft_overdrive": (0, "int"), "mel_floor": (0.001, "float"),
                 "per_bin_mean": (None, "list"), "per_bin_stddev": (None, "list")}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# kind: (test, what it asks for).  onnxruntime-extensions reads a JSON integer as int64, a number with a fraction
# part or exponent as double, a non-empty list by its first element's type; an attribute of the other type fails.
_GEMMA4_KINDS = {"int": (_is_int, "integer"),
                 "float": (lambda v: isinstance(v, float), "number written with a fraction part (e.g. 20.0)"),
                 "list": (lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and isinstance(v[0], float)
                          and all(isinstance(x, float) or _is_int(x) for x in v),
                          "non-empty list of numbers, the first written with a fraction part")}


def _c_round(x: float) -> int:
    """C's ``std::round``: halves away from zero (Python's ``round`` takes them to even)."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def _gemma4_config(attrs: dict) -> dict:
    """Gemma4LogMel's attributes over its defaults, with the derived sizes: ``frame_length`` and ``hop_length`` in
    samples (``std::round(sampling_rate * ms / 1000)``) and ``n_fft``, the smallest power of two at or above the
    frame, doubled under ``fft_overdrive``.  An unknown attribute, one of another JSON type than
    onnxruntime-extensions reads (``20`` where it reads a double fails there, as does ``128.0`` for an integer, a
    boolean, an empty list or one whose first value is an integer), a ``per_bin_mean``/``per_bin_stddev`` not of
    ``feature_size`` values, or a frame or hop under one sample (onnxruntime-genai dies on a zero hop) is a
    ``RequestError``."""
    unknown = sorted(set(attrs) - set(_GEMMA4_ATTRS))
    if unknown:
        raise RequestError(f"Gemma4LogMel: unknown attribute(s) {unknown} (known: {sorted(_GEMMA4_ATTRS)})")
    cfg = {}
    for key, (default, kind) in _GEMMA4_ATTRS.items():
        value = attrs.get(key, default)
        if key in attrs and not _GEMMA4_KINDS[kind][0](value):
            raise RequestError(f"Gemma4LogMel: attribute {key} must be a JSON {_GEMMA4_KINDS[kind][1]}, "
                               f"got {value!r:.60}")
        cfg[key] = value
    n_mel = cfg["feature_size"]
    for key in ("per_bin_mean", "per_bin_stddev"):
        if cfg[key] is not None and len(cfg[key]) != n_mel:
            raise RequestError(f"Gemma4LogMel: {key} length ({len(cfg[key])}) must equal feature_size ({n_mel})")
    cfg["frame_length"] = _c_round(cfg["sampling_rate"] * cfg["frame_length_ms"] / 1000.0)
    cfg["hop_length"] = _c_round(cfg["sampling_rate"] * cfg["hop_length_ms"] / 1000.0)
    if n_mel < 1 or cfg["sampling_rate"] < 1 or cfg["frame_length"] < 1 or cfg["hop_length"] < 1:
        raise RequestError(f"Gemma4LogMel: feature_size ({n_mel}), sampling_rate ({cfg['sampling_rate']}) and the "
                           f"frame ({cfg['frame_length']}) and hop ({cfg['hop_length']}) lengths in samples must be "
                           f"positive")
    n_fft = 1
    while n_fft < cfg["frame_length"]:
        n_fft <<= 1
    cfg["n_fft"] = n_fft << 1 if cfg["fft_overdrive"] else n_fft
    return cfg


@functools.lru_cache(maxsize=8)
def _htk_mel_bank(n_bins: int, n_mels: int, sr: int, fmin: float, fmax: float) -> np.ndarray:
    """``[n_bins, n_mels]`` float32, onnxruntime-extensions' ``Gemma4LogMel::MelFilterBank``: ``n_mels + 2`` points
    evenly spaced on the HTK scale ``2595 log10(1 + f / 700)`` from ``fmin`` to ``fmax``, taken back to Hz
    (``700 (10**(m / 2595) - 1)``) and to fractional FFT bins ``f (n_bins - 1) 2 / sr``; filter ``m`` rises over
    ``(left, center]`` and falls over ``(center, right)``.  All in float64, in its operation order, through the C
    library's ``log10`` and ``pow`` (Python's ``math`` calls them), each weight rounded to float32 once; built once
    per shape, read-only."""
    mel_lo = 2595.0 * math.log10(1.0 + fmin / 700.0)
    mel_hi = 2595.0 * math.log10(1.0 + fmax / 700.0)
    points = n_mels + 2
    hz = [700.0 * (math.pow(10.0, (mel_lo + (mel_hi - mel_lo) * i / (points - 1)) / 2595.0) - 1.0)
          for i in range(points)]
    edge = [f * (n_bins - 1) * 2.0 / sr for f in hz]
    fb = np.zeros((n_bins, n_mels), np.float32)
    for m in range(n_mels):
        left, center, right = edge[m], edge[m + 1], edge[m + 2]
        for k in range(n_bins):
            if left < k <= center and center > left:
                fb[k, m] = (k - left) / (center - left)
            elif center < k < right and right > center:
                fb[k, m] = (right - k) / (right - center)
    fb.flags.writeable = False
    return fb


@functools.lru_cache(maxsize=8)
def _radix2_plan(n_fft: int) -> tuple:
    """The radix-2 FFT's bit-reversal swaps (pairs ``i < j``, flattened, in the order its loop makes them) and
    each stage's root ``exp(-2 pi i / len)`` for ``len = 2, 4, ..., n_fft`` as ``(cos, sin)`` of ``-2 pi / len``
    (the C library's, in float64); read-only."""
    swaps, j = [], 0
    for i in range(1, n_fft):
        bit = n_fft >> 1
        while j & bit:
            j ^= bit
            bit >>= 1
        j ^= bit
        if i < j:
            swaps += [i, j]
    roots, length = [], 2
    while length <= n_fft:
        ang = -2.0 * math.pi / length
        roots.append((math.cos(ang), math.sin(ang)))
        length <<= 1
    plan = np.array(swaps, np.int64), np.array(roots, np.float64).reshape(-1, 2)
    for a in plan:
        a.flags.writeable = False
    return plan


@njit(cache=True, nogil=True)
def _gemma4_rows(padded, n_frames, frame_length, hop, window, preemphasis, htk, n_fft, swaps, roots, bank, lo, hi,
                 floor, out):
    """Each frame's ``logf(float32(sum_k |X_k| bank[k, m]) + floor)`` into ``out`` ``[n_frames, n_mel]``, as
    ``Gemma4LogMel::Compute`` does it: the frame's ``frame_length`` samples at ``t * hop`` of ``padded`` (with
    pre-emphasis when ``preemphasis > 0``: the HTK flavour ``x[0] (1 - p)``, ``x[i] - p x[i-1]``, else ``x[i+1] - p
    x[i]`` over the unfolded ``frame_length + 1`` samples), times the window, in float32; zero-padded to ``n_fft``;
    its ``RealFFTMagnitude``: an in-place radix-2 decimation-in-time FFT in complex float64 (bit-reversal swaps,
    then butterflies whose twiddle is the stage root raised by repeated complex multiplication, ``w *= wlen``,
    each product ``(ac - bd, ad + bc)``), ``|X_k|`` as ``hypot`` rounded to float32; the mel sum in float64 in bin
    order (over each filter's nonzero bins ``lo[m]..hi[m]``: the others add exact zeros).  Buffers are allocated
    once, outside the frame loop."""
    n_mel = bank.shape[1]
    n_bins = n_fft // 2 + 1
    re = np.empty(n_fft, np.float64)
    im = np.empty(n_fft, np.float64)
    frame = np.empty(frame_length, np.float32)
    mag = np.empty(n_bins, np.float32)
    one = np.float32(1.0)
    for t in range(n_frames):
        base = t * hop
        if preemphasis > 0.0:
            if htk:
                frame[0] = padded[base] * (one - preemphasis)
                for i in range(1, frame_length):
                    frame[i] = padded[base + i] - preemphasis * padded[base + i - 1]
            else:
                for i in range(frame_length):
                    frame[i] = padded[base + i + 1] - preemphasis * padded[base + i]
        else:
            for i in range(frame_length):
                frame[i] = padded[base + i]
        for i in range(n_fft):
            re[i] = np.float64(frame[i] * window[i]) if i < frame_length else 0.0
            im[i] = 0.0
        for s in range(0, swaps.shape[0], 2):
            a, b = swaps[s], swaps[s + 1]
            re[a], re[b] = re[b], re[a]
            im[a], im[b] = im[b], im[a]
        length, stage = 2, 0
        while length <= n_fft:
            lr, li = roots[stage, 0], roots[stage, 1]
            half = length // 2
            for i in range(0, n_fft, length):
                wr, wi = 1.0, 0.0
                for j in range(half):
                    a, b = i + j, i + j + half
                    ur, ui = re[a], im[a]
                    vr = re[b] * wr - im[b] * wi
                    vi = re[b] * wi + im[b] * wr
                    re[a], im[a] = ur + vr, ui + vi
                    re[b], im[b] = ur - vr, ui - vi
                    wr, wi = wr * lr - wi * li, wr * li + wi * lr
            length <<= 1
            stage += 1
        for k in range(n_bins):
            mag[k] = np.float32(math.hypot(re[k], im[k]))
        for m in range(n_mel):
            acc = 0.0
            for k in range(lo[m], hi[m]):
                acc += np.float64(mag[k]) * np.float64(bank[k, m])
            out[t, m] = math.log(np.float32(acc) + floor)


def gemma4_log_mel(decoded, **attrs) -> tuple:
    """onnxruntime-extensions' ``Gemma4LogMel`` (Gemma 4's USM-style log-mel features) for one clip, ``pcm [1,
    samples]`` float32 at ``sampling_rate`` (``decode_audio``'s): ``(audio_embeds float32 [frames, feature_size],
    audio_attention_mask bool [frames])``.

    The clip is padded with ``frame_length / 2`` zeros on the left only (semicausal), cut into ``(samples +
    frame_length / 2 - frame_length - 1) // hop_length + 1`` unfolded frames of ``frame_length + 1`` samples (20 ms
    + 1 and 10 ms at 16 kHz: 321 and 160), each run through ``_gemma4_rows`` under the periodic Hann window
    (``_hann``) and the HTK mel bank (``_htk_mel_bank``), ``ln(mel + mel_floor)`` by the C library's ``logf``.
    A frame whose last sample is padding would be zeroed and masked false (none is: the padding is on the left);
    then ``per_bin_mean`` is subtracted and ``per_bin_stddev`` (where not zero) divides, in float32.

    Rounding: the same float32 and float64 steps in the same order, the same C library's ``log10``/``pow``/``cos``/
    ``sin``/``hypot``/``logf``; only a compiler's contraction of a product and a sum into one fused multiply-add
    there (not seen: the features came out bit-equal to onnxruntime-genai 0.18's) could round differently.

    A clip of fewer than ``frame_length / 2 + 1`` samples gives no frame: refused here (onnxruntime-extensions
    returns an empty tensor, and onnxruntime-genai 0.18's processor dies on it with a floating-point exception)."""
    cfg = _gemma4_config(attrs)
    if isinstance(decoded, tuple):
        raise RequestError("Gemma4LogMel: expected AudioDecoder's (1, num_samples) samples, got a tuple "
                           "(AudioDecoderEx's (samples, rate)?)")
    pcm = np.asarray(decoded, np.float32)
    if pcm.ndim != 2 or pcm.shape[0] != 1:
        raise RequestError(f"Gemma4LogMel: expected (1, num_samples) float input, got shape {pcm.shape}")
    pcm = pcm[0]
    frame_length, hop, n_fft = cfg["frame_length"], cfg["hop_length"], cfg["n_fft"]
    pad = frame_length // 2
    padded = np.zeros(pcm.shape[0] + pad, np.float32)
    padded[pad:] = pcm
    if padded.shape[0] < frame_length + 1:
        raise RequestError(f"Gemma4LogMel: the audio clip is too short: {pcm.shape[0]} samples, fewer than the "
                           f"{frame_length + 1 - pad} one frame needs (onnxruntime-genai fails on it)")
    n_frames = (padded.shape[0] - frame_length - 1) // hop + 1
    n_mel = int(cfg["feature_size"])
    bank = _htk_mel_bank(n_fft // 2 + 1, n_mel, int(cfg["sampling_rate"]), float(cfg["min_frequency"]),
                         float(cfg["max_frequency"]))
    nonzero = bank != 0
    any_bin = nonzero.any(axis=0)
    lo = np.where(any_bin, nonzero.argmax(axis=0), 0).astype(np.int64)
    hi = np.where(any_bin, bank.shape[0] - nonzero[::-1].argmax(axis=0), 0).astype(np.int64)
    out = np.empty((n_frames, n_mel), np.float32)
    _gemma4_rows(padded, n_frames, frame_length, hop, _hann(frame_length), np.float32(cfg["preemphasis"]),
                 bool(cfg["preemphasis_htk_flavor"]), n_fft, *_radix2_plan(n_fft), bank, lo, hi,
                 np.float32(cfg["mel_floor"]), out)
    ends = np.arange(n_frames) * hop + frame_length  # each unfolded frame's last sample
    mask = (ends < padded.shape[0]) & (ends >= pad)
    out[~mask] = 0.0
    if cfg["per_bin_mean"] is not None:
        out -= np.asarray(cfg["per_bin_mean"], np.float64).astype(np.float32)
    if cfg["per_bin_stddev"] is not None:
        std = np.asarray(cfg["per_bin_stddev"], np.float64).astype(np.float32)
        out[:, std != 0] /= std[std != 0]
    return out, mask


def gemma4_audio_sizes(frames: int) -> int:
    """onnxruntime-genai's ``audio_sizes`` for a Gemma 4 clip of ``frames`` feature frames: the speech encoder's two
    stride-2 convolutions, ``(t - 1) / 2 + 1`` twice, in C's truncating integer division."""
    t = int(frames)
    for _ in range(2):
        t = int((t - 1) / 2) + 1
    return t


AUDIO_STEPS = {"AudioDecoder": decode_audio, "STFTNorm": stft_norm, "LogMelSpectrum": log_mel,
               "AudioDecoderEx": decode_audio_ex, "Phi4AudioEmbed": phi4_audio_embed,
               "Gemma4LogMel": gemma4_log_mel}
