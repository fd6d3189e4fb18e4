#!/usr/bin/env python3
"""Where each rank's compute waited on communication, per step, from a run's trace (run.profile=true).

For every rank: the mean step (from one "optimizer" span to the next), then each kind of wait (the trace's "wait"
row: gradient buckets, all-gather parameters, pp receives, ...) split by the pass it fell in (forward, backward, or
"between" passes: the end of the step), in ms per step and waits per step, and the compute spans per step. The
first --skip steps (allocation, warm-up) are left out. metrics.jsonl's exposed_comm_ms is the largest of these waits'
sums over ranks, step by step; this shows which of them it is made of.

Usage: scripts/trace_waits.py RUN_DIR/trace.json [--skip 5] [--json]
Standard library only.
"""
import argparse
import bisect
import collections
import json
import sys


def summarize(events, skip):
    """{rank: {"steps", "step_ms", "waits": {(name, pass): (ms per step, count per step)}, "compute": {...}}}."""
    by_rank = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            by_rank[e["pid"]].append(e)
    out = {}
    for rank, evs in sorted(by_rank.items()):
        steps = sorted(e["ts"] for e in evs if e.get("cat") == "compute" and e["name"] == "optimizer")
        if len(steps) < skip + 2:
            continue
        t0, t1, n = steps[skip], steps[-1], len(steps) - 1 - skip
        passes = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in evs if e.get("cat") == "compute")
        starts = [p[0] for p in passes]
        waits, compute = collections.defaultdict(lambda: [0.0, 0]), collections.Counter()
        for e in evs:
            if not t0 <= e["ts"] < t1:
                continue
            if e.get("cat") == "wait":
                i = bisect.bisect_right(starts, e["ts"]) - 1
                inside = i >= 0 and passes[i][1] >= e["ts"] + e["dur"]
                w = waits[(e["name"], passes[i][2] if inside else "between")]
                w[0] += e["dur"]
                w[1] += 1
            elif e.get("cat") == "compute":
                compute[e["name"]] += e["dur"]
        out[rank] = {"steps": n, "step_ms": (t1 - t0) / n / 1e3,
                     "waits": {k: (v[0] / n / 1e3, v[1] / n) for k, v in waits.items()},
                     "compute": {k: v / n / 1e3 for k, v in compute.items()}}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=5, help="steps left out at the start (default 5)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()
    if args.skip < 0:
        sys.exit("--skip must be at least 0")
    try:
        trace = json.load(open(args.trace))
    except (OSError, ValueError) as e:
        sys.exit(f"cannot read {args.trace}: {e}")
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    summary = summarize(events, args.skip)
    if not summary:
        sys.exit(f"{args.trace}: no rank has more than {args.skip + 1} optimizer steps to summarize")
    if args.json:
        print(json.dumps({str(r): {**s, "waits": [{"name": k[0], "pass": k[1], "ms": v[0], "count": v[1]}
                                                   for k, v in s["waits"].items()]}
                          for r, s in summary.items()}, indent=1))
        return
    for rank, s in summary.items():
        print(f"rank {rank}: {s['steps']} steps, {s['step_ms']:.1f} ms per step")
        for (name, where), (ms, count) in sorted(s["waits"].items(), key=lambda kv: -kv[1][0]):
            print(f"  wait    {name + ' [' + where + ']':44s} {ms:8.2f} ms/step  ({count:.1f} waits)")
        for name, ms in sorted(s["compute"].items(), key=lambda kv: -kv[1]):
            print(f"  compute {name:44s} {ms:8.2f} ms/step")


if __name__ == "__main__":
    main()
