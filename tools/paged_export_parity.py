"""The model builder's paged export (``use_paged_attention``) through ``og.Engine`` natively, against
onnxruntime-genai's ``Generator`` on the builder's ordinary export of the same weights.

Both are the CUDA float16 exports (the only ones the builder makes paged); onnxruntime has no CPU kernel for
``PagedAttention``, so the paged package runs on this runtime's (``ops/paged_attention.py``) and the ordinary one on
onnxruntime's GroupQueryAttention, both on the CPU.  Random weights, built offline by ``../shared/tools/
make_genai_package.py``'s model and tokenizer (needs ``torch``, ``transformers`` and ``onnx_ir``, not project
dependencies).  Every prompt is decoded greedily; tokens are compared while the reference's two best logits are
more than ``--gap`` apart (float16 rounding may order a closer pair either way), and also whole.  The ordinary
export as built (its q/k norms fused into GroupQueryAttention for Qwen 3 and Gemma 3) also runs natively through
``og.Generator`` and is compared with the same reference.

    python -m tools.paged_export_parity --arch llama [--arch phi3 ...] [--tokens 16] [--work DIR]
    python -m tools.paged_export_parity --arch qwen2 --hidden 896 --intermediate 4864 --layers 24 --heads 14 \
        --kv-heads 2 --time 64 --tokens 32      # prefill and decode times of both, one request

Where the ordinary export's GroupQueryAttention fuses the q/k norms (qwen3, gemma3), which onnxruntime computes on
CUDA and WebGPU only, the reference gets them written out before it (``unfuse_qk_norms``), as the paged export has
them.  Gemma 3's sliding-window layers take ``block_table_windowed``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import types

import runtime  # noqa: F401  (before numpy, as every entry point of the project)
import numpy as np

SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "tools")
PROMPTS = [[5, 9, 13, 100, 200], [7, 2, 20, 4, 8, 9, 10, 11, 30, 31] * 3, [1000, 1001], [50]]


def build(arch: str, work: str, seed: int = 1, **sizes) -> tuple[str, str]:
    """The paged and the ordinary CUDA float16 export of one random model (``sizes``: hidden, layers, heads,
    kv_heads, vocab, intermediate, as ``make_genai_package.py`` takes them): their folders."""
    sys.path.insert(0, SHARED)
    import make_genai_package as mk
    import torch
    a = types.SimpleNamespace(arch=arch, hidden=256, layers=2, heads=4, kv_heads=2, vocab=2048, init=0.1,
                              intermediate=0, seed=seed)
    a.__dict__.update({k: v for k, v in sizes.items() if v})
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
        _run_builder(mk, hf_dir, folder, os.path.join(src, "cache"), extra)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tok_dir, f), os.path.join(folder, f))
        out.append(folder)
    return out[0], out[1]


def _run_builder(mk, hf_dir, folder, cache, extra):
    """The shared script's builder run (with its config fixes), for CUDA in float16 and with ``extra``."""
    real = mk.runpy

    class ForCuda:
        @staticmethod
        def run_module(*args, **kw):
            sys.argv[sys.argv.index("-e") + 1] = "cuda"
            sys.argv += extra
            return real.run_module(*args, **kw)

    mk.runpy = ForCuda
    try:
        mk.run_builder(hf_dir, folder, "fp16", cache)
    finally:
        mk.runpy = real


