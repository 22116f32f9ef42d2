#!/bin/sh
# tests/check-layers.sh CALLGRAPH LIB_OR_OBJDIR... — fails when a file of
# the daemon, the client library or kvpalacectl calls a non-static
# function of a file that calls it back, directly or through others: the
# rule of daemon/README.md and client/README.md, which the layers'
# include paths cannot check inside one folder. Each argument is a
# layer's static library (daemon/libkvpd_<layer>.a,
# client/<layer>/libkvpc_<layer>.a) or a folder of a program's object
# files (kvpalacectl's); tools/callgraph.py reads their symbol tables.
# Exits 77 (skip) without ar or nm.
set -eu

callgraph=${1:?usage: check-layers.sh CALLGRAPH LIB_OR_OBJDIR...}
shift
command -v ar >/dev/null 2>&1 && command -v nm >/dev/null 2>&1 ||
	{ echo "ar or nm not found: skipping"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

objs=""
for a in "$@"; do
	if [ -d "$a" ]; then
		objs="$objs $(ls "$a"/*.o)"
	elif [ "$(head -c 7 "$a")" = '!<thin>' ]; then
		# A thin archive (meson's): ar t names its members' paths.
		objs="$objs $(ar t "$a")"
	else
		# A full archive: unpack it under <layer>/lib.p so that
		# callgraph.py names its files <layer>/<file>.
		d="$tmp/$(basename "$(dirname "$a")")/lib.p"
		mkdir -p "$d"
		(cd "$d" && ar x "$a")
		objs="$objs $(ls "$d"/*.o)"
	fi
done
# shellcheck disable=SC2086 # paths of the build tree, without spaces
exec python3 "$callgraph" --check $objs
