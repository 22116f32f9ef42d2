"""Engine blocks <-> kvpalace pages: the one place the two KV layouts meet.

The engine (engine.py, as vLLM/FlashInfer NHD) keeps per layer
`[num_blocks, 2, block_size, n_kv_heads, head_dim]`; a kvpalace page is
`[n_layers, 2, n_kv_heads, block_tokens, head_dim]` (shm/layout.h: layer, K|V, head, token,
dim). With block_size == block_tokens one engine block of every layer is one page, and the
conversion is a transpose of the token and head axes per layer.

demo.py copies through the package instead (Session.from_engine, Lease.to_engine: the C
layout adapters kvp_engine_to_pages / kvp_pages_to_engine, one call per list of blocks); these
two functions, pure numpy and exact (a copy, no arithmetic), are the independent reference the
tests hold the adapters to, and what an engine without the package built would use.
"""


def engine_to_pages(kv_caches, block_ids, pages):
    """Copy engine blocks into kvpalace pages.

    kv_caches: per layer [num_blocks, 2, block_size, n_kv_heads, head_dim];
    block_ids: the engine block behind each page (a block-table slice), len(pages) of them;
    pages: writable arrays [n_layers, 2, n_kv_heads, block_tokens, head_dim].
    """
    if len(block_ids) != len(pages):
        raise ValueError(f"{len(block_ids)} blocks for {len(pages)} pages")
    for page, b in zip(pages, block_ids):
        if page.shape[0] != len(kv_caches):
            raise ValueError(f"page of {page.shape[0]} layers, engine has {len(kv_caches)}")
        for layer, cache in enumerate(kv_caches):
            page[layer] = cache[b].transpose(0, 2, 1, 3)  # [2, bs, h, d] -> [2, h, bs, d]


def pages_to_engine(pages, kv_caches, block_ids):
    """Copy kvpalace pages (read-only arrays are fine) into engine blocks; the inverse."""
    if len(block_ids) != len(pages):
        raise ValueError(f"{len(pages)} pages for {len(block_ids)} blocks")
    for page, b in zip(pages, block_ids):
        if page.shape[0] != len(kv_caches):
            raise ValueError(f"page of {page.shape[0]} layers, engine has {len(kv_caches)}")
        for layer, cache in enumerate(kv_caches):
            cache[b] = page[layer].transpose(0, 2, 1, 3)  # [2, h, bs, d] -> [2, bs, h, d]
