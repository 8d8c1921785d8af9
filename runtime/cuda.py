"""The one door to ``numba.cuda``: device detection, transfers and their accounting.

Every CUDA kernel module reaches Numba's CUDA target through this module
(``from runtime.cuda import cuda``), so moving to another CUDA front end is a
one-file change.

Invariants:
- importing this module never imports ``numba.cuda`` and never fails, even
  when numba-cuda is not installed: the target is loaded on first use (the
  ``cuda`` attribute, ``available()``, a transfer).  Numba decides between the
  real driver and the simulator when ``numba.cuda`` is first imported, so
  ``NUMBA_ENABLE_CUDASIM=1`` must be in the environment before that first use,
  not merely before this import (``load`` re-reads Numba's config first, so
  setting it after ``import numba`` is fine);
- ``available()`` and ``simulator()`` never raise;
- every host<->device copy made through ``to_device``/``to_host`` is counted
  by each active ``TransferCounter`` (and by the process-wide ``TOTAL``);
  copies made any other way (``DeviceNDArray.copy_to_host``, launching a
  kernel on a host array) are invisible to it, so kernel wrappers accept and
  return device arrays only;
- every kernel is declared with this module's ``jit`` (never ``cuda.jit``
  directly): it compiles with ``cache=True``, so a second start loads the
  kernels from Numba's cache instead of compiling them again, and it counts
  every launch (``TransferCounter.launches``, per kernel in ``.kernels``),
  so fusions are checked by the launches a step makes; a ``LaunchLog``
  also records each launch's configuration and arguments (buffer addresses
  and scalar values), so two runs can be compared launch by launch;
- with ``ONNX_NUMBA_REQUIRE_CUDA=1`` a missing CUDA target is an error,
  never a skip (``require_cuda``);
- launches and copies go to Numba's default stream unless a
  ``launch_stream`` block names another (a Numba stream, a ``cuda.core``
  stream, or a ``cuda.core`` GraphBuilder that captures a CUDA graph); inside
  a capturing block every host<->device copy raises ``CaptureError``, since
  a graph replays device work only.
"""
from __future__ import annotations

import importlib
import os
import threading
from contextlib import contextmanager

import numpy as np

from .errors import OnnxNumbaError

__all__ = ["cuda", "jit", "Kernel", "available", "simulator", "gpu_present", "load", "to_device", "to_host",
           "device_empty", "is_device_array", "measure_bandwidth", "device_pointer", "same_buffer", "TransferCounter",
           "TOTAL", "CudaUnavailableError", "require_cuda", "REQUIRE_ENV", "SIM_ENV", "launch_stream",
           "current_stream", "copy_device", "CaptureError", "LaunchLog"]

REQUIRE_ENV = "ONNX_NUMBA_REQUIRE_CUDA"
SIM_ENV = "NUMBA_ENABLE_CUDASIM"


class CudaUnavailableError(OnnxNumbaError, RuntimeError):
    """CUDA was required (or used) but neither a GPU nor the CUDA simulator is usable."""


class CaptureError(OnnxNumbaError, RuntimeError):
    """Work that a CUDA graph cannot hold (a host<->device copy) was asked for while a graph was being captured."""


_lock = threading.Lock()
_state: dict = {}  # "module": numba.cuda or None; "error": why loading failed


def load():
    """``numba.cuda``, imported on first call; raises ``CudaUnavailableError`` if numba-cuda is missing."""
    mod = _state.get("module")
    if mod is not None:
        return mod
    with _lock:
        if "module" not in _state:
            try:
                # Numba snapshots NUMBA_* variables when numba itself is imported (numba-cuda shares that
                # config); re-read them so NUMBA_ENABLE_CUDASIM set after ``import numba`` still counts.
                # The compiler calls reload_config() on every compile anyway, so this changes nothing else.
                try:
                    from numba.core import config as _numba_config
                    _numba_config.reload_config()
                except Exception:
                    pass
                _state["module"] = importlib.import_module("numba.cuda")
            except Exception as e:  # ImportError, or the CUDA bindings failing to load
                _state["module"] = None
                _state["error"] = f"{type(e).__name__}: {e}"
    mod = _state["module"]
    if mod is None:
        raise CudaUnavailableError(f"numba.cuda could not be imported ({_state['error']}); "
                                   f"install it with `pip install numba-cuda`")
    return mod


def __getattr__(name):
    # ``from runtime.cuda import cuda`` loads the target lazily (PEP 562).
    if name == "cuda":
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def unavailable_reason() -> str:
    """Why ``available()`` is False ('' when it is True)."""
    try:
        mod = load()
    except CudaUnavailableError as e:
        return str(e)
    try:
        if mod.is_available():
            return ""
    except Exception as e:
        return f"numba.cuda.is_available() raised {type(e).__name__}: {e}"
    return (f"numba-cuda is installed but finds no usable GPU, and the simulator is off "
            f"(set {SIM_ENV}=1 before numba.cuda is first imported)")


