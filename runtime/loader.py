"""Load ONNX models from a path, bytes or a ``ModelProto`` into the IR.

Invariants:
- External data is memory-mapped, one read-only map per file, and handed out
  as zero-copy numpy views; nothing is copied up front (float weights are
  read once, by the NaN scan).
- A location that is absolute, climbs out of the model's folder (``..``, a
  symlink) or reaches past the end of its file is refused with
  ``ExternalDataPathError`` / ``ExternalDataRangeError``; float weights that
  hold NaN (a damaged file), and data that no longer matches its digest
  record (``runtime.digests``), with ``ExternalDataDamagedError``.
- onnx's C++ (the inliner here, shape inference in its pass) runs isolated
  (``runtime.isolate``), after the checks of nodes it is known to crash on.
- Model-local functions are inlined before the IR is built.
"""
from __future__ import annotations

import os
import re

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto, numpy_helper

from . import isolate
from .digests import FileDigests
from .dtypes import np_dtype
from .errors import ExternalDataDamagedError, ExternalDataPathError, ExternalDataRangeError, ModelFileNotFoundError, ModelLoadError, ModelParseError
from .ir import Graph, graph_from_proto, valueinfo_from_proto
from .settings import flag

__all__ = ["load_model_proto", "load_graph", "resolve_external_path", "model_meta", "newest_opsets"]


def load_model_proto(model) -> tuple[ModelProto, str | None]:
    """Parse ``model`` (path, bytes or ModelProto) without loading external data."""
    if isinstance(model, ModelProto):
        return model, None
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            m = onnx.load_from_string(bytes(model))
        except (DecodeError, RuntimeError, ValueError) as e:
            raise ModelParseError(f"bytes are not a valid ONNX ModelProto: {e}") from None
        return m, None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise ModelFileNotFoundError(f"model file {path!r} does not exist")
        try:
            m = onnx.load(path, load_external_data=False)
        except (DecodeError, RuntimeError, ValueError) as e:
            raise ModelParseError(f"{path!r} is not a valid ONNX model: {e}") from None
        return m, os.path.dirname(os.path.abspath(path))
    raise TypeError(f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")


def resolve_external_path(base_dir: str | None, location: str) -> str:
    """Absolute path of an external-data file, refusing anything outside ``base_dir``."""
    if base_dir is None:
        raise ExternalDataPathError(
            f"tensor data lives in external file {location!r} but the model was not loaded from a "
            "path, so there is no model folder to resolve it against")
    if not location or os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location[:3]:
        raise ExternalDataPathError(
            f"external data location {location!r} must be a relative path inside the model folder {base_dir!r}")
    root = os.path.realpath(base_dir)
    full = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, full]) != root:
        raise ExternalDataPathError(
            f"external data location {location!r} resolves to {full!r}, outside the model folder {root!r}")
    if not os.path.isfile(full):
        raise ExternalDataPathError(f"external data file {full!r} (location {location!r}) does not exist")
    return full


