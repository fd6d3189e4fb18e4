// rmsnorm_forward / rmsnorm_backward: argument checks and device dispatch (kernels/rmsnorm.h).
#include "kernels/rmsnorm.h"

#include <cmath>
#include <utility>

#include "kernels/cpu/rmsnorm_cpu.h"
#include "kernels/cuda/rmsnorm_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
// inp (activation dtype S) and weight (S) of C elements; rstd of N elements in the accumulation dtype of S.
// Returns N and C.
void check_common(const char* op, const Tensor& inp, const Tensor& weight, const Tensor& rstd, int64_t& N, int64_t& C) {
  check_defined(inp, op, "inp"), check_defined(weight, op, "weight"), check_defined(rstd, op, "rstd");
  check_activation(inp, op, "inp");
  check_same_dtype(weight, inp, op, "weight", "inp"), check_acc_dtype(rstd, inp.dtype(), op, "rstd");
  check_same_device(weight, inp, op, "weight", "inp"), check_same_device(rstd, inp, op, "rstd", "inp");
  CHECK(inp.ndim() >= 1 && inp.dim(-1) > 0, "{}: inp {} must be [..., C] with C > 0", op, inp.shape().str());
  C = inp.dim(-1);
  N = inp.numel() / C;
  CHECK(weight.numel() == C, "{}: weight has {} elements, expected C={}", op, weight.numel(), C);
  CHECK(rstd.numel() == N, "{}: rstd has {} elements, expected N={}", op, rstd.numel(), N);
}
}  // namespace

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, double eps) {
  const char* op = "rmsnorm_forward";
  int64_t N, C;
  check_common(op, inp, weight, rstd, N, C);
  check_defined(out, op, "out"), check_same_dtype(out, inp, op, "out", "inp");
  check_same_device(out, inp, op, "out", "inp"), check_shape(out, inp.shape(), op, "out");
  CHECK(std::isfinite(eps) && eps >= 0, "{}: eps = {} must be finite and >= 0", op, eps);
  if (inp.device() == Device::CUDA) MT_ON_CUDA(op, gpu::rmsnorm_forward(out, rstd, inp, weight, eps));
  dispatch_storage(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = cpu::acc_t<S>;
    cpu::rmsnorm_forward<S>(storage_ptr<S>(out), storage_ptr<A>(rstd), storage_ptr<S>(inp), storage_ptr<S>(weight), N,
                            C, eps);
  });
}

void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  int64_t N, C;
  check_common(op, inp, weight, rstd, N, C);
  for (auto [t, name] : {std::pair{&dinp, "dinp"}, std::pair{&dout, "dout"}}) {
    check_defined(*t, op, name), check_same_dtype(*t, inp, op, name, "inp");
    check_same_device(*t, inp, op, name, "inp"), check_shape(*t, inp.shape(), op, name);
  }
  check_defined(dweight, op, "dweight"), check_acc_dtype(dweight, inp.dtype(), op, "dweight");
  check_same_device(dweight, inp, op, "dweight", "inp");
  CHECK(dweight.numel() == C, "{}: dweight has {} elements, expected C={}", op, dweight.numel(), C);
  if (inp.device() == Device::CUDA) MT_ON_CUDA(op, gpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd));
  dispatch_storage(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = cpu::acc_t<S>;
    cpu::rmsnorm_backward<S>(storage_ptr<S>(dinp), storage_ptr<A>(dweight), storage_ptr<S>(dout), storage_ptr<S>(inp),
                             storage_ptr<S>(weight), storage_ptr<A>(rstd), N, C);
  });
}

}  // namespace mt::kernels
