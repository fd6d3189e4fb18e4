"""PyTorch parity: the same GPT-2, the same initial weights (a safetensors file written here and loaded by
meshtrain's model.init_from), the same token file, AdamW with weight decay, gradient clipping, a warmup +
cosine schedule and gradient accumulation, trained side by side for 20 steps.

Tolerances and why:
- loss, every step, 1e-5 relative: meshtrain trains in fp32 and the reference in fp64; fp32 rounding moves a
  loss like this one by ~1e-7 relative per step (the fp32 reference run below measures it and must stay under
  the same bound), and 20 AdamW steps amplify that drift by at most ~10x.
- step-1 gradients, 1e-4 relative per tensor (||g - g_ref|| / ||g_ref||): single fp32 gradients carry ~1e-6
  relative error from summation order; 1e-4 leaves room for the smallest tensors (biases) without hiding a
  wrong formula, which shows as O(1) error.
Usage: test_pytorch_parity.py TRAINER TEXT_FILE WORK_DIR
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpt2_reference import GPT2, decays, read_safetensors, train_reference, write_llmc_shard, write_safetensors

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4

CFG = dict(n_layer=2, n_head=4, d_model=64, seq_len=32, vocab_size=250, global_batch=8, micro_batch=4, steps=20,
           lr=3e-3, min_lr=3e-4, warmup=5, weight_decay=0.1, grad_clip=1.0, beta1=0.9, beta2=0.95, eps=1e-8)


def initial_weights(seed=0):
    """Random weights in meshtrain's shapes; LayerNorm and biases perturbed so their gradients are not trivial."""
    m = GPT2(CFG["n_layer"], CFG["n_head"], CFG["d_model"], CFG["seq_len"], CFG["vocab_size"], torch.float32)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in m.named().items():
        if "ln_" in name and name.endswith(".weight"):
            t = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        elif name.endswith(".bias"):
            t = 0.02 * torch.randn(p.shape, generator=g)
        else:
            t = 0.02 * torch.randn(p.shape, generator=g)
        out[name] = t.numpy()
    return out


def reference_run(weights, tokens, dtype):
    c = CFG
    model = GPT2(c["n_layer"], c["n_head"], c["d_model"], c["seq_len"], c["vocab_size"], dtype)
    with torch.no_grad():
        for name, p in model.named().items():
            p.copy_(torch.from_numpy(weights[name]).to(dtype))
    return train_reference(model, model.named(), decays, c, tokens)


def main():
    trainer, text_path, work = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    c = CFG
    raw = np.frombuffer(open(text_path, "rb").read()[:200_000], dtype=np.uint8)
    tokens = (raw.astype(np.int64) % c["vocab_size"])  # ASCII text: ids stay < 250, padding 250 -> 256 exercised
    token_path = os.path.join(work, "tokens.bin")
    write_llmc_shard(token_path, tokens)
    weights = initial_weights()
    init_path = os.path.join(work, "init.safetensors")
    write_safetensors(init_path, {("transformer." + n if n.startswith("h.") else n): w for n, w in weights.items()})

    run_dir = os.path.join(work, "run")
    grads_path = os.path.join(work, "grads_step1.safetensors")
    sets = {"model.n_layer": c["n_layer"], "model.n_head": c["n_head"], "model.d_model": c["d_model"],
            "model.seq_len": c["seq_len"], "model.vocab_size": c["vocab_size"], "model.init_from": init_path,
            "train.global_batch": c["global_batch"], "train.micro_batch": c["micro_batch"],
            "train.steps": c["steps"], "train.grad_clip": c["grad_clip"], "optim.lr": c["lr"],
            "optim.min_lr": c["min_lr"], "optim.warmup_steps": c["warmup"], "optim.schedule": "cosine",
            "optim.weight_decay": c["weight_decay"], "optim.beta1": c["beta1"], "optim.beta2": c["beta2"],
            "optim.eps": c["eps"], "data.source": "tokens", "data.path": token_path, "data.val_fraction": 0,
            "run.dir": run_dir, "run.dump_grads": grads_path, "run.log_every": 5}
    cmd = [trainer, "--config", os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.yaml")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    subprocess.run(cmd, check=True)
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    ours = np.array([r["loss"] for r in rows])
    our_norms = np.array([r["grad_norm"] for r in rows])

    ref64, norms64, grads64 = reference_run(weights, tokens, torch.float64)
    ref32, _, _ = reference_run(weights, tokens, torch.float32)
    assert len(ours) == c["steps"], f"meshtrain wrote {len(ours)} rows"
    fp32_drift = np.max(np.abs(ref32 - ref64) / ref64)
    rel = np.abs(ours - ref64) / ref64
    print(f"loss: max relative difference meshtrain vs fp64 reference {rel.max():.2e} "
          f"(PyTorch fp32 vs fp64: {fp32_drift:.2e}); tolerance {LOSS_RTOL:g}")
    for s in range(c["steps"]):
        print(f"  step {s + 1:2d}: meshtrain {ours[s]:.8f}  reference {ref64[s]:.8f}  rel {rel[s]:.2e}  "
              f"grad norm {our_norms[s]:.5f} / {norms64[s]:.5f}")
    ok = True
    if rel.max() > LOSS_RTOL:
        print("FAIL: loss differs beyond tolerance")
        ok = False
    if fp32_drift > LOSS_RTOL:
        print("FAIL: even PyTorch fp32 drifts beyond the loss tolerance; the tolerance's premise is wrong")
        ok = False
    if not (norms64 > c["grad_clip"]).any():
        print("FAIL: gradient clipping never engaged, so the test would not catch a clipping bug")
        ok = False
    if not (ours[-1] < ours[0] - 0.5):
        print("FAIL: the loss did not fall; the comparison is not exercising training")
        ok = False

    got = read_safetensors(grads_path)
    worst = 0.0
    for name, ref in grads64.items():
        g = got[name].astype(np.float64)
        assert g.shape == ref.shape, (name, g.shape, ref.shape)
        r = np.linalg.norm(g - ref) / max(np.linalg.norm(ref), 1e-30)
        worst = max(worst, r)
        if r > GRAD_RTOL:
            print(f"FAIL: step-1 gradient of {name}: relative difference {r:.2e} > {GRAD_RTOL:g}")
            ok = False
    print(f"step-1 gradients: {len(grads64)} tensors, worst relative difference {worst:.2e}; tolerance {GRAD_RTOL:g}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
