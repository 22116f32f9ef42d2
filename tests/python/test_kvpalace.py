"""The kvpalace Python package against a real kvpalaced (conftest.py
starts one): what an engine written in Python relies on."""

import errno
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import kvpalace
from conftest import LAYOUT

HERE = os.path.dirname(os.path.abspath(__file__))


def kv_pattern(page, seed):
    """Deterministic K/V for one page of LAYOUT, distinct per page and seed."""
    rng = np.random.default_rng(seed * 1000 + page)
    return rng.standard_normal((2, 2, 2, 16, 32)).astype(np.float16)


def write_prefix(pool, tokens, seed=1):
    with pool.session() as s:
        s.append(tokens)
        for i in range((len(tokens) + 15) // 16):
            s.page(i).array()[...] = kv_pattern(i, seed)
        s.commit()
        return s.committed


def test_version_and_connect(client):
    assert re.fullmatch(r"\d+\.\d+\.\d+", kvpalace.version())
    assert kvpalace.__version__ == kvpalace.version()
    assert client.server_version.startswith("kvpalaced ")
    assert client.is_admin is False
    client.ping()


def test_connect_error_carries_errno(daemon):
    with pytest.raises(kvpalace.Error) as e:
        kvpalace.Client(daemon.dir + "/no-such.sock")
    assert e.value.errno in (errno.ENOENT, errno.ECONNREFUSED)
    assert isinstance(e.value, OSError)
    assert "no-such.sock" in str(e.value)


def test_layouts_by_name():
    names = kvpalace.layout_names()
    assert "llama-3-8b" in names and "stories260k" in names
    l = kvpalace.Layout.named("llama-3-8b")
    assert (l.n_layers, l.n_kv_heads, l.head_dim, l.block_tokens) == (32, 8, 128, 16)
    assert l.dtype == "bf16" and l.quant_group == 0
    q = kvpalace.Layout.named("Llama-3-8B", dtype="int8", block_tokens=32)
    assert (q.dtype, q.block_tokens, q.quant_group) == ("int8", 32, 32)
    assert kvpalace.Layout.named("meta-llama/Meta-Llama-3-8B") == l
    with pytest.raises(kvpalace.NotFound) as e:
        kvpalace.Layout.named("no-such-model")
    assert e.value.errno == errno.ENOENT
    with pytest.raises(AttributeError):
        l.n_layers = 3
    with pytest.raises(ValueError):
        kvpalace.Layout(1, 1, 8, 16, "f64")
    with pytest.raises(ValueError):
        kvpalace.Layout(-1, 1, 8, 16)
    with pytest.raises(OverflowError):
        kvpalace.Layout(1 << 32, 1, 8, 16)
    for d in ("f16", "bf16", "f32", "int8", "fp8_e4m3", "int4"):
        assert kvpalace.Layout(1, 1, 64, 16, d).dtype == d


def test_write_commit_match_in_another_process(daemon, client, tmp_path):
    model = "py-xproc-%d" % os.getpid()
    tokens = list(range(1000, 1040))  # 2 full pages and a partial one
    with client.open_pool(model, LAYOUT) as pool:
        with pool.session() as s:
            s.append(np.array(tokens, dtype=np.uint32))
            assert (s.tokens, s.committed) == (40, 0)
            pg = s.page(0)
            assert (pg.n_tokens, pg.first_pos, pg.writable) == (16, 0, True)
            assert pg.strides["row_bytes"] == 64 and pg.strides["page_bytes"] == pool.page_bytes
            pg.array()[...] = kv_pattern(0, 7)
            # page 1 through torch, page 2 through Session.write
            torch = pytest.importorskip("torch")
            t = s.page(1).tensor()

            t.copy_(torch.from_numpy(kv_pattern(1, 7)))
            del t
            s.write(2, 0, kv_pattern(2, 7).tobytes())
            s.commit()
            assert s.committed == 40
        out = str(tmp_path / "read")
        subprocess.run(
            [sys.executable, os.path.join(HERE, "reader.py"), daemon.sock, model, out,
             ",".join(map(str, tokens))],
            check=True, timeout=120)
    want = np.stack([kv_pattern(0, 7), kv_pattern(1, 7)])
    got = np.load(out + ".npy")
    assert got.dtype == np.float16 and got.shape == (2, 2, 2, 2, 16, 32)
    assert got.tobytes() == want.tobytes()
    assert open(out + ".torch", "rb").read() == want.tobytes()
    assert open(out + ".read", "rb").read() == want.tobytes()


def test_lookup_matches_match_and_changes_nothing(client, pool):
    tokens = np.arange(5000, 5064, dtype=np.uint32)
    write_prefix(pool, tokens[:48])
    prompts = [tokens, tokens[:20], tokens[:48], [1, 2, 3], []]
    before = client.stats()
    one = [pool.lookup(p) for p in prompts]
    batch = pool.lookup_batch(prompts)
    after = client.stats()
    for k in ("match_hits", "match_misses", "matched_tokens", "queried_tokens"):
        assert after[k] == before[k], k
    assert one == [48, 16, 48, 0, 0]
    assert [m for m, _ in batch] == one
    assert all(h == m for m, h in batch)  # nothing on disk here
    for p, n in zip(prompts, one):
        with pool.match(p) as lease:
            assert lease.tokens == n
    assert client.stats()["match_hits"] > before["match_hits"]


def test_salts_isolate(pool):
    tokens = list(range(7000, 7032))
    pool.set_salt(b"tenant-a")
    write_prefix(pool, tokens)
    assert pool.lookup(tokens) == 32
    pool.set_salt(None)
    assert pool.lookup(tokens) == 0
    assert pool.lookup(tokens, salt=b"tenant-a") == 32
    assert pool.lookup(tokens, salt=b"tenant-b") == 0
    assert pool.lookup_batch([tokens] * 3, salts=[b"tenant-a", None, b""]) == [
        (32, 32), (0, 0), (0, 0)]
    with pool.match(tokens, salt=b"tenant-a") as lease:
        assert lease.tokens == 32
    with pool.match(tokens) as lease:  # the handle's salt (none) came back
        assert lease.tokens == 0
    assert pool.lookup(tokens) == 0
    with pytest.raises(ValueError):
        pool.set_salt(b"x" * 65)
    with pytest.raises(ValueError):
        pool.lookup(tokens, salt=b"x" * 65)


def test_errors_carry_errno_and_message(pool):
    with pool.session() as s:
        s.append([1, 2, 3])
        with pytest.raises(kvpalace.Error) as e:
            s.commit(10)
        assert e.value.errno == errno.ERANGE and e.value.strerror
        commit_why = e.value.strerror
        with pytest.raises(kvpalace.Error) as e:
            s.page(5)
        assert e.value.errno == errno.ERANGE
        # A local error says what it is, not the last daemon reply's text.
        assert e.value.strerror != commit_why
        assert e.value.strerror == os.strerror(errno.ERANGE)
        with pytest.raises(kvpalace.Error) as e:
            s.truncate(99)
        assert e.value.errno == errno.ERANGE
    with pool.match([9, 9, 9]) as miss:
        assert miss.tokens == 0
        with pytest.raises(kvpalace.Error) as e:
            miss.fork(16)
        assert e.value.errno in (errno.ENOENT, errno.ERANGE)
        if e.value.errno == errno.ENOENT:
            assert isinstance(e.value, (kvpalace.NotFound, FileNotFoundError))
    with pytest.raises(kvpalace.NotFound) as e:
        kvpalace.Layout.named("nope")
    assert isinstance(e.value, FileNotFoundError)


def test_bad_tokens(pool):
    with pool.session() as s:
        with pytest.raises(ValueError):
            s.append([1, -1])
        with pytest.raises(OverflowError):
            s.append([1 << 32])
        with pytest.raises(TypeError):
            s.append(["a"])
        with pytest.raises(TypeError):
            s.append(b"abc")
        with pytest.raises(TypeError):
            s.append(5)
        with pytest.raises(TypeError):
            pool.lookup([1.5])
        assert s.tokens == 0
        s.append(np.arange(4, dtype=np.int64))  # converted, not a view
        s.append(np.arange(20, dtype=np.uint32)[::2])  # not contiguous: converted
        s.append(range(3))
        s.append((np.uint32(7), 8))
        assert s.tokens == 4 + 10 + 3 + 2


def test_session_fork_truncate_and_lease_fork(pool):
    tokens = list(range(100, 148))
    write_prefix(pool, tokens, seed=3)
    with pool.match(tokens) as lease:
        assert lease.tokens == 48
        with lease.fork(32) as s:
            assert (s.tokens, s.committed) == (32, 32)
            assert s.page(1).array().tobytes() == kv_pattern(1, 3).tobytes()
            s.append([1, 2])
            s.commit()
            with s.fork(33) as f:
                assert f.tokens == 33
            s.truncate(16)
            assert s.tokens == 16


def test_fork_child_gets_child_process_error(daemon, client, pool):
    pool.lookup([1, 2, 3])
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            try:
                client.ping()
                code = 10
            except kvpalace.ForkedChild as e:
                if e.errno != errno.ECHILD or not isinstance(e, ChildProcessError):
                    code = 11
            try:
                pool.lookup([1, 2, 3])
                code = 12
            except ChildProcessError:
                pass
            with kvpalace.Client(daemon.sock) as c2:
                c2.ping()
                with c2.open_pool("py-fork-child", LAYOUT) as p2:
                    p2.lookup([1, 2, 3])
        except BaseException as e:  # noqa: B036 - report anything
            print("child:", repr(e), file=sys.stderr)
            code = 13
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    client.ping()  # the parent's connection is untouched
    assert pool.lookup([1, 2, 3]) == 0


def test_fork_while_another_thread_holds_the_client(daemon, client):
    """The child of a fork taken while a thread waits on the daemon through
    the client (holding its lock) still gets ForkedChild, not a hang."""
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    resume = subprocess.Popen(["sh", "-c", "sleep 5; kill -CONT %d" % daemon.proc.pid])
    try:
        th = threading.Thread(target=client.ping)
        th.start()
        time.sleep(0.2)  # the ping is in flight, the lock taken
        pid = os.fork()
        if pid == 0:
            code = 20
            try:
                client.ping()
            except kvpalace.ForkedChild:
                code = 0
            except BaseException:  # noqa: B036
                code = 21
            os._exit(code)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the client's lock")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
        resume.wait()
    th.join(30)
    client.ping()


def test_view_outlives_with_blocks(daemon):
    tokens = list(range(300, 332))
    watcher = kvpalace.Client(daemon.sock)
    c = kvpalace.Client(daemon.sock)
    pool = c.open_pool("py-lifetime-%d" % os.getpid(), LAYOUT)
    write_prefix(pool, tokens, seed=5)
    conns = watcher.stats()["connections"]
    with pool.match(tokens) as lease:
        a = lease.page(1).array()
        pytest.importorskip("torch")
        t = lease.page(0).tensor()
        pg = lease.page(0)
    assert lease.closed
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0, 0, 0, 0, 0] = 1
    with pytest.raises(ValueError):
        lease.page(0)
    with pytest.raises(ValueError):
        pg.array()
    lease.release()  # idempotent
    # Closing everything above the views: the mapping stays while they live.
    pool.close()
    c.close()
    c.close()
    with pytest.raises(ValueError):
        c.ping()
    with pytest.raises(ValueError):
        pool.lookup(tokens)
    assert a.tobytes() == kv_pattern(1, 5).tobytes()
    assert t.numpy().tobytes() == kv_pattern(0, 5).tobytes()
    assert watcher.stats()["connections"] == conns  # the connection waits for the views
    # A second process matches the prefix while the views pin it.
    with kvpalace.Client(daemon.sock) as c3, c3.open_pool(
            "py-lifetime-%d" % os.getpid(), LAYOUT) as p3:
        assert p3.lookup(tokens) == 32
    del a, t, pg
    deadline = time.monotonic() + 10
    while watcher.stats()["connections"] != conns - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watcher.stats()["connections"] == conns - 1  # ended with the last view
    watcher.close()


