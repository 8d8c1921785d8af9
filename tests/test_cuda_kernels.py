"""CUDA kernels (ops/cuda/) against the CPU: numpy, or the project's CPU kernels run through
``runtime.InferenceSession`` on a one-node model.

Without a GPU the kernels run on Numba's CUDA simulator, where every CUDA thread is a Python thread, so
shapes are tiny (2x3x8-ish), but chosen so that rows are longer than a block and grids have several blocks.

Numba picks the simulator or the real driver when ``numba.cuda`` is first imported, and ``runtime.cuda``
defers that import to first use, so setting ``NUMBA_ENABLE_CUDASIM`` here works under xdist too: no other
module imports ``numba.cuda`` (``import ops`` imports only ``ops/cuda/__init__.py``, which loads no kernel).

When numba-cuda is missing (or finds no GPU and the simulator is off) the module is skipped, unless
``ONNX_NUMBA_REQUIRE_CUDA=1``, in which case collecting it fails.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

from runtime import cuda as rc  # importing runtime.cuda never imports numba.cuda

from cuda_target import use_cuda_or_skip  # noqa: E402

use_cuda_or_skip("CUDA kernels")

from ops.cuda import cast as kcast  # noqa: E402
from ops.cuda import contrib_norm as knorm  # noqa: E402,F401  (registers the RMS norms)
from ops.cuda import elementwise as kel  # noqa: E402
from ops.cuda import indexing as kidx  # noqa: E402
from ops.cuda import matmul as kmm  # noqa: E402
from ops.cuda import reduce as kred  # noqa: E402
from ops.cuda import softmax as ksm  # noqa: E402
from runtime import InferenceSession  # noqa: E402
from runtime.dtypes import onnx_type  # noqa: E402
from runtime.errors import IndexOutOfRangeError, InvalidArgumentError, ShapeMismatchError  # noqa: E402

RNG = np.random.default_rng(0)
TOL = {np.float32: (1e-5, 1e-6), np.float16: (2e-3, 2e-3)}
MS = "com.microsoft"
D = rc.to_device
H = rc.to_host


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _norm(op_type, *args, n_outputs=1, outputs_used=None, domain="", **attrs):
    """The CUDA launch of a row norm, bound as a plan binds it (its bind is the CPU wrapper's)."""
    from ops import registry
    ctx = registry.OpContext(name="n", op_type=op_type, domain=domain, opset=1, attrs=attrs, n_inputs=len(args),
                             n_outputs=n_outputs, outputs_used=outputs_used or [True] * n_outputs)
    impl = registry.resolve(domain, op_type, 1, "CUDAExecutionProvider")
    return registry.bind(impl, ctx)(*args)


def _cpu(op_type, inputs, n_out=1, domain="", **attrs):
    """Run one node on the CPU provider; inputs: list of arrays (None for a missing optional input)."""
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(inputs)]
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, domain=domain, **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, onnx_type(a.dtype), list(a.shape)) for n, a in zip(names, inputs) if n],
        [helper.make_empty_tensor_value_info(o) for o in outs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    sess = InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: a for n, a in zip(names, inputs) if n})


def _close(got, want, dtype=None):
    r, a = TOL[np.dtype(dtype or want.dtype).type] if np.dtype(dtype or want.dtype).kind == "f" else (0, 0)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=r, atol=a)


def test_mode():
    assert rc.available()
    if not rc.gpu_present():
        assert rc.simulator(), "numba.cuda was imported before NUMBA_ENABLE_CUDASIM was set"


def test_require_cuda_rule(monkeypatch):
    monkeypatch.setattr(rc, "unavailable_reason", lambda: "no GPU (test)")
    monkeypatch.delenv(rc.REQUIRE_ENV, raising=False)
    rc.require_cuda()  # not required: the caller may skip
    monkeypatch.setenv(rc.REQUIRE_ENV, "1")
    with pytest.raises(rc.CudaUnavailableError, match="ONNX_NUMBA_REQUIRE_CUDA"):
        rc.require_cuda()


# -- elementwise -------------------------------------------------------------------------------------

_NP_BIN = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
_SHAPES = [((2, 3, 8), (2, 3, 8)), ((2, 3, 8), (3, 1)), ((1, 3, 1), (2, 1, 8)), ((5,), ())]


