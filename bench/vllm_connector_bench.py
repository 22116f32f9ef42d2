#!/usr/bin/python3
"""bench/vllm_connector_bench.py — the vLLM connector's own cost per
1k-token prefix hit beside the raw package calls doing the same copy.

    PYTHONPATH=build/python /usr/bin/python3 bench/vllm_connector_bench.py \\
        --socket SOCK [--tokens 1024] [--rounds 200] [--blocks 10]

against a running kvpalaced. A 1024-token prompt (plus one token, which
vLLM always computes) is saved once; then each round is one request
hitting it, through the connector's calls in vLLM's order (scheduler:
get_num_new_matched_tokens twice, update_state_after_alloc,
build_connector_meta; worker: bind, start_load_kv, per layer
wait_for_layer_load and save_kv_layer, wait_for_save, get_finished;
scheduler: request_finished; and the next step's get_finished) — or
through the raw calls that move the same bytes (Pool.lookup, Pool.match,
Pool.adopt, Lease.to_engine, both releases). Rounds run in blocks ordered
connector, raw, raw, connector. Shapes: 4 layers (--layers), 8 KV heads,
head 64, block 16, bf16 (vLLM's FlashAttention cache,
[2, num_blocks, 16, 8, 64] per layer, on the CPU).

Prints "sample NAME VALUE" lines on stdout (vllm.conn_us, vllm.raw_us:
µs per hit, time in kvpalace calls; vllm.conn_wall_us: the connector
methods' whole time; vllm.ratio: raw / connector; vllm.copy_ratio: bytes
copied per byte served) and a summary on stderr."""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))
import kvpalace  # noqa: E402
from kvpalace import vllm_connector as vc  # noqa: E402
from vllm_driver import NS, KVCacheBlocks, Request, vllm_config  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=100, help="hits per block")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--staging-blocks", type=int, default=0,
                    help="copy through a host staging buffer of this many blocks, as the "
                    "connector does for a GPU cache (here the cache stays on the CPU)")
    a = ap.parse_args()
    L, H, D, bs = a.layers, 8, 64, 16
    model = "vllm-bench-%d" % os.getpid()
    cfg = vllm_config(a.socket, model, L, H, D, bs,
                      extra={"staging_blocks": a.staging_blocks} if a.staging_blocks else None)
    sched = vc.KvpalaceConnectorImpl(cfg, 0)
    worker = vc.KvpalaceConnectorImpl(cfg, 1)
    nb = a.tokens // bs
    n_engine = 2 * nb + 4
    names = ["model.layers.%d.self_attn.attn" % i for i in range(L)]
    caches = {n: torch.randn(2, n_engine, bs, H, D).to(torch.bfloat16) for n in names}
    worker.register_kv_caches(caches)
    prompt = list(range(1, a.tokens + 2))
    blocks = list(range(nb + 1))  # the saving request's
    load_blocks = list(range(nb + 1, 2 * nb + 2))  # each hit's

    def step(req, ids, ext, computed, n):
        sched.update_state_after_alloc(req, KVCacheBlocks(ids), ext)
        so = NS(scheduled_new_reqs=[NS(req_id=req.request_id, prompt_token_ids=req.prompt_token_ids,
                                       block_ids=(ids,), num_computed_tokens=computed,
                                       lora_request=None, mm_features=[])],
                scheduled_cached_reqs=NS(req_ids=[], resumed_req_ids=set(), new_block_ids=[],
                                         num_computed_tokens=[]),
                num_scheduled_tokens={req.request_id: n}, finished_req_ids=set())
        meta = sched.build_connector_meta(so)
        worker.bind_connector_metadata(meta)
        worker.start_load_kv(None)
        for name in names:
            worker.wait_for_layer_load(name)
            worker.save_kv_layer(name, caches[name], None)
        worker.wait_for_save()
        worker.get_finished(set())
        worker.get_block_ids_with_load_errors()
        worker.clear_connector_metadata()

    def finish(req):
        sched.request_finished(req, [])
        worker.bind_connector_metadata(vc.KvpalaceConnectorMetadata())
        worker.get_finished({req.request_id})
        worker.clear_connector_metadata()

    w = Request("w", prompt)
    assert sched.get_num_new_matched_tokens(w, 0) == (0, False)
    step(w, blocks, 0, 0, len(prompt))
    finish(w)
    seq = [0]

    def conn_hit():
        seq[0] += 1
        req = Request("r%d" % seq[0], prompt)
        t = time.perf_counter()
        ext, _ = sched.get_num_new_matched_tokens(req, 0)
        sched.get_num_new_matched_tokens(req, 0)
        step(req, load_blocks, ext, ext, len(prompt) - ext)
        finish(req)
        return ext, time.perf_counter() - t

    spool, wpool = sched._pools[0], worker._pools[0]
    cache = kvpalace.EngineCache("flash_attn", [caches[n] for n in names], block_size=bs)

    def raw_hit():
        t = time.perf_counter()
        n = spool.lookup(prompt[:a.tokens])
        spool.lookup(prompt[:a.tokens])
        lease = spool.match(prompt[:n])
        wl = wpool.adopt(lease.id)
        wl.to_engine(cache, load_blocks[:n // bs], 0)
        wl.release()
        lease.release()
        return n, time.perf_counter() - t

    conn, conn_wall, raw = [], [], []
    for blk in range(a.blocks):
        for kind in (("c", "r", "r", "c") if blk % 2 == 0 else ("r", "c", "c", "r")):
            if kind == "c":
                sched.stats.reset()
                worker.stats.reset()
                wall = 0.0
                for _ in range(a.rounds):
                    ext, dt = conn_hit()
                    assert ext == a.tokens
                    wall += dt
                conn.append((sched.stats.kvp_seconds + worker.stats.kvp_seconds) / a.rounds)
                conn_wall.append(wall / a.rounds)
                served = worker.stats.blocks_loaded * worker._block_bytes
                copied = (worker.stats.bytes_loaded + worker.stats.bytes_saved +
                          worker.stats.bytes_staged)
            else:
                t = 0.0
                for _ in range(a.rounds):
                    n, dt = raw_hit()
                    assert n == a.tokens
                    t += dt
                raw.append(t / a.rounds)
    c, cw, r = (statistics.median(x) * 1e6 for x in (conn, conn_wall, raw))
    print("sample vllm.conn_us %.1f" % c)
    print("sample vllm.conn_wall_us %.1f" % cw)
    print("sample vllm.raw_us %.1f" % r)
    print("sample vllm.ratio %.3f" % (r / c))
    print("sample vllm.copy_ratio %.3f" % (copied / served))
    print("vLLM connector, %d-token hit, %d layers x 8 heads x 64 x block 16 bf16 (%d KiB): "
          "connector %.1f us in kvpalace calls (%.1f us in its methods), raw package calls "
          "%.1f us; raw/connector %.2f; %.2f bytes copied per byte served"
          % (a.tokens, L, nb * worker._block_bytes // 1024, c, cw, r, r / c, copied / served),
          file=sys.stderr)
    sched.shutdown()
    worker.shutdown()


if __name__ == "__main__":
    main()
