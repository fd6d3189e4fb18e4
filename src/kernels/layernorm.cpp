// layernorm_forward / residual_layernorm_forward / layernorm_backward: argument checks and device dispatch
// (kernels/layernorm.h).
#include "kernels/layernorm.h"

#include <utility>

#include "kernels/cpu/layernorm_cpu.h"
#include "kernels/cuda/layernorm_cuda.h"
#include "kernels/elementwise.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
// inp (activation dtype S) and weight (S); mean and rstd in the accumulation dtype of S. Returns N and C.
void check_common(const char* op, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                  int64_t& N, int64_t& C) {
  check_defined(x, op, "inp"), check_defined(weight, op, "weight");
  check_defined(mean, op, "mean"), check_defined(rstd, op, "rstd");
  check_activation(x, op, "inp");
  check_same_dtype(weight, x, op, "weight", "inp");
  check_acc_dtype(mean, x.dtype(), op, "mean"), check_acc_dtype(rstd, x.dtype(), op, "rstd");
  for (const Tensor* t : {&weight, &mean, &rstd}) check_same_device(*t, x, op, "a parameter/statistic", "inp");
  C = x.dim(-1);
  N = x.numel() / C;
  CHECK(weight.numel() == C, "{}: weight has {} elements, expected C={}", op, weight.numel(), C);
  CHECK(mean.numel() == N && rstd.numel() == N, "{}: mean/rstd have {}/{} elements, expected N={}", op,
        mean.numel(), rstd.numel(), N);
}

// The forward pass's checks beyond check_common: bias of C elements and out like inp.
void check_forward(const char* op, const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                   const Tensor& mean, const Tensor& rstd, int64_t& N, int64_t& C) {
  check_common(op, inp, weight, mean, rstd, N, C);
  check_defined(bias, op, "bias"), check_same_dtype(bias, inp, op, "bias", "inp");
  check_same_device(bias, inp, op, "bias", "inp");
  CHECK(bias.numel() == C, "{}: bias has {} elements, expected C={}", op, bias.numel(), C);
  check_defined(out, op, "out"), check_same_dtype(out, inp, op, "out", "inp");
  check_same_device(out, inp, op, "out", "inp"), check_shape(out, inp.shape(), op, "out");
}

}  // namespace

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias) {
  const char* op = "layernorm_forward";
  int64_t N, C;
  check_forward(op, out, inp, weight, bias, mean, rstd, N, C);
  if (inp.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::layernorm_forward(out, mean, rstd, inp, weight, bias, kLayerNormEps));
  dispatch_storage(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = cpu::acc_t<S>;
    cpu::layernorm_forward<S>(storage_ptr<S>(out), storage_ptr<A>(mean), storage_ptr<A>(rstd), storage_ptr<S>(inp),
                              storage_ptr<S>(weight), storage_ptr<S>(bias), N, C, kLayerNormEps);
  });
}

void residual_layernorm_forward(const Tensor& residual_out, const Tensor& ln_out, const Tensor& mean,
                                const Tensor& rstd, const Tensor& a, const Tensor& b, const Tensor& weight,
                                const Tensor& bias) {
  const char* op = "residual_layernorm_forward";
  int64_t N, C;
  check_defined(residual_out, op, "residual_out");
  check_forward(op, ln_out, residual_out, weight, bias, mean, rstd, N, C);
  for (auto [t, name] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
    check_defined(*t, op, name), check_same_dtype(*t, residual_out, op, name, "residual_out");
    check_same_device(*t, residual_out, op, name, "residual_out");
    check_shape(*t, residual_out.shape(), op, name);
  }
  // ln_out is written while the rows of a, b and residual_out are still being read (on the GPU).
  for (auto [t, name] : {std::pair{&a, "a"}, std::pair{&b, "b"}, std::pair{&residual_out, "residual_out"}})
    CHECK(!overlaps(ln_out, *t), "{}: ln_out overlaps {}", op, name);
  if (a.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::residual_layernorm_forward(residual_out, ln_out, mean, rstd, a, b, weight, bias,
                                                   kLayerNormEps));
  // The CPU runs the composition itself, so the fused op equals it exactly by construction.
  add_forward(residual_out, a, b);
  layernorm_forward(ln_out, mean, rstd, residual_out, weight, bias);
}

void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward";
  int64_t N, C;
  check_common(op, inp, weight, mean, rstd, N, C);
  for (auto [t, name] : {std::pair{&dinp, "dinp"}, std::pair{&dout, "dout"}}) {
    check_defined(*t, op, name), check_same_dtype(*t, inp, op, name, "inp");
    check_same_device(*t, inp, op, name, "inp"), check_shape(*t, inp.shape(), op, name);
  }
  for (auto [t, name] : {std::pair{&dweight, "dweight"}, std::pair{&dbias, "dbias"}}) {
    check_defined(*t, op, name), check_acc_dtype(*t, inp.dtype(), op, name);
    check_same_device(*t, inp, op, name, "inp");
    CHECK(t->numel() == C, "{}: {} has {} elements, expected C={}", op, name, t->numel(), C);
  }
  if (inp.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd));
  dispatch_storage(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = cpu::acc_t<S>;
    cpu::layernorm_backward<S>(storage_ptr<S>(dinp), storage_ptr<A>(dweight), storage_ptr<A>(dbias),
                               storage_ptr<S>(dout), storage_ptr<S>(inp), storage_ptr<S>(weight),
                               storage_ptr<A>(mean), storage_ptr<A>(rstd), N, C);
  });
}

}  // namespace mt::kernels
