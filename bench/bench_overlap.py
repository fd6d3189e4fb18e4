"""Overlap of the data-parallel gradient all-reduce with the backward pass, on an emulated network link that is
calibrated on the machine the benchmark runs on (issue #3, performance (a)).

--dp ranks (default 2) train configs/gpt.yaml (GPT-2, L=4, C=128, T=64, V=256, ~0.83M parameters, 3.3 MB of fp32
gradients) with one micro-batch of 8 sequences per rank (train.global_batch = 8 * dp). One measurement:

  1. calibration: overlap off, no emulation, bucket 25 MiB. compute = the median step_ms; n = the median
     comm_bytes (the payload the busiest rank sent in a step: the whole gradient plus a few scalars).
  2. the link: latency --latency-us (alpha), and the bandwidth chosen so that the serial ring all-reduce of the
     whole gradient, 2(p-1)(alpha + n/p * beta), costs --comm-fraction (0.6) of that compute (p = dp).
  3. baseline: overlap off on that link (bucket 25 MiB: one all-reduce of the whole gradient after the backward).
  4. overlap on, on the same link, for every --buckets size (comm.bucket_mb, default 0.25,0.5,1,2).

Each run prints the medians over steps 6..N of metrics.jsonl: step_ms, comm_ms (time at least one collective was in
flight), exposed_comm_ms (time the compute thread waited for communication, the maximum over ranks), comm_cpu_ms (CPU
time of the communication threads, when the trainer writes it), exposed/comm, the step time against the baseline
of the same measurement, and the share of the serial all-reduce that overlap hid, (baseline step - step) / the
emulated all-reduce time, with the bars beside them. Oversubscribed runs also print the slowest rank's own exposed
communication over comm (slowest_exposed_comm_ms: without the other ranks' wait for that rank), for information:
  dp 2 (a core per rank):            exposed/comm <= 0.30 and step <= 0.80x the non-overlapped step
  dp 4 on 2 cores (oversubscribed):  exposed/comm <= 0.50 and hidden >= 0.50 (at least half of it hidden)
(in general: dp <= cores gets the dp 2 bars, dp > cores the oversubscribed ones). The ideal step ratio here is about
1/1.6 = 0.63x (all communication hidden behind a backward pass longer than it). --runs N repeats the whole
measurement (calibration included) N times and ends with the min and max across runs per bucket. With --plot and
matplotlib, the sweep (median over runs, min..max as error bars) goes into a PNG.

comm.thread_priority stays at its default (auto: real-time communication threads where the OS permits them) unless
--thread-priority says otherwise; the header says which the runs got.
train.threads stays at its default (0: OMP_NUM_THREADS if set, else cores / ranks) and the runs inherit this
process's environment unchanged (OMP_NUM_THREADS is not set for them), so the user's defaults are what is measured;
--threads N sets train.threads=N and OMP_NUM_THREADS=N instead.

Usage: /usr/bin/python3 bench/bench_overlap.py [--dp 2] [--runs 1] [--steps 25] [--latency-us 20]
           [--comm-fraction 0.6] [--buckets 0.25,0.5,1,2] [--backend auto|shm|mpi] [--comm-wait auto|poll|block]
           [--thread-priority auto|realtime|normal] [--threads N] [--plot docs/figures/bucket_sweep.png]
Two ranks, defaults: ~1 minute per measurement on a 2-core machine; timings are only meaningful on an idle machine.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

from bench_cli import cpu_model, float_above, float_at_least, float_list_above, int_at_least

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 5  # metrics rows skipped: allocations, first buckets, lr warm-up has no effect on timing


def run(tag, args, work, bucket_mb, overlap, bandwidth_gbps=0.0, latency_us=0.0):
    """One trainer run; returns the medians over steps WARMUP+1..N and the trainer's log."""
    run_dir = os.path.join(work, tag)
    cmd = ["mpiexec", "-n", str(args.dp), os.path.join(ROOT, "build", "trainer"), "--config",
           os.path.join(ROOT, "configs", "gpt.yaml"), "--set", f"parallel.dp={args.dp}",
           "--set", f"train.global_batch={8 * args.dp}", "--set", "train.micro_batch=8",
           "--set", f"train.steps={args.steps}", "--set", "train.eval_every=0",
           "--set", f"comm.bucket_mb={bucket_mb}", "--set", f"comm.overlap={'true' if overlap else 'false'}",
           "--set", f"comm.emulate.bandwidth_gbps={bandwidth_gbps}", "--set", f"comm.emulate.latency_us={latency_us}",
           "--set", f"comm.backend={args.backend}", "--set", f"comm.wait={args.comm_wait}",
           "--set", f"comm.thread_priority={args.thread_priority}",
           "--set", "run.log_every=1000", "--set", "run.checkpoint_every=0", "--set", f"run.dir={run_dir}"]
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
    return med, p.stdout + p.stderr


