"""A decoder's KV caches: one interface, three policies, in host or device memory.

A ``KVCache`` holds, for each KV input of a decoder, the positions the steps
so far have written, behind seven methods:

- ``make_room(total)`` before a step that brings the caches to ``total``
  positions: refuses past ``max_length`` (nothing is written), grows buffers
  that would overflow;
- ``past(name)``: the array to feed as that input;
- ``store(presents, seq_len)`` after the step: keep its presents
  (``{input name: present}``), every one checked before any is written;
- ``rewind(length)``, ``reset()``, ``reserve(positions)`` (how far the
  coming request reaches: what new buffers are sized to), ``reorder(rows)``
  (beam search: each row takes another row's contents, in place).

Sliding-window caches (``windows``: input name -> capacity) are common to
every policy: zeros of their capacity at first, then each step's present,
replaced whole.  The attention caches follow one of three policies, chosen
once from the graph by ``policy_for``:

- ``SharedKV``: one buffer per cache that past and present share (the
  session's ``kv_share_buffer``): it is fed whole and GroupQueryAttention
  appends the new rows in place, so nothing is copied between steps; a
  present that is not the buffer has its new rows copied in;
- ``CarriedKV``: each step's present holds exactly the live rows in a fresh
  array and is fed back as the next step's past as it is;
- ``CopiedKV``: each present holds every live row; the new rows are copied
  into a buffer that grows by doubling, whose live prefix is the next past
  (onnxruntime, and native graphs whose caches feed more than attention);
  with ``ragged`` rows (a padded batch, each row at its own length) the
  whole present is copied, since each row's new positions sit at its end.

``length`` is the live positions of every attention cache; ``rows`` maps
each made cache to its ``Rows`` (buffer, sequence axis, live length).  A
cache's ``Memory`` says where its buffers live: ``HOST`` (numpy), or the
device's (``device_decoder.DEVICE``: static buffers of ``max_length`` rows,
filled by device-to-device copies).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from .spec import MetadataError

__all__ = ["KVCache", "SharedKV", "CarriedKV", "CopiedKV", "CacheSpec", "Rows", "Memory", "HOST", "kv_rows",
           "policy_for", "KV_START_ROWS"]

KV_START_ROWS = 256  # rows a cache starts with when nothing said how far the request reaches


def kv_rows(needed: int, reach: int | None, max_length: int, current: int = 0) -> int:
    """Rows to give a KV buffer that must hold ``needed``: a new one what the request reaches (``reach``, else
    ``KV_START_ROWS``), a full one (``current`` rows) twice as many; at least ``needed``, never past
    ``max_length``."""
    rows = max(needed, 2 * current) if current else max(needed, reach or KV_START_ROWS)
    return min(rows, max_length)


class CacheSpec(NamedTuple):
    """One cache input: its concrete shape (any extent on the sequence axis), that axis, its dtype and its batch
    axis (1 for a combined key-and-value cache)."""
    shape: tuple
    axis: int
    dtype: np.dtype
    batch: int = 0

    def with_rows(self, rows: int) -> tuple:
        s = list(self.shape)
        s[self.axis] = int(rows)
        return tuple(s)


class Rows:
    """One cache tensor: ``buf`` holds ``length`` live positions along ``axis`` (and maybe room for more)."""

    def __init__(self, buf, axis: int, length: int = 0):
        self.buf = buf
        self.axis = axis
        self.length = length

    @property
    def capacity(self) -> int:
        return int(self.buf.shape[self.axis])

    def span(self, start, stop) -> tuple:
        idx = [slice(None)] * self.buf.ndim
        idx[self.axis] = slice(start, stop)
        return tuple(idx)

    def live(self):
        """The first ``length`` positions (a view)."""
        return self.buf[self.span(0, self.length)]

    def put(self, present, start, stop):
        """Rows [start, stop) of ``present`` into the same rows of the buffer."""
        self.buf[self.span(start, stop)] = present[self.span(start, stop)]


def policy_for(graph, kv_inputs, windows, want_shared: bool):
    """The host policy for a native decoder's attention caches: ``SharedKV`` when wanted and every cache is
    read only as GroupQueryAttention's past (inputs 3 and 4) of a node without ``sliding_window_cache`` (which
    then appends in place whenever the buffer has room), ``CarriedKV`` when every cache is read only by
    GroupQueryAttention (whose present holds exactly the live rows), else ``CopiedKV``."""
    readers = {}
    for node in graph.nodes:
        for k, x in enumerate(node.inputs):
            readers.setdefault(x, []).append((node, k))
    names = [n for n in kv_inputs if n not in windows]
    gqa = all(readers.get(n) and all(node.op_type == "GroupQueryAttention" and k in (3, 4)
                                     for node, k in readers[n]) for n in names)
    if not gqa:
        return CopiedKV
    windowed = any(int(node.attrs.get("sliding_window_cache", 0) or 0) for n in names for node, _ in readers[n])
    return SharedKV if want_shared and not windowed else CarriedKV


def _same_buffer(a, b) -> bool:
    """``b`` is ``a`` or a view of the same memory with the same shape."""
    return a is b or (a.shape == b.shape and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


class Memory(NamedTuple):
    """Where a cache's arrays live: how they are made and told apart."""
    zeros: Callable      # (shape, dtype) -> zeros (sliding-window caches' first past)
    empty: Callable      # (shape, dtype) -> a buffer whose rows are read only once written
    rows: type           # the ``Rows`` class over its arrays
    same: Callable       # (a, b) -> whether b is a's memory
    static: bool         # buffers are made with max_length rows and never grow
    take: Callable       # (a, rows, axis, out=None, live=None) -> slices ``rows`` of a along axis, into out (else
    #                      a new array); ``live`` (seq_axis, n): only positions [0, n) along seq_axis are moved


