"""Execution providers: the seam between a plan and the device it runs on.

A plan is built for exactly one provider.  Every value a plan hands out is
tagged with the device of that provider; the CPU provider's tensors are plain
numpy arrays; the CUDA provider's are numba device arrays (``runtime.cuda``).
Provider names follow onnxruntime's spelling.

A CUDA session needs a usable CUDA target (a GPU, or Numba's simulator):
``check_available`` raises ``CudaUnavailableError`` otherwise; nothing ever
falls back to the CPU silently.  In an onnxruntime-style list such as
``["CUDAExecutionProvider", "CPUExecutionProvider"]`` the first provider is
the one the plan is built for.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Device", "CPU", "CUDA_PROVIDER", "PROVIDERS", "normalize_providers", "device_of", "check_available"]


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "cuda"
    index: int = 0

    def __str__(self):
        return self.kind if self.kind == "cpu" else f"{self.kind}:{self.index}"


CPU = Device("cpu")

CUDA_PROVIDER = "CUDAExecutionProvider"

PROVIDERS = {"CPUExecutionProvider": CPU, CUDA_PROVIDER: Device("cuda", 0)}


def normalize_providers(providers, provider_options=None) -> list[tuple[str, dict]]:
    """``providers`` as onnxruntime accepts it -> [(name, options)]; unknown names are errors.

    Options the runtime does not use (onnxruntime's arena or cuDNN settings) are kept and ignored; the CUDA
    provider reads ``device_id``.

    ``provider_options`` (onnxruntime's parallel list of dicts) is merged into the options of each entry.
    """
    if not providers:
        return [("CPUExecutionProvider", {})]
    if isinstance(providers, str):
        providers = [providers]
    if provider_options is not None and len(provider_options) != len(providers):
        raise ValueError(f"provider_options has {len(provider_options)} entries for {len(providers)} providers")
    out = []
    for k, p in enumerate(providers):
        name, opts = (p, {}) if isinstance(p, str) else (p[0], dict(p[1]))
        if name not in PROVIDERS:
            raise ValueError(f"unknown execution provider {name!r}; available: {sorted(PROVIDERS)}")
        if provider_options is not None:
            opts.update(provider_options[k] or {})
        out.append((name, opts))
    return out


def device_of(name: str, options: dict | None = None) -> Device:
    """The device a provider entry names (``device_id`` picks the CUDA device)."""
    dev = PROVIDERS[name]
    if dev.kind == "cuda":
        try:
            index = int((options or {}).get("device_id", 0))
        except (TypeError, ValueError):
            raise ValueError(f"{name}: device_id must be an integer, got {(options or {}).get('device_id')!r}") \
                from None
        if index < 0:
            raise ValueError(f"{name}: device_id must be >= 0, got {index}")
        return Device("cuda", index)
    return dev


def check_available(name: str, options: dict | None = None) -> Device:
    """The provider's device, or ``CudaUnavailableError`` when it needs CUDA and CUDA is unusable."""
    dev = device_of(name, options)
    if dev.kind != "cuda":
        return dev
    from . import cuda as rc  # importing runtime.cuda never imports numba.cuda
    if not rc.available():
        raise rc.CudaUnavailableError(
            f"{name} was requested but CUDA is unavailable: {rc.unavailable_reason() or 'no usable CUDA target'}. "
            f"Nothing falls back to the CPU: pass providers=['CPUExecutionProvider'] to run on the CPU, or set "
            f"{rc.SIM_ENV}=1 (before numba.cuda is first imported) to use Numba's CUDA simulator.")
    if dev.index != 0:
        n = _device_count(rc)
        if dev.index >= n:
            raise rc.CudaUnavailableError(f"{name}: device_id {dev.index} does not exist; {n} CUDA device(s) found")
        rc.cuda.select_device(dev.index)
    return dev


def _device_count(rc) -> int:
    try:
        return len(rc.cuda.gpus)
    except Exception:
        return 1
