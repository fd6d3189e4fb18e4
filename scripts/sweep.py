#!/usr/bin/python3
# scripts/sweep.py: runs meshtrain over a grid of meshes or settings through mpiexec, one run.dir per point, and
# collects every point's metrics.jsonl into steps.csv (every step) and summary.csv (one row per point).
# Standard library only. `scripts/sweep.py --help` documents the options and the CSV columns.
"""Run build/trainer over the cartesian product of --grid values (and --np rank counts), one run.dir per point
under --out, and collect the metrics into OUT/steps.csv and OUT/summary.csv.

Each point runs as `mpiexec -n NP TRAINER --config CONFIG --set ... --set run.dir=OUT/POINT` (a single rank runs
without mpiexec). The point's directory keeps the trainer's outputs, its combined stdout/stderr (train.log) and
point.json (settings, command, exit status, error). A failing point (a non-zero exit, e.g. 2 for an invalid
layout, or a timeout) is recorded with its status and error message and the sweep goes on. The sweep's own exit
status is 0 when it ran every point (failed ones included; with --strict, 1 when any failed), 1 when every point
failed (a misspelt key fails them all), 2 for a bad command line.

Grid and points:
  --grid KEY=V1,V2,...  a dotted config key (as for the trainer's --set) and its values; repeat for more keys; the
                        grid is the cartesian product. Commas inside [...] stay in one value
                        (--grid parallel.stage_layers=[3,1],[2,2]). The key `np` varies the rank count.
  --np N[,N...]         the rank count(s), the same as --grid np=...; default 1.
  --point "K=V K=V"     one explicit bundle of settings (space-separated); repeat for a list of non-grid points
                        (e.g. meshes with different np). Points multiply with the grid.
  --set KEY=VALUE       fixed overrides for every point (before the point's own settings).
  --from-plan PLAN.json the points are build/planner --json's rows (the first --plan-top, default 8): each row's
                        rank count and layout, with the planner's own --set flags; summary.csv then has each
                        point's plan_rank and predicted_step_ms beside what it measured (plot.py predicted).
                        As the planner's table, it takes the fastest row of each mesh (dp x cp x tp x pp);
                        --plan-every-layout takes the rows in rank order (the best mesh's schedules, micro-batches
                        and ZeRO stages first).
parallel.dp is set to 0 (dp = ranks / (tp*pp)) unless given, so a grid over tp and pp at a fixed np (or over np)
gets its dp from the rank count. run.resume is none unless given: a point always starts afresh.
Threads: when a point's ranks x OMP_NUM_THREADS (or x 1 when unset) exceed the cores, it runs with one compute
thread per rank (OMP_NUM_THREADS=1, train.threads=1); --threads N forces N; train.threads in --set/--grid wins.
A sweep over several rank counts gives every point the same threads per rank: the cores over the most ranks (at
least 1, at most OMP_NUM_THREADS where set), so that scaling_efficiency compares equal ranks.

steps.csv, one row per point per metrics.jsonl row (every optimizer step):
  point, label, settings, np, <each grid/point key>, then every metrics field the trainer wrote: step, loss, lr,
  grad_norm, tokens, step_ms, tokens_per_s, compute_ms, comm_ms, comm_cpu_ms, exposed_comm_ms, bubble_ms,
  comm_bytes, val_loss
  (only on evaluation rows; empty elsewhere), and extra fields such as loss_scale, skipped_steps when present.
  A null (non-finite) value is an empty cell.

sweep.json: what the sweep is of (config, the rank counts, the --set overrides, the keys varied): scripts/plot.py
titles its figures with it.

summary.csv, one row per point:
  point        the point's directory name under --out (its settings, e.g. np4_tp2_pp1)
  label        a readable name for legends: the mesh (dp2 x tp2 x pp1) plus any non-mesh grid settings
  settings     the grid/point settings other than np, as "key=value key=value" ("" for none)
  np, <keys>   the rank count and each grid/point key's value
  dp, tp, pp   the mesh the trainer reported (empty if it did not start)
  threads      compute threads per rank, as the trainer reported
  status       ok | failed | timeout
  returncode   the trainer's exit status (2 = bad config or layout, 1 = failure while running)
  error        the trainer's error message (its first "error" log line), empty when ok
  steps        metrics rows written
  final_loss, final_val_loss   the last step's loss and the last evaluation's val_loss
  step_ms_median, tokens_per_s_median, compute_ms_median, comm_ms_median, comm_cpu_ms_median,
  exposed_comm_ms_median, bubble_ms_median, comm_bytes_median
               medians over the steps after the first --warmup steps (over all steps if there are no more)
  step_ms_mean, compute_ms_mean, exposed_comm_ms_mean, bubble_ms_mean
               means over the same steps: the trainer reports compute_ms = step_ms - exposed_comm_ms - bubble_ms
               per step (each of the last two the maximum over ranks, compute clamped at 0), so the means add up
               to step_ms_mean (but for steps where the clamp acted) where medians need not; plot.py's
               breakdown stacks these
  measured_steps  how many steps those medians and means cover
  peak_rss_mib           peak resident memory: the maximum over ranks from run.dir/memory.json when the
                         trainer writes one, else rank 0's from the log's "done" line
  peak_tensor_mib        high-water mark of tensor memory, maximum over ranks (memory.json only)
  peak_activations_mib   the largest rank's (pipeline stage's) peak activation records
  optimizer_state_bytes  the largest rank's optimizer state (memory.json, else rank 0's "memory per rank" line)
  wall_s       wall-clock seconds of the whole point (start-up included): its time to solution
  device_hours np x wall_s / 3600: what the point used of the machine
  tokens       tokens trained (the last metrics row's)
  scaling_efficiency  tokens/s per rank against the point of the same settings with the fewest ranks (its runs'
               mean with --repeat; 1.0 there on average):
               strong scaling when global_batch stays fixed over np, weak scaling when it grows with np
               (--batch-per-rank B: each point's global_batch is B x np)
  cost, cost_per_billion_tokens   with --price-per-device-hour P: device_hours x P, and that per 10^9 tokens
  plan_rank, predicted_step_ms    with --from-plan: the planner's rank and predicted step time of the point
  stopped_by_budget   whether --time-budget stopped the point (SIGTERM: it finished its step and checkpointed)
  repeat       1 .. --repeat N: the point's run (each in its own folder, NAME_rK); plot.py draws their spread
  time_to_target_s, tokens_to_target   with --target-loss L: the elapsed time and tokens at the first row whose
               val_loss (where the point evaluates, else its training loss) is at most L; empty if none was
  run_dir      the point's directory
"""
import argparse
import csv
import itertools
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESH_KEYS = ("np", "parallel.dp", "parallel.tp", "parallel.pp")
METRIC_ORDER = ["step", "loss", "lr", "grad_norm", "tokens", "step_ms", "tokens_per_s", "compute_ms", "comm_ms",
                "comm_cpu_ms", "exposed_comm_ms", "bubble_ms", "comm_bytes", "val_loss"]
