"""scripts/sweep.py and scripts/plot.py end to end: a small grid (configs/tiny.yaml, np 1 and 2 x tp 1 and 2: one
rank, dp2, tp2 and an invalid tp2-on-one-rank point) through mpiexec; steps.csv and summary.csv against each
point's metrics.jsonl; the invalid point recorded as failed without stopping the sweep; --skip-done and --strict;
a sweep whose every point fails exits 1;
bad command lines answered with exit 2; then every figure kind written as a valid PNG. Standard library only.
Usage: test_sweep_plot.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import csv
import json
import math
import re
import os
import shutil
import statistics
import struct
import subprocess
import sys

mpiexec, trainer, src, work = sys.argv[1:5]
SWEEP = [sys.executable, os.path.join(src, "scripts", "sweep.py")]
PLOT = [sys.executable, os.path.join(src, "scripts", "plot.py")]
TINY = os.path.join(src, "configs", "tiny.yaml")
STEPS, WARMUP = 5, 2
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
    return ok


def run(cmd, timeout=120):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def read_csv(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def same(cell, value):
    """A CSV cell against a metrics.jsonl value (None = empty cell)."""
    if value is None:
        return cell == ""
    if cell == "":
        return False
    return math.isclose(float(cell), float(value), rel_tol=1e-12, abs_tol=0.0)


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_summary(out):
    cols, rows = read_csv(os.path.join(out, "summary.csv"))
    need = ["point", "label", "settings", "np", "parallel.tp", "dp", "tp", "pp", "status", "returncode", "error",
            "steps", "final_loss", "final_val_loss", "step_ms_median", "tokens_per_s_median", "compute_ms_median",
            "comm_ms_median", "comm_cpu_ms_median", "exposed_comm_ms_median", "bubble_ms_median",
            "comm_bytes_median", "peak_rss_mib", "run_dir"]
    missing = [c for c in need if c not in cols]
    check(not missing, f"summary.csv has the {len(need)} expected columns (missing: {missing})")
    by = {r["point"]: r for r in rows}
    check(sorted(by) == ["np1_tp1", "np1_tp2", "np2_tp1", "np2_tp2"], f"summary.csv has the 4 points: {sorted(by)}")
    bad = by.get("np1_tp2", {})
    check(bad.get("status") == "failed" and bad.get("returncode") == "2" and "parallel.tp" in bad.get("error", ""),
          f"tp2 on one rank is recorded as failed with exit 2 and the trainer's message: {bad}")
    for name, mesh in (("np1_tp1", ("1", "1", "1")), ("np2_tp1", ("2", "1", "1")), ("np2_tp2", ("1", "2", "1"))):
        r = by.get(name)
        if not check(r is not None and r["status"] == "ok", f"{name} ran ok"):
            continue
        got = (r["dp"], r["tp"], r["pp"])
        check(got == mesh, f"{name}: mesh (dp, tp, pp) = {mesh} (got {got})")
        m = metrics(r["run_dir"])
        vals = [x["val_loss"] for x in m if "val_loss" in x]
        measured = m[WARMUP:]
        ok = (r["steps"] == str(len(m)) == str(STEPS) and same(r["final_loss"], m[-1]["loss"])
              and same(r["final_val_loss"], vals[-1])
              and all(same(r[f + "_median"], statistics.median(x[f] for x in measured))
                      for f in ("step_ms", "tokens_per_s", "compute_ms", "comm_ms", "comm_cpu_ms", "exposed_comm_ms",
                                "bubble_ms", "comm_bytes")))
        ok &= all(abs(float(r[f + "_mean"]) - statistics.fmean(x[f] for x in measured)) < 1e-4
                  for f in ("step_ms", "compute_ms", "exposed_comm_ms", "bubble_ms"))
        check(ok, f"{name}: steps, final losses, medians and means of steps {WARMUP + 1}..{STEPS} agree with "
                  "metrics.jsonl")
        check(os.path.isfile(os.path.join(r["run_dir"], "train.log")), f"{name}: train.log saved in its run dir")
    # Scaling and cost: per-rank throughput against the same settings' fewest ranks; device-hours x the price.
    ok = {n: r for n, r in by.items() if r["status"] == "ok"}
    want_eff = {"np1_tp1": 1.0, "np2_tp2": 1.0,
                "np2_tp1": float(ok["np2_tp1"]["tokens_per_s_median"]) / 2 / float(ok["np1_tp1"]["tokens_per_s_median"])}
    cost_ok = all(abs(float(r["device_hours"]) - int(r["np"]) * float(r["wall_s"]) / 3600) < 1e-9 and
                  abs(float(r["cost"]) - 2.5 * float(r["device_hours"])) < 1e-9 and
                  abs(float(r["cost_per_billion_tokens"]) - float(r["cost"]) / (float(r["tokens"]) / 1e9)) < 1e-6
                  for r in ok.values())
    # Over rank counts 1 and 2 every point runs the same threads per rank: cores / 2, at most OMP_NUM_THREADS. (Under
    # CTest's OMP_NUM_THREADS=1 every point had one thread before too; scaling_threads() below checks the rule
    # without it.)
    env = os.environ.get("OMP_NUM_THREADS", "")
    want_threads = max(1, min(len(os.sched_getaffinity(0)) // 2, int(env) if env.isdigit() and int(env) else 1 << 30))
    check({r["threads"] for r in ok.values()} == {str(want_threads)},
          f"a sweep over rank counts runs {want_threads} thread(s) per rank at each: "
          f"{ {n: r['threads'] for n, r in ok.items()} }")
    check(all(abs(float(ok[n]["scaling_efficiency"]) - e) < 1e-9 for n, e in want_eff.items()) and cost_ok,
          f"scaling efficiency {[ok[n]['scaling_efficiency'] for n in sorted(ok)]}, device-hours and cost at 2.5 per "
          f"device-hour")
    return by


def check_steps(out, summary):
    cols, rows = read_csv(os.path.join(out, "steps.csv"))
    check(cols[:5] == ["point", "label", "settings", "np", "parallel.tp"], f"steps.csv settings columns: {cols[:5]}")
    ok_points = [p for p, r in summary.items() if r["status"] == "ok"]
    check(len(rows) == STEPS * len(ok_points), f"steps.csv has {STEPS} rows per ok point ({len(rows)})")
    for p in ok_points:
        mine = [r for r in rows if r["point"] == p]
        m = metrics(summary[p]["run_dir"])
        fields = sorted({k for x in m for k in x})
        ok = len(mine) == len(m) and all(same(row[k], x.get(k)) for row, x in zip(mine, m) for k in fields)
        ok &= all(row["np"] == summary[p]["np"] and row["parallel.tp"] == summary[p]["parallel.tp"] for row in mine)
        check(ok, f"steps.csv rows of {p} equal its metrics.jsonl in every field ({', '.join(fields)})")


def check_png(path):
    try:
        with open(path, "rb") as f:
            head = f.read(24)
        size = os.path.getsize(path)
    except OSError:
        return check(False, f"{path} exists")
    w, h = struct.unpack(">II", head[16:24]) if len(head) == 24 else (0, 0)
    return check(head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR" and size > 5000 and w > 200 and h > 200,
                 f"{os.path.basename(path)} is a PNG of {size} bytes, {w}x{h}")


def scaling_threads():
    # Without OMP_NUM_THREADS (CTest sets it to 1): a sweep over rank counts gives each rank the cores over the most
    # ranks, so the one-rank point does not take every core; a sweep at one rank count keeps the trainer's default.
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    n = max(1, len(os.sched_getaffinity(0)) // 2)

    def dry(np_list):
        r = subprocess.run(SWEEP + ["--config", TINY, "--np", np_list, "--dry-run", "--out", os.path.join(work, "dry")],
                           capture_output=True, text=True, timeout=60, env=env)
        return [l for l in r.stdout.splitlines() if l.startswith("[")], r.stderr
    lines, err = dry("1,2")
    check(len(lines) == 2 and all(f"train.threads={n}" in l for l in lines) and "per rank at every rank count" in err,
          f"--np 1,2 without OMP_NUM_THREADS: train.threads={n} at both rank counts, said on stderr: {lines} {err!r}")
    lines, err = dry("2")
    check(len(lines) == 1 and "train.threads" not in lines[0] and not err, f"--np 2 alone: the trainer's default "
          f"threads: {lines} {err!r}")


def main():
    shutil.rmtree(work, ignore_errors=True)
    out = os.path.join(work, "sweep")
    base = ["--config", TINY, "--trainer", trainer, "--mpiexec", mpiexec, "--out", out, "--np", "1,2",
            "--grid", "parallel.tp=1,2", "--set", f"train.steps={STEPS}", "--set", "train.eval_every=2",
            "--warmup", str(WARMUP), "--price-per-device-hour", "2.5"]
    rc, log = run(SWEEP + base)
    check(rc == 0 and "3 of 4 points ok" in log, f"the sweep runs every point past the failing one (exit {rc})")
    if rc != 0:
        print(log)
    summary = check_summary(out)
    check_steps(out, summary)
    scaling_threads()

    stamps = {p: os.path.getmtime(os.path.join(out, p, "metrics.jsonl")) for p in ("np1_tp1", "np2_tp1", "np2_tp2")}
    rc, log = run(SWEEP + base + ["--skip-done", "--strict"])
    same_files = all(os.path.getmtime(os.path.join(out, p, "metrics.jsonl")) == t for p, t in stamps.items())
    check(rc == 1 and log.count("done before, skipped") == 3 and same_files,
          f"--skip-done reuses the 3 ok points, reruns the failed one, and --strict exits 1 (exit {rc})")

    rc, log = run(SWEEP + ["--config", TINY, "--trainer", trainer, "--mpiexec", mpiexec, "--out",
                           os.path.join(work, "misspelt"), "--grid", "parallel.tpp=1,2"])
    check(rc == 1 and "0 of 2 points ok" in log and "every point failed (the first: failed (exit 2): unknown key "
          "'parallel.tpp'" in log, f"a sweep whose every point fails exits 1 naming the first error (exit {rc})")

    for args, words in ((["--grid", "parallel.tp="], "has no values"), (["--grid", "parallel.pp"], "has no values"),
                        (["--np", "0"], "positive"), (["--set", "run.dir=x"], "run.dir")):
        rc, log = run(SWEEP + ["--config", TINY, "--trainer", trainer, "--out", os.path.join(work, "bad")] + args)
        check(rc == 2 and words in log, f"sweep.py {' '.join(args)}: exit 2 naming the problem ({rc}: {log.strip()})")

    meta = json.load(open(os.path.join(out, "sweep.json")))
    check(meta["config"].endswith("tiny.yaml") and meta["np"] == [1, 2] and "parallel.tp" in meta["varied"],
          f"sweep.json says what the sweep ran: {meta}")
    figs = os.path.join(work, "figs")
    rc, log = run(PLOT + ["all", out, "-o", figs])
    check(rc == 0 and "titles: tiny.yaml on 1, 2 rank(s); link shared memory (not emulated); varying parallel.tp"
          in log, f"plot.py all exits 0, its titles naming the config, ranks and link ({rc}: {log.strip()})")
    check(re.search(r"scaling efficiency, strong \(global batch 4 at every rank count; \d+ thread\(s\) per rank\)", log),
          "the scaling figure says it is strong scaling, with the global batch and threads per rank")
    for name in ("loss.png", "breakdown.png", "scaling.png"):
        check_png(os.path.join(figs, name))
    runs = [os.path.join(out, p) for p in ("np2_tp1", "np2_tp2")]
    rc, log = run(PLOT + ["loss"] + runs + ["-o", os.path.join(figs, "loss_dirs.png")])
    check(rc == 0, f"plot.py loss RUN_DIR RUN_DIR exits 0 ({rc}: {log.strip()})")
    check_png(os.path.join(figs, "loss_dirs.png"))
    for x in ("time", "bytes"):  # time- and bytes-to-loss, from run dirs and from the sweep's steps.csv
        for srcs, name in ((runs, f"loss_{x}_dirs.png"), ([out], f"loss_{x}_sweep.png")):
            rc, log = run(PLOT + ["loss"] + srcs + ["--x", x, "-o", os.path.join(figs, name)])
            check(rc == 0, f"plot.py loss --x {x} exits 0 ({rc}: {log.strip()})")
            check_png(os.path.join(figs, name))

    # Weak scaling: --batch-per-rank 2 gives np 1 and 2 global batches 2 and 4; the efficiency compares them (one
    # group of settings) and the figure says weak.
    weak = os.path.join(work, "weak")
    rc, log = run(SWEEP + ["--config", TINY, "--trainer", trainer, "--mpiexec", mpiexec, "--out", weak, "--np", "1,2",
                           "--batch-per-rank", "2", "--set", "train.micro_batch=1", "--set", f"train.steps={STEPS}",
                           "--warmup", str(WARMUP)])
    _, wrows = read_csv(os.path.join(weak, "summary.csv")) if rc == 0 else (None, [])
    batch = {r["np"]: re.search(r"^\s+global_batch: (\d+)", open(os.path.join(r["run_dir"], "config.yaml")).read(),
                                re.M).group(1) for r in wrows if r["status"] == "ok"}
    eff = {r["np"]: float(r["scaling_efficiency"]) for r in wrows if r["status"] == "ok"}
    tps = {r["np"]: float(r["tokens_per_s_median"]) for r in wrows if r["status"] == "ok"}
    check(batch == {"1": "2", "2": "4"} and eff.get("1") == 1.0 and
          abs(eff.get("2", 0) - tps.get("2", 0) / 2 / tps.get("1", 1)) < 1e-9,
          f"--batch-per-rank 2: global batches {batch}, the np 2 point's efficiency against np 1's: {eff} (exit {rc})")
    rc, log = run(PLOT + ["scaling", os.path.join(weak, "summary.csv"), "-o", os.path.join(figs, "weak.png")])
    check(rc == 0 and "scaling efficiency, weak (global batch 2 per rank" in log,
          f"the weak sweep's figure says weak scaling ({rc}: {log.strip()})")

    # A sweep of a plan's rows (as build/planner --json writes them): each row's rank count and layout, the plan's
    # --set flags for all, and its prediction beside the measurement; then the predicted-against-measured figure.
    # By default only the fastest row of each mesh runs (mesh_best, as the planner's table shows them).
    plan = os.path.join(work, "plan.json")
    with open(plan, "w") as f:
        json.dump([{"rank": 1, "step_ms": 0.5, "mesh_best": True, "sweep_command": f"scripts/sweep.py --config {TINY} "
                    f"--np 2 --set train.steps={STEPS} --point 'parallel.tp=2 train.micro_batch=4'"},
                   {"rank": 2, "step_ms": 0.6, "mesh_best": False, "sweep_command": f"scripts/sweep.py --config "
                    f"{TINY} --np 2 --set train.steps={STEPS} --point 'parallel.tp=2 train.micro_batch=2'"},
                   {"rank": 3, "step_ms": 0.7, "mesh_best": True, "sweep_command": f"scripts/sweep.py --config {TINY} "
                    f"--np 1 --set train.steps={STEPS}"}], f)
    rc, log = run(SWEEP + ["--config", TINY, "--out", os.path.join(work, "every"), "--from-plan", plan,
                           "--plan-every-layout", "--dry-run"])
    check(rc == 0 and "[3/3] np1:" in log and "np2_tp2_micro_batch2:" in log,
          f"--plan-every-layout takes every row of the plan, in rank order ({rc}: {log.strip()})")
    planned = os.path.join(work, "planned")
    rc, log = run(SWEEP + ["--config", TINY, "--trainer", trainer, "--mpiexec", mpiexec, "--out", planned,
                           "--from-plan", plan, "--warmup", str(WARMUP)])
    _, prow = read_csv(os.path.join(planned, "summary.csv")) if rc == 0 else (None, [])
    got = [(r["point"], r["plan_rank"], r["predicted_step_ms"], r["tp"], r["steps"]) for r in prow]
    check(got == [("np2_tp2_micro_batch4", "1", "0.5", "2", str(STEPS)), ("np1", "3", "0.7", "1", str(STEPS))],
          f"--from-plan runs the plan's fastest row of each mesh with its --set flags, each with its prediction: "
          f"{got} (exit {rc})")
    rc, log = run(PLOT + ["predicted", os.path.join(planned, "summary.csv"), "-o", os.path.join(figs, "pred.png")])
    check(rc == 0 and "prediction error over 2 layouts" in log and
          re.search(r"titles: tiny\.yaml on [12], [12] rank\(s\); link shared memory", log),
          f"plot.py predicted: the table and errors, titled with the sweep's config, ranks and link ({rc}: {log})")
    check_png(os.path.join(figs, "pred.png"))
    rc, log = run(PLOT + ["all", planned, "-o", os.path.join(figs, "planned")])
    check(rc == 0 and os.path.isfile(os.path.join(figs, "planned", "predicted.png")),
          f"plot.py all draws predicted.png for a sweep of a plan ({rc})")

    # A time budget: the point is stopped by SIGTERM after 1.5 s (it finishes its step, checkpoints, exits 0), and
    # the time and tokens to a target loss come from its rows.
    budget = os.path.join(work, "budget")
    rc, log = run(SWEEP + ["--config", TINY, "--trainer", trainer, "--mpiexec", mpiexec, "--out", budget, "--np", "2",
                           "--set", "train.steps=1000000", "--time-budget", "1.5", "--target-loss", "4.0"])
    _, brow = read_csv(os.path.join(budget, "summary.csv")) if rc == 0 else (None, [{}])
    b = brow[0]
    m = metrics(b["run_dir"]) if b.get("run_dir") else []
    hit = next((x for x in m if x["loss"] <= 4.0), None)
    check(rc == 0 and b.get("status") == "ok" and b.get("stopped_by_budget") == "True" and 0 < len(m) < 1000000 and
          hit is not None and same(b.get("time_to_target_s"), hit["elapsed_ms"] / 1000) and
          b.get("tokens_to_target") == str(hit["tokens"]),
          f"--time-budget 1.5 stops the point ({len(m)} steps, exit {rc}); --target-loss 4.0 reached at "
          f"{b.get('time_to_target_s')} s, {b.get('tokens_to_target')} tokens")

    # Repeats: each point run twice in folders of their own; the breakdown merges them with their spread.
    rep = os.path.join(work, "repeat")
    rc, log = run(SWEEP + ["--config", TINY, "--trainer", trainer, "--out", rep, "--set", f"train.steps={STEPS}",
                           "--repeat", "2"])
    _, rrows = read_csv(os.path.join(rep, "summary.csv")) if rc == 0 else (None, [])
    check([(r["point"], r["repeat"], r["status"]) for r in rrows] == [("base_r1", "1", "ok"), ("base_r2", "2", "ok")],
          f"--repeat 2: two runs of the point ({[(r['point'], r['repeat']) for r in rrows]}, exit {rc})")
    rc, log = run(PLOT + ["breakdown", os.path.join(rep, "summary.csv"), "-o", os.path.join(figs, "rep.png")])
    check(rc == 0, f"plot.py breakdown of repeats: exit {rc}")
    check_png(os.path.join(figs, "rep.png"))
    # The same two runs as a planned layout: the predicted figure shows them as one point with their spread.
    cols, rrows = read_csv(os.path.join(rep, "summary.csv"))
    with open(os.path.join(work, "rep_planned.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows(dict(r, plan_rank="1", predicted_step_ms="1.0") for r in rrows)
    rc, log = run(PLOT + ["predicted", os.path.join(work, "rep_planned.csv"), "-o", os.path.join(figs, "rep_pred.png")])
    check(rc == 0 and "prediction error over 1 layouts" in log,
          f"plot.py predicted merges a point's repeats into one layout ({rc}: {log.strip()[-300:]})")
    check_png(os.path.join(figs, "rep_pred.png"))

    for args, words in ((["histogram", out], "invalid choice"), (["scaling", os.path.join(work, "none.csv")],
                                                                  "no such file"),
                        (["breakdown", os.path.join(out, "steps.csv")], "missing column")):
        rc, log = run(PLOT + args)
        check(rc == 2 and words in log, f"plot.py {args[0]}: exit 2 naming the problem ({rc}: {log.strip()[-200:]})")

    print(f"{'FAIL' if failures else 'PASS'}: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
