"""Contrib attention ops (ops/contrib_attention.py) against onnxruntime's CPU kernels.

Only the rows onnxruntime specifies are compared: output rows of valid query tokens and the live
cache rows ``[0, seqlens_k[b] + 1)`` of ``present_key``/``present_value``.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import runtime
from runtime.errors import IndexOutOfRangeError, InvalidArgumentError

RNG = np.random.default_rng(0)
TOL = {np.float32: dict(rtol=1e-4, atol=2e-5), np.float16: dict(rtol=1e-2, atol=3e-3)}
ONNX_T = {np.float32: TP.FLOAT, np.float16: TP.FLOAT16, np.int64: TP.INT64, np.int32: TP.INT32}
MS = "com.microsoft"


def _model(op, inputs, outputs, **attrs):
    """inputs/outputs: (name, numpy dtype); an empty name is a skipped optional."""
    node = helper.make_node(op, [n for n, _ in inputs], [n for n, _ in outputs], domain=MS, **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, ONNX_T[t], None) for n, t in inputs if n],
        [helper.make_tensor_value_info(n, ONNX_T[t], None) for n, t in outputs if n])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])


def _both(model, feeds):
    ours = runtime.InferenceSession(model.SerializeToString()).run(None, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    return ours, want


def _rand(shape, dt=np.float32):
    return RNG.standard_normal(shape).astype(dt)


def _caches(max_len, rot, dt):
    inv = 1.0 / (10000 ** (np.arange(0, rot, 2) / rot))
    f = np.outer(np.arange(max_len), inv)
    return np.cos(f).astype(dt), np.sin(f).astype(dt)


def _gqa(B, S, P, H, kvH, D, seqlens, total, dt=np.float32, packed=False, rotary=False, interleaved=False,
         rot=None, share=0, pos_ids=False, bias=False, sink=False, **attrs):
    """Build and run one GroupQueryAttention; returns (ours, want, seqlens)."""
    feeds = {}
    ins = []
    if packed:
        feeds["query"] = _rand((B, S, (H + 2 * kvH) * D), dt)
        ins += [("query", dt), ("", dt), ("", dt)]
    else:
        feeds.update(query=_rand((B, S, H * D), dt), key=_rand((B, S, kvH * D), dt), value=_rand((B, S, kvH * D), dt))
        ins += [("query", dt), ("key", dt), ("value", dt)]
    plen = P + share
    if plen or P == 0 and share:
        feeds["past_key"] = _rand((B, kvH, plen, D), dt)
        feeds["past_value"] = _rand((B, kvH, plen, D), dt)
        ins += [("past_key", dt), ("past_value", dt)]
    else:
        ins += [("", dt), ("", dt)]
    feeds["seqlens_k"] = np.asarray(seqlens, np.int32)
    feeds["total_sequence_length"] = np.asarray([total], np.int32)
    ins += [("seqlens_k", np.int32), ("total_sequence_length", np.int32)]
    if rotary:
        c, s_ = _caches(max(total, plen) + 8, rot or D, dt)
        feeds.update(cos_cache=c, sin_cache=s_)
        ins += [("cos_cache", dt), ("sin_cache", dt)]
    else:
        ins += [("", dt), ("", dt)]
    if pos_ids:
        feeds["position_ids"] = (np.asarray(seqlens)[:, None] + 1 - S + np.arange(S)[None, :]).astype(np.int64)
        ins += [("position_ids", np.int64)]
    else:
        ins += [("", np.int64)]
    if bias:
        feeds["attention_bias"] = _rand((B, 1, S, total), dt)
        ins += [("attention_bias", dt)]
    else:
        ins += [("", dt)]
    if sink:
        feeds["head_sink"] = _rand((H,), dt)
        ins += [("head_sink", dt)]
    while ins and not ins[-1][0]:
        ins.pop()
    m = _model("GroupQueryAttention", ins, [("output", dt), ("present_key", dt), ("present_value", dt)],
               num_heads=H, kv_num_heads=kvH, do_rotary=int(rotary), rotary_interleaved=int(interleaved), **attrs)
    ours, want = _both(m, feeds)
    return ours, want, np.asarray(seqlens)


def _check(ours, want, seqlens, S, dt=np.float32, first_prompt=False):
    y, pk, pv = ours
    wy, wk, wv = want
    assert y.dtype == dt and y.shape == wy.shape and pk.shape == wk.shape and pv.shape == wv.shape
    for b, sl in enumerate(seqlens):
        T = int(sl) + 1
        rows = min(T, S) if first_prompt else S
        np.testing.assert_allclose(y[b, :rows].astype(np.float32), wy[b, :rows].astype(np.float32), **TOL[dt])
        np.testing.assert_allclose(pk[b, :, :T].astype(np.float32), wk[b, :, :T].astype(np.float32), **TOL[dt])
        np.testing.assert_allclose(pv[b, :, :T].astype(np.float32), wv[b, :, :T].astype(np.float32), **TOL[dt])


@pytest.mark.parametrize("H,kvH", [(4, 4), (4, 2), (8, 2), (16, 2)])
def test_gqa_prefill_no_past(H, kvH):
    B, S, D = 2, 13, 24
    ours, want, sl = _gqa(B, S, 0, H, kvH, D, [S - 1] * B, S)
    _check(ours, want, sl, S)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("packed,interleaved", [(True, False), (False, True)])
def test_gqa_prefill_rotary(dt, packed, interleaved):
    B, S, H, kvH, D = 1, 37, 8, 2, 32
    ours, want, sl = _gqa(B, S, 0, H, kvH, D, [S - 1], S, dt=dt, packed=packed, rotary=True, interleaved=interleaved,
                          share=0)
    _check(ours, want, sl, S, dt)


def test_gqa_prefill_right_padded_batch():
    B, S, H, kvH, D = 3, 9, 4, 2, 16
    sl = [8, 4, 0]
    ours, want, sl = _gqa(B, S, 0, H, kvH, D, sl, S, rotary=True, packed=True)
    _check(ours, want, sl, S, first_prompt=True)


@pytest.mark.parametrize("H,kvH,D", [(4, 1, 16), (8, 8, 48), (8, 4, 64), (32, 4, 64)])
def test_gqa_decode_with_past(H, kvH, D):
    B, P = 2, 21
    ours, want, sl = _gqa(B, 1, P, H, kvH, D, [P, P], P + 1, rotary=True)
    _check(ours, want, sl, 1)


def test_gqa_decode_shared_buffer_ragged():
    # past and present share one max-length buffer; entries hold different live lengths
    B, H, kvH, D, max_len = 2, 8, 2, 32, 64
    sl = [10, 30]
    ours, want, sl = _gqa(B, 1, 0, H, kvH, D, sl, 31, rotary=True, packed=True, share=max_len)
    assert ours[1].shape == (B, kvH, max_len, D)
    _check(ours, want, sl, 1)


def test_gqa_subsequent_prompt_and_pos_ids():
    B, S, P, H, kvH, D = 1, 5, 12, 6, 2, 16
    ours, want, sl = _gqa(B, S, P, H, kvH, D, [P + S - 1], P + S, rotary=True, pos_ids=True)
    _check(ours, want, sl, S)


@pytest.mark.parametrize("S,P", [(17, 0), (1, 30), (4, 20)])
def test_gqa_local_window_softcap(S, P):
    B, H, kvH, D = 1, 4, 2, 16
    ours, want, sl = _gqa(B, S, P, H, kvH, D, [P + S - 1], P + S, rotary=True, local_window_size=5, softcap=2.5,
                          scale=0.3)
    _check(ours, want, sl, S)


@pytest.mark.parametrize("S,P", [(5, 0), (1, 4)])
def test_gqa_local_window_of_zero_keys(S, P):
    """``local_window_size`` 0 attends no key: onnxruntime's output is zeros, its caches written as usual."""
    B, H, kvH, D = 2, 4, 2, 16
    ours, want, sl = _gqa(B, S, P, H, kvH, D, [P + S - 1] * B, P + S, rotary=True, local_window_size=0)
    assert not want[0].any()
    _check(ours, want, sl, S)


