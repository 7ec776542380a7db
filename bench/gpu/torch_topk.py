#!/usr/bin/env python3
"""torch.topk reference timings for ashl_bench_compress_cuda.

    python3 bench/gpu/torch_topk.py --sizes 1048576 25557032 --runs 25

Same method as the C++ benchmark (docs/perf/compress-gpu.md): rotating
inputs, warm-up, each run timed alone with CUDA events, median reported;
k = 1 % and 0.1 %, f32 and bf16, torch.topk(x.abs(), k) (values and
indices, unsorted=False as torch defaults). Prints one JSON object per case.
Exits 0 with a note when torch or a CUDA device is missing.
"""
import argparse
import json
import statistics
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", required=True)
    ap.add_argument("--runs", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("# torch.topk: skipped (python module torch not installed)")
        return 0
    if not torch.cuda.is_available():
        print("# torch.topk: skipped (torch sees no CUDA device)")
        return 0
    for n in args.sizes:
        for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            nbytes = n * (4 if dtype == torch.float32 else 2)
            rotate = max(2, min(8, (256 << 20) // nbytes))
            xs = [torch.randn(n, device="cuda", dtype=dtype) for _ in range(rotate)]
            for ratio, label in ((0.01, "torch_topk_1%"), (0.001, "torch_topk_0.1%")):
                k = max(1, round(ratio * n))
                for i in range(args.warmup):
                    torch.topk(xs[i % rotate].abs(), k)
                times = []
                for i in range(args.runs):
                    a = torch.cuda.Event(enable_timing=True)
                    b = torch.cuda.Event(enable_timing=True)
                    a.record()
                    torch.topk(xs[i % rotate].abs(), k)
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b) * 1000.0)
                times.sort()
                med = statistics.median(times)
                print(json.dumps({"bench": "compress_cuda", "codec": label, "dtype": name, "n": n, "k": k,
                                  "median_us": round(med, 3), "min_us": round(times[0], 3),
                                  "max_us": round(times[-1], 3), "gbps": round(nbytes / (med * 1e3), 2)}))
            del xs
            torch.cuda.empty_cache()
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