def test_session_view_rules(pool):
    with pool.session() as s:
        s.append(range(16))
        a = s.page(0).array()
        a[...] = 1
        pg = s.page(0)
        with pytest.raises(BufferError):
            s.commit()
        with pytest.raises(BufferError):
            s.truncate(0)
        del a
        s.commit()
        with pytest.raises(ValueError):  # stale: the commit may have moved it
            pg.array()
        assert s.page(0).array()[0, 0, 0, 0, 0] == 1
        b = s.page(0).array()
    assert s.closed
    with pytest.raises(ValueError):
        s.append([1])
    assert float(b[1, 1, 1, 15, 31]) == 1.0  # still mapped
    del b


def test_gil_released_during_daemon_calls(daemon, client):
    """A call blocked on a stopped daemon must let other threads run."""
    done = threading.Event()
    errors = []

    def ping():
        try:
            client.ping()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        done.set()

    os.kill(daemon.proc.pid, signal.SIGSTOP)
    # Resumed from outside too: were the GIL held, this thread could not.
    resume = subprocess.Popen(["sh", "-c", "sleep 2; kill -CONT %d" % daemon.proc.pid])
    try:
        th = threading.Thread(target=ping)
        th.start()
        ticks = 0
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            ticks += 1
        assert not done.is_set()  # the ping is waiting on the daemon...
        assert ticks > 1000  # ...and this thread ran meanwhile
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
        resume.wait()
    th.join(30)
    assert done.is_set() and not errors


