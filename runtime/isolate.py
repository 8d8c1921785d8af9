"""Run onnx's C++ code on an untrusted model where a crash or a hang cannot take the caller down.

onnx's shape inference and function inliner are C++ that trusts its input: some malformed models segfault,
abort or hang it (the loader refuses the ones known, ``loader._node_defects``; others may exist).  ``call``
runs such a step, a function of a step file named by path (``runtime/onnx_steps.py``), in a worker process
(``runtime/isolate_worker.py``) started once per process and kept: arguments and answer travel pickled.

The worker is a fresh interpreter, not a fork of this one.  A fork copies the caller's locks in whatever state
its other threads hold them (a serving engine's, a server's, Numba's and onnxruntime's pools), and a child
that needs one of them waits forever: a good model would then fail its load as a hang.

Invariants:
- A worker that dies (a signal, an exit) or outlives the deadline (it is then killed) turns the step into
  ``OnnxCrashError`` naming the step and how it ended; the next step starts a new worker.  The caller's
  process and state are untouched.
- An exception inside the step comes back as ``IsolatedStepError`` carrying its type and message, so the
  caller handles it as it would the step's own exception.
- Steps of this process run one at a time (a lock).  A process forked from this one starts its own worker.
- ``ONNX_NUMBA_ISOLATE_ONNX`` off runs the step in this process.  ``ONNX_NUMBA_ISOLATE_TIMEOUT`` (seconds,
  default 120) sets the deadline of a step, the worker's start excluded.
"""
from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

from .errors import OnnxCrashError
from .settings import SettingError, flag, text

__all__ = ["call", "prestart", "IsolatedStepError", "enabled", "deadline", "ONNX_STEPS"]

ONNX_STEPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx_steps.py")
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "isolate_worker.py")
_LEN = struct.Struct("<Q")
_LOCK = threading.Lock()
_DEFAULT_TIMEOUT = 120.0
_START_TIMEOUT = 120.0  # the worker's own start (an interpreter loading onnx's extension) on a loaded machine
_READY = b"ready"       # the worker's first frame, once its step files are loaded


