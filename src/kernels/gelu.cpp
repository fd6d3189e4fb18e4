// gelu_forward / gelu_backward: argument checks and device dispatch (kernels/gelu.h).
#include "kernels/gelu.h"

#include "kernels/cpu/gelu_cpu.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

void gelu_forward(const Tensor& out, const Tensor& inp) {
  const char* op = "gelu_forward";
  check_defined(out, op, "out"), check_defined(inp, op, "inp"), check_float(inp, op, "inp");
  check_same_dtype(out, inp, op, "out", "inp"), check_same_device(out, inp, op, "out", "inp");
  CHECK(out.numel() == inp.numel(), "{}: out has {} elements, inp {}", op, out.numel(), inp.numel());
  if (inp.device() == Device::CUDA) no_cuda(op);
  if (inp.dtype() == DType::F32)
    cpu::gelu_forward<float>(out.data_as<float>(), inp.data_as<float>(), inp.numel());
  else
    cpu::gelu_forward<double>(out.data_as<double>(), inp.data_as<double>(), inp.numel());
}

void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const char* op = "gelu_backward";
  check_defined(dinp, op, "dinp"), check_defined(inp, op, "inp"), check_defined(dout, op, "dout");
  check_float(inp, op, "inp");
  check_same_dtype(dinp, inp, op, "dinp", "inp"), check_same_dtype(dout, inp, op, "dout", "inp");
  check_same_device(dinp, inp, op, "dinp", "inp"), check_same_device(dout, inp, op, "dout", "inp");
  CHECK(dinp.numel() == inp.numel() && dout.numel() == inp.numel(), "{}: dinp/dout/inp have {}/{}/{} elements",
        op, dinp.numel(), dout.numel(), inp.numel());
  if (inp.device() == Device::CUDA) no_cuda(op);
  if (inp.dtype() == DType::F32)
    cpu::gelu_backward<float>(dinp.data_as<float>(), inp.data_as<float>(), dout.data_as<float>(), inp.numel());
  else
    cpu::gelu_backward<double>(dinp.data_as<double>(), inp.data_as<double>(), dout.data_as<double>(), inp.numel());
}

}  // namespace mt::kernels
