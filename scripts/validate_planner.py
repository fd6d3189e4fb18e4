#!/usr/bin/python3
"""Validates build/planner against real runs: the planner's best layouts and a seeded random sample of the rest
are trained for a few steps through mpiexec on an emulated network, and each layout's predicted step time and
peak memory are compared with the measured ones (median step_ms of metrics.jsonl after a warm-up, under local SGD
the wall time per step without the last step, as the planner predicts the mean step; the largest
peak_tensor_bytes of memory.json). Prints one row per layout, the mean and max errors against the
targets of issue 38 (step time: mean <= 10%, max <= 20%, the measured fastest among the planner's first 3;
memory: <= 10%), and a Markdown table for docs/planner.md.

  /usr/bin/python3 scripts/validate_planner.py [--build build] [--world 4] [--best 4] [--sample 8] [--seed 1]
                                               [--runtime FILE] [--fit FILE [--fit-also DIR]...]

--fit FILE refits the planner's eight runtime constants (--p2p-latency-us, --p2p-wake-us, --poll-share,
--sync-latency-us, --step-sync-us, --ring-sync-us, --comm-cpu-op-us, --comm-cpu-ns-per-byte) to the runs: a
coordinate search (the compute timings held fixed; it starts from --runtime FILE's constants where one is given,
else from the defaults, and has more than one minimum) that minimises the largest of mean error / 10%, max error / 20%
and the planner's rank of the fastest measured layout / 3 (the targets of issue 38), then saves them as JSON with the
runs' measured run-to-run spread (within a sample, or across samples where layouts were measured in several:
measured_spread), which `build/planner --runtime FILE` reads (and this script, with --runtime FILE,
validates on other layouts: --seed). The measurements are kept in OUT/results.json, and
--from-results refits from them without running anything.
--fit-also DIR (repeatable) adds an earlier run's layouts (another --seed or --world) to the fit: each run is
scored on its own and the fit minimises the mean of the scores; it prints the worst mean and max error and rank.
Constants fit to one sample of 12 layouts can miss on the next (docs/planner_log.md has figures for fits to one, two,
three, five and eight samples). --include LAYOUT (repeatable) measures a layout beside the sample, named as the rows
print it ('1x1x4 gpipe mb1 z0').

Timings need a quiet machine: other processes on the cores slow the runs but not the planner's calibration
(or the other way round). Each run measures the CPU other processes used meanwhile (/proc/stat minus its own)
and is repeated after a pause while that exceeds --max-other cores; the column 'other' shows it. A machine can
also change speed by itself (a VM whose host is busy), for minutes at a time: the layouts are measured in rounds,
every layout once per round (--repeats rounds), so that such a stretch falls on one run of several layouts rather
than on every run of one; one rank alone trains a few steps beside the calibration and again before each run, and
the column 'speed' is that rank's step time then against beside the calibration (the mean over a layout's runs).
Layouts measured at a speed more than --max-drift away are marked, and the errors are given over the others too:
there the planner's calibration no longer describes the machine. Stdlib only.
"""
import argparse
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from bench_cli import cpu_model  # noqa: E402 (the benches' CPU name, written into each fit)
LAYOUT_KEYS = ("dp", "cp", "tp", "pp", "schedule", "virtual_stages", "micro_batch", "zero")


def layout_sets(row):
    return ["parallel.dp=%d" % row["dp"], "parallel.cp=%d" % row["cp"], "parallel.tp=%d" % row["tp"],
            "parallel.pp=%d" % row["pp"],
            "parallel.schedule=%s" % row["schedule"], "parallel.virtual_stages=%d" % row["virtual_stages"],
            "train.micro_batch=%d" % row["micro_batch"], "optim.zero=%d" % row["zero"]]


