// The process's GPU state for CUDA sources: its compute stream and its caching device allocator. Every kernel
// of the step runs on compute_stream(), so work is ordered without host synchronisation; communicators order
// their own streams after it with events. Include only from CUDA-enabled sources.
#pragma once
#include <cuda_runtime_api.h>

#include "core/caching_allocator.h"

namespace mt {

// The stream every kernel is launched on (created by cuda_init, core/device.h; CHECKs that it was called).
cudaStream_t compute_stream();
// The allocator behind Tensor::empty and Arena on the GPU.
CachingAllocator& device_allocator();
// Waits for the compute stream, counted for device_host_waits() (core/device.h).
void wait_for_compute_stream();

}  // namespace mt
