"""Recurrent ops: RNN, GRU, LSTM (opset 7 and 14, the latter adding ``layout``), and com.microsoft's
DynamicQuantizeLSTM (int8/uint8 weights, activations quantized to uint8 on the fly).

The wrapper canonicalizes everything to layout 0 (X [seq, batch, input]) and
fills missing optional inputs (bias, initial states, peepholes, sequence_lens)
with their defaults.  The weights stay as the model holds them: every matrix
product inside the kernels is an ``np.dot`` (BLAS) that reads them transposed
in place, so no run copies them.  Each cell kernel handles every direction and
compiles once per float dtype (float16 and bfloat16 run in float32).  Tanh and
Sigmoid of float32 are MLAS's forms (``_fastmath.ftanh``/``fsigmoid_mlas``), as
onnxruntime's LSTM kernels compute them (its RNN and GRU kernels take other
approximations of the same accuracy, within 2.4e-7 of these).

Semantics follow onnxruntime: for batch entry b only the first
``sequence_lens[b]`` steps are computed (a reverse direction runs them
backwards from step ``sequence_lens[b] - 1``); Y is zero past that length and
Y_h/Y_c hold the state after the last valid step.  ``clip`` bounds every gate
pre-activation.  Activation alpha/beta lists are consumed in activation
order, only by the activations that take them.

DynamicQuantizeLSTM reproduces onnxruntime's integer arithmetic: X quantized to uint8 once (all steps), the
hidden state again at every step (range widened to hold 0, scale (max - min) / 255, round half to even), the
products exact (``ops._i16pairs``), or, for int8 weights on x86 hosts without VNNI where MLAS sums adjacent
pairs by ``vpmaddubsw``, with that 16-bit saturation (``MLAS_U8S8_SATURATES``, detected at import; the products
then run on that instruction too, ``ops._u8s8``), and for int8 weights on VNNI hosts exactly by ``vpdpbusd``;
each product scaled per column in float32.  The directions of a
bidirectional node run side by side on the threads.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError
from . import _i16pairs, _u8s8
from ._common import F32, lowp
from ._fastmath import fsigmoid_mlas, ftanh
from ._i16pairs import gemm as gemm16
from ._u8s8 import dot_gemm, sat_gemm
from .registry import op

__all__ = ["RNN", "GRU", "LSTM"]  # and com.microsoft DynamicQuantizeLSTM (registered at the end)

# name -> (code, default alpha or None, default beta or None)
_ACTS = {
    "relu": (0, None, None), "tanh": (1, None, None), "sigmoid": (2, None, None),
    "affine": (3, 1.0, 0.0), "leakyrelu": (4, 0.01, None), "thresholdedrelu": (5, 1.0, None),
    "scaledtanh": (6, 1.0, 1.0), "hardsigmoid": (7, 0.2, 0.5), "elu": (8, 1.0, None),
    "softsign": (9, None, None), "softplus": (10, None, None),
}


@njit(cache=True, nogil=True)
def _act(code, a, b, clip, x):
    """Activation ``code`` of ``x`` clipped to [-clip, clip] (clip > 0; ``clip`` has x's type).  Tanh and Sigmoid
    of float32 are MLAS's forms (``ftanh``, ``fsigmoid_mlas``), as onnxruntime's LSTM computes them."""
    if clip > 0.0:
        x = min(max(x, -clip), clip)
    if code == 1:
        return ftanh(x)
    if code == 2:
        return fsigmoid_mlas(x)
    if code == 0:
        return max(x, 0.0)
    if code == 3:
        return a * x + b
    if code == 4:
        return x if x >= 0 else a * x
    if code == 5:
        return x if x > a else 0.0
    if code == 6:
        return a * math.tanh(b * x)
    if code == 7:
        return max(0.0, min(1.0, a * x + b))
    if code == 8:
        return x if x >= 0 else a * (math.exp(x) - 1.0)
    if code == 9:
        return x / (1.0 + abs(x))
    return math.log1p(math.exp(-abs(x))) + max(x, 0.0)


@njit(cache=True, nogil=True)
def _input_proj(X, W, d):
    """X [seq, batch, nin] times direction ``d``'s input weights transposed (``W`` [D, G * H, nin], read in place
    as a Fortran-ordered operand): [seq * batch, G * H], row t * batch + b."""
    seq, batch, nin = X.shape
    return np.dot(X.reshape(seq * batch, nin), W[d].T)


@njit(cache=True, nogil=True)
def _time_of(s, L, rev):
    """The time index of step ``s`` over a sequence of ``L`` valid steps, run backwards when ``rev``; -1 when
    ``s`` is past them (the step is skipped)."""
    if s >= L:
        return -1
    return L - 1 - s if rev else s


@njit(cache=True, nogil=True)
def _rnn_kernel(X, W, R, B, seqlens, h0, rev, acts, alphas, betas, clip, Y, Yh):
    seq, batch, _ = X.shape
    D, H, _ = R.shape
    for d in range(D):
        xw = _input_proj(X, W, d)
        h = h0[d].copy()
        c0 = acts[d, 0]
        a0 = alphas[d, 0]
        b0 = betas[d, 0]
        for s in range(seq):
            hr = np.dot(h, R[d].T)
            for b in range(batch):
                t = _time_of(s, seqlens[b], rev[d])
                if t < 0:
                    continue
                row = t * batch + b
                for j in range(H):
                    v = xw[row, j] + hr[b, j] + B[d, j] + B[d, H + j]
                    h[b, j] = _act(c0, a0, b0, clip, v)
                    Y[t, d, b, j] = h[b, j]
        Yh[d] = h


@njit(cache=True, nogil=True)
def _gru_kernel(X, W, R, B, seqlens, h0, rev, acts, alphas, betas, clip, lbr, Y, Yh):
    seq, batch, _ = X.shape
    D, _, H = R.shape
    z = np.empty((batch, H), X.dtype)
    rh = np.zeros((batch, H), X.dtype)
    for d in range(D):
        xw = _input_proj(X, W, d)
        h = h0[d].copy()
        cf, ag, bg = acts[d, 0], alphas[d, 0], betas[d, 0]
        cg, ah, bh = acts[d, 1], alphas[d, 1], betas[d, 1]
        for s in range(seq):
            hzr = np.dot(h, R[d, :2 * H].T)
            if lbr:
                hh = np.dot(h, R[d, 2 * H:].T)
            for b in range(batch):
                t = _time_of(s, seqlens[b], rev[d])
                if t < 0:
                    continue
                row = t * batch + b
                for j in range(H):
                    z[b, j] = _act(cf, ag, bg, clip, xw[row, j] + hzr[b, j] + B[d, j] + B[d, 3 * H + j])
                    r = _act(cf, ag, bg, clip, xw[row, H + j] + hzr[b, H + j] + B[d, H + j] + B[d, 4 * H + j])
                    if lbr:
                        rh[b, j] = r * (hh[b, j] + B[d, 5 * H + j])
                    else:
                        rh[b, j] = r * h[b, j]
            if not lbr:
                hh = np.dot(rh, R[d, 2 * H:].T)
            for b in range(batch):
                t = _time_of(s, seqlens[b], rev[d])
                if t < 0:
                    continue
                row = t * batch + b
                for j in range(H):
                    pre = xw[row, 2 * H + j] + B[d, 2 * H + j]
                    if lbr:
                        pre += rh[b, j]
                    else:
                        pre += hh[b, j] + B[d, 5 * H + j]
                    ht = _act(cg, ah, bh, clip, pre)
                    h[b, j] = (1.0 - z[b, j]) * ht + z[b, j] * h[b, j]
                    Y[t, d, b, j] = h[b, j]
        Yh[d] = h


@njit(cache=True, nogil=True, inline="always")
def _gate_inputs(xw, hr, B, P, cp, d, row, b, j):
    """Unit ``j``'s pre-activations of the input, output, forget and cell gates (the output gate's peephole term
    comes with the new cell, in the caller): projection, recurrence, both biases, peepholes on ``cp``."""
    H = hr.shape[1] // 4
    G = 4 * H
    gi = xw[row, j] + hr[b, j] + B[d, j] + B[d, G + j] + P[d, j] * cp
    go = xw[row, H + j] + hr[b, H + j] + B[d, H + j] + B[d, G + H + j]
    gf = xw[row, 2 * H + j] + hr[b, 2 * H + j] + B[d, 2 * H + j] + B[d, G + 2 * H + j] + P[d, 2 * H + j] * cp
    gc = xw[row, 3 * H + j] + hr[b, 3 * H + j] + B[d, 3 * H + j] + B[d, G + 3 * H + j]
    return gi, go, gf, gc


@njit(cache=True, nogil=True, error_model="numpy")
def _lstm_cells_std(xw, hr, B, P, c, h, d, s, seqlens, rev, input_forget, Y, g):
    """``_lstm_cells`` for the default activations (Sigmoid, Tanh, Tanh) without clip, in the arrays' float type.
    Each stage is its own loop over contiguous rows that writes one array (the gate sums ``g`` [4H], scratch,
    then the gates in place, the cell, the hidden state), so each vectorizes: a loop that wrote c, h and Y
    together read too many arrays for the vectorizer's overlap checks, and ran one unit at a time.  The sums
    are formed in ``_gate_inputs``' order, so the bits are the same."""
    batch, H = h.shape
    G = 4 * H
    one = np.float32(1.0)  # 1 in float32 and in float64 alike
    Bd = B[d]
    Pd = P[d]
    for b in range(batch):
        t = _time_of(s, seqlens[b], rev[d])
        if t < 0:
            continue
        xr = xw[t * batch + b]
        hb = hr[b]
        for k in range(G):
            g[k] = xr[k] + hb[k] + Bd[k] + Bd[G + k]
        cb = c[b]
        for j in range(H):
            g[j] = fsigmoid_mlas(g[j] + Pd[j] * cb[j])
        if input_forget:
            for j in range(H):
                g[2 * H + j] = one - g[j]
        else:
            for j in range(H):
                g[2 * H + j] = fsigmoid_mlas(g[2 * H + j] + Pd[2 * H + j] * cb[j])
        for j in range(H):
            cb[j] = g[2 * H + j] * cb[j] + g[j] * ftanh(g[3 * H + j])
        for j in range(H):
            g[H + j] = fsigmoid_mlas(g[H + j] + Pd[H + j] * cb[j])
        hn = h[b]
        for j in range(H):
            hn[j] = g[H + j] * ftanh(cb[j])
        yb = Y[t, d, b]
        for j in range(H):
            yb[j] = hn[j]


