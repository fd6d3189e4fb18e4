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

GPT::GPT(const GPTConfig& cfg, DType dtype, Device device, Tensor params, Tensor grads)
    : cfg_(checked(cfg)), vp_(padded_vocab(cfg.vocab_size, cfg.tp)), dtype_(dtype), device_(device),
      table_(gpt_param_table(cfg)) {
  static_assert(sizeof(kSlotNames) / sizeof(kSlotNames[0]) == kSlotsPerLayer, "one name per slot");
  wte_ = table_.index_of("wte.weight");
  wpe_ = table_.index_of("wpe.weight");
  lnf_w_ = table_.index_of("ln_f.weight");
  lnf_b_ = table_.index_of("ln_f.bias");
  layer_params_.assign(cfg_.stage_layers() * kSlotsPerLayer, -1);
  for (int i = 0; i < cfg_.stage_layers(); ++i)
    for (int s = 0; s < kSlotsPerLayer; ++s) layer_params_[i * kSlotsPerLayer + s] = table_.index_of(layer_name(cfg_.layer_begin + i, s));
  const int64_t n = table_.total_numel();
  if (params.defined() || grads.defined()) {
    CHECK(params.numel() == n && grads.numel() == n && params.dtype() == dtype && grads.dtype() == acc_dtype(dtype),
          "GPT: given buffers of {} {} and {} {} elements, the stage needs {} of {} and {}", params.numel(),
          dtype_name(params.dtype()), grads.numel(), dtype_name(grads.dtype()), n, dtype_name(dtype),
          dtype_name(acc_dtype(dtype)));
    params_ = params;
    grads_ = grads;
    zero_(params_);
    zero_(grads_);
  } else {
    params_ = Tensor::zeros({n}, dtype, device);
    grads_ = Tensor::zeros({n}, acc_dtype(dtype), device);
  }
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

void GPT::init(uint64_t seed, double std, const Tensor& into) {
  const Tensor flat = into.defined() ? into : params_;
  CHECK(flat.device() == Device::CPU, "init writes host memory: a GPU model is initialised into a host buffer, "
        "then copied");
  CHECK(flat.numel() == params_.numel(), "init: a buffer of {} elements for {} parameters", flat.numel(),
        params_.numel());
  const double proj_std = std / std::sqrt(2.0 * cfg_.n_layer);  // GPT-2: residual projections scaled by 1/sqrt(2L)
  zero_(flat);
  std::vector<double> vals;
  for (int p = 0; p < table_.size(); ++p) {
    const ParamSpec& s = table_[p];
    const bool is_ln_weight = s.name.find("ln_") != std::string::npos && s.name.find(".weight") != std::string::npos;
    const bool is_bias = s.name.size() >= 5 && s.name.compare(s.name.size() - 5, 5, ".bias") == 0;
    if (is_bias) continue;
    const bool is_proj = s.name.find("c_proj.weight") != std::string::npos;
    const double sd = is_proj ? proj_std : std;
    const uint64_t stream = fnv1a64(s.name);
    // Walk this rank's shard run by run; global indices past the full tensor are vocabulary padding (stay 0).
    vals.assign(s.numel(), 0.0);
    const int64_t len = s.run_length(), full = s.full_numel();
    for (int64_t q = 0; q < s.num_runs(); ++q) {
      const int64_t g0 = s.run_global_begin(q), l0 = q * len;
      for (int64_t i = 0; i < len && g0 + i < full; ++i)
        vals[l0 + i] = is_ln_weight ? 1.0 : sd * philox_normal(seed, stream, static_cast<uint64_t>(g0 + i));
    }
    copy_convert(flat.slice(s.offset, s.shape), Tensor(vals.data(), s.shape, DType::F64));
  }
}

Activations GPT::alloc_activations(Arena& arena, int B, int T, bool split_backward) const {
  CHECK(T <= cfg_.seq_len, "sequence of {} tokens exceeds seq_len {}", T, cfg_.seq_len);
  const int64_t N = int64_t(B) * T, C = cfg_.d_model / cfg_.tp, NH = cfg_.n_head / cfg_.tp, Cf = cfg_.d_model;
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
  for (auto& la : a.layers) {
    la.ln1 = arena.alloc({Ns, Cf}, dtype_);
    la.ln1_mean = arena.alloc({Ns}, acc);
    la.ln1_rstd = arena.alloc({Ns}, acc);
    la.qkv = arena.alloc({N, 3 * C}, dtype_);
    // cpu: the softmax probabilities [B, NH, T, T]; cuda: the flash kernel's log-sum-exp [B, NH, T] in fp32.
    la.att = arena.alloc(kernels::attention_record_shape(device_, B, NH, T), device_ == Device::CUDA ? acc : dtype_);
    la.atty = arena.alloc({N, C}, dtype_);
    la.res_attn = arena.alloc({Ns, Cf}, dtype_);
    la.ln2 = arena.alloc({Ns, Cf}, dtype_);
    la.ln2_mean = arena.alloc({Ns}, acc);
    la.ln2_rstd = arena.alloc({Ns}, acc);
    la.fch = arena.alloc({N, 4 * C}, dtype_);
    la.fch_gelu = arena.alloc({N, 4 * C}, dtype_);
  }
  if (last) {
    a.lnf = arena.alloc({Ns, Cf}, dtype_);
    a.lnf_mean = arena.alloc({Ns}, acc);
    a.lnf_rstd = arena.alloc({Ns}, acc);
    a.logits = arena.alloc({N, vocab_shard()}, dtype_);
    a.losses = arena.alloc({N}, acc);
    if (cfg_.tp > 1) {
      a.xent_max = arena.alloc({N}, acc);
      a.xent_stats = arena.alloc({2, N}, acc);
    }
  }
  if (sp) a.sp_full = arena.alloc({N, Cf}, dtype_);
  if (split_backward) {
    a.wgrad.resize(L);
    for (auto& w : a.wgrad) {
      w.d_fcproj = arena.alloc({N, Cf}, dtype_);
      w.dfch = arena.alloc({N, 4 * C}, dtype_);
      w.d_attproj = arena.alloc({N, Cf}, dtype_);
      w.dqkv = arena.alloc({N, 3 * C}, dtype_);
    }
    if (first) a.demb = arena.alloc({N, Cf}, dtype_);
  }
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
  if (!cfg_.first_stage()) {
    // a later pipeline stage: the caller has put the previous stage's output into a.input()
  } else if (!tp) {
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
  // Each skip connection's add is fused with the LayerNorm that reads its result (kernels/layernorm.h: the same
  // values as the add followed by the LayerNorm): the block's ln_2, and the next block's ln_1 (ln_f after the
  // last block of the last stage). Only the first block's ln_1 reads the stage's input alone.
  const int L = cfg_.stage_layers();
  const bool last = cfg_.last_stage();
  kernels::layernorm_forward(a.layers[0].ln1, a.layers[0].ln1_mean, a.layers[0].ln1_rstd, a.residual[0],
                             param(layer_param(0, LN1_W)), param(layer_param(0, LN1_B)));
  for (int l = 0; l < L; ++l) {
    LayerActivations& la = a.layers[l];
    const Tensor& x = a.residual[l];
    const Tensor& out = a.residual[l + 1];
    kernels::matmul_forward(la.qkv, gathered(la.ln1), param(layer_param(l, QKV_W)), param(layer_param(l, QKV_B)),
                            WeightLayout::InOut);
    kernels::attention_forward(la.atty.view({a.B, a.T, Cl}), la.att, la.qkv.view({a.B, a.T, 3 * Cl}), NHl);
    // c_proj writes into res_attn, then the skip connection is added in place (with ln_2).
    row_parallel(la.res_attn, la.atty, param(layer_param(l, ATTPROJ_W)), param(layer_param(l, ATTPROJ_B)));
    kernels::residual_layernorm_forward(la.res_attn, la.ln2, la.ln2_mean, la.ln2_rstd, la.res_attn, x,
                                        param(layer_param(l, LN2_W)), param(layer_param(l, LN2_B)));
    kernels::matmul_bias_gelu_forward(la.fch, la.fch_gelu, gathered(la.ln2), param(layer_param(l, FC_W)),
                                      param(layer_param(l, FC_B)));
    row_parallel(out, la.fch_gelu, param(layer_param(l, FCPROJ_W)), param(layer_param(l, FCPROJ_B)));
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

void GPT::ready_through(int p, const std::function<void(int64_t)>& grads_ready) const {
  if (grads_ready && p >= 0) grads_ready(table_[p].offset + table_[p].numel());
}

void GPT::backward(Activations& a, Arena& arena, const std::function<void(int64_t)>& grads_ready, BackwardPart part,
                   const Tensor& dout, const Tensor& dinput) {
  const bool tp = cfg_.tp > 1, sp = sequence_parallel(), split = part == BackwardPart::InputOnly;
  const bool first = cfg_.first_stage(), last = cfg_.last_stage();
  const int L = cfg_.stage_layers();
  CHECK(!tp || tp_, "tp = {}: set_tp_comm() first", cfg_.tp);
  CHECK(last || dout.defined(), "pipeline stage [{}, {}): backward needs the output gradient", cfg_.layer_begin,
        cfg_.stage_end());
  CHECK(first || dinput.defined(), "pipeline stage [{}, {}): backward needs a tensor for the input gradient",
        cfg_.layer_begin, cfg_.stage_end());
  CHECK(!split || static_cast<int>(a.wgrad.size()) == L, "split backward needs alloc_activations(..., true)");
  // The split input pass leaves the matmul parameters unfinished: readiness is reported by backward_weights.
  const std::function<void(int64_t)> no_hook;
  const std::function<void(int64_t)>& ready = split ? no_hook : grads_ready;
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
  Tensor dqkv = split ? Tensor() : arena.alloc({N, 3 * Cl}, dtype_);
  Tensor dfch = split ? Tensor() : arena.alloc({N, 4 * Cl}, dtype_);
  Tensor datt = arena.alloc(a.layers.empty() ? Shape{1} : a.layers[0].att.shape(), grads_.dtype());  // fp32 scratch
  Tensor ln_grads = sp ? arena.alloc({2, C}, grads_.dtype()) : Tensor();  // sp: one LayerNorm's partial dweight | dbias

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
  // A block matmul's backward: in one pass, or (split) the input gradient only, the output gradient kept in
  // `keep` for backward_weights (no copy when it was computed there).
  auto matmul_bwd = [&](const Tensor& dinp, int w, int b, const Tensor& d_out, const Tensor& inp, const Tensor& keep) {
    if (!split) return kernels::matmul_backward(dinp, grad(w), grad(b), d_out, inp, param(w), WeightLayout::InOut);
    kernels::matmul_backward(dinp, none, none, d_out, inp, param(w), WeightLayout::InOut);
    if (keep.defined() && keep.data() != d_out.data()) copy_convert(keep, d_out);
  };

  zero_(dres);
  if (last) {
    kernels::matmul_backward(dln_full, split ? none : grad(wte_), none, a.logits, gathered(a.lnf), param(wte_),
                             WeightLayout::OutIn);
    reduce_partial();
    ln_backward(lnf_w_, lnf_b_, a.residual[L], a.lnf_mean, a.lnf_rstd);
    ready_through(lnf_b_, ready);
  } else {
    kernels::accumulate(dres, dout);  // the next stage's d(loss)/d(output)
  }
  for (int l = L - 1; l >= 0; --l) {
    LayerActivations& la = a.layers[l];
    const LayerOutputGrads* kept = split ? &a.wgrad[l] : nullptr;
    auto P = [&](Slot s) { return layer_param(l, s); };
    // MLP branch: dres is d/d(block output) here. The row-parallel c_proj's bias gradient comes from the full
    // (all rows, replicated) output gradient on every rank, so it is complete without a tp reduction.
    const Tensor dfch_l = split ? kept->dfch : dfch;
    matmul_bwd(dfch_l, P(FCPROJ_W), P(FCPROJ_B), gathered_dres(), la.fch_gelu, split ? kept->d_fcproj : none);
    kernels::gelu_backward(dfch_l, la.fch, dfch_l);
    matmul_bwd(dln_full, P(FC_W), P(FC_B), dfch_l, gathered(la.ln2), none);
    reduce_partial();
    ln_backward(P(LN2_W), P(LN2_B), la.res_attn, la.ln2_mean, la.ln2_rstd);
    ready_through(P(LN2_B), ready);  // the MLP half of the block: its buckets can start now
    // Attention branch: dres is now d/d(res_attn).
    // Row-parallel c_proj: dbias from the full (replicated) dres on every rank, the input gradient local.
    matmul_bwd(datty, P(ATTPROJ_W), P(ATTPROJ_B), gathered_dres(), la.atty, split ? kept->d_attproj : none);
    const Tensor dqkv_l = split ? kept->dqkv : dqkv;
    kernels::attention_backward(dqkv_l.view({a.B, a.T, 3 * Cl}), datt, datty.view({a.B, a.T, Cl}),
                                la.qkv.view({a.B, a.T, 3 * Cl}), la.atty.view({a.B, a.T, Cl}), la.att, NHl);
    matmul_bwd(dln_full, P(QKV_W), P(QKV_B), dqkv_l, gathered(la.ln1), none);
    reduce_partial();
    ln_backward(P(LN1_W), P(LN1_B), a.residual[l], la.ln1_mean, la.ln1_rstd);
    ready_through(P(LN1_B), ready);  // the block's last parameter in the flat layout
  }
  if (!first) {
    copy_convert(dinput, dres);  // d(loss)/d(input), for the previous stage
  } else {
    // The embedding backward reads every row (sequence parallelism gathers them), so wpe's gradient is complete.
    const Tensor demb = gathered_dres();
    if (split) copy_convert(a.demb, demb);
    else embedding_backward(demb, a);
  }
  if (ready) ready(table_.total_numel());
}

void GPT::embedding_backward(const Tensor& demb, const Activations& a) {
  const int64_t C = cfg_.d_model;
  if (cfg_.tp == 1) kernels::embedding_backward(grad(wte_), grad(wpe_), demb.view({a.B, a.T, C}), a.tokens);
  else kernels::embedding_backward(grad(wte_), grad(wpe_), demb.view({a.B, a.T, C}), a.tokens, vocab_begin(), vp_);
}

void GPT::backward_weights(Activations& a, const std::function<void(int64_t)>& grads_ready) {
  CHECK(static_cast<int>(a.wgrad.size()) == cfg_.stage_layers(), "backward_weights needs a split backward first");
  const bool sp = sequence_parallel();
  const Tensor none;
  // Sequence parallelism: the column-parallel inputs are all-gathered again, as in backward().
  auto gathered = [&](const Tensor& local) -> Tensor {
    if (!sp) return local;
    tp_->all_gather(local, a.sp_full);
    return a.sp_full;
  };
  if (cfg_.last_stage()) {
    kernels::matmul_backward(none, grad(wte_), none, a.logits, gathered(a.lnf), param(wte_), WeightLayout::OutIn);
    ready_through(lnf_b_, grads_ready);
  }
  for (int l = cfg_.stage_layers() - 1; l >= 0; --l) {
    const LayerActivations& la = a.layers[l];
    const LayerOutputGrads& kept = a.wgrad[l];
    auto wgrad = [&](Slot w, Slot b, const Tensor& d_out, const Tensor& inp) {
      const int pw = layer_param(l, w), pb = layer_param(l, b);
      kernels::matmul_backward(none, grad(pw), grad(pb), d_out, inp, param(pw), WeightLayout::InOut);
    };
    wgrad(FCPROJ_W, FCPROJ_B, kept.d_fcproj, la.fch_gelu);
    wgrad(FC_W, FC_B, kept.dfch, gathered(la.ln2));
    ready_through(layer_param(l, LN2_B), grads_ready);
    wgrad(ATTPROJ_W, ATTPROJ_B, kept.d_attproj, la.atty);
    wgrad(QKV_W, QKV_B, kept.dqkv, gathered(la.ln1));
    ready_through(layer_param(l, LN1_B), grads_ready);
  }
  if (cfg_.first_stage()) embedding_backward(a.demb, a);
  if (grads_ready) grads_ready(table_.total_numel());
}

}  // namespace mt
