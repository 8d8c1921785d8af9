"""CUDA kernels of ops/cuda/{shape,norm,contrib_recurrent,activations,elementwise,reduce}.py against the CPU provider's
kernels, both resolved and bound through ``ops.registry`` on the same inputs (device inputs uploaded with
``runtime.cuda.to_device``, except each CUDA registration's ``host_inputs``).

Without a GPU the kernels run on Numba's CUDA simulator, where every CUDA thread is a Python thread, so shapes
are tiny, but chosen so that rows are longer than a block, grids have several blocks, and edge cases
(negative axes and steps, clamping, uneven splits, groups, decode with a past state, multi-token prefill) are
covered.

When numba-cuda is missing (or finds no GPU and the simulator is off) the module is skipped, unless
``ONNX_NUMBA_REQUIRE_CUDA=1``, in which case collecting it fails.
"""

import numpy as np
import pytest

from runtime import cuda as rc  # importing runtime.cuda never imports numba.cuda

from cuda_target import use_cuda_or_skip  # noqa: E402

use_cuda_or_skip("CUDA kernels")

import ops  # noqa: E402,F401  (registers the CPU kernels)
import ops.cuda.activations  # noqa: E402,F401
import ops.cuda.contrib_recurrent  # noqa: E402,F401
import ops.cuda.norm  # noqa: E402,F401
import ops.cuda.registered  # noqa: E402,F401  (the elementwise ops)
import ops.cuda.shape  # noqa: E402,F401
from ops import registry  # noqa: E402
from ops.registry import OpContext  # noqa: E402
from runtime.errors import (IndexOutOfRangeError, InvalidArgumentError, InvalidAttributeError,  # noqa: E402
                            ShapeMismatchError)

RNG = np.random.default_rng(0)
MS = "com.microsoft"
CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
TOL = {np.dtype(np.float32): (1e-4, 1e-5), np.dtype(np.float16): (3e-3, 3e-3), np.dtype(np.float64): (1e-5, 1e-6)}


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _ctx(op_type, domain, opset, attrs, n_in, n_out, provider):
    return OpContext(name="n", op_type=op_type, domain=domain, opset=opset, attrs=dict(attrs), n_inputs=n_in,
                     n_outputs=n_out, outputs_used=[True] * n_out, provider=provider)


def _run(provider, op_type, inputs, n_out, domain, opset, attrs):
    impl = registry.resolve(domain, op_type, opset, provider)
    assert impl is not None and impl.provider == provider, (provider, domain, op_type, opset)
    fn = registry.bind(impl, _ctx(op_type, domain, opset, attrs, len(inputs), n_out, provider))
    if provider == CPU:
        res = fn(*inputs)
    else:
        res = fn(*[a if a is None or k in impl.host_inputs else rc.to_device(a) for k, a in enumerate(inputs)])
    res = res if isinstance(res, tuple) else (res,)
    return [r if isinstance(r, np.ndarray) else rc.to_host(r) for r in res]


def check(op_type, inputs, n_out=1, domain="", opset=21, tol=None, **attrs):
    """Run the node on both providers and compare every output (shape, dtype, values)."""
    want = _run(CPU, op_type, inputs, n_out, domain, opset, attrs)
    got = _run(CUDA, op_type, inputs, n_out, domain, opset, attrs)
    assert len(got) == len(want) == n_out
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (op_type, k, g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind == "f":
            r, a = tol or TOL[w.dtype]
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=r, atol=a,
                                       err_msg=f"{op_type} output {k}")
        else:
            np.testing.assert_array_equal(g, w)
    return got


def raises_like_cpu(exc, op_type, inputs, n_out=1, domain="", opset=21, **attrs):
    for prov in (CPU, CUDA):
        with pytest.raises(exc):
            _run(prov, op_type, inputs, n_out, domain, opset, attrs)


def test_mode():
    assert rc.available()
    if not rc.gpu_present():
        assert rc.simulator(), "numba.cuda was imported before NUMBA_ENABLE_CUDASIM was set"


# -- shape family ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
def test_transpose(dtype):
    x = (_rand(2, 3, 4) > 0) if dtype == np.bool_ else (_rand(2, 3, 4) * 10).astype(dtype)
    check("Transpose", [x], perm=[2, 0, 1])
    check("Transpose", [x])  # reversed
    check("Transpose", [x], perm=[-1, 1, 0])  # negative perm entries


def test_transpose_high_rank_and_errors():
    check("Transpose", [_rand(2, 1, 3, 1, 2, 1, 2)], perm=[6, 5, 4, 3, 2, 1, 0])  # rank 7, merges to <= 6
    check("Transpose", [_rand(2, 3, 2, 2, 3)], perm=[4, 2, 0, 3, 1])
    check("Transpose", [_rand(0, 3)], perm=[1, 0])
    raises_like_cpu(InvalidAttributeError, "Transpose", [_rand(2, 3)], perm=[0, 0])


def test_concat():
    a, b, c = _rand(2, 3, 4), _rand(2, 1, 4), _rand(2, 5, 4)
    check("Concat", [a, b, c], axis=1)
    check("Concat", [a, b, c], axis=-2)
    check("Concat", [_rand(1, 3, 4), a, _rand(0, 3, 4)], axis=0)
    check("Concat", [a.astype(np.float16), _rand(2, 3, 1).astype(np.float16)], axis=-1)
    check("Concat", [np.arange(3, dtype=np.int64), np.arange(4, dtype=np.int64)], axis=0)
    check("Concat", [a, b], opset=1)  # axis defaults to 1 before opset 4
    raises_like_cpu(InvalidArgumentError, "Concat", [a, a.astype(np.float16)], axis=0)
    raises_like_cpu(ShapeMismatchError, "Concat", [a, _rand(2, 3, 5)], axis=1)