@njit(cache=True, nogil=True)
def _lstm_cells(xw, hr, B, P, c, h, d, s, seqlens, rev, acts, alphas, betas, clip, input_forget, Y, g):
    """Step ``s`` of direction ``d`` for every batch row: gates from the input projection ``xw`` and the
    recurrence ``hr`` (bias and peepholes added here), then the new cell ``c`` and hidden ``h``.  ``g`` is
    scratch of 4H values in xw's type."""
    batch, H = h.shape
    if clip == 0 and acts[d, 0] == 2 and acts[d, 1] == 1 and acts[d, 2] == 1:
        _lstm_cells_std(xw, hr, B, P, c, h, d, s, seqlens, rev, input_forget, Y, g)
        return
    cf, af, bf = acts[d, 0], alphas[d, 0], betas[d, 0]
    cg, ag, bg = acts[d, 1], alphas[d, 1], betas[d, 1]
    ch, ah, bh = acts[d, 2], alphas[d, 2], betas[d, 2]
    for b in range(batch):
        t = _time_of(s, seqlens[b], rev[d])
        if t < 0:
            continue
        row = t * batch + b
        for j in range(H):
            cp = c[b, j]
            gi, go, gf, gc = _gate_inputs(xw, hr, B, P, cp, d, row, b, j)
            i = _act(cf, af, bf, clip, gi)
            f = 1.0 - i if input_forget else _act(cf, af, bf, clip, gf)
            cn = f * cp + i * _act(cg, ag, bg, clip, gc)
            o = _act(cf, af, bf, clip, go + P[d, H + j] * cn)
            c[b, j] = cn
            h[b, j] = o * _act(ch, ah, bh, clip - clip, cn)  # unclipped: 0 of clip's type
            Y[t, d, b, j] = h[b, j]


