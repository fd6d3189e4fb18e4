"""Time to a target validation loss (issue #16): the same model trained on tinyshakespeare by 4 data-parallel ranks
on a slow emulated link with one straggler, once per communication strategy, and for each the wall time, the bytes
sent and the steps until the validation loss first reaches the target.

Strategies: synchronous (overlapped buckets), overlap off, bf16 and PowerSGD compression, local SGD and DiLoCo
(every --sync-every steps), staleness 1 and 4, and comm.adapt (bucket size and compression among none, bf16,
powersgd). Each run evaluates every --eval-every steps; wall time is metrics.jsonl's elapsed_ms (the slowest rank's
time to the end of that step, evaluations included), bytes the cumulative comm_bytes (the busiest rank's payload).
The target: --target, or by default the synchronous run's validation loss at 3/4 of its steps.

The runs are one scripts/sweep.py sweep, a --point per strategy (its steps.csv, summary.csv and run folders under
--out, so scripts/plot.py draws them too). Writes OUT/time_to_loss.csv (one row per strategy) and, with
matplotlib, OUT/time_to_loss.png (validation loss against wall-clock time and against bytes sent); --plot
docs/figures/time_to_loss.png updates the documentation's figure.

Usage: /usr/bin/python3 bench/bench_time_to_loss.py [--steps 120] [--target LOSS] [--only sync,stale4] [--reuse]
About 6 minutes on a 2-core machine with the defaults (4 ranks share the 2 cores: one compute thread each).
"""
import argparse
import csv
import json
import os
import subprocess
import sys

from bench_cli import cpu_model, float_above, float_at_least, int_at_least, names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STRATEGIES = [  # name, label, settings
    ("sync", "synchronous", ["comm.overlap=true"]),
    ("no_overlap", "overlap off", ["comm.overlap=false"]),
    ("bf16", "bf16 compression", ["comm.compress=bf16"]),
    ("powersgd", "PowerSGD (rank 4)", ["comm.compress=powersgd"]),
    ("local_sgd", "local SGD", ["optim.sync_every={H}"]),
    ("diloco", "DiLoCo", ["optim.sync_every={H}", "optim.outer=nesterov"]),
    ("stale1", "staleness 1", ["optim.staleness=1"]),
    ("stale4", "staleness 4", ["optim.staleness=4"]),
    ("adapt", "adaptive", ["comm.adapt=true", "comm.adapt_compress=none,bf16,powersgd"]),
]


