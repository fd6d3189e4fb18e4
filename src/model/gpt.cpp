// GPT-2 forward and backward over one micro-batch, built from the kernels in src/kernels.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>

#include "core/philox.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "model/parallel_layers.h"

namespace mt {

using kernels::WeightLayout;

int padded_vocab(int vocab_size, int tp) {
  const int align = kVocabAlign * tp;
  return (vocab_size + align - 1) / align * align;
}

namespace {

GPTConfig checked(const GPTConfig& cfg) {
  CHECK(cfg.tp >= 1 && cfg.tp_rank >= 0 && cfg.tp_rank < cfg.tp, "tp_rank {} out of range for tp {}", cfg.tp_rank,
        cfg.tp);
  CHECK(cfg.n_head % cfg.tp == 0, "n_head {} is not divisible by tp {}", cfg.n_head, cfg.tp);
  CHECK(cfg.mlp_hidden() % cfg.tp == 0, "the MLP width {} is not divisible by tp {}", cfg.mlp_hidden(), cfg.tp);
  CHECK(cfg.d_model % cfg.n_head == 0, "d_model {} is not divisible by n_head {}", cfg.d_model, cfg.n_head);
  CHECK(!cfg.llama() || (cfg.n_head % cfg.kv_heads() == 0 &&
                         (cfg.kv_heads() % cfg.tp == 0 || cfg.tp % cfg.kv_heads() == 0) && cfg.head_size() % 2 == 0),
        "Llama: n_kv_head {} must divide n_head {}, divide or be divisible by tp {}, and the head size {} be even",
        cfg.kv_heads(), cfg.n_head, cfg.tp, cfg.head_size());
  CHECK(cfg.layer_begin >= 0 && cfg.layer_begin < cfg.stage_end() && cfg.stage_end() <= cfg.n_layer,
        "pipeline stage [{}, {}) is not a non-empty range of the {} blocks", cfg.layer_begin, cfg.stage_end(),
        cfg.n_layer);
  return cfg;
}

// The layer slots' parameter-name suffixes (GPT-2 Hugging Face names), in GPT::Slot order.
const char* const kSlotNames[] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                  "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                  "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};

std::string layer_name(int l, int slot) { return "h." + std::to_string(l) + "." + kSlotNames[slot]; }

}  // namespace

ParamTable gpt_param_table(const GPTConfig& cfg_in) {
  const GPTConfig cfg = checked(cfg_in);
  if (cfg.llama()) return llama_param_table(cfg);
  const int64_t C = cfg.d_model, vp = padded_vocab(cfg.vocab_size, cfg.tp);
  // Megatron's shard layouts (table in model/param_table.h): column-parallel splits a weight's outputs (dim 1 of
  // the [in, out] weight, dim 0 of its bias), row-parallel its inputs (dim 0); c_attn's outputs are q|k|v, three
  // groups each split over the tp ranks by heads.
  const int tp = cfg.tp, r = cfg.tp_rank;
  const Shard replicated{-1, tp, r, 1}, column{1, tp, r, 1}, column_bias{0, tp, r, 1}, row{0, tp, r, 1},
      qkv{1, tp, r, 3}, qkv_bias{0, tp, r, 3};
  ParamTable t;
  // Reverse order of use: the final LayerNorm's gradient is ready first, the token embedding's (also the
  // LM head) last.
  if (cfg.last_stage()) {
    t.add("ln_f.weight", {C}, {C}, false, replicated);
    t.add("ln_f.bias", {C}, {C}, false, replicated);
  }
  for (int l = cfg.stage_end() - 1; l >= cfg.layer_begin; --l) {
    auto add = [&](int slot, Shape shape, bool decay, const Shard& shard) {
      t.add(layer_name(l, slot), shape, shape, decay, shard);
    };
    add(10, {4 * C, C}, true, row);          // mlp.c_proj.weight
    add(11, {C}, false, replicated);         // mlp.c_proj.bias
    add(8, {C, 4 * C}, true, column);        // mlp.c_fc.weight
    add(9, {4 * C}, false, column_bias);     // mlp.c_fc.bias
    add(6, {C}, false, replicated);          // ln_2.weight
    add(7, {C}, false, replicated);          // ln_2.bias
    add(4, {C, C}, true, row);               // attn.c_proj.weight
    add(5, {C}, false, replicated);          // attn.c_proj.bias
    add(2, {C, 3 * C}, true, qkv);           // attn.c_attn.weight
    add(3, {3 * C}, false, qkv_bias);        // attn.c_attn.bias
    add(0, {C}, false, replicated);          // ln_1.weight
    add(1, {C}, false, replicated);          // ln_1.bias
  }
  if (cfg.first_stage()) t.add("wpe.weight", {cfg.seq_len, C}, {cfg.seq_len, C}, true, replicated);
  // The token embedding (vocab-parallel) on the first stage, and its tied copy as the head on the last.
  if (cfg.first_stage() || cfg.last_stage()) t.add("wte.weight", {vp, C}, {cfg.vocab_size, C}, true, row);
  return t;
}