def _live_span(ndim, live):
    idx = [slice(None)] * ndim
    if live is not None:
        idx[live[0]] = slice(0, live[1])
    return tuple(idx)


def _host_take(a, rows, axis, out=None, live=None):
    if out is None:
        return np.ascontiguousarray(np.take(a, rows, axis=axis))
    span = _live_span(a.ndim, live)
    out[span] = np.take(a[span], rows, axis=axis)
    return out


HOST = Memory(np.zeros, np.zeros, Rows, _same_buffer, False, _host_take)


class KVCache:
    """The interface (module docstring) and what every policy shares: the sliding-window caches, the length and
    its bounds, making buffers in ``memory`` (``HOST``; the device's in ``device_decoder``).  Policies write
    ``_past``, ``_store`` and, where they keep rows past the live ones, ``_grow``, ``_rewind``."""

    in_place = False  # SharedKV: whether the last step appended into the buffers (no copy)
    ragged = False    # rows of a batch hold different lengths: a present's new rows sit at each row's own end

    def __init__(self, spec: Callable[[str], CacheSpec], kv_inputs, windows: dict, max_length: int,
                 memory: Memory = HOST):
        self._spec_of = spec
        self._specs = {}
        self.kv_inputs = tuple(kv_inputs)
        self.windows = dict(windows)
        self.max_length = int(max_length)
        self.memory = memory
        self.reach = None
        self.rows = {}
        self.window = {}
        self.length = 0

    def spec(self, name) -> CacheSpec:
        s = self._specs.get(name)
        if s is None:
            s = self._specs[name] = self._spec_of(name)
        return s

    # -- the interface ---------------------------------------------------------------------------------
    def reserve(self, positions: int):
        """The coming request reaches at most ``positions``: new buffers are sized to that (within
        ``max_length``; static memory is always sized to ``max_length``)."""
        self.reach = max(1, min(int(positions), self.max_length))

    def reset(self):
        self.window = {}
        self.length = 0
        self._reset()

    def past(self, name):
        cap = self.windows.get(name)
        if cap is None:
            return self._past(name)
        w = self.window.get(name)
        if w is None:
            s = self.spec(name)
            w = self.window[name] = self.memory.zeros(s.with_rows(cap), s.dtype)
        return w

    def make_room(self, total: int):
        if total > self.max_length:
            raise MetadataError(f"the KV cache would hold {total} positions, past max_length {self.max_length}")
        self._grow(total)

    def store(self, presents: dict, seq_len: int):
        attn = {n: p for n, p in presents.items() if n not in self.windows}
        self._store(attn, seq_len)
        for n, p in presents.items():
            if n in self.windows:
                self.window[n] = p
        self.length += seq_len

    def rewind(self, length: int):
        if length < 0 or length > self.length:
            raise ValueError(f"cannot rewind to {length}: the cache holds {self.length} positions")
        if self.windows and length != self.length:
            raise ValueError("a decoder with sliding-window caches cannot rewind (they keep no history)")
        self._rewind(length)
        self.length = length

    def reorder(self, rows):
        """Row ``b`` (along each cache's batch axis) of every cache becomes what row ``rows[b]`` held (beam
        search), in the same buffers, in the cache's memory (a device cache never crosses to the host)."""
        idx = np.asarray(rows, np.int64)
        for n, r in self.rows.items():   # the live positions only: the rest is never read
            self.memory.take(r.buf, idx, self.spec(n).batch, r.buf, (r.axis, r.length))
        for n, w in self.window.items():
            self.window[n] = self.memory.take(w, idx, self.spec(n).batch)

    def nbytes(self) -> int:
        """Bytes held by every cache buffer (live or not)."""
        arrays = [r.buf for r in self.rows.values()] + list(self.window.values())
        return sum(int(a.size) * np.dtype(a.dtype).itemsize for a in arrays)

    # -- what policies share and write -----------------------------------------------------------------
    def _capacity(self, total: int) -> int:
        """Rows of a new buffer that must hold ``total``."""
        return self.max_length if self.memory.static else kv_rows(total, self.reach, self.max_length)

    def _new_rows(self, name, capacity, length=0) -> Rows:
        s = self.spec(name)
        return self.memory.rows(self.memory.empty(s.with_rows(capacity), s.dtype), s.axis, length)

    def _none_yet(self, name):
        """A past of no rows (before the first step)."""
        s = self.spec(name)
        return self.memory.empty(s.with_rows(0), s.dtype)

    def _reset(self):
        self.rows = {}

    def _grow(self, total: int):
        pass

    def _rewind(self, length: int):
        for r in self.rows.values():
            r.length = length

    def _check(self, presents: dict, seq_len: int):
        """Every present has the rank, extents and dtype its cache holds; raises before anything is written."""
        for n, p in presents.items():
            s = self.spec(n)
            shape, ax = tuple(p.shape), s.axis
            if len(shape) != len(s.shape) or shape[:ax] != s.shape[:ax] or shape[ax + 1:] != s.shape[ax + 1:] \
                    or np.dtype(p.dtype) != np.dtype(s.dtype) or shape[ax] < self.length + seq_len:
                want = list(s.with_rows(self.length + seq_len))
                raise MetadataError(f"KV cache {n!r}: the decoder produced {p.dtype} of shape {list(shape)}; the "
                                    f"cache holds {np.dtype(s.dtype)} of shape {want} (at least, on sequence axis {ax})")

    def _past(self, name):  # pragma: no cover - interface
        raise NotImplementedError

    def _store(self, presents: dict, seq_len: int):  # pragma: no cover - interface
        raise NotImplementedError


