"""Execution providers: the seam between a plan and the device it runs on.

A plan is built for exactly one provider.  Every value a plan hands out is
tagged with the device of that provider; the CPU provider's tensors are plain
numpy arrays; the CUDA provider's are numba device arrays (``runtime.cuda``).
Provider names follow onnxruntime's spelling.

A CUDA session needs a usable CUDA target (a GPU, or Numba's simulator):
``check_available`` raises ``CudaUnavailableError`` otherwise.  A providers
list is an ordered preference, as in onnxruntime: ``choose_provider`` takes
the first entry that is usable here and skips the others before it with a
warning naming each and why (onnxruntime's other providers, a CUDA target
that is missing); it is an error when none remains.  So
``["CUDAExecutionProvider", "CPUExecutionProvider"]`` runs on the CPU, with a
warning, where there is no GPU, and ``["CUDAExecutionProvider"]`` fails.
Nothing else falls back: the session is planned for one provider, and a node
without a kernel on it is an error.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

from .errors import UnknownProviderError

__all__ = ["Device", "CPU", "CUDA_PROVIDER", "PROVIDERS", "ONNXRUNTIME_PROVIDERS", "normalize_providers",
           "device_of", "check_available", "choose_provider", "available_providers"]


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "cuda"
    index: int = 0

    def __str__(self):
        return self.kind if self.kind == "cpu" else f"{self.kind}:{self.index}"


CPU = Device("cpu")

CUDA_PROVIDER = "CUDAExecutionProvider"

PROVIDERS = {"CPUExecutionProvider": CPU, CUDA_PROVIDER: Device("cuda", 0)}

# Every provider name onnxruntime knows (its get_all_providers()), in its order of preference.
ONNXRUNTIME_PROVIDERS = (
    "TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider", "ROCMExecutionProvider",
    "OpenVINOExecutionProvider", "DnnlExecutionProvider", "VitisAIExecutionProvider", "QNNExecutionProvider",
    "NnapiExecutionProvider", "VSINPUExecutionProvider", "JsExecutionProvider", "CoreMLExecutionProvider",
    "ArmNNExecutionProvider", "ACLExecutionProvider", "DmlExecutionProvider", "RknpuExecutionProvider",
    "WebNNExecutionProvider", "WebGpuExecutionProvider", "XnnpackExecutionProvider", "CANNExecutionProvider",
    "AzureExecutionProvider", "CPUExecutionProvider",
)


def available_providers() -> list[str]:
    """The providers a session can be built for on this machine, most preferred first."""
    from . import cuda as rc
    return ([CUDA_PROVIDER] if rc.available() else []) + ["CPUExecutionProvider"]


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
        if name not in PROVIDERS and name not in ONNXRUNTIME_PROVIDERS:
            raise UnknownProviderError(f"Unknown Provider Type: {name} (unknown execution provider {name!r}; "
                                       f"available: {sorted(PROVIDERS)})")
        if provider_options is not None:
            opts.update(provider_options[k] or {})
        out.append((name, opts))
    return out


def choose_provider(providers, provider_options=None, logger: logging.Logger | None = None):
    """(name, options, device) of the first usable entry of ``providers`` (onnxruntime's ordered preference).

    Entries before it are skipped with a ``UserWarning`` (and a log record) naming each and why; when none is
    usable the error of the last one is raised (``CudaUnavailableError`` for a CUDA target that is missing)."""
    from .cuda import CudaUnavailableError
    entries = normalize_providers(providers, provider_options)
    skipped, error = [], None
    for name, opts in entries:
        if name not in PROVIDERS:
            skipped.append(f"{name} (an onnxruntime provider this runtime does not have)")
            error = ValueError(f"execution provider {name!r} is not available in this runtime; available: "
                               f"{available_providers()}")
            continue
        try:
            dev = check_available(name, opts)
        except CudaUnavailableError as e:
            from . import cuda as rc
            skipped.append(f"{name} ({rc.unavailable_reason() or e})")
            error = e
            continue
        if skipped:
            msg = f"skipped unavailable execution provider(s) {'; '.join(skipped)}; running on {name}"
            warnings.warn(msg, UserWarning, stacklevel=3)
            if logger is not None:
                logger.warning(msg)
        return name, opts, dev
    raise error


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


def check_and_normalize_provider_args(providers, provider_options, available_provider_names):
    """onnxruntime's provider-argument check: ``providers`` (names or (name, options) pairs) and
    ``provider_options`` (a parallel list of dicts, or None) -> (names, options), the options as str -> str, each
    provider once (a repeat is dropped with a ``UserWarning``).  A name missing from
    ``available_provider_names`` is warned about, not refused; malformed arguments are ``ValueError``."""
    if providers is None:
        return [], []
    if not isinstance(providers, (list, tuple)):
        raise ValueError(f"'providers' should be a sequence, got {type(providers).__name__}")
    names, options, seen = [], [], set()

    def add(name, opts):
        if name in seen:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", UserWarning, stacklevel=3)
            return
        if name not in available_provider_names:
            warnings.warn(f"Specified provider '{name}' is not in available provider names. Available providers: "
                          f"'{', '.join(available_provider_names)}'", UserWarning, stacklevel=3)
        seen.add(name)
        names.append(name)
        options.append({str(k): str(v) for k, v in opts.items()})

    if provider_options is not None:
        if not isinstance(provider_options, (list, tuple)):
            raise ValueError(f"'provider_options' should be a sequence, got {type(provider_options).__name__}")
        if len(providers) != len(provider_options):
            raise ValueError(f"'providers' and 'provider_options' should be the same length: {len(providers)} "
                             f"and {len(provider_options)}")
        for name, opts in zip(providers, provider_options):
            if not isinstance(name, str):
                raise ValueError(f"Only string values for 'providers' are supported when 'provider_options' is "
                                 f"given, got {name!r}")
            if not isinstance(opts, dict):
                raise ValueError(f"'provider_options' entries should be dicts, got {opts!r}")
            add(name, opts)
        return names, options
    for p in providers:
        if isinstance(p, str):
            add(p, {})
        elif (isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], dict)):
            add(p[0], p[1])
        else:
            raise ValueError(f"'providers' values must be either strings or (string, dict) tuples, got {p!r}")
    return names, options
