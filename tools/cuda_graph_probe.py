"""Can our CUDA launches be captured into a CUDA graph, and what would capture save per launch and per step?

    python -m tools.cuda_graph_probe [--hidden 64,2048] [--launches 18] [--reps 200] [--model PACKAGE]
                                     [--prompt-ids 3,10,17] [--json FILE]

Two measurements in one run:

- chain: ``--launches`` launches of the project's GEMV kernel (``ops/cuda/matmul.py``) on fixed device
  buffers, ping-ponging between two vectors, for each ``--hidden`` size.  The sequence is timed launched
  eagerly (then synchronized) and, on a GPU, captured once into a CUDA graph (numba-cuda launches into a
  ``cuda.core`` GraphBuilder) and replayed; both must end with the same bits.  The difference per launch is
  what capture saves per launch of a decode step.
- step (``--model``): a GenAI package's decoder on the device (``CudaDecoder``) prefills a prompt and decodes
  two tokens, each under a ``runtime.cuda.LaunchLog``: the report counts the launches that repeat exactly
  from one step to the next (same kernel, buffers and scalars, as a replayed graph would launch them) and
  names those that take another buffer (allocated per run) or another scalar (the step's length).  Then the
  next step is bound (``CudaDecoder.bind_step``) and run eagerly, then under a capturing
  ``runtime.cuda.launch_stream`` block, where any host<->device copy raises ``CaptureError``.  If the step
  holds none, on a GPU its graph is replayed, its logits must equal the eager run's bit for bit, and the
  replay is timed against the eager run; otherwise the report names the first node that needs the host.

The step probe drives a token-id decoder (``tokens=``); an ``inputs_embeds`` decoder is refused by the
decoder with a message saying so.  A captured step is valid only at the length it was captured at (kernels take the step's lengths by value,
and the plan allocates its intermediates per run, so the graph replays into the capture's buffers): this
measures what capture would save, it is not a decode loop.  Allocations made during a capture stay alive
while the probe runs (``cuda.defer_cleanup``).

On the CUDA simulator (no GPU) everything runs eagerly: the step is still run under a capturing block, so
whether it holds host copies is reported, but nothing is replayed or timed against a graph.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

__all__ = ["chain_probe", "step_probe", "main"]


def _median_us(fn, reps: int) -> float:
    ts = []
    for _ in range(max(int(reps), 1)):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def _graph_tools():
    """The current ``cuda.core`` Device (where GraphBuilders come from); None on the simulator or without
    cuda.core."""
    from runtime import cuda as rc
    if rc.simulator():
        return None
    try:
        from cuda.core import Device
    except ImportError:
        try:
            from cuda.core.experimental import Device
        except ImportError:
            return None
    dev = Device()
    dev.set_current()
    return dev


def _capture(dev, run):
    """``run()`` captured into a graph on ``dev``: (graph, replay stream, None), or (None, None, error text)."""
    from runtime import cuda as rc
    gb = dev.create_graph_builder()
    gb.begin_building("relaxed")  # allocations made by the run are allowed while it is captured
    try:
        with rc.launch_stream(gb, capturing=True):
            run()
    except Exception as e:
        try:
            gb.end_building()
        except Exception:
            pass
        return None, None, f"{type(e).__name__}: {e}"
    graph = gb.end_building().complete()
    stream = dev.create_stream()
    return graph, stream, None


def _replay(graph, stream, read, want, reps: int) -> dict:
    """Replay a captured graph once (its result ``read()`` must equal ``want`` bit for bit), then time replays."""
    from runtime import cuda as rc
    rc.cuda.synchronize()  # whatever the default stream copied in has landed before the graph reads it
    graph.upload(stream)
    graph.launch(stream)
    stream.sync()
    out = {"replay_matches_eager": bool(np.array_equal(read(), want))}

    def replay():
        graph.launch(stream)
        stream.sync()

    out["captured_us"] = _median_us(replay, reps)
    return out


def chain_probe(hidden: int, launches: int, reps: int) -> dict:
    """Eager against captured launches of the GEMV kernel (module docstring)."""
    from runtime import cuda as rc
    from ops.cuda.matmul import launch_gemv
    cuda = rc.cuda
    rng = np.random.default_rng(0)
    K = N = int(hidden)
    w = rc.to_device((rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32).reshape(-1))
    x0 = rng.standard_normal(K).astype(np.float32)
    bufs = [rc.device_empty((K,), np.float32), rc.device_empty((K,), np.float32)]

    def chain():
        for i in range(launches):
            launch_gemv(bufs[i % 2], w, None, bufs[(i + 1) % 2], K, N)

    def reset():
        rc.to_device(x0, out=bufs[0])

    def eager():
        chain()
        cuda.synchronize()

    reset()
    eager()  # compiles (or loads) the kernel
    reset()
    eager()
    want = rc.to_host(bufs[launches % 2])
    rep = {"hidden": K, "launches": int(launches), "eager_us": _median_us(eager, reps)}
    rep["eager_us_per_launch"] = rep["eager_us"] / max(launches, 1)
    dev = _graph_tools()
    if dev is None:
        rep["captured"] = "not on the CUDA simulator" if rc.simulator() else "cuda.core is not installed"
        return rep
    with cuda.defer_cleanup():
        graph, stream, err = _capture(dev, chain)
        if err:
            rep["captured"] = f"capture failed: {err}"
            return rep
        reset()
        rep.update(_replay(graph, stream, lambda: rc.to_host(bufs[launches % 2]), want, reps))
    rep["captured"] = "ok"
    rep["captured_us_per_launch"] = rep["captured_us"] / max(launches, 1)
    rep["saved_us_per_launch"] = rep["eager_us_per_launch"] - rep["captured_us_per_launch"]
    return rep


def step_probe(model: str, prompt=None, reps: int = 50) -> dict:
    """One decode step of a package's decoder, eager against captured (module docstring)."""
    from runtime import cuda as rc
    from pipeline.backends import BackendChoice
    from pipeline.metadata import load_package
    from pipeline.runner import Pipeline
    cuda = rc.cuda
    spec = load_package(model)
    stateless = {c for c in spec.components if c != spec.decoder.name}
    pipe = Pipeline(spec, BackendChoice(stateless, True, "cuda"))
    dec = pipe.decoder
    if prompt is None:
        prompt = [int(x) for x in (np.arange(8) * 7 + 3) % 97 + 1]  # profile_native's default prompt, 8 tokens
    dec.reset()
    tok = int(np.asarray(dec.prefill(tokens=[prompt], want="argmax")).reshape(-1)[0])
    logs = []
    for _ in range(2):  # two consecutive decode steps, launch by launch: would one graph replay both?
        with rc.LaunchLog() as log:
            tok = int(np.asarray(dec.step(tokens=[[tok]], want="argmax")).reshape(-1)[0])
        logs.append(log.launches)
    diffs = rc.LaunchLog.differences(*logs)
    kinds: dict = {}
    for _, name, what in diffs:  # one entry per launch index: the rest repeated exactly
        kinds.setdefault(what, {})
        kinds[what][name] = kinds[what].get(name, 0) + 1
    b = dec.bind_step(tokens=[[tok]])
    li = dec.output_names.index(dec.io.logits_output)

    def eager():
        dec.session.run_with_iobinding(b)
        cuda.synchronize()

    with rc.TransferCounter() as tc:
        eager()
    want = rc.to_host(b.get_output_arrays()[li])
    rep = {"model": model, "length": int(dec.kv_length) + 1, "launches": tc.launches,
           "consecutive_steps": {"launches": len(logs[1]),
                                 "repeated": max(len(logs[0]), len(logs[1])) - len(diffs), "differ": kinds},
           "h2d_copies_eager": tc.h2d_calls, "d2h_copies_eager": tc.d2h_calls,
           "eager_us": _median_us(eager, reps)}
    dev = _graph_tools()
    with cuda.defer_cleanup():
        if dev is None:  # the simulator: a capturing block around a plain stream finds the host copies
            try:
                with rc.launch_stream(cuda.stream(), capturing=True):
                    dec.session.run_with_iobinding(b)
                rep["host_copies_in_step"] = "none: the step can be captured"
                rep["captured"] = "not on the CUDA simulator" if rc.simulator() else "cuda.core is not installed"
            except Exception as e:
                rep["host_copies_in_step"] = f"{type(e).__name__}: {e}"
                rep["captured"] = "capture failed"
            return rep
        graph, stream, err = _capture(dev, lambda: dec.session.run_with_iobinding(b))
        if err:
            rep["host_copies_in_step"] = err
            rep["captured"] = "capture failed"
            return rep
        rep["host_copies_in_step"] = "none: the step can be captured"
        rep.update(_replay(graph, stream, lambda: rc.to_host(b.get_output_arrays()[li]), want, reps))
    rep["captured"] = "ok"
    rep["saved_us_per_step"] = rep["eager_us"] - rep["captured_us"]
    return rep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", default="64,2048", help="comma-separated GEMV sizes for the chain")
    ap.add_argument("--launches", type=int, default=18, help="launches per chain (a decode step's count)")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--model", help="a GenAI package whose decode step is probed")
    ap.add_argument("--prompt-ids", help="comma-separated prompt token ids (default: 8 tokens as profile_native's)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from runtime import cuda as rc
    if not rc.available():
        print(f"CUDA is unavailable: {rc.unavailable_reason()}")
        return 2
    print(f"target: {'CUDA simulator' if rc.simulator() else 'GPU'}")
    out = {"chain": [], "step": None}
    for h in (int(x) for x in args.hidden.split(",") if x.strip()):
        r = chain_probe(h, args.launches, args.reps)
        out["chain"].append(r)
        line = f"chain: hidden={h} launches={r['launches']} eager={r['eager_us']:.1f} us " \
               f"({r['eager_us_per_launch']:.2f} us/launch)"
        if r["captured"] == "ok":
            line += f" captured={r['captured_us']:.1f} us ({r['captured_us_per_launch']:.2f} us/launch, " \
                    f"saves {r['saved_us_per_launch']:.2f} us/launch) replay_matches_eager={r['replay_matches_eager']}"
        else:
            line += f" captured: {r['captured']}"
        print(line)
    if args.model:
        prompt = [int(x) for x in args.prompt_ids.split(",")] if args.prompt_ids else None
        r = step_probe(args.model, prompt, max(args.reps // 4, 5))
        out["step"] = r
        print(f"step: {args.model} at length {r['length']}: {r['launches']} launches, "
              f"{r['h2d_copies_eager']} h2d and {r['d2h_copies_eager']} d2h copies, eager={r['eager_us']:.1f} us")
        c = r["consecutive_steps"]
        print(f"step: of {c['launches']} launches, {c['repeated']} repeat exactly in the next step (kernel, "
              f"buffers, scalars); the others differ in: "
              + ("; ".join(f"{what}: " + ", ".join(f"{n} x{k}" for n, k in sorted(names.items()))
                           for what, names in sorted(c["differ"].items())) or "nothing"))
        print(f"step: host copies inside the step: {r['host_copies_in_step']}")
        if r["captured"] == "ok":
            print(f"step: captured={r['captured_us']:.1f} us (saves {r['saved_us_per_step']:.1f} us/step) "
                  f"replay_matches_eager={r['replay_matches_eager']}")
        else:
            print(f"step: captured: {r['captured']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    bad = [r for r in out["chain"] + [out["step"] or {}] if r.get("replay_matches_eager") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
