"""kvpalace.vllm_connector against a real kvpalaced, driven the way vLLM
drives a KV connector (tests/python/vllm_driver.py): prefix hits, partial
hits, misses, preemption, a request finished before its save was done, a
load that fails halfway; every byte that reaches the engine's cache is
checked, and every block reported failed. Where vLLM imports, the same
story runs against its real KVConnectorBase_V1; here that part skips."""

import importlib.util
import glob
import os
import signal
import subprocess
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # vLLM's caches are torch tensors

import kvpalace  # noqa: E402
from kvpalace import vllm_connector as vc  # noqa: E402
from conftest import Daemon, _can_connect  # noqa: E402
from vllm_driver import Engine, Request  # noqa: E402

_seq = [0]


def model_id():
    _seq[0] += 1
    return "vllm-test-%d-%d" % (os.getpid(), _seq[0])


HAVE_VLLM = importlib.util.find_spec("vllm") is not None
NO_VLLM = ("vLLM is not importable here (no PyPI, no CUDA torch): the stories run "
           "against the real KVConnectorBase_V1 where it is")


@pytest.fixture(params=["impl", "vllm-base"])
def impl(request):
    """The connector class: the logic alone, and (where vLLM imports) the
    class vLLM's factory gets, a subclass of its KVConnectorBase_V1."""
    if request.param == "impl":
        return vc.KvpalaceConnectorImpl
    if not HAVE_VLLM:
        pytest.skip(NO_VLLM)
    return vc.KvpalaceConnector


def prompt(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 30000, (n,), generator=g).tolist()


def lookup(eng, tokens):
    return eng.sched._lookup(tokens, None, None, None)


def test_hit_partial_miss(daemon, impl):
    eng = Engine(impl, daemon.sock, model_id())
    try:
        a = prompt(1, 200)
        eng.add(Request("A", a))
        eng.run_until_idle()
        assert lookup(eng, a) == 192  # 12 whole blocks saved, the partial 13th not
        assert eng.finish("A") is True  # it had saves: blocks freed when reported
        sending, _ = eng.execute(eng.schedule())
        assert sending == {"A"} and "A" not in eng.delayed_free

        # A full prefix hit: B is A's prompt; 192 tokens load (never the last).
        eng.workers[0].stats.reset()
        eng.add(Request("B", a))
        so = eng.schedule()
        assert eng.last_matched["B"] == 192
        assert len(so.kv_connector_metadata.leases) == 1
        eng.execute(so)
        assert eng.load_check[(0, "B")] == (12, 0, [])
        st = eng.workers[0].stats
        assert st.blocks_loaded == 12 and st.blocks_failed == 0
        # Nothing new to save: no save, the worker's lease released after the
        # load, and the blocks freed as soon as B finishes.
        assert not so.kv_connector_metadata.saves and st.bytes_saved == 0
        assert eng.workers[0]._wreq["B"].lease is None
        assert eng.finish("B") is False

        # A partial hit: 100 tokens of A then others -> 6 blocks load, the rest
        # compute and are saved, only the new blocks copied out.
        c = a[:100] + prompt(3, 150)
        eng.workers[0].stats.reset()
        eng.add(Request("C", c))
        so = eng.schedule()
        assert eng.last_matched["C"] == 96
        eng.execute(so)
        assert eng.load_check[(0, "C")] == (6, 0, [])
        st = eng.workers[0].stats
        assert st.bytes_saved == (15 - 6) * eng.workers[0]._block_bytes
        assert lookup(eng, c) == 240

        # A miss.
        d = prompt(4, 64)
        assert eng.sched.get_num_new_matched_tokens(Request("D", d), 0) == (0, False)
        eng.add(Request("D", d))
        so = eng.schedule()
        assert eng.last_matched["D"] == 0 and not so.kv_connector_metadata.leases
        eng.execute(so)
        assert lookup(eng, d) == 64  # its 4 whole blocks saved
        # Never the last token: vLLM must compute one to sample from.
        assert eng.sched.get_num_new_matched_tokens(Request("D2", d), 0) == (48, False)
    finally:
        eng.close()


