"""Throughput of one session run from several threads at once, against one thread, natively and on onnxruntime.

Each side gets a session with ``intra_op_num_threads=1``; the model is a few float32 products and activations
(``--size`` square, ``--layers`` deep: MatMul, Add, Relu).  For 1 and ``--threads`` threads the script times ``--runs`` runs per
thread and prints runs per second and the ratio to one thread (ideal: the thread count, on that many idle
cores).  Repeats alternate the two runtimes and the table shows medians; onnxruntime's spinning is off so its
idle threads do not slow the run that follows.

    python -m tools.bench_parallel_runs [--threads 2] [--runs 200] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np
from onnx import TensorProto as T, helper as h, numpy_helper

import runtime


def model(size: int, layers: int):
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for k in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32),
                                             f"w{k}"))
        inits.append(numpy_helper.from_array(rng.standard_normal(size).astype(np.float32), f"b{k}"))
        nodes += [h.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"]), h.make_node("Add", [f"m{k}", f"b{k}"], [f"s{k}"]),
                  h.make_node("Relu", [f"s{k}"], [f"a{k}"])]
        prev = f"a{k}"
    nodes.append(h.make_node("Identity", [prev], ["y"]))
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [size, size])],
                     [h.make_tensor_value_info("y", T.FLOAT, [size, size])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


def throughput(run, nthreads: int, runs: int) -> float:
    start = threading.Barrier(nthreads + 1)

    def work():
        start.wait()
        for _ in range(runs):
            run()

    threads = [threading.Thread(target=work) for _ in range(nthreads)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return nthreads * runs / (time.perf_counter() - t0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args(argv)
    m = model(a.size, a.layers)
    x = np.random.default_rng(1).standard_normal((a.size, a.size)).astype(np.float32)
    so = runtime.SessionOptions()
    so.intra_op_num_threads = 1
    native = runtime.InferenceSession(m, so)
    import onnxruntime as ort
    oso = ort.SessionOptions()
    oso.intra_op_num_threads = 1
    oso.inter_op_num_threads = 1
    oso.add_session_config_entry("session.intra_op.allow_spinning", "0")
    ref = ort.InferenceSession(m, oso, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(native.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    sides = {"native": lambda: native.run(None, {"x": x}), "onnxruntime": lambda: ref.run(None, {"x": x})}
    for run in sides.values():
        throughput(run, a.threads, 20)  # warm-up, and the overlapping runs' buffers
    res = {(s, n): [] for s in sides for n in (1, a.threads)}
    for _ in range(a.repeats):
        for s, run in sides.items():
            for n in (1, a.threads):
                res[(s, n)].append(throughput(run, n, a.runs))
    print(f"{a.layers} x (MatMul {a.size}x{a.size}, Add, Relu), intra_op_num_threads=1, medians of {a.repeats}")
    print(f"{'runtime':<12} {'1 thread runs/s':>16} {f'{a.threads} threads runs/s':>18} {'ratio':>7}")
    for s in sides:
        one, many = statistics.median(res[(s, 1)]), statistics.median(res[(s, a.threads)])
        print(f"{s:<12} {one:16.1f} {many:18.1f} {many / one:7.2f}")


if __name__ == "__main__":
    main()
