// Argument checks shared by the kernels' public entry points (shapes, dtypes, devices), with messages that
// name the kernel and the argument, and the one place that says what a CUDA tensor does without the backend.
#pragma once
#include "core/check.h"
#include "core/tensor.h"
#include "kernels/cpu/storage.h"

namespace mt::kernels::detail {

inline void check_defined(const Tensor& t, const char* op, const char* name) {
  MT_CHECK(t.defined(), "{}: {} is undefined", op, name);
}

inline void check_float(const Tensor& t, const char* op, const char* name) {
  MT_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, "{}: {} must be fp32 or fp64, is {}", op, name,
        dtype_name(t.dtype()));
}

inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* na, const char* nb) {
  MT_CHECK(a.dtype() == b.dtype(), "{}: {} is {} but {} is {}", op, na, dtype_name(a.dtype()), nb,
        dtype_name(b.dtype()));
}

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* na, const char* nb) {
  MT_CHECK(a.device() == b.device(), "{}: {} is on {} but {} is on {}", op, na, device_name(a.device()), nb,
        device_name(b.device()));
}

inline void check_shape(const Tensor& t, const Shape& s, const char* op, const char* name) {
  MT_CHECK(t.shape() == s, "{}: {} has shape {}, expected {}", op, name, t.shape().str(), s.str());
}

using mt::acc_dtype;  // core/dtype.h

inline void check_activation(const Tensor& t, const char* op, const char* name) {
  MT_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64 || t.dtype() == DType::BF16 || t.dtype() == DType::F16,
           "{}: {} must be fp32, fp64, bf16 or fp16, is {}", op, name, dtype_name(t.dtype()));
}

// Calls f(S{}) with the CPU storage type of `t` (float, double, cpu::bf16, cpu::fp16).
template <typename F>
decltype(auto) dispatch_storage(DType t, F&& f) {
  switch (t) {
    case DType::F64: return f(double{});
    case DType::BF16: return f(cpu::bf16{});
    case DType::F16: return f(cpu::fp16{});
    default: return f(float{});
  }
}

[[noreturn]] inline void no_cuda(const char* op) {
  MT_CHECK(false, "{}: tensor is on cuda, but meshtrain was built without the CUDA backend", op);
  __builtin_unreachable();
}

// The device dispatch of a kernel's entry point, after its argument checks:
//   if (inp.device() == Device::CUDA) MT_ON_CUDA(op, gpu::matmul_forward(...));
// returns the GPU kernel's call in CUDA builds; without the backend the call is dropped (its declarations
// in kernels/cuda/*.h need no CUDA header either way) and the kernel fails with no_cuda's message.
#ifdef MESHTRAIN_WITH_CUDA
#define MT_ON_CUDA(op, call) return call
#else
#define MT_ON_CUDA(op, call) ::mt::kernels::detail::no_cuda(op)
#endif

// The dtype of a CPU storage type (float, double, cpu::bf16, cpu::fp16).
template <typename S>
constexpr DType storage_dtype() {
  if constexpr (std::is_same_v<S, double>) return DType::F64;
  else if constexpr (std::is_same_v<S, cpu::bf16>) return DType::BF16;
  else if constexpr (std::is_same_v<S, cpu::fp16>) return DType::F16;
  else return DType::F32;
}

// t's elements as S* (nullptr when t is undefined: an optional argument), for the S chosen by dispatch_storage.
template <typename S>
S* storage_ptr(const Tensor& t) {
  MT_CHECK(!t.defined() || t.dtype() == storage_dtype<S>(), "tensor is {}, accessed as {}", dtype_name(t.dtype()),
           dtype_name(storage_dtype<S>()));
  return static_cast<S*>(t.data());
}

// An argument in the accumulation dtype of `activation` (statistics, losses, parameter gradients).
inline void check_acc_dtype(const Tensor& t, DType activation, const char* op, const char* name) {
  MT_CHECK(t.dtype() == acc_dtype(activation), "{}: {} is {}, expected {} (the accumulation dtype of {})", op, name,
           dtype_name(t.dtype()), dtype_name(acc_dtype(activation)), dtype_name(activation));
}

// losses: the accumulation dtype of the logits (fp32 for bf16/fp16); fp32 and fp64 logits take either fp32 or
// fp64 losses, as they always have.
inline void check_losses(const Tensor& losses, const Tensor& logits, const char* op) {
  if (logits.dtype() == DType::F32 || logits.dtype() == DType::F64) return check_float(losses, op, "losses");
  check_acc_dtype(losses, logits.dtype(), op, "losses");
}

// Whether two tensors' element ranges overlap.
inline bool overlaps(const Tensor& x, const Tensor& y) {
  const char *xb = static_cast<const char*>(x.data()), *yb = static_cast<const char*>(y.data());
  return xb < yb + y.nbytes() && yb < xb + x.nbytes();
}

}  // namespace mt::kernels::detail
