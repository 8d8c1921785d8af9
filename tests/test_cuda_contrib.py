"""CUDA contrib kernels (ops/cuda/contrib_quant.py, ops/cuda/contrib_attention.py) against the CPU twins.

Each op runs through the registry twice: the CUDAExecutionProvider wrapper on device copies of the inputs
(host inputs stay numpy) and the CPU wrapper on the numpy inputs, with the same attributes; results are
compared after ``to_host``.  Without a GPU the kernels run on Numba's CUDA simulator, so shapes are tiny but
chosen to cross block boundaries: K not a multiple of the quant block, sequence lengths not multiples of the
thread count, odd head sizes, GQA ratios 1/2/4, prefill with and without past, single-token decode.

When numba-cuda is missing (or finds no GPU and the simulator is off) the module is skipped, unless
``ONNX_NUMBA_REQUIRE_CUDA=1``, in which case collecting it fails.
"""

import numpy as np
import pytest

from runtime import cuda as rc  # importing runtime.cuda never imports numba.cuda

from cuda_target import use_cuda_or_skip  # noqa: E402

use_cuda_or_skip("CUDA kernels")

from ops import registry  # noqa: E402  (importing ops registers the CPU twins)
from ops.cuda import contrib_attention as katt  # noqa: E402  (importing registers the CUDA kernels)
from ops.cuda import contrib_quant as kq  # noqa: E402
from runtime.errors import (IndexOutOfRangeError, InvalidArgumentError, InvalidAttributeError,  # noqa: E402
                            ShapeMismatchError)

RNG = np.random.default_rng(0)
MS = "com.microsoft"
CUDA = "CUDAExecutionProvider"
TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float16: dict(rtol=1e-2, atol=3e-3)}


def _ctx(op, attrs, n_in, n_out, provider):
    return registry.OpContext(name=f"{op}_test", op_type=op, domain=MS, opset=1, attrs=dict(attrs),
                              n_inputs=n_in, n_outputs=n_out, provider=provider, outputs_used=[True] * n_out)


def _run(op, inputs, n_out=1, **attrs):
    """(cuda results, cpu results) as lists of numpy arrays; inputs: list with None for missing optionals."""
    cpu = registry.resolve(MS, op, 1)
    dev = registry.resolve(MS, op, 1, CUDA)
    assert dev is not None and dev.provider == CUDA
    want = registry.bind(cpu, _ctx(op, attrs, len(inputs), n_out, "CPUExecutionProvider"))(*inputs)
    dins = [None if a is None else (np.asarray(a) if i in dev.host_inputs else rc.to_device(a))
            for i, a in enumerate(inputs)]
    got = registry.bind(dev, _ctx(op, attrs, len(inputs), n_out, CUDA))(*dins)
    want = list(want) if isinstance(want, tuple) else [want]
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(want)
    return [rc.to_host(g) for g in got], want


def _close(got, want, dt=np.float32, **tol):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **(tol or TOL[dt]))


def _rand(*shape, dt=np.float32):
    return RNG.standard_normal(shape).astype(dt)


def test_registered():
    assert registry.resolve(MS, "GatherBlockQuantized", 1, CUDA).fn is kq.launch_gbq
    # The lengths and positions are read (and validated) on the host, where a decoder computes them.
    assert registry.resolve(MS, "GroupQueryAttention", 1, CUDA).fn is katt.launch_gqa
    assert registry.resolve(MS, "RotaryEmbedding", 1, CUDA).fn is katt.launch_rope
    assert registry.resolve(MS, "MatMulNBits", 1, CUDA).fn is kq.launch_mnb
    assert registry.resolve(MS, "GroupQueryAttention", 1, CUDA).host_inputs == (5, 6, 9)
    assert registry.resolve(MS, "RotaryEmbedding", 1, CUDA).host_inputs == (1,)
    assert registry.resolve(MS, "MRotaryEmbedding", 1, CUDA).host_inputs == (1,)


# -- MatMulNBits -------------------------------------------------------------------------------------

