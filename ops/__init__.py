"""onnx-numba's kernels.  Importing this package registers every op family.

Every public module of this package (a name without a leading underscore) is
an op family and is imported here, so adding a family is adding a file.
"""
import importlib
import pkgutil

from runtime import cpu_env  # noqa: F401  (first: settings numpy and Numba read when they load)

from . import _cache_epoch, _nrt_cache, registry  # noqa: F401

_nrt_cache.install()  # before anything starts Numba's runtime: its module then loads from the kernels' cache

# Start Numba's threading layer now.  A cached function that calls a ``parallel=True`` kernel, when loaded from
# the cache, jumps into the parallel launcher without starting it (Numba's loader starts it only for a cached
# function that is itself parallel) and segfaults; every region and many wrappers' kernels are such callers.
try:
    from numba.np.ufunc.parallel import _launch_threads
    _launch_threads()
except Exception:  # pragma: no cover - a missing threading layer fails at the first parallel kernel instead
    pass

_cache_epoch.refresh()  # before any kernel loads a cache entry compiled against other kernel sources

_FAMILIES = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")
                   and m.name not in ("registry",))
for _name in _FAMILIES:
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["registry"]
