// sum_accumulate / sum_squares_accumulate / clip_scale: argument checks and device dispatch (kernels/reduce.h).
#include "kernels/reduce.h"

#include <cmath>

#include "kernels/cpu/reduce_cpu.h"
#include "kernels/cuda/reduce_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
double load1(const Tensor& t) {
  return t.dtype() == DType::F32 ? double(*t.data_as<float>()) : *t.data_as<double>();
}
void store1(const Tensor& t, double v) {
  if (t.dtype() == DType::F32)
    *t.data_as<float>() = float(v);
  else
    *t.data_as<double>() = v;
}
void check_scalar(const char* op, const Tensor& t, const char* name) {
  check_defined(t, op, name), check_float(t, op, name);
  CHECK(t.numel() == 1, "{}: {} must have 1 element, has {}", op, name, t.numel());
}

template <bool kSquare>
void accumulate_reduction(const char* op, const Tensor& acc, const Tensor& x) {
  check_scalar(op, acc, "acc");
  check_defined(x, op, "x"), check_activation(x, op, "x"), check_same_device(acc, x, op, "acc", "x");
  if (x.device() == Device::CUDA)
    MT_ON_CUDA(op, kSquare ? gpu::sum_squares_accumulate(acc, x) : gpu::sum_accumulate(acc, x));
  const double s = dispatch_storage(x.dtype(), [&](auto t) {
    using S = decltype(t);
    return kSquare ? cpu::sum_squares(storage_ptr<S>(x), x.numel()) : cpu::sum(storage_ptr<S>(x), x.numel());
  });
  store1(acc, load1(acc) + s);
}
}  // namespace

void sum_accumulate(const Tensor& acc, const Tensor& x) { accumulate_reduction<false>("sum_accumulate", acc, x); }

void sum_squares_accumulate(const Tensor& acc, const Tensor& x) {
  accumulate_reduction<true>("sum_squares_accumulate", acc, x);
}

void clip_scale(const Tensor& scale, const Tensor& norm, const Tensor& norm_sq, double max_norm,
                double inv_loss_scale) {
  const char* op = "clip_scale";
  CHECK(std::isfinite(inv_loss_scale) && inv_loss_scale > 0, "{}: inv_loss_scale = {} must be finite and > 0", op,
        inv_loss_scale);
  check_scalar(op, scale, "scale"), check_scalar(op, norm, "norm"), check_scalar(op, norm_sq, "norm_sq");
  check_same_device(scale, norm_sq, op, "scale", "norm_sq"), check_same_device(norm, norm_sq, op, "norm", "norm_sq");
  // On the GPU the norm never leaves the device: one device thread computes norm and scale.
  if (norm_sq.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::clip_scale(scale, norm, norm_sq, max_norm, inv_loss_scale));
  const double n = std::sqrt(load1(norm_sq)) * inv_loss_scale;  // the unscaled gradients' norm
  // torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6), applied only when it is < 1.
  // A non-finite norm gives a non-finite or zero scale, as in PyTorch; the loss scaler deals with it.
  double s = 1.0;
  if (max_norm > 0) {
    const double coef = max_norm / (n + 1e-6);
    if (coef < 1.0) s = coef;
  }
  store1(norm, n);
  store1(scale, s * inv_loss_scale);  // unscales as it clips: AdamW's grad * scale is the true, clipped gradient
}

}  // namespace mt::kernels