SLICE_CASES = [
    ([1], [3], [0], [1]),
    ([-1], [-100], [1], [-1]),  # negative step, end clamped below 0
    ([10, 0], [-10, 100], [2, -2], [-2, 3]),  # start clamped above the extent, negative axis
    ([-2, 1], [1000, -1], [-3, 1], [1, 1]),
    ([3], [1], [0], [1]),  # empty
    ([0, 4], [4, 0], [1, 2], [2, -2]),
]


@pytest.mark.parametrize("case", range(len(SLICE_CASES)))
def test_slice(case):
    x = _rand(4, 5, 6)
    st, en, ax, sp = (np.array(v, np.int64) for v in SLICE_CASES[case])
    check("Slice", [x, st, en, ax, sp], opset=13)
    if (sp == 1).all():
        check("Slice", [x], opset=1, starts=st.tolist(), ends=en.tolist(), axes=ax.tolist())
        if (ax == np.arange(len(ax))).all():
            check("Slice", [x, st, en], opset=13)


def test_slice_misc():
    x = (_rand(3, 4) * 5).astype(np.int32)
    check("Slice", [x, np.array([-1, -1]), np.array([-4, -5]), None, np.array([-1, -1])], opset=13)
    check("Slice", [x, np.array([1], np.int32), np.array([3], np.int32), np.array([-1], np.int32)], opset=13)
    raises_like_cpu(InvalidArgumentError, "Slice", [x, np.array([0]), np.array([1]), np.array([0]), np.array([0])],
                    opset=13)
    raises_like_cpu(InvalidArgumentError, "Slice", [x, np.array([0, 0]), np.array([1, 1]), np.array([0, -2])],
                    opset=13)


def test_split():
    x = _rand(2, 7, 3)
    check("Split", [x, np.array([1, 4, 2], np.int64)], n_out=3, opset=13, axis=1)
    check("Split", [x, np.array([2, 0, 1], np.int64)], n_out=3, opset=13, axis=-1)
    check("Split", [x], n_out=2, opset=13, axis=0)
    check("Split", [x], n_out=3, opset=18, axis=-2, num_outputs=3)  # uneven: 3, 3, 1
    check("Split", [x], n_out=3, opset=2, axis=1, split=[3, 3, 1])
    check("Split", [x, np.array([5, 2], np.int64)], n_out=2, opset=1, axis=1)
    check("Split", [x.astype(np.float16)], n_out=1, opset=13, axis=2)
    raises_like_cpu(InvalidArgumentError, "Split", [x, np.array([1, 1], np.int64)], n_out=2, opset=13, axis=1)
    raises_like_cpu(InvalidArgumentError, "Split", [x], n_out=2, opset=13, axis=1)
    raises_like_cpu(InvalidAttributeError, "Split", [x], n_out=2, opset=18, axis=1)


def test_expand():
    check("Expand", [_rand(3, 1), np.array([2, 1, 4], np.int64)], opset=13)
    check("Expand", [_rand(2, 3), np.array([3], np.int64)], opset=13)
    check("Expand", [_rand(1, 3, 1).astype(np.float16), np.array([2, 1, 1, 5], np.int64)], opset=13)
    check("Expand", [np.array(2, np.int64), np.array([2, 2], np.int64)], opset=13)
    raises_like_cpu(ShapeMismatchError, "Expand", [_rand(2, 3), np.array([4, 3], np.int64)], opset=13)


# -- norms -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_layer_norm(dtype):
    x = (_rand(2, 3, 40) * 3 + 1).astype(dtype)
    sc, b = _rand(40).astype(dtype), _rand(40).astype(dtype)
    check("LayerNormalization", [x, sc, b], n_out=3, opset=17)
    check("LayerNormalization", [x, sc], n_out=1, opset=17, epsilon=1e-3)
    x4 = (_rand(2, 3, 4, 5) + 2).astype(dtype)
    check("LayerNormalization", [x4, _rand(4, 5).astype(dtype), _rand(5).astype(dtype)], n_out=3, opset=17,
          axis=-2)  # bias broadcast on the device
    check("LayerNormalization", [x4, _rand(3, 4, 5).astype(dtype)], n_out=2, opset=17, axis=1)
    check("LayerNormalization", [x, sc, b], n_out=3, opset=1)  # default-domain contrib form


def test_layer_norm_errors():
    raises_like_cpu(ShapeMismatchError, "LayerNormalization", [_rand(2, 8), _rand(3)], opset=17)
    raises_like_cpu(InvalidArgumentError, "LayerNormalization", [np.ones((2, 8), np.int32), np.ones(8, np.int32)],
                    opset=17)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_layer_norm(dtype):
    x, skip = _rand(2, 3, 24).astype(dtype), _rand(2, 3, 24).astype(dtype)
    g, be, bi = (_rand(24).astype(dtype) for _ in range(3))
    check("SkipLayerNormalization", [x, skip, g, be, bi], n_out=4, domain=MS, epsilon=1e-5)
    check("SkipLayerNormalization", [x, skip[0], g], n_out=4, domain=MS)  # skip broadcast over batch
    check("SkipLayerNormalization", [x[0], skip[0], g, None, bi], n_out=1, domain=MS)
    check("SkipLayerNormalization", [x, skip, g, be], n_out=3, domain=MS)