@pytest.mark.parametrize("S,P", [(6, 0), (1, 9)])
def test_gqa_bias_and_sink(S, P):
    B, H, kvH, D = 2, 4, 2, 8
    ours, want, sl = _gqa(B, S, P, H, kvH, D, [P + S - 1] * B, P + S, bias=True, sink=True)
    _check(ours, want, sl, S)
    ours, want, sl = _gqa(B, S, P, H, kvH, D, [P + S - 1] * B, P + S, smooth_softmax=1)
    _check(ours, want, sl, S)


def test_gqa_partial_rotary_fp16_decode():
    B, P, H, kvH, D = 1, 7, 4, 2, 32
    ours, want, sl = _gqa(B, 1, P, H, kvH, D, [P], P + 1, dt=np.float16, rotary=True, rot=16)
    _check(ours, want, sl, 1, np.float16)


def test_gqa_bad_seqlens():
    # seqlens_k claims more cached positions than past_key holds
    B, S, P, H, kvH, D, dt = 1, 1, 4, 2, 1, 8, np.float32
    ins = [("query", dt), ("key", dt), ("value", dt), ("past_key", dt), ("past_value", dt),
           ("seqlens_k", np.int32), ("total_sequence_length", np.int32)]
    m = _model("GroupQueryAttention", ins, [("output", dt), ("present_key", dt), ("present_value", dt)],
               num_heads=H, kv_num_heads=kvH)
    feeds = dict(query=_rand((B, S, H * D)), key=_rand((B, S, kvH * D)), value=_rand((B, S, kvH * D)),
                 past_key=_rand((B, kvH, P, D)), past_value=_rand((B, kvH, P, D)),
                 seqlens_k=np.array([P + 10], np.int32), total_sequence_length=np.array([P + 1], np.int32))
    with pytest.raises(InvalidArgumentError):
        runtime.InferenceSession(m.SerializeToString()).run(None, feeds)


