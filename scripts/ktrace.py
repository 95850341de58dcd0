#!/usr/bin/env python3
"""Per-kernel timeline of the CUDA graphs replayed in a run traced by ktrace (tools/ktrace).

    CUDA_INJECTION64_PATH=build-gpu/libtwell_ktrace.so TWELL_KTRACE_OUT=t.tsv twell bench model --no-prefill ...
    scripts/ktrace.py t.tsv [--json out.json] [--window 16] [--plot out.png]

For each graph replayed at least 5 times: the median replay's wall time, then for every kernel
name its count in a replay, the summed median duration and the summed median gap before it (the
time from the previous kernel's end to its start: negative where programmatic dependent launch
started it early), and a window of consecutive kernels from the middle of the graph (one layer,
in a model). Durations are GPU time stamps, so they include the waits inside a kernel.
--plot draws that window of each graph as a timeline, one row per graph (needs matplotlib).

Kernels launched eagerly (not in a graph), e.g. a training step of `twell bench ffn --train`:

    scripts/ktrace.py t.tsv --steps TwellPackEpilogue --step-end nvjet

cuts the timeline into steps, each from a kernel whose full name contains the --steps text up to
the next one, or to the first kernel whose name contains the --step-end text; for each kind of step
(the same kernels, seen at least 3 times) it prints the median span, the median time no kernel was
running (on any stream), and per kernel name the median summed duration in a step.

Where the GPU waits for the host (a trace taken with TWELL_KTRACE_HOST=1, which also writes
t.tsv.host.tsv: the host's CUDA calls and the memsets):

    scripts/ktrace.py t.tsv --host TwellPackEpilogue [--index -2] [--before 60] [--min-call-us 1]

prints one stretch of the merged timeline, from --before µs ahead of the --index-th kernel whose
full name contains the --host text up to the next one: kernels (with their stream), memsets, and
host calls longer than --min-call-us, in µs from that kernel's start.
"""
import argparse
import collections
import json
import shutil
import statistics
import subprocess
import sys


def demangled(mangled):
    """Demangled names (c++filt where installed, else the mangled ones), by mangled name."""
    names = list(mangled)
    if shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
        names = out.splitlines() if len(out.splitlines()) == len(names) else names
    return dict(zip(mangled, names))