def test_with_vllms_own_prefix_cache(daemon, impl):
    """vLLM's own cache holds part of the prompt: kvpalace loads only what
    lies beyond it, and where vLLM holds more than kvpalace, the save forks
    kvpalace's prefix instead of copying it back."""
    eng = Engine(impl, daemon.sock, model_id())
    try:
        a = prompt(5, 200)
        _saved_then_new(eng, "A", a)  # kvpalace: 192 tokens
        eng.add(Request("B", a), local=64)
        so = eng.schedule()
        assert eng.last_matched["B"] == 128
        assert so.kv_connector_metadata.leases[0].first_page == 4
        eng.execute(so)
        assert eng.load_check[(0, "B")] == (8, 0, [])
        c = a[:96] + prompt(6, 100)  # kvpalace holds 96 of it, vLLM 160
        eng.workers[0].stats.reset()
        eng.add(Request("C", c), local=160)
        so = eng.schedule()
        assert eng.last_matched["C"] == 0
        spec = so.kv_connector_metadata.leases[0]
        assert spec.block_ids == [] and spec.lease_tokens == 96
        eng.execute(so)
        st = eng.workers[0].stats
        assert st.bytes_saved == (12 - 6) * eng.workers[0]._block_bytes
        assert lookup(eng, c) == 192
        assert eng.workers[0]._wreq["C"].lease is None  # released once forked
        # The lease to fork gone before the worker adopts it: the save starts
        # from 0 instead (vLLM's own blocks are good), no block reported.
        e = a[:96] + prompt(7, 100)
        eng.workers[0].stats.reset()
        eng.add(Request("E", e), local=160)
        so = eng.schedule()
        eng.sched._release_all(eng.sched._req["E"].leases)
        _, errors = eng.execute(so)
        assert not errors
        assert eng.workers[0].stats.bytes_saved == 12 * eng.workers[0]._block_bytes
        assert lookup(eng, e) == 192
    finally:
        eng.close()


def test_bytes_saved_are_the_engines(daemon, impl):
    """What kvpalace holds after a save is, byte for byte, what the engine
    computed (read back through the package's own page views)."""
    eng = Engine(impl, daemon.sock, model_id(), dtype="f16")
    try:
        a = prompt(11, 80)
        eng.add(Request("A", a))
        eng.run_until_idle()
        pool = eng.sched._pools[0]
        with pool.match(a) as lease:
            assert lease.tokens == 80
            for i in range(5):
                page = torch.from_numpy(lease.page(i).array().copy())  # [L, 2, H, bs, D]
                want = eng.expected_block(0, a, i).permute(0, 1, 3, 2, 4)
                assert torch.equal(page, want), "page %d differs" % i
    finally:
        eng.close()


def test_preemption(daemon, impl):
    """A preempted request is resumed with its blocks reloaded, but never
    promised more than at its first scheduling: vLLM checks sync load
    failures only below num_cached_tokens, so a failure past it could not
    be reported and zeroed blocks would be used as KV."""
    eng = Engine(impl, daemon.sock, model_id())
    try:
        a = prompt(21, 130)
        eng.add(Request("W", a))  # another request saves the prompt first
        eng.run_until_idle()
        eng.add(Request("P", a))
        eng.execute(eng.schedule())
        assert eng.last_matched["P"] == 128
        for _ in range(3):  # decode a few tokens
            eng.execute(eng.schedule())
        eng.preempt("P")
        so = eng.schedule()
        assert "P" in so.scheduled_cached_reqs.resumed_req_ids
        assert eng.last_matched["P"] == 128  # the prompt's whole blocks, reloaded
        eng.execute(so)
        assert eng.load_check[(0, "P")] == (8, 0, [])
        assert eng.finish("P") is False  # it saved nothing new
        # Q was scheduled cold (nothing promised) and saved its prompt: resumed,
        # it is promised nothing still, and recomputes.
        b = prompt(22, 130)
        eng.add(Request("Q", b))
        eng.run_until_idle()
        assert lookup(eng, b) == 128
        eng.preempt("Q")
        so = eng.schedule()
        assert "Q" in so.scheduled_cached_reqs.resumed_req_ids
        assert eng.last_matched["Q"] == 0
        eng.execute(so)
        assert eng.finish("Q") is True
        sending, _ = eng.execute(eng.schedule())
        assert sending == {"Q"}
    finally:
        eng.close()


