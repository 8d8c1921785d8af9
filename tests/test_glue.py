"""The glue pipeline (ops/_glue.py): a driver compiled by it computes what the default pipeline computes, and
the kernels linked into it are not run through LLVM's full module pipeline a second time."""
import numpy as np
from numba import njit

from ops._glue import GlueCompiler, GlueLibrary


@njit(cache=False)
def _kernel(x, out):
    for i in range(x.size):
        out[i] = np.float32(np.sqrt(abs(x[i]))) * np.float32(1.5) + x[i]


def _driver(x):
    out = np.empty_like(x)
    _kernel(x, out)
    s = np.float32(0.0)
    for i in range(out.size):  # the driver's own loop, optimized with its own module
        s += out[i]
    return out, s


_glue = njit(cache=False, pipeline_class=GlueCompiler)(_driver)
_plain = njit(cache=False)(_driver)


def test_a_glue_driver_gives_the_default_pipelines_bits():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    (a, sa), (b, sb) = _glue(x), _plain(x)
    np.testing.assert_array_equal(a, b)
    assert sa == sb
    (lib,) = [cr.library for cr in _glue.overloads.values()]
    assert isinstance(lib, GlueLibrary)


def test_the_linked_kernels_get_no_second_full_optimization(monkeypatch):
    """Numba's full module pass runs over a default-pipeline driver with its kernel linked in, never over a
    glue driver's."""
    from numba.core.codegen import CPUCodeLibrary
    full = []
    base = CPUCodeLibrary._optimize_final_module

    def spy(self):
        full.append(type(self).__name__)
        return base(self)

    monkeypatch.setattr(CPUCodeLibrary, "_optimize_final_module", spy)
    x = np.ones(4, np.float32)
    njit(cache=False)(_driver)(x)
    assert "JITCodeLibrary" in full
    del full[:]
    njit(cache=False, pipeline_class=GlueCompiler)(_driver)(x)
    assert "GlueLibrary" not in full


def _scale_shift(x, s, t):
    y = x * s  # two array expressions: Numba compiles each one's loop body into a library of its own
    return y + t


def test_a_glue_functions_array_expressions_are_inlined_into_it():
    """The loop body of an array expression is the function's own code: optimized with it, so the compiled loop
    makes no call per element, and the bits are the default pipeline's."""
    import re
    glue = njit(cache=False, pipeline_class=GlueCompiler)(_scale_shift)
    x = np.random.default_rng(1).standard_normal((3, 5, 7)).astype(np.float32)
    np.testing.assert_array_equal(glue(x, np.float32(0.75), np.float32(-2.0)),
                                  njit(cache=False)(_scale_shift)(x, np.float32(0.75), np.float32(-2.0)))
    (lib,) = [cr.library for cr in glue.overloads.values()]
    assert not re.search(r"call [^\n]*__numba_array_expr", lib.get_llvm_str())
