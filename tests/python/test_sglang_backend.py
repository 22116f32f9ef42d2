"""kvpalace.sglang_backend (SGLang's HiCache storage backend over the
package) against a real kvpalaced, driven by sglang_driver.Controller:
SGLang's calls in SGLang's order (prefetch: batch_exists, then batch_get_v1
or batch_get; write-back: batch_set_v1 or batch_set) on a stand-in host
pool of CPU torch tensors in SGLang's host layouts, over several requests:
hits (every byte the engine reads equals what was written), partial hits,
misses, a page set twice, tensor-parallel ranks, and gets that fail (the
daemon killed; pages gone) reported as misses for exactly those pages.

Each test runs twice: over KvpalaceStorage (no SGLang), and over SGLang's
own HiCacheStorage base class (KvpalaceHiCacheStorage), which is skipped
where SGLang does not import (here: it needs PyPI and CUDA torch)."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import kvpalace
from conftest import Daemon, _can_connect
from sglang_driver import Controller, HostPool, page_keys, storage_config

sb = pytest.importorskip("kvpalace.sglang_backend")

PS = 16  # SGLang's --page-size: the pool's block_tokens
MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]

_seq = [0]


def model_id(tag):
    _seq[0] += 1
    return "sgl-%s-%d-%d" % (tag, os.getpid(), _seq[0])


def sglang_importable():
    try:
        import sglang.srt.mem_cache.hicache_storage  # noqa: F401
        return None
    except ImportError as e:
        return str(e)


@pytest.fixture(params=["plain", "sglang"])
def backend_cls(request):
    """The backend class: KvpalaceStorage, or the class SGLang's dynamic
    loader gets (a subclass of SGLang's HiCacheStorage)."""
    if request.param == "plain":
        return sb.KvpalaceStorage
    why = sglang_importable()
    if why is not None:
        pytest.skip("SGLang is not importable here (%s): the real base class is not tested"
                    % why)
    return sb.KvpalaceHiCacheStorage


def make(backend_cls, sock, model, host, zero_copy=True, **cfg):
    extra = {"backend_name": "kvpalace", "module_path": "kvpalace.sglang_backend",
             "class_name": "KvpalaceHiCacheStorage", "interface_v1": int(zero_copy),
             "kvpalace_socket": sock, "kvpalace_model_id": model}
    conf = storage_config(extra_config=extra, **cfg)
    backend = backend_cls(conf, {})  # as StorageBackendFactory._create_dynamic_backend
    return Controller(backend, host, zero_copy=zero_copy)


def host_pool(layout="page_first", mla=False, dtype=torch.float16, n_pages=32, heads=2):
    if mla:
        return HostPool(layout, n_pages, PS, 2, 1, 64, dtype=dtype, mla=True)
    return HostPool(layout, n_pages, PS, 2, heads, 32, dtype=dtype)


def tokens(seed, n_pages):
    return list(range(seed * 10000, seed * 10000 + n_pages * PS))


def computed(ctl, keys, seed):
    """The engine computed these pages: host slots filled with KV."""
    idx = ctl.host.alloc(len(keys) * PS)
    ctl.host.fill(idx, seed)
    return idx, ctl.host.tokens_kv(idx)


def same(a, b):
    return a.shape == b.shape and a.view(torch.int16 if a.element_size() == 2 else torch.int32
                                          ).equal(b.view(torch.int16 if b.element_size() == 2
                                                         else torch.int32))


@pytest.mark.parametrize("zero_copy", [True, False], ids=["v1", "generic"])
@pytest.mark.parametrize("layout,mla", [(lay, False) for lay in MHA_LAYOUTS] +
                         [(lay, True) for lay in MLA_LAYOUTS],
                         ids=["mha-" + lay for lay in MHA_LAYOUTS] +
                         ["mla-" + lay for lay in MLA_LAYOUTS])
def test_requests(daemon, backend_cls, layout, mla, zero_copy):
    """Requests A (miss, computed, written back), A again (hit), B sharing
    A's first 2 pages (partial hit), A written twice (idempotent), C (miss);
    every byte the engine's host pool gets equals what was written."""
    ctl = make(backend_cls, daemon.sock, model_id("req"), host_pool(layout, mla),
               zero_copy=zero_copy, is_mla_model=mla)
    be = ctl.backend
    a = page_keys(tokens(1, 5), PS)
    assert len(a) == 5 and len(set(a)) == 5 and len(a[0]) == 64

    # A: a miss, computed, backed up.
    assert ctl.prefetch(a) == (0, None)
    idx_a, kv_a = computed(ctl, a, seed=1)
    assert ctl.write_back(a, idx_a) == 5 * PS
    assert be.stats["set_new"] == 5
    ctl.host.free(idx_a)
    ctl.host.kv_buffer.fill_(0)  # evicted from the host tier

    # A again: all 5 from storage, the bytes the engine wrote.
    n, idx = ctl.prefetch(a)
    assert n == 5
    assert same(ctl.host.tokens_kv(idx), kv_a)
    ctl.host.free(idx)

    # B: A's first two pages, then three of its own.
    b_tokens = tokens(1, 2) + tokens(2, 3)
    b = page_keys(b_tokens, PS)
    assert b[:2] == a[:2] and not set(b[2:]) & set(a)
    assert be.batch_exists(b) == 2
    n, idx = ctl.prefetch(b)
    assert n == 2
    assert same(ctl.host.tokens_kv(idx), kv_a[:2 * PS])
    ctl.host.free(idx)

    # A written twice: stored once, still A's bytes.
    idx2 = ctl.host.alloc(5 * PS)
    ctl.host.fill(idx2, seed=99)  # other bytes under the same keys
    assert ctl.write_back(a, idx2) == 5 * PS
    assert be.stats["set_new"] == 5
    ctl.host.free(idx2)
    n, idx = ctl.prefetch(a)
    assert n == 5 and same(ctl.host.tokens_kv(idx), kv_a)
    ctl.host.free(idx)

    # C: nothing of it.
    c = page_keys(tokens(3, 4), PS)
    assert be.batch_exists(c) == 0 and ctl.prefetch(c) == (0, None)
    assert not any(be.exists(k) for k in c) and all(be.exists(k) for k in a)
    assert be.stats["bytes_copied"] == be.stats["bytes_served"]
    be.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_dtypes(daemon, backend_cls, dtype):
    ctl = make(backend_cls, daemon.sock, model_id("dt"), host_pool("layer_first", dtype=dtype))
    assert ctl.backend.host.engine is not None  # layer_first MHA: the C adapters copy
    keys = page_keys(tokens(4, 3), PS)
    idx, kv = computed(ctl, keys, seed=4)
    assert ctl.write_back(keys, idx) == 3 * PS
    ctl.host.free(idx)
    ctl.host.kv_buffer.fill_(0)
    n, idx = ctl.prefetch(keys)
    assert n == 3 and same(ctl.host.tokens_kv(idx), kv)
    ctl.backend.close()


def test_layouts_read_each_other(daemon, backend_cls):
    """Pages hold kvpalace's layout: a page_first engine reads what a
    page_head one wrote, and a layer_first one what a page_first_direct
    one wrote."""
    model = model_id("xl")
    for wlay, rlay in [("page_head", "page_first"), ("page_first_direct", "layer_first")]:
        w = make(backend_cls, daemon.sock, model, host_pool(wlay))
        r = make(backend_cls, daemon.sock, model, host_pool(rlay), zero_copy=False)
        keys = page_keys(tokens(5 if wlay == "page_head" else 6, 4), PS)
        idx, kv = computed(w, keys, seed=5)
        assert w.write_back(keys, idx) == 4 * PS
        n, ridx = r.prefetch(keys)
        assert n == 4 and same(r.host.tokens_kv(ridx), kv)
        w.backend.close()
        r.backend.close()


def test_long_keys_and_many_pages(daemon, backend_cls):
    """Keys over 64 bytes (hashed down) and a prefix of 150 pages (two
    SGLang storage batches, three lookup batches)."""
    ctl = make(backend_cls, daemon.sock, model_id("long"), host_pool(n_pages=320))
    keys = [k + "-" + "x" * 40 for k in page_keys(tokens(7, 150), PS)]
    assert all(len(k) > 64 for k in keys)
    assert sb.storage_key(keys[0]) != sb.storage_key(keys[1])
    assert len(sb.storage_key(keys[0])) == 32 and sb.storage_key("ab") == b"ab"
    assert sb.pool_model_id("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
    long_id = sb.pool_model_id("/models/" + "x" * 200 + "\u00e9")
    assert len(long_id) <= 96 and long_id.isascii() and long_id != sb.pool_model_id("/m/x")
    idx, kv = computed(ctl, keys, seed=7)
    assert ctl.write_back(keys, idx) == 150 * PS
    ctl.host.free(idx)
    n, idx = ctl.prefetch(keys)
    assert n == 150 and same(ctl.host.tokens_kv(idx), kv)
    # A hole at page 100: the leading run stops there.
    ctl.host.free(idx)
    holed = keys[:100] + ["missing-page"] + keys[101:]
    assert ctl.backend.batch_exists(holed[:128]) == 100
    n, idx = ctl.prefetch(holed)
    assert n == 100
    ctl.backend.close()


def test_tensor_parallel_ranks(daemon, backend_cls):
    """Two TP ranks of one model, each its own heads: a rank never finds or
    reads the other's pages; each reads back its own bytes."""
    model = model_id("tp")
    r0 = make(backend_cls, daemon.sock, model, host_pool(heads=1), tp_rank=0, tp_size=2)
    r1 = make(backend_cls, daemon.sock, model, host_pool(heads=1), tp_rank=1, tp_size=2)
    keys = page_keys(tokens(8, 4), PS)
    idx0, kv0 = computed(r0, keys, seed=80)
    assert r0.write_back(keys, idx0) == 4 * PS
    assert r0.backend.batch_exists(keys) == 4
    assert r1.backend.batch_exists(keys) == 0
    assert r1.prefetch(keys, exists_first=False)[0] == 0  # get without exists: misses
    idx1, kv1 = computed(r1, keys, seed=81)
    assert not same(kv0, kv1)
    assert r1.write_back(keys, idx1) == 4 * PS
    for ctl, kv in [(r0, kv0), (r1, kv1)]:
        ctl.host.kv_buffer.fill_(0)
        n, idx = ctl.prefetch(keys)
        assert n == 4 and same(ctl.host.tokens_kv(idx), kv)
        ctl.backend.close()


def test_mla_ranks_share(daemon, backend_cls):
    """MLA (is_mla_model): every rank holds the same latent; rank 0 writes,
    rank 1 reads it, and rank 1's write-back stores nothing."""
    model = model_id("mla")
    r0 = make(backend_cls, daemon.sock, model, host_pool(mla=True), tp_rank=0, tp_size=2,
              is_mla_model=True)
    r1 = make(backend_cls, daemon.sock, model, host_pool(mla=True), tp_rank=1, tp_size=2,
              is_mla_model=True)
    keys = page_keys(tokens(9, 3), PS)
    idx1, _ = computed(r1, keys, seed=91)
    assert r1.write_back(keys, idx1) == 3 * PS  # skipped, reported done
    assert r0.backend.batch_exists(keys) == 0
    idx0, kv0 = computed(r0, keys, seed=90)
    assert r0.write_back(keys, idx0) == 3 * PS
    n, idx = r1.prefetch(keys)
    assert n == 3 and same(r1.host.tokens_kv(idx), kv0)
    r0.backend.close()
    r1.backend.close()


def _restart(d, wipe):
    """kvpalaced again on d's sockets (state and cache wiped: its pages gone)."""
    if wipe:
        shutil.rmtree(os.path.join(d.dir, "state"), ignore_errors=True)
        shutil.rmtree(os.path.join(d.dir, "cache"), ignore_errors=True)
    for s in (d.sock, d.admin_sock):
        if os.path.exists(s):
            os.unlink(s)
    d.proc = subprocess.Popen(d.argv)
    deadline = time.monotonic() + 30
    while not (_can_connect(d.sock) and _can_connect(d.admin_sock)):
        assert d.proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)


class _OwnDaemon(Daemon):
    def __init__(self, extra=()):
        real = subprocess.Popen
        seen = {}

        def popen(argv, *a, **kw):
            seen["argv"] = argv
            return real(argv, *a, **kw)

        subprocess.Popen = popen
        try:
            super().__init__(extra)
        finally:
            subprocess.Popen = real
        self.argv = seen["argv"]


@pytest.mark.parametrize("zero_copy", [True, False], ids=["v1", "generic"])
def test_failed_gets_are_misses(backend_cls, zero_copy):
    """A daemon of this test's own: killed between batch_exists and the
    get, every page of the get is a miss and the host slots keep what they
    held; restarted empty (pages gone), the backend reconnects, finds none
    of the old pages, and a get mixing gone and new pages reports exactly
    the gone ones as misses."""
    d = _OwnDaemon()
    try:
        ctl = make(backend_cls, d.sock, model_id("fail"), host_pool(), zero_copy=zero_copy)
        be = ctl.backend
        keys = page_keys(tokens(10, 4), PS)
        idx, kv = computed(ctl, keys, seed=10)
        assert ctl.write_back(keys, idx) == 4 * PS
        ctl.host.free(idx)
        assert be.batch_exists(keys) == 4

        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        dst = ctl.host.alloc(4 * PS)
        ctl.host.fill(dst, seed=11)  # what the slots hold before the get
        before = ctl.host.tokens_kv(dst)
        assert ctl.page_get(keys, dst) == 0
        if zero_copy:
            assert be.batch_get_v1(keys, dst) == [False] * 4
        else:
            assert be.batch_get(keys, [ctl.host.get_dummy_flat_data_page()] * 4) == [None] * 4
        assert same(ctl.host.tokens_kv(dst), before)
        assert be.batch_exists(keys) == 0 and not be.exists(keys[0])
        assert ctl.write_back(keys, dst) == 0

        _restart(d, wipe=True)
        time.sleep(sb._RECONNECT_INTERVAL_S)
        assert be.batch_exists(keys) == 0  # reconnected: the pages are gone
        assert be.stats["reconnects"] == 1
        new = page_keys(tokens(12, 2), PS)
        nidx, nkv = computed(ctl, new, seed=12)
        assert ctl.write_back(new, nidx) == 2 * PS
        mixed = [new[0], keys[1], new[1], keys[3]]
        dst2 = ctl.host.alloc(4 * PS)
        ctl.host.fill(dst2, seed=13)
        before = ctl.host.tokens_kv(dst2)
        if zero_copy:
            assert be.batch_get_v1(mixed, dst2) == [True, False, True, False]
        else:
            pages = [ctl.host.get_dummy_flat_data_page() for _ in mixed]
            got = be.batch_get(mixed, pages)
            assert [g is not None for g in got] == [True, False, True, False]
            for i in (0, 2):
                ctl.host.set_from_flat_data_page(dst2[i * PS], got[i])
        after = ctl.host.tokens_kv(dst2)
        assert same(after[0:PS], nkv[0:PS]) and same(after[2 * PS:3 * PS], nkv[PS:])
        assert same(after[PS:2 * PS], before[PS:2 * PS])
        assert same(after[3 * PS:], before[3 * PS:])
        assert ctl.page_get(mixed, dst2) == 1  # SGLang keeps the leading run
        be.close()
    finally:
        d.stop()


def test_corrupted_pages_on_disk(backend_cls):
    """Pages spilled to disk (a 1 MiB host pool; a clean stop writes the
    rest), bytes flipped in the spill file's data, the daemon started
    again: every page a get serves equals what was written, the damaged
    ones are misses."""
    d = _OwnDaemon(("--host-pool-size", "1M", "--disk-pool-size", "16M"))
    try:
        model = model_id("disk")
        ctl = make(backend_cls, d.sock, model, host_pool(n_pages=200))
        keys = page_keys(tokens(16, 96), PS)  # 768 KiB of pages
        idx, kv = computed(ctl, keys, seed=16)
        assert ctl.write_back(keys, idx) == 96 * PS
        ctl.backend.close()
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(30) == 0
        spill = [os.path.join(d.dir, "cache", f) for f in os.listdir(os.path.join(d.dir, "cache"))
                 if f.startswith("spill-")]
        assert len(spill) == 1
        with open(spill[0], "r+b") as f:
            size = f.seek(0, 2)
            for off in range(512 << 10, size, 1024):  # past the headers: extents' data
                f.seek(off)
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ 0x5A]))
        _restart(d, wipe=False)
        ctl = make(backend_cls, d.sock, model, host_pool(n_pages=200))
        be = ctl.backend
        dst = ctl.host.alloc(96 * PS)
        ctl.host.fill(dst, seed=17)
        before = ctl.host.tokens_kv(dst)
        run = be.batch_exists(keys)  # what is found is on disk: asked to come in
        assert run > 0 and be.stats["prefetched"] == run
        got = be.batch_get_v1(keys, dst)
        after = ctl.host.tokens_kv(dst)
        for i, ok in enumerate(got):
            page = slice(i * PS, (i + 1) * PS)
            assert same(after[page], kv[page] if ok else before[page]), i
        assert 0 < sum(got) < len(keys), sum(got)
        be.close()
    finally:
        d.stop()


