#!/usr/bin/env python3
"""Plots `twell bench ffn` JSON records: time relative to the dense baseline against activation
density, one panel per token count, one line per implementation and distribution.

    python3 bench/plot.py bench/results/h200/ffn.json -o bench/results/h200/ffn.png

Needs matplotlib (pip install matplotlib).
"""
import argparse
import collections
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="JSON files written by `twell bench ffn --json`")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    args = ap.parse_args()

    records = [r for path in args.json for r in json.load(open(path)) if r.get("bench") == "ffn"]
    shapes = sorted({(r["H"], r["I"], r["M"]) for r in records})
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.8), squeeze=False, sharey=True)
    for ax, (H, I, M) in zip(axes[0], shapes):
        lines = collections.defaultdict(list)
        for r in records:
            if (r["H"], r["I"], r["M"]) == (H, I, M) and r["correct"] and r["ratio_to_dense"] is not None:
                lines[(r["impl"], r["distribution"])].append((r["density"] * 100, r["ratio_to_dense"]))
        for (impl, dist), pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                    ls="-" if dist == "uniform" else "--", label=f"{impl} ({dist})")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"M={M}, H={H}, I={I}", fontsize=9)
        ax.set_xlabel("activation density (%)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time / dense cuBLAS (lower is faster)")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    gpu = records[0]["gpu"] if records else ""
    fig.suptitle(f"twell bench ffn on {gpu}: forward time relative to dense", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)


if __name__ == "__main__":
    main()
