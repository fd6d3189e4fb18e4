"""Context parallelism (parallel.cp) in the trainer reproduces the single-rank run, on 2, 4 and 8 ranks.

  1. Exactness: every step's loss and the validation losses of steps 10 and 20 within 1e-5 relative of one rank's
     over 20 steps, each accumulating 2 micro-batches, and the same token counts in metrics.jsonl: GPT-2 on cp 2 (its
     step-1 gradients too, within 1e-5), cp 4 (two tokens per chunk, the order naming cp), dp2 x cp2 x tp2 with
     ZeRO-3 and sequence parallelism, and cp2 x pp2 x tp2 (1f1b, the tied embedding summed between the stages) with
     full recomputation; Llama with grouped-query attention on cp 2, cp 4, dp2 x cp2 x tp2 with ZeRO-2 and
     cp2 x pp2 x tp2, against Llama on one rank. The layouts differ from one rank only in
     summation order (the ring's log-sum-exp merges, the gradient average over dp x cp), about 1e-7 per step. A
     chunk at the wrong positions, a gradient share not summed over cp, or tokens counted twice in the loss shows
     as 1e-2 or more at the first step.
     In bf16, cp 2 against one rank in bf16: step 1 within 1e-4, every step within 1e-2 (below, with why).
  2. Checkpoints: step 10's of the cp 2 run resumed on one rank, and the single-rank run's on cp 4, continue the
     single-rank run within 1e-5.
Usage: test_cp_parity.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import shutil
import sys

from parity_support import compare_grads, max_relative_loss_difference, run_mesh

mpiexec, trainer, src, work = sys.argv[1:5]
RTOL = 1e-5
BASE = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "model.n_head=4", "--set", "train.steps=20",
        "--set", "run.log_every=100", "--set", "comm.timeout_s=120", "--set", "comm.bucket_mb=0.004",
        "--set", "train.eval_every=10", "--set", "train.eval_batches=2"]
LLAMA = ["model.arch=llama", "model.n_kv_head=2", "model.ffn_hidden=64"]
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def tokens(name):
    return [json.loads(line).get("tokens") for line in open(os.path.join(work, name, "metrics.jsonl"))]


def run(name, dp, tp, pp, cp, sets=(), grads=False):
    shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    losses, log, _, g = run_mesh(mpiexec, trainer, BASE, os.path.join(work, name), dp, tp, pp, sets, grads, cp)
    return losses, log, g


ref, _, ref_grads = run("single", 1, 1, 1, 1, ["run.checkpoint_every=10"], grads=True)
llama_ref, _, _ = run("single_llama", 1, 1, 1, 1, LLAMA)

# 1. Exactness.
CASES = [  # name, dp, tp, pp, cp, settings, reference
    ("cp2", 1, 1, 1, 2, ["run.checkpoint_every=10"], ref),
    ("cp4_order", 1, 1, 1, 4, ["parallel.order=cp-tp-dp-pp"], ref),
    ("dp2_cp2_tp2_zero3_sp", 2, 2, 1, 2, ["optim.zero=3", "parallel.sequence_parallel=true"], ref),
    ("cp2_pp2_tp2_recompute", 1, 2, 2, 2, ["train.recompute=full"], ref),
    ("llama_cp2", 1, 1, 1, 2, LLAMA, llama_ref),
    ("llama_cp4", 1, 1, 1, 4, LLAMA, llama_ref),
    ("llama_dp2_cp2_tp2_zero2", 2, 2, 1, 2, LLAMA + ["optim.zero=2"], llama_ref),
    ("llama_cp2_pp2_tp2", 1, 2, 2, 2, LLAMA, llama_ref),
]
for name, dp, tp, pp, cp, sets, reference in CASES:
    losses, log, grads = run(name, dp, tp, pp, cp, sets, grads=name == "cp2")
    diff = max_relative_loss_difference(losses, reference)
    same_tokens = tokens(name) == tokens("single")
    check(diff <= RTOL and same_tokens and f"cp={cp}" in log,
          f"{name}: {len(losses)} losses (training and validation), max relative difference {diff:.2e} "
          f"(bound {RTOL:g}); token counts {'as' if same_tokens else 'DIFFER from'} one rank's")
    if grads is not None:
        failures += not compare_grads(name, grads, ref_grads, RTOL)

# bf16 compute: cp 2 against one rank in bf16. At step 1 (the same weights) only the forward pass's rounding differs:
# 8.6e-6 measured, bound 1e-4. Later the runs drift apart as any two bf16 runs with another summation order do: bf16
# keeps 8 significant bits (4e-3 per rounding), and one rank in bf16 itself departs from fp32 by up to 2.7e-3 on this
# run; 5.6e-3 measured over 20 steps, bound 1e-2. A dtype mistake in the ring's buffers (k|v travel in bf16, dk|dv
# accumulate in fp32) gives 1e-1 or more from step 1.
BF16 = ["precision.compute=bf16"]
bf16_ref = run("single_bf16", 1, 1, 1, 1, BF16)[0]
bf16_cp = run("cp2_bf16", 1, 1, 1, 2, BF16)[0]
first, diff = max_relative_loss_difference(bf16_cp[:1], bf16_ref[:1]), max_relative_loss_difference(bf16_cp, bf16_ref)
check(first <= 1e-4 and diff <= 1e-2, f"cp2 in bf16 against one rank in bf16: step 1 within {first:.1e} (bound 1e-4), "
      f"every step within {diff:.1e} (bound 1e-2)")

# 2. Step 10's checkpoint of the cp 2 run resumed on one rank, and the single-rank run's on cp 4: steps 11-20 (and
# the validation loss of step 20) continue the single-rank run.
ref_later = ref[10:20] + ref[-1:]
for name, cp, source in [("resume_cp2_on_one", 1, "cp2"), ("resume_one_on_cp4", 4, "single")]:
    ckpt = os.path.join(work, source, "checkpoints", "step_00000010")
    resumed, log, _ = run(name, 1, 1, 1, cp, [f"run.resume={ckpt}"])
    diff = max_relative_loss_difference(resumed, ref_later)
    check(diff <= RTOL and "resumed from" in log,
          f"{name}: steps 11-20 and the validation loss, max relative difference {diff:.2e} (bound {RTOL:g})")

print(f"{'FAIL' if failures else 'PASS'}: {failures} failure(s)")
sys.exit(1 if failures else 0)
