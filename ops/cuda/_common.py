"""Launch geometry, argument checks, small kernels and block reductions shared by the CUDA kernel wrappers.

Grids are sized for a real GPU (256-thread blocks, grid-stride loops) but shrink to a few threads under the
simulator, where every thread is a Python thread; kernels never assume a particular grid size, only that row
kernels get a power-of-two block no larger than ``MAX_ROW_THREADS`` (the size of their shared scratch).
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np

from runtime import cuda as rc
from runtime.errors import InvalidArgumentError

__all__ = ["grid1d", "row_threads", "check_device", "upload_small", "host_array", "MAX_ROW_THREADS", "F32", "F16",
           "FLOATS", "unravel4", "fill0", "copy_cast"]

MAX_ROW_THREADS = 256  # shared scratch length of the row-reduction kernels
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
FLOATS = (F32, F16, np.dtype(np.float64))
_MAX_BLOCKS = 1 << 16


def grid1d(n: int) -> tuple:
    """(blocks, threads) for a grid-stride loop over ``n`` items."""
    n = max(int(n), 1)
    if rc.simulator():
        t = min(n, 8)
        return min(-(-n // t), 2), t
    return min(-(-n // 256), _MAX_BLOCKS), 256


def row_threads(n: int) -> int:
    """Power-of-two threads per block for a kernel that reduces one row of ``n`` per block."""
    p = 1 << max(0, math.ceil(math.log2(max(int(n), 1))))
    if rc.simulator():
        return min(p, 16)
    return max(32, min(p, MAX_ROW_THREADS))


def check_device(op: str, **arrays) -> None:
    """Every named argument (None allowed) must be a C-contiguous device array."""
    for name, a in arrays.items():
        if a is None:
            continue
        if not rc.is_device_array(a):
            raise InvalidArgumentError(f"{op}: {name} must be a device array (use runtime.cuda.to_device), "
                                       f"got {type(a).__name__}")
        if not a.is_c_contiguous():
            raise InvalidArgumentError(f"{op}: {name} must be C-contiguous")


_UPLOADS: OrderedDict = OrderedDict()  # (device, dtype, shape, bytes) -> device copy, least recently used first
_UPLOADS_MAX = 16
_UPLOAD_SMALL_BYTES = 4096
_uploads_lock = threading.Lock()


def upload_small(a):
    """A device copy of a small host array (sequence lengths, positions, indices), shared by every call with the
    same contents on the same device: the layers of one decode step read one upload of their common
    ``seqlens_k``.  Copies are read-only by contract (kernels never write their inputs); arrays over 4 KiB are
    uploaded afresh."""
    a = np.ascontiguousarray(a)
    if a.nbytes > _UPLOAD_SMALL_BYTES:
        return rc.to_device(a)
    key = (getattr(rc.cuda.get_current_device(), "id", 0), a.dtype.str, a.shape, a.tobytes())
    with _uploads_lock:
        d = _UPLOADS.get(key)
        if d is not None:
            _UPLOADS.move_to_end(key)
            return d
    d = rc.to_device(a)
    with _uploads_lock:
        _UPLOADS[key] = d
        while len(_UPLOADS) > _UPLOADS_MAX:
            _UPLOADS.popitem(last=False)
    return d


def host_array(op: str, name: str, a, integer: bool = True) -> np.ndarray:
    """An input the wrapper reads on the host (``host_inputs``): a numpy array, or a device array downloaded
    (counted) when a caller passes one; ``integer``: it must hold integers."""
    if a is None:
        raise InvalidArgumentError(f"{op}: {name} is required")
    h = rc.to_host(a) if rc.is_device_array(a) else np.asarray(a)
    if integer and h.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{op}: {name} must hold integers, got {h.dtype}")
    return h


def flat(a):
    """A 1-d view of a contiguous device array."""
    return a.reshape(a.size) if a.ndim != 1 else a


# -- shared kernels; block reductions (device functions) ---------------------------------------------
# Every thread of the block must call the reductions with the same ``nt`` (a power of two <= MAX_ROW_THREADS);
# ``sh`` / ``sv`` is the block's float32 shared scratch.  The result is returned to every thread.

from runtime.cuda import cuda, jit  # noqa: E402  (kept below the host helpers, which need no CUDA)


@jit
def fill0(a):
    """a[:] = 0 over a flat device array, grid-stride."""
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, a.size, step):
        a[i] = 0


@jit
def copy_cast(src, dst):
    """dst[:] = src (converted to dst's dtype) over flat device arrays of one size, grid-stride."""
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, dst.size, step):
        dst[i] = src[i]


@jit(device=True)
def unravel4(i, n1, n2, n3):
    """(i0, i1, i2, i3): flat index ``i`` over the C-order extents (., n1, n2, n3)."""
    i3 = i % n3
    t = i // n3
    i2 = t % n2
    t = t // n2
    return t // n1, t % n1, i2, i3


SUM, MAX, ARGMAX = 0, 1, 2  # ``block_fold`` modes


@jit(device=True)
def block_fold(sv, si, tid, nt, mode):
    """Fold slots ``[0, nt)`` of the scratch into slot 0 (each thread has written its own slot) and return
    ``sv[0]``: ``SUM`` adds, ``MAX`` keeps the larger value (a NaN already in the lower slot stays),
    ``ARGMAX`` keeps the larger value with its index in ``si`` and, on ties, the smaller index.  ``SUM`` and
    ``MAX`` never touch ``si`` (pass ``sv``)."""
    cuda.syncthreads()
    s = nt // 2
    while s > 0:
        if tid < s:
            o = sv[tid + s]
            if mode == SUM:
                sv[tid] += o
            elif o > sv[tid] or (mode == ARGMAX and o == sv[tid] and si[tid + s] < si[tid]):
                sv[tid] = o
                if mode == ARGMAX:
                    si[tid] = si[tid + s]
        cuda.syncthreads()
        s //= 2
    r = sv[0]
    cuda.syncthreads()  # so the scratch can be reused right away
    return r


@jit(device=True)
def block_sum(sh, tid, nt, v):
    sh[tid] = v
    return block_fold(sh, sh, tid, nt, SUM)


@jit(device=True)
def block_max(sh, tid, nt, v):
    sh[tid] = v
    return block_fold(sh, sh, tid, nt, MAX)


@jit(device=True)
def online_tile(red, ps, tid, nt, x, live, m, lsum):
    """One tile of an online softmax over a thread block: thread ``tid`` holds the score ``x`` of a key (``live``:
    the key is in range), ``m``/``lsum`` are the running maximum and sum.  Returns the new maximum, the factor the
    accumulators are rescaled by and the new sum; each thread's weight lands in ``ps[tid]`` (published by the
    barriers of the sum)."""
    tmax = block_max(red, tid, nt, x)
    m_new = m if m > tmax else tmax
    pv = np.float32(0.0)
    alpha = np.float32(1.0)
    if m_new != np.float32(-np.inf):
        if live:
            pv = math.exp(x - m_new)
        alpha = math.exp(m - m_new)
    ps[tid] = pv
    tsum = block_sum(red, tid, nt, pv)
    return m_new, alpha, lsum * alpha + tsum


@jit(device=True)
def key_span(p, T, causal, window):
    """The keys ``[lo, hi)`` the query at position ``p`` sees among ``T`` (``ops/_prefill_attention.key_range``)."""
    hi = T
    if causal and p + 1 < hi:
        hi = p + 1
    lo = np.int64(0)
    if window > 0 and p + 1 - window > 0:
        lo = p + 1 - window
    if hi < lo:
        hi = lo
    return lo, hi