def test_skip_layer_norm_errors():
    raises_like_cpu(ShapeMismatchError, "SkipLayerNormalization", [_rand(2, 8), _rand(2, 7), _rand(8)], domain=MS)
    raises_like_cpu(ShapeMismatchError, "SkipLayerNormalization", [_rand(8), _rand(8), _rand(8)], domain=MS)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gated_rms_norm(dtype):
    x, gate = _rand(2, 3, 16).astype(dtype), _rand(2, 3, 16).astype(dtype)
    check("GatedRMSNorm", [x, _rand(8).astype(dtype), gate], domain=MS)  # two groups per row
    check("GatedRMSNorm", [x, _rand(16).astype(dtype), gate], domain=MS, activation="sigmoid", epsilon=1e-3)
    raises_like_cpu(ShapeMismatchError, "GatedRMSNorm", [x, _rand(5).astype(dtype), gate], domain=MS)
    raises_like_cpu(InvalidAttributeError, "GatedRMSNorm", [x, _rand(8).astype(dtype), gate], domain=MS,
                    activation="relu")


def test_lp_norm():
    x = _rand(3, 4, 5)
    x[1, :, 2] = 0  # zero norm -> 0
    for p in (1, 2):
        for axis in (-1, 1, 0):
            check("LpNormalization", [x], opset=22, p=p, axis=axis)
    check("LpNormalization", [x.astype(np.float16)], opset=1)
    raises_like_cpu(InvalidAttributeError, "LpNormalization", [x], opset=22, p=3)


# -- activations -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_activations(dtype):
    x = (_rand(3, 37) * 3).astype(dtype)
    b = _rand(37).astype(dtype)
    check("Gelu", [x], domain=MS)
    check("BiasGelu", [x, b], domain=MS)
    check("FastGelu", [x], domain=MS)
    check("FastGelu", [x, b], domain=MS)
    check("QuickGelu", [x], domain=MS)
    check("QuickGelu", [x], domain=MS, alpha=1.5)
    check("Gelu", [x], opset=20)
    check("Gelu", [x], opset=20, approximate="tanh")
    xs = np.concatenate([x.reshape(-1), np.array([30, -30, 0], dtype)])
    check("Softplus", [xs])
    check("Softsign", [xs])
    check("HardSigmoid", [xs])
    check("HardSigmoid", [xs], alpha=0.5, beta=0.1)
    check("LeakyRelu", [xs])
    check("LeakyRelu", [xs], alpha=0.3)


def test_every_generated_unary_op_matches_the_cpu():
    """Each default-domain unary op the CUDA provider registers (its device function generated from the CPU
    kernels' table) on edge values: signed zeros, infinities, NaN, halves, the edges of each op's domain."""
    from ops.cuda.elementwise import CUDA_UNARY, UNARY_OPS, _kernel
    from ops.elementwise import UNARY
    edges = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 0.999, 1.001, 1e-3, 60.0, -60.0, np.inf, -np.inf,
             np.nan]
    x = np.concatenate([np.linspace(-4, 4, 23), edges]).astype(np.float32)
    assert {"Neg", "Sigmoid", "Gelu", "Softplus", "Round", "Asin", "Selu", "HardSwish"} <= set(UNARY_OPS)
    finite = x[np.isfinite(x) | np.isnan(x)]
    with np.errstate(all="ignore"):
        for name in UNARY_OPS:
            if _kernel(UNARY, name) not in CUDA_UNARY:
                continue  # integer and bool ops: test_unary_integer_bool_and_float64_forms
            # the simulator computes with Python's math, which raises on sin(inf) where a device gives NaN
            check(name, [finite if rc.simulator() and name in ("Sin", "Cos", "Tan") else x], opset=24)
    check("Elu", [x], alpha=0.5)
    check("Celu", [x], alpha=2.0)
    check("Shrink", [x], bias=0.25, lambd=1.0)
    check("Swish", [x], opset=24, alpha=0.75)


def test_activation_errors():
    raises_like_cpu(ShapeMismatchError, "BiasGelu", [_rand(3, 4), _rand(3)], domain=MS)
    raises_like_cpu(InvalidArgumentError, "Gelu", [np.ones((3, 4), np.int32)], domain=MS)
    raises_like_cpu(InvalidAttributeError, "Gelu", [_rand(3, 4)], opset=20, approximate="erf")


# -- recurrent -------------------------------------------------------------------------------------

def _la_inputs(B, T, hq, hkv, dk, dv, rule, past=True, dtype=np.float32, decay_per_dim=False, beta_one=False):
    gating, delta = {"linear": (0, 0), "gated": (1, 0), "delta": (0, 1), "gated_delta": (1, 1)}[rule]
    q = _rand(B, T, hq * dk, dtype=dtype)
    k = (_rand(B, T, (hq if hkv > hq else hkv) * dk) * 0.3).astype(dtype)
    v = _rand(B, T, hkv * dv, dtype=dtype)
    st = _rand(B, hkv, dk, dv, dtype=dtype) if past else None
    dc = (-np.abs(_rand(B, T, hkv * (dk if decay_per_dim else 1)))).astype(dtype) if gating else None
    bt = (1 / (1 + np.exp(-_rand(B, T, 1 if beta_one else hkv)))).astype(dtype) if delta else None
    return [q, k, v, st, dc, bt]


