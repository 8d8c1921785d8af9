"""Speculative decoding's speed: plain greedy decoding against a draft model or n-gram lookup, natively and in
onnxruntime-genai, in one run.

    python -m tools.bench_speculative --model PACKAGE [--draft PACKAGE | --ngram N] [--k 4] [--tokens 64]
        [--prompt-tokens 64] [--runs 3] [--backend native|ort-genai|both]

The package is linked (hard links, no copies) into two temporary folders: one as it is (the plain runs), one
whose ``genai_config.json`` adds the draft (``model.draft``, its files under ``draft/``; the model itself when
``--draft`` is not given: every proposal is then accepted, which measures what checking ``k`` proposals in one
run saves) or, with ``--ngram``, the same package with the n-gram size set by ``set_speculative_options``.  The prompt is ``--prompt-tokens`` ids that repeat a
16-id phrase, so that n-grams find continuations.  For each backend, plain and speculative runs alternate; each
run decodes ``--tokens`` greedy tokens after the prompt and is timed from after ``append_tokens`` (the prompt's
run) to the last token.  onnxruntime-genai's sessions run with ``session.intra_op.allow_spinning`` = 0, so its
idle threads do not slow the native runs between them.  Printed: the medians in ms/token, the speed-up of
speculation, the acceptance rate, and whether the speculative tokens equal the plain ones.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

NO_SPIN = {"session.intra_op.allow_spinning": "0"}


def _link_tree(src: str, dst: str) -> None:
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        s = os.path.join(src, name)
        if os.path.isfile(s):
            try:
                os.link(s, os.path.join(dst, name))
            except OSError:  # another filesystem: a copy
                shutil.copy(s, os.path.join(dst, name))


def _package(model: str, draft: str | None, k: int, work: str, name: str) -> str:
    """A package folder the runs read: the model's files, and the draft's under ``draft/`` when given."""
    path = os.path.join(work, name)
    _link_tree(model, path)
    cfg = json.load(open(os.path.join(model, "genai_config.json")))
    dec = cfg["model"]["decoder"]
    dec.setdefault("session_options", {}).update(NO_SPIN)
    if draft is not None:
        _link_tree(draft, os.path.join(path, "draft"))
        d = json.load(open(os.path.join(draft, "genai_config.json")))["model"]["decoder"]
        d["filename"] = "draft/" + d["filename"]
        d.setdefault("session_options", {}).update(NO_SPIN)
        cfg["model"]["draft"] = d
        cfg["speculative"] = {"max_draft_tokens": k}
    os.unlink(os.path.join(path, "genai_config.json"))
    with open(os.path.join(path, "genai_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def _run(og, model, prompt, tokens, speculative):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + tokens, do_sample=False)
    if speculative:
        params.set_speculative_options(**speculative)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray(prompt, np.int32))
    t0 = time.perf_counter()
    while not gen.is_done():
        gen.generate_next_token()
    ms = (time.perf_counter() - t0) * 1e3
    seq = gen.get_sequence(0).tolist()[len(prompt):]
    return ms / max(len(seq), 1), seq, gen.get_speculative_stats()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the package to decode (the target)")
    ap.add_argument("--draft", help="a draft package with the same vocabulary (default: the model itself)")
    ap.add_argument("--ngram", type=int, default=0, help="n-gram lookup of this size instead of a draft")
    ap.add_argument("--k", type=int, default=4, help="proposals per round (max_draft_tokens)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens to decode after the prompt")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="prompt length (a repeated 16-id phrase)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each mode (after one warm-up)")
    ap.add_argument("--backend", choices=["native", "ort-genai", "both"], default="both",
                    help="native: this runtime's decoder; ort-genai: onnxruntime-genai")
    a = ap.parse_args(argv)
    import runtime  # noqa: F401
    import pipeline

    work = tempfile.mkdtemp(prefix="bench_spec_")
    try:
        draft = None if a.ngram else (a.draft or a.model)
        path = _package(a.model, draft, a.k, work, "speculative")
        plain_path = _package(a.model, None, a.k, work, "plain")
        vocab = int(json.load(open(os.path.join(path, "genai_config.json")))["model"].get("vocab_size") or 1000)
        phrase = np.random.default_rng(0).integers(10, min(vocab, 30000), 16).tolist()
        prompt = (phrase * (a.prompt_tokens // 16 + 1))[:a.prompt_tokens]
        spec = {"ngram_size": a.ngram, "max_draft_tokens": a.k} if a.ngram else None
        mode = f"n-gram {a.ngram}" if a.ngram else ("self-draft" if a.draft is None else f"draft {a.draft}")
        print(f"model: {a.model}  speculation: {mode}, k={a.k}  tokens: {a.tokens} after {len(prompt)}")
        backends = []
        if a.backend in ("native", "both"):
            backends.append(("native", pipeline, pipeline.Model(plain_path, native="all"),
                             pipeline.Model(path, native="all")))
        if a.backend in ("ort-genai", "both"):
            import onnxruntime_genai as og
            backends.append(("ort-genai", og, og.Model(plain_path), og.Model(path)))
        for name, og, plain_model, model in backends:
            plain_ms, spec_ms = [], []
            plain = got = stats = None
            for i in range(a.runs + 1):
                p = _run(og, plain_model, prompt, a.tokens, None)
                s = _run(og, model, prompt, a.tokens, spec)
                if i:
                    plain_ms.append(p[0])
                    spec_ms.append(s[0])
                plain, got, stats = p[1], s[1], s[2]
            mp, ms = statistics.median(plain_ms), statistics.median(spec_ms)
            print(f"{name}: plain {mp:.2f} ms/token, speculative {ms:.2f} ms/token ({mp / ms:.2f}x), acceptance "
                  f"{stats['acceptance_rate']:.2f}, {stats['rounds']} rounds, tokens "
                  f"{'equal' if got == plain else 'DIFFER'}  (runs: plain {[round(x, 2) for x in plain_ms]}, "
                  f"speculative {[round(x, 2) for x in spec_ms]})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
