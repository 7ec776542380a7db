#!/usr/bin/env bash
# bench/gpu/run.sh — the device check of the CUDA codecs in one go, for a
# machine with a GPU (designed for < 8 minutes on a 16-core H200 machine;
# it builds only the GPU tests, the benchmark and the .cuh header check):
#   1. configure with the cuda preset (build/cuda),
#   2. build the GPU tests and the benchmark,
#   3. run ctest -L gpu (every test/cuda/*.cu: the device codecs, threshold,
#      topk_sampled, error_feedback/dgc, odr, and the ps/coll device tests),
#   4. run ashl_bench_compress_cuda (every device codec and decorator against
#      a D2D copy, with the compression ratio; torch.topk too when torch is
#      installed),
#   5. print a short summary table last: each GPU test's verdict, then the
#      benchmark's largest cases.
# Usage: bench/gpu/run.sh [--quick]     (--quick: sizes 2^20..2^22 and 25,557,032 only)
# Output: build/cuda/gpu-run/{ctest.log,bench.log,bench.jsonl}; also copied to
# $OUT when that variable names a directory.
set -u -o pipefail
cd "$(dirname "$0")/../.."
quick=()
[[ "${1:-}" == "--quick" ]] && quick=(--quick)
jobs=$(nproc 2>/dev/null || echo 4)
log=build/cuda/gpu-run
start=$(date +%s)

if ! cmake --preset cuda >/tmp/ashl-gpu-configure.log 2>&1; then
  # The preset requires NCCL; the codecs do not. Retry without it, and say so.
  echo "run.sh: cmake --preset cuda failed (tail below); retrying with -DASHL_WITH_NCCL=AUTO"
  tail -5 /tmp/ashl-gpu-configure.log
  cmake --preset cuda -DASHL_WITH_NCCL=AUTO >/tmp/ashl-gpu-configure.log 2>&1 || {
    cat /tmp/ashl-gpu-configure.log; exit 1; }
fi
mkdir -p "$log"
targets=$(cd test/cuda && for f in *.cu; do echo "test_cuda_${f%.cu}"; done)
# shellcheck disable=SC2086
if ! ninja -C build/cuda -j"$jobs" $targets ashl_bench_compress_cuda ashl_header_check_cuda >"$log/build.log" 2>&1; then
  grep -E "error|FAILED" "$log/build.log" | head -40
  exit 1
fi
echo "run.sh: built in $(( $(date +%s) - start )) s"

ctest --test-dir build/cuda -L gpu --output-on-failure --timeout 300 2>&1 | tee "$log/ctest.log"
ctest_rc=${PIPESTATUS[0]}

timeout 360 build/cuda/bench/ashl_bench_compress_cuda "${quick[@]}" --torch-script bench/gpu/torch_topk.py \
  2>&1 | tee "$log/bench.log"
bench_rc=${PIPESTATUS[0]}
grep '^{' "$log/bench.log" >"$log/bench.jsonl" || true

# coll::nccl dense allreduce against a bare ncclAllReduce (issue 14, bench/coll_nccl.cu; needs NCCL).
if ninja -C build/cuda -j"$jobs" ashl_bench_coll_nccl >>"$log/build.log" 2>&1; then
  timeout 120 build/cuda/bench/ashl_bench_coll_nccl 2>&1 | tee "$log/coll_nccl.log"
  grep '^{' "$log/coll_nccl.log" >"$log/coll_nccl.jsonl" || true
  [[ -n "${OUT:-}" && -d "${OUT:-}" ]] && cp "$log/coll_nccl.jsonl" "$OUT"/ 2>/dev/null
fi

if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then cp "$log"/*.log "$log"/bench.jsonl "$OUT"/ 2>/dev/null; fi

echo
echo "==== summary ($(( $(date +%s) - start )) s) ===="
grep -E "Test +#[0-9]+:" "$log/ctest.log" | sed -E 's/^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: +//; s/ \.+/ /' | head -40
grep -E "tests passed|tests failed" "$log/ctest.log" | head -2
echo "ctest exit: $ctest_rc   bench exit: $bench_rc"
python3 - "$log/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
copy = {(r["n"], r["dtype"]): r["median_us"] for r in rows if r["codec"] == "copy"}
big = [r for r in rows if r["n"] in (25557032, max((r["n"] for r in rows), default=0))]
print(f'{"codec":<16}{"dtype":<6}{"n":>11}{"ratio":>9}{"median_us":>12}{"GB/s":>9}{"vs_copy":>9}')
for r in big:
    c = copy.get((r["n"], r["dtype"]), 0.0)
    speed = c / r["median_us"] if r["median_us"] > 0 and c > 0 else 0.0
    print(f'{r["codec"]:<16}{r["dtype"]:<6}{r["n"]:>11}{r.get("ratio", 0.0):>9.4f}{r["median_us"]:>12.1f}'
          f'{r["gbps"]:>9.1f}{speed:>9.3f}')
PY
exit $(( ctest_rc != 0 || bench_rc != 0 ))