@njit(cache=True, nogil=True)
def _lstm_kernel(X, W, R, B, seqlens, h0, c0, P, rev, acts, alphas, betas, clip, input_forget, Y, Yh, Yc):
    seq = X.shape[0]
    D = R.shape[0]
    for d in range(D):
        xw = _input_proj(X, W, d)
        h = h0[d].copy()
        c = c0[d].copy()
        g = np.empty(xw.shape[1], xw.dtype)
        for s in range(seq):
            hr = np.dot(h, R[d].T)
            _lstm_cells(xw, hr, B, P, c, h, d, s, seqlens, rev, acts, alphas, betas, clip, input_forget, Y, g)
        Yh[d] = h
        Yc[d] = c


@njit(cache=True, nogil=True)
def _quantize_u8(x, codes, q):
    """onnxruntime's dynamic uint8 quantization of ``x`` (2-d float32) as its quantized RNN products take it:
    the range widened to hold 0, scale (max - min) / 255 (1 when the range is empty), zero point the rounded
    -min / scale, each value round-half-even(x / scale) kept within the codes.  Writes the uint8 codes to
    ``codes`` when it has rows, the codes minus the zero point (int16) to ``q`` when it has rows; the columns of
    either past x's stay as they are (zeros).  Returns the scale and the zero point."""
    mn = np.float32(0.0)
    mx = np.float32(0.0)
    for i in range(x.shape[0]):
        for k in range(x.shape[1]):
            v = x[i, k]
            mn = min(mn, v)
            mx = max(mx, v)
    scale = np.float32(1.0) if mx == mn else np.float32((mx - mn) / np.float32(255.0))
    zp = np.rint(min(np.float32(255.0), max(np.float32(0.0), np.float32(0.0) - mn / scale)))
    lo, hi = -zp, np.float32(255.0) - zp
    with_codes = codes.shape[0] > 0
    with_q = q.shape[0] > 0
    for i in range(x.shape[0]):
        for k in range(x.shape[1]):
            v = min(max(np.rint(x[i, k] / scale), lo), hi)
            if with_codes:
                codes[i, k] = np.uint8(np.int32(v + zp))
            if with_q:
                q[i, k] = np.int16(v)
    return scale, zp


