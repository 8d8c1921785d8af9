"""onnxruntime-genai's Python API over the pipeline, with its names, types and semantics.

    import pipeline as og
    model = og.Model("path/to/package")                 # or og.Model(og.Config(path)); backends: native=/device=
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(tokenizer.encode("Hello"))
    while not generator.is_done():
        generator.generate_next_token()
        print(generator.get_next_tokens()[0])

or in one call: ``og.generate(model, prompt_ids, max_new_tokens=16)``.  ``Generator`` lives in
``pipeline/generator.py``; a streaming speech package (``nemotron_speech``, ``parakeet_tdt``, Moonshine's
``streaming_enc_dec_asr``) gets ``pipeline/streaming_asr.py``'s generator and ``StreamingProcessor`` instead.

As in onnxruntime-genai: token ids come back as int32 arrays, a batch of encodings as a ``Tensor`` (right-padded
with the pad id), search options as floats and bools (``get_search_options``); an unknown search option or a
mistake onnxruntime-genai reports is a ``RuntimeError`` with its wording.  ``Config`` holds the package's
``genai_config.json`` with ``overlay`` mappings merged in and the providers to use (``cuda`` runs the native
components on the CUDA provider).  Which components run natively comes from ``native=`` or the environment
(``pipeline/backends.py``).
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from .backends import choice_from_environment, choice_from_names
from .generator import Generator
from .runner import Pipeline
from .sampling import Sampler
from .spec import RequestError
from .speculative import SPECULATIVE_KEYS, SpeculativeOptions, set_speculative_option

__all__ = ["Config", "Model", "Tokenizer", "Tensor", "NamedTensors", "GeneratorParams", "Generator", "generate",
           "SEARCH_KEYS"]

_PROVIDERS = {"cpu": "cpu", "cuda": "cuda", "cpuexecutionprovider": "cpu", "cudaexecutionprovider": "cuda"}


class Config:
    """A package's configuration before loading: ``overlay(json)`` merges a JSON object into its
    genai_config.json; ``clear_providers`` / ``append_provider(name)`` choose the device (``cpu`` or
    ``cuda``); ``set_provider_option`` records a provider's options; ``add_model_data(filename, data)`` gives a
    model file's bytes in memory (the file need not exist; its external data is read from the package folder)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.overlays = []
        self.providers = None  # None: the package's own choice (the CPU unless the caller says)
        self.provider_options = {}
        self.model_data = {}   # the config's filename of a model -> its bytes

    def add_model_data(self, model_filename: str, model_data):
        """The bytes of the model the config names ``model_filename`` (``bytes``, or a one-dimensional uint8
        buffer: ``bytearray``, ``memoryview``, a numpy array), used when a ``Model`` loads from this config."""
        if isinstance(model_data, bytes):
            data = model_data
        else:
            try:
                view = memoryview(model_data)
            except TypeError:
                raise RequestError("Unsupported input type. Expected bytes or buffer.") from None
            if view.ndim != 1 or view.format not in ("B", "<B", "=B"):
                raise RequestError("Expected a 1D buffer of uint8_t")
            data = view.tobytes()
        if not data:
            raise RequestError("Expected a valid model data pointer and length. Received nullptr or zero length.")
        name = str(model_filename)
        if name in self.model_data:
            raise RequestError(f"Model data for '{name}' was already added previously. If you want to replace it, "
                               f"please remove it first.")
        self.model_data[name] = data

    def remove_model_data(self, model_filename: str):
        name = str(model_filename)
        if name not in self.model_data:
            raise RequestError(f"Model data for '{name}' was not found.")
        del self.model_data[name]

    def overlay(self, json_text: str):
        try:
            d = json.loads(json_text)
        except json.JSONDecodeError as exc:
            raise RequestError(f"Config.overlay: invalid JSON: {exc}") from None
        if not isinstance(d, dict):
            raise RequestError(f"Config.overlay: expected a JSON object, got {type(d).__name__}")
        self.overlays.append(d)

    def clear_providers(self):
        self.providers = []

    def append_provider(self, name: str):
        """Adds ``name`` to the providers; as in onnxruntime-genai, a name is checked when the model loads."""
        self.providers = (self.providers or []) + [str(name)]
        self.provider_options.setdefault(str(name), {})

    def set_provider_option(self, provider: str, key: str, value: str):
        if provider not in (self.providers or []):
            self.append_provider(provider)
        self.provider_options[str(provider)][str(key)] = str(value)

    # -- device filters (onnxruntime's EP-device selection): recorded per provider, as onnxruntime-genai does ----
    def _filters(self, provider: str) -> list:
        """The device filters of every appended provider that ``provider`` names (none: nothing to set)."""
        kind = _PROVIDERS.get(str(provider).lower())
        return [self.provider_options.setdefault(p, {}).setdefault("device_filtering_options", {})
                for p in (self.providers or []) if p == provider or (kind and _PROVIDERS.get(p.lower()) == kind)]

    def set_decoder_provider_options_hardware_device_type(self, provider: str, hardware_device_type: str):
        """Which kind of device (``cpu``, ``gpu``, ``npu``, any case) an appended provider's device must be.  The
        filters are recorded with the provider's options (a provider not appended takes none); as in
        onnxruntime-genai, the CPU and CUDA providers do not select devices by them."""
        for f in self._filters(provider):
            kind = str(hardware_device_type).lower()
            if kind not in ("cpu", "gpu", "npu"):
                raise RequestError(f"Unsupported hardware device type: {hardware_device_type}")
            f["hardware_device_type"] = kind

    def set_decoder_provider_options_hardware_device_id(self, provider: str, hardware_device_id: int):
        for f in self._filters(provider):
            f["hardware_device_id"] = int(hardware_device_id)

    def set_decoder_provider_options_hardware_vendor_id(self, provider: str, hardware_vendor_id: int):
        for f in self._filters(provider):
            f["hardware_vendor_id"] = int(hardware_vendor_id)

    def clear_decoder_provider_options_hardware_device_type(self, provider: str):
        for f in self._filters(provider):
            f.pop("hardware_device_type", None)

    def clear_decoder_provider_options_hardware_device_id(self, provider: str):
        for f in self._filters(provider):
            f.pop("hardware_device_id", None)

    def clear_decoder_provider_options_hardware_vendor_id(self, provider: str):
        for f in self._filters(provider):
            f.pop("hardware_vendor_id", None)

    @property
    def device(self) -> str | None:
        """``cuda`` when a CUDA provider was appended, ``cpu`` when only the CPU, None when not said.  A provider
        this runtime does not have is a ``RuntimeError`` naming it."""
        if not self.providers:
            return None
        kinds = []
        for p in self.providers:
            kind = _PROVIDERS.get(p.lower()) if isinstance(p, str) else None
            if kind is None:
                raise RequestError(f"Unknown provider name '{p}'. Currently supported values are 'cpu'/"
                                   f"'CPUExecutionProvider' and 'cuda'/'CUDAExecutionProvider'.")
            kinds.append(kind)
        return "cuda" if "cuda" in kinds else "cpu"

    def merged_overlay(self) -> dict:
        from .genai_config import merged
        out = {}
        for d in self.overlays:
            out = merged(out, d)
        return out


