"""Network faults while 4 ranks train on 2 hosts (scripts/cluster.sh), dp 2 x tp 2 (tp inside a host, dp across),
a checkpoint every 5 steps, comm.timeout_s 10:

  1. a host's link goes down: the job ends within comm.timeout_s + 15 s of the fault, the message names the rank,
     the operation and the communicator; with the link back, the same command resumes from the newest complete
     checkpoint and every metrics row equals an uninterrupted run;
  2. a host's processes are killed: the same;
  3. the link goes down for 2 s, shorter than the timeout: training goes on and every row equals the uninterrupted
     run.

Each step is slowed to ~100 ms by a straggler delay, so a fault finds the run in the middle. Needs root and
`ip netns` (exit 77 without them, or when a cluster is already up).

usage: test_network_faults.py TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import shutil
import subprocess
import sys
import time

from cluster_support import check, exit_status, require_cluster

trainer, src, work = sys.argv[1:4]
cluster = os.path.join(src, "scripts", "cluster.sh")
TIMEOUT_S = 10
cmd = [cluster, "run", "-n", "4", "--", trainer, "--config", os.path.join(src, "configs", "tiny.yaml")]
for s in ["model.n_head=4", "train.global_batch=8", "train.micro_batch=2", "train.steps=60", "run.log_every=100",
          "parallel.tp=2", "comm.wait=poll", f"comm.timeout_s={TIMEOUT_S}", "run.checkpoint_every=5",
          "train.straggler.ranks=[0]", "train.straggler.delay_ms=100"]:
    cmd += ["--set", s]
require_cluster()


def rows(name):
    path = f"{work}/{name}/metrics.jsonl"
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def same_rows(a, b):
    keys = ("step", "loss", "grad_norm", "lr", "tokens")
    return len(a) == len(b) and all(x.get(k) == y.get(k) for x, y in zip(a, b) for k in keys)


def start(name):
    return subprocess.Popen(cmd + ["--set", f"run.dir={work}/{name}"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))


def finish(p):
    try:
        return p.communicate(timeout=300)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        return p.communicate()[0] + "\n(killed: did not end in 300 s)"


def when_at_step(name, step, p):
    while len(rows(name)) < step and p.poll() is None:
        time.sleep(0.05)


def cl(*args):
    subprocess.run([cluster] + list(args), check=True)


def fault_then_resume(name, fault, what):
    p = start(name)
    when_at_step(name, 15, p)
    t0 = time.time()
    fault()
    out = finish(p)
    took = time.time() - t0
    check(p.returncode != 0 and took <= TIMEOUT_S + 15,
          f"{what}: the job ended {took:.1f} s after the fault (bar {TIMEOUT_S + 15} s), exit {p.returncode}")
    return out


def resumes(name):
    out = finish(start(name))
    check("resumed from" in out and "done:" in out and same_rows(rows(name), rows("uninterrupted")),
          f"{name}: the same command resumes from the newest complete checkpoint; every row equals the "
          "uninterrupted run")


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
subprocess.run([cluster, "up", "2"], check=True)
try:
    out = finish(start("uninterrupted"))
    if "done:" not in out:
        print(out[-3000:])
        raise SystemExit("FAIL: the uninterrupted run did not finish")

    out = fault_then_resume("link_down", lambda: cl("link", "mt-h2", "down"), "a host's link down")
    check("watchdog" in out and "rank" in out and "all_reduce" in out and "'dp'" in out,
          "the message names the rank, the operation and the communicator")
    cl("link", "mt-h2", "up")
    resumes("link_down")

    fault_then_resume("host_killed", lambda: cl("kill", "mt-h2"), "a host's processes killed")
    resumes("host_killed")

    p = start("link_blip")
    when_at_step("link_blip", 15, p)
    cl("link", "mt-h2", "down")
    time.sleep(2)
    cl("link", "mt-h2", "up")
    out = finish(p)
    check("done:" in out and same_rows(rows("link_blip"), rows("uninterrupted")),
          "the link down for 2 s (< comm.timeout_s): training goes on, every row equals the uninterrupted run")
finally:
    subprocess.run([cluster, "down"])
sys.exit(exit_status())
