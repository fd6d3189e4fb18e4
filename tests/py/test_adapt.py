"""comm.adapt end to end on 2 data-parallel ranks (the controller's choices themselves are tested on synthetic
measurements in tests/test_comm_adapt.cpp; this checks that the trainer feeds it, applies what it decides, and says
so):

  1. on an emulated link whose all-reduce of the whole gradient takes about as long as the backward pass, starting
     from one 25 MiB bucket (the whole gradient reduced after the backward pass), the controller moves to smaller
     buckets within its first decision window; every row carries the bucket size
     and compression it ran with, the decision row says what changed and why, the log says it too, and the run
     trains as the static run does (the same losses until the change: bucket sizes do not change the sums' values
     in fp32 beyond rounding, so within 1e-5).
  2. comm.emulate.schedule: a link whose per-message cost dominates until step 16 and its bandwidth after shows in
     the run: within 20 steps the controller has settled on small buckets.
  3. under local SGD it picks the period instead: on the slow link, from an average every step, a longer period at
     the first average it can count, and the parameter averages then follow it; a run resumed from a checkpoint
     after the change starts at the checkpoint's period, not optim.sync_every.

usage: test_adapt.py TRAINER SOURCE_DIR WORK_DIR MPIEXEC"""
import json
import os
import re
import shutil
import subprocess
import sys

trainer, src, work, mpiexec = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
base = ["--config", os.path.join(src, "configs", "gpt.yaml"), "--set", "train.global_batch=8", "--set",
        "train.micro_batch=4", "--set", "train.steps=30", "--set", "run.log_every=1", "--set", "run.resume=none",
        "--set", "model.n_layer=2"]
ok = True


def check(cond, what):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {what}")


def run(name, *sets):
    d = os.path.join(work, name)
    cmd = [mpiexec, "-n", "2", trainer] + base + [a for s in sets for a in ("--set", s)] + ["--set", f"run.dir={d}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAIL: {name} exited with {r.returncode}")
    return r.stdout + r.stderr, [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]


# Smaller buckets can hide at most the backward pass (~5 ms here, unloaded) under the communication, and the
# controller moves only for a gain above 3% of the step (its hysteresis). So the link must not dwarf the backward
# pass: on the slow link below (88 ms per step on the wire for the 1.7 MiB gradient) the gain was ~2.5% of a 97 ms
# step unloaded, ~3-6% with the cores shared, and whether the controller moved depended on the machine and its load.
# On this one (about 9 ms for the whole gradient, 10 us per message) the model predicts a gain of ~20% unloaded and
# ~20-35% with a 2-thread busy load (a slower backward hides more), several times the hysteresis. A controller that
# does not move here is broken.
overlap = ["comm.emulate.latency_us=10", "comm.emulate.bandwidth_gbps=0.2"]
slow = ["comm.emulate.latency_us=100", "comm.emulate.bandwidth_gbps=0.02"]
out, rows = run("adapt_overlap", *overlap, "comm.adapt=true")
_, static = run("static_overlap", *overlap)
decisions = [r for r in rows if "adapt" in r]
check(all(r.get("bucket_mb", 0) > 0 and r.get("compress") == "none" for r in rows),
      "every row carries its bucket size and compression")
check(decisions and decisions[0]["step"] <= 9 and "bucket 25 -> " in decisions[0]["adapt"],
      f"the first decision (step {decisions[0]['step'] if decisions else None}): "
      f"{decisions[0]['adapt'] if decisions else 'none'}")
first = decisions[0]["step"] if decisions else 0
check(all(r["bucket_mb"] == 25 for r in rows[:first]) and rows[first]["bucket_mb"] < 25,
      f"the next step runs with the new buckets ({rows[first]['bucket_mb'] if decisions else '?'} MiB)")
check("comm.adapt from step" in out and "expected" in out, "the log gives each decision with its figures")
d = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(rows, static))
check(d <= 1e-5, f"bucket sizes change nothing but rounding: losses within {d:.1e} of the static run")