@pytest.mark.parametrize("op", list(_NP_BIN))
@pytest.mark.parametrize("sa,sb", _SHAPES)
def test_binary(op, sa, sb):
    a, b = _rand(*sa), _rand(*sb)
    if op == "Div":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    _close(H(kel.binary(op, D(a), D(b))), _NP_BIN[op](a, b))


def test_binary_int_and_f16():
    a, b = RNG.integers(-50, 50, (2, 3, 8)), RNG.integers(-50, 50, (3, 8))
    _close(H(kel.Mul(D(a), D(b))), a * b)
    x, y = _rand(2, 3, 8, dtype=np.float16), _rand(8, dtype=np.float16)
    _close(H(kel.Add(D(x), D(y))), (x.astype(np.float32) + y).astype(np.float16))


def test_binary_errors():
    with pytest.raises(ShapeMismatchError, match="4 canonical axes"):
        kel.Add(D(np.zeros((2, 1, 2, 1, 2, 1, 2), np.float32)), D(np.zeros((2, 1, 2, 1, 2, 1), np.float32)))
    with pytest.raises(ShapeMismatchError):
        kel.Add(D(np.zeros((2, 3), np.float32)), D(np.zeros((4,), np.float32)))
    with pytest.raises(InvalidArgumentError, match="device array"):
        kel.Add(np.zeros(3, np.float32), D(np.zeros(3, np.float32)))
    with pytest.raises(InvalidArgumentError, match="one dtype"):
        kel.Add(D(np.zeros(3, np.float32)), D(np.zeros(3, np.float16)))


@pytest.mark.filterwarnings("ignore:overflow encountered")  # exp(100) in float16 is inf, as on the CPU
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_unary(dtype):
    x = (_rand(2, 3, 8) * 4).astype(dtype)
    x.flat[:4] = [-100, 100, 0, -0.5]
    xf = x.astype(np.float32)
    with np.errstate(over="ignore"):
        want = {"Neg": -xf, "Exp": np.exp(xf), "Sigmoid": 1 / (1 + np.exp(-xf)), "Tanh": np.tanh(xf),
                "Relu": np.maximum(xf, 0)}
    for op, w in want.items():
        _close(H(kel.unary(op, D(x))), w.astype(dtype))


def test_where():
    c = RNG.random((2, 1, 8)) > 0.5
    x, y = _rand(3, 1), _rand(2, 3, 8)
    _close(H(kel.Where(D(c), D(x), D(y))), np.where(c, x, y))


# -- softmax, norms, argmax, cast, gather (CPU kernels as reference) ----------------------------------

@pytest.mark.parametrize("shape,dtype", [((2, 3, 8), np.float32), ((2, 40), np.float32), ((3, 20), np.float16)])
def test_softmax(shape, dtype):
    x = (_rand(*shape) * 3).astype(dtype)
    _close(H(ksm.Softmax(D(x))), _cpu("Softmax", [x], axis=-1)[0])


def test_softmax_rejects_inner_axis():
    with pytest.raises(InvalidArgumentError, match="last axis"):
        ksm.Softmax(D(_rand(2, 3)), axis=0)


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm(axis):
    x = _rand(2, 3, 8)
    scale = _rand(*x.shape[axis:])
    y, inv = _norm("SimplifiedLayerNormalization", D(x), D(scale), axis=axis, epsilon=1e-5, n_outputs=2)
    ry, rinv = _cpu("SimplifiedLayerNormalization", [x, scale], n_out=2, axis=axis, epsilon=1e-5)
    _close(H(y), ry)
    _close(H(inv), rinv)


@pytest.mark.parametrize("skip_shape,with_bias", [((2, 3, 24), True), ((3, 24), False)])
def test_skip_simplified_layer_norm(skip_shape, with_bias):
    x, skip, gamma = _rand(2, 3, 24), _rand(*skip_shape), _rand(24)
    bias = _rand(24) if with_bias else None
    got = _norm("SkipSimplifiedLayerNormalization", D(x), D(skip), D(gamma),
                *([] if bias is None else [D(bias)]), epsilon=1e-6, n_outputs=4, domain=MS)
    ref = _cpu("SkipSimplifiedLayerNormalization", [x, skip, gamma, bias], n_out=4, domain=MS, epsilon=1e-6)
    for g, r in zip(got, ref):
        _close(H(g), r)


