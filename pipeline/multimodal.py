"""onnxruntime-genai's ``Images`` and ``MultiModalProcessor``: a prompt and its images to the model's inputs.

``Images.open(*paths)`` / ``Images.open_bytes(*blobs)`` hold encoded images; they are decoded by the
processor's ``DecodeImage`` step.  ``Model.create_multimodal_processor()`` reads the package's processor config
(``model.vision.config_filename``, default ``processor_config.json``) and returns a ``MultiModalProcessor``;
``processor(prompt, images=...)`` returns ``NamedTensors`` under onnxruntime-genai's nominal names.

The ``phi3v`` processor, as onnxruntime-genai's:

- each image runs the config's transforms (``pipeline/image_transforms.py``) to ``pixel_values``
  ``(17, 3, 336, 336)``, ``image_sizes`` ``(2,)`` and ``num_image_tokens``; the images are stacked, and
  ``pixel_values`` takes the vision model's input type (float32, float16 or bfloat16 rounded to nearest even);
- the prompt is split at its ``<|image_N|>`` tags; each piece is tokenized by the package's tokenizer with its
  options (no special token by default, as onnxruntime-genai's ``Tokenizer::Encode``) and tag ``N`` becomes
  ``num_image_tokens[N-1]`` copies of ``-N``; ``input_ids`` is ``(1, length)`` int32. The tags must name each
  image once (onnxruntime-genai's wording for a mismatch).

The Qwen processor (``qwen2_5_vl``, ``qwen3_vl``, ``qwen3_5``, ``fara``), as onnxruntime-genai's: each image runs
the config's chain (``smart_resize`` ... ``PatchImage``) to ``pixel_values`` patches and an ``image_grid_thw``
row; each ``<|vision_start|>`` of the prompt, up to its ``<|vision_end|>``, becomes ``<|vision_start|>``, one
``<|image_pad|>`` per merged patch group (``t * h * w / spatial_merge_size**2``) and ``<|vision_end|>``; an empty
prompt gets one such span per image; the count of spans must equal the count of images (its wording).

The ``gemma3`` processor: each image through the config's chain to ``(3, 896, 896)``, stacked; each
``<start_of_image>`` becomes two newlines, itself, 256 ``<image_soft_token>``, ``<end_of_image>`` and two
newlines (an empty prompt gets one per image); ``token_type_ids`` mark the soft tokens.

The ``phi4mm`` processor (Phi-4-multimodal), as onnxruntime-genai's: each image through the vision config's
chain (``Phi4VisionDynamicPreprocess`` ... ``Phi4VisionProcessor``: a global 448 x 448 view and up to
``dynamic_hd`` 448 x 448 crops, with their 32 x 32 masks), stacked and padded to the largest crop count; each
clip through the speech config's chain (``AudioDecoderEx``, ``Phi4AudioEmbed``: 80 log-mel features per 10 ms at
16 kHz or 8 kHz), stacked; the prompt's ``<|image_N|>`` and ``<|audio_N|>`` tags become the ids 200010 and 200011,
expanded in order to each image's ``num_image_tokens`` and each clip's ``audio_sizes``; ``audio_projection_mode``
says which came.

The ``gemma4`` processor (Gemma 4), as onnxruntime-genai 0.18's: each image through ``Gemma4ImageTransform``
(an aspect-preserving bicubic resize to multiples of 48 pixels within the soft-token budget, 16-pixel patches and
their (column, row) positions), stacked with zero pixels and (-1, -1) positions after the shorter ones; each
``<|image>`` (or ``<|image|>``, or a tag put before the text) becomes its image's run of ``<|image|>`` between
``<|image>`` and ``<image|>`` and blank lines; one clip through ``Gemma4LogMel``, its run of ``<|audio|>``
(the frames halved twice) put at its ``<|audio|>``; ``token_type_ids`` mark the image tokens.

The ``mistral3`` processor (Mistral 3's Pixtral image side), as onnxruntime-genai 0.18's: each image through the
config's chain (``smart_resize`` to multiples of ``patch_size * spatial_merge_size``, ... ``PixtralImageSizes``),
stacked zero-padded to the largest with ``image_sizes``; each ``[IMG]`` of the prompt (a run of them counts as
one) becomes the next image's rows of ``[IMG]``, each row closed by ``[IMG_BREAK]`` and the last by ``[IMG_END]``;
images left over go after the first ``[INST]`` (first of all without one); ``num_image_tokens`` counts the
``[IMG]`` (0 without images).  Its vision model runs once per image on the image's own size (``run_per_image``).
Difference: onnxruntime-genai 0.18 stacks images of different sizes into the last image's size and then fails;
here they are padded to the largest and run.

The ``lfm2_vl`` processor (LFM2-VL), as onnxruntime-genai 0.18's: each image through the config's chain (``smart_resize``
... ``PixtralImageSizes``), cut into ``patch_size`` squares row by row, all padded to ``model.vision.max_num_patches``
with ``image_attention_mask`` over each image's own and ``image_sizes`` its patch grid; the prompt must hold one
``<image>`` per image, each becoming ``<|image_start|>``, one ``<image>`` per token of its grid downsampled by
``spatial_merge_size`` and ``<|image_end|>``.  The vision model runs once over all images.  Difference: images of
different sizes are padded to the largest here, where onnxruntime-genai 0.18 stacks them wrongly and fails.

The ``videochat_flash_qwen`` processor (VideoChat-Flash), as onnxruntime-genai 0.18's: the images are frames of one
size through the config's chain, stacked channels first (transposed when they come out channels last) as
``pixel_values`` ``(1, frames, C, H, W)`` with ``image_grid_thw`` rows (1, H, W); the prompt needs one
``<|vision_start|>`` per frame, each marker with what follows up to its ``<|vision_end|>`` becoming
``num_visual_tokens`` ``<|image_pad|>`` between the two (onnxruntime-genai's scan, quirks kept: a marker without an
end takes the next one's, and the text between is repeated).

The ``gemma4_unified`` processor (Gemma 4 unified), as onnxruntime-genai 0.18's: Gemma 4's, with every image's
patches padded to the budget's most (``max_soft_tokens * pooling_kernel_size**2``, zeros and (-1, -1)) and one
``<|audio|>`` per feature frame (not a quarter of them).

The ``lfm2_audio`` processor (LFM2-Audio) is ``pipeline/lfm2_audio.py``'s: each clip's normalised log-mel
(``audio_embeds``, ``audio_lengths``) and ``ceil(frames / subsampling_factor)`` copies of ``model.audio_token_id``
at each ``<|audio|>`` (``audio_sizes``).

The ``whisper`` processor: each clip through ``audio_processor_config.json``'s steps (``pipeline/audio.py``) to
log-mel ``audio_features`` ``(n_mel, 3000)``, stacked; the prompt (or one per clip) encoded as a right-padded
``input_ids`` batch.

Only these are implemented.  Another multimodal type is a ``NotImplementedError`` naming it; a text
decoder is a ``RuntimeError`` with onnxruntime-genai's words.  Known difference: JPEG images are decoded by
Pillow (libjpeg-turbo), onnxruntime-genai's by IJG libjpeg 9, whose chroma upsampling differs, so JPEG pixel
values differ by a few grey levels at colour edges; PNG and other lossless images give the same pixels.
"""
from __future__ import annotations

