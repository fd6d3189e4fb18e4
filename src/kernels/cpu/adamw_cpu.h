// CPU AdamW over flat buffers (see kernels/adamw.h).
#pragma once
#include <cstdint>

#include "kernels/adamw.h"
#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

// P: parameter/state type, G: gradient type, R: the type of `rounded` (bf16 or fp16 beside fp32; void: none).
template <typename P, typename G, typename R = void>
void adamw_update(P* params, const G* grads, P* m, P* v, double grad_scale, int64_t n, const AdamWHyper& h,
                  R* rounded = nullptr);

}  // namespace mt::kernels::cpu
