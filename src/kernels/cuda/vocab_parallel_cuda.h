// GPU vocab-parallel softmax + cross-entropy steps (kernels/vocab_parallel.h): declarations only, without CUDA
// headers, so every build can include them. The entry points in kernels/vocab_parallel.cpp check the arguments
// (but cannot read device targets: see vocab_parallel_cuda.cu). N rows of Vl local logits, nreal of them real.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::kernels::gpu {

void vocab_parallel_xent_local_max(const Tensor& row_max, const Tensor& logits, int64_t nreal);
void vocab_parallel_xent_local_sums(const Tensor& stats, const Tensor& logits, const Tensor& targets,
                                    const Tensor& row_max, int64_t v0, int64_t nreal);
void vocab_parallel_xent_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                const Tensor& targets, const Tensor& row_max, const Tensor& stats, int64_t v0,
                                int64_t vocab, int64_t nreal, double dloss);

}  // namespace mt::kernels::gpu
