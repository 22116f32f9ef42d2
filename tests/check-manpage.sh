#!/bin/sh
# tests/check-manpage.sh HEADER PAGE — libkvpalace(3), generated from the
# header by tools/header2man.py, documents every public function of the
# header and renders without a groff warning. Exits 77 without groff.
set -eu

header=${1:?usage: check-manpage.sh HEADER PAGE}
page=${2:?usage: check-manpage.sh HEADER PAGE}
command -v groff >/dev/null 2>&1 || { echo "groff not found: skipping"; exit 77; }

warnings=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
[ -z "$warnings" ] || { echo "FAIL: groff warns:"; echo "$warnings"; exit 1; }
text=$(groff -man -Tutf8 -P-c -P-b -P-u "$page" 2>/dev/null)
missing=""
n=0
for f in $(sed -n 's/^KVP_PUBLIC .*[ *]\(kvp_[a-z0-9_]*\)(.*/\1/p' "$header"); do
	n=$((n + 1))
	echo "$text" | grep -q "[ *]$f(" || missing="$missing $f"
done
[ "$n" -gt 50 ] || { echo "FAIL: found only $n functions in $header"; exit 1; }
[ -z "$missing" ] || { echo "FAIL: not in $page:$missing"; exit 1; }
echo "OK: $n functions, no groff warning"