def _resident(T, C, W):
    G = C - W + 1
    return T if T <= C else T - G * -(-(T - C) // G)


@pytest.mark.parametrize("C,W,steps", [(6, 4, [10, 1, 1, 1, 3, 1]), (8, 8, [3, 1, 1, 1, 1, 1, 1, 4]),
                                       (7, 3, [2, 5, 1, 1])])
def test_gqa_sliding_window_cache_steps(C, W, steps):
    # a decode loop over a window-sized cache; each step feeds onnxruntime's present as the next past
    B, H, kvH, D = 1, 4, 2, 16
    dt = np.float32
    ins = [("query", dt), ("key", dt), ("value", dt), ("past_key", dt), ("past_value", dt),
           ("seqlens_k", np.int32), ("total_sequence_length", np.int32), ("cos_cache", dt), ("sin_cache", dt)]
    m = _model("GroupQueryAttention", ins, [("output", dt), ("present_key", dt), ("present_value", dt)],
               num_heads=H, kv_num_heads=kvH, local_window_size=W, sliding_window_cache=1, do_rotary=1)
    cos, sin = _caches(64, D, dt)
    pk = np.zeros((B, kvH, C, D), dt)
    pv = np.zeros((B, kvH, C, D), dt)
    T = 0
    for S in steps:
        T += S
        feeds = dict(query=_rand((B, S, H * D)), key=_rand((B, S, kvH * D)), value=_rand((B, S, kvH * D)),
                     past_key=pk, past_value=pv, seqlens_k=np.array([T - 1], np.int32),
                     total_sequence_length=np.array([T], np.int32), cos_cache=cos, sin_cache=sin)
        (y, k, v), (wy, wk, wv) = _both(m, feeds)
        n = _resident(T, C, W)
        assert k.shape == wk.shape == (B, kvH, C, D)
        np.testing.assert_allclose(y, wy, **TOL[dt])
        np.testing.assert_allclose(k[:, :, :n], wk[:, :, :n], **TOL[dt])
        np.testing.assert_allclose(v[:, :, :n], wv[:, :, :n], **TOL[dt])
        pk, pv = wk, wv


def _rope_run(op, x, pos, cos, sin, **attrs):
    dt = x.dtype.type
    m = _model(op, [("input", dt), ("position_ids", np.int64), ("cos_cache", dt), ("sin_cache", dt)],
               [("output", dt)], **attrs)
    (got,), (want,) = _both(m, dict(input=x, position_ids=pos, cos_cache=cos, sin_cache=sin))
    assert got.dtype == x.dtype and got.shape == want.shape == x.shape
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), **TOL[dt])


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_3d(dt, interleaved):
    B, S, H, D = 2, 7, 4, 32
    cos, sin = _caches(64, D, dt)
    pos = RNG.integers(0, 64, (B, S)).astype(np.int64)
    _rope_run("RotaryEmbedding", _rand((B, S, H * D), dt), pos, cos, sin, interleaved=interleaved)


def test_rotary_embedding_4d_scalar_pos_partial():
    B, S, H, D, rot = 1, 5, 3, 64, 32
    cos, sin = _caches(64, rot, np.float32)
    _rope_run("RotaryEmbedding", _rand((B, H, S, D)), np.array([9], np.int64), cos, sin,
              rotary_embedding_dim=rot, num_heads=H)
    _rope_run("RotaryEmbedding", _rand((B, S, H * D)), np.array([3], np.int64), cos, sin,
              rotary_embedding_dim=rot, num_heads=H, interleaved=1)


