"""run.stop_signals: a signal stops the run after the step in progress with a checkpoint, as a scheduler's
preemption needs; and a checkpoint that cannot be written leaves nothing incomplete behind.

  1. SIGTERM to mpiexec (which forwards it to every rank) on dp2 x pp2 with ZeRO-1: exit 0 with the line saying
     so, at most 2 steps after the step the run was in when signalled (each step is slowed to ~150 ms by a
     straggler delay, so this is a bound on steps, not on a stopwatch); the checkpoint of that step is complete,
     and the same command resumes from it and ends bit-identical to an uninterrupted run (metrics rows and export);
  2. SIGUSR1 to one rank only (not mpiexec): the ranks agree and stop together; exit 0;
  3. optim.staleness=2 (fixed): the signal makes a following step a sync point; the checkpoint resumes
     bit-identically to an uninterrupted run with the same sync points;
  3b. local SGD (optim.sync_every=12, DiLoCo's outer step, bf16): the vote is read 8 steps late, so the run stops
     within 9 steps of the signal, before the first average, with a checkpoint holding every replica's weights and
     state, and the resumed run equals an uninterrupted one (its average at step 12 included);
  4. a second signal ends the run at once (long steps: it must not wait for the step to end);
     run.stop_signals="" leaves the signal's default (the run ends at once, status not 0);
  5. a full disk (a small tmpfs under `unshare --mount`; skipped where it cannot be made): the checkpoint write
     fails with exit 1 naming "No space left on device", and the incomplete step directory is removed.

usage: test_stop_signals.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

mpiexec, trainer, src, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
STEPS = 16
base = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "model.n_head=4", "--set",
        "train.global_batch=8", "--set", "train.micro_batch=2", "--set", f"train.steps={STEPS}",
        "--set", "run.log_every=1"]
# Every step of rank 0 sleeps 150 ms, so a signal finds the run mid-step and the steps it takes to stop are few.
slow = ["train.straggler.ranks=[0]", "train.straggler.delay_ms=150"]
ok = True


def check(cond, what):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {what}", flush=True)


def command(name, ranks, sets):
    cmd = ([mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [trainer] + base + ["--set", f"run.dir={work}/{name}"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def env():
    return dict(os.environ, OMP_NUM_THREADS="1")


def run(name, ranks, *sets, expect=0):
    r = subprocess.run(command(name, ranks, sets), capture_output=True, text=True, timeout=300, env=env())
    out = r.stdout + r.stderr
    if r.returncode != expect:
        print(out)
        raise SystemExit(f"FAIL: {name} exited with {r.returncode}, expected {expect}")
    return out


def rows(name):
    path = f"{work}/{name}/metrics.jsonl"
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def same_rows(a, b, keys=("step", "loss", "grad_norm", "lr", "tokens")):
    return len(a) == len(b) and all(x.get(k) == y.get(k) for x, y in zip(a, b) for k in keys)


def same_file(a, b):
    return open(a, "rb").read() == open(b, "rb").read()


def signalled(name, ranks, sets, send, after_rows=4, timeout=120):
    """Starts a run, waits until metrics.jsonl has after_rows rows, calls send(process); returns (status, output,
    the rows written when the signal went)."""
    p = subprocess.Popen(command(name, ranks, sets), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env(), start_new_session=True)
    t0 = time.time()
    metrics = f"{work}/{name}/metrics.jsonl"  # created just before the first step
    while (len(rows(name)) < after_rows or not os.path.exists(metrics)) and p.poll() is None and \
            time.time() - t0 < timeout:
        time.sleep(0.02)
    if after_rows == 0:
        time.sleep(1.0)  # inside the first step
    seen = len(rows(name))
    send(p)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        out += "\n(killed: the run did not end)"
    return p.returncode, out, seen


def stopped_step(out):
    for line in out.splitlines():
        if "stopped by" in line and "after step" in line:
            return int(line.split("after step")[1].split()[0])
    return None


def complete(name, step):
    return os.path.exists(f"{work}/{name}/checkpoints/step_{step:08d}/COMPLETE")


# 1. SIGTERM to mpiexec, dp2 x pp2 with ZeRO-1, then resume.
mesh = ["parallel.pp=2", "optim.zero=1", "parallel.schedule=1f1b"]
run("uninterrupted", 4, *mesh, *slow)
status, out, seen = signalled("term", 4, mesh + slow, lambda p: p.send_signal(signal.SIGTERM))
at = stopped_step(out)
check(status == 0 and at is not None and "stopped by SIGTERM" in out,
      f"SIGTERM to mpiexec: exit {status}, stopped after step {at}")
check(at is not None and seen <= at <= seen + 2, f"it stopped within 2 steps of the signal (rows written {seen}, "
      f"stopped after step {at})")
check(at is not None and complete("term", at) and len(rows("term")) == at,
      f"the checkpoint of step {at} is complete and metrics.jsonl has every step up to it")
out = run("term", 4, *mesh, *slow)
check(f"step_{at:08d} (step {at}," in out and "resumed from" in out, f"the same command resumes from step {at}")
check(same_rows(rows("term"), rows("uninterrupted")), "every metrics row after the resume equals the uninterrupted run")
check(same_file(f"{work}/term/model.safetensors", f"{work}/uninterrupted/model.safetensors"),
      "the export equals the uninterrupted run's, byte for byte")


# 2. SIGUSR1 to one rank only: the ranks agree.
def rank_pids(name):
    """The trainer processes of run `name` (their command line names its run.dir), mpiexec's proxies left out."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"trainer" and f"run.dir={work}/{name}".encode() in argv:
            pids.append(int(pid))
    return sorted(pids)


