#!/bin/sh
# tests/gpu/run.sh — the GPU check of kvpalace on a machine with a GPU:
# configures a CUDA build in build-gpu/ (or $KVP_BUILD_DIR) with
# -Dcuda=enabled, builds the GPU tests and benchmarks, runs the test suite
# `gpu` (each CUDA kernel against its C reference, the engine-layout
# adapters among them: test_gpu_adapt; the GPU tier shared
# across processes: test_gpu_tier), then the GPU benchmarks (kernels in
# GB/s next to a device-to-device cudaMemcpy of the same bytes; the GPU
# tier's host→device migration and device read-back next to pinned
# cudaMemcpy, and restoring a 4k-token Llama-3-8B prefix next to the cuBLAS
# GEMMs of the prefill it saves, against a kvpalaced started here), and
# prints a summary. A few minutes on one GPU, most of it compiling.
#
# Exit status: 0 when the tests passed and the benchmarks ran, 77 when no
# usable GPU was found (the test skipped), 1 otherwise. Extra arguments go
# to kvp-bench-kernel (e.g. --gpu-mib 2048 --seconds 1).
# $KVP_GPU_BENCH_ARGS go to kvp-bench-gpu (e.g. "--tokens 8192 --reps 3").
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
say "building the GPU tests and benchmarks in $build"
ninja -C "$build" tests/gpu/test_gpu tests/gpu/test_gpu_adapt tests/gpu/test_gpu_tier daemon/kvpalaced \
	client/kvpalacectl bench/kvp-bench-kernel bench/kvp-bench-gpu >"$log/build" 2>&1 ||
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

	# The GPU tier against a daemon of its own: a host pool and a device
	# arena that hold a 4k-token Llama-3-8B prefix (512 MiB), watermarks 0.01
	# so every match copies afresh (a cold restore).
	say "GPU tier benchmark (kvp-bench-gpu)"
	d="$log/daemon"
	mkdir -p "$d"
	"$build/daemon/kvpalaced" --socket "$d/kvpalace.sock" --state-dir "$d/state" \
		--cache-dir "$d/cache" --host-tier-size 4G --host-pool-size 2G \
		--gpu-pool-size 1G --gpu-high-watermark 0.01 --gpu-low-watermark 0.01 \
		--disk-pool-size 0 --log-level notice 2>"$log/daemon.log" &
	dpid=$!
	i=0
	while [ ! -S "$d/kvpalace.sock" ] && [ $i -lt 100 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	grep -i 'gpu' "$log/daemon.log" || true
	gpu_rc=0
	# shellcheck disable=SC2086
	"$build/bench/kvp-bench-gpu" --socket "$d/kvpalace.sock" ${KVP_GPU_BENCH_ARGS:-} \
		>>"$log/bench" 2>"$log/bench-gpu.err" || gpu_rc=$?
	cat "$log/bench-gpu.err"
	kill "$dpid" 2>/dev/null || true
	wait "$dpid" 2>/dev/null || true
	case "$gpu_rc" in
	0) ;;
	77) echo "kvp-bench-gpu: skipped (the daemon has no GPU tier)" ;;
	*) bench_rc=$gpu_rc ;;
	esac
fi

say "summary"
echo "GPU tests: $tests"
if [ -s "$log/bench" ]; then
	awk '$1 == "sample" { v[$2] = $3; n[++k] = $2 }
	END {
		ref = v["gpu.ref.d2d_bw"]
		printf "%-26s %10s %8s %6s\n", "benchmark", "GB/s", "× D2D", "goal"
		for (i = 1; i <= k; i++) {
			name = n[i]
			if (name ~ /^(gpu\.migrate|gpu\.vmm|gpu\.ref\.pinned|restore\.)/)
				continue
			goal = (name ~ /quant|attn/) ? "0.70" : "-"
			printf "%-26s %10.1f %8.2f %6s\n", name, v[name],
			       ref > 0 ? v[name] / ref : 0, name == "gpu.ref.d2d_bw" ? "" : goal
		}
		if ("gpu.migrate_h2d_bw" in v) {
			printf "%-26s %10.1f %8.2f  (× pinned cudaMemcpy H2D)\n", "gpu.migrate_h2d_bw",
			       v["gpu.migrate_h2d_bw"], v["gpu.migrate_h2d_bw"] / v["gpu.ref.pinned_h2d_bw"]
			printf "%-26s %10.1f %8.2f  (× pinned cudaMemcpy D2H)\n", "gpu.vmm_d2h_bw",
			       v["gpu.vmm_d2h_bw"], v["gpu.vmm_d2h_bw"] / v["gpu.ref.pinned_d2h_bw"]
			printf "%-26s %8.1f ms vs %.1f ms of prefill GEMMs (%.2f×)\n",
			       "restore 4k Llama-3-8B", v["restore.gpu_ms"],
			       v["restore.ref.prefill_gemm_ms"],
			       v["restore.ref.prefill_gemm_ms"] / v["restore.gpu_ms"]
		}
	}' "$log/bench"
fi
[ "$bench_rc" = 0 ] || echo "GPU benchmarks: FAILED (exit $bench_rc)"
case "$tests" in
passed) [ "$bench_rc" = 0 ] || exit 1 ;;
skipped*) exit 77 ;;
*) exit 1 ;;
esac
