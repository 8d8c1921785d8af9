"""Load a GenAI package folder into a ``PipelineSpec``.

Two package forms are read:

- ``genai_config.json`` as the onnxruntime-genai model builder writes it: one
  decoder whose KV-cache and recurrent-state port names are ``%d`` templates
  expanded over the layers.  Hybrid decoders (qwen3.5, lfm2) have attention
  caches on some layers and conv/recurrent states on the others, so a template
  is expanded only for the layer indices that exist in the decoder's ONNX
  graph.  A split VLM config (``vision`` / ``embedding`` / ``decoder``
  sections) becomes a three-component composite.
- ``inference_metadata.yaml``: a composite of components joined by dataflow
  edges and run in stages.  The schema is checked strictly: an unknown or
  contradictory key raises ``MetadataError`` naming its key path.

Text-only admission: a split VLM (vision, embedding, decoder) whose declared
image preprocessing cannot be represented here (Qwen's ``smart_resize``,
min/max pixel budgets) is admitted for text decoding: the vision component and
its edges are dropped, the embedding takes the prompt ids, its image-feature
input gets a zero-token absent value, and ``spec.text_only`` is set.

Invariants of every returned spec:
- every component file and tokenizer folder is inside the package folder and
  exists (``IncompletePackageError`` otherwise, also for ``..``/absolute paths);
- every port named in an ``io`` section or a dataflow edge is an input/output
  of that component's ONNX graph (read with ``load_external_data=False``);
- ``kv_inputs[i]`` pairs with ``kv_outputs[i]`` (per layer: key, then value);
- exactly one stage is autoregressive and its decoder is a component.

Attributes set on the spec beyond ``spec.py`` (fields it lacks):
``text_only_reason`` (str or None), ``sliding_window`` (the genai_config
``decoder.sliding_window`` dict or None), ``hidden_size`` and ``vocab_size``.
"""
from __future__ import annotations

import json
import os
import re

from .spec import (AbsentValue, ComponentSpec, Edge, IncompletePackageError, IOSpec, MetadataError, PipelineSpec,
                   Positions, SearchOptions, Stage, StatePair)

__all__ = ["load_package", "load_genai_config", "load_inference_metadata", "graph_ports", "resolve_in_package",
           "preprocessing_unrepresentable", "GENAI_CONFIG", "INFERENCE_METADATA"]

GENAI_CONFIG = "genai_config.json"
INFERENCE_METADATA = "inference_metadata.yaml"

# search keys the builder writes that only matter for beam search; accepted at their neutral values
_NEUTRAL_SEARCH = {"num_beams": 1, "num_return_sequences": 1, "no_repeat_ngram_size": 0, "diversity_penalty": 0.0,
                   "length_penalty": 1.0, "early_stopping": None}
_SEARCH_FIELDS = {"max_length": int, "min_length": int, "do_sample": bool, "top_k": int, "top_p": float,
                  "min_p": float, "temperature": float, "repetition_penalty": float,
                  "past_present_share_buffer": bool, "seed": int}
_DTYPES = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool"}
_RUN_ON = ("prompt_only", "every_step", "final_only")
_CONTINUATIONS = ("linear_increment", "carry_max")
_SEQUENCE_SOURCES = ("token_ids", "inputs_embeds")

# genai_config template keys: (input key, output key, kind)
_KV_TEMPLATES = (("past_key_names", "present_key_names"), ("past_value_names", "present_value_names"))
_STATE_TEMPLATES = (("past_conv_names", "present_conv_names"), ("past_recurrent_names", "present_recurrent_names"))


# ----------------------------------------------------------------------------------------------- entry point

def load_package(path) -> PipelineSpec:
    """Read the package at ``path`` (a folder, or its genai_config.json / inference_metadata.yaml)."""
    path = os.fspath(path)
    if os.path.isfile(path):
        root, name = os.path.split(os.path.abspath(path))
    else:
        root, name = os.path.abspath(path), None
        if not os.path.isdir(root):
            raise IncompletePackageError(f"package folder {path!r} does not exist")
        if os.path.isfile(os.path.join(root, INFERENCE_METADATA)):
            name = INFERENCE_METADATA
        elif os.path.isfile(os.path.join(root, GENAI_CONFIG)):
            name = GENAI_CONFIG
        else:
            raise IncompletePackageError(f"package folder {path!r} holds neither {INFERENCE_METADATA} nor "
                                         f"{GENAI_CONFIG}")
    if name.endswith((".yaml", ".yml")):
        return load_inference_metadata(root, name)
    if name.endswith(".json"):
        return load_genai_config(root, name)
    raise MetadataError(f"{path!r}: expected a {GENAI_CONFIG} or {INFERENCE_METADATA} file")


# ----------------------------------------------------------------------------------------------- helpers

def resolve_in_package(root: str, rel, key: str, *, must_exist: bool = True, kind: str = "file") -> str:
    """Absolute path of ``rel`` inside ``root``; refuses absolute paths and ``..``/symlink escapes."""
    if not isinstance(rel, str) or not rel:
        raise MetadataError(f"{key}: expected a relative path string, got {rel!r}")
    if os.path.isabs(rel) or re.match(r"^[A-Za-z]:[\\/]", rel):
        raise IncompletePackageError(f"{key}: path {rel!r} is absolute; package paths must stay inside {root}")
    real_root = os.path.realpath(root)
    full = os.path.realpath(os.path.join(real_root, rel))
    if os.path.commonpath([real_root, full]) != real_root:
        raise IncompletePackageError(f"{key}: path {rel!r} escapes the package folder {root}")
    if must_exist:
        ok = os.path.isdir(full) if kind == "folder" else os.path.isfile(full)
        if not ok:
            raise IncompletePackageError(f"{key}: {kind} {rel!r} is missing from the package folder {root}")
    return full


