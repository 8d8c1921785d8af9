"""Benchmark hot kernels natively and on onnxruntime, against the machine's measured memory bandwidth.

Each case is a one-node model (weights as initializers, as in a real model) run through
``runtime.InferenceSession`` and ``onnxruntime.InferenceSession`` in the same process.  For each side
the script reports the warm-up separately (session creation, then the first run, which for the native
side includes Numba compilation or cache loading) and the steady state (median and best of N runs).
It prints the native/ORT ratio of the medians and the bandwidth each side reaches, in GB/s of the
bytes the op must touch, next to the copy bandwidth measured here with a large numpy copy.  Ops that
have no native kernel yet are skipped with a message saying so.

All native measurements run before onnxruntime is imported and its sessions exist, so that its
intra-op thread pool (whose idle threads spin) cannot steal cores from the native kernels.  On a
shared or loaded machine ``parallel=True`` kernels suffer most (a parallel region waits for its
slowest thread), so compare the 'best' column too and rerun on an idle machine for real numbers.

Usage: ``python tools/bench_kernels.py [--quick] [--runs N] [--threads N] [--only NAME ...]``
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def _early_threads(argv) -> int | None:
    # Thread pools (OpenBLAS, OpenMP, Numba) read their size when first loaded: set it before numpy.
    for i, a in enumerate(argv):
        if a.startswith("--threads"):
            v = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
            if v.isdigit():
                for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
                    os.environ[k] = v
                return int(v)
    return None


_THREADS = _early_threads(sys.argv[1:])

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from ops import registry  # noqa: E402
from runtime import InferenceSession  # noqa: E402
from runtime.errors import UnsupportedOpError  # noqa: E402

OPSET = 17


def measure_bandwidth(nbytes: int, runs: int = 5) -> float:
    """Copy bandwidth in GB/s (bytes read + written), best of ``runs`` large numpy copies."""
    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def one_node(op_type, inputs: dict, inits: dict, **attrs):
    node = helper.make_node(op_type, list(inputs) + list(inits), ["y"], **attrs)
    g = helper.make_graph(
        [node], op_type.lower(),
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    return m.SerializeToString()


def cases(quick: bool, rng):
    """(name, op_type, feeds, inits, attrs, bytes touched, flops or 0)."""
    f32 = np.float32
    if quick:
        k, n, m, rows_sm, rows_ln, vocab, dim = 1024, 1024, 32, 8, 64, 4000, 1024
    else:
        k, n, m, rows_sm, rows_ln, vocab, dim = 4096, 4096, 128, 64, 512, 32000, 4096
    w = (rng.standard_normal((k, n)) / 64).astype(f32)
    out = []
    x1 = rng.standard_normal((1, k)).astype(f32)
    out.append((f"MatMul GEMV 1x{k}x{n}", "MatMul", {"x": x1}, {"w": w}, {},
                w.nbytes + x1.nbytes + 4 * n, 2 * k * n))
    xm = rng.standard_normal((m, k)).astype(f32)
    out.append((f"MatMul GEMM {m}x{k}x{n}", "MatMul", {"x": xm}, {"w": w}, {},
                w.nbytes + xm.nbytes + 4 * m * n, 2 * m * k * n))
    xs = rng.standard_normal((rows_sm, 32768)).astype(f32)
    out.append((f"Softmax {rows_sm}x32768", "Softmax", {"x": xs}, {}, {"axis": -1}, 2 * xs.nbytes, 0))
    xl = rng.standard_normal((rows_ln, 4096)).astype(f32)
    out.append((f"LayerNorm {rows_ln}x4096", "LayerNormalization", {"x": xl},
                {"g": np.ones(4096, f32), "b": np.zeros(4096, f32)}, {"axis": -1, "epsilon": 1e-5},
                2 * xl.nbytes + 2 * 4096 * 4, 0))
    table = rng.standard_normal((vocab, dim)).astype(f32)
    ids = rng.integers(0, vocab, (1, 128)).astype(np.int64)
    # Input order matters for Gather: data first, then indices.
    out.append((f"Gather {vocab}x{dim}[128]", "Gather", {"ids": ids}, {"table": table}, {"axis": 0},
                2 * 128 * dim * 4 + ids.nbytes, 0))
    return out


def gather_model(feeds, inits, attrs):
    node = helper.make_node("Gather", ["table", "ids"], ["y"], **attrs)
    g = helper.make_graph(
        [node], "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, list(feeds["ids"].shape))],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(inits["table"], "table")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    return m.SerializeToString()


def time_side(make, feeds, runs: int):
    """(create s, first run s, median s, best s, output) for one session kind."""
    t0 = time.perf_counter()
    sess = make()
    t_create = time.perf_counter() - t0
    t0 = time.perf_counter()
    y = sess.run(None, feeds)[0]
    t_first = time.perf_counter() - t0
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        ts.append(time.perf_counter() - t0)
    return t_create, t_first, float(np.median(ts)), float(min(ts)), y


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller shapes and fewer runs")
    ap.add_argument("--runs", type=int, default=None, help="steady-state runs per side (default 20, quick 5)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for both sides (Numba, OpenBLAS, onnxruntime intra-op); default: all cores")
    ap.add_argument("--only", nargs="*", default=None, help="run only cases whose name contains one of these")
    args = ap.parse_args(argv)
    runs = args.runs or (5 if args.quick else 20)
    rng = np.random.default_rng(0)

    import numba
    bw = measure_bandwidth((64 if args.quick else 512) * 2**20)
    print(f"machine: {os.cpu_count()} CPUs, numba threads {numba.get_num_threads()}")
    print(f"measured copy bandwidth: {bw:.1f} GB/s (numpy copy, read + write)\n")

    todo = []
    for name, op_type, feeds, inits, attrs, nbytes, flops in cases(args.quick, rng):
        if args.only and not any(s.lower() in name.lower() for s in args.only):
            continue
        if registry.resolve("", op_type, OPSET) is None:
            print(f"{name:<28} skipped: no native kernel for {op_type} (opset {OPSET}) is registered yet")
            continue
        model = gather_model(feeds, inits, attrs) if op_type == "Gather" else one_node(op_type, feeds, inits, **attrs)
        try:
            nat = time_side(lambda: InferenceSession(model, providers=["CPUExecutionProvider"]), feeds, runs)
        except UnsupportedOpError as e:
            print(f"{name:<28} skipped: {str(e).splitlines()[0]}")
            continue
        except Exception as e:  # a kernel still under construction must not stop the other cases
            print(f"{name:<28} native failed: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        todo.append((name, model, feeds, nbytes, flops, nat))

    import onnxruntime as ort  # only now: see the module docstring
    print(f"onnxruntime {ort.__version__}\n")
    so = ort.SessionOptions()
    if args.threads:
        so.intra_op_num_threads = args.threads
    hdr = (f"{'case':<28} {'side':<6} {'create ms':>9} {'first ms':>9} {'median ms':>10} {'best ms':>8} "
           f"{'GB/s':>7} {'%bw':>5} {'GFLOP/s':>8}")
    print(hdr)
    print("-" * len(hdr))
    summary = []
    for name, model, feeds, nbytes, flops, nat in todo:
        res = {"native": nat,
               "ort": time_side(lambda: ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]),
                                feeds, runs)}
        for side in ("native", "ort"):
            c, f, med, best, _ = res[side]
            gbs = nbytes / med / 1e9
            gfl = f"{flops / med / 1e9:8.1f}" if flops else f"{'':>8}"
            print(f"{name if side == 'native' else '':<28} {side:<6} {c * 1e3:9.1f} {f * 1e3:9.1f} "
                  f"{med * 1e3:10.3f} {best * 1e3:8.3f} {gbs:7.1f} {100 * gbs / bw:5.0f} {gfl}")
        yn, yo = res["native"][4], res["ort"][4]
        err = float(np.max(np.abs(yn.astype(np.float64) - yo.astype(np.float64)))) if yn.shape == yo.shape else None
        ratio = res["native"][2] / res["ort"][2]
        summary.append((name, ratio))
        print(f"{'':<28} native/ORT median ratio {ratio:.2f}x"
              + (f", max |diff| {err:.2e}" if err is not None else ", OUTPUT SHAPES DIFFER"))
    if summary:
        print("\nsummary (native/ORT median time; < 1 means native is faster; warm-up is in 'create'/'first'):")
        for name, ratio in summary:
            print(f"  {name:<28} {ratio:6.2f}x")


if __name__ == "__main__":
    main()
