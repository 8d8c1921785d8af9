"""The one op contract (ops/registry.py): every op with a region form or a CUDA kernel shares its CPU twin's bind.

An op written to the contract registers one ``bind`` (its attributes with their defaults, its plan-time checks)
and each implementation (CPU wrapper, region form, CUDA launch) under that same bind.  Every op with a form or
a CUDA kernel is written so; ``NOT_YET`` lists the ops whose form or CUDA kernel still read the
node's attributes themselves: the test fails when an op outside it lacks a shared bind, and also when an op in it
has one (so the list stays exact).
"""
import inspect

from cuda_target import use_cuda_or_skip

use_cuda_or_skip("the CUDA registrations")

import ops  # noqa: E402,F401
import ops.compiled_forms_contrib  # noqa: E402,F401
import ops.cuda  # noqa: E402
from ops import registry  # noqa: E402

CPU, CUDA, REGION = "CPUExecutionProvider", "CUDAExecutionProvider", registry.REGION
MS = "com.microsoft"

# The CUDA kernels added for the node suite's coverage (ops/cuda: norms, movement, indexing, quantization, control
# flow, the variadic ops) register factories that read their attributes themselves, as their CPU
# twins do; each leaves this list when the pair is written to the contract.
NOT_YET = {("", op) for op in (
    "BatchNormalization", "BitShift", "CastLike", "Clip", "ConstantOfShape", "CumProd", "CumSum", "DepthToSpace",
    "DequantizeLinear", "Dropout", "EyeLike", "GatherElements", "GatherND", "Gemm", "GroupNormalization", "If",
    "InstanceNormalization", "LRN", "Loop", "Max", "Mean", "MeanVarianceNormalization", "Min", "Mod", "OneHot",
    "PRelu", "Pad", "QuantizeLinear", "RMSNormalization", "Range", "Resize", "ReverseSequence", "Scan", "Scatter",
    "ScatterElements", "ScatterND", "Sign", "SpaceToDepth", "Sum", "Tile", "TopK", "Trilu", "Upsample")}


def _twins():
    """(domain, op_type, since, provider, impl, CPU impl at that version) for every form and CUDA kernel."""
    ops.cuda.load()
    for provider in (REGION, CUDA):
        for domain, op_type, since in registry.registered_ops(provider):
            impl = registry.resolve(domain, op_type, since, provider)
            yield domain, op_type, since, provider, impl, registry.resolve(domain, op_type, since, CPU)


def test_every_form_and_cuda_kernel_shares_its_cpu_bind():
    unshared, converted = set(), set()
    for domain, op_type, since, provider, impl, cpu in _twins():
        shared = cpu is not None and impl.contract is not None and impl.contract is cpu.contract
        (converted if shared else unshared).add((domain, op_type, since, provider))
    lagging = {(d, o) for d, o, _, _ in unshared}
    assert lagging - NOT_YET == set(), "ops whose form or CUDA kernel does not share the CPU bind"
    done = {(d, o) for d, o, _, _ in converted} - lagging
    assert done & NOT_YET == set(), "ops written to the contract: take them off NOT_YET"
    assert {(MS, "SimplifiedLayerNormalization"), ("", "SimplifiedLayerNormalization"),
            (MS, "SkipSimplifiedLayerNormalization"), (MS, "SkipLayerNormalization"),
            (MS, "GroupQueryAttention"), (MS, "RotaryEmbedding"), (MS, "MRotaryEmbedding"),
            (MS, "MatMulNBits"), (MS, "GatherBlockQuantized"),
            (MS, "GatedRMSNorm"), (MS, "LinearAttentionGate"),
            (MS, "CausalConvWithState"), ("", "CausalConvWithState"), (MS, "Gelu"), (MS, "BiasGelu"),
            (MS, "FastGelu"), (MS, "QuickGelu"), (MS, "LinearAttention"), ("", "LinearAttention"),
            ("", "Cast")} <= done


def test_attribute_defaults_are_written_once():
    """A contract op's implementations take no attributes of their own: only (bound, ctx), a form (e, bound)."""
    for domain, op_type, since, provider, impl, cpu in _twins():
        if impl.contract is None:
            continue
        params = list(inspect.signature(impl.fn).parameters)
        assert len(params) == 2, (provider, domain, op_type, params)
        assert len(inspect.signature(cpu.fn).parameters) == 2, (domain, op_type)


def test_forms_resolve_by_version(monkeypatch):
    """Forms live in the versioned registry: a form registered from a later version is not used before it."""
    # The probe registers into copies of the registry's tables, so no other test ever sees it.
    monkeypatch.setattr(registry, "_REG", {k: list(v) for k, v in registry._REG.items()})
    monkeypatch.setattr(registry, "_SINCE", {k: list(v) for k, v in registry._SINCE.items()})
    calls = []

    @registry.op("ContractProbe", 5, domain="test.contract", provider=REGION)
    def _probe(e):
        calls.append(e)

    from ops.forms import form_of
    from runtime.ir import Node
    assert form_of(Node("ContractProbe", ["x"], ["y"], domain="test.contract", opset=4)) is None
    assert form_of(Node("ContractProbe", ["x"], ["y"], domain="test.contract", opset=7)).fn is _probe


def test_arena_buffers_go_only_to_wrappers_that_write_into_them():
    """A contract wrapper gets preallocated output buffers only when it is registered with ``writes_out``
    (Cast is; the GELU family allocates its own): no arena bytes are spent on buffers nobody writes."""
    import numpy as np
    from onnx import TensorProto, helper
    from runtime import GraphOptimizationLevel, InferenceSession, SessionOptions
    nodes = [helper.make_node("QuickGelu", ["x"], ["g"], domain=MS),
             helper.make_node("Cast", ["g"], ["c"], to=TensorProto.DOUBLE),
             helper.make_node("Neg", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 8])],
                          value_info=[helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 8]),
                                      helper.make_tensor_value_info("c", TensorProto.DOUBLE, [2, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    so = SessionOptions()
    so.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL  # every node its own step
    sess = InferenceSession(m.SerializeToString(), so)
    assert sess.plan.arena_bytes == 2 * 8 * 8  # Cast's float64 output only
    x = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)
    want = -(x / (1 + np.exp(-1.702 * x))).astype(np.float64)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-6)
