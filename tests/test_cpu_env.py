"""runtime.cpu_env: the process defaults applied before numpy and Numba load."""
import os
import subprocess
import sys

import pytest

from runtime import cpu_env

_ZEN5 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nflags\t\t: fpu sse avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n"


def test_blas_coretype_names_avx512_set_only_for_amd_with_all_four_extensions():
    assert cpu_env.blas_coretype(_ZEN5) == "SKYLAKEX"
    assert cpu_env.blas_coretype(_ZEN5.replace(" avx512vl", "")) is None        # no VL: the AVX2 set is right
    assert cpu_env.blas_coretype(_ZEN5.replace("AuthenticAMD", "GenuineIntel")) is None  # OpenBLAS knows these
    assert cpu_env.blas_coretype("") is None


def test_apply_keeps_the_users_value_and_never_acts_after_numpy(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(_ZEN5)
    env = {}
    cpu_env.apply(env, {}, str(info))
    assert env == {"GOMP_SPINCOUNT": "10000", "OPENBLAS_THREAD_TIMEOUT": "16", "OPENBLAS_CORETYPE": "SKYLAKEX"}
    env = {"OPENBLAS_CORETYPE": "HASWELL", "OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "28"}
    cpu_env.apply(env, {}, str(info))
    assert env == {"OPENBLAS_CORETYPE": "HASWELL", "OMP_WAIT_POLICY": "PASSIVE",
                   "OPENBLAS_THREAD_TIMEOUT": "28"}  # the user's policy decides
    env = {"GOMP_SPINCOUNT": "0"}
    cpu_env.apply(env, {}, str(info))
    assert env["GOMP_SPINCOUNT"] == "0"
    env = {}
    cpu_env.apply(env, {"numpy": object()}, str(info))
    assert "OPENBLAS_CORETYPE" not in env and "OPENBLAS_THREAD_TIMEOUT" not in env
    env = {}
    cpu_env.apply(env, {}, str(tmp_path / "missing"))
    assert env == {"GOMP_SPINCOUNT": "10000", "OPENBLAS_THREAD_TIMEOUT": "16"}


@pytest.mark.parametrize("entry", ["import runtime", "import ops", "import tools", "import pipeline.__main__"])
def test_every_entry_point_applies_it_before_numpy_loads(entry):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_THREAD_TIMEOUT")}
    code = (f"import sys, os; {entry}; from runtime import cpu_env;"
            "print(cpu_env.NUMPY_FIRST, 'numpy' in sys.modules,"
            " os.environ.get('OPENBLAS_CORETYPE') == cpu_env.blas_coretype(open('/proc/cpuinfo').read(1 << 16)),"
            " os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OPENBLAS_THREAD_TIMEOUT'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout.split()
    assert out == ["False", "True", "True", "10000", "16"]


def test_keep_heap_leaves_a_users_malloc_settings_alone():
    assert cpu_env.keep_heap({"MALLOC_ARENA_MAX": "2"}) is False


def test_keep_heap_serves_a_large_array_from_the_heap():
    """A 64 MB array, freed and allocated again: with the allocator keeping its memory it comes from the heap
    (glibc's mallinfo2 counts no bytes in mmap'd blocks), so it is reused, not faulted in anew; with the
    settings left to the user (a MALLOC_ variable set) glibc maps it on its own."""
    code = ("import ctypes, runtime, numpy as np\n"
            "libc = ctypes.CDLL(None)\n"
            "word = ctypes.c_size_t if hasattr(libc, 'mallinfo2') else ctypes.c_int  # glibc before 2.33\n"
            "class M(ctypes.Structure):\n"
            "    _fields_ = [(n, word) for n in ('arena ordblks smblks hblks hblkhd usmblks fsmblks '\n"
            "                                    'uordblks fordblks keepcost').split()]\n"
            "f = getattr(libc, 'mallinfo2', None) or libc.mallinfo; f.restype = M\n"
            "a = np.ones(1 << 24, np.float32); del a\n"
            "a = np.ones(1 << 24, np.float32)\n"
            "print(f().hblkhd >> 20)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def mapped_mb(**extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env.update(extra)
        return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                  check=True, cwd=root).stdout)

    assert mapped_mb() < 64
    assert mapped_mb(MALLOC_ARENA_MAX="8") >= 64