def test_rotary_embedding_bad_position():
    cos, sin = _caches(8, 16, np.float32)
    m = _model("RotaryEmbedding", [("input", np.float32), ("position_ids", np.int64), ("cos_cache", np.float32),
                                   ("sin_cache", np.float32)], [("output", np.float32)])
    feeds = dict(input=_rand((1, 2, 32)), position_ids=np.array([[0, 8]], np.int64), cos_cache=cos, sin_cache=sin)
    with pytest.raises(IndexOutOfRangeError):
        runtime.InferenceSession(m.SerializeToString()).run(None, feeds)


@pytest.mark.parametrize("layout,section", [(0, [6, 5, 5]), (1, [6, 5, 5]), (0, [16, 0, 0])])
@pytest.mark.parametrize("rank", [3, 4])
def test_mrotary_embedding(layout, section, rank):
    B, S, H, D = 2, 6, 3, 32
    cos, sin = _caches(40, D, np.float32)
    pos = RNG.integers(0, 40, (3, B, S)).astype(np.int64)
    x = _rand((B, S, H * D)) if rank == 3 else _rand((B, H, S, D))
    _rope_run("MRotaryEmbedding", x, pos, cos, sin, mrope_section=section, mrope_layout=layout,
              num_heads=H if rank == 3 else 0)


def _mha(feeds, dt=np.float32, outputs=3, **attrs):
    order = ["query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key", "past_value"]
    types = {"key_padding_mask": np.int32}
    ins = [(n, types.get(n, dt)) if n in feeds else ("", dt) for n in order]
    while not ins[-1][0]:
        ins.pop()
    outs = [("output", dt), ("present_key", dt), ("present_value", dt), ("qk", dt)][:outputs]
    m = _model("MultiHeadAttention", ins, outs, num_heads=attrs.pop("num_heads"), **attrs)
    ours, want = _both(m, feeds)
    for a, b in zip(ours, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), **TOL[dt])


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_mha_self_past_bias_causal(dt):
    B, S, P, H, D = 2, 5, 7, 4, 16
    feeds = dict(query=_rand((B, S, H * D), dt), key=_rand((B, S, H * D), dt), value=_rand((B, S, H * D), dt),
                 bias=_rand((3 * H * D,), dt), past_key=_rand((B, H, P, D), dt), past_value=_rand((B, H, P, D), dt))
    _mha(feeds, dt, num_heads=H, unidirectional=1)
    _mha(feeds, dt, num_heads=H, scale=0.2)


def test_mha_cross_masks():
    B, S, L, H, D, Dv = 2, 6, 9, 2, 8, 16
    feeds = dict(query=_rand((B, S, H * D)), key=_rand((B, L, H * D)), value=_rand((B, L, H * Dv)),
                 key_padding_mask=(RNG.random((B, L)) > 0.3).astype(np.int32),
                 attention_bias=_rand((1, H, S, L)))
    _mha(feeds, num_heads=H, outputs=1)
    feeds["key_padding_mask"] = np.array([L, 4], np.int32)
    _mha(feeds, num_heads=H, outputs=1)


def test_mha_packed_and_bnsh():
    B, S, L, H, D = 1, 4, 6, 2, 8
    # onnxruntime's CPU kernel has no packed QKV: compare it with the unpacked form instead
    qkv, bias = _rand((B, S, H, 3, D)), _rand((3 * H * D,))
    m = _model("MultiHeadAttention", [("query", np.float32), ("", np.float32), ("", np.float32), ("bias", np.float32)],
               [("output", np.float32)], num_heads=H)
    got, = runtime.InferenceSession(m.SerializeToString()).run(None, dict(query=qkv, bias=bias))
    unpacked = {n: np.ascontiguousarray(qkv[:, :, :, i]).reshape(B, S, H * D) for i, n in
                enumerate(["query", "key", "value"])}
    m = _model("MultiHeadAttention", [("query", np.float32), ("key", np.float32), ("value", np.float32),
                                      ("bias", np.float32)], [("output", np.float32)], num_heads=H)
    want, = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, dict(unpacked, bias=bias))
    np.testing.assert_allclose(got, want, **TOL[np.float32])
    q, kv = _rand((B, S, H * D)), _rand((B, L, H, 2, D))
    m = _model("MultiHeadAttention", [("query", np.float32), ("key", np.float32)], [("output", np.float32)],
               num_heads=H)
    got, = runtime.InferenceSession(m.SerializeToString()).run(None, dict(query=q, key=kv))
    m = _model("MultiHeadAttention", [("query", np.float32), ("key", np.float32), ("value", np.float32)],
               [("output", np.float32)], num_heads=H)
    want, = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, dict(query=q, key=np.ascontiguousarray(kv[:, :, :, 0]).reshape(B, L, H * D),
                   value=np.ascontiguousarray(kv[:, :, :, 1]).reshape(B, L, H * D)))
    np.testing.assert_allclose(got, want, **TOL[np.float32])
    _mha(dict(query=_rand((B, S, H * D)), key=_rand((B, H, L, D)), value=_rand((B, H, L, D))), num_heads=H, outputs=1)