def _dtype_name(elem_type: int) -> str:
    from onnx import TensorProto
    name = TensorProto.DataType.Name(elem_type).lower()
    return {"float": "float32", "double": "float64", "float16": "float16"}.get(name, name)


def graph_ports(filename: str) -> tuple[dict, dict]:
    """(inputs, outputs) of an ONNX file: name -> (shape list of int|str|None, dtype name).

    Initializers listed as graph inputs (old exporters) are not ports.  External data is not read.
    """
    import onnx
    try:
        m = onnx.load(filename, load_external_data=False)
    except Exception as e:  # a truncated or non-ONNX file is a broken package
        raise IncompletePackageError(f"{filename}: not a readable ONNX model ({e})") from e
    inits = {t.name for t in m.graph.initializer}

    def info(v):
        tt = v.type.tensor_type
        shape = None
        if tt.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        return shape, _dtype_name(tt.elem_type)

    ins = {v.name: info(v) for v in m.graph.input if v.name not in inits}
    outs = {v.name: info(v) for v in m.graph.output}
    return ins, outs


class _Graphs:
    """Graph ports per component, loaded once per package."""

    def __init__(self):
        self._cache = {}

    def __call__(self, comp: ComponentSpec) -> tuple[dict, dict]:
        if comp.filename not in self._cache:
            self._cache[comp.filename] = graph_ports(comp.filename)
        return self._cache[comp.filename]


def _join(key: str, k) -> str:
    return f"{key}.{k}" if key else str(k)


def _check_keys(d, allowed, key: str):
    if not isinstance(d, dict):
        raise MetadataError(f"{key}: expected a mapping, got {type(d).__name__}")
    for k in d:
        if k not in allowed:
            raise MetadataError(f"{_join(key, k)}: unknown key (expected one of {', '.join(sorted(allowed))})")


def _req(d: dict, k: str, key: str):
    if k not in d or d[k] is None:
        raise MetadataError(f"{_join(key, k)}: required key is missing")
    return d[k]


def _str(v, key, optional=True):
    if v is None and optional:
        return None
    if not isinstance(v, str) or not v:
        raise MetadataError(f"{key}: expected a non-empty string, got {v!r}")
    return v


def _int(v, key, optional=True, minimum=None):
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or (minimum is not None and v < minimum):
        lim = f" >= {minimum}" if minimum is not None else ""
        raise MetadataError(f"{key}: expected an integer{lim}, got {v!r}")
    return v


def _eos_list(v, key) -> list:
    if v is None:
        return []
    vals = v if isinstance(v, list) else [v]
    return [_int(x, key, optional=False, minimum=0) for x in vals]


def _search(d, key: str, strict: bool) -> SearchOptions:
    s = SearchOptions()
    if d is None:
        return s
    if not isinstance(d, dict):
        raise MetadataError(f"{key}: expected a mapping, got {type(d).__name__}")
    for k, v in d.items():
        if k in _NEUTRAL_SEARCH:
            neutral = _NEUTRAL_SEARCH[k]
            if neutral is not None and v != neutral:
                raise MetadataError(f"{key}.{k}: only {neutral!r} is supported (no beam search), got {v!r}")
            continue
        if k not in _SEARCH_FIELDS:
            if strict:
                raise MetadataError(f"{key}.{k}: unknown key (expected one of {', '.join(sorted(_SEARCH_FIELDS))})")
            continue
        t = _SEARCH_FIELDS[k]
        if v is None and k == "seed":
            continue
        if t is bool:
            ok = isinstance(v, bool)
        elif t is int:
            ok = isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not ok:
            raise MetadataError(f"{key}.{k}: expected {t.__name__}, got {v!r}")
        setattr(s, k, t(v))
    checks = [("max_length", s.max_length >= 1), ("min_length", 0 <= s.min_length <= s.max_length),
              ("top_k", s.top_k >= 0), ("top_p", 0.0 < s.top_p <= 1.0), ("min_p", 0.0 <= s.min_p <= 1.0),
              ("temperature", s.temperature >= 0.0), ("repetition_penalty", s.repetition_penalty > 0.0)]
    for k, ok in checks:
        if not ok:
            raise MetadataError(f"{key}.{k}: value {getattr(s, k)!r} is out of range")
    return s


def _tokenizer_dir(root, rel, key):
    """The folder holding tokenizer.json; ``rel`` names the folder or the tokenizer.json file itself."""
    if isinstance(rel, str) and os.path.basename(rel.rstrip("/\\")) == "tokenizer.json":
        return os.path.dirname(resolve_in_package(root, rel, key))
    folder = resolve_in_package(root, rel, key, kind="folder")
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        raise IncompletePackageError(f"{key}: tokenizer folder {rel!r} has no tokenizer.json")
    return folder


# ----------------------------------------------------------------------------------------------- checks on graphs