GPT::GPT(const GPTConfig& cfg, DType dtype, Device device, Tensor params, Tensor grads, bool no_buffers)
    : cfg_(checked(cfg)), vp_(padded_vocab(cfg.vocab_size, cfg.tp)), dtype_(dtype), device_(device),
      table_(gpt_param_table(cfg)) {
  static_assert(sizeof(kSlotNames) / sizeof(kSlotNames[0]) == kSlotsPerLayer, "one name per slot");
  if (cfg_.llama()) {
    wte_ = table_.index_of("model.embed_tokens.weight");
    lnf_w_ = table_.index_of("model.norm.weight");
    head_ = cfg_.tie_embeddings ? wte_ : table_.index_of("lm_head.weight");
    slots_ = kLlamaSlots;
    if (cfg_.kv_copies() > 1 && cfg_.stage_layers() > 0)
      kv_sum_ = Tensor::zeros({2 * int64_t(cfg_.kv_heads()) * cfg_.head_size() * cfg_.d_model}, acc_dtype(dtype), device);
  } else {
    wte_ = head_ = table_.index_of("wte.weight");
    wpe_ = table_.index_of("wpe.weight");
    lnf_w_ = table_.index_of("ln_f.weight");
    lnf_b_ = table_.index_of("ln_f.bias");
  }
  layer_params_.assign(cfg_.stage_layers() * slots_, -1);
  for (int i = 0; i < cfg_.stage_layers(); ++i)
    for (int s = 0; s < slots_; ++s)
      layer_params_[i * slots_ + s] = table_.index_of(cfg_.llama() ? llama_layer_name(cfg_.layer_begin + i, s)
                                                                    : layer_name(cfg_.layer_begin + i, s));
  const int64_t n = table_.total_numel();
  if (no_buffers) {
    CHECK(!params.defined() && !grads.defined(), "GPT: buffers given with no_buffers");
  } else if (params.defined()) {
    CHECK(params.numel() == n && params.dtype() == dtype &&
              (!grads.defined() || (grads.numel() == n && grads.dtype() == acc_dtype(dtype))),
          "GPT: given buffers of {} {} and {} {} elements, the stage needs {} of {} and {}", params.numel(),
          dtype_name(params.dtype()), grads.numel(), dtype_name(grads.dtype()), n, dtype_name(dtype),
          dtype_name(acc_dtype(dtype)));
    params_ = params;
    grads_ = grads;
    zero_(params_);
    if (grads_.defined()) zero_(grads_);
  } else {
    params_ = Tensor::zeros({n}, dtype, device);
    grads_ = Tensor::zeros({n}, acc_dtype(dtype), device);
  }
}

Tensor GPT::param(int i) const {
  if (!param_views_.empty()) return param_views_[i];
  return params_.slice(table_[i].offset, table_[i].shape);
}

void GPT::set_param_views(std::vector<Tensor> views) {
  CHECK(static_cast<int>(views.size()) == table_.size(), "set_param_views: {} views for {} parameters",
        views.size(), table_.size());
  for (int i = 0; i < table_.size(); ++i)
    CHECK(views[i].shape() == table_[i].shape && views[i].dtype() == dtype_,
          "set_param_views: the view of {} does not match its shape and the compute dtype", table_[i].name);
  param_views_ = std::move(views);
}
Tensor GPT::grad(int i) const {
  if (!grad_views_.empty()) return grad_views_[i];
  CHECK(grads_.defined(), "GPT: no gradient storage (set_grad_views() gives it)");
  return grads_.slice(table_[i].offset, table_[i].shape);
}