@pytest.mark.parametrize("rule", ["gated_delta", "linear", "gated", "delta"])
def test_linear_attention_decode_and_prefill(rule):
    for T, past in ((1, True), (5, False), (4, True)):
        ins = _la_inputs(2, T, 4, 2, 4, 6, rule, past=past, decay_per_dim=(T == 4), beta_one=(T == 4))
        check("LinearAttention", ins, n_out=2, domain=MS, q_num_heads=4, kv_num_heads=2, update_rule=rule)
    ins = _la_inputs(1, 3, 2, 2, 4, 5, rule)
    check("LinearAttention", ins, n_out=2, opset=27, q_num_heads=2, kv_num_heads=2, update_rule=rule, scale=0.7)


def test_linear_attention_inverse_gqa_and_fp16():
    ins = _la_inputs(1, 3, 1, 2, 4, 4, "gated_delta")  # kv_num_heads > q_num_heads (contrib only)
    check("LinearAttention", ins, n_out=2, domain=MS, q_num_heads=1, kv_num_heads=2)
    ins = _la_inputs(1, 1, 2, 2, 4, 4, "gated_delta", dtype=np.float16)
    check("LinearAttention", ins, n_out=2, domain=MS, q_num_heads=2, kv_num_heads=2, tol=(1e-2, 1e-2))
    ins = _la_inputs(1, 2, 2, 2, 4, 4, "gated_delta", past=False, dtype=np.float16)
    check("LinearAttention", ins, n_out=2, domain=MS, q_num_heads=2, kv_num_heads=2, tol=(1e-2, 1e-2))


