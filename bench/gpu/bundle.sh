#!/usr/bin/env bash
# bench/gpu/bundle.sh — builds the GPU tests and benchmarks on a machine
# WITHOUT a GPU (this project's CI-like hosts: Debian 12, CUDA 13 toolkit,
# the packages of scripts/deps.sh) and packs them, with the shared libraries
# they need that a bare GPU machine lacks, into one folder that
# `bench/gpu/run.sh --prebuilt DIR` runs on a machine WITH one. Device time
# is then spent on running, not on compiling (docs/perf/compress-gpu.md).
#
#   bench/gpu/bundle.sh [DIR]          (default .gpu-bundle; add it to .git/info/exclude)
#   ASHL_CCCL_DIR=/path/to/cccl bench/gpu/bundle.sh   # also builds the cub::DeviceTopK baseline
#
# DIR/bin: every test/cuda test, ashl_test_ps_node, ashl_bench_compress_cuda,
#          ashl_bench_coll_nccl, and cub_topk when ASHL_CCCL_DIR names a CCCL
#          checkout (>= 3.3, with cub/device/device_topk.cuh);
# DIR/lib: Boost.Test, UCX (and its shared-memory modules in lib/ucx), libnuma,
#          libcrypto and the CUDA runtime, copied from this machine. NCCL is
#          not copied (over 200 MB): run.sh takes the GPU machine's own
#          libnccl.so.2 (PyTorch's nvidia-nccl wheel, or the system's).
# DIR/include: the Boost.Test headers (header-only variant), so run.sh can
#          compile test/adapt/torch_cuda.cpp there against that machine's
#          CUDA libtorch (Debian's libtorch has no CUDA).
# DIR/paths: NAME=PATH lines of the absolute paths compiled into the tests
#          (ashl_test_ps_node), which run.sh recreates there.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.gpu-bundle}
build=build/cuda
jobs=$(nproc 2>/dev/null || echo 2)

cmake --preset cuda >/dev/null
targets=(ashl_test_ps_node ashl_bench_compress_cuda ashl_bench_coll_nccl)
for f in test/cuda/*.cu; do n=${f##*/}; targets+=("test_cuda_${n%.cu}"); done
ninja -C "$build" -j"$jobs" "${targets[@]}"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/ucx" "$out/include"
for t in "${targets[@]}"; do
  f=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  [[ -n "$f" ]] || { echo "bundle.sh: $t was not built" >&2; exit 1; }
  cp "$f" "$out/bin/"
done
if [[ -n "${ASHL_CCCL_DIR:-}" ]]; then
  c=$ASHL_CCCL_DIR
  if [[ -f "$c/cub/cub/device/device_topk.cuh" ]]; then
    nvcc -std=c++20 -O3 -arch=sm_90 -I "$c/cub" -I "$c/libcudacxx/include" -I "$c/thrust" \
      bench/gpu/cub_topk.cu -o "$out/bin/cub_topk"
  else
    echo "bundle.sh: $c has no cub/cub/device/device_topk.cuh (CCCL >= 3.3); no cub::DeviceTopK baseline" >&2
  fi
fi

# Shared libraries a bare GPU machine may lack. The C and C++ runtimes,
# the driver (libcuda) and NCCL stay behind.
skip='/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux-x86-64|libcuda|libnccl)\.so'
for f in "$out"/bin/*; do ldd "$f" | awk '/=> \//{print $3}'; done | sort -u | grep -Ev "$skip" |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
ucs=$(ldd "$out/bin/ashl_test_ps_node" | awk '/libucs\.so/{print $3}')
cp -L "$(dirname "$(readlink -f "$ucs")")"/ucx/libuct_cma.so.0 "$out/lib/ucx/"

# The Boost.Test headers the header-only runner needs, and nothing else.
printf '#define BOOST_TEST_NO_MAIN\n#define BOOST_TEST_ALTERNATIVE_INIT_API\n#include <boost/test/included/unit_test.hpp>\n' |
  g++ -std=c++20 -M -x c++ - | tr ' \\' '\n\n' | grep -E '^/usr/include/boost/' | sort -u |
  while read -r h; do mkdir -p "$out/include/$(dirname "${h#/usr/include/}")"; cp "$h" "$out/include/${h#/usr/include/}"; done

echo "ps_node=$(readlink -f "$build/test/ashl_test_ps_node")" >"$out/paths"
du -sh "$out"
echo "bundle.sh: $(ls "$out/bin" | wc -l) programs, $(ls "$out/lib" | wc -l) libraries in $out"
