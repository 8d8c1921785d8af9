"""Benchmark: the serving engine (``pipeline/engine.py``) on a GenAI package.

Three measurements, in one run, after a warm-up that is timed on its own (compiling the paged decoder's
regions, or loading them from the cache):

- batching: output tokens per second of one request alone against ``--concurrency`` requests submitted
  together (each ``--prompt-tokens`` random prompt tokens, ``--new-tokens`` greedy tokens, EOS ignored);
  the two alternate ``--runs`` times and the medians are compared.  With ``--og``, onnxruntime-genai's
  tokens per second for one request on the same package is printed last (its threads spin after a run);
- prefix reuse: the time to the first token of a request whose first ``--prefix-tokens`` tokens an earlier
  request already served, with the prefix cache and with it emptied first; medians of ``--runs``;
- stress: ``--requests`` requests of random prompt lengths (1 to ``--stress-prompt`` tokens) and random
  ``max_tokens`` (1 to ``--stress-new``), arriving together on the engine's own thread, a random
  ``--cancel`` fraction cancelled at a random moment: errors, p50 and p99 latency (submission to end),
  throughput, and the KV blocks still in use at the end (must be 0).

Usage: python -m tools.bench_serve --model /path/to/package [--concurrency 8] [--requests 1000]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _prompts(rng, n, length, vocab):
    return [rng.integers(10, vocab - 10, length).tolist() for _ in range(n)]


def _batching(engine, args, rng, vocab):
    from pipeline.engine import SamplingParams
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    rates = {1: [], args.concurrency: []}
    for _ in range(args.runs):
        for n in (1, args.concurrency):
            engine.pool.clear_cache()
            ps = _prompts(rng, n, args.prompt_tokens, vocab)
            t = time.perf_counter()
            out = engine.generate(ps, params)
            rates[n].append(sum(map(len, out)) / (time.perf_counter() - t))
    one, many = float(np.median(rates[1])), float(np.median(rates[args.concurrency]))
    print(f"batching: 1 request {one:.1f} tok/s, {args.concurrency} concurrent {many:.1f} tok/s: "
          f"{many / one:.2f}x  (prompt {args.prompt_tokens}, {args.new_tokens} new tokens each, medians of "
          f"{args.runs})")
    return one


def _og_rate(args, rng, vocab):
    import onnxruntime_genai as og
    model = og.Model(args.model)
    prompt = _prompts(rng, 1, args.prompt_tokens, vocab)[0]
    rates = []
    for _ in range(args.runs):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=args.prompt_tokens + args.new_tokens, do_sample=False,
                                  min_length=args.prompt_tokens + args.new_tokens)
        gen = og.Generator(model, params)
        t = time.perf_counter()
        gen.append_tokens(prompt)
        n = 0
        while not gen.is_done():
            gen.generate_next_token()
            n += 1
        rates.append(n / (time.perf_counter() - t))
    rate = float(np.median(rates))
    print(f"onnxruntime-genai, 1 request: {rate:.1f} tok/s")


def _ttft(engine, prompt):
    from pipeline.engine import SamplingParams
    r = engine.submit(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    engine.run()
    return r.first_token_at - r.arrival


def _prefix(engine, args, rng, vocab):
    from pipeline.engine import SamplingParams
    warm, cold = [], []
    for _ in range(args.runs):
        prefix = _prompts(rng, 1, args.prefix_tokens, vocab)[0]
        engine.pool.clear_cache()
        engine.generate([prefix + _prompts(rng, 1, 8, vocab)[0]], SamplingParams(max_tokens=4, ignore_eos=True))
        req = prefix + _prompts(rng, 1, args.suffix_tokens, vocab)[0]
        warm.append(_ttft(engine, req))
        engine.pool.clear_cache()
        cold.append(_ttft(engine, req))
    w, c = float(np.median(warm)), float(np.median(cold))
    print(f"prefix reuse: first token after a served {args.prefix_tokens}-token prefix (+{args.suffix_tokens} new) "
          f"{w * 1e3:.1f} ms, without the prefix cache {c * 1e3:.1f} ms: {w / c:.3f} of the time")


def _stress(engine, args, rng, vocab):
    from pipeline.engine import SamplingParams
    engine.pool.clear_cache()
    engine.start()
    reqs = []
    t0 = time.perf_counter()
    for _ in range(args.requests):
        n = int(rng.integers(1, args.stress_prompt + 1))
        params = SamplingParams(max_tokens=int(rng.integers(1, args.stress_new + 1)),
                                temperature=float(rng.choice([0.0, 0.8])), seed=int(rng.integers(1 << 30)))
        reqs.append(engine.submit(_prompts(rng, 1, n, vocab)[0], params))
    doomed = rng.random(len(reqs)) < args.cancel
    order = rng.permutation(np.flatnonzero(doomed))
    for k in order:  # cancel at random moments while the engine runs
        time.sleep(float(rng.random()) * args.cancel_spread / max(len(order), 1))
        engine.cancel(reqs[k])
    for r in reqs:
        r.wait()
    wall = time.perf_counter() - t0
    engine.shutdown()
    lat = np.array([r.finished_at - r.arrival for r in reqs])
    reasons = {}
    for r in reqs:
        reasons[r.finish_reason] = reasons.get(r.finish_reason, 0) + 1
    toks = sum(len(r.output) for r in reqs)
    st = engine.stats()
    print(f"stress: {len(reqs)} requests in {wall:.1f} s, endings {reasons}, errors {st['errors']}, "
          f"latency p50 {np.percentile(lat, 50):.2f} s p99 {np.percentile(lat, 99):.2f} s, "
          f"{toks / wall:.1f} generated tok/s, {len(reqs) / wall:.2f} requests/s, preemptions {st['preemptions']}, "
          f"KV blocks in use at the end {st['kv_blocks_in_use']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the package folder")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prefix-tokens", type=int, default=512)
    ap.add_argument("--suffix-tokens", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--stress-prompt", type=int, default=64)
    ap.add_argument("--stress-new", type=int, default=32)
    ap.add_argument("--cancel", type=float, default=0.2, help="fraction of stress requests cancelled")
    ap.add_argument("--cancel-spread", type=float, default=30.0, help="seconds over which cancellations fall")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--og", action="store_true", help="also time onnxruntime-genai on one request")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: batching,prefix,stress")
    args = ap.parse_args(argv)
    from pipeline.engine import Engine
    skip = set(filter(None, args.skip.split(",")))
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    engine = Engine(args.model, block_size=args.block_size, max_batch=args.concurrency,
                    max_model_len=args.max_model_len)
    load = time.perf_counter() - t
    vocab = int(engine.spec.vocab_size or 1000)
    t = time.perf_counter()
    engine.generate(_prompts(rng, 2, 20, vocab), None)
    print(f"load {load:.1f} s, warm-up (compile or cache load) {time.perf_counter() - t:.1f} s; "
          f"{engine.pool.num_blocks} blocks of {args.block_size}, {engine.decoder.bytes_per_block / 1024:.0f} KiB each")
    if "batching" not in skip:
        _batching(engine, args, rng, vocab)
    if "prefix" not in skip:
        _prefix(engine, args, rng, vocab)
    if "stress" not in skip:
        _stress(engine, args, rng, vocab)
    if args.og:  # last: onnxruntime's threads spin after its runs and would slow what follows
        _og_rate(args, rng, vocab)


if __name__ == "__main__":
    main()
