"""Per-node executor overhead on a chain of small Adds, native against onnxruntime in one run.

    python -m tools.bench_dispatch [--nodes 1000] [--size 4] [--runs 200]

The model is y = ((x + c) + c) + ... with ``--nodes`` Add nodes on tensors of
``--size`` float32 elements, so the run time is almost all per-node overhead.
Both runtimes use one thread and no graph optimizations that would remove
the Adds.  Prints the median microseconds per node of each and their ratio;
``--no-segments`` measures the executor's generic per-node dispatch path.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from onnx import TensorProto, helper

from tools._timing import median_seconds


def chain_model(nodes: int, size: int):
    ns, prev = [], "x"
    for i in range(nodes):
        ns.append(helper.make_node("Add", [prev, "c"], [f"y{i}"]))
        prev = f"y{i}"
    g = helper.make_graph(ns, "add_chain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size]),
                           helper.make_tensor_value_info("c", TensorProto.FLOAT, [size])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [size])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def median_s(fn, runs):
    return median_seconds(fn, runs, warmup=10)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--size", type=int, default=4)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--no-segments", action="store_true", help="disable fused elementwise segments")
    args = ap.parse_args(argv)

    import onnxruntime as ort
    from runtime import InferenceSession, SessionOptions

    model = chain_model(args.nodes, args.size)
    feeds = {"x": np.ones(args.size, np.float32), "c": np.full(args.size, 0.5, np.float32)}
    opts = SessionOptions()
    opts.fused_segments = not args.no_segments
    native = InferenceSession(model, opts)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    rt = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    a = native.run(None, feeds)[0]
    b = rt.run(None, feeds)[0]
    np.testing.assert_allclose(a, b, rtol=1e-6)
    t_nat = median_s(lambda: native.run(None, feeds), args.runs)
    t_ort = median_s(lambda: rt.run(None, feeds), args.runs)
    us_nat = t_nat / args.nodes * 1e6
    us_ort = t_ort / args.nodes * 1e6
    mode = "generic dispatch" if args.no_segments else "default plan"
    print(f"chain of {args.nodes} Adds on {args.size} float32 elements, median of {args.runs} runs ({mode})")
    print(f"  native      {us_nat:.3f} us/node")
    print(f"  onnxruntime {us_ort:.3f} us/node")
    print(f"  ratio native/onnxruntime {us_nat / us_ort:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
