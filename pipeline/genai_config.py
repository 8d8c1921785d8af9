"""Read a ``genai_config.json`` package, as the onnxruntime-genai model builder writes it, into a ``PipelineSpec``.

The config names one decoder whose KV-cache and recurrent-state port names are
``%d`` templates expanded over the layers (separate key and value caches, or onnxruntime-genai's legacy
combined ``past_%d``/``present_%d`` of shape ``(2, batch, heads, positions, head_size)``).  Hybrid decoders
(qwen3.5, lfm2) have attention caches on some layers and conv/recurrent states on the others,
so a template is expanded only for the layer indices that exist in the
decoder's ONNX graph.  As in onnxruntime-genai:
- a port the config leaves out takes onnxruntime-genai's default name (``input_ids``, ``attention_mask``,
  ``position_ids``, ``logits``, ``past_key_values.%d.key``, ``past_conv.%d``, ...) when the graph has it, and
  the recurrent states of a hybrid decoder are found under names derived from the KV template
  (``past_key_values.%d.conv_state`` and ``.recurrent_state``);
- an ``attention_mask`` or ``position_ids`` the graph does not take is not fed;
- the layer count is the graph's (the highest layer its cache inputs name, plus one); ``num_hidden_layers``
  counts only for a decoder without caches.
A split VLM config (``vision`` / ``embedding`` / ``decoder`` sections) becomes a three-component composite run
in the stages vision (prompt only), embed and decode.

Invariants of the returned spec (besides those ``metadata`` states for every spec):
- every layer below the layer count has a KV cache (key and value) or a
  recurrent state among the decoder's inputs, once any cache template is given;
- the head counts and head size the config declares agree with
  the decoder graph's cache shapes and attention nodes (``MetadataError`` otherwise);
- a search section's beam options (``num_beams``, ``num_return_sequences``, ``length_penalty``,
  ``early_stopping``, ``no_repeat_ngram_size``) are read; other unknown search keys are ignored (the builder
  writes more);
- ``sliding_window``, ``hidden_size`` and ``vocab_size`` are carried over as declared.
- A Marian encoder-decoder (``type`` ``marian-*``) is read by ``pipeline/marian.py``.
- A streaming speech package (``nemotron_speech``, ``parakeet_tdt``, Moonshine's ``streaming_enc_dec_asr``) is
  not a spec: ``og.Model`` runs it through ``pipeline/streaming_asr.py`` (Moonshine's loop in
  ``pipeline/moonshine_streaming.py``), and this loader refuses it with a ``NotImplementedError`` saying so.
- A Whisper package's ``encoder`` section is a component run once over the caller's ``audio_features``
  (``audio_encoder``); its cross-attention caches feed the decoder's ``cross_past_*_names`` at every step.

A split VLM of a type whose processor is implemented (``PROCESSOR_TYPES`` in ``pipeline/multimodal.py``) keeps
its vision side with images optional; another whose image preprocessing cannot be represented, or a
builder ``*_vl_text`` decoder, is admitted for text only (see ``text_only``).
"""
from __future__ import annotations

import json
import os
import re

from .package_checks import (Graphs, check_edges, check_io_ports, eos_list, graph_ports, implicit_positions, int_value,
                             read_document, required, component_spec, search_options)
from .spec import (ComponentSpec, Edge, IncompletePackageError, IOSpec, MetadataError, PipelineSpec, RequestError, Stage,
                   StatePair)
from .marian import is_marian, load_marian_config
from .speculative import speculative_options
from .text_only import admit_text_only, images_optional

__all__ = ["load_genai_config", "merged", "GENAI_CONFIG"]

GENAI_CONFIG = "genai_config.json"

# genai_config template keys: (input key, output key, kind)
_KV_TEMPLATES = (("past_key_names", "present_key_names"), ("past_value_names", "present_value_names"))
_STATE_TEMPLATES = (("past_conv_names", "present_conv_names"), ("past_recurrent_names", "present_recurrent_names"))
# onnxruntime-genai's legacy combined cache: keys and values of a layer in one (2, batch, heads, positions, head)
# tensor (GPT-2 exports with com.microsoft Attention)
_COMBINED_TEMPLATE = ("past_names", "present_names")


