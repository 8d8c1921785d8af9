"""A decoder over a paged KV cache: its GroupQueryAttention nodes read and write pools of fixed-size blocks.

``MakePaged`` is a graph pass over the decoder's IR: every com.microsoft GroupQueryAttention whose past caches
are graph inputs becomes ``onnx_numba::PagedGroupQueryAttention`` (``ops/paged_attention.py``), reading the
same input names as pools ``(num_blocks, kv_num_heads, block_size, head_size)`` and one new graph input
``block_table`` ``(batch, max_blocks)``; the present outputs are dropped (the op writes the pools in place).
A decoder it cannot serve raises ``PagedUnsupportedError`` saying which node and why: a cache read by
anything but GroupQueryAttention, a windowed cache without a window or of less capacity than its window, position
ids or an attention bias fed to the attention.  A sliding-window layer's cache (``sliding_window_cache=1``)
becomes pools like any other: the op attends the window over the blocks, which keep the whole history.

``PagedDecoder`` runs the rewritten graph natively: ``run(tokens, totals, tables, states)`` takes a batch of
rows, each with its own number of positions after the step (``totals``) and its own block table, and returns
the logits of each row's last position (and the recurrent state outputs of a hybrid decoder).  The attention
mask it feeds is what the graph derives ``seqlens_k`` and ``total_sequence_length`` from: row ``b`` has
``totals[b]`` ones.  The rows of one call are all prefill (one row, any number of new tokens) or all decode
(one new token each): ``tokens`` is ``(batch, new)``.

On ``CUDAExecutionProvider`` the pools are device arrays, bound whole every step and written in place by the
op's CUDA kernel (``ops/cuda/paged_attention.py``); a step uploads the ids, the mask and the block table and
downloads the last position's logits only.  A hybrid decoder is refused there (its per-request state would
have to cross to the host).

A decoder that takes onnxruntime-genai's paged format itself (``IOSpec.varlen``: its builder's
``use_paged_attention`` export, or any graph with those inputs) is run as it is: no rewrite, its caches
``(num_blocks, block_size, kv_heads, head_size)`` in the graph's own dtype are the pools, and a step feeds the rows'
new ids packed in one axis (``input_ids`` [tokens]), ``cumulative_sequence_lengths`` [B + 1],
``past_sequence_lengths`` [B], ``block_table`` [B, M] (-1 past a row's own blocks) and, where the graph takes
it, ``attention_metadata`` [longest query, longest cache, longest cache] as onnxruntime-genai's Engine feeds them.
Sliding-window layers (``block_table_windowed``): onnxruntime-genai keeps each request's window in a ring of blocks
of their own; here their pools are as large as the others' and keep every position, and the window's table is the
block table itself (the attention reads only the window, so the tokens are the same; the memory is not saved).
Its present caches are copied back into the pools, except those a com.microsoft ``PagedAttention`` node writes
in place (``ops/paged_attention.py``), which leave the graph's outputs; its logits are one row
per request when their first axis is named ``batch_size``, else one per packed token (each row's last is taken).

Invariants: the pools are allocated once (``np.zeros`` on the host, pages touched as blocks fill) and fed whole,
never copied; every block id and position is checked by the op before it reads or writes memory.
"""
from __future__ import annotations

import os

import numpy as np

from runtime.passes.base import Pass, PassResult

from .components import decoder_options, np_type
from .spec import MetadataError

__all__ = ["MakePaged", "PagedDecoder", "PagedUnsupportedError", "BLOCK_TABLE"]

BLOCK_TABLE = "block_table"
_MS = "com.microsoft"
_GQA_INPUTS = 12  # query .. head_sink; past those (quantized caches, qk norms) are refused


class PagedUnsupportedError(MetadataError):
    """The decoder has something the paged cache cannot serve; the message names the node and what."""


