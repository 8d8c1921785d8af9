"""Settings read from the environment: every ``ONNX_NUMBA_*`` switch, in one place, under one rule.

A flag is on for ``1``/``true``/``yes``/``on`` and off for ``0``/``false``/``no``/``off`` (any case, blanks
around ignored); unset or empty means its default.  Any other value raises ``SettingError`` naming the
variable, the value and the accepted spellings, so a typo never silently leaves a feature in the state the
user meant to change.  Values are read when asked for (not at import), so a test or a process can change
them between sessions.

| variable | default | what it turns on |
|---|---|---|
| ``ONNX_NUMBA_COMPILED_REGIONS`` | on | the pipeline's native decoder runs compiled regions |
| ``ONNX_NUMBA_KV_SHARE_BUFFER`` | on | the pipeline's native decoder writes KV caches in place |
| ``ONNX_NUMBA_DECODE_INLINE_SCAN`` | off | single-token steps of Scan decoders run on the inlined sibling plan |
| ``ONNX_NUMBA_PROGRESS`` | on | a progress bar while a first run compiles region kinds |
| ``ONNX_NUMBA_REQUIRE_CUDA`` | off | a missing CUDA target fails instead of skipping |
| ``ONNX_NUMBA_ISOLATE_ONNX`` | on | onnx's C++ shape inference and inliner run in a worker process (``runtime.isolate``) |
| ``ONNX_NUMBA_CHECK_WEIGHTS`` | on | float weights read from external data are scanned for NaN, and data files with a digest record (``runtime.digests``) are checked against it (a damaged data file) |
| ``ONNX_NUMBA_MLAS_ORDER`` | on on x86 hosts with AVX2 | onnxruntime's CPU arithmetic order (MLAS's kernels): int4 products, float32 MatMul against a constant weight, GroupQueryAttention, activations, norms (``ops._common.mlas_order``) |

Paths (``ONNX_NUMBA_REGION_DIR``), the isolated step's deadline (``ONNX_NUMBA_ISOLATE_TIMEOUT``, seconds),
onnxruntime's intra-op thread count that its order follows when a session sets none (``ONNX_NUMBA_ORT_THREADS``,
default its own default, the physical cores; ``ops._mlas_attention.ort_threads``) and the pipeline's backend choice
(``ONNX_NUMBA_NATIVE_*``, parsed with their own errors in ``pipeline.backends``) are read through ``text``.
"""
from __future__ import annotations

import os

from .errors import OnnxNumbaError

__all__ = ["SettingError", "FLAGS", "TRUE", "FALSE", "flag", "parse", "text"]

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})

FLAGS = {  # variable -> default
    "ONNX_NUMBA_COMPILED_REGIONS": True,
    "ONNX_NUMBA_KV_SHARE_BUFFER": True,
    "ONNX_NUMBA_DECODE_INLINE_SCAN": False,
    "ONNX_NUMBA_PROGRESS": True,
    "ONNX_NUMBA_REQUIRE_CUDA": False,
    "ONNX_NUMBA_ISOLATE_ONNX": True,
    "ONNX_NUMBA_CHECK_WEIGHTS": True,
    "ONNX_NUMBA_MLAS_ORDER": True,  # when unset, ``ops._common.mlas_order`` takes the host's default
}


class SettingError(OnnxNumbaError, ValueError):
    """An environment variable holds a value its setting does not recognise."""


def parse(name: str, value, default: bool) -> bool:
    """``value`` of flag ``name`` under the rule above (a bool passes through; None or blank: ``default``)."""
    if value is None or isinstance(value, bool):
        return default if value is None else value
    v = str(value).strip().lower()
    if not v:
        return default
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise SettingError(f"{name}={value!r} is not a flag value: expected one of "
                       f"{', '.join(sorted(TRUE))} (on) or {', '.join(sorted(FALSE))} (off), or unset")


def flag(name: str, env=None) -> bool:
    """The current value of flag ``name`` (one of ``FLAGS``)."""
    if name not in FLAGS:
        raise KeyError(f"{name} is not a setting of this project; known flags: {', '.join(FLAGS)}")
    env = os.environ if env is None else env
    return parse(name, env.get(name), FLAGS[name])


def text(name: str, default: str | None = None, env=None) -> str | None:
    """The value of a text setting, or ``default`` when it is unset or blank."""
    env = os.environ if env is None else env
    v = env.get(name)
    return default if v is None or not v.strip() else v