def test_finished_before_its_save_completed(daemon, impl):
    """A request aborted after the step that saves its first chunk was
    scheduled but before it ran: request_finished keeps its blocks, the
    workers still save that chunk from them and only then report it."""
    eng = Engine(impl, daemon.sock, model_id(), budget=64)
    try:
        a = prompt(31, 200)
        eng.add(Request("E", a))
        so = eng.schedule()  # the first 64 tokens, with their save
        assert [s.req_id for s in so.kv_connector_metadata.saves] == ["E"]
        assert eng.finish("E") is True  # aborted now, the step not yet run
        blocks = eng.delayed_free["E"]
        assert not set(blocks) & set(eng.free)
        sending, _ = eng.execute(so)
        assert sending is None  # the abort reaches the workers in the next step
        assert lookup(eng, a) == 64
        sending, _ = eng.execute(eng.schedule())
        assert sending == {"E"} and set(blocks) <= set(eng.free)
        assert lookup(eng, a) == 64  # nothing past the chunk that ran
        assert not eng.workers[0]._wreq  # its session and lease are closed
    finally:
        eng.close()


class _FailingLease:
    """A lease whose to_engine fails from its nth call on, as a copy that
    loses the daemon's pages halfway would."""

    def __init__(self, lease, fail_at, action):
        self._l, self._n, self._fail_at, self._action = lease, 0, fail_at, action

    def __getattr__(self, name):
        return getattr(self._l, name)

    def to_engine(self, *a, **kw):
        self._n += 1
        if self._n >= self._fail_at:
            r = self._action()
            if r is not None:
                raise r
        return self._l.to_engine(*a, **kw)


class _PoolProxy:
    def __init__(self, pool, fail_at, action):
        self._p, self._fail_at, self._action = pool, fail_at, action

    def __getattr__(self, name):
        return getattr(self._p, name)

    def adopt(self, lease_id):
        return _FailingLease(self._p.adopt(lease_id), self._fail_at, self._action)


def _saved_then_new(eng, rid, tokens):
    eng.add(Request(rid + "-w", tokens))
    eng.run_until_idle()
    eng.finish(rid + "-w")
    eng.execute(eng.schedule())


def test_load_fails_halfway(daemon, impl):
    """The third chunk of two blocks fails: blocks 4.. are reported, zeroed,
    recomputed; blocks 0..3 hold exactly what was saved."""
    eng = Engine(impl, daemon.sock, model_id(),
                 extra={"load_chunk_blocks": 2})
    try:
        a = prompt(41, 161)  # 10 whole blocks
        _saved_then_new(eng, "F", a)
        w = eng.workers[0]
        w._pools[0] = _PoolProxy(w._pools[0], 3,
                                 lambda: kvpalace.ConnectionLost(104, "pages gone"))
        eng.add(Request("F", a))
        so = eng.schedule()
        assert eng.last_matched["F"] == 160
        blocks = list(eng.running["F"].blocks)
        _, errors = eng.execute(so)
        assert errors == set(blocks[4:10])
        assert eng.load_check[(0, "F")] == (4, 6, [])
        assert eng.running["F"].num_computed == 64  # vLLM recomputes from block 4
        # The recompute fills them with the model's bytes again, and F saves
        # nothing (its engine copy was not loaded whole).
        eng.run_until_idle()
        for bi in range(4, 10):
            assert torch.equal(eng.engine_block(0, blocks[bi]), eng.expected_block(0, a, bi))
    finally:
        eng.close()