void GPT::set_grad_views(std::vector<Tensor> views) {
  CHECK(static_cast<int>(views.size()) == table_.size(), "set_grad_views: {} views for {} parameters", views.size(),
        table_.size());
  for (int i = 0; i < table_.size(); ++i)
    CHECK(views[i].shape() == table_[i].shape && views[i].dtype() == grad_dtype(),
          "set_grad_views: the view of {} does not match its shape and the gradients' dtype", table_[i].name);
  grad_views_ = std::move(views);
}
Tensor GPT::param(const std::string& name) const {
  int i = table_.index_of(name);
  CHECK(i >= 0, "no parameter named {}", name);
  return param(i);
}

int64_t GPT::num_parameters() const {
  int64_t n = 0;
  for (const auto& s : table_.specs()) n += s.full_shape.numel();
  return n;
}

void GPT::init(uint64_t seed, double std, const Tensor& into) {
  const Tensor flat = into.defined() ? into : params_;
  CHECK(flat.defined() && flat.device() == Device::CPU,
        "init writes host memory: a GPU model is initialised into a host buffer, then copied");
  CHECK(flat.numel() == table_.total_numel(), "init: a buffer of {} elements for {} parameters", flat.numel(),
        table_.total_numel());
  zero_(flat);
  for (int p = 0; p < table_.size(); ++p) init_param(seed, std, p, flat.slice(table_[p].offset, table_[p].shape));
}

void GPT::init_param(uint64_t seed, double std, int p, const Tensor& out) const {
  const ParamSpec& s = table_[p];
  CHECK(out.device() == Device::CPU && out.numel() == s.numel(), "init_param: {} host elements for {}'s {}",
        out.numel(), s.name, s.numel());
  // GPT-2: residual projections scaled by 1/sqrt(2L); Llama: every matrix N(0, std^2), as Hugging Face
  // initialises it.
  const double proj_std = cfg_.llama() ? std : std / std::sqrt(2.0 * cfg_.n_layer);
  const bool is_ln_weight = s.name.find(cfg_.llama() ? "norm." : "ln_") != std::string::npos &&
                            s.name.find(".weight") != std::string::npos;
  const bool is_bias = s.name.size() >= 5 && s.name.compare(s.name.size() - 5, 5, ".bias") == 0;
  std::vector<double> vals(s.numel(), 0.0);
  if (!is_bias) {
    const double sd = s.name.find("c_proj.weight") != std::string::npos ? proj_std : std;
    const uint64_t stream = fnv1a64(s.name);
    // Walk this rank's shard run by run; global indices past the full tensor are vocabulary padding (stay 0).
    const int64_t len = s.run_length(), full = s.full_numel();
    for (int64_t q = 0; q < s.num_runs(); ++q) {
      const int64_t g0 = s.run_global_begin(q), l0 = q * len;
      for (int64_t i = 0; i < len && g0 + i < full; ++i)
        vals[l0 + i] = is_ln_weight ? 1.0 : sd * philox_normal(seed, stream, static_cast<uint64_t>(g0 + i));
    }
  }
  copy_convert(out.view(s.shape), Tensor(vals.data(), s.shape, DType::F64));
}

Activations GPT::alloc_activations(Arena& arena, int B, int T, bool split_backward) const {
  CHECK(T <= cfg_.seq_len, "sequence of {} tokens exceeds seq_len {}", T, cfg_.seq_len);
  const int64_t N = int64_t(B) * T, Cf = cfg_.d_model;
  const bool sp = sequence_parallel(), first = cfg_.first_stage(), last = cfg_.last_stage();
  CHECK(!sp || N % cfg_.tp == 0, "sequence parallelism: {} rows (B*T) are not divisible by tp {}", N, cfg_.tp);
  const int64_t Ns = sp ? N / cfg_.tp : N;  // rows of the residual stream and LayerNorm regions on this rank
  const int L = cfg_.stage_layers();
  const DType acc = acc_dtype(dtype_);  // LayerNorm statistics and losses
  Activations a;
  a.B = B;
  a.T = T;
  a.tokens = arena.alloc({B, T}, DType::I32);
  a.targets = arena.alloc({B, T}, DType::I32);
  for (int l = 0; l <= L; ++l) a.residual.push_back(arena.alloc({Ns, Cf}, dtype_));
  a.layers.resize(L);
  if (cfg_.llama()) llama_alloc(a, arena, false);
  else alloc_gpt2(a, arena, false);
  if (last) {
    a.logits = arena.alloc({N, vocab_shard()}, dtype_);
    a.losses = arena.alloc({N}, acc);
    if (cfg_.tp > 1) {
      a.xent_max = arena.alloc({N}, acc);
      a.xent_stats = arena.alloc({2, N}, acc);
    }
  }
  if (sp) a.sp_full = arena.alloc({N, Cf}, dtype_);
  if (split_backward) {
    if (cfg_.llama()) llama_alloc(a, arena, true);
    else alloc_gpt2(a, arena, true);
    if (first) a.demb = arena.alloc({N, Cf}, dtype_);
  }
  return a;
}

