"""onnxruntime's LoRA adapter files (``.onnx_adapter``): read, write, and onnxruntime's ``AdapterFormat`` and
``LoraAdapter`` classes over them.

The file is a flatbuffer, file identifier ``TORT``, whose root is an ``Adapter`` table (fields: ``format_version``,
``adapter_version``, ``model_version`` as int32, ``parameters``: a vector of ``Parameter`` tables).  A
``Parameter`` has ``name`` (string), ``dims`` ([int64]), ``data_type`` (int32, onnxruntime's TensorDataType, the
ONNX element-type numbers) and ``raw_data`` ([uint8], little-endian, its bytes 8-aligned).

Invariants: ``read_adapter`` checks every offset and length against the file's size before it reads, and that
each parameter's bytes match its dims and type, so a damaged file is an error naming the file, never a read
past its end.  ``write_adapter`` lays the buffer out front to back (every reference points forward, each
scalar and vector aligned to its element size) and onnxruntime reads what it writes.

A run uses an adapter through ``RunOptions.add_active_adapter``: its parameters are fed by name in place of the
model's overridable initializers of those names.
"""
from __future__ import annotations

import os
import struct

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["AdapterFile", "read_adapter", "write_adapter", "AdapterFormat", "LoraAdapter"]

FORMAT_VERSION = 1

# TensorDataType (the ONNX element-type numbers) <-> numpy
DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
          10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}
_CODES = {np.dtype(v): k for k, v in DTYPES.items()}


class AdapterFile:
    """The content of an adapter file: its versions and its parameters (name -> numpy array)."""

    __slots__ = ("parameters", "format_version", "adapter_version", "model_version")

    def __init__(self, parameters: dict, format_version: int, adapter_version: int, model_version: int):
        self.parameters = parameters
        self.format_version, self.adapter_version, self.model_version = format_version, adapter_version, model_version


class _Buffer:
    """Bounds-checked little-endian reads of a flatbuffer."""

    def __init__(self, data: bytes, path: str):
        self.data, self.path = data, path

    def _need(self, at: int, n: int):
        if at < 0 or at + n > len(self.data):
            raise InvalidArgumentError(f"adapter file {self.path!r} is malformed: a field at byte {at} runs past its "
                                       f"end ({len(self.data)} bytes)")

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

    def int_field(self, table: int, index: int) -> int:
        at = self.field(table, index)
        return 0 if at is None else self.i32(at)

    def ref(self, at: int) -> int:
        return at + self.u32(at)

    def vector(self, at: int, item: int) -> tuple:
        """(position of the first element, count) of the vector referenced at ``at``."""
        start = self.ref(at)
        n = self.u32(start)
        self._need(start + 4, n * item)
        return start + 4, n