def _check_io_ports(comp: ComponentSpec, graphs: _Graphs, key: str):
    """Every port the io section names must exist in the component's graph."""
    ins, outs = graphs(comp)
    io = comp.io
    wanted_in = [("token_input", io.token_input), ("inputs_embeds_input", io.inputs_embeds_input),
                 ("attention_mask_input", io.attention_mask_input), ("position_ids_input", io.position_ids_input)]
    wanted_in += [("kv_inputs", p) for p in io.kv_inputs] + [("state_pairs", sp.input) for sp in io.state_pairs]
    wanted_in += [("optional_inputs", p) for p in io.optional_inputs]
    wanted_out = [("logits_output", io.logits_output)] + [("kv_outputs", p) for p in io.kv_outputs]
    wanted_out += [("state_pairs", sp.output) for sp in io.state_pairs]
    for field_, port in wanted_in:
        if port is not None and port not in ins:
            raise IncompletePackageError(f"{key}.io.{field_}: {port!r} is not an input of {comp.filename} "
                                         f"(inputs: {', '.join(ins)})")
    for field_, port in wanted_out:
        if port is not None and port not in outs:
            raise IncompletePackageError(f"{key}.io.{field_}: {port!r} is not an output of {comp.filename} "
                                         f"(outputs: {', '.join(outs)})")


def _check_edges(spec: PipelineSpec, graphs: _Graphs, key: str):
    for i, e in enumerate(spec.dataflow):
        for end, comp_name, port, side in (("from", e.src, e.src_port, 1), ("to", e.dst, e.dst_port, 0)):
            comp = spec.components.get(comp_name)
            if comp is None:
                raise IncompletePackageError(f"{key}[{i}].{end}: component {comp_name!r} does not exist "
                                             f"(components: {', '.join(spec.components)})")
            ports = graphs(comp)[side]
            if port not in ports:
                what = "output" if side else "input"
                raise IncompletePackageError(f"{key}[{i}].{end}: {port!r} is not an {what} of component "
                                             f"{comp_name!r} ({comp.filename})")


def _position_rank(shape) -> int | None:
    """3 for mrope position ids ([3, batch, seq]), 1 for [batch, seq], None when the graph does not say."""
    if shape is None:
        return None
    if len(shape) == 3 and shape[0] == 3:
        return 3
    if len(shape) == 2:
        return 1
    return None


# ----------------------------------------------------------------------------------------------- genai_config

def _expand(template, n, key):
    if not isinstance(template, str) or template.count("%d") != 1:
        raise MetadataError(f"{key}: expected a name template with one %d, got {template!r}")
    return [template % i for i in range(n)]


def _decoder_io(sec: dict, n_layers: int, ins: dict, outs: dict, key: str, filename: str) -> IOSpec:
    inputs, outputs = sec.get("inputs") or {}, sec.get("outputs") or {}
    io = IOSpec()
    io.token_input = inputs.get("input_ids") if "inputs_embeds" not in inputs else None
    if "inputs_embeds" in inputs:
        io.sequence_source, io.inputs_embeds_input = "inputs_embeds", inputs["inputs_embeds"]
        io.token_input = None
    io.logits_output = outputs.get("logits")
    io.attention_mask_input = inputs.get("attention_mask")
    io.position_ids_input = inputs.get("position_ids")

    covered = [False] * n_layers

    def pairs(in_key, out_key):
        """Expanded (input, output) names for the layer indices present in the graph."""
        if in_key not in inputs and out_key not in outputs:
            return {}
        if in_key not in inputs or out_key not in outputs:
            missing = f"{key}.inputs.{in_key}" if in_key not in inputs else f"{key}.outputs.{out_key}"
            raise MetadataError(f"{missing}: required with its pair template")
        got = {}
        for i, (a, b) in enumerate(zip(_expand(inputs[in_key], n_layers, f"{key}.inputs.{in_key}"),
                                       _expand(outputs[out_key], n_layers, f"{key}.outputs.{out_key}"))):
            if (a in ins) != (b in outs):
                raise IncompletePackageError(f"{key}: layer {i} has {a if a in ins else b!r} but not its pair "
                                             f"{b if a in ins else a!r} in {filename}")
            if a in ins:
                got[i] = (a, b)
                covered[i] = True
        return got

    keys, values = (pairs(*t) for t in _KV_TEMPLATES)
    if set(keys) != set(values):
        raise IncompletePackageError(f"{key}: layers {sorted(set(keys) ^ set(values))} have a key cache without a "
                                     f"value cache (or the reverse) in {filename}")
    for i in sorted(keys):
        io.kv_inputs += [keys[i][0], values[i][0]]
        io.kv_outputs += [keys[i][1], values[i][1]]
    conv, rec = (pairs(*t) for t in _STATE_TEMPLATES)
    for i in range(n_layers):
        for d in (conv, rec):
            if i in d:
                io.state_pairs.append(StatePair(*d[i]))
    has_cache = any(t[0] in inputs for t in _KV_TEMPLATES + _STATE_TEMPLATES)
    if has_cache and not all(covered):
        raise IncompletePackageError(f"{key}: layers {[i for i, c in enumerate(covered) if not c]} have neither "
                                     f"a KV cache nor a recurrent state among the inputs of {filename}")
    return io


