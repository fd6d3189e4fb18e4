"""Checkpoint write and load time and size (issue #8), for a model as large as this machine holds.

The trainer runs one step of a GPT-2-shaped model (default GPT-2 medium: 24 blocks, C = 1024, 16 heads, vocabulary
50257, 355M parameters; seq_len 64 and one sequence per step, so activations stay small) with
run.checkpoint_every=1, then a second run resumes from that checkpoint with nothing left to train. It prints
the parameters, the checkpoint's bytes on disk (fp32 masters and two AdamW moments: 12 bytes per parameter plus
headers), the write time (the trainer's "checkpoint: ... written in" line: each rank file written with its
checksum and fsynced, meta.json) and the load time (its "resumed from ... in" line: verifying every file's size
and checksum, reading the shards and laying them out), with the bandwidth of each against the bytes. The
baselines are the disk itself: `dd` of the same number of bytes with fsync, through the page cache and with
O_DIRECT (the checkpoint writer's way, core/direct_file.h), measured in the same run, each with the CPU time it
took (the page cache's copy is CPU work).

Usage: /usr/bin/python3 bench/bench_checkpoint.py [--layers 24] [--d-model 1024] [--heads 16] [--ranks 1]
       [--dir DIR]   (DIR on the disk to measure; default a temporary directory under /tmp)
"""
import argparse
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time

from bench_cli import int_at_least

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trainer(args, run_dir, steps_sets):
    cmd = ([args.mpiexec, "-n", str(args.ranks)] if args.ranks > 1 else []) + [
        os.path.join(ROOT, "build", "trainer"), "--config", os.path.join(ROOT, "configs", "gpt.yaml"),
        "--set", f"model.n_layer={args.layers}", "--set", f"model.d_model={args.d_model}",
        "--set", f"model.n_head={args.heads}", "--set", "model.vocab_size=50257", "--set", "model.seq_len=64",
        "--set", "data.synthetic_tokens=200000", "--set", f"train.global_batch={args.ranks}",
        "--set", "train.micro_batch=1", "--set", "train.eval_every=0", "--set", "optim.warmup_steps=1",
        "--set", "run.checkpoint_every=1", "--set", f"run.dir={run_dir}"] + steps_sets
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit("the trainer failed")
    return r.stdout + r.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int_at_least(1), default=24)
    ap.add_argument("--d-model", type=int_at_least(1), default=1024)
    ap.add_argument("--heads", type=int_at_least(1), default=16)
    ap.add_argument("--ranks", type=int_at_least(1), default=1)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--mpiexec", default="mpiexec")
    args = ap.parse_args()
    work = tempfile.mkdtemp(dir=args.dir)
    try:
        run_dir = os.path.join(work, "run")
        out = trainer(args, run_dir, ["--set", "train.steps=1"])
        params = float(re.search(r"([\d.]+)M parameters", out).group(1))
        write_ms = float(re.search(r"checkpoint: step 1 written to \S+ in (\d+) ms", out).group(1))
        ckpt = os.path.join(run_dir, "checkpoints", "step_00000001")
        size = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))
        out = trainer(args, run_dir, ["--set", "train.steps=1", "--set", "run.resume=auto"])
        load_ms = float(re.search(r"resumed from \S+ .* in (\d+) ms", out).group(1))
        # Baselines: the disk writing the same bytes with fsync (dd), through the page cache and with O_DIRECT.
        probe = os.path.join(work, "dd_probe")
        dd_s = {}
        for name, flags in (("page cache", []), ("O_DIRECT", ["oflag=direct"])):
            t0, cpu0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(["dd", "if=/dev/zero", f"of={probe}", "bs=4M", f"count={max(1, size // (4 << 20))}",
                            "conv=fsync", "status=none"] + flags, check=True)
            cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            dd_s[name] = (time.time() - t0, cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime)
            os.remove(probe)
        gb = size / 1e9
        print(f"model: {params:.1f}M parameters on {args.ranks} rank(s)")
        print(f"checkpoint: {size / 2**30:.2f} GiB ({size / (params * 1e6):.2f} bytes per parameter)")
        print(f"write: {write_ms / 1000:.2f} s ({gb / (write_ms / 1000):.2f} GB/s)")
        print(f"load:  {load_ms / 1000:.2f} s ({gb / (load_ms / 1000):.2f} GB/s)")
        for name, (secs, cpu) in dd_s.items():
            print(f"disk baseline (dd with fsync, {name}, same bytes): {secs:.2f} s ({gb / secs:.2f} GB/s, "
                  f"{cpu:.2f} s of CPU); the write takes {write_ms / 1000 / secs:.2f}x it")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
