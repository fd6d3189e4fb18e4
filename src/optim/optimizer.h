// The optimizer step over flat buffers: global gradient-norm clipping, then AdamW (or SGD with momentum) segment by
// segment (decay on matrices and embeddings only). A segment is a range of the params and grads buffers and a range of the moment
// buffers: one per parameter for a full optimizer, or the pieces of this rank's shards under ZeRO-1 (moments
// packed, so they take 1/dp of the memory). fp32 moments live here, and with a 16-bit compute copy the fp32
// master weights too, packed like the moments (so ZeRO-1 shards them as well): the update goes to the masters and
// each updated segment is then cast once into the compute copy.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/adamw.h"
#include "model/param_table.h"

namespace mt {

struct OptimizerSettings {
  bool sgd = false;  // SGD with momentum (kernels/sgd.h) instead of AdamW: the first moment buffer is its momentum
  double momentum = 0.9;  // SGD only
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 = off
  // The gradients given to step() are packed like the moments (a segment's at its state_offset): ZeRO-2's
  // gradient shards. Otherwise they are laid out like the parameters (at the segment's offset).
  bool packed_grads = false;
  // The params given to step() are packed like the moments too: ZeRO-3's parameter shards.
  bool packed_params = false;
};

struct OptimSegment {
  int64_t offset = 0;        // into the params and grads buffers
  int64_t state_offset = 0;  // into the moment buffers
  int64_t numel = 0;
  bool decay = false;
  bool tp_sharded = false;  // its sum of squares adds over tp (Shard::summed_over_tp), not a replicated tensor's
  bool in_norm = true;      // false for a copy counted elsewhere (the last pipeline stage's tied wte)
};

// One segment per parameter of the table, at its offset in the flat buffers.
std::vector<OptimSegment> param_segments(const ParamTable& table);

class Optimizer {
 public:
  // state_numel: length of the moment buffers (>= every segment's state end). norm_group: when the segments
  // cover only this rank's shard (ZeRO-1), the group whose sums of squares make the global norm; nullptr when
  // they cover every parameter. tp_group: with tensor parallelism, the tp group: the sums of squares of the
  // tp_sharded segments are all-reduced over it and the replicated ones counted locally, so every parameter is
  // counted once over the mesh (nullptr, or a group of one rank: no tensor parallelism). pp_group: with pipeline
  // parallelism, the stages whose sums of squares add up to the whole model's.
  // keep_masters: the params given to step() are a bf16/fp16 compute copy; the optimizer then holds fp32
  // masters of its segments (load_masters() before the first step).
  Optimizer(std::vector<OptimSegment> segments, int64_t state_numel, DType dtype, Device device,
            const OptimizerSettings& s, Communicator* norm_group = nullptr, Communicator* tp_group = nullptr,
            Communicator* pp_group = nullptr, bool keep_masters = false);

  // One update with learning rate `lr` of the segments of `params` (through the masters, when kept) from the
  // same segments of `grads`, which are the gradients of the loss multiplied by `loss_scale`. Leaves the
  // unscaled gradient's global norm (before clipping) in grad_norm()[0]. Returns false, and changes nothing,
  // when that norm is not finite (an inf or NaN anywhere in the mesh's gradients: the norm is reduced over every
  // group that holds a part of them, so every rank returns the same); that is the one value read back.
  bool step(const Tensor& params, const Tensor& grads, double lr, double loss_scale = 1.0);
  const Tensor& grad_norm() const { return norm_; }
  // The value of grad_norm() that the last step() read back (NaN before the first): reading it costs no wait.
  double last_grad_norm() const { return last_norm_; }
  int64_t steps_taken() const { return t_; }
  // Kernel calls a step makes over the parameters (the norm's sums of squares, the updates, the masters' casts).
  size_t calls_per_step() const {
    return norm_runs_.size() + update_runs_.size() + (keeps_masters() ? cast_runs_.size() : 0);
  }
  size_t state_bytes() const { return m_.nbytes() + v_.nbytes() + masters_.nbytes(); }
  bool keeps_masters() const { return masters_.defined(); }
  // The masters of this optimizer's segments, read from / written to a buffer laid out like params (fp32).
  // load_masters: of the elements [offset, offset + part.numel()) of that layout only, read from `part`.
  void load_masters(const Tensor& part, int64_t offset = 0);
  void store_masters(const Tensor& full) const;
  // The weights of this optimizer's segments (the masters, or `params` themselves when none are kept) written to
  // `full`, laid out like the unpacked params (the export).
  void store_weights(const Tensor& full, const Tensor& params) const;
  // The masters themselves where they are laid out like the params (one segment per parameter at its own offset, as
  // without ZeRO): what store_weights would write, without the copy. Undefined otherwise, or without masters.
  Tensor masters_in_param_layout(int64_t params_numel) const;
  // Checkpoints: a segment's fp32 state (its master weights, `params` themselves when no masters are kept, and
  // its two AdamW moments) as views; the state of the elements [offset, offset + n) of the params layout that
  // lie in this optimizer's segments set from fp32 values (master, m, v: n each); AdamW's step count.
  const std::vector<OptimSegment>& segments() const { return segments_; }
  Tensor master_view(const OptimSegment& g, const Tensor& params) const;
  Tensor exp_avg_view(const OptimSegment& g) const { return m_.slice(g.state_offset, {g.numel}); }
  Tensor exp_avg_sq_view(const OptimSegment& g) const { return v_.slice(g.state_offset, {g.numel}); }
  void load_state(int64_t offset, int64_t n, const float* master, const float* m, const float* v);
  void set_steps_taken(int64_t t) { t_ = t; }

 private:
  Tensor grad_of(const Tensor& grads, const OptimSegment& g) const;  // the segment's gradients in `grads`
  Tensor param_of(const Tensor& params, const OptimSegment& g) const;  // and its parameters in `params`
  std::vector<OptimSegment> segments_;
  // The segments merged where one kernel call can cover several (optimizer.cpp, merge_adjacent): each parameter is
  // a segment, and on the GPU every call is a launch of a few microseconds, three per segment per step otherwise.
  std::vector<OptimSegment> norm_runs_;    // in the norm, adjacent in grads, both tp-sharded or both replicated
  std::vector<OptimSegment> update_runs_;  // adjacent in params and in the state, the same decay
  std::vector<OptimSegment> cast_runs_;    // adjacent in params and in the state (the masters' cast)
  OptimizerSettings s_;
  Communicator* norm_group_;
  Communicator* tp_group_;
  Communicator* pp_group_;
  Tensor m_, v_, masters_;  // masters_: only with keep_masters
  Tensor norm_sq_, norm_, scale_;  // 1-element device scalars
  double last_norm_ = std::nan("");  // norm_ as step() last read it
  Tensor rep_sq_;                  // replicated segments' sum of squares (tensor parallelism only)
  int64_t t_ = 0;
};

}  // namespace mt
