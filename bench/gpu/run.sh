#!/usr/bin/env bash
# bench/gpu/run.sh — every GPU check of the project in one go, for a machine
# with a GPU (docs/perf/compress-gpu.md; about 5 minutes on one H200 with a bundle):
#   1. the programs: built here with the cuda preset (needs the packages of
#      scripts/deps.sh and the CUDA toolkit), or taken from a bundle made on
#      a machine without a GPU by bench/gpu/bundle.sh (--prebuilt DIR);
#   2. every GPU test: test/cuda/*.cu (device codecs bit-identical to the
#      host codecs, error feedback and DGC on the device, coll_nccl,
#      ps_device_worker, odr) and test/adapt/torch_cuda.cpp (the CUDA path
#      of adapt/torch.hpp; with --prebuilt it is compiled here against this
#      machine's CUDA libtorch, PyTorch's wheel);
#   3. ashl_bench_compress_cuda (every device codec against a D2D copy, and
#      torch.topk), cub_topk (cub::DeviceTopK, when the bundle has it) and
#      ashl_bench_coll_nccl (coll::nccl against a bare ncclAllReduce);
#   4. a short table last: each test's verdict, then the GPU goals
#      as ratios (casts, quantizers and sign >= 0.75x copy; exact top-k >= 3x
#      torch.topk and >= 1x cub::DeviceTopK; NCCL through ashl >= 0.95x bare).
# Usage: bench/gpu/run.sh [--quick] [--prebuilt DIR]
#   --quick: benchmark sizes 2^20..2^22 and 25,557,032 only.
# Output: build/cuda/gpu-run/ (logs, bench.jsonl, summary.txt); with $OUT
# naming a directory, summary.txt, bench.jsonl, coll_nccl.jsonl and
# logs.tar.gz are copied there.
set -u -o pipefail
cd "$(dirname "$0")/../.."
quick=()
prebuilt=""
while (($#)); do
  case "$1" in
    --quick) quick=(--quick) ;;
    --prebuilt) prebuilt=$(readlink -f "$2"); shift ;;
    *) echo "usage: $0 [--quick] [--prebuilt DIR]" >&2; exit 2 ;;
  esac
  shift
done
jobs=$(nproc 2>/dev/null || echo 4)
log=build/cuda/gpu-run
rm -rf "$log"
mkdir -p "$log/tests"
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start )) s"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  2>&1 | tee "$log/gpu.txt"

# ---- 1. the programs ----------------------------------------------------------
torch_pid=""
if [[ -n "$prebuilt" ]]; then
  bin=$prebuilt/bin
  # NCCL: PyTorch's wheel (nvidia-nccl-cu13) or the system's.
  nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [[ -n "$nccl_lib" && -e "$nccl_lib/libnccl.so.2" ]] || nccl_lib=$(dirname "$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')" 2>/dev/null)
  echo "run.sh: bundle $prebuilt; NCCL from ${nccl_lib:-nowhere (coll tests will fail to start)}"
  export LD_LIBRARY_PATH="$prebuilt/lib${nccl_lib:+:$nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export UCX_MODULE_DIR="$prebuilt/lib/ucx"
  # Absolute paths compiled into the tests, recreated here.
  while IFS='=' read -r name path; do
    mkdir -p "$(dirname "$path")" && cp "$bin/$(basename "$path")" "$path"
  done <"$prebuilt/paths"
  # test/adapt/torch_cuda.cpp against this machine's CUDA libtorch, built on
  # the CPU while the GPU tests run. Boost.Test is the bundle's header-only one.
  (
    t=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))') &&
    abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))') &&
    "$(command -v c++ || command -v g++)" -std=c++20 -O1 -DASHL_CONFIG_HAS_TORCH=1 -D_GLIBCXX_USE_CXX11_ABI="$abi" \
      -DBOOST_TEST_MODULE=adapt_torch_cuda -DBOOST_TEST_NO_MAIN -DBOOST_TEST_ALTERNATIVE_INIT_API \
      -isystem "$prebuilt/include" -include boost/test/included/unit_test.hpp -Iinclude \
      -isystem "$t/include" -isystem "$t/include/torch/csrc/api/include" test/adapt/torch_cuda.cpp \
      -o "$log/test_adapt_torch_cuda" -L"$t/lib" -Wl,-rpath,"$t/lib" -Wl,--no-as-needed \
      -ltorch -ltorch_cuda -lc10_cuda -ltorch_cpu -lc10 -Wl,--as-needed -pthread
  ) >"$log/torch_build.log" 2>&1 &
  torch_pid=$!
