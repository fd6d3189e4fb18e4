"""fp16 loss scaling on a 2x2x2 mesh (dp x tp x pp, ZeRO-1): an inf injected into one gradient of one rank
(MESHTRAIN_INJECT=grad-inf@3) makes the dynamic scaler back off and skip exactly step 3 on every rank.

Checks: metrics rows (the scale halves after step 3, skipped_steps counts 1 from step 3 on), and, for "every
rank", the exported weights of a run that stops right after the skipped step 3 equal those of a run of 2 steps
bit for bit: had any rank updated its shard at step 3, its tensors would differ. A fixed loss scale skips the
step too but keeps its value.

usage: test_loss_scale_overflow.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from parity_support import read_safetensors  # noqa: E402

mpiexec, trainer, src, work = sys.argv[1:5]
base = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "precision.compute=fp16",
        "--set", "parallel.tp=2", "--set", "parallel.pp=2", "--set", "optim.zero=1",
        "--set", "train.global_batch=8", "--set", "train.micro_batch=2", "--set", "run.log_every=1"]


def run(name, ranks, steps, inject, *sets):
    run_dir = os.path.join(work, name)
    cmd = [mpiexec, "-n", str(ranks), trainer] + base + ["--set", f"train.steps={steps}", "--set", f"run.dir={run_dir}"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MESHTRAIN_INJECT", None)
    if inject:
        env["MESHTRAIN_INJECT"] = f"grad-inf@{inject}"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAIL: {name} exited with {r.returncode}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return rows, read_safetensors(os.path.join(run_dir, "model.safetensors")), r.stdout + r.stderr


ok = True


def check(cond, what):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {what}")


rows, _, log = run("dynamic_inject3", 8, 5, 3)
scales = [r["loss_scale"] for r in rows]
skipped = [r["skipped_steps"] for r in rows]
check(scales == [65536, 65536, 65536, 32768, 32768], f"dynamic scale per step {scales}")
check(skipped == [0, 0, 1, 1, 1], f"skipped_steps per step {skipped}")
check("step 3: gradient overflow" in log and "scale now 32768" in log, "the skip is logged")
check(all(r["grad_norm"] == r["grad_norm"] and r["grad_norm"] < 1e30 for i, r in enumerate(rows) if i != 2),
      "finite gradient norms on the other steps")

_, w_skip, _ = run("dynamic_inject3_stop", 8, 3, 3)
_, w_two, _ = run("no_inject_2steps", 8, 2, 0)
same = w_skip.keys() == w_two.keys() and all(w_skip[k] == w_two[k] for k in w_two)
check(same, "weights after the skipped step 3 equal those after step 2, on every shard (exported, bit for bit)")
_, w_three, _ = run("no_inject_3steps", 8, 3, 0)
check(any(w_three[k] != w_two[k] for k in w_two), "(and a third step without the overflow does change them)")

rows, _, _ = run("fixed_inject2", 8, 3, 2, "precision.loss_scale=1024")
check([r["loss_scale"] for r in rows] == [1024, 1024, 1024] and [r["skipped_steps"] for r in rows] == [0, 1, 1],
      "a fixed scale skips the overflowing step and keeps its value")

sys.exit(0 if ok else 1)
