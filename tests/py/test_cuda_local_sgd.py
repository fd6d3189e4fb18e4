#!/usr/bin/env python3
"""Local SGD on the GPU: 2 replicas sharing one GPU (comm.backend=mpi, device tensors staged through the host)
average their parameters every 2 steps, plainly and with the outer Nesterov step (optim.outer=nesterov, the
kernels::outer_nesterov_update kernel), and every loss of 8 steps matches the same run on the CPU:
  - fp32 within 1e-5 relative, the bound of the parity tests: the same arithmetic in another summation order;
  - bf16 (fp32 masters, the staging buffer on the GPU) within 1e-2 relative, cuda_parity's bf16 loss bound: both
    paths round to bf16 at the same points, the GPU some of them at other moments, a few bf16 ulps per element.
Then checkpoints on the GPU: DiLoCo's outer momentum and replica 1's moments downloaded at the average of step 4 and
uploaded again on resume, steps 5-8 within 1e-5 of the uninterrupted GPU run (cuda_checkpoints' bound: atomic
additions may reorder sums between runs).

Exits 77 (skipped) when the trainer has no CUDA backend or sees no GPU.
Usage: test_cuda_local_sgd.py BUILD_DIR [WORK_DIR]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_support import SMALL_GPT, GpuTest  # noqa: E402
from parity_support import max_relative_loss_difference, run_trainer  # noqa: E402

t = GpuTest("cuda_local_sgd_")
report = t.report
BASE = SMALL_GPT + ["--set", "train.eval_every=0", "--set", "train.steps=8", "--set", "parallel.dp=2", "--set",
                    "comm.backend=mpi", "--set", "optim.sync_every=2"]

for outer, precision, bound in (("none", "fp32", 1e-5), ("nesterov", "fp32", 1e-5), ("nesterov", "bf16", 1e-2)):
    cpu, gpu, log = t.on_both_devices(2, BASE + ["--set", f"optim.outer={outer}", "--set",
                                                 f"precision.compute={precision}"], f"{outer}_{precision}")
    report("local SGD" in log, f"{outer}, {precision}: the GPU run's log announces local SGD")
    d = max_relative_loss_difference(gpu, cpu)
    report(len(gpu) == 8 and d <= bound,
           f"local SGD, outer {outer}, {precision}: 8 losses on the GPU within {d:.2e} of the CPU's (bound {bound:g})")
diloco = BASE + ["--set", "optim.outer=nesterov", "--set", "precision.compute=fp32", "--set", "device=cuda"]
full, _ = run_trainer(t.mpiexec, t.trainer, 2, diloco + ["--set", "run.checkpoint_every=4"],
                      os.path.join(t.work, "ckpt"))
resumed, log = run_trainer(t.mpiexec, t.trainer, 2, diloco + ["--set", "run.resume=" + os.path.join(
    t.work, "ckpt", "checkpoints", "step_00000004")], os.path.join(t.work, "ckpt_resumed"))
d = max_relative_loss_difference(resumed, full[4:]) if len(resumed) == 4 else float("inf")
report(d <= 1e-5 and "each of the 2 replicas resumes its own optimizer moments" in log,
       f"DiLoCo on the GPU resumed from the average of step 4: steps 5-8 within {d:.2e} of the uninterrupted run")
t.finish()
