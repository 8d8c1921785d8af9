"""Numba's on-disk caches across processes: what a second start loads must run.

Each case runs fresh interpreters against one private cache folder.  A parallel kernel's cached caller runs
them in the order that once crashed: a ``parallel=True`` kernel cached by one process, a cached caller of it
compiled by a second (linking the cached kernel), and the caller loaded from the cache by a third.  Without the
package starting Numba's threading layer at import, the third process segfaults.  Numba's runtime module is
compiled by the first process that needs it and loaded by the next; a damaged entry or a folder that cannot
be written still ends in a working runtime.  The source epoch flushes the folder Numba really caches in.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CALLER = textwrap.dedent('''
    import numpy as np
    from numba import njit
    from ops.compiled_forms_contrib import _qt_par

    @njit(cache=True)
    def caller(bits, bt, ae, ao, asum, ascale, sct, zft, has_zp, zdef, out):
        # The same argument types as the direct call, so the kernel is linked from the cache, not recompiled.
        _qt_par(bits, bt, ae, ao, asum, ascale, sct, zft, has_zp, zdef, out)
        return out
''')

_RUN = textwrap.dedent('''
    import sys
    import numpy as np
    sys.path[:0] = [sys.argv[2], sys.argv[3]]
    import ops
    from ops import contrib_quant as cq
    K, N, bs = 64, 300, 32
    nb = K // bs
    rng = np.random.default_rng(0)
    bt = rng.integers(0, 256, (nb, bs // 2, N)).astype(np.uint8)
    sct = rng.random((nb, N)).astype(np.float32)
    zft = np.zeros((1, N), np.float32)
    a = rng.random((1, K)).astype(np.float32)
    asum = np.empty((1, nb), np.float32); ascale = np.empty((1, nb), np.float32)
    ae = np.empty((1, nb, bs // 2), np.float32); ao = np.empty((1, nb, bs // 2), np.float32)
    cq.prep_a4(a, nb, bs, True, ae, ao, asum, ascale)
    ref = np.empty(N, np.float32)
    from ops.compiled_forms_contrib import _qt_cols
    _qt_cols(4, bt, ae, ao, asum, ascale, sct, zft, False, np.float32(8), ref, 0, N)
    out = np.empty(N, np.float32)
    if sys.argv[1] == "kernel":
        from ops.compiled_forms_contrib import _qt_par
        _qt_par(4, bt, ae, ao, asum, ascale, sct, zft, False, np.float32(8), out)
    else:
        from caller_mod import caller
        caller(4, bt, ae, ao, asum, ascale, sct, zft, False, np.float32(8), out)
    assert np.array_equal(out, ref), "parallel kernel result differs"
    print("ok")
''')


def test_cached_caller_of_a_parallel_kernel_loads_and_runs(tmp_path):
    mod = tmp_path / "mods"
    mod.mkdir()
    (mod / "caller_mod.py").write_text(_CALLER)
    script = tmp_path / "run.py"
    script.write_text(_RUN)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), NUMBA_NUM_THREADS="2")
    for step in ("kernel", "caller", "caller"):
        r = subprocess.run([sys.executable, str(script), step, ROOT, str(mod)], env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (
            f"{step} run failed (rc {r.returncode}): {r.stdout[-500:]} {r.stderr[-2000:]}")


_RUNTIME_USE = textwrap.dedent('''
    import os, sys
    sys.path[:0] = [sys.argv[2]]
    import ops
    from ops import _nrt_cache
    if sys.argv[1] == "unwritable":
        _nrt_cache.numba_cache_folder = lambda path: os.path.join(sys.argv[3], "no", "such", "folder")
    import numpy as np
    from numba import njit
    from numba.core.runtime import rtsys

    @njit
    def f(n):  # arrays in a list: allocation, and the reference counts of the runtime module
        parts = [np.full(3, i) for i in range(n)]
        return sum([p.sum() for p in parts])

    assert f(10) == 135
    s = rtsys.get_allocation_stats()
    assert s.alloc == s.free and s.mi_alloc == s.mi_free, s
    print(_nrt_cache.last_source)
''')


def test_numbas_runtime_module_is_compiled_once_and_then_loaded(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(_RUNTIME_USE)
    cache = tmp_path / "cache"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), NUMBA_NRT_STATS="1")

    def run(step):
        r = subprocess.run([sys.executable, str(script), step, ROOT, str(tmp_path)], env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, f"{step} run failed (rc {r.returncode}): {r.stdout[-500:]} {r.stderr[-2000:]}"
        return r.stdout.strip().splitlines()[-1]

    def entries():
        return sorted(cache.glob("*/onnx_numba_nrt-*.nbo"))

    assert run("first") == "compiled"
    [entry] = entries()
    assert run("second") == "loaded"
    entry.write_bytes(b"not a pickle")
    assert run("damaged") == "compiled"
    assert entries() == [entry]
    with open(entry, "rb") as fh:
        key, (name, kind, data) = pickle.load(fh)
    assert kind == "object" and len(data) == 2
    assert run("again") == "loaded"
    entry.unlink()
    assert run("unwritable") == "compiled"
    assert entries() == []


def test_the_source_epoch_flushes_the_folder_numba_caches_in(tmp_path, monkeypatch):
    from numba.core import config
    from numba.core.caching import FunctionCache

    from ops import _cache_epoch

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    used = FunctionCache(_cache_epoch.fingerprint)._cache_path  # where Numba caches a function of ops/
    assert used.startswith(str(tmp_path))
    stale = os.path.join(used, "kernel-1.py311.nbi")
    with open(stale, "w") as fh:
        fh.write("compiled against other kernel sources")
    _cache_epoch.refresh()
    assert not os.path.exists(stale)
    with open(os.path.join(used, "onnx_numba_sources.sha1")) as fh:
        assert fh.read().strip() == _cache_epoch.fingerprint()
