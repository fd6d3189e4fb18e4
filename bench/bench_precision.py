"""Mixed precision: activation bytes, communication bytes and tokens/s per step in bf16 and fp16 against fp32,
all measured in the same run (issue #6).

configs/gpt.yaml's model (4 blocks, C = 128, T = 64, V = 256), micro-batch 8, runs in three layouts:
  - one rank (--threads compute threads): peak activation memory of the step (the "peak
    activations" log line: the records of the micro-batches in flight) and tokens/s;
  - dp = 2 on an emulated network (--latency-us, --gbps): the data-parallel gradient reduction in fp32 and in
    bf16 (precision.grad_reduce), comm_bytes and comm_ms per step;
  - tp = 2 on the same network: the tensor-parallel activation traffic, which travels in the compute dtype.
Each row prints its ratio to the fp32 row of its layout. On this CPU backend bf16 and fp16 widen to fp32 for
every GEMM, so they move half the bytes but are not faster; the GPU backend's tensor cores are where they pay.

Usage: /usr/bin/python3 bench/bench_precision.py [--steps 50] [--threads 2] [--latency-us 20] [--gbps 1]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

from bench_cli import float_above, float_at_least, int_at_least

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACTS = re.compile(r"peak activations ([\d.]+) MiB")  # the first line: pipeline stage 0, or the only one


def run(args, work, name, ranks, sets, threads=1):
    run_dir = os.path.join(work, name)
    cmd = ([args.mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [
        os.path.join(ROOT, "build", "trainer"), "--config", os.path.join(ROOT, "configs", "gpt.yaml"),
        "--set", "train.global_batch=16", "--set", "train.micro_batch=8", "--set", f"train.steps={args.steps}",
        "--set", "train.eval_every=0", "--set", "run.log_every=1000", "--set", f"train.threads={threads}",
        "--set", f"run.dir={run_dir}"]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, check=True, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    m = ACTS.search(r.stdout + r.stderr)
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))][3:]  # skip the warm-up
    med = {k: statistics.median(x[k] for x in rows) for k in ("step_ms", "comm_ms", "tokens_per_s", "comm_bytes")}
    med["acts_mib"] = float(m.group(1)) if m else float("nan")
    return med


def table(title, results, cols):
    print(f"\n{title}")
    print("| " + " | ".join(["run"] + [c[0] for c in cols]) + " |")
    print("|" + "---|" * (len(cols) + 1))
    base = results[0][1]
    for name, r in results:
        cells = [f"{c[2](r[c[1]])} ({r[c[1]] / base[c[1]]:.2f}x)" if base[c[1]] else c[2](r[c[1]]) for c in cols]
        print("| " + " | ".join([name] + cells) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int_at_least(1), default=50)
    ap.add_argument("--threads", type=int_at_least(1), default=2)
    ap.add_argument("--latency-us", type=float_at_least(0), default=20)
    ap.add_argument("--gbps", type=float_above(0), default=1.0)
    ap.add_argument("--mpiexec", default="mpiexec")
    args = ap.parse_args()
    net = [f"comm.emulate.latency_us={args.latency_us}", f"comm.emulate.bandwidth_gbps={args.gbps}"]
    precisions = [("fp32", ["precision.compute=fp32"]), ("bf16", ["precision.compute=bf16"]),
                  ("fp16", ["precision.compute=fp16"])]
    with tempfile.TemporaryDirectory() as work:
        one = [(p, run(args, work, f"one_{p}", 1, s, args.threads)) for p, s in precisions]
        table(f"One rank, {args.threads} threads: activation memory and speed", one,
              [("peak activations", "acts_mib", lambda v: f"{v:.1f} MiB"),
               ("tokens/s", "tokens_per_s", lambda v: f"{v:.0f}"), ("step", "step_ms", lambda v: f"{v:.1f} ms")])
        dp = [(f"{p}, reduce {g}", run(args, work, f"dp_{p}_{g}", 2, s + net + ["parallel.dp=2",
                                                                             f"precision.grad_reduce={g}"]))
              for p, s in precisions[:2] for g in ("fp32", "bf16")]
        table(f"dp = 2, emulated {args.latency_us:g} us / {args.gbps:g} GB/s: the gradient reduction", dp,
              [("bytes sent per step", "comm_bytes", lambda v: f"{v / 1048576:.2f} MiB"),
               ("comm_ms", "comm_ms", lambda v: f"{v:.1f}"), ("tokens/s", "tokens_per_s", lambda v: f"{v:.0f}")])
        tp = [(p, run(args, work, f"tp_{p}", 2, s + net + ["parallel.tp=2", "parallel.dp=1"])) for p, s in precisions]
        table(f"tp = 2, emulated {args.latency_us:g} us / {args.gbps:g} GB/s: activation traffic in the compute dtype",
              tp, [("bytes sent per step", "comm_bytes", lambda v: f"{v / 1048576:.2f} MiB"),
                   ("comm_ms", "comm_ms", lambda v: f"{v:.1f}"), ("tokens/s", "tokens_per_s", lambda v: f"{v:.0f}")])


if __name__ == "__main__":
    main()
