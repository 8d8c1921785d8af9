"""Process-wide CPU settings that must be in place before numpy and Numba load their kernels and threads.

Imported first by every package of the project (``runtime``, ``ops``, ``pipeline``, ``tools``), so the
command-line entry points and a plain ``import runtime`` apply it before numpy loads.  Each setting is a
default: a value already in the environment wins, and a library that has already loaded keeps what it read.

- ``GOMP_SPINCOUNT=10000`` (about 0.1 ms), unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set: how long
  Numba's OpenMP workers spin for the next parallel kernel before they sleep.  OpenMP's default (about 3 ms)
  let them starve the BLAS threads of the next matrix product on a machine with few cores (a 16-token prefill
  measured 20x slower); sleeping at once (``PASSIVE``) made every kernel pay a wake-up, 30 to 50 us, which on
  a decode step of 121 int4 products was a quarter of its time (one 896x4864 product in cache: 84 us passive,
  31 us with this spin).  Read when Numba first starts its threads.
- ``OPENBLAS_THREAD_TIMEOUT=16`` (2**16 cycles, tens of microseconds), unless it is set: how long OpenBLAS's
  workers spin for the next product before they sleep.  Its default (2**28 cycles, about 0.1 s) kept a worker
  spinning through the Numba kernels that follow a BLAS product, and on 2 cores Numba's OpenMP worker then
  waited for a time slice: convolutional models, which alternate the two, ran twice as slow (a PaddleOCR
  classifier 16.5 ms against 4.1 to 4.8 ms, a captcha reader 88 ms against 28 to 30 ms).  Read when OpenBLAS
  loads, so set only while numpy is not yet imported.
- ``OPENBLAS_CORETYPE=SKYLAKEX`` on AMD CPUs with AVX-512 (F, BW, DQ, VL): numpy's OpenBLAS chooses its kernel
  set when it loads, and a build that predates a CPU family (Zen 5 for OpenBLAS 0.3.31) falls back to its
  AVX2 (Haswell) set, which ran a 256x896x4864 float32 ``numpy.matmul`` at 224 GFLOP/s on 2 Zen 5 cores
  against 395 with the AVX-512 set.  Set only while numpy is not yet
  imported, so it never misdescribes the library a process already holds.
- glibc's allocator keeps freed memory for reuse (``mallopt``: no ``mmap`` per allocation, the heap trimmed only
  past 1 GiB free at its top), unless any ``MALLOC_*`` variable is set.  By default every array of 32 MB or
  more got fresh pages from the kernel and gave them back when freed, so each use paid a page fault per 4 KiB:
  a 2048-token prefill (activations of 40 MB) measured 11.9 s per forward against 8.7 s with the memory kept.
  Applied at import (the allocator reads no environment after it starts); peak memory is unchanged, the
  process's resident memory stays near its peak.
"""
from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["blas_coretype", "apply", "keep_heap", "NUMPY_FIRST"]

# Whether numpy was loaded before this module (then its OpenBLAS already chose its kernels): the entry points
# import this module first, and a test pins that they do on any host.
NUMPY_FIRST = "numpy" in sys.modules

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4

_AVX512 = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})


def blas_coretype(cpuinfo: str) -> str | None:
    """The OpenBLAS kernel set to name for the CPU that ``/proc/cpuinfo`` text describes; None lets OpenBLAS
    choose (every CPU but AMD ones with AVX-512, which its detection may not know)."""
    vendor = flags = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and vendor is None:
            vendor = value.strip()
        elif key == "flags" and flags is None:
            flags = set(value.split())
        if vendor is not None and flags is not None:
            break
    if vendor == "AuthenticAMD" and flags is not None and _AVX512 <= flags:
        return "SKYLAKEX"
    return None


def keep_heap(environ=os.environ) -> bool:
    """Tell glibc's allocator to keep freed memory (see the module docstring); True when it took the settings."""
    if any(k.startswith("MALLOC_") for k in environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def apply(environ=os.environ, modules=sys.modules, cpuinfo_path: str = "/proc/cpuinfo") -> None:
    """Set the environment defaults above in ``environ`` (see the module docstring for when each applies)."""
    if "OMP_WAIT_POLICY" not in environ:
        environ.setdefault("GOMP_SPINCOUNT", "10000")
    if "numpy" in modules:
        return
    environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "16")
    if "OPENBLAS_CORETYPE" in environ:
        return
    try:
        with open(cpuinfo_path) as f:
            text = f.read(1 << 16)  # the first processor's block names the vendor and flags
    except OSError:
        return
    core = blas_coretype(text)
    if core is not None:
        environ["OPENBLAS_CORETYPE"] = core


apply()
keep_heap()
