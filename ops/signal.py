"""Signal ops: DFT (opset 17 and 20), STFT, Hann/Hamming/Blackman windows, MelWeightMatrix.

Every transform runs through one kernel, ``_dft_kernel``, on a canonical
float64 tensor (outer, length, inner, 1 or 2 parts), so it compiles once:
signals whose length is a power of two take an in-place radix-2 FFT, other
lengths a direct DFT over a precomputed twiddle table.  The input is zero
padded or truncated to ``dft_length``.  A one-sided inverse (irfft) rebuilds
the Hermitian spectrum first and emits a real signal (last dim 1).  Results
are cast back to the input's float dtype.  The window and mel generators are
O(size) and stay in numpy.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from runtime.dtypes import np_dtype
from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from ._common import lowp
from .registry import op

__all__ = ["DFT_17", "DFT_20", "STFT", "HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"]

F64 = np.dtype(np.float64)


@njit(cache=True, nogil=True)
def _fft_inplace(re, im, cw, sw, tr, ti):
    n = re.shape[0]
    if n & (n - 1) == 0:
        j = 0
        for i in range(1, n):
            bit = n >> 1
            while j & bit:
                j ^= bit
                bit >>= 1
            j |= bit
            if i < j:
                re[i], re[j] = re[j], re[i]
                im[i], im[j] = im[j], im[i]
        m = 2
        while m <= n:
            half = m >> 1
            step = n // m
            for s in range(0, n, m):
                for k in range(half):
                    wr = cw[k * step]
                    wi = sw[k * step]
                    a = s + k
                    b = a + half
                    xr = re[b] * wr - im[b] * wi
                    xi = re[b] * wi + im[b] * wr
                    re[b] = re[a] - xr
                    im[b] = im[a] - xi
                    re[a] += xr
                    im[a] += xi
            m <<= 1
        return
    for k in range(n):
        sr = 0.0
        si = 0.0
        idx = 0
        for j in range(n):
            wr = cw[idx]
            wi = sw[idx]
            sr += re[j] * wr - im[j] * wi
            si += re[j] * wi + im[j] * wr
            idx += k
            if idx >= n:
                idx -= n
        tr[k] = sr
        ti[k] = si
    for k in range(n):
        re[k] = tr[k]
        im[k] = ti[k]


@njit(cache=True, nogil=True)
def _dft_kernel(x, win, n, inverse, hermitian, out):
    """x: (outer, L, inner, 1|2) -> out: (outer, keep, inner, 1|2); win: length-L window or empty."""
    outer, L, inner, cin = x.shape
    keep = out.shape[1]
    cout = out.shape[3]
    sign = 1.0 if inverse else -1.0
    scale = 1.0 / n if inverse else 1.0
    cw = np.empty(n)
    sw = np.empty(n)
    for k in range(n):
        a = 2.0 * math.pi * k / n
        cw[k] = math.cos(a)
        sw[k] = sign * math.sin(a)
    re = np.empty(n)
    im = np.empty(n)
    tr = np.empty(n)
    ti = np.empty(n)
    has_win = win.shape[0] > 0
    for o in range(outer):
        for i in range(inner):
            if hermitian:
                for k in range(n):
                    src = k if 2 * k <= n else n - k
                    r = 0.0
                    m = 0.0
                    if src < L:
                        r = x[o, src, i, 0]
                        if cin == 2 and src != 0 and 2 * src != n:
                            m = x[o, src, i, 1]
                    re[k] = r
                    im[k] = m if src == k else -m
            else:
                for k in range(n):
                    if k < L:
                        w = win[k] if has_win else 1.0
                        re[k] = x[o, k, i, 0] * w
                        im[k] = x[o, k, i, 1] * w if cin == 2 else 0.0
                    else:
                        re[k] = 0.0
                        im[k] = 0.0
            _fft_inplace(re, im, cw, sw, tr, ti)
            for k in range(keep):
                out[o, k, i, 0] = re[k] * scale
                if cout == 2:
                    out[o, k, i, 1] = im[k] * scale
    return out


def _run_dft(x4, n, inverse, onesided, win=None):
    if n < 1:
        raise InvalidArgumentError(f"DFT: dft_length must be positive, got {n}")
    hermitian = bool(inverse and onesided)
    keep = n // 2 + 1 if (onesided and not inverse) else n
    out = np.empty((x4.shape[0], keep, x4.shape[2], 1 if hermitian else 2), F64)
    if out.size:
        w = np.empty(0, F64) if win is None else np.ascontiguousarray(win, F64)
        _dft_kernel(np.ascontiguousarray(x4, F64), w, int(n), bool(inverse), hermitian, out)
    return out


def _dft(x, dft_length, axis, inverse, onesided):
    if x.dtype.kind != "f" and not lowp(x.dtype):
        raise InvalidArgumentError(f"DFT expects a floating-point input, got {x.dtype}")
    r = x.ndim
    if r < 3 or x.shape[-1] not in (1, 2):
        raise ShapeMismatchError(f"DFT expects an input [batch, ..., signal, 1 or 2], got shape {list(x.shape)}")
    ax = int(axis)
    if not (-r <= ax <= r - 2) or ax % r == r - 1:
        raise InvalidAttributeError(f"DFT: axis {axis} is out of range for an input of rank {r} "
                                    "(the last axis holds the real/imaginary parts)")
    ax %= r
    L = x.shape[ax]
    if dft_length is not None and np.asarray(dft_length).size:
        n = int(np.asarray(dft_length).reshape(-1)[0])
    else:
        n = 2 * (L - 1) if (inverse and onesided) else L
    outer = int(math.prod(x.shape[:ax]))
    inner = int(math.prod(x.shape[ax + 1:-1]))
    out = _run_dft(x.reshape(outer, L, inner, x.shape[-1]), n, inverse, onesided)
    shape = x.shape[:ax] + (out.shape[1],) + x.shape[ax + 1:-1] + (out.shape[3],)
    return out.reshape(shape).astype(x.dtype)


@op("DFT", 17)
def DFT_17(input, dft_length=None, *, axis=1, inverse=0, onesided=0):
    return _dft(input, dft_length, axis, inverse, onesided)


@op("DFT", 20)
def DFT_20(input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    a = -2 if axis is None or np.asarray(axis).size == 0 else int(np.asarray(axis).reshape(-1)[0])
    return _dft(input, dft_length, a, inverse, onesided)


@op("STFT", 17)
def STFT(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    if signal.ndim != 3 or signal.shape[2] not in (1, 2):
        raise ShapeMismatchError(f"STFT expects a signal [batch, length, 1 or 2], got {list(signal.shape)}")
    step = int(np.asarray(frame_step).reshape(-1)[0])
    if frame_length is not None:
        n = int(np.asarray(frame_length).reshape(-1)[0])
    elif window is not None:
        n = int(window.shape[0])
    else:
        raise InvalidArgumentError("STFT needs a window or a frame_length")
    if window is not None and (window.ndim != 1 or window.shape[0] != n):
        raise ShapeMismatchError(f"STFT: window must have shape [{n}], got {list(window.shape)}")
    b, T, c = signal.shape
    if step < 1 or n < 1 or n > T:
        raise InvalidArgumentError(f"STFT: need frame_step >= 1 and 1 <= frame_length <= {T}, "
                                   f"got frame_step={step}, frame_length={n}")
    frames = 1 + (T - n) // step
    idx = (np.arange(frames) * step)[:, None] + np.arange(n)[None, :]
    fr = signal[:, idx, :].reshape(b * frames, n, 1, c)
    out = _run_dft(fr, n, False, bool(onesided), window)
    return out.reshape(b, frames, out.shape[1], 2).astype(signal.dtype)


def _window(size, periodic, output_datatype, coefs):
    n = int(np.asarray(size).reshape(-1)[0])
    if n < 0:
        raise InvalidArgumentError(f"window size must be non-negative, got {n}")
    denom = n if periodic else n - 1
    k = np.arange(n, dtype=F64)
    y = np.full(n, coefs[0], F64)
    if denom > 0:
        for m, a in enumerate(coefs[1:], start=1):
            y += a * np.cos(k * (2.0 * math.pi * m / denom))
    return y.astype(np_dtype(output_datatype))


@op("HannWindow", 17)
def HannWindow(size, *, output_datatype=1, periodic=1):
    return _window(size, periodic, output_datatype, (0.5, -0.5))


@op("HammingWindow", 17)
def HammingWindow(size, *, output_datatype=1, periodic=1):
    a = 25.0 / 46.0
    return _window(size, periodic, output_datatype, (a, -(1.0 - a)))


@op("BlackmanWindow", 17)
def BlackmanWindow(size, *, output_datatype=1, periodic=1):
    return _window(size, periodic, output_datatype, (0.42, -0.5, 0.08))


@op("MelWeightMatrix", 17)
def MelWeightMatrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *,
                    output_datatype=1):
    nmel = int(np.asarray(num_mel_bins).reshape(-1)[0])
    n = int(np.asarray(dft_length).reshape(-1)[0])
    sr = int(np.asarray(sample_rate).reshape(-1)[0])
    lo = float(np.asarray(lower_edge_hertz).reshape(-1)[0])
    hi = float(np.asarray(upper_edge_hertz).reshape(-1)[0])
    if nmel < 1 or n < 1 or sr < 1:
        raise InvalidArgumentError(f"MelWeightMatrix: num_mel_bins, dft_length and sample_rate must be positive, "
                                   f"got {nmel}, {n}, {sr}")
    nspec = n // 2 + 1
    lo_mel = 2595.0 * math.log10(1.0 + lo / 700.0)
    hi_mel = 2595.0 * math.log10(1.0 + hi / 700.0)
    step = (hi_mel - lo_mel) / (nmel + 2)
    mel = np.arange(nmel + 2, dtype=F64) * step + lo_mel
    hz = 700.0 * (np.power(10.0, mel / 2595.0) - 1.0)
    bins = np.floor((n + 1) * hz / sr).astype(np.int64)
    if bins.min() < 0 or bins.max() >= nspec:
        raise InvalidArgumentError(f"MelWeightMatrix: edge frequencies [{lo}, {hi}] Hz map outside the "
                                   f"{nspec} spectrogram bins")
    out = np.zeros((nspec, nmel), F64)
    for i in range(nmel):
        l, c, h = bins[i], bins[i + 1], bins[i + 2]
        if c == l:
            out[c, i] = 1.0
        else:
            out[l:c + 1, i] = (np.arange(l, c + 1) - l) / float(c - l)
        if h > c:
            out[c:h, i] = (h - np.arange(c, h)) / float(h - c)
    return out.astype(np_dtype(output_datatype))
