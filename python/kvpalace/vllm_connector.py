"""kvpalace as a vLLM v1 KV connector: ``KvpalaceConnector``.

Turned on with::

    vllm serve MODEL --disable-hybrid-kv-cache-manager \
        --kv-transfer-config '{"kv_connector": "KvpalaceConnector",
        "kv_connector_module_path": "kvpalace.vllm_connector", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": "/run/kvpalace/kvpalace.sock"}}'

(``kv_load_failure_policy`` "recompute": vLLM's default, "fail", fails a
request whose load failed instead of recomputing the blocks reported.)

vLLM's KVConnectorFactory (vllm/distributed/kv_transfer/kv_connector/factory.py,
read at blob a4cd9d0d) imports ``kv_connector_module_path`` with importlib when
``kv_connector`` is not one of its registered names, takes the class of that
name from the module with getattr, and constructs it once per role as
``cls(vllm_config, role, kv_cache_config)``; it refuses a connector that
is not SupportsHMA while the hybrid KV cache manager is on, hence the
flag (this connector handles one KV cache group). The interface implemented here is
KVConnectorBase_V1 of vllm/distributed/kv_transfer/kv_connector/v1/base.py (read
at blob 13f4ad0f); the objects it is handed are those of vllm/v1/request.py
(Request: request_id, prompt_token_ids, all_token_ids, lora_request,
cache_salt, mm_features[i].identifier / .mm_position.offset, .length; blob
dba83d52) and vllm/v1/core/sched/output.py (SchedulerOutput, NewRequestData,
CachedRequestData; blob 00e8f1fd). The call order was learnt from
v1/example_connector.py (blob 4c165421) and the scheduler's call sites.

This module imports without vLLM: the class vLLM names is made on first
access of ``kvpalace.vllm_connector.KvpalaceConnector`` (PEP 562 module
``__getattr__``) as a subclass of vLLM's KVConnectorBase_V1 and of
``KvpalaceConnectorImpl``, which holds all the logic and needs only kvpalace;
without vLLM that access raises ImportError saying so. Tests drive
``KvpalaceConnectorImpl`` directly with stand-ins for vLLM's objects.

How a request flows (one KV cache group, full-attention layers):

- scheduler, ``get_num_new_matched_tokens``: ``Pool.lookup`` of the request's
  tokens in every tensor-parallel rank's pool (the smallest wins), capped
  below the last token (vLLM must compute one) and cut to whole blocks. It
  changes nothing and may be called any number of times.
- scheduler, ``update_state_after_alloc``: where kvpalace holds a prefix,
  ``Pool.match`` in every rank's pool takes a lease on it; the lease ids go
  to the workers in the metadata, with the engine blocks to load (blocks a
  lease turns out shorter than promised are sent as failed, never loaded).
- scheduler, ``build_connector_meta``: the leases taken this step, and a
  save for every request whose computed prompt grew by whole blocks past
  what kvpalace holds of it (a full hit saves nothing).
- worker, ``start_load_kv``: ``Pool.adopt`` of its rank's lease and
  ``Lease.to_engine`` into the registered caches, in chunks of blocks; a
  chunk that fails makes it and every later block of that request failed
  (``get_block_ids_with_load_errors``), their engine blocks zeroed so no
  partial copy is ever read, and that request saves nothing afterwards.
  Loads are synchronous (the copy runs with the GIL released), so
  ``wait_for_layer_load`` has nothing to wait for.
- worker, ``save_kv_layer``: per layer, ``Session.from_engine`` of the new
  whole blocks into the request's session (a fork of the lease it loaded
  from, so the prefix is not copied back); ``wait_for_save`` commits.
  Only prompt tokens are saved.
- a cache on a GPU: kvpalace.EngineCache is over host memory, so the
  worker copies through a host staging buffer of ``staging_blocks`` blocks
  per layer (pinned), with torch moving blocks between it and the device:
  two copies per byte served instead of one.
- scheduler, ``request_finished``: releases its leases and answers True
  (free the blocks later) for a request that had saves, which the workers
  then report in ``get_finished`` once its session is closed.

Mappings: vLLM's block_size must equal the pool's block_tokens (refused
otherwise); tensor-parallel rank r of t is ``open_pool(tp_rank=r,
tp_size=t)``; a LoRA adapter is the extra key ``b"lora:" + name``; a
request's cache_salt is the kvpalace salt; multimodal items are key spans
(their hash over their placeholder tokens). Keys over 64 bytes are
replaced by their SHA-256.

``kv_connector_extra_config`` keys: ``socket`` (the daemon's socket; else
$KVPALACE_SOCKET, else the library's default), ``model_id`` (default the
served model's name), ``dtype`` ("bf16", "f16", "f32"; default from the
cache tensors or the model's dtype), ``kv_layout`` ("flash_attn",
"flashinfer_nhd", "flashinfer_hnd"; default from the tensors' shape),
``load_chunk_blocks`` (64), ``staging_blocks`` (128, for a device cache;
set on a CPU cache it forces the staging path), ``tp_rank`` (override).
"""

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import kvpalace as _kvp

