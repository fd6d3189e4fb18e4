"""Llama parity with a PyTorch reference (tests/py/llama_reference.py, torch ops only): the same initial weights
(a Hugging Face-layout safetensors file written here, loaded by model.init_from), the same token file, AdamW with
weight decay, clipping, warmup + cosine and gradient accumulation, trained side by side for 20 steps, for
n_kv_head equal to n_head, smaller than it (grouped-query attention), and with the head tied to the embedding.
Then the export: meshtrain's model.safetensors loads back into the reference and gives meshtrain's final loss
(Hugging Face names and layouts out, as in), and export then import is the identity (the export loaded with
model.init_from and exported again after a step of lr 1e-30 holds the same tensors).

Tolerances, as the GPT-2 parity test's and for the same reasons: loss 1e-5 relative at every step (fp32 against
the fp64 reference; the fp32 reference's own drift must stay under it), step-1 gradients 1e-4 relative per tensor.
Usage: test_llama_parity.py TRAINER TEXT_FILE WORK_DIR
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpt2_reference import read_safetensors, train_reference, window, write_llmc_shard, write_safetensors
from llama_reference import Llama, llama_decays, llama_shapes

LOSS_RTOL, GRAD_RTOL = 1e-5, 1e-4
BASE = dict(n_layer=2, n_head=4, n_kv_head=4, d_model=64, ffn_hidden=96, seq_len=32, vocab_size=250, tie=False,
            norm_eps=1e-5, rope_theta=10000.0, global_batch=8, micro_batch=4, steps=20, lr=3e-3, min_lr=3e-4,
            warmup=5, weight_decay=0.1, grad_clip=1.0, beta1=0.9, beta2=0.95, eps=1e-8)


def initial_weights(c, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in llama_shapes(c).items():
        base = 1.0 if "norm" in name else 0.0  # norms perturbed around 1 so their gradients are not trivial
        scale = 0.1 if "norm" in name else 0.05
        out[name] = (base + scale * torch.randn(shape, generator=g, dtype=torch.float64)).float().numpy()
    return out


def reference_run(c, weights, tokens, dtype):
    model = Llama(c, weights, dtype)
    named = model.named()
    losses, norms, grads1 = train_reference(model, named, llama_decays, c, tokens)
    final = {n: p.detach().double().numpy().copy() for n, p in named.items()}
    return losses, norms, grads1, final


def eval_loss(c, weights, tokens, step):
    """The mean loss of step `step`'s global batch under `weights` (fp64)."""
    model = Llama(c, weights, torch.float64)
    xs, ys = zip(*[window(tokens, step - 1, b, c["global_batch"], c["seq_len"]) for b in range(c["global_batch"])])
    with torch.no_grad():
        return model(torch.tensor(np.array(xs), dtype=torch.long), torch.tensor(np.array(ys), dtype=torch.long)).item()


