"""``OrtValue``: onnxruntime's value handle over what the runtime passes around.

A tensor value wraps a numpy array (CPU) or a numba device array (CUDA, ``runtime.cuda``) without copying it:
``numpy()`` of a CPU value is the array itself, so ``update_inplace`` and a session writing into a bound
output change what the caller sees.  A sequence value wraps a list of arrays, an optional one None, a map a
dict, a sparse value a ``SparseTensor`` (``runtime.sparse``).  The element type spellings are onnxruntime's
(``tensor(float)``, ``seq(tensor(int64))``, ``sparse_tensor(float)``).

Invariants:
- the factories' ``device_type``/``device_id``/``vendor_id`` mean what ``OrtDevice.make`` makes of them
  (``runtime.devices``): ``cpu`` (any id, as onnxruntime), ``cuda`` or an NVIDIA ``gpu`` (device ``device_id``);
  another device raises ``NotSupportedError`` naming it;
- a sparse value is not a tensor: ``is_tensor()`` is False and ``numpy``, ``data_ptr``,
  ``tensor_size_in_bytes`` refuse it, while ``shape`` and ``element_type`` report its dense shape and element
  type, as onnxruntime's do.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from .devices import OrtDevice, runtime_device
from .dtypes import np_dtype, onnx_type, type_string
from .errors import InvalidFeedError
from .sparse import SparseTensor

__all__ = ["OrtValue", "OrtValueVector", "value_type_string", "is_dlpack_uint8_tensor"]


def value_type_string(v) -> str:
    """onnxruntime's type string of a run-time value (a tensor, a list of tensors, a dict, a sparse tensor, None)."""
    if isinstance(v, SparseTensor):
        return v.data_type()
    if isinstance(v, dict):
        k = next(iter(v), None)
        key = "string" if isinstance(k, str) or k is None else "int64"
        val = next(iter(v.values()), None)
        return f"map({key},{'tensor(float)' if val is None else value_type_string(np.asarray(val))})"
    if isinstance(v, list):
        return f"seq({value_type_string(v[0]) if v else 'tensor(float)'})"
    return type_string(onnx_type(np.asarray(v).dtype if not hasattr(v, "dtype") else v.dtype))


