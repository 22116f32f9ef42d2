"""A driver that makes vLLM's KV connector calls in vLLM's order, for
tests/python/test_vllm_connector.py and bench/vllm_connector_bench.py.

vLLM cannot be installed here, so its objects are stand-ins carrying only
the attributes the connector reads, named as in vLLM's source (vllm/config,
vllm/v1/request.py, vllm/v1/core/sched/output.py, vllm/v1/core/
kv_cache_manager.py KVCacheBlocks). The Engine plays vLLM's scheduler (its
block allocator, one KV cache group, chunked prefill by a token budget, a
decode token per running request, preemption, abort) and its workers (one
per tensor-parallel rank, each with its share of the KV heads in CPU torch
tensors of FlashAttention's shape [2, num_blocks, block_size, H, D]):

  scheduler: get_num_new_matched_tokens (twice, as vLLM may), allocate,
             update_state_after_alloc, build_connector_meta;
             request_finished when a request ends
  worker:    bind_connector_metadata, start_load_kv, per layer
             wait_for_layer_load / the layer's compute / save_kv_layer,
             wait_for_save, get_finished(finished_req_ids),
             get_block_ids_with_load_errors, clear_connector_metadata
  scheduler: frees the blocks of requests the workers report finished.

The "model" writes, for token position p of token t, layer l, K or V (k),
head h and dim d, the integer ((t * 7 + p * 3 + l * 11 + k * 5 + h * 13 + d)
% 251) - 125 (exact in bf16 and f16): the same prefix gives the same bytes,
so what a later request loads can be checked against what is computed.
Fresh blocks are filled with SENTINEL, which the model never writes."""

import types
from dataclasses import dataclass, field
from typing import Dict, List

import torch

SENTINEL = -1000.0


class NS(types.SimpleNamespace):
    pass