def test_linear_attention_prefill_equals_chained_decode():
    ins = _la_inputs(1, 4, 2, 1, 4, 4, "gated_delta")
    attrs = dict(q_num_heads=2, kv_num_heads=1)
    full, state = _run(CUDA, "LinearAttention", ins, 2, MS, 1, attrs)
    st = ins[3]
    for t in range(4):
        step = [a[:, t:t + 1] if a is not None and a.ndim == 3 else a for a in ins]
        step[3] = st
        o, st = _run(CUDA, "LinearAttention", step, 2, MS, 1, attrs)
        np.testing.assert_allclose(o[:, 0], full[:, t], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(st, state, rtol=1e-5, atol=1e-5)


def test_linear_attention_errors():
    ins = _la_inputs(1, 1, 2, 2, 4, 4, "gated_delta")
    raises_like_cpu(InvalidAttributeError, "LinearAttention", ins, 2, MS, q_num_heads=2, kv_num_heads=2,
                    state_window=4)
    raises_like_cpu(InvalidArgumentError, "LinearAttention", ins, 2, MS, q_num_heads=2, kv_num_heads=2,
                    update_rule="linear")
    bad = list(ins)
    bad[3] = _rand(1, 2, 4, 5)
    raises_like_cpu(ShapeMismatchError, "LinearAttention", bad, 2, MS, q_num_heads=2, kv_num_heads=2)
    raises_like_cpu(InvalidAttributeError, "LinearAttention", ins, 2, MS, q_num_heads=3, kv_num_heads=2)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_linear_attention_gate(dtype):
    a, b = _rand(2, 3, 5, dtype=dtype), _rand(2, 3, 5, dtype=dtype)
    a[0, 0, 0] = 30  # softplus threshold
    dtb, ds = _rand(5, dtype=dtype), (-np.abs(_rand(5))).astype(dtype)
    check("LinearAttentionGate", [a, dtb, ds, b], n_out=2, domain=MS)
    check("LinearAttentionGate", [a, dtb, ds], n_out=1, domain=MS)
    raises_like_cpu(ShapeMismatchError, "LinearAttentionGate", [a, _rand(4), ds], domain=MS)


def test_causal_conv_with_state():
    B, C, K = 2, 5, 4
    w, bias = _rand(C, 1, K), _rand(C)
    for L, past, dil in ((1, True, 1), (6, False, 1), (3, True, 2), (1, True, 3)):
        x = _rand(B, C, L)
        ps = _rand(B, C, (K - 1) * dil) if past else None
        check("CausalConvWithState", [x, w, bias, ps], n_out=2, domain=MS, dilation=dil, activation="silu")
        check("CausalConvWithState", [x, w, None, ps], n_out=2, domain=MS, dilation=dil)
    # channels-last with extra channel dims, decode and prefill
    for L, past in ((1, True), (5, False)):
        x = _rand(B, L, 1, C)
        ps = _rand(B, (K - 1) * 2, 1, C) if past else None
        check("CausalConvWithState", [x, w, bias, ps], n_out=2, domain=MS, channels_last=1, dilation=2)
    check("CausalConvWithState", [_rand(1, C, 3, dtype=np.float16), w.astype(np.float16), None,
                                  _rand(1, C, K - 1, dtype=np.float16)], n_out=2, domain=MS)
    # default domain (opset 27), and kernel size 1 (empty state)
    check("CausalConvWithState", [_rand(B, C, 1), w, bias, _rand(B, C, K - 1)], n_out=2, opset=27,
          activation="swish")
    check("CausalConvWithState", [_rand(B, C, 4), w, None, None], n_out=2, opset=27)
    check("CausalConvWithState", [_rand(B, C, 3), _rand(C, 1, 1), bias, None], n_out=2, opset=27)


def test_causal_conv_errors():
    x, w = _rand(1, 3, 2), _rand(3, 1, 3)
    raises_like_cpu(ShapeMismatchError, "CausalConvWithState", [x, w, None, _rand(1, 3, 3)], 2, MS)
    raises_like_cpu(ShapeMismatchError, "CausalConvWithState", [x, _rand(4, 1, 3)], 2, MS)
    raises_like_cpu(InvalidAttributeError, "CausalConvWithState", [x, w], 2, MS, state_window=2)
    raises_like_cpu(InvalidAttributeError, "CausalConvWithState", [x, w], 2, MS, activation="relu")
    raises_like_cpu(ShapeMismatchError, "CausalConvWithState", [x, w, None, _rand(1, 3, 4)], 2, opset=27)


def test_contiguous_results_are_views_and_launch_nothing():
    """A Split along an axis with only unit axes before it, a Slice of whole trailing axes under unit outer ones
    and a Transpose that moves only unit axes return views of their input: no kernel runs, values as on the
    CPU.  A strided result still copies."""
    x = _rand(1, 7, 3)
    with rc.TransferCounter() as tc:
        for op_type, inputs, n_out, attrs in (
                ("Split", [x, np.array([2, 4, 1], np.int64)], 3, {"axis": 1}),
                ("Slice", [x, np.array([2]), np.array([6]), np.array([1])], 1, {}),
                ("Slice", [_rand(3, 4, 5), np.array([1, 2]), np.array([2, 4]), np.array([0, 1])], 1, {}),
                ("Transpose", [_rand(1, 4, 1, 3)], 1, {"perm": [2, 0, 1, 3]})):
            before = tc.launches
            check(op_type, inputs, n_out=n_out, opset=13, **attrs)
            assert tc.launches == before, (op_type, tc.kernels)
        check("Slice", [x, np.array([1]), np.array([2]), np.array([2])], opset=13)  # strided: a copy
        check("Slice", [_rand(1, 3, 4), np.array([-1]), np.array([-100]), np.array([2]), np.array([-1])], opset=13)
    assert tc.kernels == {"shape._copy6": 2}, tc.kernels


# -- reductions ------------------------------------------------------------------------------------

REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")


def _reduce_input(dtype, shape):
    if np.dtype(dtype).kind == "f":
        return (_rand(*shape) + 1.5).astype(dtype)  # mostly positive, so LogSum has values to take
    return RNG.integers(-3 if np.dtype(dtype).kind == "i" else 0, 4, shape).astype(dtype)


@pytest.mark.parametrize("op_type", REDUCTIONS)
def test_reductions_match_cpu(op_type):
    """Every mode: adjacent axes (the row kernel: inner 1, rows longer than a block), an inner axis (the column
    kernel), non-adjacent axes (composed runs or a transpose), all axes, axes as the opset-18 input, and an empty
    axes input with ``noop_with_empty_axes`` (the elementwise part alone)."""
    x = _reduce_input(np.float32, (2, 3, 37))
    for axes in ([2], [1], [0, 2]):
        check(op_type, [x], opset=11, axes=axes, keepdims=1)
    check(op_type, [x, np.array([-1, 0, 1], np.int64)], opset=18, keepdims=0)
    check(op_type, [x[:, :, :4], np.array([], np.int64)], opset=18, noop_with_empty_axes=1)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64, np.uint8])
def test_reduction_dtypes_match_cpu(dtype):
    x = _reduce_input(dtype, (2, 3, 19))
    for op_type, axes in (("ReduceSum", [2]), ("ReduceMean", [0, 2]), ("ReduceMax", [1]), ("ReduceProd", [1]),
                          ("ReduceSumSquare", [0, 2])):
        check(op_type, [x, np.array(axes, np.int64)], opset=18)


@pytest.mark.parametrize("op_type", REDUCTIONS)
def test_reductions_edge_values(op_type):
    """Empty reduced extents give the identity; NaN propagates through max and min; bool max/min."""
    check(op_type, [_rand(2, 0, 3), np.array([1], np.int64)], opset=18, keepdims=1)
    x = _rand(3, 5)
    x[1, 2] = np.nan
    x[2, 0] = np.inf
    check(op_type, [x, np.array([1], np.int64)], opset=18, keepdims=0)
    check(op_type, [x, np.array([0], np.int64)], opset=18, keepdims=0)
    if op_type in ("ReduceMax", "ReduceMin"):
        check(op_type, [_rand(2, 3, 4) > 0, np.array([0, 2], np.int64)], opset=18)


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.int8])
def test_arg_reductions_match_cpu(op_type, dtype):
    x = (RNG.integers(-2, 3, (3, 4, 5))).astype(dtype)  # many ties
    for axis, last in ((0, 0), (1, 1), (-1, 0), (-1, 1)):
        check(op_type, [x], opset=13, axis=axis, keepdims=axis == 1, select_last_index=last)
    raises_like_cpu(InvalidArgumentError, op_type, [_rand(2, 0)], opset=13, axis=1)


# -- elementwise: comparisons, logic, integers, variadic, Clip, PRelu, Pow -------------------------