class OrtValue:
    """A tensor, sequence, map or optional value, on the CPU or a CUDA device."""

    __slots__ = ("_value",)

    def __init__(self, value):
        self._value = value

    # -- construction (onnxruntime's static factories) -------------------------------------------------------------
    @staticmethod
    def ortvalue_from_numpy(numpy_obj, device_type: str = "cpu", device_id: int = 0, vendor_id: int = -1):
        """Wrap ``numpy_obj`` (no copy on the CPU; a copy to the device for ``device_type='cuda'``);
        ``device_type`` may also be an ``OrtDevice``."""
        arr = numpy_obj if isinstance(numpy_obj, np.ndarray) else np.asarray(numpy_obj)
        dev = _device(device_type, device_id, vendor_id)
        if dev.kind == "cuda":
            with _on(dev) as rc:
                return OrtValue(rc.to_device(np.ascontiguousarray(arr)))
        return OrtValue(arr)

    @staticmethod
    def ortvalue_from_numpy_with_onnx_type(data, onnx_element_type: int):
        want = np_dtype(int(onnx_element_type))
        arr = np.asarray(data)
        if arr.dtype.itemsize != want.itemsize and want != np.dtype(object):
            raise InvalidFeedError(f"array of {arr.dtype} ({arr.dtype.itemsize} bytes) cannot hold ONNX element "
                                   f"type {type_string(int(onnx_element_type))} ({want.itemsize} bytes)")
        return OrtValue(arr.view(want) if arr.dtype != want and want != np.dtype(object) else arr)

    @staticmethod
    def ortvalue_from_shape_and_type(shape, element_type, device_type: str = "cpu", device_id: int = 0,
                                     vendor_id: int = -1):
        """A new uninitialised tensor; ``element_type`` a numpy type or an ONNX element type number."""
        dt = np_dtype(int(element_type)) if isinstance(element_type, (int, np.integer)) else np.dtype(element_type)
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise InvalidFeedError(f"shape {list(shape)}: dimensions must be >= 0")
        dev = _device(device_type, device_id, vendor_id)
        if dev.kind == "cuda":
            with _on(dev) as rc:
                return OrtValue(rc.device_empty(shape, dt))
        return OrtValue(np.empty(shape, dt))

    @staticmethod
    def ort_value_from_sparse_tensor(sparse_tensor: SparseTensor) -> "OrtValue":
        """An OrtValue holding ``sparse_tensor`` (not copied)."""
        if not isinstance(sparse_tensor, SparseTensor):
            raise InvalidFeedError(f"ort_value_from_sparse_tensor: expected a runtime.SparseTensor, got "
                                   f"{type(sparse_tensor).__name__}")
        return OrtValue(sparse_tensor)

    def as_sparse_tensor(self) -> SparseTensor:
        """The ``SparseTensor`` this value holds."""
        if not isinstance(self._value, SparseTensor):
            raise InvalidFeedError(f"OrtValue.as_sparse_tensor: this OrtValue does not hold a sparse tensor; it "
                                   f"holds {self.data_type()}")
        return self._value

    # -- reading -------------------------------------------------------------------------------------------------
    def numpy(self):
        """The value as numpy: the CPU array itself (no copy), a device array copied to the host, a list or dict."""
        v = self._value
        if isinstance(v, np.ndarray) or v is None or isinstance(v, (list, dict)):
            return v
        if isinstance(v, SparseTensor):
            raise InvalidFeedError(f"OrtValue.numpy: the value is a sparse tensor ({v.data_type()}), not a tensor; "
                                   f"read it with as_sparse_tensor() (to_dense() gives the dense array)")
        from . import cuda as rc
        return rc.to_host(v)

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(value)``: the CPU array itself when no conversion is asked for (zero-copy)."""
        a = self.numpy()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def value(self):
        """The wrapped value as the runtime holds it (a device array stays on the device)."""
        return self._value

    def is_tensor(self) -> bool:
        return self._value is not None and not isinstance(self._value, (list, dict, SparseTensor))

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def is_sparse_tensor(self) -> bool:
        return isinstance(self._value, SparseTensor)

    def has_value(self) -> bool:
        return self._value is not None

    def _tensor(self, what):
        if not self.is_tensor():
            raise InvalidFeedError(f"OrtValue.{what}: the value is not a tensor ({self.data_type()})")
        return self._value

    def shape(self) -> list:
        if isinstance(self._value, SparseTensor):
            return self._value.dense_shape()
        return list(self._tensor("shape").shape)

    def data_type(self) -> str:
        if self._value is None:
            return "optional(tensor(float))"
        return value_type_string(self._value)

    def element_type(self) -> int:
        if isinstance(self._value, SparseTensor):
            return onnx_type(self._value.values().dtype)
        return onnx_type(np.dtype(self._tensor("element_type").dtype))

    def device_name(self) -> str:
        if isinstance(self._value, SparseTensor):
            return self._value.device_name()
        return "cpu" if isinstance(self._value, (np.ndarray, list, dict)) or self._value is None else "cuda"

    def tensor_size_in_bytes(self) -> int:
        t = self._tensor("tensor_size_in_bytes")
        return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize

    def data_ptr(self) -> int:
        t = self._tensor("data_ptr")
        if isinstance(t, np.ndarray):
            return int(t.ctypes.data)
        from . import cuda as rc
        return rc.device_pointer(t)

    def update_inplace(self, np_arr) -> None:
        """Copy ``np_arr`` into this tensor's memory (same shape and dtype)."""
        t = self._tensor("update_inplace")
        src = np.asarray(np_arr)
        if tuple(src.shape) != tuple(t.shape) or src.dtype != np.dtype(t.dtype):
            raise InvalidFeedError(f"update_inplace: expected {np.dtype(t.dtype)}{list(t.shape)}, got "
                                   f"{src.dtype}{list(src.shape)}")
        if isinstance(t, np.ndarray):
            np.copyto(t, src)
        else:
            from . import cuda as rc
            rc.to_device(np.ascontiguousarray(src), out=t)

    # -- onnxruntime's C-layer handle and DLPack ------------------------------------------------------------------
    @property
    def _ortvalue(self) -> "OrtValue":
        """onnxruntime's Python ``OrtValue`` wraps a C one here; this class is both, so it is itself."""
        return self

    def _get_c_value(self) -> "OrtValue":
        return self

    def __dlpack__(self, *args, **kwargs):
        """The CPU tensor as a DLPack capsule (numpy's export: the memory is shared, not copied)."""
        t = self._tensor("__dlpack__")
        if not isinstance(t, np.ndarray):
            raise InvalidFeedError("OrtValue.__dlpack__: only CPU tensors are exported through DLPack here; copy "
                                   "the value to the host with numpy() first")
        return t.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple:
        self._tensor("__dlpack_device__")
        return (1, 0) if isinstance(self._value, np.ndarray) else (2, 0)

    def to_dlpack(self):
        return self.__dlpack__()

    @staticmethod
    def from_dlpack(data, is_bool_tensor: bool = False) -> "OrtValue":
        """An ``OrtValue`` over a DLPack capsule or an object with ``__dlpack__`` (memory shared, not copied);
        ``is_bool_tensor`` reads uint8 data as bool, as onnxruntime's flag does."""
        source = _Capsule(data) if type(data).__name__ == "PyCapsule" else data
        arr = np.from_dlpack(source)
        if is_bool_tensor and arr.dtype == np.uint8:
            arr = arr.view(np.bool_)
        return OrtValue(arr)

    def __repr__(self):
        return f"OrtValue({self.data_type()}, device={self.device_name()})"


