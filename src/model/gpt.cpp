// GPT-2 forward and backward over one micro-batch, built from the kernels in src/kernels.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>

#include "core/philox.h"
#include "kernels/attention.h"
#include "kernels/crossentropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/vocab_parallel.h"

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
  CHECK(4 * cfg.d_model % cfg.tp == 0, "the MLP width 4*d_model = {} is not divisible by tp {}", 4 * cfg.d_model,
        cfg.tp);
  return cfg;
}

}  // namespace

GPT::GPT(const GPTConfig& cfg, DType dtype, Device device)
    : cfg_(checked(cfg)), vp_(padded_vocab(cfg.vocab_size, cfg.tp)), dtype_(dtype), device_(device) {
  const int64_t C = cfg.d_model, L = cfg.n_layer;
  // Megatron's shard layouts (table in model/param_table.h): column-parallel splits a weight's outputs (dim 1 of
  // the [in, out] weight, dim 0 of its bias), row-parallel its inputs (dim 0); c_attn's outputs are q|k|v, three
  // groups each split over the tp ranks by heads.
  const int tp = cfg.tp, r = cfg.tp_rank;
  const Shard replicated{-1, tp, r, 1}, column{1, tp, r, 1}, column_bias{0, tp, r, 1}, row{0, tp, r, 1},
      qkv{1, tp, r, 3}, qkv_bias{0, tp, r, 3};
  // Reverse order of use: the final LayerNorm's gradient is ready first, the token embedding's (also the
  // LM head) last.
  lnf_w_ = table_.add("ln_f.weight", {C}, {C}, false, replicated);
  lnf_b_ = table_.add("ln_f.bias", {C}, {C}, false, replicated);
  layer_params_.assign(L * kSlotsPerLayer, -1);
  for (int64_t l = L - 1; l >= 0; --l) {
    auto add = [&](Slot s, const char* suffix, Shape shape, bool decay, const Shard& shard) {
      layer_params_[l * kSlotsPerLayer + s] =
          table_.add("h." + std::to_string(l) + "." + suffix, shape, shape, decay, shard);
    };
    add(FCPROJ_W, "mlp.c_proj.weight", {4 * C, C}, true, row);
    add(FCPROJ_B, "mlp.c_proj.bias", {C}, false, replicated);
    add(FC_W, "mlp.c_fc.weight", {C, 4 * C}, true, column);
    add(FC_B, "mlp.c_fc.bias", {4 * C}, false, column_bias);
    add(LN2_W, "ln_2.weight", {C}, false, replicated);
    add(LN2_B, "ln_2.bias", {C}, false, replicated);
    add(ATTPROJ_W, "attn.c_proj.weight", {C, C}, true, row);
    add(ATTPROJ_B, "attn.c_proj.bias", {C}, false, replicated);
    add(QKV_W, "attn.c_attn.weight", {C, 3 * C}, true, qkv);
    add(QKV_B, "attn.c_attn.bias", {3 * C}, false, qkv_bias);
    add(LN1_W, "ln_1.weight", {C}, false, replicated);
    add(LN1_B, "ln_1.bias", {C}, false, replicated);
  }
  wpe_ = table_.add("wpe.weight", {cfg.seq_len, C}, {cfg.seq_len, C}, true, replicated);
  wte_ = table_.add("wte.weight", {vp_, C}, {cfg.vocab_size, C}, true, row);  // vocab-parallel
  params_ = Tensor::zeros({table_.total_numel()}, dtype, device);
  grads_ = Tensor::zeros({table_.total_numel()}, dtype, device);
}

Tensor GPT::param(int i) const { return params_.slice(table_[i].offset, table_[i].shape); }
Tensor GPT::grad(int i) const { return grads_.slice(table_[i].offset, table_[i].shape); }
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

