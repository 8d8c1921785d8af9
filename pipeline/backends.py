"""Backend choice per component: onnxruntime or native, and the native device.

Environment (read by ``choice_from_environment``; the API takes the same
values as arguments):

- ``ONNX_NUMBA_NATIVE_COMPONENTS``: comma-separated stateless component
  names to run natively (``all``: every one; empty or ``none``: none);
- ``ONNX_NUMBA_NATIVE_DECODER``: the decoder's name, ``1`` or ``all`` to run
  it natively; empty, ``0`` or ``none`` for onnxruntime;
- ``ONNX_NUMBA_NATIVE_DEVICE``: ``cpu``, ``cuda`` or ``cuda:N``.

An unrecognized value is an error naming the variable and the accepted
values; nothing silently falls back to a default.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

__all__ = ["BackendChoice", "BackendConfigError", "parse_components", "parse_decoder", "parse_device",
           "choice_from_environment", "native_providers", "choice_from_names"]


class BackendConfigError(ValueError):
    """A backend selection names something that does not exist or is not supported."""


@dataclass
class BackendChoice:
    native_components: set = field(default_factory=set)  # stateless component names
    native_decoder: bool = False
    device: str = "cpu"


def parse_components(value, stateless: list, what="ONNX_NUMBA_NATIVE_COMPONENTS") -> set:
    if value is None:
        return set()
    if isinstance(value, (set, list, tuple)):
        names = [str(v).strip() for v in value]
    else:
        names = [v.strip() for v in str(value).split(",")]
    names = [n for n in names if n]
    if not names or names == ["none"]:
        return set()
    if names == ["all"]:
        return set(stateless)
    unknown = [n for n in names if n not in stateless]
    if unknown:
        raise BackendConfigError(f"{what}: unknown component(s) {unknown}; this package's stateless components are "
                                 f"{list(stateless)} (or 'all' / 'none')")
    return set(names)


def parse_decoder(value, decoder_name: str, what="ONNX_NUMBA_NATIVE_DECODER") -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    v = str(value).strip()
    if v.lower() in ("", "0", "none", "false"):
        return False
    if v.lower() in ("1", "all", "true") or v == decoder_name:
        return True
    raise BackendConfigError(f"{what}={value!r}: expected the decoder's name {decoder_name!r}, '1' or 'all' "
                             f"(native) or '0' / 'none' (onnxruntime)")


_DEVICE = re.compile(r"^(cpu|cuda)(:(\d+))?$")


def parse_device(value, what="ONNX_NUMBA_NATIVE_DEVICE") -> str:
    if value is None or str(value).strip() == "":
        return "cpu"
    v = str(value).strip().lower()
    m = _DEVICE.match(v)
    if not m or (m.group(1) == "cpu" and m.group(2)):
        raise BackendConfigError(f"{what}={value!r}: expected 'cpu', 'cuda' or 'cuda:N'")
    return v


def choice_from_environment(stateless: list, decoder_name: str, env=None) -> BackendChoice:
    env = os.environ if env is None else env
    return BackendChoice(parse_components(env.get("ONNX_NUMBA_NATIVE_COMPONENTS"), stateless),
                         parse_decoder(env.get("ONNX_NUMBA_NATIVE_DECODER"), decoder_name),
                         parse_device(env.get("ONNX_NUMBA_NATIVE_DEVICE")))


def choice_from_names(spec, native, device=None, what="native") -> BackendChoice:
    """The choice a caller states by name: ``native`` is 'all', 'none' (or None), or component names (a
    comma-separated string or a list; the decoder's name among them makes it native)."""
    dec = spec.decoder.name
    stateless = [n for n in spec.components if n != dec]
    if native in (None, "none"):
        return BackendChoice(set(), False, parse_device(device, "device"))
    if native == "all":
        return BackendChoice(set(stateless), True, parse_device(device, "device"))
    names = [n.strip() for n in (native.split(",") if isinstance(native, str) else native) if n.strip()]
    return BackendChoice(parse_components([n for n in names if n != dec], stateless, what), dec in names,
                         parse_device(device, "device"))


def native_providers(device: str) -> list:
    """The native runtime's providers for ``device``; CUDA must exist, never silently becomes CPU."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    from runtime import cuda as rc
    if not rc.available():
        raise BackendConfigError(f"device {device!r}: the native CUDA provider cannot run here: "
                                 f"{rc.unavailable_reason()}")
    index = int(device.split(":")[1]) if ":" in device else 0
    return [("CUDAExecutionProvider", {"device_id": index})]
