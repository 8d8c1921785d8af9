"""Command line: ``python -m pipeline parity|generate|warm|serve PACKAGE ...``.

parity: run the onnxruntime baseline and the requested native mix side by
side, greedily, and compare step by step: the first divergent step, both
tokens, each side's top-2 logit gap there (a near-tie, flagged, is a divergence where onnxruntime's own gap
is below ``--near-tie``, default 0.01: a fixed tolerance), and the
largest absolute logit difference of every step up to it.  Exit status 0
only when the token lists are identical.

generate: decode a prompt, streaming the text as it is produced, then print the token ids; ``--chat`` wraps the
prompt in the package's chat template (and converses, line by line, when no prompt is given: each turn
continues on the cached conversation); ``--batch-file`` decodes the prompts of a file as one padded batch
(each in turn where the decoder cannot run rows of different lengths).

A user's mistake (a folder without a package, a prompt past ``max_length``, ``max_length`` past the model's
context, an unknown option value) prints one line and exits with status 2.

warm: compile everything the package's native components need, so that later starts load it from the caches.

serve: an OpenAI-compatible HTTP server (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``,
``/metrics``) over the serving engine, which batches the requests it receives (``pipeline/server.py``).
"""
from __future__ import annotations

import argparse
import sys

from runtime import cpu_env  # noqa: F401  (first: settings numpy reads when it loads)

import numpy as np

# A divergence is a near-tie when onnxruntime's own top-2 logit gap at that step is below this: a fixed tolerance,
# never one that grows with the difference observed (a wide logit difference is a defect, not rounding).
NEAR_TIE = 1e-2


def _user_errors() -> tuple:
    from runtime.errors import ModelLoadError, UnsupportedOpError
    from .spec import IncompletePackageError, MetadataError, RequestError
    from .backends import BackendConfigError
    return (MetadataError, IncompletePackageError, RequestError, BackendConfigError, ModelLoadError,
            UnsupportedOpError, FileNotFoundError, NotImplementedError)


def _choice(spec, native: str, device: str):
    from .backends import choice_from_names
    return choice_from_names(spec, native, device, "--native")


def _prompt(args, spec):
    from .spec import RequestError
    if args.prompt_ids:
        return [int(x) for x in args.prompt_ids.split(",")]
    if args.prompt is None:
        raise RequestError("give --prompt TEXT or --prompt-ids IDS")
    from .tokenizer import Tokenizer
    if not spec.tokenizer_dir:
        raise RequestError("this package has no tokenizer.json: use --prompt-ids")
    return [int(x) for x in Tokenizer(spec.tokenizer_dir).encode(args.prompt)]


def _with_processor(spec) -> bool:
    """The package's images go through onnxruntime-genai's processor (``pipeline/multimodal.py``)."""
    from .multimodal import PROCESSOR_TYPES
    return spec.source == "genai_config" and spec.model_type in PROCESSOR_TYPES and bool(spec.vision_config)


def _external(args, spec=None):
    ext = {}
    if getattr(args, "pixel_values", None):
        ext["pixel_values"] = np.load(args.pixel_values)
    if getattr(args, "image", None) and not _with_processor(spec):
        from .preprocess import find_preprocessor, preprocess_image
        ext["pixel_values"] = preprocess_image(args.image, find_preprocessor(spec.root))
    return ext


def _top2_gap(logits):
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    if row.size < 2:
        return float("inf")
    a = np.partition(row, -2)[-2:]
    return float(a[1] - a[0])


def divergence_line(step, ta, tb, la, lb, near_tie=NEAR_TIE) -> str:
    """The report of the first divergent step: both tokens, both top-2 gaps, and whether it is a near-tie
    (onnxruntime's own gap ``la`` below ``near_tie``; the native logits play no part)."""
    ga, gb = _top2_gap(la), _top2_gap(lb)
    return (f"first divergence at step {step}: ort {ta} vs native {tb}; top-2 gap ort {ga:.3e} native {gb:.3e}"
            f"{'  (near-tie)' if ga < near_tie else '  (NOT a near-tie)'}")


