#!/usr/bin/env python3
"""comm.hierarchical on the GPU: dp 4 sharing one GPU over two emulated nodes of 2 ranks (comm.backend=mpi: the
three phases run on the MPI transport's sub-communicators, device tensors staged through host memory, and the
Avg's division is a kernel). Every loss of 8 steps:
  - against the flat dp 4 GPU run: within 1e-5 relative (the phases add the same values, grouped as MPICH's
    4-rank algorithm may not group them: a summation order at most), and the line says whether bitwise;
  - against the same hierarchical run on the CPU: within 1e-5 relative, the parity tests' bound for the GPU's
    own summation orders.

Exits 77 (skipped) when the trainer has no CUDA backend or sees no GPU.
Usage: test_cuda_hierarchical.py BUILD_DIR [WORK_DIR]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_support import SMALL_GPT, GpuTest  # noqa: E402
from parity_support import max_relative_loss_difference, run_trainer  # noqa: E402

t = GpuTest("cuda_hierarchical_")
report = t.report
MESH = SMALL_GPT + ["--set", "train.eval_every=0", "--set", "train.steps=8", "--set", "parallel.dp=4", "--set",
                    "comm.backend=mpi", "--set", "comm.emulate.ranks_per_node=2"]

cpu_h, gpu_h, log = t.on_both_devices(4, MESH + ["--set", "comm.hierarchical=true"], "hierarchical")
report("comm.hierarchical: each dp all-reduce over 2 nodes x 2 ranks" in log, "the log names the two-level layout")
gpu_flat, _ = run_trainer(t.mpiexec, t.trainer, 4, MESH + ["--set", "device=cuda", "--set", "comm.hierarchical=false"],
                          os.path.join(t.work, "cuda_flat"))
d = max_relative_loss_difference(gpu_h, gpu_flat)
report(len(gpu_h) == 8 and d <= 1e-5, f"hierarchical against flat on the GPU: 8 losses within {d:.2e} (bound 1e-5; "
                                      f"{'bitwise equal' if gpu_h == gpu_flat else 'not bitwise equal'})")
d = max_relative_loss_difference(gpu_h, cpu_h)
report(d <= 1e-5, f"hierarchical on the GPU against the CPU: within {d:.2e} (bound 1e-5)")
t.finish()