@pytest.mark.parametrize("keepdims", [1, 0])
def test_argmax_first_on_ties(keepdims):
    x = _rand(2, 3, 40)
    x[0, 0, [5, 30]] = 9.0  # tie: the first one wins
    x[1, 2, [0, 39]] = 9.0
    x[0, 1] = -np.inf  # all -inf: index 0
    got = H(kred.ArgMax(D(x), axis=-1, keepdims=keepdims))
    _close(got, _cpu("ArgMax", [x], axis=-1, keepdims=keepdims)[0])
    assert got.reshape(2, 3)[0, 0] == 5 and got.reshape(2, 3)[1, 2] == 0 and got.reshape(2, 3)[0, 1] == 0


@pytest.mark.filterwarnings("ignore:overflow encountered")  # 70000 -> float16 is inf, on both sides
@pytest.mark.parametrize("src,to", [(np.float32, TensorProto.FLOAT16), (np.float16, TensorProto.FLOAT)])
def test_cast(src, to):
    x = (_rand(2, 3, 8) * 100).astype(src)
    x.flat[:3] = [70000.0 if src == np.float32 else 1.0, 1e-8, np.nan]
    _close(H(kcast.Cast(D(x), to)), _cpu("Cast", [x], to=to)[0])


@pytest.mark.parametrize("axis,idx", [(0, [[0, 4], [-1, 2]]), (1, [2, 0, -3]), (-1, 7)])
def test_gather(axis, idx):
    data = _rand(5, 3, 8) if axis == 0 else _rand(2, 3, 8)
    idx = np.array(idx, np.int64)
    _close(H(kidx.Gather(D(data), idx, axis=axis)), _cpu("Gather", [data, idx], axis=axis)[0])


def test_gather_validates_on_host():
    data = D(_rand(5, 8))
    with pytest.raises(IndexOutOfRangeError, match="out of bounds"):
        kidx.Gather(data, np.array([0, 5]), axis=0)
    with pytest.raises(IndexOutOfRangeError):
        kidx.Gather(data, D(np.array([-6], np.int32)), axis=0)


# -- matmul ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,with_bias,xshape", [(np.float32, True, (20,)), (np.float16, False, (1, 20))])
def test_gemv(dtype, with_bias, xshape):
    x, w = _rand(*xshape, dtype=dtype), _rand(20, 8, dtype=dtype)
    b = _rand(8, dtype=dtype) if with_bias else None
    want = x.astype(np.float32) @ w.astype(np.float32) + (0 if b is None else b.astype(np.float32))
    _close(H(kmm.gemv(D(x), D(w), None if b is None else D(b))), want.astype(dtype))


@pytest.mark.parametrize("sa,sb", [((3, 20), (20, 8)), ((2, 3, 20), (20, 8)), ((2, 17, 5), (2, 5, 18))])
def test_gemm(sa, sb):
    a, b = _rand(*sa), _rand(*sb)
    got = H(kmm.gemm(D(a), D(b)))
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_dispatch_and_errors():
    x, w = _rand(1, 20), _rand(20, 8)
    np.testing.assert_allclose(H(kmm.MatMul(D(x), D(w))), x @ w, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeMismatchError, match="inner"):
        kmm.gemm(D(_rand(3, 4)), D(_rand(5, 2)))


# -- transfers ---------------------------------------------------------------------------------------

