"""Fused elementwise segments: runs of small float32 elementwise nodes executed by one compiled loop.

A graph of many tiny elementwise nodes (shape arithmetic, activations on
small tensors, the bodies of decode-time recurrences) is dominated by the
cost of calling one kernel per node from Python.  The planner finds maximal
runs of consecutive steps that qualify and replaces each run with one step:
the run is encoded as rows of integers (op code, operand offsets and
strides, output offset and length) over one float32 scratch array, and
``_run_segment`` interprets all rows in a single call.

A node qualifies when it is a default-domain op listed in ``OPCODES``, every
input and output is float32 with a static shape of at most
``MAX_ELEMENTS`` elements, and every input either has the output's shape or a
single element.  The arithmetic is the same float32 arithmetic as the
standalone kernels in ``ops._elementwise_kernels``, so results are
bit-identical to the unfused plan.

Invariants:
- values produced and consumed inside a segment never leave its scratch
  array; values read after the segment are handed out as views of it, which
  stay valid until the next run (graph outputs among them are copied);
- scratch ranges are recycled once the value held there is dead inside the
  segment, and never while a later row of the segment still reads it;
- initializers are copied into the scratch array once, at plan time.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ops import _elementwise_kernels as K
from ops.elementwise import cpu_kernel

__all__ = ["OPCODES", "MAX_ELEMENTS", "find_segments", "runs_of", "Segment"]

# ONNX op -> its opcode: the index of its kernel in the generated ``SEGMENT``, whose ``segment_op`` computes it
# with the expression of that kernel (tools/gen_elementwise.py holds both).
OPCODES = {name: K.SEGMENT.index(kernel) for name, kernel in (
    ("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("Div", "div_f"), ("Relu", "relu"), ("Neg", "neg"),
    ("Exp", "exp"), ("Tanh", "tanh"), ("Sigmoid", "sigmoid"), ("Abs", "abs"))}
BINARY = {"Add", "Sub", "Mul", "Div"}


def opcode(op_type: str) -> int:
    """The row opcode of ``op_type`` in a plan made now: its kernel's, after ``cpu_kernel`` (under
    ``ONNX_NUMBA_MLAS_ORDER`` Sigmoid's is MLAS's logistic)."""
    return K.SEGMENT.index(cpu_kernel(K.SEGMENT[OPCODES[op_type]]))
MAX_ELEMENTS = 4096
F32 = np.dtype(np.float32)


@njit(cache=True, nogil=True, error_model="numpy")
def _run_segment(arena, code):
    for r in range(code.shape[0]):
        op = code[r, 0]
        a = code[r, 1]
        sa = code[r, 2]
        b = code[r, 3]
        sb = code[r, 4]
        o = code[r, 5]
        n = code[r, 6]
        for i in range(n):
            K.segment_op(op, arena[a + i * sa], arena[b + i * sb], arena, o + i)


def _qualifies(node, impl, value_info, initializers) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type not in OPCODES or impl.provider != "CPUExecutionProvider":
        return False
    nin = 2 if node.op_type in BINARY else 1
    if len(node.inputs) != nin or len(node.outputs) != 1 or not all(node.inputs) or not node.outputs[0]:
        return False
    out = value_info.get(node.outputs[0])
    if out is None or out.dtype != F32 or out.static_shape is None:
        return False
    size = int(math.prod(out.static_shape))
    if size == 0 or size > MAX_ELEMENTS:
        return False
    for i in node.inputs:
        if i in initializers:
            arr = initializers[i]
            dt, shape = arr.dtype, tuple(arr.shape)
        else:
            vi = value_info.get(i)
            if vi is None or vi.static_shape is None:
                return False
            dt, shape = vi.dtype, vi.static_shape
        if dt != F32:
            return False
        if shape != out.static_shape and int(math.prod(shape)) != 1:
            return False
    return True


def runs_of(flags, min_length: int) -> list:
    """Maximal [start, end) runs of true entries of the list ``flags``, each at least ``min_length`` long."""
    runs, start = [], None
    for i, ok in enumerate(flags):
        if ok:
            if start is None:
                start = i
        else:
            if start is not None and i - start >= min_length:
                runs.append((start, i))
            start = None
    if start is not None and len(flags) - start >= min_length:
        runs.append((start, len(flags)))
    return runs


def find_segments(nodes, impls, value_info, initializers, min_length: int = 2) -> list:
    """Maximal [start, end) runs of qualifying consecutive steps."""
    return runs_of([_qualifies(n, impl, value_info, initializers) for n, impl in zip(nodes, impls)], min_length)


class Segment:
    """One compiled run of elementwise steps; ``run(*external_inputs)`` returns the escaping values."""

    def __init__(self, nodes, value_info, initializers, read_after: set, slot_of: dict):
        produced = {n.outputs[0] for n in nodes}
        last_read = {}
        for k, n in enumerate(nodes):
            for x in n.inputs:
                last_read[x] = k
        self.escaping = [n.outputs[0] for n in nodes if n.outputs[0] in read_after]
        escaping = set(self.escaping)
        external = []
        for n in nodes:
            for x in n.inputs:
                if x not in produced and x not in initializers and x not in external:
                    external.append(x)
        self.external = external
        consts = []
        for n in nodes:
            for x in n.inputs:
                if x in initializers and x not in consts:
                    consts.append(x)

        top = 0
        offset, size, free = {}, {}, {}

        def alloc(name, n_el):
            nonlocal top
            pool = free.get(n_el)
            if pool:
                off = pool.pop()
            else:
                off = top
                top += n_el
            offset[name] = off
            size[name] = n_el
            return off

        def numel(name):
            if name in initializers:
                return int(initializers[name].size)
            return int(math.prod(value_info[name].static_shape))

        for x in consts + external:
            alloc(x, numel(x))
        rows = []
        pending_free = []
        for k, n in enumerate(nodes):
            for name in pending_free:
                free.setdefault(size[name], []).append(offset[name])
            pending_free = []
            out = n.outputs[0]
            n_out = numel(out)
            o = alloc(out, n_out)
            a = n.inputs[0]
            b = n.inputs[1] if len(n.inputs) > 1 else a
            rows.append((opcode(n.op_type), offset[a], int(numel(a) != 1), offset[b], int(numel(b) != 1), o, n_out))
            for x in set(n.inputs):
                if x in produced and last_read.get(x) == k and x not in escaping:
                    pending_free.append(x)
            if out not in escaping and out not in last_read:
                pending_free.append(out)
        self.code = np.array(rows, dtype=np.int64).reshape(-1, 7)
        self.arena = np.zeros(max(top, 1), dtype=np.float32)
        for x in consts:
            self.arena[offset[x]:offset[x] + size[x]] = np.asarray(initializers[x], np.float32).reshape(-1)
        self.in_ranges = [(offset[x], offset[x] + size[x]) for x in external]
        self.out_views = [self.arena[offset[x]:offset[x] + size[x]].reshape(value_info[x].static_shape)
                          for x in self.escaping]
        self.in_slots = tuple(slot_of[x] for x in external)
        self.out_slots = tuple(slot_of[x] for x in self.escaping)
        self.nodes = nodes

    def run(self, *xs):
        arena = self.arena
        for (lo, hi), x in zip(self.in_ranges, xs):
            arena[lo:hi] = x.reshape(-1)
        _run_segment(arena, self.code)
        return self.out_views
