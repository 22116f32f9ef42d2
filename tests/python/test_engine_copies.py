"""What an engine connector does through the package, against a real
kvpalaced: pages copied to and from an engine's paged cache
(kvpalace.EngineCache, Session.from_engine, Lease.to_engine) in the
engines' own layouts, the keys of a request (extra key, key spans), and
submitted lookups and prefetches collected by Client.complete()."""

import os
import select
import time

import numpy as np
import pytest
import torch

import kvpalace
from conftest import LAYOUT

L, H, BS, D = 2, 2, 16, 32  # conftest's LAYOUT


def tokens(base, n):
    return np.arange(base, base + n, dtype=np.uint32)


def reference_k(kind, layer_tensors, block, t, h, kv=0):
    """Row (block, token t, head h) of K (kv 0) or V of one layer tensor, by
    the engine's documented layout (independent of the C strides)."""
    k, v = layer_tensors
    if kind == "flash_attn":
        return (k[kv] if v is None else (k, v)[kv])[block, t, h]
    if kind == "flashinfer_nhd":
        return k[block, kv, t, h]
    if kind == "flashinfer_hnd":
        return k[block, kv, h, t]
    return (k, v)[kv][block * BS + t, h]


def make_cache(kind, num_blocks, split=False, lib="numpy", fill=None):
    shape = {
        "flash_attn": (num_blocks, BS, H, D) if split else (2, num_blocks, BS, H, D),
        "flashinfer_nhd": (num_blocks, 2, BS, H, D),
        "flashinfer_hnd": (num_blocks, 2, H, BS, D),
        "sglang": (num_blocks * BS, H, D),
    }[kind]
    two = split or kind == "sglang"
    rng = np.random.default_rng(len(kind) * 7 + num_blocks)

    def tensor():
        a = rng.standard_normal(shape).astype(np.float16) if fill is None else np.full(
            shape, fill, np.float16)
        return torch.from_numpy(a) if lib == "torch" else a

    k = [tensor() for _ in range(L)]
    v = [tensor() for _ in range(L)] if two else None
    cache = kvpalace.EngineCache(kind, k, v, block_size=BS if kind == "sglang" else None)
    return cache, k, v


def as_np(x):
    return x.numpy() if isinstance(x, torch.Tensor) else x


@pytest.mark.parametrize("kind,split", [("flash_attn", False), ("flash_attn", True),
                                        ("flashinfer_nhd", False), ("flashinfer_hnd", False),
                                        ("sglang", False)])
def test_round_trip_through_another_process_layout(client, pool, kind, split):
    """An engine's blocks 5, 2, 7 saved into pages, matched, and loaded into
    blocks 0, 3, 1 of another engine cache in FlashInfer HND: every row
    where the layouts say, nothing else written."""
    src, sk, sv = make_cache(kind, 8, split, lib="torch")
    assert (src.num_blocks, src.block_size, src.n_heads, src.head_dim) == (8, BS, H, D)
    t = tokens(100, 3 * BS)
    with pool.session() as s:
        s.append(t)
        s.from_engine(src, [5, 2, 7])
        # The page holds exactly the engine's rows.
        page = s.page(1).array()
        for layer in range(L):
            for h in range(H):
                for tt in (0, 9, BS - 1):
                    want = reference_k(kind, (as_np(sk[layer]), sv and as_np(sv[layer])), 2, tt, h,
                                       1)
                    assert page[layer, 1, h, tt].tobytes() == want.tobytes()
        del page
        s.commit()
    dst, dk, _ = make_cache("flashinfer_hnd", 4, fill=-1.0)
    with pool.match(t) as lease:
        assert lease.tokens == 3 * BS
        lease.to_engine(dst, [0, 3, 1])
    for (sb, db) in ((5, 0), (2, 3), (7, 1)):
        for layer in range(L):
            for kv in (0, 1):
                for h in range(H):
                    for tt in range(BS):
                        got = dk[layer][db, kv, h, tt]
                        want = reference_k(kind, (as_np(sk[layer]), sv and as_np(sv[layer])), sb,
                                           tt, h, kv)
                        assert got.tobytes() == want.tobytes()
    assert (dk[0][2] == -1.0).all(), "block 2 was not in the list and must be untouched"