def _expand(template, n, key):
    if not isinstance(template, str) or template.count("%d") != 1:
        raise MetadataError(f"{key}: expected a name template with one %d, got {template!r}")
    return [template % i for i in range(n)]


# onnxruntime-genai's default port names: a name the config leaves out is used when the graph has it
_DEFAULT_INPUTS = {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                   "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value",
                   "past_conv_names": "past_conv.%d", "block_table": "block_table",
                   "cumulative_sequence_lengths": "cumulative_sequence_lengths",
                   "past_sequence_lengths": "past_sequence_lengths", "attention_metadata": "attention_metadata",
                   "block_table_windowed": "block_table_windowed"}
# the paged decoder format's inputs (``IOSpec.varlen``): the first three make a decoder paged
_VARLEN_INPUTS = ("block_table", "cumulative_sequence_lengths", "past_sequence_lengths")
_DEFAULT_OUTPUTS = {"logits": "logits", "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value", "present_conv_names": "present_conv.%d"}


def _with_defaults(given: dict, defaults: dict, ports: dict) -> dict:
    """``given`` with each default name the graph has (a template's name for some layer) added where the
    config is silent."""
    out = dict(given)
    for k, name in defaults.items():
        if k not in out and name and _layers_of(name, ports) != []:
            out[k] = name
    return out


def _layers_of(name: str, ports: dict):
    """The layer indices a ``%d`` template names among ``ports`` (sorted); for a plain name, [0] when present."""
    if "%d" not in name:
        return [0] if name in ports else []
    pat = re.compile("^" + re.escape(name).replace("%d", r"(\d+)") + "$")
    return sorted({int(m.group(1)) for p in ports for m in [pat.match(p)] if m})


def _derived_state_names(inputs: dict, outputs: dict) -> tuple[dict, dict]:
    """onnxruntime-genai's recurrent-state names derived from the KV templates (``past_key_values.%d.key`` ->
    ``past_key_values.%d.conv_state`` and ``.recurrent_state``), used where the config names no state."""
    def derive(template, suffix):
        return template[:template.rfind(".") + 1] + suffix if isinstance(template, str) and "." in template else None
    ins = {"past_conv_names": derive(inputs.get("past_key_names", _DEFAULT_INPUTS["past_key_names"]), "conv_state"),
           "past_recurrent_names": derive(inputs.get("past_key_names", _DEFAULT_INPUTS["past_key_names"]),
                                          "recurrent_state")}
    outs = {"present_conv_names": derive(outputs.get("present_key_names", _DEFAULT_OUTPUTS["present_key_names"]),
                                         "conv_state"),
            "present_recurrent_names": derive(outputs.get("present_key_names",
                                                          _DEFAULT_OUTPUTS["present_key_names"]), "recurrent_state")}
    return ins, outs


def _decoder_ports(sec: dict, ins: dict, outs: dict) -> tuple[dict, dict]:
    """The decoder's input and output names: the config's, then onnxruntime-genai's defaults the graph has,
    then state names derived from the KV templates.  An ``attention_mask`` or ``position_ids`` the graph does
    not take is left out, as onnxruntime-genai leaves it out."""
    inputs = _with_defaults(sec.get("inputs") or {}, _DEFAULT_INPUTS, ins)
    outputs = _with_defaults(sec.get("outputs") or {}, _DEFAULT_OUTPUTS, outs)
    d_in, d_out = _derived_state_names(inputs, outputs)
    inputs = _with_defaults(inputs, d_in, ins)
    outputs = _with_defaults(outputs, d_out, outs)
    for k in ("attention_mask", "position_ids"):
        if k in inputs and inputs[k] not in ins:
            del inputs[k]
    return inputs, outputs


def _graph_layers(inputs: dict, ins: dict) -> int | None:
    """How many layers the graph's cache and state inputs span (the highest index + 1), None when none."""
    found = [i for t in _KV_TEMPLATES + _STATE_TEMPLATES + (_COMBINED_TEMPLATE,) if isinstance(inputs.get(t[0]), str)
             for i in _layers_of(inputs[t[0]], ins)]
    return max(found) + 1 if found else None


