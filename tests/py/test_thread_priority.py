"""comm.thread_priority: real-time communication threads where the OS permits them, a clear refusal where a run
requires them and may not have them, and nothing lost either way (docs/comm.md).

Each run: 2 ranks, configs/tiny.yaml, a few steps. A process is denied real-time threads by starting it without
CAP_SYS_NICE and with an rtprio limit of 0 (`prlimit --rtprio=0 setpriv --bounding-set -sys_nice`), as an
unprivileged user's is by default.
  1. auto, denied: the run trains (exit 0), warns that real-time threads were refused, and does not claim them;
  2. realtime, denied: exit 2 before training, naming the key, the reason and how to grant them;
  3. realtime as this test runs (`chrt -f 1` tells whether it may): the run has them and says so on the mesh line,
     or, where this process may not, exits 2 as in 2;
  4. realtime with an rtprio limit of 1 and no CAP_SYS_NICE (the unprivileged grant): the run has them. Only where
     the hard rtprio limit allows 1 (raising it needs CAP_SYS_RESOURCE); the test says when it did not run this;
  5. normal: no real-time threads and no warning;
  6. the losses of every run that trained are equal: scheduling changes when threads run, never what they compute.

usage: test_thread_priority.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import resource
import shutil
import subprocess
import sys

mpiexec, trainer, src, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
ok = True
DENY = ["prlimit", "--rtprio=0", "setpriv", "--bounding-set", "-sys_nice", "--"]
GRANT_BY_RLIMIT = ["prlimit", "--rtprio=1", "setpriv", "--bounding-set", "-sys_nice", "--"]
CLAIM = "(real-time threads)"
REFUSED = "real-time threads refused"


def check(cond, what):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {what}", flush=True)


def run(name, wrap, priority, expect):
    cmd = [mpiexec, "-n", "2"] + wrap + [trainer, "--config", os.path.join(src, "configs", "tiny.yaml"),
                                         "--set", "train.global_batch=8", "--set", "train.micro_batch=2",
                                         "--set", "train.steps=4", "--set", "run.log_every=1",
                                         "--set", f"comm.thread_priority={priority}", "--set", f"run.dir={work}/{name}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = r.stdout + r.stderr
    if r.returncode != expect:
        print(out)
    check(r.returncode == expect, f"{name}: exit {r.returncode} (expected {expect})")
    return out


def losses(name):
    return [json.loads(l)["loss"] for l in open(os.path.join(work, name, "metrics.jsonl"))]


out = run("auto_denied", DENY, "auto", 0)
check(REFUSED in out and CLAIM not in out, "auto, denied: warns that real-time threads were refused, claims none")
out = run("realtime_denied", DENY, "realtime", 2)
check("comm.thread_priority=realtime" in out and "Operation not permitted" in out and "ulimit -r" in out,
      "realtime, denied: refused naming the key, the reason and the grant")
check(not os.path.exists(os.path.join(work, "realtime_denied", "metrics.jsonl")), "realtime, denied: no step ran")
trained = ["auto_denied"]
may = subprocess.run(["chrt", "-f", "1", "true"], capture_output=True).returncode == 0
out = run("realtime", [], "realtime", 0 if may else 2)
if may:
    check(CLAIM in out, "realtime, permitted here: the mesh line claims real-time threads")
    trained.append("realtime")
else:
    check("Operation not permitted" in out, "realtime, not permitted here: refused with the reason")
hard = resource.getrlimit(resource.RLIMIT_RTPRIO)[1]
if hard == resource.RLIM_INFINITY or hard >= 1:
    out = run("realtime_rlimit", GRANT_BY_RLIMIT, "realtime", 0)
    check(CLAIM in out and REFUSED not in out, "realtime with rtprio 1 and no CAP_SYS_NICE: real-time threads")
    trained.append("realtime_rlimit")
else:
    print("not run: realtime with an rtprio limit of 1 (the hard limit here is 0, and raising it needs "
          "CAP_SYS_RESOURCE)")
out = run("normal", [], "normal", 0)
check(CLAIM not in out and REFUSED not in out, "normal: neither real-time threads nor a warning")
ref = losses("normal")
check(len(ref) == 4 and all(losses(n) == ref for n in trained), f"the same losses whatever the priority: {ref}")
sys.exit(0 if ok else 1)
