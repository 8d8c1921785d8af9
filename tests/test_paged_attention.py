"""onnx_numba::PagedGroupQueryAttention against onnxruntime's GroupQueryAttention on the same caches laid out
contiguously: outputs, and the pools read back through the block table against onnxruntime's presents."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxruntime as ort

from ops.paged_attention import DOMAIN, OP
from runtime import InferenceSession
from runtime.errors import IndexOutOfRangeError, InvalidArgumentError

H, KVH, D, BS, NBLK = 4, 2, 16, 4, 12
ATOL, RTOL = 2e-5, 1e-4


def _gqa_model(packed, attrs):
    names = ["query", "key", "value"] if not packed else ["query", "", ""]
    node = helper.make_node("GroupQueryAttention", names + ["past_key", "past_value", "seqlens_k", "total", "cos",
                            "sin"], ["out", "present_key", "present_value"], domain="com.microsoft",
                            num_heads=H, kv_num_heads=KVH, **attrs)
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("query", f, None)]
    if not packed:
        ins += [helper.make_tensor_value_info("key", f, None), helper.make_tensor_value_info("value", f, None)]
    ins += [helper.make_tensor_value_info(n, f, None) for n in ("past_key", "past_value")]
    ins += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, None),
            helper.make_tensor_value_info("total", TensorProto.INT32, None),
            helper.make_tensor_value_info("cos", f, None), helper.make_tensor_value_info("sin", f, None)]
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "present_key", "present_value")]
    m = helper.make_model(helper.make_graph([node], "g", ins, outs),
                          opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def _paged_model(packed, attrs):
    names = ["query", "key", "value"] if not packed else ["query", "", ""]
    node = helper.make_node(OP, names + ["key_pool", "value_pool", "table", "seqlens_k", "total", "cos", "sin"],
                            ["out"], domain=DOMAIN, num_heads=H, kv_num_heads=KVH, **attrs)
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("query", f, None)]
    if not packed:
        ins += [helper.make_tensor_value_info("key", f, None), helper.make_tensor_value_info("value", f, None)]
    ins += [helper.make_tensor_value_info(n, f, [None, KVH, BS, D]) for n in ("key_pool", "value_pool")]
    ins += [helper.make_tensor_value_info("table", TensorProto.INT32, [None, None]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [None]),
            helper.make_tensor_value_info("total", TensorProto.INT32, []),
            helper.make_tensor_value_info("cos", f, None), helper.make_tensor_value_info("sin", f, None)]
    m = helper.make_model(helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("out", f, None)]),
                          opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)])
    m.ir_version = 10
    return m.SerializeToString()


def _rope(rng, rows=64):
    ang = rng.random((rows, D // 2)).astype(np.float32) * 3
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _case(rng, pasts, S, packed, attrs):
    """Each row against onnxruntime alone; the paged op on all rows at once, on shuffled blocks."""
    B = len(pasts)
    cos, sin = _rope(rng)
    width = (H + 2 * KVH) * D if packed else H * D
    q = rng.standard_normal((B, S, width)).astype(np.float32)
    k = rng.standard_normal((B, S, KVH * D)).astype(np.float32)
    v = rng.standard_normal((B, S, KVH * D)).astype(np.float32)
    totals = [p + S for p in pasts]
    kpool = rng.standard_normal((NBLK, KVH, BS, D)).astype(np.float32)  # garbage where nothing was written
    vpool = rng.standard_normal((NBLK, KVH, BS, D)).astype(np.float32)
    perm = rng.permutation(NBLK)
    need = [-(-t // BS) for t in totals]
    table = np.zeros((B, max(need)), np.int32)
    taken = 0
    for b in range(B):
        table[b, :need[b]] = perm[taken:taken + need[b]]
        taken += need[b]
    pasts_k, pasts_v = [], []
    for b in range(B):
        pk = rng.standard_normal((1, KVH, pasts[b], D)).astype(np.float32)
        pv = rng.standard_normal((1, KVH, pasts[b], D)).astype(np.float32)
        for p in range(pasts[b]):
            kpool[table[b, p // BS], :, p % BS] = pk[0, :, p]
            vpool[table[b, p // BS], :, p % BS] = pv[0, :, p]
        pasts_k.append(pk)
        pasts_v.append(pv)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    ref = ort.InferenceSession(_gqa_model(packed, attrs), so, providers=["CPUExecutionProvider"])
    outs, pres_k, pres_v = [], [], []
    for b in range(B):
        feeds = {"query": q[b:b + 1], "past_key": pasts_k[b], "past_value": pasts_v[b],
                 "seqlens_k": np.array([totals[b] - 1], np.int32), "total": np.array(totals[b], np.int32),
                 "cos": cos, "sin": sin}
        if not packed:
            feeds.update(key=k[b:b + 1], value=v[b:b + 1])
        o, pk, pv = ref.run(None, feeds)
        outs.append(o)
        pres_k.append(pk)
        pres_v.append(pv)
    sess = InferenceSession(_paged_model(packed, attrs))
    feeds = {"query": q, "key_pool": kpool, "value_pool": vpool, "table": table,
             "seqlens_k": np.array(totals, np.int32) - 1, "total": np.array(max(totals), np.int32),
             "cos": cos, "sin": sin}
    if not packed:
        feeds.update(key=k, value=v)
    got = sess.run(None, feeds)[0]
    for b in range(B):
        np.testing.assert_allclose(got[b:b + 1], outs[b], atol=ATOL, rtol=RTOL)
        for p in range(totals[b]):
            np.testing.assert_allclose(kpool[table[b, p // BS], :, p % BS], pres_k[b][0, :, p], atol=ATOL, rtol=RTOL)
            np.testing.assert_allclose(vpool[table[b, p // BS], :, p % BS], pres_v[b][0, :, p], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("pasts,S,packed,attrs", [
    ([0], 5, True, dict(do_rotary=1)),                                   # a prompt from nothing
    ([8], 3, True, dict(do_rotary=1)),                                   # a chunk after a reused prefix
    ([6, 9], 1, False, dict(softcap=3.0, local_window_size=4)),          # decode, two rows, own lengths
    ([5, 2, 11], 1, True, dict(do_rotary=1, rotary_interleaved=1, smooth_softmax=1, scale=0.3)),
])
def test_paged_matches_onnxruntime_gqa(pasts, S, packed, attrs):
    _case(np.random.default_rng(len(pasts) * 10 + S), pasts, S, packed, attrs)


@pytest.mark.parametrize("C,W,steps", [(6, 4, [9, 1, 1, 3, 1, 1]), (5, 5, [3, 1, 1, 1, 1, 2, 1])])
def test_windowed_cache_is_its_window_over_the_pools(C, W, steps):
    """A sliding-window layer (``sliding_window_cache=1``, capacity C, window W): onnxruntime keeps the resident
    rows in a buffer of capacity C, its present fed back as the next past; the paged op keeps every position in
    its blocks and attends the window.  Each step's output equals onnxruntime's, and the pools' last resident
    positions equal its present rows."""
    from ops.contrib_attention import resident_rows
    rng = np.random.default_rng(C * 10 + W)
    attrs = dict(do_rotary=1, local_window_size=W, sliding_window_cache=1)
    cos, sin = _rope(rng)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    ref = ort.InferenceSession(_gqa_model(False, attrs), so, providers=["CPUExecutionProvider"])
    sess = InferenceSession(_paged_model(False, attrs))
    kpool = rng.standard_normal((NBLK, KVH, BS, D)).astype(np.float32)
    vpool = rng.standard_normal((NBLK, KVH, BS, D)).astype(np.float32)
    table = rng.permutation(NBLK)[None, :-(-sum(steps) // BS)].astype(np.int32)
    pk = np.zeros((1, KVH, C, D), np.float32)
    pv = np.zeros((1, KVH, C, D), np.float32)
    T = 0
    for S in steps:
        T += S
        q, k, v = (rng.standard_normal((1, S, n * D)).astype(np.float32) for n in (H, KVH, KVH))
        want, pk, pv = ref.run(None, {"query": q, "key": k, "value": v, "past_key": pk, "past_value": pv,
                                      "seqlens_k": np.array([T - 1], np.int32), "total": np.array(T, np.int32),
                                      "cos": cos, "sin": sin})
        got = sess.run(None, {"query": q, "key": k, "value": v, "key_pool": kpool, "value_pool": vpool,
                              "table": table, "seqlens_k": np.array([T - 1], np.int32),
                              "total": np.array(T, np.int32), "cos": cos, "sin": sin})[0]
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)
        n = int(resident_rows(T, C, W))
        for i in range(n):
            p = T - n + i
            np.testing.assert_allclose(kpool[table[0, p // BS], :, p % BS], pk[0, :, i], atol=ATOL, rtol=RTOL)
            np.testing.assert_allclose(vpool[table[0, p // BS], :, p % BS], pv[0, :, i], atol=ATOL, rtol=RTOL)


def _bad_feeds(table, seqlens):
    rng = np.random.default_rng(1)
    cos, sin = _rope(rng)
    return {"query": rng.standard_normal((1, 1, (H + 2 * KVH) * D)).astype(np.float32),
            "key_pool": np.zeros((NBLK, KVH, BS, D), np.float32), "value_pool": np.zeros((NBLK, KVH, BS, D), np.float32),
            "table": np.array(table, np.int32), "seqlens_k": np.array(seqlens, np.int32),
            "total": np.array(max(seqlens) + 1, np.int32), "cos": cos, "sin": sin}


@pytest.mark.parametrize("table,seqlens,cls,words", [
    ([[0, NBLK]], [5], IndexOutOfRangeError, "block id is outside the pool"),
    ([[0, -1]], [5], IndexOutOfRangeError, "block id is outside the pool"),
    ([[0]], [5], IndexOutOfRangeError, "past its block table"),
])
def test_paged_refuses_what_it_cannot_read(table, seqlens, cls, words):
    sess = InferenceSession(_paged_model(True, dict(do_rotary=1)))
    feeds = _bad_feeds(table, seqlens)
    before = feeds["key_pool"].copy()
    with pytest.raises(cls, match=words):
        sess.run(None, feeds)
    assert np.array_equal(feeds["key_pool"], before)  # nothing written


def test_paged_refuses_fewer_positions_than_new_tokens():
    sess = InferenceSession(_paged_model(True, dict(do_rotary=1)))
    feeds = _bad_feeds([[0, 1]], [5])
    feeds["query"] = np.zeros((1, 8, (H + 2 * KVH) * D), np.float32)
    with pytest.raises(InvalidArgumentError, match="fewer than its new tokens"):
        sess.run(None, feeds)
