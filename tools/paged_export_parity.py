"""The model builder's paged export (``use_paged_attention``) through ``og.Engine`` natively, against
onnxruntime-genai's ``Generator`` on the builder's ordinary export of the same weights.

Both are the CUDA float16 exports (the only ones the builder makes paged); onnxruntime has no CPU kernel for
``PagedAttention``, so the paged package runs on this runtime's (``ops/paged_attention.py``) and the ordinary one on
onnxruntime's GroupQueryAttention, both on the CPU.  Random weights, built offline by ``../shared/tools/
make_genai_package.py``'s model and tokenizer (needs ``torch``, ``transformers`` and ``onnx_ir``, not project
dependencies).  Every prompt is decoded greedily; tokens are compared while the reference's two best logits are
more than ``--gap`` apart (float16 rounding may order a closer pair either way), and also whole.

    python -m tools.paged_export_parity --arch llama [--arch phi3 ...] [--tokens 16] [--work DIR]

Architectures whose ordinary CUDA export onnxruntime cannot run on the CPU (qwen3: its GroupQueryAttention fuses
the q/k norms, which onnxruntime implements only on CUDA and WebGPU) are reported as such.
"""
from __future__ import annotations

import argparse
import os
import runpy
import shutil
import sys
import types

import runtime  # noqa: F401  (before numpy, as every entry point of the project)
import numpy as np

SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "tools")
PROMPTS = [[5, 9, 13, 100, 200], [7, 2, 20, 4, 8, 9, 10, 11, 30, 31] * 3, [1000, 1001], [50]]


def build(arch: str, work: str, seed: int = 1) -> tuple[str, str]:
    """The paged and the ordinary CUDA float16 export of one random model: their folders."""
    sys.path.insert(0, SHARED)
    import make_genai_package as mk
    import torch
    a = types.SimpleNamespace(arch=arch, hidden=256, layers=2, heads=4, kv_heads=2, vocab=2048, init=0.1,
                              intermediate=0, seed=seed)
    src = os.path.join(work, arch, "src")
    shutil.rmtree(src, ignore_errors=True)
    tok_dir, hf_dir = os.path.join(src, "tok"), os.path.join(src, "hf")
    tok = mk.train_tokenizer(tok_dir, a.vocab)
    cls, cfg = mk.make_model(arch, tok, a)
    torch.manual_seed(seed)
    cfg.architectures = [cls.__name__]
    cls(cfg).to(torch.float32).eval().save_pretrained(hf_dir)
    tok.save_pretrained(hf_dir)
    out = []
    for name, extra in (("paged", ["--extra_options", "use_paged_attention=true"]), ("ordinary", [])):
        folder = os.path.join(work, arch, name)
        shutil.rmtree(folder, ignore_errors=True)
        argv = sys.argv
        sys.argv = ["builder", "-i", hf_dir, "-o", folder, "-p", "fp16", "-e", "cuda", "-c",
                    os.path.join(src, "cache")] + extra
        try:
            runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
        finally:
            sys.argv = argv
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tok_dir, f), os.path.join(folder, f))
        out.append(folder)
    return out[0], out[1]


def reference(ordinary: str, n: int) -> list:
    """onnxruntime-genai's greedy steps on the ordinary export, on the CPU: [(token, gap of the two best)]."""
    import onnxruntime_genai as og
    cfg = og.Config(ordinary)
    cfg.clear_providers()
    model = og.Model(cfg)
    out = []
    for p in PROMPTS:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(p) + n, past_present_share_buffer=False)
        g = og.Generator(model, params)
        g.append_tokens(np.asarray(p, np.int32))
        steps = []
        while not g.is_done():
            top = np.sort(np.asarray(g.get_logits(), np.float32).reshape(-1))[-2:]
            g.generate_next_token()
            steps.append((int(g.get_next_tokens()[0]), float(top[1] - top[0])))
        out.append(steps)
    return out


def native(paged: str, n: int) -> list:
    """The paged export through og.Engine natively, every prompt a request of one batch: their tokens."""
    import pipeline as pg
    engine = pg.Engine(pg.Model(paged, native="all"))
    requests = []
    for p in PROMPTS:
        r = engine.create_request()
        o = pg.TurnOptions(r)
        o.set_max_generated_tokens(n)
        r.begin_turn(np.asarray(p, np.int32), o)
        requests.append(r)
    tokens = {id(r): [] for r in requests}
    buf = engine.create_event_buffer(64)
    while engine.has_pending_requests():
        for e in engine.run(buf):
            if e.token is not None:
                tokens[id(e.request)].append(int(e.token))
    return [tokens[id(r)] for r in requests]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", default=None, help="builder architecture (repeatable; llama)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per prompt")
    ap.add_argument("--gap", type=float, default=0.02, help="the smallest gap of the two best logits compared")
    ap.add_argument("--work", default="/tmp/paged_export_parity", help="where the packages are built")
    a = ap.parse_args(argv)
    failed = 0
    for arch in a.arch or ["llama"]:
        paged, ordinary = build(arch, a.work)
        try:
            ref = reference(ordinary, a.tokens)
        except Exception as exc:  # the ordinary export onnxruntime cannot run on the CPU
            print(f"{arch:8s} reference fails: {str(exc).splitlines()[0][:200]}")
            continue
        got = native(paged, a.tokens)
        for p, steps, toks in zip(PROMPTS, ref, got):
            clear = next((k for k, (_, gap) in enumerate(steps) if gap <= a.gap), len(steps))
            same = toks[:clear] == [t for t, _ in steps[:clear]]
            whole = toks == [t for t, _ in steps]
            failed += not same
            print(f"{arch:8s} prompt of {len(p):2d}: {'same' if same else 'DIFFERS'} over the {clear} clear steps; "
                  f"all {len(steps)}: {'same' if whole else 'differ'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
