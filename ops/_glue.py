"""The Numba pipeline for glue functions: drivers whose work is done by the kernels they call.

Numba links every callee's compiled module into its caller's and then runs LLVM's whole O3 module pipeline over
the result, so a driver re-optimizes every kernel below it, and a generated region re-optimizes the drivers and
kernels below it again.  The callees arrive already optimized (each was finalized when it compiled), so that
second pass mostly repeats work: at the 24-layer package's sizes it was about 7 s of a cold start's region
compiles and 2.5 s of GroupQueryAttention's driver.

``GlueCompiler`` is Numba's nopython pipeline with one change, in the code library its functions are lowered
into (``GlueLibrary``): the function's own module is optimized at O3 *before* the callees are linked in, and
the linked whole then gets only Numba's cheap module pass (the one that prunes reference-count pairs).

Invariants:
- a callee runs the code its own compile optimized, the code it runs when called from Python (the default
  pipeline may instead re-optimize it inside the caller: inlined, specialized on constant arguments, which can
  change the order of a fast-math reduction); the function's own code gets the same O3 pipeline as by default,
  only without the callees' bodies in view;
- what is lost is inlining a callee into the glue: a loop in a glue function that calls a small jitted helper
  per element makes a call per element.  Such loops belong in a kernel (compiled by the default pipeline) or in
  an ``inline="always"`` helper, which Numba inlines before lowering.  An array expression (``x * s + t`` over
  arrays) is not such a callee: Numba compiles its loop body into a library of its own, which is linked into
  the function's module before that module is optimized, so it inlines and vectorizes as by default;
- the machine code and its on-disk cache entry are made as for any other function.
"""
from __future__ import annotations

from numba.core.codegen import JITCodeLibrary
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import LoweringPass, register_pass
from numba.core.typed_passes import NativeLowering

__all__ = ["GlueCompiler", "GlueLibrary", "UseGlueLibrary", "glue_pipeline"]

_ARRAY_EXPR = "__numba_array_expr_"  # the name of the library Numba compiles an array expression's loop body into


class GlueLibrary(JITCodeLibrary):
    """A code library whose own module is optimized before linking, and the linked whole only cheaply."""

    def finalize(self):
        # The loops Numba generated for this function's own array expressions are part of its code: linked and
        # optimized with it, so that they inline and vectorize (left to the cheap pass, an array expression made
        # one call per element: a scale-and-shift over 1.6 M floats took 5.1 ms against 0.34 by default).
        own = [lib for lib in dict.fromkeys(self._linking_libraries) if lib.name.startswith(_ARRAY_EXPR)]
        for lib in own:
            self._reload_init.update(lib._reload_init)
            self._final_module.link_in(lib._get_module_for_linking(), preserve=True)
        self._linking_libraries = [lib for lib in self._linking_libraries if lib not in own]
        mpm, mpb = self._codegen._module_pass_manager()  # the default O3 module pipeline, on this code alone
        mpm.run(self._final_module, mpb)
        super().finalize()  # links the callees, then runs _optimize_final_module below

    def _optimize_final_module(self):
        cg = self._codegen
        mpm, mpb = cg._module_pass_manager(loop_vectorize=cg._loopvect, slp_vectorize=False, opt=cg._opt_level,
                                           cost="cheap")
        mpm.run(self._final_module, mpb)


@register_pass(mutates_CFG=False, analysis_only=False)
class UseGlueLibrary(LoweringPass):
    """Lower into a ``library`` (a ``GlueLibrary``; Numba's lowering pass otherwise makes a default one).  A
    subclass that sets another library class registers itself under its own ``_name``."""

    _name = "onnx_numba_glue_library"
    library = GlueLibrary

    def __init__(self):
        LoweringPass.__init__(self)

    def run_pass(self, state):
        if state.library is None:
            state.library = self.library(state.targetctx.codegen(), state.func_id.func_qualname)
            state.library.enable_object_caching()  # so that the cache can serialize it, as Numba's pass does
        return False


def glue_pipeline(state, library_pass=UseGlueLibrary):
    """Numba's nopython pass manager with ``library_pass`` (``UseGlueLibrary`` or a pass like it) before
    lowering; not finalized, so that a subclass can add passes."""
    pm = DefaultPassBuilder.define_nopython_pipeline(state)
    at = next(k for k, (cls, _) in enumerate(pm.passes) if cls is NativeLowering)
    pm.passes.insert(at, (library_pass, "lower into a library that does not re-optimize its callees"))
    return pm


class GlueCompiler(CompilerBase):
    """Numba's nopython pipeline, lowering into a ``GlueLibrary``: ``@njit(pipeline_class=GlueCompiler)``."""

    def define_pipelines(self):
        pm = glue_pipeline(self.state)
        pm.finalize()
        return [pm]
