// layernorm_forward / layernorm_backward: argument checks and device dispatch (kernels/layernorm.h).
#include "kernels/layernorm.h"

#include <utility>

#include "kernels/cpu/layernorm_cpu.h"
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
}  // namespace

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias) {
  const char* op = "layernorm_forward";
  int64_t N, C;
  check_common(op, inp, weight, mean, rstd, N, C);
  check_defined(bias, op, "bias"), check_same_dtype(bias, inp, op, "bias", "inp");
  check_same_device(bias, inp, op, "bias", "inp");
  CHECK(bias.numel() == C, "{}: bias has {} elements, expected C={}", op, bias.numel(), C);
  check_defined(out, op, "out"), check_same_dtype(out, inp, op, "out", "inp");
  check_same_device(out, inp, op, "out", "inp"), check_shape(out, inp.shape(), op, "out");
  if (inp.device() == Device::CUDA) no_cuda(op);
  dispatch_storage(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = cpu::acc_t<S>;
    cpu::layernorm_forward<S>(storage_ptr<S>(out), storage_ptr<A>(mean), storage_ptr<A>(rstd), storage_ptr<S>(inp),
                              storage_ptr<S>(weight), storage_ptr<S>(bias), N, C, kLayerNormEps);
  });
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
  if (inp.device() == Device::CUDA) no_cuda(op);
  dispatch_storage(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = cpu::acc_t<S>;
    cpu::layernorm_backward<S>(storage_ptr<S>(dinp), storage_ptr<A>(dweight), storage_ptr<A>(dbias),
                               storage_ptr<S>(dout), storage_ptr<S>(inp), storage_ptr<S>(weight),
                               storage_ptr<A>(mean), storage_ptr<A>(rstd), N, C);
  });
}

}  // namespace mt::kernels
