// core/device.h for CUDA builds: device selection, the compute stream, the caching allocator and its counters.
#include "core/cuda/cuda_context.h"

#include <atomic>
#include <memory>
#include <mutex>

#include "core/cuda_check.h"
#include "core/device.h"
#include "core/device_memory.h"

namespace mt {
namespace {

// Process-wide, like the GPU itself: created once by cuda_init and never destroyed (destroying a stream or
// freeing memory after the CUDA runtime has shut down at exit fails).
struct Context {
  int device = -1;
  cudaStream_t stream = nullptr;
  CachingAllocator* allocator = nullptr;
};
Context g_ctx;
std::once_flag g_once;
std::atomic<uint64_t> g_host_waits{0};

}  // namespace

bool cuda_built() { return true; }

int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

bool cuda_available() { return cuda_device_count() > 0; }

void cuda_init(int local_rank) {
  std::call_once(g_once, [&] {
    int n = 0;
    const cudaError_t rc = cudaGetDeviceCount(&n);
    MT_CHECK(rc == cudaSuccess && n > 0, "device=cuda: no usable GPU ({})",
             rc == cudaSuccess ? "none visible" : cudaGetErrorString(rc));
    g_ctx.device = local_rank % n;
    CUDA_CHECK(cudaSetDevice(g_ctx.device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g_ctx.stream, cudaStreamNonBlocking));
    g_ctx.allocator = new CachingAllocator(
        [](size_t bytes) -> void* {
          void* p = nullptr;
          if (cudaMalloc(&p, bytes) != cudaSuccess) {
            (void)cudaGetLastError();  // clear the out-of-memory error: the allocator retries or reports it
            return nullptr;
          }
          return p;
        },
        [](void* p) { CUDA_CHECK(cudaFree(p)); });
  });
  // Threads other than the first caller (communicator threads) need the device current too.
  CUDA_CHECK(cudaSetDevice(g_ctx.device));
}

int cuda_device_index() { return g_ctx.device; }
CUstream_st* cuda_compute_stream() { return compute_stream(); }

cudaStream_t compute_stream() {
  MT_CHECK(g_ctx.stream != nullptr, "CUDA used before cuda_init()");
  return g_ctx.stream;
}

CachingAllocator& device_allocator() {
  MT_CHECK(g_ctx.allocator != nullptr, "CUDA used before cuda_init()");
  return *g_ctx.allocator;
}

void wait_for_compute_stream() {
  g_host_waits.fetch_add(1, std::memory_order_relaxed);
  CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
}

uint64_t device_host_waits() { return g_host_waits.load(std::memory_order_relaxed); }

void device_synchronize(Device d) {
  if (d == Device::CUDA) wait_for_compute_stream();
}

DeviceMemoryStats device_memory_stats() {
  if (!g_ctx.allocator) return {};
  const CachingAllocator& a = *g_ctx.allocator;
  return {a.bytes_in_use(), a.peak_bytes_in_use(), a.bytes_reserved(), a.backend_allocations()};
}

void reset_device_memory_peak() {
  if (g_ctx.allocator) g_ctx.allocator->reset_peak();
}

namespace detail {

std::shared_ptr<void> device_alloc(size_t bytes) {
  CachingAllocator& a = device_allocator();
  return std::shared_ptr<void>(a.allocate(bytes), [&a](void* p) { a.release(p); });
}

void device_zero(void* p, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_stream()));
}

}  // namespace detail
}  // namespace mt
