"""GPT-2 against Llama of the same width, and activation recomputation (train.recompute none / light / selective /
full):
tokens/s and peak activation memory on one rank, with the FLOPs each setting must do beside the time it takes.

The model: --layers blocks of --width channels, --heads heads (Llama: --kv-heads key/value heads, SwiGLU hidden
2/3 of 4 width rounded up to 64), sequences of --seq tokens, vocabulary 256 (the synthetic corpus), micro-batch
--batch, fp32, one rank with the machine's cores. Each run trains --steps steps; tokens/s is the median over steps
4..N (then the median over --repeats interleaved runs), the peak activations are the trainer's own figure (the activation records' arena high water).

The two numbers. Multiply-adds per token of one block's forward, N tokens of T per sequence:
  GPT-2  qkv 3C^2 + attention 2 T C (scores and P V, causal: half of T on average, counted whole as the kernel does)
         + c_proj C^2 + MLP 8 C^2
  Llama  q, o 2 C^2 + k, v 2 C KV + attention 2 T C + gate, up, down 3 C H
A training step is forward + backward = 3 forwards (the backward computes two products per forward one). Full
recomputation runs each block's forward again up to the MLP's activation (everything but the down / c_proj
projection): about one more forward of the blocks, a third more compute. Selective recomputes the attention core,
2 T C per token per block. Light recomputes the norms' outputs and the MLP's activation: no multiply-adds, a few
elementwise passes over tensors the backward reads anyway. Bytes: the records, as the planner's memory model gives
them (docs/planner.md).

Usage: /usr/bin/python3 bench/bench_recompute.py [--width 256] [--layers 4] [--heads 8] [--kv-heads 2]
                                                [--seq 256] [--batch 4] [--steps 20] [--repeats 3]
Timings are only meaningful on an idle machine (about 2 minutes on 2 cores with the defaults)."""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

from bench_cli import cpu_model, int_at_least

RECOMPUTE = ("none", "light", "selective", "full")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def macs_per_token(arch, a, hidden):
    C, T, L = a.width, a.seq, a.layers
    kv = C // a.heads * a.kv_heads
    attn = 2 * T * C
    if arch == "gpt2":
        proj, mlp, down = 4 * C * C, 8 * C * C, 4 * C * C
    else:
        proj, mlp, down = 2 * C * C + 2 * C * kv, 3 * C * hidden, C * hidden
    block = proj + attn + mlp
    head = C * 256
    return {"fwd": L * block + head, "recompute_full": L * (block - down), "recompute_selective": L * attn,
            "recompute_light": 0}


def run(work, arch, rc, a):
    d = os.path.join(work, f"{arch}_{rc}")
    sets = [f"model.arch={arch}", f"model.n_layer={a.layers}", f"model.n_head={a.heads}", f"model.d_model={a.width}",
            f"model.seq_len={a.seq}", "model.vocab_size=256", f"train.global_batch={a.batch}",
            f"train.micro_batch={a.batch}", f"train.steps={a.steps}", "train.eval_every=0", f"train.recompute={rc}",
            "run.log_every=1000", "run.checkpoint_every=0", f"run.dir={d}"]
    if arch == "llama":
        sets += [f"model.n_kv_head={a.kv_heads}", "model.multiple_of=64"]
    cmd = [os.path.join(ROOT, "build", "trainer"), "--config", os.path.join(ROOT, "configs", "gpt.yaml")]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"trainer failed: {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
    tps = statistics.median(r["tokens_per_s"] for r in rows[3:])
    peak = float(re.search(r"peak activations ([0-9.]+) MiB", p.stdout + p.stderr).group(1))
    hidden = int(re.search(r"SwiGLU hidden (\d+)", p.stdout + p.stderr).group(1)) if arch == "llama" else 0
    return tps, peak, hidden


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int_at_least(1), default=256)
    ap.add_argument("--layers", type=int_at_least(1), default=4)
    ap.add_argument("--heads", type=int_at_least(1), default=8)
    ap.add_argument("--kv-heads", type=int_at_least(1), default=2)
    ap.add_argument("--seq", type=int_at_least(1), default=256)
    ap.add_argument("--batch", type=int_at_least(1), default=4)
    ap.add_argument("--steps", type=int_at_least(1), default=20)
    ap.add_argument("--repeats", type=int_at_least(1), default=3, help="runs per setting, interleaved")
    a = ap.parse_args()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); one rank, fp32; width {a.width}, {a.layers} blocks, "
          f"{a.heads} heads (Llama: {a.kv_heads} kv heads), T {a.seq}, micro-batch {a.batch}")
    print(f"{'model':>6} {'recompute':>10} {'tokens/s':>9} {'min..max':>12} {'vs none':>8} {'MAC/token':>10} "
          f"{'compute +':>9} "
          f"{'peak act MiB':>12} {'saved':>6}   (tokens/s: median of --repeats runs)")
    settings = [(arch, rc) for arch in ("gpt2", "llama") for rc in RECOMPUTE]
    got = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(a.repeats):  # round robin, so that a slow spell of the machine hits every setting alike
            for s in settings:
                got[s].append(run(work, *s, a))
    for arch in ("gpt2", "llama"):
        base = None
        for rc in RECOMPUTE:
            runs = got[(arch, rc)]
            tps, peak, hidden = statistics.median(r[0] for r in runs), runs[0][1], runs[0][2]
            m = macs_per_token(arch, a, hidden)
            train = 3 * m["fwd"] + (m[f"recompute_{rc}"] if rc != "none" else 0)
            base = base or (tps, peak, 3 * m["fwd"])
            spread = f"{min(r[0] for r in runs):.0f}..{max(r[0] for r in runs):.0f}"
            print(f"{arch:>6} {rc:>10} {tps:9.0f} {spread:>12} {tps / base[0]:8.3f} {train / 1e6:9.1f}M "
                  f"{train / base[2] - 1:+9.1%} {peak:12.2f} {1 - peak / base[1]:6.1%}")

if __name__ == "__main__":
    main()