def describe(row):
    s = "%dx%dx%d %s" % (row["dp"], row["tp"], row["pp"], row["schedule"])
    if row["schedule"] == "interleaved":
        s += "/v%d" % row["virtual_stages"]
    if row["cp"] > 1:
        s += " cp%d" % row["cp"]
    return s + " mb%d z%d" % (row["micro_batch"], row["zero"])


def sets_args(sets):
    out = []
    for s in sets:
        out += ["--set", s]
    return out


def run_planner(args, sets, constants=None):
    """The planner's rows (JSON), with the compute timings cached in OUT/calibration.json, and the runtime
    constants of --runtime or, when given, `constants` (flag -> value)."""
    cmd = [os.path.join(args.build, "planner"), "--config", args.config, "--world", str(args.world), "--json",
           "--reps", str(args.reps), "--calibration", os.path.join(args.out, "calibration.json")] + sets_args(sets)
    if args.runtime:
        cmd += ["--runtime", args.runtime]
    for flag, value in (constants or {}).items():
        cmd += [flag, "%g" % value]
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("planner failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr))
    return json.loads(p.stdout), time.time() - t0


def busy_seconds():
    """CPU time every process of the machine has used (/proc/stat: all but idle and iowait)."""
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def run_once(args, cmd, run_dir):
    """One run; repeated (up to --retries times, after a pause) while other processes used more than
    --max-other cores during it. Returns its steps after the warm-up, memory.json's ranks, the cores other
    processes used and whether it ran local SGD."""
    for attempt in range(args.retries + 1):
        shutil.rmtree(run_dir, ignore_errors=True)
        b0, u0, t0 = busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        b1, u1, t1 = busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
        if p.returncode != 0:
            sys.exit("trainer failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-3000:]))
        ours = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)
        other = max(0.0, (b1 - b0 - ours) / (t1 - t0))
        if other <= args.max_other:
            break
        if attempt < args.retries:
            time.sleep(args.pause)
    steps = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if line.strip()]
    mem = json.load(open(os.path.join(run_dir, "memory.json")))["ranks"]
    # Local SGD's run ends with a parameter average whatever the period: its last step is not a typical one.
    local_sgd = local_sgd_period(run_dir) > 0
    last = steps[-1]["step"] if local_sgd else None
    return [s for s in steps if s["step"] > args.warmup and s["step"] != last], mem, other, local_sgd


def local_sgd_period(run_dir):
    """optim.sync_every of a run, from its resolved config.yaml (0: synchronous)."""
    m = re.search(r"^optim:\n(?:[ ].*\n)*?\s+sync_every:\s*(\d+)", open(os.path.join(run_dir, "config.yaml")).read(),
                  re.M)
    return int(m.group(1)) if m else 0


def step_time(steps, local_sgd):
    """A run's typical step: the median step_ms, or under local SGD the wall time per step (the planner predicts
    the mean step: a median leaves out the average every H steps, and step_ms, the slowest rank's own step, counts
    twice the lag a replica builds up before an average, once in its steps and once in its wait there)."""
    if not local_sgd:
        return statistics.median(s["step_ms"] for s in steps)
    return (steps[-1]["elapsed_ms"] - steps[0]["elapsed_ms"]) / (len(steps) - 1)


def typical(values, local_sgd):
    """A part of the step (compute, exposed, bubble): its median, or under local SGD its mean."""
    return statistics.mean(values) if local_sgd else statistics.median(values)


def speed_probe(args, sets):
    """One rank of one thread alone, 12 steps at micro-batch 2 (no network): its median step_ms after 2 steps. The
    same beside the calibration, divided by this, is how fast the machine runs now against then."""
    run_dir = os.path.join(args.out, "speed")
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [os.path.join(args.build, "trainer"), "--config", args.config] + sets_args(sets + [
        "parallel.dp=1", "parallel.cp=1", "parallel.tp=1", "parallel.pp=1", "train.threads=1", "train.micro_batch=2",
        "train.global_batch=2", "train.steps=12", "run.dir=%s" % run_dir, "run.resume=none", "run.log_every=1000"])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("speed probe failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-3000:]))
    steps = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if line.strip()]
    return statistics.median(s["step_ms"] for s in steps if s["step"] > 2)


