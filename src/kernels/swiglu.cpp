// swiglu_forward / swiglu_backward: argument checks and device dispatch (kernels/swiglu.h).
#include "kernels/swiglu.h"

#include "kernels/cpu/swiglu_cpu.h"
#include "kernels/cuda/swiglu_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
// t is defined with gate's dtype, device and shape.
void check_like_gate(const char* op, const Tensor& t, const char* name, const Tensor& gate) {
  check_defined(t, op, name), check_same_dtype(t, gate, op, name, "gate");
  check_same_device(t, gate, op, name, "gate"), check_shape(t, gate.shape(), op, name);
}

// An output may be the input itself (the same data pointer: with equal shapes and dtypes, the same elements, each
// read before it is written) but must not overlap it otherwise, where one element's write would clobber another
// element's input before it is read.
void check_alias(const char* op, const Tensor& out, const char* out_name, const Tensor& inp, const char* inp_name) {
  CHECK(out.data() == inp.data() || !overlaps(out, inp),
        "{}: {} overlaps {} without being the same tensor (only an exact alias is allowed)", op, out_name, inp_name);
}
}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  check_defined(gate, op, "gate"), check_activation(gate, op, "gate");
  check_like_gate(op, up, "up", gate), check_like_gate(op, out, "out", gate);
  check_alias(op, out, "out", gate, "gate"), check_alias(op, out, "out", up, "up");
  if (gate.device() == Device::CUDA) MT_ON_CUDA(op, gpu::swiglu_forward(out, gate, up));
  dispatch_storage(gate.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::swiglu_forward<S>(storage_ptr<S>(out), storage_ptr<S>(gate), storage_ptr<S>(up), gate.numel());
  });
}

void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_backward";
  check_defined(gate, op, "gate"), check_activation(gate, op, "gate");
  check_like_gate(op, up, "up", gate), check_like_gate(op, dout, "dout", gate);
  check_like_gate(op, dgate, "dgate", gate), check_like_gate(op, dup, "dup", gate);
  // Two writes to one element: the result would depend on their order (between GPU threads, on the schedule).
  CHECK(!overlaps(dgate, dup), "{}: dgate overlaps dup", op);
  for (auto [o, on] : {std::pair{&dgate, "dgate"}, std::pair{&dup, "dup"}})
    for (auto [i, in] : {std::pair{&dout, "dout"}, std::pair{&gate, "gate"}, std::pair{&up, "up"}})
      check_alias(op, *o, on, *i, in);
  if (gate.device() == Device::CUDA) MT_ON_CUDA(op, gpu::swiglu_backward(dgate, dup, dout, gate, up));
  dispatch_storage(gate.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::swiglu_backward<S>(storage_ptr<S>(dgate), storage_ptr<S>(dup), storage_ptr<S>(dout), storage_ptr<S>(gate),
                            storage_ptr<S>(up), gate.numel());
  });
}

}  // namespace mt::kernels