@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("S,P", [(5, 0), (1, 6)])
def test_gqa_qk_output(mode, S, P):
    B, H, kvH, D, dt = 2, 4, 2, 16, np.float32
    T = P + S
    ins = [("query", dt), ("key", dt), ("value", dt), ("past_key", dt) if P else ("", dt),
           ("past_value", dt) if P else ("", dt), ("seqlens_k", np.int32), ("total_sequence_length", np.int32)]
    m = _model("GroupQueryAttention", ins, [("output", dt), ("present_key", dt), ("present_value", dt),
                                            ("output_qk", dt)], num_heads=H, kv_num_heads=kvH, qk_output=mode)
    feeds = dict(query=_rand((B, S, H * D)), key=_rand((B, S, kvH * D)), value=_rand((B, S, kvH * D)),
                 seqlens_k=np.array([T - 1] * B, np.int32), total_sequence_length=np.array([T], np.int32))
    if P:
        feeds.update(past_key=_rand((B, kvH, P, D)), past_value=_rand((B, kvH, P, D)))
    ours, want = _both(m, feeds)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a, b, **TOL[dt])


def test_mha_qk_output():
    B, S, P, H, D = 1, 3, 4, 2, 8
    feeds = dict(query=_rand((B, S, H * D)), key=_rand((B, S, H * D)), value=_rand((B, S, H * D)),
                 past_key=_rand((B, H, P, D)), past_value=_rand((B, H, P, D)))
    _mha(feeds, num_heads=H, outputs=4, unidirectional=1)
    feeds.update(attention_bias=_rand((1, H, S, P + S)), key_padding_mask=np.ones((B, P + S), np.int32))
    _mha(feeds, num_heads=H, outputs=4)