def _decoder_io(inputs: dict, outputs: dict, n_layers: int, ins: dict, outs: dict, key: str,
                filename: str) -> IOSpec:
    io = IOSpec()
    io.token_input = inputs.get("input_ids") if "inputs_embeds" not in inputs else None
    if "inputs_embeds" in inputs:
        io.sequence_source, io.inputs_embeds_input = "inputs_embeds", inputs["inputs_embeds"]
        io.token_input = None
        if inputs.get("input_ids") in ins:  # the embeddings and the ids both, as onnxruntime-genai feeds them
            io.ids_beside_embeds = inputs["input_ids"]
    io.logits_output = outputs.get("logits")
    io.attention_mask_input = inputs.get("attention_mask")
    io.position_ids_input = inputs.get("position_ids")
    varlen = {k: inputs[k] for k in _VARLEN_INPUTS + ("attention_metadata", "block_table_windowed")
              if inputs.get(k) in ins}
    if any(k in varlen for k in _VARLEN_INPUTS):
        missing = [k for k in _VARLEN_INPUTS if k not in varlen]
        if missing:
            raise IncompletePackageError(f"{key}: the paged decoder format needs the inputs {list(_VARLEN_INPUTS)}; "
                                         f"{filename} lacks {missing}")
        io.varlen = varlen

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
    combined = pairs(*_COMBINED_TEMPLATE)
    if combined and (keys or values):
        raise MetadataError(f"{key}.inputs: past_names (combined caches) excludes past_key_names and "
                            f"past_value_names")
    for i in sorted(combined):
        io.kv_inputs.append(combined[i][0])
        io.kv_outputs.append(combined[i][1])
        io.kv_batch_axis = 1
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
    has_cache = any(t[0] in inputs for t in _KV_TEMPLATES + _STATE_TEMPLATES + (_COMBINED_TEMPLATE,))
    if has_cache and not all(covered):
        raise IncompletePackageError(f"{key}: layers {[i for i, c in enumerate(covered) if not c]} have neither "
                                     f"a KV cache nor a recurrent state among the inputs of {filename}")
    return io


_ATTENTION_OPS = ("GroupQueryAttention", "MultiHeadAttention", "Attention", "PagedAttention")


def _check_decoder_geometry(dec: dict, decoder: ComponentSpec, ins: dict, n_layers: int, key: str) -> None:
    """The head counts and head size the config declares against the decoder graph: its cache inputs (heads at
    axis 1, or 2 in the paged format, head size at axis 3 where static) and its attention nodes' ``num_heads``
    and ``kv_num_heads``.  A config that contradicts the graph would otherwise run and decode garbage."""
    import onnx
    kv = int_value(dec.get("num_key_value_heads"), f"{key}.num_key_value_heads")
    heads = int_value(dec.get("num_attention_heads"), f"{key}.num_attention_heads")
    hs = int_value(dec.get("head_size"), f"{key}.head_size")
    caches = decoder.io.kv_inputs
    axis = 2 if decoder.io.varlen else 1  # paged caches: (blocks, block_size, heads, head_size)
    for name in caches:
        shape = ins.get(name, (None,))[0]
        if not shape or len(shape) != 4:
            continue
        if kv is not None and isinstance(shape[axis], int) and shape[axis] != kv:
            raise MetadataError(f"{key}.num_key_value_heads is {kv} but the graph's {name!r} has {shape[axis]} "
                                f"heads (shape {shape})")
        if hs is not None and isinstance(shape[3], int) and shape[3] != hs:
            raise MetadataError(f"{key}.head_size is {hs} but the graph's {name!r} has head size {shape[3]} "
                                f"(shape {shape})")
    if heads is None and kv is None:
        return
    try:
        m = onnx.load_from_string(decoder.data) if decoder.data is not None else \
            onnx.load(decoder.filename, load_external_data=False)
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


