"""A Llama in PyTorch, written from the paper and Hugging Face's layout and rotary convention (rotate_half: element i
of a head pairs with element i + HS/2), with torch ops only: the reference for meshtrain's Llama parity test."""
import torch
import torch.nn.functional as F


def llama_names(n_layer, tie):
    names = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if tie else ["lm_head.weight"])
    for l in range(n_layer):
        names += [f"model.layers.{l}.{n}" for n in (
            "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")]
    return names


def llama_shapes(c):
    C, HS = c["d_model"], c["d_model"] // c["n_head"]
    Q, KV, H, V = c["n_head"] * HS, c["n_kv_head"] * HS, c["ffn_hidden"], c["vocab_size"]
    shapes = {}
    for name in llama_names(c["n_layer"], c["tie"]):
        tail = name.split(".")[-2]
        shapes[name] = {"embed_tokens": (V, C), "lm_head": (V, C), "q_proj": (Q, C), "k_proj": (KV, C),
                        "v_proj": (KV, C), "o_proj": (C, Q), "gate_proj": (H, C), "up_proj": (H, C),
                        "down_proj": (C, H)}.get(tail, (C,))
    return shapes


class Llama(torch.nn.Module):
    def __init__(self, c, weights, dtype):
        super().__init__()
        self.c = c
        self.params = torch.nn.ParameterDict(
            {n.replace(".", "__"): torch.nn.Parameter(torch.tensor(weights[n], dtype=dtype)) for n in weights})

    def w(self, name):
        return self.params[name.replace(".", "__")]

    def named(self):
        return {k.replace("__", "."): v for k, v in self.params.items()}

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["norm_eps"]) * w

    def forward(self, idx, targets):
        return F.cross_entropy(self.logits(idx).reshape(-1, self.c["vocab_size"]), targets.reshape(-1))

    def logits(self, idx):
        c = self.c
        B, T = idx.shape
        NH, KV, C = c["n_head"], c["n_kv_head"], c["d_model"]
        HS = C // NH
        dtype = self.w("model.norm.weight").dtype
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS))
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)

        def rotate_half(x):
            x1, x2 = x[..., :HS // 2], x[..., HS // 2:]
            return torch.cat((-x2, x1), dim=-1)

        def rope(x):
            return x * cos + rotate_half(x) * sin

        x = self.w("model.embed_tokens.weight")[idx]
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        for l in range(c["n_layer"]):
            h = lambda n: self.w(f"model.layers.{l}.{n}")
            a = self.rms(x, h("input_layernorm.weight"))
            q = (a @ h("self_attn.q_proj.weight").t()).view(B, T, NH, HS).transpose(1, 2)
            k = (a @ h("self_attn.k_proj.weight").t()).view(B, T, KV, HS).transpose(1, 2)
            v = (a @ h("self_attn.v_proj.weight").t()).view(B, T, KV, HS).transpose(1, 2)
            q, k = rope(q), rope(k)
            k = k.repeat_interleave(NH // KV, dim=1)  # query head h reads kv head h // (NH / KV)
            v = v.repeat_interleave(NH // KV, dim=1)
            att = (q @ k.transpose(-2, -1)) / HS ** 0.5
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, NH * HS)
            x = x + y @ h("self_attn.o_proj.weight").t()
            m = self.rms(x, h("post_attention_layernorm.weight"))
            m = F.silu(m @ h("mlp.gate_proj.weight").t()) * (m @ h("mlp.up_proj.weight").t())
            x = x + m @ h("mlp.down_proj.weight").t()
        x = self.rms(x, self.w("model.norm.weight"))
        head = self.w("model.embed_tokens.weight") if c["tie"] else self.w("lm_head.weight")
        return x @ head.t()


def llama_decays(name):
    """meshtrain's rule: weight decay on matrices and embeddings, not on the norms."""
    return "norm" not in name