def bars(args):
    """(exposed/comm bar, step-ratio bar or None, hidden-share bar or None) for this dp on this machine."""
    if args.dp > (os.cpu_count() or 1):
        return 0.50, None, 0.50
    return 0.30, 0.80, None


def within(args, share, ratio, hidden):
    exp_bar, step_bar, hidden_bar = bars(args)
    return share <= exp_bar and (step_bar is None or ratio <= step_bar) and (hidden_bar is None or hidden >= hidden_bar)


def measure(args, work, k):
    """One whole measurement (calibration, baseline, sweep); returns its rows."""
    cal, log = run(f"m{k}_calibrate", args, work, 25, False)
    compute_ms, n = cal["step_ms"], cal["comm_bytes"]
    m = re.search(r"([0-9.]+)M parameters", log)
    params = f"{m.group(1)}M parameters, " if m else ""
    p, alpha = args.dp, args.latency_us
    target_us = args.comm_fraction * compute_ms * 1e3
    beta = (target_us / (2 * (p - 1)) - alpha) / (n / p)  # us per byte
    if beta <= 0:
        raise SystemExit(f"--latency-us {alpha} alone exceeds {args.comm_fraction} of the compute ({compute_ms:.1f} ms)")
    bw = 1e-3 / beta  # GB/s: beta = 1e6 / (bw * 1e9) us per byte
    pred_ms = 2 * (p - 1) * (alpha + n / p * beta) / 1e3
    print(f"[measurement {k + 1}] calibration (overlap off, no emulation): step {compute_ms:.1f} ms "
          f"(compute_ms {cal['compute_ms']:.1f}, exposed comm {cal['exposed_comm_ms']:.1f}); {params}"
          f"comm_bytes {n / 1e6:.3f} MB/step")
    print(f"[measurement {k + 1}] emulated link: {alpha:g} us, {bw:.4f} GB/s -> serial all-reduce of {n / 1e6:.3f} MB "
          f"over {p} ranks = {pred_ms:.1f} ms = {args.comm_fraction:g} x compute")
    base, log = run(f"m{k}_off", args, work, 25, False, bw, alpha)
    if k == 0:
        print("communication threads: " + ("real-time" if "(real-time threads)" in log else "normal priority"))
    rows = [(25.0, False, base)]
    for b in [float(x) for x in args.buckets.split(",")]:
        med, _ = run(f"m{k}_on_{b}", args, work, b, True, bw, alpha)
        rows.append((b, True, med))
    return bw, compute_ms, rows, pred_ms


