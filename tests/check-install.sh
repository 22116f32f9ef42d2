#!/bin/sh
# tests/check-install.sh BUILD — what `meson install` puts on a machine, as
# an operator or a packager uses it: staged with --destdir in a temporary
# directory, it checks that
#   - the pkg-config file gives an include directory holding kvpalace.h and
#     a library directory holding libkvpalace.so, plainly and with
#     --define-prefix (which guesses a wrong prefix under a multiarch
#     libdir), by building and running a program against the staged tree;
#   - the units lie where systemd.pc says units go under our prefix;
#   - systemd-analyze verify finds nothing to say about them, and
#     systemd-analyze security rates each service's exposure at most 1.0;
#   - the users and groups the units name are those systemd-sysusers
#     creates from the sysusers.d snippet, and ExecStart's sockets are
#     where the socket units listen;
#   - the staged daemon's exit status for a bad command line and a bad
#     configuration file is one the service's RestartPreventExitStatus=
#     lists (restarting cannot fix those).
# Exits 77 when meson or pkg-config is missing; systemd-analyze parts are
# skipped (with a line saying so) where it is not installed.
set -eu

build=$(cd "${1:?usage: check-install.sh BUILD}" && pwd)
command -v meson >/dev/null 2>&1 || { echo "meson not found: skipping"; exit 77; }
command -v pkg-config >/dev/null 2>&1 || { echo "pkg-config not found: skipping"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
	echo "FAIL: $*"
	exit 1
}

stage=$tmp/stage
meson install -C "$build" --no-rebuild --destdir "$stage" >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log"; fail "meson install failed"; }
prefix=$(meson introspect "$build" --buildoptions |
	/usr/bin/python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"][0])')

# ---- the pkg-config file --------------------------------------------------
pc=$(find "$stage" -name kvpalace.pc | head -n 1)
[ -n "$pc" ] || fail "no kvpalace.pc installed"
cat >"$tmp/t.c" <<'C'
#include <kvpalace.h>
int main(void)
{
	return kvp_checkpoint_name_check("ok") == 0 && kvp_checkpoint_name_check("") < 0 ? 0 : 1;
}
C
for mode in "" --define-prefix; do
	flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config $mode --cflags --libs kvpalace)
	inc=$(echo "$flags" | tr ' ' '\n' | sed -n 's/^-I//p')
	lib=$(echo "$flags" | tr ' ' '\n' | sed -n 's/^-L//p')
	[ -f "$inc/kvpalace.h" ] || fail "pkg-config $mode: -I$inc holds no kvpalace.h"
	[ -e "$lib/libkvpalace.so" ] || fail "pkg-config $mode: -L$lib holds no libkvpalace.so"
	# A sanitizer build's library wants the program built the same way
	# (its runtime must come first).
	san=""
	if readelf -d "$lib/libkvpalace.so" 2>/dev/null | grep -q 'NEEDED.*libasan'; then
		san="-fsanitize=address,undefined"
	fi
	# shellcheck disable=SC2086
	cc $san -o "$tmp/t" "$tmp/t.c" $flags || fail "pkg-config $mode: cannot build against it"
	LD_LIBRARY_PATH=$lib "$tmp/t" || fail "pkg-config $mode: the program did not run"
done
echo "OK: kvpalace.pc, plain and --define-prefix"

# ---- the units ------------------------------------------------------------
unitdir=$(pkg-config --define-variable=root_prefix="$prefix" --variable=systemdsystemunitdir systemd 2>/dev/null || echo "$prefix/lib/systemd/system")
service=$stage$unitdir/kvpalaced.service
[ -f "$service" ] || fail "no kvpalaced.service in $unitdir"
for u in kvpalaced.socket kvpalaced-admin.socket; do
	[ -f "$stage$unitdir/$u" ] || fail "no $u in $unitdir"
done
sbin=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$service")
daemon=$stage$sbin
[ -x "$daemon" ] || fail "ExecStart=$sbin is not installed"