MEDIAN_FIELDS = ["step_ms", "tokens_per_s", "compute_ms", "comm_ms", "comm_cpu_ms", "exposed_comm_ms", "bubble_ms",
                 "comm_bytes"]
MEAN_FIELDS = ["step_ms", "compute_ms", "exposed_comm_ms", "bubble_ms"]  # additive: compute = step - exposed - bubble
SUMMARY_TAIL = (["dp", "tp", "pp", "threads", "status", "returncode", "error", "steps", "final_loss",
                 "final_val_loss"] + [f + "_median" for f in MEDIAN_FIELDS] + [f + "_mean" for f in MEAN_FIELDS] +
                ["measured_steps", "peak_rss_mib", "peak_tensor_mib", "peak_activations_mib", "optimizer_state_bytes",
                 "wall_s", "device_hours", "tokens", "scaling_efficiency", "cost", "cost_per_billion_tokens",
                 "plan_rank", "predicted_step_ms", "stopped_by_budget", "time_to_target_s", "tokens_to_target",
                 "repeat", "run_dir"])

MESH_RE = re.compile(r"mesh dp=(\d+) x tp=(\d+) x pp=(\d+).*?(\d+) compute threads per rank")
RSS_RE = re.compile(r"peak RSS ([\d.]+) MiB")
ACTS_RE = re.compile(r"peak activations ([\d.]+) MiB")  # per pipeline stage, or the one line without a pipeline
OPT_RE = re.compile(r"optimizer state [\d.]+ MiB \((\d+) bytes\)")
ERROR_RE = re.compile(r"^(?:\[[^\]]*\]\s*)?(?:error|critical)\b\s*(.*)$", re.IGNORECASE)


