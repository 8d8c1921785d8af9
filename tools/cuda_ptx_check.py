"""Compile every CUDA kernel the CUDA tests launch for a real GPU, without a GPU.

The CUDA simulator runs a kernel as Python, so a kernel that Numba cannot type or compile for a device (a
function the device lacks, types that do not unify, a Python object in device code) passes every simulated
test and fails only on a GPU.  This tool closes that gap on a machine without one:

1. it runs the given tests under the simulator with a pytest plugin (this module) that records each kernel
   launched from the host and the Numba types of its arguments (as a GPU launch would type them);
2. in a fresh process on the real CUDA target (no driver is needed to compile), it compiles each recorded
   (kernel, signature) to PTX for the given compute capability with NVVM, device functions included, and
   prints every failure with Numba's message.

NVVM comes with CUDA, or with the ``nvidia-cuda-nvcc-cu12`` and ``nvidia-cuda-nvrtc-cu12`` wheels (point
``--cuda-home`` at the ``nvidia`` folder they install).  Exit status 0 only when every signature compiles.

    python -m tools.cuda_ptx_check [--cc 9.0] [--cuda-home DIR] [TEST_PATH ...]

Kernels made inside a function (a closure) cannot be found again by name in the second process; they are
counted and listed, not compiled.
"""
from __future__ import annotations

import argparse
import glob
import importlib
import os
import pickle
import re
import subprocess
import sys
import tempfile

RECORD_ENV = "ONNX_NUMBA_PTX_RECORD"  # the folder the plugin writes its records to
DEFAULT_TESTS = ("tests/test_cuda_kernels.py", "tests/test_cuda_ops_misc.py", "tests/test_cuda_contrib.py",
                 "tests/test_cuda_fusions.py", "tests/test_cuda_session.py", "tests/test_cuda_decoder.py")


# -- 1. the recording plugin (loaded by pytest with -p tools.cuda_ptx_check) -------------------------------

_seen: set = set()


def _numba_type(a):
    import numba
    ary = getattr(a, "_ary", None)  # the simulator's device array wraps a numpy array
    return numba.typeof(ary if ary is not None else a)


def _recording(call):
    """The simulator's kernel call, recording each launch from the host (device-function calls are not)."""
    import numba.cuda.simulator.kernel as sim

    def launch(self, *args):
        if not self._device and not sim._kernel_context:
            fn = self.fn
            try:
                _seen.add((fn.__module__, fn.__qualname__, tuple(_numba_type(a) for a in args)))
            except Exception as exc:  # pragma: no cover - an argument Numba cannot type fails on a GPU too
                _seen.add((fn.__module__, fn.__qualname__, ("untyped", repr(exc))))
        return call(self, *args)
    return launch


def pytest_configure(config):
    if os.environ.get(RECORD_ENV):
        from runtime import cuda as rc
        rc.load()  # the simulator (the tool sets NUMBA_ENABLE_CUDASIM)
        from numba.cuda.simulator.kernel import FakeCUDAKernel
        FakeCUDAKernel.__call__ = _recording(FakeCUDAKernel.__call__)


def pytest_unconfigure(config):
    folder = os.environ.get(RECORD_ENV)
    if folder and _seen:
        with open(os.path.join(folder, f"launches-{os.getpid()}.pkl"), "wb") as f:
            pickle.dump(sorted(_seen, key=repr), f)


# -- 2. compiling what was recorded ----------------------------------------------------------------------

def _kernel_function(module: str, qualname: str):
    """The Python function of the kernel ``module.qualname``, or None when it is not reachable by name."""
    if "<locals>" in qualname:
        return None
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    d = getattr(obj, "dispatcher", obj)
    return getattr(d, "py_func", None)


def compile_all(records, cc) -> int:
    """Compile each record to PTX for ``cc``; print failures and a summary; the number of failures."""
    import types as pytypes

    import numba.cuda.dispatcher as ndisp
    from numba import cuda
    # Device functions compile for the current device's capability; without a driver there is none.
    ndisp.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=cc)
    failed, unreachable, done = [], set(), 0
    for module, qualname, sig in records:
        if sig and sig[0] == "untyped":
            failed.append((module, qualname, sig, sig[1]))
            continue
        fn = _kernel_function(module, qualname)
        if fn is None:
            unreachable.add(f"{module}.{qualname}")
            continue
        try:
            cuda.compile_ptx(fn, sig, cc=cc)
            done += 1
        except Exception as exc:
            failed.append((module, qualname, sig, f"{type(exc).__name__}: {exc}"))
    for module, qualname, sig, why in failed:
        lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", why).splitlines() if ln.strip()]
        print(f"FAILED {module}.{qualname}{tuple(str(t) for t in sig)}")
        for ln in lines[:8]:
            print(f"  {ln[:300]}")
    if unreachable:
        print(f"not reachable by name (made inside a function), not compiled: {', '.join(sorted(unreachable))}")
    kernels = len({(m, q) for m, q, _ in records})
    print(f"{done} kernel signatures compiled to PTX for sm_{cc[0]}{cc[1]} ({kernels} kernels), {len(failed)} failed, "
          f"{len(unreachable)} kernels not reachable")
    return len(failed)


def _nvvm_env(cuda_home):
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if cuda_home:
        libs = [d for pat in ("cuda_nvrtc/lib", "cuda_nvcc/nvvm/lib64") for d in glob.glob(os.path.join(cuda_home, pat))]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [env.get("LD_LIBRARY_PATH", "")])
        nvcc = os.path.join(cuda_home, "cuda_nvcc")
        env["CUDA_HOME"] = nvcc if os.path.isdir(nvcc) else cuda_home
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tests", nargs="*", default=list(DEFAULT_TESTS), help="test paths to record launches from")
    ap.add_argument("--cc", default="9.0", help="compute capability to compile for (default 9.0)")
    ap.add_argument("--cuda-home", help="a CUDA install, or the 'nvidia' folder of the nvcc and nvrtc wheels")
    ap.add_argument("--compile", help=argparse.SUPPRESS)  # the second process: a records file to compile
    a = ap.parse_args(argv)
    cc = tuple(int(x) for x in a.cc.split("."))
    if a.compile:
        with open(a.compile, "rb") as f:
            return 1 if compile_all(pickle.load(f), cc) else 0
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", **{RECORD_ENV: folder})
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "tools.cuda_ptx_check", "-p",
                              "no:cacheprovider", *a.tests], env=env)
        if rc not in (0, 1):
            print(f"the tests could not run (pytest exit status {rc})")
            return 2
        records = set()
        for path in glob.glob(os.path.join(folder, "launches-*.pkl")):
            with open(path, "rb") as f:
                records.update(pickle.load(f))
        path = os.path.join(folder, "all.pkl")
        with open(path, "wb") as f:
            pickle.dump(sorted(records, key=repr), f)
        return subprocess.call([sys.executable, "-m", "tools.cuda_ptx_check", "--compile", path, "--cc", a.cc],
                               env=_nvvm_env(a.cuda_home))


if __name__ == "__main__":
    sys.exit(main())
