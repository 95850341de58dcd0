#!/usr/bin/env python3
"""Per-kernel timeline of the CUDA graphs replayed in a run traced by ktrace (tools/ktrace).

    CUDA_INJECTION64_PATH=build-gpu/libtwell_ktrace.so TWELL_KTRACE_OUT=t.tsv twell bench model --no-prefill ...
    scripts/ktrace.py t.tsv [--json out.json] [--window 16]

For each graph replayed at least 5 times: the median replay's wall time, then for every kernel
name its count in a replay, the summed median duration and the summed median gap before it (the
time from the previous kernel's end to its start: negative where programmatic dependent launch
started it early), and a window of consecutive kernels from the middle of the graph (one layer,
in a model). Durations are GPU time stamps, so they include the waits inside a kernel.
"""
import argparse
import collections
import json
import shutil
import statistics
import subprocess
import sys


def short_names(mangled):
    """Readable kernel names: demangled (c++filt where installed), without namespaces or arguments."""
    names = list(mangled)
    if shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
        names = out.splitlines() if len(out.splitlines()) == len(names) else names
    result = {}
    for m, d in zip(mangled, names):
        s = d.replace("(anonymous namespace)::", "").split("(")[0]
        for prefix in ("void ", "twell::cuda::", "twell::", "cutlass::"):
            s = s.replace(prefix, "")
        result[m] = s[:70]
    return result


def replays(kernels):
    """The graph's kernels cut into replays: one kernel of every node a replay."""
    nodes = len({k["node"] for k in kernels})
    kernels = sorted(kernels, key=lambda k: k["start"])
    return [kernels[i:i + nodes] for i in range(0, len(kernels) - nodes + 1, nodes)], nodes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--json", help="write the per-kernel table here")
    ap.add_argument("--window", type=int, default=16, help="consecutive kernels listed from the middle")
    ap.add_argument("--min-replays", type=int, default=5)
    args = ap.parse_args()

    rows = []
    with open(args.trace) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            v = dict(zip(header, line.rstrip("\n").split("\t")))
            rows.append({"start": int(v["start_ns"]), "end": int(v["end_ns"]), "graph": int(v["graph"]),
                         "node": int(v["node"]), "name": v["name"]})
    names = short_names(sorted({r["name"] for r in rows}))
    graphs = collections.defaultdict(list)
    for r in rows:
        if r["graph"]:
            graphs[r["graph"]].append(r)

    report = []
    for graph, kernels in sorted(graphs.items()):
        reps, nodes = replays(kernels)
        reps = [r for r in reps if len({k["node"] for k in r}) == nodes]  # whole replays only
        if len(reps) < args.min_replays:
            continue
        wall = statistics.median(r[-1]["end"] - r[0]["start"] for r in reps) / 1e3
        seq = []
        for i in range(nodes):
            dur = statistics.median(r[i]["end"] - r[i]["start"] for r in reps) / 1e3
            gap = statistics.median(r[i]["start"] - r[i - 1]["end"] for r in reps) / 1e3 if i else 0.0
            seq.append((names[reps[0][i]["name"]], dur, gap))
        by_name = collections.OrderedDict()
        for name, dur, gap in seq:
            e = by_name.setdefault(name, {"kernel": name, "count": 0, "duration_us": 0.0, "gap_us": 0.0})
            e["count"] += 1
            e["duration_us"] += dur
            e["gap_us"] += gap
        print(f"graph {graph}: {len(reps)} replays of {nodes} kernels, median wall {wall:.1f} us")
        print(f"  {'count':>5} {'sum dur us':>10} {'sum gap us':>10} {'mean dur':>8} {'mean gap':>8}  kernel")
        for e in by_name.values():
            print(f"  {e['count']:5d} {e['duration_us']:10.1f} {e['gap_us']:10.1f} {e['duration_us'] / e['count']:8.2f} "
                  f"{e['gap_us'] / e['count']:8.2f}  {e['kernel']}")
        mid = max(0, nodes // 2 - args.window // 2)
        print(f"  kernels {mid}..{mid + args.window - 1} (duration, gap before, us):")
        for name, dur, gap in seq[mid:mid + args.window]:
            print(f"    {dur:7.2f} {gap:7.2f}  {name}")
        report.append({"graph": graph, "replays": len(reps), "kernels": nodes, "wall_us": wall,
                       "by_kernel": list(by_name.values()),
                       "sequence": [{"kernel": n, "duration_us": d, "gap_us": g} for n, d, g in seq]})
    if not report:
        print("no graph replayed often enough in this trace", file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
