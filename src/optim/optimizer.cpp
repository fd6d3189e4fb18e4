// Optimizer step: clip by global norm (computed on the device), then AdamW over runs of segments.
#include "optim/optimizer.h"

#include "core/device.h"

#include <algorithm>
#include <cmath>

#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "kernels/sgd.h"

namespace mt {

std::vector<OptimSegment> param_segments(const ParamTable& table) {
  std::vector<OptimSegment> out;
  // A part held by several tp ranks counts once in the norm: its first copy's.
  for (const ParamSpec& p : table.specs())
    out.push_back({p.offset, p.offset, p.numel(), p.decay, p.shard.summed_over_tp(), p.shard.copy == 0});
  return out;
}

namespace {
// Runs of consecutive segments that lie end to end (in the params layout, and in the state too when `state`) and
// that `same` says may share a call. The kernels called per run are elementwise (AdamW, SGD, the cast), so a run
// gives the bits its segments would; the sum of squares over a run is one sum instead of several added.
template <typename Same>
std::vector<OptimSegment> merge_adjacent(const std::vector<OptimSegment>& segments, bool state, Same same) {
  std::vector<OptimSegment> runs;
  for (const OptimSegment& g : segments) {
    if (g.numel == 0) continue;
    if (!runs.empty()) {
      OptimSegment& r = runs.back();
      if (r.offset + r.numel == g.offset && (!state || r.state_offset + r.numel == g.state_offset) && same(r, g)) {
        r.numel += g.numel;
        continue;
      }
    }
    runs.push_back(g);
  }
  return runs;
}
}  // namespace

Optimizer::Optimizer(std::vector<OptimSegment> segments, int64_t state_numel, DType dtype, Device device,
                     const OptimizerSettings& s, Communicator* norm_group, Communicator* tp_group,
                     Communicator* pp_group, bool keep_masters)
    : segments_(std::move(segments)), s_(s), norm_group_(norm_group),
      tp_group_(tp_group && tp_group->size() > 1 ? tp_group : nullptr),
      pp_group_(pp_group && pp_group->size() > 1 ? pp_group : nullptr) {
  for (const OptimSegment& g : segments_)
    CHECK(g.state_offset >= 0 && g.state_offset + g.numel <= state_numel, "segment state [{}, +{}) outside {} elements",
          g.state_offset, g.numel, state_numel);
  std::vector<OptimSegment> in_norm;
  for (const OptimSegment& g : segments_)
    if (g.in_norm) in_norm.push_back(g);
  norm_runs_ = merge_adjacent(in_norm, s_.packed_grads, [](auto& a, auto& b) { return a.tp_sharded == b.tp_sharded; });
  update_runs_ = merge_adjacent(segments_, true, [](auto& a, auto& b) { return a.decay == b.decay; });
  cast_runs_ = merge_adjacent(segments_, true, [](auto&, auto&) { return true; });
  m_ = Tensor::zeros({std::max<int64_t>(1, state_numel)}, dtype, device);
  v_ = Tensor::zeros({std::max<int64_t>(1, state_numel)}, dtype, device);
  if (keep_masters) masters_ = Tensor::zeros({std::max<int64_t>(1, state_numel)}, dtype, device);
  norm_sq_ = Tensor::zeros({1}, dtype, device);
  norm_ = Tensor::zeros({1}, dtype, device);
  scale_ = Tensor::zeros({1}, dtype, device);
  rep_sq_ = Tensor::zeros({1}, dtype, device);
}

void Optimizer::load_masters(const Tensor& part, int64_t offset) {
  CHECK(keeps_masters(), "load_masters: this optimizer updates the parameters in place");
  const int64_t n = part.numel();
  for (const OptimSegment& g : segments_) {
    const int64_t lo = std::max(offset, g.offset), hi = std::min(offset + n, g.offset + g.numel);
    if (lo < hi)
      copy_convert(masters_.slice(g.state_offset + (lo - g.offset), {hi - lo}), part.slice(lo - offset, {hi - lo}));
  }
}

void Optimizer::store_masters(const Tensor& full) const {
  CHECK(keeps_masters(), "store_masters: this optimizer updates the parameters in place");
  for (const OptimSegment& g : segments_)
    copy_convert(full.slice(g.offset, {g.numel}), masters_.slice(g.state_offset, {g.numel}));
}

void Optimizer::store_weights(const Tensor& full, const Tensor& params) const {
  for (const OptimSegment& g : segments_) copy_convert(full.slice(g.offset, {g.numel}), master_view(g, params));
}

Tensor Optimizer::masters_in_param_layout(int64_t params_numel) const {
  if (!keeps_masters() || masters_.numel() != std::max<int64_t>(1, params_numel)) return Tensor();
  for (const OptimSegment& g : segments_)
    if (g.state_offset != g.offset) return Tensor();
  return masters_;
}

Tensor Optimizer::master_view(const OptimSegment& g, const Tensor& params) const {
  return keeps_masters() ? masters_.slice(g.state_offset, {g.numel}) : param_of(params, g);
}

void Optimizer::load_state(int64_t offset, int64_t n, const float* master, const float* m, const float* v) {
  for (const OptimSegment& g : segments_) {
    const int64_t lo = std::max(offset, g.offset), hi = std::min(offset + n, g.offset + g.numel);
    if (lo >= hi) continue;
    const int64_t state = g.state_offset + (lo - g.offset), src = lo - offset, len = hi - lo;
    // Host values into the state wherever it lives (a copy, or an upload to the GPU).
    auto put = [&](const Tensor& to, const float* from) {
      copy_convert(to.slice(state, {len}), Tensor(const_cast<float*>(from + src), {len}, DType::F32));
    };
    if (keeps_masters()) put(masters_, master);
    put(m_, m);
    put(v_, v);
  }
}

Tensor Optimizer::grad_of(const Tensor& grads, const OptimSegment& g) const {
  return grads.slice(s_.packed_grads ? g.state_offset : g.offset, {g.numel});
}

Tensor Optimizer::param_of(const Tensor& params, const OptimSegment& g) const {
  return params.slice(s_.packed_params ? g.state_offset : g.offset, {g.numel});
}

bool Optimizer::step(const Tensor& params, const Tensor& grads, double lr, double loss_scale) {
  CHECK(keeps_masters() == (params.dtype() != m_.dtype()), "optimizer: {} parameters with {} state{}",
        dtype_name(params.dtype()), dtype_name(m_.dtype()), keeps_masters() ? " and masters" : "");
  zero_(norm_sq_);
  if (!tp_group_) {
    for (const OptimSegment& g : norm_runs_)
      kernels::sum_squares_accumulate(norm_sq_, grad_of(grads, g));
  } else {
    // Sharded segments: each tp rank holds different elements, so their sums of squares add over tp; replicated
    // segments are the same on every tp rank and count once.
    zero_(rep_sq_);
    for (const OptimSegment& g : norm_runs_)
      kernels::sum_squares_accumulate(g.tp_sharded ? norm_sq_ : rep_sq_, grad_of(grads, g));
    tp_group_->all_reduce(norm_sq_, ReduceOp::Sum);
    kernels::accumulate(norm_sq_, rep_sq_);
  }
  if (norm_group_) norm_group_->all_reduce(norm_sq_, ReduceOp::Sum);
  if (pp_group_) pp_group_->all_reduce(norm_sq_, ReduceOp::Sum);
  kernels::clip_scale(scale_, norm_, norm_sq_, s_.grad_clip, 1.0 / loss_scale);
  // The step's one host read of a device value: a non-finite norm skips the update (fp16 overflow, or the run's
  // non-finite policy). 4 bytes; on the GPU it waits for the backward pass and the reductions to finish.
  last_norm_ = read_scalar(norm_);
  if (!std::isfinite(last_norm_)) return false;
  ++t_;
  kernels::AdamWHyper h;
  h.lr = lr;
  h.beta1 = s_.beta1;
  h.beta2 = s_.beta2;
  h.eps = s_.eps;
  h.step = t_;
  kernels::SGDHyper sh;
  sh.lr = lr;
  sh.momentum = s_.momentum;
  for (const OptimSegment& g : update_runs_) {
    h.weight_decay = sh.weight_decay = g.decay ? s_.weight_decay : 0.0;
    const Shape flat{g.numel};
    const Tensor master = master_view(g, params);
    // AdamW writes the compute copy as it updates the masters (rounded once per step, as SGD's cast below does).
    const Tensor compute_copy = keeps_masters() ? param_of(params, g) : Tensor();
    if (s_.sgd)
      kernels::sgd_update(master, grad_of(grads, g), m_.slice(g.state_offset, flat), scale_, sh);
    else
      kernels::adamw_update(master, grad_of(grads, g), m_.slice(g.state_offset, flat),
                            v_.slice(g.state_offset, flat), scale_, h, compute_copy);
  }
  if (keeps_masters() && s_.sgd)  // the compute copy: rounded once per step
    for (const OptimSegment& g : cast_runs_)
      copy_convert(param_of(params, g), masters_.slice(g.state_offset, {g.numel}));
  return true;
}

}  // namespace mt
