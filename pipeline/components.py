"""The two component interfaces and their onnxruntime and native implementations.

- ``ComponentSession`` (stateless): declared inputs and outputs; ``run(feeds)``
  returns a dict of outputs.
- ``DecoderComponent`` (stateful): ``prefill`` and ``step`` take token ids or
  embeddings plus extra inputs and return the next-token logits (or, with
  ``want="argmax"``, the greedy token ids); ``kv_length`` is the live cache
  length; ``rewind(n)`` drops everything after the first ``n`` positions;
  ``greedy_step(token)`` is one batch-1 greedy step (the pipeline's greedy
  loop), which the native decoder runs as a direct call of its compiled
  region on an argument list kept between steps.

The decoder owns its loop-carried values.  KV caches live in static buffers
sized to ``max_length`` and written in place (only the new positions of each
step are written, so a step's cost follows the live length); recurrent and
conv state pairs are replaced by each step's outputs.  The native decoder's
attention caches are max-length buffers that past and present share: its
session (``SessionOptions.kv_share_buffer``) lets GroupQueryAttention write
the new rows into them in place, so nothing is copied between steps (with
``ONNX_NUMBA_KV_SHARE_BUFFER=0``, or where the step does not write in place,
each step's present holds exactly the live rows and is fed back as the next
step's past); across its
``prefill`` / ``step`` boundary only the step's ids or embeddings (and the
small mask / position inputs it builds itself) go in, and only logits or
the argmax come out; ``transfers`` counts exactly those bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .spec import ComponentSpec, IncompletePackageError, MetadataError, PipelineSpec

__all__ = ["ComponentSession", "OrtComponent", "NativeComponent", "DecoderComponent", "OrtDecoder",
           "NativeDecoder", "Transfers"]


def _ort_session(path, providers=None):
    import onnxruntime as ort
    return ort.InferenceSession(path, providers=providers or ["CPUExecutionProvider"])


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

    def run(self, feeds: dict) -> dict:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise IncompletePackageError(f"component {self.name!r}: nothing provides input(s) {missing}")
        out = self.session.run(None, {n: feeds[n] for n in self.input_names})
        return dict(zip(self.output_names, out))


class OrtComponent(ComponentSession):
    backend = "ort"

    def __init__(self, spec: ComponentSpec, providers=None):
        super().__init__(spec, _ort_session(spec.filename, providers))


class NativeComponent(ComponentSession):
    backend = "native"

    def __init__(self, spec: ComponentSpec, providers=None, options=None):
        from runtime import InferenceSession
        super().__init__(spec, InferenceSession(spec.filename, options, providers=providers))


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


def _np_type(t: str):
    return _INT_TYPES.get(t) or _FLOAT_TYPES.get(t) or np.float32


KV_START_ROWS = 256  # rows a cache starts with when nothing said how far the request reaches


def kv_rows(needed: int, reach: int | None, max_length: int, current: int = 0) -> int:
    """Rows to give a KV buffer that must hold ``needed``: a new one what the request reaches (``reach``, else
    ``KV_START_ROWS``), a full one (``current`` rows) twice as many; at least ``needed``, never past
    ``max_length``."""
    rows = max(needed, 2 * current) if current else max(needed, reach or KV_START_ROWS)
    return min(rows, max_length)


class _KVBuffer:
    """One KV cache tensor in a buffer along whose sequence axis it grows (doubling, up to ``max_length``)."""

    def __init__(self, shape, axis, dtype, rows, max_length):
        full = list(shape)
        full[axis] = rows
        self.buf = np.zeros(full, dtype)
        self.axis = axis
        self.length = 0
        self.max_length = max_length

    def _grow(self, total):
        rows = kv_rows(total, None, self.max_length, self.buf.shape[self.axis])
        full = list(self.buf.shape)
        full[self.axis] = rows
        new = np.zeros(full, self.buf.dtype)
        idx = [slice(None)] * self.buf.ndim
        idx[self.axis] = slice(0, self.length)
        new[tuple(idx)] = self.buf[tuple(idx)]
        self.buf = new

    def live(self) -> np.ndarray:
        idx = [slice(None)] * self.buf.ndim
        idx[self.axis] = slice(0, self.length)
        return self.buf[tuple(idx)]

    def write(self, present: np.ndarray, new_from: int):
        total = present.shape[self.axis]
        if total > self.max_length:
            raise MetadataError(f"KV cache would grow to {total} positions, past its maximum of "
                                f"{self.max_length} (search.max_length)")
        if total > self.buf.shape[self.axis]:
            self._grow(total)
        src = [slice(None)] * present.ndim
        dst = [slice(None)] * present.ndim
        src[self.axis] = slice(new_from, total)
        dst[self.axis] = slice(new_from, total)
        self.buf[tuple(dst)] = present[tuple(src)]
        self.length = total


class DecoderComponent:
    """The stateful decoder; subclasses supply the session and how a step runs."""

    backend = "?"

    def __init__(self, spec: ComponentSpec, pipeline: PipelineSpec, session, max_length: int, batch: int = 1):
        self.spec = spec
        self.io = spec.io
        self.pipeline = pipeline
        self.session = session
        self.max_length = int(max_length)
        self.batch = batch
        self.inputs = {i.name: i for i in session.get_inputs()}
        self.output_names = [o.name for o in session.get_outputs()]
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
        self._window = {}
        sw = pipeline.sliding_window or {}
        if sw.get("layers") is not None and sw.get("window_size"):
            cap = int(sw["window_size"]) + int(sw.get("cache_slack", 0) or 0)
            layers = {int(x) for x in sw["layers"]}
            for name in io.kv_inputs:
                parts = name.split(".")
                if any(p.isdigit() and int(p) in layers for p in parts):
                    self._window[name] = cap
        self.transfers = Transfers()
        self.reach = None  # positions the current request can reach (``reserve``): what KV buffers are sized to
        self.reset()

    def reserve(self, positions: int):
        """The coming request reaches at most ``positions`` (prompt plus new tokens): caches are sized to that,
        capped by ``max_length``, rather than to the model's maximum."""
        self.reach = max(1, min(int(positions), self.max_length))

    # -- state -------------------------------------------------------------------------------------
    def reset(self):
        self.kv = None          # name -> _KVBuffer, created at the first run
        self.state = {}         # state input name -> array
        self.window_kv = {}     # sliding-window KV input name -> its whole cache
        self._length = 0
        self._positions_max = None
        self._ones = None       # a (batch, max_length) row of ones whose prefixes are the attention masks

    @property
    def kv_length(self) -> int:
        return self._length

    def rewind(self, length: int):
        if length < 0 or length > self._length:
            raise ValueError(f"cannot rewind to {length}: the cache holds {self._length} positions")
        if (self.io.state_pairs or self._window) and length != self._length:
            raise ValueError("a decoder with recurrent state cannot rewind (its state has no history)")
        if self.kv:
            for b in self.kv.values():
                b.length = length
        self._length = length

    def _seq_axis(self, name):
        shape = self.inputs[name].shape
        axes = [k for k, d in enumerate(shape) if k > 0 and not isinstance(d, int) and not _is_head_dim(d)]
        if len(axes) != 1:
            raise MetadataError(f"decoder input {name!r} has shape {shape}: cannot tell its sequence axis")
        return axes[0]

    def _concrete(self, name, seq_len=0):
        shape = self.inputs[name].shape
        out = []
        for k, d in enumerate(shape):
            if isinstance(d, int):
                out.append(d)
            elif k == 0:
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
                self.state[p.input] = np.zeros(self._concrete(p.input), _np_type(self.inputs[p.input].type))

    def _past(self, name):
        if name in self._window:
            if name not in self.window_kv:
                self.window_kv[name] = np.zeros(self._concrete(name, self._window[name]),
                                                _np_type(self.inputs[name].type))
            return self.window_kv[name]
        if self.kv is None:
            return np.zeros(self._concrete(name, 0), _np_type(self.inputs[name].type))
        return self.kv[name].live()

    def _extras(self, seq_len, extra):
        feeds = dict(extra) if extra else {}
        io = self.io
        b = self.batch
        length = self._length
        total = length + seq_len
        if io.attention_mask_input and io.attention_mask_input in self.inputs and io.attention_mask_input not in feeds:
            feeds[io.attention_mask_input] = self._mask_prefix(total)
        pos = self.pipeline.positions
        pname = io.position_ids_input or (pos.input if pos is not None else None)
        if pname and pname in self.inputs and pname not in feeds:
            rank = pos.rank if pos is not None else 1
            t = _np_type(self.inputs[pname].type)
            if rank == 3:
                start = self._rank3_start(length, seq_len)
                ids = np.empty((3, b, seq_len), t)
                ids[...] = (start[:, None] + np.arange(seq_len, dtype=np.int64)[None, :])[:, None, :]
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
            t = _np_type(self.inputs[self.io.attention_mask_input].type)
            ones = self._ones = np.ones((self.batch, max(total, self.max_length)), t)
        m = ones[:, :total]
        return m if self.batch == 1 else np.ascontiguousarray(m)

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
    def prefill(self, tokens=None, embeds=None, extra=None, want="logits"):
        return self._forward(tokens, embeds, extra, want)

    def step(self, tokens=None, embeds=None, extra=None, want="logits"):
        return self._forward(tokens, embeds, extra, want)

    def _forward(self, tokens, embeds, extra, want):
        io = self.io
        feeds = {}
        if io.sequence_source == "inputs_embeds":
            if embeds is None:
                raise ValueError(f"decoder {self.spec.name!r} reads inputs_embeds; pass embeds=")
            x = np.ascontiguousarray(embeds)
            feeds[io.inputs_embeds_input] = x
            seq_len = x.shape[1]
            self.transfers.note_in(io.inputs_embeds_input, x)
        else:
            if tokens is None:
                raise ValueError(f"decoder {self.spec.name!r} reads token ids; pass tokens=")
            x = np.ascontiguousarray(np.asarray(tokens, dtype=_np_type(self.inputs[io.token_input].type))
                                     .reshape(self.batch, -1))
            feeds[io.token_input] = x
            seq_len = x.shape[1]
            self.transfers.note_in(io.token_input, x)
        if self._length + seq_len > self.max_length:
            raise MetadataError(f"the KV cache would hold {self._length + seq_len} positions, past max_length "
                                f"{self.max_length}")
        self._make_room(self._length + seq_len)
        feeds.update(self._extras(seq_len, extra))
        for k, v in (extra or {}).items():
            self.transfers.note_in(k, v)
        self._init_state()
        logits = self._run(feeds, seq_len)
        self.transfers.calls += 1
        last = logits[:, -1, :] if logits.ndim == 3 else logits
        if want == "argmax":
            out = np.argmax(last, axis=-1).astype(np.int64)
        else:
            out = np.ascontiguousarray(last)
        self.transfers.note_out(out)
        return out

    def _make_room(self, total: int):
        """Before a step that brings the cache to ``total`` positions (within ``max_length``)."""

    def greedy_step(self, token: int) -> int:
        """One greedy step for batch 1: feed ``token`` and return the argmax id (``step(..., want="argmax")``)."""
        x = np.full((1, 1), token, _np_type(self.inputs[self.io.token_input].type))
        return int(self.step(tokens=x, want="argmax")[0])

    def _store(self, results: dict, seq_len):
        io = self.io
        if self.kv is None:
            self.kv = {}
            for i, o in zip(io.kv_inputs, io.kv_outputs):
                if i not in self._window:
                    pres = results[o]
                    rows = kv_rows(self._length + seq_len, self.reach, self.max_length)
                    self.kv[i] = _KVBuffer(pres.shape, self._seq_axis(i), pres.dtype, rows, self.max_length)
        for i, o in zip(io.kv_inputs, io.kv_outputs):
            if i in self._window:
                self.window_kv[i] = results[o]
            else:
                self.kv[i].write(results[o], self._length)
        for p in io.state_pairs:
            self.state[p.input] = results[p.output]
        self._length += seq_len

    def _run(self, feeds, seq_len):  # pragma: no cover - interface
        raise NotImplementedError