void GPT::alloc_gpt2(Activations& a, Arena& arena, bool kept_grads) const {
  const int64_t N = int64_t(a.B) * a.T, C = cfg_.d_model / cfg_.tp, NH = cfg_.n_head / cfg_.tp, Cf = cfg_.d_model;
  const int64_t Ns = sequence_parallel() ? N / cfg_.tp : N;
  const DType acc = acc_dtype(dtype_);
  if (kept_grads) {
    a.wgrad.resize(a.layers.size());
    for (auto& w : a.wgrad) {
      w.d_fcproj = arena.alloc({N, Cf}, dtype_);
      w.dfch = arena.alloc({N, 4 * C}, dtype_);
      w.d_attproj = arena.alloc({N, Cf}, dtype_);
      w.dqkv = arena.alloc({N, 3 * C}, dtype_);
    }
    return;
  }
  share_block_records(a, arena, [&](const BlockAlloc& alloc) {
    using LA = LayerActivations;
    LayerActivations la;
    la.ln1 = alloc(&LA::ln1, Recompute::Light, {Ns, Cf}, dtype_);
    la.ln1_mean = arena.alloc({Ns}, acc);
    la.ln1_rstd = arena.alloc({Ns}, acc);
    la.qkv = arena.alloc({N, 3 * C}, dtype_);
    // cpu: the softmax probabilities [B, NH, T, T]; cuda: the flash kernel's log-sum-exp [B, NH, T] in fp32.
    la.att = alloc(&LA::att, Recompute::Selective, kernels::attention_record_shape(device_, a.B, NH, a.T),
                   device_ == Device::CUDA ? acc : dtype_);
    la.atty = arena.alloc({N, C}, dtype_);
    la.res_attn = arena.alloc({Ns, Cf}, dtype_);
    la.ln2 = alloc(&LA::ln2, Recompute::Light, {Ns, Cf}, dtype_);
    la.ln2_mean = arena.alloc({Ns}, acc);
    la.ln2_rstd = arena.alloc({Ns}, acc);
    la.fch = arena.alloc({N, 4 * C}, dtype_);
    la.fch_gelu = alloc(&LA::fch_gelu, Recompute::Light, {N, 4 * C}, dtype_);
    return la;
  });
  if (cfg_.last_stage()) {
    a.lnf = arena.alloc({Ns, Cf}, dtype_);
    a.lnf_mean = arena.alloc({Ns}, acc);
    a.lnf_rstd = arena.alloc({Ns}, acc);
  }
}

void GPT::share_block_records(Activations& a, Arena& arena,
                              const std::function<LayerActivations(const BlockAlloc&)>& make) const {
  for (size_t l = 0; l < a.layers.size(); ++l) {
    if (l > 0 && cfg_.recompute == Recompute::Full) a.layers[l] = a.layers[0];
    else a.layers[l] = make(BlockAlloc{arena, l > 0 ? &a.layers[0] : nullptr, cfg_.recompute});
  }
}

TensorParallel GPT::tensor_parallel() const {
  CHECK(cfg_.tp == 1 || (tp_ && tp_->size() == cfg_.tp && tp_->rank() == cfg_.tp_rank),
        "tp = {}: set_tp_comm() needs the tp group of {} ranks (this one rank {})", cfg_.tp, cfg_.tp, cfg_.tp_rank);
  return TensorParallel(cfg_.tp > 1 ? tp_ : nullptr, cfg_.sequence_parallel);
}

