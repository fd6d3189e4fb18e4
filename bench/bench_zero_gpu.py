"""What ZeRO costs on a GPU: optim.zero 0, 1 and 2 on dp ranks that share one GPU (comm.backend=mpi: the MPI
transport stages device tensors through the host), interleaved --runs times, on GPT-2 124M (configs/gpt2-124m.yaml,
bf16, T 1024) with --micro-batch sequences per micro-batch and --micro-batches of them per rank and step.

Per arm: the median step_ms over steps after the first --warmup of each run (then the median over runs), its ratio
to zero 0's, the exposed communication, and the memory the trainer reports: gradients + optimizer state per rank
(its "memory per rank" line) and the GPU's peak in tensors per rank (its "GPU memory" line). The ranks share one GPU
and one host link, so the step time is a stress case of the staging, not a multi-GPU figure: read the memory
columns as the result and the time columns as the price of the extra collectives on this transport.

Usage: python3 bench/bench_zero_gpu.py [--build build] [--config configs/gpt2-124m.yaml] [--device cuda] [--dp 2]
           [--micro-batch 4] [--micro-batches 1] [--steps 8] [--warmup 3] [--runs 1] [--out DIR]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

from bench_cli import int_at_least

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, zero, rep):
    d = os.path.join(args.out, f"zero{zero}_run{rep}")
    cmd = ["mpiexec", "-n", str(args.dp), os.path.join(args.build, "trainer"),
           "--config", args.config, "--set", f"device={args.device}",
           "--set", "comm.backend=mpi", "--set", f"parallel.dp={args.dp}", "--set", f"optim.zero={zero}",
           "--set", f"train.micro_batch={args.micro_batch}",
           "--set", f"train.global_batch={args.micro_batch * args.micro_batches * args.dp}",
           "--set", f"train.steps={args.steps}", "--set", "run.log_every=1", "--set", f"run.dir={d}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    log = p.stdout + p.stderr
    with open(d + ".log", "w") as f:
        f.write(" ".join(cmd) + "\n" + log)
    if p.returncode != 0:
        sys.exit(f"bench_zero_gpu: zero {zero} exited {p.returncode}; log {d}.log:\n{log[-3000:]}")
    rows = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
    late = [r for r in rows if r["step"] > args.warmup]
    mem = re.search(r"memory per rank: .*?gradients ([\d.]+) MiB, optimizer state ([\d.]+) MiB", log)
    peaks = [float(x) for x in re.findall(r"GPU memory: peak ([\d.]+) MiB", log)]
    return {"step_ms": statistics.median(r["step_ms"] for r in late),
            "exposed_ms": statistics.median(r["exposed_comm_ms"] for r in late),
            "grad_opt_mib": float(mem.group(1)) + float(mem.group(2)) if mem else float("nan"),
            "gpu_peak_mib": max(peaks) if peaks else float("nan"), "loss": rows[-1]["loss"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/gpt2-124m.yaml"))
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke test of this script")
    ap.add_argument("--dp", type=int_at_least(2), default=2)
    ap.add_argument("--micro-batch", type=int_at_least(1), default=4)
    ap.add_argument("--micro-batches", type=int_at_least(1), default=1)
    ap.add_argument("--steps", type=int_at_least(2), default=8)
    ap.add_argument("--warmup", type=int_at_least(1), default=3)
    ap.add_argument("--runs", type=int_at_least(1), default=1)
    ap.add_argument("--out", default="/tmp/mt-bench-zero-gpu")
    args = ap.parse_args()
    if args.warmup >= args.steps:
        ap.error("--warmup must be below --steps")
    os.makedirs(args.out, exist_ok=True)
    per = {z: [] for z in (0, 1, 2)}
    for rep in range(args.runs):
        for z in per:
            per[z].append(run(args, z, rep))
    med = {z: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for z, rs in per.items()}
    print(f"\n{os.path.basename(args.config)} on {args.device}, dp {args.dp} ranks on one GPU (comm.backend=mpi), "
          f"{args.micro_batches} micro-batch(es) of {args.micro_batch} sequences per rank and step; medians over "
          f"steps {args.warmup + 1}..{args.steps} and {args.runs} run(s)\n")
    print("| zero | step ms | vs zero 0 | exposed comm ms | grads + optimizer MiB/rank | GPU peak MiB/rank "
          "| last loss |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for z, m in med.items():
        print(f"| {z} | {m['step_ms']:.1f} | {m['step_ms'] / med[0]['step_ms']:.2f}x | {m['exposed_ms']:.1f} | "
              f"{m['grad_opt_mib']:.0f} | {m['gpu_peak_mib']:.0f} | {m['loss']:.4f} |")


if __name__ == "__main__":
    main()
