#!/usr/bin/python3
# scripts/plot.py: PNG figures of meshtrain runs and sweeps (Debian's matplotlib, Agg backend): loss curves,
# tokens/s against ranks, the step time broken into compute, exposed communication and pipeline bubble, and the
# flight recorder's last collectives of every rank of a hung run.
"""Figures of meshtrain runs and of scripts/sweep.py's CSVs, written as PNG.

  plot.py loss SOURCE... -o loss.png       training loss (and val_loss where evaluated) against wall-clock
                                           seconds (elapsed_ms), overlaid: the comparison that matters (against
                                           step every layout's curve is the same by design); each SOURCE is a run
                                           dir (its metrics.jsonl), a metrics.jsonl, a sweep's steps.csv (one
                                           curve per ok point) or a sweep dir; --x bytes: against the MB sent so
                                           far (cumulative comm_bytes), --x step: against the step
  plot.py scaling SUMMARY.csv -o scaling.png    median tokens/s against ranks (np), one line per setting
                                                other than np, with linear scaling from each line's first point,
                                                and beside it (sweep.py's scaling_efficiency) the efficiency
  plot.py breakdown SUMMARY.csv -o breakdown.png   per layout, a bar of the step time (mean over the measured
                                                   steps; medians for a CSV without means) stacked into compute,
                                                   exposed communication and pipeline bubble
A sweep run with --repeat N has each point's runs merged (their mean) with error bars from the fastest to the
slowest run, in the scaling, breakdown and predicted figures.
  plot.py predicted SUMMARY.csv -o predicted.png   a sweep run from a plan (sweep.py --from-plan): each layout's
                                           measured median step time against the planner's prediction, with the
                                           line of equality and a 10% band; the table and the mean and largest
                                           errors printed
  plot.py all SWEEP_DIR [-o DIR]           loss.png, breakdown.png, (with two or more rank counts) scaling.png and
                                           (for a sweep of a plan) predicted.png from SWEEP_DIR/steps.csv and
                                           summary.csv, into DIR (default SWEEP_DIR)
A sweep's figures are titled with what it ran (SWEEP_DIR/sweep.json and its first point's config.yaml, next to the
SUMMARY.csv given): the config, the rank counts and the link (comm.emulate, or shared memory); --title replaces it.
  plot.py flight RUN_DIR -o flight.png     the flight recorder's dumps (RUN_DIR/flight/rank_N.json): a lane per
                                           rank, the last 40 collectives of the communicator scripts/flight.py
                                           names (filled: completed, hollow: pending, red X: never joined or no
                                           dump), its sentence as the title

Exit status: 0 written, 2 a bad command line, a missing or malformed input, or nothing to plot.
"""
import argparse
import csv
import json
import os
import re
import sys
import textwrap

COLORS = {"compute": "#4C72B0", "exposed": "#DD8452", "bubble": "#55A868"}
STYLES = ["-", "--", ":", "-."]  # curves of equal losses (mesh invariance) stay visible on top of each other


