"""Special values (signed zeros, infinities, NaN, subnormals, 2**31, 2**63, 1e30, each integer type's extremes)
through the elementwise, reduction, normalization and TopK/ArgMax kernels: the results are onnxruntime's, or
``onnx.reference``'s where onnxruntime has no kernel for the type or its result depends on where a NaN sits
(ReduceMax, ReduceMin: the reference propagates NaN, as numpy does).  Hardmax is one-hot of ArgMax (the spec's
"first maximum"), whose NaN handling is onnxruntime's.

Each family runs as one graph with one node per op, so one session covers many kernels."""
from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper
from onnx.reference import ReferenceEvaluator

import runtime
from runtime.dtypes import onnx_type

F32 = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, 2.0**31, -2.0**31, 2.0**63, -2.0**63,
                1e30, -1e30, 3.4e38, -3.4e38, 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0], np.float32)

UNARY_F = ["Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Tanh", "Sigmoid", "Erf", "Sin", "Cos", "Tan", "Asin",
           "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Floor", "Ceil", "Round", "Sign", "Relu",
           "Softplus", "Softsign", "Mish", "HardSwish", "Elu", "Selu", "Celu", "LeakyRelu", "HardSigmoid",
           "ThresholdedRelu", "Shrink"]
BINARY_F = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"]
INT_TYPES = [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64]
NAN_POSITIONAL = {"ReduceMax", "ReduceMin"}  # onnxruntime's NaN result depends on where the NaN is


def _ints(dt):
    i = np.iinfo(dt)
    return np.array([0, 1, i.max, i.min, i.max - 1, 2, 7] + ([-1, -7] if i.min < 0 else [3, 5]), dt)


def _graph(nodes, feeds, outputs, inits=(), opset=18):
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, onnx_type(a.dtype), list(a.shape)) for n, a in feeds.items()],
                     [h.make_tensor_value_info(n, t, None) for n, t in outputs], list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)]).SerializeToString()


def _expected(model, feeds, names, positional=()):
    """onnxruntime's results, else the reference's (per output: the model is split when onnxruntime refuses it)."""
    try:
        ref = dict(zip(names, ReferenceEvaluator(model).run(None, feeds)))
    except Exception:  # an op the reference does not implement (GlobalLpPool): onnxruntime alone decides
        ref = None
    try:
        ort = dict(zip(names, onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)))
    except Exception:  # a type onnxruntime has no kernel for
        if ref is None:
            raise
        return ref
    return {n: ref[n] if n in positional and ref is not None else ort[n] for n in names}


def _same(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind != "f":
        return a == b
    # transcendental functions may differ in the last place or two (tolerance fixed before looking: ~2 ulp of the
    # type; float16 kernels compute in float32 and round once)
    tol = {np.dtype(np.float16): 2e-3, np.dtype(np.float64): 1e-15}.get(a.dtype, 4e-7)
    close = np.isfinite(a) & np.isfinite(b) & (np.abs(a.astype(np.float64) - b) <= tol * np.maximum(1.0, np.abs(b)))
    return (a == b) | (np.isnan(a) & np.isnan(b)) | close


def _check(model, feeds, names, positional=(), adjust=None):
    want = _expected(model, feeds, names, positional)
    if adjust is not None:
        adjust(want)
    got = dict(zip(names, runtime.InferenceSession(model).run(None, feeds)))
    bad = []
    for n in names:
        ok = _same(got[n], want[n])
        if np.asarray(got[n]).shape != np.asarray(want[n]).shape or not np.all(ok):
            bad.append(f"{n}: got {np.asarray(got[n]).tolist()}, expected {np.asarray(want[n]).tolist()}")
    assert not bad, "\n".join(bad)


F64 = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 2.0**31, 2.0**63, -2.0**63, 1e300, -1e300,
                0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0], np.float64)
F16 = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 6e-8, -6e-8, 2048, 65504, -65504, 0.5, -0.5, 1.5, 2.5, -2.5,
                1.0, -1.0], np.float16)
# onnxruntime's own results that are not kept, with why: its float64 and float16 kernels differ from its float32
# ones there, and the float32 behaviour (the exact one) is kept for every width.
ORT_QUIRKS = {
    ("float64", "Softplus"): "log(exp(x) + 1) overflows to inf for large x; x is kept, as onnxruntime's float32",
    ("float16", "Softplus"): "as for float64",
    ("float64", "Shrink"): "onnxruntime's double Shrink gives inf for x - bias near the double maximum",
    ("float16", "Sign"): "onnxruntime's float16 Sign(NaN) is 0; NaN is kept, as onnxruntime's float32",
    ("float64", "Erf"): "onnxruntime's double Erf flushes subnormal inputs to 0",
}