def print_table(rows, args, pred_ms):
    exp_bar, step_bar, hidden_bar = bars(args)
    has_cpu = all("comm_cpu_ms" in r[2] for r in rows)
    # The slowest rank's own exposed communication, without the other ranks' wait for it (oversubscribed runs).
    has_slow = args.dp > (os.cpu_count() or 1) and all("slowest_exposed_comm_ms" in r[2] for r in rows)
    base_step = rows[0][2]["step_ms"]
    print(f"{'bucket_mb':>9} {'overlap':>7} {'step_ms':>8} {'comm_ms':>8} {'exposed':>8}"
          + (f" {'comm_cpu':>8}" if has_cpu else "")
          + f" {'exposed/comm':>12} {'bar <=' + format(exp_bar, '.2f'):>10}"
          + (f" {'slowest exp/comm':>16}" if has_slow else "")
          + f" {'step vs off':>11}"
          + (f" {'bar <=' + format(step_bar, '.2f') + 'x':>11}" if step_bar else "")
          + f" {'hidden':>7}" + (f" {'bar >=' + format(hidden_bar, '.2f'):>10}" if hidden_bar else ""))
    for b, on, r in rows:
        share, ratio = r["exposed_comm_ms"] / max(r["comm_ms"], 1e-9), r["step_ms"] / base_step
        hidden = (base_step - r["step_ms"]) / pred_ms
        line = (f"{b:>9g} {'on' if on else 'off':>7} {r['step_ms']:8.1f} {r['comm_ms']:8.1f} {r['exposed_comm_ms']:8.1f}"
                + (f" {r['comm_cpu_ms']:8.1f}" if has_cpu else "") + f" {share:12.2f}")
        slow = r.get("slowest_exposed_comm_ms", 0) / max(r["comm_ms"], 1e-9)
        if on:
            line += f" {'ok' if share <= exp_bar else 'MISSED':>10}"
            if has_slow:
                line += f" {slow:16.2f}"
            line += f" {ratio:10.2f}x"
            if step_bar:
                line += f" {'ok' if ratio <= step_bar else 'MISSED':>11}"
            line += f" {hidden:7.2f}"
            if hidden_bar:
                line += f" {'ok' if hidden >= hidden_bar else 'MISSED':>10}"
        else:
            line += f" {'(baseline)':>10}" + (f" {slow:16.2f}" if has_slow else "") + f" {ratio:10.2f}x"
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dp", type=int_at_least(2), default=2, help="data-parallel ranks (mpiexec -n)")
    ap.add_argument("--runs", type=int_at_least(1), default=1,
                    help="repeat the whole measurement (calibration included)")
    ap.add_argument("--steps", type=int_at_least(WARMUP + 1), default=25,
                    help=f"steps per run; the first {WARMUP} are not counted")
    ap.add_argument("--latency-us", type=float_at_least(0), default=20)
    ap.add_argument("--comm-fraction", type=float_above(0), default=0.6,
                    help="serial all-reduce time of the whole gradient on the emulated link / compute time")
    ap.add_argument("--buckets", type=float_list_above(0), default="0.25,0.5,1,2",
                    help="comm.bucket_mb values, overlap on")
    ap.add_argument("--backend", choices=["auto", "shm", "mpi"], default="auto", help="comm.backend: auto | shm | mpi")
    ap.add_argument("--comm-wait", choices=["auto", "poll", "block"], default="auto",
                    help="comm.wait (MPI transport): auto | poll | block")
    ap.add_argument("--thread-priority", choices=["auto", "realtime", "normal"], default="auto",
                    help="comm.thread_priority: auto | realtime | normal")
    ap.add_argument("--threads", type=int_at_least(0), default=0,
                    help="train.threads and OMP_NUM_THREADS for the runs (0: leave both to the user's defaults)")
    ap.add_argument("--plot", default="")
    args = ap.parse_args()

    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores visible)")
    exp_bar, step_bar, hidden_bar = bars(args)
    threads = (f"train.threads={args.threads}, OMP_NUM_THREADS={args.threads}" if args.threads else
               f"train.threads=0 (default), OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"dp={args.dp} ({args.dp} ranks{', oversubscribed' if args.dp > (os.cpu_count() or 1) else ''}), "
          f"configs/gpt.yaml, global batch {8 * args.dp} = {args.dp} x micro-batch 8, {args.steps} steps "
          f"(medians of steps {WARMUP + 1}..{args.steps}); comm.backend={args.backend}, comm.wait={args.comm_wait}, "
          f"comm.thread_priority={args.thread_priority}, {threads}")
    print(f"bars: exposed/comm <= {exp_bar:.2f}" + (f", step <= {step_bar:.2f}x the non-overlapped step" if step_bar
                                                    else "")
          + (f", hidden >= {hidden_bar:.2f} of the serial all-reduce (oversubscribed)" if hidden_bar else ""))
    results = []
    with tempfile.TemporaryDirectory() as work:
        for k in range(args.runs):
            bw, compute_ms, rows, pred_ms = measure(args, work, k)
            print_table(rows, args, pred_ms)
            print()
            results.append((bw, compute_ms, rows, pred_ms))

    # Per bucket across runs: exposed/comm and step vs off (each against its own measurement's baseline).
    sweep = []
    for i, (b, on, _) in enumerate(results[0][2]):
        if not on:
            continue
        shares = [res[2][i][2]["exposed_comm_ms"] / max(res[2][i][2]["comm_ms"], 1e-9) for res in results]
        ratios = [res[2][i][2]["step_ms"] / res[2][0][2]["step_ms"] for res in results]
        steps = [res[2][i][2]["step_ms"] for res in results]
        exps = [res[2][i][2]["exposed_comm_ms"] for res in results]
        hidden = [(res[2][0][2]["step_ms"] - res[2][i][2]["step_ms"]) / res[3] for res in results]
        met = sum(1 for s, r, h in zip(shares, ratios, hidden) if within(args, s, r, h))
        sweep.append((b, shares, ratios, steps, exps, met, hidden))
    if args.runs > 1:
        bws = [r[0] for r in results]
        print(f"across {args.runs} measurements (emulated bandwidth {min(bws):.4f}..{max(bws):.4f} GB/s; baseline step "
              f"{min(r[2][0][2]['step_ms'] for r in results):.1f}..{max(r[2][0][2]['step_ms'] for r in results):.1f} ms)")
        print(f"{'bucket_mb':>9} {'exposed/comm min':>16} {'max':>6} {'step vs off min':>15} {'max':>6} "
              f"{'hidden min':>10} {'max':>5} {'runs within the bars':>21}")
        for b, shares, ratios, _, _, met, hidden in sweep:
            print(f"{b:>9g} {min(shares):16.2f} {max(shares):6.2f} {min(ratios):14.2f}x {max(ratios):5.2f}x "
                  f"{min(hidden):10.2f} {max(hidden):5.2f} {f'{met}/{args.runs}':>21}")

    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3.6))
        bs = [s[0] for s in sweep]
        for idx, label, marker in ((3, "step_ms (overlap on)", "o-"), (4, "exposed_comm_ms", "s-")):
            mid = [statistics.median(s[idx]) for s in sweep]
            err = [[m - min(s[idx]) for m, s in zip(mid, sweep)], [max(s[idx]) - m for m, s in zip(mid, sweep)]]
            ax.errorbar(bs, mid, yerr=err, fmt=marker, capsize=3, label=label)
        ax.axhline(statistics.median(r[2][0][2]["step_ms"] for r in results), color="gray", ls="--",
                   label="step_ms, overlap off")
        ax.set_xscale("log")
        ax.set_xticks(bs)
        ax.set_xticklabels([f"{b:g}" for b in bs])
        ax.minorticks_off()
        ax.set_xlabel("comm.bucket_mb")
        ax.set_ylabel("ms per step (median)")
        bw = statistics.median(r[0] for r in results)
        ax.set_title(f"dp={args.dp}, emulated {bw:.3f} GB/s, {args.latency_us:g} us "
                     f"(comm = {args.comm_fraction:g} x compute)", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