class CopiedKV(KVCache):
    """Presents hold every live row: the new ones are copied into a buffer (made at the first store) that
    doubles when full; its live prefix is the next past."""

    def _past(self, name):
        r = self.rows.get(name)
        return self._none_yet(name) if r is None else r.live()

    def _store(self, presents, seq_len):
        self._check(presents, seq_len)
        total = self.length + seq_len
        for n, p in presents.items():
            r = self.rows.get(n)
            if r is None:
                r = self.rows[n] = self._new_rows(n, self._capacity(total))
            if total > r.capacity:
                self._regrow(r, kv_rows(total, None, self.max_length, r.capacity))
            # ragged rows: each row's new positions sit at its own end, so the present is kept whole
            r.put(p, 0 if self.ragged else self.length, total)
            r.length = total

    def _regrow(self, r: Rows, rows: int):
        """Host buffers only (static ones have every row already)."""
        s = list(r.buf.shape)
        s[r.axis] = rows
        new = self.memory.empty(tuple(s), r.buf.dtype)
        new[r.span(0, r.length)] = r.live()
        r.buf = new


class CarriedKV(KVCache):
    """Each step's present holds exactly the live rows, fresh: it is the next step's past as it is."""

    def _past(self, name):
        r = self.rows.get(name)
        return self._none_yet(name) if r is None else r.buf

    def _store(self, presents, seq_len):
        for n, p in presents.items():
            self.rows[n] = self.memory.rows(p, self.spec(n).axis, self.length + seq_len)

    def _rewind(self, length):
        for r in self.rows.values():
            r.length = length
            r.buf = np.ascontiguousarray(r.live())


class SharedKV(CopiedKV):
    """One buffer per cache, fed whole; the step appends its rows in place.  Buffers are made at the first
    ``past`` for what the request reaches (at least the step's total), double (keeping the live rows) when a
    step would pass them, and are kept across ``reset`` while a new request reaches as far."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._need = 1  # positions the coming step brings the caches to

    def reserve(self, positions: int):
        super().reserve(positions)
        if self.length == 0 and self.rows and not self.memory.static and \
                next(iter(self.rows.values())).capacity != kv_rows(1, self.reach, self.max_length):
            self.rows = {}  # sized afresh for this request at its first step

    def _reset(self):
        for r in self.rows.values():
            r.length = 0

    def _past(self, name):
        r = self.rows.get(name)
        if r is None:
            cap = next(iter(self.rows.values())).capacity if self.rows else self._capacity(self._need)
            r = self.rows[name] = self._new_rows(name, cap, self.length)
        return r.buf

    def _grow(self, total):
        self._need = max(total, 1)
        if not self.rows:
            return
        cap = next(iter(self.rows.values())).capacity
        if total > cap:
            rows = kv_rows(total, None, self.max_length, cap)
            for r in self.rows.values():
                self._regrow(r, rows)

    def _store(self, presents, seq_len):
        rows, same = self.rows, self.memory.same
        copied = {n: p for n, p in presents.items() if not same(rows[n].buf, p)}
        self._check(copied, seq_len)
        self.in_place = not copied
        total = self.length + seq_len
        for n, p in copied.items():
            rows[n].put(p, 0 if self.ragged else self.length, total)
        for n in presents:
            rows[n].length = total
