"""A stand-in for the parts of SGLang that call a HiCache storage backend,
for tests/python/test_sglang_backend.py and bench/sglang_backend_bench.py
(SGLang itself cannot be installed here). Modelled on sgl-project/sglang
at commit 001067fffe33427bee0ed2f007fb7551a1d76b44 (managers/
cache_controller.py: HiCacheController's prefetch path
_storage_hit_query -> batch_exists, _page_transfer -> batch_get_v1 or
batch_get + set_from_flat_data_page; its write-back path _page_backup ->
batch_set_v1 or batch_set of get_data_page; STORAGE_BATCH_SIZE pages a
call) and 0047d999bb3a3ad311df5a4b6356bfb5586e0d66 (mem_cache/pool_host/
mha.py, mla.py: the host buffers' shapes per layout, get_data_page,
get_dummy_flat_data_page, set_from_flat_data_page). Written from reading
them, not copied."""

import hashlib
from dataclasses import dataclass
from typing import Optional

import torch

STORAGE_BATCH_SIZE = 128


@dataclass
class StorageConfig:
    """HiCacheStorageConfig's fields (hicache_storage.py)."""
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    is_mla_model: bool = False
    enable_storage_metrics: bool = False
    is_page_first_layout: bool = False
    model_name: Optional[str] = None
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


def storage_config(**kw):
    """SGLang's HiCacheStorageConfig when SGLang imports, else ours."""
    try:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    except ImportError:
        return StorageConfig(**kw)
    base = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
                model_name=None)
    base.update(kw)
    return HiCacheStorageConfig(**base)


def page_keys(tokens, page_size, prior=None):
    """Chained page keys: page i's is the SHA-256 (hex) of page i-1's key
    and page i's tokens, as SGLang's get_hash_str chains them."""
    keys = []
    prev = prior
    for i in range(0, len(tokens) - len(tokens) % page_size, page_size):
        h = hashlib.sha256()
        if prev is not None:
            h.update(bytes.fromhex(prev))
        h.update(torch.tensor(tokens[i:i + page_size], dtype=torch.int64).numpy().tobytes())
        prev = h.hexdigest()
        keys.append(prev)
    return keys


