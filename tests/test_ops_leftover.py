"""Leftover ops: FlexAttention (ops/flex_attention.py), the Optional family (ops/optional.py) and the
random generators (ops/random.py).

onnxruntime has no FlexAttention kernel, so FlexAttention is compared with
onnxruntime's Attention (opset 23) on the same 4-d inputs, where the two
coincide (no modifier; a causal score_mod vs is_causal=1; a soft-cap
score_mod vs softcap), and with a numpy reference for prob_mod.  Random ops
cannot match any other implementation number for number, so they are
checked for shape, dtype, range, moments, seed determinism and against
onnxruntime's distribution.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import runtime
from runtime.errors import InvalidArgumentError, ShapeMismatchError

RNG = np.random.default_rng(0)
TOL = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float16: dict(rtol=1e-2, atol=2e-3),
       np.float64: dict(rtol=1e-5, atol=1e-6)}  # ORT computes the scale in float32
ONNX_T = {np.float32: TP.FLOAT, np.float16: TP.FLOAT16, np.float64: TP.DOUBLE}
PREVIEW = "ai.onnx.preview"


def _ours(model, feeds):
    return runtime.InferenceSession(model.SerializeToString()).run(None, feeds)


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


# -- FlexAttention ---------------------------------------------------------------------------------

def _flex_model(dt, score_mod=None, prob_mod=None, **attrs):
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain=PREVIEW, **attrs)
    if score_mod is not None:
        node.attribute.append(helper.make_attribute("score_mod", score_mod))
    if prob_mod is not None:
        node.attribute.append(helper.make_attribute("prob_mod", prob_mod))
    t = ONNX_T[dt]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, None) for n in "QKV"],
                          [helper.make_tensor_value_info("Y", t, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 26), helper.make_opsetid(PREVIEW, 1)])


def _attn_model(dt, **attrs):
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], **attrs)
    t = ONNX_T[dt]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, None) for n in "QKV"],
                          [helper.make_tensor_value_info("Y", t, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])


def _mod_graph(nodes, inits, dt=TP.FLOAT):
    return helper.make_graph(nodes, "mod", [helper.make_tensor_value_info("s", dt, None)],
                             [helper.make_tensor_value_info("o", dt, None)], inits)


def _causal_mod():
    nodes = [
        helper.make_node("Shape", ["s"], ["shp"]),
        helper.make_node("Gather", ["shp", "i2"], ["L"], axis=0),
        helper.make_node("Gather", ["shp", "i3"], ["S"], axis=0),
        helper.make_node("Range", ["zero", "L", "one"], ["qr"]),
        helper.make_node("Reshape", ["qr", "qs"], ["qi"]),
        helper.make_node("Range", ["zero", "S", "one"], ["kr"]),
        helper.make_node("Reshape", ["kr", "ks"], ["ki"]),
        helper.make_node("GreaterOrEqual", ["qi", "ki"], ["m"]),
        helper.make_node("Where", ["m", "s", "ninf"], ["o"]),
    ]
    inits = [helper.make_tensor("zero", TP.INT64, [], [0]), helper.make_tensor("one", TP.INT64, [], [1]),
             helper.make_tensor("i2", TP.INT64, [], [2]), helper.make_tensor("i3", TP.INT64, [], [3]),
             helper.make_tensor("qs", TP.INT64, [2], [-1, 1]), helper.make_tensor("ks", TP.INT64, [2], [1, -1]),
             helper.make_tensor("ninf", TP.FLOAT, [], [float("-inf")])]
    return _mod_graph(nodes, inits)


def _qkv(B, Hq, Hkv, L, S, E, Ev, dt):
    return {"Q": RNG.standard_normal((B, Hq, L, E)).astype(dt), "K": RNG.standard_normal((B, Hkv, S, E)).astype(dt),
            "V": RNG.standard_normal((B, Hkv, S, Ev)).astype(dt)}


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64])
def test_flex_plain_gqa_vs_ort_attention(dt):
    # 32 query heads over 8 KV heads, 256 queries x 512 keys, head size 64
    feeds = _qkv(1, 32, 8, 256, 512, 64, 64, dt)
    got, = _ours(_flex_model(dt), feeds)
    want, = _ort(_attn_model(dt), feeds)
    assert got.dtype == dt and got.shape == (1, 32, 256, 64)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **TOL[dt])


def test_flex_causal_score_mod_vs_ort_is_causal():
    feeds = _qkv(2, 8, 8, 128, 128, 64, 32, np.float32)
    got, = _ours(_flex_model(np.float32, score_mod=_causal_mod(), scale=0.1), feeds)
    want, = _ort(_attn_model(np.float32, is_causal=1, scale=0.1), feeds)
    np.testing.assert_allclose(got, want, **TOL[np.float32])


def test_flex_softcap_score_mod_vs_ort_softcap():
    nodes = [helper.make_node("Div", ["s", "cap"], ["d"]), helper.make_node("Tanh", ["d"], ["t"]),
             helper.make_node("Mul", ["t", "cap"], ["o"])]
    mod = _mod_graph(nodes, [helper.make_tensor("cap", TP.FLOAT, [], [5.0])])
    feeds = _qkv(1, 4, 2, 64, 96, 32, 32, np.float32)
    got, = _ours(_flex_model(np.float32, score_mod=mod), feeds)
    want, = _ort(_attn_model(np.float32, softcap=5.0), feeds)
    np.testing.assert_allclose(got, want, **TOL[np.float32])


def test_flex_prob_mod_and_fully_masked_rows():
    # prob_mod halves the probabilities; score_mod masks everything for the first query row
    pm = _mod_graph([helper.make_node("Mul", ["s", "h"], ["o"])], [helper.make_tensor("h", TP.FLOAT, [], [0.5])])
    mask = np.zeros((1, 1, 16, 24), np.float32)
    mask[..., 0, :] = -np.inf
    sm = _mod_graph([helper.make_node("Add", ["s", "mask"], ["o"])],
                    [helper.make_tensor("mask", TP.FLOAT, mask.shape, mask.reshape(-1))])
    feeds = _qkv(2, 4, 4, 16, 24, 8, 8, np.float32)
    got, = _ours(_flex_model(np.float32, score_mod=sm, prob_mod=pm), feeds)
    q, k, v = feeds["Q"].astype(np.float64), feeds["K"].astype(np.float64), feeds["V"].astype(np.float64)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8) + mask
    p = np.exp(s[..., 1:, :] - s[..., 1:, :].max(-1, keepdims=True))
    p = 0.5 * p / p.sum(-1, keepdims=True)
    want = np.concatenate([np.zeros((2, 4, 1, 8)), p @ v], axis=2)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_flex_rejects_bad_shapes():
    feeds = _qkv(1, 3, 2, 4, 4, 8, 8, np.float32)
    with pytest.raises(ShapeMismatchError, match="multiple of kv heads"):
        _ours(_flex_model(np.float32), feeds)
    feeds = {"Q": np.zeros((1, 2, 4, 8), np.float32), "K": np.zeros((1, 2, 4, 6), np.float32),
             "V": np.zeros((1, 2, 4, 8), np.float32)}
    with pytest.raises(ShapeMismatchError, match="inconsistent shapes"):
        _ours(_flex_model(np.float32), feeds)


# -- Optional --------------------------------------------------------------------------------------

def _opt_model(nodes, inputs, outputs, opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_optional_roundtrip_vs_ort():
    x_t = helper.make_tensor_type_proto(TP.FLOAT, [3, 4])
    nodes = [helper.make_node("Optional", ["x"], ["o"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalGetElement", ["o"], ["y"]),
             helper.make_node("Optional", [], ["e"], type=x_t),
             helper.make_node("OptionalHasElement", ["e"], ["has_e"])]
    m = _opt_model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [3, 4])],
                   [helper.make_tensor_value_info("has", TP.BOOL, []),
                    helper.make_tensor_value_info("y", TP.FLOAT, [3, 4]),
                    helper.make_tensor_value_info("has_e", TP.BOOL, [])])
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    got = _ours(m, {"x": x})
    want = _ort(m, {"x": x})
    for g_, w_ in zip(got, want):
        np.testing.assert_array_equal(g_, w_)
    assert got[1] is not x and not np.shares_memory(got[1], x)


def test_optional_feeds_pass_the_feed_check():
    # an optional(sequence) graph input: a list, and None for an empty optional
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TP.INT32, [None]))
    opt_vi = helper.make_value_info("o", helper.make_optional_type_proto(seq_t))
    out_vi = helper.make_value_info("y", seq_t)
    m = _opt_model([helper.make_node("OptionalGetElement", ["o"], ["y"]),
                    helper.make_node("OptionalHasElement", ["o"], ["has"])],
                   [opt_vi], [out_vi, helper.make_tensor_value_info("has", TP.BOOL, [])])
    seq = [np.arange(3, dtype=np.int32), np.arange(5, dtype=np.int32)]
    sess = runtime.InferenceSession(m.SerializeToString())
    y, has = sess.run(None, {"o": seq})
    assert has.dtype == np.bool_ and bool(has) and len(y) == 2
    np.testing.assert_array_equal(y[1], seq[1])
    m2 = _opt_model([helper.make_node("OptionalHasElement", ["o"], ["has"])], [opt_vi],
                    [helper.make_tensor_value_info("has", TP.BOOL, [])])
    has, = runtime.InferenceSession(m2.SerializeToString()).run(None, {"o": None})
    assert has.shape == () and not bool(has)
    with pytest.raises(InvalidArgumentError, match="empty"):
        runtime.InferenceSession(m.SerializeToString()).run(None, {"o": None})


# -- random ----------------------------------------------------------------------------------------

def _rand_model(op, attrs, inputs=(), out_t=TP.FLOAT, opset=21):  # onnxruntime has no opset-22 kernels
    node = helper.make_node(op, [n for n, _, _ in inputs], ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info("y", out_t, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("dt", [TP.FLOAT, TP.DOUBLE, TP.FLOAT16])
def test_random_uniform_moments_and_range(dt):
    m = _rand_model("RandomUniform", dict(shape=[1000, 1000], low=-2.0, high=3.0, dtype=dt, seed=1.0), out_t=dt)
    y, = _ours(m, {})
    want_dt = {TP.FLOAT: np.float32, TP.DOUBLE: np.float64, TP.FLOAT16: np.float16}[dt]
    assert y.dtype == want_dt and y.shape == (1000, 1000)
    assert y.min() >= -2.0 and y.max() <= 3.0
    assert abs(y.astype(np.float64).mean() - 0.5) < 0.01
    assert abs(y.astype(np.float64).var() - 25 / 12) < 0.02
    # against onnxruntime's own draw: same distribution (quantiles), not the same numbers
    w, = _ort(_rand_model("RandomUniform", dict(shape=[1000, 1000], low=-2.0, high=3.0, dtype=TP.FLOAT, seed=2.0)),
              {})
    qs = [0.01, 0.25, 0.5, 0.75, 0.99]
    np.testing.assert_allclose(np.quantile(y.astype(np.float64), qs), np.quantile(w, qs), atol=0.02)


def _quantile_se(dist, q, n):
    """Standard error of the q-quantile of n draws from `dist`: sqrt(q(1-q)/n) / density there."""
    return float(np.sqrt(q * (1 - q) / n) / dist.pdf(dist.inv_cdf(q)))


def test_random_normal_moments_vs_ort():
    # both draws seeded, so the test is deterministic; the bounds are six standard errors of each
    # quantile, from the normal law itself, so an honest draw never comes near them
    from statistics import NormalDist
    m = _rand_model("RandomNormal", dict(shape=[2000, 500], mean=1.5, scale=2.0, seed=5.0))
    y, = _ours(m, {})
    w, = _ort(m, {})
    assert y.dtype == np.float32 and y.shape == (2000, 500)
    assert abs(y.mean() - 1.5) < 0.01 and abs(y.std() - 2.0) < 0.01
    law, n = NormalDist(1.5, 2.0), y.size
    qs = [0.01, 0.1, 0.5, 0.9, 0.99]
    want = np.array([law.inv_cdf(q) for q in qs])
    se = np.array([_quantile_se(law, q, n) for q in qs])
    assert np.all(np.abs(np.quantile(y, qs) - want) < 6 * se)
    assert np.all(np.abs(np.quantile(y, qs) - np.quantile(w, qs)) < 6 * np.sqrt(2) * se)


def test_random_seed_is_deterministic_per_session_and_advances():
    m = _rand_model("RandomNormal", dict(shape=[7, 5], seed=3.0)).SerializeToString()
    a, b = runtime.InferenceSession(m), runtime.InferenceSession(m)
    a1, a2 = a.run(None, {})[0], a.run(None, {})[0]
    b1 = b.run(None, {})[0]
    np.testing.assert_array_equal(a1, b1)
    assert not np.array_equal(a1, a2)
    c = runtime.InferenceSession(_rand_model("RandomNormal", dict(shape=[7, 5], seed=4.0)).SerializeToString())
    assert not np.array_equal(a1, c.run(None, {})[0])


def test_random_like_ops_take_shape_and_dtype():
    x = np.zeros((3, 4, 5), np.float64)
    for op in ("RandomUniformLike", "RandomNormalLike"):
        y, = _ours(_rand_model(op, {}, [("x", TP.DOUBLE, [3, 4, 5])], out_t=TP.DOUBLE, opset=22), {"x": x})
        assert y.dtype == np.float64 and y.shape == x.shape
        y, = _ours(_rand_model(op, dict(dtype=TP.FLOAT16), [("x", TP.INT64, [3, 4, 5])], out_t=TP.FLOAT16),
                   {"x": x.astype(np.int64)})
        assert y.dtype == np.float16 and y.shape == x.shape


def test_bernoulli_rates_and_extremes():
    p = np.tile(np.array([0.0, 0.1, 0.5, 0.9, 1.0], np.float32), (200000, 1))
    y, = _ours(_rand_model("Bernoulli", dict(seed=8.0), [("x", TP.FLOAT, list(p.shape))]), {"x": p})
    assert y.dtype == np.float32 and y.shape == p.shape
    assert set(np.unique(y)) <= {0.0, 1.0}
    rates = y.mean(axis=0)
    assert rates[0] == 0.0 and rates[4] == 1.0
    np.testing.assert_allclose(rates[1:4], [0.1, 0.5, 0.9], atol=0.005)
    yb, = _ours(_rand_model("Bernoulli", dict(dtype=TP.BOOL), [("x", TP.FLOAT, list(p.shape))], out_t=TP.BOOL),
                {"x": p})
    assert yb.dtype == np.bool_


def test_multinomial_frequencies_vs_ort():
    with np.errstate(divide="ignore"):
        logits = np.log(np.array([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]], np.float32))
    m = _rand_model("Multinomial", dict(sample_size=100000, seed=7.0), [("x", TP.FLOAT, [2, 3])], out_t=TP.INT32, opset=7)
    y, = _ours(m, {"x": logits})
    w, = _ort(m, {"x": logits})
    assert y.dtype == np.int32 and y.shape == (2, 100000)
    assert y.min() >= 0 and y.max() <= 2 and not (y[1] == 2).any()
    for row in range(2):
        f_ours = np.bincount(y[row], minlength=3) / y.shape[1]
        f_ort = np.bincount(w[row], minlength=3) / w.shape[1]
        np.testing.assert_allclose(f_ours, f_ort, atol=0.01)
    y64, = _ours(_rand_model("Multinomial", dict(sample_size=4, dtype=TP.INT64), [("x", TP.FLOAT, [2, 3])],
                             out_t=TP.INT64, opset=7), {"x": logits})
    assert y64.dtype == np.int64 and y64.shape == (2, 4)
