"""Checks both package readers share: paths inside the package, ONNX graph ports, typed schema values.

``genai_config`` and ``metadata`` (inference_metadata.yaml) build a
``PipelineSpec`` from these pieces:

- ``resolve_in_package`` turns a package-relative path into an absolute one and
  refuses absolute paths and ``..``/symlink escapes (``IncompletePackageError``,
  also for a missing file or folder);
- ``read_document`` loads a package's top-level config file (JSON or YAML) and
  requires a mapping at its top;
- ``graph_ports`` reads an ONNX file's inputs and outputs without its external
  data; ``Graphs`` caches them per component file for one package;
- the ``check_keys`` / ``required`` / ``str_value`` / ``int_value`` / ``search_options`` family
  checks one schema value and raises ``MetadataError`` naming its key path
  (``a.b[i].c``), so every message says where the package is wrong;
- ``check_io_ports`` and ``check_edges`` hold a spec's port names against
  the components' graphs.

Nothing here reads a whole package or decides its form; that is ``metadata.load_package``.
"""
from __future__ import annotations

import os
import re

from .spec import ComponentSpec, IncompletePackageError, MetadataError, PipelineSpec, Positions, SearchOptions

__all__ = ["resolve_in_package", "read_document", "graph_ports", "Graphs", "check_keys", "required", "str_value", "int_value",
           "search_options", "eos_list", "find_tokenizer_dir", "position_rank", "implicit_positions", "check_io_ports",
           "check_edges", "component_spec"]

# search keys the builder writes that only matter for beam search; accepted at their neutral values
_NEUTRAL_SEARCH = {"num_beams": 1, "num_return_sequences": 1, "no_repeat_ngram_size": 0, "diversity_penalty": 0.0,
                   "length_penalty": 1.0, "early_stopping": None}
# read from a genai_config's search section (onnxruntime-genai's beam search); an inference_metadata spec, whose
# runner has no beams, takes them at their neutral values only
_BEAM_FIELDS = {"num_beams": int, "num_return_sequences": int, "no_repeat_ngram_size": int, "length_penalty": float,
                "early_stopping": bool,
                # and LFM2-Audio's speech output (pipeline/lfm2_audio.py)
                "audio_interleaved": bool, "audio_temperature": float, "audio_top_k": int}
_SEARCH_FIELDS = {"max_length": int, "min_length": int, "do_sample": bool, "top_k": int, "top_p": float,
                  "min_p": float, "temperature": float, "repetition_penalty": float,
                  "past_present_share_buffer": bool, "seed": int}


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


def component_spec(root: str, section: dict, key: str, name: str, ctype: str, files: dict) -> ComponentSpec:
    """The component of a config section's ``filename``: its file in the package, or its bytes from ``files``
    (then the file need not exist)."""
    rel = required(section, "filename", key)
    data = files.get(rel) if isinstance(rel, str) else None
    fname = resolve_in_package(root, rel, f"{key}.filename", must_exist=data is None)
    return ComponentSpec(name, fname, ctype, data=data)


def read_document(root: str, name: str, load, errors, fmt: str, top: str) -> dict:
    """The mapping at the top of the package's config file ``name``, parsed by ``load``; ``errors`` are its
    parse errors (reported as not valid ``fmt``), ``top`` names the mapping in the message when it is not one."""
    try:
        with open(os.path.join(root, name), encoding="utf-8") as f:
            doc = load(f)
    except errors as e:
        raise MetadataError(f"{name}: not valid {fmt} ({e})") from e
    if not isinstance(doc, dict):
        raise MetadataError(f"{name}: expected {top} at the top level")
    return doc


def _dtype_name(elem_type: int) -> str:
    from onnx import TensorProto
    name = TensorProto.DataType.Name(elem_type).lower()
    return {"float": "float32", "double": "float64", "float16": "float16"}.get(name, name)


def graph_ports(filename: str, data: bytes | None = None) -> tuple[dict, dict]:
    """(inputs, outputs) of an ONNX file (or of ``data``, its bytes given in memory): name -> (shape list of
    int|str|None, dtype name).

    Initializers listed as graph inputs (old exporters) are not ports.  External data is not read.
    """
    import onnx
    try:
        m = onnx.load_from_string(data) if data is not None else onnx.load(filename, load_external_data=False)
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