_ATTENTION_OPS = ("GroupQueryAttention", "MultiHeadAttention", "Attention", "PagedAttention")


def _check_decoder_geometry(dec: dict, decoder: ComponentSpec, ins: dict, n_layers: int, key: str) -> None:
    """The head counts, head size and layer count the config declares against the decoder graph: its cache
    inputs (heads at axis 1, head size at axis 3 where static) and its attention nodes' ``num_heads`` and
    ``kv_num_heads``.  A config that contradicts the graph would otherwise run and decode garbage."""
    import re

    import onnx
    kv = _int(dec.get("num_key_value_heads"), f"{key}.num_key_value_heads")
    heads = _int(dec.get("num_attention_heads"), f"{key}.num_attention_heads")
    hs = _int(dec.get("head_size"), f"{key}.head_size")
    caches = decoder.io.kv_inputs
    for name in caches:
        shape = ins.get(name, (None,))[0]
        if not shape or len(shape) != 4:
            continue
        if kv is not None and isinstance(shape[1], int) and shape[1] != kv:
            raise MetadataError(f"{key}.num_key_value_heads is {kv} but the graph's {name!r} has {shape[1]} heads "
                                f"(shape {shape})")
        if hs is not None and isinstance(shape[3], int) and shape[3] != hs:
            raise MetadataError(f"{key}.head_size is {hs} but the graph's {name!r} has head size {shape[3]} "
                                f"(shape {shape})")
    template = (((dec.get("inputs") or {}).get("past_key_names")) or "")
    if "%d" in template:
        pat = re.compile("^" + re.escape(template).replace("%d", r"(\d+)") + "$")
        layers = sorted({int(m.group(1)) for n in ins for m in [pat.match(n)] if m})
        if layers and layers[-1] >= n_layers:
            raise MetadataError(f"{key}.num_hidden_layers is {n_layers} but the graph has caches for "
                                f"{layers[-1] + 1} layers ({template % layers[-1]!r})")
    if heads is None and kv is None:
        return
    try:
        m = onnx.load(decoder.filename, load_external_data=False)
    except Exception:  # graph_ports read it already; nothing new to say
        return
    for n in m.graph.node:
        if n.op_type not in _ATTENTION_OPS:
            continue
        a = {x.name: x.i for x in n.attribute}
        if heads is not None and "num_heads" in a and a["num_heads"] != heads:
            raise MetadataError(f"{key}.num_attention_heads is {heads} but node {n.name!r} ({n.op_type}) has "
                                f"num_heads {a['num_heads']}")
        if kv is not None and a.get("kv_num_heads") and a["kv_num_heads"] != kv:
            raise MetadataError(f"{key}.num_key_value_heads is {kv} but node {n.name!r} ({n.op_type}) has "
                                f"kv_num_heads {a['kv_num_heads']}")


def load_genai_config(root: str, name: str = GENAI_CONFIG) -> PipelineSpec:
    """Spec of a builder-written package: one decoder, or a vision/embedding/decoder split VLM."""
    try:
        with open(os.path.join(root, name), encoding="utf-8") as f:
            cfg = json.load(f)
    except json.JSONDecodeError as e:
        raise MetadataError(f"{name}: not valid JSON ({e})") from e
    if not isinstance(cfg, dict):
        raise MetadataError(f"{name}: expected a JSON object at the top level")
    model = _req(cfg, "model", "genai_config")
    if not isinstance(model, dict):
        raise MetadataError("genai_config.model: expected a mapping")
    dec = _req(model, "decoder", "model")
    if not isinstance(dec, dict):
        raise MetadataError("model.decoder: expected a mapping")
    graphs = _Graphs()
    n_layers = _int(_req(dec, "num_hidden_layers", "model.decoder"), "model.decoder.num_hidden_layers",
                    optional=False, minimum=1)
    fname = resolve_in_package(root, _req(dec, "filename", "model.decoder"), "model.decoder.filename")
    decoder = ComponentSpec("decoder", fname, "decoder")
    ins, outs = graphs(decoder)
    decoder.io = _decoder_io(dec, n_layers, ins, outs, "model.decoder", fname)

    components, edges = {}, []
    for sec_name, ctype in (("vision", "vision_encoder"), ("embedding", "embedding")):
        sec = model.get(sec_name)
        if not isinstance(sec, dict) or not sec.get("filename"):
            continue
        comp = ComponentSpec(sec_name, resolve_in_package(root, sec["filename"], f"model.{sec_name}.filename"),
                             ctype)
        comp.io.token_input = (sec.get("inputs") or {}).get("input_ids")
        components[sec_name] = comp
    components["decoder"] = decoder
    if "embedding" in components:
        emb_in = model["embedding"].get("inputs") or {}
        emb_out = model["embedding"].get("outputs") or {}
        if decoder.io.inputs_embeds_input is None:
            raise MetadataError("model.decoder.inputs.inputs_embeds: required when model.embedding is present")
        edges.append(Edge("embedding", emb_out.get("inputs_embeds", "inputs_embeds"), "decoder",
                          decoder.io.inputs_embeds_input))
        if "vision" in components:
            vis_out = model["vision"].get("outputs") or {}
            edges.append(Edge("vision", vis_out.get("image_features", "image_features"), "embedding",
                              emb_in.get("image_features", "image_features")))
    elif decoder.io.sequence_source == "inputs_embeds":
        raise IncompletePackageError("model.decoder.inputs.inputs_embeds: the decoder takes embeddings but the "
                                     "package has no model.embedding component")
    for comp in components.values():
        _check_io_ports(comp, graphs, f"model.{comp.name}")

    stages = []
    if "vision" in components:
        stages.append(Stage("vision", "single_pass", "vision", "prompt_only"))
    if "embedding" in components:
        stages.append(Stage("embed", "single_pass", "embedding", "every_step"))
    stages.append(Stage("decode", "autoregressive", "decoder", "every_step", max_tokens=None))

    positions = None
    if decoder.io.position_ids_input is not None:
        rank = _position_rank(ins[decoder.io.position_ids_input][0]) or 1
        positions = Positions(decoder.io.position_ids_input, rank, "linear_increment")

    tok = root if os.path.isfile(os.path.join(root, "tokenizer.json")) else None
    spec = PipelineSpec(
        root=root, components=components, dataflow=edges, stages=stages, positions=positions,
        search=_search(cfg.get("search"), "search", strict=False),
        eos_token_ids=_eos_list(model.get("eos_token_id"), "model.eos_token_id"),
        bos_token_id=_int(model.get("bos_token_id"), "model.bos_token_id"),
        pad_token_id=_int(model.get("pad_token_id"), "model.pad_token_id"),
        context_length=_int(model.get("context_length"), "model.context_length", minimum=1),
        tokenizer_dir=tok, model_type=model.get("type"), num_layers=n_layers,
        num_kv_heads=_int(dec.get("num_key_value_heads"), "model.decoder.num_key_value_heads"),
        head_size=_int(dec.get("head_size"), "model.decoder.head_size"), source="genai_config",
        sliding_window=dec.get("sliding_window"), hidden_size=dec.get("hidden_size"),
        vocab_size=model.get("vocab_size"))
    _check_edges(spec, graphs, "model")
    _check_decoder_geometry(dec, decoder, ins, n_layers, "model.decoder")
    if "vision" in components:
        _admit_text_only(spec, graphs, "model")
    elif isinstance(spec.model_type, str) and spec.model_type.endswith("_vl_text"):
        # the builder's text half of a VLM: it can only ever decode text
        spec.text_only = True
        spec.text_only_reason = f"model.type {spec.model_type!r} is the text decoder of a vision-language model"
    return spec


