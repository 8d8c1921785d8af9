"""com.microsoft EmbedLayerNormalization and Attention (ops/contrib_bert.py) against onnxruntime, on tiny graphs:
every mask format, past and present, causal masking, attention bias, unequal V width; ids out of range refused.

Tolerances, fixed before comparing: 1e-5 absolute for the embedding normalization (float32 sums of a few
terms), rtol 1e-4 / atol 1e-5 for attention (the projection's GEMM sums in another order than onnxruntime's)."""
import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession
from runtime.errors import IndexOutOfRangeError, InvalidArgumentError, ShapeMismatchError

MS = "com.microsoft"
F, I32 = TensorProto.FLOAT, TensorProto.INT32
RNG = np.random.default_rng(7)


def _model(node, inputs, outputs, inits):
    g = helper.make_graph([node], "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 9
    return m.SerializeToString()


def _both(model, feeds):
    ref = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    return InferenceSession(model).run(None, feeds), ref


# -- EmbedLayerNormalization -----------------------------------------------------------------------

V, P, NSEG, HID = 30, 12, 2, 16


def _embed_model(segments=True, mask=True, position_ids=None, outputs=3):
    ins = ["ids", "seg" if segments else "", "word", "pos", "semb" if segments else "", "gamma", "beta",
           "mask" if mask else "", "pid" if position_ids else ""]
    while ins and not ins[-1]:
        ins.pop()
    outs = ["y", "mask_index", "sum"][:outputs]
    node = helper.make_node("EmbedLayerNormalization", ins, outs, domain=MS, epsilon=1e-5)
    inputs = [helper.make_tensor_value_info("ids", I32, ["b", "s"])]
    if segments:
        inputs.append(helper.make_tensor_value_info("seg", I32, ["b", "s"]))
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", I32, ["b", "s"]))
    if position_ids:
        inputs.append(helper.make_tensor_value_info("pid", I32, [position_ids, "s"]))
    inits = {"word": RNG.standard_normal((V, HID)).astype(np.float32),
             "pos": RNG.standard_normal((P, HID)).astype(np.float32),
             "gamma": RNG.standard_normal(HID).astype(np.float32),
             "beta": RNG.standard_normal(HID).astype(np.float32)}
    if segments:
        inits["semb"] = RNG.standard_normal((NSEG, HID)).astype(np.float32)
    types = {"y": F, "mask_index": I32, "sum": F}
    return _model(node, inputs, [helper.make_tensor_value_info(o, types[o], None) for o in outs], inits)


@pytest.mark.parametrize("segments,mask,position_ids", [(True, True, None), (False, False, None),
                                                        (True, True, "b"), (False, True, 1)])
def test_embed_layer_normalization(segments, mask, position_ids):
    B, S = 3, 7
    feeds = {"ids": RNG.integers(0, V, (B, S)).astype(np.int32)}
    if segments:
        feeds["seg"] = RNG.integers(0, NSEG, (B, S)).astype(np.int32)
    if mask:  # a zero before the end: the count of ones, not the first zero's position
        feeds["mask"] = np.array([[1, 1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]], np.int32)
    if position_ids == "b":
        feeds["pid"] = RNG.integers(0, P, (B, S)).astype(np.int32)
    elif position_ids == 1:
        feeds["pid"] = np.array([[3, 1, 4, 1, 5, 9, 2]], np.int32)
    got, want = _both(_embed_model(segments, mask, position_ids), feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])
    assert got[1].dtype == np.int32
    np.testing.assert_allclose(got[2], want[2], rtol=0, atol=1e-5)


def test_embed_layer_normalization_refuses_ids_outside_their_tables():
    model = _embed_model(True, False, None, outputs=1)
    s = InferenceSession(model)
    ok = {"ids": np.zeros((1, 3), np.int32), "seg": np.zeros((1, 3), np.int32)}
    s.run(None, ok)
    for name, value in (("ids", V), ("ids", -1), ("seg", NSEG)):
        bad = dict(ok)
        bad[name] = ok[name].copy()
        bad[name][0, 1] = value
        with pytest.raises(IndexOutOfRangeError, match="outside"):
            s.run(None, bad)
    with pytest.raises(IndexOutOfRangeError, match="position_embedding"):
        s.run(None, {"ids": np.zeros((1, P + 1), np.int32), "seg": np.zeros((1, P + 1), np.int32)})