def usr1_to_one_rank(p):
    os.kill(rank_pids("usr1_one_rank")[-1], signal.SIGUSR1)


status, out, seen = signalled("usr1_one_rank", 2, slow, usr1_to_one_rank)
at = stopped_step(out)
check(status == 0 and "stopped by SIGUSR1" in out and at is not None and complete("usr1_one_rank", at),
      f"SIGUSR1 to one rank: every rank stops after step {at} with a complete checkpoint (exit {status})")

# 3. Staleness: the stop waits for a step where the replicas agree. That step becomes a sync point (every average
# in flight applied), which changes the trajectory: the reference is a run with a sync point there too, a checkpoint
# every `at` steps, and the resumed run keeps that setting so both have the same sync points after it as well.
stale = ["optim.staleness=2", "optim.staleness_policy=fixed"]
status, out, seen = signalled("stale", 2, stale + slow, lambda p: p.send_signal(signal.SIGTERM))
at = stopped_step(out)
check(status == 0 and at is not None and seen <= at <= seen + 6 and complete("stale", at),
      f"optim.staleness=2: stopped after step {at} (rows written {seen}, reported in the background) with a "
      "complete checkpoint")
if at is not None:
    run("stale_reference", 2, *stale, *slow, f"run.checkpoint_every={at}")
    run("stale", 2, *stale, *slow, f"run.checkpoint_every={at}")
    # grad_norm under staleness is the norm of the last average applied, which a resumed run has not seen yet.
    check(same_rows(rows("stale"), rows("stale_reference"), ("step", "loss", "lr", "tokens")),
          "staleness: the resumed run equals an uninterrupted one with the same sync points")


# 3b. Local SGD: the replicas meet only at their averages, 12 steps apart here; the vote, read 8 steps late, stops
# the run before the first, and the checkpoint holds each replica's own weights. The stop changes nothing: the
# resumed run equals an uninterrupted one without checkpoints, averaging at step 12 as that one does.
local = ["optim.sync_every=12", "optim.outer=nesterov", "optim.name=adamw", "precision.compute=bf16"]
status, out, seen = signalled("local_sgd", 2, local + slow, lambda p: p.send_signal(signal.SIGTERM), after_rows=2)
at = stopped_step(out)
# Rows complete as the slowest rank's figures arrive: the signal lands in step seen + 1 at the latest, and the vote
# cast at its end is read 8 steps later: step 11 at the latest.
check(status == 0 and at is not None and at < 12 and seen <= at <= seen + 9 and complete("local_sgd", at),
      f"local SGD: stopped after step {at}, before the first average (rows written {seen}), with a complete checkpoint")
