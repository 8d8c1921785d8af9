"""Native against onnxruntime-genai, token for token, across the model builder's architectures.

    python -m tools.parity_matrix [--archs llama,qwen2,...] [--precisions fp32,int4] [--tokens 64]
        [--sizes 64x2,96x3] [--seeds 0,1] [--out DIR]

For every (arch, precision, size, seed) this builds a package with
``../shared/tools/make_genai_package.py`` (which needs torch, transformers,
onnxruntime-genai and onnx_ir in the environment; they are not project
dependencies), decodes ``--tokens`` greedy tokens with onnxruntime-genai's own
generator and with the fully native pipeline, and prints one row: identical,
or the first divergent step with both sides' top-2 logit gaps from the
native and onnxruntime session loops (a near-tie when onnxruntime's own gap is
below the parity command's fixed ``NEAR_TIE``, 0.01), and the largest logit
difference at step 0.  Exit status 0 when every divergence is a near-tie.
The native side runs onnxruntime's arithmetic order where that is the default (x86 hosts with AVX2; see
``ops._common.mlas_order``); ``ONNX_NUMBA_MLAS_ORDER=0`` or ``=1`` chooses.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

from pipeline.__main__ import NEAR_TIE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILDER = os.path.join(os.path.dirname(ROOT), "shared", "tools", "make_genai_package.py")
ARCHS = ["llama", "qwen2", "qwen3", "phi3", "gemma", "gemma3", "qwen35", "lfm2", "qwen25vl", "gemma3mm"]


def _gap(row):
    a = np.partition(np.asarray(row, np.float64).reshape(-1), -2)[-2:]
    return float(a[1] - a[0])


def genai_tokens(path, prompt, n):
    """Greedy tokens of onnxruntime-genai's own generator on the package at ``path``."""
    import onnxruntime_genai as og
    m = og.Model(path)
    p = og.GeneratorParams(m)
    p.set_search_options(max_length=len(prompt) + n, do_sample=False)
    g = og.Generator(m, p)
    g.append_tokens(prompt)
    out = []
    while not g.is_done():
        g.generate_next_token()
        out.append(int(g.get_next_tokens()[0]))
    return out


def check(path, prompt, n):
    from pipeline.backends import BackendChoice
    from pipeline.metadata import load_package
    from pipeline.runner import Pipeline
    spec = load_package(path)
    ref = genai_tokens(path, prompt, n)
    nat = Pipeline(spec, BackendChoice(set(spec.components) - {spec.decoder.name}, True, "cpu"))
    steps = list(nat.tokens(prompt, n, with_logits=True))
    ids = [t for t, _ in steps]
    k = next((i for i, (a, b) in enumerate(zip(ids, ref)) if a != b), None)
    # Logits of both implementations on the same prefix (the reference tokens up to the divergence).
    ort = Pipeline(spec, BackendChoice(set(), False, "cpu"))
    o_steps = list(ort.tokens(prompt, 1 if k is None else k + 1, with_logits=True))
    d0 = float(np.max(np.abs(np.asarray(o_steps[0][1], np.float64) - np.asarray(steps[0][1], np.float64))))
    if k is None:
        return f"identical (step 0 max|dlogit| {d0:.2e})", True
    lo, ln = o_steps[k][1], steps[k][1]
    diff = float(np.max(np.abs(np.asarray(lo, np.float64) - np.asarray(ln, np.float64))))
    go, gn = _gap(lo), _gap(ln)
    tie = go < NEAR_TIE
    return (f"diverges at step {k}: native {ids[k]} vs genai {ref[k]}; top-2 gap native {gn:.2e} ort {go:.2e}, "
            f"max|dlogit| {diff:.2e} (step 0 {d0:.2e}) -> {'near-tie' if tie else 'NOT a near-tie'}"), tie


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--precisions", default="fp32,int4")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--sizes", default="64x2", help="hidden x layers, comma-separated")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--prompts", default="1,45,77,12,300,9;7,5,11,200")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="parity_")
    ok = True
    for arch in args.archs.split(","):
        for prec in args.precisions.split(","):
            for size in args.sizes.split(","):
                hidden, layers = (int(x) for x in size.split("x"))
                for seed in args.seeds.split(","):
                    path = os.path.join(out, f"{arch}_{prec}_{size}_s{seed}")
                    cmd = [sys.executable, BUILDER, "--arch", arch, "--precision", prec, "--out", path,
                           "--hidden", str(hidden), "--layers", str(layers), "--heads", "4", "--kv-heads", "2",
                           "--vocab", "512", "--seed", seed]
                    r = subprocess.run(cmd, capture_output=True, text=True)
                    if r.returncode:
                        print(f"{arch:9s} {prec} {size} seed {seed}: BUILD FAILED {r.stderr.strip()[-200:]}")
                        ok = False
                        continue
                    for prompt in args.prompts.split(";"):
                        ids = [int(x) for x in prompt.split(",")]
                        try:
                            msg, good = check(path, ids, args.tokens)
                        except Exception as e:  # report and go on with the other packages
                            msg, good = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:160]}", False
                        ok &= good
                        print(f"{arch:9s} {prec} {size} seed {seed} prompt [{prompt}]: {msg}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
