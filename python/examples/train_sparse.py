"""Train a small ReLU-gated Llama whose FFNs are twell's, with the L1 penalty that makes them sparse;
then load what it saved with twell.Model and check its logits.

    python3 python/examples/train_sparse.py [--data FILE] [--steps N] [--l1 3e-3] [--out DIR] [--compile]

The model is transformers' LlamaForCausalLM (hidden_act="relu") on bytes (ids 0..255, BOS 256, EOS
257: twell's byte tokenizer), its MLPs swapped for twell.FFN by twell.replace_hf_mlps with λ = --l1,
warmed up from 0 over the first --l1-warmup steps (DESIGN.md §2: L = CE + λ · mean over layers of
(1/M) Σ|h|; twell adds the penalty's gradient in its backward, its value is not part of the loss
printed). On a Hopper GPU the FFNs run twell's kernels in bf16, with float32 master weights in the
optimizer; elsewhere the CPU reference backend trains a smaller model in float32.

Each --log-every steps it prints the step, the training CE and the held-out CE (nats a byte; the
held-out windows the same each time), the FFNs' non-zeros a token in the step's batch (mean over
layers: the sparsity the penalty buys; where the GPU ran an FFN dense, its sampled density × width)
and the training tokens a second so far. DIR (default
train_sparse_out/) then holds the model as the HF checkpoint it is (save_pretrained with
twell.hf_state_dict: transformers, `twell run DIR --byte-tokenizer` and twell.Model load it),
train_log.json (every logged step) and, where matplotlib is installed, train.png. Last, twell.Model
loads DIR and its logits on a held-out window are compared with the trained model's.
"""
import argparse
import glob
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import twell  # noqa: E402

BOS, EOS, VOCAB = 256, 257, 264  # the byte tokenizer's ids; the embedding padded to a multiple of 8


def default_text():
    """The repository's own prose (README and docs): ~0.3 MB of bytes, enough to see the penalty work."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    files = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    return b"\n\n".join(open(f, "rb").read() for f in files if os.path.isfile(f))


def batches(data, batch, context, generator):
    """Random windows of `context` − 1 bytes, each after a BOS: inputs [batch, context], targets shifted."""
    starts = torch.randint(0, len(data) - context, (batch,), generator=generator)
    rows = torch.stack([data[s:s + context] for s in starts.tolist()])
    x = torch.cat([torch.full((batch, 1), BOS, dtype=torch.long), rows[:, :-1]], 1)
    return x, rows


def ffn_nonzeros(model):
    """Mean over the twell FFNs of their last call's non-zeros a token (None where no FFN counted them:
    the GPU's dense path counts none, and gives the sampled density instead)."""
    values = []
    for m in model.modules():
        s = m.last_stats() if isinstance(m, twell.FFN) else None
        if s is not None:
            if s["nnz"] >= 0 and s["tokens"] > 0:
                values.append(s["nnz"] / s["tokens"])
            elif s["sampled_density"] >= 0:
                values.append(s["sampled_density"] * m.ffn)
    return sum(values) / len(values) if values else None


def out_unusable(out):
    """Why --out cannot take this run's checkpoint (checked before training, not after it), or None. It may
    be absent, empty, or an earlier run's (it holds train_log.json): another model's folder is not replaced."""
    if os.path.lexists(out) and not os.path.isdir(out):
        return f"--out {out} is a file, not a folder"
    parent = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(parent):  # made at the save: the nearest folder that exists must take them
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        return f"--out {out}: {parent} is not a folder this run can write in"
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, "train_log.json")):
        return (f"--out {out} holds files of something else (no train_log.json of an earlier run): "
                "name a new or empty folder")
    return None


def save_atomically(out, write):
    """write(folder) into a new folder beside `out`, its files synced, then that folder renamed to `out`
    (an earlier run's moved aside first, then removed). Returns what write returns."""
    out = os.path.abspath(out)
    parent, name = os.path.dirname(out), os.path.basename(out)
    os.makedirs(parent, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=f".{name}.saving.", dir=parent)
    old = None
    try:
        result = write(folder)
        for entry in os.listdir(folder):
            if os.path.isfile(os.path.join(folder, entry)):
                with open(os.path.join(folder, entry), "rb") as f:
                    os.fsync(f.fileno())
        os.chmod(folder, 0o755)  # mkdtemp's folder is private
        if os.path.exists(out):
            old = tempfile.mkdtemp(prefix=f".{name}.old.", dir=parent)
            os.rename(out, os.path.join(old, name))
        os.rename(folder, out)
        fd = os.open(parent, os.O_RDONLY)  # the renames themselves, on the disk
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        if old is not None and not os.path.exists(out):  # the earlier run's back in its place
            os.rename(os.path.join(old, name), out)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return result


