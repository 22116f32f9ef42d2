#!/bin/sh
# tests/check-exports.sh LIBRARY — fails when the shared library exports any
# symbol outside the public kvp_ namespace (STYLE.md: kvp_* are the only
# exported symbols). Reads the dynamic symbol table with nm; exits 77 (skip)
# when nm is not installed. Version-node symbols (type A, e.g. KVPALACE_1)
# are names of the version script, not code or data, and are allowed.
set -eu

lib=${1:?usage: check-exports.sh LIBRARY}
command -v nm >/dev/null 2>&1 || { echo "nm not found: skipping"; exit 77; }
[ -f "$lib" ] || { echo "no such library: $lib"; exit 1; }

syms=$(nm -D --defined-only "$lib" | awk 'NF >= 3 && $2 != "A" { print $3 }' | sed 's/@.*//')
if [ -z "$syms" ]; then
	echo "FAIL: $lib exports nothing"
	exit 1
fi
echo "$syms" | grep -qx 'kvp_connect' || { echo "FAIL: kvp_connect is not exported"; exit 1; }

bad=$(echo "$syms" | grep -v '^kvp_' || true)
if [ -n "$bad" ]; then
	echo "FAIL: symbols outside kvp_* exported by $lib:"
	echo "$bad"
	exit 1
fi
echo "OK: $(echo "$syms" | wc -l) symbols, all kvp_*"
