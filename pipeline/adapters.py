"""onnxruntime-genai's ``Adapters``: LoRA adapter files whose parameters a generator feeds to its decoder.

An adapter file (``.onnx_adapter``, onnxruntime's adapter format, written by ``onnxruntime.AdapterFormat``) is a
flatbuffer: an ``Adapter`` table (format, adapter and model versions, a vector of ``Parameter`` tables: name,
dims, element type, raw little-endian data), file identifier ``TORT``.  ``read_adapter`` parses it here, checking
every offset against the file's size, into name -> numpy array.

``Adapters(model)`` holds loaded adapters by name (``load``, ``unload``); ``Generator.set_active_adapter(adapters,
name)`` makes one active in that generator: its parameters are then fed to the decoder at every step, by name, in
place of the graph's initializers of those names (onnxruntime's overridable initializers).  As in
onnxruntime-genai: a name loads once ("Adapter already loaded: NAME"), an active adapter cannot be unloaded
("Adapter still in use: NAME") until the generators using it are gone, and a generator takes adapters from one
``Adapters`` container only.
"""
from __future__ import annotations

import os
import struct
import threading

import numpy as np

from .spec import RequestError

__all__ = ["Adapters", "read_adapter"]

# onnxruntime's adapter TensorDataType -> numpy
_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
           10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


class _Buffer:
    """Bounds-checked little-endian reads of a flatbuffer."""

    def __init__(self, data: bytes, path: str):
        self.data, self.path = data, path

    def _need(self, at: int, n: int):
        if at < 0 or at + n > len(self.data):
            raise RequestError(f"adapter file {self.path!r} is malformed: a field at byte {at} runs past its end "
                               f"({len(self.data)} bytes)")

    def u16(self, at):
        self._need(at, 2)
        return struct.unpack_from("<H", self.data, at)[0]

    def u32(self, at):
        self._need(at, 4)
        return struct.unpack_from("<I", self.data, at)[0]

    def i32(self, at):
        self._need(at, 4)
        return struct.unpack_from("<i", self.data, at)[0]

    def field(self, table: int, index: int):
        """The absolute position of field ``index`` of the table at ``table``, or None when it is absent."""
        vtable = table - self.i32(table)
        size = self.u16(vtable)
        slot = 4 + 2 * index
        if slot + 2 > size:
            return None
        off = self.u16(vtable + slot)
        return table + off if off else None

    def ref(self, at: int) -> int:
        return at + self.u32(at)

    def vector(self, at: int, item: int) -> tuple:
        """(position of the first element, count) of the vector referenced at ``at``."""
        start = self.ref(at)
        n = self.u32(start)
        self._need(start + 4, n * item)
        return start + 4, n


def read_adapter(path) -> dict:
    """The parameters of an onnxruntime adapter file: name -> numpy array (a copy; the file is not kept)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise RequestError(f"cannot read adapter file {path!r}: {exc.strerror or exc}") from None
    buf = _Buffer(data, path)
    if len(data) < 8 or data[4:8] != b"TORT":
        raise RequestError(f"{path!r} is not an onnxruntime adapter file (its identifier is {data[4:8]!r}, "
                           f"expected b'TORT')")
    root = buf.ref(0)
    params = buf.field(root, 3)
    out = {}
    if params is None:
        return out
    first, count = buf.vector(params, 4)
    for k in range(count):
        table = buf.ref(first + 4 * k)
        name_at = buf.field(table, 0)
        if name_at is None:
            raise RequestError(f"adapter file {path!r}: parameter {k} has no name")
        start, n = buf.vector(name_at, 1)
        name = data[start:start + n].decode("utf-8")
        dims_at = buf.field(table, 1)
        dims = []
        if dims_at is not None:
            dstart, dn = buf.vector(dims_at, 8)
            dims = list(struct.unpack_from(f"<{dn}q", data, dstart))
        type_at = buf.field(table, 2)
        dtype = _DTYPES.get(buf.i32(type_at) if type_at is not None else 0)
        if dtype is None:
            raise RequestError(f"adapter file {path!r}: parameter {name!r} has an element type this runtime does "
                               f"not read ({buf.i32(type_at) if type_at is not None else 0})")
        raw_at = buf.field(table, 3)
        rstart, rn = buf.vector(raw_at, 1) if raw_at is not None else (0, 0)
        if any(d < 0 for d in dims) or int(np.prod(dims, dtype=np.int64)) * np.dtype(dtype).itemsize != rn:
            raise RequestError(f"adapter file {path!r}: parameter {name!r} declares dims {dims} of "
                               f"{np.dtype(dtype).name} but holds {rn} bytes")
        out[name] = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"), count=rn // np.dtype(dtype).itemsize,
                                  offset=rstart).astype(dtype).reshape(dims)
    return out


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