def save(model, log, a, folder):
    """The HF checkpoint, train_log.json and train.png into folder; says whether the plot was drawn."""
    model.save_pretrained(folder, state_dict=twell.hf_state_dict(model), safe_serialization=True)
    with open(os.path.join(folder, "train_log.json"), "w") as f:
        json.dump({"args": vars(a), "log": log}, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        steps = [e["step"] for e in log]
        left.plot(steps, [e["ce"] for e in log], label="training CE")
        left.plot(steps, [e["held_out_ce"] for e in log], label="held-out CE")
        left.set_xlabel("step"), left.set_ylabel("cross-entropy (nats a byte)"), left.legend()
        right.plot([s for s, e in zip(steps, log) if e["nnz_per_token"] is not None],
                   [e["nnz_per_token"] for e in log if e["nnz_per_token"] is not None])
        right.set_xlabel("step"), right.set_ylabel(f"FFN non-zeros a token (of {a.ffn})"), right.set_yscale("log")
        fig.tight_layout()
        fig.savefig(os.path.join(folder, "train.png"), dpi=100)
        plot = ", train.png"
    except ImportError:
        plot = " (pip install matplotlib for train.png)"
    return plot


def main():
    gpu = twell.cuda_available() and torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", help="a text file to train on (default: the repository's README and docs)")
    p.add_argument("--out", default="train_sparse_out",
                   help="folder for the checkpoint, log and plot: new, empty or an earlier run's, which the finished "
                        "run replaces whole")
    p.add_argument("--device", default="cuda" if gpu else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--steps", type=int, help="optimizer steps (default 1000 on the GPU, 200 on the CPU)")
    p.add_argument("--batch", type=int, help="windows a step (default 32 on the GPU, 8 on the CPU)")
    p.add_argument("--context", type=int, default=256, help="tokens a window")
    p.add_argument("--hidden", type=int, help="model width (default 512 on the GPU, 128 on the CPU)")
    p.add_argument("--ffn", type=int, help="FFN width (default 4 × hidden)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--l1", type=float, default=3e-3, help="λ of the L1 penalty (the paper's 2B model: 2e-5)")
    p.add_argument("--l1-warmup", type=int, help="steps over which λ rises from 0 (default steps / 4)")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (fullgraph)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.device == "cuda" and not gpu:
        p.error(f"no GPU for twell: {twell.cuda_unavailable_reason() or 'PyTorch sees no CUDA device'}")
    on_gpu = a.device == "cuda"
    a.steps = a.steps or (1000 if on_gpu else 200)
    a.batch = a.batch or (32 if on_gpu else 8)
    a.hidden = a.hidden or (512 if on_gpu else 128)
    a.ffn = a.ffn or 4 * a.hidden
    a.l1_warmup = a.steps // 4 if a.l1_warmup is None else a.l1_warmup
    for name in ("steps", "batch", "hidden", "ffn", "layers", "head_dim", "log_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not (a.l1 >= 0 and a.l1_warmup >= 0 and a.lr > 0):
        p.error("--l1 and --l1-warmup must be at least 0, --lr above 0")
    why = out_unusable(a.out)
    if why:
        p.error(why)
    if a.hidden % a.head_dim or a.context < 2:
        p.error("--hidden must be a multiple of --head-dim, and --context at least 2")

    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        sys.exit("this example builds its model with transformers: pip install transformers")

    try:
        raw = open(a.data, "rb").read() if a.data else default_text()
    except OSError as e:
        sys.exit(f"--data: {e}")
    split = int(len(raw) * 0.95)
    if len(raw) - split <= a.context:
        sys.exit(f"{len(raw)} bytes of text: too few for windows of {a.context} (give --data or a smaller --context)")
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    train, held_out = data[:split], data[split:]

    torch.manual_seed(a.seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=a.hidden, intermediate_size=a.ffn,
                         num_hidden_layers=a.layers, num_attention_heads=a.hidden // a.head_dim,
                         num_key_value_heads=a.hidden // a.head_dim, head_dim=a.head_dim, hidden_act="relu",
                         max_position_embeddings=a.context, rope_theta=10000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS)
    model = LlamaForCausalLM(config).to(a.device)
    if on_gpu:  # the parameters in bf16; buffers (RoPE's frequencies) stay float32, as from_pretrained keeps them
        for t in model.parameters():
            t.data = t.data.to(torch.bfloat16)
    # precision "auto": a float32 model keeps float32's accuracy on the CPU; the GPU trains in bf16
    with warnings.catch_warnings():  # its advice on save_pretrained: followed below
        warnings.simplefilter("ignore")
        n = twell.replace_hf_mlps(model, l1=0.0)
    ffns = [m for m in model.modules() if isinstance(m, twell.FFN)]
    print(f"{n} MLPs now twell FFNs; {sum(t.numel() for t in model.parameters()) / 1e6:.1f}M parameters on "
          f"{a.device}; {len(train)} training bytes, {len(held_out)} held out", flush=True)

    params = [t for t in model.parameters() if t.requires_grad]
    master = [t.detach().float().clone().requires_grad_() for t in params] if on_gpu else params
    opt = torch.optim.AdamW(master, lr=a.lr, weight_decay=0.1, betas=(0.9, 0.95))
    forward = torch.compile(model, fullgraph=True) if a.compile else model
    g = torch.Generator().manual_seed(a.seed + 1)

    def ce(x, y):
        logits = forward(input_ids=x.to(a.device)).logits
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), y.to(a.device).reshape(-1))

    def held_out_ce():
        with torch.no_grad():
            hg = torch.Generator().manual_seed(12345)  # the same windows each time
            return ce(*batches(held_out, min(a.batch, 8), a.context, hg)).item()

    log, t0, tokens, evaluating = [], time.time(), 0, 0.0
    warmup = max(1, min(20, a.steps // 10))
    for step in range(1, a.steps + 1):  # a linear warm-up, then a cosine down to a tenth of --lr
        lr = a.lr * min(1.0, step / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - 1) / a.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        l1 = a.l1 * min(1.0, step / a.l1_warmup) if a.l1_warmup else a.l1
        for f in ffns:
            f.l1 = l1  # read by the FFN's backward
        loss = ce(*batches(train, a.batch, a.context, g))
        loss.backward()
        if on_gpu:  # bf16 weights, float32 masters: the step on the masters, copied back rounded
            for t, m in zip(params, master):
                m.grad = t.grad.float()
                t.grad = None
        torch.nn.utils.clip_grad_norm_(master, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if on_gpu:
            with torch.no_grad():
                for t, m in zip(params, master):
                    t.copy_(m)
        tokens += a.batch * a.context
        if step % a.log_every == 0 or step == a.steps:
            nnz, ce_now, elapsed = ffn_nonzeros(model), loss.item(), time.time() - t0 - evaluating
            started = time.time()
            entry = {"step": step, "ce": ce_now, "held_out_ce": held_out_ce(), "l1": l1, "lr": lr,
                     "nnz_per_token": nnz, "ffn": a.ffn, "tokens_per_s": tokens / elapsed}
            evaluating += time.time() - started  # the rate is of training alone
            log.append(entry)
            shown = "?" if nnz is None else f"{nnz:.1f} of {a.ffn} ({100 * nnz / a.ffn:.2f}%)"
            print(f"step {step:5d}/{a.steps}  CE {entry['ce']:.3f}  held-out {entry['held_out_ce']:.3f}  "
                  f"λ {l1:.1e}  non-zeros a token {shown}  {entry['tokens_per_s']:.0f} tokens/s", flush=True)

    # Everything is written to a new folder beside --out, which then takes --out's place: a save that
    # fails (a full disk) leaves the earlier run's checkpoint whole, never its config with new weights.
    plot = save_atomically(a.out, lambda folder: save(model, log, a, folder))
    print(f"saved {a.out}/: the checkpoint, train_log.json{plot}", flush=True)

    # the saved checkpoint, loaded by twell's runtime: its logits against the trained model's
    x, _ = batches(held_out, 1, a.context, torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(input_ids=x.to(a.device)).logits[0].float().cpu()
    loaded = twell.Model(a.out, device=a.device, tokenizer="bytes", context=a.context)
    got = torch.as_tensor(loaded.logits(x[0].tolist())).float().cpu()
    err = ((got - want).norm() / want.norm()).item()
    limit = 2e-2 if on_gpu else 1e-4
    print(f"twell.Model on {a.out}: logits relative error {err:.2e} against the trained model's (limit {limit:g})")
    if not err <= limit:
        sys.exit("the saved model's logits do not match")


if __name__ == "__main__":
    main()
