"""The stateful sequence ops beside LinearAttention (``ops/linear_attention.py``) that the GenAI model builder
emits (qwen35 gated DeltaNet, lfm2 short convolutions): com.microsoft LinearAttentionGate, and
CausalConvWithState (com.microsoft, and the opset-27 op as its dilation-1, channels-first case), each written
once: its bind, checks and messages, typed driver, CPU wrapper and region form (the CUDA launches in
``ops/cuda/contrib_recurrent.py`` share the binds and the checks).  The contrib CausalConvWithState adds
``dilation`` and the channels-last layout (handled by transposing views in the wrapper).

Invariants:
- only ``state_window = 0`` (3-d conv state) and ``ndim = 1`` are supported; the
  CUDA-only attributes must keep their defaults; anything else raises ``InvalidAttributeError``;
- LinearAttentionGate computes in float64 and rounds once to the output dtype (``a``'s dtype);
- CausalConvWithState computes in float32; ``present_state`` holds the last ``(k - 1) * dilation`` positions
  of the past-padded input, in the input dtype.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from runtime.errors import InvalidArgumentError, InvalidAttributeError
from ._common import F32, mlas_order, raise_coded
from ._fastmath import fsigmoid, sigmoid32_mlas
from .forms import Decline, float_only, raise_on, form
from .registry import op

MS = "com.microsoft"
_OPTS = dict(cache=True, nogil=True, error_model="numpy")
SILU_ORT = 2  # CausalConvWithState's activation as onnxruntime computes it: x / (1 + expf(-x))


def _s(x):
    return x.decode() if isinstance(x, bytes) else str(x)


# -- kernels ---------------------------------------------------------------------------------------

@njit(**_OPTS)
def _gate_kernel(a, dt_bias, decay_scale, b, decay, beta, has_b, ort):
    """a/b/decay/beta (R, H) float32; decay = decay_scale * softplus(a + dt_bias), beta = sigmoid(b): in float64,
    or with ``ort`` (``ONNX_NUMBA_MLAS_ORDER=1``) onnxruntime's float32 order: ``v = a + dt_bias``, softplus
    ``v + logf(expf(-v) + 1)`` for v > 0 else ``logf(expf(v) + 1)``, times the scale, beta by MLAS's logistic."""
    R, H = a.shape
    one = np.float32(1.0)
    for r in range(R):
        for h in range(H):
            if ort:
                v = np.float32(a[r, h] + dt_bias[h])
                if v > 0:
                    sp = np.float32(v + math.log(np.float32(math.exp(-v) + one)))
                else:
                    sp = np.float32(math.log(np.float32(math.exp(v) + one)))
                decay[r, h] = np.float32(decay_scale[h] * sp)
                if has_b:
                    beta[r, h] = sigmoid32_mlas(b[r, h])
                continue
            z = np.float64(a[r, h]) + np.float64(dt_bias[h])
            sp = z if z > 20.0 else math.log1p(math.exp(z))
            decay[r, h] = np.float64(decay_scale[h]) * sp
            if has_b:
                beta[r, h] = 1.0 / (1.0 + math.exp(-np.float64(b[r, h])))


@njit(**_OPTS)
def _dilated_conv_kernel(x, w, bias, past, out, dil, silu):
    """x/out (B,C,L), w (C,K), bias (C,), past (B,C,P) with P = (K-1)*dil:
    out[t] = bias + sum_i w[i] * padded[t + i*dil], padded = past ++ x, in that order, each product and sum
    rounded (onnxruntime's order); then ``silu`` 1: ``x * sigmoid(x)``, 2: onnxruntime's ``x / (1 + expf(-x))``
    (``SILU_ORT``, taken under ``ONNX_NUMBA_MLAS_ORDER=1``)."""
    B, C, L = x.shape
    K = w.shape[1]
    P = past.shape[2]
    for b in range(B):
        for c in range(C):
            for t in range(L):
                acc = bias[c]
                for i in range(K):
                    p = t + i * dil
                    xv = past[b, c, p] if p < P else x[b, c, p - P]
                    acc += w[c, i] * xv
                if silu == SILU_ORT:
                    acc = np.float32(acc / np.float32(np.float32(1.0) + math.exp(-acc)))
                elif silu:
                    acc = acc * fsigmoid(acc)
                out[b, c, t] = acc