def available() -> bool:
    """True when a real GPU or the CUDA simulator can run kernels; never raises."""
    try:
        return unavailable_reason() == ""
    except Exception:
        return False


def simulator() -> bool:
    """True when kernels run on Numba's CUDA simulator; never raises."""
    try:
        mod = load()
        # The simulator's API functions live under numba.cuda.simulator; the config flag may be re-read later.
        return "simulator" in (getattr(mod.to_device, "__module__", "") or "")
    except Exception:
        return False


def gpu_present() -> bool:
    """True when the CUDA driver reports at least one device (asked through ctypes, without numba.cuda).

    Lets a test decide whether to turn the simulator on before ``numba.cuda`` is imported.
    """
    import ctypes
    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll", "libcuda.dylib"):
        try:
            drv = ctypes.CDLL(lib)
        except OSError:
            continue
        try:
            if drv.cuInit(0) != 0:
                return False
            n = ctypes.c_int(0)
            return drv.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0
        except Exception:
            return False
    return False


def require_cuda() -> None:
    """Raise ``CudaUnavailableError`` when CUDA is unusable and ``ONNX_NUMBA_REQUIRE_CUDA=1`` is set.

    Callers that would otherwise skip (tests, optional providers) call this first, so CI that must exercise
    the GPU path fails loudly instead of skipping silently.
    """
    from . import settings
    if not settings.flag(REQUIRE_ENV):
        return
    reason = unavailable_reason()
    if reason:
        raise CudaUnavailableError(f"{REQUIRE_ENV}=1 but CUDA is unavailable: {reason}")


# -- streams -----------------------------------------------------------------------------------------

class _Scope(threading.local):
    v = None  # (stream, capturing) of this thread's innermost launch_stream block; a class default, so reading
    #           it outside any block raises and catches nothing (every launch reads it)


_scope = _Scope()


@contextmanager
def launch_stream(stream, capturing: bool = False):
    """While the block runs, every kernel launch and every copy this thread makes through this module goes to
    ``stream``: a Numba stream, a ``cuda.core`` Stream, or a ``cuda.core`` GraphBuilder (numba-cuda launches
    into a GraphBuilder's capture).  ``capturing=True`` says ``stream`` is capturing a graph: a host<->device
    copy then raises ``CaptureError`` naming what was copied, because a graph replays device work only (the
    host side of a copy is not part of it).  Blocks nest; the innermost wins.
    """
    prev = _scope.v
    _scope.v = (stream, bool(capturing))
    try:
        yield stream
    finally:
        _scope.v = prev


def current_stream():
    """The stream of the innermost ``launch_stream`` block in this thread, or 0 (Numba's default stream)."""
    v = _scope.v
    return 0 if v is None else v[0]


def _copy_handle(stream):
    # Numba's copies take a stream, not a GraphBuilder: a builder's copies go to the stream it captures.
    return stream.stream if hasattr(stream, "end_building") else stream


def _copy_stream(what: str, array, stream):
    if stream is not None:
        return stream
    v = _scope.v
    if v is None:
        return 0
    if v[1]:
        raise CaptureError(f"{what} of {list(np.shape(array))} {np.dtype(array.dtype)} while a CUDA graph is "
                           f"being captured: a graph holds device work only")
    return _copy_handle(v[0])


# -- transfers ---------------------------------------------------------------------------------------

class _Listening:
    """A context manager that is in its class's ``_registry`` (a module list) while its block runs, from any
    thread."""
    _registry: list

    def __enter__(self):
        with _lock:
            self._registry.append(self)
        return self

    def __exit__(self, *exc):
        with _lock:
            self._registry.remove(self)
        return False


class TransferCounter(_Listening):
    """Counts bytes copied host->device (``h2d``) and device->host (``d2h``) through this module, and kernel
    launches.

    Use as a context manager; counters nest and each sees every transfer and launch made while it is active,
    from any thread.  ``h2d_calls``/``d2h_calls`` count the copies themselves; ``launches`` counts the kernels
    launched through ``jit`` kernels, and ``kernels`` maps each kernel's name to its launches.
    """

    def __init__(self):
        self.h2d = self.d2h = self.h2d_calls = self.d2h_calls = self.launches = 0
        self.kernels: dict = {}

    def reset(self):
        self.h2d = self.d2h = self.h2d_calls = self.d2h_calls = self.launches = 0
        self.kernels = {}

    def __repr__(self):
        return (f"TransferCounter(h2d={self.h2d} B in {self.h2d_calls} copies, "
                f"d2h={self.d2h} B in {self.d2h_calls} copies, {self.launches} launches)")


