// add_forward / accumulate: argument checks and device dispatch (kernels/elementwise.h).
#include "kernels/elementwise.h"

#include "kernels/cpu/elementwise_cpu.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

void add_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  const char* op = "add_forward";
  check_defined(out, op, "out"), check_defined(a, op, "a"), check_defined(b, op, "b"), check_float(a, op, "a");
  check_same_dtype(out, a, op, "out", "a"), check_same_dtype(b, a, op, "b", "a");
  check_same_device(out, a, op, "out", "a"), check_same_device(b, a, op, "b", "a");
  CHECK(out.numel() == a.numel() && b.numel() == a.numel(), "{}: out/a/b have {}/{}/{} elements", op, out.numel(),
        a.numel(), b.numel());
  if (a.device() == Device::CUDA) no_cuda(op);
  if (a.dtype() == DType::F32)
    cpu::add_forward<float>(out.data_as<float>(), a.data_as<float>(), b.data_as<float>(), a.numel());
  else
    cpu::add_forward<double>(out.data_as<double>(), a.data_as<double>(), b.data_as<double>(), a.numel());
}

void accumulate(const Tensor& dst, const Tensor& src) {
  const char* op = "accumulate";
  check_defined(dst, op, "dst"), check_defined(src, op, "src"), check_float(dst, op, "dst");
  check_same_dtype(src, dst, op, "src", "dst"), check_same_device(src, dst, op, "src", "dst");
  CHECK(dst.numel() == src.numel(), "{}: dst has {} elements, src {}", op, dst.numel(), src.numel());
  if (dst.device() == Device::CUDA) no_cuda(op);
  if (dst.dtype() == DType::F32)
    cpu::accumulate<float>(dst.data_as<float>(), src.data_as<float>(), dst.numel());
  else
    cpu::accumulate<double>(dst.data_as<double>(), src.data_as<double>(), dst.numel());
}

void bias_add(const Tensor& out, const Tensor& bias) {
  const char* op = "bias_add";
  check_defined(out, op, "out"), check_defined(bias, op, "bias"), check_float(out, op, "out");
  check_same_dtype(bias, out, op, "bias", "out"), check_same_device(bias, out, op, "bias", "out");
  const int64_t OC = bias.numel();
  CHECK(OC >= 1 && out.numel() % OC == 0 && out.dim(-1) == OC,
        "{}: out {} does not end in the bias's {} elements", op, out.shape().str(), OC);
  if (out.device() == Device::CUDA) no_cuda(op);
  if (out.dtype() == DType::F32)
    cpu::bias_add<float>(out.data_as<float>(), bias.data_as<float>(), out.numel() / OC, OC);
  else
    cpu::bias_add<double>(out.data_as<double>(), bias.data_as<double>(), out.numel() / OC, OC);
}

}  // namespace mt::kernels