def die(msg):
    print(f"plot: {msg}", file=sys.stderr)
    sys.exit(2)


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    try:
        import matplotlib
    except ImportError:
        die("matplotlib is missing: apt-get install python3-matplotlib (and run with /usr/bin/python3)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# ---------------------------------------------------------------------------------------------------------------
# Reading


def number(text):
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        return None


def read_csv(path, required):
    if not os.path.isfile(path):
        die(f"no such file: {path}")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        columns = reader.fieldnames or []
    missing = [c for c in required if c not in columns]
    if missing:
        die(f"{path}: missing column(s) {', '.join(missing)} (is it a sweep.py CSV?)")
    return rows


def curve_from_metrics(path, label):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    die(f"{path}:{n}: not a JSON line")
    return {"label": label, "step": [r.get("step") for r in rows], "loss": [r.get("loss") for r in rows],
            "val": [(r["step"], r["val_loss"]) for r in rows if isinstance(r.get("val_loss"), (int, float))],
            "time": [r.get("elapsed_ms", 0) / 1000.0 for r in rows], "bytes": cumulative_mb(rows)}


def cumulative_mb(rows):
    out, total = [], 0.0
    for r in rows:
        total += number(str(r.get("comm_bytes", 0))) or 0
        out.append(total / 1e6)
    return out


def curves_from_steps_csv(path):
    rows = read_csv(path, ["point", "step", "loss"])
    curves = {}
    for r in rows:
        c = curves.setdefault(r["point"], {"label": r.get("label") or r["point"], "step": [], "loss": [], "val": [],
                                           "time": [], "bytes": []})
        step = number(r["step"])
        c["step"].append(step)
        c["loss"].append(number(r["loss"]))
        c["time"].append((number(r.get("elapsed_ms")) or 0) / 1000.0)
        c["bytes"].append((c["bytes"][-1] if c["bytes"] else 0) + (number(r.get("comm_bytes")) or 0) / 1e6)
        val = number(r.get("val_loss"))
        if val is not None:
            c["val"].append((step, val))
    return list(curves.values())


def load_curves(sources):
    """Loss curves from run dirs, metrics.jsonl files, steps.csv files or sweep dirs."""
    curves = []
    for src in sources:
        if os.path.isdir(src) and os.path.isfile(os.path.join(src, "metrics.jsonl")):
            curves.append(curve_from_metrics(os.path.join(src, "metrics.jsonl"),
                                             os.path.basename(os.path.normpath(src))))
        elif os.path.isdir(src) and os.path.isfile(os.path.join(src, "steps.csv")):
            curves += curves_from_steps_csv(os.path.join(src, "steps.csv"))
        elif os.path.isfile(src) and src.endswith(".csv"):
            curves += curves_from_steps_csv(src)
        elif os.path.isfile(src):
            curves.append(curve_from_metrics(src, os.path.basename(os.path.dirname(os.path.abspath(src)))))
        else:
            die(f"{src}: not a run dir (with metrics.jsonl), a metrics.jsonl, a steps.csv or a sweep dir")
    return curves


def ok_rows(path):
    rows = merge_repeats(read_csv(path, ["point", "status", "np", "tokens_per_s_median", "step_ms_median"]))
    return rows, [r for r in rows if r["status"] == "ok"]


def merge_repeats(rows):
    """sweep.py --repeat's runs of one point (NAME_r1..rN) as one row: each number the mean over its ok runs, and
    for every such column COL also COL_lo and COL_hi, the smallest and largest (the run-to-run spread). Rows of a
    sweep without repeats stay as they are."""
    groups = {}
    for r in rows:
        base, _, k = r["point"].rpartition("_r")
        key = base if r.get("repeat") and base and k.isdigit() else r["point"]
        groups.setdefault(key, []).append(r)
    out = []
    for key, grp in groups.items():
        if len(grp) == 1:
            out.append(grp[0])
            continue
        ok = [r for r in grp if r["status"] == "ok"]
        merged = dict((ok or grp)[0], point=key, repeats=str(len(ok)))
        merged["status"] = "ok" if ok else grp[0]["status"]
        for col in list(merged):
            vals = [number(r.get(col)) for r in ok]
            if ok and all(v is not None for v in vals) and col not in ("np", "repeat", "returncode"):
                merged[col] = repr(sum(vals) / len(vals))
                merged[col + "_lo"], merged[col + "_hi"] = repr(min(vals)), repr(max(vals))
        out.append(merged)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Figures


def set_title(ax, title):
    # About 11 characters per inch of the axes' own width (a panel of two is half the figure), less for the
    # labels and an outside legend.
    inches = ax.figure.get_figwidth() * ax.get_position().width
    ax.set_title("\n".join(textwrap.wrap(title, max(30, int(inches * 10)))), fontsize=11)


def short_settings(settings):
    """'parallel.tp=2 comm.overlap=false' -> 'tp=2 overlap=false' for legends."""
    return " ".join(t.split("=", 1)[0].split(".")[-1] + "=" + t.split("=", 1)[1] if "=" in t else t
                    for t in settings.split())


def save(fig, out):
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"plot: wrote {out}")