void GPT::need_params(const std::function<void(int64_t)>& params_needed, int next) const {
  if (!params_needed) return;
  if (next >= cfg_.stage_layers()) return params_needed(0);
  // The block's input norm: Llama's RMSNorm weight, GPT-2's LayerNorm weight and bias.
  int64_t lo = table_[layer_param(next, cfg_.llama() ? int(IN_NORM) : int(LN1_W))].offset;
  if (!cfg_.llama()) lo = std::min(lo, table_[layer_param(next, LN1_B)].offset);
  params_needed(lo);
}

void GPT::need_block_params(const std::function<void(int64_t)>& params_needed, int l) const {
  if (!params_needed) return;
  int64_t lo = INT64_MAX;
  for (int s = 0; s < slots_; ++s) lo = std::min(lo, table_[layer_param(l, s)].offset);
  params_needed(lo);
}

void GPT::forward(Activations& a, double dloss, const Tensor& loss_sum,
                  const std::function<void(int64_t)>& params_needed) const {
  if (cfg_.llama()) return llama_forward(a, dloss, loss_sum, params_needed);
  need_params(params_needed, 0);
  // The block in its tp = 1 reading; the layers (model/parallel_layers.h) add tensor parallelism's collectives,
  // and with sequence parallelism the residual stream and LayerNorms hold this rank's rows only. Shapes are this
  // rank's: Cl = C / tp columns of each head-split projection, NHl = n_head / tp heads.
  const TensorParallel tp = tensor_parallel();
  const int64_t N = int64_t(a.B) * a.T;
  const Tensor& full = a.sp_full;  // sequence parallelism's [N, C] scratch
  if (cfg_.first_stage())  // a later pipeline stage: the caller has put the previous stage's output into a.input()
    vocab_embedding_forward(tp, a.residual[0], full, a.tokens, param(wte_), param(wpe_), vocab_begin(), vp_);
  // Each skip connection's add is fused with the LayerNorm that reads its result (kernels/layernorm.h: the same
  // values as the add followed by the LayerNorm): the block's ln_2, and the next block's ln_1 (ln_f after the
  // last block of the last stage). Only the first block's ln_1 reads the stage's input alone.
  const int L = cfg_.stage_layers();
  const bool last = cfg_.last_stage();
  kernels::layernorm_forward(a.layers[0].ln1, a.layers[0].ln1_mean, a.layers[0].ln1_rstd, a.residual[0],
                             param(layer_param(0, LN1_W)), param(layer_param(0, LN1_B)));
  for (int l = 0; l < L; ++l) {
    LayerActivations& la = a.layers[l];
    const Tensor& out = a.residual[l + 1];
    need_block_params(params_needed, l);
    block_forward(a, l, tp);
    row_linear_forward(tp, out, la.fch_gelu, full, param(layer_param(l, FCPROJ_W)), param(layer_param(l, FCPROJ_B)));
    need_params(params_needed, l + 1);
    if (l + 1 < L) {
      LayerActivations& next = a.layers[l + 1];
      kernels::residual_layernorm_forward(out, next.ln1, next.ln1_mean, next.ln1_rstd, out, la.res_attn,
                                          param(layer_param(l + 1, LN1_W)), param(layer_param(l + 1, LN1_B)));
    } else if (last) {
      kernels::residual_layernorm_forward(out, a.lnf, a.lnf_mean, a.lnf_rstd, out, la.res_attn, param(lnf_w_),
                                          param(lnf_b_));
    } else {
      kernels::accumulate(out, la.res_attn);
    }
  }
  if (!last) return;  // a.output() goes on to the next stage
  // The tied LM head reads wte [Vp, C] as an [out, in] weight: column-parallel over the vocabulary.
  column_linear_forward(tp, a.logits, a.lnf, full, param(wte_), Tensor(), WeightLayout::OutIn);
  vocab_cross_entropy(tp, a.losses, a.logits, a.targets.view({N}), a.xent_max, a.xent_stats, vocab_begin(),
                      cfg_.vocab_size, dloss);
  if (loss_sum.defined()) kernels::sum_accumulate(loss_sum, a.losses);
}

