"""What run.check_copies_every costs: one check of the weights' copies against a training step of the same run.

The trainer runs a GPT-2-shaped model (default GPT-2 small: 12 blocks, C = 768, 12 heads, vocabulary 50257, 124M
parameters; seq_len 64, one sequence per rank and step) on --ranks ranks (dp unless --set says otherwise) with
run.check_copies_every=1. The check reads every rank's weights once (the bytes that must move, on dp alone: 4 per
parameter in fp32; 2 under ZeRO-1/2 with 16-bit compute, which compares the gathered 16-bit weights; no arithmetic
beyond a multiply per 8 bytes) and sums 16 bytes per parameter tensor and rank over the world. Under ZeRO-1/2 it
first waits for the step's parameter gathers, which the next step's forward pass would otherwise overlap. It prints
the first check's time (the trainer's "copies check ... (X ms" line), the later checks' (the median, over the checks
after steps 2 onwards, of the wall time between the end of one step and the start of the next in metrics.jsonl:
elapsed_ms less step_ms), on dp alone the read bandwidth that makes per rank, and the baseline measured in the same
run: the median step of steps 2 onwards, so the ratio says what a check every N steps costs. A check that gathers the
fp32 weights (ZeRO-3, or ZeRO-1/2 with 16-bit compute beside tp or pp copies) allocates the export's buffer each time,
which a VM backs page by page on first touch: the first costs most.

--set KEY=VALUE (repeatable) passes a setting on, e.g. `--set optim.zero=1 --set precision.compute=bf16`.

Usage: /usr/bin/python3 bench/bench_copies_check.py [--layers 12] [--d-model 768] [--heads 12] [--ranks 2]
       [--steps 6] [--set KEY=VALUE ...]
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
    ap.add_argument("--steps", type=int_at_least(4), default=6)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a trainer setting (repeatable)")
    args = ap.parse_args()
    work = tempfile.mkdtemp()
    try:
        cmd = [args.mpiexec, "-n", str(args.ranks), os.path.join(ROOT, "build", "trainer"),
               "--config", os.path.join(ROOT, "configs", "gpt.yaml")]
        for s in (f"model.n_layer={args.layers}", f"model.d_model={args.d_model}", f"model.n_head={args.heads}",
                  "model.vocab_size=50257", "model.seq_len=64", f"train.global_batch={args.ranks}",
                  "train.micro_batch=1", "train.eval_every=0", f"train.steps={args.steps}", "optim.zero=0",
                  "run.check_copies_every=1", f"run.dir={work}/run", *args.set):
            cmd += ["--set", s]
        r = subprocess.run(cmd, capture_output=True, text=True)
        out = r.stdout + r.stderr
        if r.returncode != 0:
            print(out)
            raise SystemExit("the trainer failed")
        params = float(re.search(r"([\d.]+)M parameters", out).group(1)) * 1e6
        first_ms = float(re.search(r"copies check after step 1: .* \(([\d.]+) ms;", out).group(1))
        rows = [json.loads(line) for line in open(f"{work}/run/metrics.jsonl")]
        step_ms = statistics.median(x["step_ms"] for x in rows[1:])
        # The checks after steps 2 .. steps-1 (the last step's is the end's, after its row's figures).
        check_ms = statistics.median(b["elapsed_ms"] - a["elapsed_ms"] - b["step_ms"]
                                     for a, b in zip(rows[1:-1], rows[2:]))
        sets = " ".join(args.set)
        print(f"model: {params / 1e6:.1f}M parameters, {args.ranks} ranks{''.join(' ' + x for x in args.set)}")
        print(f"first check: {first_ms:.1f} ms")
        print(f"later checks: {check_ms:.1f} ms (median of the checks after steps 2-{args.steps - 1})")
        if not re.search(r"parallel\.(tp|pp|cp)=|optim\.zero=3", sets):
            # dp alone: every rank hashes the whole model, fp32 (ZeRO-1/2 with 16-bit compute: its gathered 16-bit
            # copy). Elsewhere a rank's share, and the fp32 gathers, depend on the layout.
            sixteen = re.search(r"optim\.zero=[12]\b", sets) and re.search(r"precision\.compute=(bf16|fp16)", sets)
            mb = (2 if sixteen else 4) * params / 1e6  # about: the padded vocabulary adds a little
            print(f"each rank hashes about {mb:.0f} MB of {'16-bit' if sixteen else 'fp32'} weights: "
                  f"{mb / check_ms:.2f} GB/s read per rank at the later checks, the ranks at once")
        print(f"baseline, a training step of the same run (median of steps 2-{args.steps}): {step_ms:.1f} ms")
        print(f"check / step: {check_ms / step_ms:.3f}; every 100 steps adds {check_ms / (100 * step_ms) * 100:.2f}%")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
