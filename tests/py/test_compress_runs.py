"""Gradient compression (comm.compress) end to end, on 2 data-parallel replicas (of 2 pipeline stages unless said):

  1. copies of a parameter stay equal: the tied embedding's two (the first stage's wte, the last stage's head), and
     the tp ranks' copies of replicated parameters (norms, biases) and of Llama's k and v under n_kv_head < tp.
     Each copy is updated from the same gradient, but int8 and topk encode whole buckets, whose other parameters
     differ between the stages, and between the tp ranks: the tied copy has a bucket of its own, and tp copies
     are encoded apart from their bucket (GradReducer). The export gathers every copy and stops the run (a CHECK, exit
     status not 0) where they differ. int8 and topk on 2 x 1 x 2; an fp16 run with int8 on 2 x 2 x 2 whose last
     rank overflows at step 3 in a block's weight (its tensor-parallel shard; the vocabulary is 128 so that the
     second tp rank's wte shard holds real rows, not only padding): the skipped step clears every stage's error
     feedback alike, not only the reducers whose own averages were non-finite; topk on a Llama with one k/v head on
     2 x 2 x 1.
  2. checkpoints hold the error feedback: int8 on 2 x 1 x 2 with interleaved stages (2 chunks per rank, not in
     order in the flat layout) and powersgd (rank 2) on 2 x 2 x 2, 8 steps with a checkpoint at step 4, resumed
     from it into another run directory: steps 5-8 and the export are exactly the uninterrupted run's (each rank's
     residual, and PowerSGD's Qs and draw counts, are in the checkpoint). The powersgd checkpoint resumed on
     4 x 1 x 1 warns that replicas 2-3 start from zero and that the Qs (written for tp 2) start from a fresh draw,
     and runs on.
  3. comm.adapt: a run that chose 1 MiB buckets without compression, resumed under comm.bucket_mb=4 and
     comm.compress=powersgd, goes on at 1 MiB without compression (the checkpoint holds the setting in force).

usage: test_compress_runs.py TRAINER SOURCE_DIR WORK_DIR MPIEXEC"""
import json
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
    cmd = [mpiexec, "-n", str(ranks), trainer] + base + [a for s in sets for a in ("--set", s)]
    cmd += ["--set", f"run.dir={d}"]
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
                         {"MESHTRAIN_INJECT": "grad-inf@3"}),
                        ("topk_llama_tp2", ["comm.compress=topk", "comm.topk_fraction=0.05", "parallel.tp=2",
                                            "parallel.pp=1", "model.arch=llama", "model.n_kv_head=1"], None)]:
    rc, log = run(name, *sets, env=env, ranks=8 if "parallel.tp=2" in sets and "parallel.pp=1" not in sets else 4)
    drifted = "drifted apart" in log
    if rc != 0 and not drifted:
        print(log)
    check(rc == 0 and not drifted, f"{name}: the copies training keeps equal are equal at the end (exit {rc})")
    if name.endswith("overflow"):
        check("step 3: gradient overflow" in log, f"{name}: step 3 overflowed and was skipped")



def rows(name):
    with open(os.path.join(work, name, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f)}


def same_file(a, b):
    def read(name):
        with open(os.path.join(work, name, "model.safetensors"), "rb") as f:
            return f.read()
    return read(a) == read(b)


# 2. Resumed runs continue bit for bit.
ckpt = ["train.steps=8", "run.checkpoint_every=4"]
psgd = ["comm.compress=powersgd", "comm.powersgd_rank=2", "parallel.tp=2", "model.vocab_size=128"]
interleaved = ["parallel.schedule=interleaved", "parallel.virtual_stages=2", "model.n_layer=4", "train.micro_batch=2"]
for name, sets, ranks in [("int8_ckpt", ["comm.compress=int8", *interleaved], 4), ("powersgd_ckpt", psgd, 8)]:
    rc, log = run(name, *sets, *ckpt, ranks=ranks)
    check(rc == 0, f"{name}: 8 steps with checkpoints (exit {rc})")
    at4 = os.path.join(work, name, "checkpoints", "step_00000004")
    rc, log = run(name + "_resumed", *sets, *ckpt, f"run.resume={at4}", ranks=ranks)
    check(rc == 0 and "resumes its error-feedback residual" in log, f"{name}: resumed from step 4 with its residuals")
    if rc != 0:
        print(log[-3000:])
        continue
    a, b = rows(name), rows(name + "_resumed")
    check(all(a[s]["loss"] == b[s]["loss"] for s in range(5, 9)),
          f"{name}: steps 5-8 as uninterrupted: {[b[s]['loss'] for s in range(5, 9)]}")
    check(same_file(name, name + "_resumed"), f"{name}: the export is the uninterrupted run's, byte for byte")
at4 = os.path.join(work, "powersgd_ckpt", "checkpoints", "step_00000004")
rc, log = run("powersgd_dp4", *psgd[:2], "parallel.dp=4", "parallel.pp=1", "model.vocab_size=128", *ckpt,
              f"run.resume={at4}")
check(rc == 0 and "replicas 2-3 start from zero" in log and "fresh draw for" in log,
      f"powersgd on 4 x 1 x 1 from the 2 x 2 x 2 checkpoint: warned, ran on (exit {rc})")

# 3. comm.adapt resumes in the setting it had chosen.
adapt = ["parallel.pp=1", "comm.adapt=true", "comm.adapt_compress=none,powersgd", *ckpt]
rc, _ = run("adapt", *adapt, "comm.bucket_mb=1", ranks=2)
at4 = os.path.join(work, "adapt", "checkpoints", "step_00000004")
rc2, log = run("adapt_resumed", *adapt, "comm.bucket_mb=4", "comm.compress=powersgd", f"run.resume={at4}", ranks=2)
after = rows("adapt_resumed")
check(rc == 0 and rc2 == 0 and "resumes at the checkpoint's setting, bucket 1 MiB and compression none" in log
      and all(after[s]["bucket_mb"] == 1 and after[s]["compress"] == "none" for s in range(5, 9)),
      f"comm.adapt resumed at 1 MiB without compression (exit {rc}, {rc2})")

print("all passed" if ok else "FAILED")
sys.exit(0 if ok else 1)
