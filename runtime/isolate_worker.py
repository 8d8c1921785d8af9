"""The worker process of ``runtime.isolate``: runs named steps on request, one at a time, until its input ends.

Started as ``python -c <runpy of this file> WORKER_PATH PARENT_PID STEP_FILE...``, so that neither this
project's package nor Numba is imported: the worker holds onnx's C++ extension and the step files it is asked
for, and no other thread.

Protocol over stdin/stdout: frames of an 8-byte little-endian length and a pickle.  A request is ``(file,
function, args)``; the step file is loaded by path once and ``function(*args)`` is called.  The answer is
``("ok", value)`` or ``("err", exception class name, message)``.  A crash or a hang is the parent's to see:
the worker dies (or is killed) without answering.
"""
import importlib.util
import os
import pickle
import struct
import sys

_LEN = struct.Struct("<Q")
READY = b"ready"  # the first frame: ``runtime.isolate`` waits for it before the first request


def _read(f, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = f.read(n - len(out))
        if not chunk:
            return b""
        out += chunk
    return bytes(out)


def step_module(path: str, cache: dict):
    """The step file at ``path``, loaded once (as a module of its own, not of a package) and kept in ``cache``."""
    mod = cache.get(path)
    if mod is None:
        spec = importlib.util.spec_from_file_location(f"_isolated_{len(cache)}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        cache[path] = mod
    return mod


def serve(inp, out, preload=()) -> None:
    """Answer requests from ``inp`` on ``out``; ``preload``: step files loaded (their imports done) before the
    worker says it is ready, so that no step's deadline pays for them."""
    cache: dict = {}
    for path in preload:
        step_module(path, cache)
    out.write(_LEN.pack(len(READY)) + READY)
    out.flush()
    while True:
        head = _read(inp, _LEN.size)
        if not head:
            return
        body = _read(inp, _LEN.unpack(head)[0])
        if not body:
            return
        try:
            path, name, args = pickle.loads(body)
            answer = ("ok", getattr(step_module(path, cache), name)(*args))
        except Exception as e:  # noqa: BLE001 - every exception goes back to the caller by name
            answer = ("err", type(e).__name__, str(e))
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(_LEN.pack(len(data)) + data)
        out.flush()


def die_with(parent: int) -> None:
    """Be killed when the process ``parent`` ends (Linux's parent-death signal), so that a step hung in onnx does
    not outlive a caller that was itself killed; with ``parent`` 0, or elsewhere, the worker ends when its input
    does."""
    if not parent:
        return
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the signal was asked for
        os._exit(0)


if __name__ == "__main__":
    die_with(int(sys.argv[2]))  # argv: '-c', this file, the parent, the step files
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a step that prints cannot corrupt the answers
    serve(stdin, stdout, sys.argv[3:])
