// Which devices this build and machine can use, and the device services that code without CUDA headers calls:
// choosing the GPU, waiting for its compute stream, and device memory statistics. In a build without the CUDA
// backend every function here answers "no GPU" (or fails with a clear message where a GPU is required).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

struct CUstream_st;  // cudaStream_t == CUstream_st*, so this header needs no CUDA header

namespace mt {

bool cuda_built();      // compiled with the CUDA backend (MESHTRAIN_WITH_CUDA)
bool cuda_available();  // built with it, and this process sees at least one usable GPU
int cuda_device_count();  // GPUs visible to this process (0 without the backend)

// Selects GPU (local_rank mod the visible GPUs) for this process and creates its compute stream; idempotent.
// Several ranks on one node share GPUs round-robin (several ranks on one GPU is allowed: correctness tests).
// Fails with a message when no GPU is usable.
void cuda_init(int local_rank);
int cuda_device_index();  // the selected GPU (-1 before cuda_init)
// The stream every kernel runs on (nullptr without the backend), for code that passes it on (NCCL).
CUstream_st* cuda_compute_stream();

// Blocks the host until everything issued to the device's compute stream has finished (no-op for cpu).
void device_synchronize(Device d);

// The caching allocator's counters for device memory, in bytes: handed out now, the most handed out at once since
// the start or the last reset, held from the driver (handed out + cached), and how many cudaMalloc calls it made.
struct DeviceMemoryStats {
  size_t in_use = 0, peak = 0, reserved = 0;
  uint64_t driver_allocations = 0;
};
DeviceMemoryStats device_memory_stats();
void reset_device_memory_peak();
// How many times the host has waited for the compute stream (device_synchronize, or a copy to the host): every
// read of a device value is one. 0 without the CUDA backend.
uint64_t device_host_waits();

// A host copy of `t` (itself when t is already on the host): for reading device results (losses, norms,
// checkpoints) outside the step's hot path. Synchronises with the compute stream.
Tensor to_host(const Tensor& t);
// Element 0 of a 1-element fp32 or fp64 tensor on any device, as a double (a device read synchronises).
double read_scalar(const Tensor& t);

}  // namespace mt
