// One stage's passes at a shape (see stage_passes.h).
#include "plan/stage_passes.h"

#include <algorithm>

#include "plan/timing.h"
#include "train/model_config.h"

namespace mt::plan {

namespace {

// A stage of s.blocks blocks with or without the ends; n_layer only sets names and the init scale.
GPTConfig stage_gpt_config(const ModelConfig& model, const StageShape& s) {
  GPTConfig g = gpt_config(model);
  g.recompute = s.recompute;
  g.n_layer = (s.first ? 0 : 1) + s.blocks + (s.last ? 0 : 1);
  return g;
}

ModelPart stage_model_part(const StageShape& s) {
  ModelPart part;
  part.sharding = {s.tp, 0, s.sp};
  part.blocks.begin = s.first ? 0 : 1;
  part.blocks.end = part.blocks.begin + s.blocks;
  return part;
}

}  // namespace

void fill_values(const Tensor& t, double scale, uint32_t salt) {
  Tensor f = Tensor::empty(t.shape(), DType::F32);
  float* p = f.data_as<float>();
  uint32_t x = 2463534242u ^ salt;
  for (int64_t i = 0; i < f.numel(); ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = float(scale * ((x & 0xffff) / 32768.0 - 1.0));
  }
  copy_convert(t, f);
}

StagePasses::StagePasses(const ModelConfig& model, const StageShape& s)
    : tp(s.tp, 0), ring(s.cp, 0), s_(s), model_(stage_gpt_config(model, s), stage_model_part(s), s.dtype),
      scratch_(Device::CPU, size_t(16) << 20), loss_sum_(Tensor::zeros({1}, DType::F32)) {
  model_.init(1234, model.init_std > 0 ? model.init_std : 0.02);
  if (s.tp > 1) model_.set_tp_comm(&tp);
  if (s.cp > 1) model_.set_cp_comm(&ring);  // rank 0 of the ring: every cp rank does the same attention work
  const int T = model.seq_len / s.cp;
  // k records in flight, used in 1F1B's steady-state order (the forward of the newest, the backward of the
  // oldest), so that k - 1 other passes run between a micro-batch's forward and its backward, as in a schedule
  // that holds k records: with k > 1 the backward finds its record out of the caches, as it does in a run.
  const int k = std::max(1, s.inflight);
  for (int i = 0; i < k; ++i) {
    acts_.push_back(model_.alloc_activations(records_, s.B, T, s.split));
    Activations& a = acts_.back();
    int32_t* tok = a.tokens.data_as<int32_t>();
    int32_t* tgt = a.targets.data_as<int32_t>();
    for (int64_t j = 0; j < a.tokens.numel(); ++j) {
      tok[j] = int32_t((j * 7919 + i) % model.vocab_size);
      tgt[j] = int32_t((j * 104729 + 1) % model.vocab_size);
    }
    if (!s.first) fill_values(a.input(), 1.0, 1 + i);  // a later stage's input: forward reads it, nothing writes it
  }
  const Shape rows = acts_[0].input().shape();
  if (!s.last) {
    dout_ = Tensor::empty(rows, s.dtype);
    fill_values(dout_, 1e-3, 2);
  }
  if (!s.first) dinput_ = Tensor::empty(rows, s.dtype);
  dloss_ = 1.0 / (double(s.B) * T);
}

double StagePasses::forward(int record) {
  const Tensor none;
  const auto t0 = Clock::now();
  model_.forward(acts_[record % inflight()], s_.last ? dloss_ : 0.0, s_.last ? loss_sum_ : none);
  return us_since(t0);
}

double StagePasses::backward(int record) {
  scratch_.reset();
  const auto t0 = Clock::now();
  model_.backward(acts_[record % inflight()], scratch_, {}, s_.split ? BackwardPart::InputOnly : BackwardPart::All,
                  dout_, dinput_);
  return us_since(t0);
}

double StagePasses::backward_weights(int record) {
  const auto t0 = Clock::now();
  model_.backward_weights(acts_[record % inflight()], {});
  return us_since(t0);
}

}  // namespace mt::plan
