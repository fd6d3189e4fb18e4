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

// The accumulation dtype of kernels over `activation`-typed tensors: the dtype of LayerNorm statistics, losses,
// attention-gradient scratch and parameter gradients (fp32 for fp32, bf16 and fp16; fp64 for fp64).
inline DType acc_dtype(DType activation) { return activation == DType::F64 ? DType::F64 : DType::F32; }

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

}  // namespace mt::kernels::detail
