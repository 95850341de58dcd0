#!/usr/bin/env python3
"""Plots `twell bench` JSON records.

`twell bench ffn` (and `--train`): time relative to the dense baseline against activation
density, one panel per token count, one line per implementation and distribution.
`twell bench model`: prefill throughput and decode step time per implementation, and each
relative to dense. `twell eval --sparsity --json`: each layer's FFN non-zeros per token (mean and
most), one bar a layer.

    python3 bench/plot.py bench/results/h200/ffn.json -o bench/results/h200/ffn.png
    python3 bench/plot.py bench/results/h200/model.json -o bench/results/h200/model.png
    python3 bench/plot.py eval.json -o sparsity.png

Needs matplotlib (pip install matplotlib).
"""
import argparse
import collections
import json
import os
import sys
import textwrap

try:
    import matplotlib
except ImportError:
    sys.exit("bench/plot.py needs matplotlib: pip install matplotlib")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

# What `ratio_to_dense` divides by: the dense implementation each backend's bench times.
BASELINES = {"dense_cublas": "dense cuBLAS", "dense_cpu": "dense (CPU reference)"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="JSON files written by `twell bench ffn --json`, `twell bench model --json` or `twell eval --sparsity --json`")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    args = ap.parse_args()

    loaded = [load(path) for path in args.json]
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        sys.exit(f"bench/plot.py: -o {args.output}: no such directory {out_dir}")
    try:
        plot(loaded, args)
    except OSError as e:  # the PNG could not be written
        sys.exit(f"bench/plot.py: -o {args.output}: {e.strerror or e}")


def load(path):
    """One file's records (`twell bench --json`: a list of them) or result (`twell eval --json`), or a one-line
    exit saying why not."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        sys.exit(f"bench/plot.py: {path}: {e.strerror or e}")
    except (ValueError, UnicodeDecodeError) as e:
        sys.exit(f"bench/plot.py: {path}: not JSON ({e})")
    is_records = isinstance(data, list) and all(isinstance(r, dict) and "bench" in r for r in data)
    if not is_records and not (isinstance(data, dict) and "perplexity" in data):
        sys.exit(f"bench/plot.py: {path}: not a file of `twell bench --json` records or a `twell eval --json` result")
    return data


def plot(loaded, args):
    if any(isinstance(d, dict) for d in loaded):  # `twell eval --json`: one result, not a list of records
        if len(loaded) != 1 or "ffn_sparsity" not in loaded[0]:
            sys.exit("bench/plot.py: an eval result plots alone, and only with its per-layer figures "
                     "(twell eval --sparsity --json)")
        return plot_sparsity(loaded[0], args.output)
    # Each record with the index of its file, so that the same case from several files is a line of each.
    all_records = [dict(r, _file=i) for i, d in enumerate(loaded) for r in d]
    if not all_records:
        sys.exit("bench/plot.py: the files hold no records")
    if any(r.get("bench", "").startswith("model_") for r in all_records):
        model = [r for r in all_records if r["bench"] in ("model_prefill", "model_decode")]
        note_left_out(all_records, model, "model_prefill and model_decode")
        if not model:
            sys.exit("bench/plot.py: no model_prefill or model_decode records to plot")
        return plot_model(model, args.output)
    kind = "ffn_train" if any(r.get("bench") == "ffn_train" for r in all_records) else "ffn"
    records = [r for r in all_records if r.get("bench") == kind]
    note_left_out(all_records, records, kind)
    if not records:
        sys.exit(f"bench/plot.py: no records it plots ({', '.join(PLOTTED)})")
    shapes = sorted({(r["H"], r["I"], r["M"]) for r in records})
    baselines = {BASELINES[r["impl"]] for r in records if r["impl"] in BASELINES}
    baseline = baselines.pop() if len(baselines) == 1 else "dense"
    ratios = [r["ratio_to_dense"] for r in records if r["correct"] and r["ratio_to_dense"] is not None]
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.8), squeeze=False, sharey=True)
    # What else tells records apart where the files mix them: a line each, named by it.
    varying = [k for k in ("gpu", "timing", "gated", "tile", "compression", "_file")
               if len({str(r.get(k)) for r in records}) > 1]
    left_out = [r for r in records if r["correct"] and r["ratio_to_dense"] is not None and not r["density"] > 0]
    if left_out:
        print(f"bench/plot.py: {len(left_out)} record(s) of density 0 left out (the density axis is logarithmic)",
              file=sys.stderr)
    for ax, (H, I, M) in zip(axes[0], shapes):
        lines = collections.defaultdict(dict)
        for r in records:
            if ((r["H"], r["I"], r["M"]) == (H, I, M) and r["correct"] and r["ratio_to_dense"] is not None
                    and r["density"] > 0):
                key = (r["impl"], r["distribution"]) + tuple(str(r.get(k)) for k in varying)
                if r["density"] in lines[key]:
                    sys.exit(f"bench/plot.py: two records of {r['impl']}, M={M}, {r['distribution']} at density "
                             f"{r['density']} in one file: plot the runs from separate files")
                lines[key][r["density"]] = r["ratio_to_dense"]
        for key, pts in sorted(lines.items()):
            impl, dist, rest = key[0], key[1], key[2:]
            extra = "".join(f", {name(k)} {v}" for k, v in zip(varying, rest))
            xs = sorted(pts)
            ax.plot([x * 100 for x in xs], [pts[x] for x in xs], marker="o", ms=3,
                    ls="-" if dist == "uniform" else "--", label=f"{impl} ({dist}{extra})")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_ticks_if_narrow(ax.xaxis, [x * 100 for pts in lines.values() for x in pts])
        plain_ticks_if_narrow(ax.yaxis, ratios)
        ax.set_title(f"M={M}, H={H}, I={I}", fontsize=9)
        ax.set_xlabel("activation density (%)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(f"time / {baseline} (lower is faster)")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    gpu = " / ".join(sorted({r["gpu"] for r in records}))
    what = "forward + backward" if kind == "ffn_train" else "forward"
    # About 12 characters of 10 pt text to the inch; one panel is too narrow for the title on one line.
    title = f"twell bench ffn on {gpu}: {what} time relative to dense"
    fig.suptitle(textwrap.fill(title, width=int(12 * fig.get_figwidth())), fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)


def name(key):
    """A record field as a line's label names it."""
    return "file" if key == "_file" else key