def test_staged_copies(daemon, impl):
    """A device cache goes through a host staging buffer (forced here on the
    CPU, 3 blocks of it): a hit, a partial hit's save, a failure halfway."""
    eng = Engine(impl, daemon.sock, model_id(),
                 extra={"staging_blocks": 3})
    try:
        w = eng.workers[0]
        assert w._staging is not None and w.load_chunk_blocks == 3
        a = prompt(91, 161)
        _saved_then_new(eng, "H", a)
        eng.add(Request("H", a))
        so = eng.schedule()
        eng.execute(so)
        assert eng.load_check[(0, "H")] == (10, 0, [])
        c = a[:64] + prompt(92, 100)
        eng.add(Request("C", c))
        eng.run_until_idle()
        with eng.sched._pools[0].match(c) as lease:
            assert lease.tokens == 160
            page = lease.page(7).array()  # bf16 as its uint16 bits
            page = torch.from_numpy(page.view(np.int16).copy())
            want = eng.expected_block(0, c, 7).permute(0, 1, 3, 2, 4).contiguous()
            assert torch.equal(page, want.view(torch.int16))
        w._pools[0] = _PoolProxy(w._pools[0], 2, lambda: kvpalace.Error(5, "EIO"))
        eng.add(Request("H2", a))
        so = eng.schedule()
        blocks = list(eng.running["H2"].blocks)
        _, errors = eng.execute(so)
        assert errors == set(blocks[3:10])
        assert eng.load_check[(0, "H2")] == (3, 7, [])
    finally:
        eng.close()


def test_lease_gone_before_adopt(daemon, impl):
    """The scheduler's lease released before the worker adopts it (its pages
    no longer pinned for it): every block of that load is failed."""
    eng = Engine(impl, daemon.sock, model_id())
    try:
        a = prompt(51, 100)
        _saved_then_new(eng, "G", a)
        eng.add(Request("G", a))
        so = eng.schedule()
        eng.sched._release_all(eng.sched._req["G"].leases)
        blocks = list(eng.running["G"].blocks)
        _, errors = eng.execute(so)
        assert errors == set(blocks[:6])
        assert eng.load_check[(0, "G")] == (0, 6, [])
    finally:
        eng.close()


def _kvpalacectl():
    ctl = os.path.join(os.path.dirname(os.path.dirname(os.environ.get("KVPALACED", ""))),
                       "client", "kvpalacectl")
    if not os.access(ctl, os.X_OK):
        pytest.skip("no kvpalacectl beside $KVPALACED (%s)" % ctl)
    return ctl


def test_pages_gone_between_lookup_and_match(daemon, impl):
    """The pages purged (kvpalacectl purge) after vLLM was told 160 tokens
    would load and before the scheduler's match: the lease has none, all 10
    blocks are reported failed without a load, and the request saves
    nothing until vLLM recomputed them."""
    ctl = _kvpalacectl()
    mid = model_id()
    eng = Engine(impl, daemon.sock, mid)
    try:
        a = prompt(55, 161)
        _saved_then_new(eng, "Q", a)
        real = eng.sched.update_state_after_alloc

        def purge_first(req, blocks, n):
            subprocess.run([ctl, "--socket", daemon.admin_sock, "purge", "--model", mid],
                           check=True, capture_output=True, timeout=60)
            return real(req, blocks, n)

        eng.sched.update_state_after_alloc = purge_first
        eng.add(Request("Q", a))
        so = eng.schedule()
        assert eng.last_matched["Q"] == 160
        spec = so.kv_connector_metadata.leases[0]
        blocks = list(eng.running["Q"].blocks)
        assert spec.block_ids == [] and spec.failed_block_ids == blocks[:10]
        assert not so.kv_connector_metadata.saves
        _, errors = eng.execute(so)
        assert errors == set(blocks[:10])
        assert eng.load_check[(0, "Q")] == (0, 10, [])
        eng.run_until_idle()
        assert lookup(eng, a) == 0
    finally:
        eng.close()


