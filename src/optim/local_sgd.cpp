// Local SGD: the periodic parameter average and the outer Nesterov step.
#include "optim/local_sgd.h"

#include <cstring>

namespace mt {

LocalSGD::LocalSGD(const LocalSGDSettings& s, Communicator& dp, const Tensor& params, const Optimizer& opt)
    : s_(s), dp_(dp) {
  CHECK(s.sync_every >= 1, "local SGD: sync_every must be >= 1, got {}", s.sync_every);
  CHECK(opt.keeps_masters() || params.dtype() == DType::F32, "local SGD: {} parameters without fp32 masters",
        dtype_name(params.dtype()));
  const Shape shape{params.numel()};
  if (opt.keeps_masters()) staging_ = Tensor::zeros(shape, DType::F32);
  if (!s.nesterov) return;
  anchor_ = Tensor::zeros(shape, DType::F32);
  velocity_ = Tensor::zeros(shape, DType::F32);
  if (opt.keeps_masters())
    opt.store_masters(anchor_);
  else
    copy_convert(anchor_, params);
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
  if (s_.nesterov) {
    // PyTorch's SGD(nesterov=True) on the pseudo-gradient d = anchor - average (its first step's buffer is d,
    // as here with v starting at 0): v = mu v + d; anchor -= lr (d + mu v).
    float* a = anchor_.data_as<float>();
    float* v = velocity_.data_as<float>();
    float* x = w.data_as<float>();
    const float lr = float(s_.outer_lr), mu = float(s_.outer_momentum);
    const int64_t n = w.numel();
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
    for (int64_t i = 0; i < n; ++i) {
      const float d = a[i] - x[i];
      v[i] = mu * v[i] + d;
      a[i] -= lr * (d + mu * v[i]);
      x[i] = a[i];
    }
  }
  if (opt.keeps_masters()) {
    opt.load_masters(w);
    copy_convert(params, w);
  }
}

}  // namespace mt