# KvpalaceConnector is left out: a star import must not need vLLM.
__all__ = ["KvpalaceConnectorImpl", "KvpalaceConnectorMetadata", "LeaseSpec", "SaveSpec"]

ROLE_SCHEDULER = 0  # the values of vLLM's KVConnectorRole
ROLE_WORKER = 1


def _role_value(role) -> int:
    return int(getattr(role, "value", role))


def _key64(prefix: bytes, data) -> bytes:
    """A salt or extra key of 1..64 bytes: prefix + data, or its SHA-256."""
    if isinstance(data, str):
        data = data.encode()
    key = prefix + bytes(data)
    return key if len(key) <= 64 else hashlib.sha256(key).digest()


# ---- metadata, scheduler -> workers (pickled by vLLM) ----------------------


@dataclass
class LeaseSpec:
    """A lease per rank on a kvpalace prefix: load pages first_page.. into
    block_ids (may be none: the lease is only forked by a save), and report
    failed_block_ids failed without loading them."""
    req_id: str
    lease_ids: Tuple[int, ...]
    lease_tokens: int
    first_page: int
    block_ids: List[int]
    failed_block_ids: List[int] = field(default_factory=list)
    keep: bool = False  # a save will fork from it: hold it until then


@dataclass
class SaveSpec:
    """Save the request's tokens[:len(tokens)] (whole blocks, the engine's
    blocks block_ids) into kvpalace; the worker copies only the blocks its
    session does not have yet."""
    req_id: str
    tokens: List[int]
    block_ids: List[int]
    salt: Optional[bytes] = None
    extra_key: Optional[bytes] = None
    key_spans: Optional[List[Tuple[int, int, bytes]]] = None


@dataclass
class KvpalaceConnectorMetadata:
    leases: List[LeaseSpec] = field(default_factory=list)
    saves: List[SaveSpec] = field(default_factory=list)
    # This step's preempted requests: newer vLLM hands handle_preemptions
    # the metadata instead of the set of ids.
    preempted: set = field(default_factory=set)


@dataclass
class TransferResults:
    """The fields of newer vLLM's KVConnectorTransferResults, where it is not
    importable."""
    finished_sending: set = field(default_factory=set)
    finished_recving: set = field(default_factory=set)
    failed_recving: set = field(default_factory=set)


# ---- reading vLLM's objects --------------------------------------------------


def _extra_config(ktc) -> Dict[str, Any]:
    return dict(getattr(ktc, "kv_connector_extra_config", None) or {})


def _request_keys(request):
    """(salt, extra_key, key_spans) of a vLLM Request (or NewRequestData)."""
    salt = getattr(request, "cache_salt", None)
    salt = _key64(b"", salt) if salt else None
    lora = getattr(request, "lora_request", None)
    extra = None
    if lora is not None:
        name = getattr(lora, "lora_name", None) or str(getattr(lora, "lora_int_id", ""))
        extra = _key64(b"lora:", name)
    spans = []
    feats = getattr(request, "mm_features", None)
    if feats:
        for f in feats:
            pos = f.mm_position
            spans.append((int(pos.offset), int(pos.length), _key64(b"mm:", f.identifier)))
    else:  # older vLLM: parallel lists
        hashes = getattr(request, "mm_hashes", None) or []
        positions = getattr(request, "mm_positions", None) or []
        for h, pos in zip(hashes, positions):
            spans.append((int(pos.offset), int(pos.length), _key64(b"mm:", h)))
    return salt, extra, (spans or None)


def _clip_spans(spans, lo, hi):
    """The key spans over tokens [lo, hi), cut to that range (absolute
    positions), or None: for lookups and matches of a prefix, where a span
    may not run past the tokens. Cutting a span's end changes no page's
    key (a page hashes the key and the span's start relative to it)."""
    out = []
    for first, n, key in spans or ():
        a, b = max(first, lo), min(first + n, hi)
        if a < b:
            out.append((a, b - a, key))
    return out or None


def _spans_starting(spans, lo, hi):
    """The key spans that start in [lo, hi), whole: what an append of
    tokens lo..hi-1 (lo a page's first token) gives kvp_append_opts, which
    takes a span running past the appended tokens and keeps it for the
    tokens that come later; a span that started before lo was given
    before (or lies in the lease a session was forked from)."""
    return [s for s in spans or () if lo <= s[0] < hi] or None