def sweep(args, chosen):
    """One scripts/sweep.py run, a --point per strategy; returns {name: its metrics rows}."""
    fixed = ["config=" + os.path.join(ROOT, "configs", "gpt.yaml"), "data.source=text",
             "data.path=" + os.path.join(ROOT, "data", "tinyshakespeare.txt"), "model.vocab_size=256",
             "train.global_batch=32", "train.micro_batch=8", f"train.steps={args.steps}",
             f"train.eval_every={args.eval_every}", "train.eval_batches=2", "optim.warmup_steps=10",
             f"comm.emulate.latency_us={args.latency_us}", f"comm.emulate.bandwidth_gbps={args.gbps}",
             "train.straggler.ranks=[3]", f"train.straggler.slowdown={args.slowdown}",
             f"train.straggler.delay_ms={args.delay_ms}", "train.straggler.delay_sigma=1", "run.log_every=1000",
             "run.checkpoint_every=0"]
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "sweep.py"), "--out", args.out, "--np", "4", "--threads", "1"]
    for f in fixed:
        key, value = f.split("=", 1)
        cmd += (["--config", value] if key == "config" else ["--set", f])
    for _, _, settings in chosen:
        cmd += ["--point", " ".join(x.format(H=args.sync_every) for x in settings)]
    if not args.reuse:
        p = subprocess.run(cmd)
        if p.returncode != 0:
            raise SystemExit(f"sweep failed: {' '.join(cmd)}")
    # summary.csv's settings name each strategy's point folder.
    points = {row["settings"]: row for row in csv.DictReader(open(os.path.join(args.out, "summary.csv")))}
    results = {}
    for name, label, settings in chosen:
        row = points.get(" ".join(x.format(H=args.sync_every) for x in settings))
        if row is None or row["status"] != "ok":
            why = row["error"] if row else "not in summary.csv"
            raise SystemExit(f"{label}: no successful run in {args.out} ({why})")
        results[name] = [json.loads(line) for line in open(os.path.join(args.out, row["point"], "metrics.jsonl"))]
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int_at_least(1), default=120)
    ap.add_argument("--eval-every", type=int_at_least(1), default=10)
    ap.add_argument("--target", type=float_above(0), default=None)
    ap.add_argument("--latency-us", type=float_at_least(0), default=100)
    ap.add_argument("--gbps", type=float_above(0), default=0.05, help="emulated link bandwidth (GB/s)")
    ap.add_argument("--slowdown", type=float_above(0), default=1.5, help="rank 3's compute slowdown")
    ap.add_argument("--delay-ms", type=float_at_least(0), default=10,
                    help="rank 3's mean per-step delay (log-normal, sigma 1)")
    ap.add_argument("--sync-every", type=int_at_least(1), default=4, help="local SGD and DiLoCo period")
    ap.add_argument("--only", type=names([s[0] for s in STRATEGIES]), default="", help="comma-separated strategy names")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "time_to_loss"))
    ap.add_argument("--plot", default=None,
                    help='the figure\'s path (default OUT/time_to_loss.png; docs/figures/time_to_loss.png to update '
                         'the documentation\'s); "" for none')
    ap.add_argument("--reuse", action="store_true", help="read the runs already in --out instead of training")
    args = ap.parse_args()
    if args.plot is None:
        args.plot = os.path.join(args.out, "time_to_loss.png")
    chosen = [s for s in STRATEGIES if not args.only or s[0] in args.only.split(",")]
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); 4 ranks, configs/gpt.yaml on tinyshakespeare, "
          f"{args.steps} steps, link {args.latency_us:g} us / {args.gbps:g} GB/s, rank 3 {args.slowdown:g}x slower "
          f"and {args.delay_ms:g} ms delays")
    results = sweep(args, chosen)
    for name, label, _ in chosen:
        evals = [r for r in results[name] if "val_loss" in r]
        print(f"  {label:<20} final val loss {evals[-1]['val_loss']:.4f}, {results[name][-1]['elapsed_ms'] / 1000:.1f} s")
    target = args.target
    if target is None:
        sync = [r for r in results.get("sync", next(iter(results.values()))) if "val_loss" in r]
        target = sync[(3 * len(sync)) // 4 - 1]["val_loss"]
    print(f"target validation loss {target:.4f}")
    table = []
    for name, label, _ in chosen:
        rows, sent = results[name], 0
        hit = None
        for r in rows:
            sent += r["comm_bytes"]
            if hit is None and r.get("val_loss", 1e9) <= target:
                hit = (r["elapsed_ms"] / 1000, sent / 1e6, r["step"])
        table.append({"strategy": label, "reached": hit is not None,
                      "wall_s": round(hit[0], 2) if hit else "", "mb_sent": round(hit[1], 1) if hit else "",
                      "steps": hit[2] if hit else "", "final_val_loss": round([r for r in rows if "val_loss" in r][-1]["val_loss"], 4),
                      "run_wall_s": round(rows[-1]["elapsed_ms"] / 1000, 2), "run_mb_sent": round(sent / 1e6, 1)})
    print(f"{'strategy':<20} {'wall s':>8} {'MB sent':>9} {'steps':>6} {'final val':>10} {'run s':>7} {'run MB':>8}")
    for t in table:
        print(f"{t['strategy']:<20} {str(t['wall_s'] or 'not reached'):>8} {str(t['mb_sent']):>9} {str(t['steps']):>6} "
              f"{t['final_val_loss']:>10} {t['run_wall_s']:>7} {t['run_mb_sent']:>8}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "time_to_loss.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    print(f"wrote {os.path.join(args.out, 'time_to_loss.csv')}")
    if not args.plot:
        return
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not found: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, label, _ in chosen:
        rows, sent, xs, bs, ys = results[name], 0, [], [], []
        for r in rows:
            sent += r["comm_bytes"]
            if "val_loss" in r:
                xs.append(r["elapsed_ms"] / 1000)
                bs.append(sent / 1e6)
                ys.append(r["val_loss"])
        a1.plot(xs, ys, marker="o", ms=3, label=label)
        a2.plot(bs, ys, marker="o", ms=3, label=label)
    for a, xl in ((a1, "wall-clock time (s)"), (a2, "MB sent by the busiest rank")):
        a.axhline(target, color="gray", ls="--", lw=1)
        a.set_xlabel(xl)
        a.set_ylabel("validation loss")
        a.grid(alpha=0.3)
    a2.set_xscale("log")
    finals = [r["val_loss"] for rows in results.values() for r in rows if "val_loss" in r]
    for a in (a1, a2):  # the first evaluations (during warm-up) would squash the rest
        a.set_ylim(min(finals) - 0.05, target + 1.0)
    a1.legend(fontsize=8)
    fig.suptitle(f"4 ranks, link {args.latency_us:g} us / {args.gbps:g} GB/s, one straggler "
                 f"({args.slowdown:g}x, {args.delay_ms:g} ms delays); dashed: target {target:.3f}", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
    fig.savefig(args.plot, dpi=120)
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
