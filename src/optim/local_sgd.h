// Local SGD (optim.sync_every = H >= 1): each data-parallel replica steps its own optimizer on its own gradients,
// and every H steps the replicas average their parameters over the dp group. An outer optimizer may then treat
// the averaged change as a gradient (DiLoCo, Douillard et al. 2023: SGD with Nesterov momentum on the
// pseudo-gradient anchor - average). The inner optimizers' states stay local; only parameters cross the network,
// 4 bytes per parameter per sync (docs/local_sgd.md).
#pragma once
#include "comm/communicator.h"
#include "core/tensor.h"
#include "optim/optimizer.h"

namespace mt {

struct LocalSGDSettings {
  int sync_every = 1;     // H
  bool nesterov = false;  // false: the parameters become the replicas' average
  double outer_lr = 0.7, outer_momentum = 0.9;
};

class LocalSGD {
 public:
  // params: this rank's flat compute copy; opt: its optimizer, holding every parameter (no ZeRO-1), with the fp32
  // masters when the compute copy is 16-bit. The anchor (the parameters of the last sync) starts from them.
  LocalSGD(const LocalSGDSettings& s, Communicator& dp, const Tensor& params, const Optimizer& opt);

  // Whether step `step` (from 1) ends with a sync: H steps after the last one, and the run's last step, so that the
  // replicas agree on the weights the run exports.
  bool due(int step, int last_step) const { return step - last_sync_ >= s_.sync_every || step == last_step; }
  // Collective over dp, at the end of step `step`: averages the replicas' (master) parameters, applies the outer
  // optimizer, and leaves every replica with the same parameters (the compute copy their rounding).
  void sync(int step, const Tensor& params, Optimizer& opt);
  // comm.adapt: the period from the next step on (every replica alike).
  void set_sync_every(int h);
  int sync_every() const { return s_.sync_every; }
  // The outer momentum and the anchor (Nesterov; undefined otherwise), laid out like params: written into
  // checkpoints, and loaded back into (views of the same buffers) on resume.
  Tensor velocity() const { return velocity_; }
  Tensor anchor() const { return anchor_; }
  // The step of the last average (0: none yet).
  int last_sync() const { return last_sync_; }
  // A run resumed from a checkpoint whose last average was at step `last_sync`: the period counts from there. The
  // anchor, unless the checkpoint's was loaded into anchor(), is the restored weights (params, or the optimizer's
  // masters), as an average leaves it.
  void resume_at(int last_sync, const Tensor& params, const Optimizer& opt, bool anchor_restored);
  // fp32 buffers kept between syncs: the anchor and the outer momentum (Nesterov), a staging copy (16-bit).
  size_t state_bytes() const { return anchor_.nbytes() + velocity_.nbytes() + staging_.nbytes(); }

 private:
  void set_anchor(const Tensor& params, const Optimizer& opt);  // the anchor := the weights (Nesterov)

  LocalSGDSettings s_;
  Communicator& dp_;
  int last_sync_ = 0;  // the step of the last sync (0: the start)
  Tensor anchor_, velocity_;  // Nesterov only
  Tensor staging_;            // 16-bit compute only: the masters, laid out like params
};

}  // namespace mt
