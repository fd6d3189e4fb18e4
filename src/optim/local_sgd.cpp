// Local SGD: the periodic parameter average and the outer Nesterov step.
#include "optim/local_sgd.h"

#include "kernels/sgd.h"

namespace mt {

LocalSGD::LocalSGD(const LocalSGDSettings& s, Communicator& dp, const Tensor& params, const Optimizer& opt)
    : s_(s), dp_(dp) {
  CHECK(s.sync_every >= 1, "local SGD: sync_every must be >= 1, got {}", s.sync_every);
  CHECK(opt.keeps_masters() || params.dtype() == DType::F32, "local SGD: {} parameters without fp32 masters",
        dtype_name(params.dtype()));
  const Shape shape{params.numel()};
  const Device dev = params.device();  // the buffers live with the parameters (on the GPU for device=cuda)
  if (opt.keeps_masters()) staging_ = Tensor::zeros(shape, DType::F32, dev);
  if (!s.nesterov) return;
  anchor_ = Tensor::zeros(shape, DType::F32, dev);
  velocity_ = Tensor::zeros(shape, DType::F32, dev);
  set_anchor(params, opt);
}

void LocalSGD::set_anchor(const Tensor& params, const Optimizer& opt) {
  if (!s_.nesterov) return;
  if (opt.keeps_masters())
    opt.store_masters(anchor_);
  else
    copy_convert(anchor_, params);
}

void LocalSGD::resume_at(int last_sync, const Tensor& params, const Optimizer& opt, bool anchor_restored) {
  last_sync_ = last_sync;
  if (!anchor_restored) set_anchor(params, opt);
}

void LocalSGD::set_sync_every(int h) {
  CHECK(h >= 1, "local SGD: sync_every must be >= 1, got {}", h);
  s_.sync_every = h;
}

void LocalSGD::sync(int step, const Tensor& params, Optimizer& opt) {
  last_sync_ = step;
  // The fp32 weights the optimizer updates: the parameters themselves, or the masters staged like params.
  const Tensor w = opt.keeps_masters() ? staging_ : params;
  if (opt.keeps_masters()) opt.store_masters(w);
  dp_.all_reduce(w, ReduceOp::Avg);
  // PyTorch's SGD(nesterov=True) on the pseudo-gradient anchor - average (its first step's buffer is that
  // pseudo-gradient, as here with the velocity starting at 0).
  if (s_.nesterov) kernels::outer_nesterov_update(anchor_, velocity_, w, s_.outer_lr, s_.outer_momentum);
  if (opt.keeps_masters()) {
    opt.load_masters(w);
    copy_convert(params, w);
  }
}

}  // namespace mt
