#!/usr/bin/env python3
"""Local SGD on the GPU: 2 replicas sharing one GPU (comm.backend=mpi, device tensors staged through the host)
average their parameters every 2 steps, plainly and with the outer Nesterov step (optim.outer=nesterov, the
kernels::outer_nesterov_update kernel), and every loss of 8 steps matches the same run on the CPU:
  - fp32 within 1e-5 relative, the bound of the parity tests: the same arithmetic in another summation order;
  - bf16 (fp32 masters, the staging buffer on the GPU) within 1e-2 relative, cuda_parity's bf16 loss bound: both
    paths round to bf16 at the same points, the GPU some of them at other moments, a few bf16 ulps per element.

Exits 77 (skipped) when the trainer has no CUDA backend or sees no GPU.
Usage: test_cuda_local_sgd.py BUILD_DIR [WORK_DIR]"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity_support import max_relative_loss_difference, run_trainer  # noqa: E402

build = os.path.abspath(sys.argv[1])
work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="cuda_local_sgd_")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
trainer = os.path.join(build, "trainer")
mpiexec = shutil.which("mpiexec") or "mpiexec"
BASE = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "model.d_model=64", "--set",
        "model.seq_len=64", "--set", "train.global_batch=8", "--set", "train.micro_batch=2", "--set",
        "run.log_every=100", "--set", "comm.timeout_s=120", "--set", "train.eval_every=0", "--set", "train.steps=8",
        "--set", "parallel.dp=2", "--set", "comm.backend=mpi", "--set", "optim.sync_every=2"]

probe = subprocess.run([trainer] + BASE[:-6] + ["--set", "device=cuda", "--set", "train.steps=1", "--set",
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


for outer, precision, bound in (("none", "fp32", 1e-5), ("nesterov", "fp32", 1e-5), ("nesterov", "bf16", 1e-2)):
    losses = {}
    for device in ("cpu", "cuda"):
        name = f"{device}_{outer}_{precision}"
        losses[device], log = run_trainer(mpiexec, trainer, 2, BASE + [
            "--set", f"device={device}", "--set", f"optim.outer={outer}", "--set", f"precision.compute={precision}"],
            os.path.join(work, name))
        if device == "cuda":
            report("local SGD" in log, f"{name}: the log announces local SGD")
    d = max_relative_loss_difference(losses["cuda"], losses["cpu"])
    report(len(losses["cuda"]) == 8 and d <= bound,
           f"local SGD, outer {outer}, {precision}: 8 losses on the GPU within {d:.2e} of the CPU's (bound {bound:g})")
sys.exit(1 if failures else 0)
