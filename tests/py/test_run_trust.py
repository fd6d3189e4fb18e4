"""Checkpoints and runs you can trust (docs/reliability.md, "Runs you can trust"): every case shares two tiny
runs (a GPT-2 and a Llama, 4 and 2 steps) and copies of their run directories.

  meta_bitflip_*       a one-bit flip of meta.json's "step" or "optimizer_steps": exit 2 naming meta.json
  resume_mismatch_*    model.tie_embeddings, model.rope_theta, optim.name differing from the checkpoint's: exit 2
                       naming the key, both values and run.resume=none
  incomplete_newest    an incomplete newest checkpoint is skipped with a log line naming its step
  corrupt_fallback     run.resume=auto falls back past a corrupt newest checkpoint, naming it and why
  prune_complete_first an old checkpoint whose files cannot all be deleted loses its COMPLETE marker first
  status_json          run.dir/status.json says completed / failed; a re-run says the run was already complete
  sbatch_status        scripts/slurm/train.sbatch's exit status follows status.json
  run_dir_lock         a second run on a locked run.dir: exit 2 naming the holder
  activation_memory    model.seq_len=100000: exit 2 naming the bytes needed and available and the keys, no abort
  full_disk            the shared run resumed on a full disk (a tmpfs in a private mount namespace; skipped where
                       none can be made): exit 1 (not 2: no bad input) naming the file and "No space left on device",
                       and no .tmp left behind

usage: test_run_trust.py TRAINER SOURCE_DIR WORK_DIR"""
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time

trainer, src, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
t_start = time.time()
tiny = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "train.steps=4", "--set",
        "run.checkpoint_every=2", "--set", "run.log_every=100"]
llama = ["--config", os.path.join(src, "configs", "llama-tiny.yaml"), "--set", "model.n_layer=2", "--set",
         "model.d_model=64", "--set", "model.seq_len=16", "--set", "train.global_batch=4", "--set",
         "train.micro_batch=2", "--set", "train.steps=2", "--set", "train.eval_every=0", "--set",
         "run.checkpoint_every=2", "--set", "run.log_every=100"]
ok = True


def check(cond, what, out=""):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {what}")
    if not cond and out:
        print(out[-3000:])


def run(base, name, *sets):
    cmd = [trainer] + base + ["--set", f"run.dir={work}/{name}"]
    for s in sets:
        cmd += ["--set", s]
    e = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=e)
    return r.returncode, r.stdout + r.stderr


def copy(a, b):
    shutil.copytree(f"{work}/{a}", f"{work}/{b}")
    return f"{work}/{b}/checkpoints"


def flip_bit(path, key):
    text = open(path, "rb").read()
    i = text.index(f'"{key}": '.encode()) + len(key) + 4  # the value's first digit
    open(path, "wb").write(text[:i] + bytes([text[i] ^ 1]) + text[i + 1:])


status, out = run(tiny, "gpt")
check(status == 0, "the shared GPT-2 run (4 steps, checkpoints at 2 and 4)", out)
status, out = run(llama, "llama")
check(status == 0, "the shared Llama run (2 steps, untied head)", out)

# meta_bitflip_*: explicit path refuses; auto falls back (corrupt_fallback below).
for key in ("step", "optimizer_steps"):
    ck = copy("gpt", f"flip_{key}")
    flip_bit(f"{ck}/step_00000004/meta.json", key)
    status, out = run(tiny, f"flip_{key}", f"run.resume={ck}/step_00000004")
    check(status == 2 and "step_00000004/meta.json fails its own checksum" in out,
          f"meta_bitflip_{key}: exit {status}, names meta.json and the checksum", out)
    if key == "step":
        st = json.load(open(f"{work}/flip_step/status.json"))
        check(st["state"] == "failed" and st["exit_code"] == 2 and "meta.json" in st["error"],
              f"status_json: a refused resume is recorded as failed with exit code 2: {st}")

# corrupt_fallback: run.resume=auto skips the damaged step 4 and continues from step 2.
status, out = run(tiny, "flip_step", "run.resume=auto")
check(status == 0 and "step_00000004 is damaged and is skipped" in out and "fails its own checksum" in out
      and "resumed from" in out and "step_00000002 (step 2" in out,
      f"corrupt_fallback: exit {status}, warns naming step 4 and why, resumes from step 2", out)

# incomplete_newest: step 4 without COMPLETE is skipped with a line saying so.
ck = copy("gpt", "incomplete")
os.remove(f"{ck}/step_00000004/COMPLETE")
status, out = run(tiny, "incomplete")
check(status == 0 and "skipping" in out and "step_00000004 (step 4) has no COMPLETE marker" in out
      and "step_00000002 (step 2" in out, f"incomplete_newest: exit {status}, logged, resumed from step 2", out)

# resume_mismatch_*: each an exit-2 refusal naming the key, both values and run.resume=none.
for key, there, here in (("model.tie_embeddings", "false", "true"), ("model.rope_theta", "10000", "5000"),
                         ("optim.name", "adamw", "sgd")):
    status, out = run(llama, "llama", f"{key}={here}", "train.steps=4")
    check(status == 2 and f"{key}={there}" in out and f"{key}={here}" in out and "run.resume=none" in out,
          f"resume_mismatch_{key}: exit {status}, names the key, both values and run.resume=none", out)

