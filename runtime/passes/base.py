"""Pass protocol: a pass is a class whose ``call(graph)`` returns a ``PassResult``.

A pass mutates the IR graph in place and says whether it changed anything;
``PassManager`` repeats a list of passes until none reports a change.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

__all__ = ["PassResult", "Pass", "PassManager"]

logger = logging.getLogger(__name__)


@dataclass
class PassResult:
    modified: bool
    details: list = field(default_factory=list)


class Pass:
    name = "pass"

    def call(self, graph) -> PassResult:  # pragma: no cover - interface
        raise NotImplementedError

    def __call__(self, graph) -> PassResult:
        res = self.call(graph)
        logger.debug("%s: modified=%s %s", self.name, res.modified, res.details[:5])
        return res


class PassManager:
    """Runs ``passes`` in order, again while any of them changed the graph, at most ``max_iterations`` rounds;
    its result says whether anything changed."""

    def __init__(self, passes, max_iterations: int = 8):
        self.passes = list(passes)
        self.max_iterations = max_iterations

    def __call__(self, graph) -> PassResult:
        any_change = False
        for _ in range(self.max_iterations):
            changed = False
            for p in self.passes:
                changed |= p(graph).modified
            any_change |= changed
            if not changed:
                break
        return PassResult(any_change)
