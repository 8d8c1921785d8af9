"""Numba's runtime module, loaded from object code cached beside the kernels instead of compiled at every start.

Numba compiles one small LLVM module of its runtime's helpers (the atomic reference-count updates, NRT's
``incref``/``decref``) in every process, the first time anything compiles or loads a cached function.  That
compile runs LLVM's optimizer and code generator, and their code pages stay resident: at a warm start of the
24-layer int4 package, 27 MB of file-backed pages of LLVM's shared library (of 77 MB the process held above
its weights), for a module of a few hundred bytes of machine code.  ``install()`` makes Numba's
``rtsys.initialize`` take the module from an entry written in the folder Numba caches this package's kernels
in, when one matches, which touches only LLVM's object loader; otherwise it compiles as Numba does and writes
the entry.

Invariants:
- the entry is keyed by the module's LLVM IR text (built by Numba's own code, in Python, without LLVM), the
  target's triple, CPU name and features (Numba's ``magic_tuple``, which its own cache checks) and llvmlite's
  version: an entry is used only for exactly the code Numba would compile here;
- the loaded library is what Numba's compile returns: the same machine code, and the same IR module kept for
  linking into the functions compiled later in the process;
- nothing here raises: an entry that cannot be read or parsed is compiled again and rewritten, and a folder
  that cannot be written is only not written (each process then compiles, as without this module);
- writes are atomic (a temporary file renamed into place), so a process never reads another's half-written
  entry;
- installed before anything initializes Numba's runtime (``ops`` does it on import); if the runtime is already
  initialized, or Numba's layout is not the one this module knows, it changes nothing.
"""
from __future__ import annotations

import hashlib
import os
import pickle

from runtime.atomic import write_atomic

from ._cache_epoch import numba_cache_folder

__all__ = ["install", "load_or_compile", "last_source"]

_NAME = "onnx_numba_nrt"
last_source = None  # "loaded" or "compiled" once Numba's runtime was made through this module


def _key(ctx, ir_text: str) -> str:
    import llvmlite
    h = hashlib.sha256()
    for part in (llvmlite.__version__, repr(ctx.codegen().magic_tuple()), ir_text):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _read(path: str, key: str):
    try:
        with open(path, "rb") as f:
            stored_key, state = pickle.load(f)
    except Exception:
        return None
    return state if stored_key == key else None


def _write(path: str, key: str, state) -> None:
    try:
        write_atomic(path, pickle.dumps((key, state)))
    except Exception:
        pass


def load_or_compile(ctx, compile_nrt_functions):
    """Numba's runtime library for the target context ``ctx``: loaded from the entry in the kernels' cache folder
    when it matches, else compiled and written there (``compile_nrt_functions``, Numba's own, makes it if the
    module cannot even be built or keyed here)."""
    global last_source
    from numba.core.runtime import nrtdynmod
    try:
        ir_mod, library = nrtdynmod.create_nrt_module(ctx)
        key = _key(ctx, str(ir_mod))
        folder = numba_cache_folder(os.path.abspath(__file__))
        path = os.path.join(folder, f"{_NAME}-{key[:24]}.nbo") if folder else None
    except Exception:
        return compile_nrt_functions(ctx)
    state = _read(path, key) if path else None
    if state is not None:
        try:
            loaded = ctx.codegen().unserialize_library(state)
            last_source = "loaded"
            return loaded
        except Exception:
            pass
    library.enable_object_caching()
    library.add_ir_module(ir_mod)
    library.finalize()
    last_source = "compiled"
    if path:
        try:
            state = library.serialize_using_object_code()
        except Exception:
            state = None
        if state is not None:
            _write(path, key, state)
    return library


def install() -> bool:
    """Make Numba's runtime initialization use ``load_or_compile``; True when it will."""
    try:
        from numba.core.runtime import nrtdynmod, rtsys
    except ImportError:  # pragma: no cover - another Numba layout
        return False
    original = getattr(nrtdynmod, "compile_nrt_functions", None)
    if getattr(original, "_onnx_numba", False):
        return True
    if original is None or getattr(rtsys, "_init", True):
        return False

    def compile_nrt_functions(ctx):
        return load_or_compile(ctx, original)

    compile_nrt_functions._onnx_numba = True
    nrtdynmod.compile_nrt_functions = compile_nrt_functions
    return True
