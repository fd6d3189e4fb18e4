"""Several hosts over real TCP: scripts/cluster.sh makes 2 hosts (network namespaces on a bridge, each with its own
hostname), 2 ranks on each, and the trainer runs across them.

  1. the start-up log names each host and its ranks, and which mesh axes stay inside a host;
  2. dp 4, tp 2 inside a host x dp 2 across hosts, and pp 2 across hosts x dp 2 inside: every loss within 1e-5 of
     the same layout on one host (mpiexec here);
  3. bytes really cross the host links: each host's veth counters grow by at least the gradient traffic the
     all-reduce across hosts must carry;
  4. comm.hierarchical (reduce-scatter inside each host, all-reduce across, all-gather inside) on the real hosts:
     every loss bit-identical to the flat all-reduce across the same hosts;
  5. a checkpoint written on 2 hosts resumes on 1 (mpiexec here): every loss after it within 1e-5 of the run
     that went on across the hosts;
  6. scripts/cluster.sh refuses (exit 2) without root, and `down` removes every namespace it made; `--help` prints
     its usage with status 0;
  7. the hosts split the machine's cores: each host's processes see their share (nproc), the shares adding up to
     the cores this test may use.

Needs root and `ip netns` (exit 77, reported as skipped, without them, or when a cluster is already up). The
cluster is removed at the end, also on failure. comm.wait=poll: the hosts share this machine's cores, so the MPI
transport's blocking waits, which spin, would take the cores the other host's ranks compute on.

usage: test_multihost.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from cluster_support import check, exit_status, require_cluster

mpiexec, trainer, src, work = sys.argv[1:5]
cluster = os.path.join(src, "scripts", "cluster.sh")
STEPS = 12
base = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "model.n_head=4", "--set",
        "train.global_batch=8", "--set", "train.micro_batch=2", "--set", f"train.steps={STEPS}",
        "--set", "run.log_every=100", "--set", "comm.wait=poll", "--set", "comm.timeout_s=60"]
require_cluster()


def trainer_cmd(name, sets):
    cmd = [trainer] + base + ["--set", f"run.dir={work}/{name}"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def finished(name, r):
    out = r.stdout + r.stderr
    # The trainer's own line and files say whether it finished; mpiexec's status after that can be spoiled by
    # MPICH's UCX transport hanging in MPI_Finalize, which the trainer then ends itself (comm/mpi_init.h).
    if "done:" not in out or not os.path.exists(f"{work}/{name}/model.safetensors"):
        print(out[-4000:])
        raise SystemExit(f"FAIL: {name} did not finish (exit {r.returncode})")
    return out


def on_hosts(name, *sets):
    r = subprocess.run([cluster, "run", "-n", "4", "--"] + trainer_cmd(name, sets), capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return finished(name, r)


def here(name, *sets):
    r = subprocess.run([mpiexec, "-n", "4"] + trainer_cmd(name, sets), capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    return finished(name, r)


def losses(name):
    return [json.loads(line)["loss"] for line in open(f"{work}/{name}/metrics.jsonl")]


def within(a, b, tol=1e-5):
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def host_bytes():
    out = subprocess.run([cluster, "bytes"], capture_output=True, text=True, check=True).stdout.split()
    return {out[i]: (int(out[i + 1]), int(out[i + 2])) for i in range(0, len(out), 3)}


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
# The unprivileged user runs a copy in a folder it can read: the checkout itself may be readable by root only
# (a clone under /root, or in a `mktemp -d` folder), and then it would exit 126 before the script's own check.
public = tempfile.mkdtemp(prefix="mt-cluster-")
try:
    os.chmod(public, 0o755)
    shutil.copy(cluster, public)
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        os.path.join(public, "cluster.sh"), "up", "2"], capture_output=True, text=True)
finally:
    shutil.rmtree(public, ignore_errors=True)
check(r.returncode == 2 and "needs root" in r.stderr, f"without root: exit {r.returncode}, says why")
r = subprocess.run([cluster, "--help"], capture_output=True, text=True)
check(r.returncode == 0 and "scripts/cluster.sh up N" in r.stdout, f"--help: exit {r.returncode}, the usage")
subprocess.run([cluster, "up", "2"], check=True)
try:
    r = subprocess.run([cluster, "run", "-n", "2", "--", "nproc"], capture_output=True, text=True, timeout=60)
    shares = [int(x) for x in r.stdout.split() if x.isdigit()]
    cores = len(os.sched_getaffinity(0))
    check(len(shares) == 2 and all(s >= 1 for s in shares) and sum(shares) == max(cores, 2),
          f"the hosts split the {cores} cores: each sees {shares}")
    layouts = {"dp4": [], "tp2_dp2": ["parallel.tp=2"], "pp2_dp2": ["parallel.pp=2", "parallel.schedule=1f1b"]}
    for name, sets in layouts.items():
        before = host_bytes()
        out = on_hosts(name, *sets)
        after = host_bytes()
        here(name + "_one_host", *sets)
        diff = max(abs(x - y) for x, y in zip(losses(name), losses(name + "_one_host")))
        check(within(losses(name), losses(name + "_one_host")),
              f"{name} on 2 hosts: every loss within 1e-5 of one host (max difference {diff:.1e})")
        if name == "dp4":
            check("2 nodes: mt-h1 (ranks 0-1), mt-h2 (ranks 2-3)" in out, "the log names each host and its ranks")
            # The gradient (4 bytes per parameter) crosses between the hosts at least once per step each way.
            grad = 4 * 28_032  # tiny.yaml with n_head 4: 28032 parameters
            sent = {h: after[h][1] - before[h][1] for h in after}
            check(all(s >= STEPS * grad for s in sent.values()),
                  f"dp4: each host link carried at least the gradient per step ({STEPS * grad} bytes): {sent}")
        if name == "tp2_dp2":
            check("groups inside a node: tp; groups spanning nodes: dp" in out,
                  "tp2 x dp2: the log says tp stays inside a host and dp spans the hosts")
        if name == "pp2_dp2":
            check("groups inside a node: dp; groups spanning nodes: pp" in out,
                  "pp2 x dp2: the log says the pipeline spans the hosts")

    out = on_hosts("dp4_hierarchical", "comm.hierarchical=true")
    check("each dp all-reduce over 2 nodes x 2 ranks (nodes as MPI finds them)" in out,
          "comm.hierarchical finds the 2 real hosts")
    check(losses("dp4_hierarchical") == losses("dp4"),
          "comm.hierarchical on the real hosts: every loss bit-identical to the flat all-reduce")

    on_hosts("tp2_dp2_ckpt", "parallel.tp=2", "run.checkpoint_every=6")
    ckpt = f"{work}/tp2_dp2_ckpt/checkpoints/step_00000006"
    out = here("resumed_on_one_host", "parallel.tp=2", f"run.resume={ckpt}")
    check("resumed from" in out and within(losses("resumed_on_one_host"), losses("tp2_dp2_ckpt")[6:]),
          "a checkpoint written on 2 hosts resumes on 1 host: steps 7-12 within 1e-5 of the run across hosts")
finally:
    subprocess.run([cluster, "down"])
check(not os.path.exists("/run/meshtrain-cluster") and
      not any(n.startswith("mt-h") for n in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                           text=True).stdout.split()),
      "scripts/cluster.sh down removed every namespace it made")
sys.exit(exit_status())
