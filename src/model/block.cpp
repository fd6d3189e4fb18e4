// The norms and the blocks' construction (see model/block.h).
#include "model/block.h"

#include "kernels/elementwise.h"
#include "kernels/layernorm.h"
#include "kernels/rmsnorm.h"

namespace mt {

namespace {

// GPT-2's LayerNorm: weight and bias, eps 1e-5.
class LayerNorm final : public Norm {
 public:
  LayerNorm(int w, int b) : w_(w), b_(b) {}
  std::vector<int> params() const override { return {w_, b_}; }
  NormRecord alloc(Arena& arena, int64_t rows, int64_t C, DType dtype) const override {
    return {arena.alloc({rows, C}, dtype), arena.alloc({rows}, acc_dtype(dtype)), arena.alloc({rows}, acc_dtype(dtype))};
  }
  void forward(const BlockPass& p, const NormRecord& r, const Tensor& x) const override {
    kernels::layernorm_forward(r.y, r.mean, r.rstd, x, p.param(w_), p.param(b_));
  }
  void add_forward(const BlockPass& p, const NormRecord& r, const Tensor& x, const Tensor& skip) const override {
    kernels::residual_layernorm_forward(x, r.y, r.mean, r.rstd, x, skip, p.param(w_), p.param(b_));
  }
  void backward(const BlockPass& p, const Tensor& dx, const Tensor& dy, const Tensor& x, const NormRecord& r,
                const Tensor& scratch) const override {
    replicated_param_grads(p.tp, {p.grad(w_), p.grad(b_)}, scratch, [&](const std::vector<Tensor>& g) {
      kernels::layernorm_backward(dx, g[0], g[1], dy, x, p.param(w_), r.mean, r.rstd);
    }, p.model.grads_over_params());
  }
  Shape scratch_shape(int64_t C) const override { return {2, C}; }

 private:
  int w_, b_;
};

// Llama's RMSNorm: a weight, the model's eps. Its skip connection is added apart (no fused kernel).
class RMSNorm final : public Norm {
 public:
  RMSNorm(int w, double eps) : w_(w), eps_(eps) {}
  std::vector<int> params() const override { return {w_}; }
  NormRecord alloc(Arena& arena, int64_t rows, int64_t C, DType dtype) const override {
    NormRecord r;
    r.y = arena.alloc({rows, C}, dtype);
    r.rstd = arena.alloc({rows}, acc_dtype(dtype));
    return r;
  }
  void forward(const BlockPass& p, const NormRecord& r, const Tensor& x) const override {
    kernels::rmsnorm_forward(r.y, r.rstd, x, p.param(w_), eps_);
  }
  void add_forward(const BlockPass& p, const NormRecord& r, const Tensor& x, const Tensor& skip) const override {
    kernels::accumulate(x, skip);
    forward(p, r, x);
  }
  void backward(const BlockPass& p, const Tensor& dx, const Tensor& dy, const Tensor& x, const NormRecord& r,
                const Tensor& scratch) const override {
    replicated_param_grads(p.tp, {p.grad(w_)}, scratch, [&](const std::vector<Tensor>& g) {
      kernels::rmsnorm_backward(dx, g[0], dy, x, p.param(w_), r.rstd);
    }, p.model.grads_over_params());
  }
  Shape scratch_shape(int64_t C) const override { return {C}; }

 private:
  int w_;
  double eps_;
};

}  // namespace

std::unique_ptr<Norm> make_norm(const GPTConfig& cfg, std::vector<int> params) {
  if (cfg.llama()) return std::make_unique<RMSNorm>(params.at(0), cfg.norm_eps);
  return std::make_unique<LayerNorm>(params.at(0), params.at(1));
}

std::vector<std::unique_ptr<Block>> make_blocks(const GPTConfig& cfg, const ModelPart& part, const ParamTable& table,
                                                DType dtype, Device device) {
  // Llama with fewer kv heads than tp ranks: one scratch, shared by the blocks, sums the k and v gradients' copies.
  Tensor kv_sum;
  if (cfg.llama() && part.sharding.kv_copies(cfg.kv_heads()) > 1)
    kv_sum = Tensor::zeros({2 * int64_t(cfg.kv_heads()) * cfg.head_size() * cfg.d_model}, acc_dtype(dtype), device);
  std::vector<std::unique_ptr<Block>> blocks;
  for (int l = part.blocks.begin; l < part.blocks.end_in(cfg.n_layer); ++l)
    blocks.push_back(cfg.llama() ? make_llama_block(cfg, part.sharding, table, l, kv_sum)
                                 : make_gpt2_block(cfg, table, l));
  return blocks;
}

void Block::recompute(const BlockPass& p, const LayerActivations& la, const Tensor& x) const {
  const Recompute policy = p.model.config().recompute;
  if (policy == Recompute::Full) {
    norm_in_->forward(p, input_record(la), x);  // unfused: the same values as the forward's fused add
    forward_to_activation(p, la, x);
  } else if (policy == Recompute::Light) {
    norm_in_->forward(p, input_record(la), x);
    norm_post_->forward(p, {la.ln2, la.ln2_mean, la.ln2_rstd}, la.res_attn);
    activation_forward(la);
  }
}

}  // namespace mt
