"""kvpalace.sglang_backend: kvpalace as an SGLang HiCache storage backend
(the L3 tier under SGLang's host memory pool), loaded through SGLang's
dynamic backend mechanism:

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvpalace",
            "module_path": "kvpalace.sglang_backend",
            "class_name": "KvpalaceHiCacheStorage", "interface_v1": 1}'

Written against SGLang's interface as read at sgl-project/sglang commit
001067fffe33427bee0ed2f007fb7551a1d76b44 (python/sglang/srt/mem_cache/
hicache_storage.py: HiCacheStorage, HiCacheStorageConfig; storage/
backend_factory.py: StorageBackendFactory._create_dynamic_backend, which
imports module_path, checks issubclass(cls, HiCacheStorage) and calls
cls(storage_config, kwargs); managers/cache_controller.py:
HiCacheController, which calls register_mem_pool_host(host_pool) next,
then from its threads batch_exists (prefetch: the leading run of stored
pages), batch_get_v1 or batch_get (prefetch I/O), batch_set_v1 or
batch_set (write-back); "interface_v1": 1 picks the _v1 calls for a
dynamic backend) and at commit 0047d999bb3a3ad311df5a4b6356bfb5586e0d66
(mem_cache/pool_host/mha.py, mla.py: the host KV buffer layouts). Nothing
of SGLang's code is copied.

The mapping. SGLang names a page by a string, a hash chained over the
page's tokens and every page before it (64 hex characters), so a key alone
stands for the whole prefix up to its page. Each SGLang page is stored as
a one-page kvpalace chain: block_tokens placeholder tokens (zeros) under
the extra key of its SGLang key (the key's bytes, or their 32-byte
BLAKE2b when longer than kvpalace's 64). Such a page is found from its
key alone, whatever SGLang holds before it (it asks for runs that start
mid-prompt, after what its device and host tiers hold), is immutable
(content-addressed: a key set twice stores once; kvpalace dedups the
commit) and cannot meet an ordinary prompt's chain (the extra key is
folded into the chain's root). exists -> Pool.lookup_batch (side-effect
free, 64 keys a request); get -> Pool.match, copy, release; set ->
lookup_batch for what is there already, then Pool.session(extra_key),
append, copy, commit. The page size of SGLang (--page-size) is the pool's
block_tokens.

Pages hold kvpalace's layout (per layer K then V, [head][token][dim]), not
SGLang's host layout, so any SGLang host layout reads what any other
wrote: "layer_first", "page_first", "page_first_direct" and "page_head"
(MHA), and "layer_first", "page_first", "page_first_direct" (MLA). The
copy is one pass between the host pool and the daemon's shared arena:
kvpalace's C engine adapter (Lease.to_engine / Session.from_engine) for
every MHA layout (EngineCache kind "sglang" for "layer_first", kind
"strided" views of the buffer for the others), torch's strided copy
between the host buffer and Page.tensor() for MLA and flat pages. An MLA latent row of width D (kv_lora_rank +
qk_rope_head_dim) is stored as one head of D/2: its first half as K, the
second as V (no space wasted on an empty V).

Tensor parallelism: each rank opens the pool of its rank
(Client.open_pool(model, layout, tp_rank, tp_size); the layout is the
rank's share of heads), so ranks never read each other's heads; for MLA
(is_mla_model: every rank holds the same latent) all ranks share one pool
and only rank 0 writes (SGLang skips the others' write-back too). Pipeline
and attention context parallel ranks get their own pools by model id
suffix.

Failures are misses, never wrong bytes: a key whose match comes back short
or raises is False (get) or ends the leading run (exists); a lost
connection fails the keys it reaches and is reopened by a later call.

extra_config keys read here, besides SGLang's: "kvpalace_socket" (the
daemon's socket; default $KVPALACE_SOCKET, else libkvpalace's default),
"kvpalace_model_id" (default: SGLang's model name, else "sglang").

Importable without SGLang: the class SGLang loads, KvpalaceHiCacheStorage,
is made on first access (a module __getattr__) as a subclass of SGLang's
HiCacheStorage, and raises a clear ImportError then when SGLang is
missing. KvpalaceStorage is the same backend without SGLang's base class
(for tests and tools); make_backend_class(base) makes it over a given one.
"""

import errno
import hashlib
import logging
import threading
import time

import numpy as np

import kvpalace

# KvpalaceHiCacheStorage is left out: a star import must not need SGLang.
__all__ = ["KvpalaceStorage", "make_backend_class", "pool_model_id", "storage_key"]

