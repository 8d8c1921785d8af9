"""The CUDA plan's fusions (runtime/passes/cuda_fusions.py, kernels in ops/cuda/fused.py): GatedActivation and
GatedMatMul against float64 references and their CPU twins (ops/fused.py, the same bind), the launches they
save, and a CUDA session running a fused feed-forward gate against the CPU session of the same model.

Without a GPU the kernels run on Numba's CUDA simulator, so shapes are tiny.  When numba-cuda is missing (or
finds no GPU and the simulator is off) the module is skipped, unless ``ONNX_NUMBA_REQUIRE_CUDA=1``, in which
case collecting it fails.
"""
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import cuda as rc  # importing runtime.cuda never imports numba.cuda

from cuda_target import use_cuda_or_skip  # noqa: E402

use_cuda_or_skip("CUDA fusions")

import ops.cuda.fused as kf  # noqa: E402  (importing it registers the CUDA launches)
from ops import registry  # noqa: E402
from ops.fused import DOMAIN  # noqa: E402
from runtime import InferenceSession, SessionOptions  # noqa: E402
from runtime.errors import InvalidArgumentError, InvalidAttributeError, ShapeMismatchError  # noqa: E402

RNG = np.random.default_rng(0)
_erf = np.vectorize(math.erf)
REF = {"silu": lambda v: v / (1.0 + np.exp(-v)),
       "gelu": lambda v: 0.5 * v * (1.0 + _erf(v / math.sqrt(2.0))),
       "gelu_tanh": lambda v: 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))}
TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float16: dict(rtol=2e-3, atol=2e-3)}


def _rand(*shape, dt=np.float32):
    return (RNG.standard_normal(shape) * 2).astype(dt)


def _bound(op_type, activation, provider="CUDAExecutionProvider", n_inputs=2):
    """The ``provider``'s implementation of ``op_type`` bound as a plan binds it (one bind for CPU and CUDA)."""
    ctx = registry.OpContext(name="n", op_type=op_type, domain=DOMAIN, opset=1, attrs={"activation": activation},
                             n_inputs=n_inputs, n_outputs=1, outputs_used=[True], provider=provider)
    return registry.bind(registry.resolve(DOMAIN, op_type, 1, provider), ctx)


def _gated(g, u, activation):
    return _bound("GatedActivation", activation, n_inputs=1 if u is None else 2)(g, u)


def _gated_matmul(x, wg, wu, activation):
    return _bound("GatedMatMul", activation, n_inputs=3)(x, wg, wu)


@pytest.mark.parametrize("act", sorted(REF))
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_gated_activation(act, dt):
    g, u = _rand(2, 3, 5, dt=dt), _rand(2, 3, 5, dt=dt)
    g[0, 0, :3] = [-90.0, 0.0, 60.0]  # exp must not overflow either way
    with rc.TransferCounter() as tc:
        y = _gated(rc.to_device(g), rc.to_device(u), act)
    assert tc.kernels == {"fused._gated": 1}
    want = REF[act](g.astype(np.float64)) * u.astype(np.float64)
    got = rc.to_host(y)
    assert got.dtype == dt and got.shape == g.shape
    np.testing.assert_allclose(got.astype(np.float64), want, **TOL[dt])


@pytest.mark.parametrize("act", sorted(REF))
@pytest.mark.parametrize("rows,launches", [(1, {"fused._gemv_gated": 1}),
                                           (3, {"matmul._gemm_tiled": 2, "fused._gated": 1})])