def _operands(kind, shape_a=(2, 3, 4), shape_b=(3, 1)):
    if kind == "f":
        a, b = _rand(*shape_a), _rand(*shape_b)
        a[0, 0, 0], b[1, 0] = np.nan, a[0, 1, 1]  # a NaN and an equal pair
        return a, b
    if kind == "b":
        return _rand(*shape_a) > 0, _rand(*shape_b) > 0
    return (RNG.integers(-9, 9, shape_a).astype(np.int32), RNG.integers(1, 5, shape_b).astype(np.int32)
            * np.where(RNG.random(shape_b) < 0.5, -1, 1).astype(np.int32))


@pytest.mark.parametrize("op_type,kinds", [
    ("Equal", "fib"), ("Less", "fi"), ("LessOrEqual", "fi"), ("Greater", "fi"), ("GreaterOrEqual", "fi"),
    ("And", "b"), ("Or", "b"), ("Xor", "b"), ("BitwiseAnd", "i"), ("BitwiseOr", "i"), ("BitwiseXor", "i"),
    ("Add", "i"), ("Sub", "i"), ("Mul", "i"), ("Div", "i"), ("Max", "fi"), ("Min", "fi"), ("Sum", "fi"),
    ("Mean", "f"), ("PRelu", "fi"), ("Pow", "f")])
def test_binary_and_variadic_ops_match_cpu(op_type, kinds):
    for kind in kinds:
        check(op_type, list(_operands(kind)))


def test_integer_division_and_modulo():
    a, b = _operands("i")
    check("Mod", [a, b], fmod=0)
    check("Mod", [a, b], fmod=1)
    check("Pow", [np.abs(a), np.abs(b)])  # an integer base goes through float64
    check("Pow", [_rand(2, 3), np.array([2], np.int64)])  # the exponent takes the base's dtype
    zero = b.copy()
    zero[2, 0] = 0
    raises_like_cpu(InvalidArgumentError, "Div", [a, zero])
    raises_like_cpu(InvalidArgumentError, "Mod", [a, zero], fmod=1)


def test_variadic_of_three_and_of_one():
    a, b, c = _rand(2, 3, 4), _rand(3, 1), _rand(4)
    for op_type in ("Max", "Min", "Sum", "Mean"):
        check(op_type, [a, b, c])
        check(op_type, [b])


def test_unary_integer_bool_and_float64_forms():
    i = RNG.integers(-5, 5, (3, 7)).astype(np.int64)
    for op_type in ("Neg", "Abs", "Sign", "BitwiseNot", "Relu"):
        check(op_type, [i])
    check("Not", [i > 0])
    check("Sign", [i > 0])
    x = np.array([0.0, -0.0, 1.5, -2, np.nan, np.inf, -np.inf, 1e300], np.float64)  # 1e300: finite in float64
    for op_type in ("Sign", "IsNaN", "IsInf", "Neg", "Floor"):
        check(op_type, [x])
    check("IsInf", [x], detect_negative=0)
    raises_like_cpu(InvalidArgumentError, "Reciprocal", [i])


def test_clip():
    x = _rand(3, 5)
    x[0, 0] = np.nan
    check("Clip", [x], opset=6, min=-0.5, max=0.5)
    check("Clip", [x, np.array(-0.25, np.float32), np.array(0.75, np.float32)], opset=13)
    check("Clip", [x, None, np.array(0.0, np.float32)], opset=13)
    check("Clip", [x.astype(np.float16), np.array(-1, np.float16)], opset=13)
    i = RNG.integers(-9, 9, (4, 4)).astype(np.int32)
    check("Clip", [i, np.array(-2, np.int32), np.array(3, np.int32)], opset=13)
    check("Clip", [x, np.array(1.0, np.float32), np.array(0.0, np.float32)], opset=13)  # min > max: all max


# -- channel norms, RMSNormalization ---------------------------------------------------------------

def test_channel_norms_match_cpu():
    x = _rand(2, 4, 3, 5) * 3 + 1
    c = lambda: _rand(4)  # noqa: E731
    check("InstanceNormalization", [x, c(), c()], epsilon=1e-3)
    check("GroupNormalization", [x, c(), c()], opset=21, num_groups=2)
    check("GroupNormalization", [x, _rand(2), _rand(2)], opset=18, num_groups=2)  # per-group scale
    check("BatchNormalization", [x, c(), c(), c(), np.abs(c()) + 0.5], opset=15, epsilon=1e-2)
    check("MeanVarianceNormalization", [x], opset=13)  # axes 0, 2, 3: moved last
    check("MeanVarianceNormalization", [x], opset=13, axes=[2, 3])  # already last
    check("RMSNormalization", [x, _rand(5)], opset=23, epsilon=1e-4)
    check("RMSNormalization", [x, _rand(3, 5)], opset=23, axis=-2)
    raises_like_cpu(InvalidAttributeError, "GroupNormalization", [x, c(), c()], opset=21, num_groups=3)
    raises_like_cpu(ShapeMismatchError, "InstanceNormalization", [x, _rand(3), c()])


# -- Tile, DepthToSpace, SpaceToDepth, Pad, Trilu ---------------------------------------------------

