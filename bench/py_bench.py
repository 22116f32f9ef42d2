#!/usr/bin/python3
"""bench/py_bench.py — the Python package's overhead: Pool.lookup and
Pool.match + Lease.release against the same calls from C
(kvp-bench-pyref, bench/py_ref.c), in blocks ordered ours, C, C, ours so
both see the same seconds of a noisy machine.

    PYTHONPATH=build/python /usr/bin/python3 bench/py_bench.py \\
        --socket SOCK --ref build/bench/kvp-bench-pyref [--blocks 20] [--calls 2000]

against a running kvpalaced. Prints "sample NAME VALUE" lines (µs per
call: py.lookup_us, py.ref_lookup_us, py.match_us, py.ref_match_us, and
per-block ratios C/Python as py.lookup_ratio, py.match_ratio) on stdout
for bench/run's area py, and a summary on stderr: medians, and the ratio
C time / Python time (1.0: no overhead; below 1: Python is slower).

Then, from Python alone, in the same interleaved blocks: one
Pool.lookup_batch of 64 prompts against 64 Pool.lookup calls
(py.batch64_us, py.singles64_us), and Lease.to_engine of 16 pages of a
Llama-shaped layer slice (8 layers, 8 KV heads of 128, f16: 8 MiB) into
a FlashAttention cache against numpy's copy of the same bytes between
two buffers, a memcpy (py.to_engine_gbs, py.memcpy_gbs)."""

import argparse
import os
import statistics
import subprocess
import sys
import time

import kvpalace

LAYOUT = kvpalace.Layout(2, 2, 32, 16, "f16")


def timed(fn, calls):
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--ref", required=True, help="kvp-bench-pyref")
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--list", action="store_true",
                    help="tokens as a list of ints (converted each call) instead of a numpy "
                    "uint32 array (passed without a copy)")
    a = ap.parse_args()

    model = "py-bench-%d" % os.getpid()
    tokens = list(range(a.tokens))
    if not a.list:
        import numpy

        tokens = numpy.arange(a.tokens, dtype=numpy.uint32)
    with kvpalace.Client(a.socket) as c, c.open_pool(model, LAYOUT) as pool:
        with pool.session() as s:
            s.append(tokens)
            s.commit()
        assert pool.lookup(tokens) == a.tokens // 16 * 16
        ref = subprocess.Popen([a.ref, a.socket, model, str(a.tokens)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)

        def theirs(op):
            ref.stdin.write("%s %d\n" % (op, a.calls))
            ref.stdin.flush()
            line = ref.stdout.readline()
            if not line:
                sys.exit("kvp-bench-pyref ended")
            return float(line)

        def match_release():
            pool.match(tokens).release()

        ours_fn = {"lookup": lambda: pool.lookup(tokens), "match": match_release}
        res = {op: ([], []) for op in ours_fn}
        for op in ours_fn:  # warm both sides
            timed(ours_fn[op], a.calls // 10 or 1)
            theirs(op)
        for _ in range(a.blocks):
            for op, fn in ours_fn.items():
                o1 = timed(fn, a.calls)
                t1 = theirs(op)
                t2 = theirs(op)
                o2 = timed(fn, a.calls)
                res[op][0].append((o1 + o2) / 2000)
                res[op][1].append((t1 + t2) / 2000)
        ref.stdin.write("quit\n")
        ref.stdin.close()
        ref.wait(30)
        extra = python_only(c, pool, tokens, a)

    for name, vals in extra.items():
        for v in vals:
            print("sample py.%s %.4f" % (name, v))
    for a_, b_, unit, what in (("batch64_us", "singles64_us", "us", "64 lookups: one batch vs 64 calls"),
                               ("to_engine_gbs", "memcpy_gbs", "GB/s", "Lease.to_engine vs memcpy")):
        ma, mb = statistics.median(extra[a_]), statistics.median(extra[b_])
        ratio = mb / ma if unit == "us" else ma / mb
        print("%-34s %9.2f vs %9.2f %s  ratio %.3f" % (what, ma, mb, unit, ratio), file=sys.stderr)
    for op, (ours, c_side) in res.items():
        for v in ours:
            print("sample py.%s_us %.3f" % (op, v))
        for v in c_side:
            print("sample py.ref_%s_us %.3f" % (op, v))
        for o, t in zip(ours, c_side):
            print("sample py.%s_ratio %.4f" % (op, t / o))
        mo, mt = statistics.median(ours), statistics.median(c_side)
        ratios = sorted(t / o for o, t in zip(ours, c_side))
        print("%-22s Python %7.2f us  C %7.2f us  ratio C/Python %.3f (blocks %.3f..%.3f)"
              % (op + (" + release" if op == "match" else ""), mo, mt,
                 statistics.median(ratios), ratios[0], ratios[-1]), file=sys.stderr)


def python_only(c, pool, tokens, a):
    """The batch and the copy figures, each against its reference in alternating blocks."""
    import numpy

    prompts = [numpy.arange(i * 1000, i * 1000 + a.tokens, dtype=numpy.uint32) for i in range(64)]
    with pool.session() as s:
        s.append(prompts[0])
        s.commit()
    calls = max(a.calls // 64, 4)
    out = {k: [] for k in ("batch64_us", "singles64_us", "to_engine_gbs", "memcpy_gbs")}

    def singles():
        for p in prompts:
            pool.lookup(p)

    big = kvpalace.Layout(8, 8, 128, 16, "f16")
    n_pages = 16
    t = numpy.arange(n_pages * 16, dtype=numpy.uint32)
    with c.open_pool("py-bench-copy-%d" % os.getpid(), big) as bp:
        with bp.session() as s:
            s.append(t)
            s.commit()
        kv = [numpy.zeros((2, n_pages, 16, 8, 128), numpy.float16) for _ in range(8)]
        cache = kvpalace.EngineCache("flash_attn", kv)
        nbytes = n_pages * bp.page_bytes
        src = numpy.ones(nbytes, numpy.uint8)
        dst = numpy.zeros(nbytes, numpy.uint8)
        blocks = list(range(n_pages))
        with bp.match(t) as lease:
            copy = lambda: lease.to_engine(cache, blocks)  # noqa: E731
            ref = lambda: numpy.copyto(dst, src)  # noqa: E731
            for fn in (copy, ref, singles, lambda: pool.lookup_batch(prompts)):
                timed(fn, 3)
            for _ in range(a.blocks):
                out["batch64_us"].append(timed(lambda: pool.lookup_batch(prompts), calls) / 1000)
                out["singles64_us"].append(timed(singles, calls) / 1000)
                out["memcpy_gbs"].append(nbytes / timed(ref, 20))
                out["to_engine_gbs"].append(nbytes / timed(copy, 20))
    return out


if __name__ == "__main__":
    main()
