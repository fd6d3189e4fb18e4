// Fatal checks for CUDA runtime and NCCL calls: CUDA_CHECK / NCCL_CHECK print the call, file:line,
// the MPI rank and the library's error name and string, then abort (as CHECK does, core/check.h). Every CUDA
// and NCCL call in the project goes through one of them. Include only from CUDA-enabled sources
// (MESHTRAIN_WITH_CUDA); NCCL_CHECK also needs <nccl.h> included by the caller.
#pragma once
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "core/check.h"

#define CUDA_CHECK(call)                                                                                  \
  do {                                                                                                    \
    const cudaError_t mt_cuda_rc_ = (call);                                                               \
    if (mt_cuda_rc_ != cudaSuccess)                                                                       \
      ::mt::check_failed(#call, __FILE__, __LINE__,                                                       \
                         ::fmt::format("CUDA error {}: {}", cudaGetErrorName(mt_cuda_rc_),                \
                                       cudaGetErrorString(mt_cuda_rc_)));                                 \
  } while (0)

#define NCCL_CHECK(call)                                                                                  \
  do {                                                                                                    \
    const ncclResult_t mt_nccl_rc_ = (call);                                                              \
    if (mt_nccl_rc_ != ncclSuccess)                                                                       \
      ::mt::check_failed(#call, __FILE__, __LINE__,                                                       \
                         ::fmt::format("NCCL error {}: {}", static_cast<int>(mt_nccl_rc_),                \
                                       ncclGetErrorString(mt_nccl_rc_)));                                 \
  } while (0)

// After every kernel launch: a bad configuration or an earlier asynchronous fault surfaces here, at the launch.
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())