X_AXES = {"step": "step", "time": "wall-clock time (s)", "bytes": "MB sent (the busiest rank, cumulative)"}


def plot_loss(sources, out, title=None, logy=False, x="time"):
    curves = [c for c in load_curves(sources) if c["step"]]
    if not curves:
        die("no loss curves to plot (no metrics rows in " + ", ".join(sources) + ")")
    if x != "step":  # each curve's steps mapped to its elapsed time or bytes sent
        for c in curves:
            at = dict(zip(c["step"], c[x]))
            c["val"] = [(at.get(s, 0), v) for s, v in c["val"]]
            c["step"] = c[x]
    plt = pyplot()
    has_val = any(c["val"] for c in curves)
    fig, axes = plt.subplots(1, 2 if has_val else 1, figsize=(11 if has_val else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    for i, c in enumerate(curves):
        pts = [(s, l) for s, l in zip(c["step"], c["loss"]) if s is not None and l is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=c["label"], color=f"C{i % 10}", linewidth=1.4,
                linestyle=STYLES[i % len(STYLES)])
    ax.set(xlabel=X_AXES[x], ylabel="training loss (nats/token)")
    set_title(ax, "Training loss")
    if has_val:
        vax = axes[0][1]
        for i, c in enumerate(curves):
            if c["val"]:
                vax.plot([v[0] for v in c["val"]], [v[1] for v in c["val"]], marker="o", markersize=3,
                         label=c["label"], color=f"C{i % 10}", linewidth=1.4, linestyle=STYLES[i % len(STYLES)])
        vax.set(xlabel=X_AXES[x], ylabel="validation loss (nats/token)")
        set_title(vax, "Validation loss")
    from matplotlib.ticker import MaxNLocator
    for a in axes[0]:
        if x == "step":
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.grid(alpha=0.3)
        if logy:
            a.set_yscale("log")
        a.legend(fontsize=8)
    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, 110)), fontsize=11)
    save(fig, out)
    plt.close(fig)


def series_of(row):
    return row.get("settings") or ""


def scaling_kind(pts):
    """'strong (global batch 16 at every rank count; 1 thread per rank)', 'weak (...)', or the general rule where the
    points' resolved configs (run.dir/config.yaml) do not say which."""
    batches, threads = {}, {r.get("threads") for r in pts}
    for r in pts:
        try:
            m = re.search(r"^\s+global_batch: (\d+)", open(os.path.join(r["run_dir"], "config.yaml")).read(), re.M)
        except (OSError, KeyError, TypeError):
            m = None
        if not m:
            return "strong with a fixed global batch, weak with one growing with np"
        batches[int(number(r["np"]))] = int(m.group(1))
    per_thread = f"; {threads.pop()} thread(s) per rank" if len(threads) == 1 and None not in threads else ""
    if len(set(batches.values())) == 1:
        return f"strong (global batch {next(iter(batches.values()))} at every rank count{per_thread})"
    if len({b / n for n, b in batches.items()}) == 1:
        n, b = min(batches.items())
        return f"weak (global batch {b / n:g} per rank{per_thread})"
    return "global batch " + ", ".join(f"{b} at {n}" for n, b in sorted(batches.items())) + per_thread


BREAKDOWN = "Step time: compute, exposed communication, pipeline bubble"
SCALING = "Throughput against ranks"


