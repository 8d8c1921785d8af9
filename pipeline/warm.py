"""Compile ahead: run a package once so that every native kernel and compiled region it needs is in the caches.

``python -m pipeline warm PACKAGE`` (or ``pipeline.warm.warm(PACKAGE)``) builds the pipeline with the chosen
native components, decodes two greedy tokens from a two-token prompt (a prefill and a decode step, which
between them reach every compiled function a generation reaches) and reports what it compiled.  A service
runs it at build time; later processes then start without compiling.  Components that need input the
package cannot make up (pixel values of a vision encoder) are named in the report and left cold.

With ``digests`` (``--digests``) it also records the digests of every component's data files beside them
(``runtime.digests``): a package warmed at build time is then checked at each later load, and data damaged
since (packed integer weights included, which no value check can see) fails the load by name.

Invariant: it changes nothing but the caches (Numba's and the generated regions'), and the digest records
when asked for.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["warm", "WarmReport"]


@dataclass
class WarmReport:
    package: str
    seconds: float = 0.0
    compiled: dict = field(default_factory=dict)  # region module -> seconds its first call took
    cached: int = 0                               # region kinds that were already cached
    skipped: list = field(default_factory=list)   # (component, reason) left cold
    digests: list = field(default_factory=list)   # digest records written (``digests=True``)

    def summary(self) -> str:
        s = (f"warmed {self.package} in {self.seconds:.1f} s: {len(self.compiled)} region kind(s) compiled, "
             f"{self.cached} already cached")
        if self.digests:
            s += f"\n  recorded the digests of {len(self.digests)} data file(s): " + ", ".join(self.digests)
        for name, why in self.skipped:
            s += f"\n  not warmed: {name} ({why})"
        return s


def _plans(pipe):
    sessions = [getattr(c, "session", None) for c in pipe.components.values()]
    sessions.append(getattr(pipe.decoder, "session", None))
    return [s.plan for s in sessions if s is not None and hasattr(s, "plan")]


def warm(package: str, native: str = "all", device: str = "cpu", max_length: int | None = None,
         digests: bool = False) -> WarmReport:
    """Compile everything ``package`` needs on the native side; returns what was compiled.  ``digests``: also
    record the digests of the components' data files (``runtime.digests.record``)."""
    from .backends import choice_from_names
    from .spec import IncompletePackageError
    from .metadata import load_package
    from .runner import Pipeline
    t0 = time.perf_counter()
    spec = load_package(package)
    pipe = Pipeline(spec, choice_from_names(spec, native, device), max_length)
    report = WarmReport(package)
    plans = _plans(pipe)
    kinds = {r.module_name for p in plans for r in p.regions}
    try:
        list(pipe.tokens([1, 2], 2))
    except IncompletePackageError as e:
        report.skipped.append(("pipeline", str(e)))
    for p in plans:
        report.compiled.update(p.compile_seconds)
    report.cached = len(kinds - set(report.compiled))
    if digests:
        from runtime.digests import record
        for c in spec.components.values():
            report.digests.extend(record(c.filename))
    report.seconds = time.perf_counter() - t0
    return report