def run_case(trainer, name, c, tokens, token_path, work):
    weights = initial_weights(c)
    init_path = os.path.join(work, f"{name}_init.safetensors")
    write_safetensors(init_path, weights)
    run_dir = os.path.join(work, name)
    grads_path = os.path.join(run_dir, "grads_step1.safetensors")
    sets = {"model.arch": "llama", "model.n_layer": c["n_layer"], "model.n_head": c["n_head"],
            "model.n_kv_head": c["n_kv_head"], "model.d_model": c["d_model"], "model.ffn_hidden": c["ffn_hidden"],
            "model.seq_len": c["seq_len"], "model.vocab_size": c["vocab_size"],
            "model.tie_embeddings": str(c["tie"]).lower(), "model.norm_eps": c["norm_eps"],
            "model.rope_theta": c["rope_theta"], "model.init_from": init_path,
            "train.global_batch": c["global_batch"], "train.micro_batch": c["micro_batch"], "train.steps": c["steps"],
            "train.grad_clip": c["grad_clip"], "optim.lr": c["lr"], "optim.min_lr": c["min_lr"],
            "optim.warmup_steps": c["warmup"], "optim.schedule": "cosine", "optim.weight_decay": c["weight_decay"],
            "optim.beta1": c["beta1"], "optim.beta2": c["beta2"], "optim.eps": c["eps"], "data.source": "tokens",
            "data.path": token_path, "data.val_fraction": 0, "run.dir": run_dir, "run.dump_grads": grads_path,
            "run.log_every": 10}
    cmd = [trainer, "--config", os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        return False
    ours = np.array([json.loads(line)["loss"] for line in open(os.path.join(run_dir, "metrics.jsonl"))])
    ref64, norms64, grads64, final64 = reference_run(c, weights, tokens, torch.float64)
    ref32, _, _, _ = reference_run(c, weights, tokens, torch.float32)
    ok = len(ours) == c["steps"]
    rel = np.abs(ours - ref64) / ref64
    drift = np.max(np.abs(ref32 - ref64) / ref64)
    print(f"{name}: loss max relative difference {rel.max():.2e} (PyTorch fp32 vs fp64 {drift:.2e}); "
          f"first {ours[0]:.6f}, last {ours[-1]:.6f}")
    ok &= rel.max() <= LOSS_RTOL and drift <= LOSS_RTOL
    ok &= bool((norms64 > c["grad_clip"]).any()) and ours[-1] < ours[0] - 0.5  # clipping engaged, training happened
    got = read_safetensors(grads_path)
    worst = 0.0
    for n, ref in grads64.items():
        g = got[n].astype(np.float64)
        ok &= g.shape == ref.shape
        worst = max(worst, np.linalg.norm(g - ref) / max(np.linalg.norm(ref), 1e-30))
    ok &= sorted(got) == sorted(grads64) and worst <= GRAD_RTOL
    print(f"{name}: step-1 gradients, {len(grads64)} tensors, worst relative difference {worst:.2e}")
    # The export: Hugging Face names and shapes, and the reference computes meshtrain's loss from them.
    exported = read_safetensors(os.path.join(run_dir, "model.safetensors"))
    same = sorted(exported) == sorted(final64) and all(exported[n].shape == final64[n].shape for n in final64)
    ref_final = eval_loss(c, final64, tokens, c["steps"] + 1)
    ours_final = eval_loss(c, exported, tokens, c["steps"] + 1)
    d = abs(ours_final - ref_final) / ref_final
    print(f"{name}: export holds the reference's {len(final64)} tensors: {same}; its loss {ours_final:.6f} against "
          f"the reference's {ref_final:.6f} ({d:.1e})")
    ok &= same and d <= 1e-4  # 20 AdamW steps in fp32 against fp64: weights agree to ~1e-5
    # Export then import is the identity: the export loaded back and exported again after one step of lr 1e-30
    # (which moves a weight by at most ~1e-30) holds the same tensors.
    again = os.path.join(work, f"{name}_reimport")
    cmd2 = cmd[:cmd.index("--set")] + [a for k, v in dict(sets, **{
        "model.init_from": os.path.join(run_dir, "model.safetensors"), "train.steps": 1, "optim.lr": 1e-30,
        "optim.min_lr": 0, "run.dir": again, "run.dump_grads": ""}).items() for a in ("--set", f"{k}={v}")]
    r2 = subprocess.run(cmd2, capture_output=True, text=True)
    back = read_safetensors(os.path.join(again, "model.safetensors")) if r2.returncode == 0 else {}
    diff = max((float(np.max(np.abs(back[n] - exported[n]))) for n in exported if n in back), default=float("inf"))
    ok &= sorted(back) == sorted(exported) and diff <= 1e-20
    print(f"{name}: export -> init_from -> export: {len(back)} tensors, max difference {diff:.1e}")
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return ok


def main():
    trainer, text_path, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    raw = np.frombuffer(open(text_path, "rb").read()[:200_000], dtype=np.uint8)
    tokens = raw.astype(np.int64) % BASE["vocab_size"]
    token_path = os.path.join(work, "tokens.bin")
    write_llmc_shard(token_path, tokens)
    ok = True
    for name, change in [("mha", {}), ("gqa", {"n_kv_head": 2}), ("gqa_tied", {"n_kv_head": 1, "tie": True})]:
        ok &= run_case(trainer, name, dict(BASE, **change), tokens, token_path, work)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