def arithmetic_line() -> str:
    """Which arithmetic order the native kernels run, and how to get onnxruntime's: a divergence means little
    without it (the setting is read when the native pipeline plans its nodes)."""
    from ops._common import mlas_order
    if mlas_order():
        return "native arithmetic: onnxruntime's order (ONNX_NUMBA_MLAS_ORDER=0 runs its own, with faster prompts)"
    return ("native arithmetic: its own order (ONNX_NUMBA_MLAS_ORDER=1 runs onnxruntime's, logits equal to the bit "
            "on the builder's architectures)")


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
    print(arithmetic_line())
    for i, ((ta, la), (tb, lb)) in enumerate(zip(ort_steps, nat_steps)):
        diff = float(np.max(np.abs(np.asarray(la, np.float64) - np.asarray(lb, np.float64))))
        print(f"  step {i:3d}: ort {ta:6d} native {tb:6d}  max|dlogit| {diff:.3e}")
        if ta != tb:
            print(divergence_line(i, ta, tb, la, lb, args.near_tie))
            break
    print(f"ort_token_ids: {ort_ids}")
    print(f"native_token_ids: {nat_ids}")
    same = ort_ids == nat_ids
    print("tokens identical" if same else "tokens differ")
    return 0 if same else 1


def _params(args, model):
    from . import api as og
    params = og.GeneratorParams(model)
    options = {k: getattr(args, k) for k in ("max_length", "do_sample", "top_k", "top_p", "min_p", "temperature",
                                             "repetition_penalty") if getattr(args, k) is not None}
    if args.seed is not None:
        options["random_seed"] = args.seed
    if getattr(args, "audio_interleaved", None):
        options["audio_interleaved"] = True
    params.set_search_options(**options)
    speculative = {k: getattr(args, a) for k, a in (("ngram_size", "ngram_size"), ("max_draft_tokens", "draft_tokens"))
                   if getattr(args, a) is not None}
    if speculative:
        params.set_speculative_options(**speculative)
    return params


def _decode_into(gen, n: int, tok, out) -> list:
    """Up to ``n`` new tokens of ``gen``, their text written to ``out`` as each one completes it (what the stream
    still holds at the end, an incomplete character, is written then)."""
    ids, written = [], ""
    stream = tok.create_stream() if tok is not None else None
    while len(ids) < n and not gen.is_done():
        gen.generate_next_token()
        t = int(gen.get_next_tokens()[0])
        ids.append(t)
        if stream is not None:
            piece = stream.decode(t)
            written += piece
            out.write(piece)
            out.flush()
    if tok is not None:
        full = tok.decode(ids)
        out.write(full[len(written):] if full.startswith(written) else "")
    return ids


def _continue(gen, ids):
    """Feed ``ids`` (the whole conversation so far) on top of what ``gen`` holds: only what differs from its
    sequence runs (the common prefix stays cached)."""
    seq = gen.get_sequence(0).tolist()
    p = 0
    while p < min(len(seq), len(ids)) and seq[p] == ids[p]:
        p += 1
    if p < len(seq):
        gen.rewind_to(p)
    gen.append_tokens(ids[p:])


def _chat(args, model, tok, params, out) -> int:
    from . import api as og
    gen = og.Generator(model, params)
    messages = []
    turns = [args.prompt] if args.prompt is not None else iter(lambda: input("> "), None)
    try:
        for text in turns:
            messages.append({"role": "user", "content": text})
            _continue(gen, [int(t) for t in tok.encode(tok.apply_chat_template(messages))])
            ids = _decode_into(gen, args.max_new_tokens, tok, out)
            out.write("\n")
            messages.append({"role": "assistant", "content": tok.decode(ids)})
            if args.prompt is not None:
                print(f"token_ids: {ids}", file=out)
    except EOFError:
        pass
    return 0