void GPT::init(uint64_t seed, double std) {
  CHECK(device_ == Device::CPU, "init on cpu; the CUDA backend initialises on the host and copies");
  const double proj_std = std / std::sqrt(2.0 * cfg_.n_layer);  // GPT-2: residual projections scaled by 1/sqrt(2L)
  zero_(params_);
  for (int p = 0; p < table_.size(); ++p) {
    const ParamSpec& s = table_[p];
    const bool is_ln_weight = s.name.find("ln_") != std::string::npos && s.name.find(".weight") != std::string::npos;
    const bool is_bias = s.name.size() >= 5 && s.name.compare(s.name.size() - 5, 5, ".bias") == 0;
    if (is_bias) continue;
    const bool is_proj = s.name.find("c_proj.weight") != std::string::npos;
    const double sd = is_proj ? proj_std : std;
    const uint64_t stream = fnv1a64(s.name);
    Tensor t = param(p);
    // Walk this rank's shard run by run; global indices past the full tensor are vocabulary padding (stay 0).
    const int64_t len = s.run_length(), full = s.full_numel();
    for (int64_t q = 0; q < s.num_runs(); ++q) {
      const int64_t g0 = s.run_global_begin(q), l0 = q * len;
      for (int64_t i = 0; i < len && g0 + i < full; ++i) {
        const double v = is_ln_weight ? 1.0 : sd * philox_normal(seed, stream, static_cast<uint64_t>(g0 + i));
        if (dtype_ == DType::F64) t.data_as<double>()[l0 + i] = v;
        else t.data_as<float>()[l0 + i] = static_cast<float>(v);
      }
    }
  }
}

Activations GPT::alloc_activations(Arena& arena, int B, int T) const {
  CHECK(T <= cfg_.seq_len, "sequence of {} tokens exceeds seq_len {}", T, cfg_.seq_len);
  const int64_t N = int64_t(B) * T, C = cfg_.d_model / cfg_.tp, NH = cfg_.n_head / cfg_.tp, Cf = cfg_.d_model;
  const bool sp = sequence_parallel();
  CHECK(!sp || N % cfg_.tp == 0, "sequence parallelism: {} rows (B*T) are not divisible by tp {}", N, cfg_.tp);
  const int64_t Ns = sp ? N / cfg_.tp : N;  // rows of the residual stream and LayerNorm regions on this rank
  Activations a;
  a.B = B;
  a.T = T;
  a.tokens = arena.alloc({B, T}, DType::I32);
  a.targets = arena.alloc({B, T}, DType::I32);
  for (int l = 0; l <= cfg_.n_layer; ++l) a.residual.push_back(arena.alloc({Ns, Cf}, dtype_));
  a.layers.resize(cfg_.n_layer);
  for (auto& la : a.layers) {
    la.ln1 = arena.alloc({Ns, Cf}, dtype_);
    la.ln1_mean = arena.alloc({Ns}, dtype_);
    la.ln1_rstd = arena.alloc({Ns}, dtype_);
    la.qkv = arena.alloc({N, 3 * C}, dtype_);
    la.att = arena.alloc({B, NH, T, T}, dtype_);
    la.atty = arena.alloc({N, C}, dtype_);
    la.res_attn = arena.alloc({Ns, Cf}, dtype_);
    la.ln2 = arena.alloc({Ns, Cf}, dtype_);
    la.ln2_mean = arena.alloc({Ns}, dtype_);
    la.ln2_rstd = arena.alloc({Ns}, dtype_);
    la.fch = arena.alloc({N, 4 * C}, dtype_);
    la.fch_gelu = arena.alloc({N, 4 * C}, dtype_);
  }
  a.lnf = arena.alloc({Ns, Cf}, dtype_);
  a.lnf_mean = arena.alloc({Ns}, dtype_);
  a.lnf_rstd = arena.alloc({Ns}, dtype_);
  a.logits = arena.alloc({N, vocab_shard()}, dtype_);
  a.losses = arena.alloc({N}, dtype_);
  if (cfg_.tp > 1) {
    a.xent_max = arena.alloc({N}, dtype_);
    a.xent_stats = arena.alloc({2, N}, dtype_);
  }
  if (sp) a.sp_full = arena.alloc({N, Cf}, dtype_);
  return a;
}

