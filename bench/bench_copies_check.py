"""What run.check_copies_every costs: one check of the weights' copies against a training step of the same run.

The trainer runs a GPT-2-shaped model (default GPT-2 small: 12 blocks, C = 768, 12 heads, vocabulary 50257, 124M
parameters; seq_len 64, one sequence per rank and step) on dp ranks with run.check_copies_every=1. The check reads
every rank's fp32 weights once (4 bytes per parameter, the bytes that must move; no arithmetic beyond a multiply per
8 bytes) and sums 16 bytes per parameter tensor and rank over the world. It prints the first check's time (the trainer's "copies
check ... (X ms" line), the read bandwidth that makes per rank, and the baseline measured in the same run: the
median step of steps 2 onwards, so the ratio says what a check every N steps costs.

Usage: /usr/bin/python3 bench/bench_copies_check.py [--layers 12] [--d-model 768] [--heads 12] [--ranks 2]
       [--steps 4]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile

from bench_cli import int_at_least

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int_at_least(1), default=12)
    ap.add_argument("--d-model", type=int_at_least(1), default=768)
    ap.add_argument("--heads", type=int_at_least(1), default=12)
    ap.add_argument("--ranks", type=int_at_least(2), default=2)
    ap.add_argument("--steps", type=int_at_least(3), default=4)
    ap.add_argument("--mpiexec", default="mpiexec")
    args = ap.parse_args()
    work = tempfile.mkdtemp()
    try:
        cmd = [args.mpiexec, "-n", str(args.ranks), os.path.join(ROOT, "build", "trainer"),
               "--config", os.path.join(ROOT, "configs", "gpt.yaml")]
        for s in (f"model.n_layer={args.layers}", f"model.d_model={args.d_model}", f"model.n_head={args.heads}",
                  "model.vocab_size=50257", "model.seq_len=64", f"train.global_batch={args.ranks}",
                  "train.micro_batch=1", "train.eval_every=0", f"train.steps={args.steps}", "optim.zero=0",
                  "run.check_copies_every=1", f"run.dir={work}/run"):
            cmd += ["--set", s]
        r = subprocess.run(cmd, capture_output=True, text=True)
        out = r.stdout + r.stderr
        if r.returncode != 0:
            print(out)
            raise SystemExit("the trainer failed")
        params = float(re.search(r"([\d.]+)M parameters", out).group(1)) * 1e6
        check_ms = float(re.search(r"copies check after step 1: .* \(([\d.]+) ms;", out).group(1))
        rows = [json.loads(line) for line in open(f"{work}/run/metrics.jsonl")]
        step_ms = statistics.median(x["step_ms"] for x in rows[1:])
        mb = 4 * params / 1e6  # about: the padded vocabulary adds a little
        print(f"model: {params / 1e6:.1f}M parameters, dp {args.ranks}; each rank hashes about {mb:.0f} MB")
        print(f"one check: {check_ms:.1f} ms ({mb / check_ms:.2f} GB/s read per rank, the ranks at once)")
        print(f"baseline, a training step of the same run (median of steps 2-{args.steps}): {step_ms:.1f} ms")
        print(f"check / step: {check_ms / step_ms:.3f}; every 100 steps adds {check_ms / (100 * step_ms) * 100:.2f}%")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