def test_tile_and_depth_space():
    x = _rand(2, 3, 2)
    check("Tile", [x, np.array([2, 1, 3], np.int64)])
    check("Tile", [x, np.array([1, 0, 2], np.int64)])  # a zero repeat
    check("Tile", [_rand(2, 2, 2, 2), np.array([2, 2, 2, 2], np.int64)])  # 8 axes: split into launches
    y = _rand(1, 8, 2, 3)
    for mode in ("DCR", "CRD"):
        check("DepthToSpace", [y], blocksize=2, mode=mode)
        check("SpaceToDepth", [_rand(1, 2, 4, 6)], blocksize=2, mode=mode)
    raises_like_cpu(InvalidArgumentError, "DepthToSpace", [_rand(1, 6, 2, 2)], blocksize=2)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_modes(mode):
    x = _rand(2, 3, 4)
    check("Pad", [x, np.array([0, 1, 2, 1, 2, 3], np.int64)], mode=mode)
    check("Pad", [x, np.array([-1, 2, 0, 3], np.int64), None, np.array([2, 1], np.int64)], mode=mode)  # crop
    if mode == "constant":
        check("Pad", [x, np.array([1, 0, 1, 0, 1, 0], np.int64), np.array(2.5, np.float32)], mode=mode)
        check("Pad", [x.astype(np.int32), np.array([0, 0, 1, 0, 0, 2], np.int64), np.array(7, np.int32)])
        check("Pad", [x], opset=2, pads=[0, 1, 0, 0, 1, 0], value=-1.0)
    raises_like_cpu(InvalidArgumentError, "Pad", [x, np.array([0, 0, -5, 0, 0, 0], np.int64)], mode=mode)


def test_trilu():
    x = RNG.integers(1, 9, (2, 3, 5)).astype(np.int64)
    for upper in (0, 1):
        for k in (None, -1, 2, 9):
            check("Trilu", [x] if k is None else [x, np.array(k, np.int64)], upper=upper)


# -- GatherElements, GatherND, ScatterElements, ScatterND --------------------------------------------

def test_gather_and_scatter_families():
    x = _rand(3, 4, 5)
    idx = RNG.integers(-4, 4, (3, 2, 5)).astype(np.int64)
    check("GatherElements", [x, idx], axis=1)
    check("GatherND", [x, np.array([[0, 1], [2, -1]], np.int64)])
    check("GatherND", [x, RNG.integers(0, 4, (3, 2, 1)).astype(np.int64)], batch_dims=1)
    rows = np.array([[2, 0, 2, 1]], np.int64)  # row 2 twice: the CPU's order decides
    upd = _rand(1, 4)
    for red in ("none", "add", "mul", "max", "min"):
        check("ScatterElements", [_rand(3, 4), rows.reshape(1, 4) % 3, upd], axis=0, reduction=red)
        check("ScatterND", [x, np.array([[1], [0], [1]], np.int64), _rand(3, 4, 5)], reduction=red)
    raises_like_cpu(IndexOutOfRangeError, "GatherElements", [x, idx + 9], axis=1)
    raises_like_cpu(IndexOutOfRangeError, "ScatterND", [x, np.array([[3]], np.int64), _rand(1, 4, 5)])


def test_gemm():
    a, b, c = _rand(3, 4), _rand(4, 5), _rand(5)
    check("Gemm", [a, b, c])
    check("Gemm", [a.T.copy(), b.T.copy(), _rand(3, 1)], transA=1, transB=1, alpha=0.5, beta=2.0)
    check("Gemm", [a, b], alpha=-1.0)
    raises_like_cpu(ShapeMismatchError, "Gemm", [a, b.T.copy()])


# -- CumSum, ConstantOfShape, Range, Dropout --------------------------------------------------------

def test_cumsum_constant_range_dropout():
    import ops.cuda.cumulative  # noqa: F401
    x = _rand(3, 4, 2)
    for exclusive, reverse in ((0, 0), (1, 0), (0, 1), (1, 1)):
        check("CumSum", [x, np.array(1, np.int64)], exclusive=exclusive, reverse=reverse)
    check("CumSum", [RNG.integers(-3, 3, (2, 5)).astype(np.int32), np.array([-1], np.int64)], exclusive=1)
    check("CumProd", [x, np.array(0, np.int64)], opset=26, exclusive=1, reverse=1)
    check("ConstantOfShape", [np.array([2, 3], np.int64)], value=np.array([1.5], np.float32))
    check("ConstantOfShape", [np.array([4], np.int64)])
    check("Range", [np.array(1.0, np.float32), np.array(2.0, np.float32), np.array(0.1, np.float32)])
    check("Range", [np.array(10, np.int32), np.array(-3, np.int32), np.array(-4, np.int32)])
    check("Dropout", [x, np.array(0.3, np.float32)], n_out=2, opset=13)
    raises_like_cpu(InvalidArgumentError, "Range", [np.array(1.0, np.float32)] * 2 + [np.array(0.0, np.float32)])


def test_bitshift():
    for dt in (np.uint8, np.int32):
        x = RNG.integers(-50 if dt == np.int32 else 0, 200, (3, 4)).astype(dt)
        s = np.array([0, 1, 7, 40 if dt == np.int32 else 8], dt)  # the last: the bit width or more
        if dt == np.int32:
            s[1] = -1  # a negative amount
        for direction in ("LEFT", "RIGHT"):
            check("BitShift", [x, s], direction=direction)


# -- Resize ------------------------------------------------------------------------------------------

