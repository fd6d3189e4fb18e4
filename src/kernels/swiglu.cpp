// swiglu_forward / swiglu_backward: argument checks and device dispatch (kernels/swiglu.h).
#include "kernels/swiglu.h"

#include "kernels/cpu/swiglu_cpu.h"
#include "kernels/cuda/swiglu_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
// inp [..., 2H] and the [..., H] tensor `half` (out or dout) of inp's dtype and device, with the same leading
// dimensions. Returns N (rows) and H.
void check_halves(const char* op, const Tensor& inp, const Tensor& half, const char* half_name, int64_t& N,
                  int64_t& H) {
  check_defined(inp, op, "inp"), check_defined(half, op, half_name), check_activation(inp, op, "inp");
  check_same_dtype(half, inp, op, half_name, "inp"), check_same_device(half, inp, op, half_name, "inp");
  CHECK(inp.ndim() >= 1 && inp.dim(-1) % 2 == 0, "{}: inp {} must be [..., 2H]", op, inp.shape().str());
  H = inp.dim(-1) / 2;
  N = H > 0 ? inp.numel() / (2 * H) : 0;
  Shape expected = inp.shape();
  expected.d[expected.n - 1] = H;
  check_shape(half, expected, op, half_name);
}

// Whether two tensors' element ranges overlap.
bool overlaps(const Tensor& x, const Tensor& y) {
  const char *xb = static_cast<const char*>(x.data()), *yb = static_cast<const char*>(y.data());
  return xb < yb + y.nbytes() && yb < xb + x.nbytes();
}
}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& inp) {
  const char* op = "swiglu_forward";
  int64_t N, H;
  check_halves(op, inp, out, "out", N, H);
  CHECK(!overlaps(out, inp), "{}: out overlaps inp", op);  // a row's outputs would overwrite its unread inputs
  if (inp.device() == Device::CUDA) MT_ON_CUDA(op, gpu::swiglu_forward(out, inp));
  dispatch_storage(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::swiglu_forward<S>(storage_ptr<S>(out), storage_ptr<S>(inp), N, H);
  });
}

void swiglu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  const char* op = "swiglu_backward";
  int64_t N, H;
  check_halves(op, inp, dout, "dout", N, H);
  check_defined(dinp, op, "dinp"), check_same_dtype(dinp, inp, op, "dinp", "inp");
  check_same_device(dinp, inp, op, "dinp", "inp"), check_shape(dinp, inp.shape(), op, "dinp");
  CHECK(!overlaps(dinp, dout) && !overlaps(dinp, inp), "{}: dinp overlaps dout or inp", op);
  if (inp.device() == Device::CUDA) MT_ON_CUDA(op, gpu::swiglu_backward(dinp, dout, inp));
  dispatch_storage(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::swiglu_backward<S>(storage_ptr<S>(dinp), storage_ptr<S>(dout), storage_ptr<S>(inp), N, H);
  });
}

}  // namespace mt::kernels
