// cuBLASLt, opened on first use (dlopen) rather than linked. Loading libcublasLt (540 MB) relocates about 210 MB of
// its data: 0.15 s of CPU time and 210 MB of memory in every process that links it, every rank of every CPU run
// included. Opened here, only a process whose CUDA matmuls run pays that. The declarations still come from
// <cublasLt.h>, so every call is type-checked against the installed toolkit.
#pragma once
#include <cublasLt.h>
#include <fmt/format.h>

#include "core/check.h"

// Every cuBLASLt function meshtrain calls; a field of that name in CublasLt points to it.
#define MT_CUBLASLT_FUNCTIONS(X)                                                                      \
  X(cublasLtCreate)                                                                                   \
  X(cublasLtGetStatusString)                                                                          \
  X(cublasLtMatmul)                                                                                   \
  X(cublasLtMatmulAlgoGetHeuristic)                                                                   \
  X(cublasLtMatmulDescCreate)                                                                         \
  X(cublasLtMatmulDescSetAttribute)                                                                   \
  X(cublasLtMatmulPreferenceCreate)                                                                   \
  X(cublasLtMatmulPreferenceDestroy)                                                                  \
  X(cublasLtMatmulPreferenceSetAttribute)                                                             \
  X(cublasLtMatrixLayoutCreate)

namespace mt::kernels::gpu {

struct CublasLt {
#define MT_CUBLASLT_FIELD(name) decltype(&::name) name = nullptr;
  MT_CUBLASLT_FUNCTIONS(MT_CUBLASLT_FIELD)
#undef MT_CUBLASLT_FIELD
};

// The library's functions, opened on the first call (thread-safe); a library that cannot be opened, or lacks one
// of them, stops the process with the reason (CHECK).
const CublasLt& cublaslt();

}  // namespace mt::kernels::gpu

// cuBLASLt calls: as CUDA_CHECK (core/cuda_check.h), with cuBLASLt's own status text.
#define CUBLAS_CHECK(call)                                                                                \
  do {                                                                                                    \
    const cublasStatus_t mt_cublas_rc_ = (call);                                                          \
    if (mt_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                                           \
      ::mt::check_failed(                                                                                 \
          #call, __FILE__, __LINE__,                                                                      \
          ::fmt::format("cuBLAS error {}: {}", static_cast<int>(mt_cublas_rc_),                           \
                        ::mt::kernels::gpu::cublaslt().cublasLtGetStatusString(mt_cublas_rc_)));          \
  } while (0)
