"""Context parallelism (parallel.cp) in the trainer reproduces the single-rank run, on 2 and 4 ranks.

  1. Exactness: every step's loss and the validation loss of step 10 within 1e-5 relative of one rank's over 10
     steps, each accumulating 2 micro-batches: GPT-2 on cp 2 (its step-1 gradients too, within 1e-5) and cp 4 (two
     tokens per chunk, the order naming cp); dp2 x cp2 with ZeRO-2 and with ZeRO-3; tp2 x cp2 with sequence
     parallelism; pp2 x cp2 (1f1b, the tied embedding summed between the stages) with full recomputation; Llama with
     grouped-query attention on tp2 x cp2 against Llama on one rank. The layouts differ from one rank only in
     summation order (the ring's log-sum-exp merges, the gradient average over dp x cp), about 1e-7 per step. A
     chunk at the wrong positions, a gradient share not summed over cp, or tokens counted twice in the loss shows
     as 1e-2 or more at the first step.
  2. Checkpoints: written on cp 2, resumed on one rank, the run continues the single-rank run within 1e-5.
Usage: test_cp_parity.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import os
import shutil
import sys

from parity_support import compare_grads, max_relative_loss_difference, run_mesh

mpiexec, trainer, src, work = sys.argv[1:5]
RTOL = 1e-5
BASE = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "model.n_head=4", "--set", "train.steps=10",
        "--set", "run.log_every=100", "--set", "comm.timeout_s=120", "--set", "comm.bucket_mb=0.004",
        "--set", "train.eval_every=10", "--set", "train.eval_batches=2"]
LLAMA = ["model.arch=llama", "model.n_kv_head=2", "model.ffn_hidden=64"]
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def run(name, dp, tp, pp, cp, sets=(), grads=False):
    shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    losses, log, _, g = run_mesh(mpiexec, trainer, BASE, os.path.join(work, name), dp, tp, pp, sets, grads, cp)
    return losses, log, g


ref, _, ref_grads = run("single", 1, 1, 1, 1, ["run.checkpoint_every=5"], grads=True)
llama_ref, _, _ = run("single_llama", 1, 1, 1, 1, LLAMA)

# 1. Exactness.
CASES = [  # name, dp, tp, pp, cp, settings, reference
    ("cp2", 1, 1, 1, 2, ["run.checkpoint_every=5"], ref),
    ("cp4_order", 1, 1, 1, 4, ["parallel.order=cp-tp-dp-pp"], ref),
    ("dp2_cp2_zero2", 2, 1, 1, 2, ["optim.zero=2"], ref),
    ("dp2_cp2_zero3", 2, 1, 1, 2, ["optim.zero=3"], ref),
    ("tp2_cp2_sp", 1, 2, 1, 2, ["parallel.sequence_parallel=true"], ref),
    ("pp2_cp2_recompute", 1, 1, 2, 2, ["train.recompute=full"], ref),
    ("llama_tp2_cp2", 1, 2, 1, 2, LLAMA, llama_ref),
]
for name, dp, tp, pp, cp, sets, reference in CASES:
    losses, log, grads = run(name, dp, tp, pp, cp, sets, grads=name == "cp2")
    diff = max_relative_loss_difference(losses, reference)
    check(diff <= RTOL and f"cp={cp}" in log,
          f"{name}: {len(losses)} losses (training and validation), max relative difference {diff:.2e} "
          f"(bound {RTOL:g})")
    if grads is not None:
        failures += not compare_grads(name, grads, ref_grads, RTOL)

# 2. Step 5's checkpoint of the cp 2 run resumed on one rank, and the single-rank run's on cp 4: steps 6-10 (and the
# validation loss) continue the single-rank run.
for name, cp, source in [("resume_cp2_on_one", 1, "cp2"), ("resume_one_on_cp4", 4, "single")]:
    ckpt = os.path.join(work, source, "checkpoints", "step_00000005")
    resumed, log, _ = run(name, 1, 1, 1, cp, [f"run.resume={ckpt}"])
    diff = max_relative_loss_difference(resumed, ref[5:])
    check(diff <= RTOL and "resumed from" in log,
          f"{name}: steps 6-10 and the validation loss, max relative difference {diff:.2e} (bound {RTOL:g})")

print(f"{'FAIL' if failures else 'PASS'}: {failures} failure(s)")
sys.exit(1 if failures else 0)
