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
#include "model/block.h"
#include "model/ring_attention.h"

namespace mt {

using kernels::WeightLayout;

namespace {

enum LlamaSlot { IN_NORM, Q_W, K_W, V_W, O_W, POST_NORM, GATE_W, UP_W, DOWN_W, kLlamaSlots };

// The slots' parameter-name suffixes (Hugging Face's Llama names), in LlamaSlot order.
const char* const kLlamaSlotNames[] = {"input_layernorm.weight",   "self_attn.q_proj.weight",
                                       "self_attn.k_proj.weight",  "self_attn.v_proj.weight",
                                       "self_attn.o_proj.weight",  "post_attention_layernorm.weight",
                                       "mlp.gate_proj.weight",     "mlp.up_proj.weight",
                                       "mlp.down_proj.weight"};
static_assert(sizeof(kLlamaSlotNames) / sizeof(kLlamaSlotNames[0]) == kLlamaSlots, "one name per slot");
}  // namespace

std::string llama_layer_name(int l, int slot) {
  return "model.layers." + std::to_string(l) + "." + kLlamaSlotNames[slot];
}

ParamTable llama_param_table(const GPTConfig& cfg, const ModelPart& part) {
  const BlockSlice& blocks = part.blocks;  // resolved by gpt_param_table
  const int64_t C = cfg.d_model, HS = cfg.head_size(), Q = int64_t(cfg.n_head) * HS, KV = int64_t(cfg.kv_heads()) * HS;
  const int64_t H = cfg.mlp_hidden(), vp = padded_vocab(cfg.vocab_size, part.sharding.tp);
  const int tp = part.sharding.tp, r = part.sharding.rank;
  // Weights are [out, in]: column-parallel splits dim 0 (outputs), row-parallel dim 1 (inputs).
  const Shard replicated{-1, tp, r, 1}, column{0, tp, r, 1}, row{1, tp, r, 1};
  // k and v by kv heads: column-parallel, or with fewer kv heads than tp ranks each head on tp / KV ranks (the
  // ranks whose query heads use it: consecutive query heads share a kv head).
  const int copies = part.sharding.kv_copies(cfg.kv_heads());
  const Shard kv_heads = copies == 1 ? column : Shard{0, tp / copies, r / copies, 1, copies, r % copies};
  ParamTable t;
  // Reverse order of use, as GPT-2's: the head's gradients are ready first, the embedding's last.
  const bool first = blocks.first(), last = blocks.last(cfg.n_layer);
  if (last) {
    if (!cfg.tie_embeddings) t.add("lm_head.weight", {vp, C}, {cfg.vocab_size, C}, true, column);
    t.add("model.norm.weight", {C}, {C}, false, replicated);
  }
  for (int l = blocks.end - 1; l >= blocks.begin; --l) {
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
  if (first || (last && cfg.tie_embeddings))
    t.add("model.embed_tokens.weight", {vp, C}, {cfg.vocab_size, C}, true, column);
  return t;
}

namespace {

class LlamaBlock final : public Block {
 public:
  LlamaBlock(const GPTConfig& cfg, const TensorSharding& sharding, const ParamTable& table, int layer,
             const Tensor& kv_sum)
      : recompute_(cfg.recompute), theta_(cfg.rope_theta), hs_(cfg.head_size()), heads_(sharding.cols(cfg.n_head)),
        kv_heads_(sharding.kv_heads(cfg.kv_heads())), tag_(layer * kRingAttentionTags), kv_sum_(kv_sum) {
    for (int s = 0; s < kLlamaSlots; ++s) params_.push_back(table.index_of(llama_layer_name(layer, s)));
    norm_in_ = make_norm(cfg, {P(IN_NORM)});
    norm_post_ = make_norm(cfg, {P(POST_NORM)});
  }

  LayerActivations alloc_record(const BlockAlloc& alloc, const GPT& m, int64_t B, int64_t T) const override {
    using LA = LayerActivations;
    const int64_t N = B * T, C = m.config().d_model, Hl = m.sharding().cols(m.config().mlp_hidden());
    const int64_t Ns = m.sharding().rows(N);
    const DType dt = m.dtype(), acc = acc_dtype(dt);
    Arena& arena = alloc.arena;
    LayerActivations la;
    la.ln1 = alloc(&LA::ln1, Recompute::Light, {Ns, C}, dt);
    la.ln1_rstd = arena.alloc({Ns}, acc);
    la.q = arena.alloc({N, heads_ * hs_}, dt);
    la.k = arena.alloc({N, kv_heads_ * hs_}, dt);
    la.v = arena.alloc({N, kv_heads_ * hs_}, dt);
    la.qkv = arena.alloc({N, 3 * heads_ * hs_}, dt);
    const ContextParallel cp = m.context_parallel();
    la.att = alloc(&LA::att, Recompute::Selective, attention_record_shape_cp(cp, m.device(), B, heads_, T),
                   attention_record_dtype_cp(cp, m.device(), dt));
    la.atty = arena.alloc({N, heads_ * hs_}, dt);
    la.res_attn = arena.alloc({Ns, C}, dt);
    la.ln2 = alloc(&LA::ln2, Recompute::Light, {Ns, C}, dt);
    la.ln2_rstd = arena.alloc({Ns}, acc);
    la.gate = arena.alloc({N, Hl}, dt);
    la.up = arena.alloc({N, Hl}, dt);
    la.swiglu = alloc(&LA::swiglu, Recompute::Light, {N, Hl}, dt);
    return la;
  }

  LayerOutputGrads alloc_kept(Arena& arena, const GPT& m, int64_t B, int64_t T) const override {
    const int64_t N = B * T, C = m.config().d_model, Hl = m.sharding().cols(m.config().mlp_hidden());
    const DType dt = m.dtype();
    LayerOutputGrads w;
    w.d_fcproj = arena.alloc({N, C}, dt);   // down_proj
    w.d_attproj = arena.alloc({N, C}, dt);  // o_proj
    w.dq = arena.alloc({N, heads_ * hs_}, dt);
    w.dk = arena.alloc({N, kv_heads_ * hs_}, dt);
    w.dv = arena.alloc({N, kv_heads_ * hs_}, dt);
    w.dgate = arena.alloc({N, Hl}, dt);
    w.dup = arena.alloc({N, Hl}, dt);
    return w;
  }

  int64_t attention_temp_bytes(const GPT& m, int64_t B, int64_t T) const override {
    return mt::attention_temp_bytes(m.context_parallel(), false, B, T, heads_ * hs_, kv_heads_ * hs_, int(heads_),
                                    m.dtype());
  }

  void alloc_scratch(BlockScratch& s, Arena& arena, const GPT& m, const Activations& a, bool split) const override {
    const int64_t N = int64_t(a.B) * a.T, C = m.config().d_model, Hl = m.sharding().cols(m.config().mlp_hidden());
    const DType dt = m.dtype();
    s.dx_part = arena.alloc({N, C}, dt);  // one projection's share of a shared input's gradient
    s.datty = arena.alloc({N, heads_ * hs_}, dt);
    s.dqkv = arena.alloc({N, 3 * heads_ * hs_}, dt);
    s.dswiglu = arena.alloc({N, Hl}, dt);
    s.dq = split ? Tensor() : arena.alloc({N, heads_ * hs_}, dt);
    s.dk = split ? Tensor() : arena.alloc({N, kv_heads_ * hs_}, dt);
    s.dv = split ? Tensor() : arena.alloc({N, kv_heads_ * hs_}, dt);
    s.dgate = split ? Tensor() : arena.alloc({N, Hl}, dt);
    s.dup = split ? Tensor() : arena.alloc({N, Hl}, dt);
    s.datt = arena.alloc(a.layers[0].att.shape(), m.grad_dtype());
  }

  void forward(const BlockPass& p, LayerActivations& la, const Tensor& x, const Tensor& out) const override {
    forward_to_activation(p, la, x);
    row_linear_forward(p.tp, out, la.swiglu, p.a.sp_full, W(p, DOWN_W), Tensor(), WeightLayout::OutIn);
  }

  void backward(const BlockPass& p, LayerActivations& la, const Tensor& x, const BlockScratch& s,
                LayerOutputGrads* kept, const ParamReady& ready) const override {
    const Activations& a = p.a;
    const TensorParallel& tp = p.tp;
    const bool split = kept != nullptr;
    const Tensor none, &full = a.sp_full;
    auto G = [&](LlamaSlot slot) { return split ? none : p.grad(P(slot)); };
    recompute(p, la, x);
    // MLP branch: dres is d/d(block output).
    const Tensor d_down = row_linear_output_grad(tp, s.dres, s.dres_full);
    if (ready && !p.model.grads_over_params()) {  // the block's first gradient in the layout: its bucket can go now
      row_linear_backward(none, G(DOWN_W), none, d_down, la.swiglu, W(p, DOWN_W), WeightLayout::OutIn);
      ready(P(DOWN_W));
      row_linear_backward(s.dswiglu, none, none, d_down, la.swiglu, W(p, DOWN_W), WeightLayout::OutIn);
    } else {  // (a gradient written over its weight comes after the weight's last read)
      row_linear_backward(s.dswiglu, G(DOWN_W), none, d_down, la.swiglu, W(p, DOWN_W), WeightLayout::OutIn);
      if (ready) ready(P(DOWN_W));
    }
    if (split) copy_convert(kept->d_fcproj, d_down);
    const Tensor dgate = split ? kept->dgate : s.dgate, dup = split ? kept->dup : s.dup;
    kernels::swiglu_backward(dgate, dup, s.dswiglu, la.gate, la.up);
    column_linears_backward(tp, s.dln_full, s.dln, s.dx_part, {G(GATE_W), G(UP_W)}, {dgate, dup}, la.ln2, full,
                            {W(p, GATE_W), W(p, UP_W)}, WeightLayout::OutIn);
    norm_post_->backward(p, s.dres, s.dln, la.res_attn, {la.ln2, la.ln2_mean, la.ln2_rstd}, s.norm_scratch);
    if (ready) ready(P(POST_NORM));
    // Attention branch: dres is d/d(h).
    const Tensor d_o = row_linear_output_grad(tp, s.dres, s.dres_full);
    row_linear_backward(s.datty, G(O_W), none, d_o, la.atty, W(p, O_W), WeightLayout::OutIn);
    if (ready) ready(P(O_W));
    if (split) copy_convert(kept->d_attproj, d_o);
    const Tensor dq = split ? kept->dq : s.dq, dk = split ? kept->dk : s.dk, dv = split ? kept->dv : s.dv;
    if (recompute_ == Recompute::Selective)  // the probabilities again (atty is rewritten with its own values)
      attention_forward(p, la);
    gqa_attention_backward(p.cp, q3(a, dq), kv3(a, dk), kv3(a, dv), s.dqkv.view(qkv3(a)), s.datt, q3(a, s.datty),
                           la.qkv.view(qkv3(a)), q3(a, la.q), kv3(a, la.k), kv3(a, la.v), q3(a, la.atty), la.att,
                           int(heads_), int(kv_heads_), tag_);
    rope_backward_cp(p.cp, dq, a.T, hs_, theta_, 0, heads_ * hs_);
    rope_backward_cp(p.cp, dk, a.T, hs_, theta_, 0, kv_heads_ * hs_);
    if (split) {
      column_linears_backward(tp, s.dln_full, s.dln, s.dx_part, {none, none, none}, {dq, dk, dv}, la.ln1, full,
                              {W(p, Q_W), W(p, K_W), W(p, V_W)}, WeightLayout::OutIn);
    } else {
      kv_weight_grads(p, [&](const Tensor& dk_w, const Tensor& dv_w) {
        column_linears_backward(tp, s.dln_full, s.dln, s.dx_part, {p.grad(P(Q_W)), dk_w, dv_w}, {dq, dk, dv}, la.ln1,
                                full, {W(p, Q_W), W(p, K_W), W(p, V_W)}, WeightLayout::OutIn);
      });
    }
    norm_in_->backward(p, s.dres, s.dln, x, input_record(la), s.norm_scratch);
    if (ready) ready(P(IN_NORM));
  }

  void backward_weights(const BlockPass& p, const LayerActivations& la, const Tensor& x, const LayerOutputGrads& kept,
                        const ParamReady& ready) const override {
    const Tensor none, &full = p.a.sp_full;
    if (recompute_ == Recompute::Light) recompute(p, la, x);  // the input pass overwrote them
    row_linear_backward(none, p.grad(P(DOWN_W)), none, kept.d_fcproj, la.swiglu, W(p, DOWN_W), WeightLayout::OutIn);
    if (ready) ready(P(DOWN_W));
    column_linears_backward(p.tp, none, none, none, {p.grad(P(GATE_W)), p.grad(P(UP_W))}, {kept.dgate, kept.dup},
                            la.ln2, full, {W(p, GATE_W), W(p, UP_W)}, WeightLayout::OutIn);
    if (ready) ready(P(POST_NORM));
    row_linear_backward(none, p.grad(P(O_W)), none, kept.d_attproj, la.atty, W(p, O_W), WeightLayout::OutIn);
    if (ready) ready(P(O_W));
    kv_weight_grads(p, [&](const Tensor& dk_w, const Tensor& dv_w) {
      column_linears_backward(p.tp, none, none, none, {p.grad(P(Q_W)), dk_w, dv_w}, {kept.dq, kept.dk, kept.dv},
                              la.ln1, full, {W(p, Q_W), W(p, K_W), W(p, V_W)}, WeightLayout::OutIn);
    });
    if (ready) ready(P(IN_NORM));
  }

 protected:
  // Attention: h = x + o(attention(rope(q), rope(k), v)) of the normed x; then the MLP's normed input and its
  // activation silu(gate) * up (the down projection is forward()'s).
  void forward_to_activation(const BlockPass& p, const LayerActivations& la, const Tensor& x) const override {
    const Activations& a = p.a;
    const Tensor& full = a.sp_full;
    column_linears_forward(p.tp, {la.q, la.k, la.v}, la.ln1, full, {W(p, Q_W), W(p, K_W), W(p, V_W)},
                           WeightLayout::OutIn);
    rope_forward_cp(p.cp, la.q, a.T, hs_, theta_, 0, heads_ * hs_);
    rope_forward_cp(p.cp, la.k, a.T, hs_, theta_, 0, kv_heads_ * hs_);
    attention_forward(p, la);
    row_linear_forward(p.tp, la.res_attn, la.atty, full, W(p, O_W), Tensor(), WeightLayout::OutIn);
    norm_post_->add_forward(p, {la.ln2, la.ln2_mean, la.ln2_rstd}, la.res_attn, x);
    column_linears_forward(p.tp, {la.gate, la.up}, la.ln2, full, {W(p, GATE_W), W(p, UP_W)}, WeightLayout::OutIn);
    kernels::swiglu_forward(la.swiglu, la.gate, la.up);
  }

  void activation_forward(const LayerActivations& la) const override {
    kernels::swiglu_forward(la.swiglu, la.gate, la.up);
  }

 private:
  int P(LlamaSlot s) const { return params_[s]; }
  Tensor W(const BlockPass& p, LlamaSlot s) const { return p.param(params_[s]); }
  // [N, W] tensors as [B, T, W]: the query-width ones, the kv-width ones, the expanded q|k|v.
  Tensor q3(const Activations& a, const Tensor& t) const { return t.view({a.B, a.T, heads_ * hs_}); }
  Tensor kv3(const Activations& a, const Tensor& t) const { return t.view({a.B, a.T, kv_heads_ * hs_}); }
  Shape qkv3(const Activations& a) const { return {a.B, a.T, 3 * heads_ * hs_}; }
  // Attention of the rotated q and k and of v into la.atty (expanded into la.qkv for the one-rank kernel).
  void attention_forward(const BlockPass& p, const LayerActivations& la) const {
    const Activations& a = p.a;
    gqa_attention_forward(p.cp, q3(a, la.atty), la.att, la.qkv.view(qkv3(a)), q3(a, la.q), kv3(a, la.k), kv3(a, la.v),
                          int(heads_), int(kv_heads_), tag_);
  }

  // The k and v weight gradients: compute(dk_w, dv_w) accumulates into them. With n_kv_head < tp each copy of a kv
  // head sees only its query heads' share, so compute() writes this micro-batch's into kv_sum_, the copies' shares
  // are summed over tp there, then accumulated into the gradients (summing those would count earlier micro-batches
  // once per copy).
  void kv_weight_grads(const BlockPass& p, const std::function<void(const Tensor&, const Tensor&)>& compute) const {
    const int k = P(K_W), v = P(V_W);
    if (!kv_sum_.defined()) return compute(p.grad(k), p.grad(v));
    // Each part (kv head) in its own slot of kv_sum_.
    const ParamSpec& s = p.model.table()[k];
    const int64_t n = s.numel(), parts = s.shard.parts, at = s.shard.part * n;
    copied_param_grads(p.tp, {p.grad(k), p.grad(v)}, {kv_sum_.slice(at, s.shape), kv_sum_.slice(parts * n + at, s.shape)},
                       kv_sum_, [&](const std::vector<Tensor>& g) { compute(g[0], g[1]); },
                       p.model.grads_over_params());
  }

  Recompute recompute_;
  double theta_;
  int64_t hs_, heads_, kv_heads_;  // head size, this rank's query and kv heads
  int tag_;                        // its ring attention's messages (context parallelism)
  Tensor kv_sum_;                  // with n_kv_head < tp: [2, KV, HS x C] in the gradients' dtype, else undefined
};

}  // namespace

std::unique_ptr<Block> make_llama_block(const GPTConfig& cfg, const TensorSharding& sharding, const ParamTable& table,
                                        int layer, const Tensor& kv_sum) {
  return std::make_unique<LlamaBlock>(cfg, sharding, table, layer, kv_sum);
}

}  // namespace mt
