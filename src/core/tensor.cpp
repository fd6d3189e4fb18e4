// Tensor allocation, zeroing and dtype-converting copies: host memory here, GPU memory through
// core/device_memory.h.
#include "core/tensor.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/device_memory.h"

namespace mt {

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

namespace {
std::atomic<size_t> g_tensor_bytes{0}, g_peak_tensor_bytes{0};

}  // namespace

void count_host_tensor_bytes(int64_t delta) {
  const size_t now = g_tensor_bytes.fetch_add(size_t(delta)) + size_t(delta);  // wraps back for delta < 0
  size_t peak = g_peak_tensor_bytes.load();
  while (delta > 0 && now > peak && !g_peak_tensor_bytes.compare_exchange_weak(peak, now)) {
  }
}

size_t host_tensor_bytes() { return g_tensor_bytes.load(); }
size_t peak_host_tensor_bytes() { return g_peak_tensor_bytes.load(); }
void reset_peak_host_tensor_bytes() { g_peak_tensor_bytes.store(g_tensor_bytes.load()); }

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (device == Device::CUDA) {
    std::shared_ptr<void> mem = detail::device_alloc(bytes);
    detail::device_zero(mem.get(), bytes);
    Tensor t(mem.get(), shape, dtype, device);
    t.owner_ = std::move(mem);
    return t;
  }
  const size_t held = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, held);
  CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, held);
  count_host_tensor_bytes(int64_t(held));
  Tensor t(p, shape, dtype, device);
  t.owner_ = std::shared_ptr<void>(p, [held](void* q) {
    count_host_tensor_bytes(-int64_t(held));
    std::free(q);
  });
  return t;
}

void zero_(const Tensor& t) {
  if (t.device() == Device::CUDA) return detail::device_zero(t.data(), t.nbytes());
  // The step zeroes the whole gradient buffer (tens of MB): one memset per thread, as one thread alone does
  // not reach the memory bandwidth.
  const size_t bytes = t.nbytes(), kGrain = size_t(1) << 20;
  char* p = static_cast<char*>(t.data());
  if (bytes < 2 * kGrain || omp_in_parallel() || omp_get_max_threads() == 1) {
    std::memset(p, 0, bytes);
    return;
  }
#pragma omp parallel
  {
    const size_t nt = size_t(omp_get_num_threads()), i = size_t(omp_get_thread_num());
    const size_t per = (bytes / nt + 63) / 64 * 64, b = std::min(bytes, i * per);
    const size_t e = i + 1 == nt ? bytes : std::min(bytes, b + per);
    std::memset(p + b, 0, e - b);
  }
}

namespace {
double load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::I32: return static_cast<const int32_t*>(p)[i];
  }
  return 0;
}
void store(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_fp16(static_cast<float>(v)); break;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
  }
}
}  // namespace

void copy_convert(const Tensor& dst, const Tensor& src) {
  CHECK(dst.numel() == src.numel(), "copy of {} elements into {}", src.numel(), dst.numel());
  if (dst.device() == Device::CUDA || src.device() == Device::CUDA) return detail::device_copy_convert(dst, src);
  if (dst.dtype() == src.dtype()) {
    std::memmove(dst.data(), src.data(), src.nbytes());
    return;
  }
  // The casts of every step (fp32 masters to the bf16/fp16 compute copy, 16-bit gradient buckets back to fp32)
  // take a direct, parallel loop; the rest go through double, which is exact to the final rounding because
  // fp32 values are exact in fp64.
  const int64_t n = src.numel();
  const bool par = n > (int64_t(1) << 16) && !omp_in_parallel();
  if (src.dtype() == DType::F32 && (dst.dtype() == DType::BF16 || dst.dtype() == DType::F16)) {
    const float* x = src.data_as<float>();
    uint16_t* y = static_cast<uint16_t*>(dst.data());
    const bool bf = dst.dtype() == DType::BF16;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < n; ++i) y[i] = bf ? float_to_bf16(x[i]) : float_to_fp16(x[i]);
    return;
  }
  if (dst.dtype() == DType::F32 && (src.dtype() == DType::BF16 || src.dtype() == DType::F16)) {
    const uint16_t* x = static_cast<const uint16_t*>(src.data());
    float* y = dst.data_as<float>();
    const bool bf = src.dtype() == DType::BF16;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < n; ++i) y[i] = bf ? bf16_to_float(x[i]) : fp16_to_float(x[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) store(dst.data(), dst.dtype(), i, load(src.data(), src.dtype(), i));
}

}  // namespace mt