class HostPool:
    """SGLang's host KV pool (MHATokenToKVPoolHost / MLATokenToKVPoolHost):
    kv_buffer in the layout's shape, CPU torch tensor, page allocator."""

    def __init__(self, layout, n_pages, page_size, layer_num, head_num, head_dim,
                 dtype=torch.float16, mla=False):
        self.layout, self.page_size, self.dtype, self.mla = layout, page_size, dtype, mla
        self.layer_num, self.head_num, self.head_dim = layer_num, head_num, head_dim
        self.page_num, self.size = n_pages, n_pages * page_size
        L, S, P, ps, H, D = layer_num, self.size, n_pages, page_size, head_num, head_dim
        if mla:
            assert H == 1
            dims = {"layer_first": (L, S, 1, D), "page_first": (S, L, 1, D),
                    "page_first_direct": (P, L, ps, 1, D)}[layout]
        else:
            dims = {"layer_first": (2, L, S, H, D), "page_first": (2, S, L, H, D),
                    "page_first_direct": (2, P, L, ps, H, D),
                    "page_head": (2, P, H, ps, L, D)}[layout]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)
        self.free_pages = list(range(n_pages))

    @property
    def k_buffer(self):
        return self.kv_buffer if self.mla else self.kv_buffer[0]

    @property
    def v_buffer(self):
        return self.kv_buffer[1]

    def alloc(self, n_tokens):
        n = n_tokens // self.page_size
        if n > len(self.free_pages):
            return None
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return torch.tensor([p * self.page_size + t for p in pages for t in range(self.page_size)],
                            dtype=torch.int64)

    def free(self, indices):
        self.free_pages += sorted({int(i) // self.page_size for i in indices.tolist()})

    def _page(self, index):
        ps = self.page_size
        if self.mla:
            if self.layout == "layer_first":
                return self.kv_buffer[:, index:index + ps]
            if self.layout == "page_first":
                return self.kv_buffer[index:index + ps]
            return self.kv_buffer[index // ps:index // ps + 1]
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, index:index + ps]
        if self.layout == "page_first":
            return self.kv_buffer[:, index:index + ps]
        return self.kv_buffer[:, index // ps:index // ps + 1]

    def get_data_page(self, index, flat=True):
        p = self._page(int(index))
        return p.flatten() if flat else p

    def get_dummy_flat_data_page(self):
        n = self.layer_num * self.page_size * self.head_num * self.head_dim
        return torch.zeros(n if self.mla else 2 * n, dtype=self.dtype)

    def set_from_flat_data_page(self, index, data_page):
        p = self._page(int(index))
        p[...] = data_page.reshape(p.shape)

    def token_kv(self, index):
        """Token slot index's K and V of every layer, [L, 2, H, D] (MLA:
        [L, 1, D]): what the engine would read, whatever the layout."""
        ps = self.page_size
        b = self.kv_buffer
        if self.mla:
            if self.layout == "layer_first":
                return b[:, index].clone()
            if self.layout == "page_first":
                return b[index].clone()
            return b[index // ps, :, index % ps].clone()
        if self.layout == "layer_first":
            return b[:, :, index].transpose(0, 1).clone()
        if self.layout == "page_first":
            return b[:, index].transpose(0, 1).clone()
        if self.layout == "page_first_direct":
            return b[:, index // ps, :, index % ps].transpose(0, 1).clone()
        return b[:, index // ps, :, index % ps].permute(2, 0, 1, 3).clone()  # page_head

    def fill(self, indices, seed):
        """Random KV into token slots indices (the engine computing them)."""
        g = torch.Generator().manual_seed(seed)
        for i in indices.tolist():
            kv = torch.randn(self.token_kv(0).shape, generator=g).to(self.dtype)
            self._set_token(i, kv)

    def _set_token(self, index, kv):
        ps = self.page_size
        b = self.kv_buffer
        if self.mla:
            if self.layout == "layer_first":
                b[:, index] = kv
            elif self.layout == "page_first":
                b[index] = kv
            else:
                b[index // ps, :, index % ps] = kv
        elif self.layout == "layer_first":
            b[:, :, index] = kv.transpose(0, 1)
        elif self.layout == "page_first":
            b[:, index] = kv.transpose(0, 1)
        elif self.layout == "page_first_direct":
            b[:, index // ps, :, index % ps] = kv.transpose(0, 1)
        else:
            b[:, index // ps, :, index % ps] = kv.permute(1, 2, 0, 3)

    def tokens_kv(self, indices):
        return torch.stack([self.token_kv(i) for i in indices.tolist()])


class Controller:
    """HiCacheController's storage calls, in its order, on one rank."""

    def __init__(self, backend, host, zero_copy=True):
        self.backend, self.host, self.zero_copy = backend, host, zero_copy
        self.page_size = host.page_size
        backend.register_mem_pool_host(host)

    def hit_query(self, keys):
        """_storage_hit_query: batch_exists STORAGE_BATCH_SIZE keys at a
        time until a batch is short; the keys of the leading hits."""
        hits = []
        for start in range(0, len(keys), STORAGE_BATCH_SIZE):
            batch = keys[start:start + STORAGE_BATCH_SIZE]
            n = self.backend.batch_exists(batch, None)
            hits += batch[:n]
            if n < len(batch):
                break
        return hits

    def page_get(self, keys, host_indices):
        """_page_get_zero_copy / _generic_page_get: the leading run loaded."""
        ps = self.page_size
        if self.zero_copy:
            res = self.backend.batch_get_v1(keys, host_indices, None)
            n = 0
            while n < len(keys) and res[n]:
                n += 1
            return n
        dummies = [self.host.get_dummy_flat_data_page() for _ in keys]
        data = self.backend.batch_get(keys, dummies)
        n = 0
        for i in range(len(keys)):
            if data[i] is None:
                break
            self.host.set_from_flat_data_page(host_indices[i * ps], data[i])
            n += 1
        return n

    def prefetch(self, keys, exists_first=True):
        """A prefetch: the hit query, host slots for the hits, the page
        transfer batch by batch until one comes back short. Returns
        (pages loaded, their host indices)."""
        hits = self.hit_query(keys) if exists_first else list(keys)
        if not hits:
            return 0, None
        host_indices = self.host.alloc(len(hits) * self.page_size)
        done = 0
        ps = self.page_size
        for start in range(0, len(hits), STORAGE_BATCH_SIZE):
            batch = hits[start:start + STORAGE_BATCH_SIZE]
            n = self.page_get(batch, host_indices[start * ps:(start + len(batch)) * ps])
            done += n
            if n < len(batch):
                break
        return done, host_indices

    def page_set(self, keys, host_indices):
        ps = self.page_size
        if self.zero_copy:
            return all(self.backend.batch_set_v1(keys, host_indices, None))
        data = [self.host.get_data_page(host_indices[i * ps]) for i in range(len(keys))]
        return self.backend.batch_set(keys, data)

    def write_back(self, keys, host_indices):
        """_page_backup: batch by batch, stopping at a failed one. Returns
        the tokens backed up."""
        ps = self.page_size
        done = 0
        for start in range(0, len(keys), STORAGE_BATCH_SIZE):
            batch = keys[start:start + STORAGE_BATCH_SIZE]
            if not self.page_set(batch, host_indices[start * ps:(start + len(batch)) * ps]):
                break
            done += len(batch) * ps
        return done