# Per-message cost first (large buckets pay), then bandwidth (small buckets pay). After the change the link is the
# first case's, where smaller buckets gain ~20% of the step: on 20 us / 0.02 GB/s (87 ms on the wire, a 4 ms backward)
# the gain was ~4%, next to the 3% hysteresis: in 12 idle runs the controller stayed at 25 MiB twice and moved only
# at step 37 once.
fast = ["comm.emulate.latency_us=1000", "comm.emulate.bandwidth_gbps=2"]
out, rows = run("adapt_change", *fast, "comm.adapt=true", "comm.emulate.schedule=16:10:0.2", "train.steps=40")
# Settled within 20 steps of the change: from step 36 on, small buckets for the bandwidth-bound link, and no later
# decision leaves them. A move between small sizes after step 36 is allowed: a window that something else on the
# machine slowed also slows the communication thread's operations, so the link looks slower, and the model may then
# favour the next smaller size (1 of 40 runs on an otherwise idle 2-core machine moved 1 -> 0.25 MiB at step 38). A
# slow window no longer sends it back to a size measured before it (test_comm_adapt: "a slower spell"; under bursts
# of load, 2 of 12 runs did before). (Whether a decision says "the link changed" depends on timing: on a loaded
# machine the controller may have just moved, and then it settles by measuring; and a loaded machine's slow
# operations may be reported as a changed link that the setting still fits. The detection itself is tested on
# synthetic figures in test_comm_adapt.)
late = {r["step"]: r["adapt"] for r in rows if r["step"] > 36 and "adapt" in r}
late_to = [float(m.group(1)) for m in (re.search(r"-> (\S+) MiB", a) for a in late.values()) if m]
check("from step 16 the emulated link is 10 us / 0.2 GB/s" in out, "the log says when the link changes")
check(all(r["bucket_mb"] <= 1 for r in rows if r["step"] >= 36) and all(b <= 1 for b in late_to),
      f"settled within 20 steps of the change on small buckets (from step 36: "
      f"{sorted({r['bucket_mb'] for r in rows if r['step'] >= 36})} MiB; decisions after step 36: {late})")

# Local SGD: the controller picks the period. On a slow link, from an average every step, it lengthens the period at
# the second counted average (step 3: one alone could be a stalled step), and the averages (the steps that send the
# parameters) follow the new period.
local = [*slow, "comm.adapt=true", "optim.sync_every=1", "comm.adapt_sync_every_max=8", "run.checkpoint_every=10"]
out, rows = run("adapt_local", *local)
decisions = [r for r in rows if "adapt" in r]
check(all(r.get("sync_every", 0) > 0 and "bucket_mb" not in r for r in rows), "every row carries its period")
check(decisions and decisions[0]["step"] == 3 and "sync_every 1 -> " in decisions[0]["adapt"],
      f"the first decision: {decisions[0]['adapt'] if decisions else 'none'}")
check("comm.adapt from step 4: optim.sync_every 1 -> " in out, "the log gives the decision with its figures")
big = max(r["comm_bytes"] for r in rows)
averaged = [r["step"] for r in rows if r["comm_bytes"] > big / 2]
want, last = [], 0  # where the periods the rows report put the averages (and the last step always averages)
for r in rows:
    if r["step"] - last >= r["sync_every"] or r["step"] == rows[-1]["step"]:
        want.append(r["step"])
        last = r["step"]
check(rows[3]["sync_every"] > 1 and averaged == want,
      f"averages at steps {averaged}, where the periods put them ({want})")
# The checkpoint due at step 10 is written at the first average from there on, with the period of the steps after it.
ckpt = min(s for s in want if s >= 10)
period = rows[ckpt]["sync_every"]  # step ckpt + 1's
out, resumed = run("adapt_local_resumed", *local, "run.resume=" + os.path.join(
    work, "adapt_local", "checkpoints", f"step_{ckpt:08d}"))
check(f"resumes at the checkpoint's period, {period} steps" in out and resumed[0]["sync_every"] == period,
      f"resumed from the average of step {ckpt}: the period is the checkpoint's ({period} steps), not 1")

print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