@njit(cache=True, nogil=True)
def _qproduct(codes, q, zp, W8, W16, colsum, form, scale, wscale, acc, out):
    """out = float32(the integer product) * float32(scale * wscale[col]), as onnxruntime's quantized GEMM writes
    it.  ``form`` (see ``_quantized_weights``) ``_SATURATING`` or ``_DOTS``: the uint8 ``codes`` against the
    packed int8 weights ``W8`` (``_u8s8.sat_gemm``'s saturated pair sums, or ``_u8s8.dot_gemm``'s exact
    ``vpdpbusd`` sums) less ``zp`` times the column sums; ``_PAIRS16``: the exact product of the codes minus
    their zero points ``q`` and ``W16`` (``_i16pairs.gemm``).  ``acc`` is the int32 scratch."""
    M, N = out.shape
    if form != _PAIRS16:
        if form == _SATURATING:
            sat_gemm(codes, W8, acc)
        else:
            dot_gemm(codes, W8, acc)
        for i in range(M):
            for j in range(N):
                out[i, j] = np.float32(np.float64(acc[i, j]) - zp * colsum[j]) * np.float32(scale * wscale[j])
        return
    gemm16(q, W16, acc, 0, W16.shape[0])
    for i in range(M):
        for j in range(N):
            out[i, j] = np.float32(acc[i, j]) * np.float32(scale * wscale[j])


