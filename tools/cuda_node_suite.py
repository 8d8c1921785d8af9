"""The official ONNX node suite on the CUDA provider: how far the provider reaches, measured.

    python -m tools.cuda_node_suite [--only REGEX] [--skip REGEX] [--json FILE] [--timeout S] [--top N] [--shard K/N]

Every node case of onnx's backend suite that the CPU suite runs (the CPU exclusions of
``tests/backend_exclusions.py`` apply here too) is loaded with ``providers=["CUDAExecutionProvider"]`` and no
``cuda_cpu_ops``, so a node without a CUDA kernel fails the load (``UnsupportedOpError``) instead of running on
the CPU.  Each case ends in one of:

- ``pass``: every output equals the suite's expected data within the suite's own tolerances (rtol 1e-3,
  atol 1e-7, or the case's);
- ``host``: passes, and no device kernel ran: every node ran on the host as shape computation (int/bool tensors
  only, as onnxruntime's CUDA provider keeps them on the CPU) or was folded away at load;
- ``unsupported``: the load names a node without a CUDA kernel (the op is tallied);
- ``refused``: a CUDA kernel refused the configuration when it was planned or ran (``InvalidArgumentError``: an
  axis, dtype or mode the kernel does not take);
- ``mismatch``: ran, and an output differs from the expected data;
- ``error``: any other exception (a defect);
- ``timeout``: the case ran longer than ``--timeout`` seconds (the simulator runs every GPU thread in Python).
  An interrupted simulated launch leaves its threads behind, so the run stops there and the cases left are
  reported as not run; no timeout is set unless asked for.

Without a GPU the simulator is switched on (``NUMBA_ENABLE_CUDASIM=1``) before ``numba.cuda`` is imported;
``ONNX_NUMBA_REQUIRE_CUDA=1`` makes a missing target an error.  Prints the counts, the ops that most often stop a
case, and the failing cases; ``--json`` writes every case's outcome.
"""
from __future__ import annotations

import runtime.cpu_env  # noqa: F401,I001  (before numpy)

import argparse
import collections
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

__all__ = ["run_case", "main", "OUTCOMES"]

OUTCOMES = ("pass", "host", "unsupported", "refused", "mismatch", "error", "timeout")
RTOL, ATOL = 1e-3, 1e-7


def _exclusions():
    tests = Path(__file__).resolve().parent.parent / "tests"
    sys.path.insert(0, str(tests))
    try:
        from backend_exclusions import EXCLUDED
    finally:
        sys.path.remove(str(tests))
    return [re.compile(p) for p in EXCLUDED]


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _compare(expected, got, rtol, atol) -> str | None:
    import numpy as np
    if len(expected) != len(got):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, got)):
        if isinstance(e, list) or isinstance(g, list):
            if not isinstance(e, list) or not isinstance(g, list) or len(e) != len(g):
                return f"output {i}: sequence mismatch"
            sub = _compare(e, g, rtol, atol)
            if sub:
                return f"output {i}: {sub}"
            continue
        e, g = np.asarray(e), np.asarray(g)
        if e.dtype != g.dtype and not (e.dtype.kind == g.dtype.kind == "U"):
            return f"output {i}: dtype {g.dtype}, expected {e.dtype}"
        if e.shape != g.shape:
            return f"output {i}: shape {g.shape}, expected {e.shape}"
        if e.dtype.kind in "fc":
            if not np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
                return f"output {i}: max abs diff {float(np.nanmax(np.abs(g.astype(np.float64) - e))):.3g}"
        elif not np.array_equal(g, e):
            return f"output {i}: values differ"
    return None


def _timed_out(e: BaseException) -> bool:
    while e is not None:
        if isinstance(e, _Timeout):
            return True
        e = e.__cause__ or e.__context__
    return False


