"""Profile a GenAI package: prefill ms, decode ms/token and tok/s, native against onnxruntime in one run.

    python -m tools.profile_native --model PACKAGE [--ep cpu|cuda] [--backend native|ort|both] [--steady]
        [--decode-skip 8] [--warmups 2] [--runs 3] [--tokens 64]
        [--prompt TEXT | --prompt-ids IDS | --prompt-tokens N] [--pixel-values FILE.npy] [--json FILE]

Each run decodes ``--tokens`` greedy tokens; with several backends the runs alternate between them (run 0 of
each, then run 1 of each, ...), so the machine's drift affects every backend alike.  Prefill is the time to the first
token (prompt-only components included); decode ms/token is the median step
time after skipping the first ``--decode-skip`` steps (with ``--steady``; all
steps otherwise).  Warm-up runs are not counted.  Per-run lines come first,
then ``steady_median: backend=... prefill=X ms decode=Y ms/token
throughput=Z tok/s`` per backend, ``generated_token_ids: [...]`` and, with
``both``, the native/onnxruntime ratios; ``memory:`` lines give, per backend, the resident memory its loading
added (onnxruntime-genai loads in its first run) and the process's peak resident memory during its runs (VmHWM,
reset before each run; it includes the other backends the process holds).  The command fails if a backend's
tokens differ between its runs; tokens that differ between backends are
reported (int4 numerics can flip a near-tie) but do not fail it.

With ``--ep cuda`` the native decoder runs on the device, onnxruntime on its CUDA provider when it has one (else
on its CPU provider, said so), and onnxruntime-genai on its CUDA provider (the column is skipped, said so, when
the installed build has none).  Then ``device:`` lines give the native decode step's kernel launches and
host<->device bytes, and the bandwidth it achieves: the weights it reads in full plus the live KV rows over the
median step time, against the device's measured copy bandwidth.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def _status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS: resident now, VmHWM: peak), in MB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _reset_peak() -> None:
    """Start VmHWM afresh from the current resident size (Linux: ``5`` written to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _one_run(pipe, prompt, tokens, external):
    times = []
    ids = []
    t = time.perf_counter()
    for tok in pipe.tokens(prompt, tokens, external=external):
        now = time.perf_counter()
        times.append(now - t)
        ids.append(tok)
        t = time.perf_counter()
    return times, ids


def _genai_model(model_path, ep):
    """onnxruntime-genai's model for the package, on its CUDA provider when ``ep`` is cuda."""
    import onnxruntime_genai as og
    key = (model_path, ep)
    m = _genai_run.models.get(key)
    if m is None:
        if ep.startswith("cuda"):
            cfg = og.Config(model_path)
            cfg.clear_providers()
            cfg.append_provider("cuda")
            m = og.Model(cfg)
        else:
            m = og.Model(model_path)
        _genai_run.models[key] = m
    return m


def _genai_run(model_path, prompt, tokens, ep="cpu"):
    """One greedy run on onnxruntime-genai's own generator: (per-token times, ids)."""
    import onnxruntime_genai as og
    m = _genai_model(model_path, ep)
    p = og.GeneratorParams(m)
    p.set_search_options(max_length=len(prompt) + tokens, do_sample=False)
    g = og.Generator(m, p)
    times, ids = [], []
    t = time.perf_counter()
    g.append_tokens(prompt)
    while not g.is_done():
        g.generate_next_token()
        ids.append(int(g.get_next_tokens()[0]))
        now = time.perf_counter()
        times.append(now - t)
        t = now
    return times, ids


_genai_run.models = {}


def _device_report(dec, args, res) -> dict:
    """Per decode step on the device: launches, host<->device bytes, and the bandwidth the step achieves (the
    weights read in full plus the live KV rows, over its median time) against the device's measured copy
    bandwidth."""
    from runtime import cuda as rc
    steps = [s for s in dec.transfers.steps if s["seq_len"] == 1][-max(args.tokens - 1, 1):]
    rep = {"launches_per_step": statistics.median(s["launches"] for s in steps) if steps else 0,
           "h2d_bytes_per_step": statistics.median(s["h2d"] for s in steps) if steps else 0,
           "d2h_bytes_per_step": statistics.median(s["d2h"] for s in steps) if steps else 0}
    by = dec.bytes_per_step()
    rep.update(weight_bytes=by["weights"], kv_bytes_last_step=by["kv"])
    sec = res["decode_ms_per_token"] * 1e-3
    rep["achieved_gb_s"] = (by["weights"] + by["kv"]) / sec / 1e9 if sec > 0 else float("nan")
    rep["device_copy_gb_s"] = rc.measure_bandwidth()
    if steps:
        rep["kernels_last_step"] = dict(steps[-1]["kernels"])
    print(f"device: launches/step={rep['launches_per_step']:g} h2d={rep['h2d_bytes_per_step']:g} B/step "
          f"d2h={rep['d2h_bytes_per_step']:g} B/step")
    bw = rep["device_copy_gb_s"]
    print(f"device: a step reads {by['weights'] / 1e6:.2f} MB of weights and {by['kv'] / 1e6:.2f} MB of KV cache (at "
          f"the last step): {rep['achieved_gb_s']:.1f} GB/s achieved"
          + (f" against {bw:.0f} GB/s measured for a device copy ({rep['achieved_gb_s'] / bw:.1%})" if bw else
             " (no device bandwidth on the CUDA simulator)"))
    return rep


def _parse_args(argv):
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ep", default="cpu")
    ap.add_argument("--backend", choices=["native", "ort", "both"], default="both",
                    help="both: native, the pipeline's onnxruntime session loop, and (for genai_config packages, "
                         "when installed) onnxruntime-genai's own generator")
    ap.add_argument("--steady", action="store_true")
    ap.add_argument("--decode-skip", type=int, default=8)
    ap.add_argument("--warmups", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--prompt")
    g.add_argument("--prompt-ids")
    g.add_argument("--prompt-tokens", type=int)
    ap.add_argument("--pixel-values")
    ap.add_argument("--json")
    return ap.parse_args(argv)


def _prompt(args, spec) -> list:
    """The prompt's token ids: ``--prompt-ids``, ``--prompt`` tokenized, or ``--prompt-tokens`` synthetic ids."""
    if args.prompt_ids:
        return [int(x) for x in args.prompt_ids.split(",")]
    if args.prompt is not None:
        from pipeline.tokenizer import Tokenizer
        return [int(x) for x in Tokenizer(spec.tokenizer_dir).encode(args.prompt)]
    n = args.prompt_tokens or 16
    return [int(x) for x in (np.arange(n) * 7 + 3) % 97 + 1]


def _backends(args, spec, device):
    """The backends to run, in order, and onnxruntime's providers (None: its CPU provider); says what is skipped."""
    backends = ["native", "ort"] if args.backend == "both" else [args.backend]
    on_cuda = device.startswith("cuda")
    ort_providers = None  # onnxruntime's CPU provider
    if on_cuda and "ort" in backends:
        import onnxruntime as ort
        if "CUDAExecutionProvider" in ort.get_available_providers():
            ort_providers = ["CUDAExecutionProvider"]
        else:
            print("onnxruntime has no CUDAExecutionProvider here (install the gpu extra): the ort column runs on "
                  "its CPU provider")
    if args.backend == "both" and spec.source == "genai_config":
        try:
            import onnxruntime_genai  # noqa: F401
            if on_cuda:
                _genai_model(args.model, device)  # a build without CUDA fails here, not in the middle of the runs
            backends.append("ort-genai")
        except ImportError:
            print("onnxruntime-genai is not installed: its column is skipped")
        except Exception as e:  # a CPU-only onnxruntime-genai asked for its CUDA provider
            print(f"onnxruntime-genai cannot run this package on {device} ({type(e).__name__}: {e}): its column "
                  f"is skipped")
    return backends, ort_providers


def _load_pipelines(spec, backends, device, ort_providers, BackendChoice, Pipeline):
    """A Pipeline per backend (onnxruntime-genai loads in its first run): pipes, creation seconds, MB loaded."""
    dec = spec.decoder.name
    stateless = [c for c in spec.components if c != dec]
    pipes, create, loaded = {}, {}, {}
    for be in backends:
        if be == "ort-genai":
            continue
        choice = BackendChoice(set(stateless), True, device) if be == "native" else BackendChoice(set(), False, "cpu")
        t0 = time.perf_counter()
        before = _status_mb("VmRSS")
        pipes[be] = Pipeline(spec, choice, ort_providers=ort_providers)
        create[be] = time.perf_counter() - t0
        loaded[be] = _status_mb("VmRSS") - before
    return pipes, create, loaded


def _run_iter(args, backends):
    """The run indices (warm-ups included), under a tqdm bar when the runs are long and tqdm is installed."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    total = args.warmups + args.runs
    it = range(total)
    if tqdm is not None and args.tokens * total * len(backends) >= 256:
        it = tqdm(it, desc="runs", leave=False)
    return it


def _step_ms(args, times):
    """(prefill ms, median decode ms/token) of one run's per-token times, skipping ``--decode-skip`` with --steady."""
    skip = args.decode_skip if args.steady else 0
    steps = times[1:][skip:] or times[1:]
    pre = times[0] * 1e3
    dec_ms = statistics.median(steps) * 1e3 if steps else float("nan")
    return pre, dec_ms


def _alternate_runs(args, backends, pipes, prompt, external, device, loaded):
    """Run r of each backend, then run r + 1 of each, so a drift in the machine's speed lands on all alike.

    Returns ({backend: [(prefill ms, decode ms/token)]}, {backend: first run's ids}, {backend: peak MB}), or
    None when a backend's tokens differ between its runs (said so)."""
    runs = {be: [] for be in backends}
    first_ids, peak = {}, {}
    for r in _run_iter(args, backends):
        for be in backends:
            time.sleep(0.05)  # let the previous run's worker threads (onnxruntime's spin) go idle first
            _reset_peak()
            before = _status_mb("VmRSS")
            if be == "ort-genai":
                times, ids = _genai_run(args.model, prompt, args.tokens, device)
                if r == 0:  # onnxruntime-genai loads its model in its first run
                    loaded[be] = _status_mb("VmRSS") - before
            else:
                times, ids = _one_run(pipes[be], prompt, args.tokens, external)
            peak[be] = max(peak.get(be, 0.0), _status_mb("VmHWM"))
            ref_ids = first_ids.setdefault(be, ids)
            if ids != ref_ids:
                print(f"tokens differ ({be}, run {r}): {ids} vs {ref_ids}")
                return None
            if r >= args.warmups:
                pre, dec_ms = _step_ms(args, times)
                runs[be].append((pre, dec_ms))
                print(f"run {r - args.warmups}: backend={be} prefill={pre:.2f} ms decode={dec_ms:.3f} ms/token")
    return runs, first_ids, peak


def _summarise(backends, runs, create, loaded, peak) -> dict:
    """Per backend: the medians over its counted runs, throughput, session creation and memory."""
    results = {}
    for be in backends:
        pre = statistics.median(p for p, _ in runs[be])
        dms = statistics.median(d for _, d in runs[be])
        results[be] = {"prefill_ms": pre, "decode_ms_per_token": dms, "tok_per_s": 1e3 / dms,
                       "session_create_ms": create.get(be, 0.0) * 1e3, "load_rss_mb": loaded.get(be),
                       "peak_rss_mb": peak.get(be)}
    return results


def _print_summary(results, backends, first_ids) -> None:
    """The steady_median, memory, generated_token_ids, token-difference notes and native/other ratio lines."""
    for be, r in results.items():
        print(f"steady_median: backend={be} prefill={r['prefill_ms']:.2f} ms decode={r['decode_ms_per_token']:.3f} "
              f"ms/token throughput={r['tok_per_s']:.1f} tok/s")
    for be, r in results.items():
        print(f"memory: backend={be} loaded={r['load_rss_mb'] or float('nan'):.0f} MB resident "
              f"peak_during_runs={r['peak_rss_mb'] or float('nan'):.0f} MB (whole process)")
    main_ids = first_ids[backends[0]]
    print(f"generated_token_ids: {main_ids}")
    for be, ids in first_ids.items():
        if ids != main_ids:
            k = next((i for i, (a, b) in enumerate(zip(ids, main_ids)) if a != b), min(len(ids), len(main_ids)))
            print(f"note: {be} tokens differ from {backends[0]}'s from step {k} on "
                  f"(check with python -m pipeline parity whether it is a near-tie): {be}_token_ids: {ids}")
    n = results.get("native")
    for other in ("ort", "ort-genai"):
        o = results.get(other)
        if n and o:
            print(f"ratio native/{other}: prefill {n['prefill_ms'] / o['prefill_ms']:.2f}x "
                  f"decode {n['decode_ms_per_token'] / o['decode_ms_per_token']:.2f}x")


def level4_header() -> str:
    """Which level-4 int4 arithmetic onnxruntime takes on this host and whether the native products reproduce it."""
    from ops import _simd
    from ops._common import mlas_order
    if not _simd.AVX2:
        ort_path = "not an x86 host with AVX2 (its path here is not reproduced)"
    elif _simd.AVX512F:
        ort_path = ("MLAS AVX-512 int8 kernels" + ("" if _simd.VNNI512 else " (no VNNI)") if _simd.AVX512 else
                    "MLAS AVX-512 F without BW/DQ/VL (its path here is not reproduced)")
    else:
        ort_path = "MLAS AVX2 int8 kernels" + ("" if _simd.VNNI else " (no VNNI)")
    native = ("products, attention, norms and activations in onnxruntime's order (ONNX_NUMBA_MLAS_ORDER=0 runs "
              "the blockwise order: faster prompts)" if mlas_order() else
              "products blockwise (ONNX_NUMBA_MLAS_ORDER=1 reproduces onnxruntime's order: products, attention, "
              "norms, activations)")
    return f"level-4 int4: onnxruntime takes {ort_path}; native {native}"


def main(argv=None) -> int:
    """Profile the package's backends in alternating runs; 0, or 1 when a backend's tokens differ between runs."""
    args = _parse_args(argv)

    from pipeline.backends import BackendChoice, parse_device
    from pipeline.metadata import load_package
    from pipeline.runner import Pipeline

    spec = load_package(args.model)
    prompt = _prompt(args, spec)
    external = {"pixel_values": np.load(args.pixel_values)} if args.pixel_values else {}
    device = parse_device(args.ep)
    backends, ort_providers = _backends(args, spec, device)
    print(level4_header())
    # Every backend is set up first, then the runs go round-robin (run r of each backend, then run r + 1), so a
    # drift in the machine's speed lands on all of them alike and the medians compare like with like.
    pipes, create, loaded = _load_pipelines(spec, backends, device, ort_providers, BackendChoice, Pipeline)
    done = _alternate_runs(args, backends, pipes, prompt, external, device, loaded)
    if done is None:
        return 1
    runs, first_ids, peak = done
    results = _summarise(backends, runs, create, loaded, peak)
    _print_summary(results, backends, first_ids)
    if device.startswith("cuda") and "native" in pipes:
        results["native"]["device"] = _device_report(pipes["native"].decoder, args, results["native"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "prompt_ids": prompt, "generated_token_ids": first_ids,
                       "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