def die(msg):
    print(f"sweep: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------------------------
# The command line and the points


def split_values(text):
    """'1,2,[3,1]' -> ['1', '2', '[3,1]']: commas inside brackets stay in the value."""
    values, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            values.append(cur.strip())
            cur = ""
        else:
            cur += ch
    values.append(cur.strip())
    return values


def parse_grid(items, np_arg):
    """--grid KEY=V1,V2 items (and --np) -> list of (key, [values]), np first."""
    axes = []
    for item in items:
        key, eq, vals = item.partition("=")
        key = key.strip()
        if not key:
            die(f"--grid {item!r}: no key; expected KEY=V1,V2,...")
        values = split_values(vals) if eq else []
        if not values or any(v == "" for v in values):
            die(f"--grid {item!r}: the key {key!r} has no values (or an empty one); expected {key}=V1,V2,...")
        if any(k == key for k, _ in axes):
            die(f"--grid {key} is given twice")
        axes.append((key, values))
    if np_arg is not None:
        if any(k == "np" for k, _ in axes):
            die("give the rank counts either as --np or as --grid np=..., not both")
        values = split_values(np_arg)
        if not values or any(v == "" for v in values):
            die(f"--np {np_arg!r}: expected N or N1,N2,...")
        axes.append(("np", values))
    for key, values in axes:
        if key == "np" and not all(v.isdigit() and int(v) > 0 for v in values):
            die(f"np values must be positive integers, got {','.join(values)}")
    axes.sort(key=lambda kv: kv[0] != "np")  # np first, the rest in the order given
    return axes


def parse_point(text):
    """'np=4 parallel.tp=2' -> {'np': '4', 'parallel.tp': '2'}."""
    point = {}
    for tok in shlex.split(text):
        key, eq, value = tok.partition("=")
        if not eq or not key or value == "":
            die(f"--point {text!r}: {tok!r} is not KEY=VALUE")
        point[key] = value
    if not point:
        die("--point needs at least one KEY=VALUE")
    if "np" in point and not (point["np"].isdigit() and int(point["np"]) > 0):
        die(f"--point {text!r}: np must be a positive integer")
    return point


def plan_points(path, top, every_layout=False):
    """The first `top` rows of build/planner --json as points (np and the layout's overrides, from each row's
    sweep_command), their (rank, predicted step_ms), and the planner's own --set flags. Unless `every_layout`,
    only the rows that are the fastest of their mesh (mesh_best; a plan without the field counts every row)."""
    try:
        rows = json.load(open(path))
        assert isinstance(rows, list) and rows and all("sweep_command" in r for r in rows)
    except (OSError, ValueError, AssertionError):
        die(f"--from-plan {path}: not build/planner --json output (a list of rows with sweep_command)")
    points, predicted, sets = [], [], []
    if not every_layout:
        rows = [r for r in rows if r.get("mesh_best", True)]
    for r in rows[:top]:
        words = shlex.split(r["sweep_command"])
        point = {"np": words[words.index("--np") + 1]}
        if "--point" in words:
            point.update(parse_point(words[words.index("--point") + 1]))
        points.append(point)
        predicted.append((r.get("rank"), r.get("step_ms")))
        sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        config = words[words.index("--config") + 1]
    return points, predicted, sets, config


def expand(axes, points):
    """The cartesian product of the grid axes, times the explicit points (if any), as ordered dicts."""
    grid = [dict(zip([k for k, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])]
    if not points:
        return grid
    out = []
    for p in points:
        for g in grid:
            clash = set(p) & set(g)
            if clash:
                die(f"--point and --grid both set {', '.join(sorted(clash))}")
            merged = {"np": p.get("np", g.get("np"))} if ("np" in p or "np" in g) else {}
            merged.update({k: v for k, v in p.items() if k != "np"})
            merged.update({k: v for k, v in g.items() if k != "np"})
            out.append(merged)
    return out


def short_names(keys):
    """Dotted keys -> short, unique names for directory names: the last component unless two keys share it."""
    last = {k: k.split(".")[-1] for k in keys}
    counts = {}
    for v in last.values():
        counts[v] = counts.get(v, 0) + 1
    return {k: (last[k] if counts[last[k]] == 1 else k.replace(".", "-")) for k in keys}


def safe(text):
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "x"


def point_name(settings, shorts):
    if not settings:
        return "base"
    return "_".join(f"{shorts[k]}{safe(v)}" for k, v in settings.items())


def settings_text(settings):
    return " ".join(f"{k}={v}" for k, v in settings.items() if k != "np")


# ---------------------------------------------------------------------------------------------------------------
# Running one point


def cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def thread_settings(np_, sets, settings, forced):
    """(extra --set list, environment changes) for the compute threads of a point."""
    if "train.threads" in sets or "train.threads" in settings:
        return [], {}
    if forced:
        return [f"train.threads={forced}"], {"OMP_NUM_THREADS": str(forced)}
    per_rank = int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    if np_ * max(per_rank, 1) > cores():
        return ["train.threads=1"], {"OMP_NUM_THREADS": "1"}
    return [], {}


def scaling_threads(args, points):
    """A sweep over rank counts gives every point the same compute threads per rank (the cores over the most
    ranks, at least 1, at most OMP_NUM_THREADS where set), unless --threads or train.threads says otherwise: with
    the trainer's default (cores / ranks) one rank would get every core and its scaling efficiency would compare
    ranks of unequal shares. Says so, and warns where the most ranks exceed the cores (they then take turns)."""
    counts = sorted({int(p.get("np", 1)) for p in points})
    given = any(s.partition("=")[0] == "train.threads" for s in args.set) or any("train.threads" in p for p in points)
    if len(counts) < 2 or given:
        return
    if not args.threads:
        args.threads = max(1, cores() // counts[-1])
        env = os.environ.get("OMP_NUM_THREADS", "")
        if env.isdigit() and int(env) > 0:
            args.threads = min(args.threads, int(env))
        print(f"sweep: {args.threads} compute thread{'s' * (args.threads > 1)} per rank at every rank count "
              f"({', '.join(map(str, counts))}), so that each scales from equal ranks (--threads N to choose)",
              file=sys.stderr)
    if counts[-1] * args.threads > cores():
        over = [n for n in counts if n * args.threads > cores()]
        print(f"sweep: warning: {', '.join(map(str, over))} ranks x {args.threads} thread{'s' * (args.threads > 1)} "
              f"exceed the {cores()} cores: the ranks take turns on them, so those points' tokens/s and scaling "
              "efficiency measure the sharing, not the scaling", file=sys.stderr)


def build_command(args, sets, settings, run_dir):
    """The point's argv and environment."""
    np_ = int(settings.get("np", 1))
    overrides = list(sets)
    given = {s.partition("=")[0] for s in sets} | set(settings)
    if "parallel.dp" not in given:
        overrides.append("parallel.dp=0")
    if "run.resume" not in given:
        overrides.append("run.resume=none")
    overrides += [f"{k}={v}" for k, v in settings.items() if k != "np"]
    if args.batch_per_rank:  # weak scaling: the global batch grows with the rank count
        overrides.append(f"train.global_batch={args.batch_per_rank * np_}")
    extra, env_changes = thread_settings(np_, {s.partition("=")[0] for s in sets}, settings, args.threads)
    overrides += extra
    overrides.append(f"run.dir={run_dir}")
    cmd = ([args.mpiexec, "-n", str(np_)] if np_ > 1 else []) + [args.trainer, "--config", args.config]
    for o in overrides:
        cmd += ["--set", o]
    return cmd, env_changes


def first_error(log):
    """The trainer's first error line (without its timestamp), else the last non-empty line."""
    lines = [l.strip() for l in log.splitlines() if l.strip()]
    for line in lines:
        m = ERROR_RE.match(line)
        if m:
            return m.group(1).strip() or line
    return lines[-1] if lines else "no output"


def run_process(cmd, env, log_path, timeout, budget=0.0):
    """Runs cmd with its output in log_path; returns (returncode or None on timeout, seconds, whether the budget
    stopped it). With a budget (seconds), SIGTERM then: the trainer's run.stop_signals has every rank finish its
    step, write a checkpoint and exit 0 (mpiexec passes the signal on to the ranks)."""
    t0 = time.monotonic()
    stopped = False
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            if budget > 0:
                try:
                    proc.wait(timeout=budget)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGTERM)
                    stopped = True
            rc = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the point's own process group: mpiexec and its ranks
            proc.wait()
            rc = None
    return rc, time.monotonic() - t0, stopped


def clear_outputs(run_dir):
    """Removes a previous run's files that would be mistaken for this one's."""
    for name in ("metrics.jsonl", "memory.json", "point.json", "train.log", "trace.json"):
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            os.remove(path)


def run_point(args, sets, settings, name, run_dir):
    cmd, env_changes = build_command(args, sets, settings, run_dir)
    os.makedirs(run_dir, exist_ok=True)
    clear_outputs(run_dir)
    log_path = os.path.join(run_dir, "train.log")
    rc, secs, stopped = run_process(cmd, dict(os.environ, **env_changes), log_path, args.timeout, args.time_budget)
    with open(log_path) as f:
        log = f.read()
    has_metrics = os.path.isfile(os.path.join(run_dir, "metrics.jsonl"))
    if rc is None:
        status, error = "timeout", f"timed out after {args.timeout:g} s"
    elif rc != 0:
        status, error = "failed", first_error(log)
    elif not has_metrics:
        status, error = "failed", "exited 0 but wrote no metrics.jsonl"
    else:
        status, error = "ok", ""
    record = {"point": name, "settings": settings, "command": cmd, "env": env_changes, "status": status,
              "returncode": rc, "error": error, "wall_s": round(secs, 3), "stopped_by_budget": stopped}
    with open(os.path.join(run_dir, "point.json"), "w") as f:
        json.dump(record, f, indent=1)
    return record


def done_record(args, sets, settings, run_dir):
    """The point.json of a finished point run with the same command, or None."""
    try:
        with open(os.path.join(run_dir, "point.json")) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    cmd, _ = build_command(args, sets, settings, run_dir)
    ok = record.get("status") == "ok" and record.get("command") == cmd
    return record if ok and os.path.isfile(os.path.join(run_dir, "metrics.jsonl")) else None


# ---------------------------------------------------------------------------------------------------------------
# Collecting


def read_metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def median_of(rows, field):
    vals = [r[field] for r in rows if isinstance(r.get(field), (int, float))]
    return statistics.median(vals) if vals else None


def mean_of(rows, field):
    vals = [r[field] for r in rows if isinstance(r.get(field), (int, float))]
    return round(statistics.fmean(vals), 4) if vals else None  # the trainer writes times to 0.1 us


def parse_log(run_dir):
    """Mesh, threads and memory figures from the point's train.log (memory: rank 0's)."""
    try:
        with open(os.path.join(run_dir, "train.log")) as f:
            log = f.read()
    except OSError:
        return {}
    out = {}
    m = MESH_RE.search(log)
    if m:
        out.update(dp=int(m.group(1)), tp=int(m.group(2)), pp=int(m.group(3)), threads=int(m.group(4)))
    m = RSS_RE.search(log)
    if m:
        out["peak_rss_mib"] = float(m.group(1))
    acts = [float(x) for x in ACTS_RE.findall(log)]
    if acts:
        out["peak_activations_mib"] = max(acts)
    m = OPT_RE.search(log)
    if m:
        out["optimizer_state_bytes"] = int(m.group(1))
    return out


def parse_memory(run_dir):
    """Maxima over ranks from run.dir/memory.json ({"ranks": [{...}, ...]}), when the trainer wrote one."""
    try:
        with open(os.path.join(run_dir, "memory.json")) as f:
            ranks = json.load(f)["ranks"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    out = {}
    for col, field, scale in (("peak_rss_mib", "peak_rss_bytes", 1 / 1048576),
                              ("peak_tensor_mib", "peak_tensor_bytes", 1 / 1048576),
                              ("peak_activations_mib", "activation_bytes", 1 / 1048576),
                              ("optimizer_state_bytes", "optimizer_bytes", 1)):
        vals = [r[field] for r in ranks if isinstance(r.get(field), (int, float))]
        if vals:
            out[col] = round(max(vals) * scale, 3) if scale != 1 else int(max(vals))
    return out


def mesh_label(settings, info):
    """'dp2 x tp2 x pp1' (+ the non-mesh settings) for legends and bar labels."""
    if "dp" in info:
        mesh = f"dp{info['dp']} x tp{info['tp']} x pp{info['pp']}"
    else:
        np_ = settings.get("np", "1")
        mesh = f"np{np_}" + "".join(f" {k.split('.')[-1]}{v}" for k, v in settings.items() if k in MESH_KEYS[1:])
    rest = [f"{k.split('.')[-1]}={v}" for k, v in settings.items() if k not in MESH_KEYS]
    return " ".join([mesh] + rest)


def summarize(record, run_dir, warmup, target=None):
    settings = record["settings"]
    rows = read_metrics(run_dir)
    info = parse_log(run_dir)
    info.update(parse_memory(run_dir))
    measured = rows[warmup:] if len(rows) > warmup else rows
    vals = [r["val_loss"] for r in rows if isinstance(r.get("val_loss"), (int, float))]
    out = {"point": record["point"], "label": mesh_label(settings, info), "settings": settings_text(settings),
           "np": settings.get("np", "1")}
    out.update({k: v for k, v in settings.items() if k != "np"})
    out.update(info)
    out.update(status=record["status"], returncode=record["returncode"], error=record["error"], steps=len(rows),
               final_loss=rows[-1].get("loss") if rows else None, final_val_loss=vals[-1] if vals else None,
               measured_steps=len(measured), wall_s=record.get("wall_s"), run_dir=run_dir,
               tokens=rows[-1].get("tokens") if rows else None)
    if out["wall_s"] is not None:
        out["device_hours"] = int(out["np"]) * out["wall_s"] / 3600
    out["stopped_by_budget"] = record.get("stopped_by_budget", False)
    if target is not None:  # the first row at or below the target: its val_loss where evaluated, else its loss
        field = "val_loss" if vals else "loss"
        hit = next((r for r in rows if isinstance(r.get(field), (int, float)) and r[field] <= target), None)
        if hit:
            out["time_to_target_s"] = hit["elapsed_ms"] / 1000
            out["tokens_to_target"] = hit.get("tokens")
    for f in MEDIAN_FIELDS:
        out[f + "_median"] = median_of(measured, f)
    for f in MEAN_FIELDS:
        out[f + "_mean"] = mean_of(measured, f)
    return out, rows


def cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return v


def write_csv(path, columns, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow([cell(r.get(c)) for c in columns])
    os.replace(tmp, path)


def scale_and_cost(results, price):
    """Each ok point's scaling efficiency against the ok point of its settings with the fewest ranks, and with a
    price per device-hour its cost."""
    ok = [s for s, _ in results if s["status"] == "ok" and s.get("tokens_per_s_median")]
    for s in ok:
        same = [o for o in ok if o["settings"] == s["settings"]]
        fewest = min(int(o["np"]) for o in same)
        base = [o["tokens_per_s_median"] for o in same if int(o["np"]) == fewest]  # its repeats' mean
        s["scaling_efficiency"] = (s["tokens_per_s_median"] / int(s["np"])) / (sum(base) / len(base) / fewest)
    for s, _ in results:
        if price and s.get("device_hours") is not None:
            s["cost"] = s["device_hours"] * price
            if s.get("tokens"):
                s["cost_per_billion_tokens"] = s["cost"] / (s["tokens"] / 1e9)


def write_tables(out_dir, setting_keys, results, price=0.0):
    """results: list of (summary dict, metrics rows). Writes steps.csv and summary.csv."""
    scale_and_cost(results, price)
    head = ["point", "label", "settings", "np"] + [k for k in setting_keys if k != "np"]
    metric_cols = list(METRIC_ORDER)
    step_rows = []
    for summary, rows in results:
        for r in rows:
            for k in r:
                if k not in metric_cols:
                    metric_cols.append(k)
            step_rows.append(dict({c: summary.get(c) for c in head}, **r))
    write_csv(os.path.join(out_dir, "steps.csv"), head + metric_cols, step_rows)
    write_csv(os.path.join(out_dir, "summary.csv"), head + SUMMARY_TAIL, [s for s, _ in results])


# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="sweep.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="the trainer's YAML config")
    ap.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                    help="a config key (or np) and its values; repeat; the grid is the cartesian product")
    ap.add_argument("--np", default=None, metavar="N[,N...]", help="rank count(s) (same as --grid np=...)")
    ap.add_argument("--point", action="append", default=[], metavar='"K=V K=V"',
                    help="an explicit bundle of settings; repeat; multiplies with the grid")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="fixed override for every point")
    ap.add_argument("--out", default="runs/sweep", help="sweep directory (default runs/sweep)")
    ap.add_argument("--trainer", default=os.path.join(ROOT, "build", "trainer"), help="default build/trainer")
    ap.add_argument("--mpiexec", default="mpiexec", help="default mpiexec")
    ap.add_argument("--threads", type=int, default=0, help="compute threads per rank for every point (0 = auto)")
    ap.add_argument("--warmup", type=int, default=3, help="leading steps left out of the medians (default 3)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per point before it is killed (600)")
    ap.add_argument("--skip-done", action="store_true",
                    help="reuse points whose point.json says ok for the same command (failed ones run again)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when any point failed")
    ap.add_argument("--from-plan", metavar="PLAN.json", help="run build/planner --json's rows as the points")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run every point N times (folders NAME_r1..rN): plot.py shows the run-to-run spread")
    ap.add_argument("--time-budget", type=float, default=0.0, metavar="S",
                    help="stop each point after S seconds (SIGTERM: it finishes its step): the same wall time each")
    ap.add_argument("--target-loss", type=float, default=None, metavar="L",
                    help="summary.csv's time_to_target_s and tokens_to_target: when each point first reached L")
    ap.add_argument("--plan-top", type=int, default=8, metavar="N",
                    help="with --from-plan: its first N rows (8), the fastest of each mesh")
    ap.add_argument("--plan-every-layout", action="store_true",
                    help="with --from-plan: every row in rank order, not only the fastest of each mesh")
    ap.add_argument("--price-per-device-hour", type=float, default=0.0, metavar="P",
                    help="a device-hour's price: summary.csv then gives each point's cost and cost per 10^9 tokens")
    ap.add_argument("--batch-per-rank", type=int, default=0, metavar="B",
                    help="weak scaling: each point's train.global_batch is B x its rank count")
    ap.add_argument("--dry-run", action="store_true", help="print each point's command and run nothing")
    args = ap.parse_args(argv)
    for s in args.set:
        key, eq, _ = s.partition("=")
        if not eq or not key:
            die(f"--set {s!r}: expected KEY=VALUE")
        if key == "run.dir":
            die("--set run.dir: the sweep gives each point its own run.dir under --out")
        if key == "np":
            die("--set np: give the rank count with --np")
    if not os.path.isfile(args.config):
        die(f"--config {args.config}: no such file")
    if not args.dry_run and not os.path.isfile(args.trainer):
        die(f"--trainer {args.trainer}: no such file (build it: cmake --build build --target trainer)")
    if args.plan_top < 1 or args.repeat < 1:
        die("--plan-top and --repeat must be >= 1")
    if args.plan_every_layout and not args.from_plan:
        die("--plan-every-layout goes with --from-plan")
    if args.batch_per_rank < 0:
        die("--batch-per-rank must be >= 1")
    if not args.time_budget >= 0 or (args.time_budget > 0 and args.time_budget >= args.timeout):
        die("--time-budget must be >= 0 and below --timeout")
    if args.threads < 0 or args.warmup < 0 or args.timeout <= 0 or not args.price_per_device_hour >= 0:
        die("--threads, --warmup and --price-per-device-hour must be >= 0, --timeout > 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    predicted = None
    if args.from_plan:
        if args.grid or args.point or args.np:
            die("--from-plan gives the points: no --grid, --point or --np with it")
        points, predicted, plan_sets, plan_config = plan_points(args.from_plan, args.plan_top, args.plan_every_layout)
        args.set += [s for s in plan_sets if s not in args.set]
        if os.path.basename(plan_config) != os.path.basename(args.config):
            print(f"sweep: warning: the plan is of {plan_config}, the sweep runs {args.config}", file=sys.stderr)
    else:
        axes = parse_grid(args.grid, args.np)
        points = expand(axes, [parse_point(p) for p in args.point])
    if args.batch_per_rank and (any("train.global_batch" in p for p in points) or
                                any(s.partition("=")[0] == "train.global_batch" for s in args.set)):
        die("--batch-per-rank sets train.global_batch: not also --set, --grid or --point train.global_batch")
    scaling_threads(args, points)
    keys = []
    for p in points:
        keys += [k for k in p if k not in keys]
    shorts = short_names(keys)
    names = []
    for p in points:
        name = point_name(p, shorts)
        names.append(name if name not in names else f"{name}_{len(names)}")
    repeats = [1] * len(points)
    if args.repeat > 1:  # each point again, in a run dir of its own: the run-to-run spread (plot.py's error bars)
        n = args.repeat
        names = [f"{name}_r{k}" for name in names for k in range(1, n + 1)]
        points = [p for p in points for _ in range(n)]
        repeats = [k for _ in range(len(points) // n) for k in range(1, n + 1)]
        predicted = [x for x in predicted for _ in range(n)] if predicted else predicted
    args.config = os.path.abspath(args.config)
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    if not args.dry_run:  # what the sweep is of, for the plots' titles (scripts/plot.py)
        with open(os.path.join(out_dir, "sweep.json"), "w") as f:
            json.dump({"config": args.config, "np": sorted({int(p.get("np", 1)) for p in points}), "set": args.set,
                       "varied": keys}, f, indent=1)
    results, failed = [], 0
    for i, (settings, name) in enumerate(zip(points, names), 1):
        run_dir = os.path.join(out_dir, name)
        prefix = f"[{i}/{len(points)}] {name}"
        if args.dry_run:
            cmd, env = build_command(args, args.set, settings, run_dir)
            print(prefix + ": " + " ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") +
                  " ".join(shlex.quote(c) for c in cmd))
            continue
        record = done_record(args, args.set, settings, run_dir) if args.skip_done else None
        if record:
            print(f"{prefix}: done before, skipped", flush=True)
        else:
            print(f"{prefix}: running", flush=True)
            record = run_point(args, args.set, settings, name, run_dir)
        summary, rows = summarize(record, run_dir, args.warmup, args.target_loss)
        summary["repeat"] = repeats[i - 1]
        if predicted:
            summary["plan_rank"], summary["predicted_step_ms"] = predicted[i - 1]
        results.append((summary, rows))
        failed += record["status"] != "ok"
        print(f"{prefix}: {describe(summary)}", flush=True)
        # After every point: an interrupted sweep keeps what it ran.
        write_tables(out_dir, keys, results, args.price_per_device_hour)
    if args.dry_run:
        return 0
    print(f"sweep: {len(points) - failed} of {len(points)} points ok; wrote {os.path.join(out_dir, 'steps.csv')} "
          f"and {os.path.join(out_dir, 'summary.csv')}")
    if points and failed == len(points):
        print(f"sweep: every point failed (the first: {describe(results[0][0])})", file=sys.stderr)
        return 1
    return 1 if failed and args.strict else 0


def describe(s):
    if s["status"] == "timeout":
        return f"timeout: {s['error']}"
    if s["status"] != "ok":
        return f"{s['status']} (exit {s['returncode']}): {s['error']}"
    parts = [s["label"], f"final loss {s['final_loss']:.4f}"]
    if s["final_val_loss"] is not None:
        parts.append(f"val {s['final_val_loss']:.4f}")
    if s["step_ms_median"] is not None:
        parts.append(f"{s['step_ms_median']:.1f} ms/step, {s['tokens_per_s_median']:.0f} tok/s (medians)")
    return ", ".join(parts) + f", {s['wall_s']:.1f} s"


if __name__ == "__main__":
    sys.exit(main())
