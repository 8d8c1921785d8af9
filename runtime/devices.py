"""onnxruntime's device and memory descriptions: ``OrtDevice``, ``OrtMemoryInfo`` and their enums.

A description names a device; it never touches one.  ``OrtDevice.make("cuda", 0)`` works without a GPU, as
in onnxruntime's CPU build; only putting data there (``OrtValue.ortvalue_from_numpy(a, "cuda")``) needs a
usable CUDA target.  ``runtime_device`` maps a description to the device this runtime puts data on
(``providers.Device``): the CPU, or the CUDA device ``device_id``.

Invariants:
- every enum value and every device-type number is onnxruntime's, so ``int(ours) == int(theirs)`` and
  ``OrtDevice.make(...)`` reports what onnxruntime's reports for the same arguments;
- device-type names are onnxruntime's (``cpu``, ``cuda``, ``gpu``, ``npu``, ``dml``, ``cann``, ``webgpu``),
  matched without regard to case; describing any of them is allowed, placing data on anything but the CPU
  or an NVIDIA (or vendor-less) GPU raises ``NotSupportedError``, which is a ``RuntimeError`` as
  onnxruntime's refusal is;
- ``OrtMemoryInfo`` takes the names this runtime has memory for (``Cpu``, ``Cuda``, ``CudaPinned``);
  ``create_v2`` takes any device type, as onnxruntime's does.
"""
from __future__ import annotations

import enum

from .errors import NotSupportedError
from .providers import CPU, Device

__all__ = ["OrtDevice", "OrtMemoryInfo", "OrtAllocatorType", "OrtMemType", "OrtDeviceMemoryType",
           "OrtDeviceVendorId", "OrtMemoryInfoDeviceType", "runtime_device"]


class OrtAllocatorType(enum.IntEnum):
    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtMemType(enum.IntEnum):
    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1  # onnxruntime's alias of CPU_OUTPUT
    DEFAULT = 0


class OrtDeviceMemoryType(enum.IntEnum):
    DEFAULT = 0
    HOST_ACCESSIBLE = 5


class OrtDeviceVendorId(enum.IntEnum):
    """PCI vendor ids."""
    NONE = 0
    AMD = 0x1002
    NVIDIA = 0x10DE
    ARM = 0x13B5
    MICROSOFT = 0x1414
    HUAWEI = 0x19E5
    QUALCOMM = 0x5143
    INTEL = 0x8086


class OrtMemoryInfoDeviceType(enum.IntEnum):
    CPU = 0
    GPU = 1
    FPGA = 2
    NPU = 3


# onnxruntime's OrtDevice type numbers (its C class's cpu(), gpu(), ... statics).
_CPU, _GPU, _FPGA, _NPU = 0, 1, 2, 3

# Device-type name -> (device type, vendor when the caller gives none: None means 0 and no alias), as
# onnxruntime's OrtDevice.make and get_vendor_id_for_device_type.
_DEVICE_NAMES = {
    "cpu": (_CPU, None),
    "gpu": (_GPU, None),
    "npu": (_NPU, None),
    "cuda": (_GPU, OrtDeviceVendorId.NVIDIA),
    "dml": (_GPU, OrtDeviceVendorId.MICROSOFT),  # onnxruntime's C device reports DML as a GPU
    "cann": (_NPU, OrtDeviceVendorId.HUAWEI),
    "webgpu": (_GPU, OrtDeviceVendorId.NONE),
}

# The vendors whose GPUs this runtime reaches through CUDA (NONE: a generic "gpu").
_CUDA_VENDORS = frozenset({int(OrtDeviceVendorId.NONE), int(OrtDeviceVendorId.NVIDIA)})


