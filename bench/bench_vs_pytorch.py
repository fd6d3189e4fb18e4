"""Training-step throughput of meshtrain against PyTorch (CPU) on the same GPT-2, the same thread count and the
same machine, measured in one run.

For each config it runs build/trainer on the synthetic corpus in fp32 and in bf16 (precision.compute; the matmul
libraries are train.cpu_matmul=auto's, printed), and the same model in PyTorch (nn.Linear-free fused
formulation: F.layer_norm, F.gelu(tanh), one matmul per projection, torch.optim.AdamW, clip_grad_norm_) in fp32:
Debian's 1.13 (the parity reference) eagerly, and a current PyTorch from the Python package registry
(scripts/torch_venv.sh) eagerly and under torch.compile. It prints tokens/s (median over the timed steps), each
PyTorch's time over meshtrain's fp32 time, peak resident memory, and the share of this machine's best sgemm rate
(2048^3, the best of Eigen, oneDNN and OpenBLAS, from build/bench/bench_matmul --peak-only) that a meshtrain
training step achieves. The peak is measured again right before and right after each meshtrain run and the share
is taken against the mean of the two: a shared VM's speed drifts by up to 1.5x over minutes (seen on a 2-core
Intel Xeon VM: 190-275 GFLOP/s in eight invocations a few seconds apart), so one peak at the start would compare
runs made at different speeds.

Model FLOPs per token, 6N + 12LTC: N = 12 L C^2 + C Vp, the weights of the matmuls (the tied LM head included),
each costing 2 flops per token forward and 4 backward; 12 L T C for attention's QK^T and PV (2 T C each per token
per layer forward, times 3 for training, the causal half counted as computed, as PaLM's MFU counts it).

--runs N runs each meshtrain arm N times, each between its own peak measurements, prints every run and then the
median share with its range, and sets PyTorch against the median fp32 step: one run of a shared VM can land in a
slow minute.

Usage: /usr/bin/python3 bench/bench_vs_pytorch.py [--threads 2] [--steps 30] [--configs A,B]
       [--precisions fp32,bf16] [--cpu-matmul auto,eigen] [--runs 1] [--no-current-torch]
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from bench_cli import cpu_model, int_at_least, names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "A": dict(n_layer=4, n_head=4, d_model=256, seq_len=64, vocab_size=512, batch=4),
    "B": dict(n_layer=4, n_head=8, d_model=384, seq_len=128, vocab_size=2048, batch=8),
}


def flops_per_token(c):
    """6N + 12LTC (see the module docstring)."""
    vp = (c["vocab_size"] + 63) // 64 * 64
    L, C, T = c["n_layer"], c["d_model"], c["seq_len"]
    return 6 * (12 * L * C * C + C * vp) + 12 * L * T * C


def run_meshtrain(c, threads, steps, work, precision, cpu_matmul):
    run_dir = os.path.join(work, "run")
    sets = {"model.n_layer": c["n_layer"], "model.n_head": c["n_head"], "model.d_model": c["d_model"],
            "model.seq_len": c["seq_len"], "model.vocab_size": c["vocab_size"], "train.global_batch": c["batch"],
            "train.micro_batch": c["batch"], "train.steps": steps, "train.threads": threads,
            "data.source": "synthetic", "data.synthetic_tokens": 200000, "run.dir": run_dir, "run.log_every": 1000,
            "precision.compute": precision, "train.cpu_matmul": cpu_matmul}
    cmd = [os.path.join(ROOT, "build", "trainer"), "--config", os.path.join(ROOT, "configs", "gpt.yaml")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    ms = [row["step_ms"] for row in rows[5:]]
    rss = float(re.search(r"peak RSS ([0-9.]+) MiB", r.stdout + r.stderr).group(1))
    libs = re.search(r"train.cpu_matmul=\S+: (.*)", r.stdout + r.stderr)
    return statistics.median(ms), rss, libs.group(1).strip() if libs else "?"


TORCH_CHILD = r'''
import math, resource, statistics, sys, time, json
import torch, torch.nn.functional as F
c = json.loads(sys.argv[1]); threads = int(sys.argv[2]); steps = int(sys.argv[3]); compiled = sys.argv[4] == "1"
torch.set_num_threads(threads); torch.manual_seed(0)
L, NH, C, T, V, B = c["n_layer"], c["n_head"], c["d_model"], c["seq_len"], c["vocab_size"], c["batch"]
P = lambda *s: torch.nn.Parameter(torch.randn(*s) * 0.02)
Z = lambda *s: torch.nn.Parameter(torch.zeros(*s))
O = lambda *s: torch.nn.Parameter(torch.ones(*s))
wte, wpe = P(V, C), P(T, C)
layers = [dict(l1w=O(C), l1b=Z(C), aw=P(C, 3*C), ab=Z(3*C), pw=P(C, C), pb=Z(C), l2w=O(C), l2b=Z(C),
               fw=P(C, 4*C), fb=Z(4*C), f2w=P(4*C, C), f2b=Z(C)) for _ in range(L)]
lfw, lfb = O(C), Z(C)
params = [wte, wpe, lfw, lfb] + [p for l in layers for p in l.values()]
decay = [p for p in params if p.dim() == 2]; nodecay = [p for p in params if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
def forward(idx, tgt):
    x = wte[idx] + wpe[:T]
    for l in layers:
        a = F.layer_norm(x, (C,), l["l1w"], l["l1b"], 1e-5)
        q, k, v = (a @ l["aw"] + l["ab"]).split(C, dim=2)
        q, k, v = [t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v)]
        att = ((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // NH))).masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, C) @ l["pw"] + l["pb"]
        m = F.gelu(F.layer_norm(x, (C,), l["l2w"], l["l2b"], 1e-5) @ l["fw"] + l["fb"], approximate="tanh")
        x = x + m @ l["f2w"] + l["f2b"]
    x = F.layer_norm(x, (C,), lfw, lfb, 1e-5)
    return F.cross_entropy((x @ wte.t()).view(-1, V), tgt.view(-1))
if compiled:
    forward = torch.compile(forward)
times = []
for s in range(steps):
    idx = torch.randint(0, V, (B, T)); tgt = torch.randint(0, V, (B, T))
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = forward(idx, tgt); loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
    times.append((time.perf_counter() - t0) * 1000)
print(json.dumps({"ms": statistics.median(times[5:]), "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "version": torch.__version__}))
'''


OPENMP_OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-openmp"


def run_torch(c, threads, steps, python="/usr/bin/python3", openmp_blas=False, compiled=False):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if openmp_blas:  # PyTorch's BLAS calls on the OpenMP build of OpenBLAS: no fight with PyTorch's OpenMP pool
        env["LD_LIBRARY_PATH"] = OPENMP_OPENBLAS
    r = subprocess.run([python, "-c", TORCH_CHILD, json.dumps(c), str(threads), str(steps), "1" if compiled else "0"],
                       capture_output=True, text=True, check=True, env=env)
    return json.loads(r.stdout.strip().splitlines()[-1])


def current_torch():
    """The python of scripts/torch_venv.sh's venv, or None (and why) where it cannot be installed."""
    r = subprocess.run([os.path.join(ROOT, "scripts", "torch_venv.sh")], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "scripts/torch_venv.sh failed"
    return r.stdout.strip(), ""


def peak_sgemm(threads):
    """The best 2048^3 sgemm rate among Eigen, oneDNN and OpenBLAS (GFLOP/s), and bench_matmul's lines."""
    exe = os.path.join(ROOT, "build", "bench", "bench_matmul")
    if not os.path.exists(exe):
        return None, ""
    r = subprocess.run([exe, str(threads), "--peak-only"], capture_output=True, text=True)
    m = re.search(r"peak sgemm.*: ([0-9.]+) GFLOP/s", r.stdout)
    return (float(m.group(1)) if m else None), r.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int_at_least(1), default=2)
    ap.add_argument("--steps", type=int_at_least(6), default=30)
    ap.add_argument("--configs", type=names(list(CONFIGS)), default="A,B")
    ap.add_argument("--precisions", type=names(["fp32", "bf16"]), default="fp32,bf16")
    ap.add_argument("--cpu-matmul", type=names(["auto", "eigen", "onednn"]), default="auto",
                    help="train.cpu_matmul values to run meshtrain with (PyTorch's ratios use the first)")
    ap.add_argument("--runs", type=int_at_least(1), default=1,
                    help="meshtrain runs per arm, each between its own peak measurements (default 1)")
    ap.add_argument("--no-current-torch", action="store_true",
                    help="skip the registry's PyTorch (scripts/torch_venv.sh installs ~5 GiB once)")
    args = ap.parse_args()
    precisions = args.precisions.split(",")
    peak, peak_lines = peak_sgemm(args.threads)  # re-measured after every meshtrain run (see the docstring)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; threads per process {args.threads}")
    print(peak_lines or "build/bench/bench_matmul not built: no sgemm peak")
    have_omp = os.path.exists(os.path.join(OPENMP_OPENBLAS, "libblas.so.3"))
    new_python, why = (None, "--no-current-torch") if args.no_current_torch else current_torch()

    print(f"\nmeshtrain (FLOPs per token 6N + 12LTC; 'sgemm' = the best 2048^3 sgemm rate measured right before and "
          f"right after the run, and their mean; 'of sgemm' = the run's GFLOP/s over that mean)")
    print(f"{'config':6} {'precision':9} {'cpu_matmul':10} {'tok/s':>8} {'vs fp32':>7} {'GFLOP/s':>8} "
          f"{'sgemm':>17} {'of sgemm':>8} {'MiB':>7}  matmuls")
    mt_ms = {}
    matmul_choices = args.cpu_matmul.split(",")
    for name in args.configs.split(","):
        c = CONFIGS[name]
        tokens = c["batch"] * c["seq_len"]
        for choice in matmul_choices:
            for prec in precisions:
                runs_ms, shares = [], []
                for _ in range(args.runs):
                    with tempfile.TemporaryDirectory() as work:
                        ms, rss, libs = run_meshtrain(c, args.threads, args.steps, work, prec, choice)
                    runs_ms.append(ms)
                    gflops = flops_per_token(c) * tokens / (ms / 1000) / 1e9
                    fp32 = ms if prec == "fp32" else mt_ms.get((name, "fp32", choice))
                    vs = f"{fp32 / ms:7.2f}" if fp32 else f"{'':7}"
                    before, (peak, _) = peak, peak_sgemm(args.threads)
                    mean = (before + peak) / 2 if before and peak else None
                    sgemm = f"{before:.0f}/{peak:.0f}: {mean:.0f}" if mean else "n/a"
                    share = f"{100 * gflops / mean:.0f}%" if mean else "n/a"
                    if mean:
                        shares.append(gflops / mean)
                    print(f"{name:6} {prec:9} {choice:10} {tokens / ms * 1000:8.0f} {vs} {gflops:8.1f} {sgemm:>17} "
                          f"{share:>8} {rss:7.1f}  {libs}", flush=True)
                mt_ms[name, prec, choice] = statistics.median(runs_ms)  # what 'vs fp32' and PyTorch compare with
                if args.runs > 1:
                    share = (f"{100 * statistics.median(shares):.0f}% of sgemm ({100 * min(shares):.0f}-"
                             f"{100 * max(shares):.0f}%)" if shares else "no sgemm peak")
                    print(f"{name:6} {prec:9} {choice:10} median of {args.runs} runs: "
                          f"{tokens / mt_ms[name, prec, choice] * 1000:.0f} tok/s, {share}")

    print(f"\nPyTorch, fp32 (ratio = PyTorch's step time / meshtrain's fp32 step time, cpu_matmul "
          f"{matmul_choices[0]})")
    if new_python is None:
        print(f"  the registry's PyTorch: skipped ({why})")
    print(f"{'config':6} {'PyTorch':38} {'tok/s':>8} {'ratio':>6} {'MiB':>7}")
    for name in args.configs.split(","):
        c = CONFIGS[name]
        tokens = c["batch"] * c["seq_len"]
        runs = [("Debian eager", dict())]
        if have_omp:
            runs.append(("Debian eager, OpenMP OpenBLAS", dict(openmp_blas=True)))
        if new_python:
            runs += [("registry eager", dict(python=new_python)),
                     ("registry torch.compile", dict(python=new_python, compiled=True))]
        for label, kw in runs:
            out = run_torch(c, args.threads, args.steps, **kw)
            base = mt_ms.get((name, "fp32", matmul_choices[0]))
            ratio = f"{out['ms'] / base:6.2f}" if base else f"{'n/a':>6}"
            print(f"{name:6} {label + ' ' + out['version']:38} {tokens / out['ms'] * 1000:8.0f} {ratio} "
                  f"{out['rss']:7.1f}")


if __name__ == "__main__":
    main()