def load_genai_config(root: str, name: str = GENAI_CONFIG, overlay: dict | None = None,
                      files: dict | None = None, draft: bool = False) -> PipelineSpec:
    """Spec of a builder-written package: one decoder, or a vision/embedding/decoder split VLM.  ``overlay``:
    a mapping merged into the file's (``og.Config.overlay``): its mappings merge key by key, other values
    replace the file's.  ``files``: model files given in memory (``og.Config.add_model_data``), by the name
    the config gives them; such a file need not exist in the folder.  ``draft``: the spec of the config's
    draft decoder (``model.draft``, for speculative decoding) alone, in place of the package's."""
    files = files or {}
    cfg = _read_json(root, name)
    if overlay:
        cfg = merged(cfg, overlay)
    _check_draft_config(cfg)
    if draft:
        model, _ = _model_sections(cfg)
        if not isinstance(model.get("draft"), dict):
            raise MetadataError("model.draft.filename is not set in genai_config.json.")
        _check_draft_logits(root, model, files)
        text = {k: v for k, v in model.items() if k not in ("vision", "speech", "embedding", "draft")}
        cfg = dict(cfg, model=dict(text, decoder=model["draft"]))
    kind = cfg["model"].get("type") if isinstance(cfg.get("model"), dict) else None
    if kind in ("nemotron_speech", "parakeet_tdt", "streaming_enc_dec_asr"):
        raise NotImplementedError(f"a {kind} package (streaming speech recognition) runs through og.Model, "
                                  f"og.Generator and its processors (pipeline/streaming_asr.py), not through this "
                                  f"decode loop")
    model, dec = _model_sections(cfg)
    if is_marian(model):
        return load_marian_config(root, cfg, model, files)
    graphs = Graphs()
    decoder, n_layers, ins = _load_decoder(root, dec, graphs, files)
    components = _side_components(root, model, files)
    audio_output = _audio_output(root, model, components, files)
    components["decoder"] = decoder
    edges = _vlm_edges(model, components, decoder) + _audio_encoder(root, model, components, n_layers, files)
    for comp in components.values():
        check_io_ports(comp, graphs, f"model.{comp.name}")
    spec = _genai_spec(root, cfg, model, dec, components, edges, n_layers, ins)
    spec.audio_output = audio_output
    spec.model_keys = {k: v for k, v in model.items() if not isinstance(v, (dict, list))}
    check_edges(spec, graphs, "model")
    _check_decoder_geometry(dec, decoder, ins, n_layers, "model.decoder")
    _mark_text_only(spec, graphs)
    return spec


def _check_draft_config(cfg: dict) -> None:
    """A config with a draft decoder (``model.draft``): what speculative decoding cannot run, refused from the
    config alone, before any file is read, with onnxruntime-genai's messages."""
    model = cfg.get("model")
    if not isinstance(model, dict) or "draft" not in model:
        return
    draft = model["draft"]
    if not isinstance(draft, dict) or not draft.get("filename"):
        raise MetadataError("model.draft.filename is not set in genai_config.json.")
    if isinstance(model.get("vision"), dict) and model["vision"].get("filename") or \
            isinstance(model.get("speech"), dict) and model["speech"].get("filename"):
        raise MetadataError("Speculative decoding does not support multimodal (vision/audio) models in this "
                            "release; target and draft must be plain decoder-only LLMs.")
    for sec in (model.get("decoder"), draft):
        if not isinstance(sec, dict):
            continue
        sw = sec.get("sliding_window")
        if isinstance(sw, dict) and sw.get("slide_key_value_cache"):
            raise MetadataError("Speculative decoding does not support physically sliding KV caches in this "
                                "release; WindowedKeyValueCache cannot rewind after discarding KV history.")
        if sec.get("layer_types"):
            raise MetadataError("Speculative decoding does not support LFM2 (hybrid SSM/attention) models in this "
                                "release; their rolling convolution state cannot be rewound.")