def plot_scaling(summary, out, title=None):
    rows, ok = ok_rows(summary)
    pts = [r for r in ok if number(r["tokens_per_s_median"]) is not None and number(r["np"]) is not None]
    if not pts:
        die(f"{summary}: no ok point with tokens_per_s_median to plot")
    nps = sorted({int(number(r["np"])) for r in pts})
    if len(nps) < 2:
        print(f"plot: note: {summary} has one rank count ({nps[0]}); the scaling figure has one point per line")
    groups = {}
    for r in pts:
        groups.setdefault(series_of(r), []).append(r)
    plt = pyplot()
    # sweep.py's scaling_efficiency (tokens/s per rank against the fewest ranks): a second panel where present.
    with_eff = all(number(r.get("scaling_efficiency")) is not None for r in pts)
    fig, axes = plt.subplots(1, 2 if with_eff else 1, figsize=(12 if with_eff else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    for i, (name, grp) in enumerate(sorted(groups.items())):
        grp.sort(key=lambda r: number(r["np"]))
        if with_eff:
            axes[0][1].plot([number(r["np"]) for r in grp], [number(r["scaling_efficiency"]) for r in grp],
                            marker="o", color=f"C{i % 10}", label=short_settings(name) or "efficiency")
        x = [number(r["np"]) for r in grp]
        y = [number(r["tokens_per_s_median"]) for r in grp]
        color = f"C{i % 10}"
        name = short_settings(name)
        ax.plot(x, y, marker="o", color=color, label=name or "tokens/s")
        spread = [(number(r.get("tokens_per_s_median_lo")), number(r.get("tokens_per_s_median_hi"))) for r in grp]
        if all(lo is not None for lo, _ in spread):  # repeats: the smallest and largest run
            below = [v - lo for v, (lo, _) in zip(y, spread)]
            above = [hi - v for v, (_, hi) in zip(y, spread)]
            ax.errorbar(x, y, yerr=[below, above], fmt="none", ecolor=color, capsize=3)
        if len(x) > 1:
            ax.plot(x, [y[0] * n / x[0] for n in x], linestyle="--", color=color, alpha=0.5, linewidth=1,
                    label=(f"{name}: linear from np={x[0]:g}" if name else f"linear from np={x[0]:g}"))
    ax.set_xscale("log", base=2)
    ax.set_xticks(nps)
    ax.set_xticklabels([str(n) for n in nps])
    ax.set(xlabel="ranks (np)", ylabel="tokens/s (median over measured steps)")
    set_title(ax, title or SCALING)
    if with_eff:
        eff = axes[0][1]
        eff.axhline(1.0, color="0.5", linestyle="--", linewidth=1, label="linear scaling")
        eff.set_xscale("log", base=2)
        eff.set_xticks(nps)
        eff.set_xticklabels([str(n) for n in nps])
        eff.set(xlabel="ranks (np)", ylabel="tokens/s per rank / at the fewest ranks", ylim=(0, None))
        kind = scaling_kind(pts)
        print(f"plot: scaling efficiency, {kind}")
        set_title(eff, "Scaling efficiency, " + kind)
        eff.grid(alpha=0.3)
        eff.legend(fontsize=8)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    failed = [r["point"] for r in rows if r["status"] != "ok"]
    if failed:
        fig.text(0.01, 0.01, "not run (failed): " + ", ".join(failed), fontsize=7, color="gray")
    save(fig, out)
    plt.close(fig)


def breakdown_columns(summary):
    """The step-time columns to stack: the means (additive) when the CSV has them, else the medians."""
    with open(summary, newline="") as f:
        cols = next(csv.reader(f), [])
    stat = "mean" if "compute_ms_mean" in cols else "median"
    return stat, [f"{c}_{stat}" for c in ("compute_ms", "exposed_comm_ms", "bubble_ms", "step_ms")]


def plot_breakdown(summary, out, title=None):
    rows, ok = ok_rows(summary)  # repeats merged
    stat, cols = breakdown_columns(summary)
    read_csv(summary, cols)
    if not ok:
        die(f"{summary}: no ok point to plot")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(rows) + 4), 4.8))
    labels, x, top, first, over = [], list(range(len(rows))), 0.0, first_ok(rows), False
    for i, r in enumerate(rows):
        labels.append((r.get("label") or r["point"]).replace(" x ", "\u00d7").replace(" ", "\n"))
        if r["status"] != "ok":
            ax.text(i, 0, f"{r['status']}\n(exit {r.get('returncode', '')})", ha="center", va="bottom",
                    fontsize=8, color="crimson")
            continue
        bottom = 0.0
        for key, name, col in zip(("compute", "exposed", "bubble"),
                                  ("compute", "exposed communication", "pipeline bubble"), cols):
            v = number(r[col]) or 0.0
            ax.bar(i, v, bottom=bottom, color=COLORS[key], width=0.6, label=name if i == first else None)
            bottom += v
        step = number(r[cols[3]])
        if step is not None:
            ax.plot([i - 0.35, i + 0.35], [step, step], color="black", linewidth=1.5,
                    label=f"step time ({stat})" if i == first else None)
            lo, hi = number(r.get(cols[3] + "_lo")), number(r.get(cols[3] + "_hi"))
            if lo is not None and hi is not None:  # repeats: the fastest and slowest run
                ax.errorbar(i, step, yerr=[[step - lo], [hi - step]], fmt="none", ecolor="black", capsize=4,
                            label=f"spread over {r['repeats']} runs" if i == first else None)
                top = max(top, hi)
            ax.annotate(f"{step:.3g} ms", (i, max(step, bottom)), textcoords="offset points", xytext=(0, 3),
                        ha="center", fontsize=8)
        top = max(top, bottom, step or 0.0)
        over |= step is not None and bottom > 1.05 * step
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set(ylabel=f"time per step (ms, {stat} over measured steps)", xlabel="layout")
    set_title(ax, title or BREAKDOWN)
    ax.set_ylim(0, top * 1.12 if top > 0 else 1)
    if over:
        fig.text(0.01, 0.01, "A bar above its step line: exposed communication and bubble are each the maximum over "
                 "ranks, not always the same rank's.", fontsize=7, color="gray")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    save(fig, out)
    plt.close(fig)


