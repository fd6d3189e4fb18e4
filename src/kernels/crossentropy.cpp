// softmax_xent_forward_backward: argument checks and device dispatch (kernels/crossentropy.h).
#include "kernels/crossentropy.h"

#include "kernels/cpu/crossentropy_cpu.h"
#include "kernels/cuda/crossentropy_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

void softmax_xent_forward_backward(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& targets, int64_t vocab, double dloss) {
  const char* op = "softmax_xent_forward_backward";
  check_defined(losses, op, "losses"), check_defined(logits, op, "logits"), check_defined(targets, op, "targets");
  check_activation(logits, op, "logits"), check_losses(losses, logits, op);
  CHECK(targets.dtype() == DType::I32, "{}: targets must be int32, is {}", op, dtype_name(targets.dtype()));
  check_same_device(losses, logits, op, "losses", "logits"), check_same_device(targets, logits, op, "targets", "logits");
  const int64_t Vp = logits.dim(-1), N = logits.numel() / Vp;
  CHECK(vocab >= 1 && vocab <= Vp, "{}: vocab {} must be in [1, {}] (the padded width)", op, vocab, Vp);
  CHECK(losses.numel() == N && targets.numel() == N, "{}: losses/targets have {}/{} elements, expected N={}", op,
        losses.numel(), targets.numel(), N);
  if (dlogits.defined()) {
    check_same_dtype(dlogits, logits, op, "dlogits", "logits"), check_same_device(dlogits, logits, op, "dlogits", "logits");
    CHECK(dlogits.numel() == logits.numel(), "{}: dlogits has shape {}, logits {}", op, dlogits.shape().str(),
          logits.shape().str());
  }
  // Device targets are not range-checked here (that would synchronise); the GPU kernel gives an out-of-range
  // target a NaN loss and never uses it as an address (kernels/cuda/crossentropy_cuda.cu).
  if (logits.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::softmax_xent_forward_backward(losses, dlogits, logits, targets, vocab, dloss));
  const int32_t* t = targets.data_as<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    CHECK(t[n] >= 0 && t[n] < vocab, "{}: target {} at row {} is outside [0, {})", op, t[n], n, vocab);
  dispatch_storage(logits.dtype(), [&](auto s) {
    using S = decltype(s);
    S* d = storage_ptr<S>(dlogits);
    const S* l = storage_ptr<S>(logits);
    if (losses.dtype() == DType::F32) {
      cpu::softmax_xent_forward_backward<S, float>(losses.data_as<float>(), d, l, t, N, Vp, vocab, dloss);
    } else if constexpr (!cpu::is_16bit<S>) {
      cpu::softmax_xent_forward_backward<S, double>(losses.data_as<double>(), d, l, t, N, Vp, vocab, dloss);
    }
  });
}

}  // namespace mt::kernels