def test_partial_last_page_and_committed_pages(pool):
    src, sk, _ = make_cache("flashinfer_nhd", 4)
    with pool.session() as s:
        s.append(tokens(500, 40))  # pages of 16, 16, 8 tokens
        s.from_engine(src, [0, 1, 2])
        dst, dk, _ = make_cache("flashinfer_nhd", 4, fill=3.0)
        s.to_engine(dst, [3, 2, 1])
        assert dk[1][1, 0, :8].tobytes() == sk[1][2, 0, :8].tobytes()
        assert (dk[1][1, :, 8:] == 3.0).all(), "past the last page's 8 tokens: untouched"
        assert dk[0][3].tobytes() == sk[0][0].tobytes()
        s.commit(32)
        with pytest.raises(kvpalace.Busy, match="committed"):
            s.from_engine(src, [0], first_page=1)
        s.from_engine(src, [3], first_page=2)  # past what is committed
        with pytest.raises(kvpalace.Error) as e:
            s.from_engine(src, [0], first_page=3)  # no such page
        assert e.value.errno == 34  # ERANGE


def test_layer_and_head_ranges(pool):
    """A tensor-parallel rank holding head 1 of the pool's 2, layer by layer
    as an engine saves while its forward pass runs."""
    t = tokens(900, BS)
    full, fk, _ = make_cache("flash_attn", 2)
    with pool.session() as s:
        s.append(t)
        s.from_engine(full, [1])
        s.commit()
    rank = kvpalace.EngineCache("flash_attn", [np.zeros((2, 2, BS, 1, D), np.float16)
                                                for _ in range(L)])
    with pool.match(t) as lease:
        for layer in range(L):
            lease.to_engine(rank, [0], layers=(layer, 1), heads=(1, 1),
                            engine_layer_first=layer)
        with pytest.raises(kvpalace.Error) as e:
            lease.to_engine(rank, [0], heads=(1, 2))  # past the pool's heads
        assert e.value.errno == 34
    for layer in range(L):
        assert rank._k[layer][:, 0, :, 0].tobytes() == fk[layer][:, 1, :, 1].tobytes()


