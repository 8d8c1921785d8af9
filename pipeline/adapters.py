"""onnxruntime-genai's ``Adapters``: LoRA adapter files whose parameters a generator feeds to its decoder.

An adapter file (``.onnx_adapter``, onnxruntime's adapter format, written by ``onnxruntime.AdapterFormat``) is
read by ``runtime.adapters``, which checks every offset against the file's size, into name -> numpy array.

``Adapters(model)`` holds loaded adapters by name (``load``, ``unload``); ``Generator.set_active_adapter(adapters,
name)`` makes one active in that generator: its parameters are then fed to the decoder at every step, by name, in
place of the graph's initializers of those names (onnxruntime's overridable initializers).  As in
onnxruntime-genai: a name loads once ("Adapter already loaded: NAME"), an active adapter cannot be unloaded
("Adapter still in use: NAME") until the generators using it are gone, and a generator takes adapters from one
``Adapters`` container only.
"""
from __future__ import annotations

import threading

from runtime.adapters import read_adapter as _read
from runtime.errors import InvalidArgumentError

from .spec import RequestError

__all__ = ["Adapters", "read_adapter"]


def read_adapter(path) -> dict:
    """The parameters of an onnxruntime adapter file: name -> numpy array (``runtime.adapters`` reads it)."""
    try:
        return _read(path).parameters
    except InvalidArgumentError as exc:
        raise RequestError(str(exc)) from None


class Adapters:
    """Named LoRA adapters for one model (``load``, ``unload``); generators activate them by name."""

    def __init__(self, model):
        self.model = model
        self._adapters = {}   # name -> parameters
        self._users = {}      # name -> generators that activated it
        self._lock = threading.Lock()

    def load(self, path, name: str):
        params = read_adapter(path)
        with self._lock:
            if name in self._adapters:
                raise RequestError(f"Adapter already loaded: {name}")
            self._adapters[name] = params
            self._users[name] = 0

    def unload(self, name: str):
        with self._lock:
            if name not in self._adapters:
                raise RequestError(f"Adapter not found: {name}")
            if self._users[name] > 0:
                raise RequestError(f"Adapter still in use: {name}")
            del self._adapters[name], self._users[name]

    # -- for Generator ------------------------------------------------------------------------------
    def _acquire(self, name: str) -> dict:
        with self._lock:
            if name not in self._adapters:
                raise RequestError(f"Adapter not found: {name}")
            self._users[name] += 1
            return self._adapters[name]

    def _release(self, name: str):
        with self._lock:
            if name in self._users and self._users[name] > 0:
                self._users[name] -= 1
