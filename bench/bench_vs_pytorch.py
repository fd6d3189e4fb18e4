"""Training-step throughput of meshtrain against Debian's PyTorch (CPU) on the same GPT-2, the same thread
count and the same machine, measured in one run (issue #2's benchmark).

For each config it runs build/trainer on the synthetic corpus and the same model in PyTorch (nn.Linear-free
fused formulation: F.layer_norm, F.gelu(tanh), one matmul per projection, torch.optim.AdamW, clip_grad_norm_),
and prints tokens/s (median over the timed steps), the ratio, peak resident memory of each process, and the
share of this machine's measured sgemm throughput that a meshtrain training step achieves.

Model FLOPs per token (the usual 6N rule plus causal attention):
  6 * (12 L C^2 + C Vp) + 6 * L * T * C
(forward 2 flops per weight per token, backward 4; attention's QK^T and AV cost 2*T*C per token per layer
forward with the causal half skipped, times 3 for training).

Usage: /usr/bin/python3 bench/bench_vs_pytorch.py [--threads 2] [--steps 30] [--configs A,B]
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

from bench_cli import int_at_least, names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "A": dict(n_layer=4, n_head=4, d_model=256, seq_len=64, vocab_size=512, batch=4),
    "B": dict(n_layer=4, n_head=8, d_model=384, seq_len=128, vocab_size=2048, batch=8),
}


def flops_per_token(c):
    vp = (c["vocab_size"] + 63) // 64 * 64
    L, C, T = c["n_layer"], c["d_model"], c["seq_len"]
    return 6 * (12 * L * C * C + C * vp) + 6 * L * T * C


def run_meshtrain(c, threads, steps, work):
    run_dir = os.path.join(work, "run")
    sets = {"model.n_layer": c["n_layer"], "model.n_head": c["n_head"], "model.d_model": c["d_model"],
            "model.seq_len": c["seq_len"], "model.vocab_size": c["vocab_size"], "train.global_batch": c["batch"],
            "train.micro_batch": c["batch"], "train.steps": steps, "train.threads": threads,
            "data.source": "synthetic", "data.synthetic_tokens": 200000, "run.dir": run_dir, "run.log_every": 1000}
    cmd = [os.path.join(ROOT, "build", "trainer"), "--config", os.path.join(ROOT, "configs", "gpt.yaml")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    ms = [row["step_ms"] for row in rows[5:]]
    rss = float(re.search(r"peak RSS ([0-9.]+) MiB", r.stdout + r.stderr).group(1))
    return statistics.median(ms), rss


TORCH_CHILD = r'''
import math, resource, statistics, sys, time, json
import torch, torch.nn.functional as F
c = json.loads(sys.argv[1]); threads = int(sys.argv[2]); steps = int(sys.argv[3])
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
times = []
for s in range(steps):
    idx = torch.randint(0, V, (B, T)); tgt = torch.randint(0, V, (B, T))
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = forward(idx, tgt); loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
    times.append((time.perf_counter() - t0) * 1000)
print(json.dumps({"ms": statistics.median(times[5:]), "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


OPENMP_OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-openmp"


def run_torch(c, threads, steps, openmp_blas=False):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if openmp_blas:  # PyTorch's BLAS calls on the OpenMP build of OpenBLAS: no fight with PyTorch's OpenMP pool
        env["LD_LIBRARY_PATH"] = OPENMP_OPENBLAS
    r = subprocess.run(["/usr/bin/python3", "-c", TORCH_CHILD, json.dumps(c), str(threads), str(steps)],
                       capture_output=True, text=True, check=True, env=env)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["ms"], out["rss"]


def peak_sgemm(threads):
    exe = os.path.join(ROOT, "build", "bench", "bench_matmul")
    if not os.path.exists(exe):
        return None
    r = subprocess.run([exe, str(threads), "--peak-only"], capture_output=True, text=True)
    m = re.search(r"peak sgemm.*: ([0-9.]+) GFLOP/s", r.stdout)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int_at_least(1), default=2)
    ap.add_argument("--steps", type=int_at_least(1), default=30)
    ap.add_argument("--configs", type=names(list(CONFIGS)), default="A,B")
    args = ap.parse_args()
    peak = peak_sgemm(args.threads)
    print(f"machine: {os.cpu_count()} cores; threads per process {args.threads}; "
          f"peak sgemm {peak if peak else 'n/a'} GFLOP/s (build/bench/bench_matmul)")
    have_omp = os.path.exists(os.path.join(OPENMP_OPENBLAS, "libblas.so.3"))
    print("PyTorch: Debian's python3-torch as installed (its BLAS is the system libblas.so.3, OpenBLAS's pthread "
          "build by default)" + ("; 'omp' = the same with OpenBLAS's OpenMP build (libopenblas0-openmp), the "
                                  "faster PyTorch on this machine" if have_omp else ""))
    print(f"{'config':6} {'meshtrain tok/s':>16} {'PyTorch tok/s':>14} {'ratio':>6} "
          + (f"{'PyTorch omp':>12} {'ratio':>6} " if have_omp else "")
          + f"{'meshtrain MiB':>14} {'PyTorch MiB':>12} {'GFLOP/s':>8} {'of sgemm':>8}")
    for name in args.configs.split(","):
        c = CONFIGS[name]
        tokens = c["batch"] * c["seq_len"]
        with tempfile.TemporaryDirectory() as work:
            mt_ms, mt_rss = run_meshtrain(c, args.threads, args.steps, work)
        pt_ms, pt_rss = run_torch(c, args.threads, args.steps)
        omp = ""
        if have_omp:
            po_ms, _ = run_torch(c, args.threads, args.steps, openmp_blas=True)
            omp = f"{tokens / po_ms * 1000:12.0f} {po_ms / mt_ms:6.2f} "
        gflops = flops_per_token(c) * tokens / (mt_ms / 1000) / 1e9
        share = f"{100 * gflops / peak:.0f}%" if peak else "n/a"
        print(f"{name:6} {tokens / mt_ms * 1000:16.0f} {tokens / pt_ms * 1000:14.0f} {pt_ms / mt_ms:6.2f} " + omp
              + f"{mt_rss:14.1f} {pt_rss:12.1f} {gflops:8.1f} {share:>8}")


if __name__ == "__main__":
    main()