def test_threads_share_one_client(pool):
    tokens = list(range(900, 964))
    write_prefix(pool, tokens, seed=9)
    errors = []

    def work(k):
        try:
            for i in range(100):
                assert pool.lookup(tokens) == 64
                with pool.match(tokens[: 16 * (1 + (i + k) % 4)]) as lease:
                    assert lease.tokens == 16 * (1 + (i + k) % 4)
                    assert lease.page(0).array().tobytes() == kv_pattern(0, 9).tobytes()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ths = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(120)
    assert not errors


def test_dtypes_of_views(client):
    torch = pytest.importorskip("torch")

    for dtype, np_dtype, t_dtype, last in [
        ("bf16", np.uint16, torch.bfloat16, 32),
        ("f32", np.float32, torch.float32, 32),
        ("int8", np.uint8, torch.uint8, 32),
        ("int4", np.uint8, torch.uint8, 16),
    ]:
        layout = kvpalace.Layout(2, 2, 32, 16, dtype, 32 if dtype.startswith("int") else 0)
        with client.open_pool("py-dtype-%s-%d" % (dtype, os.getpid()), layout) as p:
            with p.session() as s:
                s.append(range(16))
                pg = s.page(0)
                a, t = pg.array(), pg.tensor()
                assert a.dtype == np_dtype and a.shape == (2, 2, 2, 16, last)
                assert t.dtype == t_dtype and tuple(t.shape) == (2, 2, 2, 16, last)
                del a, t