def unfuse_qk_norms(folder: str) -> int:
    """The ordinary export's GroupQueryAttention nodes that fuse the q/k RMS norms (inputs 14 and 15, which
    onnxruntime computes on CUDA and WebGPU only) get them written out before them instead, as
    ``SimplifiedLayerNormalization`` over each head (the paged export writes them out itself): how many."""
    import onnx
    from onnx import helper
    path = os.path.join(folder, "model.onnx")
    m = onnx.load(path)
    g = m.graph
    nodes, changed = [], 0
    for n in g.node:
        if n.op_type == "GroupQueryAttention" and len(n.input) > 15 and n.input[14] and n.input[15]:
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            heads = {0: attrs["num_heads"], 1: attrs["kv_num_heads"]}
            eps = attrs.pop("qk_norm_epsilon", 1e-6)
            for k, w in ((0, n.input[14]), (1, n.input[15])):
                src = n.input[k]
                shape = f"{src}/heads_shape"
                g.initializer.append(onnx.numpy_helper.from_array(np.asarray([0, 0, heads[k], -1], np.int64),
                                                                  shape))
                back = f"{src}/flat_shape"
                g.initializer.append(onnx.numpy_helper.from_array(np.asarray([0, 0, -1], np.int64), back))
                nodes += [helper.make_node("Reshape", [src, shape], [f"{src}/heads"]),
                          helper.make_node("SimplifiedLayerNormalization", [f"{src}/heads", w], [f"{src}/normed"],
                                           axis=-1, epsilon=eps),
                          helper.make_node("Reshape", [f"{src}/normed", back], [f"{src}/unfused"])]
                n.input[k] = f"{src}/unfused"
            del n.input[14:]
            del n.attribute[:]
            n.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
            changed += 1
        nodes.append(n)
    if changed:
        del g.node[:]
        g.node.extend(nodes)
        data = os.path.join(folder, "model.onnx.data")
        if os.path.exists(data):  # loaded whole above; onnx would append to the old file
            os.remove(data)
        onnx.save(m, path, save_as_external_data=True, location="model.onnx.data")
    return changed


def greedy_steps(api, model, n: int) -> list:
    """Every prompt decoded greedily for ``n`` tokens by ``api``'s Generator: [(token, gap of the two best logits
    before it)] per prompt.  ``max_length`` leaves room past a window, which a windowed cache needs as capacity."""
    out = []
    for p in PROMPTS:
        params = api.GeneratorParams(model)
        params.set_search_options(max_length=max(len(p) + n, 128))
        g = api.Generator(model, params)
        g.append_tokens(np.asarray(p, np.int32))
        steps = []
        for _ in range(n):
            top = np.sort(np.asarray(g.get_logits(), np.float32).reshape(-1))[-2:]
            g.generate_next_token()
            steps.append((int(g.get_next_tokens()[0]), float(top[1] - top[0])))
        out.append(steps)
    return out


def reference(ordinary: str, n: int) -> list:
    """onnxruntime-genai's greedy steps on the ordinary export, on the CPU: [(token, gap of the two best)]."""
    import onnxruntime_genai as og
    cfg = og.Config(ordinary)
    cfg.clear_providers()
    return greedy_steps(og, og.Model(cfg), n)


def native(paged: str, n: int) -> list:
    """The paged export through og.Engine natively, every prompt a request of one batch: their tokens."""
    import pipeline as pg
    from .genai_repo_models import engine_tokens
    return engine_tokens(pg, pg.Model(paged, native="all"), PROMPTS, n)


def native_generator(ordinary: str, n: int) -> list:
    """The ordinary export (its q/k norms fused, as built) through og.Generator natively: each prompt's tokens."""
    import pipeline as pg
    return [[t for t, _ in steps] for steps in greedy_steps(pg, pg.Model(ordinary, native="all"), n)]


