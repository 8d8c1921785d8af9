"""Thread counts of the calling thread only: what ``SessionOptions.intra_op_num_threads`` sets around a run.

Two libraries run a session's kernels on threads of their own: Numba (``parallel=True`` kernels) and numpy's
BLAS (float products).  Both counts are set per calling thread, so a session limited to one thread leaves
other sessions, and other threads, as they were:
- Numba's ``set_num_threads`` is thread-local by design;
- OpenBLAS (0.3.27 and later, as numpy's wheels bundle it) has ``openblas_set_num_threads_local``.  A BLAS
  without it (MKL, Accelerate, an older OpenBLAS) keeps its own count; ``blas_local()`` says which.

Overlapping runs need this: two threads each calling a two-thread OpenBLAS take turns on its one thread
server, while two single-threaded calls run side by side.
"""
from __future__ import annotations

import ctypes

import numba

__all__ = ["call_with_threads", "blas_local"]

_blas: list = []  # [setter or None], found once


def _find_blas_setter():
    if _blas:
        return _blas[0]
    setter = None
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line}
    except OSError:
        paths = set()
    for p in sorted(paths):
        try:
            fn = ctypes.CDLL(p).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = (ctypes.c_int,), ctypes.c_int
        setter = fn
        break
    _blas.append(setter)
    return setter


def blas_local() -> bool:
    """Whether the loaded BLAS takes a thread count per calling thread."""
    import numpy  # noqa: F401  (its BLAS must be loaded to be found)
    return _find_blas_setter() is not None


def call_with_threads(n: int, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with at most ``n`` Numba and BLAS threads in this thread (``n`` = 0: as is)."""
    if not n:
        return fn(*args, **kwargs)
    prev = numba.get_num_threads()
    blas = _find_blas_setter()
    if prev != n:
        numba.set_num_threads(n)
    old_blas = blas(n) if blas is not None else None
    try:
        return fn(*args, **kwargs)
    finally:
        if prev != n:
            numba.set_num_threads(prev)
        if blas is not None:
            blas(old_blas)
