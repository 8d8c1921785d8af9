"""The paged KV cache's bookkeeping: one pool of block ids shared by every layer, reference counts, and prefix reuse.

A block is ``block_size`` consecutive positions of one sequence in every layer's pools (``pipeline/paged.py``
holds the arrays; this module only hands out ids).  A sequence owns a list of block ids, its block table.

Prefix reuse: a full block is keyed by the tokens it holds and the key of the block before it (a hash chain,
``chain_keys``: SHA-1 over the parent's key and the token ids, so a key names the whole prefix, not only the
block's own tokens).  ``register`` records a sequence's full block under its key; ``match`` finds the longest
run of a new prompt's leading full blocks already in the pool and takes a reference on each.  A block no
sequence references keeps its key and waits in least-recently-used order: ``allocate`` takes never-used blocks
first, then evicts the least recently released keyed block.

Invariants:
- ``ref[b]`` is the number of sequences whose table holds ``b``; a block is in exactly one of: in use
  (``ref > 0``), ``free`` (no key), ``lru`` (keyed, ``ref == 0``);
- a keyed block's contents never change: sequences only write positions past their matched prefix, and a
  block is registered only once it is full;
- ``free_blocks() + in_use() == num_blocks`` at all times; ``release`` of a block not held raises.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict, deque

import numpy as np

__all__ = ["BlockPool", "chain_keys", "PoolExhausted"]


class PoolExhausted(RuntimeError):
    """No block is free and none can be evicted."""


def chain_keys(tokens, block_size: int, start_key: bytes = b"", first: int = 0, count: int | None = None) -> list:
    """The keys of the full blocks of ``tokens``: block ``i`` covers tokens ``[i * bs, (i + 1) * bs)``.  From
    block ``first`` (whose parent key is ``start_key``) for ``count`` blocks (default: every full block)."""
    bs = int(block_size)
    n = len(tokens) // bs
    if count is not None:
        n = min(n, first + count)
    keys = []
    key = start_key
    arr = np.asarray(tokens, np.int64)
    for i in range(first, n):
        key = hashlib.sha1(key + arr[i * bs:(i + 1) * bs].tobytes()).digest()
        keys.append(key)
    return keys


class BlockPool:
    """``num_blocks`` block ids with reference counts; ``prefix_cache`` keeps released full blocks for reuse."""

    def __init__(self, num_blocks: int, block_size: int, prefix_cache: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a pool needs at least one block of at least one position, got {num_blocks} blocks "
                             f"of {block_size}")
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.prefix_cache = bool(prefix_cache)
        self.ref = np.zeros(self.num_blocks, np.int32)
        self.free = deque(range(self.num_blocks))
        self.lru = OrderedDict()      # keyed blocks no sequence holds, least recently released first
        self.by_key = {}              # key -> block
        self.key_of = {}              # block -> key
        self.hits = 0                 # blocks reused by match()
        self.evictions = 0

    # -- counts ------------------------------------------------------------------------------------
    def free_blocks(self) -> int:
        """Blocks ``allocate`` can hand out: never used plus evictable."""
        return len(self.free) + len(self.lru)

    def in_use(self) -> int:
        return self.num_blocks - self.free_blocks()

    def cached(self) -> int:
        return len(self.by_key)

    # -- handing out -------------------------------------------------------------------------------
    def allocate(self) -> int:
        """A block with no contents anyone will read: a never-used one, else the least recently released keyed
        one (its key forgotten).  ``PoolExhausted`` when every block is held."""
        if self.free:
            b = self.free.popleft()
        elif self.lru:
            b, _ = self.lru.popitem(last=False)
            del self.by_key[self.key_of.pop(b)]
            self.evictions += 1
        else:
            raise PoolExhausted(f"all {self.num_blocks} KV blocks are in use")
        self.ref[b] = 1
        return b

    def release(self, blocks):
        """Drop one reference on each block; a block nobody holds goes back: keyed ones to the LRU list (most
        recent last), the rest to the free list."""
        for b in blocks:
            if self.ref[b] <= 0:
                raise ValueError(f"block {b} is released but not held")
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if b in self.key_of:
                    self.lru[b] = None
                else:
                    self.free.append(b)

    # -- prefix reuse ------------------------------------------------------------------------------
    def match(self, keys) -> list:
        """The blocks of the longest leading run of ``keys`` in the pool, each now referenced once more."""
        out = []
        if not self.prefix_cache:
            return out
        for k in keys:
            b = self.by_key.get(k)
            if b is None:
                break
            if self.ref[b] == 0:
                del self.lru[b]
            self.ref[b] += 1
            out.append(b)
        self.hits += len(out)
        return out

    def register(self, block: int, key: bytes):
        """``block`` is full and holds the prefix ``key`` names; the first block registered under a key keeps it
        (another block with the same contents stays unkeyed and is freed when released)."""
        if not self.prefix_cache or key in self.by_key or block in self.key_of:
            return
        self.by_key[key] = block
        self.key_of[block] = key

    def clear_cache(self):
        """Forget every key; blocks nobody holds become free."""
        for b in list(self.lru):
            self.free.append(b)
        self.lru.clear()
        self.by_key.clear()
        self.key_of.clear()
