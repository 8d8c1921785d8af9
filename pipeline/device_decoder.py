"""The native decoder on the CUDA provider, with its caches and state resident on the device.

``CudaDecoder`` is the native decoder that ``Pipeline`` picks when the
native device is ``cuda`` or ``cuda:N`` (``ONNX_NUMBA_NATIVE_DEVICE``).  Its
session is a ``runtime.InferenceSession`` on ``CUDAExecutionProvider``; a
decoder node without a CUDA kernel makes construction fail with the
session's ``UnsupportedOpError`` (nothing falls back to the CPU).

What stays on the device for the whole generation:

- KV caches (``kv_cache.KVCache``'s interface): one static buffer per cache
  input, sized to ``max_length`` along its sequence axis.  When every cache
  feeds only GroupQueryAttention (``kv_cache.policy_for``; and
  ``SessionOptions.kv_share_buffer`` is not False, nor
  ``ONNX_NUMBA_KV_SHARE_BUFFER=0``), the whole buffer is bound as ``past``
  and donated (``kv_cache.SharedKV`` in ``DEVICE`` memory): the kernel appends the new rows in place
  and returns the buffer as ``present``, so a step copies no cache row
  (onnxruntime-genai's past_present_share_buffer).  Otherwise
  (``kv_cache.CopiedKV``) only the new positions of the ``present`` output are
  copied into it, device to device (``copy_rows``),
  and the live prefix is bound as the next run's ``past`` input: a view of
  the buffer when that view is contiguous (batch x heads == 1), else a
  device-to-device compaction into a scratch buffer;
- sliding-window caches and recurrent / conv state pairs: each run's output
  device array is bound as the next run's input; their initial zeros are
  filled on the device;
- the attention mask (a device buffer of ones, bound as a contiguous
  ``(batch, total)`` view) and rank-1/2 position ids (a device arange,
  sliced for batch 1, filled by a kernel into a scratch buffer otherwise);
- absent optional inputs (device zeros, made once).

Per step the host hands over only the token ids (or one token's
embeddings), any ``extra`` inputs the caller passes and, for rank-3 (mrope)
positions, the position ids built on the host (3 x batch x seq integers,
uploaded by the session and noted in ``transfers.largest_in``); only the
last position's logits (batch x vocab) or, with ``want="argmax"``, the
argmax computed on the device (batch int64) come back (with ``want="all"``,
which ``og.Generator.get_output`` asks for, every new position's logits).  Every copy goes
through ``runtime.cuda.to_device``/``to_host``; ``transfers`` (a
``DeviceTransfers``) records the bytes each call moved as counted by a
``runtime.cuda.TransferCounter``.

Beam search reorders the caches, sliding-window caches and recurrent state
between beams on the device (``take_rows``: a gather kernel into a new
buffer, copied back into the static cache buffers; of a cache, only its live
positions); only the row indices cross.

Rows of different lengths (a right-padded batch, onnxruntime-genai's layout) run as on the CPU
(``DecoderComponent._ragged``): each row's mask covers its live positions, so GroupQueryAttention writes each
row's new keys at its own end (in the shared buffer, or the present copied whole into the static one), its
positions continue from its own length, and its logits are read at its last real position on the device (those
positions go up, 8 bytes a row).  The mask and positions are built per row on the host: where only the
plan's host subgraphs read them (a builder decoder's), nothing more crosses; where a device kernel reads them,
the session uploads them (counted).  On a decoder with recurrent state the batch's first run takes each row
alone over its real positions (``DecoderComponent._rows_alone``: the rows' feeds and state go through the host,
and their presents, state and logits come back to the device), so that no pad reaches the state; later runs of
one position per row run batched on the device.

A run that would take a cache past ``max_length`` raises before anything
runs or is written.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from runtime import cuda as rc

from .components import DecoderComponent, Transfers, decoder_options, model_source, np_type
from .kv_cache import CopiedKV, Memory, Rows, SharedKV, policy_for
from .spec import MetadataError

__all__ = ["CudaDecoder", "DeviceTransfers"]


@dataclass
class DeviceTransfers(Transfers):
    """``Transfers`` plus the host<->device bytes each ``prefill``/``step`` call moved and the kernels it
    launched (TransferCounter)."""
    h2d: int = 0
    d2h: int = 0
    launches: int = 0
    # per call: {"h2d", "d2h", "h2d_calls", "d2h_calls", "launches", "kernels", "seq_len"}
    steps: list = field(default_factory=list)

    def note_step(self, counter, seq_len):
        self.h2d += counter.h2d
        self.d2h += counter.d2h
        self.launches += counter.launches
        self.steps.append({"h2d": counter.h2d, "d2h": counter.d2h, "h2d_calls": counter.h2d_calls,
                           "d2h_calls": counter.d2h_calls, "launches": counter.launches,
                           "kernels": dict(counter.kernels), "seq_len": int(seq_len)})


# -- device kernels ---------------------------------------------------------------------------------

# Importing this module imports numba.cuda (through runtime.cuda), which fixes the choice between a GPU and the
# simulator; the pipeline imports it only once the native device is cuda (after runtime.cuda.available()).
from runtime.cuda import cuda, jit  # noqa: E402


@jit
def _copy_rows_kernel(src, s0, dst, d0, n):
    # dst[o, d0 + s, i] = src[o, s0 + s, i] for s < n; both arrays are (outer, seq, inner).
    outer, inner = src.shape[0], src.shape[2]
    total = outer * n * inner
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for k in range(start, total, stride):
        i = k % inner
        r = k // inner
        s = r % n
        o = r // n
        dst[o, d0 + s, i] = src[o, s0 + s, i]


@jit
def _take_kernel(src, rows, dst):
    # dst[o, b, i] = src[o, rows[b], i]; both arrays are (outer, batch, inner)
    outer, n, inner = dst.shape[0], dst.shape[1], dst.shape[2]
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for k in range(start, outer * n * inner, stride):
        i = k % inner
        r = k // inner
        dst[r // n, r % n, i] = src[r // n, rows[r % n], i]


@jit
def _take_live_kernel(src, rows, dst, n):
    # dst[o, b, m, l, i] = src[o, rows[b], m, l, i] for l < n; both arrays are (outer, batch, mid, seq, inner)
    outer, nb, mid, inner = dst.shape[0], dst.shape[1], dst.shape[2], dst.shape[4]
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for k in range(start, outer * nb * mid * n * inner, stride):
        i = k % inner
        r = k // inner
        s = r % n
        r = r // n
        m = r % mid
        r = r // mid
        dst[r // nb, r % nb, m, s, i] = src[r // nb, rows[r % nb], m, s, i]


@jit
def _row_positions_kernel(src, at, dst):
    # dst[b, i] = src[b, at[b], i]: each row's own position of a (batch, seq, inner) array
    nb, inner = dst.shape[0], dst.shape[1]
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for k in range(start, nb * inner, stride):
        b = k // inner
        dst[b, k % inner] = src[b, at[b], k % inner]


@jit
def _fill_kernel(a, v):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for k in range(start, a.shape[0], stride):
        a[k] = v


@jit
def _positions_kernel(a, first, seq):
    # a is a flat (batch * seq) buffer: row-major (batch, seq) positions first, first + 1, ...
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for k in range(start, a.shape[0], stride):
        a[k] = first + k % seq


def _grid(n):
    from ops.cuda._common import grid1d
    return grid1d(n)


def _flat(a):
    return a.reshape(a.size) if a.ndim != 1 else a


def device_full(shape, dtype, value):
    """A device array of ``shape`` filled with ``value`` on the device (no host transfer)."""
    a = rc.device_empty(shape, dtype)
    if a.size:
        b, t = _grid(a.size)
        _fill_kernel[b, t](_flat(a), np.dtype(dtype).type(value))
    return a


def copy_rows(src, s0, dst, d0, n, axis):
    """dst[..., d0:d0+n, ...] = src[..., s0:s0+n, ...] along ``axis``, device to device (both C-contiguous)."""
    if n <= 0:
        return
    ss, ds = tuple(src.shape), tuple(dst.shape)
    outer = int(np.prod(ss[:axis], dtype=np.int64))
    inner = int(np.prod(ss[axis + 1:], dtype=np.int64))
    if outer * inner == 0:
        return
    b, t = _grid(outer * n * inner)
    _copy_rows_kernel[b, t](src.reshape(outer, ss[axis], inner), int(s0),
                                  dst.reshape(outer, ds[axis], inner), int(d0), int(n))


class DeviceRows(Rows):
    """``Rows`` in a device buffer: ``live()`` is a C-contiguous device array (the view when it is one, else a
    device-to-device compaction into a scratch buffer kept for the next time)."""

    _scratch = None

    def live(self):
        view = self.buf[self.span(0, self.length)]
        if view.is_c_contiguous():
            return view
        if self._scratch is None:
            self._scratch = rc.device_empty((self.buf.size,), self.buf.dtype)
        shape = list(self.buf.shape)
        shape[self.axis] = self.length
        dst = self._scratch[:int(np.prod(shape, dtype=np.int64))].reshape(tuple(shape))
        copy_rows(self.buf, 0, dst, 0, self.length, self.axis)
        return dst

    def put(self, present, start, stop):
        copy_rows(present, start, self.buf, start, stop - start, self.axis)


def _device_zeros(shape, dtype):
    return device_full(tuple(shape), dtype, 0)


def take_rows(a, rows, axis, out=None, live=None):
    """Slices ``rows`` (host ints, each within ``a.shape[axis]``) of the device array ``a`` along ``axis``, gathered
    on the device into a new array, then copied into ``out`` (which may be ``a``) when given; only the row indices
    cross to the device.  ``live`` (seq_axis, n), with ``out`` and seq_axis after ``axis``: only positions
    [0, n) along seq_axis are gathered and copied (a static cache's rows past its length are never read)."""
    rows = np.ascontiguousarray(rows, np.int64)
    shape = tuple(a.shape)
    if rows.size and (rows.min() < 0 or rows.max() >= shape[axis]):
        raise IndexError(f"take_rows: rows {rows.tolist()} outside 0..{shape[axis] - 1} along axis {axis}")
    new = list(shape)
    new[axis] = rows.size
    dst = rc.device_empty(tuple(new), a.dtype)
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    if out is not None and live is not None and live[0] > axis:
        seq, n = int(live[0]), int(live[1])
        mid = int(np.prod(shape[axis + 1:seq], dtype=np.int64))
        inner = int(np.prod(shape[seq + 1:], dtype=np.int64))
        if outer * rows.size * mid * n * inner:
            b, t = _grid(outer * rows.size * mid * n * inner)
            _take_live_kernel[b, t](a.reshape(outer, shape[axis], mid, shape[seq], inner), rc.to_device(rows),
                                    dst.reshape(outer, rows.size, mid, shape[seq], inner), np.int64(n))
            copy_rows(dst, 0, out, 0, n, seq)
        return out
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    if dst.size:
        b, t = _grid(dst.size)
        _take_kernel[b, t](a.reshape(outer, shape[axis], inner), rc.to_device(rows),
                           dst.reshape(outer, rows.size, inner))
    if out is None:
        return dst
    copy_rows(dst, 0, out, 0, rows.size, axis)
    return out


# Device caches: static buffers of max_length rows (only rows already written are ever read), filled device to
# device; a present is the buffer itself when the kernel appended into it.
DEVICE = Memory(_device_zeros, lambda shape, dtype: rc.device_empty(tuple(shape), dtype), DeviceRows,
                rc.same_buffer, True, take_rows)


# -- the decoder ------------------------------------------------------------------------------------

class CudaDecoder(DecoderComponent):
    """Native decoder on ``CUDAExecutionProvider``; caches and state stay on the device (module docstring)."""

    backend = "native"
    rows_alone = True   # a padded batch's first run on recurrent state: each row alone (the host's loop)

    def __init__(self, spec, pipeline, max_length, batch=1, providers=None, options=None):
        from runtime import InferenceSession
        from runtime.providers import CUDA_PROVIDER, normalize_providers
        provs = normalize_providers(providers or [CUDA_PROVIDER])
        if provs[0][0] != CUDA_PROVIDER:
            raise ValueError(f"CudaDecoder runs on {CUDA_PROVIDER}, got providers {providers!r}")
        # Attention caches are max-length buffers that past and present share (GroupQueryAttention appends in
        # place) unless the caller's options say otherwise or ONNX_NUMBA_KV_SHARE_BUFFER=0.
        options = decoder_options(options, "ONNX_NUMBA_KV_SHARE_BUFFER", "kv_share_buffer")
        self._want_shared = bool(options.kv_share_buffer)
        # The session raises UnsupportedOpError for a node without a CUDA kernel: never caught here.
        sess = InferenceSession(*model_source(spec, options), providers=providers or [CUDA_PROVIDER])
        self._dev = {}  # persistent device buffers: ("ones", dtype) / ("arange", dtype) / ("pos", dtype) / ...
        super().__init__(spec, pipeline, sess, max_length, batch)
        self.device = str(sess.device)
        self.transfers = DeviceTransfers()

    def _make_cache(self, spec, windows):
        shared = policy_for(self.session._graph, self.io.kv_inputs, windows, self._want_shared) is SharedKV
        return (SharedKV if shared else CopiedKV)(spec, self.io.kv_inputs, windows, self.max_length, DEVICE)

    def _zeros(self, shape, dtype):
        return _device_zeros(shape, dtype)

    # -- device buffers ----------------------------------------------------------------------------
    def _buffer(self, key, make):
        b = self._dev.get(key)
        if b is None:
            b = self._dev[key] = make()
        return b

    def _mask(self, dtype, total):
        ones = self._buffer(("ones", dtype), lambda: device_full((self.batch * self.max_length,), dtype, 1))
        return ones[:self.batch * total].reshape((self.batch, total))

    def _positions(self, dtype, start, seq_len):
        if self.batch == 1:
            ar = self._buffer(("arange", dtype), lambda: self._arange(dtype))
            return ar[start:start + seq_len].reshape((1, seq_len))
        buf = self._buffer(("pos", dtype), lambda: rc.device_empty((self.batch * self.max_length,), dtype))
        out = buf[:self.batch * seq_len]
        if out.size:
            b, t = _grid(out.size)
            _positions_kernel[b, t](out, np.dtype(dtype).type(start), np.int64(seq_len))
        return out.reshape((self.batch, seq_len))

    def _arange(self, dtype):
        a = rc.device_empty((self.max_length,), dtype)
        b, t = _grid(self.max_length)
        _positions_kernel[b, t](a, np.dtype(dtype).type(0), np.int64(max(self.max_length, 1)))
        return a

    def _device_read(self, name) -> bool:
        """Whether the session's plan reads input ``name`` on the device.

        The CUDA plan runs integer shape subgraphs (and Gather's indices) on the host: an attention mask or
        position ids read only there is best bound as the host array the base class builds (nothing crosses);
        a device copy would be downloaded every run.  Inputs read by a device kernel, or by nothing, are
        bound as device views.
        """
        key = ("reads", name)
        if key not in self._dev:
            from runtime.cuda_plan import D, H
            wants = self.session.plan.reads_input_on(name)
            self._dev[key] = D in wants or H not in wants
        return self._dev[key]

    def _extras(self, seq_len, extra, lengths=None, note=True):
        # The base builds every input on the host; replace what can be resident with device views.  Rows of
        # different lengths keep the host's per-row mask and positions (uploaded by the session when a device
        # kernel reads them; the usual case, a mask and positions read only by the host's shape subgraph and
        # Gather indices, moves nothing).
        feeds = super()._extras(seq_len, extra, lengths)
        given = set(extra or {})
        io = self.io
        length = self.cache.length
        total = length + seq_len
        ragged = self.row_lengths is not None
        m = io.attention_mask_input
        if m and m in feeds and m not in given and self._device_read(m):
            if ragged:
                if note:
                    self.transfers.note_in(m, feeds[m])
            else:
                feeds[m] = self._mask(np_type(self.inputs[m].type), total)
        pos = self.pipeline.positions
        pname = io.position_ids_input or (pos.input if pos is not None else None)
        if pname and pname in feeds and pname not in given:
            if ragged:
                if note and self._device_read(pname):
                    self.transfers.note_in(pname, feeds[pname])
            elif (pos.rank if pos is not None else 1) == 3:
                if note and self._device_read(pname):
                    self.transfers.note_in(pname, feeds[pname])  # mrope positions: built on the host, uploaded
            elif self._device_read(pname):
                feeds[pname] = self._positions(np_type(self.inputs[pname].type), length, seq_len)
        for port, absent in (io.optional_inputs or {}).items():
            if port in feeds and port not in given:
                feeds[port] = self._buffer(("absent", port), lambda a=absent: device_full(a.shape, a.dtype, 0))
        return feeds

    # -- running -------------------------------------------------------------------------------------
    def _host(self, array):
        return rc.to_host(array) if rc.is_device_array(array) else np.asarray(array)

    def _from_host(self, array):
        return rc.to_device(np.ascontiguousarray(array))

    def _forward(self, tokens, embeds, extra, want, lengths=None):
        if want not in ("logits", "argmax", "all"):
            raise ValueError(f"want must be 'logits', 'argmax' or 'all', got {want!r}")
        with rc.TransferCounter() as tc:
            feeds, seq_len, n = self._feeds(tokens, embeds, extra, lengths=lengths)
            if n is not None and self.io.state_pairs and (n < seq_len).any():
                name = self.io.inputs_embeds_input if self.io.sequence_source == "inputs_embeds" \
                    else self.io.token_input
                logits = self._rows_alone(name, feeds[name], feeds, n)
            else:
                logits = self._run(feeds, seq_len)
            self.transfers.calls += 1
            if n is not None:
                self.row_lengths += n
            last = self._last(logits, None if n is None else n - 1)
            if want == "argmax":
                from ops.cuda.reduce import ArgMax
                out = rc.to_host(ArgMax(last, -1, 0))
            elif want == "all":
                out = rc.to_host(logits)
            else:
                out = rc.to_host(last)
            self.transfers.note_out(out)
        self.transfers.note_step(tc, seq_len)
        return out

    def _feeds(self, tokens, embeds, extra, note=True, lengths=None):
        """(the next run's feeds: host token ids or embeddings, device views of the rest; its length; each row's
        count of real new positions, None while every row is at one length).  Raises before anything is
        written when the caches would pass ``max_length`` or the rows' lengths cannot run here.  ``note``:
        record the host inputs in ``transfers`` (a run follows)."""
        if embeds is not None and rc.is_device_array(embeds):
            raise ValueError("CudaDecoder takes host embeddings (they are the step's only upload)")
        name, x = self._sequence(tokens, embeds)
        seq_len = x.shape[1]
        self.cache.make_room(self.cache.length + seq_len)
        n = self._ragged(lengths, seq_len)
        # Bound as a host array: the session uploads it once for the device kernels that read it.
        feeds = {name: x}
        feeds.update(self._extras(seq_len, extra, n, note))
        if note:
            self.transfers.note_in(name, x)
            for k, v in (extra or {}).items():
                if not rc.is_device_array(v):
                    self.transfers.note_in(k, v)
        self._init_state()
        return feeds, seq_len, n

    def bind_step(self, tokens=None, embeds=None, extra=None):
        """The ``IOBinding`` of the next run at the current length, bound but not run; nothing advances.

        For tools that time or capture one step in isolation (``tools/cuda_graph_probe.py``): running the
        binding computes the step exactly as ``step`` would, but the decoder's length, caches and state do not
        move (nor do ``transfers``), so the binding can be run again.  Shared caches are written in place at the
        step's positions, so a second run rewrites the same rows with the same values.  Outputs stay on the device
        (``binding.get_output_arrays()``, in ``output_names`` order).
        """
        if self.row_lengths is not None:
            raise NotImplementedError("bind_step: the rows hold different lengths (a padded batch)")
        feeds, _, _ = self._feeds(tokens, embeds, extra, note=False)
        return self._binding(feeds)

    def _binding(self, feeds):
        b = self.session.io_binding()
        for name, arr in feeds.items():
            b.bind_input(name, arr)
        for i in self.io.kv_inputs:
            b.bind_input(i, self.cache.past(i))
        for name, arr in self.state.items():
            b.bind_input(name, arr)
        for o in self.output_names:
            b.bind_output(o, "cuda")  # every output stays on the device; nothing is downloaded here
        return b

    def _last(self, logits, at=None):
        """The last position's logits as a (batch, vocab) device array; ``at``: each row's own last real position
        (host ints, uploaded: 8 bytes a row) when the rows' lengths differ."""
        if logits.ndim == 2:
            return logits
        if logits.ndim != 3:
            raise MetadataError(f"decoder {self.spec.name!r}: logits of rank {logits.ndim}; expected "
                                f"(batch, seq, vocab) or (batch, vocab)")
        b, s, v = (int(d) for d in logits.shape)
        if at is not None and (np.asarray(at) != s - 1).any():
            out = rc.device_empty((b, v), logits.dtype)
            g, t = _grid(b * v)
            _row_positions_kernel[g, t](logits, rc.to_device(np.ascontiguousarray(at, np.int64)), out)
            return out
        if s == 1:
            return logits.reshape((b, v))
        out = rc.device_empty((b, 1, v), logits.dtype)
        copy_rows(logits, s - 1, out, 0, 1, 1)
        return out.reshape((b, v))

    def _run(self, feeds, seq_len):
        b = self._binding(feeds)
        self.session.run_with_iobinding(b)
        res = dict(zip(self.output_names, b.get_output_arrays()))
        self._keep(res, seq_len)
        self._keep_captured(res)  # a captured output (a hidden state the host reads) comes down; nothing else
        self.last_results = res  # device arrays, for inspection (nothing is downloaded)
        return res[self.io.logits_output]

    # -- inspection ----------------------------------------------------------------------------------
    def bytes_per_step(self) -> dict:
        """The memory a decode step must read at the current length: ``weights`` (every device-resident
        initializer read in full, ``CudaPlan.weight_bytes_per_run``) and ``kv`` (the live rows of every
        attention cache, keys and values); their sum over a step's time is the bandwidth it achieves."""
        kv = sum(int(w.size) * np.dtype(w.dtype).itemsize for w in self.cache.window.values())
        for r in self.cache.rows.values():
            kv += int(r.buf.size) * np.dtype(r.buf.dtype).itemsize * r.length // max(r.capacity, 1)
        return {"weights": int(self.session.plan.weight_bytes_per_run()), "kv": int(kv)}

    def reorder(self, rows):
        """Row ``b`` of every cache and recurrent state becomes what row ``rows[b]`` held (beam search), gathered
        on the device: only the row indices go up (once per array), nothing comes down; the static cache buffers
        stay the same."""
        self.cache.reorder(rows)
        for k, v in self.state.items():
            self.state[k] = take_rows(v, rows, 0) if rc.is_device_array(v) else \
                np.ascontiguousarray(np.asarray(v)[np.asarray(rows, np.int64)])

    def state_to_host(self) -> dict:
        """The state pairs' current values, downloaded (counted) — for tests and debugging, not the loop."""
        return {k: rc.to_host(v) for k, v in self.state.items()}
