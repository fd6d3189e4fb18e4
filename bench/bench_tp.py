"""Tensor parallelism: per-rank memory and step time against tp (issue #4).

For tp = 1, 2 and 4 (tp must divide model.n_head; configs/gpt.yaml has 4 heads) the trainer runs
configs/gpt.yaml on tp ranks (dp = 1) with one micro-batch of 8 sequences per step. It prints:
  - per-rank parameter, gradient, optimizer-state and activation memory from the trainer's "memory per rank" log
    line, next to the tp = 1 value / tp (the ideal if everything were sharded) and, for parameters, gradients
    and optimizer state, the exact expectation: the sharded tensors (wte, c_attn, attn.c_proj.weight, c_fc,
    mlp.c_proj.weight; wte's vocabulary padded to a multiple of tp) / tp plus the replicated ones (wpe, the
    LayerNorms, the row-parallel biases) in full;
  - tokens/s and the median over steps 6..N (metrics.jsonl) of step_ms, compute_ms, comm_ms and exposed_comm_ms.

Every rank runs one compute thread; tp = 1 is also timed with --tp1-threads (default 2) threads, the cores
tp = 2 uses, for a same-core comparison.

Usage: /usr/bin/python3 bench/bench_tp.py [--steps 30] [--tps 1,2,4] [--tp1-threads 2] [--mpiexec mpiexec]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

from bench_cli import int_at_least, int_list

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1048576.0
MEM = re.compile(r"memory per rank: parameters ([\d.]+) MiB \(\w+\), gradients ([\d.]+) MiB, optimizer state "
                 r"([\d.]+) MiB \((\d+) bytes\)")
# One micro-batch per step: the peak is one activation record.
ACTS = re.compile(r"peak activations ([\d.]+) MiB")  # the first line: pipeline stage 0, or the only one


def expected_numel(tp, L=4, C=128, T=64, V=256):
    """Parameters per rank of configs/gpt.yaml's model under tensor parallelism tp."""
    vpad = -(-V // tp) * tp
    sharded = vpad * C + L * (C * 3 * C + 3 * C + C * C + C * 4 * C + 4 * C + 4 * C * C)
    replicated = T * C + L * (2 * C + 2 * C + C + C) + 2 * C
    return sharded // tp + replicated


def run(tp, args, work, threads=1):
    run_dir = os.path.join(work, f"tp{tp}_t{threads}")
    cmd = [args.mpiexec, "-n", str(tp), os.path.join(ROOT, "build", "trainer"), "--config",
           os.path.join(ROOT, "configs", "gpt.yaml"), "--set", f"parallel.tp={tp}", "--set", "parallel.dp=1",
           "--set", "train.global_batch=8", "--set", "train.micro_batch=8", "--set", f"train.steps={args.steps}",
           "--set", "train.eval_every=0", "--set", "run.log_every=1000", "--set", f"train.threads={threads}",
           "--set", f"run.dir={run_dir}"]
    r = subprocess.run(cmd, check=True, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    m, a = MEM.search(r.stdout + r.stderr), ACTS.search(r.stdout + r.stderr)
    if not m or not a:
        raise SystemExit(f"tp={tp}: no 'memory per rank' or 'peak activations' line in the trainer's output")
    params, grads, _, opt_bytes = m.groups()
    acts = a.group(1)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))][5:]
    med = {k: statistics.median(r[k] for r in rows)
           for k in ("step_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "tokens_per_s")}
    return {"params": float(params), "grads": float(grads), "opt": int(opt_bytes) / MIB, "acts": float(acts)}, med


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int_at_least(1), default=30)
    ap.add_argument("--tps", type=int_list(1), default="1,2,4")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--tp1-threads", type=int_at_least(1), default=2,
                    help="also time tp = 1 with this many compute threads (the cores tp = 2 uses); 1 = skip")
    args = ap.parse_args()
    tps = [int(x) for x in args.tps.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for tp in tps:
            results[tp] = run(tp, args, work)
        if args.tp1_threads > 1:
            wide = run(1, args, work, args.tp1_threads)
    base = results[tps[0]][0] if tps[0] == 1 else None
    print(f"configs/gpt.yaml (n_head 4, d_model 128, 4 layers), dp 1, one micro-batch of 8 x 64 tokens, "
          f"1 thread per rank; medians of steps 6-{args.steps}")
    print("memory per rank, MiB: measured (expected: sharded/tp + replicated | tp=1 value / tp)")
    print(f"{'tp':>3} {'parameters':>24} {'gradients':>24} {'optimizer':>24} {'activations':>18}")
    for tp in tps:
        mem, _ = results[tp]
        exp_p = expected_numel(tp) * 4 / MIB
        cell = lambda k, e: f"{mem[k]:6.2f} ({e:5.2f} | {base[k] / tp:5.2f})" if base else f"{mem[k]:6.2f}"
        acts = f"{mem['acts']:6.2f} (- | {base['acts'] / tp:5.2f})" if base else f"{mem['acts']:6.2f}"
        print(f"{tp:>3} {cell('params', exp_p):>24} {cell('grads', exp_p):>24} {cell('opt', 2 * exp_p):>24} "
              f"{acts:>18}")
    print(f"{'tp':>13} {'tokens/s':>9} {'step_ms':>8} {'compute_ms':>10} {'comm_ms':>8} {'exposed_comm_ms':>15}")
    timed = [(str(tp), results[tp][1]) for tp in tps]
    if args.tp1_threads > 1:
        timed.insert(1, (f"1 ({args.tp1_threads} threads)", wide[1]))
    for tp, t in timed:
        print(f"{tp:>13} {t['tokens_per_s']:9.0f} {t['step_ms']:8.1f} {t['compute_ms']:10.1f} {t['comm_ms']:8.1f} "
              f"{t['exposed_comm_ms']:15.1f}")


if __name__ == "__main__":
    main()
