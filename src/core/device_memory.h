// Device-memory primitives behind Tensor::empty, Arena, zero_ and copy_convert for CUDA tensors (core/cuda/).
// In a build without the CUDA backend they fail with a message (core/device.cpp).
#pragma once
#include <cstddef>
#include <memory>

#include "core/tensor.h"

namespace mt::detail {

// `bytes` of device memory from the caching allocator, uninitialised; released back to it with the pointer.
std::shared_ptr<void> device_alloc(size_t bytes);
// Zeroes `bytes` at p, in order on the compute stream (no host synchronisation).
void device_zero(void* p, size_t bytes);
// copy_convert where either tensor is on the GPU. Device-to-device work is queued on the compute stream; a copy
// to the host waits for it, so the host can read the result at once.
void device_copy_convert(const Tensor& dst, const Tensor& src);

}  // namespace mt::detail
