"""Load a GenAI package folder into a ``PipelineSpec``.

``load_package`` reads either package form; the folder's
``inference_metadata.yaml`` wins over its ``genai_config.json``:

- ``genai_config.json`` as the onnxruntime-genai model builder writes it: one
  decoder, or a split VLM (``vision`` / ``embedding`` / ``decoder`` sections);
  read by ``genai_config.load_genai_config``.
- ``inference_metadata.yaml``: a composite of components joined by dataflow
  edges and run in stages, read here.  The schema is checked strictly: an
  unknown or contradictory key raises ``MetadataError`` naming its key path.

Text-only admission (``text_only``): a split VLM (vision, embedding, decoder)
whose declared image preprocessing cannot be represented here (Qwen's
``smart_resize``, min/max pixel budgets) is admitted for text decoding: the
vision component and its edges are dropped, the embedding takes the prompt ids,
its image-feature input gets a zero-token absent value, and ``spec.text_only``
is set.  The checks both readers share are in ``package_checks``.

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

import os

from .genai_config import GENAI_CONFIG, load_genai_config
from .package_checks import (Graphs, check_edges, check_io_ports, check_keys, eos_list, find_tokenizer_dir,
                             graph_ports, implicit_positions, int_value, position_rank, read_document, required,
                             resolve_in_package, search_options, str_value)
from .spec import (AbsentValue, ComponentSpec, Edge, IncompletePackageError, IOSpec, MetadataError, PipelineSpec,
                   Positions, Stage, StatePair)
from .text_only import admit_text_only, is_vision, preprocessing_unrepresentable

__all__ = ["load_package", "load_genai_config", "load_inference_metadata", "graph_ports", "resolve_in_package",
           "preprocessing_unrepresentable", "GENAI_CONFIG", "INFERENCE_METADATA"]

INFERENCE_METADATA = "inference_metadata.yaml"

_DTYPES = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool"}
_RUN_ON = ("prompt_only", "every_step", "final_only")
_CONTINUATIONS = ("linear_increment", "carry_max")
_SEQUENCE_SOURCES = ("token_ids", "inputs_embeds")


# ----------------------------------------------------------------------------------------------- entry point

def load_package(path, overlay: dict | None = None, files: dict | None = None, draft: bool = False) -> PipelineSpec:
    """Read the package at ``path`` (a folder, or its genai_config.json / inference_metadata.yaml); ``overlay``:
    a mapping merged into a genai_config.json (``og.Config.overlay``); ``files``: a genai_config.json package's
    model files given in memory, by the name the config gives them (``og.Config.add_model_data``); ``draft``: the
    spec of a genai_config.json's draft decoder (``model.draft``) instead."""
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
        if overlay or files:
            raise MetadataError(f"{path!r}: overlays and model data in memory apply to a {GENAI_CONFIG}, not to "
                                f"{name}")
        return load_inference_metadata(root, name)
    if name.endswith(".json"):
        return load_genai_config(root, name, overlay, files, draft)
    raise MetadataError(f"{path!r}: expected a {GENAI_CONFIG} or {INFERENCE_METADATA} file")


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
    check_keys(d, _IO_KEYS, key)
    for k in ("token_input", "inputs_embeds_input", "logits_output", "attention_mask_input", "position_ids_input"):
        setattr(io, k, str_value(d.get(k), f"{key}.{k}"))
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
        setattr(io, k, [str_value(p, f"{key}.{k}[{i}]", optional=False) for i, p in enumerate(v)])
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
        check_keys(sp, {"input", "output", "init", "update"}, k)
        init, update = sp.get("init", "zeros"), sp.get("update", "replace")
        if init != "zeros":
            raise MetadataError(f"{k}.init: only 'zeros' is supported, got {init!r}")
        if update != "replace":
            raise MetadataError(f"{k}.update: only 'replace' is supported, got {update!r}")
        io.state_pairs.append(StatePair(str_value(required(sp, "input", k), f"{k}.input", False),
                                        str_value(required(sp, "output", k), f"{k}.output", False), init, update))
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
        check_keys(v, {"shape", "dtype"}, k)
        shape = required(v, "shape", k)
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
    check_keys(st, {"name", "strategy", "run_on"}, k)
    name = str_value(required(st, "name", k), f"{k}.name", False)
    strat = required(st, "strategy", k)
    kind = required(strat, "kind", f"{k}.strategy") if isinstance(strat, dict) else None
    if kind == "single_pass":
        check_keys(strat, {"kind", "model"}, f"{k}.strategy")
        model = str_value(required(strat, "model", f"{k}.strategy"), f"{k}.strategy.model", False)
        if model not in models:
            raise MetadataError(f"{k}.strategy.model: {model!r} is not a model in pipeline.models")
        run_on = st.get("run_on", "prompt_only")
        max_tokens = None
    elif kind == "autoregressive":
        check_keys(strat, {"kind", "decoder", "max_tokens"}, f"{k}.strategy")
        model = str_value(required(strat, "decoder", f"{k}.strategy"), f"{k}.strategy.decoder", False)
        if model not in models:
            raise MetadataError(f"{k}.strategy.decoder: {model!r} is not a model in pipeline.models")
        max_tokens = int_value(strat.get("max_tokens"), f"{k}.strategy.max_tokens", minimum=1)
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
    doc = _read_yaml(root, name)
    pipe = _pipeline_section(doc)
    components = _parse_models(root, pipe)
    edges, fed = _parse_dataflow(pipe)
    stages = _parse_stages(pipe, components)
    decoder = _stage_decoder(stages, components)
    positions = _parse_positions(pipe, decoder)
    tok = _run_tokenizer(root, doc, decoder)
    spec = PipelineSpec(
        root=root, components=components, dataflow=edges, stages=stages, positions=positions,
        search=search_options(doc.get("search"), "search", strict=True),
        eos_token_ids=eos_list(doc.get("eos_token_id"), "eos_token_id"),
        bos_token_id=int_value(doc.get("bos_token_id"), "bos_token_id", minimum=0),
        pad_token_id=int_value(doc.get("pad_token_id"), "pad_token_id", minimum=0),
        context_length=int_value(doc.get("context_length"), "context_length", minimum=1),
        tokenizer_dir=tok, source="inference_metadata")

    # the package must be complete before anything is dropped from it
    graphs = Graphs()
    _check_graphs(spec, decoder, fed, graphs)
    _check_positions(spec, decoder, graphs)
    if any(is_vision(c) for c in components.values()):
        admit_text_only(spec, graphs, "pipeline")
    return spec


