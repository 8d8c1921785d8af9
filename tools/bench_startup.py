"""Cold and warm start of a session on the mlp_block fixture.

    python -m tools.bench_startup [--hidden 64]

Each start runs in a fresh Python process: import (of the runtime and every
kernel module; Numba compiles lazily), session build, first run (compiles
or loads each kernel the model uses), second run.
"Cold" points NUMBA_CACHE_DIR at an empty folder, so every kernel compiles;
"warm" runs again with that folder filled, so kernels load from the cache.
onnxruntime's start in the same kind of process is printed alongside.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
which, hidden = sys.argv[1], int(sys.argv[2])
from fixtures import mlp_block
if which == "native":
    from runtime import InferenceSession
else:
    import onnxruntime as ort
model = mlp_block.build(hidden)
feeds = mlp_block.inputs(2, 8, hidden)
t1 = time.perf_counter()
if which == "native":
    s = InferenceSession(model)
else:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
t2 = time.perf_counter()
s.run(None, feeds)
t3 = time.perf_counter()
s.run(None, feeds)
t4 = time.perf_counter()
print(json.dumps({"import_ms": 1e3 * (t1 - t0), "build_ms": 1e3 * (t2 - t1), "first_run_ms": 1e3 * (t3 - t2),
                  "second_run_ms": 1e3 * (t4 - t3)}))
"""


def _start(which, hidden, env):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _CHILD, which, str(hidden)], cwd=root, env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=64)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        rows = [("native cold (empty cache)", _start("native", args.hidden, env)),
                ("native warm (cache filled)", _start("native", args.hidden, env)),
                ("onnxruntime", _start("ort", args.hidden, env))]
    print(f"session start on fixture mlp_block (hidden={args.hidden}), each in a fresh process")
    print(f"  {'':28s} {'import':>9s} {'build':>9s} {'1st run':>9s} {'2nd run':>9s}  (ms)")
    for name, r in rows:
        print(f"  {name:28s} {r['import_ms']:9.1f} {r['build_ms']:9.1f} {r['first_run_ms']:9.1f} "
              f"{r['second_run_ms']:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
