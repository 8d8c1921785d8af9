"""Decode ms/step of the hybrid decoder fixture: Scan plan against the inlined decode sibling, in one run.

    python -m tools.bench_decode_inline [--size realistic|small] [--prompt 16] [--steps 32] [--repeats 3]

Both sessions load the same model (built on the fly from fixtures.hybrid_decoder),
prefill the same prompt, then decode ``--steps`` greedy tokens, one token per
step; the tokens must be identical.  Each repeat's per-step times are pooled
and the median ms/step of each plan and their ratio are printed.  The first
decode step of the sibling session (which builds the sibling plan) is
reported separately and excluded from the medians.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def _decode(sess, cfg, prompt, steps, specs):
    from fixtures import hybrid_decoder as H
    feeds = H.zero_states(cfg, 1)
    feeds["input_ids"] = prompt
    names = [o.name for o in sess.get_outputs()]
    t0 = time.perf_counter()
    res = dict(zip(names, sess.run(None, feeds)))
    prefill = time.perf_counter() - t0
    tokens, times = [], []
    for _ in range(steps):
        ids = np.argmax(res["logits"][:, -1], -1)[:, None].astype(np.int64)
        tokens.append(int(ids[0, 0]))
        feeds = {i: res[o] for i, o, _ in specs}
        feeds["input_ids"] = ids
        t = time.perf_counter()
        res = dict(zip(names, sess.run(None, feeds)))
        times.append(time.perf_counter() - t)
    return prefill, times, tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["realistic", "small"], default="realistic")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    from fixtures import hybrid_decoder as H
    from runtime import InferenceSession, SessionOptions

    cfg = H.REALISTIC if args.size == "realistic" else H.SMALL
    specs = H.state_specs(cfg)
    t = time.perf_counter()
    model = H.build(cfg)
    print(f"hybrid decoder fixture ({args.size}): hidden={cfg.hidden} layers={cfg.layers} "
          f"built in {time.perf_counter() - t:.1f} s")
    sessions = {}
    for name, flag in (("scan", False), ("inlined", True)):
        opts = SessionOptions()
        opts.decode_inline_scan = flag
        sessions[name] = InferenceSession(model, opts)
    prompt = (np.arange(args.prompt, dtype=np.int64) * 7 % cfg.vocab)[None, :]
    step_times = {"scan": [], "inlined": []}
    prefill = {"scan": [], "inlined": []}
    first_sibling = None
    ref_tokens = None
    for rep in range(args.repeats + 1):  # repeat 0 warms the kernels up
        for name in ("scan", "inlined"):
            p, times, tokens = _decode(sessions[name], cfg, prompt, args.steps, specs)
            if ref_tokens is None:
                ref_tokens = tokens
            elif tokens != ref_tokens:
                print(f"token mismatch in {name}: {tokens} vs {ref_tokens}")
                return 1
            if name == "inlined" and first_sibling is None:
                first_sibling = times[0]
            if rep:
                step_times[name] += times
                prefill[name].append(p)
    ms = {k: 1e3 * statistics.median(v) for k, v in step_times.items()}
    print(f"prompt {args.prompt} tokens, {args.steps} decode steps x {args.repeats} repeats, tokens identical")
    print(f"  sibling build (first single-token step): {1e3 * first_sibling:.0f} ms")
    for k in ("scan", "inlined"):
        print(f"  {k:8s} prefill {1e3 * statistics.median(prefill[k]):8.2f} ms   decode {ms[k]:8.3f} ms/step")
    print(f"  decode speed-up scan/inlined: {ms['scan'] / ms['inlined']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