def timing(paged: str, ordinary: str, prompt_tokens: int, steps: int, runs: int) -> None:
    """Prefill and decode of one request: the paged export through og.Engine natively, then the ordinary export
    on onnxruntime-genai's Generator (its threads do not spin, so the first does not slow the second); medians of
    ``runs`` runs after a warm-up, in milliseconds."""
    import time
    import onnxruntime_genai as og
    import pipeline as pg
    prompt = np.asarray([(7 * i) % 1000 + 3 for i in range(prompt_tokens)], np.int32)

    def engine_run(engine):
        r = engine.create_request()
        o = pg.TurnOptions(r)
        o.set_max_generated_tokens(steps + 1)
        r.begin_turn(prompt, o)
        buf, marks = engine.create_event_buffer(64), [time.perf_counter()]
        while engine.has_pending_requests():
            engine.run(buf)
            marks.append(time.perf_counter())
        r.close()
        return marks

    def generator_run(model):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=prompt_tokens + steps + 1)
        g = og.Generator(model, params)
        marks = [time.perf_counter()]
        g.append_tokens(prompt)
        marks.append(time.perf_counter())
        for _ in range(steps):
            g.generate_next_token()
            marks.append(time.perf_counter())
        return marks

    sides = (("native og.Engine, paged export", lambda: pg.Engine(pg.Model(paged, native="all")), engine_run),
             ("onnxruntime-genai Generator, ordinary export", lambda: _og_model(ordinary), generator_run))
    for label, make, run in sides:
        t0 = time.perf_counter()
        target = make()
        run(target)  # warm-up: compiles, first allocations
        warm = time.perf_counter() - t0
        pre, dec = [], []
        for _ in range(runs):
            m = run(target)
            pre.append(m[1] - m[0])
            dec.append(float(np.median(np.diff(m[2:]))))
        print(f"{label:46s} load + warm-up {warm:6.1f} s   prefill of {prompt_tokens}: "
              f"{1e3 * float(np.median(pre)):7.1f} ms   decode: {1e3 * float(np.median(dec)):6.2f} ms/token")
        del target


def _og_model(folder):
    import onnxruntime_genai as og
    cfg = og.Config(folder)
    cfg.clear_providers()
    cfg.overlay('{"model": {"decoder": {"session_options": {"session.intra_op.allow_spinning": "0"}}}}')
    return og.Model(cfg)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", default=None, help="builder architecture (repeatable; llama)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per prompt")
    ap.add_argument("--gap", type=float, default=0.02, help="the smallest gap of the two best logits compared")
    ap.add_argument("--work", default="/tmp/paged_export_parity", help="where the packages are built")
    for k in ("hidden", "layers", "heads", "kv-heads", "intermediate", "vocab"):
        ap.add_argument(f"--{k}", type=int, default=0, help=f"model {k} (0: make_genai_package's small default)")
    ap.add_argument("--time", type=int, default=0, metavar="PROMPT_TOKENS",
                    help="time prefill of this many tokens and decode instead of comparing tokens")
    ap.add_argument("--runs", type=int, default=3, help="timed runs (--time)")
    a = ap.parse_args(argv)
    sizes = dict(hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads, intermediate=a.intermediate,
                 vocab=a.vocab)
    failed = 0
    for arch in a.arch or ["llama"]:
        paged, ordinary = build(arch, a.work, **sizes)
        if a.time:
            unfuse_qk_norms(ordinary)
            timing(paged, ordinary, a.time, a.tokens, a.runs)
            continue
        as_built = native_generator(ordinary, a.tokens)  # before its norms are written out for onnxruntime
        if unfuse_qk_norms(ordinary):
            print(f"{arch:8s} reference: its fused q/k norms written out before GroupQueryAttention")
        try:
            ref = reference(ordinary, a.tokens)
        except Exception as exc:  # the ordinary export onnxruntime cannot run on the CPU
            print(f"{arch:8s} reference fails: {str(exc).splitlines()[0][:200]}")
            failed += 1
            continue
        for what, got in (("paged, og.Engine", native(paged, a.tokens)),
                          ("ordinary as built, og.Generator", as_built)):
            for p, steps, toks in zip(PROMPTS, ref, got):
                clear = next((k for k, (_, gap) in enumerate(steps) if gap <= a.gap), len(steps))
                same = toks[:clear] == [t for t, _ in steps[:clear]]
                whole = toks == [t for t, _ in steps]
                failed += not same
                print(f"{arch:8s} {what:32s} prompt of {len(p):2d}: {'same' if same else 'DIFFERS'} over the "
                      f"{clear} clear steps; all {len(steps)}: {'same' if whole else 'differ'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
