#!/usr/bin/env python3
"""Gradient compression with error feedback on the GPU (comm.compress int8, topk, powersgd): dp 2 sharing one GPU
(comm.backend=mpi); the compressors run on a host copy of the GPU's gradients (GradReducer), so their arithmetic is
the CPU's, and the only difference from the CPU run is the gradients' own summation order (up to ~1e-6 relative;
cuda_parity's fp32 bound is 1e-5). Every loss of 8 steps against the same run on the CPU, within:
  - int8: 1e-3. Rounding to 255 levels turns a tiny change of a gradient into a whole quantum where a value sits
    near a rounding boundary; on the CPU, initial weights changed by 1e-6 relative (model.init_std 0.02 ->
    0.02000002) moved the uncompressed run's losses by at most 2e-7 and int8's by 1.7e-5: about 100x, so the
    parity bound of 1e-5 becomes 1e-3;
  - topk and powersgd: 1e-4. The same perturbation moved them by at most 7e-8 and 2.4e-7 (no amplification); 10x
    the parity bound leaves room for a selection that flips near the k-th magnitude.
And the run trains: the last loss below the first.
Then checkpoints on the GPU: powersgd's residuals (host memory) and Qs written at step 4 and read back on resume,
steps 5-8 within 1e-4 of the uninterrupted GPU run (the bound above: atomic additions may reorder sums between
runs). On the CPU, in compress_runs' powersgd case, resuming without the Qs moved step 8's loss by 2e-3.

Exits 77 (skipped) when the trainer has no CUDA backend or sees no GPU.
Usage: test_cuda_compress.py BUILD_DIR [WORK_DIR]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_support import SMALL_GPT, GpuTest  # noqa: E402
from parity_support import max_relative_loss_difference, run_trainer  # noqa: E402

t = GpuTest("cuda_compress_")
report = t.report
DP2 = SMALL_GPT + ["--set", "train.eval_every=0", "--set", "train.steps=8", "--set", "parallel.dp=2", "--set",
                   "comm.backend=mpi"]

for method, bound in (("int8", 1e-3), ("topk", 1e-4), ("powersgd", 1e-4)):
    cpu, gpu, log = t.on_both_devices(2, DP2 + ["--set", f"comm.compress={method}"], method)
    report(f"compression {method}" in log, f"{method}: the GPU run's log names the compression")
    d = max_relative_loss_difference(gpu, cpu)
    report(len(gpu) == 8 and d <= bound, f"{method}: 8 losses on the GPU within {d:.2e} of the CPU's (bound {bound:g})")
    report(gpu[-1] < gpu[0], f"{method}: the GPU run trains ({gpu[0]:.4f} -> {gpu[-1]:.4f})")
psgd = DP2 + ["--set", "comm.compress=powersgd", "--set", "device=cuda"]
full, _ = run_trainer(t.mpiexec, t.trainer, 2, psgd + ["--set", "run.checkpoint_every=4"], os.path.join(t.work, "ckpt"))
resumed, log = run_trainer(t.mpiexec, t.trainer, 2, psgd + ["--set", "run.resume=" + os.path.join(
    t.work, "ckpt", "checkpoints", "step_00000004")], os.path.join(t.work, "ckpt_resumed"))
d = max_relative_loss_difference(resumed, full[4:]) if len(resumed) == 4 else float("inf")
report(d <= 1e-4 and "resumes its error-feedback residual, and PowerSGD its Qs" in log,
       f"powersgd on the GPU resumed from step 4: steps 5-8 within {d:.2e} of the uninterrupted run")
t.finish()
