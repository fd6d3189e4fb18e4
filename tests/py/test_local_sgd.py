"""Local SGD (optim.sync_every) end to end on 2 data-parallel ranks:

  1. sync_every=1 with SGD (no clipping) equals synchronous data parallelism (also with 2 pipeline stages): SGD's
     update is linear in the gradient, so averaging the replicas' parameters after a step equals stepping with the
     averaged gradient. The two differ only in fp32 rounding (a sum of two updates against an update of a sum):
     losses within 1e-6 relative at every step, exported weights within 1e-5. fp32 and bf16 compute (the fp32
     masters are averaged); in bf16 the compute copies may round differently where the masters differ in their
     last bits: 2e-3.
  2. sync_every=4: parameters cross the network only at steps 4, 8, ... and the last one (4 bytes per parameter
     per sync), nothing at the steps between, and the run still learns. The replicas meet only there: with one
     rank delayed before every step, the other never waits between averages (no exposed communication).
  3. the outer Nesterov optimizer with outer_lr=1, outer_momentum=0 is a plain average (anchor - 1 (anchor -
     average)): within 1e-6 of outer=none; with DiLoCo's settings (inner AdamW) it trains and differs.
  4. a non-finite gradient norm on one replica stops every rank together (exit 1) at the next average, before it
     is averaged in, naming the step where it happened; with train.skip_nonfinite that replica skips the step
     alone, and the rows count it though rank 0 (which writes them) skipped nothing.
  5. checkpoints under DiLoCo: written at the averages only (one due between them waits for the next), so they
     change no loss; a run resumed from one continues bit for bit (each replica's own AdamW moments and the outer
     momentum are in it); so does an fp16 run whose one replica overflowed and skipped a step alone (each
     replica's AdamW step count and loss scaler are in it too).

usage: test_local_sgd.py TRAINER SOURCE_DIR WORK_DIR MPIEXEC"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from parity_support import max_weight_difference, read_safetensors  # noqa: E402

trainer, src, work, mpiexec = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
base = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "model.n_head=4", "--set", "train.global_batch=8",
        "--set", "train.micro_batch=2", "--set", "train.steps=16", "--set", "run.log_every=100", "--set",
        "optim.name=sgd", "--set", "optim.lr=0.3", "--set", "train.grad_clip=0", "--set", "run.resume=none",
        "--set", "data.source=text", "--set", f"data.path={os.path.join(src, 'data', 'tinyshakespeare.txt')}",
        "--set", "model.vocab_size=256"]
ok = True


def check(cond, what):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {what}")


def run(name, *sets, ranks=2, env=None, expect=0):
    d = os.path.join(work, name)
    cmd = [mpiexec, "-n", str(ranks), trainer] + base + [a for s in sets for a in ("--set", s)] + ["--set", f"run.dir={d}"]
    e = dict(os.environ, OMP_NUM_THREADS="1")
    e.pop("MESHTRAIN_INJECT", None)
    e.update(env or {})
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=e)
    if r.returncode != expect:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAIL: {name} exited with {r.returncode}, expected {expect}")
    return r.stdout + r.stderr


def rows(name):
    return [json.loads(line) for line in open(os.path.join(work, name, "metrics.jsonl"))]


def loss_diff(a, b):
    return max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(rows(a), rows(b)))


def weight_diff(a, b):
    return max_weight_difference(read_safetensors(os.path.join(work, a, "model.safetensors")),
                                 read_safetensors(os.path.join(work, b, "model.safetensors")))


for compute, tol in (("fp32", 1e-6), ("bf16", 2e-3)):
    run(f"sync_{compute}", f"precision.compute={compute}")
    run(f"h1_{compute}", f"precision.compute={compute}", "optim.sync_every=1")
    d = loss_diff(f"h1_{compute}", f"sync_{compute}")
    w = weight_diff(f"h1_{compute}", f"sync_{compute}")
    check(d <= tol and len(rows(f"h1_{compute}")) == 16,
          f"{compute}: sync_every=1 reproduces synchronous training: losses within {d:.2e} (allowed {tol:g})")
    # fp32: the masters differ by rounding alone (~1e-7 of weights below 1, over 16 steps). bf16: where the masters
    # differ in their last bits the compute copies may round one bf16 ulp (2^-8) apart, the gradients then differ
    # by about that relative amount, and each step moves weights by lr |g|: 16 steps x 0.3 x 2^-8 x |g| stays
    # below 1e-2 for gradient entries up to 0.5.
    check(w <= (1e-5 if compute == "fp32" else 1e-2), f"{compute}: exported weights within {w:.2e}")

# With a pipeline each replica's stages share its loss among themselves (not with the other replica): 2 replicas
# of 2 stages, 8 steps, as in 1.
pipe = ["parallel.dp=2", "parallel.pp=2", "train.steps=8"]
run("sync_pp2", *pipe, ranks=4)
run("h1_pp2", *pipe, "optim.sync_every=1", ranks=4)
d = loss_diff("h1_pp2", "sync_pp2")
check(d <= 1e-6 and len(rows("h1_pp2")) == 8, f"dp 2 x pp 2: sync_every=1 reproduces synchronous training: losses "
      f"within {d:.2e}")

out = run("h4", "optim.sync_every=4")
weights = read_safetensors(os.path.join(work, "h4", "model.safetensors"))
numel = sum(len(v) for _, v in weights.values())
h4, sync = rows("h4"), rows("sync_fp32")
# A sync sends every parameter (the tied embedding once: the model has one stage) and the replicas' non-finite
# verdict (4 bytes); the steps between send only run.stop_signals' vote, 4 bytes each (their metrics are summed in the
# background, not counted). A vote is counted in the step during which it completes, so on a busy machine a step
# counts two votes and another none, and a sync step's vote can land between: the steps between carry at most the
# run's 16 votes.
sync_steps = [r["step"] for r in h4 if r["comm_bytes"] >= 4 * numel]
between = [r["comm_bytes"] for r in h4 if r["step"] not in sync_steps]
check(sync_steps == [4, 8, 12, 16] and sum(between) <= 4 * len(h4),
      f"sync_every=4 sends parameters at steps {sync_steps} only ({4 * numel} bytes of parameters each), and the "
      f"stop votes' 4 bytes per step between ({sum(between)} bytes over {len(between)} steps)")
check(h4[-1]["loss"] < h4[0]["loss"] - 1, f"sync_every=4 learns: loss {h4[0]['loss']:.3f} -> {h4[-1]['loss']:.3f} "
      f"(synchronous: {sync[-1]['loss']:.3f})")
check("average their parameters every 4 steps" in out, "the log says what local SGD does")

# Rank 1 sleeps 20 ms before every step: rank 0 runs ahead and waits for it only at the averages. A step's
# exposed communication is the largest over the ranks, so between averages it is rank 0's too: none.
run("h4_straggler", "optim.sync_every=4", "train.straggler.delay_ms=20", "train.straggler.delay_sigma=0",
    "train.straggler.ranks=[1]")
st = rows("h4_straggler")
between = [r["exposed_comm_ms"] for r in st if r["step"] % 4]
at_sync = [r["exposed_comm_ms"] for r in st if r["step"] % 4 == 0]
check(max(between) == 0 and min(at_sync) > 0 and st[-1]["loss"] == h4[-1]["loss"],
      f"the replicas meet only at the averages: exposed communication between them {max(between):.2f} ms, at them "
      f"{min(at_sync):.1f}-{max(at_sync):.1f} ms; the same losses as without the delay")

run("none_h2", "optim.sync_every=2")
run("unit_nesterov_h2", "optim.sync_every=2", "optim.outer=nesterov", "optim.outer_lr=1", "optim.outer_momentum=0")
d = loss_diff("unit_nesterov_h2", "none_h2")
check(d <= 1e-6, f"outer Nesterov with lr 1 and momentum 0 is a plain average (losses within {d:.2e})")
# DiLoCo: inner AdamW, outer Nesterov (lr 0.7, momentum 0.9: the defaults).
adamw = ["optim.name=adamw", "optim.lr=0.01", "optim.sync_every=2"]
run("adamw_h2", *adamw)
run("diloco_h2", *adamw, "optim.outer=nesterov")
dl, pl = rows("diloco_h2"), rows("adamw_h2")
check(dl[-1]["loss"] < dl[0]["loss"] - 1 and loss_diff("diloco_h2", "adamw_h2") > 1e-3,
      f"DiLoCo (inner AdamW, outer Nesterov lr 0.7 momentum 0.9) trains and differs from the plain average: "
      f"{dl[0]['loss']:.3f} -> {dl[-1]['loss']:.3f} (plain average: {pl[-1]['loss']:.3f})")

# 5. A checkpoint every 3 steps with averages every 2: due at 3, 6, 9, 12, 15 and the last step, written at the
# averages of steps 4, 6, 10, 12 and 16.
out = run("diloco_ckpt", *adamw, "optim.outer=nesterov", "run.checkpoint_every=3", "run.keep_checkpoints=10")
ckpts = os.path.join(work, "diloco_ckpt", "checkpoints")
written = sorted(int(n[5:]) for n in os.listdir(ckpts) if n.startswith("step_"))
check(written == [4, 6, 10, 12, 16] and "due at step 9, written at the parameter average of step 10" in out,
      f"checkpoints at the averages only: steps {written}")
same = [a["loss"] == b["loss"] for a, b in zip(rows("diloco_ckpt"), dl)]
check(len(same) == 16 and all(same), "the checkpoints change no loss")
out = run("diloco_resumed", *adamw, "optim.outer=nesterov", f"run.resume={os.path.join(ckpts, 'step_00000010')}")
resumed = rows("diloco_resumed")
check([r["step"] for r in resumed] == list(range(11, 17)) and all(r["loss"] == d["loss"] for r, d in
                                                                    zip(resumed, dl[10:])),
      "resumed from the average of step 10: steps 11-16 give the uninterrupted run's losses exactly")
check(weight_diff("diloco_resumed", "diloco_h2") == 0, "and its exported weights, exactly")
check("each of the 2 replicas resumes its own optimizer moments" in out, "the log says what the resume restored")
# fp16: an inf on one replica at step 3 makes it skip that step alone (its loss scaler backs off, its AdamW count
# stays behind); the resumed run must take that replica's counters, not replica 0's.
fp16 = ["precision.compute=fp16", "optim.sync_every=4", "optim.name=adamw", "optim.lr=0.01", "train.steps=12"]
run("fp16_skip", *fp16, "run.checkpoint_every=4", env={"MESHTRAIN_INJECT": "grad-inf@3"})
run("fp16_skip_resumed", *fp16, f"run.resume={os.path.join(work, 'fp16_skip', 'checkpoints', 'step_00000004')}")
a, b = rows("fp16_skip"), rows("fp16_skip_resumed")
check(a[3]["skipped_steps"] == 1 and [(r["loss"], r["skipped_steps"]) for r in a[4:]] ==
      [(r["loss"], r["skipped_steps"]) for r in b] and weight_diff("fp16_skip", "fp16_skip_resumed") == 0,
      "fp16, one replica skipped step 3 alone: resumed from step 4, steps 5-12 and the export are the same exactly")

out = run("inf_one_replica", "optim.sync_every=4", env={"MESHTRAIN_INJECT": "grad-inf@3"}, expect=1)
check("non-finite at step 3" in out and "parameter average of step 4" in out and len(rows("inf_one_replica")) == 4,
      "an inf on one replica at step 3 stops both ranks together at the average of step 4")
run("inf_skipped", "optim.sync_every=4", "train.skip_nonfinite=true", env={"MESHTRAIN_INJECT": "grad-inf@3"})
skipped = [r["skipped_steps"] for r in rows("inf_skipped")]
check(skipped == [0, 0] + [1] * 14, f"with train.skip_nonfinite the replica skips step 3 alone and the rows count it "
      f"({skipped})")

print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
