"""The op registry: (domain, op_type, since_version) -> wrapper.

A wrapper is a plain function whose positional parameters are the op's inputs
(missing optional inputs arrive as ``None``; trailing ones are omitted) and
whose keyword parameters are the ONNX attribute names with the spec's
defaults.  At plan time the attributes are bound once with
``functools.partial``.  A wrapper that also needs plan-time facts (opset,
output count, static shapes, preallocated buffers) declares a keyword-only
``ctx`` parameter and receives an ``OpContext``.

A wrapper registered with ``factory=True`` is instead called once at plan
time as ``factory(ctx, **attrs)`` and returns the per-run callable; hot ops
use this to bind their compiled kernel and output buffer ahead of time.

An op written to the one contract registers its ``bind`` instead: a function
``bind(ctx, **attrs)`` whose keyword parameters are the attributes with
their defaults (written once, there), which does every plan-time check and
returns the bound op, a record of what the node's implementations share.
Each implementation of the op (the CPU wrapper, the region form, the CUDA
launch) is registered with that same ``bind`` and is called as
``impl(bound, ctx)``; it returns the per-run callable (the region form
instead emits the node's block).  ``tests/test_op_contract.py`` checks that
every op with a region form or a CUDA kernel shares its CPU twin's bind.

Providers: ``CPUExecutionProvider`` and ``CUDAExecutionProvider`` hold
kernels; ``REGION`` holds the region forms (``ops.compiled_forms``), with
versions like any other implementation.

Invariants a wrapper keeps:
- it returns numpy arrays (0-d for scalars), one per output, as an ndarray
  for a single output or a tuple for several;
- it never writes to its inputs;
- unless registered with ``views=True`` it never returns an input or a view
  of one (the planner relies on this to recycle buffers).

Resolution picks the newest registration whose since_version is at or below
the model's opset for that domain.
"""
from __future__ import annotations

import bisect
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["op", "resolve", "OpContext", "OpImpl", "registered_ops", "bind", "REGION"]

REGION = "region"  # the provider the region forms register under


@dataclass
class OpImpl:
    domain: str
    op_type: str
    since: int
    fn: Callable
    factory: bool = False
    views: bool = False
    wants_ctx: bool = False
    provider: str = "CPUExecutionProvider"
    host_inputs: tuple = ()  # input positions a device kernel reads as host numpy arrays (shapes, axes)
    contract: Callable | None = None  # the op's bind(ctx, **attrs), shared by all its implementations
    writes_out: bool = False  # a contract implementation that writes its outputs into ``ctx.out`` buffers

    @property
    def takes_buffers(self) -> bool:
        """The plan may hand this implementation preallocated output buffers (``ctx.out``)."""
        return self.factory or self.wants_ctx or self.writes_out

    @property
    def signature_fn(self) -> Callable:
        """The function whose keyword parameters are the op's attributes."""
        return self.contract if self.contract is not None else self.fn


@dataclass
class OpContext:
    """Plan-time facts about one node."""

    name: str
    op_type: str
    domain: str
    opset: int
    attrs: dict
    n_inputs: int
    n_outputs: int
    input_types: list = field(default_factory=list)  # ValueInfo or None per input
    output_types: list = field(default_factory=list)
    out: list = field(default_factory=list)  # preallocated ndarray or None per output
    provider: str = "CPUExecutionProvider"
    outputs_used: list = field(default_factory=list)  # bool per output
    node: Any = None
    graph: Any = None  # the IR graph the node belongs to (subgraph ops need it)
    session_options: Any = None
    captured: list = field(default_factory=list)  # outer-scope names a node's subgraphs read, passed after inputs
    # Input positions whose buffers the caller gives up (graph inputs read by this node alone, with
    # SessionOptions.kv_share_buffer): the kernel may write into them and return them as outputs.
    donated: frozenset = frozenset()


_REG: dict[tuple, list] = {}
_SINCE: dict[tuple, list] = {}

_DOMAIN_ALIASES = {"ai.onnx": ""}


def _norm_domain(d: str) -> str:
    return _DOMAIN_ALIASES.get(d, d)


def op(op_type: str, since: int = 1, domain: str = "", *, factory: bool = False, views: bool = False,
       provider: str = "CPUExecutionProvider", host_inputs: tuple = (), bind: Callable | None = None,
       writes_out: bool = False):
    """Register the decorated wrapper for ``(domain, op_type)`` from version ``since`` on.

    ``host_inputs`` (device providers only) lists the input positions the wrapper wants as host numpy
    arrays rather than device arrays: small shape, axis and scalar tensors it reads to size its launch.
    ``bind``: the op's contract (see the module docstring); the wrapper is then ``fn(bound, ctx)``.
    ``writes_out``: a contract wrapper that writes its outputs into the buffers ``ctx.out`` hands it (the plan
    gives arena buffers only to wrappers that use them).
    """

    def deco(fn):
        wants_ctx = "ctx" in inspect.signature(fn).parameters and not factory and bind is None
        impl = OpImpl(_norm_domain(domain), op_type, since, fn, factory, views, wants_ctx, provider,
                      tuple(host_inputs), bind, writes_out)
        key = (provider, impl.domain, op_type)
        lst = _REG.setdefault(key, [])
        sinces = _SINCE.setdefault(key, [])
        if since in sinces:
            i = sinces.index(since)
            lst[i] = impl
        else:
            i = bisect.bisect(sinces, since)
            sinces.insert(i, since)
            lst.insert(i, impl)
        return fn

    return deco


def resolve(domain: str, op_type: str, opset: int, provider: str = "CPUExecutionProvider") -> OpImpl | None:
    """Newest registration at or below ``opset``, or None."""
    key = (provider, _norm_domain(domain), op_type)
    sinces = _SINCE.get(key)
    if not sinces:
        return None
    i = bisect.bisect_right(sinces, opset) - 1
    if i < 0:
        return None
    return _REG[key][i]


def registered_ops(provider: str = "CPUExecutionProvider") -> list:
    return sorted((d, o, s) for (p, d, o), v in _SINCE.items() if p == provider for s in v)


def bind(impl: OpImpl, ctx: OpContext) -> Callable:
    """The per-run callable for a node: attributes and context bound once."""
    attrs = ctx.attrs
    _check_attrs(impl, attrs, ctx)
    if impl.contract is not None:
        return impl.fn(impl.contract(ctx, **attrs), ctx)
    if impl.factory:
        return impl.fn(ctx, **attrs)
    if impl.wants_ctx:
        return functools.partial(impl.fn, ctx=ctx, **attrs)
    if attrs:
        return functools.partial(impl.fn, **attrs)
    return impl.fn


def _check_attrs(impl: OpImpl, attrs: dict, ctx: OpContext) -> None:
    params = inspect.signature(impl.signature_fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = [a for a in attrs if a not in params or params[a].kind is inspect.Parameter.VAR_POSITIONAL]
    if unknown:
        from runtime.errors import InvalidAttributeError
        raise InvalidAttributeError(
            f"node {ctx.name!r} ({ctx.op_type}, opset {ctx.opset}): unexpected attribute(s) {unknown}; "
            f"the kernel accepts {[k for k, p in params.items() if p.kind is p.KEYWORD_ONLY or p.default is not p.empty]}")
