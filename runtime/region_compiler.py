"""The Numba pipeline that generated region functions compile under (``runtime/regions.py``).

A region calls kernels with its plan-time facts written as constants: ``row_norm(..., 2, True, False, ...)``.
Numba types a constant as a literal (``Literal[bool](True)``) and compiles a callee once per distinct set of
literal arguments, so two layer kinds whose calls differ in one flag compiled every kernel below them twice,
and a kernel called from a region compiled apart from the same kernel called from Python.  This pipeline is
Numba's nopython pipeline with one pass put before type inference, ``PlainConstantArgs``: an integer, boolean
or float constant passed straight to a jitted function is typed by its plain type (``bool``, ``int64``), as
a value from Python would be.  A callee then compiles once per combination of types, whatever the values.

Invariants:
- only arguments of calls to Numba dispatchers change; every other constant keeps its literal type (a shape
  tuple, an index into a heterogeneous tuple, a branch Numba prunes);
- no callee relies on literal dispatch (``numba.literally``): a region would fail to compile rather than
  compute something else, since the call's types would not resolve.
"""
from __future__ import annotations

from numba.core import ir
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.dispatcher import Dispatcher
from numba.core.ir_utils import get_definition, guard
from numba.core.typed_passes import NopythonTypeInference

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
        consts = {}
        calls = []
        for block in func_ir.blocks.values():
            for st in block.body:
                if not isinstance(st, ir.Assign):
                    continue
                v = st.value
                if isinstance(v, ir.Const) and type(v.value) in _PLAIN:
                    consts[st.target.name] = v
                elif isinstance(v, ir.Expr) and v.op == "call":
                    calls.append(v)
        changed = False
        for call in calls:
            fn = guard(get_definition, func_ir, call.func)
            if not isinstance(fn, (ir.Global, ir.FreeVar)) or not isinstance(fn.value, Dispatcher):
                continue
            for a in list(call.args) + [v for _, v in call.kws]:
                c = consts.get(a.name)
                if c is not None and c.use_literal_type:
                    c.use_literal_type = False
                    changed = True
        return changed


class RegionCompiler(CompilerBase):
    """Numba's nopython pipeline with ``PlainConstantArgs`` just before type inference."""

    def define_pipelines(self):
        pm = DefaultPassBuilder.define_nopython_pipeline(self.state)
        at = next(k for k, (cls, _) in enumerate(pm.passes) if cls is NopythonTypeInference)
        pm.passes.insert(at, (PlainConstantArgs, "type constant call arguments by their plain types"))
        pm.finalize()
        return [pm]