def _check_draft_logits(root: str, model: dict, files: dict) -> None:
    """The decoder's and the draft's logits outputs exist, with one static vocabulary size (onnxruntime-genai's
    checks and messages)."""
    vocab = {}
    for role, key in (("Target", "decoder"), ("Draft", "draft")):
        sec = model[key]
        comp = component_spec(root, sec, f"model.{key}", key, "decoder", files)
        outs = graph_ports(comp.filename, comp.data)[1]
        outputs = sec.get("outputs") if isinstance(sec.get("outputs"), dict) else {}
        name = outputs.get("logits", "logits")
        if name not in outs:
            raise MetadataError(f"{role} logits output '{name}' was not found in the ONNX model.")
        shape = outs[name][0]
        if not shape or not isinstance(shape[-1], int) or shape[-1] <= 0:
            raise MetadataError(f"{role} logits output '{name}' must have a static positive vocabulary dimension.")
        vocab[role] = shape[-1]
    if vocab["Target"] != vocab["Draft"]:
        raise MetadataError(f"Target and draft logit dimensions don't match. Target vocab: {vocab['Target']}, Draft "
                            f"vocab: {vocab['Draft']}. Target and draft must share the same vocabulary.")


def merged(base: dict, over: dict) -> dict:
    """``base`` with ``over`` merged in (mappings recursively, anything else replaced); neither is changed."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_json(root: str, name: str) -> dict:
    """The config file's top-level JSON object."""
    return read_document(root, name, json.load, json.JSONDecodeError, "JSON", "a JSON object")


def _model_sections(cfg: dict) -> tuple[dict, dict]:
    """The ``model`` and ``model.decoder`` mappings, both required."""
    model = required(cfg, "model", "genai_config")
    if not isinstance(model, dict):
        raise MetadataError("genai_config.model: expected a mapping")
    dec = required(model, "decoder", "model")
    if not isinstance(dec, dict):
        raise MetadataError("model.decoder: expected a mapping")
    return model, dec


def _load_decoder(root: str, dec: dict, graphs: Graphs, files: dict) -> tuple[ComponentSpec, int, dict]:
    """The decoder component with its io expanded over the layers, its layer count and its graph inputs."""
    n_declared = int_value(dec.get("num_hidden_layers"), "model.decoder.num_hidden_layers", minimum=0)
    decoder = component_spec(root, dec, "model.decoder", "decoder", "decoder", files)
    fname = decoder.filename
    ins, outs = graphs(decoder)
    inputs, outputs = _decoder_ports(dec, ins, outs)
    # onnxruntime-genai counts the layers the graph's caches name; num_hidden_layers only where they name none
    n_layers = _graph_layers(inputs, ins) or n_declared
    if n_layers is None:
        raise MetadataError("model.decoder.num_hidden_layers: required key is missing (the decoder's inputs name "
                            "no cache layers)")
    decoder.io = _decoder_io(inputs, outputs, n_layers, ins, outs, "model.decoder", fname)
    return decoder, n_layers, ins


def _side_components(root: str, model: dict, files: dict) -> dict:
    """The ``vision``, ``speech`` and ``embedding`` components a split multimodal config declares (a section
    without a filename is absent)."""
    components = {}
    for sec_name, ctype in (("vision", "vision_encoder"), ("speech", "speech_encoder"), ("embedding", "embedding")):
        sec = model.get(sec_name)
        if not isinstance(sec, dict) or not sec.get("filename"):
            continue
        comp = component_spec(root, sec, f"model.{sec_name}", sec_name, ctype, files)
        comp.io.token_input = (sec.get("inputs") or {}).get("input_ids")
        components[sec_name] = comp
    return components


def _audio_output(root: str, model: dict, components: dict, files: dict):
    """LFM2-Audio's ``audio_output`` section (``pipeline/lfm2_audio.py``): its config, None without one; its two
    models become the components ``depthformer`` and ``audio_embedding``, which the generator runs itself."""
    from .lfm2_audio import AudioOutputConfig
    cfg = AudioOutputConfig.from_model(model)
    if cfg is not None:
        for name, rel, key in (("depthformer", cfg.depthformer, "depthformer"),
                               ("audio_embedding", cfg.embedding, "embedding")):
            components[name] = component_spec(root, {"filename": rel}, f"model.audio_output.{key}", name,
                                              "audio_output", files)
    return cfg