def test_transfer_counter_sees_only_explicit_copies():
    x, w, g = _rand(1, 16), _rand(16, 24), _rand(16)
    cache = np.zeros((2, 8), np.float32)  # stands for a KV cache that must stay on the device
    with rc.TransferCounter() as tc:
        dx, dw, dg, dcache = D(x), D(w), D(g), D(cache)
        assert tc.h2d == x.nbytes + w.nbytes + g.nbytes + cache.nbytes and tc.h2d_calls == 4 and tc.d2h == 0
        tc.reset()
        h = _norm("SimplifiedLayerNormalization", dx, dg)
        logits = kmm.MatMul(h, dw)
        kel.Add(dcache, dcache, out=dcache)  # the "cache" is updated in place on the device
        tok = kred.ArgMax(logits, keepdims=0)
        assert (tc.h2d, tc.d2h) == (0, 0), tc  # a chain of kernels moves nothing
        t = H(tok)
        assert tc.d2h == t.nbytes == 8 and tc.d2h_calls == 1 and tc.h2d == 0
    ref = (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g) @ w
    assert int(t.reshape(())) == int(np.argmax(ref))
    with rc.TransferCounter() as outer:
        with rc.TransferCounter() as inner:
            H(dcache)
        H(dcache)
    assert (inner.d2h, outer.d2h) == (cache.nbytes, 2 * cache.nbytes)


def test_every_launch_is_counted_by_kernel():
    """Kernels declared through runtime.cuda.jit count each launch, per kernel name, in every active counter;
    device functions stay Numba's own (kernels call them, nothing launches them)."""
    from ops.cuda import _common
    x, w, g = D(_rand(1, 16)), D(_rand(16, 24)), D(_rand(16))
    with rc.TransferCounter() as outer:
        with rc.TransferCounter() as inner:
            h = _norm("SimplifiedLayerNormalization", x, g)
        logits = kmm.MatMul(h, w)
        kred.ArgMax(logits, keepdims=0)
    assert inner.launches == 1 and inner.kernels == {"contrib_norm._rows": 1}
    assert outer.launches == 3 and outer.kernels == {"contrib_norm._rows": 1, "matmul._gemv": 1,
                                                     "reduce._argmax_rows": 1}, outer.kernels
    assert isinstance(kmm._gemv, rc.Kernel) and repr(kmm._gemv) == "<CUDA kernel matmul._gemv>"
    assert not isinstance(_common.block_sum, rc.Kernel)
    outer.reset()
    assert (outer.launches, outer.kernels) == (0, {})


def test_launch_stream_routes_launches_and_copies_and_refuses_copies_while_capturing():
    """Inside ``launch_stream`` every launch without its own stream goes to the block's stream (innermost wins,
    restored after); a capturing block refuses host<->device copies but lets device copies and launches
    through; work outside any block keeps the default stream."""
    configs = []

    class Spy:
        def __getitem__(self, config):
            configs.append(config)
            return lambda *a: None

    k = rc.Kernel(Spy(), "spy")
    s1, s2 = rc.cuda.stream(), rc.cuda.stream()
    k[2, 32]()
    with rc.launch_stream(s1):
        k[2, 32]()
        k[2, 32, s2, 0]()  # a launch naming its stream keeps it
        with rc.launch_stream(s2):
            k[2, 32]()
            assert rc.current_stream() is s2
        k[2, 32, 0, 64]()  # the default stream named explicitly: the block's, shared memory kept
        assert rc.current_stream() is s1
    k[2, 32]()
    assert configs == [(2, 32), (2, 32, s1), (2, 32, s2, 0), (2, 32, s2), (2, 32, s1, 64), (2, 32)]
    assert rc.current_stream() == 0

    x = _rand(2, 8)
    d = D(x)
    with rc.launch_stream(s1):  # not capturing: copies run (and the download is complete when it returns)
        np.testing.assert_array_equal(H(D(x)), x)
    with rc.launch_stream(s1, capturing=True), rc.TransferCounter() as tc:
        with pytest.raises(rc.CaptureError, match=r"host-to-device copy of \[2, 8\] float32 while a CUDA graph"):
            D(x)
        with pytest.raises(rc.CaptureError, match=r"device-to-host copy of \[2, 8\] float32"):
            H(d)
        c = rc.device_empty((2, 8), np.float32)
        rc.copy_device(c, d)  # device to device: allowed
        y = kel.Add(d, d)
    assert (tc.h2d_calls, tc.d2h_calls, tc.launches) == (0, 0, 1)
    np.testing.assert_array_equal(H(c), x)
    np.testing.assert_array_equal(H(y), x + x)
    with pytest.raises(ShapeMismatchError, match=r"destination is \[2, 8\] float32, source is \[8\] float32"):
        rc.copy_device(c, D(x[0]))


