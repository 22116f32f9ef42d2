"""stories260K from Python: the model file, its paged-cache engine, and KV shared through kvpalace.

What a user of examples/python would check: the model in the tree is the published file
(sha256); incremental decode from the paged cache gives the same float32 logits as recomputing
the whole sequence; engine blocks survive the trip through kvpalace's page layout unchanged; and
two processes — one prefills and commits whole pages, the other matches them and decodes on —
get logits identical to a full recompute, with the hit count equal to the pages stored.

The model-only tests need numpy alone; the two-process test needs the kvpalace package and a
daemon (started from $KVPALACED or build/daemon/kvpalaced), and is
skipped when `import kvpalace` fails. Without the package built, run
`/usr/bin/python3 -m pytest --noconftest tests/python/test_stories.py` (conftest.py imports it).
"""

import argparse
import os
import re
import shutil
import sys

import numpy as np
import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))

import engine  # noqa: E402
import kv_pages  # noqa: E402
import stories  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return stories.Model()


@pytest.fixture(scope="module")
def prompt(model):
    return stories.greedy_prompt(model, 90)


def test_model_file_is_the_published_one():
    assert os.path.getsize(stories.MODEL_PATH) == 1056540
    assert stories.file_sha256() == stories.MODEL_SHA256
    # ... and the sha256 the model's README gives.
    with open(os.path.join(stories.MODEL_DIR, "README.md")) as f:
        readme = f.read()
    assert re.search(r"sha256\s+`([0-9a-f]{64})`", readme).group(1) == stories.file_sha256()
    for name in ("LICENSE", "README.md"):
        assert os.path.exists(os.path.join(stories.MODEL_DIR, name))
    with open(os.path.join(stories.MODEL_DIR, "LICENSE")) as f:
        assert "MIT License" in f.read()


