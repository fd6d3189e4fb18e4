"""ZeRO stages against each other on an emulated network link calibrated on the machine the benchmark runs on:
optim.zero 0 (all-reduce of gradient buckets), 1 (reduce-scatter of the gradient, sharded optimizer state, all-gather
of the parameters) and 2 (gradients reduce-scattered after every micro-batch's backward into per-rank shards, two
block-sized buffers in turn), plus zero 2 with optim.zero_reduce=step (one reduction on the last micro-batch, ZeRO-1's
machinery) when a step has more than one micro-batch, and 3 (zero 2's gradients, and the parameters sharded too: each
block all-gathered before each forward and backward pass, the next one prefetched), plus zero 3 with
parallel.reshard_after_forward=false ("zero3-keep": each block gathered once per step and kept to its end). With
--sublayer, zero 2 and 3 again with optim.zero_unit=sublayer ("zero2-sub", "zero3-sub": each block three units, a
third of a block each, in the two ring slots).

For each --dp (default 2,4) ranks train configs/gpt.yaml (GPT-2, L=4, C=128, T=64, V=256, ~0.83M parameters, 3.3 MB
of fp32 gradients) with micro-batches of 8 sequences, M of them per rank and step (--micro-batches, default 1; a
comma list runs each; train.global_batch = 8 * dp * M). One dp:

  1. calibration: zero 0, overlap off, no emulation, bucket 25 MiB, M=1. compute = the median step_ms; n = the
     median comm_bytes (the whole gradient's all-reduce payload plus a few scalars).
  2. the link: latency --latency-us (alpha), and the bandwidth chosen so that the serial ring all-reduce of the
     whole gradient, 2(p-1)(alpha + n/p * beta), costs --comm-fraction (0.6) of that compute (p = dp). The link is
     fixed for the dp, so with M > 1 the per-micro-batch reductions of zero 2 cost M times theirs against the same
     link while the compute grows M times too.
  3. --runs (3) times the sequence [zero 0, zero 1, zero 2, (zero 2 reduce=step), zero 3, zero 3 keep] for each M,
     interleaved so that
     drift on the machine hits every arm alike; overlap on, comm.bucket_mb = --bucket-mb (0.25).

Each row gives, per (dp, M, arm), the median over runs of each run's medians over steps 6..N of metrics.jsonl:
step_ms, comm_ms (time at least one collective was in flight), exposed_comm_ms (time the compute thread waited for
communication, the maximum over ranks), exposed/comm, and "own": the slowest rank's own exposed communication over
comm (slowest_exposed_comm_ms, without the other ranks' wait for that rank, which no ZeRO stage changes); the step
time against zero 1's in the same run (median, and
min..max across runs); and gradients + optimizer state per rank in MiB, from the trainer's "memory per rank" line, so
the memory each stage saves is beside what it costs (parameters too, which only zero 3 shards). Beside zero 2's and
zero 3's rows: the bars, step within 1.15x of zero 1 and exposed/comm <= 0.30 (reported as met or missed, never a
failure); and build/planner's prediction of the arm's step time on the same link, made in every run before its arms
(the planner times its own passes, so a drift of the machine's speed between runs moves its prediction too): the
median of the predictions, its error against the measured median, and the range of each run's own error. With
dp > cores the ranks are oversubscribed and compete for cores with the communication threads: read those rows as a
stress case.

Usage: /usr/bin/python3 bench/bench_zero.py [--dp 2,4] [--micro-batches 1] [--runs 3] [--steps 25] [--sublayer]
           [--latency-us 20] [--comm-fraction 0.6] [--bucket-mb 0.25] [--backend auto|shm|mpi]
           [--comm-wait auto|poll|block] [--thread-priority auto|realtime|normal] [--threads N] [--json PATH]
           [--runtime FILE]
Defaults: 2 x (1 + 3 x 5) trainer runs and 2 x 3 planner runs (about 20 s each), about 15 minutes on a 2-core
machine; timings mean something only on an idle machine.
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

from bench_cli import cpu_model, float_above, float_at_least, int_at_least, int_list

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 5  # metrics rows skipped: allocations, first buckets, lr warm-up has no effect on timing
STEP_BAR, EXPOSED_BAR = 1.15, 0.30  # zero 2 and 3: step <= 1.15x zero 1's, exposed/comm <= 0.30
MEMORY = re.compile(r"memory per rank: parameters ([0-9.]+) MiB \([^)]*\), gradients ([0-9.]+) MiB, "
                    r"optimizer state ([0-9.]+) MiB \((\d+) bytes\)")


def arms(m, sublayer=False):
    """(name, optim.zero, optim.zero_reduce or None, parallel.reshard_after_forward, optim.zero_unit) of each arm at m
    micro-batches per step; with sublayer, zero 2 and 3 with sub-block units too ("zero2-sub", "zero3-sub")."""
    a = [("zero0", 0, None, True, "block"), ("zero1", 1, None, True, "block"),
         ("zero2", 2, "micro_batch", True, "block")]
    a += [("zero2-step", 2, "step", True, "block")] if m > 1 else []
    a += [("zero3", 3, None, True, "block"), ("zero3-keep", 3, None, False, "block")]
    return a + ([("zero2-sub", 2, "micro_batch", True, "sublayer"), ("zero3-sub", 3, None, True, "sublayer")]
                if sublayer else [])


def run(tag, args, work, dp, m, zero, reduce, bucket_mb, overlap, bandwidth_gbps=0.0, latency_us=0.0, reshard=True,
        unit="block"):
    """One trainer run; returns the medians over steps WARMUP+1..N, the memory line's figures (or None) and the log."""
    run_dir = os.path.join(work, tag)
    cmd = ["mpiexec", "-n", str(dp), os.path.join(ROOT, "build", "trainer"), "--config",
           os.path.join(ROOT, "configs", "gpt.yaml"), "--set", f"parallel.dp={dp}",
           "--set", f"train.global_batch={8 * dp * m}", "--set", "train.micro_batch=8",
           "--set", f"train.steps={args.steps}", "--set", "train.eval_every=0", "--set", f"optim.zero={zero}",
           "--set", f"comm.bucket_mb={bucket_mb}", "--set", f"comm.overlap={'true' if overlap else 'false'}",
           "--set", f"comm.emulate.bandwidth_gbps={bandwidth_gbps}", "--set", f"comm.emulate.latency_us={latency_us}",
           "--set", f"comm.backend={args.backend}", "--set", f"comm.wait={args.comm_wait}",
           "--set", f"comm.thread_priority={args.thread_priority}",
           "--set", "run.log_every=1000", "--set", "run.checkpoint_every=0", "--set", f"run.dir={run_dir}"]
    if reduce:
        cmd += ["--set", f"optim.zero_reduce={reduce}"]
    if not reshard:
        cmd += ["--set", "parallel.reshard_after_forward=false"]
    if unit != "block":
        cmd += ["--set", f"optim.zero_unit={unit}"]
    env = dict(os.environ)
    if args.threads:
        cmd += ["--set", f"train.threads={args.threads}"]
        env["OMP_NUM_THREADS"] = str(args.threads)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"trainer failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))][WARMUP:]
    if not rows:
        raise SystemExit(f"--steps {args.steps} leaves no steps after the {WARMUP} warm-up steps")
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if isinstance(rows[0][k], (int, float))}
    log = p.stdout + p.stderr
    mm = MEMORY.search(log)
    mem = ({"param_mib": float(mm.group(1)), "grad_mib": float(mm.group(2)), "optim_mib": int(mm.group(4)) / 1048576.0}
           if mm else None)
    return med, mem, log


