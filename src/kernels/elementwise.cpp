// add_forward / accumulate / bias_add / divide_: argument checks and device dispatch (kernels/elementwise.h).
#include "kernels/elementwise.h"

#include "kernels/cpu/elementwise_cpu.h"
#include "kernels/cuda/elementwise_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

void add_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  const char* op = "add_forward";
  check_defined(out, op, "out"), check_defined(a, op, "a"), check_defined(b, op, "b"), check_activation(a, op, "a");
  check_same_dtype(out, a, op, "out", "a"), check_same_dtype(b, a, op, "b", "a");
  check_same_device(out, a, op, "out", "a"), check_same_device(b, a, op, "b", "a");
  CHECK(out.numel() == a.numel() && b.numel() == a.numel(), "{}: out/a/b have {}/{}/{} elements", op, out.numel(),
        a.numel(), b.numel());
  if (a.device() == Device::CUDA) MT_ON_CUDA(op, gpu::add_forward(out, a, b));
  dispatch_storage(a.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::add_forward<S>(storage_ptr<S>(out), storage_ptr<S>(a), storage_ptr<S>(b), a.numel());
  });
}

void accumulate(const Tensor& dst, const Tensor& src) {
  const char* op = "accumulate";
  check_defined(dst, op, "dst"), check_defined(src, op, "src");
  check_activation(dst, op, "dst"), check_activation(src, op, "src"), check_same_device(src, dst, op, "src", "dst");
  CHECK(dst.numel() == src.numel(), "{}: dst has {} elements, src {}", op, dst.numel(), src.numel());
  if (dst.device() == Device::CUDA) MT_ON_CUDA(op, gpu::accumulate(dst, src));
  dispatch_storage(dst.dtype(), [&](auto d) {
    dispatch_storage(src.dtype(), [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      cpu::accumulate<D, S>(storage_ptr<D>(dst), storage_ptr<S>(src), dst.numel());
    });
  });
}

void bias_add(const Tensor& out, const Tensor& bias) {
  const char* op = "bias_add";
  check_defined(out, op, "out"), check_defined(bias, op, "bias"), check_activation(out, op, "out");
  check_same_dtype(bias, out, op, "bias", "out"), check_same_device(bias, out, op, "bias", "out");
  const int64_t OC = bias.numel();
  CHECK(OC >= 1 && out.numel() % OC == 0 && out.dim(-1) == OC,
        "{}: out {} does not end in the bias's {} elements", op, out.shape().str(), OC);
  if (out.device() == Device::CUDA) MT_ON_CUDA(op, gpu::bias_add(out, bias));
  dispatch_storage(out.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::bias_add<S>(storage_ptr<S>(out), storage_ptr<S>(bias), out.numel() / OC, OC);
  });
}

void divide_(const Tensor& t, int divisor) {
  const char* op = "divide_";
  check_defined(t, op, "t");
  CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16 || t.dtype() == DType::F16,
        "{}: t must be fp32, bf16 or fp16, is {}", op, dtype_name(t.dtype()));
  CHECK(divisor > 0, "{}: divisor {}", op, divisor);
  if (t.device() == Device::CUDA) MT_ON_CUDA(op, gpu::divide_(t, divisor));
  const float d = static_cast<float>(divisor);
  dispatch_storage(t.dtype(), [&](auto s) {
    using S = decltype(s);
    S* x = storage_ptr<S>(t);
    for (int64_t i = 0, n = t.numel(); i < n; ++i) cpu::store(x[i], float(cpu::load(x[i])) / d);
  });
}

}  // namespace mt::kernels
