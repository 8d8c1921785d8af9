"""Audio for onnxruntime-genai's speech processors: ``Audios`` and the Whisper feature chain, as
onnxruntime-extensions computes it.

``Audios.open(*paths)`` / ``Audios.open_bytes(*blobs)`` hold encoded audio.  An ``audio_processor_config.json``
lists the steps, each a function here:

- ``AudioDecoder`` (``target_sample_rate`` 16000, ``stereo_to_mono`` 1): WAV (16-bit PCM, read by the standard
  library) or, when the ``soundfile`` package is installed, FLAC, MP3 and what else libsndfile reads; samples as
  float32 ``x / 32768``; two channels averaged; a higher rate brought down as onnxruntime-extensions does it
  (a 4-pole Butterworth low-pass at half the target rate, in float64, then Kaiser-windowed sinc interpolation,
  beta 6), a lower one refused;
- ``STFTNorm`` (``n_fft``, ``hop_length``): the power spectrum ``|rfft|**2`` of frames of ``n_fft`` samples every
  ``hop_length``, under a periodic Hann window, the signal zero-padded by ``n_fft / 2`` at both ends;
- ``LogMelSpectrum`` (``n_mel``, ``chunk_size`` seconds): Whisper's mel filters (Slaney scale, as
  onnxruntime-extensions builds them), the last frame dropped, ``log10`` of at least 1e-10, floored 8 below the
  maximum, ``(x + 4) / 4``; padded with the floor's value to ``chunk_size * 100`` frames (truncated past it).

Known difference: MP3 decoders differ (onnxruntime-extensions uses dr_mp3, libsndfile mpg123), so MP3 features
differ slightly; WAV and FLAC are lossless and give onnxruntime-genai's samples.  The FFT is numpy's (float64
internally), onnxruntime-extensions' dlib's in float32: features agree within about 1e-5.
"""
from __future__ import annotations

import functools
import io
import math
import wave

import numpy as np
from numba import njit

from .multimodal import Blobs

__all__ = ["Audios", "decode_audio", "stft_norm", "log_mel", "AUDIO_STEPS"]


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
    try:
        import soundfile
    except ImportError:
        raise NotImplementedError("AudioDecoder: this audio is not WAV; FLAC, MP3 and other formats need the "
                                  "soundfile package (pip install soundfile)") from None
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


def decode_audio(data: bytes, target_sample_rate: int = 16000, stereo_to_mono: int = 1,
                 target_sample_rates=None) -> np.ndarray:
    """``[1, samples]`` float32 at the target rate (see the module docstring)."""
    samples, rate = _read(data)
    if stereo_to_mono and samples.shape[1] > 1:
        if samples.shape[1] != 2:
            raise NotImplementedError(f"AudioDecoder: {samples.shape[1]} channels are not mixed here (2 are)")
        pcm = ((samples[:, 0] + samples[:, 1]) / np.float32(2.0)).astype(np.float32)
    else:
        pcm = np.ascontiguousarray(samples.reshape(-1), np.float32)
    rates = sorted(target_sample_rates) if target_sample_rates else [int(target_sample_rate)]
    if rate < rates[0]:
        raise ValueError(f"AudioDecoder: the audio's sample rate {rate} is below {rates[0]}")
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
    return pcm.reshape(1, -1)


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


AUDIO_STEPS = {"AudioDecoder": decode_audio, "STFTNorm": stft_norm, "LogMelSpectrum": log_mel}
