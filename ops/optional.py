"""Optional-type ops: Optional (15), OptionalHasElement (15, 18), OptionalGetElement (15, 18).

An optional value is represented without a wrapper object: an empty optional
is ``None`` and a present one is the value itself (a numpy array for an
optional tensor, a Python list of arrays for an optional sequence).  This
matches how the executor already represents an absent input (slot 0 holds
None) and how ``onnx.numpy_helper.to_optional`` hands test data over.

Invariants:
- ``OptionalHasElement`` with no input, an empty input name or an empty
  optional returns a 0-d ``bool`` array ``False``; anything else is ``True``;
- ``Optional`` and ``OptionalGetElement`` hand the element through unchanged,
  so they are registered with ``views=True`` (the planner then treats their
  output as an alias of their input and never recycles it early);
- ``OptionalGetElement`` on an empty optional raises ``InvalidArgumentError``
  (the spec calls it an error), never returns None silently.
"""
from __future__ import annotations

import numpy as np

from runtime.errors import InvalidArgumentError
from .registry import op

_TRUE = np.array(True)
_FALSE = np.array(False)


@op("Optional", 15, views=True)
def optional(input=None, *, type=None):
    """Wrap ``input`` (or nothing) as an optional; ``type`` only matters for an empty one."""
    return input


@op("OptionalHasElement", 15)
@op("OptionalHasElement", 18)
def optional_has_element(input=None):
    # Fresh 0-d arrays: an output must never be shared between runs or nodes.
    return _FALSE.copy() if input is None else _TRUE.copy()


@op("OptionalGetElement", 15, views=True)
@op("OptionalGetElement", 18, views=True)
def optional_get_element(input=None):
    """The element of a non-empty optional; since opset 18 a plain tensor or sequence passes through."""
    if input is None:
        raise InvalidArgumentError("OptionalGetElement: expected a non-empty optional, got an empty one (None)")
    return input