_active: list = []
TransferCounter._registry = _active
TOTAL = TransferCounter()
_active.append(TOTAL)


def _count(kind: str, nbytes: int) -> None:
    with _lock:
        for c in _active:
            if kind == "h2d":
                c.h2d += nbytes
                c.h2d_calls += 1
            else:
                c.d2h += nbytes
                c.d2h_calls += 1


def _count_launch(name: str) -> None:
    with _lock:
        for c in _active:
            c.launches += 1
            c.kernels[name] = c.kernels.get(name, 0) + 1


class LaunchLog(_Listening):
    """Records every launch made while it is active (any thread): ``launches`` is a list of
    ``(kernel name, grid, block, args)`` where each argument is ``("buffer", address, shape, dtype)`` for a device
    array or ``("value", v)`` for a scalar.

    Two runs whose logs are equal launch the same kernels on the same buffers with the same scalars, which is
    what replaying a captured CUDA graph does; ``differences`` says, launch by launch, what differs.  Recording
    costs a wrapper per launch, so it is for tools and tests, not for the decode loop.
    """

    def __init__(self):
        self.launches: list = []

    @staticmethod
    def differences(a: list, b: list) -> list:
        """``[(i, name, what)]`` for each launch ``i`` of two logs that differs: ``what`` is ``"kernel"`` (another
        kernel or configuration), ``"buffers"`` (some argument is another buffer), ``"values"`` (some scalar
        differs) or ``"buffers+values"``; a longer log's extra launches are ``"missing"`` in the other."""
        out = []
        for i in range(max(len(a), len(b))):
            if i >= len(a) or i >= len(b):
                out.append((i, (a[i] if i < len(a) else b[i])[0], "missing"))
                continue
            (na, ga, ba, xa), (nb, gb, bb, xb) = a[i], b[i]
            if (na, ga, ba, len(xa)) != (nb, gb, bb, len(xb)):
                out.append((i, na, "kernel"))
                continue
            bufs = any(p != q for p, q in zip(xa, xb) if p[0] == "buffer" or q[0] == "buffer")
            vals = any(p != q for p, q in zip(xa, xb) if p[0] == "value" and q[0] == "value")
            if bufs or vals:
                out.append((i, na, "buffers+values" if bufs and vals else "buffers" if bufs else "values"))
        return out


_logs: list = []
LaunchLog._registry = _logs


def _arg_signature(a):
    if is_device_array(a):
        return ("buffer", device_pointer(a), tuple(int(d) for d in a.shape), str(np.dtype(a.dtype)))
    if isinstance(a, np.ndarray):
        return ("value", a.tobytes())
    if isinstance(a, (bool, int, float, np.generic)):
        return ("value", a.item() if isinstance(a, np.generic) else a)
    return ("value", repr(a))


def _logged(name, config, launcher):
    def launch(*args):
        entry = (name, tuple(np.atleast_1d(config[0]).tolist()), tuple(np.atleast_1d(config[1]).tolist()),
                 tuple(_arg_signature(a) for a in args))
        with _lock:
            for log in _logs:
                log.launches.append(entry)
        return launcher(*args)
    return launch


# -- kernels -----------------------------------------------------------------------------------------

class Kernel:
    """A compiled CUDA kernel whose launches are counted: ``kernel[grid, block](*args)`` as with Numba's own.

    The launch is counted when it is configured (``kernel[grid, block]`` hands back Numba's own launcher, so
    the call adds nothing to Numba's launch path; only while a ``LaunchLog`` is open is it wrapped, to record
    the arguments); every configuration in this project is called at once.
    ``dispatcher`` is Numba's kernel object (compile-time attributes such as ``specialize`` live there).
    """
    __slots__ = ("dispatcher", "name")

    def __init__(self, dispatcher, name: str):
        self.dispatcher = dispatcher
        self.name = name

    def __getitem__(self, config):
        _count_launch(self.name)
        v = _scope.v
        if v is not None:  # inside launch_stream: the block's stream unless the launch names one
            if len(config) == 2:
                config = (config[0], config[1], v[0])
            elif not config[2]:
                config = (config[0], config[1], v[0]) + tuple(config[3:])
        if _logs:
            return _logged(self.name, config, self.dispatcher[config])
        return self.dispatcher[config]

    def __repr__(self):
        return f"<CUDA kernel {self.name}>"