# LinearAttentionGate, written once: it has no attributes; its checks and messages are ``LA_GATE_ERRORS``
# through ``la_gate_check`` (CPU, CUDA) and ``la_gate_f32`` (the typed driver of the CPU wrapper and the form).

def bind_la_gate(ctx) -> tuple:
    return ()


LA_GATE_ERRORS = {
    1: ("ShapeMismatchError", "dt_bias must have one element per head (a's last axis)"),
    2: ("ShapeMismatchError", "decay_scale must have one element per head (a's last axis)"),
    3: ("ShapeMismatchError", "b must have a's shape"),
    4: ("ShapeMismatchError", "a must be (B, T, H), not a scalar"),
}


def la_gate_check(a, dt_bias, decay_scale, b) -> int:
    """The heads H (a's last extent), after the checks every implementation makes (host or device arrays)."""
    shape = tuple(a.shape)
    code = 4 if not shape else 1 if dt_bias.size != shape[-1] else 2 if decay_scale.size != shape[-1] else \
        3 if b is not None and tuple(b.shape) != shape else 0
    if code:
        raise_coded(LA_GATE_ERRORS, code, "LinearAttentionGate", f" (a {list(shape)})")
    return shape[-1]


@njit(**_OPTS)
def la_gate_f32(a, dt_bias, decay_scale, b, has_b, ort):
    """The driver: ``(error code, decay flat, beta flat)`` over a/b flattened to (R, H); ``ort``: onnxruntime's
    float32 order (``_gate_kernel``)."""
    H = a.shape[a.ndim - 1]
    e = np.empty(0, np.float32)
    if dt_bias.size != H:
        return 1, e, e
    if decay_scale.size != H:
        return 2, e, e
    if has_b and b.shape != a.shape:
        return 3, e, e
    R = a.size // H if H else 0
    a2 = a.reshape((R, H))
    b2 = b.reshape((R, H)) if has_b else a2
    dec = np.empty((R, H), np.float32)
    bt = np.empty((R if has_b else 0, H), np.float32)
    if a.size:
        _gate_kernel(a2, dt_bias.reshape((H,)), decay_scale.reshape((H,)), b2, dec, bt, has_b, ort)
    return 0, dec.reshape((R * H,)), bt.reshape((bt.size,))


@op("LinearAttentionGate", 1, domain=MS, bind=bind_la_gate)
def _la_gate_cpu(_, ctx):
    ort = mlas_order()

    def run(a, dt_bias, decay_scale, b=None):
        la_gate_check(a, dt_bias, decay_scale, b)
        af = np.ascontiguousarray(a, dtype=F32)
        err, dec, bt = la_gate_f32(af, np.ascontiguousarray(dt_bias, dtype=F32),
                                   np.ascontiguousarray(decay_scale, dtype=F32),
                                   af if b is None else np.ascontiguousarray(b, dtype=F32), b is not None, ort)
        if err:
            raise_coded(LA_GATE_ERRORS, err, "LinearAttentionGate")
        dec = dec.reshape(a.shape).astype(a.dtype, copy=False)
        return dec if b is None else (dec, bt.reshape(a.shape).astype(a.dtype, copy=False))
    return run


def _la_gate_form(e, _):
    float_only(e, 0, 1, 2, 3)
    r = e.rank(0)
    if r < 1 or (e.has(3) and e.rank(3) != r):
        raise Decline("ranks")
    k = e.use(__name__, "la_gate_f32")
    b = "{i3}" if e.has(3) else "{i0}"
    e.line(f"{{p}}_err, {{p}}_d, {{p}}_b = {k}({{i0}}, {{i1}}, {{i2}}, {b}, {e.has(3)}, {mlas_order()})")
    raise_on(e, "{p}_err", [(c, cls, msg) for c, (cls, msg) in LA_GATE_ERRORS.items() if c < 4])
    e.line("{o0} = {p}_d.reshape({i0}.shape)")
    if e.has(3) and e.used(1):
        e.line("{o1} = {p}_b.reshape({i0}.shape)")


form("LinearAttentionGate", domain=MS, bind=bind_la_gate)(_la_gate_form)


# -- CausalConvWithState ---------------------------------------------------------------------------

