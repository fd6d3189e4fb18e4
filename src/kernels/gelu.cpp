// gelu_forward / gelu_backward: argument checks and device dispatch (kernels/gelu.h).
#include "kernels/gelu.h"

#include "kernels/cpu/gelu_cpu.h"
#include "kernels/cuda/gelu_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

void gelu_forward(const Tensor& out, const Tensor& inp) {
  const char* op = "gelu_forward";
  check_defined(out, op, "out"), check_defined(inp, op, "inp"), check_activation(inp, op, "inp");
  check_same_dtype(out, inp, op, "out", "inp"), check_same_device(out, inp, op, "out", "inp");
  CHECK(out.numel() == inp.numel(), "{}: out has {} elements, inp {}", op, out.numel(), inp.numel());
  if (inp.device() == Device::CUDA) MT_ON_CUDA(op, gpu::gelu_forward(out, inp));
  dispatch_storage(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::gelu_forward<S>(storage_ptr<S>(out), storage_ptr<S>(inp), inp.numel());
  });
}

void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const char* op = "gelu_backward";
  check_defined(dinp, op, "dinp"), check_defined(inp, op, "inp"), check_defined(dout, op, "dout");
  check_activation(inp, op, "inp");
  check_same_dtype(dinp, inp, op, "dinp", "inp"), check_same_dtype(dout, inp, op, "dout", "inp");
  check_same_device(dinp, inp, op, "dinp", "inp"), check_same_device(dout, inp, op, "dout", "inp");
  CHECK(dinp.numel() == inp.numel() && dout.numel() == inp.numel(), "{}: dinp/dout/inp have {}/{}/{} elements",
        op, dinp.numel(), dout.numel(), inp.numel());
  if (inp.device() == Device::CUDA) MT_ON_CUDA(op, gpu::gelu_backward(dinp, inp, dout));
  dispatch_storage(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::gelu_backward<S>(storage_ptr<S>(dinp), storage_ptr<S>(inp), storage_ptr<S>(dout), inp.numel());
  });
}

}  // namespace mt::kernels