void GPT::forward(Activations& a, double dloss, const Tensor& loss_sum) const {
  const bool tp = cfg_.tp > 1;
  CHECK(!tp || (tp_ && tp_->size() == cfg_.tp && tp_->rank() == cfg_.tp_rank),
        "tp = {}: set_tp_comm() needs the tp group of {} ranks (this one rank {})", cfg_.tp, cfg_.tp, cfg_.tp_rank);
  const int64_t N = int64_t(a.B) * a.T, C = cfg_.d_model, Cl = C / cfg_.tp, NHl = cfg_.n_head / cfg_.tp;
  const Tensor none;
  // Sequence parallelism: the residual stream and LayerNorms hold this rank's block of rows; every
  // column-parallel matmul all-gathers its (LayerNorm output) input rows into sp_full (replacing f's identity),
  // every row-parallel matmul reduce-scatters its partial sum from sp_full to the local rows (replacing g's
  // all-reduce). Without it each rank holds all N rows and the inputs are used as they are.
  const bool sp = sequence_parallel();
  auto gathered = [&](const Tensor& local) -> Tensor {
    if (!sp) return local;
    tp_->all_gather(local, a.sp_full);
    return a.sp_full;
  };
  // Row-parallel layers (c_proj): the local matmul makes a partial sum, all-reduced over tp (Megatron's g), then
  // the replicated bias is added once. With tp = 1 the bias goes into the matmul as before.
  auto row_parallel = [&](const Tensor& out, const Tensor& inp, const Tensor& w, const Tensor& bias) {
    if (!tp) return kernels::matmul_forward(out, inp, w, bias, WeightLayout::InOut);
    if (sp) {
      kernels::matmul_forward(a.sp_full, inp, w, none, WeightLayout::InOut);
      tp_->reduce_scatter(a.sp_full, out, ReduceOp::Sum);
    } else {
      kernels::matmul_forward(out, inp, w, none, WeightLayout::InOut);
      tp_->all_reduce(out, ReduceOp::Sum);
    }
    kernels::bias_add(out, bias);
  };
  if (!tp) {
    kernels::embedding_forward(a.residual[0].view({a.B, a.T, C}), a.tokens, param(wte_), param(wpe_));
  } else if (sp) {
    // Vocabulary-parallel embedding, reduce-scattered to this rank's rows; then each local row (b, t), flat row
    // g = b*T + t, gets wpe[t], run by run of consecutive positions.
    kernels::embedding_forward(a.sp_full.view({a.B, a.T, C}), a.tokens, param(wte_), none, vocab_begin(), vp_);
    tp_->reduce_scatter(a.sp_full, a.residual[0], ReduceOp::Sum);
    const int64_t Ns = N / cfg_.tp, row0 = int64_t(cfg_.tp_rank) * Ns;
    for (int64_t i = 0; i < Ns;) {
      const int64_t t = (row0 + i) % a.T, len = std::min<int64_t>(a.T - t, Ns - i);
      kernels::accumulate(a.residual[0].slice(i * C, {len * C}), param(wpe_).slice(t * C, {len * C}));
      i += len;
    }
  } else {
    // Vocabulary-parallel embedding: each rank adds the rows it holds, the sum over tp has every token's row,
    // then the (replicated) position embedding is added once.
    kernels::embedding_forward(a.residual[0].view({a.B, a.T, C}), a.tokens, param(wte_), none, vocab_begin(), vp_);
    tp_->all_reduce(a.residual[0], ReduceOp::Sum);
    const Tensor pos = param(wpe_).slice(0, {int64_t(a.T) * C});
    for (int b = 0; b < a.B; ++b) kernels::accumulate(a.residual[0].slice(int64_t(b) * a.T * C, {int64_t(a.T) * C}), pos);
  }
  for (int l = 0; l < cfg_.n_layer; ++l) {
    LayerActivations& la = a.layers[l];
    const Tensor& x = a.residual[l];
    const Tensor& out = a.residual[l + 1];
    kernels::layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, x, param(layer_param(l, LN1_W)),
                               param(layer_param(l, LN1_B)));
    kernels::matmul_forward(la.qkv, gathered(la.ln1), param(layer_param(l, QKV_W)), param(layer_param(l, QKV_B)),
                            WeightLayout::InOut);
    kernels::attention_forward(la.atty.view({a.B, a.T, Cl}), la.att, la.qkv.view({a.B, a.T, 3 * Cl}), NHl);
    // c_proj writes into res_attn, then the skip connection is added in place.
    row_parallel(la.res_attn, la.atty, param(layer_param(l, ATTPROJ_W)), param(layer_param(l, ATTPROJ_B)));
    kernels::accumulate(la.res_attn, x);
    kernels::layernorm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.res_attn, param(layer_param(l, LN2_W)),
                               param(layer_param(l, LN2_B)));
    kernels::matmul_forward(la.fch, gathered(la.ln2), param(layer_param(l, FC_W)), param(layer_param(l, FC_B)),
                            WeightLayout::InOut);
    kernels::gelu_forward(la.fch_gelu, la.fch);
    row_parallel(out, la.fch_gelu, param(layer_param(l, FCPROJ_W)), param(layer_param(l, FCPROJ_B)));
    kernels::accumulate(out, la.res_attn);
  }
  kernels::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.residual[cfg_.n_layer], param(lnf_w_),
                             param(lnf_b_));
  // The tied LM head reads wte [Vp, C] as an [out, in] weight.
  kernels::matmul_forward(a.logits, gathered(a.lnf), param(wte_), none, WeightLayout::OutIn);
  if (!tp) {
    kernels::softmax_xent_forward_backward(a.losses, dloss != 0 ? a.logits : none, a.logits,
                                           a.targets.view({N}), cfg_.vocab_size, dloss);
  } else {
    // Vocabulary-parallel cross-entropy: the full logits are never gathered (kernels/vocab_parallel.h).
    const Tensor& row_max = a.xent_max;
    const Tensor& stats = a.xent_stats;
    const Tensor targets = a.targets.view({N});
    kernels::vocab_parallel_xent_local_max(row_max, a.logits, vocab_begin(), cfg_.vocab_size);
    tp_->all_reduce(row_max, ReduceOp::Max);
    kernels::vocab_parallel_xent_local_sums(stats, a.logits, targets, row_max, vocab_begin(), cfg_.vocab_size);
    tp_->all_reduce(stats, ReduceOp::Sum);
    kernels::vocab_parallel_xent_finish(a.losses, dloss != 0 ? a.logits : none, a.logits, targets, row_max, stats,
                                        vocab_begin(), cfg_.vocab_size, dloss);
  }
  if (loss_sum.defined()) kernels::sum_accumulate(loss_sum, a.losses);
}