class IsolatedStepError(Exception):
    """The isolated step raised; ``kind`` is the exception's class name and ``args[0]`` its message."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def enabled() -> bool:
    return flag("ONNX_NUMBA_ISOLATE_ONNX")


def deadline() -> float:
    raw = text("ONNX_NUMBA_ISOLATE_TIMEOUT")
    if raw is None:
        return _DEFAULT_TIMEOUT
    try:
        t = float(raw)
    except ValueError:
        t = -1.0
    if not t > 0:
        raise SettingError(f"ONNX_NUMBA_ISOLATE_TIMEOUT={raw!r} is not a number of seconds above 0")
    return t


def call(function: str, args: tuple, what: str, timeout: float | None = None, steps: str | None = None):
    """``function(*args)`` of step file ``steps`` (default ``ONNX_STEPS``), run in the worker; ``what`` names the
    step in errors."""
    steps = ONNX_STEPS if steps is None else steps
    if not enabled():
        return _in_process(steps, function, args)
    timeout = deadline() if timeout is None else timeout
    request = pickle.dumps((steps, function, tuple(args)), protocol=pickle.HIGHEST_PROTOCOL)
    with _LOCK:
        worker = _Worker.get()
        answer = worker.ask(request, timeout)
        if answer is None:  # it died or hung: say how, and start afresh next time
            how = worker.end()
            raise OnnxCrashError(f"onnx's {what} {how}; the model is malformed in a way onnx cannot handle")
    if answer[0] == "ok":
        return answer[1]
    raise IsolatedStepError(answer[1], answer[2])


def prestart() -> None:
    """Start this process's worker if it has none, without waiting for it: a load calls this first, so that the
    worker's start (an interpreter loading onnx's C++ extension, about 60 ms) overlaps the reading of the model."""
    if enabled():
        with _LOCK:
            _Worker.get(wait=False)


_LOADED: dict = {}


def _in_process(steps: str, function: str, args: tuple):
    from .isolate_worker import step_module  # the worker's own loader, here in this process
    mod = step_module(steps, _LOADED)
    try:
        return getattr(mod, function)(*args)
    except Exception as e:
        raise IsolatedStepError(type(e).__name__, str(e)) from None


class _Worker:
    """One worker process; ``get`` returns this process's, starting it when there is none."""

    current: "_Worker | None" = None

    @classmethod
    def get(cls, wait: bool = True) -> "_Worker":
        w = cls.current
        if w is None or w.owner != os.getpid() or w.proc.poll() is not None:
            if w is not None and w.owner == os.getpid():
                w.end()
            w = cls.current = cls()
        if wait and not w.ready:
            if w._read(_LEN.size + len(_READY), time.monotonic() + _START_TIMEOUT) != _LEN.pack(len(_READY)) + _READY:
                w.timed_out = _START_TIMEOUT if w.timed_out else None
                how = w.end(where="")
                raise RuntimeError(f"the worker that runs onnx's C++ apart from this process did not start ({how}); "
                                   f"ONNX_NUMBA_ISOLATE_ONNX=0 runs it in this process instead")
            w.ready = True
        return w

    def __init__(self):
        self.owner = os.getpid()
        self.err = tempfile.TemporaryFile()
        boot = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
        # Linux's parent-death signal follows the thread that starts the worker: ask for it only from the main
        # thread, whose end is the process's (a worker started by a pool thread ends with its input instead).
        parent = os.getpid() if threading.current_thread() is threading.main_thread() else 0
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", boot, _WORKER, str(parent), ONNX_STEPS],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, bufsize=0,
                                         close_fds=True)
        except (OSError, ValueError) as e:
            self.err.close()
            raise RuntimeError(f"the worker that runs onnx's C++ apart from this process could not be started with "
                               f"{sys.executable!r} ({e}); ONNX_NUMBA_ISOLATE_ONNX=0 runs it in this process "
                               f"instead") from None
        self.timed_out = None  # the deadline it passed, if it did
        self.ready = False     # its first frame has been read

    def ask(self, request: bytes, timeout: float):
        """The worker's answer to ``request``, or None when it died or passed ``timeout`` (then killed)."""
        try:
            self.proc.stdin.write(_LEN.pack(len(request)) + request)
        except (BrokenPipeError, OSError):
            return None
        until = time.monotonic() + timeout
        head = self._read(_LEN.size, until)
        body = None if head is None else self._read(_LEN.unpack(head)[0], until)
        if body is None:
            self.timed_out = timeout if self.timed_out else None
            return None
        return pickle.loads(body)

    def _read(self, n: int, until: float):
        fd, out = self.proc.stdout.fileno(), bytearray()
        while len(out) < n:
            left = until - time.monotonic()
            ready = select.select([fd], [], [], left)[0] if left > 0 else []
            if not ready:
                self.timed_out = True
                self.proc.kill()
                return None
            chunk = os.read(fd, min(n - len(out), 1 << 20))
            if not chunk:
                return None
            out += chunk
        return bytes(out)

    def end(self, where: str = " on this model") -> str:
        """Stop the worker (if it still runs) and say how it ended."""
        if _Worker.current is self:
            _Worker.current = None
        if self.proc.poll() is None and not self.timed_out:
            self.proc.kill()
        code = self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.err.seek(0, os.SEEK_END)
        self.err.seek(max(0, self.err.tell() - 400))
        tail = self.err.read().decode("utf-8", "replace").strip().splitlines()
        self.err.close()
        said = f": {tail[-1]}" if tail else ""
        if self.timed_out:
            return f"did not finish within {self.timed_out:g} s{where} and was stopped"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"crashed{where} ({name}{said})"
        return f"ended without an answer{where} (exit status {code}{said})"


@atexit.register
def _stop_worker() -> None:
    w = _Worker.current
    if w is not None and w.owner == os.getpid() and w.proc.poll() is None:
        try:
            w.proc.stdin.close()  # the worker's input ends: it returns
            w.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            w.proc.kill()