def run_case(case, timeout: float | None = None) -> tuple[str, str]:
    """(outcome, detail) of one ``onnx.backend.test`` node case on the CUDA provider."""
    from runtime import InferenceSession
    from runtime.cuda_plan import CUDA
    from runtime.errors import InvalidArgumentError, UnsupportedOpError

    model, sets = case.model, case.data_sets or []
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout or 0)
    try:
        try:
            sess = InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
        except InvalidArgumentError as e:
            return "refused", f"{type(e).__name__}: {str(e).splitlines()[0]}"
        except UnsupportedOpError as e:
            nodes = getattr(e, "nodes", None) or []
            return "unsupported", " ".join(sorted({f"{d or 'ai.onnx'}::{o}-{v}" for _, o, d, v in nodes})) or str(e)
        names = [i.name for i in sess.get_inputs()]
        for feeds, expected in sets:
            feeds, expected = [_array(a) for a in feeds], [_array(a) for a in expected]
            try:
                got = sess.run(None, dict(zip(names, feeds)))
            except InvalidArgumentError as e:
                return "refused", f"{type(e).__name__}: {str(e).splitlines()[0]}"
            bad = _compare(expected, got, case.rtol or RTOL, case.atol or ATOL)
            if bad:
                return "mismatch", bad
        if not any(p == CUDA for p in sess.get_placement().values()):
            return "host", ""  # every node on the host, or folded away at load
        return "pass", ""
    except _Timeout:
        return "timeout", f"over {timeout:g} s"
    except Exception as e:  # noqa: BLE001  (every other outcome is a defect to report)
        if _timed_out(e):
            return "timeout", f"over {timeout:g} s"
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _array(a):
    """A data-set entry as numpy: ``TensorProto`` (dtypes numpy lacks), sequences and optionals converted."""
    from onnx import OptionalProto, SequenceProto, TensorProto, numpy_helper
    if isinstance(a, TensorProto):
        return numpy_helper.to_array(a)
    if isinstance(a, SequenceProto):
        return numpy_helper.to_list(a)
    if isinstance(a, OptionalProto):
        return numpy_helper.to_optional(a)
    if isinstance(a, list):
        return [_array(e) for e in a]
    return a


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="run the cases whose name matches this regular expression")
    ap.add_argument("--json", help="write every case's outcome here")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per case; the first case past it ends the run (default: none)")
    ap.add_argument("--skip", help="leave out the cases whose name matches this regular expression")
    ap.add_argument("--top", type=int, default=40, help="ops to list among the unsupported (default 40)")
    ap.add_argument("--shard", default="1/1", help="K/N: run every N-th case from the K-th (processes in parallel)")
    args = ap.parse_args(argv)

    from runtime import cuda as rc
    if rc.SIM_ENV not in os.environ and not rc.gpu_present():
        os.environ[rc.SIM_ENV] = "1"
    reason = rc.unavailable_reason()
    if reason:
        rc.require_cuda()
        print(f"no CUDA target: {reason}")
        return 2
    from onnx.backend.test.loader import load_node_model_tests

    excluded = _exclusions()
    only = re.compile(args.only) if args.only else None
    skip = re.compile(args.skip) if args.skip else None
    cases = sorted({c.name: c for c in load_node_model_tests()}.values(), key=lambda c: c.name)
    cases = [c for c in cases if not any(rx.search(f"{c.name}_cpu") for rx in excluded)
             and (only is None or only.search(c.name)) and (skip is None or not skip.search(c.name))]
    k, n = (int(v) for v in args.shard.split("/"))
    cases = cases[k - 1::n]
    sim = os.environ.get(rc.SIM_ENV) == "1"
    print(f"{len(cases)} node cases on CUDAExecutionProvider ({'simulator' if sim else 'GPU'})", flush=True)
    results, t0 = {}, time.perf_counter()
    for j, c in enumerate(cases, 1):
        t = time.perf_counter()
        results[c.name] = run_case(c, args.timeout)
        if time.perf_counter() - t > 10:
            print(f"  {c.name}: {results[c.name][0]} in {time.perf_counter() - t:.0f} s", flush=True)
        if j % 200 == 0:
            print(f"{j}/{len(cases)} cases, {time.perf_counter() - t0:.0f} s", flush=True)
        if results[c.name][0] == "timeout":
            print(f"{c.name} ran past {args.timeout:g} s: the simulator's threads are left running, so the "
                  f"{len(cases) - j} cases after it are not run", flush=True)
            break
    took = time.perf_counter() - t0
    counts = collections.Counter(o for o, _ in results.values())
    print(f"in {took:.0f} s: " + ", ".join(f"{counts.get(o, 0)} {o}" for o in OUTCOMES)
          + (f", {len(cases) - len(results)} not run" if len(results) < len(cases) else ""))
    ops = collections.Counter()
    for o, d in results.values():
        if o == "unsupported":
            for op in d.split():
                ops[op.split("::")[-1].rsplit("-", 1)[0]] += 1
    if ops:
        print("unsupported, by op: " + ", ".join(f"{k} {v}" for k, v in ops.most_common(args.top)))
    for name, (o, d) in results.items():
        if o in ("refused", "mismatch", "error", "timeout"):
            print(f"  {o:8s} {name}: {d}")
    if args.json:
        Path(args.json).write_text(json.dumps({n: {"outcome": o, "detail": d} for n, (o, d) in results.items()},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