def _read_yaml(root: str, name: str) -> dict:
    """The metadata file's top-level YAML mapping."""
    import yaml
    return read_document(root, name, yaml.safe_load, yaml.YAMLError, "YAML", "a mapping")


def _pipeline_section(doc: dict) -> dict:
    """The ``pipeline`` mapping; run-wide keys written under it are moved to the top level of ``doc``."""
    check_keys(doc, _TOP_KEYS, "")  # top-level keys are named bare
    pipe = required(doc, "pipeline", "")
    check_keys(pipe, _PIPELINE_KEYS, "pipeline")
    for k in _RUN_KEYS:
        if k in pipe:
            if k in doc and doc[k] != pipe[k]:
                raise MetadataError(f"pipeline.{k}: contradicts the top-level {k} ({pipe[k]!r} vs {doc[k]!r})")
            doc[k] = pipe[k]
    return pipe


def _parse_models(root: str, pipe: dict) -> dict:
    """``pipeline.models``: component name -> ComponentSpec, in declaration order."""
    models = required(pipe, "models", "pipeline")
    if not isinstance(models, dict) or not models:
        raise MetadataError("pipeline.models: expected a non-empty mapping name -> model")
    components = {}
    for cname, m in models.items():
        k = f"pipeline.models.{cname}"
        if not isinstance(cname, str) or not cname or "." in cname:
            raise MetadataError(f"{k}: a component name must be a non-empty string without '.'")
        check_keys(m, _MODEL_KEYS, k)
        fname = resolve_in_package(root, required(m, "filename", k), f"{k}.filename")
        ctype = str_value(required(m, "type", k), f"{k}.type", False)
        tok = find_tokenizer_dir(root, m["tokenizer"], f"{k}.tokenizer") if m.get("tokenizer") is not None else None
        components[cname] = ComponentSpec(cname, fname, ctype, _parse_io(m.get("io"), f"{k}.io"), tok)
    return components


def _parse_dataflow(pipe: dict) -> tuple[list, dict]:
    """``pipeline.dataflow`` edges, and (component, port) -> index of the one edge feeding it."""
    edges = []
    flow = pipe.get("dataflow") or []
    if not isinstance(flow, list):
        raise MetadataError("pipeline.dataflow: expected a list of edges")
    for i, e in enumerate(flow):
        k = f"pipeline.dataflow[{i}]"
        check_keys(e, {"from", "to", "dtype"}, k)
        src, sport = _parse_endpoint(required(e, "from", k), f"{k}.from")
        dst, dport = _parse_endpoint(required(e, "to", k), f"{k}.to")
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
    return edges, fed