class Model:
    """A loaded package (a path or a ``Config``).  ``native``: component names, 'all' or 'none' (default: the
    environment); ``device``: 'cpu' or 'cuda' (default: the config's providers)."""

    transducer = None  # a streaming speech model's sessions (pipeline/streaming_asr.py), else None

    def __init__(self, path_or_config, native=None, device=None, max_length=None):
        from .metadata import load_package
        from .streaming_asr import TRANSDUCER_TYPES, load_transducer, read_model_type
        config = path_or_config if isinstance(path_or_config, Config) else Config(path_or_config)
        if read_model_type(config.path, config.merged_overlay() or None) in TRANSDUCER_TYPES:
            if device is None and config.device == "cuda":
                from .environment import get_current_gpu_device_id
                device = f"cuda:{get_current_gpu_device_id()}"
            self.transducer, spec = load_transducer(config.path, config.merged_overlay() or None,
                                                    dict(config.model_data), native, device)
            self._setup(config, spec, None, False, max_length)
            return
        spec = load_package(config.path, config.merged_overlay() or None, dict(config.model_data))
        if device is None and config.device == "cuda":
            from .environment import get_current_gpu_device_id
            device = f"cuda:{get_current_gpu_device_id()}"
        dec = spec.decoder.name
        if native is None and device is None:
            choice = choice_from_environment([n for n in spec.components if n != dec], dec)
        else:
            choice = choice_from_names(spec, native if native is not None else "all", device)
        # the decoder put on onnxruntime by the caller's word (an argument or the environment), not by default
        on_ort = not choice.native_decoder and (
            native is not None or os.environ.get("ONNX_NUMBA_NATIVE_DECODER", "").strip() != "")
        self._setup(config, spec, choice, on_ort, max_length)
        # a draft decoder (speculative decoding): its spec is read and checked now, its sessions on first use
        self._draft_spec = (load_package(config.path, config.merged_overlay() or None, dict(config.model_data),
                                         draft=True) if spec.draft is not None else None)

    def _setup(self, config, spec, choice, decoder_on_onnxruntime, max_length):
        self.config, self.path, self.spec, self.choice = config, config.path, spec, choice
        self.decoder_on_onnxruntime = decoder_on_onnxruntime
        self.max_length = max_length
        self._pipeline = None
        self._pad = None
        self._draft = None
        self._draft_spec = None

    @property
    def draft_model(self) -> "Model":
        """The config's draft decoder (``model.draft``) as a model of its own, on this model's backend and device."""
        if self._draft_spec is None:
            raise RequestError("model.draft.filename is not set in genai_config.json.")
        if self._draft is None:
            choice = choice_from_names(self._draft_spec, "all" if self.choice.native_decoder else "none",
                                       self.choice.device)
            self._draft = Model.__new__(Model)
            self._draft._setup(self.config, self._draft_spec, choice, self.decoder_on_onnxruntime, self.max_length)
        return self._draft

    def create_multimodal_processor(self):
        """The package's prompt-and-image processor (``pipeline/multimodal.py``)."""
        from .multimodal import MultiModalProcessor
        if self.type == "parakeet_tdt":
            from .streaming_asr import ParakeetProcessor
            return ParakeetProcessor(self)
        if self.transducer is not None:
            raise RequestError(f"MultiModalProcessor cannot be created. {self.type} is not a registered multi-modal "
                               f"model type.")
        return MultiModalProcessor(self)

    def create_streaming_processor(self):
        """The streaming audio processor of a ``nemotron_speech`` or Moonshine ``streaming_enc_dec_asr`` package
        (``pipeline/streaming_asr.py``, ``pipeline/moonshine_streaming.py``)."""
        from .streaming_asr import StreamingProcessor
        return StreamingProcessor(self)

    @property
    def pad_token_id(self) -> int:
        """The id that pads a batch's rows, one rule for the tokenizer and the generator: the package's, else
        the tokenizer's, else the first EOS id, else 0."""
        if self._pad is None:
            pad = self.spec.pad_token_id
            if pad is None and self.spec.tokenizer_dir:
                from .tokenizer import Tokenizer as _Tok
                pad = _Tok(self.spec.tokenizer_dir).pad_token_id
            eos = self.spec.eos_token_ids
            self._pad = int(pad) if pad is not None else (int(eos[0]) if eos else 0)
        return self._pad

    @property
    def type(self) -> str:
        return self.spec.model_type or ""

    @property
    def device_type(self) -> str:
        if self.transducer is not None:
            return "CUDA" if self.transducer.device.startswith("cuda") else "CPU"
        return "CUDA" if self.choice.device.startswith("cuda") else "CPU"

    def _new_pipeline(self, max_length, batch=1):
        if self.spec.marian_ports is not None:
            from .marian import MarianPipeline
            return MarianPipeline(self.spec, self.choice, max_length, batch=batch)
        return Pipeline(self.spec, self.choice, max_length, batch=batch)

    @property
    def pipeline(self) -> Pipeline:
        if self._pipeline is None:
            self._pipeline = self._new_pipeline(self.max_length)
        return self._pipeline

    def pipeline_for(self, max_length: int, batch: int = 1) -> Pipeline:
        """The pipeline for ``batch`` rows, rebuilt when it runs another batch size or its decoder's caches cannot
        hold ``max_length`` positions."""
        p = self.pipeline
        if p.batch != batch or p.max_length < max_length:
            self._pipeline = self._new_pipeline(max(int(max_length), p.max_length), batch=batch)
        return self._pipeline


