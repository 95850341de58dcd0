"""twell.FFN against PyTorch's dense FFN, from Python: correctness first, then CUDA-event timings.

    python3 python/examples/ffn_speed.py [--tokens 16384 131072] [--json out.json]

The weights are calibrated as in BENCHMARKS.md (a constant channel in x and a negative gate weight on
it): ~0.5% of the gate active, ~28 non-zeros a token at I = 5632. Each timed call starts from a cold
L2 (a 256 MB buffer is written first, outside the timed stretch); the median of --iters calls after
--warmup. PyTorch's FFN is the literature's unfused one: three GEMMs, the ReLU and the product apart.
"""
import argparse
import functools
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import twell  # noqa: E402


def problem(M, H, I, density_threshold=2.58, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, H, device="cuda", generator=g)
    x[:, 0] = 1
    wg = torch.randn(I, H, device="cuda", generator=g) / (H - 1) ** 0.5
    wg[:, 0] = -density_threshold  # P(N(0, 1) > 2.58) ≈ 0.5%
    wu = torch.randn(I, H, device="cuda", generator=g) / H ** 0.5
    wd = torch.randn(I, H, device="cuda", generator=g) / I ** 0.5
    return [t.to(torch.bfloat16) for t in (x, wg, wu, wd)]


def torch_ffn(x, wg, wu, wd):
    return (torch.relu(x @ wg.t()) * (x @ wu.t())) @ wd


def time_ms(fn, warmup, iters):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[16384, 131072])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", help="write the records here")
    args = ap.parse_args()
    if not twell.cuda_available():
        sys.exit(f"ffn_speed.py needs a Hopper GPU: {twell.cuda_unavailable_reason()}")

    H, I = args.hidden, args.ffn
    records = []
    print(f"{'tokens':>8} {'nnz/token':>9} {'path':>7} {'err twell':>10} {'err torch':>10} "
          f"{'torch ms':>9} {'twell ms':>9} {'ratio':>6}")
    for M in args.tokens:
        x, wg, wu, wd = problem(M, H, I)
        ffn = twell.FFN(H, I, device="cuda", dispatch="previous", max_tokens=M)
        with torch.no_grad():
            ffn.wg.copy_(wg), ffn.wu.copy_(wu), ffn.wd.copy_(wd)
            # correctness first: both against float64 on a slice of the tokens
            y = ffn(x)
            y = ffn(x)  # the second call dispatches on the first's density
            stats = ffn.last_stats()
            rows = slice(0, min(M, 2048))
            y64 = torch_ffn(*(t.double() for t in (x[rows], wg, wu, wd)))
            err_twell, err_torch = rel(y[rows], y64), rel(torch_ffn(x[rows], wg, wu, wd), y64)
            if not err_twell <= 2 * err_torch + 1e-6:
                sys.exit(f"M = {M}: twell's relative error {err_twell:.2e} is over twice PyTorch's {err_torch:.2e}")
            t_torch = time_ms(functools.partial(torch_ffn, x, wg, wu, wd), args.warmup, args.iters)
            t_twell = time_ms(functools.partial(ffn, x), args.warmup, args.iters)
        r = {"bench": "python_ffn", "M": M, "H": H, "I": I, "nnz_per_token": stats["nnz"] / M, "path": stats["path"],
             "rel_err_twell": err_twell, "rel_err_torch": err_torch, "torch_unfused_ms": t_torch, "twell_ms": t_twell,
             "ratio_to_torch": t_twell / t_torch, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
             "twell": twell.version()}
        records.append(r)
        print(f"{M:>8} {r['nnz_per_token']:>9.1f} {r['path']:>7} {err_twell:>10.2e} {err_torch:>10.2e} "
              f"{t_torch:>9.3f} {t_twell:>9.3f} {r['ratio_to_torch']:>5.3f}x", flush=True)
        del ffn, x, wg, wu, wd, y
        torch.cuda.empty_cache()
    print(json.dumps(records, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