def _block_ids_of(blocks) -> List[int]:
    ids = blocks.get_block_ids() if hasattr(blocks, "get_block_ids") else blocks
    if isinstance(ids, tuple):
        if len(ids) != 1:
            raise NotImplementedError(
                "KvpalaceConnector handles one KV cache group; run vLLM with "
                "--disable-hybrid-kv-cache-manager")
        ids = ids[0]
    return list(ids)


_LAYER_NUM = re.compile(r"\.(\d+)\.")


def _layer_order(names: Sequence[str]) -> List[str]:
    def key(item):
        i, name = item
        m = _LAYER_NUM.search("." + name + ".")
        return (int(m.group(1)) if m else 1 << 30, i)
    return [n for _, n in sorted(enumerate(names), key=key)]


_TORCH_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32",
                 "bfloat16": "bf16", "float16": "f16", "float32": "f32", "half": "f16",
                 "bf16": "bf16", "f16": "f16", "f32": "f32", "fp16": "f16"}


class _Stats:
    """What the connector spent in kvpalace calls and what it copied."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.kvp_seconds = 0.0
        self.calls = 0
        self.bytes_loaded = 0     # into the engine's cache
        self.bytes_saved = 0      # out of it into pages
        self.blocks_loaded = 0
        self.blocks_failed = 0
        self.staging_seconds = 0.0  # torch copies between the staging buffer and the cache
        self.bytes_staged = 0
        self.saves_dropped = 0  # saves not committed: a layer of them was never copied

    def as_dict(self):
        return dict(vars(self))


# ---- the connector -------------------------------------------------------------


class KvpalaceConnectorImpl:
    """All of KvpalaceConnector but its vLLM base class (see the module's
    docstring). Constructed as vLLM constructs connectors:
    ``(vllm_config, role, kv_cache_config=None)``."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        if "KVConnectorBase_V1" in [c.__name__ for c in type(self).__mro__]:
            super().__init__(vllm_config, role, kv_cache_config)
        self._vllm_config = vllm_config
        self._kvp_role = _role_value(role)
        ktc = vllm_config.kv_transfer_config
        if ktc is None:
            raise ValueError("KvpalaceConnector needs vLLM's kv_transfer_config")
        self._ktc = ktc
        cfg = _extra_config(ktc)
        self._cfg = cfg
        kv_role = getattr(ktc, "kv_role", "kv_both") or "kv_both"
        self._loads = kv_role in ("kv_both", "kv_consumer")
        self._saves = kv_role in ("kv_both", "kv_producer")
        self.block_size = int(vllm_config.cache_config.block_size)
        pc = vllm_config.parallel_config
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        if int(getattr(pc, "pipeline_parallel_size", 1) or 1) > 1:
            # A stage's pool would be keyed like every other stage's (same
            # model, same stage-local layer count): one stage would load
            # another's layers.
            raise ValueError("KvpalaceConnector: pipeline parallelism is not supported")
        mc = vllm_config.model_config
        # MLA (DeepSeek): one latent vector per token and layer, the same on
        # every tensor-parallel rank: a latent pool shared by the ranks, which
        # all load from it and of which rank 0 alone saves.
        self._mla = bool(getattr(mc, "use_mla", False))
        self.model_id = str(cfg.get("model_id") or getattr(mc, "served_model_name", None)
                            or mc.model)
        if isinstance(self.model_id, (list, tuple)):
            self.model_id = self.model_id[0]
        self._socket = cfg.get("socket") or os.environ.get("KVPALACE_SOCKET")
        self.load_chunk_blocks = max(1, int(cfg.get("load_chunk_blocks", 64)))
        self.stats = _Stats()
        self._client = _kvp.Client(self._socket) if self._socket else _kvp.Client()
        self._pools: List[Any] = []
        if self._kvp_role == ROLE_SCHEDULER:
            self._sched_init(mc, pc)
        else:
            self._worker_init(pc)

    # -- shared ---------------------------------------------------------------

    def _layout(self, n_layers, n_heads, head_dim, dtype):
        if dtype not in ("bf16", "f16", "f32"):
            raise ValueError("KvpalaceConnector: KV cache dtype %r is not one kvpalace "
                             "pools (bf16, f16, f32)" % (dtype,))
        if self._mla:
            return _kvp.Layout(int(n_layers), 1, int(head_dim), self.block_size, dtype,
                               format="latent")
        return _kvp.Layout(int(n_layers), int(n_heads), int(head_dim), self.block_size, dtype)

    def _open(self, layout, rank):
        tp = self.tp_size > 1 and not self._mla
        pool = self._client.open_pool(self.model_id, layout, rank if tp else 0,
                                      self.tp_size if tp else 0)
        if pool.layout.block_tokens != self.block_size:
            raise ValueError("KvpalaceConnector: vLLM's block_size %d differs from the "
                             "pool's block_tokens %d" % (self.block_size,
                                                         pool.layout.block_tokens))
        return pool

    def _timed(self, fn, *args, **kw):
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            self.stats.kvp_seconds += time.perf_counter() - t
            self.stats.calls += 1

    def shutdown(self):
        for st in getattr(self, "_req", {}).values():
            self._release_all(st.leases)
        for w in getattr(self, "_wreq", {}).values():
            w.close()
        for h in self._pools + [self._client]:
            try:
                h.close()
            except _kvp.Error:
                pass  # the daemon is gone

    # -- scheduler side -------------------------------------------------------

    class _SchedReq:
        __slots__ = ("tokens", "prompt_len", "salt", "extra_key", "key_spans", "block_ids",
                     "leases", "saved_end", "save_emitted", "no_save", "kv_tokens")

        def __init__(self):
            self.kv_tokens = 0  # what kvpalace holds of it: nothing to save there
            self.leases = []
            self.block_ids = []
            self.saved_end = 0
            self.save_emitted = False
            self.no_save = False

    def _sched_init(self, mc, pc):
        dtype = self._cfg.get("dtype")
        if dtype is None:
            cache_dtype = str(getattr(self._vllm_config.cache_config, "cache_dtype", "auto"))
            dtype = (str(getattr(mc, "dtype", "")) if cache_dtype == "auto" else cache_dtype)
        dtype = _TORCH_DTYPES.get(str(dtype), str(dtype))
        n_layers = mc.get_num_layers(pc)
        n_heads = mc.get_num_kv_heads(pc)  # a rank's share, as kvpalace's layouts want
        head_dim = mc.get_head_size()
        layout = self._layout(n_layers, n_heads, head_dim, dtype)
        self._pools = [self._open(layout, r) for r in range(1 if self._mla else self.tp_size)]
        self._req: Dict[str, "KvpalaceConnectorImpl._SchedReq"] = {}
        # req id -> (num_computed_tokens, kvpalace hit) of the last question
        self._matched: Dict[str, Tuple[int, int]] = {}
        self._pending_leases: List[LeaseSpec] = []

    def _lookup(self, tokens, salt, extra_key, key_spans) -> int:
        hit = None
        for p in self._pools:
            n = self._timed(p.lookup, tokens, salt=salt, extra_key=extra_key,
                            key_spans=key_spans)
            hit = n if hit is None else min(hit, n)
        return hit or 0

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        """Tokens kvpalace can load beyond num_computed_tokens (whole blocks,
        never the last token); loads are synchronous (False). No side effect
        but remembering the answer for update_state_after_alloc."""
        rid = request.request_id
        self._matched.pop(rid, None)
        if request.prompt_token_ids is None or not (self._loads or self._saves):
            return 0, False
        tokens = request.all_token_ids
        limit = (len(tokens) - 1) // self.block_size * self.block_size
        if limit <= 0:
            return 0, False
        salt, extra, spans = _request_keys(request)
        hit = self._lookup(list(tokens[:limit]), salt, extra, _clip_spans(spans, 0, limit))
        hit = min(hit, limit) // self.block_size * self.block_size
        cached = getattr(request, "num_cached_tokens", -1)
        if rid in self._req and cached is not None and cached >= 0:
            # Resumed after a preemption: vLLM checks load failures only
            # below num_cached_tokens, set at the first scheduling, so a
            # promise past it could not be taken back if its load failed.
            hit = min(hit, cached // self.block_size * self.block_size)
        self._matched[rid] = (num_computed_tokens, hit)
        if not self._loads:
            return 0, False
        return max(0, hit - num_computed_tokens), False

    def _release_all(self, leases):
        for lease in leases:
            try:
                self._timed(lease.release)
            except _kvp.Error:
                pass  # the daemon is gone: the lease went with the connection
        leases.clear()

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        rid = request.request_id
        st = self._req.get(rid)
        if st is None:
            st = self._req[rid] = self._SchedReq()
        else:  # re-scheduled after a preemption: the engine's blocks are new
            self._release_all(st.leases)
            st.saved_end = st.kv_tokens = 0
        st.tokens = list(request.all_token_ids)
        st.prompt_len = len(request.prompt_token_ids or ())
        st.salt, st.extra_key, st.key_spans = _request_keys(request)
        st.block_ids = _block_ids_of(blocks)
        st.no_save = request.prompt_token_ids is None
        bs = self.block_size
        first, hit = self._matched.pop(rid, (0, 0))
        if num_external_tokens > 0:
            end = first + num_external_tokens
        elif self._saves and not st.no_save and hit >= bs:
            # vLLM's own cache covers kvpalace's prefix: a lease on it all the
            # same, for the save to fork from instead of copying it back.
            first = end = hit
        else:
            return
        ids, lease_tokens = [], None
        for p in self._pools:
            lease = self._timed(p.match, st.tokens[:end], salt=st.salt, extra_key=st.extra_key,
                                key_spans=_clip_spans(st.key_spans, 0, end))
            st.leases.append(lease)
            ids.append(lease.id)
            lease_tokens = lease.tokens if lease_tokens is None else min(lease_tokens,
                                                                         lease.tokens)
        got = min(lease_tokens or 0, end) // bs * bs
        want = st.block_ids[first // bs:end // bs]
        n_ok = max(0, got - first) // bs
        if n_ok < len(want) or (want and 0 in ids):
            st.no_save = True  # the engine's copy of those blocks is recomputed later
        st.kv_tokens = got
        keep = self._saves and not st.no_save and st.prompt_len // bs * bs > got
        self._pending_leases.append(LeaseSpec(
            req_id=rid, lease_ids=tuple(ids), lease_tokens=got, first_page=first // bs,
            block_ids=want[:n_ok], failed_block_ids=want[n_ok:], keep=keep))

    def build_connector_meta(self, scheduler_output) -> KvpalaceConnectorMetadata:
        meta = KvpalaceConnectorMetadata(leases=self._pending_leases)
        self._pending_leases = []
        meta.preempted = set(getattr(scheduler_output, "preempted_req_ids", None) or ())
        if self._saves:
            self._build_saves(scheduler_output, meta)
        if meta.leases or meta.saves:
            # Loads and the saves' reservations run in start_load_kv, which
            # newer vLLM calls before the forward only when this is set.
            try:
                scheduler_output.has_sync_kv_loads = True
            except AttributeError:
                pass  # an older SchedulerOutput: always before the forward
        return meta

    def _build_saves(self, scheduler_output, meta):
        nst = scheduler_output.num_scheduled_tokens
        steps = []
        for nr in scheduler_output.scheduled_new_reqs:
            st = self._req.get(nr.req_id)
            if st is not None:
                st.block_ids = _block_ids_of(nr.block_ids)
                steps.append((nr.req_id, st, nr.num_computed_tokens))
        cr = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cr, "resumed_req_ids", None)
        if resumed is None:  # older vLLM: a list of flags
            flags = getattr(cr, "resumed_from_preemption", ())
            resumed = {r for r, f in zip(cr.req_ids, flags) if f}
        for i, rid in enumerate(cr.req_ids):
            st = self._req.get(rid)
            if st is None:
                continue
            new = cr.new_block_ids[i]
            if new is not None:
                if rid in resumed:
                    st.block_ids = _block_ids_of(new)
                else:
                    st.block_ids += _block_ids_of(new)
            steps.append((rid, st, cr.num_computed_tokens[i]))
        bs = self.block_size
        for rid, st, computed in steps:
            if st.no_save:
                continue
            end = min(computed + nst.get(rid, 0), st.prompt_len) // bs * bs
            if end <= max(st.saved_end, st.kv_tokens):
                continue
            spans = _spans_starting(st.key_spans, 0, end)
            meta.saves.append(SaveSpec(req_id=rid, tokens=st.tokens[:end],
                                       block_ids=st.block_ids[:end // bs], salt=st.salt,
                                       extra_key=st.extra_key, key_spans=spans))
            st.saved_end = end
            st.save_emitted = True

    def update_connector_output(self, connector_output):
        return

    def request_finished(self, request, block_ids):
        """Releases the scheduler's leases. True (free the blocks only once a
        worker reports the request in get_finished) when it had saves."""
        self._matched.pop(request.request_id, None)
        st = self._req.pop(request.request_id, None)
        if st is None:
            return False, None
        self._release_all(st.leases)
        return st.save_emitted, None

    def take_events(self):
        return ()

    # -- worker side ----------------------------------------------------------

    class _WorkerReq:
        def __init__(self):
            self.lease = None
            self.session = None
            self.done = 0       # tokens the session holds (committed or copied)
            self.failed = False
            self.saved = False  # had a SaveSpec: reported in get_finished
            self.copying = None  # (first_page, block_ids) of this step's save
            self.layers_saved = 0  # layers of it save_kv_layer copied

        def close(self):
            for h in (self.session, self.lease):
                if h is not None:
                    try:
                        h.close()
                    except _kvp.Error:
                        pass
            self.session = self.lease = None

    def _worker_init(self, pc):
        rank = self._cfg.get("tp_rank")
        if rank is None:
            try:
                from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
                rank = get_tensor_model_parallel_rank()
            except Exception:  # no vLLM, or its groups are not set up
                rank = int(getattr(pc, "rank", 0) or 0) % self.tp_size
        self.tp_rank = int(rank)
        # MLA ranks hold the same latent: one of them writes it.
        self._saver = not self._mla or self.tp_rank == 0
        self._cache = None
        self._layer_index: Dict[str, int] = {}
        self._kv_tensors: List[Any] = []
        self._wreq: Dict[str, "KvpalaceConnectorImpl._WorkerReq"] = {}
        self._load_errors: set = set()
        self._meta = None

    def register_kv_caches(self, kv_caches: Dict[str, Any]):
        """vLLM's caches, one tensor per attention layer; FlashAttention's
        [2, num_blocks, block_size, H, D] (or FlashInfer's) on the CPU."""
        names = _layer_order(list(kv_caches))
        tensors = [kv_caches[n] for n in names]
        t0 = tensors[0]
        kind = self._cfg.get("kv_layout")
        shape = tuple(t0.shape)
        if kind is None:
            if len(shape) == 5 and shape[0] == 2 and shape[2] == self.block_size:
                kind = "flash_attn"
            elif len(shape) == 5 and shape[1] == 2 and shape[2] == self.block_size:
                kind = "flashinfer_nhd"
            elif len(shape) == 5 and shape[1] == 2 and shape[3] == self.block_size:
                kind = "flashinfer_hnd"
            elif len(shape) == 3 and shape[1] == self.block_size and self._mla:
                kind = "latent"  # MLA: [num_blocks, block_size, kv_lora_rank + rope]
            else:
                raise ValueError("KvpalaceConnector: KV cache of shape %s is no layout it "
                                 "knows (FlashAttention [2, blocks, %d, H, D], or MLA's "
                                 "[blocks, %d, D] with use_mla)" % (shape, self.block_size,
                                                                    self.block_size))
        for n, t in zip(names, tensors):
            if not t.is_contiguous():
                raise ValueError("KvpalaceConnector: layer %s's KV cache is not contiguous "
                                 "(a permuted stride order, e.g. an HND cache behind an NHD "
                                 "shape): set kv_layout" % n)
        self._axis = 1 if kind == "flash_attn" else 0  # the blocks' dimension
        n_stage = int(self._cfg.get("staging_blocks", 0) or 0)
        on_cpu = str(getattr(t0, "device", "cpu")) == "cpu"
        if on_cpu and n_stage <= 0:
            self._staging = None
            self._cache = _kvp.EngineCache(kind, tensors, block_size=self.block_size)
        else:
            # A device cache (or a forced staging): kvpalace copies into a host
            # buffer of n_stage blocks per layer, torch moves them on.
            import torch
            n_stage = n_stage if n_stage > 0 else 128
            shape = list(t0.shape)
            shape[self._axis] = n_stage
            self._staging = [torch.empty(shape, dtype=t0.dtype, pin_memory=not on_cpu)
                             for _ in tensors]
            self._cache = _kvp.EngineCache(kind, self._staging, block_size=self.block_size)
            self.load_chunk_blocks = min(self.load_chunk_blocks, n_stage)
        self._stage_n = n_stage
        self._kv_tensors = tensors
        self._kv_kind = kind
        self._layer_index = {n: i for i, n in enumerate(names)}
        dtype = self._cfg.get("dtype") or _TORCH_DTYPES.get(str(t0.dtype))
        layout = self._layout(self._cache.n_layers, self._cache.n_heads, self._cache.head_dim,
                              dtype)
        self._pools = [self._open(layout, self.tp_rank)]
        planes = 1 if kind == "latent" else 2
        self._block_bytes = (self._cache.n_layers * planes * self.block_size *
                             self._cache.n_heads * self._cache.head_dim * t0.element_size())

    def bind_connector_metadata(self, connector_metadata):
        self._meta = connector_metadata
        if "KVConnectorBase_V1" in [c.__name__ for c in type(self).__mro__]:
            super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self):
        self._meta = None
        if "KVConnectorBase_V1" in [c.__name__ for c in type(self).__mro__]:
            super().clear_connector_metadata()

    def _w(self, rid):
        w = self._wreq.get(rid)
        if w is None:
            w = self._wreq[rid] = self._WorkerReq()
        return w

    def _load_chunk(self, lease, ids, first_page):
        """Pages first_page.. of the lease into engine blocks ids (at most
        load_chunk_blocks of them): straight into the cache, or through the
        host staging buffer for a device cache."""
        if self._staging is None:
            self._timed(lease.to_engine, self._cache, ids, first_page)
            return
        import torch
        k = len(ids)
        self._timed(lease.to_engine, self._cache, list(range(k)), first_page)
        t = time.perf_counter()
        idx = torch.tensor(ids, device=self._kv_tensors[0].device)
        for dst, src in zip(self._kv_tensors, self._staging):
            dst.index_copy_(self._axis, idx, src.narrow(self._axis, 0, k).to(dst.device,
                                                                              non_blocking=True))
        if idx.is_cuda:
            torch.cuda.current_stream(idx.device).synchronize()  # the staging is reused
        self.stats.staging_seconds += time.perf_counter() - t
        self.stats.bytes_staged += k * self._block_bytes

    def _save_layer(self, session, ids, first_page, layer):
        """One layer of engine blocks ids into the session's pages first_page..."""
        if self._staging is None:
            self._timed(session.from_engine, self._cache, ids, first_page, layers=(layer, 1),
                        engine_layer_first=layer)
            return
        import torch
        src, stage = self._kv_tensors[layer], self._staging[layer]
        for i in range(0, len(ids), self._stage_n):
            chunk = ids[i:i + self._stage_n]
            k = len(chunk)
            t = time.perf_counter()
            idx = torch.tensor(chunk, device=src.device)
            stage.narrow(self._axis, 0, k).copy_(src.index_select(self._axis, idx))
            self.stats.staging_seconds += time.perf_counter() - t
            self.stats.bytes_staged += k * self._block_bytes // len(self._kv_tensors)
            self._timed(session.from_engine, self._cache, list(range(k)), first_page + i,
                        layers=(layer, 1), engine_layer_first=layer)

    def _scrub(self, block_ids):
        """Zeroes the engine blocks of a failed load in every layer, so that
        no byte of a half-done copy stays where vLLM could read it."""
        if not block_ids:
            return
        for t in self._kv_tensors:
            for b in block_ids:
                t.select(self._axis, b).zero_()

    def _fail(self, w, block_ids):
        """Blocks of w's load that will not hold kvpalace's bytes: reported,
        zeroed, and w saves nothing more (its engine copy is recomputed)."""
        if not block_ids:
            return  # a lease only a save would have forked: it saves from 0
        w.failed = True
        self._load_errors.update(block_ids)
        self.stats.blocks_failed += len(block_ids)
        self._scrub(block_ids)

    def start_load_kv(self, forward_context=None, **kwargs):
        meta = self._meta
        if meta is None:
            return
        pool = self._pools[0]
        for spec in meta.leases:
            w = self._w(spec.req_id)
            w.close()  # a lease of an earlier scheduling of this request
            w.done, w.failed = 0, False
            if spec.failed_block_ids:
                self._fail(w, spec.failed_block_ids)
            lease_id = spec.lease_ids[self.tp_rank if len(spec.lease_ids) > 1 else 0]
            ids = spec.block_ids
            try:
                if lease_id == 0:
                    raise _kvp.NotFound(2, "the scheduler's match found nothing")
                w.lease = self._timed(pool.adopt, lease_id)
            except (_kvp.Error, ValueError):
                self._fail(w, ids)
                continue
            if w.lease.tokens < spec.lease_tokens:
                short = (w.lease.tokens // self.block_size) - spec.first_page
                ids, lost = ids[:max(0, short)], ids[max(0, short):]
                self._fail(w, lost)
            step = self.load_chunk_blocks
            for i in range(0, len(ids), step):
                chunk = ids[i:i + step]
                try:
                    self._load_chunk(w.lease, chunk, spec.first_page + i)
                except (_kvp.Error, ValueError, OSError):
                    self._fail(w, ids[i:])
                    break
                self.stats.blocks_loaded += len(chunk)
                self.stats.bytes_loaded += len(chunk) * self._block_bytes
            if not spec.keep or not self._saver:  # no save will fork from it
                self._release_lease(w)
        if self._saves:
            self._prepare_saves(meta)

    def _release_lease(self, w):
        try:
            self._timed(w.lease.release)
        except _kvp.Error:
            pass  # the daemon is gone: the lease went with the connection
        w.lease = None

    def _prepare_saves(self, meta):
        """Sessions and token reservations for this step's saves, before the
        layers' copies in save_kv_layer."""
        bs = self.block_size
        pool = self._pools[0]
        for spec in meta.saves:
            w = self._w(spec.req_id)
            w.saved = True
            w.copying = None
            if w.failed or not self._saver:
                continue
            end = len(spec.tokens)
            try:
                if w.session is None:
                    if w.lease is not None and w.lease.tokens >= bs:
                        n = min(w.lease.tokens, end) // bs * bs
                        w.session = self._timed(w.lease.fork, n)
                        w.done = n
                    else:
                        w.session = self._timed(pool.session, extra_key=spec.extra_key,
                                                salt=spec.salt)
                        w.done = 0
                if end <= w.done:
                    continue
                spans = _spans_starting(spec.key_spans, w.done, end)
                self._timed(w.session.append, spec.tokens[w.done:end], key_spans=spans)
                w.copying = (w.done // bs, spec.block_ids[w.done // bs:end // bs], end)
                w.layers_saved = 0
            except (_kvp.Error, ValueError):
                w.close()
                w.failed = True  # nothing more from this request

    def wait_for_layer_load(self, layer_name: str):
        return  # start_load_kv copied every layer already

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata=None, **kwargs):
        meta = self._meta
        if meta is None or not meta.saves:
            return
        layer = self._layer_index[layer_name]
        for spec in meta.saves:
            w = self._wreq.get(spec.req_id)
            if w is None or w.copying is None or w.failed:
                continue
            first_page, ids, _ = w.copying
            try:
                self._save_layer(w.session, ids, first_page, layer)
            except (_kvp.Error, ValueError):
                w.close()
                w.failed = True
                w.copying = None
                continue
            w.layers_saved += 1
            self.stats.bytes_saved += len(ids) * self._block_bytes // self._cache.n_layers

    def wait_for_save(self):
        meta = self._meta
        if meta is None:
            return
        for spec in meta.saves:
            w = self._wreq.get(spec.req_id)
            if w is None or w.copying is None or w.failed:
                continue
            end = w.copying[2]
            if w.layers_saved != self._cache.n_layers:
                # Some layer's save_kv_layer never ran (a step replayed as a
                # whole CUDA graph, or start_load_kv after the forward): its
                # pages hold no KV, and committing would publish them.
                w.close()
                w.failed = True
                w.copying = None
                self.stats.saves_dropped += 1
                continue
            try:
                self._timed(w.session.commit)
                w.done = end
            except (_kvp.Error, ValueError, BufferError):
                w.close()
                w.failed = True
            w.copying = None
        for w in self._wreq.values():  # the sessions forked from them hold the pages now
            if w.lease is not None and (w.session is not None or w.failed):
                self._release_lease(w)

    def handle_preemptions(self, preempted):
        """A preempted request's blocks go to others: drop what its session
        has not committed (saves are done within the step, so none).
        vLLM passes the set of ids, or (newer) this step's metadata."""
        if isinstance(preempted, KvpalaceConnectorMetadata):
            preempted = preempted.preempted
        elif preempted is None or not hasattr(preempted, "__iter__"):
            preempted = getattr(preempted, "preempted", ())
        for rid in preempted:
            w = self._wreq.get(rid)
            if w is not None:
                w.close()
                w.done, w.failed = 0, False

    def get_finished(self, finished_req_ids):
        """Requests the scheduler finished: close their sessions and leases;
        those that had saves (request_finished said True) are done sending."""
        done = set()
        for rid in finished_req_ids:
            w = self._wreq.pop(rid, None)
            if w is None:
                continue
            w.close()
            if w.saved:
                done.add(rid)
        return (done or None), None

    def get_transfer_results(self, finished_req_ids):
        """get_finished as newer vLLM runners ask for it (a
        KVConnectorTransferResults; loads are synchronous, so nothing is
        ever received late)."""
        sending, _ = self.get_finished(finished_req_ids)
        try:
            from vllm.distributed.kv_transfer.kv_connector.v1.base import (
                KVConnectorTransferResults as results)
        except ImportError:  # no vLLM, or one older than the call
            results = TransferResults
        return results(finished_sending=set(sending or ()))

    def get_block_ids_with_load_errors(self):
        errs, self._load_errors = self._load_errors, set()
        return errs

    def get_kv_connector_stats(self):
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        """True: save_kv_layer runs Python per layer, which a replayed full
        CUDA graph would skip (vLLM then compiles piecewise graphs)."""
        return True

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None


# ---- the class vLLM names, made on first use ---------------------------------

_made: Dict[str, Any] = {}


def _make_connector():
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
            KVConnectorBase_V1, KVConnectorMetadata)
    except ImportError as e:
        raise ImportError(
            "kvpalace.vllm_connector.KvpalaceConnector needs vLLM (its KVConnectorBase_V1 "
            "in vllm.distributed.kv_transfer.kv_connector.v1.base), which did not import: "
            "%s. kvpalace itself works without it." % e) from e
    KVConnectorMetadata.register(KvpalaceConnectorMetadata)
    cls = type("KvpalaceConnector", (KvpalaceConnectorImpl, KVConnectorBase_V1),
               {"__module__": __name__, "__doc__": KvpalaceConnectorImpl.__doc__})
    return cls


def __getattr__(name):
    if name == "KvpalaceConnector":
        if name not in _made:
            _made[name] = _make_connector()
        globals()[name] = _made[name]
        return _made[name]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