def test_use_after_close_and_context_managers(daemon):
    with kvpalace.Client(daemon.sock) as c:
        with c.open_pool("py-close-%d" % os.getpid(), LAYOUT) as p:
            s = p.session()
        assert p.closed and s.closed  # closing the pool closed its session
        with pytest.raises(ValueError):
            s.tokens
        with pytest.raises(ValueError):
            p.session()
        s.close()
    assert c.closed
    with pytest.raises(ValueError):
        c.open_pool("x", LAYOUT)
    with pytest.raises(ValueError):
        with c:
            pass


def test_quantized_page_through_write_and_read(client):
    """int8 pages: Session.write of a whole page (data and scales) comes
    back the same through Lease.read, the array view and a memoryview."""
    layout = kvpalace.Layout(2, 2, 64, 16, "int8", 32)
    with client.open_pool("py-int8-%d" % os.getpid(), layout) as p:
        rng = np.random.default_rng(4)
        data = rng.integers(0, 256, p.page_bytes, dtype=np.uint8).tobytes()
        tokens = np.arange(16, dtype=np.uint32)
        with p.session() as s:
            s.append(tokens)
            s.write(0, 0, data)
            with pytest.raises(kvpalace.Error) as e:
                s.write(0, p.page_bytes - 1, b"xy")
            assert e.value.errno == errno.ERANGE
            s.commit()
        with p.match(tokens) as lease:
            assert lease.read(0, 0, p.page_bytes) == data
            pg = lease.page(0)
            st = pg.strides
            assert st["scales_offset"] >= st["data_bytes"] and st["scale_row_bytes"] == 4
            a = pg.array()
            assert a.shape == (2, 2, 2, 16, 64) and a.tobytes() == data[: st["data_bytes"]]
            with memoryview(pg) as m:
                assert m.readonly and len(m) == p.page_bytes and m.tobytes() == data
            del a
