"""A paged KV cache the way vLLM/FlashInfer engines keep one, in numpy.

Per layer one array in FlashInfer's NHD layout, `[num_blocks, 2, block_size, n_kv_heads,
head_dim]` (index 1: 0 = K, 1 = V), shared by every sequence; each sequence owns a block table,
the list of block ids that hold its positions in order (position p lives in block
table[p // block_size], slot p % block_size). Attention reads a sequence's K/V by gathering its
blocks by block table (`gather`), as a paged-attention kernel does.

`SeqKV` binds one sequence to the `kv` interface stories.Model.forward expects (write the new
positions, read positions 0..t-1). Blocks come from a free list; `free` returns a sequence's.
Single-threaded.
"""

import numpy as np


class PagedKVCache:
    def __init__(self, n_layers, n_kv_heads, head_dim, block_size=16, num_blocks=256,
                 dtype=np.float32):
        self.n_layers = n_layers
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.num_blocks = num_blocks
        # kv_caches[layer]: [num_blocks, 2, block_size, n_kv_heads, head_dim]
        self.kv_caches = [
            np.zeros((num_blocks, 2, block_size, n_kv_heads, head_dim), dtype)
            for _ in range(n_layers)
        ]
        self._free = list(range(num_blocks - 1, -1, -1))
        self.block_tables = {}  # seq id -> list of block ids
        self._next_seq = 0

    @classmethod
    def for_model(cls, config, block_size=16, num_blocks=256):
        return cls(config.n_layers, config.n_kv_heads, config.head_size, block_size, num_blocks)

    def new_seq(self):
        sid = self._next_seq
        self._next_seq += 1
        self.block_tables[sid] = []
        return sid

    def ensure(self, sid, n_tokens):
        """Give sequence `sid` blocks for positions 0..n_tokens-1; returns its block table."""
        table = self.block_tables[sid]
        need = -(-n_tokens // self.block_size)
        if need - len(table) > len(self._free):
            raise MemoryError(f"paged cache full: {len(self._free)} free blocks")
        while len(table) < need:
            table.append(self._free.pop())
        return table

    def free(self, sid):
        self._free.extend(reversed(self.block_tables.pop(sid)))

    def write(self, sid, layer, start, k, v):
        """Store k, v [n, n_kv_heads, head_dim] at positions start..start+n-1 of `sid`."""
        table = self.ensure(sid, start + len(k))
        cache = self.kv_caches[layer]
        bs = self.block_size
        for i in range(len(k)):
            b, s = divmod(start + i, bs)
            cache[table[b], 0, s] = k[i]
            cache[table[b], 1, s] = v[i]

    def gather(self, sid, layer, t):
        """K, V [t, n_kv_heads, head_dim] of positions 0..t-1, gathered by block table."""
        bs = self.block_size
        nb = -(-t // bs)
        table = np.asarray(self.block_tables[sid][:nb], np.int64)
        if len(table) < nb:
            raise IndexError(f"sequence {sid} has {len(table) * bs} positions, {t} asked")
        blocks = self.kv_caches[layer][table]  # [nb, 2, bs, h, d], a copy
        k = blocks[:, 0].reshape(nb * bs, self.n_kv_heads, self.head_dim)[:t]
        v = blocks[:, 1].reshape(nb * bs, self.n_kv_heads, self.head_dim)[:t]
        return k, v

    def seq(self, sid):
        return SeqKV(self, sid)


class SeqKV:
    """One sequence of a PagedKVCache as the `kv` argument of stories.Model.forward."""

    def __init__(self, cache, sid):
        self.cache = cache
        self.sid = sid

    def write(self, layer, start, k, v):
        self.cache.write(self.sid, layer, start, k, v)

    def read(self, layer, t):
        return self.cache.gather(self.sid, layer, t)

    @property
    def block_table(self):
        return self.cache.block_tables[self.sid]
