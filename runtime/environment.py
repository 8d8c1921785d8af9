"""onnxruntime's process-wide settings: the logger callback and verbosity, the random seed, the global thread
pools.

The runtime logs through Python's ``logging``: each session's records come from a logger named
``onnx_numba.session[.<logid>]`` (``session._session_logger``), the optimization passes' from ``runtime.passes.*``.
``set_default_logger_callback(cb)`` hands those records to ``cb(severity, category, logid, code_location,
message)``, onnxruntime's signature: ``severity`` 0 verbose .. 4 fatal, ``category`` ``"onnxruntime"``,
``logid`` the session's logid ("" when it has none, ``"Default"`` for records of no session),
``code_location`` ``"file.py:line function"``.

Invariants:
- installing a callback sets the default severity (``set_default_logger_severity``), which sessions created
  later read; sessions that exist keep theirs, and a run's ``RunOptions.log_severity_level`` still applies;
- the callback is a ``logging`` handler on the runtime's loggers: records still reach any handlers the
  application configured, while Python's last-resort stderr output (the "platform sink") stops, as
  onnxruntime's default sink stops when a callback is installed;  ``None`` removes it and leaves the severity;
- a record logged while the callback runs, in the same thread, skips the callback (no recursion), and an
  exception the callback raises is reported through ``logging``'s ``handleError``, never to the code that
  logged;
- ``set_seed`` seeds the random ops that have no ``seed`` attribute and are bound after it (``ops/random.py``
  reads ``seed()`` when it makes a node's generator);
- ``set_global_thread_pool_sizes`` sets the thread counts of sessions whose
  ``SessionOptions.use_per_session_threads`` is False (onnxruntime's global pools): they take these
  ``intra_op_num_threads`` and ``inter_op_num_threads`` instead of their own.
"""
from __future__ import annotations

import logging
import os
import threading

__all__ = ["set_default_logger_callback", "set_default_logger_verbosity", "default_logger_verbosity", "set_seed",
           "seed", "set_global_thread_pool_sizes", "global_thread_pool_sizes", "CALLBACK_LOGGERS"]

# The loggers whose records the callback receives (and their children).
CALLBACK_LOGGERS = ("onnx_numba", "runtime")
_SESSION_LOGGER = "onnx_numba.session"

_log = logging.getLogger("onnx_numba.environment")
_state = {"handler": None, "verbosity": 0, "seed": None, "threads": (0, 0)}
_state_lock = threading.Lock()


def _check_severity(severity) -> int:
    sev = int(severity)
    if not 0 <= sev <= 4:
        raise RuntimeError(f"severity must be between 0 (verbose) and 4 (fatal), got {severity!r}")
    return sev


def _ort_severity(levelno: int) -> int:
    """A ``logging`` level as onnxruntime's severity (0 verbose, 1 info, 2 warning, 3 error, 4 fatal)."""
    for sev, level in enumerate((logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)):
        if levelno < level:
            return sev
    return 4


def _logid(logger_name: str) -> str:
    if logger_name == _SESSION_LOGGER:
        return ""
    if logger_name.startswith(_SESSION_LOGGER + "."):
        return logger_name[len(_SESSION_LOGGER) + 1:]
    return "Default"


class _CallbackHandler(logging.Handler):
    """Hands each record to an onnxruntime-style callback."""

    def __init__(self, callback):
        super().__init__(logging.NOTSET)  # the session loggers filter by their own severity
        self.callback = callback
        self._inside = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self._inside, "active", False):
            return
        self._inside.active = True
        try:
            self.callback(_ort_severity(record.levelno), "onnxruntime", _logid(record.name),
                          f"{os.path.basename(record.pathname)}:{record.lineno} {record.funcName}",
                          record.getMessage())
        except Exception:
            self.handleError(record)
        finally:
            self._inside.active = False


class _NotCallable(TypeError, RuntimeError):
    """A logger callback that is not callable: onnxruntime raises ``RuntimeError``; a ``TypeError`` too."""


def set_default_logger_callback(callback, severity: int = 2) -> None:
    """Send the runtime's log records to ``callback(severity, category, logid, code_location, message)`` and set
    the default severity to ``severity``; ``None`` removes the callback (``severity`` is checked, not applied)."""
    sev = _check_severity(severity)
    if callback is not None and not callable(callback):
        raise _NotCallable(f"set_default_logger_callback: callback must be callable or None, got "
                        f"{type(callback).__name__}")
    with _state_lock:
        old = _state["handler"]
        if old is not None:
            for name in CALLBACK_LOGGERS:
                logging.getLogger(name).removeHandler(old)
            _state["handler"] = None
        if callback is None:
            return
        from .session import set_default_logger_severity
        set_default_logger_severity(sev)
        handler = _CallbackHandler(callback)
        for name in CALLBACK_LOGGERS:
            logging.getLogger(name).addHandler(handler)
        _state["handler"] = handler


def set_default_logger_verbosity(level: int) -> None:
    """onnxruntime's verbosity of VLOG records at severity 0; kept (``default_logger_verbosity``), though the
    runtime writes no VLOG records, so it changes no output."""
    _state["verbosity"] = int(level)


def default_logger_verbosity() -> int:
    return _state["verbosity"]


def set_seed(value: int) -> None:
    """onnxruntime's process-wide seed: random ops without a ``seed`` attribute bound after this draw from it
    (each such node starts from the same state, as onnxruntime seeds each from its global seed)."""
    _state["seed"] = int(value)


def seed():
    """The value last given to ``set_seed`` (None before any)."""
    return _state["seed"]


def set_global_thread_pool_sizes(intra_op_num_threads: int = 0, inter_op_num_threads: int = 0) -> None:
    """The thread counts of sessions created with ``use_per_session_threads = False`` (0: the default, every
    thread for intra-op work, one per core for ``ORT_PARALLEL``)."""
    intra, inter = int(intra_op_num_threads), int(inter_op_num_threads)
    if intra < 0 or inter < 0:
        raise ValueError(f"thread pool sizes must be >= 0, got intra_op_num_threads={intra_op_num_threads}, "
                         f"inter_op_num_threads={inter_op_num_threads}")
    _state["threads"] = (intra, inter)


def global_thread_pool_sizes() -> tuple[int, int]:
    """(intra_op_num_threads, inter_op_num_threads) of the global pools."""
    return _state["threads"]
