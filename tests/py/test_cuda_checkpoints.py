#!/usr/bin/env python3
"""Checkpoints on the GPU: written from device state, resumed into it, and moved between the GPU and the CPU.

1. Round trip, bitwise: a GPU run's step-4 checkpoint resumed on the GPU with nothing left to train exports
   weights byte-identical to that run's own export at step 4 (fp32, and bf16 over fp32 masters).
2. Resume on the same device and mesh: the GPU run resumed from its step-4 checkpoint continues steps 5-8 bit
   for bit where the GPU's uninterrupted runs are themselves bitwise reproducible (checked with a second
   uninterrupted run); where they are not (LayerNorm's and the embedding's backward add with atomics, so the
   order of fp32 additions varies), within 1e-5 relative, the bound of the parity tests.
3. GPU -> CPU and CPU -> GPU (fp32): each continuation within 1e-5 relative of the run that wrote the
   checkpoint (the uploaded moments enter every later step: AdamW's update from wrong ones differs at O(1)).
   That the bound can fail: the same resume with a learning rate of 1e-9 differs by more than 1e-3.
4. A mesh: dp 2 with ZeRO-1 on one GPU (comm.backend=mpi) writes its shards; 2 ranks resume them on the GPU
   and 1 rank on the CPU, each within 1e-5 relative of the 2-rank run's steps 5-8.

Exits 77 (skipped) when the trainer has no CUDA backend or sees no GPU.
Usage: test_cuda_checkpoints.py BUILD_DIR [WORK_DIR]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_support import SMALL_GPT, GpuTest  # noqa: E402
from parity_support import max_relative_loss_difference, run_trainer  # noqa: E402

BASE = SMALL_GPT + ["--set", "train.eval_every=0"]
t = GpuTest("cuda_checkpoints_", BASE)
work, report = t.work, t.report


def train(name, ranks=1, **sets):
    """Runs the trainer into WORK/name with --set key=value for each keyword (dots as '__'); returns losses."""
    args = list(BASE)
    for k, v in sets.items():
        args += ["--set", f"{k.replace('__', '.')}={v}"]
    losses, _ = run_trainer(t.mpiexec, t.trainer, ranks, args, os.path.join(work, name))
    return losses


def checkpoint(name, step=4):
    return os.path.join(work, name, "checkpoints", f"step_{step:08d}")


def export_bytes(name):
    return open(os.path.join(work, name, "model.safetensors"), "rb").read()


def exact(a, b):
    return len(a) == len(b) and all(x == y for x, y in zip(a, b))


GPU = dict(device="cuda", run__checkpoint_every=4)
CPU = dict(device="cpu", run__checkpoint_every=4)

uninterrupted = {}
for precision in ("fp32", "bf16"):
    p = dict(precision__compute=precision)
    # 1. The state's round trip through a checkpoint, with no training in between.
    train(f"gpu4_{precision}", train__steps=4, **GPU, **p)
    train(f"gpu4_{precision}_resumed", train__steps=4, run__resume=checkpoint(f"gpu4_{precision}"), **GPU, **p)
    same = export_bytes(f"gpu4_{precision}_resumed") == export_bytes(f"gpu4_{precision}")
    report(same, f"{precision}: the step-4 checkpoint resumed on the GPU exports the writer's weights byte for byte")

    # 2. Resuming on the same device and mesh.
    full = uninterrupted[precision] = train(f"gpu8_{precision}", train__steps=8, **GPU, **p)
    again = train(f"gpu8_{precision}_again", train__steps=8, **GPU, **p)
    resumed = train(f"gpu8_{precision}_resumed", train__steps=8, run__resume=checkpoint(f"gpu8_{precision}"),
                    **GPU, **p)
    if exact(again, full):
        report(exact(resumed, full[4:]), f"{precision}: resumed on the GPU, steps 5-8 equal the uninterrupted run's "
                                         f"bit for bit (the GPU's runs are bitwise reproducible here)")
    else:
        d = max_relative_loss_difference(resumed, full[4:])
        spread = max_relative_loss_difference(again, full)
        report(len(resumed) == 4 and d <= 1e-5,
               f"{precision}: resumed on the GPU, steps 5-8 within {d:.2e} of the uninterrupted run (bound 1e-5; "
               f"two uninterrupted GPU runs differ by {spread:.2e}: atomic additions)")

# 3. Between devices, fp32.
gpu = uninterrupted["fp32"]
on_cpu = train("gpu_to_cpu", train__steps=8, run__resume=checkpoint("gpu8_fp32"), **CPU)
d = max_relative_loss_difference(on_cpu, gpu[4:])
report(len(on_cpu) == 4 and d <= 1e-5, f"GPU checkpoint resumed on the CPU: steps 5-8 within {d:.2e} (bound 1e-5)")
cpu = train("cpu8", train__steps=8, **CPU)
on_gpu = train("cpu_to_gpu", train__steps=8, run__resume=checkpoint("cpu8"), **GPU)
d = max_relative_loss_difference(on_gpu, cpu[4:])
report(len(on_gpu) == 4 and d <= 1e-5, f"CPU checkpoint resumed on the GPU: steps 5-8 within {d:.2e} (bound 1e-5)")
frozen = train("cpu_to_gpu_lr0", train__steps=8, run__resume=checkpoint("cpu8"), optim__lr=1e-9, optim__min_lr=0, **GPU)
report(max_relative_loss_difference(frozen, cpu[4:]) > 1e-3,
       "the comparison can fail: with a learning rate of 1e-9 after resuming, steps 5-8 differ by more than 1e-3")

# 4. A ZeRO-1 mesh on one GPU.
MESH = dict(parallel__dp=2, optim__zero=1, comm__backend="mpi")
mesh = train("gpu_dp2", 2, train__steps=8, **GPU, **MESH)
for name, ranks, sets in (("gpu_dp2_resumed", 2, dict(**GPU, **MESH)), ("gpu_dp2_to_cpu_1rank", 1, CPU)):
    got = train(name, ranks, train__steps=8, run__resume=checkpoint("gpu_dp2"), **sets)
    d = max_relative_loss_difference(got, mesh[4:])
    report(len(got) == 4 and d <= 1e-5, f"dp 2 ZeRO-1 GPU checkpoint -> {name[8:]}: steps 5-8 within {d:.2e}")

print(f"GPU fp32 losses: step 1 {gpu[0]:.6f}, step 8 {gpu[-1]:.6f}")
t.finish()