# The benches plot.py draws (each kind alone: ffn_train before ffn, model before both).
PLOTTED = ("ffn", "ffn_train", "model_prefill", "model_decode")


def note_left_out(records, kept, what):
    """Says on stderr how many records of other benches a plot of `what` leaves out, and whether plot.py
    draws them at all."""
    others = collections.Counter(r.get("bench") for r in records if not any(r is k for k in kept))
    if others:
        listed = ", ".join(f"{n} {b}" for b, n in sorted(others.items(), key=lambda kv: str(kv[0])))
        how = ("plot those from a file of their own" if any(b in PLOTTED for b in others)
               else "plot.py draws no plot of those")
        print(f"bench/plot.py: plotting the {what} records; left out: {listed} ({how})", file=sys.stderr)


def plain_ticks_if_narrow(axis, values):
    """On a log axis spanning less than a decade, the default ticks are one or two labels like 1.2×10⁰:
    put plain numbers (0.8, 1, 1.2) at linearly spaced values instead (one at the value where all are
    one). Wider ranges keep the default."""
    if not values or max(values) >= 10 * min(values):
        return
    # One value (a single density, say): one tick at it, where linear ticks over the narrow log view overlap.
    axis.set_major_locator(ticker.FixedLocator([values[0]]) if len(set(values)) == 1
                           else ticker.MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def plot_model(records, output):
    impls = ["dense", "twell", "twell_gather"]
    colors = {"dense": "tab:grey", "twell": "tab:blue", "twell_gather": "tab:orange"}
    ok = [r for r in records if r["correct"] and r["ms_median"] is not None]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))

    prefill = [r for r in ok if r["bench"] == "model_prefill"]
    ax = axes[0]
    present = [impl for impl in impls if any(r["impl"] == impl for r in prefill)]
    if len(prefill) > len({r["impl"] for r in prefill}):
        print("bench/plot.py: several prefill records of one implementation: each bar is the first",
              file=sys.stderr)
    for i, impl in enumerate(present):
        r = next(r for r in prefill if r["impl"] == impl)
        ax.bar(i, r["tokens_per_ms"], color=colors[impl])
        ax.text(i, r["tokens_per_ms"], f"{r['tokens_per_ms']:.1f} ({r['ratio_to_dense']:.3f}x)", ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(range(len(present)), present)
    ax.margins(y=0.12)
    ax.set_ylabel("prefill tokens / ms (higher is faster)")
    if prefill:
        r = prefill[0]
        ax.set_title(f"prefill {r['M']} tokens, {r['layers']} layers", fontsize=9)

    decode = [r for r in ok if r["bench"] == "model_decode"]
    ax = axes[1]
    batches = sorted({r["M"] for r in decode})
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        xs, ys = [], []
        for j, b in enumerate(batches):
            rs = [r for r in decode if r["impl"] == impl and r["M"] == b]
            if len(rs) > 1:
                print(f"bench/plot.py: {len(rs)} decode records of {impl} at batch {b}: the bar is the first",
                      file=sys.stderr)
            if rs:
                xs.append(j + (i - 1) * width)
                ys.append(rs[0]["ratio_to_dense"])
        ax.bar(xs, ys, width=width, color=colors[impl], label=impl)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    ax.set_ylabel("decode step time / dense (lower is faster)")
    ax.set_title("decode, one step (graph replay + copies)", fontsize=9)
    ax.legend(fontsize=8)
    gpu = " / ".join(sorted({r["gpu"] for r in records}))
    fig.suptitle(f"twell bench model on {gpu}: dense vs twell FFN", fontsize=10)
    fig.tight_layout()
    fig.savefig(output, dpi=110)


def plot_sparsity(result, output):
    layers = result["ffn_sparsity"]
    xs = [r["layer"] for r in layers]
    fig, ax = plt.subplots(figsize=(max(5, 0.25 * len(xs) + 2), 3.8))
    ax.bar(xs, [r["nnz_per_token"] for r in layers], color="tab:blue", label="mean")
    ax.plot(xs, [r["max_nnz_per_token"] for r in layers], "v", color="tab:red", ms=4, ls="none", label="most of a token")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_ylabel("FFN non-zeros per token")
    ax.set_ylim(bottom=0)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    mean = sum(r["nnz_per_token"] for r in layers) / max(1, len(layers))
    title = (f"twell eval --sparsity: {result['model']} on {result['file']} ({result['backend']}); "
             f"mean {mean:.1f} of {result['intermediate_size']} a token ({100 * mean / result['intermediate_size']:.2f}%), "
             + (f"perplexity {result['perplexity']:.3f}" if result.get("perplexity") is not None
                else f"mean NLL {result['mean_nll']:.3f} nats (its perplexity overflows)"))
    ax.set_title(textwrap.fill(title, width=int(12 * fig.get_figwidth())), fontsize=9)
    fig.tight_layout()
    fig.savefig(output, dpi=110)


if __name__ == "__main__":
    main()