else
  if ! cmake --preset cuda >"$log/configure.log" 2>&1; then
    # The preset requires NCCL; the codecs do not. Retry without it, and say so.
    echo "run.sh: cmake --preset cuda failed (tail below); retrying with -DASHL_WITH_NCCL=AUTO"
    tail -5 "$log/configure.log"
    cmake --preset cuda -DASHL_WITH_NCCL=AUTO >"$log/configure.log" 2>&1 || { cat "$log/configure.log"; exit 1; }
  fi
  targets=(ashl_bench_compress_cuda ashl_bench_coll_nccl ashl_header_check_cuda test_adapt_torch_cuda)
  for f in test/cuda/*.cu; do n=${f##*/}; targets+=("test_cuda_${n%.cu}"); done
  # Targets a configuration lacks (no NCCL, no libtorch) are left out, not fatal.
  have=$(ninja -C build/cuda -t targets all 2>/dev/null | cut -d: -f1)
  build_list=()
  for t in "${targets[@]}"; do grep -qx "$t" <<<"$have" && build_list+=("$t"); done
  if ! ninja -C build/cuda -j"$jobs" "${build_list[@]}" >"$log/build.log" 2>&1; then
    grep -E "error|FAILED" "$log/build.log" | head -40
    exit 1
  fi
  bin=$log/bin
  mkdir -p "$bin"
  for t in "${build_list[@]}"; do
    f=$(find build/cuda -type f -name "$t" -perm -u+x | head -1)
    [[ -n "$f" ]] && ln -sf "$(readlink -f "$f")" "$bin/$t"
  done
  [[ -e "$bin/test_adapt_torch_cuda" ]] && ln -sf "$(readlink -f "$bin/test_adapt_torch_cuda")" "$log/test_adapt_torch_cuda"
fi
echo "run.sh: programs ready after $(elapsed)"

# ---- 2. the GPU tests ---------------------------------------------------------
# Each test alone on the device would leave it mostly idle: four at a time.
export UCX_NET_DEVICES=lo  # the ps test's processes talk over loopback only
run_test() {  # name exe -> tests/<name>.log, tests/<name>.rc
  local name=$1 exe=$2 t0 rc
  t0=$(date +%s)
  timeout 100 "$exe" --report_level=short >"$log/tests/$name.log" 2>&1
  rc=$?
  echo "$rc $(( $(date +%s) - t0 ))" >"$log/tests/$name.rc"
}
export -f run_test
export log
ls "$bin"/test_cuda_* | xargs -P 6 -I{} bash -c 'n=$(basename {}); run_test "${n#test_}" {}'
if [[ -n "$torch_pid" ]]; then
  if wait "$torch_pid"; then echo "run.sh: test_adapt_torch_cuda built"; else
    echo "run.sh: test_adapt_torch_cuda did not build (tail of $log/torch_build.log):"; tail -15 "$log/torch_build.log"; fi
