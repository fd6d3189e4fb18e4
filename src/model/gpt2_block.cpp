// The GPT-2 block: x -> x + attn(ln_1(x)) = h -> h + mlp(ln_2(h)), LayerNorms with biases, a GELU MLP of width 4C,
// every projection with a bias. Written in its tp = 1 reading; the layers (model/parallel_layers.h) make c_attn and
// c_fc column-parallel (by heads and hidden units) and both c_proj row-parallel. Shapes are this rank's: Cl = C / tp
// columns of each head-split projection, NHl = n_head / tp heads.
#include <string>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "model/block.h"
#include "model/ring_attention.h"

namespace mt {

namespace {

enum Slot { LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B, kSlots };

// The slots' parameter-name suffixes (GPT-2 Hugging Face names), in Slot order.
const char* const kSlotNames[] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                  "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                  "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
static_assert(sizeof(kSlotNames) / sizeof(kSlotNames[0]) == kSlots, "one name per slot");

class Gpt2Block final : public Block {
 public:
  Gpt2Block(const GPTConfig& cfg, const ParamTable& table, int layer)
      : recompute_(cfg.recompute), tag_(layer * kRingAttentionTags) {
    for (int s = 0; s < kSlots; ++s) params_.push_back(table.index_of(gpt2_layer_name(layer, s)));
    norm_in_ = make_norm(cfg, {P(LN1_W), P(LN1_B)});
    norm_post_ = make_norm(cfg, {P(LN2_W), P(LN2_B)});
  }

  LayerActivations alloc_record(const BlockAlloc& alloc, const GPT& m, int64_t B, int64_t T) const override {
    using LA = LayerActivations;
    const TensorSharding& sh = m.sharding();
    const int64_t N = B * T, C = m.config().d_model, Cl = sh.cols(C), NHl = sh.cols(m.config().n_head);
    const int64_t Ns = sh.rows(N);
    const DType dt = m.dtype(), acc = acc_dtype(dt);
    Arena& arena = alloc.arena;
    LayerActivations la;
    la.ln1 = alloc(&LA::ln1, Recompute::Light, {Ns, C}, dt);
    la.ln1_mean = arena.alloc({Ns}, acc);
    la.ln1_rstd = arena.alloc({Ns}, acc);
    la.qkv = arena.alloc({N, 3 * Cl}, dt);
    // cpu: the softmax probabilities [B, NH, T, T]; cuda: the flash kernel's log-sum-exp [B, NH, T] in fp32; under
    // context parallelism the ring's log-sum-exp.
    const ContextParallel cp = m.context_parallel();
    la.att = alloc(&LA::att, Recompute::Selective, attention_record_shape_cp(cp, m.device(), B, NHl, T),
                   attention_record_dtype_cp(cp, m.device(), dt));
    la.atty = arena.alloc({N, Cl}, dt);
    la.res_attn = arena.alloc({Ns, C}, dt);
    la.ln2 = alloc(&LA::ln2, Recompute::Light, {Ns, C}, dt);
    la.ln2_mean = arena.alloc({Ns}, acc);
    la.ln2_rstd = arena.alloc({Ns}, acc);
    la.fch = arena.alloc({N, 4 * Cl}, dt);
    la.fch_gelu = alloc(&LA::fch_gelu, Recompute::Light, {N, 4 * Cl}, dt);
    return la;
  }

  LayerOutputGrads alloc_kept(Arena& arena, const GPT& m, int64_t B, int64_t T) const override {
    const int64_t N = B * T, C = m.config().d_model, Cl = m.sharding().cols(C);
    LayerOutputGrads w;
    w.d_fcproj = arena.alloc({N, C}, m.dtype());
    w.dfch = arena.alloc({N, 4 * Cl}, m.dtype());
    w.d_attproj = arena.alloc({N, C}, m.dtype());
    w.dqkv = arena.alloc({N, 3 * Cl}, m.dtype());
    return w;
  }

  int64_t attention_temp_bytes(const GPT& m, int64_t B, int64_t T) const override {
    const int64_t Cl = m.sharding().cols(m.config().d_model);
    return mt::attention_temp_bytes(m.context_parallel(), true, B, T, Cl, Cl, m.sharding().cols(m.config().n_head),
                                    m.dtype());
  }

