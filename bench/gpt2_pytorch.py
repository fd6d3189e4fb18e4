"""GPT-2 124M in plain PyTorch: the PyTorch contender of scripts/bench_gpt2.sh (tokens/s against meshtrain and
llm.c on one GPU, same model, same tokens per optimizer step, random init).

The model is GPT-2 as the README states it (learned token and position embeddings, pre-LayerNorm blocks, causal
attention through F.scaled_dot_product_attention(is_causal=True), 4C MLP with tanh-GELU, final LayerNorm, LM head
tied to the token embedding, no dropout), its vocabulary padded to a multiple of 64 as meshtrain and llm.c pad
theirs (50257 -> 50304; the padded rows never appear as targets). The step: bf16 autocast over fp32 weights,
`micro_batch` sequences per forward/backward, global_batch / micro_batch of them accumulated, global-norm clipping
at 1.0, fused AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1 on matrices and embeddings). Tokens come from an
llm.c token file (--data) read as meshtrain reads it with data.order sequential, or are drawn at random.

Timing: CUDA events around each whole optimizer step (data slicing included); the median over the steps after
--warmup. Each (mode, micro-batch) prints and writes (--json) one result:
  {"contender": "pytorch-eager"|"pytorch-compile", "micro_batch", "global_batch", "seq_len", "tokens_per_s",
   "step_ms", "loss", "peak_mem_gib", "steps", "warmup", "status"}

  python3 bench/gpt2_pytorch.py --micro-batches 8,16,32 --global-batch 32 --steps 40 --warmup 10 --data F.bin
  python3 bench/gpt2_pytorch.py --write-tokens F.bin [--from-text data/tinyshakespeare.txt] [--num-tokens N]
  python3 bench/gpt2_pytorch.py --device cpu --tiny      # a smoke test on any PyTorch (no GPU needed)
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_cli import int_at_least, int_list, names

LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER_INTS = 20240520, 1, 256
OutOfMemory = getattr(torch.cuda, "OutOfMemoryError", MemoryError)  # PyTorch >= 1.13 has the former


def write_llmc_tokens(path, tokens):
    """An llm.c token shard: 256 int32 header (magic 20240520, version 1, token count), then uint16 tokens."""
    tokens = np.asarray(tokens, dtype=np.uint16)
    header = np.zeros(LLMC_HEADER_INTS, dtype=np.int32)
    header[0], header[1], header[2] = LLMC_MAGIC, LLMC_VERSION, len(tokens)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def read_llmc_tokens(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(LLMC_HEADER_INTS * 4), dtype=np.int32)
        if header[0] != LLMC_MAGIC or header[1] != LLMC_VERSION:
            sys.exit(f"{path}: not an llm.c token file (magic {header[0]}, version {header[1]})")
        tokens = np.frombuffer(f.read(), dtype=np.uint16)
    if len(tokens) != header[2]:
        sys.exit(f"{path}: header says {header[2]} tokens, file holds {len(tokens)}")
    return tokens


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def attention(self, x):  # x: (B, T, C)
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))  # (B, NH, T, HS)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch < 2.0 (the CPU smoke test on an old PyTorch): the same function, unfused
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, NH, C, T, V, pad_to=64):
        super().__init__()
        self.V = V
        Vp = (V + pad_to - 1) // pad_to * pad_to
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        # GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2L), zero biases.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):  # idx, targets: (B, T) int64
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head: (B, T, Vp)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def make_optimizer(model, lr, device):
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    fused = {"fused": True} if device == "cuda" else {}
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **fused)


class Timer:
    """CUDA events on the GPU (device work is asynchronous); the host clock on the CPU."""

    def __init__(self, device):
        self.cuda = device == "cuda"

    def start(self):
        if self.cuda:
            self.t0, self.t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.t0.record()
        else:
            self.h0 = time.perf_counter()

    def stop_ms(self):
        if self.cuda:
            self.t1.record()
            self.t1.synchronize()
            return self.t0.elapsed_time(self.t1)
        return (time.perf_counter() - self.h0) * 1000.0


def run_one(args, mode, micro_batch, tokens):
    device = args.device
    torch.manual_seed(args.seed)
    model = GPT2(args.n_layer, args.n_head, args.d_model, args.seq_len, args.vocab_size).to(device)
    opt = make_optimizer(model, 6e-4, device)
    step_fn_model = torch.compile(model) if mode == "compile" else model
    T, GB = args.seq_len, args.global_batch
    accum = GB // micro_batch
    n_windows = len(tokens) - T - 1

    pos = torch.arange(T + 1, device=device)

    amp_dtype = torch.bfloat16
    timer = Timer(device)
    times, loss_val = [], float("nan")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step in range(args.steps):
        timer.start()
        for m in range(accum):
            # meshtrain's data.order=sequential windows (docs/data.md): global sequence g of step s starts at
            # ((s * GB + g) * T) mod (N - T - 1); one gather makes the micro-batch's inputs and targets.
            offs = [((step * GB + m * micro_batch + b) * T) % n_windows for b in range(micro_batch)]
            win = tokens[torch.tensor(offs, device=device)[:, None] + pos]  # (micro_batch, T + 1)
            idx, tgt = win[:, :-1], win[:, 1:]
            with torch.autocast(device_type=device, dtype=amp_dtype):
                loss = step_fn_model(idx, tgt) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ms = timer.stop_ms()
        loss_val = loss.item() * accum  # the last micro-batch's loss
        times.append(ms)
        if args.verbose:
            print(f"  {mode} mb {micro_batch} step {step + 1}/{args.steps}: {ms:.1f} ms, loss {loss_val:.4f}",
                  flush=True)
    measured = times[args.warmup:] if len(times) > args.warmup else times
    step_ms = statistics.median(measured)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"contender": f"pytorch-{mode}", "micro_batch": micro_batch, "global_batch": GB, "seq_len": T,
            "tokens_per_s": GB * T / (step_ms / 1000.0), "step_ms": step_ms, "loss": loss_val,
            "peak_mem_gib": peak, "steps": args.steps, "warmup": args.warmup, "status": "ok"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model, 4 steps: a smoke test")
    ap.add_argument("--n-layer", type=int_at_least(1), default=12)
    ap.add_argument("--n-head", type=int_at_least(1), default=12)
    ap.add_argument("--d-model", type=int_at_least(1), default=768)
    ap.add_argument("--seq-len", type=int_at_least(1), default=1024)
    ap.add_argument("--vocab-size", type=int_at_least(1), default=50257)
    ap.add_argument("--micro-batches", type=int_list(1), default="8,16,32", help="comma-separated micro-batch sizes")
    ap.add_argument("--global-batch", type=int_at_least(1), default=32, help="sequences per optimizer step")
    ap.add_argument("--steps", type=int_at_least(1), default=40)
    ap.add_argument("--warmup", type=int_at_least(0), default=10, help="steps left out of the median")
    ap.add_argument("--modes", type=names(["eager", "compile"]), default="eager,compile",
                    help="eager and/or compile (torch.compile)")
    ap.add_argument("--compile-micro-batches", default="",
                    help="micro-batches to run under torch.compile (default: all of --micro-batches)")
    ap.add_argument("--data", default="", help="llm.c token file; default: random tokens")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", default="", help="append one JSON line per result to this file")
    ap.add_argument("--verbose", action="store_true", help="print every step")
    ap.add_argument("--write-tokens", default="", help="write an llm.c token file and exit")
    ap.add_argument("--from-text", default="", help="with --write-tokens: the bytes of this text file, repeated")
    ap.add_argument("--num-tokens", type=int_at_least(1), default=1 << 22, help="with --write-tokens: how many tokens")
    args = ap.parse_args()

    if args.write_tokens:
        if args.from_text and os.path.exists(args.from_text):
            raw = np.frombuffer(open(args.from_text, "rb").read(), dtype=np.uint8).astype(np.uint16)
            tokens = np.resize(raw, args.num_tokens)  # repeats the text to the length asked for
        else:
            tokens = np.random.default_rng(args.seed).integers(0, args.vocab_size, args.num_tokens, dtype=np.uint16)
        write_llmc_tokens(args.write_tokens, tokens)
        print(f"wrote {args.write_tokens}: {len(tokens)} tokens")
        return

    if args.tiny:
        args.n_layer, args.n_head, args.d_model, args.seq_len, args.vocab_size = 2, 2, 64, 64, 512
        args.steps, args.warmup = min(args.steps, 4), min(args.warmup, 1)
        if args.micro_batches == ap.get_default("micro_batches"):
            args.micro_batches = "2,4"
        if args.global_batch == ap.get_default("global_batch"):
            args.global_batch = 4
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpt2_pytorch: no CUDA device (use --device cpu for a smoke test)")
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    if args.data:
        np_tokens = read_llmc_tokens(args.data)
        if np_tokens.max() >= args.vocab_size:
            sys.exit(f"{args.data}: token {np_tokens.max()} is outside the vocabulary ({args.vocab_size})")
    else:
        np_tokens = np.random.default_rng(args.seed).integers(0, args.vocab_size, 1 << 20).astype(np.uint16)
    tokens = torch.from_numpy(np_tokens.astype(np.int64)).to(args.device)

    micro_batches = [int(x) for x in args.micro_batches.split(",") if x]
    compile_mbs = [int(x) for x in args.compile_micro_batches.split(",") if x] or micro_batches
    modes = [m for m in args.modes.split(",") if m]
    print(f"gpt2_pytorch: torch {torch.__version__}, device {args.device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if args.device == 'cuda' else ''}, "
          f"L{args.n_layer} NH{args.n_head} C{args.d_model} T{args.seq_len} V{args.vocab_size}, "
          f"global batch {args.global_batch} x {args.seq_len} tokens, {args.steps} steps ({args.warmup} warm-up)",
          flush=True)
    results = []
    for mode in modes:
        for mb in (compile_mbs if mode == "compile" else micro_batches):
            base = {"contender": f"pytorch-{mode}", "micro_batch": mb, "global_batch": args.global_batch,
                    "seq_len": args.seq_len, "steps": args.steps, "warmup": args.warmup}
            if args.global_batch % mb:
                r = dict(base, status=f"skipped: global batch {args.global_batch} does not divide by {mb}")
            elif mode == "compile" and not hasattr(torch, "compile"):
                r = dict(base, status=f"skipped: torch {torch.__version__} has no torch.compile")
            elif mode not in ("eager", "compile"):
                r = dict(base, status=f"skipped: unknown mode {mode}")
            else:
                t0 = time.time()
                try:
                    r = run_one(args, mode, mb, tokens)
                except OutOfMemory as e:
                    r = dict(base, status=f"out of memory: {str(e).splitlines()[0]}")
                except Exception as e:  # a failing contender is a row of the table, not the end of the run
                    r = dict(base, status=f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                r["wall_s"] = round(time.time() - t0, 1)
                if args.device == "cuda":
                    torch.cuda.empty_cache()
            results.append(r)
            if r["status"] == "ok":
                print(f"{r['contender']:16s} mb {mb:3d}: {r['tokens_per_s']:12.0f} tok/s, {r['step_ms']:9.2f} ms/step, "
                      f"loss {r['loss']:.4f}, peak {r['peak_mem_gib'] or 0:.1f} GiB, {r['wall_s']} s", flush=True)
            else:
                print(f"{r['contender']:16s} mb {mb:3d}: {r['status']}", flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(r) + "\n")
    if not any(r["status"] == "ok" for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