fi
[[ -x "$log/test_adapt_torch_cuda" ]] && run_test adapt_torch_cuda "$log/test_adapt_torch_cuda"
echo "run.sh: tests done after $(elapsed)"
for f in "$log"/tests/*.rc; do
  n=$(basename "$f" .rc)
  read -r rc secs <"$f"
  grep -Eq "^(SKIPPED|skipped)" "$log/tests/$n.log" && [[ $rc == 77 ]] && continue
  [[ $rc == 0 ]] || { echo "---- $n failed (exit $rc); its log ends:"; tail -25 "$log/tests/$n.log"; }
done

# ---- 3. the benchmarks -------------------------------------------------------
bench_rc=0
nccl_rc=-1
if [[ "${ASHL_GPU_TESTS_ONLY:-0}" == 1 ]]; then
  echo "run.sh: benchmarks not run (ASHL_GPU_TESTS_ONLY=1)"
else
  timeout 150 "$bin/ashl_bench_compress_cuda" "${quick[@]}" --torch-script bench/gpu/torch_topk.py >"$log/bench.log" 2>&1
  bench_rc=$?
  grep '^{' "$log/bench.log" >"$log/bench.jsonl"
  echo "run.sh: compress benchmark exit $bench_rc after $(elapsed)"
  sizes=$(python3 -c 'import json,sys; print(" ".join(sorted({str(json.loads(l)["n"]) for l in open(sys.argv[1])}, key=int)))' "$log/bench.jsonl" 2>/dev/null)
  if [[ -x "$bin/cub_topk" && -n "$sizes" ]]; then
    # shellcheck disable=SC2086
    timeout 60 "$bin/cub_topk" --runs 25 --sizes $sizes >"$log/cub_topk.log" 2>&1
    echo "run.sh: cub_topk exit $? after $(elapsed)"
    grep '^{' "$log/cub_topk.log" >>"$log/bench.jsonl"
  else
    echo "run.sh: no cub::DeviceTopK baseline (bundle without cub_topk; see bench/gpu/bundle.sh)"
  fi
  if [[ -x "$bin/ashl_bench_coll_nccl" ]]; then
    timeout 60 "$bin/ashl_bench_coll_nccl" >"$log/coll_nccl.log" 2>&1
    nccl_rc=$?
    grep '^{' "$log/coll_nccl.log" >"$log/coll_nccl.jsonl"
    echo "run.sh: coll_nccl benchmark exit $nccl_rc after $(elapsed)"
  fi

fi

# ---- 3b. the Python module's CUDA tests -----------------------------------------
# ashl.torch with CUDA tensors (test/python/test_torch_cuda.py, pytest marker
# gpu: the pinned staging, and a top-k plan's update built and encoded on
# the device, test_topk_is_encoded_on_the_device_and_trains_like_the_host_codec),
# when this python3's torch sees a device: the module is built here for
# this interpreter (pybind11 from pip; no libtorch inside it).
if [[ "${ASHL_GPU_SKIP_PYTHON:-0}" == 1 ]]; then
  echo "run.sh: python -m pytest -m gpu not run (ASHL_GPU_SKIP_PYTHON=1)"
elif python3 -c 'import sys, torch, pytest, pybind11; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  t0=$(date +%s)
  pyb=build/cuda/python-gpu
  { cmake -S python -B "$pyb" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v python3)" \
      -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" && ninja -C "$pyb" -j"$jobs" ashl_python &&
    PYTHONPATH="$pyb/python" timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu test/python; } \
    >"$log/tests/python_gpu.log" 2>&1
  echo "$? $(( $(date +%s) - t0 ))" >"$log/tests/python_gpu.rc"
  echo "run.sh: python -m pytest -m gpu exit $(cut -d' ' -f1 "$log/tests/python_gpu.rc") after $(elapsed)"
else
  echo "run.sh: python -m pytest -m gpu not run (python3 lacks torch with CUDA, pytest or pybind11)"
fi

# ---- 4. the table --------------------------------------------------------------
python3 - "$log" <<'PY' | tee "$log/summary.txt"
import json, os, sys
log = sys.argv[1]
print(f"==== GPU tests ====")
failed = 0
for f in sorted(os.listdir(f"{log}/tests")):
    if not f.endswith(".rc"): continue
    rc, secs = open(f"{log}/tests/{f}").read().split()
    verdict = {"0": "passed", "77": "SKIPPED"}.get(rc, f"FAILED (exit {rc})")
    failed += verdict.startswith("FAILED")
    print(f"  {f[:-3]:<28}{verdict:<20}{secs:>5} s")
print(f"  {failed} failed")
rows = [json.loads(l) for l in open(f"{log}/bench.jsonl") if l.strip()] if os.path.exists(f"{log}/bench.jsonl") else []
med = {(r["codec"], r["dtype"], r["n"]): r["median_us"] for r in rows}
ns = sorted({r["n"] for r in rows})
show = [n for n in ns if n in (25557032, max(ns, default=0))]
print("==== codecs against a D2D copy of the same input (goal >= 0.75 for casts, quantizers, sign) ====")
codecs = [c for c in dict.fromkeys(r["codec"] for r in rows) if c != "copy" and not c.startswith(("torch_", "cub_"))]
for n in show:
    for dt in ("f32", "bf16"):
        copy = med.get(("copy", dt, n))
        cells = [f"{c}={copy / med[(c, dt, n)]:.2f}" for c in codecs if copy and med.get((c, dt, n))]
        print(f"  n={n} {dt}: " + " ".join(cells))
print("==== exact top-k: speed-up of ashl's (goal >= 3x torch.topk, >= 1x cub::DeviceTopK) ====")
for n in show:
    for dt in ("f32", "bf16"):
        for k in ("1%", "0.1%"):
            a = med.get((f"topk_{k}", dt, n))
            t = med.get((f"torch_topk_{k}", dt, n))
            c = med.get((f"cub_topk_{k}", dt, n))
            fmt = lambda base: f"{base / a:.2f}x" if a and base else "n/a"
            print(f"  n={n} {dt} k={k}: ashl {a or 0:.0f} us; vs torch.topk {fmt(t)}; vs cub::DeviceTopK {fmt(c)}")
if os.path.exists(f"{log}/coll_nccl.jsonl"):
    print("==== coll::nccl allreduce against bare ncclAllReduce (goal >= 0.95) ====")
    for l in open(f"{log}/coll_nccl.jsonl"):
        r = json.loads(l)
        print(f"  {r['bytes'] >> 20:>5} MiB: bare {r['bare_us']:.1f} us, ashl {r['ashl_us']:.1f} us, ratio {r['ratio']:.3f}")
PY
echo "run.sh: bench exit $bench_rc, coll_nccl exit $nccl_rc, total $(elapsed)"
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
  cp "$log/summary.txt" "$log/bench.jsonl" "$OUT"/ 2>/dev/null
  cp "$log/coll_nccl.jsonl" "$OUT"/ 2>/dev/null
  tar -czf "$OUT/logs.tar.gz" -C "$log" --exclude=bin --exclude=test_adapt_torch_cuda . 2>/dev/null
fi
failed=$(grep -c "FAILED" "$log/summary.txt")
exit $(( failed != 0 || bench_rc != 0 ))