  void alloc_scratch(BlockScratch& s, Arena& arena, const GPT& m, const Activations& a, bool split) const override {
    const int64_t N = int64_t(a.B) * a.T, C = m.config().d_model, Cl = m.sharding().cols(C);
    const DType dt = m.dtype();
    s.datty = m.sharding().tp > 1 ? arena.alloc({N, Cl}, dt) : s.dln;  // c_proj's input gradient (local heads)
    s.dqkv = split ? Tensor() : arena.alloc({N, 3 * Cl}, dt);
    s.dfch = split ? Tensor() : arena.alloc({N, 4 * Cl}, dt);
    s.datt = arena.alloc(a.layers[0].att.shape(), m.grad_dtype());  // fp32 scratch
  }

  void forward(const BlockPass& p, LayerActivations& la, const Tensor& x, const Tensor& out) const override {
    forward_to_activation(p, la, x);
    row_linear_forward(p.tp, out, la.fch_gelu, p.a.sp_full, W(p, FCPROJ_W), W(p, FCPROJ_B));
  }

  void backward(const BlockPass& p, LayerActivations& la, const Tensor& x, const BlockScratch& s,
                LayerOutputGrads* kept, const ParamReady& ready) const override {
    const Activations& a = p.a;
    const TensorParallel& tp = p.tp;
    const int64_t Cl = local_width(p);
    const bool split = kept != nullptr;
    const Tensor none, &full = a.sp_full;
    // A weight's gradient in this pass, or (split) none: backward_weights computes it.
    auto G = [&](Slot slot) { return split ? none : p.grad(P(slot)); };
    recompute(p, la, x);
    // MLP branch: dres is d/d(block output) here.
    const Tensor dfch = split ? kept->dfch : s.dfch;
    const Tensor d_fcproj = row_linear_output_grad(tp, s.dres, s.dres_full);
    if (ready && !p.model.grads_over_params()) {  // the block's first gradients in the layout: their bucket can go now
      row_linear_backward(none, G(FCPROJ_W), G(FCPROJ_B), d_fcproj, la.fch_gelu, W(p, FCPROJ_W));
      ready(P(FCPROJ_B));
      row_linear_backward(dfch, none, none, d_fcproj, la.fch_gelu, W(p, FCPROJ_W));
    } else {  // (a gradient written over its weight comes after the weight's last read)
      row_linear_backward(dfch, G(FCPROJ_W), G(FCPROJ_B), d_fcproj, la.fch_gelu, W(p, FCPROJ_W));
      if (ready) ready(P(FCPROJ_B));
    }
    if (split) copy_convert(kept->d_fcproj, d_fcproj);
    kernels::gelu_backward(dfch, la.fch, dfch);
    column_linear_backward(tp, s.dln_full, s.dln, G(FC_W), G(FC_B), dfch, la.ln2, full, W(p, FC_W));
    norm_post_->backward(p, s.dres, s.dln, la.res_attn, {la.ln2, la.ln2_mean, la.ln2_rstd}, s.norm_scratch);
    if (ready) ready(P(LN2_B));  // the MLP half of the block: its buckets can start now
    // Attention branch: dres is now d/d(res_attn).
    const Tensor d_attproj = row_linear_output_grad(tp, s.dres, s.dres_full);
    row_linear_backward(s.datty, G(ATTPROJ_W), G(ATTPROJ_B), d_attproj, la.atty, W(p, ATTPROJ_W));
    if (ready) ready(P(ATTPROJ_B));
    if (split) copy_convert(kept->d_attproj, d_attproj);
    const Tensor dqkv = split ? kept->dqkv : s.dqkv;
    const Shape qkv_shape{a.B, a.T, 3 * Cl}, y_shape{a.B, a.T, Cl};
    if (recompute_ == Recompute::Selective)  // the probabilities again (atty is rewritten with its own values)
      packed_attention_forward(p.cp, la.atty.view(y_shape), la.att, la.qkv.view(qkv_shape), heads(p), tag_);
    packed_attention_backward(p.cp, dqkv.view(qkv_shape), s.datt, s.datty.view(y_shape), la.qkv.view(qkv_shape),
                              la.atty.view(y_shape), la.att, heads(p), tag_);
    column_linear_backward(tp, s.dln_full, s.dln, G(QKV_W), G(QKV_B), dqkv, la.ln1, full, W(p, QKV_W));
    norm_in_->backward(p, s.dres, s.dln, x, input_record(la), s.norm_scratch);
    if (ready) ready(P(LN1_B));  // the block's last parameter in the flat layout
  }