# ----------------------------------------------------------------------------------------------- inference_metadata

_TOP_KEYS = {"pipeline", "search", "eos_token_id", "bos_token_id", "pad_token_id", "context_length", "tokenizer"}
# the run-wide keys may also sit under ``pipeline`` (as fixtures/composite_vlm.py writes them)
_RUN_KEYS = ("search", "eos_token_id", "bos_token_id", "pad_token_id", "context_length", "tokenizer")
_PIPELINE_KEYS = {"models", "dataflow", "strategy", "positions", *_RUN_KEYS}
_MODEL_KEYS = {"filename", "type", "tokenizer", "io"}
_IO_KEYS = {"token_input", "sequence_source", "inputs_embeds_input", "logits_output", "attention_mask_input",
            "position_ids_input", "kv_inputs", "kv_outputs", "state_pairs", "optional_inputs"}


def _parse_io(d, key: str) -> IOSpec:
    io = IOSpec()
    if d is None:
        return io
    _check_keys(d, _IO_KEYS, key)
    for k in ("token_input", "inputs_embeds_input", "logits_output", "attention_mask_input", "position_ids_input"):
        setattr(io, k, _str(d.get(k), f"{key}.{k}"))
    src = d.get("sequence_source", "token_ids")
    if src not in _SEQUENCE_SOURCES:
        raise MetadataError(f"{key}.sequence_source: expected one of {', '.join(_SEQUENCE_SOURCES)}, got {src!r}")
    io.sequence_source = src
    if src == "inputs_embeds" and io.inputs_embeds_input is None:
        raise MetadataError(f"{key}.inputs_embeds_input: required when sequence_source is inputs_embeds")
    if src == "token_ids" and io.inputs_embeds_input is not None and io.token_input is None:
        raise MetadataError(f"{key}.inputs_embeds_input: given with sequence_source token_ids but no token_input")
    for k in ("kv_inputs", "kv_outputs"):
        v = d.get(k) or []
        if not isinstance(v, list):
            raise MetadataError(f"{key}.{k}: expected a list of port names, got {type(v).__name__}")
        setattr(io, k, [_str(p, f"{key}.{k}[{i}]", optional=False) for i, p in enumerate(v)])
        if len(set(v)) != len(v):
            raise MetadataError(f"{key}.{k}: names a port twice")
    if len(io.kv_inputs) != len(io.kv_outputs):
        raise MetadataError(f"{key}.kv_inputs: {len(io.kv_inputs)} ports but kv_outputs has {len(io.kv_outputs)}; "
                            "they pair by position")
    sps = d.get("state_pairs") or []
    if not isinstance(sps, list):
        raise MetadataError(f"{key}.state_pairs: expected a list, got {type(sps).__name__}")
    for i, sp in enumerate(sps):
        k = f"{key}.state_pairs[{i}]"
        _check_keys(sp, {"input", "output", "init", "update"}, k)
        init, update = sp.get("init", "zeros"), sp.get("update", "replace")
        if init != "zeros":
            raise MetadataError(f"{k}.init: only 'zeros' is supported, got {init!r}")
        if update != "replace":
            raise MetadataError(f"{k}.update: only 'replace' is supported, got {update!r}")
        io.state_pairs.append(StatePair(_str(_req(sp, "input", k), f"{k}.input", False),
                                        _str(_req(sp, "output", k), f"{k}.output", False), init, update))
    state_ins = [sp.input for sp in io.state_pairs]
    for p in state_ins:
        if p in io.kv_inputs or state_ins.count(p) > 1:
            raise MetadataError(f"{key}.state_pairs: {p!r} is carried twice (kv_inputs or another state pair)")
    opt = d.get("optional_inputs") or {}
    if not isinstance(opt, dict):
        raise MetadataError(f"{key}.optional_inputs: expected a mapping port -> {{shape, dtype}}")
    fed = {io.token_input, io.inputs_embeds_input, io.attention_mask_input, io.position_ids_input,
           *io.kv_inputs, *state_ins} - {None}
    for port, v in opt.items():
        k = f"{key}.optional_inputs.{port}"
        _check_keys(v, {"shape", "dtype"}, k)
        shape = _req(v, "shape", k)
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                  for s in shape):
            raise MetadataError(f"{k}.shape: expected a list of non-negative integers, got {shape!r}")
        dtype = v.get("dtype", "float32")
        if dtype not in _DTYPES:
            raise MetadataError(f"{k}.dtype: expected one of {', '.join(sorted(_DTYPES))}, got {dtype!r}")
        if port in fed:
            raise MetadataError(f"{k}: the port is also fed by the io section; it cannot be optional")
        io.optional_inputs[port] = AbsentValue(list(shape), dtype)
    return io


