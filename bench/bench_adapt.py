"""comm.adapt against guessing (issue #16): on three emulated links (fast, medium, slow), the mean step time of an
adaptive run against every static setting of the same knobs (bucket size x the allowed compressions), and on a link
that changes mid-run, how many steps the controller takes to settle again.

For each link: one run per static setting (comm.adapt=false) and one adaptive run starting from the defaults
(25 MiB buckets, no compression), each --steps steps of configs/gpt.yaml on --dp ranks; the mean step_ms over steps
6..N (the adaptive run's exploration counts). The bar: adaptive within 5% of the best static setting.
Then one adaptive run of --change + 30 steps on comm.emulate.schedule (fast until step --change, slow after): the
steps from the change to the controller's last decision (bar: 20), and its mean step after settling against the
best static on the slow link.

With --periods (or --only-periods): local SGD's period, each static period of 1..16 against comm.adapt choosing it.

--repeats N runs every setting N times, round robin, and compares medians (single runs of one setting differ by a
few percent here, as much as the bar); --links picks the links.

Usage: /usr/bin/python3 bench/bench_adapt.py [--dp 2] [--steps 40] [--compress none,bf16,powersgd] [--change 30]
                                             [--periods | --only-periods] [--repeats 1] [--links fast,medium,slow]
Timings are only meaningful on an idle machine; about 6 minutes on a 2-core machine with the defaults.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

from bench_cli import COMPRESSIONS, cpu_model, int_at_least, names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 5
LINKS = {"fast": (20, 5.0), "medium": (50, 0.3), "slow": (100, 0.05)}  # latency_us, bandwidth_gbps
BUCKETS = [0.25, 0.5, 1, 2, 4, 25]


def run(work, tag, args, sets):
    d = os.path.join(work, tag)
    cmd = ["mpiexec", "-n", str(args.dp), os.path.join(ROOT, "build", "trainer"), "--config",
           os.path.join(ROOT, "configs", "gpt.yaml"), "--set", f"train.steps={args.steps}",
           "--set", f"train.global_batch={8 * args.dp}", "--set", "train.micro_batch=8", "--set", "train.eval_every=0",
           "--set", "run.log_every=1000", "--set", "run.checkpoint_every=0", "--set", f"run.dir={d}"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"trainer failed: {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]


def mean_step(rows, first=WARMUP):
    return statistics.mean(r["step_ms"] for r in rows[first:])


def wall_step(rows, first=WARMUP):
    """The wall time per step over steps first+1..N: under local SGD the replicas meet only at the averages, so a
    step's step_ms (the slowest rank's own step) leaves out what the steps overlap, and the average step holds
    the lag a replica built up meanwhile: their mean counts that lag twice."""
    return (rows[-1]["elapsed_ms"] - rows[first - 1]["elapsed_ms"]) / (len(rows) - first)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dp", type=int_at_least(2), default=2)
    ap.add_argument("--steps", type=int_at_least(1), default=40)
    ap.add_argument("--compress", type=names(COMPRESSIONS), default="none,bf16,powersgd",
                    help="the compressions comm.adapt may choose")
    ap.add_argument("--change", type=int_at_least(1), default=30, help="the step from which the changing link is slow")
    ap.add_argument("--periods", action="store_true", help="also the local SGD period (optim.sync_every)")
    ap.add_argument("--only-periods", action="store_true", help="the local SGD period only")
    ap.add_argument("--repeats", type=int_at_least(1), default=1,
                    help="runs per setting, round robin (their median counts)")
    ap.add_argument("--links", type=names(list(LINKS)), default="fast,medium,slow", help="the links to measure")
    args = ap.parse_args()
    methods = [m.strip() for m in args.compress.split(",")]
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); dp={args.dp}, configs/gpt.yaml, {args.steps} steps, mean "
          f"step_ms of steps {WARMUP + 1}..{args.steps}; knobs: buckets {BUCKETS} MiB x compression {methods}")
    if args.only_periods:
        return local_sgd_periods(args)
    adapt = ["comm.adapt=true", f"comm.adapt_compress={','.join(methods)}"]
    best_on = {}
    with tempfile.TemporaryDirectory() as work:
        print(f"{'link':>6} {'latency':>8} {'GB/s':>6} {'best static':>22} {'ms':>7} {'worst':>7} {'adaptive':>8} "
              f"{'ratio':>6} {'bar <= 1.05':>11}  adaptive's final setting")
        for name, (lat, bw) in LINKS.items():
            if name not in args.links.split(","):
                continue
            link = [f"comm.emulate.latency_us={lat}", f"comm.emulate.bandwidth_gbps={bw}"]
            settings = {(b, m): link + [f"comm.bucket_mb={b}", f"comm.compress={m}"] for m in methods for b in BUCKETS}
            settings["adapt"] = link + adapt
            means, finals = {k: [] for k in settings}, []
            for _ in range(args.repeats):  # round robin: a slow spell of the machine hits every setting alike
                for k, sets in settings.items():
                    rows = run(work, f"{name}_{k}", args, sets)
                    means[k].append(mean_step(rows))
                    if k == "adapt":
                        finals.append(f"{rows[-1]['bucket_mb']:g} MiB, {rows[-1]['compress']}")
            static = {k: statistics.median(v) for k, v in means.items() if k != "adapt"}
            best = min(static, key=static.get)
            best_on[name] = static[best]
            a = statistics.median(means["adapt"])
            ratio = a / static[best]
            final = "; ".join(finals)
            print(f"{name:>6} {lat:>8} {bw:>6} {f'{best[0]:g} MiB, {best[1]}':>22} {static[best]:7.1f} "
                  f"{max(static.values()):7.1f} {a:8.1f} {ratio:6.3f} {'ok' if ratio <= 1.05 else 'MISSED':>11}  {final}")
        if "slow" not in best_on:
            return
        # A link that changes: fast until --change, slow from there.
        lat0, bw0 = LINKS["fast"]
        lat1, bw1 = LINKS["slow"]
        rows = run(work, "change", args, [f"comm.emulate.latency_us={lat0}", f"comm.emulate.bandwidth_gbps={bw0}",
                                          f"comm.emulate.schedule={args.change}:{lat1}:{bw1}",
                                          f"train.steps={args.change + 30}"] + adapt)
        decisions = [r["step"] for r in rows if "adapt" in r]
        after = [s for s in decisions if s >= args.change]
        settled = (after[-1] - args.change + 1) if after else None
        tail = [r for r in rows if r["step"] > (after[-1] + 1 if after else args.change)]
        print(f"link change at step {args.change} (fast -> slow): decisions at steps {decisions}; settled "
              f"{settled} steps after the change (bar <= 20: {'ok' if settled is not None and settled <= 20 else 'MISSED'})")
        if tail:
            t = statistics.mean(r["step_ms"] for r in tail)
            print(f"  after settling: mean step {t:.1f} ms against the best static on the slow link {best_on['slow']:.1f} "
                  f"ms ({t / best_on['slow']:.3f}x; {len(tail)} steps)")
    if args.periods:
        local_sgd_periods(args)


def local_sgd_periods(args):
    """Under local SGD comm.adapt picks the period: the shortest within 2% of the longest's mean step. Against every
    static period of the same limits on each link: the adaptive run's wall time per step over the fastest static
    one's (the longest period), and the period it chose against the shortest static period within 5% of the
    fastest. Each setting runs --repeats times, round robin (the median counts): single runs differ by as much as
    the bar."""
    periods = [1, 2, 4, 8, 16]
    print(f"\nlocal SGD (optim.sync_every), periods {periods}: wall time per step over steps {WARMUP + 1}.."
          f"{args.steps}, median of {args.repeats} runs each")
    print(f"{'link':>6} {'static mean step per period (ms)':>44} {'adaptive':>8} {'/ fastest':>9} {'bar <= 1.05':>11} "
          f"{'chosen':>6} {'shortest static within 5%':>26}")
    with tempfile.TemporaryDirectory() as work:
        for name, (lat, bw) in LINKS.items():
            if name not in args.links.split(","):
                continue
            link = [f"comm.emulate.latency_us={lat}", f"comm.emulate.bandwidth_gbps={bw}"]
            settings = {h: link + [f"optim.sync_every={h}"] for h in periods}
            settings["adapt"] = link + ["optim.sync_every=1", "comm.adapt=true",
                                        f"comm.adapt_sync_every_max={periods[-1]}"]
            means, chosen = {k: [] for k in settings}, []
            for _ in range(args.repeats):
                for k, sets in settings.items():
                    rows = run(work, f"{name}_h{k}", args, sets)
                    means[k].append(wall_step(rows))
                    if k == "adapt":
                        chosen.append(rows[-1]["sync_every"])
            static = {h: statistics.median(means[h]) for h in periods}
            a = statistics.median(means["adapt"])
            fastest = min(static.values())
            within = min(h for h in periods if static[h] <= 1.05 * fastest)
            cells = " ".join(f"{static[h]:7.1f}" for h in periods)
            print(f"{name:>6} {cells:>44} {a:8.1f} {a / fastest:9.3f} {'ok' if a <= 1.05 * fastest else 'MISSED':>11} "
                  f"{'/'.join(map(str, chosen)):>6} {within:>26}")

if __name__ == "__main__":
    main()
