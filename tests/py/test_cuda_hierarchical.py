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
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity_support import max_relative_loss_difference, run_trainer  # noqa: E402

build = os.path.abspath(sys.argv[1])
work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="cuda_hierarchical_")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
trainer = os.path.join(build, "trainer")
mpiexec = shutil.which("mpiexec") or "mpiexec"
COMMON = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "model.d_model=64", "--set",
          "model.seq_len=64", "--set", "train.global_batch=8", "--set", "train.micro_batch=2", "--set",
          "run.log_every=100", "--set", "comm.timeout_s=120", "--set", "train.eval_every=0"]
MESH = ["--set", "train.steps=8", "--set", "parallel.dp=4", "--set", "comm.backend=mpi", "--set",
        "comm.emulate.ranks_per_node=2"]

probe = subprocess.run([trainer] + COMMON + ["--set", "device=cuda", "--set", "train.steps=1", "--set",
                                             "run.dir=" + os.path.join(work, "probe")],
                       capture_output=True, text=True, timeout=300)
if probe.returncode != 0 and ("no usable GPU" in probe.stderr + probe.stdout or
                              "no CUDA backend" in probe.stderr + probe.stdout):
    print("skipped: " + (probe.stderr + probe.stdout).strip().splitlines()[-1])
    sys.exit(77)

failures = 0


def report(ok, what):
    global failures
    failures += not ok
    print(("ok   " if ok else "FAIL ") + what)


def run(name, device, hierarchical):
    losses, log = run_trainer(mpiexec, trainer, 4, COMMON + MESH + [
        "--set", f"device={device}", "--set", f"comm.hierarchical={'true' if hierarchical else 'false'}"],
        os.path.join(work, name))
    return losses, log


gpu_h, log = run("gpu_hierarchical", "cuda", True)
report("comm.hierarchical: each dp all-reduce over 2 nodes x 2 ranks" in log, "the log names the two-level layout")
gpu_flat, _ = run("gpu_flat", "cuda", False)
cpu_h, _ = run("cpu_hierarchical", "cpu", True)
d = max_relative_loss_difference(gpu_h, gpu_flat)
report(len(gpu_h) == 8 and d <= 1e-5, f"hierarchical against flat on the GPU: 8 losses within {d:.2e} (bound 1e-5; "
                                      f"{'bitwise equal' if gpu_h == gpu_flat else 'not bitwise equal'})")
d = max_relative_loss_difference(gpu_h, cpu_h)
report(d <= 1e-5, f"hierarchical on the GPU against the CPU: within {d:.2e} (bound 1e-5)")
sys.exit(1 if failures else 0)
