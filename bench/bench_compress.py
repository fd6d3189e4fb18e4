"""Gradient compression of the data-parallel reduction (comm.compress, docs/compression.md): what each method
costs in final loss and saves in bytes and time, against the uncompressed reduction measured in the same run.

The byte-level tinyshakespeare model of tests/py/test_mixed_precision.py (2 blocks, 4 heads, C = 64, T = 64,
vocab 256; global batch 16 of micro-batches of 4, lr 1e-3) trains for --steps steps on dp = 2 (mpiexec -n 2, one
compute thread per rank) over an emulated slow link (--latency-us, --gbps), once per method: none, bf16, int8,
topk (--topk-fraction), powersgd (--powersgd-rank). Validation: the held-out tail of the text (data.val_fraction),
evaluated at the last step. Per method the table gives
  - train loss: the mean training loss of the last 10 steps (one step's loss is a single batch: noisy);
  - val loss at the end;
  - bytes per step: metrics.jsonl's comm_bytes (payload bytes the busiest rank contributed to every collective
    of the step: the gradient reduction plus a few scalars), median over the steps;
  - step_ms, comm_ms (time at least one collective was in flight) and exposed_comm_ms, medians over the steps
    after the first 5;
each with its ratio to `none`. A method whose bytes equal none's has not been applied (a trainer that does not
know comm.compress): the bench says so.

Usage: /usr/bin/python3 bench/bench_compress.py [--steps 500] [--latency-us 100] [--gbps 0.01] [--bucket-mb 0.1]
           [--topk-fraction 0.01] [--powersgd-rank 4] [--methods none,bf16,int8,topk,powersgd] [--keep DIR]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_cli import COMPRESSIONS, float_above, float_at_least, int_at_least, names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, work, method):
    run_dir = os.path.join(work, method)
    sets = ["data.source=text", f"data.path={os.path.join(ROOT, 'data', 'tinyshakespeare.txt')}",
            "model.vocab_size=256", "model.n_layer=2", "model.n_head=4", "model.d_model=64", "model.seq_len=64",
            "train.global_batch=16", "train.micro_batch=4", f"train.steps={args.steps}",
            f"train.eval_every={args.steps}", "train.eval_batches=16", "optim.lr=1e-3", "optim.warmup_steps=10",
            "parallel.dp=2", f"comm.bucket_mb={args.bucket_mb}", f"comm.emulate.latency_us={args.latency_us}",
            f"comm.emulate.bandwidth_gbps={args.gbps}", f"comm.compress={method}",
            f"comm.topk_fraction={args.topk_fraction}", f"comm.powersgd_rank={args.powersgd_rank}",
            "run.log_every=1000", f"run.dir={run_dir}"]
    cmd = [args.mpiexec, "-n", "2", args.trainer, "--config", os.path.join(ROOT, "configs", "tiny.yaml")]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        sys.exit(f"{method}: the trainer exited with {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    timed = rows[5:] if len(rows) > 6 else rows
    out = {k: statistics.median(x[k] for x in timed) for k in ("step_ms", "comm_ms", "exposed_comm_ms")}
    out["comm_bytes"] = statistics.median(x["comm_bytes"] for x in rows)
    out["loss"] = statistics.mean(x["loss"] for x in rows[-10:])
    out["val_loss"] = next((x["val_loss"] for x in reversed(rows) if "val_loss" in x), float("nan"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int_at_least(1), default=500)
    ap.add_argument("--latency-us", type=float_at_least(0), default=100)
    ap.add_argument("--gbps", type=float_above(0), default=0.01,
                    help="emulated link bandwidth, GB/s (0.01 = 80 Mbit/s)")
    ap.add_argument("--bucket-mb", type=float_above(0), default=0.1)
    ap.add_argument("--topk-fraction", type=float_above(0), default=0.01)
    ap.add_argument("--powersgd-rank", type=int_at_least(1), default=4)
    ap.add_argument("--methods", type=names(COMPRESSIONS), default="none,bf16,int8,topk,powersgd")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--trainer", default=os.path.join(ROOT, "build", "trainer"))
    ap.add_argument("--keep", default="", help="write the runs here instead of a temporary directory")
    args = ap.parse_args()
    methods = args.methods.split(",")
    if methods[0] != "none":
        methods = ["none"] + [m for m in methods if m != "none"]

    def bench(work):
        results = []
        for m in methods:
            results.append((m, run(args, work, m)))
            r = results[-1][1]
            print(f"  {m}: loss {r['loss']:.4f}, val {r['val_loss']:.4f}, {r['comm_bytes']:.0f} B/step, "
                  f"{r['step_ms']:.1f} ms/step", flush=True)
        return results

    print(f"dp = 2, {args.steps} steps, emulated link {args.latency_us:g} us / {args.gbps:g} GB/s, buckets of "
          f"{args.bucket_mb:g} MB; topk fraction {args.topk_fraction:g}, powersgd rank {args.powersgd_rank}",
          flush=True)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        results = bench(args.keep)
    else:
        with tempfile.TemporaryDirectory() as work:
            results = bench(work)

    base = results[0][1]
    cols = [("train loss (last 10)", "loss", "{:.4f}"), ("val loss", "val_loss", "{:.4f}"),
            ("bytes / step", "comm_bytes", "{:.0f}"), ("step ms", "step_ms", "{:.1f}"),
            ("comm ms", "comm_ms", "{:.1f}"), ("exposed comm ms", "exposed_comm_ms", "{:.1f}")]
    print()
    print("| method | " + " | ".join(c[0] for c in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, r in results:
        cells = []
        for _, key, fmt in cols:
            ratio = r[key] / base[key] if base[key] else float("nan")
            cells.append(f"{fmt.format(r[key])} ({ratio:.2f}x)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    ignored = [n for n, r in results[1:] if r["comm_bytes"] == base["comm_bytes"]]
    if ignored:
        print(f"\nWARNING: {', '.join(ignored)} sent as many bytes as none: the trainer did not apply comm.compress")


if __name__ == "__main__":
    main()