def _mnb_inputs(M, K, N, bits, bs, zp=None, bias=False, gidx=False, dt=np.float32, lead=()):
    nb = (K + bs - 1) // bs
    b = RNG.integers(0, 256, (N, nb, bs * bits // 8), dtype=np.uint8)
    sc = (RNG.random(N * nb, dtype=np.float32) * 0.02 + 0.001).astype(dt)
    z = None
    if zp == "u8":
        z = RNG.integers(0, 256, N * ((nb * bits + 7) // 8), dtype=np.uint8)
    elif zp == "f":
        z = (RNG.random(N * nb) * 15).astype(dt)
    g = RNG.integers(0, nb, K).astype(np.int32) if gidx else None
    bi = RNG.standard_normal(N).astype(dt) if bias else None
    a = RNG.standard_normal(tuple(lead) + (M, K)).astype(dt)
    return [a, b, sc, z, g, bi]


@pytest.mark.parametrize("M,K,N,bits,bs,zp,bias", [
    (1, 40, 5, 4, 16, None, False),      # decode GEMV, K not a multiple of the block
    (1, 64, 6, 4, 32, "u8", True),
    (1, 100, 3, 8, 32, "f", False),
    (1, 130, 4, 4, 128, "f", True),      # K just over one 128 block
    (3, 48, 5, 8, 16, "u8", True),
    (11, 33, 3, 4, 16, None, True),      # more rows than one pass (_ROWS = 8)
    (2, 70, 4, 8, 128, None, False),
])
def test_matmul_nbits(M, K, N, bits, bs, zp, bias):
    ins = _mnb_inputs(M, K, N, bits, bs, zp=zp, bias=bias)
    (got,), (want,) = _run("MatMulNBits", ins, K=K, N=N, bits=bits, block_size=bs, accuracy_level=0)
    _close(got, want)


def test_matmul_nbits_gidx_f16_lead_and_level4():
    ins = _mnb_inputs(3, 40, 4, 4, 16, zp="f", gidx=True, bias=True, dt=np.float16, lead=(2,))
    (got,), (want,) = _run("MatMulNBits", ins, K=40, N=4, bits=4, block_size=16)
    _close(got, want, np.float16)
    ins = _mnb_inputs(1, 32, 3, 8, 16, zp="u8", gidx=True)  # packed zero points ignored with a g_idx
    (got,), (want,) = _run("MatMulNBits", ins, K=32, N=3, bits=8, block_size=16)
    _close(got, want)
    # accuracy_level is accepted; the device keeps float A (the CPU's level-4 int8 A differs by its rounding)
    ins = _mnb_inputs(1, 64, 4, 4, 32, zp="u8")
    (got,), (want,) = _run("MatMulNBits", ins, K=64, N=4, bits=4, block_size=32, accuracy_level=4)
    _close(got, want, rtol=0.05, atol=0.05)


def test_matmul_nbits_errors():
    ins = [rc.to_device(a) if a is not None else None for a in _mnb_inputs(1, 32, 3, 4, 16)]
    impl = registry.resolve(MS, "MatMulNBits", 1, CUDA)

    def f(*ins, **attrs):
        return registry.bind(impl, _ctx("MatMulNBits", attrs, len(ins), 1, CUDA))(*ins)
    with pytest.raises(InvalidAttributeError):
        f(*ins, K=32, N=3, bits=3, block_size=16)
    with pytest.raises(InvalidAttributeError):
        f(*ins, K=32, N=3, bits=4, block_size=24)
    with pytest.raises(ShapeMismatchError):
        f(*ins, K=32, N=4, bits=4, block_size=16)
    with pytest.raises(ShapeMismatchError):
        f(*ins, K=48, N=3, bits=4, block_size=16)


# -- GroupQueryAttention -------------------------------------------------------------------------------

def _caches(rows, rot, dt):
    inv = 1.0 / (10000 ** (np.arange(0, rot, 2) / rot))
    f = np.outer(np.arange(rows), inv)
    return np.cos(f).astype(dt), np.sin(f).astype(dt)


def _gqa(B, S, P, H, kvH, D, seqlens, total, dt=np.float32, packed=False, rotary=False, rot=None, pos_ids=False,
         bias=False, sink=False, n_out=3, **attrs):
    if packed:
        ins = [_rand(B, S, (H + 2 * kvH) * D, dt=dt), None, None]
    else:
        ins = [_rand(B, S, H * D, dt=dt), _rand(B, S, kvH * D, dt=dt), _rand(B, S, kvH * D, dt=dt)]
    ins += [_rand(B, kvH, P, D, dt=dt), _rand(B, kvH, P, D, dt=dt)] if P else [None, None]
    ins += [np.asarray(seqlens, np.int32), np.asarray([total], np.int32)]
    ins += list(_caches(max(total, P) + 3, rot or (D - D % 2), dt)) if rotary else [None, None]
    ins += [(np.asarray(seqlens)[:, None] + 1 - S + np.arange(S)[None, :]).astype(np.int64) if pos_ids else None]
    ins += [_rand(B, 1, S, max(total, P), dt=dt) if bias else None]
    ins += [_rand(H, dt=dt) if sink else None]
    while ins[-1] is None:
        ins.pop()
    got, want = _run("GroupQueryAttention", ins, n_out=n_out, num_heads=H, kv_num_heads=kvH,
                     do_rotary=int(rotary), **attrs)
    for g, w in zip(got, want):
        _close(g, w, dt)
    return got


@pytest.mark.parametrize("H,kvH,S", [(1, 1, 19), (2, 1, 7), (4, 1, 5)])
def test_gqa_prefill_no_past(H, kvH, S):
    # S = 19 crosses a key tile (16 threads per block in the simulator); GQA ratios 1, 2, 4
    _gqa(1, S, 0, H, kvH, 6, [S - 1], S)


def test_gqa_prefill_right_padded_odd_head():
    S = 7
    _gqa(2, S, 0, 2, 1, 5, [S - 1, 3], S)  # entry 1 has 4 live tokens; head size 5


@pytest.mark.parametrize("H,kvH,packed", [(2, 2, False), (4, 2, True), (4, 1, False)])
def test_gqa_decode(H, kvH, packed):
    # one new token over a shared max-length past buffer: entries at different lengths
    P, total = 20, 20
    _gqa(2, 1, P, H, kvH, 8, [11, 17], total, packed=packed)
    _gqa(1, 1, P, H, kvH, 8, [13], total, packed=packed)  # batch 1: its length is passed by value


def test_gqa_prefill_with_past_softcap_window():
    # chunked prefill: 5 new rows after 9 cached ones, in a buffer of 16
    _gqa(2, 3, 16, 2, 1, 6, [13, 10], 16, softcap=2.0, local_window_size=4)


@pytest.mark.parametrize("interleaved,packed,pos_ids", [(0, True, False), (1, False, False), (0, False, True)])
def test_gqa_rotary(interleaved, packed, pos_ids):
    _gqa(1, 4, 0, 2, 1, 8, [3], 4, packed=packed, rotary=True, rotary_interleaved=interleaved, pos_ids=pos_ids)
    _gqa(2, 1, 12, 4, 2, 8, [7, 11], 12, packed=packed, rotary=True, rotary_interleaved=interleaved,
         pos_ids=pos_ids, local_window_size=5)


def test_gqa_rotary_partial_odd_head_f16():
    _gqa(1, 5, 0, 2, 1, 7, [4], 5, dt=np.float16, rotary=True, rot=4)


def test_gqa_smooth_softmax_sink_bias_and_scale():
    _gqa(1, 4, 0, 2, 1, 8, [3], 4, smooth_softmax=1, scale=0.3)
    _gqa(2, 1, 10, 4, 2, 8, [4, 9], 10, sink=True, bias=True)
    _gqa(1, 3, 0, 2, 1, 4, [2], 3, causal=0)


def test_gqa_window_of_one_and_qk_zeros():
    got = _gqa(1, 4, 0, 2, 2, 4, [3], 4, local_window_size=1, n_out=4)
    assert not np.any(got[3])
    got = _gqa(2, 1, 6, 2, 1, 4, [5, 3], 6, local_window_size=0)  # a window of no key: zeros, as onnxruntime's
    assert not np.any(got[0]) and np.any(got[1])


@pytest.mark.parametrize("S,seqlens,rotary", [(1, [11, 6], False), (3, [13, 9], True), (1, [5], True)])
def test_gqa_donated_past_is_appended_in_place(S, seqlens, rotary):
    """With past_key/past_value donated (a decoder's kv_share_buffer) and room for the total, the past buffers
    are the present: only the new rows are written (by _kv_append, or for one new row by the attention kernel
    itself), the output and the live rows are the CPU's, and every other row keeps its old contents."""
    B, P, H, kvH, D = len(seqlens), 16, 4, 2, 8
    ins = [_rand(B, S, (H + 2 * kvH) * D), None, None, _rand(B, kvH, P, D), _rand(B, kvH, P, D),
           np.asarray(seqlens, np.int32), np.asarray([P], np.int32)]
    ins += list(_caches(P + 3, D, np.float32)) if rotary else []
    attrs = dict(num_heads=H, kv_num_heads=kvH, do_rotary=int(rotary))
    want = registry.bind(registry.resolve(MS, "GroupQueryAttention", 1),
                         _ctx("GroupQueryAttention", attrs, len(ins), 3, "CPUExecutionProvider"))(*ins)
    dev = registry.resolve(MS, "GroupQueryAttention", 1, CUDA)
    ctx = _ctx("GroupQueryAttention", attrs, len(ins), 3, CUDA)
    ctx.donated = frozenset({3, 4})
    dins = [None if a is None else (a if i in dev.host_inputs else rc.to_device(a)) for i, a in enumerate(ins)]
    with rc.TransferCounter() as tc:
        y, pk, pv = registry.bind(dev, ctx)(*dins)
    # One new row (decode) of the packed QKV is appended by the attention kernel itself.
    launched = {"contrib_attention._gqa_attn": 1} if S == 1 else {"contrib_attention._kv_append": 1,
                                                                   "contrib_attention._gqa_attn": 1}
    assert tc.kernels == launched, tc.kernels
    assert rc.same_buffer(pk, dins[3]) and rc.same_buffer(pv, dins[4])
    _close(rc.to_host(y), want[0])
    for got, cpu, old in ((rc.to_host(pk), want[1], ins[3]), (rc.to_host(pv), want[2], ins[4])):
        for b, n in enumerate(seqlens):
            T = n + 1
            _close(got[b, :, :T], cpu[b, :, :T])
            np.testing.assert_array_equal(got[b, :, T:], old[b, :, T:])  # never copied, never cleared
            np.testing.assert_array_equal(got[b, :, :T - S], old[b, :, :T - S])
    # A past with no room for the total is not appended to: the present is a fresh copy, as without donation.
    small = [ins[0], None, None, ins[3][:, :, :4].copy(), ins[4][:, :, :4].copy(), np.full(B, 4 + S - 1, np.int32),
             np.asarray([4 + S], np.int32)] + ins[7:]
    dsmall = [None if a is None else (a if i in dev.host_inputs else rc.to_device(a)) for i, a in enumerate(small)]
    y2, pk2, _ = registry.bind(dev, ctx)(*dsmall)
    assert not rc.same_buffer(pk2, dsmall[3]) and tuple(pk2.shape) == (B, kvH, 4 + S, D)
    want2 = registry.bind(registry.resolve(MS, "GroupQueryAttention", 1),
                          _ctx("GroupQueryAttention", attrs, len(small), 3, "CPUExecutionProvider"))(*small)
    _close(rc.to_host(y2), want2[0])
    _close(rc.to_host(pk2), want2[1])


@pytest.mark.parametrize("C,W,steps", [(6, 4, [10, 1, 1, 1, 3, 1]), (7, 3, [2, 5, 1, 1])])
def test_gqa_sliding_window_cache_steps(C, W, steps):
    """A decode loop over a window-sized cache (sliding_window_cache=1): each step's output and resident rows are
    the CPU twin's, the present of each provider feeding its next step; prompts longer than the capacity and
    chunks that evict several rows at once included."""
    B, H, kvH, D = 1, 4, 2, 8
    cos, sin = _caches(32, D, np.float32)
    attrs = dict(num_heads=H, kv_num_heads=kvH, local_window_size=W, sliding_window_cache=1, do_rotary=1)
    cpu = registry.bind(registry.resolve(MS, "GroupQueryAttention", 1),
                        _ctx("GroupQueryAttention", attrs, 9, 3, "CPUExecutionProvider"))
    dev = registry.bind(registry.resolve(MS, "GroupQueryAttention", 1, CUDA),
                        _ctx("GroupQueryAttention", attrs, 9, 3, CUDA))
    pk = pv = np.zeros((B, kvH, C, D), np.float32)
    dk, dv = rc.to_device(pk), rc.to_device(pv)
    dcos, dsin = rc.to_device(cos), rc.to_device(sin)
    T = 0
    for S in steps:
        T += S
        q, k, v = _rand(B, S, H * D), _rand(B, S, kvH * D), _rand(B, S, kvH * D)
        sl, tot = np.array([T - 1], np.int32), np.array([T], np.int32)
        wy, pk, pv = cpu(q, k, v, pk, pv, sl, tot, cos, sin)
        with rc.TransferCounter() as tc:
            y, dk, dv = dev(rc.to_device(q), rc.to_device(k), rc.to_device(v), dk, dv, sl, tot, dcos, dsin)
        assert tc.kernels == {"contrib_attention._kv_write": 1, "contrib_attention._gqa_attn": 1,
                              "contrib_attention._window_keep": 1}, tc.kernels
        assert tuple(dk.shape) == (B, kvH, C, D)
        _close(rc.to_host(y), wy)
        _close(rc.to_host(dk), pk)  # resident rows and the zeros after them
        _close(rc.to_host(dv), pv)


def test_gqa_sliding_window_cache_batch_bias():
    """Entries at different lengths (one past its capacity) with an attention bias indexed at absolute
    positions."""
    B, C, W = 2, 6, 4
    _gqa(B, 1, C, 4, 2, 8, [8, 3], 9, bias=True, rotary=True, sliding_window_cache=1, local_window_size=W)
    _gqa(B, 3, C, 2, 1, 8, [11, 2], 12, sliding_window_cache=1, local_window_size=W)


def test_gqa_errors():
    impl = registry.resolve(MS, "GroupQueryAttention", 1, CUDA)

    def f(*ins, **attrs):
        return registry.bind(impl, _ctx("GroupQueryAttention", attrs, len(ins), 3, CUDA))(*ins)
    q = rc.to_device(_rand(1, 1, 8))
    k = rc.to_device(_rand(1, 1, 4))
    sl = rc.to_device(np.array([5], np.int32))
    tot = np.array([3], np.int32)
    with pytest.raises(InvalidArgumentError):  # seqlens beyond total_sequence_length
        f(q, k, k, None, None, sl, tot, num_heads=2, kv_num_heads=1)
    with pytest.raises(InvalidAttributeError):
        f(q, k, k, None, None, sl, tot, num_heads=3, kv_num_heads=2)
    with pytest.raises(InvalidArgumentError, match="capacity"):  # a windowed cache needs a past buffer
        f(q, k, k, None, None, sl, tot, num_heads=2, kv_num_heads=1, sliding_window_cache=1, local_window_size=2)
    c = rc.to_device(np.ones((2, 2), np.float32))
    q = rc.to_device(_rand(1, 3, 8))
    k = rc.to_device(_rand(1, 3, 4))
    sl = rc.to_device(np.array([2], np.int32))
    with pytest.raises(IndexOutOfRangeError):  # position 2 outside a 2-row cos cache
        f(q, k, k, None, None, sl, tot, c, c, num_heads=2, kv_num_heads=1, do_rotary=1)


# -- RotaryEmbedding / MRotaryEmbedding ---------------------------------------------------------------

@pytest.mark.parametrize("shape,num_heads,rot_dim,interleaved,scalar_pos", [
    ((2, 3, 12), 2, 0, 0, False),   # 3-d input, full rotation
    ((2, 3, 12), 2, 4, 1, True),    # partial rotation, interleaved, scalar position
    ((1, 2, 3, 6), 0, 0, 1, False),  # 4-d (B, H, S, D)
])
def test_rotary_embedding(shape, num_heads, rot_dim, interleaved, scalar_pos):
    B, S = shape[0], shape[-2] if len(shape) == 4 else shape[1]
    D = shape[-1] if len(shape) == 4 else shape[-1] // num_heads
    rot = rot_dim or D
    cos, sin = _caches(10, rot, np.float32)
    pos = np.array([2], np.int64) if scalar_pos else RNG.integers(0, 10, (B, S)).astype(np.int64)
    (got,), (want,) = _run("RotaryEmbedding", [_rand(*shape), pos, cos, sin], interleaved=interleaved,
                           num_heads=num_heads, rotary_embedding_dim=rot_dim)
    _close(got, want)


def test_rotary_embedding_f16_and_bad_position():
    cos, sin = _caches(6, 4, np.float16)
    pos = np.array([[0, 5], [3, 1]], np.int64)
    (got,), (want,) = _run("RotaryEmbedding", [_rand(2, 2, 8, dt=np.float16), pos, cos, sin], num_heads=2)
    _close(got, want, np.float16)
    f = registry.bind(registry.resolve(MS, "RotaryEmbedding", 1, CUDA),
                      _ctx("RotaryEmbedding", {"num_heads": 2}, 4, 1, CUDA))
    with pytest.raises(IndexOutOfRangeError):
        f(rc.to_device(_rand(2, 2, 8)), rc.to_device(pos + 1), rc.to_device(cos), rc.to_device(sin))


@pytest.mark.parametrize("layout,interleaved", [(0, 0), (1, 0), (0, 1)])
def test_mrotary_embedding(layout, interleaved):
    B, S, nh, D = 1, 3, 2, 12
    cos, sin = _caches(9, D, np.float32)
    pos = RNG.integers(0, 9, (3, B, S)).astype(np.int64)
    (got,), (want,) = _run("MRotaryEmbedding", [_rand(B, S, nh * D), pos, cos, sin], mrope_section=[2, 2, 2],
                           mrope_layout=layout, interleaved=interleaved, num_heads=nh)
    _close(got, want)


# -- GatherBlockQuantized ------------------------------------------------------------------------------

@pytest.mark.parametrize("bits,zp,idx,ga,qa", [
    (4, False, [[0, 3], [-1, 2]], 0, 1),
    (4, True, [1, -4], 0, 1),
    (8, True, [2, 0, 1], 0, 1),
    (8, False, [5, 17, 40], 1, 1),   # gather along the quantized axis
    (8, True, [1], 1, 0),            # quantize along the first axis
])
def test_gather_block_quantized(bits, zp, idx, ga, qa):
    rows, cols, bs = 4, 48, 16
    per = 8 // bits
    data = RNG.integers(0, 256, (rows, cols // per), dtype=np.uint8)
    lshape = (rows, cols)
    sshape = list(lshape)
    sshape[qa] = (lshape[qa] + bs - 1) // bs
    sc = (RNG.random(sshape, dtype=np.float32) + 0.1).astype(np.float32)
    z = None
    if zp:
        z = RNG.integers(0, 256, tuple(sshape[:-1]) + ((sshape[-1] + per - 1) // per,), dtype=np.uint8)
    (got,), (want,) = _run("GatherBlockQuantized", [data, np.asarray(idx, np.int64), sc, z], gather_axis=ga,
                           quantize_axis=qa, block_size=bs, bits=bits)
    _close(got, want)


def test_gather_block_quantized_errors():
    impl = registry.resolve(MS, "GatherBlockQuantized", 1, CUDA)

    def f(*ins, **attrs):
        return registry.bind(impl, _ctx("GatherBlockQuantized", attrs, len(ins), 1, CUDA))(*ins)
    data = rc.to_device(RNG.integers(0, 256, (4, 8), dtype=np.uint8))
    sc = rc.to_device(np.ones((4, 1), np.float32))
    with pytest.raises(IndexOutOfRangeError):
        f(data, rc.to_device(np.array([4], np.int64)), sc, block_size=16)
    with pytest.raises(ShapeMismatchError):
        f(data, rc.to_device(np.array([0], np.int64)), rc.to_device(np.ones((4, 2), np.float32)), block_size=16)
    with pytest.raises(InvalidAttributeError):
        f(data, rc.to_device(np.array([0], np.int64)), sc, block_size=16, quantize_axis=0)


def test_small_uploads_are_shared_by_content():
    """``upload_small`` uploads each distinct small host array once (the layers of a step share their
    ``seqlens_k``); other contents get their own copy."""
    from ops.cuda._common import upload_small
    a = np.arange(7, dtype=np.int32) * 7919 + 31337
    with rc.TransferCounter() as tc:
        d1, d2 = upload_small(a), upload_small(a.copy())
        d3 = upload_small(a + 1)
    assert d1 is d2 and d3 is not d1 and tc.h2d_calls == 2
    np.testing.assert_array_equal(rc.to_host(d3), a + 1)
    np.testing.assert_array_equal(rc.to_host(d1), a)
