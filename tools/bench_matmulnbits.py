"""Benchmark: int4 MatMulNBits decode GEMV, native kernel against onnxruntime.

Shapes 1x4096x4096 (block 32 and 128) and 1x4096x11008 (block 32), each with accuracy_level 0 and 4,
in one run.  Prints median milliseconds, the ratio onnxruntime/native, and the GB/s of packed
bytes (B + scales) each side streams, against the machine's memory bandwidth measured here with a
large numpy copy (bytes read + written).  Both sides run the same one-node model with the weights
as initializers; onnxruntime uses its default thread pool, native its Numba threads.
Each native measurement runs before its onnxruntime session exists (spinning pool threads).

Usage: python tools/bench_matmulnbits.py [--reps 50]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools._timing import median_seconds  # noqa: E402  (needs the path above when run as a script)


def _bandwidth(nbytes=1 << 28, reps=5):
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        ts.append(time.perf_counter() - t)
    return 2 * nbytes / min(ts) / 1e9


def _model(K, N, bs, level, rng):
    from onnx import helper, numpy_helper
    nb = (K + bs - 1) // bs
    B = rng.integers(0, 256, (N, nb, bs // 2), dtype=np.uint8)
    sc = (rng.random(N * nb, dtype=np.float32) * 0.02).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["a", "B", "scales"], ["y"], domain="com.microsoft",
                            K=K, N=N, bits=4, block_size=bs, accuracy_level=level)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 1, [1, K])],
                          [helper.make_tensor_value_info("y", 1, [1, N])],
                          [numpy_helper.from_array(B, "B"), numpy_helper.from_array(sc, "scales")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString(), B.nbytes + sc.nbytes


def _median(fn, reps):
    return median_seconds(fn, reps, warmup=3)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args(argv)
    import onnxruntime as ort
    from runtime import InferenceSession
    bw = _bandwidth()
    print(f"measured memory bandwidth (numpy copy, read+write): {bw:.1f} GB/s")
    rng = np.random.default_rng(0)
    hdr = f"{'shape':<16}{'block':>6}{'level':>6}{'native ms':>11}{'ort ms':>9}{'ort/nat':>9}{'nat GB/s':>10}{'ort GB/s':>10}{'nat %bw':>9}{'max|diff|':>11}"
    print(hdr)
    for K, N, bs in ((4096, 4096, 32), (4096, 4096, 128), (4096, 11008, 32)):
        for level in (0, 4):
            mb, nbytes = _model(K, N, bs, level, rng)
            a = rng.standard_normal((1, K)).astype(np.float32)
            feeds = {"a": a}
            # Native first: onnxruntime's pool threads keep spinning for a while after a run and would
            # steal the cores the Numba threads need; the sessions are also dropped after use.
            ns = InferenceSession(mb)
            got = ns.run(None, feeds)[0]
            tn = _median(lambda: ns.run(None, feeds), args.reps)
            del ns
            rs = ort.InferenceSession(mb, ort.SessionOptions(), providers=["CPUExecutionProvider"])
            ref = rs.run(None, feeds)[0]
            to = _median(lambda: rs.run(None, feeds), args.reps)
            del rs
            time.sleep(0.2)
            diff = float(np.abs(got - ref).max())
            print(f"{f'1x{K}x{N}':<16}{bs:>6}{level:>6}{tn * 1e3:>11.3f}{to * 1e3:>9.3f}{to / tn:>9.2f}"
                  f"{nbytes / tn / 1e9:>10.2f}{nbytes / to / 1e9:>10.2f}{100 * nbytes / tn / 1e9 / bw:>8.0f}%"
                  f"{diff:>11.2e}")


if __name__ == "__main__":
    main()