class _Capsule:
    """A bare DLPack capsule as the object ``np.from_dlpack`` takes, reporting the device its tensor says."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, *args, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        device_type, device_id, _, _ = _dltensor_fields(self.capsule)
        return (device_type, device_id)


def _dltensor_fields(capsule) -> tuple:
    """(device type, device id, type code, bits) of an unused DLPack capsule's tensor (``DLManagedTensor``: the
    data pointer, the device as two int32, ndim as int32, then the dtype's code and bits as uint8)."""
    import ctypes
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    ptr = get(capsule, b"dltensor")
    device_type, device_id = ctypes.cast(ptr + 8, ctypes.POINTER(ctypes.c_int32))[0:2]
    code, bits = ctypes.cast(ptr + 20, ctypes.POINTER(ctypes.c_uint8))[0:2]
    return device_type, device_id, code, bits


def is_dlpack_uint8_tensor(capsule) -> bool:
    """Whether a DLPack capsule holds uint8 data (onnxruntime's check before reading one as bool)."""
    _, _, code, bits = _dltensor_fields(capsule)
    return code == 1 and bits == 8


class OrtValueVector(list):
    """onnxruntime's ``OrtValueVector``: the ``OrtValue`` results of ``run_with_ort_values``, as a list."""


def _device(device_type, device_id, vendor_id):
    """The runtime device (``providers.Device``) that onnxruntime's factory arguments name: a device name with
    its index, or an ``OrtDevice`` (the form onnxruntime's C layer takes)."""
    if isinstance(device_type, OrtDevice):
        return runtime_device(device_type, "OrtValue")
    return runtime_device(OrtDevice.make(device_type or "cpu", device_id, vendor_id), "OrtValue")


@contextmanager
def _on(dev):
    """``runtime.cuda`` with CUDA device ``dev.index`` current (numba's device context) while the block runs."""
    from . import cuda as rc
    if dev.index == 0:
        yield rc
        return
    gpus = rc.cuda.gpus
    if dev.index >= len(gpus):
        raise rc.CudaUnavailableError(f"OrtValue: CUDA device {dev.index} does not exist; {len(gpus)} found")
    with gpus[dev.index]:
        yield rc
