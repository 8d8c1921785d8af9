"""``SparseTensor``: onnxruntime's sparse tensor handle, in the COO and CSR(C) formats, on the CPU.

A sparse tensor is its dense shape, a 1-D array of the non-zero values and its indices:
- COO: one linear index per value (shape ``(nnz,)``), or for a 2-D tensor one (row, column) pair per value
  (``(nnz, 2)``; an index array of ``2 * nnz`` elements is read as those pairs, as onnxruntime reads it);
- CSR(C): for a 2-D tensor, the column of each value (``inner``, ``nnz`` long) and where each row's values
  start (``outer``, ``rows + 1`` long, or empty when there are no values).

Invariants:
- numeric values and int64 indices are kept without copying (onnxruntime maps the caller's arrays, and so do
  we); other integer indices are converted to int64, string values to an object array of ``str``; what
  ``values()`` and the views hand out are read-only views, as onnxruntime's are;
- construction checks what onnxruntime checks (1-D contiguous values, index counts, a 2-D shape for CSR) and
  also what it leaves to the kernels: every index lies inside the dense shape and ``outer`` never decreases,
  so a sparse tensor that exists is well formed.  Bad arguments raise ``InvalidArgumentError`` (indices
  outside the shape ``IndexOutOfRangeError``) naming what was expected and what arrived;
- the data lives on the CPU: a device other than the CPU, and ``to_cuda``, raise ``NotSupportedError``;
- no graph input of this runtime takes a sparse tensor: a session refuses one fed where a dense tensor is
  expected (``InvalidFeedError``), as onnxruntime does.
"""
from __future__ import annotations

import enum
import math

import numpy as np

from .devices import runtime_device
from .dtypes import onnx_type, type_string
from .errors import IndexOutOfRangeError, InvalidArgumentError, NotSupportedError

__all__ = ["SparseTensor", "OrtSparseFormat", "SparseCooView", "SparseCsrView"]


class OrtSparseFormat(enum.IntEnum):
    ORT_SPARSE_UNDEFINED = 0
    ORT_SPARSE_COO = 1
    ORT_SPARSE_CSRC = 2
    ORT_SPARSE_BLOCK_SPARSE = 4


