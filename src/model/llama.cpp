// The Llama block family over the same machinery as GPT-2 (model/gpt.h): RMSNorm, rotary position embeddings,
// a SwiGLU MLP, grouped-query attention, no biases, an untied head unless model.tie_embeddings. Parameters carry
// Hugging Face's Llama names and layouts (projections [out, in], read as WeightLayout::OutIn), so safetensors in
// and out need no renaming. Each block is written in its tp = 1 reading; the layers (model/parallel_layers.h) make
// q, k, v, gate and up column-parallel (by heads, kv heads and hidden units) and o and down row-parallel.
#include <cmath>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gqa.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "model/gpt.h"

namespace mt {

using kernels::WeightLayout;

namespace {
const char* const kLlamaSlotNames[] = {"input_layernorm.weight",   "self_attn.q_proj.weight",
                                       "self_attn.k_proj.weight",  "self_attn.v_proj.weight",
                                       "self_attn.o_proj.weight",  "post_attention_layernorm.weight",
                                       "mlp.gate_proj.weight",     "mlp.up_proj.weight",
                                       "mlp.down_proj.weight"};
}  // namespace

std::string llama_layer_name(int l, int slot) {
  return "model.layers." + std::to_string(l) + "." + kLlamaSlotNames[slot];
}

ParamTable llama_param_table(const GPTConfig& cfg) {
  const int64_t C = cfg.d_model, HS = cfg.head_size(), Q = int64_t(cfg.n_head) * HS, KV = int64_t(cfg.kv_heads()) * HS;
  const int64_t H = cfg.mlp_hidden(), vp = padded_vocab(cfg.vocab_size, cfg.tp);
  const int tp = cfg.tp, r = cfg.tp_rank;
  // Weights are [out, in]: column-parallel splits dim 0 (outputs), row-parallel dim 1 (inputs).
  const Shard replicated{-1, tp, r, 1}, column{0, tp, r, 1}, row{1, tp, r, 1};
  // k and v by kv heads: column-parallel, or with fewer kv heads than tp ranks each head on tp / KV ranks (the
  // ranks whose query heads use it: consecutive query heads share a kv head).
  const int copies = cfg.kv_copies();
  const Shard kv_heads = copies == 1 ? column : Shard{0, tp / copies, r / copies, 1, copies, r % copies};
  ParamTable t;
  // Reverse order of use, as GPT-2's: the head's gradients are ready first, the embedding's last.
  if (cfg.last_stage()) {
    if (!cfg.tie_embeddings) t.add("lm_head.weight", {vp, C}, {cfg.vocab_size, C}, true, column);
    t.add("model.norm.weight", {C}, {C}, false, replicated);
  }
  for (int l = cfg.stage_end() - 1; l >= cfg.layer_begin; --l) {
    auto add = [&](int slot, Shape shape, bool decay, const Shard& shard) {
      t.add(llama_layer_name(l, slot), shape, shape, decay, shard);
    };
    add(8, {C, H}, true, row);              // mlp.down_proj
    add(7, {H, C}, true, column);           // mlp.up_proj
    add(6, {H, C}, true, column);           // mlp.gate_proj
    add(5, {C}, false, replicated);         // post_attention_layernorm
    add(4, {C, Q}, true, row);              // self_attn.o_proj
    add(3, {KV, C}, true, kv_heads);        // self_attn.v_proj
    add(2, {KV, C}, true, kv_heads);        // self_attn.k_proj
    add(1, {Q, C}, true, column);           // self_attn.q_proj
    add(0, {C}, false, replicated);         // input_layernorm
  }
  // The embedding on the first stage, and on the last too when the head is tied to it.
  if (cfg.first_stage() || (cfg.last_stage() && cfg.tie_embeddings))
    t.add("model.embed_tokens.weight", {vp, C}, {cfg.vocab_size, C}, true, column);
  return t;
}

void GPT::llama_alloc(Activations& a, Arena& arena, bool kept_grads) const {
  const int64_t N = int64_t(a.B) * a.T, HS = cfg_.head_size(), Cf = cfg_.d_model;
  const int64_t NHl = cfg_.n_head / cfg_.tp, KVl = cfg_.local_kv_heads(), Hl = cfg_.mlp_hidden() / cfg_.tp;
  const bool sp = sequence_parallel();
  const int64_t Ns = sp ? N / cfg_.tp : N;
  const DType acc = acc_dtype(dtype_);
  if (kept_grads) {
    a.wgrad.resize(a.layers.size());
    for (auto& w : a.wgrad) {
      w.d_fcproj = arena.alloc({N, Cf}, dtype_);   // down_proj
      w.d_attproj = arena.alloc({N, Cf}, dtype_);  // o_proj
      w.dq = arena.alloc({N, NHl * HS}, dtype_);
      w.dk = arena.alloc({N, KVl * HS}, dtype_);
      w.dv = arena.alloc({N, KVl * HS}, dtype_);
      w.dgate = arena.alloc({N, Hl}, dtype_);
      w.dup = arena.alloc({N, Hl}, dtype_);
    }
    return;
  }
  share_block_records(a, arena, [&](const BlockAlloc& alloc) {
    using LA = LayerActivations;
    LayerActivations la;
    la.ln1 = alloc(&LA::ln1, Recompute::Light, {Ns, Cf}, dtype_);
    la.ln1_rstd = arena.alloc({Ns}, acc);
    la.q = arena.alloc({N, NHl * HS}, dtype_);
    la.k = arena.alloc({N, KVl * HS}, dtype_);
    la.v = arena.alloc({N, KVl * HS}, dtype_);
    la.qkv = arena.alloc({N, 3 * NHl * HS}, dtype_);
    la.att = alloc(&LA::att, Recompute::Selective, kernels::attention_record_shape(device_, a.B, NHl, a.T),
                   device_ == Device::CUDA ? acc : dtype_);
    la.atty = arena.alloc({N, NHl * HS}, dtype_);
    la.res_attn = arena.alloc({Ns, Cf}, dtype_);
    la.ln2 = alloc(&LA::ln2, Recompute::Light, {Ns, Cf}, dtype_);
    la.ln2_rstd = arena.alloc({Ns}, acc);
    la.gate = arena.alloc({N, Hl}, dtype_);
    la.up = arena.alloc({N, Hl}, dtype_);
    la.swiglu = alloc(&LA::swiglu, Recompute::Light, {N, Hl}, dtype_);
    return la;
  });
  if (cfg_.last_stage()) {
    a.lnf = arena.alloc({Ns, Cf}, dtype_);
    a.lnf_rstd = arena.alloc({Ns}, acc);
  }
}

void GPT::llama_forward(Activations& a, double dloss, const Tensor& loss_sum,
                        const std::function<void(int64_t)>& params_needed) const {
  need_params(params_needed, 0);
  const TensorParallel tp = tensor_parallel();
  const int64_t N = int64_t(a.B) * a.T;
  const double eps = cfg_.norm_eps;
  const Tensor none, &full = a.sp_full;
  if (cfg_.first_stage())
    vocab_embedding_forward(tp, a.residual[0], full, a.tokens, param(wte_), none, vocab_begin(), vp_);
  const int L = cfg_.stage_layers();
  const bool last = cfg_.last_stage();
  kernels::rmsnorm_forward(a.layers[0].ln1, a.layers[0].ln1_rstd, a.residual[0], param(layer_param(0, IN_NORM)), eps);
  for (int l = 0; l < L; ++l) {
    LayerActivations& la = a.layers[l];
    const Tensor& out = a.residual[l + 1];
    need_block_params(params_needed, l);
    llama_block_forward(a, l, tp);
    row_linear_forward(tp, out, la.swiglu, full, param(layer_param(l, DOWN_W)), none, WeightLayout::OutIn);
    kernels::accumulate(out, la.res_attn);
    need_params(params_needed, l + 1);
    if (l + 1 < L)
      kernels::rmsnorm_forward(a.layers[l + 1].ln1, a.layers[l + 1].ln1_rstd, out,
                               param(layer_param(l + 1, IN_NORM)), eps);
    else if (last)
      kernels::rmsnorm_forward(a.lnf, a.lnf_rstd, out, param(lnf_w_), eps);
  }
  if (!last) return;
  column_linear_forward(tp, a.logits, a.lnf, full, param(head_), none, WeightLayout::OutIn);
  vocab_cross_entropy(tp, a.losses, a.logits, a.targets.view({N}), a.xent_max, a.xent_stats, vocab_begin(),
                      cfg_.vocab_size, dloss);
  if (loss_sum.defined()) kernels::sum_accumulate(loss_sum, a.losses);
}

void GPT::llama_block_forward(Activations& a, int l, const TensorParallel& tp) const {
  const int64_t HS = cfg_.head_size();
  const int NHl = cfg_.n_head / cfg_.tp, KVl = cfg_.local_kv_heads();
  const double theta = cfg_.rope_theta;
  const Tensor& full = a.sp_full;
  LayerActivations& la = a.layers[l];
  auto P = [&](LlamaSlot s) { return param(layer_param(l, s)); };
  // Attention: h = x + o(attention(rope(q), rope(k), v)) of the normed x.
  column_linears_forward(tp, {la.q, la.k, la.v}, la.ln1, full, {P(Q_W), P(K_W), P(V_W)}, WeightLayout::OutIn);
  kernels::rope_forward(la.q, a.T, HS, theta, 0, NHl * HS);
  kernels::rope_forward(la.k, a.T, HS, theta, 0, KVl * HS);
  kernels::gqa_expand(la.qkv, la.q, la.k, la.v, NHl, KVl, int(HS));
  kernels::attention_forward(la.atty.view({a.B, a.T, NHl * HS}), la.att, la.qkv.view({a.B, a.T, 3 * NHl * HS}), NHl);
  row_linear_forward(tp, la.res_attn, la.atty, full, P(O_W), Tensor(), WeightLayout::OutIn);
  kernels::accumulate(la.res_attn, a.residual[l]);
  // MLP: out = h + down(silu(gate) * up) of the normed h; the down projection is the caller's.
  kernels::rmsnorm_forward(la.ln2, la.ln2_rstd, la.res_attn, P(POST_NORM), cfg_.norm_eps);
  column_linears_forward(tp, {la.gate, la.up}, la.ln2, full, {P(GATE_W), P(UP_W)}, WeightLayout::OutIn);
  kernels::swiglu_forward(la.swiglu, la.gate, la.up);
}

void GPT::llama_backward(Activations& a, Arena& arena, const std::function<void(int64_t)>& ready, bool split,
                         const Tensor& dout, const Tensor& dinput, const ParamsNeeded& params_needed) {
  const TensorParallel tp = tensor_parallel();
  const bool sp = tp.sp(), first = cfg_.first_stage(), last = cfg_.last_stage();
  const int L = cfg_.stage_layers();
  const int64_t N = int64_t(a.B) * a.T, C = cfg_.d_model, HS = cfg_.head_size();
  const int NHl = cfg_.n_head / cfg_.tp, KVl = cfg_.local_kv_heads();
  const int64_t Hl = cfg_.mlp_hidden() / cfg_.tp, Ns = sp ? N / cfg_.tp : N;
  const double theta = cfg_.rope_theta;
  const Tensor none, &full = a.sp_full;
  Tensor dres = arena.alloc({Ns, C}, dtype_);
  Tensor dln = arena.alloc({Ns, C}, dtype_);
  Tensor dln_full = sp ? arena.alloc({N, C}, dtype_) : dln;
  Tensor dres_full = sp ? arena.alloc({N, C}, dtype_) : dres;
  Tensor dx_part = arena.alloc({N, C}, dtype_);  // one projection's share of a shared input's gradient
  Tensor datty = arena.alloc({N, NHl * HS}, dtype_);
  Tensor dqkv = arena.alloc({N, 3 * NHl * HS}, dtype_);
  Tensor dswiglu = arena.alloc({N, Hl}, dtype_);
  Tensor dq = split ? Tensor() : arena.alloc({N, NHl * HS}, dtype_);
  Tensor dk = split ? Tensor() : arena.alloc({N, KVl * HS}, dtype_);
  Tensor dv = split ? Tensor() : arena.alloc({N, KVl * HS}, dtype_);
  Tensor dgate = split ? Tensor() : arena.alloc({N, Hl}, dtype_);
  Tensor dup = split ? Tensor() : arena.alloc({N, Hl}, dtype_);
  Tensor datt = arena.alloc(a.layers.empty() ? Shape{1} : a.layers[0].att.shape(), grad_dtype());
  Tensor norm_grad = sp ? arena.alloc({C}, grad_dtype()) : Tensor();

  auto norm_backward = [&](int w, const Tensor& inp, const Tensor& rstd) {
    replicated_param_grads(tp, {grad(w)}, norm_grad, [&](const std::vector<Tensor>& g) {
      kernels::rmsnorm_backward(dres, g[0], dln, inp, param(w), rstd);
    });
  };
  auto G = [&](int p) { return split ? none : grad(p); };

  zero_(dres);
  if (last) {
    backward_needs_param(params_needed, lnf_w_);
    backward_needs_param(params_needed, head_);
    column_linear_backward(tp, dln_full, dln, G(head_), none, a.logits, a.lnf, full, param(head_),
                           WeightLayout::OutIn);
    norm_backward(lnf_w_, a.residual[L], a.lnf_rstd);
    ready_through(lnf_w_, ready);
  } else {
    kernels::accumulate(dres, dout);
  }
  for (int l = L - 1; l >= 0; --l) {
    LayerActivations& la = a.layers[l];
    LayerOutputGrads* kept = split ? &a.wgrad[l] : nullptr;
    auto P = [&](LlamaSlot s) { return layer_param(l, s); };
    backward_needs_block(params_needed, l);
    if (cfg_.recompute == Recompute::Full) {  // the block's forward again from its kept input
      kernels::rmsnorm_forward(la.ln1, la.ln1_rstd, a.residual[l], param(P(IN_NORM)), cfg_.norm_eps);
      llama_block_forward(a, l, tp);
    }
    if (cfg_.recompute == Recompute::Light) llama_recompute_light(a, l);
    // MLP branch: dres is d/d(block output).
    const Tensor d_down = row_linear_output_grad(tp, dres, dres_full);
    row_linear_backward(dswiglu, G(P(DOWN_W)), none, d_down, la.swiglu, param(P(DOWN_W)), WeightLayout::OutIn);
    if (split) copy_convert(kept->d_fcproj, d_down);
    const Tensor dgate_l = split ? kept->dgate : dgate, dup_l = split ? kept->dup : dup;
    kernels::swiglu_backward(dgate_l, dup_l, dswiglu, la.gate, la.up);
    column_linears_backward(tp, dln_full, dln, dx_part, {G(P(GATE_W)), G(P(UP_W))}, {dgate_l, dup_l}, la.ln2, full,
                            {param(P(GATE_W)), param(P(UP_W))}, WeightLayout::OutIn);
    norm_backward(P(POST_NORM), la.res_attn, la.ln2_rstd);
    ready_through(P(POST_NORM), ready);
    // Attention branch: dres is d/d(h).
    const Tensor d_o = row_linear_output_grad(tp, dres, dres_full);
    row_linear_backward(datty, G(P(O_W)), none, d_o, la.atty, param(P(O_W)), WeightLayout::OutIn);
    if (split) copy_convert(kept->d_attproj, d_o);
    if (cfg_.recompute == Recompute::Selective)  // the probabilities again (atty is rewritten with its own values)
      kernels::attention_forward(la.atty.view({a.B, a.T, NHl * HS}), la.att, la.qkv.view({a.B, a.T, 3 * NHl * HS}),
                                 NHl);
    kernels::attention_backward(dqkv.view({a.B, a.T, 3 * NHl * HS}), datt, datty.view({a.B, a.T, NHl * HS}),
                                la.qkv.view({a.B, a.T, 3 * NHl * HS}), la.atty.view({a.B, a.T, NHl * HS}), la.att,
                                NHl);
    const Tensor dq_l = split ? kept->dq : dq, dk_l = split ? kept->dk : dk, dv_l = split ? kept->dv : dv;
    kernels::gqa_reduce(dq_l, dk_l, dv_l, dqkv, NHl, KVl, int(HS));
    kernels::rope_backward(dq_l, a.T, HS, theta, 0, NHl * HS);
    kernels::rope_backward(dk_l, a.T, HS, theta, 0, KVl * HS);
    if (split) {
      column_linears_backward(tp, dln_full, dln, dx_part, {none, none, none}, {dq_l, dk_l, dv_l}, la.ln1, full,
                              {param(P(Q_W)), param(P(K_W)), param(P(V_W))}, WeightLayout::OutIn);
    } else {
      kv_weight_grads(l, tp, [&](const Tensor& dk_w, const Tensor& dv_w) {
        column_linears_backward(tp, dln_full, dln, dx_part, {grad(P(Q_W)), dk_w, dv_w}, {dq_l, dk_l, dv_l}, la.ln1,
                                full, {param(P(Q_W)), param(P(K_W)), param(P(V_W))}, WeightLayout::OutIn);
      });
    }
    norm_backward(P(IN_NORM), a.residual[l], la.ln1_rstd);
    ready_through(P(IN_NORM), ready);
  }
  if (!first) {
    copy_convert(dinput, dres);
  } else {
    const Tensor demb = tp.gather_rows(dres, dres_full);
    if (split) copy_convert(a.demb, demb);
    else vocab_embedding_backward(tp, grad(wte_), none, demb, a.tokens, vocab_begin(), vp_);
  }
  if (ready) ready(table_.total_numel());
}

void GPT::llama_recompute_light(Activations& a, int l) const {
  const LayerActivations& la = a.layers[l];
  kernels::rmsnorm_forward(la.ln1, la.ln1_rstd, a.residual[l], param(layer_param(l, IN_NORM)), cfg_.norm_eps);
  kernels::rmsnorm_forward(la.ln2, la.ln2_rstd, la.res_attn, param(layer_param(l, POST_NORM)), cfg_.norm_eps);
  kernels::swiglu_forward(la.swiglu, la.gate, la.up);
}

void GPT::kv_weight_grads(int l, const TensorParallel& tp,
                          const std::function<void(const Tensor&, const Tensor&)>& compute) {
  const int k = layer_param(l, K_W), v = layer_param(l, V_W);
  if (!kv_sum_.defined()) return compute(grad(k), grad(v));
  // Each part (kv head) in its own slot, zero elsewhere: one all-reduce over tp sums every head's copies at once.
  const ParamSpec& s = table_[k];
  const int64_t n = s.numel(), parts = s.shard.parts, at = s.shard.part * n;
  const Tensor dk_w = kv_sum_.slice(at, s.shape), dv_w = kv_sum_.slice(parts * n + at, s.shape);
  zero_(kv_sum_);
  compute(dk_w, dv_w);
  tp.comm().all_reduce(kv_sum_, ReduceOp::Sum);
  kernels::accumulate(grad(k), dk_w);
  kernels::accumulate(grad(v), dv_w);
}

void GPT::llama_backward_weights(Activations& a, const std::function<void(int64_t)>& grads_ready,
                                 const ParamsNeeded& params_needed) {
  const TensorParallel tp = tensor_parallel();
  const Tensor none, &full = a.sp_full;
  if (cfg_.last_stage()) {
    column_linear_backward(tp, none, none, grad(head_), none, a.logits, a.lnf, full, param(head_),
                           WeightLayout::OutIn);
    ready_through(lnf_w_, grads_ready);
  }
  for (int l = cfg_.stage_layers() - 1; l >= 0; --l) {
    const LayerActivations& la = a.layers[l];
    const LayerOutputGrads& kept = a.wgrad[l];
    auto P = [&](LlamaSlot s) { return layer_param(l, s); };
    if (cfg_.recompute == Recompute::Light) backward_needs_block(params_needed, l);  // its norms' outputs again
    if (cfg_.recompute == Recompute::Light) llama_recompute_light(a, l);  // the input pass overwrote them
    row_linear_backward(none, grad(P(DOWN_W)), none, kept.d_fcproj, la.swiglu, param(P(DOWN_W)), WeightLayout::OutIn);
    column_linears_backward(tp, none, none, none, {grad(P(GATE_W)), grad(P(UP_W))}, {kept.dgate, kept.dup}, la.ln2,
                            full, {param(P(GATE_W)), param(P(UP_W))}, WeightLayout::OutIn);
    ready_through(P(POST_NORM), grads_ready);
    row_linear_backward(none, grad(P(O_W)), none, kept.d_attproj, la.atty, param(P(O_W)), WeightLayout::OutIn);
    kv_weight_grads(l, tp, [&](const Tensor& dk_w, const Tensor& dv_w) {
      column_linears_backward(tp, none, none, none, {grad(P(Q_W)), dk_w, dv_w}, {kept.dq, kept.dk, kept.dv}, la.ln1,
                              full, {param(P(Q_W)), param(P(K_W)), param(P(V_W))}, WeightLayout::OutIn);
    });
    ready_through(P(IN_NORM), grads_ready);
  }
  if (cfg_.first_stage()) vocab_embedding_backward(tp, grad(wte_), none, a.demb, a.tokens, vocab_begin(), vp_);
  if (grads_ready) grads_ready(table_.total_numel());
}

}  // namespace mt