class Tensor:
    """A tensor as onnxruntime-genai hands it over: ``shape()``, ``as_numpy()``."""

    def __init__(self, array):
        self._a = np.asarray(array)

    def shape(self) -> list:
        return list(self._a.shape)

    def as_numpy(self) -> np.ndarray:
        return self._a

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


class NamedTensors(dict):
    """Named inputs for ``Generator.set_inputs``: name -> ``Tensor`` (an array assigned is wrapped in one, as
    onnxruntime-genai does)."""

    def __setitem__(self, name, value):
        super().__setitem__(name, value if isinstance(value, Tensor) else Tensor(value))

    def keys(self) -> list:
        """The names, as a list (deleting while iterating over them is allowed, as in onnxruntime-genai)."""
        return list(super().keys())


def _arrays(named: dict) -> dict:
    """name -> numpy array from a mapping of arrays or ``Tensor``s."""
    return {k: v.as_numpy() if isinstance(v, Tensor) else v for k, v in named.items()}


class Tokenizer:
    """The package's tokenizer with onnxruntime-genai's calls (ids as int32 arrays)."""

    def __init__(self, model: Model):
        from .tokenizer import Tokenizer as _Tok
        if not model.spec.tokenizer_dir:
            raise FileNotFoundError(f"package {model.path!r} has no tokenizer.json")
        self._tok = _Tok(model.spec.tokenizer_dir)
        spec = model.spec
        self.bos_token_id = _first(spec.bos_token_id, self._tok.bos_token_id, -1)
        self.pad_token_id = _first(spec.pad_token_id, self._tok.pad_token_id, -1)
        self._fill = model.pad_token_id  # what encode_batch pads with: the id the generator takes for padding
        eos = list(spec.eos_token_ids or []) or ([self._tok.eos_token_id] if self._tok.eos_token_id is not None else [])
        self.eos_token_ids = np.asarray(eos, np.int32)
        self._type = spec.model_type or ""
        self._tags = {}
        cfg = os.path.join(spec.root, "genai_config.json")
        if os.path.isfile(cfg):
            with open(cfg, encoding="utf-8") as fh:
                section = json.load(fh).get("model") or {}
            self._tags = {k: section[k] for k in ("bot_token_id", "eot_token_id", "bor_token_id", "eor_token_id")
                          if isinstance(section.get(k), int)}

    # tool-call and reasoning tags: genai_config's model section, else onnxruntime-genai's fallbacks by model type
    _TAG_FALLBACKS = {"qwen2": {"bot_token_id": 151657, "eot_token_id": 151658},
                      "qwen3": {"bot_token_id": 151657, "eot_token_id": 151658, "bor_token_id": 151667,
                                "eor_token_id": 151668},
                      "phi3": {"bot_token_id": 200025, "eot_token_id": 200026}}

    def _tag(self, key: str) -> int:
        value = self._tags.get(key, self._TAG_FALLBACKS.get(self._type, {}).get(key))
        if value is None:
            raise RequestError(f"{key} is not defined for this model")
        return int(value)

    bot_token_id = property(lambda self: self._tag("bot_token_id"), doc="The tool call's opening tag's id.")
    eot_token_id = property(lambda self: self._tag("eot_token_id"), doc="The tool call's closing tag's id.")
    bor_token_id = property(lambda self: self._tag("bor_token_id"), doc="The reasoning's opening tag's id.")
    eor_token_id = property(lambda self: self._tag("eor_token_id"), doc="The reasoning's closing tag's id.")

    def encode(self, text: str) -> np.ndarray:
        return self._tok.encode(text).astype(np.int32)

    def update_options(self, **options):
        """``add_special_tokens`` / ``skip_special_tokens`` (``"true"``/``"false"``), as onnxruntime-genai's."""
        self._tok.update_options(**options)

    def encode_batch(self, texts) -> Tensor:
        """The encodings of ``texts`` as one [n, longest] int32 ``Tensor``, right-padded with the pad id."""
        rows = self._tok.encode_batch(list(texts))
        out = np.full((len(rows), max((len(r) for r in rows), default=0)), self._fill, np.int32)
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return Tensor(out)

    def decode(self, ids) -> str:
        return self._tok.decode_genai(ids)

    def decode_batch(self, tokens) -> list:
        a = np.asarray(tokens.as_numpy() if isinstance(tokens, Tensor) else tokens)
        if a.ndim != 2:
            raise RequestError(f"decode_batch expects a 2-D batch of token ids, got shape {list(a.shape)}")
        return [self._tok.decode_genai(row) for row in a]

    def to_token_id(self, text: str) -> int:
        """The id of the vocabulary entry ``text``, -1 when it is not one."""
        t = self._tok.token_to_id(text)
        return -1 if t is None else int(t)

    def apply_chat_template(self, messages, *, template_str=None, tools=None, add_generation_prompt=True) -> str:
        """``messages`` (JSON text or a list of {role, content}) rendered by ``template_str`` or the package's
        chat template (``pipeline/chat_template.py``)."""
        from .chat_template import SPECIAL_TOKEN_KEYS, find_template, render
        from .tokenizer import token_text
        template = template_str or find_template(os.path.dirname(self._tok.path), self._tok.config)
        if not template:
            raise RequestError("Empty chat template.")
        special = {k: token_text(self._tok.config.get(k)) for k in SPECIAL_TOKEN_KEYS}
        return render(template, messages, tools, add_generation_prompt,
                      {k: v for k, v in special.items() if v is not None})

    def create_stream(self):
        return self._tok.create_stream()


