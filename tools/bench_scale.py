"""Real model sizes: cold and warm start to the first token, compile time against depth, and memory.

    python -m tools.bench_scale PACKAGE [PACKAGE ...] [--prompt-tokens 8] [--max-length 128] [--json FILE]

For each package, two fresh processes generate one greedy token natively: the first with empty Numba and
region caches (a new ``NUMBA_CACHE_DIR``), the second with the caches the first left.  Each reports the
seconds from its start to the first token, the seconds its first run spent in compiled regions' first calls,
its peak resident memory (VmHWM), its resident file-backed pages after the token (RssFile: code pages of shared
libraries such as LLVM's, which Numba's start-up touches, and mapped package pages) and the bytes of KV cache
the decoder allocated.  A baseline process that
imports the project and loads nothing gives the interpreter's own peak, which the memory figures are taken
above.  The last lines compare each cold compile with the first package's (give packages of one width and
several depths: the ratio shows whether compile time grows with depth) and put each warm peak beside
``1.3 x (package on disk + KV buffers)``.

Speed at real size is ``tools/profile_native --backend both`` on the same packages.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_CHILD = r"""
import json, sys, time
t0 = time.time()
mode, pkg, n_prompt, max_length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
import runtime  # first: the CPU settings numpy reads when it loads
import numpy as np
import ops, runtime, pipeline.runner, pipeline.metadata, pipeline.backends  # the project, loaded
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
def hwm():
    return status("VmHWM")
if mode == "baseline":
    print(json.dumps({"peak_mb": hwm(), "file_mb": status("RssFile")}))
    sys.exit(0)
from pipeline.backends import BackendChoice
from pipeline.metadata import load_package
from pipeline.runner import Pipeline
spec = load_package(pkg)
dec = spec.decoder.name
pipe = Pipeline(spec, BackendChoice({c for c in spec.components if c != dec}, True, "cpu"), max_length)
prompt = [(7 * k + 3) % 200 + 1 for k in range(n_prompt)]
first = next(iter(pipe.tokens(prompt, 1)))
t1 = time.time()
d = pipe.decoder
kv = d.cache.nbytes()
plan = d.session.plan
print(json.dumps({"first_token_s": t1 - t0, "token": int(first), "peak_mb": hwm(), "kv_mb": kv / 2**20,
                  "compile_s": sum(plan.compile_seconds.values()), "file_mb": status("RssFile"), "kinds": len({r.module_name for r in plan.regions}),
                  "regions": len(plan.regions), "nodes": len(plan.graph.nodes)}))
"""


def _child(mode, pkg, env, n_prompt, max_length):
    t = time.time()
    r = subprocess.run([sys.executable, "-c", _CHILD, mode, pkg, str(n_prompt), str(max_length)], env=env,
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if r.returncode != 0:
        raise SystemExit(f"{mode} run of {pkg} failed:\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.time() - t
    return out


def _disk_mb(pkg):
    return sum(os.path.getsize(os.path.join(pkg, f)) for f in os.listdir(pkg)
               if os.path.isfile(os.path.join(pkg, f))) / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packages", nargs="+")
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    env = dict(os.environ, ONNX_NUMBA_PROGRESS="0")
    env.pop("ONNX_NUMBA_REGION_DIR", None)
    baseline = _child("baseline", "-", env, 0, 0)
    base = baseline["peak_mb"]
    print(f"baseline: the interpreter with the project imported peaks at {base:.0f} MB")
    rows = []
    for pkg in args.packages:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as cache:
            e = dict(env, NUMBA_CACHE_DIR=cache)
            cold = _child("run", pkg, e, args.prompt_tokens, args.max_length)
            warm = _child("run", pkg, e, args.prompt_tokens, args.max_length)
        disk = _disk_mb(pkg)
        row = {"package": pkg, "disk_mb": disk, "cold": cold, "warm": warm}
        rows.append(row)
        budget = 1.3 * (disk + warm["kv_mb"])
        print(f"{os.path.basename(pkg.rstrip('/'))}: {cold['nodes']} nodes in {cold['regions']} region calls of "
              f"{cold['kinds']} kinds; cold first token {cold['first_token_s']:.1f} s (regions' first calls "
              f"{cold['compile_s']:.1f} s), warm first token {warm['first_token_s']:.2f} s; peak above baseline: "
              f"warm {warm['peak_mb'] - base:.0f} MB, cold {cold['peak_mb'] - base:.0f} MB; package {disk:.0f} MB + "
              f"KV {warm['kv_mb']:.1f} MB, x1.3 = {budget:.0f} MB; tokens {cold['token']}/{warm['token']}")
        print(f"  after the warm token, file-backed pages (shared libraries' code, the package's mapped pages) "
              f"above baseline: {warm['file_mb'] - baseline['file_mb']:.0f} MB")
    ref = rows[0]["cold"]["first_token_s"]
    for row in rows[1:]:
        print(f"cold start {os.path.basename(row['package'].rstrip('/'))} / {os.path.basename(rows[0]['package'].rstrip('/'))}: "
              f"{row['cold']['first_token_s'] / ref:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"baseline_mb": base, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