def _parse_stage(st, i: int, models: dict, key: str) -> Stage:
    k = f"{key}[{i}]"
    _check_keys(st, {"name", "strategy", "run_on"}, k)
    name = _str(_req(st, "name", k), f"{k}.name", False)
    strat = _req(st, "strategy", k)
    kind = _req(strat, "kind", f"{k}.strategy") if isinstance(strat, dict) else None
    if kind == "single_pass":
        _check_keys(strat, {"kind", "model"}, f"{k}.strategy")
        model = _str(_req(strat, "model", f"{k}.strategy"), f"{k}.strategy.model", False)
        if model not in models:
            raise MetadataError(f"{k}.strategy.model: {model!r} is not a model in pipeline.models")
        run_on = st.get("run_on", "prompt_only")
        max_tokens = None
    elif kind == "autoregressive":
        _check_keys(strat, {"kind", "decoder", "max_tokens"}, f"{k}.strategy")
        model = _str(_req(strat, "decoder", f"{k}.strategy"), f"{k}.strategy.decoder", False)
        if model not in models:
            raise MetadataError(f"{k}.strategy.decoder: {model!r} is not a model in pipeline.models")
        max_tokens = _int(strat.get("max_tokens"), f"{k}.strategy.max_tokens", minimum=1)
        run_on = st.get("run_on", "every_step")
        if run_on != "every_step":
            raise MetadataError(f"{k}.run_on: an autoregressive stage runs on every_step, got {run_on!r}")
    else:
        raise MetadataError(f"{k}.strategy.kind: expected single_pass or autoregressive, got {kind!r}")
    if run_on not in _RUN_ON:
        raise MetadataError(f"{k}.run_on: expected one of {', '.join(_RUN_ON)}, got {run_on!r}")
    return Stage(name, kind, model, run_on, max_tokens)


def _parse_endpoint(v, key: str):
    if not isinstance(v, str) or "." not in v.strip(".") or v.startswith("."):
        raise MetadataError(f"{key}: expected 'component.port', got {v!r}")
    comp, port = v.split(".", 1)
    return comp, port


