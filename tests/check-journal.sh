#!/bin/sh
# tests/check-journal.sh KVPALACED — the daemon writes "<N>"-prefixed lines
# to stderr, except when $JOURNAL_STREAM names its stderr (device:inode), as
# systemd sets it when stderr is the journal: then it sends native journal
# entries instead and stderr stays free of prefixed lines.
set -eu
daemon=${1:?usage: check-journal.sh KVPALACED}
dir=$(mktemp -d /tmp/kvp-journal.XXXXXX)
trap 'rm -rf "$dir"' EXIT

run() { # run LOG [JOURNAL_STREAM]: start, let it log, stop
	if [ -n "${2:-}" ]; then
		JOURNAL_STREAM=$2 "$daemon" --socket "$dir/c.sock" --state-dir "$dir/s" \
			--cache-dir "$dir/c" 2>>"$1" &
	else
		"$daemon" --socket "$dir/c.sock" --state-dir "$dir/s" --cache-dir "$dir/c" 2>>"$1" &
	fi
	pid=$!
	for _ in $(seq 50); do [ -S "$dir/c.sock" ] && break; sleep 0.1; done
	kill -TERM "$pid"
	wait "$pid"
}

: >"$dir/plain.log"
run "$dir/plain.log"
grep -q '^<5>kvpalaced .* serving on' "$dir/plain.log" || {
	echo "FAIL: no <5> serving line on stderr:"; cat "$dir/plain.log"; exit 1; }

: >"$dir/journal.log"
run "$dir/journal.log" "$(stat -c %d:%i "$dir/journal.log")"
if grep -q '^<[0-7]>' "$dir/journal.log"; then
	echo "FAIL: prefixed lines on stderr although JOURNAL_STREAM names it:"
	cat "$dir/journal.log"
	exit 1
fi
echo "ok: stderr with <N> prefixes, native journal when JOURNAL_STREAM matches"
