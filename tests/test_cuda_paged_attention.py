"""CUDA ``onnx_numba::PagedGroupQueryAttention`` (ops/cuda/paged_attention.py) against its CPU twin.

Each step runs through the registry twice with the same attributes: the CPU wrapper on numpy pools and the
CUDA wrapper on device copies of them (block_table, seqlens_k and total_sequence_length stay numpy, its host
inputs).  Both write their pools in place; after every step the output and both whole pools are compared, and
every pool row the step must not write is checked to be exactly its old contents.  The tables are shuffled and
the rows have different lengths; a decode step follows a prefill on the pools each provider wrote itself, and a
prefill after a reused prefix reads a block two rows share.  Without a GPU the kernels run on Numba's CUDA
simulator, so the shapes are tiny.

When numba-cuda is missing (or finds no GPU and the simulator is off) the module is skipped, unless
``ONNX_NUMBA_REQUIRE_CUDA=1``, in which case collecting it fails.
"""

import numpy as np
import pytest

from runtime import cuda as rc  # importing runtime.cuda never imports numba.cuda

from cuda_target import use_cuda_or_skip  # noqa: E402

use_cuda_or_skip("CUDA paged attention")

from ops import registry  # noqa: E402  (importing ops registers the CPU twin)
from ops.cuda import paged_attention as kpa  # noqa: E402  (importing registers the CUDA kernel)
from ops.paged_attention import DOMAIN, OP, bind_paged  # noqa: E402
from runtime.errors import IndexOutOfRangeError, InvalidArgumentError  # noqa: E402

RNG = np.random.default_rng(0)
CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
TOL = dict(rtol=1e-5, atol=1e-5)  # float32, fixed before any result was looked at
H, KVH, D, BS, NBLK, M = 4, 2, 8, 4, 12, 4  # heads, kv heads, head size, block size, pool blocks, table width
KERNELS = {"paged_attention._paged_write": 1, "paged_attention._paged_attn": 1}


def _ctx(attrs, n_in, provider):
    return registry.OpContext(name="paged_test", op_type=OP, domain=DOMAIN, opset=1, attrs=dict(attrs),
                              n_inputs=n_in, n_outputs=1, provider=provider, outputs_used=[True])


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _caches(rows, rot):
    inv = 1.0 / (10000 ** (np.arange(0, rot, 2) / rot))
    f = np.outer(np.arange(rows), inv)
    return np.cos(f).astype(np.float32), np.sin(f).astype(np.float32)


