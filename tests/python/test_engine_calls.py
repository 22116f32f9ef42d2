"""The engine-facing calls of the package against a real kvpalaced: a
match handed from one process to another (Pool.adopt), block tables, the
arena, and tensor-parallel pools."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kvpalace
from conftest import LAYOUT


def kv(page, seed):
    rng = np.random.default_rng(seed * 1000 + page)
    return rng.standard_normal((2, 2, 2, 16, 32)).astype(np.float16)


def commit(pool, tokens, seed):
    with pool.session() as s:
        s.append(tokens)
        for i in range((len(tokens) + 15) // 16):
            s.page(i).array()[...] = kv(i, seed)
        s.commit()


WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import kvpalace
    sock, model, lease_id, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    layout = kvpalace.Layout(2, 2, 32, 16, "f16")
    with kvpalace.Client(sock) as c, c.open_pool(model, layout) as pool:
        with pool.adopt(lease_id) as lease:
            n = lease.tokens // 16
            np.save(out, np.stack([lease.page(i).array() for i in range(n)]))
            print(lease.tokens, lease.id != lease_id)
        try:
            pool.adopt(lease_id + 999)
        except kvpalace.NotFound as e:
            print("notfound", e.errno)
""")


def test_adopt_in_another_process(daemon, client, tmp_path):
    model = "py-adopt-%d" % os.getpid()
    tokens = np.arange(7000, 7050, dtype=np.uint32)  # 3 whole pages
    with client.open_pool(model, LAYOUT) as pool:
        commit(pool, tokens, 3)
        with pool.match(tokens) as lease:
            assert lease.tokens == 48 and lease.id > 0
            lease_id = lease.id
            out = str(tmp_path / "adopted.npy")
            r = subprocess.run(
                [sys.executable, "-c", WORKER, daemon.sock, model, str(lease.id), out],
                check=True, timeout=120, capture_output=True, text=True)
        assert r.stdout.split() == ["48", "True", "notfound", "2"]
        got = np.load(out)
        assert got.tobytes() == np.stack([kv(i, 3) for i in range(3)]).tobytes()
        # Released, it cannot be adopted.
        with pytest.raises(kvpalace.NotFound):
            pool.adopt(lease_id)
        with pytest.raises(ValueError):
            lease.id  # a released handle


def test_block_table_and_arena(pool):
    tokens = np.arange(8000, 8064, dtype=np.uint32)
    commit(pool, tokens, 4)
    arena = pool.arena()
    assert arena["page_bytes"] == pool.page_bytes and arena["n_pages"] == pool.n_pages
    assert arena["bytes"] == pool.n_pages * pool.page_bytes and arena["fd"] >= 0
    with pool.match(tokens) as lease:
        table = lease.block_table()
        assert table == [lease.page(i).slot for i in range(4)]
        assert lease.block_table(1, 2) == table[1:3]
        assert lease.block_table(4) == []
        with pytest.raises(kvpalace.Error) as e:
            lease.block_table(2, 3)
        assert e.value.errno == 34  # ERANGE
        for i, slot in enumerate(table):
            data = os.pread(arena["fd"], 2 * 2 * 2 * 16 * 32 * 2,
                            arena["fd_offset"] + slot * arena["page_bytes"])
            assert data == kv(i, 4).tobytes()


def test_tensor_parallel_pools(client):
    model = "py-tp-%d" % os.getpid()
    tokens = np.arange(9000, 9032, dtype=np.uint32)
    with client.open_pool(model, LAYOUT, tp_rank=0, tp_size=2) as r0, \
            client.open_pool(model, LAYOUT, tp_rank=1, tp_size=2) as r1, \
            client.open_pool(model, LAYOUT) as plain:
        assert len({r0.id, r1.id, plain.id}) == 3
        commit(r0, tokens, 5)
        assert (r0.lookup(tokens), r1.lookup(tokens), plain.lookup(tokens)) == (32, 0, 0)
    with pytest.raises(kvpalace.Error) as e:
        client.open_pool(model, LAYOUT, tp_rank=2, tp_size=2)
    assert e.value.errno == 22 and "tp_rank" in str(e.value)