logger = logging.getLogger(__name__)

MAX_KEY_BYTES = 64  # kvpalace's extra key: 1..64 bytes
LOOKUP_BATCH_MAX = 64  # prompts per kvp_lookup_batch request
_RECONNECT_INTERVAL_S = 1.0

_DTYPES = {"torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32"}


def storage_key(key):
    """The kvpalace extra key of an SGLang page key (str or bytes): its
    UTF-8 bytes, or their 32-byte BLAKE2b when empty or over 64 bytes."""
    b = key.encode() if isinstance(key, str) else bytes(key)
    if 0 < len(b) <= MAX_KEY_BYTES:
        return b
    return hashlib.blake2b(b, digest_size=32, person=b"kvp-sglang").digest()


def pool_model_id(name):
    """A kvpalace model id (1..127 bytes of printable ASCII, room left for
    the "#tp<rank>/<size>" suffix) for SGLang's model name: the name when
    it is one, else its tail and a hash of it."""
    if name and len(name) <= 96 and all(" " <= ch <= "~" for ch in name):
        return name
    h = hashlib.blake2b(name.encode("utf-8", "replace"), digest_size=8).hexdigest()
    tail = "".join(ch if " " <= ch <= "~" else "_" for ch in name[-64:])
    return "%s~%s" % (tail, h)