@njit(cache=True, nogil=True, parallel=True)
def _qlstm_kernel(X, W8, W16, wcol, wform, wscale, R8, R16, rcol, rform, rscale, B, seqlens, h0, c0, P, rev, acts,
                  alphas, betas, clip, input_forget, Y, Yh, Yc):
    """LSTM with int8/uint8 weights (``W8``/``W16`` [D, ...], ``R8``/``R16``: their ``_quantized_weights`` forms)
    as onnxruntime's DynamicQuantizeLSTM runs it: X quantized once (all steps together), the hidden state
    quantized again at every step, each product scaled per column.  The directions run side by side on the
    threads."""
    seq, batch, nin = X.shape
    D, _, H = h0.shape
    G = 4 * H
    x2 = X.reshape(seq * batch, nin)
    w8, r8 = wform != _PAIRS16, rform != _PAIRS16
    xc = np.zeros((seq * batch if w8 else 0, 4 * W8.shape[2]), np.uint8)
    xq = np.zeros((0 if w8 else seq * batch, 2 * W16.shape[2]), np.int16)
    sx, zx = _quantize_u8(x2, xc, xq)
    wgroups = W8.shape[1] if w8 else W16.shape[1]
    rgroups = R8.shape[1] if r8 else R16.shape[1]
    for d in prange(D):
        xw = np.empty((seq * batch, G), np.float32)
        xacc = np.empty((seq * batch, 8 * wgroups), np.int32)
        _qproduct(xc, xq, zx, W8[d], W16[d], wcol[d], wform, sx, wscale[d], xacc, xw)
        hc = np.zeros((batch if r8 else 0, 4 * R8.shape[2]), np.uint8)
        hq = np.zeros((0 if r8 else batch, 2 * R16.shape[2]), np.int16)
        hacc = np.empty((batch, 8 * rgroups), np.int32)
        hr = np.empty((batch, G), np.float32)
        h = h0[d].copy()
        c = c0[d].copy()
        g = np.empty(G, np.float32)
        for s in range(seq):
            sh, zh = _quantize_u8(h, hc, hq)
            _qproduct(hc, hq, zh, R8[d], R16[d], rcol[d], rform, sh, rscale[d], hacc, hr)
            _lstm_cells(xw, hr, B, P, c, h, d, s, seqlens, rev, acts, alphas, betas, clip, input_forget, Y, g)
        Yh[d] = h
        Yc[d] = c


_ACTIVATIONS: dict = {}  # the arrays of each node's activation attributes, made once (the kernels only read them)


def _activations(op_name, activations, alpha, beta, defaults, D):
    key = (op_name, tuple(activations or ()), tuple(alpha or ()), tuple(beta or ()), tuple(defaults), D)
    got = _ACTIVATIONS.get(key)
    if got is None:
        got = _ACTIVATIONS[key] = _activation_arrays(op_name, activations, alpha, beta, defaults, D)
    return got