# -- Attention -------------------------------------------------------------------------------------

B, S, W, H = 2, 5, 12, 3


def _attn_model(hq=12, hv=12, mask_shape=None, past=0, bias=False, present=False, **attrs):
    D = hq // H
    ins = ["x", "w", "b", "mask" if mask_shape else "", "past" if past else "", "ab" if bias else ""]
    while ins and not ins[-1]:
        ins.pop()
    if hq != hv:
        attrs["qkv_hidden_sizes"] = [hq, hq, hv]
    node = helper.make_node("Attention", ins, ["y"] + (["present"] if present else []), domain=MS, num_heads=H,
                            **attrs)
    inputs = [helper.make_tensor_value_info("x", F, [B, S, W])]
    if mask_shape:
        inputs.append(helper.make_tensor_value_info("mask", I32, list(mask_shape)))
    if past:
        inputs.append(helper.make_tensor_value_info("past", F, [2, B, H, past, D]))
    if bias:
        inputs.append(helper.make_tensor_value_info("ab", F, [1, H, S, past + S]))
    inits = {"w": (RNG.standard_normal((W, 2 * hq + hv)) * 0.5).astype(np.float32),
             "b": (RNG.standard_normal(2 * hq + hv) * 0.1).astype(np.float32)}
    outs = [helper.make_tensor_value_info("y", F, None)]
    if present:
        outs.append(helper.make_tensor_value_info("present", F, None))
    return _model(node, inputs, outs, inits)


def _masks(kind, T):
    if kind == "lengths":
        return np.array([T, 3], np.int32)
    if kind == "left":
        return np.array([T, T, 0, 2], np.int32)  # ends, then starts
    if kind == "raw2":
        return np.array([[1] * T, [1, 0, 1] + [1] * (T - 3)], np.int32)
    if kind == "raw3":
        return (RNG.random((B, S, T)) > 0.3).astype(np.int32)
    return None


@pytest.mark.parametrize("kind", [None, "lengths", "left", "raw2", "raw3"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_masks(kind, unidirectional):
    T = S
    mask = _masks(kind, T)
    model = _attn_model(mask_shape=None if mask is None else mask.shape, unidirectional=unidirectional)
    feeds = {"x": RNG.standard_normal((B, S, W)).astype(np.float32)}
    if mask is not None:
        feeds["mask"] = mask
    got, want = _both(model, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_with_past_and_present(unidirectional):
    past = 4
    model = _attn_model(mask_shape=(B, past + S), past=past, present=True, unidirectional=unidirectional,
                        scale=0.3, mask_filter_value=-1000.0)
    feeds = {"x": RNG.standard_normal((B, S, W)).astype(np.float32),
             "mask": np.array([[1] * (past + S), [0, 1] + [1] * (past + S - 2)], np.int32),
             "past": RNG.standard_normal((2, B, H, past, W // H)).astype(np.float32)}
    got, want = _both(model, feeds)
    assert got[1].shape == (2, B, H, past + S, W // H)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_with_an_attention_bias(unidirectional):
    model = _attn_model(mask_shape=(B,), bias=True, unidirectional=unidirectional)
    feeds = {"x": RNG.standard_normal((B, S, W)).astype(np.float32), "mask": np.array([S, 3], np.int32),
             "ab": RNG.standard_normal((1, H, S, S)).astype(np.float32)}
    got, want = _both(model, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_attention_with_a_wider_value():
    model = _attn_model(hq=6, hv=12)
    feeds = {"x": RNG.standard_normal((B, S, W)).astype(np.float32)}
    got, want = _both(model, feeds)
    assert got[0].shape == (B, S, 12)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_attention_refuses_a_bias_with_past_as_onnxruntime_does():
    model = _attn_model(past=2, bias=True)
    with pytest.raises(InvalidArgumentError, match="attention_bias"):
        InferenceSession(model).run(None, {"x": np.zeros((B, S, W), np.float32),
                                           "past": np.zeros((2, B, H, 2, W // H), np.float32),
                                           "ab": np.zeros((1, H, S, S + 2), np.float32)})


def test_attention_refuses_a_mask_of_another_shape():
    model = _attn_model(mask_shape=(B, S + 1))
    with pytest.raises(ShapeMismatchError, match="mask_index"):
        InferenceSession(model).run(None, {"x": np.zeros((B, S, W), np.float32),
                                           "mask": np.ones((B, S + 1), np.int32)})
