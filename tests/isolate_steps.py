"""Step functions for the tests of ``runtime.isolate``: the worker loads this file by path, as it loads
``runtime/onnx_steps.py``."""
import os
import signal
import threading
import time

LOCK = threading.Lock()


def answer(x):
    return x


def divide(a, b):
    return a // b


def abort():
    os.abort()


def sleep(seconds):
    time.sleep(seconds)


def pid():
    return os.getpid()


def take_lock():
    """Holds only when this module's ``LOCK`` is free where the step runs."""
    if not LOCK.acquire(timeout=30):
        return "LOCK was held"
    LOCK.release()
    return "free"


def threads():
    return threading.active_count()


def infer_shapes(*args):
    """Stands for onnx's shape inference, faulting for certain."""
    os.kill(os.getpid(), signal.SIGSEGV)