def _activation_arrays(op_name, activations, alpha, beta, defaults, D):
    names = list(activations) if activations else list(defaults) * D
    k = len(defaults)
    if len(names) == k and D == 2:
        names = names * 2
    if len(names) != k * D:
        raise InvalidAttributeError(f"{op_name}: expected {k * D} activations for {D} direction(s), got {names}")
    codes = np.empty((D, k), np.int64)
    al = np.zeros((D, k))
    be = np.zeros((D, k))
    ia = ib = 0
    alpha = list(alpha or [])
    beta = list(beta or [])
    for n, name in enumerate(names):
        key = name.decode() if isinstance(name, bytes) else str(name)
        spec = _ACTS.get(key.lower())
        if spec is None:
            raise InvalidAttributeError(f"{op_name}: unsupported activation {key!r}; expected one of "
                                        f"{sorted(_ACTS)}")
        code, da, db = spec
        a, b = 0.0, 0.0
        if da is not None:
            a = float(alpha[ia]) if ia < len(alpha) else da
            ia += 1
        if db is not None:
            b = float(beta[ib]) if ib < len(beta) else db
            ib += 1
        codes[n // k, n % k] = code
        al[n // k, n % k] = a
        be[n // k, n % k] = b
    return codes, al, be


class _Prep:
    """Canonical (layout 0, contiguous, compute-dtype) operands shared by the three cells."""

    def __init__(self, op_name, G, X, W, R, B, sequence_lens, initial_h, direction, hidden_size, layout,
                 quantized=False):
        dirs = {"forward": (0,), "reverse": (1,), "bidirectional": (0, 1)}
        direction = direction.decode() if isinstance(direction, bytes) else direction
        if direction not in dirs:
            raise InvalidAttributeError(f"{op_name}: direction must be forward, reverse or bidirectional, "
                                        f"got {direction!r}")
        self.rev = np.array(dirs[direction], np.bool_)
        D = len(self.rev)
        self.out_dtype = X.dtype
        if X.dtype.kind != "f" and not lowp(X.dtype):
            raise InvalidArgumentError(f"{op_name} expects floating-point inputs, got {X.dtype}")
        dt = F32 if lowp(X.dtype) else X.dtype
        self.dt = dt
        if X.ndim != 3:
            raise ShapeMismatchError(f"{op_name}: X must be 3-d, got shape {list(X.shape)}")
        if layout:
            X = X.transpose(1, 0, 2)
        self.X = np.ascontiguousarray(X, dt)
        seq, batch, nin = self.X.shape
        H = int(hidden_size) if hidden_size else R.shape[1 if quantized else -1]
        # quantized weights (DynamicQuantizeLSTM) are laid out [D, nin, G * H] and [D, H, G * H]
        want_w, want_r = ((D, nin, G * H), (D, H, G * H)) if quantized else ((D, G * H, nin), (D, G * H, H))
        if W.shape != want_w or R.shape != want_r:
            raise ShapeMismatchError(f"{op_name}: expected W {list(want_w)} and R {list(want_r)}, "
                                     f"got {list(W.shape)} and {list(R.shape)}")
        self.D, self.H, self.seq, self.batch, self.layout = D, H, seq, batch, layout
        if not quantized:
            self.W = np.ascontiguousarray(W, dt)  # the kernels read W and R transposed in place
            self.R = np.ascontiguousarray(R, dt)
        if B is None:
            self.B = np.zeros((D, 2 * G * H), dt)
        else:
            if B.shape != (D, 2 * G * H):
                raise ShapeMismatchError(f"{op_name}: expected B {[D, 2 * G * H]}, got {list(B.shape)}")
            self.B = np.ascontiguousarray(B, dt)
        if sequence_lens is None or sequence_lens.size == 0:
            self.seqlens = np.full(batch, seq, np.int64)
        else:
            self.seqlens = np.ascontiguousarray(sequence_lens.reshape(-1), np.int64)
            if self.seqlens.shape[0] != batch:
                raise ShapeMismatchError(f"{op_name}: sequence_lens must have {batch} entries, "
                                         f"got {self.seqlens.shape[0]}")
            if self.seqlens.size and (self.seqlens.min() < 0 or self.seqlens.max() > seq):
                from runtime.errors import IndexOutOfRangeError
                raise IndexOutOfRangeError(f"{op_name}: sequence_lens must lie in [0, {seq}], "
                                           f"got {self.seqlens.tolist()}")
        self.h0 = self.state(op_name, initial_h, "initial_h")
        self.Y = np.zeros((seq, D, batch, H), dt)
        self.Yh = np.empty((D, batch, H), dt)

    def peepholes(self, op_name, P):
        if P is None:
            return np.zeros((self.D, 3 * self.H), self.dt)
        if P.shape != (self.D, 3 * self.H):
            raise ShapeMismatchError(f"{op_name}: expected P {[self.D, 3 * self.H]}, got {list(P.shape)}")
        return np.ascontiguousarray(P, self.dt)

    def state(self, op_name, s, what):
        shape = (self.D, self.batch, self.H)
        if s is None:
            return np.zeros(shape, self.dt)
        if self.layout:
            s = s.transpose(1, 0, 2)
        if s.shape != shape:
            raise ShapeMismatchError(f"{op_name}: expected {what} of shape {list(shape)} (layout 0), "
                                     f"got {list(s.shape)}")
        return np.ascontiguousarray(s, self.dt)

    def finish(self, ctx, *states):
        Y = self.Y
        if self.layout:
            Y = Y.transpose(2, 0, 1, 3)
            states = tuple(s.transpose(1, 0, 2) for s in states)
        res = tuple(np.ascontiguousarray(a).astype(self.out_dtype, copy=False) for a in (Y,) + states)
        n = ctx.n_outputs
        return res[0] if n == 1 else res[:n]


def _clip(clip):
    return 0.0 if clip is None else float(clip)


def RNN(X, W, R, B=None, sequence_lens=None, initial_h=None, *, ctx, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, layout=0):
    p = _Prep("RNN", 1, X, W, R, B, sequence_lens, initial_h, direction, hidden_size, layout)
    codes, al, be = _activations("RNN", activations, activation_alpha, activation_beta, ("Tanh",), p.D)
    _rnn_kernel(p.X, p.W, p.R, p.B, p.seqlens, p.h0, p.rev, codes, al, be, p.dt.type(_clip(clip)), p.Y, p.Yh)
    return p.finish(ctx, p.Yh)


def GRU(X, W, R, B=None, sequence_lens=None, initial_h=None, *, ctx, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
        layout=0, linear_before_reset=0):
    p = _Prep("GRU", 3, X, W, R, B, sequence_lens, initial_h, direction, hidden_size, layout)
    codes, al, be = _activations("GRU", activations, activation_alpha, activation_beta, ("Sigmoid", "Tanh"), p.D)
    _gru_kernel(p.X, p.W, p.R, p.B, p.seqlens, p.h0, p.rev, codes, al, be, p.dt.type(_clip(clip)),
                bool(linear_before_reset), p.Y, p.Yh)
    return p.finish(ctx, p.Yh)


def LSTM(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *, ctx,
         activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
         hidden_size=None, input_forget=0, layout=0):
    p = _Prep("LSTM", 4, X, W, R, B, sequence_lens, initial_h, direction, hidden_size, layout)
    codes, al, be = _activations("LSTM", activations, activation_alpha, activation_beta,
                                 ("Sigmoid", "Tanh", "Tanh"), p.D)
    c0 = p.state("LSTM", initial_c, "initial_c")
    Pm = p.peepholes("LSTM", P)
    Yc = np.empty_like(p.Yh)
    _lstm_kernel(p.X, p.W, p.R, p.B, p.seqlens, p.h0, c0, Pm, p.rev, codes, al, be, p.dt.type(_clip(clip)),
                 bool(input_forget), p.Y, p.Yh, Yc)
    return p.finish(ctx, p.Yh, Yc)


for _v in (7, 14):
    op("RNN", _v)(RNN)
    op("GRU", _v)(GRU)
    op("LSTM", _v)(LSTM)


# -- com.microsoft DynamicQuantizeLSTM -------------------------------------------------------------------

def _quantized_weights(name, Wq, scale, zero, D, N):
    """The weights' packed forms and the scale per output column float32 [D, N], checked as onnxruntime checks
    them: scale and zero point of shape [D] (per tensor) or [D, N] (per column), the zero point 0 for int8 codes
    and one value per direction for uint8.  int8 codes are packed for ``_u8s8`` [D, G, K4, 32] where the
    products saturate (``MLAS_U8S8_SATURATES``: form ``_SATURATING``) or the host has ``vpdpbusd`` (``_DOTS``,
    exact); other codes, minus the zero point, for ``_i16pairs`` [D, G, K2, 16] (``_PAIRS16``, exact).  Returns
    (int8 form, int16 form; the unused one empty), the column sums of the codes, the form, and the scales."""
    if Wq.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise InvalidArgumentError(f"DynamicQuantizeLSTM: {name} must be int8 or uint8, got {Wq.dtype}")
    for what, t in (("scale", scale), ("zero point", zero)):
        if t.shape not in ((D,), (D, N)):
            raise ShapeMismatchError(f"DynamicQuantizeLSTM: {name}'s {what} must have shape {[D]} (per tensor) or "
                                     f"{[D, N]} (per column), got {list(t.shape)}")
    if zero.dtype != Wq.dtype:
        raise InvalidArgumentError(f"DynamicQuantizeLSTM: {name}'s zero point is {zero.dtype}, its codes {Wq.dtype}")
    z = zero.reshape(D, -1).astype(np.int16)
    if Wq.dtype == np.int8 and np.any(z != 0):
        raise InvalidArgumentError(f"DynamicQuantizeLSTM: {name}'s zero point must be 0 for int8 codes, got "
                                   f"{zero.tolist()}")
    if np.any(z != z[:, :1]):
        raise InvalidArgumentError(f"DynamicQuantizeLSTM: {name}'s zero point must be one value per direction")
    codes = Wq.astype(np.int16) - z[:, :1, None]
    sc = np.ascontiguousarray(np.broadcast_to(scale.reshape(D, -1).astype(F32), (D, N)))
    colsum = np.ascontiguousarray(codes.sum(axis=1, dtype=np.int32))
    form = _PAIRS16
    if Wq.dtype == np.int8:
        form = _SATURATING if MLAS_U8S8_SATURATES else _DOTS if _u8s8.VNNI else _PAIRS16
    if form != _PAIRS16:
        p8 = np.stack([_u8s8.pack(Wq[d]) for d in range(D)])
        p16 = np.zeros((D, 0, 0, 16), np.int16)
    else:
        p8 = np.zeros((D, 0, 0, 32), np.int8)
        p16 = np.stack([_i16pairs.pack(codes[d]) for d in range(D)])
    return p8, p16, colsum, form, sc


MLAS_U8S8_SATURATES = _u8s8.SATURATES
_PAIRS16, _SATURATING, _DOTS = 0, 1, 2  # the product forms of ``_qproduct``


def _dynamic_quantize_lstm_factory(ctx, activation_alpha=None, activation_beta=None, activations=None, clip=None,
                                   direction="forward", hidden_size=None, input_forget=0):
    memo = {}  # the weights' prepared forms, kept while the same arrays come in (initializers: every run)

    def prepared(W, R, ws, wz, rs, rz, D, N):
        key = (W, R, ws, wz, rs, rz)
        got = memo.get("key")
        if got is None or any(a is not b for a, b in zip(got, key)):
            memo["w"] = _quantized_weights("W", W, ws, wz, D, N)
            memo["r"] = _quantized_weights("R", R, rs, rz, D, N)
            memo["key"] = key
        return memo["w"], memo["r"]

    def run(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, W_scale=None,
            W_zero_point=None, R_scale=None, R_zero_point=None):
        if X.dtype != F32:
            raise InvalidArgumentError(f"DynamicQuantizeLSTM expects float32 X, got {X.dtype}")
        for name, v in (("W_scale", W_scale), ("W_zero_point", W_zero_point), ("R_scale", R_scale),
                        ("R_zero_point", R_zero_point)):
            if v is None:
                raise InvalidArgumentError(f"DynamicQuantizeLSTM: input {name} is required")
        p = _Prep("DynamicQuantizeLSTM", 4, X, W, R, B, sequence_lens, initial_h, direction, hidden_size, 0,
                  quantized=True)
        (W8, W16, wcol, wform, wsc), (R8, R16, rcol, rform, rsc) = prepared(W, R, W_scale, W_zero_point, R_scale,
                                                                        R_zero_point, p.D, 4 * p.H)
        codes, al, be = _activations("DynamicQuantizeLSTM", activations, activation_alpha, activation_beta,
                                     ("Sigmoid", "Tanh", "Tanh"), p.D)
        c0 = p.state("DynamicQuantizeLSTM", initial_c, "initial_c")
        Pm = p.peepholes("DynamicQuantizeLSTM", P)
        Yc = np.empty_like(p.Yh)
        _qlstm_kernel(p.X, W8, W16, wcol, wform, wsc, R8, R16, rcol, rform, rsc, p.B, p.seqlens, p.h0, c0, Pm, p.rev,
                      codes, al, be, p.dt.type(_clip(clip)), bool(input_forget), p.Y, p.Yh, Yc)
        return p.finish(ctx, p.Yh, Yc)

    return run


op("DynamicQuantizeLSTM", 1, "com.microsoft", factory=True)(_dynamic_quantize_lstm_factory)