class Ccws(NamedTuple):
    """A CausalConvWithState node (com.microsoft, or the opset-27 op: dilation 1, channels first) bound at
    plan time."""

    silu: bool
    dilation: int
    channels_last: bool


def _activation(activation) -> bool:
    act = _s(activation)
    if act not in ("none", "silu", "swish"):
        raise InvalidAttributeError(f"CausalConvWithState: activation must be 'none', 'silu' or 'swish', got {act!r}")
    return act != "none"


def bind_ccws(ctx, activation="none", ndim=1, dilation=1, channels_last=0, state_window=0, state_update_capacity=0,
              state_channels_last=-1, state_length=0, input_channel_offset=0, input_channels=0) -> Ccws:
    silu = _activation(activation)
    if ndim != 1 or state_window or state_update_capacity or state_channels_last != -1 or state_length \
            or input_channel_offset or input_channels:
        raise InvalidAttributeError(
            f"CausalConvWithState (com.microsoft): only ndim=1, state_window=0 and the default CUDA-only attributes "
            f"are supported, got ndim={ndim}, state_window={state_window}, state_update_capacity="
            f"{state_update_capacity}, state_channels_last={state_channels_last}, state_length={state_length}, "
            f"input_channel_offset={input_channel_offset}, input_channels={input_channels}")
    if int(dilation) < 1:
        raise InvalidAttributeError(f"CausalConvWithState: dilation must be >= 1, got {dilation}")
    return Ccws(silu, int(dilation), bool(int(channels_last)))


def bind_ccws_27(ctx, activation="none") -> Ccws:
    return Ccws(_activation(activation), 1, False)


CCWS_ERRORS = {
    1: ("ShapeMismatchError", "weight must be (channels, 1, k)"),
    2: ("ShapeMismatchError", "bias must have one element per channel"),
    3: ("ShapeMismatchError", "past_state does not match batch, channels and (k - 1) * dilation"),
    4: ("ShapeMismatchError", "input must be (batch, channels, length), or (batch, length, d_1, ...) with "
                              "channels_last"),
}


def ccws_geometry(c: Ccws, input, weight, bias, past_state) -> tuple:
    """``(B, C, L, K, P)`` after the checks every implementation makes (host or device arrays)."""
    shape = tuple(int(v) for v in input.shape)
    if (c.channels_last and len(shape) < 3) or (not c.channels_last and len(shape) != 3):
        raise_coded(CCWS_ERRORS, 4, "CausalConvWithState", f", got {list(shape)}")
    B, L, C = (shape[0], shape[1], math.prod(shape[2:])) if c.channels_last else (shape[0], shape[2], shape[1])
    ws = tuple(int(v) for v in weight.shape)
    if len(ws) != 3 or ws[0] != C or ws[1] != 1 or ws[2] < 1:
        raise_coded(CCWS_ERRORS, 1, "CausalConvWithState", f" = ({C}, 1, k), got {list(ws)}")
    K = ws[2]
    P = (K - 1) * c.dilation
    if bias is not None and bias.size != C:
        raise_coded(CCWS_ERRORS, 2, "CausalConvWithState", f" ({C}), got shape {list(bias.shape)}")
    if past_state is not None:
        ps = tuple(int(v) for v in past_state.shape)
        ok = (ps[:2] == (B, P) and math.prod(ps[2:]) == C) if c.channels_last else ps == (B, C, P)
        if not ok:
            raise_coded(CCWS_ERRORS, 3, "CausalConvWithState", f": expected {[B, C, P]}"
                        f"{' (channels last)' if c.channels_last else ''}, got {list(ps)}")
    return B, C, L, K, P


@njit(**_OPTS)
def ccws_f32(x, weight, bias, has_bias, past, has_past, dil, silu):
    """The driver, channels first: x (B, C, L), past (B, C, P): ``(error code, out (B, C, L), present
    (B, C, P))``."""
    B, C, L = x.shape
    e3 = np.empty((0, 0, 0), np.float32)
    if weight.shape[0] != C or weight.shape[1] != 1 or weight.shape[2] < 1:
        return 1, e3, e3
    K = weight.shape[2]
    P = (K - 1) * dil
    if has_bias and bias.size != C:
        return 2, e3, e3
    if has_past and (past.shape[0] != B or past.shape[1] != C or past.shape[2] != P):
        return 3, e3, e3
    w = weight.reshape((C, K))
    bs = bias.reshape((C,)) if has_bias else np.zeros(C, np.float32)
    pf = past if has_past else np.zeros((B, C, P), np.float32)
    out = np.empty((B, C, L), np.float32)
    if out.size:
        _dilated_conv_kernel(x, w, bs, pf, out, dil, silu)
    present = np.empty((B, C, P), np.float32)
    for b in range(B):
        for ch in range(C):
            for t in range(P):
                j = t + L
                present[b, ch, t] = pf[b, ch, j] if j < P else x[b, ch, j - P]
    return 0, out, present