void GPT::block_forward(Activations& a, int l, const TensorParallel& tp) const {
  const int64_t Cl = cfg_.d_model / cfg_.tp, NHl = cfg_.n_head / cfg_.tp;
  LayerActivations& la = a.layers[l];
  auto P = [&](Slot s) { return param(layer_param(l, s)); };
  column_linear_forward(tp, la.qkv, la.ln1, a.sp_full, P(QKV_W), P(QKV_B));
  kernels::attention_forward(la.atty.view({a.B, a.T, Cl}), la.att, la.qkv.view({a.B, a.T, 3 * Cl}), NHl);
  // c_proj writes into res_attn, then the skip connection is added in place (with ln_2).
  row_linear_forward(tp, la.res_attn, la.atty, a.sp_full, P(ATTPROJ_W), P(ATTPROJ_B));
  kernels::residual_layernorm_forward(la.res_attn, la.ln2, la.ln2_mean, la.ln2_rstd, la.res_attn, a.residual[l],
                                      P(LN2_W), P(LN2_B));
  if (cfg_.recompute == Recompute::Light) {
    // Unfused, so the backward's GELU again gives these values bit for bit (CUDA's fused epilogue rounds its own way).
    column_linear_forward(tp, la.fch, la.ln2, a.sp_full, P(FC_W), P(FC_B));
    kernels::gelu_forward(la.fch_gelu, la.fch);
  } else {
    column_linear_gelu_forward(tp, la.fch, la.fch_gelu, la.ln2, a.sp_full, P(FC_W), P(FC_B));
  }
}

void GPT::recompute_light(Activations& a, int l) const {
  const LayerActivations& la = a.layers[l];
  auto P = [&](Slot s) { return param(layer_param(l, s)); };
  // ln_1 unfused from the kept block input: the same values as the forward's fused add (kernels/layernorm.h).
  kernels::layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, a.residual[l], P(LN1_W), P(LN1_B));
  kernels::layernorm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.res_attn, P(LN2_W), P(LN2_B));
  kernels::gelu_forward(la.fch_gelu, la.fch);
}

void GPT::ready_through(int p, const std::function<void(int64_t)>& grads_ready) const {
  if (grads_ready && p >= 0) grads_ready(table_[p].offset + table_[p].numel());
}

void GPT::backward_needs_param(const ParamsNeeded& params_needed, int p) const {
  if (params_needed && p >= 0) params_needed(table_[p].offset, table_[p].offset + table_[p].numel());
}

void GPT::backward_needs_block(const ParamsNeeded& params_needed, int l) const {
  if (!params_needed) return;
  int64_t lo = INT64_MAX, hi = 0;
  for (int s = 0; s < slots_; ++s) {
    const ParamSpec& spec = table_[layer_param(l, s)];
    lo = std::min(lo, spec.offset);
    hi = std::max(hi, spec.offset + spec.numel());
  }
  params_needed(lo, hi);
}

