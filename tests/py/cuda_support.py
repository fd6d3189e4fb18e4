"""Shared pieces of the tests/py/test_cuda_*.py scripts: their arguments (BUILD_DIR [WORK_DIR]), cuda_parity's
small GPT, the skip (exit 77) where the trainer has no CUDA backend or sees no GPU, the same run on both devices,
and the ok/FAIL report. Standard library and parity_support only."""
import os
import shutil
import subprocess
import sys
import tempfile

from parity_support import run_trainer

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A small GPT whose head size (64 / 2 = 32) the flash-attention kernel takes; 4 micro-batches per step.
SMALL_GPT = ["--config", os.path.join(SRC, "configs", "tiny.yaml"), "--set", "model.d_model=64", "--set",
             "model.seq_len=64", "--set", "train.global_batch=8", "--set", "train.micro_batch=2", "--set",
             "run.log_every=100", "--set", "comm.timeout_s=120"]


class GpuTest:
    """sys.argv's build and work directories (a fresh temporary one by default), the trainer and mpiexec, and
    the count of failed checks. Exits 77 at once when the trainer cannot run `base` on a GPU."""

    def __init__(self, prefix, base=SMALL_GPT, clean=True):
        self.build = os.path.abspath(sys.argv[1])
        self.work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix=prefix)
        if clean:
            shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work, exist_ok=True)
        self.trainer = os.path.join(self.build, "trainer")
        self.mpiexec = shutil.which("mpiexec") or "mpiexec"
        self.failures = 0
        probe = subprocess.run([self.trainer] + list(base) + ["--set", "device=cuda", "--set", "train.steps=1",
                                                             "--set", "run.dir=" + os.path.join(self.work, "probe")],
                               capture_output=True, text=True, timeout=300)
        out = probe.stderr + probe.stdout
        if probe.returncode != 0 and ("no usable GPU" in out or "no CUDA backend" in out):
            print("skipped: " + out.strip().splitlines()[-1])
            sys.exit(77)

    def on_both_devices(self, ranks, args, name):
        """The trainer with `args` on the CPU and on the GPU (run dirs cpu_NAME, cuda_NAME): (CPU losses, GPU
        losses, the GPU run's log)."""
        runs = {device: run_trainer(self.mpiexec, self.trainer, ranks, list(args) + ["--set", f"device={device}"],
                                    os.path.join(self.work, f"{device}_{name}")) for device in ("cpu", "cuda")}
        return runs["cpu"][0], runs["cuda"][0], runs["cuda"][1]

    def report(self, ok, what):
        self.failures += not ok
        print(("ok   " if ok else "FAIL ") + what)

    def finish(self):
        sys.exit(1 if self.failures else 0)