def _first(*values):
    return next(int(v) for v in values if v is not None)


# onnxruntime-genai's search options: name -> (SearchOptions field, type).  ``diversity_penalty`` and
# ``chunk_size`` are accepted and change no result, as in onnxruntime-genai 0.18 (which ignores the first and
# uses the second only to split a long prefill).
SEARCH_KEYS = {"batch_size": ("batch_size", int), "chunk_size": ("chunk_size", int),
               "diversity_penalty": ("diversity_penalty", float), "do_sample": ("do_sample", bool),
               "early_stopping": ("early_stopping", bool), "length_penalty": ("length_penalty", float),
               "max_length": ("max_length", int), "min_length": ("min_length", int), "min_p": ("min_p", float),
               "no_repeat_ngram_size": ("no_repeat_ngram_size", int), "num_beams": ("num_beams", int),
               "num_return_sequences": ("num_return_sequences", int),
               "past_present_share_buffer": ("past_present_share_buffer", bool), "random_seed": ("seed", int),
               "repetition_penalty": ("repetition_penalty", float), "temperature": ("temperature", float),
               "top_k": ("top_k", int), "top_p": ("top_p", float),
               # LFM2-Audio's speech output (pipeline/lfm2_audio.py); get_search_options leaves them out, as there
               "audio_interleaved": ("audio_interleaved", bool), "audio_temperature": ("audio_temperature", float),
               "audio_top_k": ("audio_top_k", int)}
