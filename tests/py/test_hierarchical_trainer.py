"""comm.hierarchical in the trainer: dp = 4 over two emulated nodes of 2 ranks. The three-phase all-reduce gives
the flat one's results bit for bit (it sums in the same order per element; tests/test_hierarchical.cpp), so every
step's loss and the export must be identical; on a two-tier network (slow links between nodes) the data-parallel
communication takes less time; and a layout whose dp groups are spread unevenly over nodes is refused with exit
status 2 naming the key.

usage: test_hierarchical_trainer.py TRAINER SOURCE_DIR WORK_DIR MPIEXEC"""
import json
import os
import shutil
import statistics
import subprocess
import sys

trainer, src, work, mpiexec = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
base = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "train.global_batch=8", "--set",
        "train.steps=8", "--set", "run.log_every=100", "--set", "run.resume=none", "--set", "train.threads=1",
        "--set", "comm.emulate.ranks_per_node=2", "--set", "comm.emulate.latency_us=20", "--set",
        "comm.emulate.bandwidth_gbps=2", "--set", "comm.emulate.inter_latency_us=2000", "--set",
        "comm.emulate.inter_bandwidth_gbps=0.02"]
ok = True


def check(cond, what):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {what}")


def run(name, *sets):
    d = os.path.join(work, name)
    cmd = [mpiexec, "-n", "4", trainer] + base + [a for s in sets for a in ("--set", s)] + ["--set", f"run.dir={d}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    rows = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))] if r.returncode == 0 else []
    return r.returncode, r.stdout + r.stderr, rows


_, _, flat = run("flat")
_, _, hier = run("hierarchical", "comm.hierarchical=true")
check([r["loss"] for r in hier] == [r["loss"] for r in flat] and len(flat) == 8,
      "hierarchical all-reduce: every step's loss equal to the flat all-reduce's")
same = open(os.path.join(work, "flat", "model.safetensors"), "rb").read() == \
    open(os.path.join(work, "hierarchical", "model.safetensors"), "rb").read()
check(same, "exported weights byte-identical")
# The gradients (one bucket of n bytes) cross the slow inter-node link 2(p-1) = 6 times in the flat ring, 2(m-1) = 2
# times with half the bytes in the hierarchical all-reduce. The alpha-beta model's saving per step must show up at
# least half (the step's other collectives, the same in both runs, cancel in the difference).
n = flat[-1]["comm_bytes"] - 4  # the flat run's bytes: the gradient bucket and the 4-byte loss
a_i, b_i, a_e, b_e = 20.0, 1 / 2e3, 2000.0, 1 / 0.02e3  # us and us per byte
flat_us = 6 * (a_e + n / 4 * b_e)
hier_us = 2 * (a_i + n / 2 * b_i) + 2 * (a_e + n / 4 * b_e)
f_ms = statistics.median(r["comm_ms"] for r in flat[2:])
h_ms = statistics.median(r["comm_ms"] for r in hier[2:])
saved, predicted = f_ms - h_ms, (flat_us - hier_us) / 1000
check(saved >= 0.5 * predicted, f"two tiers: communication per step {f_ms:.2f} ms flat, {h_ms:.2f} ms hierarchical: "
      f"{saved:.2f} ms saved, the model predicts {predicted:.2f} ms")
code, out, _ = run("uneven", "comm.hierarchical=true", "comm.emulate.ranks_per_node=3")
check(code == 2 and "comm.hierarchical" in out and "unevenly" in out,
      f"dp groups spread unevenly over nodes: exit {code} with a message naming comm.hierarchical")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