if command -v systemd-analyze >/dev/null 2>&1; then
	# verify checks that ExecStart= exists: point each at the staged binary.
	mkdir "$tmp/units"
	cp "$stage$unitdir"/kvpalace* "$tmp/units/"
	for u in "$tmp/units"/*.service; do
		exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$u")
		[ -x "$stage$exe" ] || fail "$(basename "$u"): ExecStart=$exe is not installed"
		sed -i "s#^ExecStart=$exe#ExecStart=$stage$exe#" "$u"
	done
	out=$(cd "$tmp/units" && systemd-analyze verify --man=no ./*.service ./*.socket 2>&1) ||
		fail "systemd-analyze verify: $out"
	[ -z "$out" ] || fail "systemd-analyze verify has something to say: $out"
	for u in "$tmp/units"/*.service; do
		name=$(basename "$u")
		exposure=$(systemd-analyze security --offline=yes "$u" 2>&1 |
			sed -n "s/.*Overall exposure level for $name: \([0-9.]*\).*/\1/p")
		[ -n "$exposure" ] || fail "systemd-analyze security gave no exposure level for $name"
		awk -v e="$exposure" 'BEGIN { exit !(e <= 1.0) }' ||
			fail "$name exposure $exposure > 1.0"
		echo "OK: $name verified, exposure $exposure"
	done
else
	echo "systemd-analyze not found: units not verified"
fi

# ---- what the units and the sysusers.d snippet agree on ---------------------
# The users and groups the units name exist once systemd-sysusers has read
# the snippet (into an empty root here).
sysusers=$(pkg-config --define-variable=prefix="$prefix" --variable=sysusersdir systemd 2>/dev/null || echo "$prefix/lib/sysusers.d")
[ -f "$stage$sysusers/kvpalace.conf" ] || fail "no kvpalace.conf in $sysusers"
if command -v systemd-sysusers >/dev/null 2>&1; then
	mkdir -p "$tmp/root/etc"
	systemd-sysusers --root="$tmp/root" "$stage$sysusers/kvpalace.conf" >/dev/null 2>&1 ||
		fail "systemd-sysusers refused kvpalace.conf"
	for name in $(sed -n 's/^User=//p' "$stage$unitdir"/kvpalace*); do
		grep -q "^$name:" "$tmp/root/etc/passwd" ||
			fail "a unit names user $name, which kvpalace.conf does not create"
	done
	for name in $(sed -n 's/^\(Group\|SocketGroup\)=//p' "$stage$unitdir"/kvpalace*); do
		grep -q "^$name:" "$tmp/root/etc/group" ||
			fail "a unit names group $name, which kvpalace.conf does not create"
	done
	echo "OK: the units' users and groups come from kvpalace.conf"
fi
# The daemon's --socket and --admin-socket are where the socket units
# listen (a daemon started without activation binds the same paths).
for pair in "--socket kvpalaced.socket" "--admin-socket kvpalaced-admin.socket"; do
	opt=${pair%% *}
	unit=${pair#* }
	want=$(sed -n "s/^ExecStart=.* $opt \([^ ]*\).*/\1/p" "$service")
	got=$(sed -n 's/^ListenSequentialPacket=//p' "$stage$unitdir/$unit")
	[ -n "$want" ] && [ "$want" = "$got" ] || fail "$opt $want but $unit listens on $got"
done
echo "OK: ExecStart's sockets are the socket units'"

# ---- exit statuses the service will not restart on -------------------------
prevent=$(sed -n 's/^RestartPreventExitStatus=//p' "$service")
[ -n "$prevent" ] || fail "kvpalaced.service has no RestartPreventExitStatus="
printf 'bogus-key = 1\n' >"$tmp/bad.conf"
for args in "--bogus-option" "--config $tmp/bad.conf" "--config $tmp/missing.conf" \
	"--max-connections=many"; do
	st=0
	# shellcheck disable=SC2086
	"$daemon" $args >/dev/null 2>&1 || st=$?
	echo " $prevent " | grep -q " $st " ||
		fail "kvpalaced $args exits $st, not in RestartPreventExitStatus=$prevent"
done
echo "OK: configuration errors exit with $prevent, which the service does not restart on"
