"""Kernels chosen by the CPU Numba compiles for (``ops._simd.target_features``), and onnxruntime's MatMulNBits as an
AVX2-only host computes it: its outputs were recorded by onnxruntime 1.32 under QEMU's emulation of a Haswell CPU
on two intra-op threads (``python -m tools.emulated_host --nodes --threads 2 --golden
fixtures/golden/matmulnbits_haswell.npz``), and this runtime, compiled for that CPU in a subprocess
(``NUMBA_CPU_NAME=haswell``, ``NUMBA_CPU_FEATURES``) and following the recorded thread count
(``ONNX_NUMBA_ORT_THREADS``), gives the same bits on every case it runs in MLAS's AVX2 order there."""
import os
import subprocess
import sys

import llvmlite.binding as llb
import numba
import pytest

from ops import _simd
from tools.emulated_host import CPUS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "fixtures", "golden", "matmulnbits_haswell.npz")


def test_the_listed_features_are_the_target_s(monkeypatch):
    monkeypatch.setattr(numba.config, "CPU_FEATURES", "+avx2, -avx512f,+fma")
    assert _simd.target_features() == {"avx2": True, "avx512f": False, "fma": True}
    monkeypatch.setattr(numba.config, "CPU_FEATURES", "")  # a portable cache: no features
    assert _simd.target_features() == {}
    monkeypatch.setattr(numba.config, "CPU_FEATURES", None)  # the host's
    assert _simd.target_features().get("avx2") == _simd.AVX2


_CHILD = r"""
import runtime
import sys
import numpy as np
from ops import _simd, _common, linear_attention
from ops import contrib_quant as Q
from tools.emulated_host import nbits_cases
assert _simd.AVX2 and not _simd.AVX512 and not _simd.AVX512F and not _simd.VNNI, "not an AVX2-only target"
assert _common.mlas_order() and linear_attention.mlas_kind() == linear_attention.MLAS_PORTABLE
golden = np.load(sys.argv[1])
checked = differ = 0
for i, (desc, model, feeds) in enumerate(nbits_cases()):
    kv = dict(x.split("=") for x in desc.split()[1:])
    if Q.mlas_path(int(kv["block"]), int(kv["bits"]), kv["level"] == "4") == 0:
        continue
    got = runtime.InferenceSession(model).run(None, feeds)[0]
    checked += 1
    if not np.array_equal(got, golden[f"case{i:03d}"]):
        differ += 1
        print("differs:", desc)
print("checked", checked, "differ", differ)
"""


@pytest.mark.skipif(not llb.get_host_cpu_features().get("avx2", False),
                    reason="code compiled for Haswell runs AVX2 instructions, which this host lacks")
def test_an_avx2_target_gives_onnxruntime_s_avx2_bits(tmp_path):
    llvm_cpu, features = CPUS["Haswell"]
    import numpy as np
    env = dict(os.environ, NUMBA_CPU_NAME=llvm_cpu, NUMBA_CPU_FEATURES=features, ONNX_NUMBA_MLAS_ORDER="",
               ONNX_NUMBA_ORT_THREADS=str(int(np.load(GOLDEN)["ort_threads"])),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _CHILD, GOLDEN], env=env, cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1].split()
    checked, differ = int(last[1]), int(last[3])
    assert checked == 128 and differ == 0, r.stdout  # every case of the sweep is in MLAS's AVX2 order there