@pytest.mark.parametrize("x", [F32, F64, F16], ids=["float32", "float64", "float16"])
def test_float_unary_special_values(x):
    ops = [op for op in UNARY_F if (x.dtype.name, op) not in ORT_QUIRKS]
    names = [f"y_{op}" for op in ops]
    model = _graph([h.make_node(op, ["x"], [n]) for op, n in zip(ops, names)], {"x": x},
                   [(n, onnx_type(x.dtype)) for n in names])
    _check(model, {"x": x}, names)
    isx = _graph([h.make_node("IsNaN", ["x"], ["nan"]), h.make_node("IsInf", ["x"], ["inf"])], {"x": x},
                 [("nan", T.BOOL), ("inf", T.BOOL)])
    _check(isx, {"x": x}, ["nan", "inf"])


def test_float_binary_special_values():
    a, b = np.repeat(F32, len(F32)), np.tile(F32, len(F32))
    names = [f"y_{op}" for op in BINARY_F] + ["y_fmod"]
    nodes = [h.make_node(op, ["a", "b"], [n]) for op, n in zip(BINARY_F, names)]
    nodes.append(h.make_node("Mod", ["a", "b"], ["y_fmod"], fmod=1))
    _check(_graph(nodes, {"a": a, "b": b}, [(n, T.FLOAT) for n in names]), {"a": a, "b": b}, names)


@pytest.mark.parametrize("dt", INT_TYPES, ids=lambda d: np.dtype(d).name)
def test_integer_extremes(dt):
    x = _ints(dt)
    a, b = np.repeat(x, len(x)), np.tile(x, len(x))
    keep = (b != 0) & ~((a == x.min()) & (b == -1))  # onnxruntime dies of SIGFPE on MIN / -1
    feeds = {"x": x, "a": a, "b": b, "p": a[keep], "q": b[keep]}
    unary = ["Abs", "Sign", "Relu"] + (["Neg"] if np.dtype(dt).kind == "i" else [])
    nodes = [h.make_node(op, ["x"], [f"u_{op}"]) for op in unary]
    nodes += [h.make_node(op, ["a", "b"], [f"b_{op}"]) for op in ["Add", "Sub", "Mul", "Max", "Min"]]
    nodes += [h.make_node("Div", ["p", "q"], ["d"]), h.make_node("Mod", ["p", "q"], ["m"]),
              h.make_node("Mod", ["p", "q"], ["fm"], fmod=1)]
    names = [o for n in nodes for o in n.output]
    model = _graph(nodes, feeds, [(n, onnx_type(dt)) for n in names])
    # One session per output where onnxruntime lacks a kernel for some of them (int8 Relu, int16 Max, ...).
    want = {}
    for n in names:
        node = next(nd for nd in nodes if n in nd.output)
        sub = {k: feeds[k] for k in node.input}
        want[n] = _expected(_graph([node], sub, [(n, onnx_type(dt))]), sub, [n])[n]
    got = dict(zip(names, runtime.InferenceSession(model).run(None, feeds)))
    bad = [f"{n}: got {got[n].tolist()}, expected {np.asarray(want[n]).tolist()}" for n in names
           if not np.array_equal(got[n], want[n])]
    assert not bad, "\n".join(bad)


ROWS = np.array([[1, 2, np.nan, 3], [np.inf, -np.inf, 1, 0], [-np.inf] * 4, [1e30] * 4, [-0.0, 0.0, -0.0, -0.0],
                 [np.nan, np.inf, 1, 1], [1e-45, -1e-45, 3.4e38, 3.4e38]], np.float32)


