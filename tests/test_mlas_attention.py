"""GroupQueryAttention and Sigmoid in MLAS's order (``ops/_mlas_attention``, ``ops/_fastmath.fsigmoid_mlas``) with
``ONNX_NUMBA_MLAS_ORDER=1``: bit for bit onnxruntime's CPU kernels (``np.array_equal``) on x86 hosts with AVX2,
where onnxruntime takes MLAS's FMA3 kernels (without AVX-512) or its AVX-512 ones (sum-exp, SiLU).  Each case also
shows that it tells the orders apart: the default kernels' result differs from onnxruntime's on it (on hosts
without AVX-512 the default kernels run prompt steps on the same flash kernel, so there the rotary tells them
apart).  The sum-exp forms, MLAS's SGEMM passes and its one-row kernel are checked against their orders written
out on every host."""
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from fixtures.gqa_node import gqa_feeds, gqa_model
from ops import _mlas_attention as ma
from ops import contrib_quant as Q

onnxruntime_host = pytest.mark.skipif(not (Q.mlas_avx2_host() or Q.mlas_avx512_host()),
                                      reason="onnxruntime takes MLAS's FMA3 or AVX-512 kernels only on x86 hosts")
F = np.float32


def _kvb(D):
    return ma.kv_block(D, ma.L2_BYTES)


