#!/bin/sh
# tests/gpu/run.sh — the GPU check of kvpalace's kernels on a machine with
# a GPU: configures a CUDA build in build-gpu/ (or $KVP_BUILD_DIR) with
# -Dcuda=enabled, builds the GPU test and the kernel benchmark, runs the
# test suite `gpu` (each CUDA kernel against its C reference), then the GPU
# benchmarks (quantize, dequantize, attention, gather, Q·Kᵀ in GB/s next to
# a device-to-device cudaMemcpy of the same bytes), and prints a summary.
# A few minutes on one GPU, most of it compiling.
#
# Exit status: 0 when the tests passed and the benchmarks ran, 77 when no
# usable GPU was found (the test skipped), 1 otherwise. Extra arguments go
# to kvp-bench-kernel (e.g. --gpu-mib 2048 --seconds 1).
set -eu
cd "$(dirname "$0")/../.."
build=${KVP_BUILD_DIR:-build-gpu}
if [ -x /usr/local/cuda/bin/nvcc ]; then
	PATH=/usr/local/cuda/bin:$PATH
	export PATH
fi
log=$(mktemp -d "${TMPDIR:-/tmp}/kvp-gpu.XXXXXX")
trap 'rm -rf "$log"' EXIT

say() { printf '== %s\n' "$*"; }

if [ ! -f "$build/build.ninja" ]; then
	say "configuring $build (-Dcuda=enabled)"
	meson setup "$build" -Dcuda=enabled -Dbuildtype=debugoptimized >"$log/setup" 2>&1 ||
		{ cat "$log/setup"; exit 1; }
fi
say "building the GPU test and benchmark in $build"
ninja -C "$build" tests/gpu/test_gpu bench/kvp-bench-kernel >"$log/build" 2>&1 ||
	{ tail -n 60 "$log/build"; exit 1; }
if command -v nvidia-smi >/dev/null 2>&1; then
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi

say "GPU tests (meson test --suite gpu)"
test_rc=0
meson test -C "$build" --suite gpu --print-errorlogs --no-rebuild >"$log/test" 2>&1 || test_rc=$?
sed -n '/^ *[0-9]*\/[0-9]* /p' "$log/test"
if grep -q '^Fail: *[1-9]\|^Timeout: *[1-9]' "$log/test" || [ "$test_rc" != 0 ]; then
	tail -n 80 "$build/meson-logs/testlog.txt" 2>/dev/null || true
	tests="FAILED"
elif grep -q '^Skipped: *[1-9]' "$log/test"; then
	tests="skipped (no usable GPU)"
else
	tests="passed"
fi

bench_rc=0
if [ "$tests" != "skipped (no usable GPU)" ]; then
	say "GPU benchmarks (kvp-bench-kernel --gpu-only)"
	"$build/bench/kvp-bench-kernel" --gpu-only --seconds 0.5 "$@" >"$log/bench" 2>"$log/bench.err" ||
		bench_rc=$?
	cat "$log/bench.err"
fi

say "summary"
echo "GPU tests: $tests"
if [ -s "$log/bench" ]; then
	awk '$1 == "sample" { v[$2] = $3; n[++k] = $2 }
	END {
		ref = v["gpu.ref.d2d_bw"]
		printf "%-22s %10s %8s %6s\n", "benchmark", "GB/s", "× D2D", "goal"
		for (i = 1; i <= k; i++) {
			name = n[i]
			goal = (name ~ /quant|attn/) ? "0.70" : "-"
			printf "%-22s %10.1f %8.2f %6s\n", name, v[name],
			       ref > 0 ? v[name] / ref : 0, name == "gpu.ref.d2d_bw" ? "" : goal
		}
	}' "$log/bench"
fi
[ "$bench_rc" = 0 ] || echo "GPU benchmarks: FAILED (exit $bench_rc)"
case "$tests" in
passed) [ "$bench_rc" = 0 ] || exit 1 ;;
skipped*) exit 77 ;;
*) exit 1 ;;
esac