def test_gated_matmul(act, rows, launches):
    K, N = 20, 13  # N is not a multiple of the simulator's block, K crosses a GEMM tile
    x, wg, wu = _rand(1, rows, K) / 4, _rand(K, N) / 4, _rand(K, N) / 4
    with rc.TransferCounter() as tc:
        y = _gated_matmul(rc.to_device(x), rc.to_device(wg), rc.to_device(wu), act)
    assert tc.kernels == launches
    x64 = x.astype(np.float64)
    want = REF[act](x64 @ wg.astype(np.float64)) * (x64 @ wu.astype(np.float64))
    np.testing.assert_allclose(rc.to_host(y), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("act", sorted(REF))
@pytest.mark.parametrize("rows", [1, 3])
def test_gated_matmul_matches_its_cpu_twin(act, rows):
    """The CUDA GatedMatMul (GEMV for one row, GEMMs and the gate for several) gives the CPU wrapper's result."""
    assert registry.resolve(DOMAIN, "GatedMatMul", 1, "CUDAExecutionProvider").fn is kf.launch_gated_matmul
    x, wg, wu = _rand(rows, 9) / 4, _rand(9, 5) / 4, _rand(9, 5) / 4
    want = _bound("GatedMatMul", act, "CPUExecutionProvider", 3)(x, wg, wu)
    got = rc.to_host(_gated_matmul(rc.to_device(x), rc.to_device(wg), rc.to_device(wu), act))
    assert got.dtype == want.dtype and got.shape == want.shape == (rows, 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fused_errors():
    g, u = rc.to_device(_rand(2, 3)), rc.to_device(_rand(2, 3))
    with pytest.raises(InvalidAttributeError, match="activation"):
        _gated(g, u, "relu")
    with pytest.raises(ShapeMismatchError, match="one shape"):
        _gated(g, rc.to_device(_rand(1, 3)), "silu")
    with pytest.raises(InvalidArgumentError, match="float32 or float16"):
        _gated(g, rc.to_device(_rand(2, 3, dt=np.float16)), "silu")
    w = rc.to_device(_rand(3, 4))
    with pytest.raises(ShapeMismatchError, match="two"):
        _gated_matmul(rc.to_device(_rand(1, 5)), w, w, "silu")
    with pytest.raises(ShapeMismatchError, match="two"):
        _gated_matmul(rc.to_device(_rand(1, 3)), w, rc.to_device(_rand(3, 5)), "silu")
    with pytest.raises(InvalidAttributeError, match="activation"):
        _gated_matmul(rc.to_device(_rand(1, 3)), w, w, "relu")


def _mlp_model(K=12, N=10):
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wg"], ["g"]), n("MatMul", ["x", "wu"], ["u"]), n("Sigmoid", ["g"], ["s"]),
             n("Mul", ["g", "s"], ["a"]), n("Mul", ["a", "u"], ["h"]), n("MatMul", ["h", "wd"], ["y"])]
    inits = [numpy_helper.from_array(_rand(K, N) / 3, "wg"), numpy_helper.from_array(_rand(K, N) / 3, "wu"),
             numpy_helper.from_array(_rand(N, K) / 3, "wd")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()


def test_session_runs_the_fused_gate_in_one_launch():
    """The CUDA session fuses the SiLU gate and its two products into GatedMatMul: a decode row takes two
    launches (the gate's GEMV and the down projection) instead of six, and gives the CPU session's result;
    graph_optimization_level 1 keeps the exported nodes."""
    model = _mlp_model()
    cuda = InferenceSession(model, providers=["CUDAExecutionProvider"])
    assert [n.op_type for n in cuda._graph.nodes] == ["GatedMatMul", "MatMul"]
    basic = SessionOptions()
    basic.graph_optimization_level = 1
    plain = InferenceSession(model, basic, providers=["CUDAExecutionProvider"])
    assert [n.op_type for n in plain._graph.nodes] == ["MatMul", "MatMul", "Sigmoid", "Mul", "Mul", "MatMul"]
    cpu = InferenceSession(model)
    for rows in (1, 3):
        x = _rand(1, rows, 12) / 3
        want = cpu.run(None, {"x": x})[0]
        with rc.TransferCounter() as tc:
            got = cuda.run(None, {"x": x})[0]
        with rc.TransferCounter() as tp:
            unfused = plain.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(unfused, want, rtol=1e-4, atol=1e-5)
        if rows == 1:
            assert tc.launches == 2 and tp.launches == 6, (tc.kernels, tp.kernels)


def _mnb_model(K, N, bs, zp, clash=False):
    """y = silu(x @ dequant(Bg)^T) * (x @ dequant(Bu)^T), both MatMulNBits (int4, block ``bs``); ``clash``: the
    graph also outputs values named as the fusion would name its concatenated weight and its product."""
    nb = (K + bs - 1) // bs
    inits, nodes = [], []
    for w in ("g", "u"):
        inits += [numpy_helper.from_array(RNG.integers(0, 256, (N, nb, bs // 2), dtype=np.uint8), f"B{w}"),
                  numpy_helper.from_array((RNG.random((N, nb)) * 0.05 + 0.01).astype(np.float32), f"S{w}")]
        ins = ["x", f"B{w}", f"S{w}"]
        if zp == "u8":
            inits.append(numpy_helper.from_array(RNG.integers(0, 256, N * ((nb * 4 + 7) // 8), dtype=np.uint8),
                                                 f"Z{w}"))
            ins.append(f"Z{w}")
        elif zp == "f":
            inits.append(numpy_helper.from_array((RNG.random(N * nb) * 15).astype(np.float32), f"Z{w}"))
            ins.append(f"Z{w}")
        nodes.append(helper.make_node("MatMulNBits", ins, [w], domain="com.microsoft", K=K, N=N, bits=4,
                                      block_size=bs))
    nodes += [helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", ["s", "g"], ["a"]),
              helper.make_node("Mul", ["u", "a"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if clash:
        for name in ("Bg+Bu", "y/gate_and_value"):
            nodes.append(helper.make_node("Neg", ["x"], [name]))
            outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "mnb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", K])],
                          outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return m.SerializeToString()


@pytest.mark.parametrize("zp", [None, "u8", "f"])
def test_session_runs_an_int4_gate_as_one_product(zp):
    """Two MatMulNBits feeding the gate become one MatMulNBits over the concatenated weights (each column reads
    only its own rows, so it is computed as before) and a one-input GatedActivation: two launches instead of
    four for a decode row, the CPU session's result, and the separate weights are gone."""
    K, N = 40, 6
    model = _mnb_model(K, N, 16, zp)
    cuda = InferenceSession(model, providers=["CUDAExecutionProvider"])
    nodes = cuda._graph.nodes
    assert [(n.op_type, len(n.inputs)) for n in nodes] == [("MatMulNBits", 3 if zp is None else 4),
                                                           ("GatedActivation", 1)]
    assert nodes[0].attrs["N"] == 2 * N
    assert not {"Bg", "Bu", "Sg", "Su", "Zg", "Zu"} & set(cuda._graph.initializers)
    cpu = InferenceSession(model)
    for rows in (1, 3):
        x = RNG.standard_normal((1, rows, K)).astype(np.float32)
        with rc.TransferCounter() as tc:
            got = cuda.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, cpu.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
        assert tc.kernels == {"contrib_quant._mnb_kernel": 1, "fused._gated_halves": 1}, tc.kernels


def test_gated_halves_errors():
    with pytest.raises(ShapeMismatchError, match="even last axis"):
        _gated(rc.to_device(_rand(2, 5)), None, "silu")
    gu = _rand(2, 3, 8)
    got = rc.to_host(_gated(rc.to_device(gu), None, "gelu"))
    want = REF["gelu"](gu[..., :4].astype(np.float64)) * gu[..., 4:]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_int4_gate_fusion_names_nothing_the_graph_already_names():
    """The concatenated weight and the gate-and-value product take fresh names: a graph that already has values
    named as the fusion would name them computes every output as on the CPU."""
    K, N = 32, 4
    model = _mnb_model(K, N, 16, None, clash=True)
    cuda = InferenceSession(model, providers=["CUDAExecutionProvider"])
    mnb = [n for n in cuda._graph.nodes if n.op_type == "MatMulNBits"]
    assert len(mnb) == 1 and mnb[0].inputs[1] != "Bg+Bu" and mnb[0].outputs[0] != "y/gate_and_value"
    x = RNG.standard_normal((1, 1, K)).astype(np.float32)
    for got, want in zip(cuda.run(None, {"x": x}), InferenceSession(model).run(None, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