def test_launch_log_records_buffers_and_scalars_and_compares_runs():
    """A LaunchLog records each launch's kernel, configuration, buffer addresses and scalars; two runs on the same
    buffers with the same scalars compare equal (a graph replay would launch exactly them), and each kind of
    difference is named.  Without a log the launch is Numba's own, unwrapped."""
    x, w, y = D(_rand(16)), D(_rand(16 * 8)), rc.device_empty((8,), np.float32)
    y2 = rc.device_empty((8,), np.float32)

    def run(out, K=16):
        kmm.launch_gemv(x, w, None, out, K, 8)

    logs = []
    for out, K, extra in ((y, 16, False), (y, 16, False), (y2, 16, False), (y, 15, False), (y2, 15, False),
                          (y, 16, True)):
        with rc.LaunchLog() as log:
            run(out, K)
            if extra:
                kred.ArgMax(y, keepdims=0)
        logs.append(log.launches)
    name, grid, block, args = logs[0][0]
    assert name == "matmul._gemv" and len(grid) >= 1 and len(block) == 2
    assert args[0] == ("buffer", rc.device_pointer(x), (16,), "float32") and args[-1] == ("value", 8)
    diff = rc.LaunchLog.differences
    assert diff(logs[0], logs[1]) == []
    np.testing.assert_allclose(H(y), H(x) @ H(w).reshape(16, 8), rtol=1e-5, atol=1e-6)  # the launch ran
    assert diff(logs[0], logs[2]) == [(0, "matmul._gemv", "buffers")]
    assert diff(logs[0], logs[3]) == [(0, "matmul._gemv", "values")]
    assert diff(logs[0], logs[4]) == [(0, "matmul._gemv", "buffers+values")]
    assert diff(logs[0], logs[5]) == [(1, "reduce._argmax_rows", "missing")]
    assert diff([("a", (1,), (2,), ())], [("b", (1,), (2,), ())]) == [(0, "a", "kernel")]
    import types
    with rc.LaunchLog():
        assert isinstance(kmm._gemv[1, 1], types.FunctionType)  # the recording wrapper
    assert not rc._logs and not isinstance(kmm._gemv[1, 1], types.FunctionType)  # Numba's own launcher


def test_skip_norm_leaves_an_unnamed_mean_out():
    """SkipSimplifiedLayerNormalization's mean (always zeros) costs a launch only when the graph names it."""
    x, skip, g = D(_rand(2, 16)), D(_rand(2, 16)), D(_rand(16))
    with rc.TransferCounter() as tc:
        y, mean, inv, s = _norm("SkipSimplifiedLayerNormalization", x, skip, g, n_outputs=4, domain=MS,
                                 outputs_used=[True, False, False, True])
    assert mean is None and tc.launches == 1
    with rc.TransferCounter() as tc:
        y2, mean2, _, s2 = _norm("SkipSimplifiedLayerNormalization", x, skip, g, n_outputs=4, domain=MS)
    assert tc.launches == 2 and not H(mean2).any() and H(mean2).shape == (2, 1)
    np.testing.assert_array_equal(H(y), H(y2))
    np.testing.assert_array_equal(H(s), H(s2))


@pytest.mark.skipif(not rc.simulator(), reason="records the simulator's launches")
def test_the_ptx_check_records_each_host_launch_with_its_numba_types(monkeypatch):
    """``tools/cuda_ptx_check``'s first half: a launch from the host is recorded with the types a GPU launch
    would give its arguments (device functions called inside the kernel are not launches), and the kernel is
    found again by name for the second half to compile."""
    import numba
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    from tools import cuda_ptx_check as chk
    monkeypatch.setattr(FakeCUDAKernel, "__call__", chk._recording(FakeCUDAKernel.__call__))
    monkeypatch.setattr(chk, "_seen", set())
    kel.unary("Sigmoid", D(np.zeros(5, np.float32)))
    f32 = numba.types.Array(numba.float32, 1, "C")
    assert chk._seen == {("ops.cuda.elementwise", "_unary_f32", (numba.int64, f32, f32, numba.float32, numba.float32))}
    assert chk._kernel_function("ops.cuda.elementwise", "_unary_f32") is kel._unary_f32.dispatcher.py_func
    assert chk._kernel_function("ops.cuda.elementwise", "make.<locals>.k") is None
