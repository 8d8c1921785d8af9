"""One GroupQueryAttention node, onnxruntime against the native kernels, at a decoder's shapes.

    python -m tools.bench_attention [--heads 14] [--kv-heads 2] [--head-size 64] [--threads 2]
        [--prompts 64,256,1024] [--past 64,300,1000] [--runs 15]

Prompt steps of each length in ``--prompts`` and one-row steps over each cache length in ``--past``, timed as
medians of interleaved runs (onnxruntime with its spinning off, the native session with its default kernels,
the native session with ``ONNX_NUMBA_MLAS_ORDER=1``), each session's first run (compilation) left out.  Prints
milliseconds and the ratio to onnxruntime, and whether the MLAS-order output equals onnxruntime's bit for bit.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from fixtures.gqa_node import gqa_feeds, gqa_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", default="64,256,1024")
    ap.add_argument("--past", default="64,300,1000")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args(argv)
    import onnxruntime as ort
    import runtime as rt
    m = gqa_model(args.heads, args.kv_heads, args.head_size).SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sessions = {"onnxruntime": ort.InferenceSession(m, so, providers=["CPUExecutionProvider"])}
    saved = os.environ.get("ONNX_NUMBA_MLAS_ORDER")
    for name, value in (("native", "0"), ("native MLAS order", "1")):
        os.environ["ONNX_NUMBA_MLAS_ORDER"] = value  # read when the node is planned
        sessions[name] = rt.InferenceSession(m)
    if saved is None:
        os.environ.pop("ONNX_NUMBA_MLAS_ORDER")
    else:
        os.environ["ONNX_NUMBA_MLAS_ORDER"] = saved
    steps = [(int(s), 0) for s in args.prompts.split(",") if s] + [(1, int(p)) for p in args.past.split(",") if p]
    for S, P in steps:
        nh, kv, D = args.heads, args.kv_heads, args.head_size
        f = gqa_feeds(nh, kv, D, 1, S, P, [P + S - 1], P + S)
        outs = {k: s.run(None, f) for k, s in sessions.items()}
        times = {k: [] for k in sessions}
        for _ in range(args.runs):
            for k, s in sessions.items():
                t = time.perf_counter()
                s.run(None, f)
                times[k].append(time.perf_counter() - t)
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        ref = med["onnxruntime"]
        exact = all(np.array_equal(a, b) for a, b in zip(outs["native MLAS order"], outs["onnxruntime"]))
        cols = "  ".join(f"{k} {v:.3f} ms ({v / ref:.2f}x)" for k, v in med.items() if k != "onnxruntime")
        print(f"{'prompt' if P == 0 else 'one row'} S={S} past={P}: onnxruntime {ref:.3f} ms  {cols}  "
              f"MLAS order bit-exact: {exact}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