def first_ok(rows):
    return next(i for i, r in enumerate(rows) if r["status"] == "ok")


def plot_predicted(summary, out, title=None, caption=None):
    read_csv(summary, ["point", "label", "status", "step_ms_median", "predicted_step_ms"])
    rows = [r for r in ok_rows(summary)[1]  # repeats merged
            if number(r.get("predicted_step_ms")) and number(r["step_ms_median"])]
    if not rows:
        die(f"{summary}: no ok point with a predicted_step_ms (run the sweep with --from-plan)")
    labels = [r.get("label") or r["point"] for r in rows]
    width = max(len(name) for name in labels)
    errs = []
    print(f"{'plan rank':>9}  {'layout':<{width}} {'predicted':>10} {'measured':>10} {'error':>7}")
    for r, name in zip(rows, labels):
        p, m = number(r["predicted_step_ms"]), number(r["step_ms_median"])
        errs.append((p - m) / m)
        print(f"{r.get('plan_rank') or '-':>9}  {name:<{width}} {p:>10.2f} {m:>10.2f} {100 * errs[-1]:>+6.1f}%")
    mean = sum(abs(e) for e in errs) / len(errs)
    largest = max(map(abs, errs))
    print(f"prediction error over {len(errs)} layouts: mean {100 * mean:.1f}%, largest {100 * largest:.1f}%")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    ms = [number(r["step_ms_median"]) for r in rows]
    ps = [number(r["predicted_step_ms"]) for r in rows]
    hi = max(ms + ps + [number(r.get("step_ms_median_hi")) or 0 for r in rows]) * 1.1
    ax.plot([0, hi], [0, hi], color="0.4", linewidth=1, label="prediction = measurement")
    ax.fill_between([0, hi], [0, 0.9 * hi], [0, 1.1 * hi], color="0.85", label="within 10%")
    spread = False
    for i, (r, name) in enumerate(zip(rows, labels)):
        ax.scatter(ms[i], ps[i], color=f"C{i % 10}", zorder=3, label=name)
        lo, top = number(r.get("step_ms_median_lo")), number(r.get("step_ms_median_hi"))
        if lo is not None and top is not None:  # repeats: the fastest and slowest run
            ax.errorbar(ms[i], ps[i], xerr=[[ms[i] - lo], [top - ms[i]]], fmt="none", ecolor=f"C{i % 10}", capsize=3)
            spread = True
    xlabel = "measured step time (ms, median" + ("; bars: fastest to slowest run)" if spread else ")")
    ax.set(xlim=(0, hi), ylim=(0, hi), xlabel=xlabel, ylabel="predicted step time (ms)")
    heading = f"The planner against runs: mean error {100 * mean:.0f}%"
    set_title(ax, title or titled(heading, caption) or heading)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, out)
    plt.close(fig)


