#!/bin/bash
# tests/integration/trace_replay.sh — kvpalaced equals its own simulation
# on a single replaying client: for each --eviction policy (lru, window),
# a fresh kvpalaced with a small host tier and no disk tier, one trace
# replayed by one worker through the real library (kvp-bench-trace run
# --workers 1: sequential), and the daemon's prompt tokens served from the
# cache must equal, exactly, those of bench/trace_sim.c's simulation of
# that policy at the pool's capacity (leaf-LRU, leaf-window).
#
# Usage: trace_replay.sh KVPALACED KVP_BENCH_TRACE [SHAPE REQUESTS]
# (meson passes the first two; the slow suite a larger trace).
set -u
kvpalaced=$1 bench=$2 shape=${3:-prod} requests=${4:-1500}
tmp=$(mktemp -d /tmp/kvp-trace-replay.XXXXXX)
pid=""
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*" >&2
	[ -f "$tmp/kvpalaced.log" ] && tail -n 20 "$tmp/kvpalaced.log" >&2
	exit 1
}

for policy in lru window; do
	rm -rf "$tmp/d"
	mkdir -p "$tmp/d/state" "$tmp/d/cache"
	"$kvpalaced" --socket "$tmp/kvp.sock" --admin-socket "$tmp/kvp-admin.sock" \
		--state-dir "$tmp/d/state" --cache-dir "$tmp/d/cache" \
		--host-pool-size 2M --disk-pool-size 0 --eviction "$policy" \
		--host-high-watermark 0.95 --host-low-watermark 0.90 \
		>>"$tmp/kvpalaced.log" 2>&1 &
	pid=$!
	for _ in $(seq 1 200); do
		[ -S "$tmp/kvp.sock" ] && break
		kill -0 "$pid" 2>/dev/null || fail "kvpalaced --eviction $policy did not start"
		sleep 0.05
	done
	[ -S "$tmp/kvp.sock" ] || fail "kvpalaced --eviction $policy: no socket"
	"$bench" run --socket "$tmp/kvp.sock" --workers 1 --shape "$shape" --seed 3 \
		--users 60 --requests "$requests" \
		--high-watermark 0.95 --low-watermark 0.90 \
		>"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err" >&2; fail "kvp-bench-trace run ($policy)"; }
	kill -0 "$pid" 2>/dev/null || fail "kvpalaced died ($policy)"
	kill "$pid"
	wait "$pid"
	pid=""
	rm -f "$tmp/kvp.sock" "$tmp/kvp-admin.sock"
	daemon=$(awk '$2 == "trace.daemon_tokens" { print $3 }' "$tmp/out")
	case $policy in
	lru) sim=$(awk '$2 == "trace.leaf_lru_tokens" { print $3 }' "$tmp/out") ;;
	window) sim=$(awk '$2 == "trace.leaf_window_tokens" { print $3 }' "$tmp/out") ;;
	esac
	lru=$(awk '$2 == "trace.leaf_lru_tokens" { print $3 }' "$tmp/out")
	[ -n "$daemon" ] && [ -n "$sim" ] || fail "no token counts in the output ($policy)"
	echo "--eviction $policy: daemon served $daemon tokens, its simulation $sim (leaf-LRU $lru)"
	[ "$daemon" -gt 0 ] || fail "$policy: nothing served: the trace is no test"
	[ "$daemon" = "$sim" ] || { cat "$tmp/err" >&2; fail "$policy: the daemon served $daemon tokens, its simulation $sim"; }
	[ "$policy" = window ] && [ "$sim" = "$lru" ] &&
		fail "window served exactly what leaf-LRU did: the trace does not tell them apart"
done
echo "ok"
