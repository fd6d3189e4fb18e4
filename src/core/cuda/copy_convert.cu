// copy_convert for GPU tensors (core/device_memory.h): byte copies through cudaMemcpyAsync on the compute
// stream, dtype conversion on the GPU by one elementwise kernel (round to nearest even, as the CPU path does).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/cuda/cuda_context.h"
#include "core/cuda_check.h"
#include "core/device_memory.h"

namespace mt::detail {
namespace {

__device__ double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::I32: return static_cast<const int32_t*>(p)[i];
  }
  return 0;
}

// Conversions to 16-bit types go through fp32 (as the CPU's float_to_bf16 does), so an fp64 source rounds twice
// on both devices alike.
__device__ void store_from_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v)); break;
    case DType::F16: static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v)); break;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
  }
}

__global__ void cast_kernel(void* dst, DType dt, const void* src, DType st, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_from_double(dst, dt, i, load_as_double(src, st, i));
}

void copy_bytes(void* dst, const void* src, size_t bytes, bool to_host) {
  if (!bytes) return;
  cudaStream_t s = compute_stream();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  if (to_host) wait_for_compute_stream();
}

}  // namespace

void device_copy_convert(const Tensor& dst, const Tensor& src) {
  const bool to_host = dst.device() == Device::CPU;
  if (dst.dtype() == src.dtype()) return copy_bytes(dst.data(), src.data(), src.nbytes(), to_host);
  if (src.device() == Device::CPU) {  // convert on the host, then upload
    Tensor staged = Tensor::empty(src.shape(), dst.dtype());
    copy_convert(staged, src);
    return copy_bytes(dst.data(), staged.data(), staged.nbytes(), false);
  }
  if (to_host) {  // download, then convert on the host
    Tensor staged = Tensor::empty(src.shape(), src.dtype());
    copy_bytes(staged.data(), src.data(), src.nbytes(), true);
    return copy_convert(dst, staged);
  }
  const int64_t n = src.numel();
  if (!n) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 4096));
  cast_kernel<<<blocks, threads, 0, compute_stream()>>>(dst.data(), dst.dtype(), src.data(), src.dtype(), n);
  CUDA_LAUNCH_CHECK();
}

}  // namespace mt::detail