def calibrate(args, work, dp):
    """Step 1 and 2 for this dp: returns the link (bandwidth GB/s) and what it was chosen from."""
    cal, _, log = run(f"dp{dp}_calibrate", args, work, dp, 1, 0, None, 25, False)
    compute_ms, n = cal["step_ms"], cal["comm_bytes"]
    m = re.search(r"([0-9.]+)M parameters", log)
    params = f"{m.group(1)}M parameters, " if m else ""
    p, alpha = dp, args.latency_us
    beta = (args.comm_fraction * compute_ms * 1e3 / (2 * (p - 1)) - alpha) / (n / p)  # us per byte
    if beta <= 0:
        raise SystemExit(f"--latency-us {alpha} alone exceeds {args.comm_fraction} of the compute "
                         f"({compute_ms:.1f} ms)")
    bw = 1e-3 / beta  # GB/s: beta = 1e6 / (bw * 1e9) us per byte
    pred_ms = 2 * (p - 1) * (alpha + n / p * beta) / 1e3
    print(f"[dp {dp}] calibration (zero 0, overlap off, no emulation, M=1): step {compute_ms:.1f} ms; {params}"
          f"comm_bytes {n / 1e6:.3f} MB/step")
    print(f"[dp {dp}] emulated link: {alpha:g} us, {bw:.4f} GB/s -> serial all-reduce of {n / 1e6:.3f} MB over {p} "
          f"ranks = {pred_ms:.1f} ms = {args.comm_fraction:g} x compute", flush=True)
    return {"bandwidth_gbps": bw, "latency_us": alpha, "compute_ms": compute_ms, "grad_bytes": n,
            "allreduce_ms": pred_ms}