run("local_sgd_reference", 2, *local, *slow)
out = run("local_sgd", 2, *local, *slow)
check(f"each of the 2 replicas resumes its own weights and optimizer moments, {at} steps into the first period" in out,
      "local SGD: each replica resumed its own weights")
check(same_rows(rows("local_sgd"), rows("local_sgd_reference")) and
      same_file(f"{work}/local_sgd/model.safetensors", f"{work}/local_sgd_reference/model.safetensors"),
      "local SGD: the resumed run equals an uninterrupted one (metrics rows and export)")

# 4. A second signal, and no stop signals.
def twice(p):
    p.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)


long_steps = ["train.straggler.ranks=[0]", "train.straggler.delay_ms=20000", "comm.timeout_s=120"]
t0 = time.time()
status, out, _ = signalled("twice", 2, long_steps, twice, after_rows=0)
took = time.time() - t0


def ended_at_once(name, took, out):
    """Ended without finishing its step: no checkpoint, no stop line, no export, and long before the step's 20 s.
    (mpiexec's own exit status is not a witness: when it was signalled itself it may exit 0 after forwarding.)"""
    return (took < 15 and "stopped by" not in out and not os.path.exists(f"{work}/{name}/checkpoints") and
            not os.path.exists(f"{work}/{name}/model.safetensors"))


check(ended_at_once("twice", took, out), f"a second SIGTERM ends the run at once (exit {status} after {took:.1f} s, steps of "
      "20 s)")
t0 = time.time()
status, out, _ = signalled("no_stop_signals", 2, long_steps + ["run.stop_signals="], lambda p: (
    time.sleep(0.5), p.send_signal(signal.SIGTERM)), after_rows=0)
took = time.time() - t0
check(ended_at_once("no_stop_signals", took, out),
      f"run.stop_signals=\"\": SIGTERM ends the run at once (exit {status} after {took:.1f} s)")

# 5. A full disk: a tmpfs too small for the checkpoint, mounted in a private mount namespace.
probe = subprocess.run(["unshare", "--mount", "--map-root-user", "true"], capture_output=True)
if probe.returncode != 0 and os.geteuid() != 0:
    print("skip: full disk (no mount namespace: unshare --mount fails and this is not root)")
else:
    disk = f"{work}/small_disk"
    os.makedirs(disk)
    ns = ["unshare", "--mount"] + (["--map-root-user"] if os.geteuid() != 0 else [])
    # 96 KiB: the config echo and metrics fit; a rank's checkpoint file (masters and moments, ~2 MiB) does not.
    # The tmpfs lives only as long as the namespace, so what the run left is listed inside it.
    script = (f"mount -t tmpfs -o size=96k tmpfs {disk} || exit 99; " +
              " ".join(command("small_disk/run", 1, ["run.checkpoint_every=2"])) +
              f"; echo \"EXIT $?\"; echo LEFT; ls -A {disk}/run/checkpoints")
    r = subprocess.run(ns + ["sh", "-c", script], capture_output=True, text=True, timeout=300, env=env())
    out = r.stdout + r.stderr
    if r.returncode == 99:
        print(out)
        print("skip: full disk (tmpfs cannot be mounted here)")
    else:
        status = int(out.split("EXIT ")[1].split()[0]) if "EXIT " in out else None
        check(status == 1 and "No space left on device" in out and "writing checkpoint" in out,
              f"full disk: exit {status}, the error names the cause")
        left = r.stdout.split("LEFT")[1].split() if "LEFT" in r.stdout else None
        check(left == [], f"full disk: no incomplete step directory is left (found {left})")

sys.exit(0 if ok else 1)
