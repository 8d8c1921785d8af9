"""Execution providers: the seam between a plan and the device it runs on.

A plan is built for exactly one provider.  Every value a plan hands out is
tagged with the device of that provider; the CPU provider's tensors are plain
numpy arrays.  Provider names follow onnxruntime's spelling.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Device", "CPU", "PROVIDERS", "normalize_providers"]


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "cuda"
    index: int = 0

    def __str__(self):
        return self.kind if self.kind == "cpu" else f"{self.kind}:{self.index}"


CPU = Device("cpu")

PROVIDERS = {"CPUExecutionProvider": CPU}


def normalize_providers(providers) -> list[tuple[str, dict]]:
    """``providers`` as onnxruntime accepts it -> [(name, options)]; unknown names are errors."""
    if not providers:
        return [("CPUExecutionProvider", {})]
    out = []
    for p in providers:
        name, opts = (p, {}) if isinstance(p, str) else (p[0], dict(p[1]))
        if name not in PROVIDERS:
            raise ValueError(f"unknown execution provider {name!r}; available: {sorted(PROVIDERS)}")
        out.append((name, opts))
    return out