def _audio_encoder(root: str, model: dict, components: dict, n_layers: int, files: dict) -> list:
    """A Whisper package's ``encoder`` section: the component (run once over the caller's ``audio_features``) and
    the edges from its cross-attention caches (``cross_present_key_names`` / ``_value_names``) to the decoder's
    (``cross_past_key_names`` / ``_value_names``), one pair per layer; no section, no edges."""
    sec = model.get("encoder")
    if model.get("type") != "whisper" or not isinstance(sec, dict):
        return []
    comp = component_spec(root, sec, "model.encoder", "encoder", "audio_encoder", files)
    components["encoder"] = comp
    enc_out = sec.get("outputs") or {}
    dec_in = (model["decoder"].get("inputs") or {})
    edges = []
    for out_key, in_key in (("cross_present_key_names", "cross_past_key_names"),
                            ("cross_present_value_names", "cross_past_value_names")):
        if out_key not in enc_out or in_key not in dec_in:
            raise MetadataError(f"model.encoder.outputs.{out_key} and model.decoder.inputs.{in_key}: both required "
                                f"for a Whisper package's cross-attention caches")
        for a, b in zip(_expand(enc_out[out_key], n_layers, f"model.encoder.outputs.{out_key}"),
                        _expand(dec_in[in_key], n_layers, f"model.decoder.inputs.{in_key}")):
            edges.append(Edge("encoder", a, "decoder", b))
    return edges


def _vlm_edges(model: dict, components: dict, decoder: ComponentSpec) -> list:
    """Dataflow of a split VLM: embedding -> decoder ``inputs_embeds`` (and ``per_layer_inputs``, Gemma 4), vision
    and speech -> embedding image and audio features."""
    edges = []
    if "embedding" in components:
        emb_in = model["embedding"].get("inputs") or {}
        emb_out = model["embedding"].get("outputs") or {}
        if decoder.io.inputs_embeds_input is None:
            raise MetadataError("model.decoder.inputs.inputs_embeds: required when model.embedding is present")
        edges.append(Edge("embedding", emb_out.get("inputs_embeds", "inputs_embeds"), "decoder",
                          decoder.io.inputs_embeds_input))
        dec_in = model["decoder"].get("inputs") or {}
        if emb_out.get("per_layer_inputs") and dec_in.get("per_layer_inputs"):  # Gemma 4's per-layer conditioning
            edges.append(Edge("embedding", emb_out["per_layer_inputs"], "decoder", dec_in["per_layer_inputs"]))
        for sec, port in (("vision", "image_features"), ("speech", "audio_features")):
            if sec in components:
                out = model[sec].get("outputs") or {}
                edges.append(Edge(sec, out.get(port, port), "embedding", emb_in.get(port, port)))
    elif decoder.io.sequence_source == "inputs_embeds":
        raise IncompletePackageError("model.decoder.inputs.inputs_embeds: the decoder takes embeddings but the "
                                     "package has no model.embedding component")
    return edges


def _default_stages(components: dict) -> list:
    """vision, speech or the audio encoder (prompt only), embed (every step) where present, then the
    autoregressive decode."""
    stages = []
    if "encoder" in components:
        stages.append(Stage("encode", "single_pass", "encoder", "prompt_only"))
    if "vision" in components:
        stages.append(Stage("vision", "single_pass", "vision", "prompt_only"))
    if "speech" in components:
        stages.append(Stage("speech", "single_pass", "speech", "prompt_only"))
    if "embedding" in components:
        stages.append(Stage("embed", "single_pass", "embedding", "every_step"))
    stages.append(Stage("decode", "autoregressive", "decoder", "every_step", max_tokens=None))
    return stages


