#!/usr/bin/python3
"""Local SGD against synchronous data parallelism: final loss, bytes on the wire and step time, all measured in the
same run (issue #9).

The tinyshakespeare byte-level model (2 blocks, C = 64, T = 64, V = 256; global batch 16, 2 data-parallel ranks)
trains --steps steps on an emulated slow network (--latency-us, --gbps) once synchronously (gradients averaged
every step) and then with optim.sync_every = H for each --every (parameters averaged every H steps), with the
plain average and with DiLoCo's outer Nesterov step (outer lr 0.7, momentum 0.9). The inner optimizer is AdamW
throughout. Each row prints its ratio to the synchronous row: bytes per step (mean over the run), wall time per
step (from the end of step 3 to the last step's: the averages included), and the final training and validation
loss. --delay-ms D delays each rank before every step by a seeded log-normal amount of mean D ms (sigma 1,
train.straggler), as replicas on a shared machine are: synchronous training waits for the larger delay every
step, local SGD once per period.

Usage: /usr/bin/python3 bench/bench_local_sgd.py [--steps 500] [--every 4,16,64] [--latency-us 100] [--gbps 0.1]
                                                 [--delay-ms 0]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

from bench_cli import float_above, float_at_least, int_at_least, int_list

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = os.path.join(ROOT, "data", "tinyshakespeare.txt")
MODEL = ["data.source=text", f"data.path={TEXT}", "model.vocab_size=256", "model.n_layer=2", "model.n_head=4",
         "model.d_model=64", "model.seq_len=64", "train.global_batch=16", "train.micro_batch=4", "optim.lr=1e-3",
         "optim.warmup_steps=10", "train.eval_batches=8", "run.log_every=1000", "train.threads=1",
         "run.resume=none"]


def run(args, work, name, sets):
    run_dir = os.path.join(work, name)
    cmd = [args.mpiexec, "-n", "2", os.path.join(ROOT, "build", "trainer"), "--config",
           os.path.join(ROOT, "configs", "tiny.yaml")]
    for s in MODEL + [f"train.steps={args.steps}", f"train.eval_every={args.steps}",
                      f"comm.emulate.latency_us={args.latency_us}", f"comm.emulate.bandwidth_gbps={args.gbps}",
                      f"run.dir={run_dir}", f"train.straggler.delay_ms={args.delay_ms}",
                      "train.straggler.delay_sigma=1"] + sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return {"bytes": statistics.mean(r["comm_bytes"] for r in rows),
            "step_ms": (rows[-1]["elapsed_ms"] - rows[2]["elapsed_ms"]) / (len(rows) - 3),
            "loss": rows[-1]["loss"], "val": rows[-1].get("val_loss", float("nan"))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int_at_least(1), default=500)
    ap.add_argument("--every", type=int_list(1), default="4,16,64", help="comma-separated values of optim.sync_every")
    ap.add_argument("--latency-us", type=float_at_least(0), default=100)
    ap.add_argument("--gbps", type=float_above(0), default=0.1)
    ap.add_argument("--delay-ms", type=float_at_least(0), default=0,
                    help="mean of a log-normal delay before each step on each rank (0: none)")
    ap.add_argument("--mpiexec", default="mpiexec")
    args = ap.parse_args()
    cases = [("synchronous", [])]
    for h in (int(x) for x in args.every.split(",")):
        cases.append((f"H={h}, average", [f"optim.sync_every={h}"]))
        cases.append((f"H={h}, DiLoCo", [f"optim.sync_every={h}", "optim.outer=nesterov"]))
    with tempfile.TemporaryDirectory() as work:
        results = [(name, run(args, work, name.replace(" ", "").replace(",", "_").replace("=", ""), sets))
                   for name, sets in cases]
    print(f"dp = 2, {args.steps} steps, emulated {args.latency_us:g} us / {args.gbps:g} GB/s"
          f"{f', each rank delayed {args.delay_ms:g} ms (log-normal) before each step' if args.delay_ms else ''}; "
          f"ratios against synchronous")
    print("| run | bytes per step | wall ms per step | final loss | val loss |")
    print("|---|---|---|---|---|")
    base = results[0][1]
    for name, r in results:
        print(f"| {name} | {r['bytes']:,.0f} ({r['bytes'] / base['bytes']:.3f}x) | {r['step_ms']:.2f} "
              f"({r['step_ms'] / base['step_ms']:.2f}x) | {r['loss']:.4f} ({r['loss'] / base['loss']:.3f}x) | "
              f"{r['val']:.4f} ({r['val'] / base['val']:.3f}x) |")


if __name__ == "__main__":
    main()