def load_inference_metadata(root: str, name: str = INFERENCE_METADATA) -> PipelineSpec:
    """Spec of a composite package described by inference_metadata.yaml."""
    import yaml
    try:
        with open(os.path.join(root, name), encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise MetadataError(f"{name}: not valid YAML ({e})") from e
    if not isinstance(doc, dict):
        raise MetadataError(f"{name}: expected a mapping at the top level")
    _check_keys(doc, _TOP_KEYS, "")  # top-level keys are named bare
    pipe = _req(doc, "pipeline", "")
    _check_keys(pipe, _PIPELINE_KEYS, "pipeline")
    for k in _RUN_KEYS:
        if k in pipe:
            if k in doc and doc[k] != pipe[k]:
                raise MetadataError(f"pipeline.{k}: contradicts the top-level {k} ({pipe[k]!r} vs {doc[k]!r})")
            doc[k] = pipe[k]

    models = _req(pipe, "models", "pipeline")
    if not isinstance(models, dict) or not models:
        raise MetadataError("pipeline.models: expected a non-empty mapping name -> model")
    components = {}
    for cname, m in models.items():
        k = f"pipeline.models.{cname}"
        if not isinstance(cname, str) or not cname or "." in cname:
            raise MetadataError(f"{k}: a component name must be a non-empty string without '.'")
        _check_keys(m, _MODEL_KEYS, k)
        fname = resolve_in_package(root, _req(m, "filename", k), f"{k}.filename")
        ctype = _str(_req(m, "type", k), f"{k}.type", False)
        tok = _tokenizer_dir(root, m["tokenizer"], f"{k}.tokenizer") if m.get("tokenizer") is not None else None
        components[cname] = ComponentSpec(cname, fname, ctype, _parse_io(m.get("io"), f"{k}.io"), tok)

    edges = []
    flow = pipe.get("dataflow") or []
    if not isinstance(flow, list):
        raise MetadataError("pipeline.dataflow: expected a list of edges")
    for i, e in enumerate(flow):
        k = f"pipeline.dataflow[{i}]"
        _check_keys(e, {"from", "to", "dtype"}, k)
        src, sport = _parse_endpoint(_req(e, "from", k), f"{k}.from")
        dst, dport = _parse_endpoint(_req(e, "to", k), f"{k}.to")
        dtype = e.get("dtype")
        if dtype is not None and dtype not in _DTYPES:
            raise MetadataError(f"{k}.dtype: expected one of {', '.join(sorted(_DTYPES))}, got {dtype!r}")
        edges.append(Edge(src, sport, dst, dport, dtype))
    fed = {}
    for i, e in enumerate(edges):
        if (e.dst, e.dst_port) in fed:
            raise MetadataError(f"pipeline.dataflow[{i}].to: {e.dst}.{e.dst_port} is already fed by "
                                f"pipeline.dataflow[{fed[(e.dst, e.dst_port)]}]")
        fed[(e.dst, e.dst_port)] = i

    strat = _req(pipe, "strategy", "pipeline")
    _check_keys(strat, {"kind", "stages"}, "pipeline.strategy")
    if strat.get("kind") != "composite":
        raise MetadataError(f"pipeline.strategy.kind: expected 'composite', got {strat.get('kind')!r}")
    raw_stages = _req(strat, "stages", "pipeline.strategy")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise MetadataError("pipeline.strategy.stages: expected a non-empty list of stages")
    stages = [_parse_stage(st, i, components, "pipeline.strategy.stages") for i, st in enumerate(raw_stages)]
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise MetadataError(f"pipeline.strategy.stages: stage names repeat ({names})")
    n_ar = sum(s.kind == "autoregressive" for s in stages)
    if n_ar != 1:
        raise MetadataError(f"pipeline.strategy.stages: exactly one autoregressive stage is required, got {n_ar}")
    decoder = next(components[s.model] for s in stages if s.kind == "autoregressive")
    dk = f"pipeline.models.{decoder.name}.io"
    if decoder.io.logits_output is None:
        raise MetadataError(f"{dk}.logits_output: required for the autoregressive decoder")
    if decoder.io.sequence_source == "token_ids" and decoder.io.token_input is None:
        raise MetadataError(f"{dk}.token_input: required for a decoder whose sequence_source is token_ids")

    positions = None
    pos = pipe.get("positions")
    if pos is not None:
        _check_keys(pos, {"input", "rank", "continuation"}, "pipeline.positions")
        pin = _str(_req(pos, "input", "pipeline.positions"), "pipeline.positions.input", False)
        rank = pos.get("rank", 1)
        if rank not in (1, 3) or isinstance(rank, bool):
            raise MetadataError(f"pipeline.positions.rank: expected 1 or 3, got {rank!r}")
        cont = pos.get("continuation", "linear_increment")
        if cont not in _CONTINUATIONS:
            raise MetadataError(f"pipeline.positions.continuation: expected one of {', '.join(_CONTINUATIONS)}, "
                                f"got {cont!r}")
        if decoder.io.position_ids_input not in (None, pin):
            raise MetadataError(f"pipeline.positions.input: {pin!r} contradicts {dk}.position_ids_input "
                                f"{decoder.io.position_ids_input!r}")
        decoder.io.position_ids_input = pin
        positions = Positions(pin, rank, cont)

    tok = None
    if doc.get("tokenizer") is not None:
        tok = _tokenizer_dir(root, doc["tokenizer"], "tokenizer")
    elif decoder.tokenizer is not None:
        tok = decoder.tokenizer
    elif os.path.isfile(os.path.join(root, "tokenizer.json")):
        tok = root

    spec = PipelineSpec(
        root=root, components=components, dataflow=edges, stages=stages, positions=positions,
        search=_search(doc.get("search"), "search", strict=True),
        eos_token_ids=_eos_list(doc.get("eos_token_id"), "eos_token_id"),
        bos_token_id=_int(doc.get("bos_token_id"), "bos_token_id", minimum=0),
        pad_token_id=_int(doc.get("pad_token_id"), "pad_token_id", minimum=0),
        context_length=_int(doc.get("context_length"), "context_length", minimum=1),
        tokenizer_dir=tok, source="inference_metadata")

    # the package must be complete before anything is dropped from it
    graphs = _Graphs()
    for comp in components.values():
        _check_io_ports(comp, graphs, f"pipeline.models.{comp.name}")
    _check_edges(spec, graphs, "pipeline.dataflow")
    if decoder.io.sequence_source == "inputs_embeds" and (decoder.name, decoder.io.inputs_embeds_input) not in fed:
        raise MetadataError(f"{dk}.inputs_embeds_input: no pipeline.dataflow edge feeds "
                            f"{decoder.name}.{decoder.io.inputs_embeds_input}")
    dins = graphs(decoder)[0]
    if positions is not None:
        if positions.input not in dins:
            raise IncompletePackageError(f"pipeline.positions.input: {positions.input!r} is not an input of "
                                         f"{decoder.filename}")
        grank = _position_rank(dins[positions.input][0])
        if grank is not None and grank != positions.rank:
            raise MetadataError(f"pipeline.positions.rank: {positions.rank} contradicts the decoder's "
                                f"{positions.input!r} shape {dins[positions.input][0]}")
    elif decoder.io.position_ids_input is not None:
        rank = _position_rank(dins[decoder.io.position_ids_input][0]) or 1
        spec.positions = Positions(decoder.io.position_ids_input, rank, "linear_increment")

    if any(_is_vision(c) for c in components.values()):
        _admit_text_only(spec, graphs, "pipeline")
    return spec


# ----------------------------------------------------------------------------------------------- text-only admission

_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
_DYNAMIC_RESIZE = re.compile(r"smart_?resize|min_pixels|max_pixels|qwen2(_5)?_?vl|qwen3_?vl", re.IGNORECASE)


def _is_vision(comp: ComponentSpec) -> bool:
    return "vision" in comp.type.lower() or "image" in comp.type.lower()


def preprocessing_unrepresentable(root: str) -> str | None:
    """Why the package's declared image preprocessing cannot be represented here, or None.

    Qwen-VL processors resize each image with ``smart_resize`` to a pixel budget (min/max_pixels) that changes
    the number of image tokens per image; nothing in a PipelineSpec can describe that.  A package that declares
    no processor config is left as declared (its images are fed already preprocessed).
    """
    for name in _PROCESSOR_FILES:
        p = os.path.join(root, name)
        if not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8", errors="replace") as f:
            text = f.read()
        m = _DYNAMIC_RESIZE.search(text)
        if m:
            return f"{name} declares {m.group(0)!r} image resizing, which a pipeline spec cannot represent"
    return None


def _absent_value(shape, dtype, hidden) -> AbsentValue:
    """Zeros with a zero-length first symbolic dim (no image tokens); other symbolic dims get ``hidden`` or 1."""
    if not shape:
        return AbsentValue([0], dtype)
    out, zeroed = [], False
    for j, d in enumerate(shape):
        if isinstance(d, int) and d > 0:
            out.append(d)
        elif not zeroed:
            out.append(0)
            zeroed = True
        else:
            out.append(hidden if (j == len(shape) - 1 and hidden) else 1)
    if not zeroed:
        out[0] = 0
    return AbsentValue(out, dtype)


def _admit_text_only(spec: PipelineSpec, graphs: _Graphs, key: str):
    """Drop the vision side of a split VLM whose image preprocessing cannot be represented."""
    reason = preprocessing_unrepresentable(spec.root)
    if reason is None:
        return
    decoder = spec.decoder
    vision = [n for n, c in spec.components.items() if _is_vision(c)]
    embedders = {e.src for e in spec.dataflow if e.dst == decoder.name and e.src not in vision}
    if decoder.io.sequence_source != "inputs_embeds" or len(embedders) != 1:
        raise MetadataError(f"{key}: text-only admission needs one embedding component feeding the decoder's "
                            f"inputs_embeds ({reason})")
    emb = spec.components[next(iter(embedders))]
    ek = f"{key}.models.{emb.name}.io.token_input" if key == "pipeline" else f"{key}.{emb.name}.inputs.input_ids"
    eins = graphs(emb)[0]
    if emb.io.token_input is None:
        ints = [p for p, (_, dt) in eins.items() if dt in ("int64", "int32")]
        if len(ints) != 1:
            raise MetadataError(f"{ek}: required for text-only admission (integer inputs: {ints})")
        emb.io.token_input = ints[0]
    hidden = getattr(spec, "hidden_size", None)
    dshape = graphs(decoder)[0][decoder.io.inputs_embeds_input][0]
    if not hidden and dshape and isinstance(dshape[-1], int) and dshape[-1] > 0:
        hidden = dshape[-1]
    for e in spec.dataflow:
        if e.src in vision and e.dst == emb.name and e.dst_port not in emb.io.optional_inputs:
            shape, dtype = eins[e.dst_port]
            emb.io.optional_inputs[e.dst_port] = _absent_value(shape, dtype, hidden)
    for e in spec.dataflow:
        if e.src in vision and e.dst not in vision and e.dst != emb.name:
            raise MetadataError(f"{key}: text-only admission cannot drop the edge {e.src}.{e.src_port} -> "
                                f"{e.dst}.{e.dst_port} ({reason})")
    spec.dataflow = [e for e in spec.dataflow if e.src not in vision and e.dst not in vision]
    spec.stages = [s for s in spec.stages if s.model not in vision]
    if not any(s.model == emb.name for s in spec.stages):
        spec.stages.insert(0, Stage("embed", "single_pass", emb.name, "every_step"))
    for n in vision:
        del spec.components[n]
    pin = decoder.io.position_ids_input
    if pin is not None:
        rank = _position_rank(graphs(decoder)[0][pin][0]) or (spec.positions.rank if spec.positions else 1)
        spec.positions = Positions(pin, rank, "linear_increment")
    spec.text_only = True
    spec.text_only_reason = reason
