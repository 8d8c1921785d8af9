"""Benchmark: onnxruntime-genai's ``Engine`` API on a GenAI package, this runtime's (``pipeline/engine_api.py``,
native) against onnxruntime-genai's own, in one run.

Each run has two rounds.  First, ``--requests`` requests begin one turn each together (``--prompt-tokens``
random ids, greedy, at most ``--new-tokens`` tokens) and the engine is stepped until every turn has ended.
Second, the same prompts one request at a time, each followed by a second turn of ``--turn-tokens`` ids (a
conversation continued from its cache).  Reported per engine: generated tokens per second of each round (medians
of ``--runs``, the engines alternating), and whether the two engines' tokens agree.  onnxruntime-genai's session threads do not spin between runs
(``session.intra_op.allow_spinning`` = 0), so one engine's idle threads do not slow the other's run.  A warm-up
run of each comes first and is timed on its own (compiling, or loading, the native decoder's regions).

onnxruntime-genai batches statically (its default batch of 4 runs to its end before the next is admitted) and
continues a conversation only while it is the one resident request: hence the second round's one request at a
time, on both engines.

Usage: python -m tools.bench_turns --model /path/to/package [--requests 4] [--new-tokens 32] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NO_SPIN = json.dumps({"model": {"decoder": {"session_options": {"session.intra_op.allow_spinning": "0"}}}})


def _drain(engine, buf, requests, out):
    while engine.has_pending_requests():
        for e in engine.run(buf):
            if e.token is not None:
                out[requests.index(e.request)].append(int(e.token))


def _turn(mod, r, ids, n):
    opts = mod.TurnOptions(r)
    opts.set_max_generated_tokens(n)
    r.begin_turn(np.asarray(ids, np.int32), opts)


def _run(mod, model, args, seed):
    """Round 1: ``--requests`` first turns together; round 2: conversations of two turns, one request at a time.
    Returns the tokens and the generated tokens per second of each round."""
    rng = np.random.default_rng(seed)
    first = [rng.integers(10, args.vocab - 10, args.prompt_tokens).tolist() for _ in range(args.requests)]
    second = [rng.integers(10, args.vocab - 10, args.turn_tokens).tolist() for _ in range(args.requests)]
    engine = mod.Engine(model)
    buf = engine.create_event_buffer(256)
    requests = [engine.create_request() for _ in range(args.requests)]
    out1 = [[] for _ in requests]
    t = time.perf_counter()
    for r, ids in zip(requests, first):
        _turn(mod, r, ids, args.new_tokens)
    _drain(engine, buf, requests, out1)
    t1 = time.perf_counter() - t
    for r in requests:
        r.close()
    out2 = []
    t = time.perf_counter()
    for a, b in zip(first, second):
        r = engine.create_request()
        got = [[]]
        for ids in (a, b):
            _turn(mod, r, ids, args.new_tokens)
            _drain(engine, buf, [r], got)
        out2.append(got[0])
        r.close()
    t2 = time.perf_counter() - t
    return (out1, out2), sum(map(len, out1)) / t1, sum(map(len, out2)) / t2


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a genai_config.json package folder")
    p.add_argument("--requests", type=int, default=4, help="requests per run (onnxruntime-genai's batch is 4)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="random prompt ids of each first turn")
    p.add_argument("--turn-tokens", type=int, default=16, help="random ids of each second turn")
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens of each turn")
    p.add_argument("--runs", type=int, default=3, help="timed runs of each engine, alternating")
    args = p.parse_args(argv)
    import runtime  # noqa: F401  (the native runtime's process settings before numpy's threads start)
    import onnxruntime_genai as og

    import pipeline as pg
    with open(os.path.join(args.model, "genai_config.json")) as fh:
        args.vocab = int(json.load(fh)["model"]["vocab_size"])
    config = og.Config(args.model)
    config.overlay(NO_SPIN)
    engines = {"onnxruntime-genai": (og, og.Model(config)), "native": (pg, pg.Model(args.model, native="all"))}
    rates = {k: ([], []) for k in engines}
    tokens = {}
    for name, (mod, model) in engines.items():
        t = time.perf_counter()
        tokens[name], _, _ = _run(mod, model, args, 0)
        print(f"{name}: warm-up run {time.perf_counter() - t:.1f} s")
    for k in range(args.runs):
        for name, (mod, model) in engines.items():
            _, r1, r2 = _run(mod, model, args, k + 1)
            rates[name][0].append(r1)
            rates[name][1].append(r2)
    same = tokens["native"] == tokens["onnxruntime-genai"]
    for name in engines:
        a, b = (float(np.median(x)) for x in rates[name])
        print(f"{name}: {args.requests} turns together {a:.1f} tok/s; two-turn conversations one by one {b:.1f} tok/s "
              f"(medians of {args.runs})")
    og1, og2 = (float(np.median(x)) for x in rates["onnxruntime-genai"])
    n1, n2 = (float(np.median(x)) for x in rates["native"])
    print(f"native / onnxruntime-genai: {n1 / og1:.2f}x together, {n2 / og2:.2f}x one by one; "
          f"tokens {'identical' if same else 'DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
