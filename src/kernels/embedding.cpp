// embedding_forward / embedding_backward: argument checks and device dispatch (kernels/embedding.h).
#include "kernels/embedding.h"

#include "kernels/cpu/embedding_cpu.h"
#include "kernels/cuda/embedding_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
void check_tokens(const char* op, const Tensor& tokens, const Tensor& table, int64_t v0, int64_t bound, int64_t& B,
                  int64_t& T) {
  CHECK(v0 >= 0, "{}: v0 = {} is negative", op, v0);
  if (bound < 0) bound = v0 + table.dim(0);
  check_defined(tokens, op, "tokens");
  CHECK(tokens.dtype() == DType::I32, "{}: tokens must be int32, is {}", op, dtype_name(tokens.dtype()));
  CHECK(tokens.ndim() == 2, "{}: tokens must be [B, T], has shape {}", op, tokens.shape().str());
  check_same_device(tokens, table, op, "tokens", "wte");
  B = tokens.dim(0), T = tokens.dim(1);
  // Token ids index memory: an id out of range is a data error that must stop here, not corrupt the heap. Device
  // ids are not read here (that would synchronise): the GPU kernels never index with an id outside [0, bound)
  // and write NaN for it instead (kernels/cuda/embedding_cuda.cu).
  if (tokens.device() == Device::CPU) {
    const int32_t* t = tokens.data_as<int32_t>();
    for (int64_t i = 0; i < B * T; ++i)
      CHECK(t[i] >= 0 && t[i] < bound, "{}: token id {} at position {} is outside [0, {})", op, t[i], i, bound);
  }
}
// The tables (or their gradients): wte of any float dtype, wpe (optional) of the same dtype.
void check_tables(const char* op, const Tensor& wte, const Tensor& wpe, int64_t T, int64_t& C) {
  check_defined(wte, op, "wte"), check_activation(wte, op, "wte");
  CHECK(wte.ndim() == 2, "{}: wte {} must be [*, C]", op, wte.shape().str());
  C = wte.dim(1);
  if (!wpe.defined()) return;
  check_same_dtype(wpe, wte, op, "wpe", "wte"), check_same_device(wpe, wte, op, "wpe", "wte");
  CHECK(wpe.ndim() == 2 && wte.dim(1) == wpe.dim(1), "{}: wte {} and wpe {} must be [*, C]", op,
        wte.shape().str(), wpe.shape().str());
  CHECK(wpe.dim(0) >= T, "{}: sequence length {} exceeds the {} positions of wpe", op, T, wpe.dim(0));
}
}  // namespace

void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t v0,
                       int64_t vocab_bound) {
  const char* op = "embedding_forward";
  int64_t B, T, C;
  check_defined(wte, op, "wte");
  check_tokens(op, tokens, wte, v0, vocab_bound, B, T);
  check_tables(op, wte, wpe, T, C);
  check_defined(out, op, "out"), check_same_dtype(out, wte, op, "out", "wte");
  check_same_device(out, wte, op, "out", "wte"), check_shape(out, Shape{B, T, C}, op, "out");
  if (wte.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::embedding_forward(out, tokens, wte, wpe, v0,
                                          vocab_bound < 0 ? v0 + wte.dim(0) : vocab_bound));
  dispatch_storage(wte.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::embedding_forward<S>(storage_ptr<S>(out), tokens.data_as<int32_t>(), storage_ptr<S>(wte),
                              storage_ptr<S>(wpe), B, T, C, v0, wte.dim(0));
  });
}

void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens, int64_t v0,
                        int64_t vocab_bound) {
  const char* op = "embedding_backward";
  int64_t B, T, C;
  check_defined(dwte, op, "dwte");
  check_tokens(op, tokens, dwte, v0, vocab_bound, B, T);
  check_tables(op, dwte, dwpe, T, C);
  check_defined(dout, op, "dout"), check_activation(dout, op, "dout");
  check_acc_dtype(dwte, dout.dtype(), op, "dwte");  // (and so dwpe, of dwte's dtype)
  check_same_device(dout, dwte, op, "dout", "dwte"), check_shape(dout, Shape{B, T, C}, op, "dout");
  if (dwte.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::embedding_backward(dwte, dwpe, dout, tokens, v0,
                                           vocab_bound < 0 ? v0 + dwte.dim(0) : vocab_bound));
  dispatch_storage(dout.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = cpu::acc_t<S>;
    cpu::embedding_backward<S>(storage_ptr<A>(dwte), storage_ptr<A>(dwpe), storage_ptr<S>(dout),
                               tokens.data_as<int32_t>(), B, T, C, v0, dwte.dim(0));
  });
}

}  // namespace mt::kernels
