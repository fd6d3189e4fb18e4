"""Llama with the rest of the trainer (the mesh and PyTorch parity tests cover the model itself):
  1. checkpoints reshard: a dp2 x tp2 ZeRO-1 checkpoint of step 6 resumed on tp2 x pp2 and on one rank, and a
     tp4 checkpoint (2 kv heads, each on two ranks) resumed on tp2 and on one rank, continue within 1e-5 of the
     uninterrupted run (the same bound, and for the same reason, as test_checkpoints.py);
  2. mixed precision: bf16 and fp16 compute end within 2% of fp32's loss after 30 steps (as the GPT-2 test);
  3. data-parallel variants train: PowerSGD compression and local SGD (DiLoCo) on 2 ranks end well below the
     starting loss;
  4. configs/llama-tiny.yaml trains on the synthetic corpus and on tinyshakespeare (its loss falls by a third).
Usage: test_llama_features.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import shutil
import subprocess
import sys

mpiexec, trainer, src, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
LLAMA = ["model.arch=llama", "model.n_head=4", "model.n_kv_head=2", "model.multiple_of=16", "model.d_model=32",
         "train.global_batch=8", "train.micro_batch=2", "run.log_every=100", "optim.lr=3e-3", "optim.min_lr=3e-4"]
ok = True


def check(cond, what):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {what}")


def run(name, ranks, *sets, config="tiny.yaml"):
    d = os.path.join(work, name)
    cmd = ([mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [trainer, "--config", os.path.join(src, "configs", config)]
    for s in list(sets) + [f"run.dir={d}"]:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAIL: {name} exited with {r.returncode}")
    return [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))], r.stdout + r.stderr


# 1. Resharding.
ref, _ = run("ref", 1, *LLAMA, "train.steps=12")
run("dp2_tp2_zero", 4, *LLAMA, "train.steps=12", "parallel.tp=2", "optim.zero=1", "run.checkpoint_every=6")
ckpt = os.path.join(work, "dp2_tp2_zero", "checkpoints", "step_00000006")
for name, ranks, sets in [("to_tp2_pp2", 4, ["parallel.tp=2", "parallel.pp=2"]), ("to_1rank", 1, [])]:
    got, out = run(name, ranks, *LLAMA, "train.steps=12", *sets, f"run.resume={ckpt}")
    worst = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(got, ref[6:]))
    check(len(got) == 6 and worst <= 1e-5, f"dp2 x tp2 ZeRO-1 step 6 -> {name[3:]}: steps 7-12 within {worst:.1e}")

# With tp 4 over 2 kv heads each kv head is on two ranks (Shard::copies): its checkpoint reshards the same way.
run("tp4_kv_copies", 4, *LLAMA, "train.steps=12", "parallel.tp=4", "run.checkpoint_every=6")
ckpt = os.path.join(work, "tp4_kv_copies", "checkpoints", "step_00000006")
for name, ranks, sets in [("to_tp2", 2, ["parallel.tp=2"]), ("to_1rank_again", 1, [])]:
    got, out = run(name, ranks, *LLAMA, "train.steps=12", *sets, f"run.resume={ckpt}")
    worst = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(got, ref[6:]))
    check(len(got) == 6 and worst <= 1e-5, f"tp4 (kv heads on two ranks) step 6 -> {name[3:]}: steps 7-12 within "
          f"{worst:.1e}")

# 2. Mixed precision.
fp32, _ = run("fp32", 1, *LLAMA, "train.steps=30")
for dt in ("bf16", "fp16"):
    got, _ = run(dt, 1, *LLAMA, "train.steps=30", f"precision.compute={dt}")
    d = abs(got[-1]["loss"] - fp32[-1]["loss"]) / fp32[-1]["loss"]
    check(d <= 0.02, f"{dt}: final loss {got[-1]['loss']:.4f} against fp32's {fp32[-1]['loss']:.4f} ({d:.1%})")

# 3. Data-parallel variants.
for name, sets in [("powersgd", ["comm.compress=powersgd"]),
                   ("diloco", ["optim.sync_every=4", "optim.outer=nesterov"])]:
    got, _ = run(name, 2, *LLAMA, "train.steps=30", *sets)
    check(got[-1]["loss"] < got[0]["loss"] - 0.3, f"{name}: loss {got[0]['loss']:.3f} -> {got[-1]['loss']:.3f}")

# 4. configs/llama-tiny.yaml on both corpora (shortened).
for name, sets in [("synthetic", []),
                   ("tinyshakespeare", ["data.source=text", f"data.path={os.path.join(src, 'data', 'tinyshakespeare.txt')}"])]:
    got, _ = run(f"llama_tiny_{name}", 1, "train.steps=60", "train.eval_every=0", *sets, config="llama-tiny.yaml")
    check(got[-1]["loss"] < 0.67 * got[0]["loss"],
          f"llama-tiny.yaml on {name}: loss {got[0]['loss']:.3f} -> {got[-1]['loss']:.3f} in 60 steps")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
