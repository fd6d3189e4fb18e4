#!/usr/bin/env python3
"""The GPU path reproduces the CPU path, and several ranks sharing one GPU reproduce the single-rank GPU run.

1. One rank, fp32, GPT-2 and Llama: the first step's loss on device=cuda within 1e-5 relative of device=cpu, and every tensor of
   the step-1 gradients (run.dump_grads) within 1e-4 relative (||g - g_cpu|| / ||g_cpu||). Why: the same
   function in fp32 with a different summation order (cuBLASLt tiles, the flash kernel's online softmax,
   atomic gradient sums) moves results by ~1e-6 relative; a wrong index or a missing term moves a tensor by
   O(1e-1).
2. One rank, bf16: loss within 1e-2 relative, gradients within 5e-2 relative. Why: both paths round to bf16
   (8 bits of mantissa, 4e-3 relative per rounding) at the same points, but the GPU rounds some values at other
   moments (the GELU epilogue rounds gelu(pre) from the fp32 accumulator, the flash kernel rounds P tile by
   tile), so single elements differ by a few bf16 ulps; a real error is O(1).
3. comm.backend=mpi with 2 ranks on one GPU (device tensors staged through host memory): dp2 (with ZeRO-1, with
   ZeRO-2: its unit buffers and shards on the device, and with ZeRO-3: its parameter shards and gathered units
   there too), tp2 and pp2 (1F1B): every step's loss over 10 steps within 1e-5 relative of the single-rank GPU run, the bound of
   the CPU parity tests and for the same reason (only the summation order differs).

Exits 77 (skipped) when the trainer has no CUDA backend or sees no GPU.
Usage: test_cuda_parity.py BUILD_DIR [WORK_DIR]"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_support import SMALL_GPT as BASE, GpuTest  # noqa: E402
from parity_support import compare_grads, max_relative_loss_difference, read_safetensors, run_trainer  # noqa: E402

t = GpuTest("cuda_parity_")
work, trainer, mpiexec, report = t.work, t.trainer, t.mpiexec, t.report


def one_step(name, device, precision, model):
    run_dir = os.path.join(work, name)
    grads = os.path.join(work, name + "_grads.safetensors")
    losses, _ = run_trainer(mpiexec, trainer, 1, BASE + model + [
        "--set", f"device={device}", "--set", f"precision.compute={precision}", "--set", "train.steps=1",
        "--set", f"run.dump_grads={grads}"], run_dir)
    return losses, read_safetensors(grads)


# GPT-2, and Llama (its RMSNorm, rotary, SwiGLU and grouped-query kernels; head size 16) with recomputation.
LLAMA = ["--set", "model.arch=llama", "--set", "model.n_head=4", "--set", "model.n_kv_head=2", "--set",
         "model.multiple_of=32", "--set", "train.recompute=selective"]
# GPT-2 with light recomputation too: its forward's GELU unfused, then again in the backward.
for arch, model in (("gpt2", []), ("gpt2_light", ["--set", "train.recompute=light"]), ("llama", LLAMA)):
    for precision, loss_rtol, grad_rtol in (("fp32", 1e-5, 1e-4), ("bf16", 1e-2, 5e-2)):
        cpu_loss, cpu_grads = one_step(f"cpu_{arch}_{precision}", "cpu", precision, model)
        gpu_loss, gpu_grads = one_step(f"gpu_{arch}_{precision}", "cuda", precision, model)
        d = max_relative_loss_difference(gpu_loss, cpu_loss)
        report(d <= loss_rtol, f"{arch} {precision}: step-1 loss {gpu_loss[0]:.6f} on the GPU, {cpu_loss[0]:.6f} on "
                               f"the CPU (relative difference {d:.2e}, bound {loss_rtol:g})")
        report(compare_grads(f"{arch} {precision} gradients, GPU against CPU", gpu_grads, cpu_grads, grad_rtol),
               f"{arch} {precision}: step-1 gradients within {grad_rtol:g}")

STEPS = ["--set", "train.steps=10", "--set", "device=cuda", "--set", "comm.backend=mpi"]
reference, log = run_trainer(mpiexec, trainer, 1, BASE + STEPS, os.path.join(work, "gpu_1rank"))
# Item 2 of the GPU work: after the first step no cudaMalloc, and the host waits for the GPU twice a step (the loss
# and the gradient norm); the trainer's end-of-run lines count both.
mallocs = re.search(r"cudaMalloc calls, (\d+) of them after the first step", log)
waits = re.search(r"host waits for the GPU: (\d+) in the (\d+) steps after the first", log)
report(mallocs is not None and mallocs.group(1) == "0",
       f"no cudaMalloc after the first step ({mallocs.group(0) if mallocs else 'no such line in the log'})")
report(waits is not None and int(waits.group(1)) == 2 * int(waits.group(2)),
       f"the host waits for the GPU twice a step ({waits.group(0) if waits else 'no such line in the log'})")
for name, extra in (("dp2_zero1", ["--set", "parallel.dp=2", "--set", "optim.zero=1"]),
                    ("dp2_zero2", ["--set", "parallel.dp=2", "--set", "optim.zero=2"]),
                    ("dp2_zero3", ["--set", "parallel.dp=2", "--set", "optim.zero=3"]),
                    ("tp2", ["--set", "parallel.tp=2", "--set", "parallel.dp=1"]),
                    ("pp2", ["--set", "parallel.pp=2", "--set", "parallel.dp=1", "--set", "parallel.schedule=1f1b"])):
    losses, _ = run_trainer(mpiexec, trainer, 2, BASE + STEPS + extra, os.path.join(work, "gpu_" + name))
    d = max_relative_loss_difference(losses, reference)
    report(d <= 1e-5, f"{name} on one GPU (comm.backend=mpi): {len(losses)} steps, max relative loss difference "
                      f"{d:.2e} against one rank")
print(f"single-rank GPU loss: first {reference[0]:.6f}, last {reference[-1]:.6f}")
report(reference[-1] < reference[0] - 0.3, "the single-rank GPU run trains")
t.finish()