def _read_only(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


class SparseCooView:
    """The COO indices of a sparse tensor (``SparseTensor.as_coo_view``)."""
    __slots__ = ("_indices",)

    def __init__(self, indices):
        self._indices = indices

    def indices(self) -> np.ndarray:
        return _read_only(self._indices)


class SparseCsrView:
    """The CSR(C) indices of a sparse tensor (``SparseTensor.as_csrc_view``)."""
    __slots__ = ("_inner", "_outer")

    def __init__(self, inner, outer):
        self._inner, self._outer = inner, outer

    def inner(self) -> np.ndarray:
        return _read_only(self._inner)

    def outer(self) -> np.ndarray:
        return _read_only(self._outer)


class SparseTensor:
    """A sparse tensor on the CPU; build one with ``sparse_coo_from_numpy`` or ``sparse_csr_from_numpy``."""

    __slots__ = ("_format", "_shape", "_values", "_indices")

    def __init__(self, fmt, shape, values, indices):
        # Internal: the factories check their arguments and call this.
        self._format = OrtSparseFormat(fmt)
        self._shape = tuple(shape)
        self._values = values
        self._indices = tuple(indices)

    # -- construction (onnxruntime's factories) --------------------------------------------------------------------
    @classmethod
    def sparse_coo_from_numpy(cls, dense_shape, values, coo_indices, ort_device) -> "SparseTensor":
        """COO: ``coo_indices`` holds one linear index per value, or a (row, column) pair per value of a 2-D
        tensor (``2 * nnz`` elements)."""
        shape, vals = _prepare("sparse_coo_from_numpy", dense_shape, values, ort_device)
        idx = _indices("sparse_coo_from_numpy", "coo_indices", coo_indices)
        nnz = vals.size
        if idx.size == nnz:
            idx = idx.reshape(nnz)
            _within("sparse_coo_from_numpy", "linear index", idx, math.prod(shape), f"dense shape {list(shape)}")
        elif idx.size == 2 * nnz:
            if len(shape) != 2:
                raise InvalidArgumentError(f"sparse_coo_from_numpy: (row, column) index pairs need a 2-D dense shape, "
                                           f"got {list(shape)}")
            idx = idx.reshape(nnz, 2)
            _within("sparse_coo_from_numpy", "row", idx[:, 0], shape[0], f"dense shape {list(shape)}")
            _within("sparse_coo_from_numpy", "column", idx[:, 1], shape[1], f"dense shape {list(shape)}")
        else:
            raise InvalidArgumentError(f"sparse_coo_from_numpy: coo_indices must hold {nnz} linear indices or "
                                       f"{2 * nnz} (row, column) coordinates for {nnz} values, got {idx.size}")
        return cls(OrtSparseFormat.ORT_SPARSE_COO, shape, vals, (idx,))

    @classmethod
    def sparse_csr_from_numpy(cls, dense_shape, values, inner_indices, outer_indices, ort_device) -> "SparseTensor":
        """CSR(C) of a 2-D tensor: ``inner_indices`` the column of each value, ``outer_indices`` where each
        row's values start (``rows + 1`` entries, the last one ``nnz``)."""
        what = "sparse_csr_from_numpy"
        shape, vals = _prepare(what, dense_shape, values, ort_device)
        if len(shape) != 2:
            raise InvalidArgumentError(f"{what}: the dense shape must be 2-D, got {list(shape)}")
        inner = _indices(what, "inner_indices", inner_indices).reshape(-1)
        outer = _indices(what, "outer_indices", outer_indices).reshape(-1)
        nnz, rows = vals.size, shape[0]
        if inner.size != nnz:
            raise InvalidArgumentError(f"{what}: inner_indices must hold one column per value ({nnz}), got "
                                       f"{inner.size}")
        if outer.size != rows + 1 and not (outer.size == 0 and nnz == 0):
            raise InvalidArgumentError(f"{what}: outer_indices must hold rows + 1 = {rows + 1} entries, got "
                                       f"{outer.size}")
        if outer.size and (outer[0] != 0 or outer[-1] != nnz or np.any(np.diff(outer) < 0)):
            raise InvalidArgumentError(f"{what}: outer_indices must rise from 0 to the value count {nnz} and never "
                                       f"decrease, got {outer.tolist()}")
        _within(what, "column", inner, shape[1], f"dense shape {list(shape)}")
        return cls(OrtSparseFormat.ORT_SPARSE_CSRC, shape, vals, (inner, outer))

    # -- reading -------------------------------------------------------------------------------------------------
    def values(self) -> np.ndarray:
        """The non-zero values (a read-only view of the array the tensor was built from, when numeric)."""
        return _read_only(self._values)

    def as_coo_view(self) -> SparseCooView:
        if self._format != OrtSparseFormat.ORT_SPARSE_COO:
            raise InvalidArgumentError(f"as_coo_view: this sparse tensor is in {self._format.name} format, not COO")
        return SparseCooView(self._indices[0])

    def as_csrc_view(self) -> SparseCsrView:
        if self._format != OrtSparseFormat.ORT_SPARSE_CSRC:
            raise InvalidArgumentError(f"as_csrc_view: this sparse tensor is in {self._format.name} format, not "
                                       f"CSR(C)")
        return SparseCsrView(*self._indices)

    def as_blocksparse_view(self):
        raise InvalidArgumentError(f"as_blocksparse_view: this sparse tensor is in {self._format.name} format; this "
                                   f"runtime builds no block-sparse tensors")

    def to_cuda(self, ort_device):
        """onnxruntime's copy to a CUDA device: refused, sparse tensors live on the CPU here."""
        raise NotSupportedError("SparseTensor.to_cuda: sparse tensors live on the CPU in this runtime (no kernel "
                                "reads them on a device); densify it (to_dense) and put the dense array on the "
                                "device with OrtValue.ortvalue_from_numpy(..., 'cuda') instead")

    def format(self) -> OrtSparseFormat:
        return self._format

    def dense_shape(self) -> list:
        return list(self._shape)

    def data_type(self) -> str:
        """onnxruntime's type string, e.g. ``sparse_tensor(float)``."""
        return "sparse_" + type_string(onnx_type(self._values.dtype))

    def device_name(self) -> str:
        return "cpu"

    def to_dense(self) -> np.ndarray:
        """The dense array (a new one): zeros where there is no value."""
        out = np.zeros(self._shape, dtype=self._values.dtype)
        if self._values.dtype == object:
            out[...] = ""
        if self._values.size == 0:
            return out
        if self._format == OrtSparseFormat.ORT_SPARSE_COO:
            idx = self._indices[0]
            if idx.ndim == 1:
                out.reshape(-1)[idx] = self._values
            else:
                out[idx[:, 0], idx[:, 1]] = self._values
        else:
            inner, outer = self._indices
            rows = np.repeat(np.arange(self._shape[0]), np.diff(outer))
            out[rows, inner] = self._values
        return out

    def __repr__(self):
        return f"SparseTensor({self.data_type()}, {self._format.name}, dense_shape={list(self._shape)}, " \
               f"nnz={self._values.size})"


def _prepare(what, dense_shape, values, ort_device) -> tuple[tuple, np.ndarray]:
    """(dense shape, values) checked: the device is the CPU, the shape 1-D non-negative integers, the values a 1-D
    contiguous array of a type ONNX has (strings become an object array of ``str``)."""
    if runtime_device(ort_device, what).kind != "cpu":
        raise NotSupportedError(f"{what}: sparse tensors live on the CPU in this runtime; got {ort_device!r}")
    shp = np.asarray(dense_shape)
    if shp.ndim != 1 or (shp.size and shp.dtype.kind not in "iu"):
        raise InvalidArgumentError(f"{what}: dense_shape must be a 1-D list of integers, got {dense_shape!r}")
    shape = tuple(int(d) for d in shp)
    if any(d < 0 for d in shape):
        raise InvalidArgumentError(f"{what}: dense_shape dimensions must be >= 0, got {list(shape)}")
    if not isinstance(values, np.ndarray):
        raise InvalidArgumentError(f"{what}: values must be a numpy array, got {type(values).__name__}")
    if values.ndim != 1:
        raise InvalidArgumentError(f"{what}: values must be a 1-D array, got shape {list(values.shape)}")
    if not values.flags.c_contiguous:
        raise InvalidArgumentError(f"{what}: values must be a contiguous array (np.ascontiguousarray)")
    if values.dtype.kind in "US" or values.dtype == object:
        if values.dtype == object and not all(isinstance(x, str) for x in values):
            raise InvalidArgumentError(f"{what}: object values must all be str")
        values = values.astype(str).astype(object) if values.dtype != object else values
    else:
        try:
            onnx_type(values.dtype)
        except TypeError:
            raise InvalidArgumentError(f"{what}: values of dtype {values.dtype} have no ONNX element type") from None
    if math.prod(shape) < values.size:
        raise InvalidArgumentError(f"{what}: {values.size} values do not fit in dense shape {list(shape)}")
    return shape, values


def _indices(what, name, a) -> np.ndarray:
    """An index array as int64 (the caller's array itself when it is int64 and contiguous)."""
    arr = np.asarray(a)
    if arr.size and arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what}: {name} must hold integers, got {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _within(what, name, idx, n, of) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = idx[(idx < 0) | (idx >= n)]
        raise IndexOutOfRangeError(f"{what}: {name} {int(bad[0])} lies outside {of} (expected 0 <= {name} < {n})")