class _ExternalData:
    """One read-only memory map per external file; ``files`` (location -> bytes, onnxruntime's external
    initializer files in memory) stand in for files of those locations, which are then never opened."""

    def __init__(self, base_dir: str | None, files: dict | None = None):
        self.base_dir = base_dir
        self.files = files or {}
        self.maps: dict[str, np.memmap] = {}
        self.digests: dict = {}  # path -> digests.FileDigests or None (no record)

    def tensor(self, t: TensorProto) -> np.ndarray:
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        if location in self.files:
            path = "memory:" + location
            if path not in self.maps:
                self.maps[path] = np.frombuffer(self.files[location], np.uint8)
                self.digests[path] = None
        else:
            path = resolve_external_path(self.base_dir, location)
        mm = self.maps.get(path)
        if mm is None:
            size = os.path.getsize(path)
            mm = np.memmap(path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
            self.maps[path] = mm
            self.digests[path] = FileDigests.load(path, location) if flag("ONNX_NUMBA_CHECK_WEIGHTS") else None
        size = mm.shape[0]
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else size - offset
        except ValueError:
            raise ModelLoadError(f"tensor {t.name!r}: external data offset/length are not integers: {info}") from None
        if offset < 0 or length < 0 or offset + length > size:
            raise ExternalDataRangeError(
                f"tensor {t.name!r}: external data [{offset}, {offset + length}) reaches past the end of "
                f"{location!r} ({size} bytes)")
        dims = tuple(int(d) for d in t.dims)
        dtype = np_dtype(t.data_type)
        count = int(np.prod(dims)) if dims else 1
        if dtype.itemsize * count != length and t.data_type not in _PACKED:
            raise ExternalDataRangeError(
                f"tensor {t.name!r}: shape {dims} of {dtype} needs {dtype.itemsize * count} bytes, "
                f"external data holds {length}")
        if self.digests[path] is not None:
            self.digests[path].check(mm, offset, length, t.name)
        raw = mm[offset:offset + length]
        if t.data_type in _PACKED or dtype == object:
            # Sub-byte types are unpacked by onnx's own helper (a copy).
            tp = TensorProto()
            tp.CopyFrom(t)
            del tp.external_data[:]
            tp.data_location = TensorProto.DEFAULT
            tp.raw_data = raw.tobytes()
            return numpy_helper.to_array(tp)
        # A plain (read-only) ndarray over the map, not an np.memmap: Numba types a subclass instance on its
        # slow path, which costs a microsecond per weight on every call into compiled code.
        arr = raw.view(dtype=dtype, type=np.ndarray)
        if not arr.flags.aligned:
            arr = arr.copy()
        if dtype.kind == "f" and flag("ONNX_NUMBA_CHECK_WEIGHTS"):
            _refuse_nan(arr, t.name, location, offset)
        return arr.reshape(dims)


_SCAN = 1 << 20  # elements per chunk of the NaN scan: no temporary grows with the tensor


def _refuse_nan(flat: np.ndarray, name: str, location: str, offset: int) -> None:
    """Float weights hold no NaN; a data file overwritten midway (random bytes are NaN one float in 256, so any
    damaged stretch of more than a few hundred bytes holds one) or a bad download does.  Zeros written over
    weights, or damage to packed integer weights, cannot be told from the data: the digest record
    (``runtime.digests``) catches those."""
    for start in range(0, flat.shape[0], _SCAN):
        bad = np.isnan(flat[start:start + _SCAN])
        if bad.any():
            k = start + int(np.argmax(bad))
            raise ExternalDataDamagedError(
                f"tensor {name!r}: element {k} (byte {offset + k * flat.dtype.itemsize} of {location!r}) is NaN; "
                f"float weights hold no NaN, so the data file is damaged or was overwritten (set "
                f"ONNX_NUMBA_CHECK_WEIGHTS=0 to load it anyway)")


def _map_of(a):
    """(the mmap behind array ``a``, the address of its first byte), or (None, 0)."""
    import mmap
    prev, b = a, getattr(a, "base", None)
    while b is not None and not isinstance(b, mmap.mmap):
        prev, b = b, getattr(b, "base", None)
    if b is None:
        return None, 0
    return b, prev.__array_interface__["data"][0]  # ``prev``: the np.memmap over the whole file


def release_pages(arrays, whole: bool = True) -> int:
    """Let the kernel drop the resident pages behind ``arrays`` (external-data weights): planning reads every
    weight it repacks, and the repacked copy is what runs, so keeping the originals resident would hold those
    weights twice.  ``whole``: the whole files they map, else only the pages each array spans.  Pages a run
    reads later come back from the page cache on demand (the maps are read-only, so nothing is lost).
    Returns how many ranges were advised."""
    import mmap
    if not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    page = mmap.PAGESIZE
    ranges = {}
    for a in arrays:
        m, base = _map_of(a)
        if m is None:
            continue
        if whole:
            ranges[(id(m), 0)] = (m, 0, len(m))
            continue
        start = a.__array_interface__["data"][0] - base
        lo, hi = start // page * page, min(len(m), -(-(start + a.nbytes) // page) * page)
        if hi > lo:
            ranges[(id(m), lo)] = (m, lo, hi - lo)
    for m, off, n in ranges.values():
        try:
            m.madvise(mmap.MADV_DONTNEED, off, n)
        except (OSError, ValueError):  # a closed map: nothing to release
            pass
    return len(ranges)


_PACKED = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2") if hasattr(TensorProto, n)}


def model_meta(proto: ModelProto) -> dict:
    """The model's descriptive fields, named as onnxruntime's ``ModelMetadata`` names them."""
    return {
        "producer_name": proto.producer_name, "graph_name": proto.graph.name, "domain": proto.domain,
        "description": proto.doc_string, "graph_description": proto.graph.doc_string,
        "version": proto.model_version if proto.HasField("model_version") else (1 << 63) - 1,
        "custom_metadata_map": {p.key: p.value for p in proto.metadata_props},
    }


def newest_opsets() -> dict:
    """The newest opset of each ONNX domain this runtime knows (that of the onnx package it is built on)."""
    if not _NEWEST:
        for schema in onnx.defs.get_all_schemas_with_history():
            _NEWEST[schema.domain] = max(_NEWEST.get(schema.domain, 0), schema.since_version)
        _NEWEST["ai.onnx"] = _NEWEST[""]
    return _NEWEST


_NEWEST: dict = {}
_ONNX_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview", "ai.onnx.preview.training"})


def newest_opset(domain: str):
    """``newest_opsets()[domain]`` without listing every schema for the default domain (each load asks); None for
    a domain onnx does not define (``com.microsoft``)."""
    if domain in ("", "ai.onnx"):
        return onnx.defs.onnx_opset_version()
    return newest_opsets().get(domain) if domain in _ONNX_DOMAINS else None


def _check_versions(proto: ModelProto) -> None:
    """Refuse an IR version or an ONNX-domain opset newer than this runtime knows: its ops may mean something else."""
    if proto.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(f"the model's IR version is {proto.ir_version}; the newest this runtime supports is "
                             f"{onnx.IR_VERSION}")
    for o in proto.opset_import:
        top = newest_opset(o.domain)
        if top is not None and o.version > top:
            raise ModelLoadError(f"the model imports opset {o.version} of domain {o.domain or 'ai.onnx'!r}; the newest "
                                 f"this runtime supports is {top}")


_EINSUM_TERM = r"\s*[A-Za-z]*(?:\.\.\.)?[A-Za-z]*\s*"
_EINSUM = re.compile(rf"^{_EINSUM_TERM}(?:,{_EINSUM_TERM})*(?:->{_EINSUM_TERM})?$")


_SCHEMAS: dict = {}


def _schema(op_type, domain, version):
    key = (op_type, domain, version)
    if key not in _SCHEMAS:
        try:
            _SCHEMAS[key] = onnx.defs.get_schema(op_type, version, domain)
        except Exception:  # no such op at that version: the planner reports it
            _SCHEMAS[key] = None
    return _SCHEMAS[key]


def _arity_defect(n, opsets: dict) -> str | None:
    """A required input left empty, or more inputs than the op has: onnx's shape inference may read past the
    node's inputs on these (a missing EyeLike input segfaults it)."""
    domain = "" if n.domain == "ai.onnx" else n.domain
    if domain not in ("", "ai.onnx.ml") or domain not in opsets:
        return None
    schema = _schema(n.op_type, domain, opsets[domain])
    if schema is None:
        return None
    if len(n.input) > schema.max_input:
        return f"has {len(n.input)} inputs; {n.op_type} takes at most {schema.max_input}"
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for k, formal in enumerate(schema.inputs):
        if formal.option == single and (k >= len(n.input) or not n.input[k]):
            return f"its required input {k} ({formal.name}) is missing"
    return None


def _node_defects(n, opsets: dict) -> str | None:
    """What is wrong with a node that onnx's C++ shape inference crashes or hangs on (it is called on every model
    loaded, so an untrusted model must not reach it with these); None when nothing is."""
    why = _arity_defect(n, opsets)
    if why is not None:
        return why
    attrs = {a.name: a for a in n.attribute}
    if n.domain in ("", "ai.onnx"):
        if n.op_type == "GatherND" and "batch_dims" in attrs and attrs["batch_dims"].i < 0:
            return f"batch_dims must be >= 0, got {attrs['batch_dims'].i}"
        if n.op_type == "Einsum":
            eq = attrs["equation"].s.decode("utf-8", "replace") if "equation" in attrs else ""
            if not _EINSUM.match(eq):
                return (f"equation {eq!r} is not an Einsum equation (comma-separated terms of letters with at most "
                        f"one '...' each, optionally '->' and an output term)")
            if eq.split("->")[0].count(",") + 1 != len(n.input):
                return f"equation {eq!r} has {eq.split('->')[0].count(',') + 1} input term(s) for {len(n.input)} inputs"
        if n.op_type == "Split" and "num_outputs" in attrs and attrs["num_outputs"].i != len(n.output):
            return f"num_outputs is {attrs['num_outputs'].i} but the node has {len(n.output)} outputs"
    return None


def _text(value, what: str) -> None:
    # protobuf hands a string field that is not valid UTF-8 back as bytes
    if isinstance(value, bytes):
        raise ModelLoadError(f"{what} is not valid UTF-8: {value!r}")


def _check_nodes(g, opsets: dict) -> None:
    """Refuse names that are not text and nodes that onnx's shape inference cannot survive (``_node_defects``),
    in ``g`` and its subgraphs."""
    _text(g.name, "the graph name")
    for coll, what in ((g.input, "graph input"), (g.output, "graph output"), (g.value_info, "value_info"),
                       (g.initializer, "initializer")):
        for v in coll:
            _text(v.name, f"a {what} name")
    for n in g.node:
        _text(n.name, "a node name")
        _text(n.op_type, f"the op type of node {n.name!r}")
        _text(n.domain, f"the domain of node {n.name!r}")
        for x in list(n.input) + list(n.output):
            _text(x, f"an input or output name of node {n.name!r}")
        for a in n.attribute:
            _text(a.name, f"an attribute name of node {n.name!r}")
        why = _node_defects(n, opsets)
        if why is not None:
            raise ModelLoadError(f"node {n.name!r} ({n.op_type}): {why}")
        for a in n.attribute:
            for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _check_nodes(sg, opsets)


def _check_dims(g) -> None:
    """Refuse initializers with negative dimensions before any of their data is read."""
    for t in g.initializer:
        if any(d < 0 for d in t.dims):
            raise ModelLoadError(f"initializer {t.name!r} has negative dimensions {list(t.dims)}")
    for sp in g.sparse_initializer:
        if any(d < 0 for d in sp.dims):
            raise ModelLoadError(f"sparse initializer {sp.values.name!r} has negative dimensions {list(sp.dims)}")


def _user_initializers(g, given: dict) -> dict:
    protos = {t.name: t for t in g.initializer}
    out = {}
    for name, arr in given.items():
        t = protos.get(name)
        if t is None:
            raise ModelLoadError(f"an initializer named {name!r} was supplied (SessionOptions.add_initializer) but "
                                 f"the model has no initializer of that name; it has {sorted(protos)[:20]}")
        try:
            want = np_dtype(t.data_type)
        except TypeError:
            want = None
        arr = np.asarray(arr)
        if (want is not None and arr.dtype != want) or tuple(arr.shape) != tuple(t.dims):
            raise ModelLoadError(f"initializer {name!r}: the model declares {want}{list(t.dims)}, the supplied "
                                 f"value is {arr.dtype}{list(arr.shape)}")
        out[name] = arr
    return out


def _tensors_of(g):
    for t in g.initializer:
        yield t
    for n in g.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _tensors_of(sg)


def _inline_functions(proto: ModelProto) -> ModelProto:
    """``proto`` with its model-local functions inlined by onnx, run isolated (``runtime.isolate``).  The child
    gets the model without initializer data (the inliner never reads it), which is then put back by name."""
    bare = ModelProto()
    bare.CopyFrom(proto)
    bare.graph.ClearField("initializer")
    bare.graph.initializer.extend(_bare_tensor(t) for t in proto.graph.initializer)
    try:
        out = isolate.call("inline_local_functions", (bare.SerializeToString(),), "function inliner")
    except isolate.IsolatedStepError as e:
        raise ModelLoadError(f"could not inline model-local functions: {e}") from None
    inlined = ModelProto()
    inlined.ParseFromString(out)
    data = {t.name: t for t in proto.graph.initializer}
    kept = [data.get(t.name, t) for t in inlined.graph.initializer]
    inlined.graph.ClearField("initializer")
    inlined.graph.initializer.extend(kept)
    return inlined


def _bare_tensor(t: TensorProto) -> TensorProto:
    bare = TensorProto()
    bare.name, bare.data_type = t.name, t.data_type
    bare.dims.extend(t.dims)
    return bare


def load_graph(model, initializers: dict | None = None, overridable_as_inputs: bool = False,
               external_files: dict | None = None, external_folder: str | None = None) -> Graph:
    """Load ``model`` into an IR graph (external data mapped, local functions inlined).

    ``initializers`` (name -> array, ``SessionOptions.add_initializer``) replace the model's initializers of
    those names, whose data is then never read (it may live in an external file that does not exist); each
    must name an initializer of the main graph and match its element type and shape.  ``external_files``
    (location -> bytes, ``SessionOptions.add_external_initializers_from_files_in_memory``) hold the content of
    external-data files of those locations, read instead of the disk.  ``external_folder`` is where the external
    data of a model given as bytes or a ``ModelProto`` lives (onnxruntime's
    ``session.model_external_initializers_file_folder_path``; a model loaded from a file keeps its own folder).

    Graph inputs that also have an initializer (IR version 4 on: onnxruntime's overridable initializers) are
    listed in ``graph.overridable``; they stay constants unless ``overridable_as_inputs``, which keeps them as
    inputs with their initializers as defaults (``graph.input_defaults``)."""
    isolate.prestart()  # its start overlaps the parsing and mapping below
    proto, base_dir = load_model_proto(model)
    if base_dir is None and external_folder:
        base_dir = os.path.abspath(external_folder)
    if not proto.HasField("graph"):
        raise ModelLoadError("model has no graph")
    if proto.functions:
        proto = _inline_functions(proto)
    _check_versions(proto)
    opsets = {}
    for o in proto.opset_import:
        opsets[o.domain if o.domain != "ai.onnx" else ""] = o.version
    if "" not in opsets:
        opsets[""] = 1 if proto.ir_version < 3 else onnx.defs.onnx_opset_version()
    _check_dims(proto.graph)
    for o in proto.opset_import:
        _text(o.domain, "an opset_import domain")
    _check_nodes(proto.graph, opsets)
    ext = _ExternalData(base_dir, external_files)
    loaded = _user_initializers(proto.graph, initializers or {})
    for t in proto.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL and t.name not in loaded:
            loaded[t.name] = ext.tensor(t)
    # External tensors inside Constant attributes are rare; resolve them in place.
    for t in _tensors_of(proto.graph):
        if t.data_location == TensorProto.EXTERNAL and t.name not in loaded:
            arr = ext.tensor(t)
            t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(arr), t.name))
    init_names = {t.name for t in proto.graph.initializer}
    overridable = [v for v in proto.graph.input if v.name in init_names] if proto.ir_version >= 4 else []
    try:
        graph = graph_from_proto(proto.graph, opsets, loaded,
                                 as_inputs={v.name for v in overridable} if overridable_as_inputs else ())
        graph.overridable = [valueinfo_from_proto(v) for v in overridable]
    except (ValueError, TypeError) as e:
        raise ModelLoadError(f"model graph is malformed: {e}") from None
    graph.ir_version = proto.ir_version
    graph.model_meta = model_meta(proto)
    graph.base_dir = base_dir
    graph.external = ext
    graph.toposort()
    return graph
