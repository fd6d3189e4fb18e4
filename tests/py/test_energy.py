#!/usr/bin/python3
"""Energy per step in metrics.jsonl (core/energy.h): with RAPL counters (a powercap folder of this test's own, given
by MESHTRAIN_POWERCAP, its counters advanced by a thread while 2 ranks train) every row has energy_j, more than 0 in
all and at most what the counters advanced; without counters (a folder that does not exist) no row has
energy_j and the log says why.

usage: test_energy.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

mpiexec, trainer, src, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def run(name, powercap):
    run_dir = os.path.join(work, name)
    cmd = [mpiexec, "-n", "2", trainer, "--config", os.path.join(src, "configs", "tiny.yaml"), "--set",
           "train.steps=6", "--set", f"run.dir={run_dir}", "--set", "run.log_every=1000", "--set",
           "train.straggler.delay_ms=20"]  # steps of 20 ms or more: each sees the counter advance
    env = dict(os.environ, OMP_NUM_THREADS="1", MESHTRAIN_POWERCAP=powercap)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))] if p.returncode == 0 else []
    return p, rows


# A package counter advanced by 1 J every 2 ms (written whole by a rename, as the kernel's file never reads torn).
root = os.path.join(work, "powercap")
os.makedirs(os.path.join(root, "intel-rapl:0"))
with open(os.path.join(root, "intel-rapl:0", "max_energy_range_uj"), "w") as f:
    f.write("262143328850\n")
counter = {"uj": 0}
done = threading.Event()


def advance():
    while not done.is_set():
        tmp = os.path.join(root, "intel-rapl:0", "energy_uj.tmp")
        with open(tmp, "w") as f:
            f.write(f"{counter['uj']}\n")
        os.replace(tmp, os.path.join(root, "intel-rapl:0", "energy_uj"))
        counter["uj"] += 1_000_000
        time.sleep(0.002)


writer = threading.Thread(target=advance)
writer.start()
try:
    p, rows = run("with_counters", root)
finally:
    done.set()
    writer.join()
energies = [r.get("energy_j") for r in rows]
# Per row >= 0 (the writer thread competes with the ranks for the cores: a step may see no tick) and at most the
# step's time at 1 J per 2 ms plus a tick (the node's counter read once, by one of its two ranks); in all > 0.
check(p.returncode == 0 and len(rows) == 6 and all(e is not None and e >= 0 for e in energies) and
      all(r["energy_j"] <= r["step_ms"] / 2 + 2 for r in rows) and sum(energies) > 0,
      f"with counters: energy_j on every row {energies} (the counter advanced {counter['uj'] * 1e-6:.0f} J in all)")

p, rows = run("without_counters", os.path.join(work, "missing"))
check(p.returncode == 0 and len(rows) == 6 and not any("energy_j" in r for r in rows) and
      "energy: unavailable on this node" in p.stdout + p.stderr,
      "without counters: no energy_j, and the log says why")
sys.exit(1 if failures else 0)
