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

__all__ = ["fingerprint", "numba_cache_folder", "refresh"]

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


def numba_cache_folder(py_file: str):
    """The folder Numba caches the functions of the source file ``py_file`` in: its first cache locator that
    applies, as Numba chooses (under ``NUMBA_CACHE_DIR`` a folder named for the source's folder and a hash of its
    path; else ``__pycache__`` beside the source when writable; else a user-wide folder).  None when no locator
    applies (Numba then caches nothing of that file)."""
    try:
        from numba.core import caching
        impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
        for cls in impl._locator_classes:
            loc = cls.from_function(numba_cache_folder, py_file)
            if loc is not None:
                return loc.get_cache_path()
    except Exception:  # pragma: no cover - another Numba layout: only the folders beside the sources are flushed
        pass
    return None


def _cache_dirs() -> list:
    folders = (_HERE, os.path.join(_HERE, "cuda"), _RUNTIME)
    dirs = [os.path.join(d, "__pycache__") for d in folders]
    for d in folders:
        found = numba_cache_folder(os.path.join(d, "__init__.py"))
        if found and found not in dirs:
            dirs.append(found)
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
