"""onnxruntime-genai's own test packages through ``pipeline`` (native and onnxruntime) and through onnxruntime-genai.

Every folder holding a ``genai_config.json`` under ``REPO/test/models`` is loaded by the three and decoded
greedily from the same prompt (``--prompt``, ``--batch`` rows, ``--max-length``); a Marian package takes a batch
of two rows of the length its graphs declare; a decoder in the paged format (``engine.dynamic_batching`` and
``cumulative_sequence_lengths`` among its inputs) runs through ``Engine``, one request per row (``pipeline``
on onnxruntime refuses the Engine: it runs the decoder natively).  One line per package: ``same``
(identical sequences from all three), ``differs``, or the error each raised (its first line).  Packages that
onnxruntime-genai itself cannot run here (a CUDA build, dummy graphs of fixed shapes, files missing from the
checkout) are listed with its error, so that the table says which rows compare anything.  The repository is
not part of this one:

    python -m tools.genai_repo_models --repo PATH_TO_ONNXRUNTIME_GENAI [--only NAME ...]
"""
from __future__ import annotations

import argparse
import os

import runtime  # noqa: F401  (before numpy, as every entry point of the project)
import numpy as np


def _decode(api, path, prompt, max_length, **kw):
    m = api.Model(path, **kw)
    params = api.GeneratorParams(m)
    params.set_search_options(max_length=max_length, batch_size=len(prompt))
    g = api.Generator(m, params)
    g.append_tokens(np.asarray(prompt, np.int32))
    while not g.is_done():
        g.generate_next_token()
    return [g.get_sequence(i).tolist() for i in range(len(prompt))]


def engine_tokens(api, model, prompts, max_new) -> list:
    """Every prompt a request of one ``api.Engine`` over ``model``, run together: each one's generated tokens
    (``max_new``: an int, or one per prompt)."""
    engine = api.Engine(model)
    requests = []
    for k, row in enumerate(prompts):
        r = engine.create_request()
        o = api.TurnOptions(r)
        o.set_max_generated_tokens(max_new[k] if isinstance(max_new, (list, tuple)) else max_new)
        r.begin_turn(np.asarray(row, np.int32), o)
        requests.append(r)
    out = {id(r): [] for r in requests}
    buf = engine.create_event_buffer(64)
    while engine.has_pending_requests():
        for e in engine.run(buf):
            if e.token is not None:
                out[id(e.request)].append(int(e.token))
    return [out[id(r)] for r in requests]


def _decode_engine(api, path, prompt, max_length, **kw):
    new = engine_tokens(api, api.Model(path, **kw), prompt, [max_length - len(row) for row in prompt])
    return [list(row) + t for row, t in zip(prompt, new)]


def _paged_format(path) -> bool:
    import json
    with open(os.path.join(path, "genai_config.json")) as f:
        cfg = json.load(f)
    inputs = ((cfg.get("model") or {}).get("decoder") or {}).get("inputs") or {}
    return bool((cfg.get("engine") or {}).get("dynamic_batching")) and "cumulative_sequence_lengths" in inputs


def _outcome(fn):
    try:
        return fn()
    except Exception as exc:  # a row of the table, never a crash
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="a checkout of onnxruntime-genai")
    ap.add_argument("--only", nargs="*", help="package folders (relative to test/models) to run")
    ap.add_argument("--prompt", default="1,2,3,4", help="comma-separated token ids of each row")
    ap.add_argument("--batch", type=int, default=1, help="rows (the same prompt in each)")
    ap.add_argument("--max-length", type=int, default=12, help="search max_length")
    args = ap.parse_args(argv)
    import onnxruntime_genai as reference

    import pipeline as og
    root = os.path.join(args.repo, "test", "models")
    found = sorted(os.path.relpath(d, root) for d, _, files in os.walk(root) if "genai_config.json" in files)
    prompt = [[int(t) for t in args.prompt.split(",")]] * args.batch
    for name in found if not args.only else [n for n in found if n in args.only]:
        path = os.path.join(root, name)
        rows = {"marian-batch": [[5], [7]]}.get(name, [[5, 32000], [7, 8]] if name.startswith("marian") else prompt)
        run = _decode_engine if _paged_format(path) else _decode
        ref = _outcome(lambda: run(reference, path, rows, args.max_length))
        ort = _outcome(lambda: run(og, path, rows, args.max_length, native="none"))
        nat = _outcome(lambda: run(og, path, rows, args.max_length, native="all"))
        if ref == ort == nat and not isinstance(ref, str):
            print(f"{name:50s} same      {ref}")
        elif run is _decode_engine and ref == nat and not isinstance(ref, str):
            print(f"{name:50s} same      {ref} (native; the Engine is refused on onnxruntime)")
        else:
            print(f"{name:50s} {'differs' if not isinstance(ref, str) else 'reference fails'}")
            for label, value in (("onnxruntime-genai", ref), ("pipeline, onnxruntime", ort),
                                 ("pipeline, native", nat)):
                print(f"    {label:22s} {value}")


if __name__ == "__main__":
    main()