_UNREPORTED = {"audio_interleaved", "audio_temperature", "audio_top_k"}


class GeneratorParams:
    def __init__(self, model: Model):
        self.model = model
        self.search = dataclasses.replace(model.spec.search)
        self.extra_inputs = {}
        self.guidance = None  # (type, data): constrained decoding, pipeline/guidance.py
        self.speculative = dataclasses.replace(model.spec.speculative or SpeculativeOptions())

    def set_guidance(self, type: str, data: str, enable_ff_tokens: bool = False):
        """Constrain the generated tokens to a grammar: ``type`` ``json_schema``, ``regex`` or ``lark_grammar``
        (llguidance, ``pipeline/guidance.py``).  Forced tokens are not proposed here, so ``enable_ff_tokens``
        changes nothing (the tokens are the same)."""
        from .guidance import check_kind
        check_kind(type)
        self.guidance = (str(type), str(data))

    def set_search_options(self, **options):
        """onnxruntime-genai's search options (``SEARCH_KEYS``); an unknown name is a ``RuntimeError``."""
        for k in options:
            if k not in SEARCH_KEYS:
                raise RequestError(f"Unknown value \"{k}\" (the search options are {', '.join(sorted(SEARCH_KEYS))})")
        for k, v in options.items():
            field, t = SEARCH_KEYS[k]
            setattr(self.search, field, t(v))

    def get_search_options(self) -> dict:
        """Every option as onnxruntime-genai reports it: bools as bools, numbers as floats."""
        out = {}
        for k, (field, t) in sorted(SEARCH_KEYS.items()):
            if k in _UNREPORTED:
                continue
            v = getattr(self.search, field)
            if k == "random_seed" and v is None:
                v = -1
            out[k] = bool(v) if t is bool else float(v)
        return out

    def set_speculative_options(self, **options):
        """onnxruntime-genai's speculative options (``pipeline/speculative.py``): ``max_draft_tokens``,
        ``ngram_size``, ``ngram_chained_lookup``, ``min_adaptive_k``, ``cooldown``; its checks and messages."""
        for k, v in options.items():
            set_speculative_option(self.speculative, k, v)

    def get_speculative_options(self) -> dict:
        """Every speculative option as onnxruntime-genai reports it: bools as bools, numbers as floats."""
        return {k: bool(getattr(self.speculative, k)) if t is bool else float(getattr(self.speculative, k))
                for k, t in SPECULATIVE_KEYS.items()}

    def set_inputs(self, named=None, **more):
        """Extra inputs of prompt-only components, e.g. pixel_values=..."""
        self.extra_inputs.update(_arrays(dict(named or {}, **more)))


def generate(model: Model, prompt_ids, max_new_tokens=None, inputs=None, **search) -> list:
    """Generate in one call; ``inputs``: extra inputs of prompt-only components (e.g. pixel_values)."""
    params = GeneratorParams(model)
    if search:
        params.set_search_options(**search)
    s = params.search
    if model.spec.marian_ports is not None:  # an encoder-decoder: the Generator's loop
        ids = np.asarray(prompt_ids, np.int64).reshape(1, -1)
        if max_new_tokens is not None:
            params.set_search_options(max_length=ids.shape[1] + int(max_new_tokens))
        g = Generator(model, params)
        g.append_tokens(ids)
        while not g.is_done():
            g.generate_next_token()
        return g.get_sequence(0)[ids.shape[1]:].tolist()
    return model.pipeline.generate(prompt_ids, max_new_tokens, sampler=Sampler(s), search=s, external=inputs)