def _same_buffer(a, b) -> bool:
    """``b`` is ``a`` or a view of the same memory with the same shape."""
    return a is b or (a.shape == b.shape and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _is_head_dim(d) -> bool:
    return isinstance(d, str) and d in ("kv_cache_dim", "head_size", "head_dim")


class OrtDecoder(DecoderComponent):
    """onnxruntime decoder: every step feeds the live caches and state (the baseline)."""

    backend = "ort"

    def __init__(self, spec, pipeline, max_length, batch=1, providers=None):
        super().__init__(spec, pipeline, _ort_session(spec.filename, providers), max_length, batch)

    def _run(self, feeds, seq_len):
        for i in self.io.kv_inputs:
            feeds[i] = np.ascontiguousarray(self._past(i))
        feeds.update(self.state)
        names = self.output_names
        res = dict(zip(names, self.session.run(None, feeds)))
        self._store(res, seq_len)
        return res[self.io.logits_output]


class NativeDecoder(DecoderComponent):
    """Native decoder: each step is one call into its session (compiled regions, feeds built here and not
    re-checked); a step's present caches and state are the next step's inputs as they are."""

    backend = "native"
    _want_shared = False  # subclasses that do not run this __init__ (the CUDA decoder) keep copied caches
    _shared = None

    def __init__(self, spec, pipeline, max_length, batch=1, providers=None, options=None):
        import copy
        from runtime import InferenceSession, SessionOptions, settings
        # A decode step is dozens of small nodes: run them as compiled regions (one call per step) unless the
        # caller's options say otherwise or ONNX_NUMBA_COMPILED_REGIONS=0.
        options = copy.copy(options) if options is not None else SessionOptions()
        if not settings.flag("ONNX_NUMBA_COMPILED_REGIONS"):
            options.compiled_regions = False
        elif getattr(options, "compiled_regions", None) is None:
            options.compiled_regions = True
        # Attention caches share one max-length buffer between past and present (written in place) unless the
        # caller's options say otherwise or ONNX_NUMBA_KV_SHARE_BUFFER=0.
        if not settings.flag("ONNX_NUMBA_KV_SHARE_BUFFER"):
            options.kv_share_buffer = False
        elif getattr(options, "kv_share_buffer", None) is None:
            options.kv_share_buffer = True
        sess = InferenceSession(spec.filename, options, providers=providers)
        self._order = None
        self._carry = False
        self._live = {}
        self._fast = None
        self._want_shared = bool(options.kv_share_buffer)
        self._shared = None  # whether the step writes its caches in place (found at the first step)
        self._bufs = {}      # shared cache buffers of ``_rows`` positions, kept across resets
        self._rows = 0
        self._need = 0       # positions the coming step brings the caches to (``_make_room``)
        super().__init__(spec, pipeline, sess, max_length, batch)

    def _past(self, name):
        # A step's present (a fresh, contiguous array holding every live row, or with shared buffers the
        # max-length buffer it was written into) is the next step's past as it is: feeding it copies nothing.
        live = self._live.get(name)
        if live is not None:
            return live
        if self._carry and self._want_shared and self._shared is not False and name not in self._window:
            buf = self._bufs.get(name)
            if buf is None:
                self._rows = self._rows or kv_rows(max(self._need, 1), self.reach, self.max_length)
                buf = self._bufs[name] = np.zeros(self._concrete(name, self._rows), _np_type(self.inputs[name].type))
            self._live[name] = buf
            return buf
        return super()._past(name)

    def _run(self, feeds, seq_len):
        order = self._order
        if order is None:
            order = self._order = [i.name for i in self.session.get_inputs()]
            self._carry = self._gqa_present_is_past()
            self._kv_names = frozenset(self.io.kv_inputs)
            out_at = {n: k for k, n in enumerate(self.output_names)}
            self._logits_at = out_at[self.io.logits_output]
            self._kv_at = [(i, out_at[o]) for i, o in zip(self.io.kv_inputs, self.io.kv_outputs)]
            self._state_at = [(p.input, out_at[p.output]) for p in self.io.state_pairs]
        kv, state = self._kv_names, self.state
        vals = []
        for n in order:
            v = feeds.get(n)
            if v is None:
                if n in kv:
                    v = self._past(n)
                elif n in state:
                    v = state[n]
                else:
                    raise MetadataError(f"decoder {self.spec.name!r}: nothing provides input {n!r}")
            vals.append(v if v.flags.c_contiguous else np.ascontiguousarray(v))
        outs = self.session.run_prepared(vals)
        if self._carry:
            self._store_carried(outs, seq_len)
        else:
            self._store(dict(zip(self.output_names, outs)), seq_len)
        return outs[self._logits_at]

    def greedy_step(self, token: int) -> int:
        """``step(tokens=[[token]], want="argmax")`` with the same results.  When the step is one compiled region
        (``InferenceSession.direct_step``), the region is called directly on an argument list kept between steps:
        only the token, the mask prefix, the positions and the carried caches and state are set each time."""
        fast = self._fast
        if fast is None and self._order is not None:
            fast = self._fast = self._fast_step() or False
        if not fast:
            return super().greedy_step(token)
        return fast(token)

    def _fast_step(self):
        io = self.io
        parts = self.session.direct_step() if hasattr(self.session, "direct_step") else None
        if parts is None or self.batch != 1 or io.sequence_source == "inputs_embeds" or not self._carry:
            return None
        fn, args, dyn, pick, on_error, nthreads = parts
        at = {k: pos for pos, k in dyn}
        ids = np.zeros((1, 1), _np_type(self.inputs[io.token_input].type))
        pos = self.pipeline.positions
        pname = io.position_ids_input or (pos.input if pos is not None else None)
        rank = pos.rank if pos is not None else 1
        posarr = None
        mask_at = None
        carried = []  # (argument position, input name, where it lives)
        opt = io.optional_inputs or {}
        for k, n in enumerate(self._order):
            if k not in at:
                continue
            p = at[k]
            if n == io.token_input:
                args[p] = ids
            elif n == io.attention_mask_input:
                mask_at = p
            elif n == pname:
                t = _np_type(self.inputs[n].type)
                posarr = np.zeros((3, 1, 1) if rank == 3 else (1, 1), t)
                args[p] = posarr
            elif n in self._kv_names:
                carried.append((p, n, "window" if n in self._window else "kv"))
            elif n in self.state:
                carried.append((p, n, "state"))
            elif n in opt:
                args[p] = np.zeros(opt[n].shape, opt[n].dtype)
            else:
                return None
        logits_at = pick[self._logits_at]
        kv_at = [(i, pick[k]) for i, k in self._kv_at]
        state_at = [(i, pick[k]) for i, k in self._state_at]
        window, tr = self._window, self.transfers
        name = io.token_input
        nbytes = ids.nbytes

        def step(token):
            length = self._length
            total = length + 1
            if total > self.max_length:
                raise MetadataError(f"the KV cache would hold {total} positions, past max_length {self.max_length}")
            if total > self._rows:
                self._make_room(total)
            ids[0, 0] = token
            args[0] = nthreads()
            if mask_at is not None:
                args[mask_at] = self._mask_prefix(total)
            if posarr is not None:
                if rank == 3:
                    posarr[:, 0, 0] = self._rank3_start(length, 1)
                else:
                    posarr[0, 0] = length
            live, state = self._live, self.state
            for p, n, kind in carried:
                if kind == "state":
                    args[p] = state[n]
                elif kind == "kv":
                    v = live.get(n)
                    args[p] = v if v is not None else self._past(n)
                else:
                    args[p] = self.window_kv[n] if n in self.window_kv else self._past(n)
            try:
                r = fn(*args)
            except Exception as e:
                on_error(e)
            for i, k in kv_at:
                if i in window:
                    self.window_kv[i] = r[k]
                else:
                    live[i] = r[k]
            for i, k in state_at:
                state[i] = r[k]
            self._length = total
            logits = r[logits_at]
            nxt = int((logits[0, -1] if logits.ndim == 3 else logits[0]).argmax())
            tr.bytes_in += nbytes
            if tr.largest_in.get(name, 0) < nbytes:
                tr.largest_in[name] = nbytes
            tr.calls += 1
            tr.bytes_out += 8
            return nxt

        return step

    def _gqa_present_is_past(self) -> bool:
        """Every KV input feeds only GroupQueryAttention, whose present holds exactly the live rows."""
        cons = {}
        for node in self.session._graph.nodes:
            for k, x in enumerate(node.inputs):
                cons.setdefault(x, []).append((node.op_type, k))
        return all(cons.get(i) and all(op == "GroupQueryAttention" and k in (3, 4) for op, k in cons[i])
                   for i in self.io.kv_inputs if i not in self._window)

    def reset(self):
        super().reset()
        self._live = {}

    def reserve(self, positions: int):
        super().reserve(positions)
        if self._length == 0 and self._rows != kv_rows(1, self.reach, self.max_length):
            self._bufs, self._rows = {}, 0  # sized afresh for this request at its first step

    def _make_room(self, total: int):
        """Grow the shared cache buffers, keeping their live rows, when a step would run past them (buffers
        not made yet are made large enough by ``_past``)."""
        self._need = total
        if not self._bufs or total <= self._rows:
            return
        rows = kv_rows(total, None, self.max_length, self._rows)
        for name, old in list(self._bufs.items()):
            new = np.zeros(self._concrete(name, rows), old.dtype)
            idx = [slice(None)] * old.ndim
            idx[self._seq_axis(name)] = slice(0, self._length)
            new[tuple(idx)] = old[tuple(idx)]
            self._bufs[name] = new
            if self._live.get(name) is old:
                self._live[name] = new
        self._rows = rows

    def rewind(self, length: int):
        super().rewind(length)
        if self._shared:
            return  # rows past ``length`` are never read, and the next steps overwrite them
        for i, v in list(self._live.items()):
            ax = self._seq_axis(i)
            idx = [slice(None)] * v.ndim
            idx[ax] = slice(0, length)
            self._live[i] = np.ascontiguousarray(v[tuple(idx)])

    def _store_carried(self, outs, seq_len):
        """Keep a step's presents as the next step's pasts (``outs`` in output order); ``_forward`` has checked
        the new length against ``max_length`` before the step ran."""
        window = self._window
        trim = None
        if self._shared is None and self._kv_at:
            self._shared = self._want_shared and all(
                i in window or (self._live.get(i) is not None and _same_buffer(self._live[i], outs[k]))
                for i, k in self._kv_at)
            if not self._shared:  # the step copied the caches: keep exactly the live rows from now on
                trim = self._length + seq_len
        for i, k in self._kv_at:
            if i in window:
                self.window_kv[i] = outs[k]
            elif trim is None:
                self._live[i] = outs[k]
            else:
                idx = [slice(None)] * outs[k].ndim
                idx[self._seq_axis(i)] = slice(0, trim)
                self._live[i] = np.ascontiguousarray(outs[k][tuple(idx)])
        for i, k in self._state_at:
            self.state[i] = outs[k]
        self._length += seq_len