def test_header_and_rope_tables(model):
    c = model.config
    assert (c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads) == (64, 172, 5, 8, 4)
    assert (c.vocab_size, c.seq_len, c.head_size, c.shared_classifier) == (512, 512, 8, True)
    # The file's RoPE tables are the standard ones (theta 10000, adjacent pairs).
    j = np.arange(c.head_size // 2)
    ang = np.arange(c.seq_len)[:, None] / 10000.0 ** (2 * j / c.head_size)
    assert np.allclose(model.freq_cos, np.cos(ang), atol=1e-5)
    assert np.allclose(model.freq_sin, np.sin(ang), atol=1e-5)


def test_truncated_file_is_refused(tmp_path):
    bad = tmp_path / "short.bin"
    with open(stories.MODEL_PATH, "rb") as f:
        bad.write_bytes(f.read()[:-4])
    with pytest.raises(ValueError, match="bytes"):
        stories.Model(str(bad))


def test_greedy_prompt_is_the_models_own_text(model, prompt):
    assert prompt[0] == stories.BOS and len(prompt) == 90
    full = model.forward_full(prompt)
    assert list(np.argmax(full[:-1], axis=-1)) == prompt[1:]


@pytest.mark.parametrize("block_size", [16, 7])
def test_paged_incremental_decode_equals_full_recompute(model, prompt, block_size):
    # A small cache whose free list hands out blocks in a scrambled order, and another
    # sequence interleaved, so the block table is not the identity.
    cache = engine.PagedKVCache.for_model(model.config, block_size, num_blocks=64)
    cache._free = list(np.random.default_rng(1).permutation(64))
    other, sid = cache.new_seq(), cache.new_seq()
    seq = cache.seq(sid)
    cache.ensure(other, 20)
    logits = [model.forward(prompt[:37], 0, seq)]  # chunked prefill, then one by one
    model.forward(prompt[:5], 0, cache.seq(other))
    for p in range(37, len(prompt)):
        logits.append(model.forward(prompt[p : p + 1], p, seq))
    inc = np.concatenate(logits)
    full = model.forward_full(prompt)
    assert seq.block_table != sorted(seq.block_table)  # really paged, not contiguous
    assert inc.dtype == np.float32 and inc.shape == (len(prompt), 512)
    assert np.array_equal(inc, full)


def test_batched_reference_within_rounding(model, prompt):
    # BLAS blocks X @ W.T differently from row-by-row products: equal only to rounding.
    full = model.forward_full(prompt)
    batched = model.forward_batched(prompt)
    assert np.abs(batched - full).max() < 1e-4
    assert np.array_equal(batched.argmax(-1), full.argmax(-1))


def test_engine_to_pages_round_trip(model, prompt):
    c = model.config
    cache = engine.PagedKVCache.for_model(c, 16, num_blocks=32)
    cache._free = list(np.random.default_rng(2).permutation(32))
    sid = cache.new_seq()
    model.forward(prompt[:80], 0, cache.seq(sid))
    table = cache.block_tables[sid]
    pages = [np.full((c.n_layers, 2, c.n_kv_heads, 16, c.head_size), np.nan, np.float32)
             for _ in range(5)]
    kv_pages.engine_to_pages(cache.kv_caches, table[:5], pages)
    # The page layout: page[layer][k|v][head][token][dim] is position 16*i + token.
    k, v = cache.gather(sid, 3, 80)
    assert np.array_equal(pages[2][3, 0, 1, 5], k[2 * 16 + 5, 1])
    assert np.array_equal(pages[4][3, 1, 3, 15], v[79, 3])
    # Back into other blocks of a second engine: the same bytes, the same attention input.
    cache2 = engine.PagedKVCache.for_model(c, 16, num_blocks=32)
    sid2 = cache2.new_seq()
    table2 = cache2.ensure(sid2, 80)
    for p in pages:
        p.flags.writeable = False  # a lease's pages are read-only
    kv_pages.pages_to_engine(pages, cache2.kv_caches, table2[:5])
    for layer in range(c.n_layers):
        assert np.array_equal(cache2.kv_caches[layer][table2[:5]],
                              cache.kv_caches[layer][table[:5]])
    with pytest.raises(ValueError):
        kv_pages.engine_to_pages(cache.kv_caches, table[:4], pages)


def test_loaded_pages_then_rest_equals_full_recompute(model, prompt):
    # Process B's path without a daemon: pages from one engine, the rest computed in another.
    c = model.config
    a = engine.PagedKVCache.for_model(c, 16)
    sa = a.new_seq()
    model.forward(prompt, 0, a.seq(sa))
    pages = [np.empty((c.n_layers, 2, c.n_kv_heads, 16, c.head_size), np.float32)
             for _ in range(len(prompt) // 16)]
    kv_pages.engine_to_pages(a.kv_caches, a.block_tables[sa][: len(pages)], pages)
    b = engine.PagedKVCache.for_model(c, 16)
    b.new_seq()  # a busy engine: B's sequence does not start at block 0
    sb = b.new_seq()
    use = len(pages) * 16
    table = b.ensure(sb, use)
    kv_pages.pages_to_engine(pages, b.kv_caches, table)
    rest = model.forward(prompt[use:], use, b.seq(sb))
    assert np.array_equal(rest, model.forward_full(prompt)[use:])


# ---- the two-process end to end, against a real kvpalaced ----

def _kvpalaced():
    for cand in (os.environ.get("KVPALACED"), os.path.join(ROOT, "build", "daemon", "kvpalaced")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return shutil.which("kvpalaced")


@pytest.fixture
def daemon_socket(request):
    """A kvpalaced of this test's own ($KVPALACED, as conftest.py's, or build/'s).

    Not conftest.py's session daemon: the other tests leave a pool each there and the daemon's
    per-user pool limit would refuse ours depending on test order.
    """
    pytest.importorskip("kvpalace")
    binary = _kvpalaced()
    if not binary:
        pytest.skip("no kvpalaced binary (set KVPALACED or build into build/)")
    import demo

    proc, sock, tmp = demo.start_daemon(binary)

    def stop():
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)

    request.addfinalizer(stop)
    return sock


def test_two_processes_share_prompt_kv_with_identical_logits(daemon_socket):
    pytest.importorskip("kvpalace")
    import demo

    args = argparse.Namespace(
        socket=daemon_socket, daemon=None, prompt_tokens=200, decode=24, block_tokens=16)
    prompt, a, b = demo.run_demo(args)
    assert a["pid"] != b["pid"] and a["pid"] != os.getpid()
    assert a["stored_pages"] == 12 and a["stored_tokens"] == 192
    assert b["looked_up"] == a["stored_tokens"]  # every page A stored, no more
    assert b["hit_tokens"] == 192 and b["computed_tokens"] == 8
    assert b["logits_checked"] == [8 + 24, 512]
    assert b["identical"], f"max abs diff {b['max_abs_diff']}"
    # A second reader of a prompt that shares only its first 100 tokens hits 6 pages.
    other = prompt[:100] + [(t + 1) % 512 for t in prompt[100:]]
    b2 = demo.child("B", args, other)
    assert b2["looked_up"] == 96 and b2["hit_tokens"] == 96 and b2["identical"]


def test_adapters_match_the_numpy_reference(daemon_socket, model, prompt):
    """The C adapters (Session.from_engine, Lease.to_engine) against kv_pages.py on the model's
    real KV, blocks scattered: the same page bytes, the same engine blocks back."""
    kvpalace = pytest.importorskip("kvpalace")
    import demo

    c = model.config
    cache = engine.PagedKVCache.for_model(c, 16, num_blocks=32)
    cache._free = list(np.random.default_rng(5).permutation(32))
    sid = cache.new_seq()
    model.forward(prompt[:80], 0, cache.seq(sid))
    table = cache.block_tables[sid][:5]
    ref = [np.empty((c.n_layers, 2, c.n_kv_heads, 16, c.head_size), np.float32) for _ in range(5)]
    kv_pages.engine_to_pages(cache.kv_caches, table, ref)
    with kvpalace.Client(daemon_socket) as cl:
        with cl.open_pool("stories-adapters", demo.layout_for(kvpalace, c, 16)) as pool:
            with pool.session() as s:
                s.append(prompt[:80])
                s.from_engine(demo.engine_cache(kvpalace, cache), table)
                for i in range(5):
                    assert s.page(i).array().tobytes() == ref[i].tobytes()
                s.commit()
            back = engine.PagedKVCache.for_model(c, 16, num_blocks=32)
            table2 = back.ensure(back.new_seq(), 80)
            with pool.match(prompt[:80]) as lease:
                assert lease.tokens == 80
                lease.to_engine(demo.engine_cache(kvpalace, back), table2)
    want = engine.PagedKVCache.for_model(c, 16, num_blocks=32)
    kv_pages.pages_to_engine(ref, want.kv_caches, table2)
    for layer in range(c.n_layers):
        assert np.array_equal(back.kv_caches[layer], want.kv_caches[layer])