def _parse_stages(pipe: dict, components: dict) -> list:
    """``pipeline.strategy``: a composite of uniquely named stages, exactly one of them autoregressive."""
    strat = required(pipe, "strategy", "pipeline")
    check_keys(strat, {"kind", "stages"}, "pipeline.strategy")
    if strat.get("kind") != "composite":
        raise MetadataError(f"pipeline.strategy.kind: expected 'composite', got {strat.get('kind')!r}")
    raw_stages = required(strat, "stages", "pipeline.strategy")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise MetadataError("pipeline.strategy.stages: expected a non-empty list of stages")
    stages = [_parse_stage(st, i, components, "pipeline.strategy.stages") for i, st in enumerate(raw_stages)]
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise MetadataError(f"pipeline.strategy.stages: stage names repeat ({names})")
    n_ar = sum(s.kind == "autoregressive" for s in stages)
    if n_ar != 1:
        raise MetadataError(f"pipeline.strategy.stages: exactly one autoregressive stage is required, got {n_ar}")
    return stages


def _stage_decoder(stages: list, components: dict) -> ComponentSpec:
    """The autoregressive stage's component, which must name its logits and its sequence input."""
    decoder = next(components[s.model] for s in stages if s.kind == "autoregressive")
    dk = f"pipeline.models.{decoder.name}.io"
    if decoder.io.logits_output is None:
        raise MetadataError(f"{dk}.logits_output: required for the autoregressive decoder")
    if decoder.io.sequence_source == "token_ids" and decoder.io.token_input is None:
        raise MetadataError(f"{dk}.token_input: required for a decoder whose sequence_source is token_ids")
    return decoder


def _parse_positions(pipe: dict, decoder: ComponentSpec) -> Positions | None:
    """``pipeline.positions``, or None; its input becomes the decoder's ``position_ids_input``."""
    pos = pipe.get("positions")
    if pos is None:
        return None
    dk = f"pipeline.models.{decoder.name}.io"
    check_keys(pos, {"input", "rank", "continuation"}, "pipeline.positions")
    pin = str_value(required(pos, "input", "pipeline.positions"), "pipeline.positions.input", False)
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
    return Positions(pin, rank, cont)


def _run_tokenizer(root: str, doc: dict, decoder: ComponentSpec) -> str | None:
    """The tokenizer folder: the top-level ``tokenizer``, else the decoder's, else the package folder's own."""
    if doc.get("tokenizer") is not None:
        return find_tokenizer_dir(root, doc["tokenizer"], "tokenizer")
    if decoder.tokenizer is not None:
        return decoder.tokenizer
    if os.path.isfile(os.path.join(root, "tokenizer.json")):
        return root
    return None


def _check_graphs(spec: PipelineSpec, decoder: ComponentSpec, fed: dict, graphs: Graphs) -> None:
    """Every io port and edge endpoint against the graphs; an embeddings decoder needs an edge feeding it."""
    for comp in spec.components.values():
        check_io_ports(comp, graphs, f"pipeline.models.{comp.name}")
    check_edges(spec, graphs, "pipeline.dataflow")
    if decoder.io.sequence_source == "inputs_embeds" and (decoder.name, decoder.io.inputs_embeds_input) not in fed:
        raise MetadataError(f"pipeline.models.{decoder.name}.io.inputs_embeds_input: no pipeline.dataflow edge "
                            f"feeds {decoder.name}.{decoder.io.inputs_embeds_input}")


def _check_positions(spec: PipelineSpec, decoder: ComponentSpec, graphs: Graphs) -> None:
    """Declared positions against the decoder graph; undeclared ones are inferred from ``position_ids_input``."""
    dins = graphs(decoder)[0]
    positions = spec.positions
    if positions is not None:
        if positions.input not in dins:
            raise IncompletePackageError(f"pipeline.positions.input: {positions.input!r} is not an input of "
                                         f"{decoder.filename}")
        grank = position_rank(dins[positions.input][0])
        if grank is not None and grank != positions.rank:
            raise MetadataError(f"pipeline.positions.rank: {positions.rank} contradicts the decoder's "
                                f"{positions.input!r} shape {dins[positions.input][0]}")
    elif decoder.io.position_ids_input is not None:
        spec.positions = implicit_positions(decoder, dins)