def trainer_command(args, sets, row, run_dir):
    cmd = [args.mpiexec, "-n", str(args.world), os.path.join(args.build, "trainer"), "--config", args.config]
    return cmd + sets_args(sets + layout_sets(row) + ["train.steps=%d" % args.steps, "run.dir=%s" % run_dir,
                                                       "run.resume=none", "run.log_every=1000"])


def summarise(runs):
    """A layout's measurement from its runs (run_once's results)."""
    after = [s for steps, _, _, _ in runs for s in steps]
    local_sgd = runs[0][3]
    medians = [step_time(steps, local_sgd) for steps, _, _, _ in runs]
    return {
        "spread": (max(medians) - min(medians)) / statistics.mean(medians),  # between the runs' own medians
        "step_ms": statistics.mean(medians) if local_sgd else statistics.median(s["step_ms"] for s in after),
        "compute_ms": typical([s["compute_ms"] for s in after], local_sgd),
        "exposed_comm_ms": typical([s["exposed_comm_ms"] for s in after], local_sgd),
        "bubble_ms": typical([s["bubble_ms"] for s in after], local_sgd),
        "memory_bytes": max(max(r["peak_tensor_bytes"] for r in mem) for _, mem, _, _ in runs),
        "other": max(other for _, _, other, _ in runs),
    }