def test_resize_matches_cpu():
    import ops.cuda.resize  # noqa: F401
    x = _rand(1, 2, 4, 5)
    sc = np.array([1, 1, 1.5, 0.6], np.float32)
    none = np.zeros(0, np.float32)
    for mode, extra in (("nearest", {}), ("linear", {}), ("cubic", {"exclude_outside": 1}),
                        ("linear", {"antialias": 1})):
        check("Resize", [x, none, sc], opset=19, mode=mode, **extra)
    check("Resize", [x, none, None, np.array([3, 7], np.int64)], opset=19, mode="linear", axes=[2, 3],
          keep_aspect_ratio_policy="not_larger")
    roi = np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], np.float32)
    check("Resize", [x, roi, sc], opset=19, mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
          extrapolation_value=-7.0)
    img = RNG.integers(0, 256, (1, 1, 4, 4)).astype(np.uint8)  # rounded half to even and saturated
    check("Resize", [img, none, np.array([1, 1, 1.75, 1.25], np.float32)], opset=19, mode="cubic")
    check("Upsample", [x, np.array([1, 1, 2, 3], np.float32)], opset=9)


# -- QuantizeLinear, DequantizeLinear ----------------------------------------------------------------

def test_quantize_and_dequantize_match_cpu():
    import ops.cuda.quantize  # noqa: F401
    x = _rand(2, 3, 4) * 50
    x[0, 0, 0], x[1, 2, 3], x[0, 1, 1] = np.nan, 1e6, 1.25  # NaN, saturation, a tie (2.5) rounded to even
    s, z = np.array(0.5, np.float32), np.array(3, np.uint8)
    check("QuantizeLinear", [x, s, z], opset=19)
    check("QuantizeLinear", [x, np.abs(_rand(3)) + 0.1, np.array([-3, 0, 5], np.int8)], opset=19, axis=1)
    check("QuantizeLinear", [x, np.abs(_rand(2, 3, 2)) + 0.1, np.zeros((2, 3, 2), np.int16)], opset=21, axis=2,
          block_size=2)
    q = RNG.integers(-128, 128, (2, 3, 4)).astype(np.int8)
    check("DequantizeLinear", [q, np.abs(_rand(3)) + 0.1, np.array([-3, 0, 5], np.int8)], opset=19, axis=1)
    check("DequantizeLinear", [q, np.abs(_rand(2, 2, 4)).astype(np.float16) + 0.1], opset=21, axis=1,
          block_size=2)
    raises_like_cpu(ShapeMismatchError, "QuantizeLinear", [x, _rand(4), np.zeros(4, np.uint8)], opset=19, axis=1)


def test_softmax_family_on_any_axis():
    x = _rand(2, 3, 5)
    x[1, 0, :] = 2.0  # ties: Hardmax marks the first
    for op_type in ("Softmax", "LogSoftmax", "Hardmax"):
        for axis in (-1, 1, 0):
            check(op_type, [x], opset=13, axis=axis)
        check(op_type, [x], opset=11, axis=1)  # the flattened trailing block
    long = _rand(2, 40)
    long[:, [3, 19, 35]] = 9.0  # one thread of a 16-thread block sees all three maxima
    check("Hardmax", [long], opset=13)


def test_topk_matches_cpu():
    import ops.cuda.topk  # noqa: F401
    x = RNG.integers(-3, 4, (2, 7, 3)).astype(np.float32)  # many ties: lowest index first
    x[0, 2, 1] = x[1, 5, 0] = np.nan
    for largest in (1, 0):
        for axis in (1, -1):
            check("TopK", [x, np.array([3 if axis == 1 else 2], np.int64)], n_out=2, opset=11, axis=axis,
                  largest=largest)
    check("TopK", [np.nan_to_num(x).astype(np.int32), np.array([7], np.int64)], n_out=2, opset=11, axis=1)
    check("TopK", [x.astype(np.float16), np.array([0], np.int64)], n_out=2, opset=11)
    raises_like_cpu(InvalidArgumentError, "TopK", [x, np.array([9], np.int64)], n_out=2, opset=11, axis=1)


def test_onehot_and_eyelike():
    idx = np.array([[0, 3, -1], [2, -5, 1]], np.int64)  # -1 wraps (opset 11); -5 stays out: an all-off row
    for opset in (9, 11):
        for axis in (-1, 0, 1):
            check("OneHot", [idx, np.array(4, np.int64), np.array([0.5, 2.0], np.float32)], opset=opset, axis=axis)
    check("OneHot", [np.array([1.7, -0.2], np.float32), np.array([3], np.int32), np.array([0, 9], np.int64)])
    for k in (0, 2, -1):
        check("EyeLike", [_rand(3, 4)], k=k)
    check("EyeLike", [_rand(2, 5)], dtype=7)  # int64


def test_lrn_and_reverse_sequence():
    check("LRN", [_rand(2, 5, 3, 2)], size=3, alpha=0.01, beta=0.5, bias=2.0)
    check("LRN", [_rand(1, 4, 6)], size=2)
    x = _rand(4, 3, 2)
    check("ReverseSequence", [x, np.array([4, 0, 2], np.int64)], batch_axis=1, time_axis=0)
    check("ReverseSequence", [x, np.array([3, 1, 2, 2], np.int64)], batch_axis=0, time_axis=1)
    raises_like_cpu(IndexOutOfRangeError, "ReverseSequence", [x, np.array([5, 0, 2], np.int64)])
