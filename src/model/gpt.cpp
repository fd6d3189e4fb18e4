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
#include "model/block.h"
#include "model/parallel_layers.h"

namespace mt {

using kernels::WeightLayout;

int padded_vocab(int vocab_size, int tp) {
  const int align = kVocabAlign * tp;
  return (vocab_size + align - 1) / align * align;
}

namespace {

// `part` checked against the model, its blocks' end resolved.
ModelPart checked(const GPTConfig& cfg, const ModelPart& part) {
  const int tp = part.sharding.tp;
  CHECK(tp >= 1 && part.sharding.rank >= 0 && part.sharding.rank < tp, "tp rank {} out of range for tp {}",
        part.sharding.rank, tp);
  CHECK(cfg.n_head % tp == 0, "n_head {} is not divisible by tp {}", cfg.n_head, tp);
  CHECK(cfg.mlp_hidden() % tp == 0, "the MLP width {} is not divisible by tp {}", cfg.mlp_hidden(), tp);
  CHECK(cfg.d_model % cfg.n_head == 0, "d_model {} is not divisible by n_head {}", cfg.d_model, cfg.n_head);
  CHECK(!cfg.llama() || (cfg.n_head % cfg.kv_heads() == 0 &&
                         (cfg.kv_heads() % tp == 0 || tp % cfg.kv_heads() == 0) && cfg.head_size() % 2 == 0),
        "Llama: n_kv_head {} must divide n_head {}, divide or be divisible by tp {}, and the head size {} be even",
        cfg.kv_heads(), cfg.n_head, tp, cfg.head_size());
  const int begin = part.blocks.begin, end = part.blocks.end_in(cfg.n_layer);
  CHECK(begin >= 0 && begin < end && end <= cfg.n_layer,
        "pipeline stage [{}, {}) is not a non-empty slice of the {} blocks", begin, end, cfg.n_layer);
  ModelPart resolved = part;
  resolved.blocks.end = end;
  return resolved;
}

}  // namespace

ParamTable gpt_param_table(const GPTConfig& cfg, const ModelPart& part_in) {
  const ModelPart part = checked(cfg, part_in);
  if (cfg.llama()) return llama_param_table(cfg, part);
  const BlockSlice& blocks = part.blocks;
  const int64_t C = cfg.d_model, vp = padded_vocab(cfg.vocab_size, part.sharding.tp);
  // Megatron's shard layouts (table in model/param_table.h): column-parallel splits a weight's outputs (dim 1 of
  // the [in, out] weight, dim 0 of its bias), row-parallel its inputs (dim 0); c_attn's outputs are q|k|v, three
  // groups each split over the tp ranks by heads.
  const int tp = part.sharding.tp, r = part.sharding.rank;
  const Shard replicated{-1, tp, r, 1}, column{1, tp, r, 1}, column_bias{0, tp, r, 1}, row{0, tp, r, 1},
      qkv{1, tp, r, 3}, qkv_bias{0, tp, r, 3};
  ParamTable t;
  // Reverse order of use: the final LayerNorm's gradient is ready first, the token embedding's (also the
  // LM head) last.
  if (blocks.last(cfg.n_layer)) {
    t.add("ln_f.weight", {C}, {C}, false, replicated);
    t.add("ln_f.bias", {C}, {C}, false, replicated);
  }
  for (int l = blocks.end - 1; l >= blocks.begin; --l) {
    auto add = [&](int slot, Shape shape, bool decay, const Shard& shard) {
      t.add(gpt2_layer_name(l, slot), shape, shape, decay, shard);
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
  if (blocks.first()) t.add("wpe.weight", {cfg.seq_len, C}, {cfg.seq_len, C}, true, replicated);
  // The token embedding (vocab-parallel) on the first stage, and its tied copy as the head on the last.
  if (blocks.first() || blocks.last(cfg.n_layer)) t.add("wte.weight", {vp, C}, {cfg.vocab_size, C}, true, row);
  return t;
}

GPT::GPT(const GPTConfig& cfg, const ModelPart& part, DType dtype, Device device, Tensor params, Tensor grads,
         bool no_buffers)
    : cfg_(cfg), part_(checked(cfg, part)), vp_(padded_vocab(cfg.vocab_size, part.sharding.tp)), dtype_(dtype),
      device_(device), table_(gpt_param_table(cfg, part_)) {
  if (cfg_.llama()) {
    wte_ = table_.index_of("model.embed_tokens.weight");
    head_ = cfg_.tie_embeddings ? wte_ : table_.index_of("lm_head.weight");
    if (last_stage()) final_norm_ = make_norm(cfg_, {table_.index_of("model.norm.weight")});
  } else {
    wte_ = head_ = table_.index_of("wte.weight");
    wpe_ = table_.index_of("wpe.weight");
    if (last_stage()) final_norm_ = make_norm(cfg_, {table_.index_of("ln_f.weight"), table_.index_of("ln_f.bias")});
  }
  blocks_ = make_blocks(cfg_, part_, table_, dtype, device);
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

GPT::~GPT() = default;

Tensor GPT::param(int i) const {
  if (on_param_read_) on_param_read_(i);
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
  if (grads_over_params_ && on_param_read_) on_param_read_(i);
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
    // Counter-based draws: any split over threads gives the same values (GPT-2 1.5B's init took minutes on one
    // thread).
    for (int64_t q = 0; q < s.num_runs(); ++q) {
      const int64_t g0 = s.run_global_begin(q), l0 = q * len, n = std::min(len, full - g0);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i)
        vals[l0 + i] = is_ln_weight ? 1.0 : sd * philox_normal(seed, stream, static_cast<uint64_t>(g0 + i));
    }
  }
  copy_convert(out.view(s.shape), Tensor(vals.data(), s.shape, DType::F64));
}

Activations GPT::alloc_activations(Arena& arena, int B, int T, bool split_backward) const {
  const ContextParallel cp = context_parallel();
  CHECK(int64_t(T) * cp.size() <= cfg_.seq_len && (!cp.on() || T % 2 == 0),
        "sequence of {} tokens (this rank's of {} cp ranks) exceeds seq_len {} or is not two chunks", T, cp.size(),
        cfg_.seq_len);
  const int64_t N = int64_t(B) * T, Cf = cfg_.d_model;
  const bool sp = sequence_parallel(), first = first_stage(), last = last_stage();
  CHECK(!sp || N % sharding().tp == 0, "sequence parallelism: {} rows (B*T) are not divisible by tp {}", N,
        sharding().tp);
  const int64_t Ns = sharding().rows(N);  // rows of the residual stream and norm regions on this rank
  const int L = num_blocks();
  const DType acc = acc_dtype(dtype_);  // norm statistics and losses
  Activations a;
  a.B = B;
  a.T = T;
  a.tokens = arena.alloc({B, T}, DType::I32);
  a.targets = arena.alloc({B, T}, DType::I32);
  for (int l = 0; l <= L; ++l) a.residual.push_back(arena.alloc({Ns, Cf}, dtype_));
  a.layers.resize(L);
  alloc_block_records(a, arena);
  if (last) {
    const NormRecord r = final_norm_->alloc(arena, Ns, Cf, dtype_);
    a.lnf = r.y;
    a.lnf_mean = r.mean;
    a.lnf_rstd = r.rstd;
    a.logits = arena.alloc({N, vocab_shard()}, dtype_);
    a.losses = arena.alloc({N}, acc);
    if (sharding().tp > 1) {
      a.xent_max = arena.alloc({N}, acc);
      a.xent_stats = arena.alloc({2, N}, acc);
    }
  }
  if (sp) a.sp_full = arena.alloc({N, Cf}, dtype_);
  if (split_backward) {
    for (int l = 0; l < L; ++l) a.wgrad.push_back(blocks_[l]->alloc_kept(arena, *this, B, T));
    if (first) a.demb = arena.alloc({N, Cf}, dtype_);
  }
  return a;
}

void GPT::alloc_block_records(Activations& a, Arena& arena) const {
  for (size_t l = 0; l < a.layers.size(); ++l) {
    if (l > 0 && cfg_.recompute == Recompute::Full) a.layers[l] = a.layers[0];
    else a.layers[l] = blocks_[l]->alloc_record(BlockAlloc{arena, l > 0 ? &a.layers[0] : nullptr, cfg_.recompute},
                                                *this, a.B, a.T);
  }
}

TensorParallel GPT::tensor_parallel() const {
  const TensorSharding& t = sharding();
  CHECK(t.tp == 1 || (tp_ && tp_->size() == t.tp && tp_->rank() == t.rank),
        "tp = {}: set_tp_comm() needs the tp group of {} ranks (this one rank {})", t.tp, t.tp, t.rank);
  return TensorParallel(t.tp > 1 ? tp_ : nullptr, t.sequence_parallel);
}

void GPT::need_params(const std::function<void(int64_t)>& params_needed, int next) const {
  if (!params_needed) return;
  if (next >= num_blocks()) return params_needed(0);
  int64_t lo = INT64_MAX;  // the block's input norm
  for (int p : blocks_[next]->input_norm().params()) lo = std::min(lo, table_[p].offset);
  params_needed(lo);
}

void GPT::need_block_params(const std::function<void(int64_t)>& params_needed, int l) const {
  if (!params_needed) return;
  int64_t lo = INT64_MAX;
  for (int p : blocks_[l]->params()) lo = std::min(lo, table_[p].offset);
  params_needed(lo);
}

void GPT::forward(Activations& a, double dloss, const Tensor& loss_sum,
                  const std::function<void(int64_t)>& params_needed) const {
  need_params(params_needed, 0);
  // With sequence parallelism the residual stream and the norms hold this rank's rows only.
  const TensorParallel tp = tensor_parallel();
  const ContextParallel cp = context_parallel();
  const BlockPass pass{*this, tp, cp, a};
  const int64_t N = int64_t(a.B) * a.T;
  const Tensor none, &full = a.sp_full;  // sequence parallelism's [N, C] scratch
  if (first_stage()) {  // a later pipeline stage: the caller has put the previous stage's output into a.input()
    Tensor pos = wpe_ >= 0 ? param(wpe_) : none;
    if (cp.on() && pos.defined()) {  // the rows at this rank's tokens' positions
      const Tensor rows = Tensor::empty({a.T, cfg_.d_model}, dtype_, device_);
      gather_positions(cp, rows, pos);
      pos = rows;
    }
    vocab_embedding_forward(tp, a.residual[0], full, a.tokens, param(wte_), pos, vocab_begin(), vp_);
  }
  // Each skip connection's add is fused with the norm that reads its result: the next block's input norm (the final
  // norm after the last block of the last stage). Only the first block's input norm reads the stage's input alone.
  const int L = num_blocks();
  const bool last = last_stage();
  blocks_[0]->input_norm().forward(pass, input_record(a.layers[0]), a.residual[0]);
  for (int l = 0; l < L; ++l) {
    LayerActivations& la = a.layers[l];
    const Tensor& out = a.residual[l + 1];
    need_block_params(params_needed, l);
    blocks_[l]->forward(pass, la, a.residual[l], out);
    need_params(params_needed, l + 1);
    if (l + 1 < L) blocks_[l + 1]->input_norm().add_forward(pass, input_record(a.layers[l + 1]), out, la.res_attn);
    else if (last) final_norm_->add_forward(pass, {a.lnf, a.lnf_mean, a.lnf_rstd}, out, la.res_attn);
    else kernels::accumulate(out, la.res_attn);
  }
  if (!last) return;  // a.output() goes on to the next stage
  // The head reads its weight [Vp, C] as an [out, in] weight: column-parallel over the vocabulary.
  column_linear_forward(tp, a.logits, a.lnf, full, param(head_), none, WeightLayout::OutIn);
  vocab_cross_entropy(tp, a.losses, a.logits, a.targets.view({N}), a.xent_max, a.xent_stats, vocab_begin(),
                      cfg_.vocab_size, dloss);
  if (loss_sum.defined()) kernels::sum_accumulate(loss_sum, a.losses);
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
  for (int p : blocks_[l]->params()) {
    lo = std::min(lo, table_[p].offset);
    hi = std::max(hi, table_[p].offset + table_[p].numel());
  }
  params_needed(lo, hi);
}

BlockScratch GPT::backward_scratch(Arena& arena, const Activations& a, bool split) const {
  const bool sp = sequence_parallel();
  const int64_t N = int64_t(a.B) * a.T, C = cfg_.d_model;
  const int64_t Ns = sharding().rows(N);  // rows of the residual stream on this rank
  // dres holds d(loss)/d(residual stream), updated in place from the top block down: each norm's backward
  // accumulates into it, which adds the block's branch to the skip connection's share. With sequence parallelism it
  // holds this rank's rows only (as do dln and the norms' inputs).
  BlockScratch s;
  s.dres = arena.alloc({Ns, C}, dtype_);
  s.dln = arena.alloc({Ns, C}, dtype_);
  s.dln_full = sp ? arena.alloc({N, C}, dtype_) : s.dln;
  s.dres_full = sp ? arena.alloc({N, C}, dtype_) : s.dres;
  blocks_[0]->alloc_scratch(s, arena, *this, a, split);
  if (sp || grads_over_params_) s.norm_scratch = arena.alloc(blocks_[0]->input_norm().scratch_shape(C), grad_dtype());
  return s;
}

void GPT::alloc_backward_scratch(Arena& arena, const Activations& a, bool split) const {
  backward_scratch(arena, a, split);
}

int64_t GPT::attention_temp_bytes(int B, int T) const {
  return blocks_.empty() ? 0 : blocks_[0]->attention_temp_bytes(*this, B, T);
}

void GPT::embedding_backward(const TensorParallel& tp, const ContextParallel& cp, const Tensor& demb,
                             const Tensor& tokens) {
  // The embeddings' backward never reads their weights: gradients written over them start from zero.
  for (int i : {wte_, wpe_})
    if (i >= 0 && grads_over_params_ && grad(i).data() == param(i).data()) zero_(grad(i));
  if (wpe_ < 0 || !cp.on())
    return vocab_embedding_backward(tp, grad(wte_), wpe_ >= 0 ? grad(wpe_) : Tensor(), demb, tokens, vocab_begin(), vp_);
  // The position rows' gradients at this rank's positions, then scattered into wpe's.
  const Tensor dpos = Tensor::zeros({tokens.shape()[1], cfg_.d_model}, grad_dtype(), device_);
  vocab_embedding_backward(tp, grad(wte_), dpos, demb, tokens, vocab_begin(), vp_);
  scatter_position_grads(cp, grad(wpe_), dpos);
}

void GPT::backward(Activations& a, Arena& arena, const std::function<void(int64_t)>& grads_ready, BackwardPart part,
                   const Tensor& dout, const Tensor& dinput, const ParamsNeeded& params_needed) {
  const TensorParallel tp = tensor_parallel();
  const ContextParallel cp = context_parallel();
  const BlockPass pass{*this, tp, cp, a};
  const bool split = part == BackwardPart::InputOnly;
  const bool first = first_stage(), last = last_stage();
  const int L = num_blocks();
  CHECK(last || dout.defined(), "pipeline stage [{}, {}): backward needs the output gradient", part_.blocks.begin,
        part_.blocks.end);
  CHECK(first || dinput.defined(), "pipeline stage [{}, {}): backward needs a tensor for the input gradient",
        part_.blocks.begin, part_.blocks.end);
  CHECK(!split || static_cast<int>(a.wgrad.size()) == L, "split backward needs alloc_activations(..., true)");
  // The split input pass leaves the matmul parameters unfinished: readiness is reported by backward_weights.
  const std::function<void(int64_t)> no_hook;
  const std::function<void(int64_t)>& ready = split ? no_hook : grads_ready;
  const ParamReady block_ready = ready ? ParamReady([&](int p) { ready_through(p, ready); }) : ParamReady();
  const Tensor none, &full = a.sp_full;
  const BlockScratch s = backward_scratch(arena, a, split);
  zero_(s.dres);
  if (last) {
    for (int p : final_norm_->params()) backward_needs_param(params_needed, p);
    backward_needs_param(params_needed, head_);
    column_linear_backward(tp, s.dln_full, s.dln, split ? none : grad(head_), none, a.logits, a.lnf, full,
                           param(head_), WeightLayout::OutIn);
    final_norm_->backward(pass, s.dres, s.dln, a.residual[L], {a.lnf, a.lnf_mean, a.lnf_rstd}, s.norm_scratch);
    ready_through(final_norm_->params().back(), ready);
  } else {
    kernels::accumulate(s.dres, dout);  // the next stage's d(loss)/d(output)
  }
  for (int l = L - 1; l >= 0; --l) {
    backward_needs_block(params_needed, l);
    blocks_[l]->backward(pass, a.layers[l], a.residual[l], s, split ? &a.wgrad[l] : nullptr, block_ready);
  }
  if (!first) {
    copy_convert(dinput, s.dres);  // d(loss)/d(input), for the previous stage
  } else {
    // The embedding backward reads every row (sequence parallelism gathers them), so wpe's gradient is complete.
    const Tensor demb = tp.gather_rows(s.dres, s.dres_full);
    if (split) copy_convert(a.demb, demb);
    else embedding_backward(tp, cp, demb, a.tokens);
  }
  if (ready) ready(table_.total_numel());
}

void GPT::backward_weights(Activations& a, const std::function<void(int64_t)>& grads_ready,
                           const ParamsNeeded& params_needed) {
  CHECK(static_cast<int>(a.wgrad.size()) == num_blocks(), "backward_weights needs a split backward first");
  const TensorParallel tp = tensor_parallel();
  const ContextParallel cp = context_parallel();
  const BlockPass pass{*this, tp, cp, a};
  const ParamReady block_ready = grads_ready ? ParamReady([&](int p) { ready_through(p, grads_ready); }) : ParamReady();
  const Tensor none, &full = a.sp_full;
  if (last_stage()) {
    column_linear_backward(tp, none, none, grad(head_), none, a.logits, a.lnf, full, param(head_),
                           WeightLayout::OutIn);
    ready_through(final_norm_->params().back(), grads_ready);
  }
  for (int l = num_blocks() - 1; l >= 0; --l) {
    if (cfg_.recompute == Recompute::Light) backward_needs_block(params_needed, l);  // its norms' outputs again
    blocks_[l]->backward_weights(pass, a.layers[l], a.residual[l], a.wgrad[l], block_ready);
  }
  if (first_stage()) embedding_backward(tp, cp, a.demb, a.tokens);
  if (grads_ready) grads_ready(table_.total_numel());
}

}  // namespace mt