def test_engine_cache_refusals(pool):
    with pytest.raises(ValueError, match="kind"):
        kvpalace.EngineCache("paged", [np.zeros((2, 2, BS, H, D), np.float16)])
    with pytest.raises(ValueError, match="shape"):
        kvpalace.EngineCache("flash_attn", [np.zeros((3, 2, BS, H, D), np.float16)])
    with pytest.raises(ValueError, match="v_layers"):
        kvpalace.EngineCache("sglang", [np.zeros((32, H, D), np.float16)], block_size=BS)
    with pytest.raises(ValueError, match="contiguous"):
        kvpalace.EngineCache("flash_attn", [np.zeros((2, 2, BS, H, 2 * D), np.float16)[..., ::2]])
    ro = np.zeros((2, 2, BS, H, D), np.float16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kvpalace.EngineCache("flash_attn", [ro])
    t = tokens(1300, BS)
    with pool.session() as s:
        s.append(t)
        # bf16 tensors: same size as the pool's f16, other numbers.
        bf = kvpalace.EngineCache("flash_attn",
                                  [torch.zeros((2, 2, BS, H, D), dtype=torch.bfloat16)] * L)
        with pytest.raises(TypeError, match="bf16"):
            s.from_engine(bf, [0])
        bad = kvpalace.EngineCache("flash_attn", [np.zeros((2, 2, BS, H, D + 1), np.float16)] * L)
        with pytest.raises(kvpalace.Error, match="layout"):
            s.from_engine(bad, [0])
        ok, k, _ = make_cache("flash_attn", 2, lib="torch")
        with pytest.raises(kvpalace.Error) as e:
            s.from_engine(ok, [2])  # block 2 of 2
        assert e.value.errno == 34
        with pytest.raises(ValueError):
            s.from_engine(ok, [-1])
        k[1].resize_(1)  # a tensor resized in place since: refused, not written through
        with pytest.raises(ValueError, match="resized"):
            s.from_engine(ok, [0])


def commit_pages(pool, t, **session_kw):
    key_spans = session_kw.pop("key_spans", None)
    with pool.session(**session_kw) as s:
        s.append(t, key_spans=key_spans)
        for i in range(len(t) // BS):
            s.page(i).array()[...] = i + 1
        s.commit()


def test_extra_keys_and_spans(pool):
    t = tokens(2000, 4 * BS)
    commit_pages(pool, t, extra_key=b"lora-7")
    assert pool.lookup(t) == 0
    assert pool.lookup(t, extra_key=b"lora-7") == 4 * BS
    assert pool.lookup_batch([t, t], extra_keys=[None, b"lora-7"]) == [(0, 0),
                                                                     (4 * BS, 4 * BS)]
    with pool.match(t, extra_key=b"lora-7") as lease:
        assert lease.tokens == 4 * BS
    with pool.match(t, extra_key=b"lora-8") as lease:
        assert lease.tokens == 0
    # An image behind placeholder tokens 20..35: pages 1 and 2 carry its key.
    u = tokens(3000, 4 * BS)
    commit_pages(pool, u, key_spans=[(20, 16, b"image-A")])
    assert pool.lookup(u, key_spans=[(20, 16, b"image-A")]) == 4 * BS
    assert pool.lookup(u, key_spans=[(20, 16, b"image-B")]) == BS, "page 0 has no image"
    assert pool.lookup(u) == BS
    assert pool.lookup_batch([u, u, u], key_spans=[[(20, 16, b"image-A")], None, []]) == [
        (4 * BS, 4 * BS), (BS, BS), (BS, BS)]
    with pytest.raises(ValueError, match="1..64"):
        pool.lookup(u, extra_key=b"")
    with pytest.raises(ValueError, match="1..64"):
        pool.match(u, extra_key=bytes(65))
    with pytest.raises(TypeError):
        pool.lookup(u, key_spans=[(20, 16)])
    with pytest.raises(kvpalace.Error, match="overlap"):
        with pool.session() as s:
            s.append(u, key_spans=[(0, 4, b"a"), (2, 4, b"b")])


def collect(client, n):
    """n completions, by handle, within 30 s (a lost one fails, never hangs)."""
    done, deadline = {}, time.monotonic() + 30
    while len(done) < n:
        assert time.monotonic() < deadline, f"{len(done)} of {n} completed in 30 s"
        r, _, _ = select.select([client.fileno()], [], [], 1)
        done.update(client.complete())
    return done


def test_submitted_lookups_and_prefetches(client, pool):
    t = tokens(4000, 3 * BS)
    commit_pages(pool, t)
    assert client.in_flight == 0
    assert client.complete() == []
    h1 = pool.lookup_submit([t, t[:BS + 3], tokens(9, BS)])
    h2 = pool.prefetch_submit(t)
    assert h1 != h2 and client.in_flight == 2
    r, _, _ = select.select([client.fileno()], [], [], 10)
    assert r, "the socket did not poll readable"
    got = collect(client, 2)
    assert got[h1] == [(3 * BS, 3 * BS), (BS, BS), (0, 0)]
    assert got[h2] == 0  # nothing on disk to bring in
    assert client.in_flight == 0
    # At most 16 in flight; the 17th is refused, and an error completes as one.
    hs = [pool.lookup_submit([t]) for _ in range(16)]
    with pytest.raises(kvpalace.Error) as e:
        pool.lookup_submit([t])
    assert e.value.errno == 11  # EAGAIN
    done = collect(client, 16)
    assert sorted(done) == sorted(hs) and all(r == [(3 * BS, 3 * BS)] for r in done.values())
    # 70 prompts: two requests, the second sent from complete().
    h = pool.lookup_submit([t] * 69 + [t[:BS]])
    assert collect(client, 1)[h] == [(3 * BS, 3 * BS)] * 69 + [(BS, BS)]
    # A blocking call made meanwhile keeps the submitted reply for complete().
    h = pool.lookup_submit([t])
    assert pool.lookup(t) == 3 * BS
    assert client.complete(timeout=10) == [(h, [(3 * BS, 3 * BS)])]


def test_closing_a_pool_drops_its_operations(client):
    p = client.open_pool("py-async-drop-%d" % os.getpid(), LAYOUT)
    for _ in range(16):
        p.lookup_submit([tokens(1, BS)])
    p.close()
    assert client.in_flight == 0
    assert client.complete(timeout=0.2) == []
    with client.open_pool("py-async-drop2-%d" % os.getpid(), LAYOUT) as q:
        hs = [q.lookup_submit([tokens(1, BS)]) for _ in range(16)]  # the slots came back
        assert sorted(collect(client, 16)) == sorted(hs)


def test_dropping_a_pool_with_operations_in_flight(client):
    """A pool object dropped unclosed: its operations go with it, nothing
    leaks into the client's 16 slots, and the client goes on."""
    p = client.open_pool("py-async-del-%d" % os.getpid(), LAYOUT)
    for _ in range(16):
        p.lookup_submit([tokens(i, BS) for i in range(70)])  # two requests' worth each
    del p
    assert client.in_flight == 0 and client.complete() == []
    with client.open_pool("py-async-del2-%d" % os.getpid(), LAYOUT) as q:
        hs = [q.lookup_submit([tokens(1, BS)]) for _ in range(16)]
        assert sorted(collect(client, 16)) == sorted(hs)


def test_strided_views_copy_as_their_named_layout(pool):
    """Kind "strided": HND blocks given as permuted [num_blocks, bs, H, D] views of K and V
    land exactly where the named "flashinfer_hnd" kind puts them; views whose rows overlap
    are refused."""
    src, sk, _ = make_cache("flashinfer_nhd", 4)
    t = tokens(5000, 2 * BS)
    with pool.session() as s:
        s.append(t)
        s.from_engine(src, [3, 1])
        s.commit()
    named, nk, _ = make_cache("flashinfer_hnd", 4, lib="torch", fill=0.0)
    base = [torch.zeros(4, 2, H, BS, D, dtype=torch.float16) for _ in range(L)]
    views = kvpalace.EngineCache("strided", [b[:, 0].permute(0, 2, 1, 3) for b in base],
                                 [b[:, 1].permute(0, 2, 1, 3) for b in base])
    assert (views.num_blocks, views.block_size, views.n_heads) == (4, BS, H)
    with pool.match(t) as lease:
        lease.to_engine(named, [2, 0])
        lease.to_engine(views, [2, 0])
        for layer in range(L):
            assert torch.equal(base[layer], nk[layer])
        assert base[1][2, 1, 0, 5].numpy().tobytes() == sk[1][3, 1, 5, 0].tobytes()
        # Rows that overlap: a token stride of 0.
        flat = torch.zeros(4, 1, H, D, dtype=torch.float16)
        bad = kvpalace.EngineCache("strided", [flat.expand(4, BS, H, D)] * L,
                                   [flat.expand(4, BS, H, D)] * L)
        with pytest.raises(kvpalace.Error):
            lease.to_engine(bad, [0])
    with pytest.raises(ValueError, match="v_layers"):
        kvpalace.EngineCache("strided", [base[0][:, 0].permute(0, 2, 1, 3)])


def test_latent_and_raw_fp8_pools(client):
    """An MLA cache ([num_blocks, block_size, D] per layer, one plane) into a latent pool and
    back into another engine's blocks; an engine's own fp8 bytes (uint8 tensors) through a
    raw-fp8 pool unchanged; a latent cache never copies into a K/V pool (it has no V)."""
    lat = kvpalace.Layout(L, 1, 64, BS, "bf16", format="latent")
    t = tokens(6000, 2 * BS)
    rng = np.random.default_rng(9)
    src = [torch.from_numpy(rng.integers(0, 1 << 16, (4, BS, 64), dtype=np.uint16).view(
        np.int16)).view(torch.bfloat16) for _ in range(L)]
    with client.open_pool("py-latent-%d" % os.getpid(), lat) as p:
        with p.session() as s:
            s.append(t)
            s.from_engine(kvpalace.EngineCache("latent", src), [3, 0])
            assert s.page(0).array().shape == (L, BS, 64)
            s.commit()
        dst = [torch.zeros(4, BS, 64, dtype=torch.bfloat16) for _ in range(L)]
        with p.match(t) as lease:
            lease.to_engine(kvpalace.EngineCache("latent", dst), [1, 2])
        bits = [(d.view(torch.int16), s_.view(torch.int16)) for d, s_ in zip(dst, src)]
        for d, s_ in bits:  # random bits hold NaNs: compare bits
            assert torch.equal(d[1], s_[3]) and torch.equal(d[2], s_[0])
            assert not d[0].any() and not d[3].any()
    raw = kvpalace.Layout(L, H, D, BS, "e4m3-raw")
    kv8 = [torch.from_numpy(rng.integers(0, 256, (2, 3, BS, H, D), dtype=np.uint8))
           for _ in range(L)]
    with client.open_pool("py-raw8-%d" % os.getpid(), raw) as p:
        with p.session() as s:
            s.append(t)
            s.from_engine(kvpalace.EngineCache("flash_attn", kv8), [2, 1])
            s.commit()
        back = [torch.zeros(2, 3, BS, H, D, dtype=torch.uint8) for _ in range(L)]
        with p.match(t) as lease:
            lease.to_engine(kvpalace.EngineCache("flash_attn", back), [0, 1])
        for layer in range(L):
            assert torch.equal(back[layer][:, 0], kv8[layer][:, 2])
            assert torch.equal(back[layer][:, 1], kv8[layer][:, 1])
    with client.open_pool("py-kv-%d" % os.getpid(), LAYOUT) as p, p.session() as s:
        s.append(t)
        with pytest.raises(TypeError, match="latent"):
            s.from_engine(kvpalace.EngineCache("latent", [torch.zeros(4, BS, D,
                                                                      dtype=torch.float16)] * L),
                          [0])