def test_daemon_killed_mid_load(impl):
    """The daemon killed (SIGKILL) between two chunks of a load: every block
    either holds exactly what was saved or is reported failed and zeroed."""
    d = Daemon()
    eng = Engine(impl, d.sock, model_id(), extra={"load_chunk_blocks": 2})
    try:
        a = prompt(61, 161)
        _saved_then_new(eng, "K", a)

        def kill():
            if d.proc.poll() is None:
                d.proc.send_signal(signal.SIGKILL)
                d.proc.wait()
            return None  # then the real to_engine runs

        w = eng.workers[0]
        w._pools[0] = _PoolProxy(w._pools[0], 2, kill)
        eng.add(Request("K", a))
        so = eng.schedule()
        blocks = list(eng.running["K"].blocks)
        _, errors = eng.execute(so)
        n_eq, n_failed, bad = eng.load_check[(0, "K")]
        assert bad == [] and n_eq + n_failed == 10
        assert errors == set(blocks[n_eq:10])  # failed blocks are a suffix
        print("daemon killed mid-load: %d blocks served, %d reported failed" % (n_eq, n_failed))
    finally:
        try:
            eng.close()
        except kvpalace.Error:
            pass
        d.stop()


def _restart_from_stopped(d, args):
    """Starts a stopped daemon again on the same directories."""
    d.proc = subprocess.Popen(args)
    deadline = time.monotonic() + 30
    while not os.path.exists(d.sock) or not _can_connect(d.sock):
        assert d.proc.poll() is None and time.monotonic() < deadline, "kvpalaced did not restart"
        time.sleep(0.02)


