"""Accuracy of an int4 package against the fp32 package built from the same weights: native int4 and onnxruntime
int4, each against onnxruntime fp32, teacher-forced.

A fixed sequence of token ids (``--tokens`` of them: a fixed English text through the package's tokenizer, repeated
as needed, or seeded random ids inside the vocabulary with ``--random``) goes through each decoder in one prefill
pass with an empty KV cache, which gives the logits after every prefix.  For every position the script compares
the int4 logits with the fp32 ones: top-1 agreement (the fraction of positions whose argmax is fp32's) and the mean
KL divergence ``KL(softmax(fp32) || softmax(int4))`` in float64.  The claim it checks: native int4 is at least as
close to fp32 as onnxruntime's int4 is (printed as ``native no worse: yes/no`` for each measure).

    python -m tools.int4_accuracy PKG_INT4 PKG_FP32 [--tokens 256] [--random] [--threads 2]

Both packages must have the same tokenizer and vocabulary (``make_genai_package.py`` with the same ``--seed`` and
sizes, ``--precision int4`` and ``fp32``).  The decoders must be dense (token ids, a mask, optional rank-2 positions,
KV caches): the inputs ``tools/level4_sensitivity`` feeds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime import cpu_env  # noqa: E402,F401  (first: settings numpy reads when it loads)

import numpy as np  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
        "To be or not to be, that is the question. All that glitters is not gold. Knowledge is power, and time "
        "is money; the early bird catches the worm while the pen is mightier than the sword. ")

__all__ = ["token_ids", "feeds", "compare", "main"]


def token_ids(pkg: str, n: int, random: bool = False, vocab: int | None = None) -> np.ndarray:
    """``n`` token ids: ``TEXT`` through the package's tokenizer.json (repeated), or seeded random ids."""
    if random:
        return np.random.default_rng(0).integers(1, vocab, n).astype(np.int64)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(pkg, "tokenizer.json"))
    ids = tok.encode(TEXT).ids
    while len(ids) < n:
        ids = ids + ids
    return np.array(ids[:n], np.int64)


def feeds(session_inputs, ids: np.ndarray, head_size: int) -> dict:
    """Prefill feeds of one sequence with an empty KV cache (a dense decoder's inputs only)."""
    f = {}
    x = ids[None]
    for i in session_inputs:
        if i.name == "input_ids":
            f[i.name] = x
        elif i.name == "attention_mask":
            f[i.name] = np.ones_like(x)
        elif i.name == "position_ids" and len(i.shape) == 2:
            f[i.name] = np.arange(x.shape[1], dtype=np.int64)[None]
        elif len(i.shape) == 4 and isinstance(i.shape[1], int) and not isinstance(i.shape[2], int):
            f[i.name] = np.zeros((1, i.shape[1], 0, head_size), np.float32)
        else:
            raise SystemExit(f"input {i.name!r} is not token ids, a mask, rank-2 positions or a KV cache: "
                             "use a dense decoder")
    return f


def _log_softmax(z):
    z = z.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def compare(ref, test) -> tuple:
    """(top-1 agreement, mean KL(softmax(ref) || softmax(test))) over positions of logits [T, V]."""
    lp, lq = _log_softmax(ref), _log_softmax(test)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    return float((ref.argmax(-1) == test.argmax(-1)).mean()), float(kl.mean())


def _logits(path, backend, f, threads):
    if backend == "ort":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    else:
        import runtime as rt
        so = rt.SessionOptions()
        so.intra_op_num_threads = threads
        s = rt.InferenceSession(path, so)
    names = [o.name for o in s.get_outputs()]
    return np.asarray(s.run(["logits"] if "logits" in names else [names[0]], f)[0])[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("int4", help="the int4 package folder")
    ap.add_argument("fp32", help="the fp32 package folder built from the same weights")
    ap.add_argument("--tokens", type=int, default=256, help="positions compared (default 256)")
    ap.add_argument("--random", action="store_true", help="seeded random token ids instead of the fixed text")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every session (default 2)")
    a = ap.parse_args(argv)
    from pipeline.metadata import load_package
    import onnxruntime as ort
    p4, p32 = load_package(a.int4).decoder.filename, load_package(a.fp32).decoder.filename
    with open(os.path.join(a.int4, "genai_config.json")) as fh:
        cfg = json.load(fh)["model"]
    head_size, vocab = int(cfg["decoder"]["head_size"]), int(cfg["vocab_size"])
    ids = token_ids(a.int4, a.tokens, a.random, vocab)
    f = feeds(ort.InferenceSession(p4, providers=["CPUExecutionProvider"]).get_inputs(), ids, head_size)
    ref = _logits(p32, "ort", f, a.threads)
    rows = {"onnxruntime int4": _logits(p4, "ort", f, a.threads), "native int4": _logits(p4, "native", f, a.threads)}
    print(f"{a.tokens} positions, teacher-forced, against onnxruntime fp32 ({os.path.basename(a.fp32.rstrip('/'))})")
    res = {}
    for name, lg in rows.items():
        res[name] = compare(ref, lg)
        print(f"{name:18s} top-1 agreement {res[name][0]:.4f}   mean KL {res[name][1]:.3e}")
    (ta, ka), (tn, kn) = res["onnxruntime int4"], res["native int4"]
    print(f"native no worse: top-1 {'yes' if tn >= ta else 'no'}, KL {'yes' if kn <= ka else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