void GPT::backward(Activations& a, Arena& arena, const std::function<void(int64_t)>& grads_ready, BackwardPart part,
                   const Tensor& dout, const Tensor& dinput, const ParamsNeeded& params_needed) {
  const TensorParallel tp = tensor_parallel();
  const bool sp = tp.sp(), split = part == BackwardPart::InputOnly;
  const bool first = cfg_.first_stage(), last = cfg_.last_stage();
  const int L = cfg_.stage_layers();
  CHECK(last || dout.defined(), "pipeline stage [{}, {}): backward needs the output gradient", cfg_.layer_begin,
        cfg_.stage_end());
  CHECK(first || dinput.defined(), "pipeline stage [{}, {}): backward needs a tensor for the input gradient",
        cfg_.layer_begin, cfg_.stage_end());
  CHECK(!split || static_cast<int>(a.wgrad.size()) == L, "split backward needs alloc_activations(..., true)");
  // The split input pass leaves the matmul parameters unfinished: readiness is reported by backward_weights.
  const std::function<void(int64_t)> no_hook;
  const std::function<void(int64_t)>& ready = split ? no_hook : grads_ready;
  if (cfg_.llama()) return llama_backward(a, arena, ready, split, dout, dinput, params_needed);
  const int64_t N = int64_t(a.B) * a.T, C = cfg_.d_model, Cl = C / cfg_.tp, NHl = cfg_.n_head / cfg_.tp;
  const int64_t Ns = sp ? N / cfg_.tp : N;  // rows of the residual stream on this rank
  const Tensor none, &full = a.sp_full;
  // dres holds d(loss)/d(residual stream), updated in place from the top layer down: each LayerNorm backward
  // accumulates into it, which adds the block's branch to the skip connection's share. With sequence
  // parallelism it holds this rank's rows only (as do dln and the LayerNorm inputs).
  Tensor dres = arena.alloc({Ns, C}, dtype_);
  Tensor dln = arena.alloc({Ns, C}, dtype_);
  Tensor dln_full = sp ? arena.alloc({N, C}, dtype_) : dln;    // column-parallel input gradient, all rows
  Tensor dres_full = sp ? arena.alloc({N, C}, dtype_) : dres;  // row-parallel output gradient, all rows
  Tensor datty = tp.on() ? arena.alloc({N, Cl}, dtype_) : dln;  // c_proj's input gradient (local heads)
  Tensor dqkv = split ? Tensor() : arena.alloc({N, 3 * Cl}, dtype_);
  Tensor dfch = split ? Tensor() : arena.alloc({N, 4 * Cl}, dtype_);
  Tensor datt = arena.alloc(a.layers.empty() ? Shape{1} : a.layers[0].att.shape(), grad_dtype());  // fp32 scratch
  Tensor ln_grads = sp ? arena.alloc({2, C}, grad_dtype()) : Tensor();  // sp: one LayerNorm's partial dweight | dbias

  // LayerNorm backward into dres; its weight and bias are replicated parameters (under sequence parallelism each
  // rank's share is summed over tp before grads_ready reports them, so data parallelism never sends a partial one).
  auto ln_backward = [&](int w, int b, const Tensor& inp, const Tensor& mean, const Tensor& rstd) {
    replicated_param_grads(tp, {grad(w), grad(b)}, ln_grads, [&](const std::vector<Tensor>& g) {
      kernels::layernorm_backward(dres, g[0], g[1], dln, inp, param(w), mean, rstd);
    });
  };
  // A weight's gradient in this pass, or (split) none: backward_weights computes it.
  auto G = [&](int p) { return split ? none : grad(p); };
  // Split: a row-parallel layer's output gradient is kept for backward_weights.
  auto keep = [&](const Tensor& kept, const Tensor& d_out) {
    if (split) copy_convert(kept, d_out);
  };

  zero_(dres);
  if (last) {
    backward_needs_param(params_needed, lnf_w_);
    backward_needs_param(params_needed, lnf_b_);
    backward_needs_param(params_needed, wte_);
    column_linear_backward(tp, dln_full, dln, G(wte_), none, a.logits, a.lnf, full, param(wte_),
                           WeightLayout::OutIn);
    ln_backward(lnf_w_, lnf_b_, a.residual[L], a.lnf_mean, a.lnf_rstd);
    ready_through(lnf_b_, ready);
  } else {
    kernels::accumulate(dres, dout);  // the next stage's d(loss)/d(output)
  }
  for (int l = L - 1; l >= 0; --l) {
    LayerActivations& la = a.layers[l];
    LayerOutputGrads* kept = split ? &a.wgrad[l] : nullptr;
    auto P = [&](Slot s) { return layer_param(l, s); };
    backward_needs_block(params_needed, l);
    if (cfg_.recompute == Recompute::Full) {
      // The block's forward again from its kept input (ln_1 unfused: the same values, kernels/layernorm.h).
      kernels::layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, a.residual[l], param(P(LN1_W)), param(P(LN1_B)));
      block_forward(a, l, tp);
    }
    if (cfg_.recompute == Recompute::Light) recompute_light(a, l);
    // MLP branch: dres is d/d(block output) here.
    const Tensor dfch_l = split ? kept->dfch : dfch;
    const Tensor d_fcproj = row_linear_output_grad(tp, dres, dres_full);
    row_linear_backward(dfch_l, G(P(FCPROJ_W)), G(P(FCPROJ_B)), d_fcproj, la.fch_gelu, param(P(FCPROJ_W)));
    if (split) keep(kept->d_fcproj, d_fcproj);
    kernels::gelu_backward(dfch_l, la.fch, dfch_l);
    column_linear_backward(tp, dln_full, dln, G(P(FC_W)), G(P(FC_B)), dfch_l, la.ln2, full, param(P(FC_W)));
    ln_backward(P(LN2_W), P(LN2_B), la.res_attn, la.ln2_mean, la.ln2_rstd);
    ready_through(P(LN2_B), ready);  // the MLP half of the block: its buckets can start now
    // Attention branch: dres is now d/d(res_attn).
    const Tensor d_attproj = row_linear_output_grad(tp, dres, dres_full);
    row_linear_backward(datty, G(P(ATTPROJ_W)), G(P(ATTPROJ_B)), d_attproj, la.atty, param(P(ATTPROJ_W)));
    if (split) keep(kept->d_attproj, d_attproj);
    const Tensor dqkv_l = split ? kept->dqkv : dqkv;
    if (cfg_.recompute == Recompute::Selective)  // the probabilities again (atty is rewritten with its own values)
      kernels::attention_forward(la.atty.view({a.B, a.T, Cl}), la.att, la.qkv.view({a.B, a.T, 3 * Cl}), NHl);
    kernels::attention_backward(dqkv_l.view({a.B, a.T, 3 * Cl}), datt, datty.view({a.B, a.T, Cl}),
                                la.qkv.view({a.B, a.T, 3 * Cl}), la.atty.view({a.B, a.T, Cl}), la.att, NHl);
    column_linear_backward(tp, dln_full, dln, G(P(QKV_W)), G(P(QKV_B)), dqkv_l, la.ln1, full, param(P(QKV_W)));
    ln_backward(P(LN1_W), P(LN1_B), a.residual[l], la.ln1_mean, la.ln1_rstd);
    ready_through(P(LN1_B), ready);  // the block's last parameter in the flat layout
  }
  if (!first) {
    copy_convert(dinput, dres);  // d(loss)/d(input), for the previous stage
  } else {
    // The embedding backward reads every row (sequence parallelism gathers them), so wpe's gradient is complete.
    const Tensor demb = tp.gather_rows(dres, dres_full);
    if (split) copy_convert(a.demb, demb);
    else vocab_embedding_backward(tp, grad(wte_), grad(wpe_), demb, a.tokens, vocab_begin(), vp_);
  }
  if (ready) ready(table_.total_numel());
}