def test_errors_are_clear(daemon):
    conf = storage_config(extra_config={"kvpalace_socket": daemon.sock,
                                        "kvpalace_model_id": model_id("err")})
    be = sb.KvpalaceStorage(conf, {})
    with pytest.raises(RuntimeError, match="register_mem_pool_host"):
        be.batch_exists(["k"])
    with pytest.raises(ValueError, match="host layout"):
        h = host_pool()
        h.layout = "token_first"
        be.register_mem_pool_host(h)
    with pytest.raises(ValueError, match="element size|dtype"):
        be.register_mem_pool_host(host_pool(dtype=torch.int8))
    ctl = Controller(be, host_pool())
    with pytest.raises(ValueError, match="host indices"):
        be.batch_get_v1(["a", "b"], torch.arange(PS))
    be.close()
    nodaemon = sb.KvpalaceStorage(storage_config(extra_config={
        "kvpalace_socket": daemon.sock + ".none"}), {})
    with pytest.raises(kvpalace.ConnectionLost):
        nodaemon.register_mem_pool_host(host_pool())
    del ctl


def test_importable_without_sglang():
    """The module imports without SGLang; the class SGLang loads then says
    what is missing, and only when asked for."""
    code = ("import sys; sys.modules['sglang'] = None\n"
            "import kvpalace.sglang_backend as sb\n"
            "from kvpalace.sglang_backend import *\n"
            "assert sb.KvpalaceStorage\n"
            "try:\n"
            "    sb.KvpalaceHiCacheStorage\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ImportError:" in r.stdout and "needs SGLang" in r.stdout
    assert "KvpalaceStorage" in r.stdout


def test_real_factory_loads_it(daemon):
    """SGLang's own StorageBackendFactory loads the class by the flags'
    module_path and class_name (only where SGLang imports)."""
    why = sglang_importable()
    if why is not None:
        pytest.skip("SGLang is not importable here (%s)" % why)
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    host = host_pool()
    conf = storage_config(extra_config={
        "backend_name": "kvpalace", "module_path": "kvpalace.sglang_backend",
        "class_name": "KvpalaceHiCacheStorage", "interface_v1": 1,
        "kvpalace_socket": daemon.sock, "kvpalace_model_id": model_id("fac")})
    be = StorageBackendFactory.create_backend("dynamic", conf, host)
    ctl = Controller(be, host)
    keys = page_keys(tokens(14, 2), PS)
    idx, kv = computed(ctl, keys, seed=14)
    assert ctl.write_back(keys, idx) == 2 * PS
    assert be.batch_exists(keys) == 2
    be.close()


def test_over_an_abstract_base(daemon):
    """make_backend_class over an ABC with HiCacheStorage's abstract calls
    (a stand-in of SGLang's, which does not import here): nothing is left
    abstract, our calls win over the base's, and SGLang's calls work."""
    import abc

    class Base(abc.ABC):
        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host

        def batch_get_v1(self, keys, host_indices, extra_info=None):
            raise NotImplementedError()

        def batch_set_v1(self, keys, host_indices, extra_info=None):
            raise NotImplementedError()

        @abc.abstractmethod
        def get(self, key, target_location=None, target_sizes=None):
            pass

        @abc.abstractmethod
        def batch_get(self, keys, target_locations=None, target_sizes=None):
            pass

        @abc.abstractmethod
        def set(self, key, value=None, target_location=None, target_sizes=None):
            pass

        @abc.abstractmethod
        def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
            pass

        @abc.abstractmethod
        def exists(self, key):
            pass

        def batch_exists(self, keys, extra_info=None):
            for i, k in enumerate(keys):
                if not self.exists(k):
                    return i
            return len(keys)

    cls = sb.make_backend_class(Base)
    assert issubclass(cls, Base) and not cls.__abstractmethods__
    for zero_copy in (True, False):
        ctl = make(cls, daemon.sock, model_id("abc"), host_pool(), zero_copy=zero_copy)
        keys = page_keys(tokens(15 + zero_copy, 3), PS)
        idx, kv = computed(ctl, keys, seed=15)
        assert ctl.write_back(keys, idx) == 3 * PS
        ctl.host.kv_buffer.fill_(0)
        n, ridx = ctl.prefetch(keys)
        assert n == 3 and same(ctl.host.tokens_kv(ridx), kv)
        flat = ctl.host.get_dummy_flat_data_page()
        assert ctl.backend.get(keys[0], flat) is flat and ctl.backend.get("nope", flat) is None
        assert ctl.backend.set(keys[0], ctl.host.get_data_page(ridx[0]))
        ctl.backend.close()


def test_threads_as_sglang_runs_them(daemon, backend_cls):
    """SGLang calls from three threads at once (prefetch: batch_exists;
    prefetch I/O: batch_get_v1; write-back: batch_set_v1) on one backend:
    every byte read is what was written, each thread on a connection of
    its own (one Client's calls wait for each other)."""
    import threading

    ctl = make(backend_cls, daemon.sock, model_id("thr"), host_pool(n_pages=160))
    old = [page_keys(tokens(100 + r, 4), PS) for r in range(8)]
    new = [page_keys(tokens(200 + r, 4), PS) for r in range(8)]
    kv_old = []
    for r, keys in enumerate(old):
        idx, kv = computed(ctl, keys, seed=100 + r)
        assert ctl.write_back(keys, idx) == 4 * PS
        kv_old.append(kv)
    w_idx = [computed(ctl, keys, seed=200 + r) for r, keys in enumerate(new)]
    r_idx = [ctl.host.alloc(4 * PS) for _ in range(4)]
    errors = []

    def writer():
        try:
            for keys, (idx, _) in zip(new, w_idx):
                assert all(ctl.backend.batch_set_v1(keys, idx))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def reader(t):
        try:
            for rnd in range(6):
                r = (t + rnd) % len(old)
                assert ctl.backend.batch_exists(old[r]) == 4
                assert ctl.backend.batch_get_v1(old[r], r_idx[t]) == [True] * 4
                assert same(ctl.host.tokens_kv(r_idx[t]), kv_old[r])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=reader, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    if hasattr(ctl.backend, "_conns"):  # a connection per thread (and the registering one's)
        assert len(ctl.backend._conns) == 1 + len(threads)
    for keys, (_, kv) in zip(new, w_idx):
        ctl.host.kv_buffer.fill_(0)
        assert ctl.backend.batch_get_v1(keys, r_idx[0]) == [True] * 4
        assert same(ctl.host.tokens_kv(r_idx[0]), kv)
    ctl.backend.close()