void GPT::backward(Activations& a, Arena& arena, const std::function<void(int64_t)>& grads_ready) {
  const bool tp = cfg_.tp > 1, sp = sequence_parallel();
  CHECK(!tp || tp_, "tp = {}: set_tp_comm() first", cfg_.tp);
  const int64_t N = int64_t(a.B) * a.T, C = cfg_.d_model, Cl = C / cfg_.tp, NHl = cfg_.n_head / cfg_.tp;
  const int64_t Ns = sp ? N / cfg_.tp : N;  // rows of the residual stream on this rank
  const Tensor none;
  // dres holds d(loss)/d(residual stream), updated in place from the top layer down: each LayerNorm backward
  // accumulates into it, which adds the block's branch to the skip connection's share. With sequence
  // parallelism it holds this rank's rows only (as do dln and the LayerNorm inputs).
  Tensor dres = arena.alloc({Ns, C}, dtype_);
  Tensor dln = arena.alloc({Ns, C}, dtype_);
  Tensor dln_full = sp ? arena.alloc({N, C}, dtype_) : dln;    // column-parallel input gradient, all rows
  Tensor dres_full = sp ? arena.alloc({N, C}, dtype_) : dres;  // row-parallel output gradient, all rows
  Tensor datty = tp ? arena.alloc({N, Cl}, dtype_) : dln;  // c_proj's input gradient (local heads)
  Tensor dqkv = arena.alloc({N, 3 * Cl}, dtype_);
  Tensor dfch = arena.alloc({N, 4 * Cl}, dtype_);
  Tensor datt = arena.alloc(a.layers.empty() ? Shape{1} : a.layers[0].att.shape(), dtype_);
  Tensor ln_grads = sp ? arena.alloc({2, C}, dtype_) : Tensor();  // sp: one LayerNorm's partial dweight | dbias

  // Column-parallel layers (and the vocab-parallel head) give a partial input gradient in dln_full: all-reduced
  // over tp (the backward of Megatron's f) before the replicated LayerNorm backward; with sequence parallelism
  // reduce-scattered into this rank's rows of dln instead. Nothing to do with tp = 1.
  auto reduce_partial = [&] {
    if (sp) tp_->reduce_scatter(dln_full, dln, ReduceOp::Sum);
    else if (tp) tp_->all_reduce(dln, ReduceOp::Sum);
  };
  // Sequence parallelism: a column-parallel layer's input (a LayerNorm output) is all-gathered again into the
  // activation record's scratch (recomputed rather than kept), and a row-parallel layer's output gradient is
  // all-gathered from the local rows of dres.
  auto gathered = [&](const Tensor& local) -> Tensor {
    if (!sp) return local;
    tp_->all_gather(local, a.sp_full);
    return a.sp_full;
  };
  auto gathered_dres = [&]() -> Tensor {
    if (!sp) return dres;
    tp_->all_gather(dres, dres_full);
    return dres_full;
  };
  // LayerNorm backward into dres. With sequence parallelism each rank saw only its rows, so the (replicated)
  // weight and bias gradients of this micro-batch are partial: they go to zeroed scratch, are summed over tp and
  // then accumulated (summing grads() itself would count earlier micro-batches tp times). This happens before
  // grads_ready reports them, so data parallelism never sends a partial LayerNorm gradient.
  auto ln_backward = [&](int w, int b, const Tensor& inp, const Tensor& mean, const Tensor& rstd) {
    if (!sp) return kernels::layernorm_backward(dres, grad(w), grad(b), dln, inp, param(w), mean, rstd);
    zero_(ln_grads);
    const Tensor dw = ln_grads.slice(0, {C}), db = ln_grads.slice(C, {C});
    kernels::layernorm_backward(dres, dw, db, dln, inp, param(w), mean, rstd);
    tp_->all_reduce(ln_grads, ReduceOp::Sum);
    kernels::accumulate(grad(w), dw);
    kernels::accumulate(grad(b), db);
  };

  kernels::matmul_backward(dln_full, grad(wte_), none, a.logits, gathered(a.lnf), param(wte_), WeightLayout::OutIn);
  reduce_partial();
  zero_(dres);
  ln_backward(lnf_w_, lnf_b_, a.residual[cfg_.n_layer], a.lnf_mean, a.lnf_rstd);
  auto ready_through = [&](int p) {
    if (grads_ready) grads_ready(table_[p].offset + table_[p].numel());
  };
  ready_through(lnf_b_);
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    LayerActivations& la = a.layers[l];
    auto P = [&](Slot s) { return param(layer_param(l, s)); };
    auto G = [&](Slot s) { return grad(layer_param(l, s)); };
    // MLP branch: dres is d/d(block output) here. The row-parallel c_proj's bias gradient comes from the full
    // (all rows, replicated) output gradient on every rank, so it is complete without a tp reduction.
    kernels::matmul_backward(dfch, G(FCPROJ_W), G(FCPROJ_B), gathered_dres(), la.fch_gelu, P(FCPROJ_W),
                             WeightLayout::InOut);
    kernels::gelu_backward(dfch, la.fch, dfch);
    kernels::matmul_backward(dln_full, G(FC_W), G(FC_B), dfch, gathered(la.ln2), P(FC_W), WeightLayout::InOut);
    reduce_partial();
    ln_backward(layer_param(l, LN2_W), layer_param(l, LN2_B), la.res_attn, la.ln2_mean, la.ln2_rstd);
    ready_through(layer_param(l, LN2_B));  // the MLP half of the block: its buckets can start now
    // Attention branch: dres is now d/d(res_attn).
    // Row-parallel c_proj: dbias from the full (replicated) dres on every rank, the input gradient local.
    kernels::matmul_backward(datty, G(ATTPROJ_W), G(ATTPROJ_B), gathered_dres(), la.atty, P(ATTPROJ_W),
                             WeightLayout::InOut);
    kernels::attention_backward(dqkv.view({a.B, a.T, 3 * Cl}), datt, datty.view({a.B, a.T, Cl}),
                                la.qkv.view({a.B, a.T, 3 * Cl}), la.att, NHl);
    kernels::matmul_backward(dln_full, G(QKV_W), G(QKV_B), dqkv, gathered(la.ln1), P(QKV_W), WeightLayout::InOut);
    reduce_partial();
    ln_backward(layer_param(l, LN1_W), layer_param(l, LN1_B), a.residual[l], la.ln1_mean, la.ln1_rstd);
    ready_through(layer_param(l, LN1_B));  // the block's last parameter in the flat layout
  }
  // The embedding backward reads every row (sequence parallelism gathers them), so wpe's gradient is complete.
  const Tensor demb = gathered_dres();
  if (!tp) kernels::embedding_backward(grad(wte_), grad(wpe_), demb.view({a.B, a.T, C}), a.tokens);
  else kernels::embedding_backward(grad(wte_), grad(wpe_), demb.view({a.B, a.T, C}), a.tokens, vocab_begin(), vp_);
  if (grads_ready) grads_ready(table_.total_numel());
}

}  // namespace mt