def sweep_caption(sweep_dir):
    """'gpt.yaml on 1, 2 ranks; link 100 us / 0.05 GB/s' from SWEEP_DIR/sweep.json and the first point's resolved
    config (run.dir/config.yaml, as the trainer wrote it), or None for a folder without sweep.json."""
    try:
        meta = json.load(open(os.path.join(sweep_dir, "sweep.json")))
    except (OSError, ValueError):
        return None
    caption = f"{os.path.basename(meta.get('config', '?'))} on {', '.join(map(str, meta.get('np', [])))} rank(s)"
    link = "shared memory (not emulated)"
    for point in sorted(os.listdir(sweep_dir)):
        path = os.path.join(sweep_dir, point, "config.yaml")
        if not os.path.isfile(path):
            continue
        text = open(path).read()
        value = {k: re.search(rf"^\s+{k}: (\S+)", text, re.M) for k in ("latency_us", "bandwidth_gbps")}
        lat, bw = (float(m.group(1)) if m else 0.0 for m in value.values())
        if lat > 0 or bw > 0:
            link = f"{lat:g} us / {bw:g} GB/s"
        break
    varied = [k for k in meta.get("varied", []) if k != "np"]
    return caption + f"; link {link}" + (f"; varying {', '.join(varied)}" if varied else "")


def titled(heading, caption):
    return f"{heading} ({caption})" if caption else None


def announced_caption(sweep_dir):
    """sweep_caption, printed as the figures' titles where the folder says what its sweep ran."""
    caption = sweep_caption(sweep_dir)
    if caption:
        print(f"plot: titles: {caption}")
    return caption


def plot_all(sweep_dir, out_dir):
    if not os.path.isdir(sweep_dir):
        die(f"no such sweep directory: {sweep_dir}")
    summary = os.path.join(sweep_dir, "summary.csv")
    steps = os.path.join(sweep_dir, "steps.csv")
    for path in (summary, steps):
        if not os.path.isfile(path):
            die(f"no such file: {path} (run scripts/sweep.py --out {sweep_dir} first)")
    out_dir = out_dir or sweep_dir
    caption = announced_caption(sweep_dir)
    plot_loss([steps], os.path.join(out_dir, "loss.png"), title=caption, x="time")
    plot_breakdown(summary, os.path.join(out_dir, "breakdown.png"), titled(BREAKDOWN, caption))
    _, ok = ok_rows(summary)
    if len({r["np"] for r in ok}) >= 2:
        plot_scaling(summary, os.path.join(out_dir, "scaling.png"), titled(SCALING, caption))
    else:
        print("plot: one rank count in the sweep: no scaling.png (sweep with --np 1,2,4 for one)")
    if any(number(r.get("predicted_step_ms")) for r in ok):  # a sweep of a plan's rows (sweep.py --from-plan)
        plot_predicted(summary, os.path.join(out_dir, "predicted.png"), caption=caption)


FLIGHT_COLORS = {"all_reduce": "C0", "reduce_scatter": "C1", "all_gather": "C2", "broadcast": "C4", "barrier": "C7",
                 "send": "C5", "recv": "C6"}
FLIGHT_MARKERS = {"send": ">", "recv": "<"}
FLIGHT_WINDOW = 40  # collectives shown per lane: enough to see the pattern before the fault, few enough to read