class OrtDevice:
    """A device: its type, memory type, PCI vendor id and index, as onnxruntime's ``OrtDevice``.

    ``OrtDevice.make(name, device_id, vendor_id=-1)`` is the usual way to get one.  The constructor takes
    onnxruntime's C forms ``(device_type, mem_type, device_id)`` and ``(device_type, mem_type, vendor_id,
    device_id)``, or one onnxruntime ``OrtDevice`` to convert.
    """

    __slots__ = ("_type", "_mem", "_vendor", "_id")

    def __init__(self, *args):
        if len(args) == 1:
            c = args[0]._get_c_device() if hasattr(args[0], "_get_c_device") else args[0]
            try:
                args = (c.device_type(), c.mem_type(), c.vendor_id(), c.device_id())
            except AttributeError:
                raise TypeError(f"OrtDevice: expected an onnxruntime OrtDevice or (device_type, mem_type, "
                                f"[vendor_id,] device_id), got {type(args[0]).__name__}") from None
        elif len(args) == 3:
            args = (args[0], args[1], 0, args[2])
        elif len(args) != 4:
            raise TypeError(f"OrtDevice: expected (device_type, mem_type, [vendor_id,] device_id), got "
                            f"{len(args)} arguments")
        self._type, self._mem, self._vendor, self._id = (int(a) for a in args)

    @staticmethod
    def make(ort_device_name, device_id, vendor_id=-1) -> "OrtDevice":
        """The device named ``ort_device_name`` (``cpu``, ``cuda``, ``gpu``, ``npu``, ...) with index
        ``device_id``; ``vendor_id`` (a PCI vendor id) for a generic ``gpu`` or ``npu``."""
        entry = _DEVICE_NAMES.get(str(ort_device_name).lower())
        if entry is None:
            raise NotSupportedError(f"unsupported device type {ort_device_name!r}; expected one of "
                                    f"{sorted(_DEVICE_NAMES)}")
        dtype, alias = entry
        vendor = int(vendor_id)
        if vendor < 0:
            vendor = int(alias) if alias is not None else 0
        return OrtDevice(dtype, 0, vendor, int(device_id))

    # onnxruntime's accessors
    def device_id(self) -> int:
        return self._id

    def device_type(self) -> int:
        return self._type

    def device_vendor_id(self) -> int:
        return self._vendor

    def device_mem_type(self) -> int:
        return self._mem

    # onnxruntime's device-type numbers (the statics of its C class)
    @staticmethod
    def cpu() -> int:
        return _CPU

    @staticmethod
    def gpu() -> int:
        return _GPU

    cuda = gpu

    @staticmethod
    def npu() -> int:
        return _NPU

    @staticmethod
    def fpga() -> int:
        return _FPGA

    @staticmethod
    def default_memory() -> int:
        return int(OrtDeviceMemoryType.DEFAULT)

    def _get_c_device(self):
        """onnxruntime's C ``OrtDevice`` for the same device: onnxruntime's Python API reads devices through this
        method, so ours can be handed to onnxruntime's own calls."""
        from onnxruntime.capi import _pybind_state as C
        return C.OrtDevice(self._type, self._mem, self._vendor, self._id)

    def _key(self):
        return self._type, self._mem, self._vendor, self._id

    def __eq__(self, other):
        return isinstance(other, OrtDevice) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return (f"OrtDevice(type={self._type}, mem_type={self._mem}, vendor_id={self._vendor:#x}, "
                f"device_id={self._id})")


def runtime_device(device: OrtDevice, what: str = "data") -> Device:
    """The device this runtime puts ``what`` on for ``device``: the CPU, or CUDA device ``device_id`` for a GPU
    from NVIDIA (or of no vendor); ``NotSupportedError`` for any other device."""
    if not isinstance(device, OrtDevice):
        device = OrtDevice(device)
    if device.device_type() == _CPU:
        return CPU
    if device.device_type() == _GPU and device.device_vendor_id() in _CUDA_VENDORS:
        if device.device_id() < 0:
            raise NotSupportedError(f"{what}: device_id must be >= 0, got {device.device_id()}")
        return Device("cuda", device.device_id())
    raise NotSupportedError(f"{what}: this runtime places data on the CPU or an NVIDIA GPU through CUDA; got "
                            f"{device!r}")