# (heads, kv heads, head size, scale, rotary, interleaved, B, S, P, seqlens, total, onnxruntime threads), then
# optionally a local window and the attention bias's broadcast (per batch row, per head)
CASES = {
    "prompt": lambda: (4, 2, 32, 0.0, 1, 0, 1, 9, 0, [8], 9, 2),
    "decode": lambda: (4, 2, 80, 0.0, 1, 0, 1, 1, 9, [9], 10, 2),
    "chunk after a past": lambda: (4, 2, 32, 0.125, 1, 0, 1, 5, 7, [11], 12, 2),
    "interleaved rotary": lambda: (4, 2, 48, 0.0, 1, 1, 1, 9, 0, [8], 9, 2),
    "no rotary, ragged decode": lambda: (4, 2, 32, 0.0, 0, 0, 2, 1, 9, [5, 8], 9, 2),
    "padded batch": lambda: (4, 2, 32, 0.0, 1, 0, 2, 6, 0, [3, 5], 6, 2),
    "ragged decode": lambda: (4, 2, 32, 0.0, 1, 0, 2, 1, 9, [5, 8], 9, 2),
    # keys over several of onnxruntime's blocks: the online rescaling by libm's expf
    "several key blocks": lambda: (2, 1, 256, 0.0, 1, 0, 1, 2 * _kvb(256) + 5, 0, [2 * _kvb(256) + 4],
                                   2 * _kvb(256) + 5, 2),
    # fewer heads than onnxruntime's threads: flash decoding splits the keys
    "split decode": lambda: (2, 1, 256, 0.0, 1, 0, 1, 1, 2 * _kvb(256) + 5, [2 * _kvb(256) + 5],
                             2 * _kvb(256) + 6, 4),
    # query blocks of 64 rows, the last of one: MLAS's SGEMM hands it to its one-row kernel
    "a one-row query block": lambda: (4, 2, 32, 0.0, 1, 0, 1, 65, 0, [64], 65, 2),
    # a key block longer than MLAS's SGEMM takes in one pass (256 keys at head size 64; on hosts with a 1 MiB L2)
    "keys past one SGEMM pass": lambda: (2, 1, 64, 0.0, 1, 0, 1, min(_kvb(64), 300), 0, [min(_kvb(64), 300) - 1],
                                         min(_kvb(64), 300), 2),
    # a local window: keys before it set to -FLT_MAX inside the sums, on every path
    "local window, prompt": lambda: (2, 1, 32, 0.0, 1, 0, 1, 20, 0, [19], 20, 2, 8),
    "local window, chunk after a past": lambda: (4, 2, 32, 0.0, 1, 0, 1, 6, 9, [14], 15, 2, 5),
    "local window, ragged decode": lambda: (4, 2, 32, 0.0, 1, 0, 2, 1, 9, [5, 8], 9, 2, 3),
    "local window, split decode": lambda: (2, 1, 256, 0.0, 1, 0, 1, 1, 2 * _kvb(256) + 5, [2 * _kvb(256) + 5],
                                           2 * _kvb(256) + 6, 4, _kvb(256) // 3),
    # an additive attention bias after the scale, broadcast or not
    "bias, prompt": lambda: (2, 1, 32, 0.0, 1, 0, 1, 20, 0, [19], 20, 2, None, (False, True)),
    "bias and window, decode": lambda: (4, 2, 32, 0.0, 1, 0, 2, 1, 9, [9, 9], 10, 2, 4, (True, True)),
    "bias, split decode": lambda: (2, 1, 256, 0.0, 1, 0, 1, 1, 2 * _kvb(256) + 5, [2 * _kvb(256) + 5],
                                   2 * _kvb(256) + 6, 4, None, (False, False)),
}


def _ort(model, feeds, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _native(model, feeds, compiled=False):
    import runtime as rt
    so = rt.SessionOptions()
    so.compiled_regions = compiled
    return rt.InferenceSession(model, so).run(None, feeds)


@onnxruntime_host
@pytest.mark.parametrize("case", list(CASES))
def test_gqa_bit_for_bit_onnxruntime(case, monkeypatch):
    nh, kv, D, scale, rot, inter, B, S, P, seqlens, total, threads, *more = CASES[case]()
    window, bias = (more + [None, None])[:2]
    if case == "keys past one SGEMM pass" and S <= 256:
        pytest.skip(f"onnxruntime's key blocks on this host ({_kvb(D)} keys) fit one SGEMM pass")
    model = gqa_model(nh, kv, D, scale, rot, inter, window, bias is not None).SerializeToString()
    feeds = gqa_feeds(nh, kv, D, B, S, P, seqlens, total, seed=len(case), amp=2.0, bias=bias)
    monkeypatch.setenv("ONNX_NUMBA_ORT_THREADS", str(threads))  # onnxruntime's thread count decides flash decoding
    want = _ort(model, feeds, threads)
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "0")
    assert not np.array_equal(_native(model, feeds)[0], want[0])  # the case tells the orders apart
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    for got, ref in zip(_native(model, feeds), want):
        np.testing.assert_array_equal(got, ref)
    if case in PATHS:  # the case runs the path it names: without it the bits differ
        attr, value = PATHS[case]
        if attr == "ONNX_NUMBA_ORT_THREADS":
            monkeypatch.setenv(attr, str(value))
        else:
            monkeypatch.setattr(ma, attr, value)
        assert not np.array_equal(_native(model, feeds)[0], want[0])


# case -> the module value (or setting) that takes its path away: one key block for all keys, or no split
PATHS = {"several key blocks": ("L2_BYTES", 1 << 40), "split decode": ("ONNX_NUMBA_ORT_THREADS", 1)}


@onnxruntime_host
@pytest.mark.parametrize("attrs,twin", [({}, "gqa_f32_mlas_flash"), ({"softcap": 5.0}, "gqa_f32_mlas")])
def test_gqa_in_a_compiled_region(attrs, twin, monkeypatch):
    """The region form (the decoders' path) follows the setting as the node wrapper does; a node whose every step
    takes the flash kernels (attributes, a head size known at plan time) runs the twin that compiles only those."""
    import re
    import runtime as rt
    nh, kv, D = 4, 2, 32
    proto = gqa_model(nh, kv, D, **attrs)
    proto.graph.node.append(h.make_node("Add", ["output", "output"], ["z"]))  # a region needs two nodes
    proto.graph.output.append(h.make_tensor_value_info("z", T.FLOAT, None))
    model = proto.SerializeToString()
    feeds = gqa_feeds(nh, kv, D, 1, 7, 0, [6], 7, seed=3, amp=2.0)
    want = _ort(model, feeds, 2)
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    so = rt.SessionOptions()
    so.compiled_regions = True
    sess = rt.InferenceSession(model, so)
    assert "GroupQueryAttention" in [n.op_type for r in sess.plan.regions for n in r.nodes]
    calls = r"\b(gqa_f32\w*?)__ops_group_query_attention"
    drivers = {m for r in sess.plan.regions for m in re.findall(calls, r.source)}
    assert drivers == {twin}
    got = sess.run(None, feeds)
    assert len(got) == len(want) == 4
    for g, ref in zip(got, want):
        np.testing.assert_array_equal(g, ref)


def test_flash_only_driver_refuses_a_step_it_does_not_compile(monkeypatch):
    """``gqa_f32_mlas_flash`` compiles the flash kernels alone: handed a step they do not take (here a softcap,
    which the plan's check keeps from it), it raises code 14 instead of running the flash kernels without the
    softcap; the general driver runs the same step."""
    import runtime as rt
    from ops import group_query_attention as gq
    from runtime.errors import ShapeMismatchError
    nh, kv, D = 4, 2, 32
    model = gqa_model(nh, kv, D, softcap=5.0).SerializeToString()
    feeds = gqa_feeds(nh, kv, D, 1, 3, 0, [2], 3, seed=4)
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    monkeypatch.setattr(gq, "driver", lambda mlas, blocked=False, flash_only=False: gq.gqa_f32_mlas_flash)
    with pytest.raises(ShapeMismatchError, match="the plan compiled this node's attention kernels for"):
        rt.InferenceSession(model).run(None, feeds)
    monkeypatch.setattr(gq, "driver", lambda mlas, blocked=False, flash_only=False: gq.gqa_f32_mlas)
    assert rt.InferenceSession(model).run(None, feeds)[0].shape == (1, 3, nh * D)


def test_sum_exp_orders():
    """MLAS's sum-exp kernels: the elements by its polynomial (FMA3: times 2**m built in the exponent bits, which
    gives 0 below 2**-126; AVX-512: ``vscalefps``, one rounding, denormals kept), the sum in 8 lanes over chunks of
    8 (FMA3; a partial last chunk fills lanes from 0) or in 16 lanes (AVX-512: lane i takes elements i, i + 16, ...;
    then ``s_i = l_i + l_{i+8}``), folded pairwise.  Pinned on a row whose other orders round differently."""
    rng = np.random.default_rng(10)
    row = rng.standard_normal(45).astype(F) * 3
    row[40] = F(-86.9)  # e**-88.4: a denormal
    p8, p16 = row.copy(), row.copy()
    s8 = ma.sum_exp8(p8, 45, F(-1.5))
    s16 = ma.sum_exp16(p16, 45, F(-1.5))
    lanes = np.zeros(8, F)
    for c in range(0, 45, 8):
        blk = p8[c:c + 8]
        lanes[:len(blk)] = (lanes[:len(blk)] + blk).astype(F)
    want8 = F(F((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + F((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])))
    l16 = np.zeros(16, F)
    for j in range(45):
        l16[j % 16] = F(l16[j % 16] + p16[j])
    x = (l16[:8] + l16[8:]).astype(F)
    want16 = F(F((x[0] + x[1]) + (x[2] + x[3])) + F((x[4] + x[5]) + (x[6] + x[7])))
    assert s8 == want8 and s16 == want16
    assert s8 != s16  # the row tells the two lane orders apart
    seq = F(0.0)
    for v in p8:
        seq = F(seq + v)
    assert seq not in (want8, want16)  # and either from a plain sum
    assert p8[40] == 0 and 0 < p16[40] < np.finfo(F).tiny  # the two scalings differ below 2**-126
    keep = np.arange(45) != 40
    np.testing.assert_array_equal(p8[keep], p16[keep])
    assert np.allclose(p8[keep], np.exp(row[keep].astype(np.float64) - 1.5), rtol=3e-7, atol=0)


def _fma(a, b, c):
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F)


def test_sgemm_passes_and_one_row_kernel():
    """MLAS's SGEMM slices K (``sgemm_stride_k``: 128, halved while it covers K when N >= K, else doubled while N
    fits half the column slice): per slice a chain of fused multiply-adds from the slice's start, the first slice
    stored, each later one added in one rounding; a block of one query row takes its one-row kernel (keys in groups
    of 4, 2, 1, products and sums rounded apart).  Both written out against ``_sv_panels``."""
    assert [ma.sgemm_stride_k(n, k) for n, k in ((64, 64), (300, 64), (64, 300), (128, 256), (16, 1000))] == \
        [64, 64, 256, 128, 1024]
    rng = np.random.default_rng(4)
    D, rk, R4 = 64, 300, 4
    vc = rng.standard_normal((1, 1, rk, D)).astype(F)
    sc = rng.random((R4, rk)).astype(F)
    bufs = (np.empty(D * ((rk + 15) // 16) * 16 * 4, F), np.empty(R4 * D, F), np.empty(R4 * rk, F))
    for rq in (3, 1):
        acc = np.empty((rq, D), F)
        ma._sv_panels(sc, rq, vc, 0, 0, 0, rk, True, acc, *bufs)
        want = np.zeros((rq, D), F)
        if rq > 1:
            for i in range(rq):
                for k0 in (0, 256):
                    part = np.zeros(D, F)
                    for k in range(k0, min(k0 + 256, rk)):
                        part = _fma(sc[i, k], vc[0, 0, k], part)
                    want[i] = part if k0 == 0 else (part + want[i]).astype(F)
        else:
            k = 0
            while k < rk:
                g = 4 if rk - k >= 4 else (2 if rk - k >= 2 else 1)
                t = (sc[0, k] * vc[0, 0, k]).astype(F)
                for u in range(1, g):
                    t = (t + (sc[0, k + u] * vc[0, 0, k + u]).astype(F)).astype(F)
                want[0] = t if k == 0 else (t + want[0]).astype(F)
                k += g
        np.testing.assert_array_equal(acc, want)


# Steps onnxruntime runs outside its flash kernels (``attend_probs_mlas``) and windowed caches: (heads, kv heads,
# head size, scale, B, S, P, seqlens, total) and the node's other settings
PROBS_CASES = {
    "softcap, prompt": lambda: ((4, 2, 32, 0.0, 1, 9, 0, [8], 9), dict(softcap=5.0)),
    "softcap, decode": lambda: ((4, 2, 32, 0.0, 1, 1, 9, [9], 10), dict(softcap=5.0)),
    "smooth softmax, chunk after a past": lambda: ((4, 2, 32, 0.125, 1, 5, 7, [11], 12), dict(smooth_softmax=1)),
    "head sink, decode": lambda: ((4, 2, 32, 0.0, 1, 1, 9, [9], 10), dict(sink=True)),
    "scores out, prompt": lambda: ((4, 2, 32, 0.0, 1, 9, 0, [8], 9), dict(qk_output=1)),
    "probabilities out, decode": lambda: ((4, 2, 32, 0.0, 1, 1, 9, [9], 10), dict(qk_output=2)),
    # one query row at scale exactly 1: MLAS's one-row transposed kernel (keys past a multiple of 4 folded apart)
    "softcap, decode at scale 1": lambda: ((4, 2, 48, 1.0, 1, 1, 10, [10], 11), dict(softcap=5.0)),
    "head sink, ragged decode at scale 1": lambda: ((4, 2, 32, 1.0, 2, 1, 9, [9, 5], 10), dict(sink=True)),
    "softcap, window and bias": lambda: ((4, 2, 32, 0.0, 1, 20, 0, [19], 20),
                                         dict(softcap=3.0, window=8, bias=(False, True))),
    # fewer than 128 keys at head size 256: MLAS's SGEMM takes the head dimension in two passes
    "softcap, two SGEMM passes": lambda: ((2, 1, 256, 0.0625, 1, 100, 0, [99], 100), dict(softcap=20.0)),
    # windowed caches (capacity P, window 8) on the flash kernels: a prompt longer than the cache attends it all
    "windowed cache, long prompt": lambda: ((4, 2, 32, 0.0, 1, 20, 8, [19], 20),
                                            dict(window=8, sliding_window_cache=1)),
    "windowed cache, chunk over a full cache": lambda: ((4, 2, 32, 0.0, 1, 3, 8, [10], 11),
                                                        dict(window=8, sliding_window_cache=1)),
    # a one-row step on a full cache drops the oldest P - 7 rows before attending
    "windowed cache, decode on a full cache": lambda: ((4, 2, 32, 0.0, 1, 1, 12, [12], 13),
                                                       dict(window=8, sliding_window_cache=1, seed=13)),
    "windowed cache, ragged decode": lambda: ((4, 2, 32, 0.0, 2, 1, 12, [12, 9], 13),
                                              dict(window=8, sliding_window_cache=1)),
    "windowed cache, softcap, decode on a full cache": lambda: ((4, 2, 32, 0.0, 1, 1, 8, [9], 10),
                                                                dict(window=8, sliding_window_cache=1, softcap=5.0)),
    # an attention bias over a windowed cache: its columns are the keys' absolute positions
    "windowed cache and bias, decode on a full cache": lambda: ((4, 2, 32, 0.0, 2, 1, 8, [9, 9], 10),
                                                                dict(window=8, sliding_window_cache=1,
                                                                     bias=(True, True))),
    "windowed cache, bias and softcap, chunk": lambda: ((4, 2, 32, 0.0, 1, 3, 12, [20], 21),
                                                        dict(window=8, sliding_window_cache=1, softcap=4.0,
                                                             bias=(False, True))),
}


@onnxruntime_host
@pytest.mark.parametrize("case", list(PROBS_CASES))
def test_gqa_outside_the_flash_kernels_bit_for_bit_onnxruntime(case, monkeypatch):
    """Softcap, smooth softmax, head sinks, the ``qk`` output and windowed caches: onnxruntime's scores by SGEMM,
    softcap, bias, softmax and value product (``attend_probs_mlas``), or its flash kernels over what a windowed
    cache holds at the step.  The default order differs on every case; present rows past the live ones are left
    out (onnxruntime leaves whatever its buffer held there)."""
    from ops.contrib_attention import resident_rows
    (nh, kv, D, scale, B, S, P, seqlens, total), opts = PROBS_CASES[case]()
    bias, sink, window = opts.pop("bias", None), opts.pop("sink", False), opts.pop("window", None)
    qk, seed = opts.pop("qk_output", 0), opts.pop("seed", len(case))
    model = gqa_model(nh, kv, D, scale, 1, 0, window, bias is not None, sink, qk, **opts).SerializeToString()
    feeds = gqa_feeds(nh, kv, D, B, S, P, seqlens, total, seed=seed, amp=2.0, bias=bias, sink=sink)
    want = _ort(model, feeds, 2)
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "0")
    assert not np.array_equal(_native(model, feeds)[0], want[0])
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    got = _native(model, feeds)
    live = [resident_rows(n + 1, P, window) if opts.get("sliding_window_cache") else None for n in seqlens]
    for i, (g, w) in enumerate(zip(got, want)):
        if i in (1, 2):  # present caches: the live rows of each entry
            for b, n in enumerate(live):
                np.testing.assert_array_equal(g[b, :, :n], w[b, :, :n])
        else:
            np.testing.assert_array_equal(g, w)


def _sigmoid_model():
    g = h.make_graph([h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("Mul", ["x", "s"], ["a"]),
                      h.make_node("Mul", ["a", "u"], ["y"]), h.make_node("Sigmoid", ["u"], ["z"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["n", 37]), h.make_tensor_value_info("u", T.FLOAT, ["n", 37])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["n", 37]), h.make_tensor_value_info("z", T.FLOAT, ["n", 37])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


@onnxruntime_host
@pytest.mark.parametrize("compiled", [False, True])
def test_sigmoid_and_fused_silu_bit_for_bit_onnxruntime(compiled, monkeypatch):
    """Sigmoid alone and inside SiLU (fused into one GatedActivation on the CPU) take MLAS's logistic: input
    clamped to [-18, 18], Eigen's rational approximation by fused multiply-adds, only the lower end clamped (on
    hosts with AVX-512 onnxruntime's SiLU also clamps it to at most 1: x = 17.844 tells that apart)."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((50, 37)) * 7).astype(F)
    x.flat[:8] = [18, -18, 17.844, -17.97, 0, -0.0, np.inf, -np.inf]
    u = rng.standard_normal((50, 37)).astype(F)
    model = _sigmoid_model()
    want = _ort(model, {"x": x, "u": u}, 2)
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "0")
    assert not np.array_equal(_native(model, {"x": x, "u": u}, compiled)[1], want[1])
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    for got, ref in zip(_native(model, {"x": x, "u": u}, compiled), want):
        np.testing.assert_array_equal(got, ref)


def _tanh_gelu_model():
    g = h.make_graph([h.make_node("Gelu", ["x"], ["y"], approximate="tanh"),
                      h.make_node("Gelu", ["u"], ["a"], approximate="tanh"), h.make_node("Mul", ["a", "x"], ["z"]),
                      h.make_node("FastGelu", ["x", "b"], ["w"], domain="com.microsoft")], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["n", 37]), h.make_tensor_value_info("u", T.FLOAT, ["n", 37]),
                      h.make_tensor_value_info("b", T.FLOAT, [37])],
                     [h.make_tensor_value_info(n, T.FLOAT, ["n", 37]) for n in ("y", "z", "w")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 20), h.make_opsetid("com.microsoft", 1)]).SerializeToString()


@onnxruntime_host
@pytest.mark.parametrize("compiled", [False, True])
def test_tanh_gelu_bit_for_bit_onnxruntime(compiled, monkeypatch):
    """tanh-GELU (ONNX Gelu, inside a gated product, and com.microsoft FastGelu with its bias) in onnxruntime's
    formula: ``x * ((C x) x + B)`` rounded at each step, MLAS's tanh, ``(x / 2) * (t + 1)``."""
    rng = np.random.default_rng(2)
    feeds = {"x": (rng.standard_normal((40, 37)) * 4).astype(F), "u": (rng.standard_normal((40, 37)) * 4).astype(F),
             "b": rng.standard_normal(37).astype(F)}
    model = _tanh_gelu_model()
    want = _ort(model, feeds, 2)
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "0")
    assert not any(np.array_equal(g, w) for g, w in zip(_native(model, feeds, compiled), want))
    monkeypatch.setenv("ONNX_NUMBA_MLAS_ORDER", "1")
    for got, ref in zip(_native(model, feeds, compiled), want):
        np.testing.assert_array_equal(got, ref)