def flight_analysis(run_dir):
    """scripts/flight.py (next to this script): its loaded run and its analysis, or exit 2 on a bad input."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import flight
    try:
        run = flight.load_run(run_dir)
        return run, flight.report(run)
    except flight.FlightError as e:
        die(str(e))


def flight_axis(run, rep):
    """The communicator name the x axis follows and whether x is its collective number (aligned across ranks) or
    each rank's own operation number (a communicator of sends and receives only)."""
    name = rep["group"]
    if name is None:  # nothing named: the communicator with the most collectives
        counts = {}  # name -> (collectives, operations): the most collectives, then the most operations
        for d in run.dumps.values():
            for g in d["groups"]:
                counts[g["name"]] = max(counts.get(g["name"], (0, 0)), (g["collectives_issued"], g["issued"]))
        name = max(sorted(counts), key=counts.get) if counts else None
    has_colls = any(o.get("coll_seq") is not None for d in run.dumps.values() for g in d["groups"]
                    if g["name"] == name for o in g["ops"])
    return name, has_colls


def flight_lane_group(run, rep, rank, name):
    """The rank's record of the communicator: the instance the analysis named when the rank is in it."""
    groups = [g for g in run.dumps[rank]["groups"] if g["name"] == name]
    named = [g for g in groups if rep["group_ranks"] and g["ranks"] == rep["group_ranks"]]
    return (named or groups or [None])[0]


def flight_points(g, by_coll):
    """(x, op) of the lane's collectives (plot_flight cuts them to one window for all lanes), or, on a
    communicator without collectives, the lane's last FLIGHT_WINDOW operations."""
    if g is None:
        return []
    if not by_coll:
        return [(o["seq"], o) for o in g["ops"][-FLIGHT_WINDOW:]]
    return [(o["coll_seq"], o) for o in g["ops"] if o.get("coll_seq") is not None]