# OrtMemoryInfo names -> (device type, vendor, device memory type), the subset of onnxruntime's names that this
# runtime has memory for.
_MEMORY_NAMES = {
    "Cpu": (OrtMemoryInfoDeviceType.CPU, OrtDeviceVendorId.NONE, OrtDeviceMemoryType.DEFAULT),
    "Cuda": (OrtMemoryInfoDeviceType.GPU, OrtDeviceVendorId.NVIDIA, OrtDeviceMemoryType.DEFAULT),
    "CudaPinned": (OrtMemoryInfoDeviceType.GPU, OrtDeviceVendorId.NVIDIA, OrtDeviceMemoryType.HOST_ACCESSIBLE),
}


def _enum(cls, value, what):
    try:
        return cls(int(value))
    except (TypeError, ValueError):
        raise ValueError(f"OrtMemoryInfo: {what} must be an {cls.__name__}, got {value!r}") from None


class OrtMemoryInfo:
    """Where an allocator's memory lives, as onnxruntime's ``OrtMemoryInfo`` (read-only properties)."""

    __slots__ = ("_name", "_allocator", "_id", "_mem", "_device_type", "_vendor", "_device_mem")

    def __init__(self, name: str, allocator_type, device_id: int, mem_type):
        entry = _MEMORY_NAMES.get(name)
        if entry is None:
            raise NotSupportedError(f"OrtMemoryInfo: memory name {name!r} is not one this runtime has; expected "
                                    f"one of {list(_MEMORY_NAMES)} (or OrtMemoryInfo.create_v2)")
        dtype, vendor, device_mem = entry
        # onnxruntime gives CPU memory device 0 whatever the caller says.
        self._set(name, allocator_type, 0 if name == "Cpu" else device_id, mem_type, dtype, vendor, device_mem)

    def _set(self, name, allocator_type, device_id, mem_type, device_type, vendor, device_mem):
        self._name = str(name)
        self._allocator = _enum(OrtAllocatorType, allocator_type, "allocator_type")
        self._id = int(device_id)
        self._mem = _enum(OrtMemType, mem_type, "mem_type")
        self._device_type = _enum(OrtMemoryInfoDeviceType, device_type, "device_type")
        self._vendor = int(vendor)
        self._device_mem = _enum(OrtDeviceMemoryType, device_mem, "device_mem_type")

    @staticmethod
    def create_v2(name: str, device_type, vendor_id: int, device_id: int, device_mem_type, alignment: int,
                  allocator_type) -> "OrtMemoryInfo":
        """onnxruntime's ``CreateMemoryInfo_V2``: any device type and vendor (the memory type is ``CPU`` for
        host-accessible memory, else ``DEFAULT``); ``alignment`` is accepted and not kept."""
        m = OrtMemoryInfo.__new__(OrtMemoryInfo)
        dm = _enum(OrtDeviceMemoryType, device_mem_type, "device_mem_type")
        mem = OrtMemType.CPU_OUTPUT if dm == OrtDeviceMemoryType.HOST_ACCESSIBLE else OrtMemType.DEFAULT
        m._set(name, allocator_type, device_id, mem, device_type, vendor_id, dm)
        return m

    name = property(lambda self: self._name, doc="The name the memory was described with.")
    allocator_type = property(lambda self: self._allocator, doc="The allocator type.")
    device_id = property(lambda self: self._id, doc="The device index.")
    mem_type = property(lambda self: self._mem, doc="OrtMemoryInfo memory type.")
    device_mem_type = property(lambda self: self._device_mem, doc="Device memory type (Device or Host accessible).")
    device_vendor_id = property(lambda self: self._vendor, doc="The PCI vendor id of the device.")

    def device(self) -> OrtDevice:
        """The ``OrtDevice`` this memory belongs to."""
        return OrtDevice(int(self._device_type), int(self._device_mem), self._vendor, self._id)

    def __repr__(self):
        return (f"OrtMemoryInfo({self._name!r}, {self._allocator.name}, device_id={self._id}, "
                f"{self._mem.name}, {self._device_mem.name}, vendor_id={self._vendor:#x})")