class MakePaged(Pass):
    """GroupQueryAttention nodes over graph-input caches become paged; ``kv_pairs``: (past input, present output)
    of every attention cache.  Records ``layers``: past key name -> (kv heads, head size)."""

    name = "make_paged"

    def __init__(self, kv_pairs, head_size: int | None = None):
        self.kv_pairs = list(kv_pairs)
        self.head_size = head_size
        self.layers = {}

    def call(self, graph) -> PassResult:
        from ops.paged_attention import DOMAIN, OP, bind_paged
        from ops.registry import OpContext
        inputs = {v.name: v for v in graph.inputs}
        past = {i for i, _ in self.kv_pairs}
        presents = {o for _, o in self.kv_pairs}
        readers = graph.consumers()
        for name in past:
            if name not in inputs:
                raise PagedUnsupportedError(f"cache {name!r} is not an input of the decoder")
            for n in readers.get(name, ()):
                if n.op_type != "GroupQueryAttention" or n.domain != _MS or name not in n.inputs[3:5]:
                    raise PagedUnsupportedError(f"cache {name!r} is read by node {n.name!r} ({n.domain or 'ai.onnx'}"
                                                f"::{n.op_type}); the paged cache serves caches that only "
                                                f"GroupQueryAttention reads")
        changed = False
        for k, n in enumerate(graph.nodes):
            if n.op_type != "GroupQueryAttention" or n.domain != _MS:
                continue
            ins = list(n.inputs) + [""] * (_GQA_INPUTS - len(n.inputs))
            where = f"node {n.name!r} (GroupQueryAttention)"
            if ins[3] not in past or ins[4] not in past:
                raise PagedUnsupportedError(f"{where}: its past caches {ins[3:5]} are not the decoder's cache "
                                            f"inputs")
            if any(ins[9:]) or len(n.inputs) > _GQA_INPUTS:
                raise PagedUnsupportedError(f"{where}: position_ids, attention_bias, head_sink and the inputs "
                                            f"after them are not supported by the paged attention")
            if any(o for o in n.outputs[3:]):
                raise PagedUnsupportedError(f"{where}: the output_qk output is not supported")
            for o in n.outputs[1:3]:
                if o and (o not in presents or readers.get(o)):
                    raise PagedUnsupportedError(f"{where}: present {o!r} is read inside the graph")
            ctx = OpContext(name=n.name, op_type=OP, domain=DOMAIN, opset=1, attrs=n.attrs, n_inputs=10,
                            n_outputs=1, outputs_used=[True], node=n, output_types=[None])
            try:
                b = bind_paged(ctx, **n.attrs)
            except Exception as exc:
                raise PagedUnsupportedError(f"{where}: {exc}") from None
            shape = inputs[ins[3]].shape or ()
            cap = shape[2] if len(shape) == 4 else None
            if b.windowed and isinstance(cap, int) and cap < b.window:
                raise PagedUnsupportedError(f"{where}: its windowed cache holds {cap} positions, fewer than its "
                                            f"window of {b.window}")
            d = self._head_size(inputs[ins[3]], b, graph, ins[0])
            self.layers[ins[3]] = (b.kvH, d)
            self.layers[ins[4]] = (b.kvH, d)
            n.op_type, n.domain, n.opset = OP, DOMAIN, 1
            n.inputs = ins[:3] + [ins[3], ins[4], BLOCK_TABLE] + ins[5:9]
            n.outputs = n.outputs[:1]
            n.attr_protos = None
            graph.nodes[k] = n
            changed = True
        missing = past - set(self.layers)
        if missing:
            raise PagedUnsupportedError(f"caches {sorted(missing)} are read by no GroupQueryAttention")
        if changed:
            self._retype(graph, presents)
        return PassResult(changed)

    def _head_size(self, past_vi, b, graph, query) -> int:
        shape = past_vi.shape or ()
        if len(shape) == 4 and isinstance(shape[3], int):
            return int(shape[3])
        if self.head_size:
            return int(self.head_size)
        raise PagedUnsupportedError(f"cache {past_vi.name!r}: its head size is not static and the package does "
                                    f"not say it")

    def _retype(self, graph, presents):
        from runtime.ir import ValueInfo
        from ops.paged_attention import DOMAIN
        for v in graph.inputs:
            if v.name in self.layers:
                kvh, d = self.layers[v.name]
                v.shape, v.dtype, v.elem_type, v.type_proto = ("num_blocks", kvh, "block_size", d), \
                    np.dtype(np.float32), 1, None
                graph.value_info.pop(v.name, None)
        graph.inputs.append(ValueInfo(BLOCK_TABLE, np.dtype(np.int32), ("batch_size", "max_blocks"), 6))
        graph.outputs = [v for v in graph.outputs if v.name not in presents]
        for p in presents:
            graph.value_info.pop(p, None)
        graph.opsets[DOMAIN] = 1
        if hasattr(graph, "_taken"):
            graph._taken.add(BLOCK_TABLE)


