"""MatMulNBits and GatherBlockQuantized (com.microsoft) against onnxruntime.

One-node models built with onnx.helper run through ``runtime.InferenceSession`` and onnxruntime on
randomized shapes: decode (M=1) and prefill rows, K not a multiple of the block, block sizes 16 to
256, 4 and 8 bits, zero points absent / packed uint8 / float, bias, g_idx, accuracy_level 0 and 4
(the native kernel reproduces onnxruntime's int8 quantization of A at level 4), float16 A.
GatherBlockQuantized covers packed uint8 (4 and 8 bits), int4/uint4 data, rank-3 data, other
gather/quantize axes, negative indices, and ``IndexOutOfRangeError`` for bad indices.
"""
import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession
from runtime.dtypes import onnx_type
from runtime.errors import IndexOutOfRangeError

RNG = np.random.default_rng(0)


def _run_both(node, feeds, inits):
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, onnx_type(v.dtype), list(v.shape)) for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(v, k) for k, v in inits.items() if v is not None])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    mb = m.SerializeToString()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(mb, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = InferenceSession(mb).run(None, feeds)[0]
    return got, ref


def _mnb(M, K, N, bits, bs, zp=None, level=0, bias=False, gidx=False, dt=np.float32, lead=()):
    nb = (K + bs - 1) // bs
    inits = {"B": RNG.integers(0, 256, (N, nb, bs * bits // 8), dtype=np.uint8),
             "scales": (RNG.random(N * nb, dtype=np.float32) * 0.02 + 0.001).astype(dt),
             "zp": None, "g": None, "bias": None}
    if zp == "u8":
        inits["zp"] = RNG.integers(0, 256, N * ((nb * bits + 7) // 8), dtype=np.uint8)
    elif zp == "f":
        inits["zp"] = (RNG.random(N * nb) * 15).astype(dt)
    if gidx:
        inits["g"] = RNG.integers(0, nb, K).astype(np.int32)
    if bias:
        inits["bias"] = RNG.standard_normal(N).astype(dt)
    names = ["B", "scales", "zp", "g", "bias"]
    while inits[names[-1]] is None:
        names.pop()
    node = helper.make_node("MatMulNBits", ["a"] + [k if inits[k] is not None else "" for k in names], ["y"],
                            domain="com.microsoft", K=K, N=N, bits=bits, block_size=bs, accuracy_level=level)
    a = RNG.standard_normal(tuple(lead) + (M, K)).astype(dt)
    return _run_both(node, {"a": a}, inits)


@pytest.mark.parametrize("M,K,N,bits,bs,zp,level,bias,gidx", [
    (1, 64, 32, 4, 32, None, 0, False, False),
    (1, 64, 32, 4, 32, None, 4, False, False),
    (1, 100, 48, 4, 32, "u8", 0, False, False),     # K not a multiple of the block
    (1, 100, 48, 4, 32, "u8", 4, False, False),
    (3, 256, 40, 4, 16, "f", 0, False, False),
    (3, 256, 40, 4, 16, "f", 4, False, False),      # float zero points: onnxruntime keeps float A
    (20, 256, 40, 4, 16, "f", 4, False, False),
    (1, 200, 40, 8, 64, None, 0, False, False),
    (1, 200, 40, 8, 64, None, 4, False, False),
    (2, 200, 40, 8, 64, "u8", 4, True, False),
    (20, 300, 70, 4, 32, "u8", 0, False, False),    # prefill: dequantized tiles + BLAS
    (20, 300, 70, 4, 32, "u8", 4, True, False),     # level 4: the int8 kernels, row by row
    (80, 300, 70, 4, 32, "u8", 4, False, False),    # more rows than they take: tiles
    (33, 300, 70, 8, 128, "u8", 4, False, False),
    (1, 4096, 256, 4, 128, None, 4, False, False),
    (1, 4096, 256, 4, 128, None, 0, False, False),
    (1, 512, 64, 4, 256, "u8", 4, True, False),
    (5, 64, 70, 4, 32, None, 0, True, True),        # g_idx
    (5, 64, 70, 4, 32, "f", 0, False, True),
    (5, 64, 70, 4, 32, "u8", 0, False, True),       # onnxruntime ignores packed zero points with g_idx
])
def test_matmul_nbits(M, K, N, bits, bs, zp, level, bias, gidx):
    got, ref = _mnb(M, K, N, bits, bs, zp, level, bias, gidx)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("level", [0, 4])
def test_matmul_nbits_fp16_batched(level):
    got, ref = _mnb(4, 512, 64, 4, 32, None, level, dt=np.float16, lead=(2,))
    assert got.shape == ref.shape == (2, 4, 64) and got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2e-2,
                               atol=2e-3 * np.abs(ref.astype(np.float32)).max())


def _gbq(lshape, ga, qa, bs, bits, zp, idx, dt=np.float32, tname="uint8"):
    per = 8 // bits if tname == "uint8" else 1
    dshape = list(lshape[:-1]) + [lshape[-1] // per]
    if tname == "uint8":
        data = RNG.integers(0, 256, dshape, dtype=np.uint8)
    elif tname == "int4":
        data = RNG.integers(-8, 8, dshape).astype(ml_dtypes.int4)
    else:
        data = RNG.integers(0, 16, dshape).astype(ml_dtypes.uint4)
    sshape = list(lshape)
    sshape[qa] = (lshape[qa] + bs - 1) // bs
    inits = {"data": data, "sc": (RNG.random(sshape) + 0.1).astype(dt)}
    if zp:
        zshape = list(sshape)
        if tname == "uint8":
            zshape[-1] = (zshape[-1] + per - 1) // per
            inits["zp"] = RNG.integers(0, 256, zshape, dtype=np.uint8)
        else:
            lo, hi = (-8, 8) if tname == "int4" else (0, 16)
            inits["zp"] = RNG.integers(lo, hi, zshape).astype(data.dtype)
    node = helper.make_node("GatherBlockQuantized", ["data", "idx", "sc"] + (["zp"] if zp else []), ["y"],
                            domain="com.microsoft", gather_axis=ga, quantize_axis=qa, block_size=bs, bits=bits)
    return node, {"idx": idx}, inits


I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731


@pytest.mark.parametrize("lshape,ga,qa,bs,bits,zp,idx,dt,tname", [
    ((50, 64), 0, 1, 32, 4, False, I64(3, 7, 49, 0), np.float32, "uint8"),
    ((50, 64), 0, 1, 32, 4, True, I64(3, 7, 49, 0), np.float32, "uint8"),
    ((50, 96), 0, 1, 64, 4, True, np.array([[1, 2], [3, 4]], np.int32), np.float32, "uint8"),
    ((50, 64), 0, 1, 16, 8, True, I64(3, 7), np.float32, "uint8"),
    ((50, 64), 0, 1, 16, 8, False, I64(3, 7), np.float16, "uint8"),
    ((50, 64), 0, 1, 32, 4, False, I64(-1, 7), np.float32, "uint8"),
    ((6, 10, 64), 0, 2, 16, 4, True, I64(0, 5, 2), np.float32, "uint8"),
    ((50, 64), 0, 1, 32, 4, True, I64(3, 7, 49, 0), np.float32, "int4"),
    ((50, 64), 0, 1, 32, 4, False, I64(3, 7, 49, 0), np.float32, "uint4"),
    ((64, 50), 0, 0, 32, 4, False, I64(3, 7, 49, 0), np.float32, "int4"),   # gather along the quantized axis
    ((64, 50), 1, 0, 32, 4, True, I64(3, 7, 49, 0), np.float32, "uint4"),
])
def test_gather_block_quantized(lshape, ga, qa, bs, bits, zp, idx, dt, tname):
    got, ref = _run_both(*_gbq(lshape, ga, qa, bs, bits, zp, idx, dt, tname))
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("bad", [50, -51])
def test_gather_block_quantized_index_error(bad):
    node, feeds, inits = _gbq((50, 64), 0, 1, 32, 4, False, I64(3, bad))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("idx", TensorProto.INT64, [2])],
                          [helper.make_empty_tensor_value_info("y")],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    with pytest.raises(IndexOutOfRangeError):
        InferenceSession(m.SerializeToString()).run(None, feeds)


@pytest.mark.parametrize("trivial", [False, True])
def test_matmul_nbits_level4_with_a_g_idx_keeps_a_float(trivial):
    """With a g_idx, even one equal to ``k // block_size``, onnxruntime keeps A float at accuracy level 4 (no int8
    quantization of A): the product is the float one (this runtime quantized A before, 0.04 away)."""
    import onnxruntime as ort
    from onnx import TensorProto as T, helper as h, numpy_helper as nh
    rng = np.random.default_rng(3 + trivial)
    K, N, bs = 128, 64, 32
    nb = K // bs
    codes = rng.integers(0, 16, (N, nb, bs)).astype(np.uint8)
    sc = (rng.random(N * nb) * 0.1 + 0.01).astype(np.float32)
    g = (np.arange(K) // bs).astype(np.int32)
    if not trivial:
        g = rng.permutation(g).astype(np.int32)
    A = rng.standard_normal((1, K)).astype(np.float32)
    node = h.make_node("MatMulNBits", ["A", "B", "S", "", "G"], ["Y"], domain="com.microsoft", K=K, N=N, bits=4,
                       block_size=bs, accuracy_level=4)
    graph = h.make_graph([node], "g", [h.make_tensor_value_info("A", T.FLOAT, [1, K])],
                         [h.make_tensor_value_info("Y", T.FLOAT, [1, N])],
                         [nh.from_array((codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8), "B"),
                          nh.from_array(sc, "S"), nh.from_array(g, "G")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    b = model.SerializeToString()
    w = (codes.reshape(N, K).astype(np.float64) - 8) * sc.reshape(N, nb)[:, g]
    ref = A.astype(np.float64) @ w.T
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    want = ort.InferenceSession(b, so, providers=["CPUExecutionProvider"]).run(None, {"A": A})[0]
    got = InferenceSession(b).run(None, {"A": A})[0]
    for y in (want, got):
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
