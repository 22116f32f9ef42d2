#!/bin/sh
# tests/redis/cluster.sh — a real 6-node Redis Cluster (3 masters, 3
# replicas) on loopback ports, for the remote tier's tests.
#
#   cluster.sh start DIR BASEPORT [WATCH_PID]  nodes on BASEPORT..BASEPORT+5
#                          (buses +10000), waits for cluster_state:ok on all
#                          and every replica's link; with WATCH_PID, a
#                          watcher stops the cluster once that process is
#                          gone (a test that crashed or was killed)
#   cluster.sh stop DIR    stops every node (SIGTERM, then SIGKILL)
#   cluster.sh kill DIR PORT   kills one node with SIGKILL (a crash)
#   cluster.sh restart DIR     starts again every node not running, from
#                          its config and nodes.conf, and waits for ok
#   cluster.sh wait DIR        waits for cluster_state:ok on running nodes
#
# Debian's /usr/bin/redis-server 7.0 and redis-cli. cluster-node-timeout is
# 1000 ms so a failover takes seconds. Extra redis.conf lines may come in
# $KVP_REDIS_CONF. Exits 77 when redis-server is missing.
set -eu
cmd=${1:?usage: cluster.sh start|stop|kill|restart|wait DIR ...}
dir=${2:?usage: cluster.sh $cmd DIR ...}
command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 ||
	{ echo "redis-server not found: skipping"; exit 77; }

running() { # PORT
	[ -f "$dir/$1/pid" ] && kill -0 "$(cat "$dir/$1/pid")" 2>/dev/null
}

wait_ok() {
	i=0
	while :; do
		bad=0
		for p in $(cat "$dir/ports"); do
			running "$p" || continue
			redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' ||
				bad=1
			if redis-cli -p "$p" info replication 2>/dev/null | grep -q '^role:slave'; then
				redis-cli -p "$p" info replication | grep -q '^master_link_status:up' ||
					bad=1
			fi
		done
		[ $bad -eq 0 ] && return 0
		i=$((i + 1))
		[ $i -lt 300 ] || { echo "cluster in $dir not ok after 30 s" >&2; return 1; }
		sleep 0.1
	done
}

start_node() { # PORT
	redis-server "$dir/$1/redis.conf"
	i=0
	until redis-cli -p "$1" ping 2>/dev/null | grep -q PONG; do
		i=$((i + 1))
		[ $i -lt 100 ] || { echo "redis-server on $1 did not start" >&2; return 1; }
		sleep 0.05
	done
}

case $cmd in
start)
	base=${3:?usage: cluster.sh start DIR BASEPORT [WATCH_PID]}
	mkdir -p "$dir"
	: >"$dir/ports"
	addrs=""
	for i in 0 1 2 3 4 5; do
		p=$((base + i))
		mkdir -p "$dir/$p"
		cat >"$dir/$p/redis.conf" <<CONF
port $p
bind 127.0.0.1
protected-mode no
daemonize yes
pidfile $dir/$p/pid
logfile $dir/$p/log
dir $dir/$p
cluster-enabled yes
cluster-config-file $dir/$p/nodes.conf
cluster-node-timeout 1000
save ""
appendonly no
${KVP_REDIS_CONF:-}
CONF
		echo "$p" >>"$dir/ports"
		start_node "$p"
		addrs="$addrs 127.0.0.1:$p"
	done
	# shellcheck disable=SC2086 # addresses without spaces
	redis-cli --cluster create $addrs --cluster-replicas 1 --cluster-yes \
		>"$dir/create.log" 2>&1 || { cat "$dir/create.log" >&2; exit 1; }
	wait_ok
	if [ -n "${4:-}" ]; then
		watch=$4
		(
			while kill -0 "$watch" 2>/dev/null; do sleep 1; done
			"$0" stop "$dir"
		) </dev/null >/dev/null 2>&1 &
	fi
	;;
stop)
	[ -f "$dir/ports" ] || exit 0
	for p in $(cat "$dir/ports"); do
		running "$p" && kill "$(cat "$dir/$p/pid")" 2>/dev/null || :
	done
	for p in $(cat "$dir/ports"); do
		i=0
		while running "$p"; do
			i=$((i + 1))
			[ $i -lt 50 ] || { kill -9 "$(cat "$dir/$p/pid")" 2>/dev/null || :; break; }
			sleep 0.1
		done
	done
	;;
kill)
	p=${3:?usage: cluster.sh kill DIR PORT}
	kill -9 "$(cat "$dir/$p/pid")"
	while running "$p"; do sleep 0.05; done
	;;
restart)
	for p in $(cat "$dir/ports"); do
		running "$p" || start_node "$p"
	done
	wait_ok
	;;
wait)
	wait_ok
	;;
*)
	echo "cluster.sh: unknown command $cmd" >&2
	exit 2
	;;
esac