  void backward_weights(const BlockPass& p, const LayerActivations& la, const Tensor& x, const LayerOutputGrads& kept,
                        const ParamReady& ready) const override {
    const Tensor none, &full = p.a.sp_full;
    if (recompute_ == Recompute::Light) recompute(p, la, x);  // the input pass overwrote them
    row_linear_backward(none, p.grad(P(FCPROJ_W)), p.grad(P(FCPROJ_B)), kept.d_fcproj, la.fch_gelu, W(p, FCPROJ_W));
    if (ready) ready(P(FCPROJ_B));
    column_linear_backward(p.tp, none, none, p.grad(P(FC_W)), p.grad(P(FC_B)), kept.dfch, la.ln2, full, W(p, FC_W));
    if (ready) ready(P(LN2_B));
    row_linear_backward(none, p.grad(P(ATTPROJ_W)), p.grad(P(ATTPROJ_B)), kept.d_attproj, la.atty,
                        W(p, ATTPROJ_W));
    if (ready) ready(P(ATTPROJ_B));
    column_linear_backward(p.tp, none, none, p.grad(P(QKV_W)), p.grad(P(QKV_B)), kept.dqkv, la.ln1, full,
                           W(p, QKV_W));
    if (ready) ready(P(LN1_B));
  }

 protected:
  void forward_to_activation(const BlockPass& p, const LayerActivations& la, const Tensor& x) const override {
    const Activations& a = p.a;
    const int64_t Cl = local_width(p);
    const Tensor& full = a.sp_full;
    column_linear_forward(p.tp, la.qkv, la.ln1, full, W(p, QKV_W), W(p, QKV_B));
    packed_attention_forward(p.cp, la.atty.view({a.B, a.T, Cl}), la.att, la.qkv.view({a.B, a.T, 3 * Cl}), heads(p),
                             tag_);
    // c_proj writes into res_attn, then the skip connection is added in place (with ln_2).
    row_linear_forward(p.tp, la.res_attn, la.atty, full, W(p, ATTPROJ_W), W(p, ATTPROJ_B));
    norm_post_->add_forward(p, {la.ln2, la.ln2_mean, la.ln2_rstd}, la.res_attn, x);
    if (recompute_ == Recompute::Light) {
      // Unfused, so the backward's GELU again gives these values bit for bit (CUDA's fused epilogue rounds its own
      // way).
      column_linear_forward(p.tp, la.fch, la.ln2, full, W(p, FC_W), W(p, FC_B));
      kernels::gelu_forward(la.fch_gelu, la.fch);
    } else {
      column_linear_gelu_forward(p.tp, la.fch, la.fch_gelu, la.ln2, full, W(p, FC_W), W(p, FC_B));
    }
  }

  void activation_forward(const LayerActivations& la) const override { kernels::gelu_forward(la.fch_gelu, la.fch); }

 private:
  int P(Slot s) const { return params_[s]; }
  Tensor W(const BlockPass& p, Slot s) const { return p.param(params_[s]); }
  static int heads(const BlockPass& p) { return p.model.sharding().cols(p.model.config().n_head); }
  static int64_t local_width(const BlockPass& p) { return p.model.sharding().cols(p.model.config().d_model); }

  Recompute recompute_;
  int tag_;  // its ring attention's messages (context parallelism)
};

}  // namespace

std::string gpt2_layer_name(int l, int slot) { return "h." + std::to_string(l) + "." + kSlotNames[slot]; }

std::unique_ptr<Block> make_gpt2_block(const GPTConfig& cfg, const ParamTable& table, int layer) {
  return std::make_unique<Gpt2Block>(cfg, table, layer);
}

}  // namespace mt