import json
import os
import re

import numpy as np

from .image_transforms import TRANSFORMS, UnsupportedTransform, gemma4_image_transform
from .package_checks import graph_ports, resolve_in_package
from .spec import ComponentSpec, RequestError

__all__ = ["Images", "MultiModalProcessor", "create_processor", "run_per_image", "PROCESSOR_TYPES", "QWEN_TYPES"]

_MULTIMODAL_TYPES = {"phi3v", "phi4mm", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "fara", "gemma3", "gemma4",
                     "mistral3", "lfm2_vl", "lfm2_audio", "gemma4_unified", "videochat_flash_qwen", "whisper",
                     "parakeet"}
_IMAGE_TAG = re.compile(r"<\|image_\d+\|>")
QWEN_TYPES = {"qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe", "fara"}
# the image processors (phi4mm's and gemma4's also take clips); ``whisper`` has the audio one
PROCESSOR_TYPES = {"phi3v", "phi4mm", "gemma3", "gemma4", "gemma4_unified", "mistral3", "lfm2_vl",
                   "videochat_flash_qwen", "lfm2_audio"} | QWEN_TYPES
_AUDIO_TAG = re.compile(r"<\|audio_\d+\|>")
_PHI4_IMAGE, _PHI4_AUDIO = 200010, 200011  # <|endoftext10|>, <|endoftext11|>: onnxruntime-genai fixes these ids
_G4_BOI, _G4_IMAGE, _G4_EOI = "<|image>", "<|image|>", "<image|>"
_PIXTRAL_TOKENS = ("[IMG]", "[IMG_BREAK]", "[IMG_END]", "[INST]")
_LFM2_IMAGE, _LFM2_START, _LFM2_END = "<image>", "<|image_start|>", "<|image_end|>"
_G4_BOA, _G4_AUDIO, _G4_EOA = "<|audio>", "<|audio|>", "<audio|>"
_BOI, _IMAGE_SOFT, _EOI, _GEMMA_IMAGE_TOKENS = "<start_of_image>", "<image_soft_token>", "<end_of_image>", 256
_VISION_START, _VISION_END, _IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"


class Blobs:
    """Encoded files (images, audio), in the order given; ``WHAT`` names them in messages."""

    WHAT = "File"

    def __init__(self, blobs: list):
        self.blobs = list(blobs)

    @classmethod
    def open(cls, *paths):
        blobs = []
        for p in paths:
            p = os.fspath(p)
            if not os.path.isfile(p):
                raise RequestError(f"{cls.WHAT} path does not exist: {p}")
            with open(p, "rb") as fh:
                blobs.append(fh.read())
        return cls(blobs)

    @classmethod
    def open_bytes(cls, *blobs):
        for b in blobs:
            if not isinstance(b, (bytes, bytearray, memoryview)):
                raise TypeError(f"{cls.__name__}.open_bytes: expected bytes, got {type(b).__name__}")
        return cls([bytes(b) for b in blobs])

    def __len__(self):
        return len(self.blobs)


class Images(Blobs):
    """Encoded images, in the order given."""

    WHAT = "Image"


def _steps(path: str, keys: tuple, table: dict, what: str) -> list:
    """(function, attrs) of each step a processor config lists under ``keys`` (``processor.transforms``, or
    ``feature_extraction.sequence``), each ``{"operation": {"type", "attrs"}}`` found in ``table``; attributes
    whose names start with ``_`` are comments."""
    try:
        with open(path, encoding="utf-8") as fh:
            steps = json.load(fh)
        for k in keys:
            steps = steps[k]
        out = [(s["operation"]["type"], {k: v for k, v in (s["operation"].get("attrs") or {}).items()
                                         if not k.startswith("_")}) for s in steps]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RequestError(f"{what} config {path!r}: expected {'.'.join(keys)} with an operation type each "
                           f"({type(exc).__name__}: {exc})") from None
    unknown = [t for t, _ in out if t not in table]
    if unknown:
        raise UnsupportedTransform(f"{what} config {path!r}: step(s) {unknown} are not implemented here "
                                   f"(implemented: {sorted(table)})")
    return [(table[t], a) for t, a in out]