def predict(args, dp, m, link):
    """build/planner's step_ms for each arm of (dp, M) on the calibrated link (the 1f1b row of that layout)."""
    out = {}
    variants = [("micro_batch", "block")] + ([("step", "block")] if m > 1 else [])
    for reduce, unit in variants + ([("micro_batch", "sublayer")] if args.sublayer else []):
        cmd = [os.path.join(ROOT, "build", "planner"), "--config", os.path.join(ROOT, "configs", "gpt.yaml"),
               "--world", str(dp), "--json"] + (["--runtime", args.runtime] if args.runtime else [])
        for s in (f"train.global_batch={8 * dp * m}", "train.eval_every=0", f"comm.bucket_mb={args.bucket_mb}",
                  f"comm.emulate.bandwidth_gbps={link['bandwidth_gbps']}",
                  f"comm.emulate.latency_us={link['latency_us']}", f"optim.zero_reduce={reduce}",
                  f"optim.zero_unit={unit}"):
            cmd += ["--set", s]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"planner failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
        for r in json.loads(p.stdout):
            if (r["dp"], r["tp"], r["pp"], r["schedule"], r["micro_batch"]) != (dp, 1, 1, "1f1b", 8):
                continue
            name = {0: "zero0", 1: "zero1", 2: "zero2" if reduce == "micro_batch" else "zero2-step",
                    3: "zero3"}[r["zero"]]
            if unit == "sublayer":
                if r["zero"] >= 2:
                    out[name + "-sub"] = r["step_ms"]
            elif reduce == "micro_batch" or name == "zero2-step":
                out[name] = r["step_ms"]
    return out


def summarize(dp, m, link, per_run, predicted, sublayer):
    """Rows for one (dp, M): per_run[k][arm name] = (medians, memory) of run k; predicted[k][arm name] = the planner's
    step_ms in run k."""
    rows = []
    for name, zero, reduce, _, _ in arms(m, sublayer):
        meds = [r[name][0] for r in per_run]
        ratios = [r[name][0]["step_ms"] / r["zero1"][0]["step_ms"] for r in per_run]
        shares = [x["exposed_comm_ms"] / max(x["comm_ms"], 1e-9) for x in meds]
        # The slowest rank's own wait: without the others' wait for it, which no ZeRO stage changes.
        own = [x.get("slowest_exposed_comm_ms", x["exposed_comm_ms"]) / max(x["comm_ms"], 1e-9) for x in meds]
        row = {"dp": dp, "micro_batches": m, "arm": name, "zero": zero, "zero_reduce": reduce, "link": link,
               "runs": [{k: x[k] for k in ("step_ms", "comm_ms", "exposed_comm_ms", "compute_ms", "comm_bytes")
                         if k in x} for x in meds],
               "step_ms": statistics.median(x["step_ms"] for x in meds),
               "comm_ms": statistics.median(x["comm_ms"] for x in meds),
               "exposed_comm_ms": statistics.median(x["exposed_comm_ms"] for x in meds),
               "exposed_over_comm": statistics.median(shares), "own_exposed_over_comm": statistics.median(own),
               "step_vs_zero1": statistics.median(ratios), "step_vs_zero1_min": min(ratios),
               "step_vs_zero1_max": max(ratios), "memory": per_run[0][name][1],
               "planner_runs": [p[name] for p in predicted if name in p]}
        row["planner_step_ms"] = statistics.median(row["planner_runs"]) if row["planner_runs"] else None
        row["planner_error_runs"] = [pr[name] / x["step_ms"] - 1 for pr, x in zip(predicted, meds) if name in pr]
        if zero >= 2:
            row["bars"] = {"step_vs_zero1_max": STEP_BAR, "step_met": row["step_vs_zero1"] <= STEP_BAR,
                           "exposed_over_comm_max": EXPOSED_BAR,
                           "exposed_met": row["exposed_over_comm"] <= EXPOSED_BAR}
        rows.append(row)
    return rows