def _genai_spec(root: str, cfg: dict, model: dict, dec: dict, components: dict, edges: list, n_layers: int,
                ins: dict) -> PipelineSpec:
    """The spec from the checked components, with the config's run-wide values (search, token ids, geometry)."""
    decoder = components["decoder"]
    positions = None
    if decoder.io.position_ids_input is not None:
        positions = implicit_positions(decoder, ins)
    tok = root if os.path.isfile(os.path.join(root, "tokenizer.json")) else None
    search = search_options(cfg.get("search"), "search", strict=False)
    ctx = int_value(model.get("context_length"), "model.context_length", minimum=1)
    if ctx and "max_length" not in (cfg.get("search") or {}):  # onnxruntime-genai's default: the context length
        search.max_length = ctx
    return PipelineSpec(
        root=root, components=components, dataflow=edges, stages=_default_stages(components), positions=positions,
        search=search,
        eos_token_ids=eos_list(model.get("eos_token_id"), "model.eos_token_id"),
        bos_token_id=int_value(model.get("bos_token_id"), "model.bos_token_id"),
        pad_token_id=int_value(model.get("pad_token_id"), "model.pad_token_id"),
        context_length=int_value(model.get("context_length"), "model.context_length", minimum=1),
        tokenizer_dir=tok, model_type=model.get("type"), num_layers=n_layers,
        num_kv_heads=int_value(dec.get("num_key_value_heads"), "model.decoder.num_key_value_heads"),
        head_size=int_value(dec.get("head_size"), "model.decoder.head_size"), source="genai_config",
        sliding_window=dec.get("sliding_window"), hidden_size=dec.get("hidden_size"),
        vocab_size=model.get("vocab_size"),
        vision_config=_vision_config(model),
        speech_config=model["speech"] if isinstance(model.get("speech"), dict) else None,
        input_aliases=_input_aliases(model),
        draft=model["draft"] if isinstance(model.get("draft"), dict) else None,
        speculative=_speculative(cfg),
        mtp=model["mtp"] if isinstance(model.get("mtp"), dict) else None,
        hidden_states_input=(dec.get("inputs") or {}).get("hidden_states") if isinstance(dec.get("inputs"), dict)
        else None)


def _speculative(cfg: dict):
    """The ``speculative`` section's options, its errors as the config's."""
    try:
        return speculative_options(cfg.get("speculative"))
    except RequestError as e:
        raise MetadataError(str(e)) from None


# onnxruntime-genai's names of what a processor returns, per section and config key
_NOMINAL = {"vision": {"pixel_values": "pixel_values", "image_sizes": "image_sizes",
                       "attention_mask": "image_attention_mask"},
            "speech": {"audio_embeds": "audio_embeds", "attention_mask": "audio_attention_mask",
                       "audio_sizes": "audio_sizes", "audio_projection_mode": "audio_projection_mode",
                       "audio_lengths": "audio_lengths"}}


def _input_aliases(model: dict) -> dict:
    """A processor output's name -> the graph input it feeds, where the config renames it (onnxruntime-genai's
    ``Config::AddMapping``)."""
    out = {}
    for sec, names in _NOMINAL.items():
        inputs = (model.get(sec) or {}).get("inputs") if isinstance(model.get(sec), dict) else None
        for key, nominal in names.items():
            port = (inputs or {}).get(key)
            if isinstance(port, str) and port != nominal:
                out[nominal] = port
    return out


def _vision_config(model: dict) -> dict | None:
    """``model.vision`` with the model's image token ids (``image_token_id``, ``vision_start_token_id``)."""
    if not isinstance(model.get("vision"), dict):
        return None
    out = dict(model["vision"])
    for k in ("image_token_id", "vision_start_token_id"):
        if k in model:
            out[k] = int_value(model[k], f"model.{k}")
    return out


def _mark_text_only(spec: PipelineSpec, graphs: Graphs) -> None:
    """A split VLM of a type whose processor is implemented (``pipeline/multimodal.py``) keeps its vision side,
    images optional (a Qwen-VL decoder's positions carry the image grid's maxima, ``pipeline/rope_index.py``);
    another split VLM is admitted for text only where its preprocessing cannot be represented; a builder
    ``*_vl_text`` decoder is text-only as declared."""
    from .multimodal import PROCESSOR_TYPES, QWEN_TYPES
    if ("vision" in spec.components or "speech" in spec.components) and spec.model_type in PROCESSOR_TYPES:
        images_optional(spec, graphs, "model")
        if spec.model_type in QWEN_TYPES and spec.positions is not None and spec.positions.rank == 3:
            spec.positions.continuation = "carry_max"
    elif "vision" in spec.components:
        admit_text_only(spec, graphs, "model")
    elif isinstance(spec.model_type, str) and spec.model_type.endswith("_vl_text"):
        # the builder's text half of a VLM: it can only ever decode text
        spec.text_only = True
        spec.text_only_reason = f"model.type {spec.model_type!r} is the text decoder of a vision-language model"
