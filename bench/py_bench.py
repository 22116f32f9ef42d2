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
C time / Python time (1.0: no overhead; below 1: Python is slower)."""

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


if __name__ == "__main__":
    main()
