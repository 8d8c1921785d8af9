"""Run onnx's C++ code on an untrusted model where a crash or a hang cannot take the caller down.

onnx's shape inference and function inliner are C++ that trusts its input: some malformed models segfault,
abort or hang it (the loader refuses the ones known, ``loader._node_defects``; others may exist).  ``call``
runs such a step in a child forked from this process, so the child already holds the model in its memory and
nothing is re-imported; the child writes the step's result to a pipe and leaves with ``os._exit``.

Invariants:
- A child that dies of a signal, exits without an answer or outlives the deadline (it is then killed) becomes
  ``OnnxCrashError`` naming the step and how it ended; the caller's process and state are untouched.
- An exception inside the step comes back as ``IsolatedStepError`` carrying its type and message, so the
  caller handles it as it would the step's own exception.
- Isolated steps of this process run one at a time (a lock), so a fork never copies another isolated step's
  locks mid-call.  The child touches neither Numba's threads nor CUDA: it runs onnx and protobuf only.
- Where ``os.fork`` does not exist, or ``ONNX_NUMBA_ISOLATE_ONNX`` is off, the step runs in this process.
  ``ONNX_NUMBA_ISOLATE_TIMEOUT`` (seconds, default 120) sets the deadline.
"""
from __future__ import annotations

import os
import select
import signal
import threading
import time

from .errors import OnnxCrashError
from .settings import SettingError, flag, text

__all__ = ["call", "IsolatedStepError", "enabled", "deadline"]

_LOCK = threading.Lock()
_DEFAULT_TIMEOUT = 120.0


class IsolatedStepError(Exception):
    """The isolated step raised; ``kind`` is the exception's class name and ``args[0]`` its message."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def enabled() -> bool:
    return hasattr(os, "fork") and flag("ONNX_NUMBA_ISOLATE_ONNX")


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


def call(step, what: str, timeout: float | None = None) -> bytes | None:
    """``step()`` (bytes or None) run in a forked child; ``what`` names the step in errors."""
    if not enabled():
        return _in_process(step)
    timeout = deadline() if timeout is None else timeout
    with _LOCK:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(step, r, w)
        os.close(w)
        try:
            data, timed_out = _read_all(r, time.monotonic() + timeout)
        finally:
            os.close(r)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if timed_out:
        raise OnnxCrashError(f"onnx's {what} did not finish within {timeout:g} s on this model and was stopped; "
                             f"the model is malformed in a way onnx cannot handle")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        raise OnnxCrashError(f"onnx's {what} crashed on this model ({name}); the model is malformed in a way "
                             f"onnx cannot handle")
    if not data:
        raise OnnxCrashError(f"onnx's {what} ended without an answer on this model (exit status "
                             f"{os.WEXITSTATUS(status)})")
    tag, body = data[:1], data[1:]
    if tag == b"K":
        return body
    if tag == b"N":
        return None
    kind, _, message = body.decode("utf-8", "replace").partition("\n")
    raise IsolatedStepError(kind, message)


def _in_process(step):
    try:
        return step()
    except Exception as e:
        raise IsolatedStepError(type(e).__name__, str(e)) from None


def _child(step, r, w) -> None:
    code = 0
    try:
        os.close(r)
        import faulthandler
        faulthandler.disable()  # a crash here is reported by the parent, not as a traceback on our stderr
        try:
            out = step()
            msg = b"N" if out is None else b"K" + bytes(out)
        except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
            msg = b"E" + f"{type(e).__name__}\n{e}".encode("utf-8", "replace")
        view = memoryview(msg)
        while view:
            view = view[os.write(w, view):]
    except BaseException:
        code = 3
    finally:
        os._exit(code)


def _read_all(fd: int, until: float) -> tuple[bytes, bool]:
    chunks = []
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return b"".join(chunks), True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return b"".join(chunks), True
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)
