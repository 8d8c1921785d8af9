"""Run a bundled fixture model natively and on onnxruntime, and print the comparison.

    python -m tools.run_fixture [--hidden 64] [--seq 8] [--batch 2] [--runs 20]

Prints, per output, the largest absolute difference native vs onnxruntime and
native vs the closed-form reference, then the median latency of each runtime
(first native run, which includes Numba compilation or cache loading, is
reported separately).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args(argv)

    import onnxruntime as ort
    from fixtures import mlp_block
    from runtime import InferenceSession

    model = mlp_block.build(args.hidden)
    feeds = mlp_block.inputs(args.batch, args.seq, args.hidden)
    ref = mlp_block.reference(feeds["x"], args.hidden)

    t0 = time.perf_counter()
    native = InferenceSession(model)
    t1 = time.perf_counter()
    out_native = native.run(None, feeds)
    t2 = time.perf_counter()
    ort_sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out_ort = ort_sess.run(None, feeds)

    def median_ms(fn):
        fn()
        ts = []
        for _ in range(args.runs):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e3

    names = [o.name for o in native.get_outputs()]
    print(f"fixture mlp_block: batch={args.batch} seq={args.seq} hidden={args.hidden}")
    ok = True
    for name, a, b in zip(names, out_native, out_ort):
        d_ort = float(np.max(np.abs(a - b)))
        d_ref = float(np.max(np.abs(a - ref[name])))
        good = d_ort < 1e-4 and d_ref < 1e-4
        ok &= good
        print(f"  {name:6s} shape={list(a.shape)}  max|native-ort|={d_ort:.2e}  max|native-ref|={d_ref:.2e}"
              f"  {'OK' if good else 'MISMATCH'}")
    nat_ms = median_ms(lambda: native.run(None, feeds))
    ort_ms = median_ms(lambda: ort_sess.run(None, feeds))
    print(f"  session build {1e3 * (t1 - t0):.1f} ms, first run {1e3 * (t2 - t1):.1f} ms (compile or cache load)")
    print(f"  median over {args.runs} runs: native {nat_ms:.3f} ms, onnxruntime {ort_ms:.3f} ms, "
          f"ratio native/ort {nat_ms / ort_ms:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
