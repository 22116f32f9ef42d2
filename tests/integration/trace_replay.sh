#!/bin/bash
# tests/integration/trace_replay.sh — kvpalaced equals its own simulation
# on a single replaying client: for each --eviction policy (lru, window),
# a fresh kvpalaced with a small host tier and no disk tier, one trace
# replayed by one worker through the real library (kvp-bench-trace run
# --workers 1: sequential), and the daemon's prompt tokens served from the
# cache must equal, exactly, those of bench/trace_sim.c's simulation of
# that policy at the pool's capacity (leaf-LRU, leaf-window).
#
# Then disk admission: the same trace against a 512-page host tier and a
# disk tier, --disk-admission all and reused; the pool's Stats (read with
# kvpalacectl --json stats) must say what was written and served: with
# all, no victim is refused and the bytes written are the spilled pages
# and their 128-byte headers, the bytes served the promoted pages; with
# reused, victims are dropped unwritten (disk_unadmitted_pages > 0) and
# fewer bytes are written, while matches still hit.
#
# Usage: trace_replay.sh KVPALACED KVP_BENCH_TRACE KVPALACECTL [SHAPE REQUESTS]
# (meson passes the first three; SHAPE and REQUESTS default to prod, 1500:
# a trace whose requests fit the 512-page host pool).
set -u
kvpalaced=$1 bench=$2 ctl=$3 shape=${4:-prod} requests=${5:-1500}
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

# start_and_replay WHAT DAEMON-OPTIONS...: a fresh daemon, one replay into
# $tmp/out; the daemon stays up (stop_daemon).
start_and_replay() {
	local what=$1
	shift
	rm -rf "$tmp/d"
	mkdir -p "$tmp/d/state" "$tmp/d/cache"
	"$kvpalaced" --socket "$tmp/kvp.sock" --admin-socket "$tmp/kvp-admin.sock" \
		--state-dir "$tmp/d/state" --cache-dir "$tmp/d/cache" --host-pool-size 2M \
		--host-high-watermark 0.95 --host-low-watermark 0.90 "$@" \
		>>"$tmp/kvpalaced.log" 2>&1 &
	pid=$!
	for _ in $(seq 1 200); do
		[ -S "$tmp/kvp.sock" ] && break
		kill -0 "$pid" 2>/dev/null || fail "kvpalaced ($what) did not start"
		sleep 0.05
	done
	[ -S "$tmp/kvp.sock" ] || fail "kvpalaced ($what): no socket"
	"$bench" run --socket "$tmp/kvp.sock" --workers 1 --shape "$shape" --seed 3 \
		--users 60 --requests "$requests" \
		--high-watermark 0.95 --low-watermark 0.90 \
		>"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err" >&2; fail "kvp-bench-trace run ($what)"; }
	kill -0 "$pid" 2>/dev/null || fail "kvpalaced died ($what)"
}

stop_daemon() {
	kill "$pid"
	wait "$pid"
	pid=""
	rm -f "$tmp/kvp.sock" "$tmp/kvp-admin.sock"
}

for policy in lru window; do
	start_and_replay "--eviction $policy" --disk-pool-size 0 --eviction "$policy"
	stop_daemon
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
	# On prod the two orders differ (the other shapes may tie).
	[ "$shape" = prod ] && [ "$policy" = window ] && [ "$sim" = "$lru" ] &&
		fail "window served exactly what leaf-LRU did: the trace does not tell them apart"
done

# One pool's disk counters from kvpalacectl --json stats, as
# "written served unadmitted spilled promoted page_bytes".
disk_counters() {
	"$ctl" --socket "$tmp/kvp-admin.sock" --json stats >"$tmp/stats.json" ||
		fail "kvpalacectl stats"
	/usr/bin/python3 - "$tmp/stats.json" <<'PY' || fail "no disk counters in kvpalacectl --json stats"
import json, sys
doc = json.load(open(sys.argv[1]))
pools = doc["pools"]
assert len(pools) == 1, pools
p = pools[0]
d = p["disk"]
print(d["disk_written_bytes"], d["disk_served_bytes"], d["disk_unadmitted_pages"],
      d["spilled_pages"], d["promoted_pages"], p["page_bytes"])
PY
}

for adm in all reused; do
	start_and_replay "--disk-admission $adm" --disk-pool-size 32M --disk-admission "$adm"
	read -r written served unadmitted spilled promoted page_bytes < <(disk_counters)
	stop_daemon
	hits=$(awk '$2 == "trace.daemon_tokens" { print $3 }' "$tmp/out")
	echo "--disk-admission $adm: $hits tokens served; disk: $written bytes written" \
		"($spilled pages), $served served ($promoted pages), $unadmitted victims not admitted"
	[ "$hits" -gt 0 ] || fail "$adm: nothing served"
	[ "$served" = $((promoted * page_bytes)) ] ||
		fail "$adm: $served bytes served for $promoted pages of $page_bytes"
	[ "$written" = $((spilled * (page_bytes + 128))) ] ||
		fail "$adm: $written bytes written for $spilled pages of $page_bytes + 128"
	case $adm in
	all)
		[ "$unadmitted" = 0 ] || fail "all: $unadmitted victims not admitted"
		[ "$spilled" -gt 0 ] && [ "$promoted" -gt 0 ] ||
			fail "all: the trace never used the disk tier ($spilled spilled, $promoted promoted)"
		written_all=$written
		;;
	reused)
		[ "$unadmitted" -gt 0 ] || fail "reused: every victim was admitted"
		[ "$written" -lt "$written_all" ] ||
			fail "reused wrote $written bytes, all $written_all"
		;;
	esac
done
echo "ok"