class _HostPages:
    """SGLang's host KV buffer (MHATokenToKVPoolHost or MLATokenToKVPoolHost
    of pool_host/), seen page by page in kvpalace's page order
    [layer][k|v][head][token][dim] as strided torch views, no copy:
    view(index) of the page that starts at token slot index, flat(t) of a
    page SGLang hands over flattened in its host layout's order
    (get_data_page / get_dummy_flat_data_page). Copies between such a view
    and a kvpalace page's tensor (Page.tensor(): the same dtype) are
    torch's strided copy_."""

    def __init__(self, host, is_mla):
        self.layout_name = lay = host.layout
        self.page_size = ps = int(host.page_size)
        self.is_mla = is_mla
        buf = getattr(host, "kv_buffer", None)
        if buf is None:
            raise ValueError("host pool %s has no kv_buffer: hybrid host pools (Mamba, SWA "
                             "groups) are not supported by kvpalace's SGLang backend"
                             % type(host).__name__)
        if isinstance(buf, (tuple, list)):
            raise ValueError("K and V of different head dims (two host buffers) are not "
                             "supported by kvpalace's SGLang backend")
        self.dtype = _DTYPES.get(str(buf.dtype))
        if self.dtype is None:
            raise ValueError("host KV dtype %s: kvpalace's SGLang backend stores f16, bf16 "
                             "and f32" % buf.dtype)
        if buf.device.type != "cpu":
            raise ValueError("kvpalace's SGLang backend needs the host pool in CPU memory, "
                             "not on %s" % buf.device)
        if not buf.is_contiguous():
            raise ValueError("the host KV buffer is not contiguous")
        self.buf = buf
        self.engine = None
        s = tuple(buf.shape)
        if not is_mla:
            if lay == "layer_first":  # [2, L, slots, H, D]
                _, L, _, H, D = s
                self._page = lambda i: buf[:, :, i:i + ps]  # [2, L, ps, H, D]
                self.perm = (1, 0, 3, 2, 4)
                self.page_shape = (2, L, ps, H, D)
            elif lay == "page_first":  # [2, slots, L, H, D]
                _, _, L, H, D = s
                self._page = lambda i: buf[:, i:i + ps]  # [2, ps, L, H, D]
                self.perm = (2, 0, 3, 1, 4)
                self.page_shape = (2, ps, L, H, D)
            elif lay == "page_first_direct":  # [2, pages, L, ps, H, D]
                _, _, L, _, H, D = s
                self._page = lambda i: buf[:, i // ps]  # [2, L, ps, H, D]
                self.perm = (1, 0, 3, 2, 4)
                self.page_shape = (2, L, ps, H, D)
            elif lay == "page_head":  # [2, pages, H, ps, L, D]
                _, _, H, _, L, D = s
                self._page = lambda i: buf[:, i // ps]  # [2, H, ps, L, D]
                self.perm = (3, 0, 1, 2, 4)
                self.page_shape = (2, H, ps, L, D)
            else:
                raise ValueError("host layout %r is not supported by kvpalace's SGLang "
                                 "backend" % lay)
            self.n_layers, self.n_heads, self.head_dim = L, H, D
            self._split = None
        else:
            if lay == "layer_first":  # [L, slots, 1, D]
                L, _, one, D = s
                self._page = lambda i: buf[:, i:i + ps]  # [L, ps, 1, D]
                self.perm = (0, 3, 2, 1, 4)  # [L, ps, 1, 2, D/2] -> [L, 2, 1, ps, D/2]
                self.page_shape = (L, ps, one, D)
            elif lay == "page_first":  # [slots, L, 1, D]
                _, L, one, D = s
                self._page = lambda i: buf[i:i + ps]  # [ps, L, 1, D]
                self.perm = (1, 3, 2, 0, 4)
                self.page_shape = (ps, L, one, D)
            elif lay == "page_first_direct":  # [pages, L, ps, 1, D]
                _, L, _, one, D = s
                self._page = lambda i: buf[i // ps]  # [L, ps, 1, D]
                self.perm = (0, 3, 2, 1, 4)
                self.page_shape = (L, ps, one, D)
            else:
                raise ValueError("MLA host layout %r is not supported by kvpalace's SGLang "
                                 "backend" % lay)
            if one != 1 or D % 2:
                raise ValueError("MLA latent [.., %d, %d]: kvpalace's SGLang backend stores "
                                 "one head of even width" % (one, D))
            self.n_layers, self.n_heads, self.head_dim = L, 1, D // 2
            self._split = D // 2
        n = 1
        for d in self.page_shape:
            n *= d
        self.page_elems = n
        self.page_bytes = n * buf.element_size()
        if not is_mla and hasattr(kvpalace, "EngineCache"):
            # The C adapters, one call a list of pages: per layer a K and a V
            # pool [slots, H, D] for layer_first; for the other layouts, K and
            # V views [pages, ps, H, D] of the buffer (kind "strided").
            L = self.n_layers
            if lay == "layer_first":
                kind, k, v = "sglang", [buf[0][i] for i in range(L)], [buf[1][i] for i in range(L)]
            elif lay == "page_first":
                kind = "strided"
                k, v = ([buf[x][:, i].unflatten(0, (-1, ps)) for i in range(L)] for x in (0, 1))
            elif lay == "page_first_direct":
                kind = "strided"
                k, v = ([buf[x][:, i] for i in range(L)] for x in (0, 1))
            else:  # page_head: [pages, H, ps, L, D]
                kind = "strided"
                k, v = ([buf[x][..., i, :].permute(0, 2, 1, 3) for i in range(L)]
                        for x in (0, 1))
            try:
                self.engine = kvpalace.EngineCache(kind, k, v,
                                                   block_size=ps if kind == "sglang" else None)
            except (TypeError, ValueError, RuntimeError, kvpalace.Error) as e:
                logger.info("kvpalace: EngineCache not usable (%s); torch copies", e)

    def layout(self):
        return kvpalace.Layout(self.n_layers, self.n_heads, self.head_dim, self.page_size,
                               self.dtype)

    def _canon(self, page):
        """A page in host order as a view in kvpalace's order."""
        if self._split is not None:
            page = page.view(tuple(page.shape[:-1]) + (2, self._split))
        return page.permute(self.perm)

    def view(self, index):
        return self._canon(self._page(index))

    def flat(self, t):
        if t.dtype != self.buf.dtype or t.numel() != self.page_elems:
            raise ValueError("a flat page of %d %s, not %d %s" %
                             (t.numel(), t.dtype, self.page_elems, self.buf.dtype))
        return self._canon(t.view(-1).view(self.page_shape))


class KvpalaceStorage:
    """kvpalace as an SGLang HiCache storage backend, without SGLang's base
    class (KvpalaceHiCacheStorage adds it). The calls are SGLang's
    HiCacheStorage's; see the module's text for the mapping and the rules."""

    def __init__(self, storage_config=None, kwargs=None, *, client_factory=None):
        cfg = storage_config
        extra = dict(getattr(cfg, "extra_config", None) or {})
        self.extra_config = extra
        self.tp_rank = int(getattr(cfg, "tp_rank", 0) or 0)
        self.tp_size = int(getattr(cfg, "tp_size", 1) or 1)
        self.is_mla = bool(getattr(cfg, "is_mla_model", False))
        self.socket = extra.get("kvpalace_socket")
        self.prefetch_on_exists = bool(extra.get("kvpalace_prefetch", True))
        model = extra.get("kvpalace_model_id") or getattr(cfg, "model_name", None) or "sglang"
        pp_size = int(getattr(cfg, "pp_size", 1) or 1)
        if pp_size > 1:
            model += "-pp%dof%d" % (int(getattr(cfg, "pp_rank", 0)), pp_size)
        cp_size = int(getattr(cfg, "attn_cp_size", 1) or 1)
        if cp_size > 1:
            model += "-cp%dof%d" % (int(getattr(cfg, "attn_cp_rank", 0)), cp_size)
        self.model_id = pool_model_id(model)
        if getattr(cfg, "should_split_heads", False):
            raise ValueError("kvpalace's SGLang backend does not split heads across "
                             "heterogeneous TP sizes (tp_lcm_size)")
        self._client_factory = client_factory or kvpalace.Client
        # A connection per calling thread: SGLang's prefetch, prefetch I/O
        # and backup threads call at once, and calls on one Client wait for
        # each other (its lock), so an exists would queue behind a
        # write-back of 128 pages. _conns holds them all, for close().
        self._lock = threading.Lock()
        self._tls = threading.local()
        self._conns = []
        self.host = None
        self.mem_pool_host = None
        self._placeholder = None
        self.stats = dict(exists_calls=0, get_pages=0, get_hits=0, set_pages=0, set_new=0,
                          bytes_served=0, bytes_copied=0, bytes_stored=0, errors=0,
                          reconnects=0, prefetched=0, kvpalace_s=0.0)
        # The factory of a built-in backend passes the host pool second.
        if kwargs is not None and hasattr(kwargs, "kv_buffer"):
            self.register_mem_pool_host(kwargs)

    # ---- setup -------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        """SGLang hands its host KV pool over (HiCacheController, right after
        creating the backend): the pool's geometry is the kvpalace layout,
        and its buffer where pages are copied from and to."""
        self.mem_pool_host = mem_pool_host
        self.host = _HostPages(mem_pool_host, self.is_mla)
        self._placeholder = np.zeros(self.host.page_size, dtype=np.uint32)
        self.close()
        if self._connect(force=True) is None:
            raise kvpalace.ConnectionLost(errno.ENOTCONN, "kvpalace: no daemon at %s"
                                          % (self.socket or "the default socket"))

    def register_mem_host_pool_v2(self, *args, **kwargs):
        """SGLang's hybrid pools (Mamba, SWA, DSA indexer): refused at
        attach, where SGLang reports it, rather than in its I/O thread
        later, which has no handler and would end the storage tier."""
        raise NotImplementedError("kvpalace's SGLang backend stores full-attention KV "
                                  "pools only (no Mamba, SWA or DSA pools)")

    def _connect(self, force=False):
        """This thread's connection and pool, made now (at most once a second
        unless forced); None when there is no daemon."""
        tls = self._tls
        now = time.monotonic()
        if not force and now - getattr(tls, "last_connect", 0.0) < _RECONNECT_INTERVAL_S:
            return None
        tls.last_connect = now
        try:
            c = self._client_factory(self.socket)
        except kvpalace.Error as e:
            logger.warning("kvpalace: cannot connect to %s: %s", self.socket or "default", e)
            return None
        try:
            if self.is_mla:
                p = c.open_pool(self.model_id, self.host.layout())
            else:
                p = c.open_pool(self.model_id, self.host.layout(), tp_rank=self.tp_rank,
                                tp_size=self.tp_size if self.tp_size > 1 else 0)
        except Exception as e:  # noqa: BLE001
            c.close()
            if force:
                raise
            logger.warning("kvpalace: cannot open the pool %r again: %s", self.model_id, e)
            return None
        tls.client, tls.pool = c, p
        with self._lock:
            self._conns.append(c)
        return p

    def _drop(self, client):
        with self._lock:
            if client in self._conns:
                self._conns.remove(client)
        try:
            client.close()
        except Exception:
            pass

    def _get_pool(self):
        """This thread's pool, connecting on a thread's first call and
        reconnecting (at most once a second) after a loss; None when there is
        no daemon."""
        if self.host is None:
            raise RuntimeError("kvpalace: register_mem_pool_host was not called")
        tls = self._tls
        p = getattr(tls, "pool", None)
        if p is not None and not p.closed:
            return p
        first = getattr(tls, "last_connect", None) is None
        p = self._connect(force=first)
        if p is not None and not first:
            self.stats["reconnects"] += 1
        return p

    def _lost(self, pool, e):
        """A call on pool failed with e: count it, and drop the connection
        when it is gone (the next call reconnects)."""
        self.stats["errors"] += 1
        if isinstance(e, (kvpalace.ConnectionLost, kvpalace.ForkedChild)) or (
                isinstance(e, ValueError) and pool.closed):
            tls = self._tls
            if getattr(tls, "pool", None) is pool:
                self._drop(tls.client)
                tls.client = tls.pool = None
            return True
        return False

    def close(self):
        """Closes every thread's connection (a thread's next call reconnects)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.close()
            except Exception:
                pass

    # ---- exists -----------------------------------------------------------

    def _exist_flags(self, keys, stop_at_miss=True, prefetch=False):
        """Per key, whether its page is stored (host memory or disk), by
        lookup_batch; with stop_at_miss, the batches after one with a miss
        are not asked (False). With prefetch, the leading run's pages that
        are only on disk are asked to come in (Pool.prefetch: the get that
        follows waits less). Keys after a failure are False."""
        flags = [False] * len(keys)
        pool = self._get_pool()
        if pool is None:
            return flags
        ph = self._placeholder
        bt = self.host.page_size
        on_disk = [False] * len(keys)
        t0 = time.perf_counter()
        try:
            for start in range(0, len(keys), LOOKUP_BATCH_MAX):
                chunk = keys[start:start + LOOKUP_BATCH_MAX]
                res = pool.lookup_batch([ph] * len(chunk),
                                        extra_keys=[storage_key(k) for k in chunk])
                for j, (matched, host) in enumerate(res):
                    flags[start + j] = matched >= bt
                    on_disk[start + j] = matched >= bt and host < bt
                if stop_at_miss and not all(flags[start:start + len(chunk)]):
                    break
            if prefetch:
                run = flags.index(False) if False in flags else len(flags)
                for i in range(run):
                    if on_disk[i]:
                        pool.prefetch(ph, extra_key=storage_key(keys[i]))
                        self.stats["prefetched"] += 1
        except (kvpalace.Error, ValueError) as e:
            self._lost(pool, e)
            logger.warning("kvpalace: lookup failed: %s", e)
        finally:
            self.stats["kvpalace_s"] += time.perf_counter() - t0
        return flags

    def batch_exists(self, keys, extra_info=None):
        """How many of keys, from the first, are stored (SGLang asks before
        a prefetch, STORAGE_BATCH_SIZE keys at a time)."""
        self.stats["exists_calls"] += 1
        flags = self._exist_flags(list(keys), prefetch=self.prefetch_on_exists)
        return flags.index(False) if False in flags else len(flags)

    def exists(self, key):
        return self._exist_flags([key])[0]

    # ---- get --------------------------------------------------------------

    def _get_pages(self, keys, dst_fn):
        """For each key, match its page and copy it where dst_fn(i) says
        (an int: the host pool's token slot; else a view in kvpalace's
        order). Returns a bool per key."""
        n = len(keys)
        out = [False] * n
        self.stats["get_pages"] += n
        pool = self._get_pool()
        if pool is None:
            return out
        ph = self._placeholder
        bt = self.host.page_size
        host = self.host
        t0 = time.perf_counter()
        try:
            for i, key in enumerate(keys):
                try:
                    lease = pool.match(ph, extra_key=storage_key(key))
                except (kvpalace.Error, ValueError) as e:
                    if self._lost(pool, e):
                        logger.warning("kvpalace: connection lost at page %d of %d: %s",
                                       i, n, e)
                        break
                    logger.warning("kvpalace: match of %s failed: %s", key, e)
                    continue
                with lease:
                    if lease.tokens < bt:
                        continue
                    try:
                        self._copy_out(lease, dst_fn(i))
                    except Exception as e:  # noqa: BLE001 - a miss, not a dead SGLang thread
                        logger.error("kvpalace: copying page %s out failed: %s", key, e)
                        continue
                out[i] = True
                self.stats["get_hits"] += 1
                self.stats["bytes_served"] += host.page_bytes
                self.stats["bytes_copied"] += host.page_bytes
        finally:
            self.stats["kvpalace_s"] += time.perf_counter() - t0
        return out

    def _copy_out(self, lease, dst):
        host = self.host
        if isinstance(dst, int) and host.engine is not None:
            lease.to_engine(host.engine, [dst // host.page_size])
            return
        if isinstance(dst, int):
            dst = host.view(dst)
        dst.copy_(lease.page(0).tensor())

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Zero-copy get: page i of keys into the host pool's slots from
        host_indices[i * page_size] on. A bool per key."""
        starts = _page_starts(host_indices, self.host.page_size, len(keys))
        return self._get_pages(list(keys), lambda i: starts[i])

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Get into flat pages (get_dummy_flat_data_page tensors): a list of
        the filled tensors, None for a miss."""
        keys = list(keys)
        targets = list(target_locations)
        ok = self._get_pages(keys, lambda i: self.host.flat(targets[i]))
        return [t if k else None for t, k in zip(targets, ok)]

    def get(self, key, target_location=None, target_sizes=None):
        if target_location is None:
            target_location = self.mem_pool_host.get_dummy_flat_data_page()
        return self.batch_get([key], [target_location])[0]

    # ---- set --------------------------------------------------------------

    def _set_pages(self, keys, src_fn):
        """Store each key's page from src_fn(i) (as _get_pages' dst_fn) unless
        it is stored already. Returns a bool per key."""
        n = len(keys)
        self.stats["set_pages"] += n
        if self.is_mla and self.tp_rank != 0:
            return [True] * n  # rank 0 writes the shared latent
        out = self._exist_flags(keys, stop_at_miss=False)
        pool = self._get_pool()
        if pool is None:
            return [False] * n
        ph = self._placeholder
        host = self.host
        t0 = time.perf_counter()
        try:
            for i, key in enumerate(keys):
                if out[i]:
                    continue
                try:
                    with pool.session(extra_key=storage_key(key)) as s:
                        s.append(ph)
                        self._copy_in(s, src_fn(i))
                        s.commit()
                except Exception as e:  # noqa: BLE001 - a failed page, not a dead thread
                    if self._lost(pool, e):
                        logger.warning("kvpalace: connection lost at page %d of %d: %s",
                                       i, n, e)
                        break
                    logger.warning("kvpalace: storing %s failed: %s", key, e)
                    continue
                out[i] = True
                self.stats["set_new"] += 1
                self.stats["bytes_stored"] += host.page_bytes
        finally:
            self.stats["kvpalace_s"] += time.perf_counter() - t0
        return out

    def _copy_in(self, session, src):
        """src (a host slot, or a view in kvpalace's order) into the
        session's page 0; no view of the page is left (commit needs that)."""
        host = self.host
        if isinstance(src, int) and host.engine is not None:
            session.from_engine(host.engine, [src // host.page_size])
            return
        if isinstance(src, int):
            src = host.view(src)
        dst = session.page(0).tensor()
        dst.copy_(src)

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Zero-copy set: page i of keys from the host pool's slots from
        host_indices[i * page_size] on. A bool per key."""
        starts = _page_starts(host_indices, self.host.page_size, len(keys))
        return self._set_pages(list(keys), lambda i: starts[i])

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Set from flat pages (get_data_page(flat=True) tensors): True when
        every page is stored."""
        keys = list(keys)
        values = list(values)
        return all(self._set_pages(keys, lambda i: self.host.flat(values[i])))

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value])

    # ---- the rest ---------------------------------------------------------

    def clear(self):
        """SGLang's "clear the storage": kvpalace's pages are shared with
        other engines and evicted by the daemon, so nothing is deleted."""
        logger.info("kvpalace: clear() leaves the daemon's pages (evicted by its policy)")

    def get_stats(self):
        return None  # SGLang's StorageMetrics; counters are in .stats

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _page_starts(host_indices, page_size, n_keys):
    if hasattr(host_indices, "tolist"):
        idx = host_indices.tolist()
    else:
        idx = list(host_indices)
    if len(idx) != n_keys * page_size:
        raise ValueError("%d host indices for %d pages of %d tokens" %
                         (len(idx), n_keys, page_size))
    return [int(idx[i * page_size]) for i in range(n_keys)]


def make_backend_class(base, name="KvpalaceHiCacheStorage"):
    """KvpalaceStorage as a subclass of base (SGLang's HiCacheStorage); ours
    come first in the MRO, so the base's abstract methods are overridden."""
    return type(name, (KvpalaceStorage, base), {"__module__": __name__})


_made = {}


def _hicache_base():
    try:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
    except ImportError as e:
        raise ImportError(
            "kvpalace.sglang_backend.KvpalaceHiCacheStorage is SGLang's HiCache storage "
            "backend and needs SGLang (sglang.srt.mem_cache.hicache_storage) importable: "
            "%s. Without SGLang use kvpalace.sglang_backend.KvpalaceStorage." % e) from e
    return HiCacheStorage


def __getattr__(name):
    if name == "KvpalaceHiCacheStorage":
        if name not in _made:
            _made[name] = make_backend_class(_hicache_base())
        return _made[name]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
