"""The Numba pipeline that generated region functions compile under (``runtime/regions.py``).

A region calls kernels with its plan-time facts written as constants: ``row_norm(..., 2, True, False, ...)``.
Numba types a constant as a literal (``Literal[bool](True)``) and compiles a callee once per distinct set of
literal arguments, so two layer kinds whose calls differ in one flag compiled every kernel below them twice,
and a kernel called from a region compiled apart from the same kernel called from Python.  This pipeline is
Numba's nopython pipeline with one pass put before any pass types a call, ``PlainConstantArgs``: an integer, boolean
or float constant passed straight to a jitted function is typed by its plain type (``bool``, ``int64``), as
a value from Python would be.  A callee then compiles once per combination of types, whatever the values.
The functions lower as glue (``ops/_glue.py``: the kernels they link are not optimized a second time) into a
``RegionLibrary``, whose cache entry carries the machine code and the names of its symbols but not the IR a
caller would link, since no compiled code calls a region.

Invariants:
- a call of more than 30 arguments, which Python makes with a star-argument tuple, is followed through the
  tuple's pieces;
- only arguments of calls to Numba dispatchers change; every other constant keeps its literal type (a shape
  tuple, an index into a heterogeneous tuple, a branch Numba prunes);
- a region's cached entry cannot be linked into another function (its linking module defines names only);
  regions are called from Python alone;
- no callee relies on literal dispatch (``numba.literally``): a region would fail to compile rather than
  compute something else, since the call's types would not resolve.
"""
from __future__ import annotations

import operator

from llvmlite import binding as ll
from numba.core import ir
from numba.core.compiler import CompilerBase
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.dispatcher import Dispatcher
from numba.core.ir_utils import get_definition, guard
from numba.core.typed_passes import NopythonTypeInference
from numba.core.untyped_passes import LiteralPropagationSubPipelinePass

from ops._glue import GlueLibrary, UseGlueLibrary, glue_pipeline

__all__ = ["RegionCompiler", "RegionLibrary", "PlainConstantArgs"]

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


class RegionLibrary(GlueLibrary):
    """A region's code library, cached without the IR a caller would link.

    Numba's cache entry holds a function's machine code and, for callers that link it, the LLVM module of the
    function with every kernel below it; loading the entry parses that module (at 24 layers about 16 MB for
    the layer kind) and keeps it.  Nothing calls a region from compiled code, so its entry carries a module
    that only names the symbols the machine code defines, which is all the loader reads from it."""

    def serialize_using_object_code(self):
        self._ensure_finalized()
        lines = []
        for fn in self._final_module.functions:
            if not fn.is_declaration:
                lines.append(f'define void @"{fn.name}"() {{\n  unreachable\n}}')
        for gv in self._final_module.global_variables:
            if not gv.is_declaration:
                lines.append(f'@"{gv.name}" = global i8 0')
        names = ll.parse_assembly("\n".join(lines))
        return (self.name, "object", (self._get_compiled_object(), names.as_bitcode()))


@register_pass(mutates_CFG=False, analysis_only=False)
class UseRegionLibrary(UseGlueLibrary):
    """Lower into a ``RegionLibrary``."""

    _name = "onnx_numba_region_library"
    library = RegionLibrary


class RegionCompiler(CompilerBase):
    """Numba's nopython pipeline with ``PlainConstantArgs`` before the passes that type calls, lowering as glue
    (``ops._glue``): a region's work is in the kernels it calls, which are not optimized a second time."""

    def define_pipelines(self):
        pm = glue_pipeline(self.state, UseRegionLibrary)
        # Before the first pass that types calls: literal propagation's partial type inference already
        # compiles the callees it resolves.
        at = next(k for k, (cls, _) in enumerate(pm.passes)
                  if cls in (LiteralPropagationSubPipelinePass, NopythonTypeInference))
        pm.passes.insert(at, (PlainConstantArgs, "type constant call arguments by their plain types"))
        pm.finalize()
        return [pm]