class PagedDecoder:
    """The package's decoder over pools of blocks, planned natively: rewritten by ``MakePaged``, or as it is when it
    takes onnxruntime-genai's paged format itself (``io.varlen``: packed ids, block tables, its own caches)."""

    def __init__(self, spec, num_blocks: int, block_size: int, providers=None, options=None):
        from runtime import InferenceSession
        from runtime.loader import load_graph
        dec = spec.decoder
        io = dec.io
        self.spec = spec
        self.io = io
        self.varlen = io.varlen
        if io.sequence_source != "token_ids" or not io.token_input:
            raise PagedUnsupportedError(f"decoder {dec.name!r} reads inputs_embeds: the engine feeds token ids")
        if not io.attention_mask_input and not self.varlen:
            raise PagedUnsupportedError(f"decoder {dec.name!r} has no attention mask input")
        self.block_size = int(block_size)
        self.num_blocks = int(num_blocks)
        graph = load_graph(dec.source, external_folder=os.path.dirname(dec.filename))
        if self.varlen:
            if io.state_pairs:
                raise PagedUnsupportedError(f"decoder {dec.name!r}: a decoder in the paged format with recurrent "
                                            f"state is not supported")
            layers = self._varlen_layers(graph, spec)
            self._drop_written_in_place(graph)
        else:
            pas = MakePaged(zip(io.kv_inputs, io.kv_outputs), spec.head_size)
            pas(graph)
            layers = {name: (kvh, d, np.dtype(np.float32)) for name, (kvh, d) in pas.layers.items()}
        options = decoder_options(options, "ONNX_NUMBA_COMPILED_REGIONS", "compiled_regions")
        options.kv_share_buffer = True  # the pools are donated to the one node that writes them
        self.session = InferenceSession(graph, options, providers=providers)
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self._order = [i.name for i in self.session.get_inputs()]
        outs = [o.name for o in self.session.get_outputs()]
        self._logits_at = outs.index(io.logits_output)
        self._state_at = {p.input: outs.index(p.output) for p in io.state_pairs}
        self._present_at = {i: outs.index(o) for i, o in zip(io.kv_inputs, io.kv_outputs) if o in outs} \
            if self.varlen else {}
        self.device = self.session.get_providers()[0] == "CUDAExecutionProvider"
        if self.device and io.state_pairs:
            raise PagedUnsupportedError(f"decoder {dec.name!r} carries recurrent state: the CUDA engine serves "
                                        f"decoders whose whole cache is attention blocks")
        if self.device and self.varlen:
            raise PagedUnsupportedError(f"decoder {dec.name!r} is in onnxruntime-genai's paged format: the engine "
                                        f"runs it on the CPU")
        if self.device:
            from .device_decoder import device_full
            zeros = lambda shape, dt: device_full(shape, dt, 0)  # noqa: E731
        else:
            zeros = lambda shape, dt: np.zeros(shape, dt)  # noqa: E731
        if self.varlen:  # onnxruntime-genai's layout: (blocks, block_size, heads, head_size)
            self.pools = {name: zeros((self.num_blocks, self.block_size, kvh, d), dt)
                          for name, (kvh, d, dt) in layers.items()}
        else:
            self.pools = {name: zeros((self.num_blocks, kvh, self.block_size, d), dt)
                          for name, (kvh, d, dt) in layers.items()}
        self.bytes_per_block = sum(dt.itemsize * kvh * self.block_size * d for kvh, d, dt in layers.values())
        pos = spec.positions
        self._pos_name = io.position_ids_input or (pos.input if pos is not None else None)
        if self._pos_name not in self.inputs:
            self._pos_name = None
        # rank-3 (mrope) positions: text only, each of the three streams at the token's position
        self._pos_rank = pos.rank if pos is not None and self._pos_name == pos.input else 2
        self.state_inputs = [p.input for p in io.state_pairs]
        self._token_type = np_type(self.inputs[io.token_input].type)
        # onnxruntime-genai's rule: logits of the paged format are per request when their first axis is named
        # batch_size, else per packed token
        shape = self.session.get_outputs()[self._logits_at].shape or []
        self._logits_per_token = bool(self.varlen) and (not shape or shape[0] != "batch_size")
        self.table_pad = -1 if self.varlen else 0
        if not self.varlen:
            self._mask_type = np_type(self.inputs[io.attention_mask_input].type)
            self._ones = np.ones((1, 1), self._mask_type)

    def _drop_written_in_place(self, graph):
        """Present caches that a com.microsoft PagedAttention node writes into its past cache in place leave the
        graph's outputs: the pools are that past, already written, and returning the present would copy them."""
        made = graph.producers()
        drop = set()
        for past, present in zip(self.io.kv_inputs, self.io.kv_outputs):
            n = made.get(present)
            if n is not None and n.op_type == "PagedAttention" and n.domain == _MS and any(
                    k + 1 < len(n.outputs) and n.outputs[k + 1] == present and len(n.inputs) > k + 3
                    and n.inputs[k + 3] == past for k in (0, 1)):
                drop.add(present)
        graph.outputs = [v for v in graph.outputs if v.name not in drop]

    def _varlen_layers(self, graph, spec) -> dict:
        """Each cache input of a decoder in the paged format: name -> (kv heads, head size, dtype), its static
        dimensions checked against the pools' block count and block size."""
        from runtime.dtypes import np_dtype
        ins = {v.name: v for v in graph.inputs}
        layers = {}
        for name in self.io.kv_inputs:
            v = ins[name]
            shape = tuple(v.shape or ())
            if len(shape) != 4:
                raise PagedUnsupportedError(f"cache {name!r} has shape {list(shape)}: the paged format's caches are "
                                            f"(num_blocks, block_size, kv_heads, head_size)")
            for axis, want, what in ((0, self.num_blocks, "num_blocks"), (1, self.block_size, "block_size")):
                if isinstance(shape[axis], int) and shape[axis] != want:
                    raise PagedUnsupportedError(f"cache {name!r} has {shape[axis]} at axis {axis} (shape "
                                                f"{list(shape)}) but engine.dynamic_batching.{what} is {want}")
            kvh = shape[2] if isinstance(shape[2], int) else spec.num_kv_heads
            d = shape[3] if isinstance(shape[3], int) else spec.head_size
            if not kvh or not d:
                raise PagedUnsupportedError(f"cache {name!r}: its heads and head size are not static and the package "
                                            f"does not say them")
            layers[name] = (int(kvh), int(d), np_dtype(v.elem_type))
        return layers

    def state_zeros(self):
        """One sequence's recurrent state (batch 1), zeros: input name -> array."""
        out = {}
        for name in self.state_inputs:
            shape = [1 if k == 0 else d for k, d in enumerate(self.inputs[name].shape)]
            if any(not isinstance(d, int) for d in shape):
                raise PagedUnsupportedError(f"state input {name!r} has shape {self.inputs[name].shape}: only its "
                                            f"batch axis may be symbolic")
            out[name] = np.zeros(shape, np_type(self.inputs[name].type))
        return out

    def run(self, tokens, totals, tables, states=None):
        """``tokens`` (B, S) ids, ``totals`` (B,) positions after the step, ``tables`` (B, M) block ids: the last
        position's logits of each row (B, vocab) and the state outputs (input name -> (B, ...)), or {}."""
        tokens = np.ascontiguousarray(tokens, dtype=self._token_type)
        B, S = tokens.shape
        totals = np.asarray(totals, np.int64)
        if self.varlen:
            return self._run_varlen(tokens, totals, tables), {}
        width = int(totals.max())
        if self._ones.shape[1] < width:
            self._ones = np.ones((1, max(width, 2 * self._ones.shape[1])), self._mask_type)
        if B == 1:
            mask = self._ones[:, :width]
        else:
            mask = (np.arange(width)[None, :] < totals[:, None]).astype(self._mask_type)
        feeds = {self.io.token_input: tokens, self.io.attention_mask_input: mask,
                 BLOCK_TABLE: np.ascontiguousarray(tables, dtype=np.int32)}
        if self._pos_name:
            t = np_type(self.inputs[self._pos_name].type)
            ids = ((totals - S)[:, None] + np.arange(S)[None, :]).astype(t)
            feeds[self._pos_name] = np.ascontiguousarray(np.broadcast_to(ids, (3, B, S))) if self._pos_rank == 3 \
                else ids
        feeds.update(self.pools)
        if states:
            feeds.update(states)
        opt = self.io.optional_inputs or {}
        vals = []
        for n in self._order:
            v = feeds.get(n)
            if v is None:
                absent = opt.get(n)
                if absent is None:
                    raise MetadataError(f"decoder input {n!r}: nothing provides it")
                v = np.zeros(absent.shape, absent.dtype)
            vals.append(v)
        if self.device:
            return self._run_device(dict(zip(self._order, vals)), B), {}
        outs = self.session.run_prepared(vals)
        logits = outs[self._logits_at]
        last = logits[:, -1, :] if logits.ndim == 3 else logits
        return np.ascontiguousarray(last, dtype=np.float32), {n: outs[k] for n, k in self._state_at.items()}

    def _run_varlen(self, tokens, totals, tables):
        """A step in onnxruntime-genai's paged format: the rows' ids packed in one axis, their boundaries, the
        positions already cached, the block tables (-1 past a row's own blocks) and the step's bounds; the caches go
        in whole and come back written (copied back unless the graph wrote them in place)."""
        B, S = tokens.shape
        v = self.varlen
        tables = np.ascontiguousarray(tables, dtype=np.int32)
        feeds = {self.io.token_input: tokens.reshape(-1),
                 v["cumulative_sequence_lengths"]: (np.arange(B + 1) * S).astype(np.int32),
                 v["past_sequence_lengths"]: (totals - S).astype(np.int32), v["block_table"]: tables}
        if "block_table_windowed" in v:  # sliding-window layers: their pools keep every block, as the others
            feeds[v["block_table_windowed"]] = tables
        if "attention_metadata" in v:  # bounds of the longest query and the longest cache after the step
            longest = int(totals.max())
            feeds[v["attention_metadata"]] = np.asarray([S, longest, longest], np.int32)
        feeds.update(self.pools)
        outs = self.session.run_prepared([feeds[n] for n in self._order])
        for name, k in self._present_at.items():
            pool, out = self.pools[name], outs[k]
            if out.ctypes.data != pool.ctypes.data:
                np.copyto(pool, out)
        logits = outs[self._logits_at]
        if logits.shape[0] != B or self._logits_per_token:  # one row per packed token: each row's last
            logits = logits[(np.arange(1, B + 1) * S) - 1]
        return np.ascontiguousarray(logits.reshape(B, -1), dtype=np.float32)

    def _run_device(self, feeds, B):
        """A step on the device: the pools stay there (bound, written in place); the step's ids, mask and block
        table go up, and only the last position's logits come down."""
        from runtime import cuda as rc
        from .device_decoder import copy_rows
        b = self.session.io_binding()
        for name, arr in feeds.items():
            b.bind_input(name, arr)
        for o in self.session.get_outputs():
            b.bind_output(o.name, "cuda")
        self.session.run_with_iobinding(b)
        logits = b.get_output_arrays()[self._logits_at]
        if logits.ndim == 3 and int(logits.shape[1]) > 1:
            last = rc.device_empty((B, 1, int(logits.shape[2])), logits.dtype)
            copy_rows(logits, int(logits.shape[1]) - 1, last, 0, 1, 1)
            logits = last
        return np.ascontiguousarray(rc.to_host(logits).reshape(B, -1), dtype=np.float32)