def jit(fn=None, **options):
    """``cuda.jit`` for every kernel and device function of the project: ``cache=True`` unless told otherwise,
    and kernels (not ``device=True`` functions, which only kernels call) come back as a counted ``Kernel``.

    Use bare (``@jit``) or with Numba's options (``@jit(device=True)``); the CUDA target is loaded here.
    """
    options.setdefault("cache", True)

    def wrap(f):
        d = load().jit(**options)(f)
        if options.get("device"):
            return d
        mod = (getattr(f, "__module__", "") or "").rsplit(".", 1)[-1]
        return Kernel(d, f"{mod}.{f.__name__}" if mod else f.__name__)

    return wrap if fn is None else wrap(fn)


def is_device_array(x) -> bool:
    if x is None or isinstance(x, np.ndarray):
        return False
    # Real device arrays expose the CUDA array interface; the simulator's FakeCUDAArray does not.
    return hasattr(x, "__cuda_array_interface__") or hasattr(x, "copy_to_host")


def device_pointer(a) -> int:
    """The address of a device array's first element (the simulator's host address under it)."""
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    return int(a._ary.ctypes.data)  # the simulator's FakeCUDAArray


def same_buffer(a, b) -> bool:
    """``b`` is ``a`` or a device array over the same memory with the same shape."""
    return a is b or (tuple(a.shape) == tuple(b.shape) and device_pointer(a) == device_pointer(b))


def to_device(array, out=None, stream=None):
    """Copy a host array to the device (into ``out`` when given); returns the device array.

    ``stream``: the ``launch_stream`` block's stream (or the default stream) unless given."""
    cuda = load()
    a = np.ascontiguousarray(array).reshape(np.shape(array))  # ascontiguousarray makes 0-d arrays 1-d
    stream = _copy_stream("a host-to-device copy", a, stream)
    if out is None:
        d = cuda.to_device(a, stream=stream)
    else:
        if tuple(out.shape) != a.shape or np.dtype(out.dtype) != a.dtype:
            from .errors import ShapeMismatchError
            raise ShapeMismatchError(f"to_device: destination is {list(out.shape)} {out.dtype}, "
                                     f"source is {list(a.shape)} {a.dtype}")
        out.copy_to_device(a, stream=stream)
        d = out
    _count("h2d", a.nbytes)
    return d


def to_host(device_array, out=None, stream=None) -> np.ndarray:
    """Copy a device array back to a (new, or ``out``) host numpy array; returns once the copy has landed.

    ``stream``: the ``launch_stream`` block's stream (or the default stream) unless given."""
    if isinstance(device_array, np.ndarray):
        raise TypeError("to_host: expected a device array, got a numpy array")
    load()
    stream = _copy_stream("a device-to-host copy", device_array, stream)
    h = device_array.copy_to_host(out, stream=stream) if out is not None else device_array.copy_to_host(stream=stream)
    if stream:
        _sync(stream)  # the copy is asynchronous on a stream; the host reads it next
    _count("d2h", int(h.nbytes))
    return h


def _sync(stream) -> None:
    sync = getattr(stream, "synchronize", None) or getattr(stream, "sync", None)
    if sync is not None:
        sync()


def copy_device(dst, src) -> None:
    """``dst[...] = src``, device to device (same shape and dtype), on the ``launch_stream`` block's stream;
    nothing crosses to the host, so it may be captured."""
    if tuple(dst.shape) != tuple(src.shape) or np.dtype(dst.dtype) != np.dtype(src.dtype):
        from .errors import ShapeMismatchError
        raise ShapeMismatchError(f"copy_device: destination is {list(dst.shape)} {dst.dtype}, "
                                 f"source is {list(src.shape)} {src.dtype}")
    if src.size:
        dst.copy_to_device(src, stream=_copy_handle(current_stream()))


def measure_bandwidth(nbytes: int = 1 << 30, repeats: int = 5):
    """The device's memory bandwidth in GB/s, measured as a device-to-device copy of ``nbytes`` (bytes read plus
    bytes written per second, the median of ``repeats`` copies timed with CUDA events); None on the simulator,
    whose "device" is host memory."""
    if simulator():
        return None
    import statistics
    cuda = load()
    n = max(int(nbytes) // 4, 1)
    a = cuda.device_array(n, np.float32)
    b = cuda.device_array(n, np.float32)
    b.copy_to_device(a)  # warm-up
    cuda.synchronize()
    ms = []
    for _ in range(max(int(repeats), 1)):
        start, end = cuda.event(), cuda.event()
        start.record()
        b.copy_to_device(a)
        end.record()
        end.synchronize()
        ms.append(cuda.event_elapsed_time(start, end))
    return 2.0 * n * 4 / (statistics.median(ms) * 1e-3) / 1e9


def device_empty(shape, dtype):
    """An uninitialized C-contiguous device array (no transfer)."""
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    return load().device_array(tuple(int(s) for s in shape), dtype=np.dtype(dtype))