def test_reductions_normalizations_and_selection_on_special_rows():
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    k = numpy_helper.from_array(np.array([3], np.int64), "k")
    scale = numpy_helper.from_array(np.ones(4, np.float32), "scale")
    bias = numpy_helper.from_array(np.zeros(4, np.float32), "bias")
    reduces = ["ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
    nodes = [h.make_node(op, ["x", "axes"], [op], keepdims=0) for op in reduces]
    nodes += [h.make_node(op, ["x"], [f"{op}{last}"], axis=1, keepdims=0, select_last_index=last)
              for op in ["ArgMax", "ArgMin"] for last in (0, 1)]
    nodes += [h.make_node(op, ["x"], [op], axis=1) for op in ["Softmax", "LogSoftmax", "Hardmax"]]
    nodes += [h.make_node("TopK", ["x", "k"], [f"topv{lg}", f"topi{lg}"], largest=lg) for lg in (0, 1)]
    nodes.append(h.make_node("LayerNormalization", ["x", "scale", "bias"], ["LayerNorm"], axis=-1))
    names = [o for n in nodes for o in n.output]
    types = [(n, T.INT64 if n.startswith(("Arg", "topi")) else T.FLOAT) for n in names]
    model = _graph(nodes, {"x": ROWS}, types, [axes, k, scale, bias])

    def hardmax_is_one_hot_argmax(want):  # onnxruntime's Hardmax of a row led by NaN is all zeros
        want["Hardmax"] = np.eye(4, dtype=np.float32)[want["ArgMax0"]]

    _check(model, {"x": ROWS}, names, positional=NAN_POSITIONAL, adjust=hardmax_is_one_hot_argmax)
    # LogSoftmax along an inner axis takes the other kernel path
    t = ROWS.T.copy()
    inner = _graph([h.make_node("LogSoftmax", ["x"], ["y"], axis=0)], {"x": t}, [("y", T.FLOAT)])
    _check(inner, {"x": t}, ["y"])


def test_integer_division_by_zero_is_refused():
    model = _graph([h.make_node("Div", ["a", "b"], ["d"], name="div0")],
                   {"a": np.ones(3, np.int32), "b": np.ones(3, np.int32)}, [("d", T.INT32)])
    s = runtime.InferenceSession(model)
    with pytest.raises(runtime.InvalidArgumentError, match=r"div0.*integer division by zero.*index \[1\]"):
        s.run(None, {"a": np.ones(3, np.int32), "b": np.array([1, 0, 2], np.int32)})
    mod = _graph([h.make_node("Mod", ["a", "b"], ["d"], name="mod0")],
                 {"a": np.ones(3, np.int64), "b": np.ones(3, np.int64)}, [("d", T.INT64)])
    with pytest.raises(runtime.InvalidArgumentError, match=r"mod0.*integer modulo by zero"):
        runtime.InferenceSession(mod).run(None, {"a": np.ones(3, np.int64), "b": np.zeros(3, np.int64)})
    # floats follow IEEE 754
    fl = _graph([h.make_node("Div", ["a", "b"], ["d"])], {"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)},
                [("d", T.FLOAT)])
    (r,) = runtime.InferenceSession(fl).run(None, {"a": np.array([1, -1], np.float32), "b": np.zeros(2, np.float32)})
    assert r.tolist() == [np.inf, -np.inf]


@pytest.mark.parametrize("op,attrs", [("HardSigmoid", {"beta": float("nan")}), ("HardSigmoid", {"alpha": float("inf")}),
                                      ("Celu", {"alpha": float("inf")}), ("Selu", {"alpha": float("inf")}),
                                      ("Shrink", {"lambd": -1.0, "bias": 1.5}), ("LeakyRelu", {"alpha": float("nan")}),
                                      ("Elu", {"alpha": float("inf")})])
def test_special_attribute_values(op, attrs):
    """Attributes at infinity or NaN (found by tools/fuzz.py): the formula's own NaN and infinities, as
    onnxruntime computes them."""
    x = np.array([-2, -1, -0.0, 0, 0.5, 1, 2, np.inf, -np.inf, np.nan], np.float32)
    model = _graph([h.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, [("y", T.FLOAT)])
    _check(model, {"x": x}, ["y"])


def test_lp_pool_powers_over_and_underflow_as_onnxruntime():
    """p = 2**20 (found by tools/fuzz.py): |x|**p overflows or underflows in float32 where float64 would not."""
    x = np.array([[[[1.0002, 0.5], [0.9994, 0.9994]], [[0.5, 0.25], [0.125, 0.0]]]], np.float32).reshape(1, 2, 2, 2)
    model = _graph([h.make_node("LpPool", ["x"], ["y"], kernel_shape=[1, 2], p=1 << 20),
                    h.make_node("GlobalLpPool", ["x"], ["g"], p=1 << 20)], {"x": x}, [("y", T.FLOAT), ("g", T.FLOAT)])
    _check(model, {"x": x}, ["y", "g"])
