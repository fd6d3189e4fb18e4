"""A GPT-2 in PyTorch, written from the paper and Hugging Face's layout, used as the reference for meshtrain's
parity test; plus the helpers the test scripts share (safetensors I/O, llm.c shards, the data windowing and the
learning-rate schedule of the README and docs/data.md)."""
import json
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F


class GPT2(torch.nn.Module):
    def __init__(self, n_layer, n_head, d_model, seq_len, vocab_size, dtype=torch.float64):
        super().__init__()
        self.L, self.NH, self.C, self.T, self.V = n_layer, n_head, d_model, seq_len, vocab_size
        C = d_model

        def p(*shape):
            return torch.nn.Parameter(torch.zeros(*shape, dtype=dtype))

        self.params = torch.nn.ParameterDict()
        self.params[key("wte.weight")] = p(vocab_size, C)
        self.params[key("wpe.weight")] = p(seq_len, C)
        for l in range(n_layer):
            for name, shape in [("ln_1.weight", (C,)), ("ln_1.bias", (C,)),
                                ("attn.c_attn.weight", (C, 3 * C)), ("attn.c_attn.bias", (3 * C,)),
                                ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
                                ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
                                ("mlp.c_fc.weight", (C, 4 * C)), ("mlp.c_fc.bias", (4 * C,)),
                                ("mlp.c_proj.weight", (4 * C, C)), ("mlp.c_proj.bias", (C,))]:
                self.params[key(f"h.{l}.{name}")] = p(*shape)
        self.params[key("ln_f.weight")] = p(C)
        self.params[key("ln_f.bias")] = p(C)

    def w(self, name):
        return self.params[key(name)]

    def forward(self, idx, targets):
        return F.cross_entropy(self.logits(idx).reshape(-1, self.V), targets.reshape(-1))

    def logits(self, idx):
        B, T = idx.shape
        C, NH = self.C, self.NH
        x = self.w("wte.weight")[idx] + self.w("wpe.weight")[:T]
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        for l in range(self.L):
            h = lambda n: self.w(f"h.{l}.{n}")
            a = F.layer_norm(x, (C,), h("ln_1.weight"), h("ln_1.bias"), 1e-5)
            qkv = a @ h("attn.c_attn.weight") + h("attn.c_attn.bias")
            q, k, v = qkv.split(C, dim=2)
            q, k, v = [t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v)]
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + y @ h("attn.c_proj.weight") + h("attn.c_proj.bias")
            m = F.layer_norm(x, (C,), h("ln_2.weight"), h("ln_2.bias"), 1e-5)
            m = F.gelu(m @ h("mlp.c_fc.weight") + h("mlp.c_fc.bias"), approximate="tanh")
            x = x + m @ h("mlp.c_proj.weight") + h("mlp.c_proj.bias")
        x = F.layer_norm(x, (C,), self.w("ln_f.weight"), self.w("ln_f.bias"), 1e-5)
        return x @ self.w("wte.weight").t()

    def named(self):
        return {unkey(k): v for k, v in self.params.items()}


def key(name):  # ParameterDict keys may not contain dots
    return name.replace(".", "__")


def unkey(k):
    return k.replace("__", ".")


def decays(name):
    """meshtrain's rule: weight decay on matrices and embeddings only."""
    return name.endswith(".weight") and "ln_" not in name


def lr_at(step, lr, min_lr, warmup, total, kind="cosine"):
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    if kind == "constant" or total <= warmup:
        return lr
    p = min(max((step - warmup) / (total - warmup), 0.0), 1.0)
    if kind == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))
    return lr - (lr - min_lr) * p


def train_reference(model, named, decays, c, tokens):
    """Trains `model` (parameters `named`, weight decay where decays(name)) as meshtrain does with config `c`:
    AdamW, clipping, the warmup + cosine schedule and gradient accumulation over the data windows. Returns the
    losses and gradient norms per step and the step-1 gradients."""
    groups = [{"params": [p for n, p in named.items() if decays(n)], "weight_decay": c["weight_decay"]},
              {"params": [p for n, p in named.items() if not decays(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"])
    n_micro = c["global_batch"] // c["micro_batch"]
    losses, norms, grads1 = [], [], None
    for step in range(1, c["steps"] + 1):
        opt.zero_grad(set_to_none=False)
        total = 0.0
        for m in range(n_micro):
            xs, ys = zip(*[window(tokens, step - 1, m * c["micro_batch"] + b, c["global_batch"], c["seq_len"])
                           for b in range(c["micro_batch"])])
            loss = model(torch.tensor(np.array(xs), dtype=torch.long), torch.tensor(np.array(ys), dtype=torch.long))
            (loss / n_micro).backward()
            total += loss.item() / n_micro
        if step == 1:
            grads1 = {n: p.grad.detach().double().numpy().copy() for n, p in named.items()}
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), c["grad_clip"]).item())
        for group in opt.param_groups:
            group["lr"] = lr_at(step, c["lr"], c["min_lr"], c["warmup"], c["steps"])
        opt.step()
        losses.append(total)
    return np.array(losses), np.array(norms), grads1


def window(tokens, step, g, global_batch, T):
    """docs/data.md, data.order = sequential."""
    o = ((step * global_batch + g) * T) % (len(tokens) - T - 1)
    return tokens[o:o + T], tokens[o + 1:o + T + 1]


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        blobs.append(arr.tobytes())
        offset += arr.nbytes
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=np.float32).reshape(info["shape"])
    return out


def write_llmc_shard(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())
