"""Checkpoints end to end: exact resume after a crash, resharding onto other meshes, export, corrupt checkpoints,
killed and stopped ranks, non-finite losses.

  1. same mesh (dp2 x pp2, ZeRO-1): a rank killed while writing the step-8 checkpoint, then run.resume=auto
     picks step 4 and the continued run is bit-identical to an uninterrupted one (every metrics row, the export),
     each step once in metrics.jsonl; likewise fp16 (the loss scaler's state, an overflow before the checkpoint)
     and a rank SIGKILLed in the middle of a step;
  2. resharding: a 2x2x2 ZeRO-1 checkpoint resumed on 1x4x2, 4x1x1 and 4x1x1 with ZeRO-1: losses within 1e-5 of
     the uninterrupted single-rank run; resumed with another train.steps, global batch and weight decay,
     warnings name the changed schedule, the data samples skipped and the changed update;
  3. --export of a checkpoint: byte-identical to the run's own final export, on one rank and on 2x2x2;
  4. corrupt checkpoints (truncated, bit flip, another model, incomplete, bad meta.json, missing file): exit 2
     naming the file;
  5. a stopped rank ends the job through the watchdog within comm.timeout_s; a NaN loss stops the run naming the
     kept checkpoint, or with train.skip_nonfinite is skipped and counted; keep_checkpoints prunes;
  6. run.check_copies_every: dp2 x tp2's copies agree at every check, and checking leaves dp2 x pp2's rows and
     export as they were; one weight nudged by one ulp on one rank
     (MESHTRAIN_INJECT=drift) stops the run with exit 1 at the next check, naming the parameter and the ranks,
     for a dp replica, a tp copy, the tied embedding over pp and ZeRO-1/2's gathered weights (fp32 and bf16);
     ZeRO-1's gathered bf16 weights agree at every check with the gathers issued late.

usage: test_checkpoints.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import re
import shutil
import subprocess
import sys
import time


mpiexec, trainer, src, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
base = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "model.n_head=4", "--set",
        "train.global_batch=8", "--set", "train.micro_batch=2", "--set", "train.steps=12", "--set", "run.log_every=100"]
ok = True


def check(cond, what):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {what}")


def run(name, ranks, *sets, env=None, expect=0, timeout=300):
    """Runs the trainer into WORK/name; returns (exit status, output, seconds)."""
    cmd = ([mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [trainer] + base + ["--set", f"run.dir={work}/{name}"]
    for s in sets:
        cmd += ["--set", s]
    e = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("MESHTRAIN_INJECT", "MESHTRAIN_FAULT", "MESHTRAIN_CRASH_IN_CHECKPOINT"):
        e.pop(k, None)
    e.update(env or {})
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
    out = r.stdout + r.stderr
    if expect is not None and (r.returncode == 0) != (expect == 0):
        print(out)
        raise SystemExit(f"FAIL: {name} exited with {r.returncode}, expected {expect}")
    return r.returncode, out, time.time() - t0


def rows(name):
    return [json.loads(line) for line in open(f"{work}/{name}/metrics.jsonl")]


def same_rows(a, b):
    keys = ("step", "loss", "grad_norm", "lr", "tokens", "loss_scale", "skipped_steps")
    return len(a) == len(b) and all(x.get(k) == y.get(k) for x, y in zip(a, b) for k in keys)


def export(ckpt, out, *sets):
    cmd = [trainer] + base + list(sets) + ["--export", ckpt, out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


# 1. Same mesh, exact.
mesh = ["parallel.pp=2", "optim.zero=1", "run.checkpoint_every=4"]
run("uninterrupted", 4, *mesh)
run("crashed", 4, *mesh, env={"MESHTRAIN_CRASH_IN_CHECKPOINT": "8"}, expect=None)
left = sorted(os.listdir(f"{work}/crashed/checkpoints"))
check(left == ["step_00000004", "step_00000008"] and not os.path.exists(f"{work}/crashed/checkpoints/step_00000008/COMPLETE"),
      f"a rank killed while writing step 8 leaves step 4 complete and step 8 incomplete: {left}")
_, out, _ = run("crashed", 4, *mesh)
check("resumed from" in out and "step_00000004" in out and "differs from the one the checkpoint" not in out,
      "run.resume=auto picks the newest complete checkpoint (step 4), with no word of schedule or data (the same)")
check(same_rows(rows("crashed"), rows("uninterrupted")),
      "resumed run's metrics equal the uninterrupted run's bit for bit, each of the 12 steps once")
same = open(f"{work}/crashed/model.safetensors", "rb").read() == open(f"{work}/uninterrupted/model.safetensors", "rb").read()
check(same, "resumed run's export is byte-identical")

fp16 = ["precision.compute=fp16", "run.checkpoint_every=4"]
run("fp16_uninterrupted", 1, *fp16, env={"MESHTRAIN_INJECT": "grad-inf@3"})
run("fp16_crashed", 1, *fp16, env={"MESHTRAIN_INJECT": "grad-inf@3", "MESHTRAIN_CRASH_IN_CHECKPOINT": "8"}, expect=None)
run("fp16_crashed", 1, *fp16)
r16 = rows("fp16_crashed")
check(same_rows(r16, rows("fp16_uninterrupted")) and r16[-1]["loss_scale"] == 32768 and r16[-1]["skipped_steps"] == 1,
      "fp16: resumed with the loss scaler's state (scale 32768, 1 skipped step) bit for bit")

code, out, secs = run("killed", 4, *mesh, env={"MESHTRAIN_FAULT": "kill@6"}, expect=None)
check(code != 0 and secs < 60, f"a rank SIGKILLed mid-step ends the job (status {code}, {secs:.1f} s)")
run("killed", 4, *mesh)
check(same_rows(rows("killed"), rows("uninterrupted")), "after the kill, resume=auto continues bit-identically")

# 2. Resharding a 2x2x2 ZeRO-1 checkpoint.
run("ref_1rank", 1, "run.checkpoint_every=6")
run("mesh_222", 8, "parallel.tp=2", "parallel.pp=2", "optim.zero=1", "run.checkpoint_every=6")
ckpt = f"{work}/mesh_222/checkpoints/step_00000006"
ref = [r["loss"] for r in rows("ref_1rank")]
for name, ranks, sets in [("to_1x4x2", 8, ["parallel.tp=4", "parallel.pp=2"]), ("to_4x1x1", 4, []),
                          ("to_4x1x1_zero", 4, ["optim.zero=1"])]:
    _, out, _ = run(name, ranks, *sets, f"run.resume={ckpt}")
    got = [r["loss"] for r in rows(name)]
    worst = max(abs(a - b) / b for a, b in zip(got, ref[6:]))
    check(len(got) == 6 and worst <= 1e-5 and "2 x 2 x 2" in out,
          f"2x2x2 ZeRO-1 -> {name[3:]}: steps 7-12 within {worst:.1e} of the uninterrupted run")

# A longer run with a larger batch and less weight decay from a checkpoint reshapes the learning-rate decay, skips
# part of the data stream and changes the update: each said, with the rates on either schedule and the samples
# never trained on.
_, out, _ = run("extended", 1, "train.steps=16", "train.global_batch=16", "optim.weight_decay=0.05",
                f"run.resume={work}/ref_1rank/checkpoints/step_00000006")
lr_then, lr_now = rows("ref_1rank")[6]["lr"], rows("extended")[0]["lr"]
check(f"(train.steps 12 -> 16): step 7 takes lr {lr_now:.3e} where that one gives {lr_then:.3e}" in out,
      "resuming with train.steps 12 -> 16 warns with step 7's rate under each schedule (the uninterrupted run's)")
check("(train.global_batch 8 -> 16); step 7 starts at sample 96 where that run would have gone on from 48: samples "
      "48-95 are never trained on" in out, "and with train.global_batch 8 -> 16, names the samples skipped")
check("(optim.weight_decay 0.1 -> 0.05): steps from 7 on update the weights otherwise" in out,
      "and with optim.weight_decay 0.1 -> 0.05, says the update changed")

# 3. Export.
code, _ = export(f"{work}/ref_1rank/checkpoints/step_00000012", f"{work}/export_ref")
same = code == 0 and open(f"{work}/export_ref/model.safetensors", "rb").read() == \
    open(f"{work}/ref_1rank/model.safetensors", "rb").read()
check(same and json.load(open(f"{work}/export_ref/config.json"))["n_head"] == 4,
      "--export of the last checkpoint equals the run's own export byte for byte, with config.json")
code, _ = export(f"{work}/mesh_222/checkpoints/step_00000012", f"{work}/export_222")
same = code == 0 and open(f"{work}/export_222/model.safetensors", "rb").read() == \
    open(f"{work}/mesh_222/model.safetensors", "rb").read()
check(same, "--export of the 2x2x2 ZeRO-1 run's last checkpoint equals that run's own gathered export byte for byte")

# 4. Corrupt checkpoints: exit 2, the file named.
def corrupt(name, edit, expect_words, *sets):
    d = f"{work}/corrupt_{name}"
    shutil.copytree(ckpt, d)
    edit(d)
    code, out, _ = run(f"resume_{name}", 8, "parallel.tp=2", "parallel.pp=2", f"run.resume={d}", *sets, expect=2)
    check(code == 2 and all(w in out for w in expect_words), f"{name}: exit 2 naming {expect_words}")


def truncate(d):
    p = f"{d}/rank_00003.safetensors"
    os.truncate(p, os.path.getsize(p) // 2)


def flip(d):
    p = f"{d}/rank_00000.safetensors"
    data = bytearray(open(p, "rb").read())
    data[len(data) - 100] ^= 0x10
    open(p, "wb").write(bytes(data))


corrupt("truncated", truncate, ["rank_00003.safetensors", "truncated"])
corrupt("bitflip", flip, ["rank_00000.safetensors", "checksum"])
corrupt("incomplete", lambda d: os.remove(f"{d}/COMPLETE"), ["corrupt_incomplete", "incomplete"])
corrupt("bad_meta", lambda d: open(f"{d}/meta.json", "w").write("{\"format\": "), ["meta.json", "not valid JSON"])
corrupt("missing_file", lambda d: os.remove(f"{d}/rank_00005.safetensors"), ["rank_00005.safetensors", "missing"])
corrupt("other_model", lambda d: None, ["another model", "n_layer"], "model.n_layer=4")

# 5. A stopped rank, non-finite losses, pruning.
code, out, secs = run("stopped", 4, "comm.timeout_s=5", env={"MESHTRAIN_FAULT": "stop@5"}, expect=None)
check(code != 0 and secs < 5 + 25 and "watchdog" in out, f"a SIGSTOPped rank ends the job via the watchdog in {secs:.1f} s")
code, out, _ = run("nan_stop", 2, "run.checkpoint_every=5", env={"MESHTRAIN_INJECT": "loss-nan@7"}, expect=None)
check(code not in (0, 2) and "non-finite" in out and "step_00000005" in out,
      f"a NaN loss stops the run (status {code}), naming the kept checkpoint")
_, out, _ = run("nan_stop", 2, "run.checkpoint_every=5")
r = rows("nan_stop")
check("step_00000005" in out and [x["step"] for x in r] == list(range(1, 13)) and r[6]["loss"] is not None,
      "and resume=auto continues from it (the NaN row replaced)")
run("nan_skip", 2, "train.skip_nonfinite=true", env={"MESHTRAIN_INJECT": "loss-nan@7"})
r = rows("nan_skip")
check(r[6]["loss"] is None and r[6]["skipped_steps"] == 1 and r[-1]["skipped_steps"] == 1 and r[-1]["loss"] < r[0]["loss"],
      "train.skip_nonfinite skips the NaN step, counts it and trains on")
run("pruned", 1, "run.checkpoint_every=2", "run.keep_checkpoints=2")
check(sorted(os.listdir(f"{work}/pruned/checkpoints")) == ["step_00000010", "step_00000012"],
      "run.keep_checkpoints=2 keeps the newest two")

# 6. The weights' copies compared between steps.
_, out, _ = run("copies", 4, "parallel.tp=2", "train.steps=6", "run.check_copies_every=3")
check("copies check after step 3: the 2 replicas' weights and 15 parameters on every tp rank that holds them agree"
      in out and "copies check after step 6:" in out, "dp2 x tp2: the replicas' and the tp ranks' copies agree")
_, out, _ = run("copies_same", 4, *mesh, "run.check_copies_every=3")
same = open(f"{work}/copies_same/model.safetensors", "rb").read() == \
    open(f"{work}/uninterrupted/model.safetensors", "rb").read()
check("copies check after step 3: the 2 replicas' gathered weights and the tied wte" in out
      and same_rows(rows("copies_same"), rows("uninterrupted"))
      and same, "dp2 x pp2 ZeRO-1: checking every 3 steps leaves the rows and the export bit for bit as they were")
# ZeRO-1's gathered bf16 weights, compared at every step: the check waits for the gathers (issued here only when a
# pass asks for them, so that a check without its wait would read half of last step's weights).
_, out, _ = run("copies_zero", 2, "parallel.dp=2", "optim.zero=1", "precision.compute=bf16", "train.steps=4",
                "run.check_copies_every=1", env={"MESHTRAIN_INJECT": "late-gather@1"})
check("copies check after step 1: the 2 replicas' gathered weights agree" in out and "differs" not in out,
      "dp2 ZeRO-1 bf16: the replicas' gathered weights agree at every check, with the gathers issued late")
# Replicas that agree only at their averages (local SGD) or sync points (staleness): a check due between waits.
stale = ["optim.staleness=1", "optim.staleness_policy=fixed", "train.eval_every=3"]
for name, sets, at in (("copies_local", ["optim.sync_every=3"], 3), ("copies_stale", stale, 3)):
    _, out, _ = run(name, 2, "train.steps=6", "run.check_copies_every=2", *sets)
    check(re.search(r"copies check after step (\d+)", out).group(1) == str(at) and "differs" not in out,
          f"{' '.join(sets)}: the check due at step 2 waits for step {at}, where the replicas agree")
# ZeRO-1/2's next gather would overwrite a drift in the gathered weights: there it comes in the checked step.
replicas = "differs between replica 0 (rank 0) and replica 1 (rank 1)"
for name, sets, at, words in (
        ("drift_dp", ["parallel.dp=2"], 3, replicas),
        ("drift_tp", ["parallel.tp=2"], 3, "ln_f.weight differs between tp rank 0 (rank 0) and tp rank 1 (rank 1)"),
        ("drift_pp", ["parallel.pp=2"], 3, "the tied wte.weight differs between stage 0 (rank 0) and stage 1 (rank 1)"),
        ("drift_zero2", ["parallel.dp=2", "optim.zero=2"], 4, "the gathered ln_f.weight " + replicas),
        ("drift_zero1_bf16", ["parallel.dp=2", "optim.zero=1", "precision.compute=bf16"], 4,
         "the gathered ln_f.weight " + replicas)):
    code, out, _ = run(name, 2, *sets, "train.steps=6", "run.check_copies_every=4",
                       env={"MESHTRAIN_INJECT": f"drift@{at}"}, expect=None)
    status = json.load(open(f"{work}/{name}/status.json"))
    check(code == 1 and "copies check after step 4" in out and words in out and status["state"] == "failed"
          and [x["step"] for x in rows(name)] == [1, 2, 3, 4], f"{' '.join(sets)}: a weight one ulp off on one rank "
          f"after step {at} stops the run at the check after step 4 (exit {code}), naming it")

sys.exit(0 if ok else 1)
