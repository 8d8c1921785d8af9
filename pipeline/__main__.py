"""Command line: ``python -m pipeline parity|generate|warm PACKAGE ...``.

parity: run the onnxruntime baseline and the requested native mix side by
side, greedily, and compare step by step: the first divergent step, both
tokens, each side's top-2 logit gap there (a near-tie is flagged), and the
largest absolute logit difference of every step up to it.  Exit status 0
only when the token lists are identical.

generate: decode a prompt and print the text and the token ids.

warm: compile everything the package's native components need, so that later starts load it from the caches.
"""
from __future__ import annotations

import argparse
import sys

from runtime import cpu_env  # noqa: F401  (first: settings numpy reads when it loads)

import numpy as np

NEAR_TIE = 1e-3


def _choice(spec, native: str, device: str):
    from .backends import choice_from_names
    return choice_from_names(spec, native, device, "--native")


def _prompt(args, spec):
    if args.prompt_ids:
        return [int(x) for x in args.prompt_ids.split(",")]
    if args.prompt is None:
        raise SystemExit("give --prompt TEXT or --prompt-ids IDS")
    from .tokenizer import Tokenizer
    if not spec.tokenizer_dir:
        raise SystemExit("this package has no tokenizer.json: use --prompt-ids")
    return [int(x) for x in Tokenizer(spec.tokenizer_dir).encode(args.prompt)]


def _external(args, spec=None):
    ext = {}
    if getattr(args, "pixel_values", None):
        ext["pixel_values"] = np.load(args.pixel_values)
    if getattr(args, "image", None):
        from .preprocess import find_preprocessor, preprocess_image
        ext["pixel_values"] = preprocess_image(args.image, find_preprocessor(spec.root))
    return ext


def _top2_gap(logits):
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    if row.size < 2:
        return float("inf")
    a = np.partition(row, -2)[-2:]
    return float(a[1] - a[0])


def cmd_parity(args) -> int:
    from .metadata import load_package
    from .runner import Pipeline
    from .spec import SearchOptions
    spec = load_package(args.package)
    prompt = _prompt(args, spec)
    greedy = SearchOptions(max_length=spec.search.max_length)
    ext = _external(args, spec)
    base = Pipeline(spec, _choice(spec, "none", "cpu"))
    ort_steps = list(base.tokens(prompt, args.tokens, external=ext, search=greedy, with_logits=True))
    ort_ids = [t for t, _ in ort_steps]
    print(f"package: {args.package}")
    print(f"prompt_ids: {prompt}")
    if args.native == "none":
        print(f"ort_token_ids: {ort_ids}")
        return 0
    nat = Pipeline(spec, _choice(spec, args.native, args.device))
    nat_steps = list(nat.tokens(prompt, args.tokens, external=ext, search=greedy, with_logits=True))
    nat_ids = [t for t, _ in nat_steps]
    backends = {n: c.backend for n, c in nat.components.items()}
    backends[nat.decoder_name] = nat.decoder.backend
    print(f"native mix: {backends} on {nat.choice.device}")
    for i, ((ta, la), (tb, lb)) in enumerate(zip(ort_steps, nat_steps)):
        diff = float(np.max(np.abs(np.asarray(la, np.float64) - np.asarray(lb, np.float64))))
        print(f"  step {i:3d}: ort {ta:6d} native {tb:6d}  max|dlogit| {diff:.3e}")
        if ta != tb:
            ga, gb = _top2_gap(la), _top2_gap(lb)
            tie = min(ga, gb) <= max(NEAR_TIE, 10 * diff)
            print(f"first divergence at step {i}: ort {ta} vs native {tb}; top-2 gap ort {ga:.3e} native {gb:.3e}"
                  f"{'  (near-tie)' if tie else '  (NOT a near-tie)'}")
            break
    print(f"ort_token_ids: {ort_ids}")
    print(f"native_token_ids: {nat_ids}")
    same = ort_ids == nat_ids
    print("tokens identical" if same else "tokens differ")
    return 0 if same else 1


def cmd_generate(args) -> int:
    from .metadata import load_package
    from .runner import Pipeline
    from .sampling import Sampler
    from .spec import SearchOptions
    spec = load_package(args.package)
    prompt = _prompt(args, spec)
    s = SearchOptions(**{**spec.search.__dict__})
    for k in ("do_sample", "top_k", "top_p", "min_p", "temperature", "repetition_penalty", "seed"):
        v = getattr(args, k)
        if v is not None:
            setattr(s, k, v)
    pipe = Pipeline(spec, _choice(spec, args.native, args.device))
    ids = pipe.generate(prompt, args.max_new_tokens, sampler=Sampler(s), external=_external(args, spec), search=s)
    if spec.tokenizer_dir:
        from .tokenizer import Tokenizer
        print(Tokenizer(spec.tokenizer_dir).decode(ids))
    print(f"token_ids: {ids}")
    return 0


def _count(text: str) -> int:
    """A token count for the command line: an integer >= 0 (argparse reports anything else and exits 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0, got {n}")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("parity", "generate"):
        p = sub.add_parser(name)
        p.add_argument("package")
        p.add_argument("--prompt")
        p.add_argument("--prompt-ids")
        p.add_argument("--pixel-values", help="a .npy array fed to the vision component's pixel_values")
        p.add_argument("--image", help="an image file, through the package's declared preprocessing")
        p.add_argument("--native", default="all" if name == "parity" else "none",
                       help="component names, 'all' or 'none'")
        p.add_argument("--device", default="cpu")
        if name == "parity":
            p.add_argument("--tokens", type=_count, default=16)
        else:
            p.add_argument("--max-new-tokens", type=_count, default=32)
            p.add_argument("--do-sample", action="store_true", default=None)
            p.add_argument("--top-k", type=int)
            p.add_argument("--top-p", type=float)
            p.add_argument("--min-p", type=float)
            p.add_argument("--temperature", type=float)
            p.add_argument("--repetition-penalty", type=float)
            p.add_argument("--seed", type=int)
    w = sub.add_parser("warm", help="compile everything the package needs ahead of time (cached for later starts)")
    w.add_argument("package")
    w.add_argument("--native", default="all", help="component names, 'all' or 'none'")
    w.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.cmd == "warm":
        from .warm import warm
        print(warm(args.package, args.native, args.device).summary())
        return 0
    return cmd_parity(args) if args.cmd == "parity" else cmd_generate(args)


if __name__ == "__main__":
    sys.exit(main())
