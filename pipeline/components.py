"""The two component interfaces and their onnxruntime and native implementations.

- ``ComponentSession`` (stateless): declared inputs and outputs; ``run(feeds)``
  returns a dict of outputs.
- ``DecoderComponent`` (stateful): ``prefill`` and ``step`` take token ids or
  embeddings plus extra inputs and return the next-token logits (or, with
  ``want="argmax"``, the greedy token ids; with ``want="all"``, every new
  position's logits); ``kv_length`` is the live cache
  length; ``rewind(n)`` drops everything after the first ``n`` positions;
  ``greedy_step(token)`` is one batch-1 greedy step (ints in and out).

The decoder owns its loop-carried values: its KV caches behind the one
interface of ``kv_cache.KVCache`` (only the new positions of each step are
written, so a step's cost follows the live length) and its recurrent and
conv state pairs, replaced by each step's outputs.  The native decoder's
attention caches are buffers that past and present share: its session
(``SessionOptions.kv_share_buffer``) lets GroupQueryAttention write the new
rows into them in place, so nothing is copied between steps (with
``ONNX_NUMBA_KV_SHARE_BUFFER=0`` each step's present holds exactly the live
rows and is fed back as the next step's past).  Across its ``prefill`` /
``step`` boundary only the step's ids or embeddings (and the small mask /
position inputs it builds itself) go in, and only logits or the argmax come
out; ``transfers`` counts exactly those bytes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .kv_cache import CacheSpec, CopiedKV, policy_for
from .spec import ComponentSpec, IncompletePackageError, MetadataError, PipelineSpec, RequestError

__all__ = ["ComponentSession", "OrtComponent", "NativeComponent", "DecoderComponent", "OrtDecoder",
           "NativeDecoder", "Transfers"]


FOLDER_KEY = "session.model_external_initializers_file_folder_path"


def model_source(spec: ComponentSpec, options=None):
    """(what a session loads for ``spec``, its session options): the component's file; or, for bytes given in
    memory (``og.Config.add_model_data``), the bytes, with the component's folder as the folder of their external
    data (``session.model_external_initializers_file_folder_path``, as onnxruntime-genai sets it), in a copy of
    ``options`` (this runtime's; new ones when None)."""
    if spec.data is None:
        return spec.filename, options
    import copy
    if options is None:
        from runtime import SessionOptions
        options = SessionOptions()
    else:
        options = copy.copy(options)
    options.add_session_config_entry(FOLDER_KEY, os.path.dirname(spec.filename))
    return spec.data, options


def _ort_session(spec: ComponentSpec, providers=None):
    import onnxruntime as ort
    options = None
    if spec.data is not None:
        options = ort.SessionOptions()
        options.add_session_config_entry(FOLDER_KEY, os.path.dirname(spec.filename))
    return ort.InferenceSession(spec.source, options, providers=providers or ["CPUExecutionProvider"])


class ComponentSession:
    """A stateless component: ``run(feeds) -> {output: array}``."""

    backend = "?"

    def __init__(self, spec: ComponentSpec, session):
        self.spec = spec
        self.name = spec.name
        self.session = session
        self.inputs = {i.name: i for i in session.get_inputs()}
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        self.outputs = {o.name: o for o in session.get_outputs()}

    def run(self, feeds: dict) -> dict:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise IncompletePackageError(f"component {self.name!r}: nothing provides input(s) {missing}")
        out = self.session.run(None, {n: feeds[n] for n in self.input_names})
        return dict(zip(self.output_names, out))


class OrtComponent(ComponentSession):
    backend = "ort"

    def __init__(self, spec: ComponentSpec, providers=None):
        super().__init__(spec, _ort_session(spec, providers))


class NativeComponent(ComponentSession):
    backend = "native"

    def __init__(self, spec: ComponentSpec, providers=None, options=None):
        from runtime import InferenceSession
        super().__init__(spec, InferenceSession(*model_source(spec, options), providers=providers))


@dataclass
class Transfers:
    """Bytes handed into and out of a decoder across its prefill/step boundary."""
    bytes_in: int = 0
    bytes_out: int = 0
    calls: int = 0
    largest_in: dict = field(default_factory=dict)

    def note_in(self, name, arr):
        n = int(np.asarray(arr).nbytes)
        self.bytes_in += n
        self.largest_in[name] = max(self.largest_in.get(name, 0), n)

    def note_out(self, arr):
        self.bytes_out += int(np.asarray(arr).nbytes)


_INT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
_FLOAT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def np_type(t: str):
    return _INT_TYPES.get(t) or _FLOAT_TYPES.get(t) or np.float32


class DecoderComponent:
    """The stateful decoder: the feeds a step needs (mask, positions, absent optional inputs), its KV cache
    (``cache``, a ``kv_cache.KVCache``) and its state pairs.  Subclasses supply the session, the cache policy
    (``_make_cache``) and how a step runs (``_run``, which hands the step's presents and state to ``_keep``)."""

    backend = "?"
    rows_alone = False  # runs a padded batch's first run row by row when padding would reach recurrent state

    def __init__(self, spec: ComponentSpec, pipeline: PipelineSpec, session, max_length: int, batch: int = 1):
        self.spec = spec
        self.io = spec.io
        self.pipeline = pipeline
        self.session = session
        self.max_length = int(max_length)
        self.batch = batch
        self.inputs = {i.name: i for i in session.get_inputs()}
        self.output_names = [o.name for o in session.get_outputs()]
        self._capture, self.captured = None, None  # capture(): an output kept from every run (an MTP head's feed)
        # graph inputs with an initializer (LoRA parameters): fed when the caller gives them, else their values
        self.input_defaults = dict(getattr(session, "_defaults", None) or {})
        self.overridable = [i.name for i in session.get_overridable_initializers()] + list(self.input_defaults)
        io = self.io
        if io.logits_output is None or io.logits_output not in self.output_names:
            raise MetadataError(f"decoder {spec.name!r}: logits_output {io.logits_output!r} is not an output of "
                                f"{spec.filename}")
        for names, where in ((io.kv_inputs, "kv_inputs"), ([p.input for p in io.state_pairs], "state_pairs")):
            for n in names:
                if n not in self.inputs:
                    raise MetadataError(f"decoder {spec.name!r}: {where} names {n!r}, which is not an input of "
                                        f"{spec.filename}")
        # Sliding-window layers keep a window-sized cache that each step replaces whole (genai_config's
        # decoder.sliding_window): their past is zeros of the window's capacity at the start.
        windows = {}
        sw = pipeline.sliding_window or {}
        if sw.get("layers") is not None and sw.get("window_size"):
            cap = int(sw["window_size"]) + int(sw.get("cache_slack", 0) or 0)
            layers = {int(x) for x in sw["layers"]}
            for name in io.kv_inputs:
                parts = name.split(".")
                if any(p.isdigit() and int(p) in layers for p in parts):
                    windows[name] = cap
        self._window = windows
        self._kv_pairs = tuple(zip(io.kv_inputs, io.kv_outputs))
        self.transfers = Transfers()
        self.cache = self._make_cache(self._cache_spec, windows)
        self.reset()

    def _make_cache(self, spec, windows):
        return CopiedKV(spec, self.io.kv_inputs, windows, self.max_length)

    def _cache_spec(self, name) -> CacheSpec:
        return CacheSpec(tuple(self._concrete(name, 0)), self._seq_axis(name), np_type(self.inputs[name].type),
                         self._batch_axis(name))

    def _batch_axis(self, name) -> int:
        """A cache's batch axis: 1 for a combined key-and-value cache, else 0 (every other input's)."""
        return self.io.kv_batch_axis if name in self.io.kv_inputs else 0

    def _zeros(self, shape, dtype):
        return np.zeros(shape, dtype)

    def reserve(self, positions: int):
        """The coming request reaches at most ``positions`` (prompt plus new tokens): caches are sized to that,
        capped by ``max_length``, rather than to the model's maximum."""
        self.cache.reserve(positions)

    # -- state -------------------------------------------------------------------------------------
    def reset(self):
        self.cache.reset()
        self.state = {}         # state input name -> array
        self._positions_max = None
        self._ones = None       # a (batch, max_length) row of ones whose prefixes are the attention masks
        self.row_lengths = None  # a right-padded batch: each row's live positions (None: all rows at length)
        self.cache.ragged = False

    @property
    def kv_length(self) -> int:
        return self.cache.length

    @property
    def kv(self):
        """The attention caches made so far (input name -> ``kv_cache.Rows``), None before the first."""
        return dict(self.cache.rows) or None

    def rewind(self, length: int):
        if self.row_lengths is not None:
            if length != 0:
                raise ValueError("a batch of rows of different lengths can only rewind to 0")
            self.reset()
            return
        if self.io.state_pairs and length != self.cache.length:
            raise ValueError("a decoder with recurrent state cannot rewind (its state has no history)")
        self.cache.rewind(length)

    def capture(self, name):
        """Keep a copy of output ``name`` of every later run in ``captured`` (None: stop)."""
        if name is not None and name not in self.output_names:
            raise RequestError(f"decoder {self.spec.name!r} has no output {name!r} (it has "
                               f"{', '.join(self.output_names)})")
        self._capture, self.captured = name, None

    def _keep_captured(self, outs: dict):
        if self._capture is not None:
            self.captured = np.array(self._host(outs[self._capture]), copy=True)

    def snapshot(self) -> dict:
        """What the decoder holds now, to come back to with ``restore``: the caches' length, copies of the
        recurrent state (a run's state may live in buffers the next run reuses) and the positions' maxima."""
        if self.row_lengths is not None:
            raise ValueError("a batch of rows of different lengths has no single length to come back to")
        return {"length": self.cache.length, "positions_max": self._positions_max,
                "state": {k: np.array(self._host(v), copy=True) for k, v in self.state.items()}}

    def restore(self, snap: dict):
        """Back to a ``snapshot``: the caches cut to its length (the rows after it are dropped), its state."""
        self.cache.rewind(snap["length"])
        self._positions_max = snap["positions_max"]
        self.state = {k: self._from_host(v.copy()) for k, v in snap["state"].items()}

    def _from_host(self, array):
        return array

    def reorder(self, rows):
        """Row ``b`` of every cache and recurrent state becomes what row ``rows[b]`` held (beam search)."""
        self.cache.reorder(rows)
        idx = np.asarray(rows, np.int64)
        for k, v in self.state.items():
            self.state[k] = np.ascontiguousarray(self._host(v)[idx])

    def output_value(self, name):
        """A host copy of what the decoder keeps of its last run's output ``name``: a present (the cache's live
        rows) or a recurrent state; None for anything else."""
        for i, o in self._kv_pairs:
            if o == name:
                r = self.cache.rows.get(i)
                return None if r is None else np.ascontiguousarray(self._host(r.buf)[r.span(0, r.length)])
        for p in self.io.state_pairs:
            if p.output == name and p.input in self.state:
                return np.array(self._host(self.state[p.input]), copy=True)
        return None

    def _host(self, array):
        return np.asarray(array)

    def _seq_axis(self, name):
        shape = self.inputs[name].shape
        b = self._batch_axis(name)
        axes = [k for k, d in enumerate(shape) if k > b and not isinstance(d, int) and not _is_head_dim(d)]
        if len(axes) != 1:
            raise MetadataError(f"decoder input {name!r} has shape {shape}: cannot tell its sequence axis")
        return axes[0]

    def _concrete(self, name, seq_len=0):
        shape = self.inputs[name].shape
        b = self._batch_axis(name)
        out = []
        for k, d in enumerate(shape):
            if isinstance(d, int):
                out.append(d)
            elif k == b:
                out.append(self.batch)
            elif _is_head_dim(d) and self.pipeline.head_size:
                out.append(self.pipeline.head_size)
            elif name in self.io.kv_inputs and k == self._seq_axis(name):
                out.append(seq_len)
            else:
                raise MetadataError(f"decoder input {name!r}: axis {k} is symbolic ({d!r}); only the leading "
                                    f"batch axis (and a KV cache's sequence axis) may be")
        return out

    def _init_state(self):
        for p in self.io.state_pairs:
            if p.input not in self.state:
                self.state[p.input] = self._zeros(self._concrete(p.input), np_type(self.inputs[p.input].type))

    def _extras(self, seq_len, extra, lengths=None):
        feeds = dict(extra) if extra else {}
        io = self.io
        b = self.batch
        length = self.cache.length
        total = length + seq_len
        rows = self.row_lengths
        if io.attention_mask_input and io.attention_mask_input in self.inputs and io.attention_mask_input not in feeds:
            if rows is None:
                feeds[io.attention_mask_input] = self._mask_prefix(total)
            else:
                t = np_type(self.inputs[io.attention_mask_input].type)
                feeds[io.attention_mask_input] = (np.arange(total)[None, :] < (rows + lengths)[:, None]).astype(t)
        pos = self.pipeline.positions
        pname = io.position_ids_input or (pos.input if pos is not None else None)
        if pname and pname in self.inputs and pname not in feeds:
            rank = pos.rank if pos is not None else 1
            t = np_type(self.inputs[pname].type)
            if rank == 3 and rows is not None:  # text positions of each row, the same in every stream
                ids = np.empty((3, b, seq_len), t)
                ids[...] = (rows[:, None] + np.arange(seq_len, dtype=np.int64)[None, :])[None]
            elif rank == 3:
                start = self._rank3_start(length, seq_len)
                ids = np.empty((3, b, seq_len), t)
                ids[...] = (start[:, None] + np.arange(seq_len, dtype=np.int64)[None, :])[:, None, :]
            elif rows is not None:  # each row from its own length (a pad's position is never attended)
                ids = (rows[:, None] + np.arange(seq_len, dtype=np.int64)[None, :]).astype(t)
            else:
                ids = np.empty((b, seq_len), t)
                ids[...] = np.arange(length, total, dtype=np.int64)
            feeds[pname] = ids
        opt = io.optional_inputs
        if opt:
            for port, absent in opt.items():
                if port in self.inputs and port not in feeds:
                    feeds[port] = np.zeros(absent.shape, absent.dtype)
        return feeds

    def _mask_prefix(self, total):
        """The attention mask for ``total`` positions: a prefix of a kept (batch, max_length) block of ones (one
        row's prefix is contiguous; with several rows it is copied)."""
        ones = self._ones
        if ones is None or ones.shape[1] < total:
            t = np_type(self.inputs[self.io.attention_mask_input].type)
            ones = self._ones = np.ones((self.batch, max(total, self.max_length)), t)
        m = ones[:, :total]
        return m if self.batch == 1 else np.ascontiguousarray(m)

    def carry_positions(self, top: int):
        """The prompt's positions were given (an image's 3-D grid); decoding continues from ``top`` + 1 on every
        stream (``carry_max``)."""
        self._positions_max = np.full(3, int(top), np.int64)

    def _rank3_start(self, length, seq_len):
        """The first of ``seq_len`` new mrope positions per stream (from each stream's previous maximum + 1 with
        ``carry_max``, else from the cache length); records the new maxima."""
        if self.pipeline.positions.continuation == "carry_max" and self._positions_max is not None:
            start = self._positions_max + 1
        else:
            start = np.full(3, length, np.int64)
        self._positions_max = start + (seq_len - 1)
        return start

    # -- running -----------------------------------------------------------------------------------
    def prefill(self, tokens=None, embeds=None, extra=None, want="logits", lengths=None):
        return self._forward(tokens, embeds, extra, want, lengths)

    def step(self, tokens=None, embeds=None, extra=None, want="logits", lengths=None):
        return self._forward(tokens, embeds, extra, want, lengths)

    @property
    def runs_ragged(self) -> bool:
        """Rows of a batch may have different lengths: the decoder has attention caches and a mask, and no
        sliding-window caches, positions that carry an image's maxima (``carry_max``) or combined key-and-value
        caches (whose Attention appends a row's new keys after the whole batch's past).  Position ids (rank 2,
        or rank 3 with the same text positions in each stream) are built per row.  Recurrent state (which the
        graphs do not mask, so a row's padding would run through it) takes rows of different lengths in the
        batch's first run only, each row run alone (``rows_alone``); later runs then feed one token per row."""
        io = self.io
        pos = self.pipeline.positions
        pname = io.position_ids_input or (pos.input if pos is not None else None)
        carried = bool(pname and pname in self.inputs and pos is not None and pos.rank == 3
                       and pos.continuation == "carry_max")
        return bool(io.attention_mask_input in self.inputs and (self.rows_alone or not io.state_pairs)
                    and not self._window and not carried and io.kv_batch_axis == 0)

    def _ragged(self, lengths, seq_len):
        """``lengths``: how many of the ``seq_len`` new positions of each row are real (a right-padded batch,
        onnxruntime-genai's layout); the per-row counts once rows differ, else None.  From then on every row
        keeps its own length: its mask covers its live positions, so GroupQueryAttention (which reads each
        row's length from the mask) writes each row's new keys at its own end, and its logits are read at its
        last real position."""
        if lengths is None and self.row_lengths is None:
            return None
        n = np.full(self.batch, seq_len, np.int64) if lengths is None else \
            np.asarray(lengths, np.int64).reshape(self.batch)
        if n.min() < 1 or n.max() > seq_len:
            raise ValueError(f"lengths {n.tolist()}: each row takes 1 to {seq_len} of the new positions")
        if self.row_lengths is None:
            if (n == seq_len).all():
                return None
            if not self.runs_ragged:
                raise NotImplementedError(f"decoder {self.spec.name!r}: rows of different lengths are run for "
                                          f"decoders with attention caches and a mask only (no sliding-window "
                                          f"caches, positions that carry an image's maxima, combined "
                                          f"key-and-value caches, or recurrent state on this backend)")
            self.row_lengths = np.full(self.batch, self.cache.length, np.int64)
            self.cache.ragged = True
        return n

    def greedy_step(self, token: int) -> int:
        """One greedy step for batch 1: feed ``token`` and return the argmax id (``step(..., want="argmax")``)."""
        x = np.full((1, 1), token, np_type(self.inputs[self.io.token_input].type))
        return int(self.step(tokens=x, want="argmax")[0])

    def _sequence(self, tokens, embeds):
        """The step's sequence input: (name, contiguous host array)."""
        io = self.io
        if io.sequence_source == "inputs_embeds":
            if embeds is None:
                raise ValueError(f"decoder {self.spec.name!r} reads inputs_embeds; pass embeds=")
            return io.inputs_embeds_input, np.ascontiguousarray(embeds)
        if tokens is None:
            raise ValueError(f"decoder {self.spec.name!r} reads token ids; pass tokens=")
        return io.token_input, np.ascontiguousarray(np.asarray(tokens, dtype=np_type(self.inputs[io.token_input].type))
                                                    .reshape(self.batch, -1))

    def _forward(self, tokens, embeds, extra, want, lengths=None):
        name, x = self._sequence(tokens, embeds)
        seq_len = x.shape[1]
        self.cache.make_room(self.cache.length + seq_len)
        n = self._ragged(lengths, seq_len)
        self.transfers.note_in(name, x)
        feeds = {name: x}
        feeds.update(self._extras(seq_len, extra, n))
        for k, v in (extra or {}).items():
            self.transfers.note_in(k, v)
        self._init_state()
        if n is not None and self.io.state_pairs and (n < seq_len).any():
            logits = self._rows_alone(name, x, feeds, n)
        else:
            logits = self._run(feeds, seq_len)
        self.transfers.calls += 1
        if n is None:
            last = logits[:, -1, :] if logits.ndim == 3 else logits
        else:  # each row's last real position
            self.row_lengths += n
            last = logits[np.arange(self.batch), n - 1, :]
        if want == "argmax":
            out = np.argmax(last, axis=-1).astype(np.int64)
        elif want == "all":
            out = np.ascontiguousarray(logits)
        else:
            out = np.ascontiguousarray(last)
        self.transfers.note_out(out)
        return out

    def _rows_alone(self, name, x, feeds, n):
        """A padded batch's first run on a decoder with recurrent state: each row alone, over its ``n[b]`` real
        positions, from an empty past and its initial state, so that no pad reaches the state; then the rows'
        presents and states kept as the batch's (each present padded with zeros past its row's end, which the
        masks of later steps never reach) and the rows' logits (zeros past each row's end) returned.  Later runs
        feed one position per row, which a batched run takes as it is; a later run of several positions with
        rows of different lengths is refused."""
        if self.cache.length:
            raise NotImplementedError(f"decoder {self.spec.name!r}: a decoder with recurrent state takes rows of "
                                      f"different lengths in its first run only; append one token per row, or "
                                      f"rows of one length, after it")
        seq_len = x.shape[1]
        pname = self.io.position_ids_input or (self.pipeline.positions.input if self.pipeline.positions else None)
        feeds = {key: np.asarray(self._host(v)) for key, v in feeds.items()}    # on the host once, for all rows
        state = {p.input: self._host(self.state[p.input]) for p in self.io.state_pairs}
        per_row = []
        for b in range(self.batch):
            k = int(n[b])
            row = {}
            for key, v in feeds.items():
                if key == name or key == self.io.attention_mask_input or (v.ndim == 2 and v.shape == x.shape[:2]):
                    row[key] = np.ascontiguousarray(v[b:b + 1, :k])
                elif key == pname and v.ndim == 3:  # (3, batch, sequence) positions
                    row[key] = np.ascontiguousarray(v[:, b:b + 1, :k])
                elif v.ndim and v.shape[0] == self.batch:
                    row[key] = np.ascontiguousarray(v[b:b + 1])
                else:
                    row[key] = v
            for i in self.io.kv_inputs:  # an empty past of one row (the batch axis is 0 here: runs_ragged)
                spec = self._cache_spec(i)
                row[i] = np.zeros((1,) + spec.with_rows(0)[1:], spec.dtype)
            for p in self.io.state_pairs:
                row[p.input] = np.ascontiguousarray(state[p.input][b:b + 1])
            per_row.append(dict(zip(self.output_names, self.session.run(None, row))))
        results = {}
        for o in self.output_names:
            parts = [r[o] for r in per_row]
            axis = next((self._cache_spec(i).axis for i, oo in self._kv_pairs if oo == o), None)
            if o == self.io.logits_output and parts[0].ndim == 3:
                axis = 1
            if axis is not None:
                padded = []
                for part in parts:
                    widths = [(0, 0)] * part.ndim
                    widths[axis] = (0, seq_len - part.shape[axis])
                    padded.append(np.pad(part, widths))
                parts = padded
            results[o] = np.concatenate(parts, axis=0)
        for i in self.io.kv_inputs:  # the buffers a batched run would have fed (a shared cache makes them here)
            self.cache.past(i)
        results = {o: self._from_host(v) for o, v in results.items()}
        self._keep(results, seq_len)
        return results[self.io.logits_output]

    def _keep(self, results: dict, seq_len):
        """Keep a step's presents (in the cache) and state (``results``: output name -> value)."""
        self.cache.store({i: results[o] for i, o in self._kv_pairs}, seq_len)
        for p in self.io.state_pairs:
            self.state[p.input] = results[p.output]

    def _run(self, feeds, seq_len):  # pragma: no cover - interface
        raise NotImplementedError


def _is_head_dim(d) -> bool:
    return isinstance(d, str) and d in ("kv_cache_dim", "head_size", "head_dim")


class OrtDecoder(DecoderComponent):
    """onnxruntime decoder: every step feeds the live caches and state (the baseline)."""

    backend = "ort"
    rows_alone = True

    def __init__(self, spec, pipeline, max_length, batch=1, providers=None):
        super().__init__(spec, pipeline, _ort_session(spec, providers), max_length, batch)

    def _run(self, feeds, seq_len):
        for i in self.io.kv_inputs:
            feeds[i] = np.ascontiguousarray(self.cache.past(i))
        feeds.update(self.state)
        res = dict(zip(self.output_names, self.session.run(None, feeds)))
        self._keep(res, seq_len)
        self._keep_captured(res)
        return res[self.io.logits_output]


class NativeDecoder(DecoderComponent):
    """Native decoder: each step is one ``run_prepared`` call into its session (compiled regions; feeds built
    here and not re-checked).  Its caches are shared buffers the step appends to in place, or, with
    ``kv_share_buffer`` off, the step's presents fed back as they are (``kv_cache.policy_for``)."""

    backend = "native"
    rows_alone = True

    def __init__(self, spec, pipeline, max_length, batch=1, providers=None, options=None):
        from runtime import InferenceSession
        # A decode step is dozens of small nodes: run them as compiled regions (one call per step) unless the
        # caller's options say otherwise or ONNX_NUMBA_COMPILED_REGIONS=0.
        options = decoder_options(options, "ONNX_NUMBA_COMPILED_REGIONS", "compiled_regions")
        # Attention caches share one buffer between past and present (written in place) unless the caller's
        # options say otherwise or ONNX_NUMBA_KV_SHARE_BUFFER=0.
        options = decoder_options(options, "ONNX_NUMBA_KV_SHARE_BUFFER", "kv_share_buffer")
        self._want_shared = bool(options.kv_share_buffer)
        self._options, self._providers = options, providers
        sess = InferenceSession(*model_source(spec, options), providers=providers)
        super().__init__(spec, pipeline, sess, max_length, batch)
        self._order = [i.name for i in sess.get_inputs()]
        self._twin = None  # the plan that takes the overridable initializers as inputs (see _plan_for)
        out_at = {n: k for k, n in enumerate(self.output_names)}
        self._logits_at = out_at[self.io.logits_output]
        self._kv_at = tuple((i, out_at[o]) for i, o in self._kv_pairs)
        self._state_at = tuple((p.input, out_at[p.output]) for p in self.io.state_pairs)
        self._kv_names = frozenset(self.io.kv_inputs)

    def _make_cache(self, spec, windows):
        policy = policy_for(self.session._graph, self.io.kv_inputs, windows, self._want_shared)
        return policy(spec, self.io.kv_inputs, windows, self.max_length)

    def _plan_for(self, feeds):
        """(session, its input order, defaults): the decoder's own, or, when a step feeds one of the graph's
        overridable initializers (a LoRA adapter's parameters), a twin session built once that takes them as
        inputs, the ones not fed at their initializers (the decoder's own plan keeps them as constants)."""
        if not self.overridable or not any(n in feeds for n in self.overridable):
            return self.session, self._order, self.input_defaults
        if self._twin is None:
            import copy
            from runtime import InferenceSession
            options = copy.copy(self._options)
            options._overridable_inputs = True
            twin = InferenceSession(*model_source(self.spec, options), providers=self._providers)
            self._twin = (twin, [i.name for i in twin.get_inputs()], dict(twin._defaults))
        return self._twin

    def _run(self, feeds, seq_len):
        cache, state, kv = self.cache, self.state, self._kv_names
        session, order, defaults = self._plan_for(feeds)
        vals = []
        for n in order:
            v = feeds.get(n)
            if v is None:
                v = cache.past(n) if n in kv else state.get(n, defaults.get(n))
                if v is None:
                    raise RequestError(f"Missing Input: {n} (decoder {self.spec.name!r}: nothing provides it)")
            vals.append(v if v.flags.c_contiguous else np.ascontiguousarray(v))
        outs = session.run_prepared(vals)
        cache.store({i: outs[k] for i, k in self._kv_at}, seq_len)
        for i, k in self._state_at:
            state[i] = outs[k]
        if self._capture is not None:
            self._keep_captured(dict(zip(self.output_names, outs)))
        return outs[self._logits_at]


def decoder_options(options, variable: str, attribute: str):
    """A copy of the session ``options`` with ``attribute`` on unless the options set it or the setting
    ``variable`` turns it off."""
    import copy
    from runtime import SessionOptions, settings
    options = copy.copy(options) if options is not None else SessionOptions()
    if not settings.flag(variable):
        setattr(options, attribute, False)
    elif getattr(options, attribute, None) is None:
        setattr(options, attribute, True)
    return options