def short_names(mangled):
    """Readable kernel names: demangled, without namespaces or arguments."""
    result = {}
    for m, d in demangled(mangled).items():
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
    ap.add_argument("--start", help="start the window at the first kernel from the middle on whose name contains this")
    ap.add_argument("--min-replays", type=int, default=5)
    ap.add_argument("--plot", help="draw each graph's window as a timeline into this PNG")
    ap.add_argument("--labels", nargs="*", default=[], help="a name for each graph in the plot, in graph order")
    ap.add_argument("--steps", help="eager kernels: a step starts at each kernel whose full name contains this")
    ap.add_argument("--step-end", help="eager kernels: a step also ends before a kernel whose full name contains this")
    ap.add_argument("--host", help="with <trace>.host.tsv: the timeline around a kernel whose full name contains this")
    ap.add_argument("--index", type=int, default=-2, help="--host: which of those kernels (Python index)")
    ap.add_argument("--before", type=float, default=60, help="--host: µs shown before it")
    ap.add_argument("--min-call-us", type=float, default=1, help="--host: shorter host calls are left out")
    args = ap.parse_args()

    rows = []
    with open(args.trace) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            v = dict(zip(header, line.rstrip("\n").split("\t")))
            rows.append({"start": int(v["start_ns"]), "end": int(v["end_ns"]), "graph": int(v["graph"]),
                         "node": int(v["node"]), "stream": v["stream"], "name": v["name"]})
    names = short_names(sorted({r["name"] for r in rows}))
    if args.host:
        return host_timeline(args.trace + ".host.tsv", rows, names, args)
    if args.steps:
        return eager_steps(rows, names, args.steps, args.step_end, args.json)
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
        if args.start:
            mid = next((i for i in range(nodes // 2, nodes) if args.start in seq[i][0]), mid)
        print(f"  kernels {mid}..{mid + args.window - 1} (duration, gap before, us):")
        for name, dur, gap in seq[mid:mid + args.window]:
            print(f"    {dur:7.2f} {gap:7.2f}  {name}")
        report.append({"graph": graph, "replays": len(reps), "kernels": nodes, "wall_us": wall,
                       "by_kernel": list(by_name.values()), "window": [mid, mid + args.window],
                       "sequence": [{"kernel": n, "duration_us": d, "gap_us": g} for n, d, g in seq]})
    if not report:
        print("no graph replayed often enough in this trace", file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.plot:
        plot(report, args.plot, args.labels)
    return 0


def host_timeline(path, rows, names, args):
    """Kernels, memsets and host calls from args.before µs ahead of the chosen kernel to the next."""
    try:
        with open(path) as f:
            header = f.readline().rstrip("\n").split("\t")
            calls = [dict(zip(header, line.rstrip("\n").split("\t"))) for line in f]
    except OSError as e:
        print(f"cannot read {path} (trace with TWELL_KTRACE_HOST=1): {e}", file=sys.stderr)
        return 1
    events = [(r["start"], r["end"], f"K s{r['stream']}", names[r["name"]]) for r in rows]
    for c in calls:
        start, end = int(c["start_ns"]), int(c["end_ns"])
        if c["kind"] == "memset":
            events.append((start, end, f"memset s{c['stream']}", f"{c['name']} bytes"))
        elif (end - start) / 1e3 >= args.min_call_us:
            events.append((start, end, "host", c["name"].split("_v")[0]))
    events.sort()
    marks = sorted(r["start"] for r in rows if args.host in r["name"])
    if not marks:
        print(f"no kernel named like {args.host!r} in the trace", file=sys.stderr)
        return 1
    try:
        t0 = marks[args.index]
    except IndexError:
        print(f"--index {args.index}: only {len(marks)} such kernels", file=sys.stderr)
        return 1
    later = [m for m in marks if m > t0]
    t1 = later[0] if later else events[-1][1]
    print(f"{'start us':>9} {'end us':>9} {'dur us':>8}  {'kind':<10} name   (0 = that kernel's start)")
    for start, end, kind, name in events:
        if t0 - args.before * 1e3 <= start <= t1:
            print(f"{(start - t0) / 1e3:9.1f} {(end - t0) / 1e3:9.1f} {(end - start) / 1e3:8.1f}  {kind:<10} {name}")
    return 0


def eager_steps(rows, names, start, stop, json_path):
    """Steps of eagerly launched kernels (see the module's help)."""
    full = demangled(sorted({r["name"] for r in rows}))
    steps, cur = [], None
    for r in sorted((r for r in rows if not r["graph"]), key=lambda r: r["start"]):
        name = full[r["name"]] + " " + r["name"]
        if start in name:
            cur = [r]
            steps.append(cur)
        elif cur is not None and stop and stop in name:
            cur = None
        elif cur is not None:
            cur.append(r)
    if not steps:
        print(f"no kernel's name contains {start!r}", file=sys.stderr)
        return 1
    report = []
    # Steps of different kernels are different runs (e.g. a benchmark's runners, or its check's run of
    # another shape with as many kernels): each apart.
    def kinds(step):
        return tuple(sorted(collections.Counter(names[k["name"]] for k in step).items()))
    for kind, n_steps in collections.Counter(kinds(s) for s in steps).most_common():
        if n_steps < 3:
            continue
        group = [s for s in steps if kinds(s) == kind]
        report.append(step_table(group, len(group[0]), names))
    if not report:
        print("no step shape seen 3 times", file=sys.stderr)
        return 1
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def step_table(steps, usual, names):
    def idle(step):  # time inside the step's span with no kernel running
        t, gap = step[0]["start"], 0
        for k in sorted(step, key=lambda k: k["start"]):
            gap += max(0, k["start"] - t)
            t = max(t, k["end"])
        return gap

    span = statistics.median(max(k["end"] for k in s) - s[0]["start"] for s in steps) / 1e3
    quiet = statistics.median(idle(s) for s in steps) / 1e3
    per_name = collections.OrderedDict()
    for k in steps[0]:
        per_name.setdefault(names[k["name"]], [])
    for s in steps:
        totals = collections.Counter()
        for k in s:
            totals[names[k["name"]]] += k["end"] - k["start"]
        for n in per_name:
            per_name[n].append(totals[n] / 1e3)
    print(f"{len(steps)} steps of {usual} kernels: median span {span:.1f} us, no kernel running {quiet:.1f} us of it")
    print(f"  {'count':>5} {'dur us':>9}  kernel")
    counts = collections.Counter(names[k["name"]] for k in steps[0])
    table = []
    for n, durs in per_name.items():
        table.append({"kernel": n, "count": counts[n], "duration_us": statistics.median(durs)})
        print(f"  {counts[n]:5d} {statistics.median(durs):9.1f}  {n}")
    return {"steps": len(steps), "kernels": usual, "span_us": span, "idle_us": quiet, "by_kernel": table}


def plot(report, path, labels):
    """Each graph's window of kernels on a time axis (median durations, gaps chained): one row per
    graph, kernels alternating between two lanes so that overlapping ones stay visible."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(14, 1.6 + 1.3 * len(report)))
    colors = {}
    palette = plt.get_cmap("tab20").colors
    for row, g in enumerate(report):
        lo, hi = g["window"]
        t = 0.0
        y = len(report) - 1 - row
        for i, k in enumerate(g["sequence"][lo:hi]):
            if i:
                t += k["gap_us"]
            c = colors.setdefault(k["kernel"], palette[len(colors) % len(palette)])
            lane = 0.22 if i % 2 else -0.22
            ax.barh(y + lane, k["duration_us"], left=t, height=0.4, color=c, edgecolor="black", linewidth=0.4)
            if k["duration_us"] > 1.5:
                ax.text(t + k["duration_us"] / 2, y + lane, k["kernel"][:18], ha="center", va="center", fontsize=6)
            t += k["duration_us"]
    names = [labels[i] if i < len(labels) else f"graph {g['graph']}" for i, g in enumerate(report)]
    ax.set_yticks(range(len(report)))
    ax.set_yticklabels(list(reversed([f"{n}\n({g['wall_us'] / 1e3:.3f} ms a replay)" for n, g in zip(names, report)])))
    ax.set_xlabel("µs from the window's first kernel (median over replays; overlapping bars: programmatic dependent launch)")
    ax.set_title("Kernels inside the replayed CUDA graph (ktrace)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