def test_decode_kernel_serial_and_parallel_forms_agree():
    """Decode attention runs serially below GQA_DECODE_PARALLEL_WORK (wrapper and compiled form alike) and on the
    thread pool above it: the two forms give the same bits, 4-key passes and their remainder included."""
    from ops import contrib_attention as ca
    rng = np.random.default_rng(5)
    for T in (1, 6, 33):
        q = rng.standard_normal((2, 1, 8, 16)).astype(np.float32)
        pk = rng.standard_normal((2, 2, T + 3, 16)).astype(np.float32)
        pv = rng.standard_normal((2, 2, T + 3, 16)).astype(np.float32)
        past_b = np.array([T - 1, T - 2 if T > 1 else 0], np.int64)
        total_b = past_b + 1
        args = (q, pk, pv, past_b, total_b, np.zeros(2, np.int64), np.array([0.25, 0.0], np.float32), True, -1,
                np.zeros((1, 1, 1, 1), np.float32), False, np.zeros(1, np.float32), 0)
        a = np.empty((2, 1, 8, 16), np.float32)
        b = np.empty_like(a)
        ca.gqa_decode_par(*args, a)
        ca.gqa_decode_serial(*args, b)
        np.testing.assert_array_equal(a, b)
        # and against a plain softmax-attention reference
        for bi in range(2):
            n = int(total_b[bi])
            for h in range(8):
                s = pk[bi, h // 4, :n] @ q[bi, 0, h] * 0.25
                w = np.exp(s - s.max())
                w /= w.sum()
                np.testing.assert_allclose(a[bi, 0, h], w @ pv[bi, h // 4, :n], rtol=1e-5, atol=1e-5)


def _norm_reference(H, kvH, D, dt, eps):
    """GroupQueryAttention after the q/k norms written out (Reshape to heads, SimplifiedLayerNormalization,
    Reshape back), which onnxruntime runs on the CPU; the fused inputs it computes on CUDA and WebGPU only."""
    T = ONNX_T[dt]
    i64 = lambda name, v: helper.make_tensor(name, TP.INT64, [len(v)], v)  # noqa: E731
    nodes = []
    for x, n, w in (("query", H, "q_norm_weight"), ("key", kvH, "k_norm_weight")):
        nodes += [helper.make_node("Reshape", [x, f"{x}_heads_shape"], [f"{x}_heads"]),
                  helper.make_node("SimplifiedLayerNormalization", [f"{x}_heads", w], [f"{x}_normed"], axis=-1,
                                   epsilon=eps),
                  helper.make_node("Reshape", [f"{x}_normed", f"{x}_flat_shape"], [f"{x}_n"])]
    nodes.append(helper.make_node("GroupQueryAttention", ["query_n", "key_n", "value", "past_key", "past_value",
                                                          "seqlens_k", "total_sequence_length", "cos_cache",
                                                          "sin_cache"], ["output", "present_key", "present_value"],
                                  domain=MS, num_heads=H, kv_num_heads=kvH, do_rotary=1))
    names = [("query", T), ("key", T), ("value", T), ("past_key", T), ("past_value", T),
             ("seqlens_k", TP.INT32), ("total_sequence_length", TP.INT32), ("cos_cache", T), ("sin_cache", T),
             ("q_norm_weight", T), ("k_norm_weight", T)]
    inits = [i64("query_heads_shape", [0, 0, H, D]), i64("key_heads_shape", [0, 0, kvH, D]),
             i64("query_flat_shape", [0, 0, H * D]), i64("key_flat_shape", [0, 0, kvH * D])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, None) for n, t in names],
                          [helper.make_tensor_value_info(n, T, None) for n in ("output", "present_key",
                                                                               "present_value")], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("packed", [False, True])
def test_gqa_fused_qk_norms_equal_the_norms_written_out(dt, packed):
    """q_norm_weight and k_norm_weight (a CUDA export's Qwen 3 or Gemma 3 attention): each head RMS-normalised
    and scaled before rotary, against onnxruntime on the norms written out before the attention (a prompt after a
    past, unpacked; two rows' decode step, packed)."""
    B, S = (2, 1) if packed else (1, 3)
    P, H, kvH, D, eps = 4, 4, 2, 16, 1e-6
    q, k, v = _rand((B, S, H * D), dt), _rand((B, S, kvH * D), dt), _rand((B, S, kvH * D), dt)
    qw, kw = (1 + 0.5 * _rand((D,))).astype(dt), (1 + 0.5 * _rand((D,))).astype(dt)
    cos, sin = _caches(P + S + 4, D, dt)
    feeds = dict(past_key=_rand((B, kvH, P, D), dt), past_value=_rand((B, kvH, P, D), dt),
                 seqlens_k=np.full(B, P + S - 1, np.int32), total_sequence_length=np.asarray([P + S], np.int32),
                 cos_cache=cos, sin_cache=sin, q_norm_weight=qw, k_norm_weight=kw)
    want = ort.InferenceSession(_norm_reference(H, kvH, D, dt, eps).SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, dict(feeds, query=q, key=k, value=v))
    qkv = [("query", dt), ("", dt), ("", dt)] if packed else [("query", dt), ("key", dt), ("value", dt)]
    ins = qkv + [("past_key", dt), ("past_value", dt), ("seqlens_k", np.int32), ("total_sequence_length", np.int32),
                 ("cos_cache", dt), ("sin_cache", dt)] + [("", dt)] * 5 + [("q_norm_weight", dt),
                                                                         ("k_norm_weight", dt)]
    m = _model("GroupQueryAttention", ins, [("output", dt), ("present_key", dt), ("present_value", dt)],
               num_heads=H, kv_num_heads=kvH, do_rotary=1, qk_norm_epsilon=eps)
    mine = dict(feeds, query=np.concatenate([q, k, v], -1)) if packed else dict(feeds, query=q, key=k, value=v)
    ours = runtime.InferenceSession(m.SerializeToString()).run(None, mine)
    _check(ours, want, feeds["seqlens_k"], S, dt)
    with pytest.raises(InvalidArgumentError, match="must be given together"):
        m2 = _model("GroupQueryAttention", ins[:-1], [("output", dt)], num_heads=H, kv_num_heads=kvH, do_rotary=1)
        runtime.InferenceSession(m2.SerializeToString()).run(None, {n: v for n, v in mine.items()
                                                                     if n != "k_norm_weight"})
