"""Sparsifying an FFN with the L1 penalty, from PyTorch: watch its activations become sparse, the output
stay close to the dense original's, and twell's kernels switch from the dense path to the sparse one.

    python3 python/examples/train_l1.py [--steps 300] [--l1 1e-3] [--json out.json]

A dense ReLU-gated FFN (the original: random weights, half its neurons active on Gaussian inputs
with a constant channel, which lets a gate learn a threshold) is copied into a twell.FFN, which is
then trained to keep the original's outputs under the loss MSE + λ · (1/M) Σ|h|, as the paper's
models are trained with the penalty. The penalty's gradient is added inside twell's backward, over
the active set. Each logged step prints the MSE relative to the outputs' variance, the non-zeros a
token (from the forward's TwELL count, or dispatch's sample on the dense path), the path the forward
took (dense above ~1.1% density, sparse below) and the time of the step. On a Hopper GPU by default;
--device cpu runs the CPU reference backend at a small size.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import twell  # noqa: E402


def batch(M, H, device, g):
    x = torch.randn(M, H, device=device, generator=g)
    x[:, 0] = 1
    return x.to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if twell.cuda_available() else "cpu")
    ap.add_argument("--tokens", type=int, help="tokens a step (default 16384 on the GPU, 256 on the CPU)")
    ap.add_argument("--hidden", type=int, help="H (default 2048 on the GPU, 64 on the CPU)")
    ap.add_argument("--ffn", type=int, help="I (default 5632 on the GPU, 256 on the CPU)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--l1", type=float, default=1e-3, help="λ of the L1 penalty")
    ap.add_argument("--teacher-density", type=float, default=0.5, help="fraction of the original's neurons active")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--json", help="write the logged steps here")
    args = ap.parse_args()
    gpu = args.device != "cpu"
    M = args.tokens or (16384 if gpu else 256)
    H = args.hidden or (2048 if gpu else 64)
    I = args.ffn or (5632 if gpu else 256)

    g = torch.Generator(device=args.device).manual_seed(0)
    # the original: gate over channels 1.. ~ N(0, 1), its threshold (0: half active) on the constant channel
    wg = torch.randn(I, H, device=args.device, generator=g) / (H - 1) ** 0.5
    wg[:, 0] = -statistics.NormalDist().inv_cdf(1 - args.teacher_density)
    wu = torch.randn(I, H, device=args.device, generator=g) / H ** 0.5
    wd = torch.randn(I, H, device=args.device, generator=g)
    teacher = [t.to(torch.bfloat16) for t in (wg, wu, wd)]
    with torch.no_grad():  # outputs of unit variance
        teacher[2] /= twell.ffn_forward(batch(M, H, args.device, g), *teacher).float().std()
    student = twell.FFN(H, I, l1=args.l1, device=args.device, dtype=torch.bfloat16)
    with torch.no_grad():
        for p, t in zip((student.wg, student.wu, student.wd), teacher):
            p.copy_(t)
    # fp32 master weights, as mixed-precision training keeps them: the kernels take the bf16 copies
    masters = [p.detach().float().clone() for p in student.parameters()]
    opt = torch.optim.Adam(masters, lr=args.lr)
    print(f"twell {twell.version()} on {torch.cuda.get_device_name() if gpu else 'the CPU'}: "
          f"H = {H}, I = {I}, {M} tokens a step, λ = {args.l1}")
    print(f"{'step':>5} {'rel mse':>9} {'nnz/token':>9} {'density':>8} {'path':>7} {'ms/step':>8}")
    log = []
    for step in range(1, args.steps + 1):
        x = batch(M, H, args.device, g)
        with torch.no_grad():
            target = twell.ffn_forward(x, *teacher)
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = student(x)
        mse = (y.float() - target.float()).pow(2).mean()
        student.zero_grad(set_to_none=True)
        mse.backward()  # twell adds λ/M · sign(h) to dh on the active set
        with torch.no_grad():
            for m, p in zip(masters, student.parameters()):
                m.grad = p.grad.float()
            opt.step()
            for m, p in zip(masters, student.parameters()):
                p.copy_(m)
        if gpu:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        if step % args.log_every == 0 or step == 1 or step == args.steps:
            s = student.last_stats()
            # the TwELL count on the sparse path and the CPU; on the dense path the density sample that
            # dispatch decided on (g's non-zeros in up to 1024 rows)
            nnz = s["nnz"] / M if s["nnz"] >= 0 else s.get("sampled_density", -1) * I
            row = {"step": step, "mse": mse.item(), "nnz_per_token": nnz, "density": nnz / I, "path": s["path"],
                   "ms_per_step": ms}
            log.append(row)
            print(f"{step:>5} {row['mse']:>9.4f} {nnz:>9.1f} {100 * nnz / I:>7.2f}% {s['path']:>7} {ms:>8.2f}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"H": H, "I": I, "tokens": M, "l1": args.l1, "device": args.device, "steps": log}, f, indent=1)


if __name__ == "__main__":
    main()
