"""Keeps Numba's on-disk caches of this package consistent with its source.

Numba invalidates a cached function when *its own* file changes, not when a
kernel it calls (in another module) changes; a stale caller then links the
old callee's machine code, which can crash.  So the package keeps one
fingerprint of all its kernel sources (``ops/`` and ``ops/cuda/``, and the
runtime modules whose compiled code calls them): when the fingerprint
differs from the one recorded beside the caches, every cache entry of those
folders is dropped before anything is loaded from it.
Generated region modules (``runtime/regions.py``) embed the same fingerprint
in their source, so they never reuse code compiled against other kernels.

Invariant: never raises (an unwritable cache folder only skips the flush;
Numba then cannot write caches there either).
"""
from __future__ import annotations

import glob
import hashlib
import os

__all__ = ["fingerprint", "refresh"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_RUNTIME = os.path.join(os.path.dirname(_HERE), "runtime")
# Compiled code outside ops/ that calls the package's kernels (the fused segments call ``_elementwise_kernels``),
# and the pipeline generated regions compile under (it decides the types their kernels are compiled for).
_CALLERS = [os.path.join(_RUNTIME, "segments.py"), os.path.join(_RUNTIME, "region_compiler.py")]
_FP = None


def fingerprint() -> str:
    """A hash of every source file of ``ops/`` and ``ops/cuda/``, and of the kernels' callers elsewhere."""
    global _FP
    if _FP is None:
        h = hashlib.sha1()
        for path in sorted(glob.glob(os.path.join(_HERE, "*.py")) + glob.glob(os.path.join(_HERE, "cuda", "*.py"))
                           + [p for p in _CALLERS if os.path.exists(p)]):
            h.update(os.path.basename(path).encode())
            with open(path, "rb") as f:
                h.update(f.read())
        _FP = h.hexdigest()[:16]
    return _FP


def _cache_dirs() -> list:
    dirs = [os.path.join(d, "__pycache__") for d in (_HERE, os.path.join(_HERE, "cuda"), _RUNTIME)]
    base = os.environ.get("NUMBA_CACHE_DIR")
    if base:
        # Numba mirrors a module's folder under NUMBA_CACHE_DIR.
        for d in (_HERE, os.path.join(_HERE, "cuda"), _RUNTIME):
            dirs.append(os.path.join(base, os.path.splitdrive(d)[1].lstrip(os.sep)))
    return dirs


def refresh() -> None:
    """Drop the package's Numba cache entries if the sources changed since they were written."""
    try:
        fp = fingerprint()
        for d in _cache_dirs():
            stamp = os.path.join(d, "onnx_numba_sources.sha1")
            if not os.path.isdir(d):
                continue
            try:
                with open(stamp) as f:
                    if f.read().strip() == fp:
                        continue
            except OSError:
                pass
            for p in glob.glob(os.path.join(d, "*.nbi")) + glob.glob(os.path.join(d, "*.nbc")):
                try:
                    os.remove(p)
                except OSError:
                    pass
            with open(stamp, "w") as f:
                f.write(fp)
    except Exception:  # pragma: no cover - a cache problem must never stop an import
        pass