void GPT::backward_weights(Activations& a, const std::function<void(int64_t)>& grads_ready,
                           const ParamsNeeded& params_needed) {
  CHECK(static_cast<int>(a.wgrad.size()) == cfg_.stage_layers(), "backward_weights needs a split backward first");
  if (cfg_.llama()) return llama_backward_weights(a, grads_ready, params_needed);
  const TensorParallel tp = tensor_parallel();
  const Tensor none, &full = a.sp_full;
  if (cfg_.last_stage()) {
    column_linear_backward(tp, none, none, grad(wte_), none, a.logits, a.lnf, full, param(wte_), WeightLayout::OutIn);
    ready_through(lnf_b_, grads_ready);
  }
  for (int l = cfg_.stage_layers() - 1; l >= 0; --l) {
    const LayerActivations& la = a.layers[l];
    const LayerOutputGrads& kept = a.wgrad[l];
    auto P = [&](Slot s) { return layer_param(l, s); };
    if (cfg_.recompute == Recompute::Light) backward_needs_block(params_needed, l);  // its norms' outputs again
    if (cfg_.recompute == Recompute::Light) recompute_light(a, l);  // the input pass overwrote them
    row_linear_backward(none, grad(P(FCPROJ_W)), grad(P(FCPROJ_B)), kept.d_fcproj, la.fch_gelu, param(P(FCPROJ_W)));
    column_linear_backward(tp, none, none, grad(P(FC_W)), grad(P(FC_B)), kept.dfch, la.ln2, full, param(P(FC_W)));
    ready_through(P(LN2_B), grads_ready);
    row_linear_backward(none, grad(P(ATTPROJ_W)), grad(P(ATTPROJ_B)), kept.d_attproj, la.atty, param(P(ATTPROJ_W)));
    column_linear_backward(tp, none, none, grad(P(QKV_W)), grad(P(QKV_B)), kept.dqkv, la.ln1, full, param(P(QKV_W)));
    ready_through(P(LN1_B), grads_ready);
  }
  if (cfg_.first_stage()) vocab_embedding_backward(tp, grad(wte_), grad(wpe_), a.demb, a.tokens, vocab_begin(), vp_);
  if (grads_ready) grads_ready(table_.total_numel());
}

}  // namespace mt