def test_pages_corrupted_on_disk(impl):
    """Pages saved through the connector, written to the disk tier at a
    clean stop, damaged there (a byte in the data of extents 4, 5, ...):
    after a restart the index still promises them, the scheduler's match
    (which reads them back and verifies them) stops short, and the blocks
    past it are reported failed; every block loaded holds what was saved."""
    d = Daemon(extra=("--disk-pool-size", "64M"))
    mid = model_id()
    try:
        a = prompt(65, 161)
        eng = Engine(impl, d.sock, mid)
        _saved_then_new(eng, "Z", a)
        eng.close()
        d.proc.send_signal(signal.SIGTERM)
        d.proc.wait(60)
        (spill,) = glob.glob(os.path.join(d.dir, "cache", "*.kvs"))
        page_bytes = 4 * 2 * 8 * 64 * 16 * 2
        n_ext = (64 << 20) // page_bytes
        data_off = (4096 + n_ext * 128 + 4095) // 4096 * 4096
        fd = os.open(spill, os.O_RDWR)
        try:
            for e in range(4, n_ext):
                off = data_off + e * page_bytes + 100
                b = os.pread(fd, 1, off)
                if b:
                    os.pwrite(fd, bytes([b[0] ^ 0xFF]), off)
        finally:
            os.close(fd)
        _restart_from_stopped(d, d.proc.args)
        eng = Engine(impl, d.sock, mid)
        try:
            eng.add(Request("Z2", a))
            so = eng.schedule()
            hit = eng.last_matched["Z2"]
            got = so.kv_connector_metadata.leases[0].lease_tokens
            print("after the damage: %d tokens promised (the index), %d in the lease" % (hit, got))
            assert hit == 160 and got < hit  # the damage shows when pages are read
            blocks = list(eng.running["Z2"].blocks)
            _, errors = eng.execute(so)
            assert errors == set(blocks[got // 16:10])
            assert eng.load_check[(0, "Z2")] == (got // 16, 10 - got // 16, [])
        finally:
            eng.close()
    finally:
        d.stop()


def test_lora_salt_and_multimodal_keys(daemon, impl):
    eng = Engine(impl, daemon.sock, model_id())
    try:
        a = prompt(71, 96)
        eng.add(Request("L", a, lora_name="sql-adapter"))
        eng.add(Request("S", prompt(72, 96), cache_salt="tenant-7"))
        eng.add(Request("M", prompt(73, 96), mm=[(16, 32, "f" * 64)]))
        eng.run_until_idle()
        gm = eng.sched.get_num_new_matched_tokens
        assert gm(Request("x", a), 0) == (0, False)
        assert gm(Request("x", a, lora_name="other"), 0) == (0, False)
        assert gm(Request("x", a, lora_name="sql-adapter"), 0) == (80, False)
        s = prompt(72, 96)
        assert gm(Request("x", s), 0) == (0, False)
        assert gm(Request("x", s, cache_salt="tenant-7"), 0) == (80, False)
        m = prompt(73, 96)
        assert gm(Request("x", m, mm=[(16, 32, "e" * 64)]), 0) == (16, False)  # before the image
        assert gm(Request("x", m, mm=[(16, 32, "f" * 64)]), 0) == (80, False)
        assert gm(Request("x", m, mm=[(16, 32, "f" * 64)]), 32) == (48, False)
        # A LoRA request's hit loads what the LoRA request saved.
        eng.add(Request("L2", a, lora_name="sql-adapter"))
        so = eng.schedule()
        eng.execute(so)
        assert eng.load_check[(0, "L2")] == (5, 0, [])
        # A partial LoRA hit's save forks the lease: its new pages are the
        # adapter's too, and nobody else's.
        b = a[:48] + prompt(74, 60)
        eng.add(Request("L3", b, lora_name="sql-adapter"))
        eng.run_until_idle()
        assert eng.workers[0].stats.bytes_saved > 0
        assert gm(Request("x", b, lora_name="sql-adapter"), 0) == (96, False)
        assert gm(Request("x", b), 0) == (0, False)
    finally:
        eng.close()


def test_multimodal_across_chunks(daemon, impl):
    """An image's span cut by chunked prefill (chunks of 48 tokens, the
    image at 40..69) is saved whole: the same image matches the prompt's
    whole blocks, another image only the pages before its span."""
    eng = Engine(impl, daemon.sock, model_id(), budget=48)
    try:
        m = prompt(75, 130)
        eng.add(Request("M", m, mm=[(40, 30, "img-1")]))
        eng.run_until_idle()
        gm = eng.sched.get_num_new_matched_tokens
        assert gm(Request("x", m, mm=[(40, 30, "img-1")]), 0) == (128, False)
        assert gm(Request("x", m, mm=[(40, 30, "img-2")]), 0) == (32, False)
        assert gm(Request("x", m), 0) == (32, False)
    finally:
        eng.close()


def test_tensor_parallel(daemon, impl):
    """Two ranks with 4 of the 8 KV heads each: a pool per rank, the
    scheduler's lease per rank, each rank loading its own heads."""
    eng = Engine(impl, daemon.sock, model_id(), tp_size=2)
    try:
        a = prompt(81, 120)
        _saved_then_new(eng, "T", a)
        assert [p.layout.n_kv_heads for p in eng.sched._pools] == [4, 4]
        eng.add(Request("T", a))
        so = eng.schedule()
        assert len(so.kv_connector_metadata.leases[0].lease_ids) == 2
        eng.execute(so)
        assert eng.load_check[(0, "T")] == (7, 0, [])
        assert eng.load_check[(1, "T")] == (7, 0, [])
    finally:
        eng.close()


def test_refusals(daemon, impl):
    from vllm_driver import vllm_config
    cfg = vllm_config(daemon.sock, model_id(), 4, 8, 64, 16)
    w = impl(cfg, 1)
    try:
        wrong = {"model.layers.0.attn": torch.zeros(2, 8, 32, 8, 64, dtype=torch.bfloat16)}
        with pytest.raises(ValueError, match="no layout it knows"):
            w.register_kv_caches(wrong)
        perm = torch.zeros(2, 8, 8, 16, 64, dtype=torch.bfloat16).transpose(2, 3)
        with pytest.raises(ValueError, match="not contiguous"):
            w.register_kv_caches({"model.layers.0.attn": perm})
    finally:
        w.shutdown()
    cfg = vllm_config(daemon.sock, model_id(), 4, 8, 64, 16, extra={"dtype": "int8"})
    with pytest.raises(ValueError, match="dtype"):
        impl(cfg, 0)


def test_importable_without_vllm():
    """The module imports without vLLM; the class vLLM names says clearly
    that vLLM is missing when it is asked for."""
    if HAVE_VLLM:
        cls = vc.KvpalaceConnector
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorBase_V1, KVConnectorMetadata)
        assert issubclass(cls, KVConnectorBase_V1)
        assert isinstance(vc.KvpalaceConnectorMetadata(), KVConnectorMetadata)
        return
    with pytest.raises(ImportError, match="needs vLLM"):
        vc.KvpalaceConnector
    with pytest.raises(ImportError, match="needs vLLM"):
        from kvpalace.vllm_connector import KvpalaceConnector  # noqa: F401
    with pytest.raises(AttributeError):
        vc.NoSuchThing


@pytest.fixture
def fake_vllm_base(monkeypatch):
    """A module where vLLM keeps KVConnectorBase_V1, made here from the
    interface's shape (an ABC with its abstract methods, the metadata ABC),
    so that the lazy subclass is made and used even without vLLM."""
    if HAVE_VLLM:
        pytest.skip("vLLM imports here: the real base class is used instead")
    import abc
    import sys
    import types

    def abstract(name):
        def f(self, *a, **kw):
            raise NotImplementedError(name)
        f.__name__ = name
        return abc.abstractmethod(f)

    names = ["start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
             "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta"]

    def init(self, vllm_config, role, kv_cache_config=None):
        self.base_init = (vllm_config, role, kv_cache_config)
        self._connector_metadata = None

    def bind(self, m):
        self._connector_metadata = m

    def clear(self):
        self._connector_metadata = None

    ns = {n: abstract(n) for n in names}
    ns.update(__init__=init, bind_connector_metadata=bind, clear_connector_metadata=clear)
    base = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.base")
    base.KVConnectorBase_V1 = abc.ABCMeta("KVConnectorBase_V1", (abc.ABC,), ns)
    base.KVConnectorMetadata = abc.ABCMeta("KVConnectorMetadata", (abc.ABC,), {})
    parts = base.__name__.split(".")
    for i in range(1, len(parts)):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    monkeypatch.setitem(sys.modules, base.__name__, base)
    vc._made.clear()
    yield base
    vc._made.clear()
    vc.__dict__.pop("KvpalaceConnector", None)


def test_subclass_of_the_base(daemon, fake_vllm_base):
    cls = vc.KvpalaceConnector
    assert issubclass(cls, fake_vllm_base.KVConnectorBase_V1) and not cls.__abstractmethods__
    assert cls.__module__ == "kvpalace.vllm_connector"
    assert isinstance(vc.KvpalaceConnectorMetadata(), fake_vllm_base.KVConnectorMetadata)
    eng = Engine(cls, daemon.sock, model_id())
    try:
        assert eng.sched.base_init[1] == 0 and eng.workers[0].base_init[1] == 1
        a = prompt(99, 100)
        _saved_then_new(eng, "V", a)
        eng.add(Request("V", a))
        so = eng.schedule()
        eng.execute(so)
        assert eng.load_check[(0, "V")] == (6, 0, [])
    finally:
        eng.close()


def test_newer_vllm_step_order(daemon, impl):
    """The newer runner: handle_preemptions(metadata) every step, and
    start_load_kv after the forward unless has_sync_kv_loads. The connector
    sets it whenever a step loads or saves, so loads land before the
    forward reads them and saves reserve before the layers copy."""
    eng = Engine(impl, daemon.sock, model_id())
    eng.newer_order = True
    try:
        a = prompt(41, 200)
        eng.add(Request("A", a))
        so = eng.schedule()
        assert so.has_sync_kv_loads is True  # a save
        eng.execute(so)
        eng.run_until_idle()
        assert lookup(eng, a) == 192
        eng.add(Request("B", a))
        so = eng.schedule()
        assert so.has_sync_kv_loads is True and eng.last_matched["B"] == 192
        eng.execute(so)
        assert eng.load_check[(0, "B")] == (12, 0, [])
        for _ in range(2):
            so = eng.schedule()  # decode steps: nothing to load or save
            assert so.has_sync_kv_loads is False
            eng.execute(so)
        eng.preempt("B")
        so = eng.schedule()
        assert "B" in so.kv_connector_metadata.preempted
        eng.execute(so)  # handle_preemptions got the metadata, not a set
        assert eng.load_check[(0, "B")] == (12, 0, [])
        # get_transfer_results, as newer runners ask: A, which saved, is done sending.
        assert eng.finish("A") is True
        so = eng.schedule()
        w = eng.workers[0]
        w.bind_connector_metadata(so.kv_connector_metadata)
        res = w.get_transfer_results(so.finished_req_ids)
        w.clear_connector_metadata()
        assert res.finished_sending == {"A"} and not res.finished_recving
    finally:
        eng.close()


def test_a_layer_never_saved_is_never_published(daemon, impl):
    """A step whose save_kv_layer a replayed full CUDA graph skipped for a
    layer: nothing of it is committed (those pages hold no KV), and the
    connector asks vLLM for piecewise graphs in the first place."""
    assert impl.requires_piecewise_for_cudagraph({}) is True
    eng = Engine(impl, daemon.sock, model_id())
    eng.graph_skips_layers = {2}
    try:
        a = prompt(43, 100)
        eng.add(Request("A", a))
        eng.run_until_idle()
        assert lookup(eng, a) == 0
        assert eng.workers[0].stats.saves_dropped >= 1
        eng.graph_skips_layers = set()
        b = prompt(44, 100)
        eng.add(Request("B", b))
        eng.run_until_idle()
        assert lookup(eng, b) == 96
    finally:
        eng.close()


def test_pipeline_parallel_refused(daemon, impl):
    from vllm_driver import vllm_config
    cfg = vllm_config(daemon.sock, model_id(), 4, 8, 64, 16)
    cfg.parallel_config.pipeline_parallel_size = 2
    with pytest.raises(ValueError, match="pipeline"):
        impl(cfg, 0)


def test_mla_latent_shared_by_ranks(daemon, impl):
    """vLLM's MLA caches ([num_blocks, block_size, 576] a layer) on two
    tensor-parallel ranks: one latent pool for both, half the bytes of the
    same width as K/V; rank 0 alone saves, both load every byte."""
    eng = Engine(impl, daemon.sock, model_id(), n_layers=2, n_heads=1, head_dim=576,
                 tp_size=2, mla=True)
    try:
        assert len(eng.sched._pools) == 1
        pool = eng.sched._pools[0]
        assert pool.layout.format == "latent" and pool.layout.n_kv_heads == 1
        assert pool.page_bytes < 2 * 16 * 576 * 2 * 2  # one plane of 2 layers
        a = prompt(51, 100)
        eng.add(Request("A", a))
        eng.run_until_idle()
        assert lookup(eng, a) == 96
        assert eng.workers[1].stats.bytes_saved == 0 and eng.workers[0].stats.bytes_saved > 0
        eng.add(Request("B", a))
        so = eng.schedule()
        assert eng.last_matched["B"] == 96
        eng.execute(so)
        assert eng.load_check[(0, "B")] == (6, 0, [])
        assert eng.load_check[(1, "B")] == (6, 0, [])
    finally:
        eng.close()