def vllm_config(sock, model_id, n_layers, n_heads, head_dim, block_size, dtype="bf16",
                tp_size=1, rank=0, kv_role="kv_both", extra=None, mla=False):
    """A VllmConfig stand-in: n_heads is the model's KV head count
    (ModelConfig.get_num_kv_heads answers a rank's share, as vLLM's does)."""
    cfg = {"socket": sock, "model_id": model_id}
    cfg.update(extra or {})
    torch_dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
    mc = NS(model=model_id, served_model_name=model_id, dtype=torch_dtype,
            get_num_layers=lambda pc: n_layers,
            get_num_kv_heads=lambda pc: 1 if mla else max(1, n_heads // pc.tensor_parallel_size),
            get_head_size=lambda: head_dim, use_mla=mla)
    return NS(kv_transfer_config=NS(kv_connector="KvpalaceConnector",
                                    kv_connector_module_path="kvpalace.vllm_connector",
                                    kv_role=kv_role, kv_connector_extra_config=cfg,
                                    engine_id="test"),
              cache_config=NS(block_size=block_size, cache_dtype="auto"),
              parallel_config=NS(tensor_parallel_size=tp_size, rank=rank),
              model_config=mc,
              scheduler_config=NS(disable_hybrid_kv_cache_manager=True))


class Request:
    """vllm.v1.request.Request's attributes the connector reads."""

    def __init__(self, request_id, prompt, lora_name=None, cache_salt=None, mm=None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt)
        self._all = list(prompt)
        self.lora_request = (NS(lora_name=lora_name, lora_int_id=1) if lora_name else None)
        self.cache_salt = cache_salt
        # mm: [(offset, length, hash)] -> MultiModalFeatureSpec stand-ins
        self.mm_features = [NS(identifier=h, mm_position=NS(offset=o, length=n))
                            for o, n, h in (mm or ())]
        self.num_computed_tokens = 0
        # vLLM sets it once, at the first scheduling (local + external hits),
        # and checks sync load failures only below it.
        self.num_cached_tokens = -1

    @property
    def all_token_ids(self):
        return self._all

    @property
    def num_tokens(self):
        return len(self._all)


class KVCacheBlocks:
    def __init__(self, ids):
        self._ids = list(ids)

    def get_block_ids(self):
        return (list(self._ids),)


def model_kv(tokens, first, n, n_layers, n_heads_total, head_first, n_heads, head_dim, dtype):
    """[n_layers, 2, n, n_heads, head_dim] of the model's K/V for positions
    first..first+n-1 (the heads head_first.. of the model's)."""
    t = torch.tensor(tokens[first:first + n], dtype=torch.int64).view(1, 1, n, 1, 1)
    p = torch.arange(first, first + n).view(1, 1, n, 1, 1)
    lyr = torch.arange(n_layers).view(n_layers, 1, 1, 1, 1)
    k = torch.arange(2).view(1, 2, 1, 1, 1)
    h = torch.arange(head_first, head_first + n_heads).view(1, 1, 1, n_heads, 1)
    d = torch.arange(head_dim).view(1, 1, 1, 1, head_dim)
    v = (t * 7 + p * 3 + lyr * 11 + k * 5 + h * 13 + d) % 251 - 125
    return v.to(dtype)


@dataclass
class Running:
    req: Request
    blocks: List[int]
    num_computed: int = 0
    loaded_blocks: List[int] = field(default_factory=list)


class Engine:
    """vLLM's scheduler and workers, as far as the connector sees them."""

    def __init__(self, impl_cls, sock, model_id, n_layers=4, n_heads=8, head_dim=64,
                 block_size=16, num_blocks=256, dtype="bf16", tp_size=1, budget=4096,
                 extra=None, kv_role="kv_both", mla=False):
        """mla: vLLM's MLA caches, [num_blocks, block_size, head_dim] a layer
        (head_dim the latent's width), the same on every rank."""
        self.block_size = block_size
        self.mla = mla
        self.n_layers, self.n_heads, self.head_dim = n_layers, n_heads, head_dim
        self.tp_size = tp_size
        self.torch_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
        self.budget = budget
        conf = lambda rank: vllm_config(sock, model_id, n_layers, n_heads, head_dim,  # noqa
                                        block_size, dtype, tp_size, rank, kv_role, extra,
                                        mla)
        self.sched = impl_cls(conf(0), 0, None)  # KVConnectorRole.SCHEDULER
        self.workers = []
        self.caches = []
        hpr = max(1, n_heads // tp_size)
        self.heads_per_rank = hpr
        self.layer_names = ["model.layers.%d.self_attn.attn" % i for i in range(n_layers)]
        for r in range(tp_size):
            w = impl_cls(conf(r), 1, None)  # KVConnectorRole.WORKER
            shape = ((num_blocks, block_size, head_dim) if mla else
                     (2, num_blocks, block_size, hpr, head_dim))
            caches = {n: torch.full(shape, SENTINEL, dtype=self.torch_dtype)
                      for n in self.layer_names}
            w.register_kv_caches(caches)
            self.workers.append(w)
            self.caches.append(caches)
        self.free = list(range(num_blocks))
        self.waiting: List[Request] = []
        self.running: Dict[str, Running] = {}
        self.finished_req_ids = set()     # for the next SchedulerOutput
        self.delayed_free: Dict[str, List[int]] = {}  # request_finished said True
        self.step_log = []
        # The newer runner (vllm/v1/worker/gpu/kv_connector.py): handle_preemptions
        # gets the metadata every step, and start_load_kv runs before the
        # forward only when SchedulerOutput.has_sync_kv_loads, else after it.
        self.newer_order = False
        # Layers whose save_kv_layer a replayed full CUDA graph skips.
        self.graph_skips_layers = set()

    # -- scheduler ------------------------------------------------------------

    def add(self, req, local=0):
        """local: tokens vLLM's own prefix cache holds for it (whole blocks),
        whose blocks the driver fills with the model's bytes."""
        req.local_hit = local
        self.waiting.append(req)

    def _alloc(self, n):
        assert len(self.free) >= n, "driver out of blocks"
        ids, self.free = self.free[:n], self.free[n:]
        for w, caches in zip(self.workers, self.caches):
            for t in caches.values():
                t[:, ids] = SENTINEL
        return ids

    def _finish(self, rid):
        run = self.running.pop(rid)
        delay, _ = self.sched.request_finished(run.req, run.blocks)
        if delay:
            self.delayed_free[rid] = run.blocks
        else:
            self.free += run.blocks
        self.finished_req_ids.add(rid)
        return delay

    def finish(self, rid):
        return self._finish(rid)

    def preempt(self, rid):
        """vLLM's preemption: blocks freed, request back to waiting with its
        tokens so far; workers get handle_preemptions first."""
        run = self.running.pop(rid)
        if self.newer_order:  # in the next step's metadata, handed at execute
            self._preempted_now = getattr(self, "_preempted_now", set()) | {rid}
        else:
            for w in self.workers:
                w.handle_preemptions({rid})
        self.free += run.blocks
        run.req.num_computed_tokens = 0
        self.waiting.insert(0, run.req)
        self._preempted = getattr(self, "_preempted", set()) | {rid}

    def schedule(self):
        """One SchedulerOutput, connector metadata attached (a NS)."""
        bs = self.block_size
        budget = self.budget
        new_reqs, cached = [], NS(req_ids=[], resumed_req_ids=set(), new_token_ids=[],
                                  all_token_ids={}, new_block_ids=[], num_computed_tokens=[],
                                  num_output_tokens=[])
        nst = {}
        self.last_matched = {}
        for rid, run in list(self.running.items()):
            if budget <= 0:
                break
            todo = run.req.num_tokens - run.num_computed
            n = min(todo, budget)
            if n <= 0:
                continue
            need = -(-(run.num_computed + n) // bs) - len(run.blocks)
            new = self._alloc(need) if need > 0 else []
            run.blocks += new
            cached.req_ids.append(rid)
            cached.new_block_ids.append((new,) if new else None)
            cached.num_computed_tokens.append(run.num_computed)
            cached.num_output_tokens.append(run.req.num_tokens - len(run.req.prompt_token_ids))
            nst[rid] = n
            budget -= n
        preempted = getattr(self, "_preempted", set())
        preempted_now = getattr(self, "_preempted_now", set())
        self._preempted_now = set()
        while self.waiting and budget > 0:
            req = self.waiting.pop(0)
            local = getattr(req, "local_hit", 0)
            req.local_hit = 0
            ext, is_async = self.sched.get_num_new_matched_tokens(req, local)
            again = self.sched.get_num_new_matched_tokens(req, local)
            assert again == (ext, is_async), "get_num_new_matched_tokens is not repeatable"
            assert is_async is False
            self.last_matched[req.request_id] = ext
            n = min(req.num_tokens - local - ext, budget)
            blocks = self._alloc(-(-(local + ext + n) // bs))
            run = Running(req, blocks, local + ext)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = local + ext
            for li in range(self.n_layers):  # vLLM's cached blocks hold the model's bytes
                for r in range(self.tp_size):
                    self._compute(r, run, li, 0, local)
            self.sched.update_state_after_alloc(req, KVCacheBlocks(blocks), ext)
            run.loaded_blocks = blocks[local // bs:(local + ext) // bs]
            run.load_first = local // bs
            self.running[req.request_id] = run
            nst[req.request_id] = n
            budget -= n
            if req.request_id in preempted:
                preempted.discard(req.request_id)
                cached.req_ids.append(req.request_id)
                cached.resumed_req_ids.add(req.request_id)
                cached.new_block_ids.append((list(blocks),))
                cached.num_computed_tokens.append(local + ext)
                cached.num_output_tokens.append(req.num_tokens - len(req.prompt_token_ids))
            else:
                new_reqs.append(NS(req_id=req.request_id, prompt_token_ids=req.prompt_token_ids,
                                   mm_features=req.mm_features, sampling_params=None,
                                   pooling_params=None, block_ids=(list(blocks),),
                                   num_computed_tokens=local + ext,
                                   lora_request=req.lora_request))
        so = NS(scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
                num_scheduled_tokens=nst, total_num_scheduled_tokens=sum(nst.values()),
                scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
                num_common_prefix_blocks=[0], finished_req_ids=self.finished_req_ids,
                free_encoder_mm_hashes=[], preempted_req_ids=set(preempted_now),
                has_sync_kv_loads=False, kv_connector_metadata=None)
        self.finished_req_ids = set()
        # what the step computes, even for a request finished before it runs
        so.runs = {rid: self.running[rid] for rid in nst}
        so.kv_connector_metadata = self.sched.build_connector_meta(so)
        return so

    # -- workers ----------------------------------------------------------------

    def execute(self, so, check_loads=True):
        """Every rank runs the step; returns (finished_sending, load error
        block ids), the load errors the same on every rank or unioned."""
        bs = self.block_size
        sending, errors = None, set()
        self.load_check = {}
        so.has_sync_kv_loads = getattr(so, "has_sync_kv_loads", False)
        before = not self.newer_order or so.has_sync_kv_loads
        for r, (w, caches) in enumerate(zip(self.workers, self.caches)):
            if self.newer_order:
                w.handle_preemptions(so.kv_connector_metadata)
            w.bind_connector_metadata(so.kv_connector_metadata)
            if before:
                w.start_load_kv(NS(attn_metadata=None, virtual_engine=0))
            errs_now = set(w._load_errors) if hasattr(w, "_load_errors") else set()
            for rid, run in so.runs.items():  # what was loaded equals what was saved
                if not run.loaded_blocks:
                    continue
                if run.num_computed == 0 or self.last_matched.get(rid, 0) == 0:
                    continue
                self.load_check[(r, rid)] = self._check_loaded(r, run, errs_now)
            for li, name in enumerate(self.layer_names):
                w.wait_for_layer_load(name)
                for rid, n in so.num_scheduled_tokens.items():
                    run = so.runs[rid]
                    self._compute(r, run, li, run.num_computed, n)
                if li not in self.graph_skips_layers:
                    w.save_kv_layer(name, caches[name], None)
            if not before:
                w.start_load_kv(NS(attn_metadata=None, virtual_engine=0))
            w.wait_for_save()
            fs, fr = w.get_finished(so.finished_req_ids)
            assert fr is None
            errors |= w.get_block_ids_with_load_errors()
            w.clear_connector_metadata()
            if r == 0:
                sending = fs
            else:
                assert fs == sending, "ranks disagree on finished_sending"
        # the scheduler's update_from_output
        for rid, n in so.num_scheduled_tokens.items():
            run = self.running.get(rid)
            if run is None:
                continue
            bad = [i for i, b in enumerate(run.blocks) if b in errors]
            if bad:  # vLLM recomputes from the first failed block
                run.num_computed = bad[0] * bs
                continue
            run.num_computed += n
            if run.num_computed >= run.req.num_tokens:  # a decode token
                run.req._all.append(1000 + run.req.num_tokens)
        for rid in sending or ():
            self.free += self.delayed_free.pop(rid)
        return sending, errors

    def _compute(self, r, run, layer, first, n):
        if n <= 0:
            return
        bs = self.block_size
        t = self.caches[r][self.layer_names[layer]]
        if self.mla:  # every rank computes the same latent
            lat = model_kv(run.req.all_token_ids, first, n, self.n_layers, 1, 0, 1,
                           self.head_dim, self.torch_dtype)[layer, 0, :, 0]  # [n, D]
            for i in range(n):
                pos = first + i
                t[run.blocks[pos // bs], pos % bs] = lat[i]
            return
        kv = model_kv(run.req.all_token_ids, first, n, self.n_layers, self.n_heads,
                      r * self.heads_per_rank, self.heads_per_rank, self.head_dim,
                      self.torch_dtype)[layer]  # [2, n, H, D]
        for i in range(n):
            pos = first + i
            t[:, run.blocks[pos // bs], pos % bs] = kv[:, i]

    def expected_block(self, r, tokens, bi):
        bs = self.block_size
        if self.mla:
            return model_kv(tokens, bi * bs, bs, self.n_layers, 1, 0, 1, self.head_dim,
                            self.torch_dtype)[:, 0, :, 0]  # [L, bs, D]
        kv = model_kv(tokens, bi * bs, bs, self.n_layers, self.n_heads, r * self.heads_per_rank,
                      self.heads_per_rank, self.head_dim, self.torch_dtype)
        return kv  # [L, 2, bs, H, D]

    def engine_block(self, r, b):
        if self.mla:
            return torch.stack([self.caches[r][n][b] for n in self.layer_names])  # [L, bs, D]
        return torch.stack([self.caches[r][n][:, b] for n in self.layer_names])  # [L,2,bs,H,D]

    def _check_loaded(self, r, run, errs):
        """(ok blocks equal to the model's bytes, failed blocks zeroed):
        (n_equal, n_failed, bad) with bad a list of block indices that are
        neither."""
        n_eq, n_failed, bad = 0, 0, []
        for bi, b in enumerate(run.loaded_blocks, getattr(run, "load_first", 0)):
            got = self.engine_block(r, b)
            if b in errs:
                n_failed += 1
                if not bool((got == 0).all()):
                    bad.append(bi)
            elif torch.equal(got, self.expected_block(r, run.req.all_token_ids, bi)):
                n_eq += 1
            else:
                bad.append(bi)
        return n_eq, n_failed, bad

    def run_until_idle(self, max_steps=50):
        out = []
        for _ in range(max_steps):
            prefilling = [rid for rid, run in self.running.items()
                          if run.num_computed < len(run.req.prompt_token_ids)]
            if not self.waiting and not prefilling:
                break
            so = self.schedule()
            out.append(self.execute(so))
        return out

    def close(self):
        for c in [self.sched] + self.workers:
            c.shutdown()
