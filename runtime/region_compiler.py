"""The Numba pipeline that generated region functions compile under (``runtime/regions.py``).

A region calls kernels with its plan-time facts written as constants: ``row_norm(..., 2, True, False, ...)``.
Numba types a constant as a literal (``Literal[bool](True)``) and compiles a callee once per distinct set of
literal arguments, so two layer kinds whose calls differ in one flag compiled every kernel below them twice,
and a kernel called from a region compiled apart from the same kernel called from Python.  This pipeline is
Numba's nopython pipeline with one pass put before any pass types a call, ``PlainConstantArgs``: an integer, boolean
or float constant passed straight to a jitted function is typed by its plain type (``bool``, ``int64``), as
a value from Python would be.  A callee then compiles once per combination of types, whatever the values.

Invariants:
- a call of more than 30 arguments, which Python makes with a star-argument tuple, is followed through the
  tuple's pieces;
- only arguments of calls to Numba dispatchers change; every other constant keeps its literal type (a shape
  tuple, an index into a heterogeneous tuple, a branch Numba prunes);
- no callee relies on literal dispatch (``numba.literally``): a region would fail to compile rather than
  compute something else, since the call's types would not resolve.
"""
from __future__ import annotations

import operator

from numba.core import ir
from numba.core.compiler import CompilerBase
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.dispatcher import Dispatcher
from numba.core.ir_utils import get_definition, guard
from numba.core.typed_passes import NopythonTypeInference
from numba.core.untyped_passes import LiteralPropagationSubPipelinePass

from ops._glue import glue_pipeline

__all__ = ["RegionCompiler", "PlainConstantArgs"]

_PLAIN = (bool, int, float)


@register_pass(mutates_CFG=False, analysis_only=False)
class PlainConstantArgs(FunctionPass):
    """Constants passed as arguments to jitted functions are typed as plain values, not literals."""

    _name = "onnx_numba_plain_constant_args"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        func_ir = state.func_ir
        defs = {}
        calls = []
        for block in func_ir.blocks.values():
            for st in block.body:
                if isinstance(st, ir.Assign):
                    defs[st.target.name] = st.value
                    if isinstance(st.value, ir.Expr) and st.value.op == "call":
                        calls.append(st.value)
        changed = False
        for call in calls:
            fn = guard(get_definition, func_ir, call.func)
            if not isinstance(fn, (ir.Global, ir.FreeVar)) or not isinstance(fn.value, Dispatcher):
                continue
            todo = list(call.args) + [v for _, v in call.kws] + ([call.vararg] if call.vararg is not None else [])
            while todo:
                v = defs.get(todo.pop().name)
                if isinstance(v, ir.Const) and (type(v.value) in _PLAIN or type(v.value) is tuple):
                    changed |= v.use_literal_type
                    v.use_literal_type = False
                elif isinstance(v, ir.Expr) and v.op == "build_tuple":
                    todo += v.items
                elif isinstance(v, ir.Expr) and v.op == "binop" and v.fn is operator.add:
                    todo += [v.lhs, v.rhs]  # a star-argument tuple joined from pieces
        return changed


class RegionCompiler(CompilerBase):
    """Numba's nopython pipeline with ``PlainConstantArgs`` before the passes that type calls, lowering as glue
    (``ops._glue``): a region's work is in the kernels it calls, which are not optimized a second time."""

    def define_pipelines(self):
        pm = glue_pipeline(self.state)
        # Before the first pass that types calls: literal propagation's partial type inference already
        # compiles the callees it resolves.
        at = next(k for k, (cls, _) in enumerate(pm.passes)
                  if cls in (LiteralPropagationSubPipelinePass, NopythonTypeInference))
        pm.passes.insert(at, (PlainConstantArgs, "type constant call arguments by their plain types"))
        pm.finalize()
        return [pm]
