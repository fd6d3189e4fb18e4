// The device services of core/device.h for builds without the CUDA backend, and to_host (both builds).
#include "core/device.h"

#include "core/device_memory.h"

namespace mt {

#ifndef MESHTRAIN_WITH_CUDA
bool cuda_built() { return false; }
bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
void cuda_init(int) { MT_CHECK(false, "device=cuda: this build has no CUDA backend (nvcc and NCCL were not found)"); }
int cuda_device_index() { return -1; }
CUstream_st* cuda_compute_stream() { return nullptr; }
void device_synchronize(Device) {}
DeviceMemoryStats device_memory_stats() { return {}; }
uint64_t device_host_waits() { return 0; }
void reset_device_memory_peak() {}
namespace detail {
[[noreturn]] static void no_backend(const char* what) {
  MT_CHECK(false, "{} of a cuda tensor: this build has no CUDA backend", what);
  __builtin_unreachable();
}
std::shared_ptr<void> device_alloc(size_t) { no_backend("allocation"); }
void device_zero(void*, size_t) { no_backend("zero_"); }
void device_copy_convert(const Tensor&, const Tensor&) { no_backend("copy"); }
}  // namespace detail
#endif

Tensor to_host(const Tensor& t) {
  if (t.device() == Device::CPU) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  copy_convert(h, t);  // device to host copies synchronise
  return h;
}

double read_scalar(const Tensor& t) {
  MT_CHECK(t.numel() >= 1 && (t.dtype() == DType::F32 || t.dtype() == DType::F64),
           "read_scalar: {} tensor of {} elements", dtype_name(t.dtype()), t.numel());
  // Read in t's own dtype: a plain copy, with no conversion staged through a temporary (twice per step on a GPU).
  if (t.dtype() == DType::F64) {
    double v = 0;
    copy_convert(Tensor(&v, {1}, DType::F64), t.slice(0, {1}));
    return v;
  }
  float v = 0;
  copy_convert(Tensor(&v, {1}, DType::F32), t.slice(0, {1}));
  return v;
}

}  // namespace mt