class Graphs:
    """Graph ports per component, loaded once per package."""

    def __init__(self):
        self._cache = {}

    def __call__(self, comp: ComponentSpec) -> tuple[dict, dict]:
        if comp.filename not in self._cache:
            self._cache[comp.filename] = graph_ports(comp.filename, comp.data)
        return self._cache[comp.filename]


def _join(key: str, k) -> str:
    return f"{key}.{k}" if key else str(k)


def check_keys(d, allowed, key: str):
    if not isinstance(d, dict):
        raise MetadataError(f"{key}: expected a mapping, got {type(d).__name__}")
    for k in d:
        if k not in allowed:
            raise MetadataError(f"{_join(key, k)}: unknown key (expected one of {', '.join(sorted(allowed))})")


def required(d: dict, k: str, key: str):
    if k not in d or d[k] is None:
        raise MetadataError(f"{_join(key, k)}: required key is missing")
    return d[k]


def str_value(v, key, optional=True):
    if v is None and optional:
        return None
    if not isinstance(v, str) or not v:
        raise MetadataError(f"{key}: expected a non-empty string, got {v!r}")
    return v


def int_value(v, key, optional=True, minimum=None):
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or (minimum is not None and v < minimum):
        lim = f" >= {minimum}" if minimum is not None else ""
        raise MetadataError(f"{key}: expected an integer{lim}, got {v!r}")
    return v


def eos_list(v, key) -> list:
    if v is None:
        return []
    vals = v if isinstance(v, list) else [v]
    return [int_value(x, key, optional=False, minimum=0) for x in vals]


def search_options(d, key: str, strict: bool) -> SearchOptions:
    s = SearchOptions()
    if d is None:
        return s
    if not isinstance(d, dict):
        raise MetadataError(f"{key}: expected a mapping, got {type(d).__name__}")
    for k, v in d.items():
        if not strict and k in _BEAM_FIELDS:  # a genai_config's beam search (og.Generator runs it)
            t = _BEAM_FIELDS[k]
            if isinstance(v, bool) != (t is bool) or not isinstance(v, (int, float)) or \
                    (t is int and not isinstance(v, int)):
                raise MetadataError(f"{key}.{k}: expected {t.__name__}, got {v!r}")
            setattr(s, k, t(v))
            continue
        if k in _NEUTRAL_SEARCH:
            neutral = _NEUTRAL_SEARCH[k]
            if neutral is not None and v != neutral:
                raise MetadataError(f"{key}.{k}: only {neutral!r} is supported (no beam search), got {v!r}")
            continue
        k = "seed" if k == "random_seed" else k  # onnxruntime-genai's name of the seed
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
              ("temperature", s.temperature >= 0.0), ("repetition_penalty", s.repetition_penalty > 0.0),
              ("num_beams", s.num_beams >= 1), ("num_return_sequences", 1 <= s.num_return_sequences <= s.num_beams),
              ("no_repeat_ngram_size", s.no_repeat_ngram_size >= 0)]
    for k, ok in checks:
        if not ok:
            raise MetadataError(f"{key}.{k}: value {getattr(s, k)!r} is out of range")
    return s


def find_tokenizer_dir(root, rel, key):
    """The folder holding tokenizer.json; ``rel`` names the folder or the tokenizer.json file itself."""
    if isinstance(rel, str) and os.path.basename(rel.rstrip("/\\")) == "tokenizer.json":
        return os.path.dirname(resolve_in_package(root, rel, key))
    folder = resolve_in_package(root, rel, key, kind="folder")
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        raise IncompletePackageError(f"{key}: tokenizer folder {rel!r} has no tokenizer.json")
    return folder


# ----------------------------------------------------------------------------------------------- checks on graphs

def check_io_ports(comp: ComponentSpec, graphs: Graphs, key: str):
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


def check_edges(spec: PipelineSpec, graphs: Graphs, key: str):
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


def position_rank(shape) -> int | None:
    """3 for mrope position ids ([3, batch, seq]), 1 for [batch, seq], None when the graph does not say."""
    if shape is None:
        return None
    if len(shape) == 3 and shape[0] == 3:
        return 3
    if len(shape) == 2:
        return 1
    return None


def implicit_positions(decoder: ComponentSpec, ins: dict) -> Positions:
    """Linear positions on the decoder's ``position_ids_input``, of the rank its graph shape says (else 1)."""
    rank = position_rank(ins[decoder.io.position_ids_input][0]) or 1
    return Positions(decoder.io.position_ids_input, rank, "linear_increment")
