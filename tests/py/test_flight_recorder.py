"""The flight recorder on real failures (docs/flight_recorder.md): a dp2 x tp2 mesh of 4 ranks on the shared-memory
and the MPI transports, and a dp2 x tp2 x pp2 mesh of 8 ranks on shared memory, each with a fault injected into the
last rank at step 3 (MESHTRAIN_FAULT, src/train/test_hooks.h):
  stop  SIGSTOP in the middle of the step: the others' watchdogs fire; the stopped rank leaves no dump;
  skip  it skips the step's loss all-reduce over the world and goes on: the others wait in it;
  size  it reduces 2 elements there instead of 1 (shared memory: the transport sees the ranks disagree, a desync);
  reduce  it reduces with max there instead of sum (MPI: the step's digests see the desync at the step's end);
  check it fails a CHECK (an internal invariant, core/check.h): it dumps before it aborts, and asks the others to.
Each time: the job ends non-zero; every rank that can dump (all but a stopped one) has written
run.dir/flight/rank_N.json within comm.timeout_s + 5 s of the collective it hung in (the dump's time against that
collective's issue time, on the machine's one monotonic clock); the watchdog's message names the folder and the command; and the first line of
scripts/flight.py names the faulty rank, the communicator and the collective's number. And SIGUSR2 makes a rank of a
running job dump (reason "signal SIGUSR2") while the job goes on to exit 0.
Not here: a killed rank (mpiexec ends the whole job at once, so no rank is left to dump: docs/flight_recorder.md);
the MPI transport's size mismatch: undefined in MPI, MPICH usually reduces it without an error but once left two ranks
inside MPI where neither their watchdogs nor their listeners ran (docs/flight_recorder.md), so the MPI case
mismatches the operation instead, every message keeping its size; NCCL (needs GPUs).
Usage: test_flight_recorder.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

mpiexec, trainer, src, work = sys.argv[1:5]
TIMEOUT_S = 2
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def run(name, ranks, sets, fault=None, backend="auto"):
    run_dir = os.path.join(work, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [mpiexec, "-n", str(ranks), trainer, "--config", os.path.join(src, "configs", "tiny.yaml"),
           "--set", f"run.dir={run_dir}", "--set", f"comm.timeout_s={TIMEOUT_S}", "--set", f"comm.backend={backend}",
           "--set", "train.steps=6", "--set", "model.n_layer=2"] + [a for s in sets for a in ("--set", s)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if fault:
        env["MESHTRAIN_FAULT"] = fault
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    return run_dir, p.returncode, p.stdout + p.stderr


def analyze(run_dir):
    p = subprocess.run([sys.executable, os.path.join(src, "scripts", "flight.py"), run_dir, "--json"],
                       capture_output=True, text=True)
    return json.loads(p.stdout) if p.returncode == 0 else {"summary": p.stderr.strip(), "faulty_ranks": []}


def dumps(run_dir):
    d = os.path.join(run_dir, "flight")
    return {int(re.match(r"rank_(\d+)\.json$", f).group(1)): json.load(open(os.path.join(d, f)))
            for f in sorted(os.listdir(d)) if re.match(r"rank_\d+\.json$", f)} if os.path.isdir(d) else {}


def hang_to_dump_s(dump):
    """Seconds from the issue of the rank's oldest unfinished operation to its dump (the same monotonic clock)."""
    pending = [op["issue_us"] for g in dump["groups"] for op in g["ops"] if op["state"] != "completed"]
    return (dump["dumped_us"] - min(pending)) / 1e6 if pending else 0.0


def case(name, ranks, sets, fault, backend, dumpers, words):
    run_dir, rc, log = run(name, ranks, sets, fault, backend)
    got = dumps(run_dir)
    late = {r: round(hang_to_dump_s(d), 1) for r, d in got.items() if hang_to_dump_s(d) > TIMEOUT_S + 5}
    a = analyze(run_dir)
    first = a["summary"]
    named = ranks - 1 in a.get("faulty_ranks", []) and all(w in first for w in words)
    ok = rc != 0 and sorted(got) == dumpers and not late and named and "scripts/flight.py" in log
    check(ok,
          f"{name}: exit {rc}, dumps of ranks {sorted(got)} (expected {dumpers}; later than timeout + 5 s: "
          f"{late or 'none'}), first line: {first}")
    if not ok:
        print(log[-3000:])


DP2_TP2 = ["parallel.tp=2"]
for backend in ("auto", "mpi"):
    case(f"stop_{backend}", 4, DP2_TP2, "stop@3", backend, [0, 1, 2], ["rank 3", "never joined", "#"])
    case(f"skip_{backend}", 4, DP2_TP2, "skip@3", backend, [0, 1, 2, 3], ["rank 3", "never joined", "world", "#"])
# Shared memory sees the desync at the collective itself, MPI at the step's end.
case("size_auto", 4, DP2_TP2, "size@3", "auto", [0, 1, 2, 3], ["desync", "world", "rank 3", "2 fp32", "#"])
case("reduce_mpi", 4, DP2_TP2, "reduce@3", "mpi", [0, 1, 2, 3], ["desync", "world", "rank 3", "(max)", "#"])
case("check", 4, DP2_TP2, "check@3", "auto", [0, 1, 2, 3], ["rank 3", "fatal error", "CHECK failed"])
case("stop_dp2_tp2_pp2", 8, ["parallel.tp=2", "parallel.pp=2", "train.global_batch=8", "train.micro_batch=2"],
     "stop@3", "auto", [0, 1, 2, 3, 4, 5, 6], ["rank 7", "#"])

# SIGUSR2: the rank it reaches dumps while the job goes on.
run_dir = os.path.join(work, "usr2")
shutil.rmtree(run_dir, ignore_errors=True)
cmd = [mpiexec, "-n", "2", trainer, "--config", os.path.join(src, "configs", "tiny.yaml"), "--set",
       f"run.dir={run_dir}", "--set", "train.steps=100000", "--set", "run.log_every=1000",
       "--set", "train.straggler.delay_ms=2"]
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                     env=dict(os.environ, OMP_NUM_THREADS="1"))
reason = None
try:
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(run_dir, "metrics.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # a few steps in
    pids = subprocess.run(["pgrep", "-f", f"run.dir={run_dir}"], capture_output=True, text=True).stdout.split()
    ranks = [int(q) for q in pids if int(q) != p.pid and os.path.basename(os.readlink(f"/proc/{q}/exe")) == "trainer"]
    os.kill(min(ranks), signal.SIGUSR2)  # the first trainer process started: one of the ranks
    while not dumps(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    reason = next(iter(dumps(run_dir).values()), {}).get("reason")
    alive = p.poll() is None
finally:
    p.send_signal(signal.SIGTERM)  # run.stop_signals: a checkpoint, then exit 0
    out = p.communicate(timeout=60)[0]
check(reason == "signal SIGUSR2" and alive and p.returncode == 0,
      f"SIGUSR2: a dump with reason {reason!r}, the job still running after it ({alive}), exit {p.returncode} after "
      f"SIGTERM")

print(f"{'FAIL' if failures else 'PASS'}: {failures} failure(s)")
sys.exit(1 if failures else 0)