def print_table(rows, runs):
    print(f"{'dp':>3} {'M':>2} {'arm':<10} {'step_ms':>8} {'comm_ms':>8} {'exposed':>8} {'exp/comm':>8} {'own':>5} "
          f"{'vs zero1':>8} {f'min..max ({runs} runs)':>18} {'param MiB':>9} {'grad MiB':>8} {'optim MiB':>9} "
          f"{'total':>8} "
          f"{'planner':>8} {'error (runs)':>16}  bars")
    for r in rows:
        mem = r["memory"]
        mems = (f"{mem['param_mib']:9.2f} {mem['grad_mib']:8.2f} {mem['optim_mib']:9.2f} "
                f"{mem['param_mib'] + mem['grad_mib'] + mem['optim_mib']:8.2f}" if mem
                else f"{'?':>9} {'?':>8} {'?':>9} {'?':>8}")
        line = (f"{r['dp']:>3} {r['micro_batches']:>2} {r['arm']:<10} {r['step_ms']:8.1f} {r['comm_ms']:8.1f} "
                f"{r['exposed_comm_ms']:8.1f} {r['exposed_over_comm']:8.2f} {r['own_exposed_over_comm']:5.2f} "
                f"{r['step_vs_zero1']:7.2f}x "
                f"{format(r['step_vs_zero1_min'], '.2f') + '..' + format(r['step_vs_zero1_max'], '.2f') + 'x':>18} "
                f"{mems}")
        pl = r["planner_step_ms"]
        errs = r["planner_error_runs"]
        line += (f" {pl:8.1f} {100 * (pl - r['step_ms']) / r['step_ms']:+5.0f}% "
                 f"({100 * min(errs):+.0f}..{100 * max(errs):+.0f}%)" if pl else f" {'?':>8} {'':>16}")
        if "bars" in r:
            b = r["bars"]
            line += (f"  step <= {STEP_BAR:.2f}x zero1: {'met' if b['step_met'] else 'MISSED'}; "
                     f"exposed/comm <= {EXPOSED_BAR:.2f}: {'met' if b['exposed_met'] else 'MISSED'}")
        elif r["arm"] == "zero1":
            line += "  (baseline)"
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dp", type=int_list(2), default="2,4", help="data-parallel ranks (mpiexec -n), comma list")
    ap.add_argument("--micro-batches", type=int_list(1), default="1",
                    help="micro-batches of 8 sequences per rank and step (gradient accumulation), comma list")
    ap.add_argument("--runs", type=int_at_least(1), default=3, help="interleaved repetitions of the arms")
    ap.add_argument("--steps", type=int_at_least(WARMUP + 1), default=25,
                    help=f"steps per run; the first {WARMUP} are not counted")
    ap.add_argument("--latency-us", type=float_at_least(0), default=20)
    ap.add_argument("--comm-fraction", type=float_above(0), default=0.6,
                    help="serial all-reduce time of the whole gradient on the emulated link / compute time")
    ap.add_argument("--bucket-mb", type=float_above(0), default=0.25, help="comm.bucket_mb of the measured runs")
    ap.add_argument("--backend", choices=["auto", "shm", "mpi"], default="auto", help="comm.backend: auto | shm | mpi")
    ap.add_argument("--comm-wait", choices=["auto", "poll", "block"], default="auto",
                    help="comm.wait (MPI transport): auto | poll | block")
    ap.add_argument("--thread-priority", choices=["auto", "realtime", "normal"], default="auto",
                    help="comm.thread_priority: auto | realtime | normal")
    ap.add_argument("--threads", type=int_at_least(0), default=0,
                    help="train.threads and OMP_NUM_THREADS for the runs (0: leave both to the user's defaults)")
    ap.add_argument("--sublayer", action="store_true",
                    help="also zero 2 and 3 with optim.zero_unit=sublayer (arms zero2-sub and zero3-sub)")
    ap.add_argument("--json", default="", help="write every row (and each run's figures) to this JSON file")
    ap.add_argument("--runtime", default="", help="the planner's runtime constants for this machine "
                    "(scripts/validate_planner.py --fit FILE); default: its built-in defaults")
    args = ap.parse_args()
    dps = [int(x) for x in args.dp.split(",")]
    ms = [int(x) for x in args.micro_batches.split(",")]

    cores = os.cpu_count() or 1
    command = shlex.join([sys.executable] + sys.argv)
    print(f"command: {command}")
    print(f"CPU: {cpu_model()} ({cores} cores visible)")
    threads = (f"train.threads={args.threads}, OMP_NUM_THREADS={args.threads}" if args.threads else
               f"train.threads=0 (default), OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"configs/gpt.yaml, micro-batch 8, M = {args.micro_batches} per rank and step, {args.steps} steps (medians "
          f"of steps {WARMUP + 1}..{args.steps}), {args.runs} interleaved runs; overlap on, comm.bucket_mb="
          f"{args.bucket_mb:g}, comm.backend={args.backend}, comm.wait={args.comm_wait}, comm.thread_priority="
          f"{args.thread_priority}, {threads}")
    print(f"bars (zero 2 and 3): step <= {STEP_BAR:.2f}x zero 1's in the same run, exposed/comm <= {EXPOSED_BAR:.2f}")
    all_rows = []
    with tempfile.TemporaryDirectory() as work:
        for dp in dps:
            print()
            if dp > cores:
                print(f"[dp {dp}] {dp} ranks on {cores} cores: oversubscribed")
            link = calibrate(args, work, dp)
            per_run = {m: [] for m in ms}
            predicted = {m: [] for m in ms}
            for k in range(args.runs):
                for m in ms:
                    # The planner times its passes when it starts: predicting in every run, beside the arms it
                    # predicts, keeps a drift of the machine's speed out of its error.
                    predicted[m].append(predict(args, dp, m, link))
                    res = {}
                    for name, zero, reduce, reshard, unit in arms(m, args.sublayer):
                        med, mem, _ = run(f"dp{dp}_m{m}_{name}_r{k}", args, work, dp, m, zero, reduce,
                                          args.bucket_mb, True, link["bandwidth_gbps"], link["latency_us"], reshard,
                                          unit)
                        res[name] = (med, mem)
                    per_run[m].append(res)
                print(f"[dp {dp}] run {k + 1}/{args.runs}: " + "; ".join(
                    f"M={m} " + " ".join(f"{n} {x[0]['step_ms']:.1f}" for n, x in per_run[m][-1].items())
                    for m in ms) + " (step_ms)", flush=True)
            rows = [r for m in ms for r in summarize(dp, m, link, per_run[m], predicted[m], args.sublayer)]
            print_table(rows, args.runs)
            all_rows += rows

    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": command, "cpu": cpu_model(), "cores": cores, "steps": args.steps,
                       "warmup": WARMUP, "runs": args.runs, "bucket_mb": args.bucket_mb, "rows": all_rows}, f,
                      indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
