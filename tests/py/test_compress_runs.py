"""Gradient compression (comm.compress) end to end, on 2 data-parallel replicas of 2 pipeline stages (4 ranks):

  1. the tied embedding's two copies (the first stage's wte, the last stage's head) stay equal. Both stages
     compress the same summed gradient, but int8 and topk encode whole buckets, and the other parameters of a
     bucket differ between the stages: the copy has a bucket of its own (GradReducer). The export gathers both
     copies and stops the run (a CHECK, exit status not 0) where they differ. int8 and topk; and an fp16 run with
     int8 on 2 x 2 x 2 whose last rank overflows at step 3 in a block's weight (its tensor-parallel shard; the
     vocabulary is 128 so that the second tp rank's wte shard holds real rows, not only padding): the skipped step
     clears every stage's error feedback alike, not only the reducers whose own averages were non-finite.

usage: test_compress_runs.py TRAINER SOURCE_DIR WORK_DIR MPIEXEC"""
import os
import shutil
import subprocess
import sys

trainer, src, work, mpiexec = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
# tiny.yaml's wte (64 x 32) sits 448 elements further into the first stage's layout than into the last's, so in a
# bucket shared with other parameters its int8 blocks of 256 would start at different elements.
base = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "parallel.dp=2", "--set", "parallel.pp=2",
        "--set", "train.global_batch=8", "--set", "train.steps=6", "--set", "run.log_every=100",
        "--set", "run.resume=none"]
ok = True


def check(cond, what):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {what}")


def run(name, *sets, env=None, ranks=4):
    d = os.path.join(work, name)
    cmd = [mpiexec, "-n", str(ranks), trainer] + base + [a for s in sets for a in ("--set", s)] + ["--set", f"run.dir={d}"]
    e = dict(os.environ, OMP_NUM_THREADS="1")
    e.pop("MESHTRAIN_INJECT", None)
    e.update(env or {})
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=e)
    return r.returncode, r.stdout + r.stderr


# 1. The tied copies stay equal.
for name, sets, env in [("int8", ["comm.compress=int8"], None),
                        ("topk", ["comm.compress=topk", "comm.topk_fraction=0.05"], None),
                        ("int8_fp16_overflow", ["comm.compress=int8", "precision.compute=fp16", "parallel.tp=2",
                                                "model.vocab_size=128"],
                         {"MESHTRAIN_INJECT": "grad-inf@3"})]:
    rc, log = run(name, *sets, env=env, ranks=8 if "parallel.tp=2" in sets else 4)
    drifted = "drifted apart" in log
    if rc != 0 and not drifted:
        print(log)
    check(rc == 0 and not drifted, f"{name}: the tied embedding's copies are equal at the end (exit {rc})")
    if name.endswith("overflow"):
        check("step 3: gradient overflow" in log, f"{name}: step 3 overflowed and was skipped")

print("all passed" if ok else "FAILED")
sys.exit(0 if ok else 1)