class Paged:
    """One pool pair per provider (numpy for the CPU, device arrays for CUDA), stepped side by side."""

    def __init__(self, table, rotary=False, rot=D, **attrs):
        self.table = np.asarray(table, np.int32)
        self.attrs = dict(num_heads=H, kv_num_heads=KVH, do_rotary=int(rotary), **attrs)
        self.kp, self.vp = _rand(NBLK, KVH, BS, D), _rand(NBLK, KVH, BS, D)  # random: unwritten rows are "past"
        self.dk, self.dv = rc.to_device(self.kp), rc.to_device(self.vp)
        self.cos = _caches(M * BS + 3, rot) if rotary else None

    def inputs(self, seqlens, S, packed):
        B = len(seqlens)
        qkv = [_rand(B, S, (H + 2 * KVH) * D), None, None] if packed else \
            [_rand(B, S, H * D), _rand(B, S, KVH * D), _rand(B, S, KVH * D)]
        tail = [self.table, np.asarray(seqlens, np.int32), np.asarray([max(seqlens) + 1], np.int32)]
        return qkv, tail, ([] if self.cos is None else list(self.cos))

    def step(self, seqlens, S, packed):
        """One call on both providers: compares the outputs and the pools, and checks the rows not written."""
        qkv, tail, rope = self.inputs(seqlens, S, packed)
        old_k, old_v = self.kp.copy(), self.vp.copy()
        n_in = 8 + len(rope)
        want = registry.bind(registry.resolve(DOMAIN, OP, 1), _ctx(self.attrs, n_in, CPU))(
            *qkv, self.kp, self.vp, *tail, *rope)
        dev = registry.bind(registry.resolve(DOMAIN, OP, 1, CUDA), _ctx(self.attrs, n_in, CUDA))
        with rc.TransferCounter() as tc:
            y = dev(*[None if a is None else rc.to_device(a) for a in qkv], self.dk, self.dv, *tail,
                    *[rc.to_device(a) for a in rope])
        assert tc.kernels == KERNELS, tc.kernels
        got = rc.to_host(y)
        assert got.shape == want.shape == (len(seqlens), S, H * D) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, **TOL)
        written = np.zeros((NBLK, BS), bool)
        for b, n in enumerate(seqlens):
            for p in range(n + 1 - S, n + 1):
                written[self.table[b, p // BS], p % BS] = True
        for dpool, cpool, old in ((self.dk, self.kp, old_k), (self.dv, self.vp, old_v)):
            gpool = rc.to_host(dpool)
            np.testing.assert_allclose(gpool, cpool, **TOL)
            keep = ~written[:, None, :, None].repeat(KVH, 1).repeat(D, 3)
            np.testing.assert_array_equal(gpool[keep], old[keep])  # in place: nothing else touched
            assert not np.array_equal(gpool[~keep], old[~keep])
        return got


def _table(rng_perm, rows):
    """A shuffled table: row b owns blocks perm[b * M:(b + 1) * M]."""
    return np.asarray(rng_perm[:rows * M]).reshape(rows, M)


def test_registered():
    impl = registry.resolve(DOMAIN, OP, 1, CUDA)
    assert impl.fn is kpa.launch_paged and impl.contract is bind_paged
    assert impl.host_inputs == (5, 6, 7)  # block_table, seqlens_k, total_sequence_length


@pytest.mark.parametrize("packed,rotary", [(False, False), (True, True)])
def test_prefill_then_decode(packed, rotary):
    """Two rows of different lengths: a prefill of 5 (row 1 with 2 positions already in its blocks), then a
    decode step (S = 1) on the pools each provider wrote.  (Packed without rotary and unpacked with it are the
    two steps of ``test_prefill_after_reused_prefix``; the simulator is slow.)"""
    pg = Paged(_table(RNG.permutation(NBLK), 2), rotary=rotary, rotary_interleaved=int(packed))
    pg.step([4, 6], 5, packed)
    pg.step([5, 7], 1, packed)


@pytest.mark.parametrize("attrs", [dict(do_rotary=1, rot=4, local_window_size=3, softcap=2.0),
                                   dict(smooth_softmax=1, scale=0.3, causal=0)])
def test_prefill_after_reused_prefix(attrs):
    """Both rows start with the same block (a 4-token prefix computed once), read by both and written by neither;
    row 0 prefills 3 tokens after it, row 1 (2 more tokens of its own past) 3 after those."""
    attrs = dict(attrs)
    rotary, rot = bool(attrs.pop("do_rotary", 0)), attrs.pop("rot", D)
    perm = RNG.permutation(NBLK)
    table = _table(perm, 2)
    table[1, 0] = table[0, 0]
    pg = Paged(table, rotary=rotary, rot=rot, **attrs)
    pg.step([6, 8], 3, packed=False)
    pg.step([7, 9], 1, packed=True)


def test_bad_block_id_raises_the_cpu_error():
    table = _table(RNG.permutation(NBLK), 2)
    table[1, 1] = NBLK  # position 4 of row 1 (of 7) lives in a block past the pool
    pg = Paged(table)
    qkv, tail, _ = pg.inputs([4, 6], 5, packed=False)
    with pytest.raises(IndexOutOfRangeError) as cpu_err:
        registry.bind(registry.resolve(DOMAIN, OP, 1), _ctx(pg.attrs, 8, CPU))(*qkv, pg.kp, pg.vp, *tail)
    dev = registry.bind(registry.resolve(DOMAIN, OP, 1, CUDA), _ctx(pg.attrs, 8, CUDA))
    dq = [rc.to_device(a) for a in qkv]
    with rc.TransferCounter() as tc, pytest.raises(IndexOutOfRangeError) as cuda_err:
        dev(*dq, pg.dk, pg.dv, *tail)
    assert str(cuda_err.value) == str(cpu_err.value) == f"{OP}: a block id is outside the pool"
    assert tc.kernels == {}
    np.testing.assert_array_equal(rc.to_host(pg.dk), pg.kp)  # refused before any launch: nothing written
    with pytest.raises(InvalidArgumentError, match="float32"):  # float32 only on the device
        dev(rc.to_device(qkv[0].astype(np.float16)), None, None, pg.dk, pg.dv, *tail)
