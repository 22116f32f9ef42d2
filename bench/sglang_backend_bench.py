#!/usr/bin/python3
"""bench/sglang_backend_bench.py — the SGLang HiCache backend's own cost
(kvpalace.sglang_backend) per 1k-token prefix hit, driven as SGLang drives
it (tests/python/sglang_driver.py: batch_exists, then batch_get_v1 into a
host pool of SGLang's layout), beside the raw package calls that serve
the same bytes in the same run:

  raw.pages  the same per-page calls without the backend: lookup_batch of
             the pages' extra keys, then per page Pool.match, the page's
             tensor copied into the host pool's slots (the same strided
             torch copy_ into SGLang's layout), release: what is left is
             the backend's own Python;
  raw.contig the same calls, each page copied into a contiguous buffer
             (np.copyto of Page.array(): the cost of SGLang's layout);
  raw.chain  the package's best case, one ordinary 1k-token chain:
             Pool.lookup, one Pool.match, the pages copied contiguously.

Blocks run ours, raw, raw, ours so all see the same seconds of a noisy
machine. Also: bytes the backend copied per byte it served, and the
write-back (batch_set_v1) time per 1k tokens.

    PYTHONPATH=build/python /usr/bin/python3 bench/sglang_backend_bench.py \\
        --daemon build/daemon/kvpalaced [--layout page_first] [--blocks 10]

(or --socket SOCK of a running kvpalaced with room for the pages). Prints
"sample NAME VALUE" lines (ms per 1k-token hit) on stdout and a summary
on stderr: medians and the ratio raw / ours (1.0: no overhead)."""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import kvpalace
from kvpalace import sglang_backend as sb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))
from sglang_driver import Controller, HostPool, page_keys, storage_config  # noqa: E402


def start_daemon(path, pool_size):
    d = tempfile.mkdtemp(prefix="kvp-sglb-", dir="/tmp")
    sock = os.path.join(d, "s")
    proc = subprocess.Popen([path, "--socket", sock, "--admin-socket", os.path.join(d, "a"),
                             "--state-dir", os.path.join(d, "state"), "--cache-dir",
                             os.path.join(d, "cache"), "--host-pool-size", pool_size])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            kvpalace.Client(sock).close()
            return proc, sock, d
        except kvpalace.Error:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError("kvpalaced did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket")
    ap.add_argument("--daemon", help="kvpalaced to start for the run")
    ap.add_argument("--pool-size", default="512M")
    ap.add_argument("--layout", default="page_first",
                    choices=["layer_first", "page_first", "page_first_direct", "page_head"])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=2, help="KV heads of this rank")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5, help="hits per block")
    a = ap.parse_args()
    if not (a.socket or a.daemon):
        ap.error("--socket or --daemon")
    proc = tmp = None
    sock = a.socket
    if a.daemon:
        proc, sock, tmp = start_daemon(a.daemon, a.pool_size)
    try:
        run(a, sock)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
            shutil.rmtree(tmp, ignore_errors=True)