# status_json and the re-run of a finished run.
st = json.load(open(f"{work}/gpt/status.json"))
check(st["state"] == "completed" and st["step"] == 4 and st["exit_code"] == 0, f"status_json: completed: {st}")
status, out = run(tiny, "gpt")
check(status == 0 and "already complete at step 4" in out and "final loss" not in out,
      f"status_json: a re-run of a finished run says it was already complete at step 4", out)

# prune_complete_first: keep_checkpoints=1 with step 2's rank file immutable (chattr +i: unlink fails even for
# root). The prune cannot finish, but step 2 loses COMPLETE first and the new checkpoint stands.
ck = copy("gpt", "prune")
victim = f"{ck}/step_00000002/rank_00000.safetensors"
if subprocess.run(["chattr", "+i", victim], capture_output=True).returncode != 0:
    print("skip prune_complete_first: chattr +i is not permitted here")
else:
    try:
        status, out = run(tiny, "prune", "train.steps=6", "run.keep_checkpoints=1")
        check(status == 0 and not os.path.exists(f"{ck}/step_00000002/COMPLETE")
              and os.path.exists(f"{ck}/step_00000006/COMPLETE"),
              f"prune_complete_first: exit {status}, step 2 lost COMPLETE first, step 6 is complete", out)
    finally:
        subprocess.run(["chattr", "-i", victim])

# run_dir_lock: another process holds run.dir/.lock.
os.makedirs(f"{work}/locked", exist_ok=True)
with open(f"{work}/locked/.lock", "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write("pid 4242 on host elsewhere\n")
    f.flush()
    status, out = run(tiny, "locked")
check(status == 2 and "is in use by another run (pid 4242 on host elsewhere" in out,
      f"run_dir_lock: exit {status}, names the holder", out)

# activation_memory: refused before any activation is allocated (was: SIGABRT in the arena).
status, out = run(tiny, "seqlen", "model.seq_len=100000", "data.synthetic_tokens=300000")
check(status == 2 and "activations need at least" in out and "available (MemAvailable)" in out
      and "model.seq_len=100000" in out and "train.micro_batch=2" in out,
      f"activation_memory: exit {status}, names the needed and available bytes and the keys", out)

# sbatch_status: the script's exit status follows status.json (LAUNCHER=env runs the trainer directly).
env = dict(os.environ, SLURM_JOB_ID="sb", RUN_ROOT=work, TRAINER=trainer, LAUNCHER="env", OMP_NUM_THREADS="1",
           CONFIG=os.path.join(src, "configs", "tiny.yaml"))
shutil.copytree(f"{work}/gpt", f"{work}/sb")
r = subprocess.run(["bash", os.path.join(src, "scripts", "slurm", "train.sbatch"), "--set", "train.steps=4"],
                   capture_output=True, text=True, env=env, timeout=120)
check(r.returncode == 0 and "completed at step 4" in r.stdout + r.stderr,
      f"sbatch_status: a complete run: exit {r.returncode}", r.stdout + r.stderr)
flip_bit(f"{work}/sb/checkpoints/step_00000004/meta.json", "step")
flip_bit(f"{work}/sb/checkpoints/step_00000002/meta.json", "step")
r = subprocess.run(["bash", os.path.join(src, "scripts", "slurm", "train.sbatch"), "--set", "train.steps=4"],
                   capture_output=True, text=True, env=env, timeout=120)
check(r.returncode == 2 and "failed (exit code 2)" in r.stdout + r.stderr,
      f"sbatch_status: no usable checkpoint: exit {r.returncode}", r.stdout + r.stderr)

# full_disk: the durable write (status.json here; meta.json and metrics.jsonl's rewrite take the same path) on a
# tmpfs filled to the last block.
disk = f"{work}/small_disk"
os.makedirs(disk)
ns = ["unshare", "--mount"] + (["--map-root-user"] if os.geteuid() != 0 else [])
resume = " ".join([trainer] + tiny + ["--set", f"run.dir={disk}/gpt", "--set", "train.steps=6"])
script = (f"mount -t tmpfs -o size=4m tmpfs {disk} || exit 99; cp -r {work}/gpt {disk}/gpt; "
          f"dd if=/dev/zero of={disk}/fill bs=4k 2>/dev/null; OMP_NUM_THREADS=1 {resume}; echo \"EXIT $?\"; "
          f"echo LEFT; find {disk}/gpt -name '*.tmp'")
r = subprocess.run(ns + ["sh", "-c", script], capture_output=True, text=True, timeout=120)
out = r.stdout + r.stderr
if r.returncode == 99 or "EXIT " not in out:
    print("skip: full_disk (no tmpfs in a private mount namespace here)")
else:
    status = int(out.split("EXIT ")[1].split()[0])
    left = r.stdout.split("LEFT")[1].split()
    check(status == 1 and "status.json failed (write): No space left on device" in out and not left,
          f"full_disk: exit {status}, the file and the cause named, .tmp files left: {left}", out)

print(f"test_run_trust: {time.time() - t_start:.1f} s")
sys.exit(0 if ok else 1)