def cmd_generate(args) -> int:
    from . import api as og
    from .spec import RequestError
    out = sys.stdout
    model = og.Model(args.package, native=args.native, device=args.device)
    tok = og.Tokenizer(model) if model.spec.tokenizer_dir else None
    params = _params(args, model)
    params.set_inputs(_external(args, model.spec))
    if (args.audio or args.image and _with_processor(model.spec)) and (args.chat or args.batch_file):
        raise RequestError("--image and --audio go with one --prompt here, not with --chat or --batch-file")
    if args.chat:
        if tok is None:
            raise RequestError("--chat needs the package's tokenizer.json")
        return _chat(args, model, tok, params, out)
    if args.batch_file:
        with open(args.batch_file, encoding="utf-8") as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
        if tok is not None and len(prompts) > 1 and model.pipeline.decoder.runs_ragged:
            return _batch(args, model, tok, params, prompts, out)
    else:
        prompts = [None]
    for k, text in enumerate(prompts):  # each in turn: one prompt, or a decoder that runs rows of one length
        if text is not None:
            args.prompt = text
            out.write(f"[{k}] ")
        gen = og.Generator(model, params)
        if args.image and _with_processor(model.spec) or args.audio:  # through the package's processor
            if args.prompt is None:
                raise RequestError("--image and --audio need --prompt TEXT (with the image's or clip's tag, e.g. "
                                   "<|image_1|>, or a Whisper decoder's prompt, e.g. "
                                   "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>)")
            from .audio import Audios
            from .multimodal import Images
            media = {}
            if args.image:
                media["images"] = Images.open(args.image)
            if args.audio:
                media["audios"] = Audios.open(args.audio)
            gen.set_inputs(model.create_multimodal_processor()(args.prompt, **media))
        else:
            gen.append_tokens(_prompt(args, model.spec))
        ids = _decode_into(gen, args.max_new_tokens, tok, out)
        out.write("\n")
        print(f"token_ids: {ids}", file=out)
        if args.audio_codes:
            import numpy as np
            codes = np.asarray(gen.get_output("audio_codes"))
            np.save(args.audio_codes, codes)
            print(f"audio codes: {codes.shape[0]} frames -> {args.audio_codes}", file=out)
    return 0


def _batch(args, model, tok, params, prompts, out) -> int:
    """The prompts as one right-padded batch: each row's text and ids once the batch is done."""
    from . import api as og
    params.set_search_options(batch_size=len(prompts))
    gen = og.Generator(model, params)
    gen.append_tokens(tok.encode_batch(prompts))
    start, eos = gen.token_count(), set(int(t) for t in tok.eos_token_ids)
    for _ in range(args.max_new_tokens):
        if gen.is_done():
            break
        gen.generate_next_token()
    for k in range(len(prompts)):
        ids = [int(t) for t in gen.get_sequence(k)[start:]]
        end = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))  # a finished row's pads dropped
        print(f"[{k}] {tok.decode(ids[:end])}\ntoken_ids: {ids[:end]}", file=out)
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