def run(a, sock):
    ps = a.page_size
    n_pages = a.tokens // ps
    model = "sglb-%d" % os.getpid()
    host = HostPool(a.layout, 2 * n_pages, ps, a.layers, a.heads, a.head_dim,
                    dtype=torch.bfloat16)
    conf = storage_config(extra_config={"kvpalace_socket": sock, "kvpalace_model_id": model,
                                        "interface_v1": 1})
    ctl = Controller(sb.KvpalaceStorage(conf, {}), host)
    be = ctl.backend
    tokens = list(range(n_pages * ps))
    keys = page_keys(tokens, ps)
    idx = host.alloc(n_pages * ps)
    host.fill(idx, seed=1)
    t0 = time.perf_counter()
    assert ctl.write_back(keys, idx) == n_pages * ps
    set_ms = (time.perf_counter() - t0) * 1e3
    dst = host.alloc(n_pages * ps)

    # The raw calls' pool: the same geometry, and one ordinary chain.
    client = kvpalace.Client(sock)
    pool = client.open_pool(model, be.host.layout())
    chain = np.arange(n_pages * ps, dtype=np.uint32) + 7
    with pool.session() as s:
        s.append(chain)
        for i in range(n_pages):
            s.page(i).array()[...] = 1
        s.commit()
    page_shape = (a.layers, 2, a.heads, ps, a.head_dim)
    buf = np.empty((n_pages,) + page_shape, dtype=np.uint16)
    ph = np.zeros(ps, dtype=np.uint32)
    ekeys = [sb.storage_key(k) for k in keys]

    def ours():
        assert be.batch_exists(keys) == n_pages
        assert all(be.batch_get_v1(keys, dst))

    starts = dst.tolist()[::ps]
    views = [be.host.view(st) for st in starts]

    def raw_pages():
        res = pool.lookup_batch([ph] * n_pages, extra_keys=ekeys)
        assert all(m == ps for m, _ in res)
        for i, k in enumerate(ekeys):
            with pool.match(ph, extra_key=k) as lease:
                if be.host.engine is not None:
                    lease.to_engine(be.host.engine, [starts[i] // ps])
                else:
                    views[i].copy_(lease.page(0).tensor())

    def raw_contig():
        res = pool.lookup_batch([ph] * n_pages, extra_keys=ekeys)
        assert all(m == ps for m, _ in res)
        for i, k in enumerate(ekeys):
            with pool.match(ph, extra_key=k) as lease:
                np.copyto(buf[i], lease.page(0).array().view(np.uint16))

    def raw_chain():
        assert pool.lookup(chain) == n_pages * ps
        with pool.match(chain) as lease:
            for i in range(n_pages):
                np.copyto(buf[i], lease.page(i).array().view(np.uint16))

    def timed(fn):
        t = time.perf_counter()
        for _ in range(a.reps):
            fn()
        return (time.perf_counter() - t) / a.reps * 1e3 * 1024 / (n_pages * ps)

    refs = {"raw.pages": raw_pages, "raw.contig": raw_contig, "raw.chain": raw_chain}
    ours()
    for fn in refs.values():
        fn()  # warm
    s0 = dict(be.stats)
    samples = {k: [] for k in ["ours"] + list(refs)}
    for _ in range(a.blocks):
        samples["ours"].append(timed(ours))
        for _twice in range(2):
            for k, fn in refs.items():
                samples[k].append(timed(fn))
        samples["ours"].append(timed(ours))
    served = be.stats["bytes_served"] - s0["bytes_served"]
    copied = be.stats["bytes_copied"] - s0["bytes_copied"]
    for name, vals in samples.items():
        for v in vals:
            print("sample sglang.%s_ms %.4f" % (name, v))
    med = {k: statistics.median(v) for k, v in samples.items()}
    page_mb = be.host.page_bytes / 2**20
    print("sglang backend, %s host layout, %d layers x %d heads x %d dim bf16, page %d tokens "
          "(%.2f MiB), %d-token hit = %d pages%s:" % (
              a.layout, a.layers, a.heads, a.head_dim, ps, page_mb, n_pages * ps, n_pages,
              ", EngineCache copies" if be.host.engine is not None else ", torch copies"),
          file=sys.stderr)
    print("  ours (batch_exists + batch_get_v1): %.3f ms per 1k tokens" % med["ours"],
          file=sys.stderr)
    for k in refs:
        print("  %-10s %.3f ms per 1k tokens, ratio raw/ours %.2f" % (k, med[k],
                                                                     med[k] / med["ours"]),
              file=sys.stderr)
    print("  bytes copied per byte served: %.2f (%d MiB served)" % (
        copied / served, served // 2**20), file=sys.stderr)
    print("  write-back (lookup + batch_set_v1 of %d new pages): %.3f ms per 1k tokens" % (
        n_pages, set_ms * 1024 / (n_pages * ps)), file=sys.stderr)
    be.close()
    pool.close()
    client.close()


if __name__ == "__main__":
    main()
