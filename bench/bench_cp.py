"""Context parallelism at long sequences: activation memory, each cp rank's share of the work, and the step against
one rank, for parallel.cp in --cp (default 1,2,4).

The model is small enough for a 2-core machine at --seq-len 4096: GPT-2 with 2 blocks of width 64 (4 heads of 16),
vocabulary 256, one sequence per step (train.global_batch = train.micro_batch = 1), one compute thread per rank. At
that length attention dominates: its scores cost 2 T^2 C FLOPs per block and pass against 24 T C^2 for the block's
matrix products (T = 4096, C = 64: 32x), so the step is nearly all attention.

For each cp, one run without network emulation and, with --bandwidth-gbps, one more on an emulated link of that
bandwidth and --latency-us; and one single-rank run with cp compute threads ("the same threads" as the cp run's
ranks together). Each row gives:
  - activation bytes per rank (memory.json: the records kept for the backward pass) and the ratio to cp 1's;
  - the step (median over steps 3..N of metrics.jsonl) and its ratio to the one-rank run with 1 thread and with cp
    threads;
  - per cp rank, its forward and backward compute (from run.profile's trace: the passes' spans, which hold the
    ring's waits too), and the spread between ranks (max / min - 1): the zigzag split gives every rank the same
    causal attention work;
  - on the emulated link: the step's growth over the run without emulation, which is the ring's exposed
    communication (the ring's k|v and dk|dv travel while the blocks compute; the gradient all-reduce over cp ranks is
    a few hundred KB), against comm_bytes / bandwidth, the time the ring's bytes need on that link.
cp 1 runs the one-rank attention kernel, whose record holds every T x T probability; cp > 1 runs the ring, whose
record is each query's log-sum-exp. So cp 1 -> 2 changes the algorithm as well as the split; cp 2 -> 4 is the split
alone.

Usage: /usr/bin/python3 bench/bench_cp.py [--cp 1,2,4] [--seq-len 4096] [--steps 6] [--bandwidth-gbps 1]
           [--latency-us 20] [--trainer build/trainer]
On an idle machine: with more ranks than cores the ranks share cores, so read those rows as a stress case.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_cli import cpu_model, float_at_least, int_at_least, int_list

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 2  # metrics rows skipped: the first steps allocate


def run(args, cp, threads, work, name, extra=()):
    run_dir = os.path.join(work, name)
    cmd = ([args.mpiexec, "-n", str(cp)] if cp > 1 else []) + [
        args.trainer, "--config", os.path.join(ROOT, "configs", "tiny.yaml"), "--set", f"run.dir={run_dir}",
        "--set", f"parallel.cp={cp}", "--set", f"model.seq_len={args.seq_len}", "--set", "model.n_layer=2",
        "--set", "model.n_head=4", "--set", "model.d_model=64", "--set", "model.vocab_size=256",
        "--set", "train.global_batch=1", "--set", "train.micro_batch=1", "--set", f"train.steps={args.steps}",
        "--set", f"train.threads={threads}", "--set", "run.profile=true", "--set", "run.log_every=1000",
        "--set", f"data.synthetic_tokens={max(65536, 4 * args.seq_len)}"] + [a for s in extra for a in ("--set", s)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if r.returncode != 0:
        sys.exit(f"bench_cp: {name} exited with {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))][WARMUP:]
    ranks = json.load(open(os.path.join(run_dir, "memory.json")))["ranks"]
    trace = json.load(open(os.path.join(run_dir, "trace.json")))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    passes = {}  # per rank, its forward and backward passes in time order (one of each per step)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "compute" and e.get("name") in ("forward", "backward"):
            passes.setdefault(e["pid"], []).append((e["ts"], e["dur"] / 1000.0))
    per_rank = [sum(d for _, d in sorted(v)[2 * WARMUP:]) / (args.steps - WARMUP) for _, v in sorted(passes.items())]
    return {"step_ms": statistics.median(r["step_ms"] for r in rows),
            "comm_bytes": statistics.median(r.get("comm_bytes", 0) for r in rows),
            "activation_bytes": max(x["activation_bytes"] for x in ranks),
            "pass_ms": per_rank}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cp", type=int_list(1), default="1,2,4")
    p.add_argument("--seq-len", type=int_at_least(2), default=4096)
    p.add_argument("--steps", type=int_at_least(WARMUP + 1), default=6)
    p.add_argument("--bandwidth-gbps", type=float_at_least(0), default=1.0,
                   help="emulated link for a second run of each cp > 1 (0: none)")
    p.add_argument("--latency-us", type=float_at_least(0), default=20.0)
    p.add_argument("--trainer", default=os.path.join(ROOT, "build", "trainer"))
    p.add_argument("--mpiexec", default="mpiexec")
    args = p.parse_args()
    cps = [int(x) for x in args.cp.split(",")]
    for cp in cps:
        if args.seq_len % (2 * cp):
            p.error(f"--seq-len {args.seq_len} must be divisible by 2 x cp = {2 * cp}")
    print(f"# bench_cp: GPT-2 L=2 C=64 T={args.seq_len}, one sequence per step, {os.cpu_count()} cores, "
          f"{cpu_model()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_cp_") as work:
        one = {1: run(args, 1, 1, work, "one_t1")}
        results = {}
        for cp in cps:
            results[cp] = one[1] if cp == 1 else run(args, cp, 1, work, f"cp{cp}")
            if cp > 1:
                one[cp] = run(args, 1, cp, work, f"one_t{cp}")
                if args.bandwidth_gbps > 0:
                    results[cp]["link"] = run(args, cp, 1, work, f"cp{cp}_link", [
                        f"comm.emulate.latency_us={args.latency_us}",
                        f"comm.emulate.bandwidth_gbps={args.bandwidth_gbps}"])
        base = results[cps[0]]["activation_bytes"]
        print("| cp | activation MiB/rank | vs cp %d | step ms | vs 1 rank, 1 thread | vs 1 rank, cp threads | "
              "passes ms per rank | spread | on the link: step ms | exposed ms | bytes / bandwidth ms |" % cps[0])
        print("|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
        for cp in cps:
            r = results[cp]
            spread = max(r["pass_ms"]) / min(r["pass_ms"]) - 1 if r["pass_ms"] else 0.0
            link = r.get("link")
            link_cols = ("- | - | -" if not link else
                         f"{link['step_ms']:.1f} | {link['step_ms'] - r['step_ms']:.1f} | "
                         f"{link['comm_bytes'] / (args.bandwidth_gbps * 1e9) * 1e3:.1f}")
            print(f"| {cp} | {r['activation_bytes'] / 1048576:.1f} | {base / r['activation_bytes']:.2f}x | "
                  f"{r['step_ms']:.1f} | {one[1]['step_ms'] / r['step_ms']:.2f}x | "
                  f"{one[cp]['step_ms'] / r['step_ms']:.2f}x | {', '.join(f'{x:.1f}' for x in r['pass_ms'])} | "
                  f"{spread:.1%} | {link_cols} |", flush=True)


if __name__ == "__main__":
    main()