def _positive(text: str) -> int:
    """A size for the command line: an integer >= 1."""
    n = _count(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a count >= 1, got {n}")
    return n


def _port(text: str) -> int:
    n = _count(text)
    if n > 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535, got {n}")
    return n


def cmd_serve(args) -> int:
    from .server import serve
    template = None
    if args.chat_template:
        with open(args.chat_template, encoding="utf-8") as f:
            template = f.read()
    serve(args.package, args.host, args.port, model_name=args.model_name, chat_template=template,
          max_batch=args.max_batch, block_size=args.block_size, num_blocks=args.num_blocks,
          prefix_cache=not args.no_prefix_cache, max_model_len=args.max_model_len)
    return 0


def _serve_options(s):
    s.add_argument("package", help="the package folder (genai_config.json or inference_metadata.yaml)")
    s.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=_port, default=8000, help="the port to listen on (default 8000)")
    s.add_argument("--model-name", help="the model name clients give (default: the package folder's name)")
    s.add_argument("--max-batch", type=_positive, default=8, help="requests decoded together (default 8)")
    s.add_argument("--block-size", type=_positive, default=16, help="positions per KV cache block (default 16)")
    s.add_argument("--num-blocks", type=_positive, help="KV cache blocks in the pool (default: --max-batch full "
                   "contexts)")
    s.add_argument("--no-prefix-cache", action="store_true", help="do not reuse the KV blocks of shared prompt "
                   "prefixes")
    s.add_argument("--max-model-len", type=_positive, help="prompt plus generated tokens at most (default: the "
                   "package's context length, capped at 4096)")
    s.add_argument("--chat-template", help="a Jinja2 chat template file used instead of the package's")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("parity", "generate"):
        p = sub.add_parser(name, help=("onnxruntime against the native runtime, step by step" if name == "parity"
                                       else "decode a prompt and stream its text"))
        p.add_argument("package", help="the package folder (genai_config.json or inference_metadata.yaml)")
        p.add_argument("--prompt", help="the prompt text (tokenized with the package's tokenizer.json)")
        p.add_argument("--prompt-ids", help="the prompt as comma-separated token ids")
        p.add_argument("--pixel-values", help="a .npy array fed to the vision component's pixel_values")
        p.add_argument("--image", help="an image file, through the package's declared preprocessing (an "
                       "onnxruntime-genai multimodal package: its processor, the prompt holding the image's tag)")
        _backend_options(p)
        if name == "parity":
            p.add_argument("--tokens", type=_count, default=16, help="greedy tokens to compare (default 16)")
            p.add_argument("--near-tie", type=float, default=NEAR_TIE, help="a divergence is called a near-tie "
                           f"when onnxruntime's top-2 logit gap at that step is below this (default {NEAR_TIE})")
        else:
            p.add_argument("--max-new-tokens", type=_count, default=32, help="tokens to generate (default 32)")
            p.add_argument("--max-length", type=_count, help="prompt plus generated tokens at most (default: the "
                           "package's search.max_length)")
            p.add_argument("--chat", action="store_true", help="wrap the prompt in the package's chat template; "
                           "without --prompt, converse line by line on standard input")
            p.add_argument("--batch-file", help="a text file of prompts, one per line, decoded as one batch")
            p.add_argument("--audio", help="an audio file for a speech package (Whisper, Phi-4-multimodal, "
                           "LFM2-Audio), through its processor; --prompt gives the decoder's first tokens or holds the "
                           "clip's tag (<|audio|> for LFM2-Audio)")
            p.add_argument("--audio-codes", help="a .npy file to write the spoken answer's codes to "
                           "([frames, codebooks] int64; an LFM2-Audio package with speech output)")
            p.add_argument("--audio-interleaved", action="store_true", default=None,
                           help="LFM2-Audio: alternate text and speech by count, as its interleaved mode does")
            p.add_argument("--do-sample", action="store_true", default=None, help="sample instead of greedy search")
            p.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
            p.add_argument("--top-p", type=float, help="sample within this cumulative probability")
            p.add_argument("--min-p", type=float, help="drop tokens below this fraction of the top probability")
            p.add_argument("--temperature", type=float, help="divide the logits by this before sampling")
            p.add_argument("--repetition-penalty", type=float, help="penalize tokens already in the sequence")
            p.add_argument("--seed", type=int, help="the sampling seed (the same seed gives the same tokens)")
            p.add_argument("--ngram-size", type=int, help="speculative decoding by n-gram lookup: the sequence's "
                           "earlier continuation of its last N-1 tokens is checked in one run (2 to 16; the tokens "
                           "are those of plain decoding)")
            p.add_argument("--draft-tokens", type=int, help="proposals checked per run with --ngram-size or a "
                           "package's draft model (model.draft; 1 to 16, default the package's, else 4)")
    w = sub.add_parser("warm", help="compile everything the package needs ahead of time (cached for later starts)")
    w.add_argument("package", help="the package folder")
    w.add_argument("--digests", action="store_true",
                   help="also record a digest of each model's data files beside them, so that later loads refuse "
                        "data damaged since (runtime.digests)")
    _backend_options(w)
    _serve_options(sub.add_parser("serve", help="an OpenAI-compatible HTTP server over the serving engine"))
    args = ap.parse_args(argv)
    try:
        if args.cmd == "warm":
            from .warm import warm
            print(warm(args.package, args.native, args.device, digests=args.digests).summary())
            return 0
        if args.cmd == "serve":
            return cmd_serve(args)
        return cmd_parity(args) if args.cmd == "parity" else cmd_generate(args)
    except _user_errors() as exc:
        print(f"python -m pipeline {args.cmd}: error: {exc}", file=sys.stderr)
        return 2


def _backend_options(p):
    p.add_argument("--native", default="all", help="the components that run natively: their names, 'all' (the "
                   "default) or 'none' (all on onnxruntime)")
    p.add_argument("--device", default="cpu", help="where the native components run: cpu (default), cuda, cuda:N")


if __name__ == "__main__":
    sys.exit(main())
