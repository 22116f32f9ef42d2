#!/bin/sh
# tests/check-needed.sh BINARY... — fails when a binary would need a CUDA
# library to start: a DT_NEEDED on libcudart, libcublas(Lt), libcuda or
# another NVIDIA library, or an undefined dynamic symbol of the CUDA
# runtime. kvpalaced loads the runtime when it probes the GPU
# (kernels/cudart.h) and libkvpalace links it statically, so both start on
# hosts without CUDA, where a NEEDED entry would stop them before main
# (exit 127). Exits 77 (skip) when readelf or nm is not installed.
set -eu

[ $# -ge 1 ] || { echo "usage: check-needed.sh BINARY..."; exit 1; }
for tool in readelf nm; do
	command -v $tool >/dev/null 2>&1 || { echo "$tool not found: skipping"; exit 77; }
done

status=0
for bin in "$@"; do
	[ -f "$bin" ] || { echo "no such file: $bin"; exit 1; }
	ok=1
	needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
	[ -n "$needed" ] || { echo "FAIL: $bin: no NEEDED entries read"; exit 1; }
	bad=$(echo "$needed" | grep -E '^lib(cudart|cublas|cublasLt|cuda|nvidia|nvrtc|cudnn)[.-]' || true)
	if [ -n "$bad" ]; then
		echo "FAIL: $bin needs CUDA libraries to start:"
		echo "$bad"
		ok=0
	fi
	syms=$(nm -D --undefined-only "$bin" | awk '{ print $NF }' | grep -E '^_*cuda' || true)
	if [ -n "$syms" ]; then
		echo "FAIL: $bin leaves CUDA runtime symbols to the dynamic linker:"
		echo "$syms"
		ok=0
	fi
	[ $ok -eq 1 ] || { status=1; continue; }
	echo "OK: $bin needs $(echo "$needed" | tr '\n' ' ')"
done
exit $status