def _round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` in the model input's type (rounded to nearest even)."""
    if dtype == "bfloat16":
        import ml_dtypes
        return values.astype(ml_dtypes.bfloat16)
    return values.astype(np.float16 if dtype == "float16" else np.float32)


class MultiModalProcessor:
    """A package's prompt-and-image processor (``PROCESSOR_TYPES``); ``decode`` and ``create_stream`` are its
    tokenizer's."""

    def __init__(self, model):
        from .api import Tokenizer
        spec = model.spec
        kind = spec.model_type or ""
        self.tokenizer = Tokenizer(model)
        self.kind = kind
        if kind == "whisper":
            self._init_whisper(spec)
            return
        if kind not in PROCESSOR_TYPES:
            if kind in _MULTIMODAL_TYPES:
                raise NotImplementedError(f"MultiModalProcessor: the {kind} processor is not implemented here "
                                          f"(implemented: {', '.join(sorted(PROCESSOR_TYPES))})")
            raise RequestError(f"MultiModalProcessor cannot be created. {kind} is not a registered multi-modal "
                               f"model type.")
        if kind == "lfm2_audio":
            self._init_lfm2_audio(spec)
            return
        if kind in ("phi4mm", "gemma4", "gemma4_unified"):
            self._init_speech(spec)
        if not spec.vision_config or not spec.vision_config.get("filename"):
            raise RequestError("MultiModalProcessor: the package has no model.vision section with a filename")
        self.kind = "qwen" if kind in QWEN_TYPES else "gemma4" if kind == "gemma4_unified" else kind
        self.unified = kind == "gemma4_unified"
        section = spec.vision_config or {}
        self.merge = int(section.get("spatial_merge_size", 2))
        self.patch = int(section.get("patch_size", 14))
        self.max_patches = int(section.get("max_num_patches", 0))
        if kind == "videochat_flash_qwen" and int(section.get("num_visual_tokens", 0)) <= 0:
            raise RequestError("videochat_flash_qwen requires vision.num_visual_tokens > 0 in genai_config.json")
        self.visual_tokens = int(section.get("num_visual_tokens", 0))
        self.steps = _steps(resolve_in_package(spec.root, section.get("config_filename", "processor_config.json"),
                                               "model.vision.config_filename"), ("processor", "transforms"),
                            TRANSFORMS, "processor")
        self.pixel_type = _input_type(_model_of(spec, "vision", section),
                                      (section.get("inputs") or {}).get("pixel_values", "pixel_values"))

    def _init_speech(self, spec):
        """Phi-4-multimodal's or Gemma 4's audio side, when the package has one: the speech section's processor
        config (``audio_feature_extraction.json`` steps, ``pipeline/audio.py``) and its model's feature type; the
        vision model's mask (Phi-4) or position (Gemma 4) input type.  A speech model without its processor config
        is onnxruntime-genai's error."""
        from .audio import AUDIO_STEPS
        self.audio_steps = None
        speech = spec.speech_config or {}
        name = speech.get("config_filename", "audio_processor_config.json")
        path = resolve_in_package(spec.root, name, "model.speech.config_filename") if name else None
        if path is not None and os.path.isfile(path):
            self.audio_steps = _steps(path, ("feature_extraction", "sequence"), AUDIO_STEPS, "audio processor")
            self.audio_type = _input_type(_model_of(spec, "speech", speech),
                                          (speech.get("inputs") or {}).get("audio_embeds", "audio_embeds"))
        elif speech.get("filename"):
            raise RequestError(f"Speech model is configured (speech.filename={speech['filename']}) but the audio "
                               f"processor config file was not found at: {path}")
        vision = spec.vision_config or {}
        vcomp = _model_of(spec, "vision", vision)
        vin = vision.get("inputs") or {}
        if spec.model_type == "phi4mm":
            self.mask_type = _input_type(vcomp, vin.get("attention_mask", "image_attention_mask"))
        else:  # Gemma 4's patch positions: int32 or int64, as the vision model takes them
            ins, _ = graph_ports(vcomp.filename, vcomp.data)
            port = vin.get("pixel_position_ids", "pixel_position_ids")
            self.position_type = np.int32 if port in ins and ins[port][1] == "int32" else np.int64

    def _init_lfm2_audio(self, spec):
        """LFM2-Audio's processor (``pipeline/lfm2_audio.py``): the speech model's mel and length inputs checked
        as onnxruntime-genai checks them, the mel settings, the placeholder id."""
        from .lfm2_audio import MelConfig
        model = spec.model_keys
        speech = spec.speech_config or {}
        names = speech.get("inputs") or {}
        comp = _model_of(spec, "speech", speech)
        ins, _ = graph_ports(comp.filename, comp.data)
        for key, default in (("audio_embeds", "audio_embeds"), ("audio_lengths", "audio_lengths")):
            port = names.get(key, default)
            if port not in ins:
                raise RequestError(f"Lfm2AudioProcessor: the speech model has no input named \"{port}\". Point "
                                   f"model.speech.inputs.{key} in genai_config.json at the name the speech model "
                                   f"uses.")
            dtype = ins[port][1]
            if key == "audio_embeds" and dtype not in ("float32", "float16"):
                raise RequestError(f"Lfm2AudioProcessor: speech input \"{port}\" must be float or float16, got "
                                   f"{dtype}.")
            if key == "audio_lengths" and dtype != "int64":
                raise RequestError(f"Lfm2AudioProcessor: speech input \"{port}\" must be int64, got {dtype}.")
            if key == "audio_embeds":
                self.audio_type = dtype
        token = model.get("audio_token_id", 0)
        if not isinstance(token, int) or isinstance(token, bool) or token <= 0:
            raise RequestError("Lfm2AudioProcessor: model.audio_token_id must be set in genai_config.json to the id "
                               "the embedding model replaces with the audio features.")
        vocab = spec.vocab_size
        if isinstance(vocab, int) and vocab > 0 and token >= vocab:
            raise RequestError(f"Lfm2AudioProcessor: model.audio_token_id {token} is outside the vocabulary of "
                               f"{vocab} tokens.")
        factor = model.get("subsampling_factor", 0)
        self.audio_token = token
        self.subsampling = int(factor) if isinstance(factor, (int, float)) and factor > 0 else 8
        self.mel = MelConfig.from_model(model)

    def _lfm2_audio(self, prompt, audios):
        """LFM2-Audio: each clip's normalised log-mel and its placeholders at its ``<|audio|>`` (the module
        docstring of ``pipeline/lfm2_audio.py``)."""
        from .api import NamedTensors
        from .audio import decode_clip
        from .lfm2_audio import MARKER, lfm2_mel, resample
        if isinstance(prompt, (list, tuple)):
            if len(prompt) != 1:
                raise RequestError(f"Lfm2AudioProcessor: batched prompts are not supported; got {len(prompt)} "
                                   f"prompts. Pass a single prompt string.")
            prompt = prompt[0] or ""
        blobs = audios.blobs if audios is not None else []
        pieces = prompt.split(MARKER)
        if len(pieces) - 1 != len(blobs):
            raise RequestError(f"Lfm2AudioProcessor: the prompt contains {len(pieces) - 1} {MARKER} markers but "
                               f"{len(blobs)} audio clips were provided. Put exactly one {MARKER} in the prompt per "
                               f"clip.")
        mels = [lfm2_mel(resample(*decode_clip(blob), self.mel.sample_rate), self.mel) for blob in blobs]
        tokens = [-(-m.shape[0] // self.subsampling) for m in mels]
        ids = []
        for i, piece in enumerate(pieces):
            if piece:
                ids += self.tokenizer.encode(piece).tolist()
            if i < len(tokens):
                ids += [self.audio_token] * tokens[i]
        out = NamedTensors()
        out["input_ids"] = np.asarray(ids, np.int32).reshape(1, -1)
        if not mels:
            out["audio_sizes"] = np.zeros(1, np.int64)
            return out
        longest = max(m.shape[0] for m in mels)
        batch = np.zeros((len(mels), longest, self.mel.num_mels), np.float32)
        for i, m in enumerate(mels):
            batch[i, :m.shape[0]] = m
        out["audio_embeds"] = _round_to(batch, self.audio_type)
        out["audio_lengths"] = np.asarray([m.shape[0] for m in mels], np.int64)
        out["audio_sizes"] = np.asarray(tokens, np.int64)
        return out

    def _init_whisper(self, spec):
        """The audio processor: ``audio_processor_config.json`` (``model.speech.config_filename``), its
        ``feature_extraction.sequence`` of steps (``pipeline/audio.py``), the encoder's feature type."""
        from .audio import AUDIO_STEPS
        name = (spec.speech_config or {}).get("config_filename", "audio_processor_config.json")
        path = resolve_in_package(spec.root, name, "model.speech.config_filename")
        self.steps = _steps(path, ("feature_extraction", "sequence"), AUDIO_STEPS, "audio processor")
        enc = spec.components.get("encoder")
        if enc is None:
            raise RequestError("MultiModalProcessor: the Whisper package has no model.encoder section")
        self.pixel_type = _input_type(enc, "audio_features")

    def _whisper(self, prompt, audios):
        """Whisper: each clip's log-mel features stacked (``audio_features``); the prompt, or one per clip,
        encoded as a right-padded batch (``input_ids``), as onnxruntime-genai's ``EncodeBatch``."""
        from .api import NamedTensors
        if audios is None or not len(audios):
            raise RequestError("No audios provided to process.")
        if prompt is None or prompt == "" or prompt == []:
            raise RequestError("No prompt or prompts provided to WhisperProcessor::Process.")
        feats = [self._run_steps(blob) for blob in audios.blobs]
        out = NamedTensors()
        out["audio_features"] = _round_to(np.stack(feats), self.pixel_type)
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        out["input_ids"] = self.tokenizer.encode_batch(prompts).as_numpy()
        return out

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids)

    def create_stream(self):
        return self.tokenizer.create_stream()

    def __call__(self, prompt=None, images=None, audios=None, **kwargs):
        from .api import NamedTensors
        if kwargs:
            raise TypeError(f"MultiModalProcessor: unexpected argument(s) {sorted(kwargs)}")
        if self.kind == "whisper":
            return self._whisper(prompt, audios)
        if self.kind == "phi4mm":
            return self._phi4mm("" if prompt is None else prompt, images, audios)
        if self.kind == "gemma4":
            return self._gemma4("" if prompt is None else prompt, images, audios)
        if self.kind == "lfm2_audio":
            if images is not None:
                raise NotImplementedError("MultiModalProcessor: the lfm2_audio processor takes no images")
            return self._lfm2_audio("" if prompt is None else prompt, audios)
        if audios is not None:
            raise NotImplementedError("MultiModalProcessor: this processor takes no audio")
        if prompt is None:
            prompt = ""
        if not isinstance(prompt, str):
            raise TypeError(f"MultiModalProcessor: this processor takes one prompt string, got "
                            f"{type(prompt).__name__}")
        if self.kind == "qwen":
            return self._qwen(prompt, images)
        if self.kind == "gemma3":
            return self._gemma3(prompt, images)
        if self.kind == "mistral3":
            return self._mistral3(prompt, images)
        if self.kind == "lfm2_vl":
            return self._lfm2_vl(prompt, images)
        if self.kind == "videochat_flash_qwen":
            return self._videochat(prompt, images)
        out = NamedTensors()
        counts = []
        if images is not None and len(images):
            pixels, sizes = [], []
            for blob in images.blobs:
                pv, size, tokens = self._run_steps(blob)
                pixels.append(pv)
                sizes.append(size)
                counts.append(int(tokens[0]))
            out["input_ids"] = self._prompt_ids(prompt, counts)
            out["pixel_values"] = _round_to(np.stack(pixels), self.pixel_type)
            out["image_sizes"] = np.stack(sizes).astype(np.int64)
            out["num_image_tokens"] = np.asarray(counts, np.int64).reshape(-1, 1)
        else:
            out["input_ids"] = self._prompt_ids(prompt, counts)
        return out

    def _run_steps(self, blob, steps=None):
        value = blob
        for fn, attrs in (self.steps if steps is None else steps):
            value = fn(value, **attrs)
        return value

    def _phi4mm(self, prompt: str, images, audios):
        """Phi-4-multimodal: each image through the vision chain and each clip through the audio chain, stacked as
        onnxruntime-extensions stacks them; ``<|image_N|>`` and ``<|audio_N|>`` tags become the placeholder ids
        200010 and 200011, expanded in order (the k-th tag takes the k-th image's token count, whatever its N);
        ``audio_projection_mode`` says which of images and clips came (0 none, 1 images, 2 clips, 3 both)."""
        from .api import NamedTensors
        from .audio import phi4_audio_stack
        from .image_transforms import phi4_stack
        if not isinstance(prompt, str):
            raise TypeError(f"MultiModalProcessor: this processor takes one prompt string, got {type(prompt).__name__}")
        shots = [self._run_steps(blob) for blob in images.blobs] if images is not None and len(images) else []
        clips = self._clips(audios)
        out = NamedTensors()
        counts, sizes = [], []
        if shots:
            pixels, image_sizes, mask, tokens = phi4_stack(shots)
            out["pixel_values"] = _round_to(pixels, self.pixel_type)
            out["image_sizes"] = image_sizes
            out["image_attention_mask"] = _round_to(mask, self.mask_type)
            out["num_image_tokens"] = tokens
            counts = [int(t) for t in tokens.reshape(-1)]
        if clips:
            embeds, amask, asizes = phi4_audio_stack(clips)
            out["audio_embeds"] = _round_to(embeds, self.audio_type)
            out["audio_attention_mask"] = amask
            out["audio_sizes"] = asizes
            sizes = [int(float(a) + 0.5) for a in asizes.reshape(-1)]
        text = _AUDIO_TAG.sub("<|endoftext11|>", _IMAGE_TAG.sub("<|endoftext10|>", prompt))
        ids = []
        seen = {_PHI4_IMAGE: 0, _PHI4_AUDIO: 0}
        for t in self.tokenizer.encode(text).tolist():
            if t in seen:
                have = counts if t == _PHI4_IMAGE else sizes
                what = "image" if t == _PHI4_IMAGE else "audio"
                if seen[t] >= len(have):
                    raise RequestError(f"Number of {what} tokens exceeds the number of {what}s. Please fix the "
                                       f"prompt.")
                ids += [t] * have[seen[t]]
                seen[t] += 1
            else:
                ids.append(t)
        if seen[_PHI4_IMAGE] != len(counts):
            raise RequestError("Number of image tokens does not match the number of images. Please fix the prompt.")
        if seen[_PHI4_AUDIO] != len(sizes):
            raise RequestError("Number of audio tokens does not match the number of audios. Please fix the prompt.")
        out["input_ids"] = np.asarray(ids, np.int32).reshape(1, -1)
        out["audio_projection_mode"] = np.asarray([(1 if shots else 0) + (2 if clips else 0)], np.int64)
        return out

    def _clips(self, audios) -> list:
        if audios is None or not len(audios):
            return []
        if self.audio_steps is None:
            raise RequestError("Audio input was provided but audio/speech support is not configured. Ensure the "
                               "genai_config.json has a 'speech' section with both 'filename' and "
                               "'config_filename'.")
        return [self._run_steps(blob, self.audio_steps) for blob in audios.blobs]

    def _gemma4(self, prompt: str, images, audios):
        """Gemma 4, as onnxruntime-genai 0.18's processor: each image's patches and positions
        (``Gemma4ImageTransform``), stacked; the prompt's ``<|image>`` tags (or, when there are none, as many
        ``<|image|>`` as images, or else tags put before the text) each become two newlines, ``<|image>``, its
        image's soft-token count of ``<|image|>``, ``<image|>`` and two newlines; one clip's log-mel features
        (``Gemma4LogMel``), its all-true mask and ``audio_sizes`` (the frames halved twice, rounding up), its
        ``<|audio|>`` (or each ``<|audio>``, or the text's start) becoming the same run of ``<|audio|>``;
        ``token_type_ids`` mark the ``<|image|>`` ids.  Without images or clips only ``input_ids`` come back."""
        from .api import NamedTensors
        from .audio import gemma4_audio_sizes
        if not isinstance(prompt, str):
            raise TypeError(f"MultiModalProcessor: this processor takes one prompt string, got {type(prompt).__name__}")
        shots = [self._run_steps(blob) for blob in images.blobs] if images is not None and len(images) else []
        clips = self._clips(audios)
        out = NamedTensors()
        counts = [int(shot[2][0]) for shot in shots]
        n_audio = 0
        if clips:
            if len(clips) > 1:
                raise RequestError(f"Gemma4 audio processing currently supports only 1 audio clip per prompt, but "
                                   f"received {len(clips)} clips.")
            feats, mask = clips[0]
            n_audio = feats.shape[0] if self.unified else gemma4_audio_sizes(feats.shape[0])  # unified: one a frame
            out["audio_embeds"] = _round_to(feats[None], self.audio_type)
            out["audio_attention_mask"] = np.ones((1, feats.shape[0]), bool)
            out["audio_sizes"] = np.asarray([n_audio], np.int64)
        text = prompt
        if shots:
            if text.count(_G4_BOI) == 0:
                if 0 < text.count(_G4_IMAGE) == len(shots):
                    text = text.replace(_G4_IMAGE, _G4_BOI)
                else:
                    text = " ".join([_G4_BOI] * len(shots)) + (" " if text else "") + text
        found = text.count(_G4_BOI)
        if found != len(shots):
            raise RequestError(f"Prompt contained {found} image tokens but received {len(shots)} images.")
        pieces = text.split(_G4_BOI)
        text = pieces[0] + "".join("\n\n" + _G4_BOI + _G4_IMAGE * n + _G4_EOI + "\n\n" + rest
                                   for n, rest in zip(counts, pieces[1:]))
        if n_audio > 0:
            run = "\n\n" + _G4_BOA + _G4_AUDIO * n_audio + _G4_EOA + "\n\n"
            markers = text.count(_G4_AUDIO)
            if markers > 1:
                raise RequestError(f"Gemma4 audio processing currently supports only 1 audio clip per prompt, but "
                                   f"found {markers} audio markers in the prompt.")
            if markers == 1:
                text = text.replace(_G4_AUDIO, run, 1)
            elif _G4_BOA in text:
                text = text.replace(_G4_BOA, run)
            else:
                text = run + text
        ids = self.tokenizer.encode(text).astype(np.int32).reshape(1, -1)
        out["input_ids"] = ids
        if not shots and not clips:
            return out
        out["token_type_ids"] = (ids == self.tokenizer.to_token_id(_G4_IMAGE)).astype(np.int32)
        if shots:  # stacked as onnxruntime-genai 0.18 stacks them: zero pixels and (-1, -1) after the shorter ones
            most = max(shot[0].shape[0] for shot in shots)
            if self.unified:   # gemma4_unified: to the budget's most patches, whatever the images
                attrs = next((a for fn, a in self.steps if fn is gemma4_image_transform), {})
                most = max(most, int(attrs.get("max_soft_tokens", 280)) * int(attrs.get("pooling_kernel_size", 3)) ** 2)
            pixels = np.zeros((len(shots), most, shots[0][0].shape[1]), np.float32)
            positions = np.full((len(shots), most, 2), -1, np.int64)
            for i, (pv, pos, _) in enumerate(shots):
                pixels[i, :pv.shape[0]] = pv
                positions[i, :pos.shape[0]] = pos
            out["pixel_values"] = _round_to(pixels, self.pixel_type)
            out["num_image_tokens"] = np.asarray(counts, np.int64)
            out["pixel_position_ids"] = positions.astype(self.position_type)
        return out

    def _qwen(self, prompt: str, images):
        """Qwen2.5-VL / Qwen3-VL: the images' patches stacked (each image's padded with zero rows to the largest
        image's count, as onnxruntime-genai returns them), ``image_grid_thw`` a row per image, each
        ``<|vision_start|>...<|vision_end|>`` span of the prompt replaced by its image's ``<|image_pad|>``s."""
        from .api import NamedTensors
        out = NamedTensors()
        grids = None
        if images is not None and len(images):
            patches, rows = [], []
            for blob in images.blobs:
                value = self._run_steps(blob)
                if not (isinstance(value, tuple) and len(value) == 2):
                    raise RequestError("MultiModalProcessor: the processor config must end with PatchImage for "
                                       "a Qwen vision model")
                patches.append(value[0])
                rows.append(value[1])
            grids = np.concatenate(rows).astype(np.int64)
        pads = [] if grids is None else [int(t * h * w) // (self.merge * self.merge) for t, h, w in grids]
        text = prompt
        if not text:
            text = " ".join(f"{_VISION_START} {_VISION_END}" for _ in pads)
        starts = [m.start() for m in re.finditer(re.escape(_VISION_START), text)]
        if len(starts) != len(pads):
            raise RequestError(f"Prompt contained {len(starts)} vision_start tokens but received {len(pads)} images.")
        if pads:
            pieces, last = [], 0
            for at, n in zip(starts, pads):
                pieces.append(text[last:at] + _VISION_START + _IMAGE_PAD * n + _VISION_END)
                end = text.find(_VISION_END, at + len(_VISION_START))
                last = end + len(_VISION_END) if end >= 0 else at + len(_VISION_START)
            text = "".join(pieces) + text[last:]
        out["input_ids"] = self.tokenizer.encode(text).astype(np.int32).reshape(1, -1)
        if grids is not None:  # onnxruntime-genai stacks the images' patches padded with zero rows to the most
            most = max(p.shape[0] for p in patches)
            stacked = np.zeros((len(patches) * most, patches[0].shape[1]), np.float32)
            for i, p in enumerate(patches):
                stacked[i * most:i * most + p.shape[0]] = p
            out["pixel_values"] = _round_to(stacked, self.pixel_type)
            out["image_grid_thw"] = grids
        out["num_image_tokens"] = np.asarray([sum(pads)], np.int64)
        return out

    def _gemma3(self, prompt: str, images):
        """Gemma 3: the images' ``(3, H, W)`` stacked; each ``<start_of_image>`` of the prompt becomes two newlines,
        itself, 256 ``<image_soft_token>``, ``<end_of_image>`` and two newlines; ``token_type_ids`` mark the soft
        tokens.  Without images only ``input_ids`` come back (as onnxruntime-genai's)."""
        from .api import NamedTensors
        out = NamedTensors()
        pixels = [self._run_steps(blob) for blob in images.blobs] if images is not None and len(images) else []
        text = prompt
        if not text and pixels:
            text = " ".join([_BOI] * len(pixels))
        found = text.count(_BOI)
        if found != len(pixels):
            raise RequestError(f"Prompt contained {found} image tokens but received {len(pixels)} images.")
        if pixels:
            text = text.replace(_BOI, "\n\n" + _BOI + _IMAGE_SOFT * _GEMMA_IMAGE_TOKENS + _EOI + "\n\n")
        ids = self.tokenizer.encode(text).astype(np.int32).reshape(1, -1)
        out["input_ids"] = ids
        if not pixels:
            return out
        soft = self.tokenizer.to_token_id(_IMAGE_SOFT)
        out["token_type_ids"] = (ids == soft).astype(np.int32)
        out["pixel_values"] = _round_to(np.stack(pixels), self.pixel_type)
        out["num_image_tokens"] = np.asarray([_GEMMA_IMAGE_TOKENS], np.int64)
        return out

    def _sized_shots(self, images, who: str) -> list:
        """Each image through the processor config, whose last step must be ``PixtralImageSizes`` (each result the
        ``(3, H, W)`` image and its ``(H, W)``); [] without images."""
        shots = [self._run_steps(blob) for blob in images.blobs] if images is not None and len(images) else []
        for shot in shots:
            if not (isinstance(shot, tuple) and len(shot) == 2):
                raise RequestError(f"{who}: the processor config must end with Permute3D followed by "
                                   f"PixtralImageSizes (each image's (height, width))")
        return shots

    def _mistral3(self, prompt: str, images):
        """Mistral 3 (Pixtral), as onnxruntime-genai 0.18's: each image's ``(3, H, W)`` (``H`` and ``W`` multiples
        of ``patch_size * spatial_merge_size``) stacked, zero-padded to the largest, with ``image_sizes``; the
        prompt's ids with each ``[IMG]`` (a run of them counts as one) replaced by the next image's rows of
        ``[IMG]``, each row closed by ``[IMG_BREAK]`` and the last by ``[IMG_END]``; images left over go after the
        first ``[INST]`` (before everything when there is none); ``num_image_tokens`` is the count of ``[IMG]``
        (0 without images)."""
        from .api import NamedTensors
        from .image_transforms import pixtral_stack
        out = NamedTensors()
        img, brk, end, inst = (self.tokenizer.to_token_id(t) for t in _PIXTRAL_TOKENS)
        ids = self.tokenizer.encode(prompt).astype(np.int32).tolist() if prompt else []
        shots = self._sized_shots(images, "Mistral3ImageProcessor")
        if not shots:
            out["input_ids"] = np.asarray(ids, np.int32).reshape(1, -1)
            out["num_image_tokens"] = np.zeros(1, np.int64)
            return out
        pixels, sizes = pixtral_stack(shots)
        tile = self.patch * self.merge
        runs = []
        for i, (h, w) in enumerate(sizes.tolist()):
            if h % tile or w % tile:
                raise RequestError(f"Mistral3ImageProcessor: image {i} dimensions ({h}x{w}) must be divisible by "
                                   f"patch_size*merge_size ({tile}). Check smart_resize configuration.")
            rows, cols = h // tile, w // tile
            runs.append([t for r in range(rows) for t in [img] * cols + [brk if r < rows - 1 else end]])
        expanded, k, i = [], 0, 0
        while i < len(ids):
            if ids[i] == img and k < len(runs):
                expanded += runs[k]
                k += 1
                while i + 1 < len(ids) and ids[i + 1] == img:
                    i += 1
            else:
                expanded.append(ids[i])
            i += 1
        if k < len(runs):
            rest = [t for run in runs[k:] for t in run]
            at = expanded.index(inst) + 1 if inst in expanded else 0
            expanded = expanded[:at] + rest + expanded[at:]
        out["input_ids"] = np.asarray(expanded, np.int32).reshape(1, -1)
        out["pixel_values"] = _round_to(pixels, self.pixel_type)
        out["image_sizes"] = sizes
        out["num_image_tokens"] = np.asarray([sum(run.count(img) for run in runs)], np.int64)
        return out

    def _lfm2_vl(self, prompt: str, images):
        """LFM2-VL, as onnxruntime-genai 0.18's: each image's ``(3, H, W)`` cut into ``patch_size`` squares row by
        row (each square's pixels row by row, channels last), all images' padded with zeros to
        ``model.vision.max_num_patches`` (else the longest): ``pixel_values`` ``(N, patches, patch_size**2 * 3)``,
        ``image_attention_mask`` ``(N, patches)`` (1 over each image's own), ``image_sizes`` ``(N, 2)`` (patch rows and
        columns); the prompt must hold one ``<image>`` per image, each becoming ``<|image_start|>``, one ``<image>``
        per token of its downsampled grid (``ceil(rows / merge) * ceil(cols / merge)``) and ``<|image_end|>``;
        ``num_image_tokens`` is their sum (0 without images)."""
        from .api import NamedTensors
        from .image_transforms import pixtral_stack
        out = NamedTensors()
        shots = self._sized_shots(images, "Lfm2VlImageProcessor")
        if not shots:
            out["input_ids"] = self.tokenizer.encode(prompt).astype(np.int32).reshape(1, -1)
            out["num_image_tokens"] = np.zeros(1, np.int64)
            return out
        found = prompt.count(_LFM2_IMAGE)
        if found != len(shots):
            raise RequestError(f"Lfm2VlImageProcessor: the prompt contains {found} {_LFM2_IMAGE} tokens but "
                               f"{len(shots)} images were provided. Put exactly one {_LFM2_IMAGE} in the prompt "
                               f"per image.")
        pixels, sizes = pixtral_stack(shots)
        p, m = self.patch, self.merge
        if p <= 0 or m <= 0:
            raise RequestError("Lfm2VlImageProcessor: patch_size and spatial_merge_size must be positive.")
        grids = []
        for h, w in sizes.tolist():
            if h % p or w % p:
                raise RequestError(f"Lfm2VlImageProcessor: resized image ({h}x{w}) is not a whole number of {p}-pixel "
                                   f"patches. Check that the Resize step in processor_config.json uses the same "
                                   f"patch_size as model.vision in genai_config.json.")
            grids.append((h // p, w // p))
        longest = max(r * c for r, c in grids)
        count = self.max_patches if self.max_patches > 0 else longest
        for i, (r, c) in enumerate(grids):
            if r * c > count:
                raise RequestError(f"Lfm2VlImageProcessor: image {i} needs {r * c} patches, more than the {count} "
                                   f"allowed by model.vision.max_num_patches in genai_config.json.")
        n, channels = pixels.shape[0], pixels.shape[1]
        patches = np.zeros((n, count, p * p * channels), np.float32)
        mask = np.zeros((n, count), np.int64)
        tokens = []
        for i, (r, c) in enumerate(grids):
            img = pixels[i, :, :r * p, :c * p].reshape(channels, r, p, c, p)
            patches[i, :r * c] = img.transpose(1, 3, 2, 4, 0).reshape(r * c, p * p * channels)
            mask[i, :r * c] = 1
            tokens.append(-(-r // m) * -(-c // m))
        pieces = prompt.split(_LFM2_IMAGE)
        text = pieces[0] + "".join(_LFM2_START + _LFM2_IMAGE * t + _LFM2_END + rest
                                   for t, rest in zip(tokens, pieces[1:]))
        out["input_ids"] = self.tokenizer.encode(text).astype(np.int32).reshape(1, -1)
        out["pixel_values"] = _round_to(patches, self.pixel_type)
        out["image_attention_mask"] = mask
        out["image_sizes"] = np.asarray(grids, np.int64)
        out["num_image_tokens"] = np.asarray([sum(tokens)], np.int64)
        return out

    def _videochat(self, prompt: str, images):
        """VideoChat-Flash, as onnxruntime-genai 0.18's: the images (frames) through the config's chain, stacked
        and made channels first when they come out channels last (the smaller trailing axis), as ``pixel_values``
        ``(1, frames, C, H, W)`` with ``image_grid_thw`` ``(frames, 3)`` = (1, H, W); the prompt must hold one
        ``<|vision_start|>`` per frame, each with what follows it up to the next ``<|vision_end|>`` replaced by
        ``<|vision_start|>``, ``num_visual_tokens`` ``<|image_pad|>`` and ``<|vision_end|>`` (onnxruntime-genai's
        scan, kept as it is: a marker without its end takes the next marker's end, and the text between is
        repeated); ``num_image_tokens`` is frames times ``num_visual_tokens`` (0 without images)."""
        from .api import NamedTensors
        out = NamedTensors()
        frames = [np.asarray(self._run_steps(blob), np.float32) for blob in images.blobs] \
            if images is not None and len(images) else []
        text = prompt
        if frames:
            found = prompt.count(_VISION_START)
            if found != len(frames):
                raise RequestError(f"Prompt contained {found} vision_start tokens but received {len(frames)} "
                                   f"images.")
            text, last, at = "", 0, prompt.find(_VISION_START)
            while at != -1:
                text += prompt[last:] if at < last else prompt[last:at]
                text += _VISION_START + _IMAGE_PAD * self.visual_tokens + _VISION_END
                last = at + len(_VISION_START)
                end = prompt.find(_VISION_END, last)
                if end != -1:
                    last = end + len(_VISION_END)
                at = prompt.find(_VISION_START, at + len(_VISION_START))
            text += prompt[last:]
        out["input_ids"] = self.tokenizer.encode(text).astype(np.int32).reshape(1, -1)
        out["num_image_tokens"] = np.asarray([len(frames) * self.visual_tokens], np.int64)
        if not frames:
            return out
        if any(f.ndim != 3 or f.shape != frames[0].shape for f in frames):
            raise RequestError(f"VideoChatFlashProcessor: the frames must come out of the processor config as "
                               f"images of one size, got shapes {[list(f.shape) for f in frames]}")
        stack = np.stack(frames)
        if stack.shape[3] < stack.shape[1]:   # channels last
            stack = stack.transpose(0, 3, 1, 2)
        n, _, h, w = stack.shape
        out["pixel_values"] = _round_to(np.ascontiguousarray(stack)[None], self.pixel_type)
        out["image_grid_thw"] = np.tile(np.array([1, h, w], np.int64), (n, 1))
        return out

    def _prompt_ids(self, prompt: str, counts: list) -> np.ndarray:
        chunks = _IMAGE_TAG.split(prompt)
        tags = [int(t[8:-2]) for t in _IMAGE_TAG.findall(prompt)]
        if len(set(tags)) != len(counts):
            raise RequestError("Number of unique image tags does not match the number of images.")
        ids = []
        for i, chunk in enumerate(chunks):
            ids += self.tokenizer.encode(chunk).tolist()
            if i < len(tags):
                n = tags[i]
                if not 1 <= n <= len(counts):
                    raise RequestError(f"Encountered unexpected value of image_id in the prompt. Expected a value "
                                       f"<= {len(counts)}. Actual value: {n}")
                ids += [-n] * counts[n - 1]
        return np.asarray(ids, np.int32).reshape(1, -1)


def _model_of(spec, name: str, section: dict) -> ComponentSpec:
    """The package's component ``name`` (its file, or its bytes given in memory); a section the spec holds no
    component for (a model kept out of a text-only package) by its file."""
    comp = spec.components.get(name)
    if comp is not None:
        return comp
    return ComponentSpec(name, resolve_in_package(spec.root, section.get("filename", ""), f"model.{name}.filename"),
                         name)


def _input_type(comp: ComponentSpec, name: str) -> str:
    """The dtype name (``float32``, ``float16`` or ``bfloat16``) of the model's input ``name``."""
    ins, _ = graph_ports(comp.filename, comp.data)
    if name not in ins:
        raise RequestError(f"MultiModalProcessor: the model {comp.filename!r} has no input {name!r}")
    dtype = ins[name][1]
    if dtype not in ("float32", "float16", "bfloat16"):
        raise RequestError(f"MultiModalProcessor: the model's {name!r} is {dtype}; expected float32, float16 or "
                           f"bfloat16")
    return dtype


def create_processor(model) -> MultiModalProcessor:
    return MultiModalProcessor(model)


def run_per_image(component, feeds: dict, port: str, image_sizes) -> dict:
    """Mistral 3's (Pixtral's) vision run, as onnxruntime-genai 0.18's: one image's ``pixel_values`` run as they
    are; several (``(N, 3, max H, max W)``, zero-padded) run one at a time, each cut to its own ``image_sizes``
    row, and each output's rows are the images' in order."""
    pixels = np.asarray(feeds[port])
    if pixels.ndim != 4:
        raise RequestError(f"PixtralVisionState: expected 4D pixel_values [N,C,H,W], got {pixels.ndim}D")
    n = pixels.shape[0]
    if n <= 1:
        return component.run(feeds)
    if image_sizes is None:
        raise RequestError("PixtralVisionState: multi-image inputs require image_sizes metadata")
    sizes = np.asarray(image_sizes)
    if sizes.ndim != 2 or sizes.shape[1] != 2:
        raise RequestError(f"PixtralVisionState: image_sizes must be [N, 2], got {list(sizes.shape)}")
    if sizes.shape[0] < n:
        raise RequestError(f"PixtralVisionState: image_heights_ has {sizes.shape[0]} entries but num_images_ is {n}")
    outs = []
    for i in range(n):
        h, w = int(sizes[i, 0]), int(sizes[i, 1])
        for what, v, top in (("h_i", h, pixels.shape[2]), ("w_i", w, pixels.shape[3])):
            if not 0 < v <= top:
                raise RequestError(f"PixtralVisionState: image {i} has {what}={v} which is out of valid range "
                                   f"(0, {top}]")
        outs.append(component.run(dict(feeds, **{port: np.ascontiguousarray(pixels[i:i + 1, :, :h, :w])})))
    return {name: np.concatenate([o[name] for o in outs], axis=0) for name in outs[0]}