def plot_flight(run_dir, out):
    run, rep = flight_analysis(run_dir)
    name, by_coll = flight_axis(run, rep)
    k = rep["coll_seq"]
    lanes = {r: flight_lane_group(run, rep, r, name) if r in run.dumps else None for r in range(run.world)}
    points = {r: flight_points(g, by_coll) for r, g in lanes.items()}
    xs = [x for pts in points.values() for x, _ in pts] + ([k] if k else [])
    if by_coll and xs:  # one window for every lane (x is aligned across ranks), ending a few past the named collective
        hi = min(max(xs), k + 5) if k else max(xs)
        lo = max(min(xs), hi - FLIGHT_WINDOW + 1)
        points = {r: [(x, o) for x, o in pts if lo <= x <= hi] for r, pts in points.items()}
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(11, min(30.0, max(3.5, 1.8 + 0.45 * run.world))))
    series = {}  # (op, completed) -> ([x], [lane]): one scatter call each (one per point is slow)
    for r, pts in points.items():
        for x, o in pts:
            xy = series.setdefault((o["op"], o["state"] == "completed"), ([], []))
            xy[0].append(x)
            xy[1].append(r)
    for (op, done), (x, y) in series.items():
        color = FLIGHT_COLORS.get(op, "C9")
        ax.scatter(x, y, s=46, marker=FLIGHT_MARKERS.get(op, "o"), linewidths=1.4, zorder=3,
                   facecolors=color if done else "white", edgecolors=color)
    seen = {op for op, _ in series}
    marks = []  # red X where a rank should be: never joined the named collective, or the p2p peer
    if rep["kind"] == "missing":
        marks = [(k, r) for r in rep["missing_ranks"]]
    elif rep["kind"] == "p2p":
        marks = [(rep["seq"] if not by_coll else k, rep["peer"])]
    marks = [(x, r) for x, r in marks if x is not None]
    if marks:
        ax.scatter([m[0] for m in marks], [m[1] for m in marks], marker="X", s=140, color="red", zorder=4)
    if k is not None:
        ax.axvline(k, color="red", linestyle="--", alpha=0.4, zorder=1)
    if rep["kind"] == "desync":  # what each rank called at the desync
        for r in rep["group_ranks"]:
            o = next((o for x, o in points.get(r, []) if x == k), None)
            if o:
                ax.annotate(f'{o["op"]} {o["count"]} {o.get("dtype", "")}', (k, r), textcoords="offset points",
                            xytext=(-8, 7), ha="right", fontsize=8, color="red",
                            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    for r, g in lanes.items():  # say why a lane is empty
        note = "no dump" if r not in run.dumps else (f"not in {name}" if g is None else None)
        if note:
            ax.text(0.01, r, note, transform=ax.get_yaxis_transform(), va="center", fontsize=9,
                    color="red" if r not in run.dumps else "gray")
    hosts = {r: d.get("host") for r, d in run.dumps.items()}
    ax.set_yticks(range(run.world))
    ax.set_yticklabels([f"rank {r}" + (f" ({hosts[r]})" if hosts.get(r) else "") for r in range(run.world)],
                       fontsize=8)
    ax.set_ylim(run.world - 0.5, -0.5)  # rank 0 on top
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"collective # on communicator {name} (coll_seq, aligned across ranks)" if by_coll else
                  f"operation # on communicator {name} (seq: each rank's own count)")
    ax.grid(axis="x", alpha=0.3)
    set_title(ax, rep["summary"])
    handles = [Line2D([], [], marker=FLIGHT_MARKERS.get(op, "o"), linestyle="", color=FLIGHT_COLORS.get(op, "C9"),
                      label=op) for op in FLIGHT_COLORS if op in seen]
    handles += [Line2D([], [], marker="o", linestyle="", color="gray", label="completed"),
                Line2D([], [], marker="o", linestyle="", markerfacecolor="white", color="gray",
                       label="pending (queued, started)")]
    if marks:
        handles.append(Line2D([], [], marker="X", linestyle="", color="red", markersize=9,
                              label="never joined / no dump"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    save(fig, out)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="plot.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="kind", metavar="KIND",
                            help="loss | scaling | breakdown | predicted | all | flight")
    sub.required = True
    p = sub.add_parser("loss", help="loss curves overlaid")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="run dir, metrics.jsonl, steps.csv or sweep dir")
    p.add_argument("-o", "--out", default="loss.png")
    p.add_argument("--logy", action="store_true", help="logarithmic loss axis")
    p.add_argument("--x", choices=sorted(X_AXES), default="time", help="the horizontal axis: time (default), bytes or "
                                                                        "step")
    p.add_argument("--title")
    for kind, default in (("scaling", "scaling.png"), ("breakdown", "breakdown.png"), ("predicted", "predicted.png")):
        p = sub.add_parser(kind, help=f"{kind} figure from a sweep's summary.csv")
        p.add_argument("summary", metavar="SUMMARY.csv")
        p.add_argument("-o", "--out", default=default)
        p.add_argument("--title")
    p = sub.add_parser("all", help="every figure of a sweep directory")
    p.add_argument("sweep_dir", metavar="SWEEP_DIR")
    p.add_argument("-o", "--out", default=None, help="output directory (default SWEEP_DIR)")
    p = sub.add_parser("flight", help="the flight recorder's dumps of a hung run")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (its flight/ holds rank_N.json)")
    p.add_argument("-o", "--out", default="flight.png")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.kind == "loss":
        one_sweep = len(args.sources) == 1 and os.path.isdir(args.sources[0])
        plot_loss(args.sources, args.out, args.title or (sweep_caption(args.sources[0]) if one_sweep else None),
                  args.logy, args.x)
    elif args.kind in ("scaling", "breakdown", "predicted"):
        # Titled as plot.py all titles them, from the sweep folder that holds SUMMARY.csv.
        caption = None if args.title else announced_caption(os.path.dirname(os.path.abspath(args.summary)))
        if args.kind == "scaling":
            plot_scaling(args.summary, args.out, args.title or titled(SCALING, caption))
        elif args.kind == "breakdown":
            plot_breakdown(args.summary, args.out, args.title or titled(BREAKDOWN, caption))
        else:
            plot_predicted(args.summary, args.out, args.title, caption)
    elif args.kind == "flight":
        plot_flight(args.run_dir, args.out)
    else:
        plot_all(args.sweep_dir, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