def ccws_activation(c: Ccws) -> int:
    """The kernel's ``silu`` argument for a node: 0 none, 1 ``x * sigmoid(x)``, ``SILU_ORT`` onnxruntime's form
    under ``ONNX_NUMBA_MLAS_ORDER=1`` (read once, when the node is planned or its region generated)."""
    return (SILU_ORT if mlas_order() else 1) if c.silu else 0


def _ccws_cpu(c: Ccws, ctx):
    act = ccws_activation(c)

    def run(input, weight, bias=None, past_state=None):
        B, C, L, K, P = ccws_geometry(c, input, weight, bias, past_state)
        T = input.dtype
        if T.kind != "f" and T.name != "bfloat16":
            raise InvalidArgumentError(f"CausalConvWithState: expects a floating-point input, got {T}")
        x, past = input, past_state
        if c.channels_last:
            x = input.reshape(B, L, C).transpose(0, 2, 1)
            past = None if past is None else past.reshape(B, P, C).transpose(0, 2, 1)
        xf = np.ascontiguousarray(x, dtype=F32)
        err, out, present = ccws_f32(xf, np.ascontiguousarray(weight, dtype=F32),
                                     xf if bias is None else np.ascontiguousarray(bias, dtype=F32), bias is not None,
                                     xf if past is None else np.ascontiguousarray(past, dtype=F32), past is not None,
                                     c.dilation, act)
        if err:
            raise_coded(CCWS_ERRORS, err, "CausalConvWithState")
        out, present = out.astype(T, copy=False), present.astype(T, copy=False)
        if c.channels_last:
            out = np.ascontiguousarray(out.transpose(0, 2, 1)).reshape(input.shape)
            present = np.ascontiguousarray(present.transpose(0, 2, 1)).reshape((B, P) + input.shape[2:])
        return out, present
    return run


def _ccws_form(e, c: Ccws):
    float_only(e, 0, 1, 2, 3)
    if e.rank(0) != 3 or e.rank(1) != 3 or (e.has(3) and e.rank(3) != 3):
        raise Decline("ranks")
    k = e.use(__name__, "ccws_f32")
    x = "np.ascontiguousarray(np.transpose({i0}, (0, 2, 1)))" if c.channels_last else "{i0}"
    past = ("np.zeros((1, 1, 1), np.float32)" if not e.has(3) else
            "np.ascontiguousarray(np.transpose({i3}, (0, 2, 1)))" if c.channels_last else "{i3}")
    bias = "{i2}" if e.has(2) else "np.zeros(1, np.float32)"
    e.line(f"{{p}}_err, {{p}}_y, {{p}}_st = {k}({x}, {{i1}}, {bias}, {e.has(2)}, {past}, {e.has(3)}, {c.dilation}, "
           f"{ccws_activation(c)})")
    raise_on(e, "{p}_err", [(code, cls, msg) for code, (cls, msg) in CCWS_ERRORS.items() if code < 4])
    if c.channels_last:
        e.line("{o0} = np.ascontiguousarray(np.transpose({p}_y, (0, 2, 1)))")
        if e.used(1):
            e.line("{o1} = np.ascontiguousarray(np.transpose({p}_st, (0, 2, 1)))")
    else:
        e.line("{o0} = {p}_y")
        if e.used(1):
            e.line("{o1} = {p}_st")


op("CausalConvWithState", 1, domain=MS, bind=bind_ccws)(_ccws_cpu)
op("CausalConvWithState", 27, bind=bind_ccws_27)(_ccws_cpu)
form("CausalConvWithState", domain=MS, bind=bind_ccws)(_ccws_form)