def read_adapter(path) -> AdapterFile:
    """The content of an onnxruntime adapter file (the arrays are copies; the file is not kept open)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read adapter file {path!r}: {exc.strerror or exc}") from None
    buf = _Buffer(data, path)
    if len(data) < 8 or data[4:8] != b"TORT":
        raise InvalidArgumentError(f"{path!r} is not an onnxruntime adapter file (its identifier is {data[4:8]!r}, "
                                   f"expected b'TORT')")
    root = buf.ref(0)
    versions = [buf.int_field(root, k) for k in range(3)]
    params = buf.field(root, 3)
    out = {}
    if params is not None:
        first, count = buf.vector(params, 4)
        for k in range(count):
            name, array = _parameter(buf, buf.ref(first + 4 * k), k)
            out[name] = array
    return AdapterFile(out, *versions)


def _parameter(buf: _Buffer, table: int, k: int) -> tuple:
    path, data = buf.path, buf.data
    name_at = buf.field(table, 0)
    if name_at is None:
        raise InvalidArgumentError(f"adapter file {path!r}: parameter {k} has no name")
    start, n = buf.vector(name_at, 1)
    name = data[start:start + n].decode("utf-8")
    dims_at = buf.field(table, 1)
    dims = []
    if dims_at is not None:
        dstart, dn = buf.vector(dims_at, 8)
        dims = list(struct.unpack_from(f"<{dn}q", data, dstart))
    code = buf.int_field(table, 2)
    dtype = DTYPES.get(code)
    if dtype is None:
        raise InvalidArgumentError(f"adapter file {path!r}: parameter {name!r} has an element type this runtime does "
                                   f"not read ({code})")
    raw_at = buf.field(table, 3)
    rstart, rn = buf.vector(raw_at, 1) if raw_at is not None else (0, 0)
    item = np.dtype(dtype).itemsize
    if any(d < 0 for d in dims) or int(np.prod(dims, dtype=np.int64)) * item != rn:
        raise InvalidArgumentError(f"adapter file {path!r}: parameter {name!r} declares dims {dims} of "
                                   f"{np.dtype(dtype).name} but holds {rn} bytes")
    array = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"), count=rn // item, offset=rstart)
    return name, array.astype(dtype).reshape(dims)


class _Writer:
    """A flatbuffer laid out front to back: references are written as placeholders and patched to point forward."""

    def __init__(self):
        self.buf = bytearray()

    def align(self, n: int, extra: int = 0):
        """Pad so that the position after ``extra`` more bytes is a multiple of ``n``."""
        while (len(self.buf) + extra) % n:
            self.buf.append(0)

    def put(self, fmt: str, *values) -> int:
        at = len(self.buf)
        self.buf += struct.pack("<" + fmt, *values)
        return at

    def patch(self, at: int, target: int):
        struct.pack_into("<I", self.buf, at, target - at)

    def table(self, fields: list) -> tuple:
        """A vtable then its table of 4-byte fields (``None`` for an absent one); returns (table position,
        {field index: position of its slot})."""
        self.align(2)
        vtable = self.put("HH", 4 + 2 * len(fields), 4 + 4 * len(fields))
        offsets = []
        for k, f in enumerate(fields):
            offsets.append(0 if f is None else 4 + 4 * k)
        self.put(f"{len(fields)}H", *offsets)
        self.align(4)
        table = self.put("i", len(self.buf) - vtable)
        slots = {}
        for k, f in enumerate(fields):
            slots[k] = self.put("i", 0 if f is None or f == "ref" else f)
        return table, slots

    def vector(self, payload: bytes, count: int, align: int) -> int:
        """A length-prefixed vector whose elements start at a multiple of ``align``."""
        self.align(max(align, 4), extra=4)
        at = self.put("I", count)
        self.buf += payload
        return at


def write_adapter(path, parameters: dict, adapter_version: int = 0, model_version: int = 0) -> None:
    """Write ``parameters`` (name -> numpy array) as an onnxruntime adapter file."""
    items = []
    for name, value in parameters.items():
        array = np.ascontiguousarray(value)
        if array.dtype.byteorder == ">":  # stored little-endian; the element type is what counts
            array = array.astype(array.dtype.newbyteorder("<"))
        if array.dtype not in _CODES:
            raise InvalidArgumentError(f"adapter parameter {name!r}: element type {array.dtype} cannot be stored "
                                       f"(expected one of {sorted(str(np.dtype(d)) for d in DTYPES.values())})")
        items.append((str(name), array))
    w = _Writer()
    w.put("I", 0)
    w.buf += b"TORT"
    root, root_slots = w.table([FORMAT_VERSION, int(adapter_version), int(model_version), "ref"])
    w.patch(0, root)
    w.align(4)
    vec = w.put("I", len(items))
    refs = [w.put("I", 0) for _ in items]
    w.patch(root_slots[3], vec)
    for ref, (name, array) in zip(refs, items):
        table, slots = w.table(["ref", "ref", _CODES[array.dtype], "ref"])
        w.patch(ref, table)
        encoded = name.encode("utf-8")
        w.patch(slots[0], w.vector(encoded + b"\0", len(encoded), 4))
        w.patch(slots[1], w.vector(struct.pack(f"<{array.ndim}q", *array.shape), array.ndim, 8))
        raw = array.tobytes()
        w.patch(slots[3], w.vector(raw, len(raw), 8))
    with open(os.fspath(path), "wb") as fh:
        fh.write(bytes(w.buf))


def _as_array(value):
    from .ortvalue import OrtValue
    return value.numpy() if isinstance(value, OrtValue) else np.asarray(value)


class AdapterFormat:
    """onnxruntime's ``AdapterFormat``: versions and parameters (name -> ``OrtValue``), exported to and read from
    an adapter file."""

    def __init__(self):
        self._adapter_version = 0
        self._model_version = 0
        self._parameters = {}

    def set_adapter_version(self, version: int) -> None:
        self._adapter_version = int(version)

    def set_model_version(self, version: int) -> None:
        self._model_version = int(version)

    def get_adapter_version(self) -> int:
        return self._adapter_version

    def get_model_version(self) -> int:
        return self._model_version

    def get_format_version(self) -> int:
        return FORMAT_VERSION

    def set_parameters(self, params: dict) -> None:
        from .ortvalue import OrtValue
        self._parameters = {str(k): v if isinstance(v, OrtValue) else OrtValue(np.asarray(v))
                            for k, v in params.items()}

    def get_parameters(self) -> dict:
        return dict(self._parameters)

    def export_adapter(self, path) -> None:
        write_adapter(path, {k: _as_array(v) for k, v in self._parameters.items()},
                      self._adapter_version, self._model_version)

    @staticmethod
    def read_adapter(path) -> "AdapterFormat":
        content = read_adapter(path)
        fmt = AdapterFormat()
        fmt._adapter_version, fmt._model_version = content.adapter_version, content.model_version
        fmt.set_parameters(content.parameters)
        return fmt


class LoraAdapter:
    """onnxruntime's ``LoraAdapter``: an adapter file loaded for runs (``RunOptions.add_active_adapter``)."""

    def __init__(self):
        self.parameters = {}

    def Load(self, path) -> None:  # noqa: N802  (onnxruntime's name)
        self.parameters = read_adapter(path).parameters

    load = Load