def measure(args, sets, chosen, speed_ms):
    """Every layout's runs, in rounds: each layout once per round (--repeats rounds), so that a slow stretch of the
    machine (a VM's busy host, for minutes at a time) falls on one run of several layouts rather than on every run
    of one. Each run is preceded by the speed probe; a layout's speed is the mean of its probes."""
    runs = [[] for _ in chosen]
    speeds = [[] for _ in chosen]
    rounds, run_dir = max(1, args.repeats), os.path.join(args.out, "run")
    for k in range(rounds):
        for i, row in enumerate(chosen):
            speeds[i].append(speed_ms / speed_probe(args, sets))  # 0.8: the machine at 80% of its speed then
            runs[i].append(run_once(args, trainer_command(args, sets, row, run_dir), run_dir))
            steps, _, _, local_sgd = runs[i][-1]
            print("round %d/%d, layout %d/%d: %-28s %9.2f ms (speed %.2f)" %
                  (k + 1, rounds, i + 1, len(chosen), describe(row), step_time(steps, local_sgd), speeds[i][-1]),
                  flush=True)
    return [dict(summarise(r), speed=statistics.mean(v)) for r, v in zip(runs, speeds)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="directory with planner and trainer")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "gpt.yaml"))
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--best", type=int, default=4, help="the planner's best layouts to run")
    ap.add_argument("--sample", type=int, default=8, help="randomly chosen other layouts to run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs per layout, in rounds (every layout once per round); the measured step time is the "
                         "median over all their steps after the warm-up (on a 2-core VM with a busy host, runs of a "
                         "layout minutes apart differed by 17-20%% in the median)")
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    ap.add_argument("--reps", type=int, default=5, help="the planner's timing repetitions")
    ap.add_argument("--latency-us", type=float, default=30.0)
    ap.add_argument("--bandwidth-gbps", type=float, default=2.0)
    ap.add_argument("--set", action="append", default=[], help="extra config override (repeatable)")
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "validate_planner"))
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--max-other", type=float, default=0.15,
                    help="cores other processes may use during a run before it is repeated (default 0.15)")
    ap.add_argument("--retries", type=int, default=3, help="repeats of a disturbed run (default 3)")
    ap.add_argument("--max-drift", type=float, default=0.15,
                    help="mark layouts measured while one rank alone ran this much faster or slower than beside the "
                         "calibration (default 0.15)")
    ap.add_argument("--pause", type=float, default=20, help="seconds to wait before repeating a disturbed run")
    ap.add_argument("--runtime", default="", help="the planner's runtime constants from a --fit (build/planner "
                    "--runtime)")
    ap.add_argument("--fit", default="", help="refit the runtime constants to these runs and save them to this file")
    ap.add_argument("--fit-also", action="append", default=[], metavar="DIR",
                    help="with --fit: fit to the layouts an earlier run measured too (its --out; the same config "
                         "and link, any --world or --seed), each run scored on its own (repeatable)")
    ap.add_argument("--include", action="append", default=[], metavar="LAYOUT",
                    help="measure this layout too, named as the rows print it (e.g. '1x1x4 gpipe mb1 z0'; "
                         "repeatable)")
    ap.add_argument("--from-results", action="store_true",
                    help="take the layouts and measurements from OUT/results.json (an earlier run) instead of running")
    args = ap.parse_args()
    if args.include and args.from_results:
        ap.error("--include measures more layouts: --from-results takes the earlier run's, without running")
    if args.fit_also and not args.fit:
        ap.error("--fit-also adds runs to a fit: give --fit FILE too")
    for folder in args.fit_also:
        if not os.path.exists(os.path.join(folder, "results.json")):
            ap.error("--fit-also %s: no results.json there (give an earlier run's --out)" % folder)
    os.makedirs(args.out, exist_ok=True)

    sets = ["comm.emulate.latency_us=%g" % args.latency_us, "comm.emulate.bandwidth_gbps=%g" % args.bandwidth_gbps,
            "train.eval_every=0"] + args.set
    speed_before = None if args.from_results else speed_probe(args, sets)
    rows, planner_s = run_planner(args, sets)
    # The machine's speed beside the calibration: the probe before and after the planner timed the passes.
    speed_ms = None if args.from_results else (speed_before + speed_probe(args, sets)) / 2
    chosen = rows[:args.best]
    # The sample is drawn from the other layouts in a fixed order (not the predicted one, which moves with the
    # calibration's noise), so a seed picks the same layouts from run to run unless they are among the best.
    rest = sorted(rows[args.best:], key=lambda r: tuple(r[k] for k in LAYOUT_KEYS))
    rng = random.Random(args.seed)
    chosen += rng.sample(rest, min(args.sample, len(rest)))
    by_name = {describe(r): r for r in rows}
    for name in args.include:
        if name not in by_name:
            sys.exit("--include %s: not among the planner's %d layouts (name them as the rows print them)" %
                     (name, len(rows)))
        if by_name[name] not in chosen:
            chosen.append(by_name[name])
    print("planner: %d layouts of %s on %d ranks in %.1f s; running %d (best %d + %d sampled, seed %d%s), %d x %d "
          "steps each, median of steps %d-%d (local SGD: wall time per step, less the last); network %g us / %g GB/s" %
          (len(rows), os.path.relpath(args.config, ROOT), args.world, planner_s, len(chosen), min(args.best, len(rows)),
           min(args.sample, len(rest)), args.seed,
           " + %d named" % (len(chosen) - min(args.best, len(rows)) - min(args.sample, len(rest)))
           if args.include else "", args.repeats, args.steps, args.warmup + 1, args.steps,
           args.latency_us, args.bandwidth_gbps), flush=True)
    hdr = "%-4s %-28s %9s %9s %7s %10s %10s %7s %6s %6s   %s" % ("rank", "layout", "pred_ms", "meas_ms", "err",
                                                                "pred_MiB", "meas_MiB", "err", "other", "speed",
                                                                "compute/exposed/bubble ms: measured (predicted)")
    results = []
    saved = os.path.join(args.out, "results.json")
    if not args.from_results:
        measured = measure(args, sets, chosen, speed_ms)
    else:  # the same layouts, measured before; the predictions are this planner call's
        by_key = {KEY(r): r for r in rows}
        chosen, measured = [], []
        for old, m in json.load(open(saved)):
            if KEY(old) not in by_key:  # e.g. ZeRO above 0 with one dp x cp replica, no longer listed
                print("--from-results: left out %s: not among the planner's layouts now" % describe(old))
                continue
            if by_key[KEY(old)] in chosen:  # measured twice as two rows that are one run (KEY)
                print("--from-results: left out %s: the same run as %s" % (describe(old), describe(by_key[KEY(old)])))
                continue
            chosen.append(by_key[KEY(old)])
            measured.append(m)
    print(hdr)
    for row, m in zip(chosen, measured):
        et = (row["step_ms"] - m["step_ms"]) / m["step_ms"]
        em = (row["memory_bytes"] - m["memory_bytes"]) / m["memory_bytes"]
        results.append((row, m, et, em))
        print("%-4d %-28s %9.2f %9.2f %+6.1f%% %10.2f %10.2f %+6.1f%% %6.2f %6s   %.1f/%.1f/%.1f (%.1f/%.1f/%.1f)" %
              (row["rank"], describe(row), row["step_ms"], m["step_ms"], 100 * et, row["memory_bytes"] / 2**20,
               m["memory_bytes"] / 2**20, 100 * em, m["other"],
               "%.2f" % m["speed"] if "speed" in m else "-", m["compute_ms"], m["exposed_comm_ms"],
               m["bubble_ms"], row["compute_ms"], row["exposed_comm_ms"], row["bubble_ms"]), flush=True)
    if not args.from_results:
        with open(saved, "w") as f:
            json.dump([[row, m] for row, m, _, _ in results], f)
    et = [abs(r[2]) for r in results]
    em = [abs(r[3]) for r in results]
    ok_t = statistics.mean(et) <= 0.10 and max(et) <= 0.20
    ok_m = max(em) <= 0.10
    print("step time error: mean %.1f%%, max %.1f%% (targets 10%% / 20%%: %s)" %
          (100 * statistics.mean(et), 100 * max(et), "met" if ok_t else "MISSED"))
    print("peak memory error: mean %.1f%%, max %.1f%% (target 10%%: %s)" %
          (100 * statistics.mean(em), 100 * max(em), "met" if ok_m else "MISSED"))
    # The rank of the measured fastest among the runs, by the planner's order.
    fastest = min(results, key=lambda r: r[1]["step_ms"])
    print("fastest measured: %s (planner rank %d; target: 3 or better: %s)" %
          (describe(fastest[0]), fastest[0]["rank"], "met" if fastest[0]["rank"] <= 3 else "MISSED"))
    spreads = [r[1]["spread"] for r in results]
    print("run to run: a layout's runs differed by %.1f%% in the median, up to %.1f%% (the noise in the errors above)" %
          (100 * statistics.median(spreads), 100 * max(spreads)))
    drifted = [r for r in results if abs(r[1].get("speed", 1) - 1) > args.max_drift]
    if drifted:
        steady = [abs(r[2]) for r in results if r not in drifted]
        print("WARNING: %d layout(s) ran while the machine was more than %.0f%% faster or slower than beside the "
              "calibration (speed %s)%s" % (
                  len(drifted), 100 * args.max_drift, ", ".join("%.2f" % r[1]["speed"] for r in drifted),
                  "; over the other %d: mean %.1f%%, max %.1f%%" % (len(steady), 100 * statistics.mean(steady),
                                                                     100 * max(steady)) if steady else ""))
    disturbed = [r for r in results if r[1]["other"] > args.max_other]
    if disturbed:
        print("WARNING: %d run(s) shared the machine with other processes (> %.2f cores) even after %d retries; "
              "their times are not the planner's to predict" % (len(disturbed), args.max_other, args.retries))
    print("\nMarkdown:\n")
    print("| planner rank | layout (dp x tp x pp, schedule, micro-batch, ZeRO) | predicted ms | measured ms | error "
          "| predicted MiB | measured MiB | error |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for row, m, e1, e2 in results:
        print("| %d | %s | %.2f | %.2f | %+.1f%% | %.2f | %.2f | %+.1f%% |" %
              (row["rank"], describe(row), row["step_ms"], m["step_ms"], 100 * e1, row["memory_bytes"] / 2**20,
               m["memory_bytes"] / 2**20, 100 * e2))
    print("| | **mean / max abs error** | | | **%.1f%% / %.1f%%** | | | **%.1f%% / %.1f%%** |" %
          (100 * statistics.mean(et), 100 * max(et), 100 * statistics.mean(em), 100 * max(em)))
    if args.fit:
        fit_constants(args, sets, results)
    if args.check and not (ok_t and ok_m):
        sys.exit(1)


def KEY(row):
    """The layout's identity. gpipe with one micro-batch is 1f1b's run (the planner lists it so): samples measured
    before it stopped listing both match the 1f1b row."""
    same = row["schedule"] == "gpipe" and row.get("micro_batches") == 1
    return tuple("1f1b" if k == "schedule" and same else row[k] for k in LAYOUT_KEYS)


# The runtime constants: planner flag, key in the runtime file, default, the values the search tries.
CONSTANTS = [
    ("--p2p-latency-us", "p2p_latency_us", 2000, [0, 100, 250, 500, 1000, 1500, 2000, 3000, 4000]),
    ("--p2p-wake-us", "p2p_wake_us", 0, [0, 100, 250, 500, 750, 1000, 1500]),
    ("--poll-share", "poll_share", 0.15, [0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.65]),
    ("--sync-latency-us", "sync_latency_us", 75, [0, 25, 50, 75, 100, 150, 200, 300]),
    ("--step-sync-us", "step_sync_us", 1000, [0, 250, 500, 750, 1000, 1500, 2000, 3000]),
    ("--ring-sync-us", "ring_sync_us", 200, [0, 50, 100, 150, 200, 250, 350, 500, 700]),
    ("--comm-cpu-op-us", "comm_cpu_op_us", 80, [0, 40, 80, 120, 160, 240]),
    ("--comm-cpu-ns-per-byte", "comm_cpu_ns_per_byte", 0.7, [0, 0.35, 0.7, 1.0, 1.4, 2.0]),
]


def measured_spread(within, by_layout):
    """The run-to-run spread a fit saves, which decides the planner's ties: the median over the layouts of their two
    runs' difference within a sample (`within`), or, where at least three layouts were measured in several samples
    (`by_layout`: each layout's step times, one per sample), the median of their range over the samples if that is
    larger. Runs minutes or hours apart, each sample beside its own calibration, differ more than runs back to
    back: on the Zen 4 VM of docs/planner.md 2.0-2.3% within a sample, 4.2% (4 ranks) and 9.4% (8 ranks) across.
    Returns (spread, within's median, across's median or None, the layouts across counts)."""
    inside = statistics.median(within)
    ranges = [(max(t) - min(t)) / statistics.mean(t) for t in by_layout.values() if len(t) >= 2]
    if len(ranges) < 3:
        return inside, inside, None, len(ranges)
    across = statistics.median(ranges)
    return max(inside, across), inside, across, len(ranges)


def fit_constants(args, sets, results):
    """Coordinate search over CONSTANTS (two rounds) for the least score (errors()) on the measured layouts, this
    run's and those of every --fit-also folder; saves the best with the measured spread to args.fit (its errors:
    the worst run's)."""
    samples = [(args, {KEY(row): m["step_ms"] for row, m, _, _ in results})]
    spreads = [m["spread"] for _, m, _, _ in results]
    for folder in args.fit_also:  # another run's layouts, predicted with its own calibration and world size
        saved = json.load(open(os.path.join(folder, "results.json")))
        first = saved[0][0]
        other = argparse.Namespace(**dict(vars(args), out=folder,
                                          world=first["dp"] * first["cp"] * first["tp"] * first["pp"]))
        samples.append((other, {KEY(row): m["step_ms"] for row, m in saved}))
        spreads += [m["spread"] for _, m in saved]
    start = {}
    if args.runtime:
        start = json.load(open(args.runtime))
    current = {flag: float(start.get(key, default)) for flag, key, default, _ in CONSTANTS}

    def sample_errors(run_args, measured, constants):
        """(the score: the largest of mean / 10%, max / 20% and the planner's rank of the fastest measured / 3,
        mean, max, that rank) on one run's layouts"""
        rows, _ = run_planner(run_args, sets, constants)
        listed = {KEY(r) for r in rows}
        measured = {k: v for k, v in measured.items() if k in listed}  # as --from-results: what is still listed
        if not measured:
            sys.exit("--fit: the planner lists none of the layouts measured in %s" % run_args.out)
        e = [abs(r["step_ms"] - measured[KEY(r)]) / measured[KEY(r)] for r in rows if KEY(r) in measured]
        fastest = min(measured, key=measured.get)
        rank = next(r["rank"] for r in rows if KEY(r) == fastest)
        return max(statistics.mean(e) / 0.10, max(e) / 0.20, rank / 3), statistics.mean(e), max(e), rank

    def errors(constants):
        """(the runs' mean score, the worst run's mean and max error, the worst rank) over the runs (sample_errors).
        The mean, not the worst: a run whose fastest layout no constants rank well would otherwise steer the
        whole fit."""
        e = [sample_errors(run_args, measured, constants) for run_args, measured in samples]
        return (statistics.mean(x[0] for x in e), max(x[1] for x in e), max(x[2] for x in e), max(x[3] for x in e))

    best = errors(current)
    print("\nfit: start %s: mean %.1f%%, max %.1f%%, fastest measured ranked %d" %
          (current, 100 * best[1], 100 * best[2], best[3]), flush=True)
    for round_ in range(2):
        for flag, _, _, values in CONSTANTS:
            for v in values:
                trial = dict(current, **{flag: v})
                e = errors(trial)
                if e < best:
                    best, current = e, trial
            print("fit: round %d, %s = %g: mean %.1f%%, max %.1f%%, fastest measured ranked %d" %
                  (round_ + 1, flag, current[flag], 100 * best[1], 100 * best[2], best[3]), flush=True)
    by_layout = {}
    for _, measured in samples:
        for key, ms in measured.items():
            by_layout.setdefault(key, []).append(ms)
    spread, within, across, repeated = measured_spread(spreads, by_layout)
    out = {key: current[flag] for flag, key, _, _ in CONSTANTS}
    out.update({
        "spread": round(spread, 4),
        "fit": {"config": os.path.relpath(args.config, ROOT), "world": args.world, "latency_us": args.latency_us,
                "bandwidth_gbps": args.bandwidth_gbps, "layouts": len(results), "seed": args.seed,
                "also": [{"folder": run_args.out, "world": run_args.world, "layouts": len(measured)}
                         for run_args, measured in samples[1:]],
                "mean_error": round(best[1], 4), "max_error": round(best[2], 4), "fastest_rank": best[3],
                "cpu": cpu_model(), "date": time.strftime("%Y-%m-%d"),
                "spread_within": round(within, 4), "spread_across": None if across is None else round(across, 4),
                "layouts_across": repeated},
    })
    with open(args.fit, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("fit: saved to %s (spread %.1f%%: runs of a layout differ by %.1f%% within a sample%s); "
          "build/planner --runtime %s uses them" %
          (args.fit, 100 * spread, 100 * within,
           " and %.1f%% across samples, over %d layouts measured in several" % (100 * across, repeated)
           if across is not None else "", args.fit))


if __name__ == "__main__":
    main()
