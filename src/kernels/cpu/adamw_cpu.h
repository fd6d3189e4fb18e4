// CPU AdamW over flat buffers (see kernels/adamw.h).
#pragma once
#include <cstdint>

#include "kernels/adamw.h"

namespace mt::kernels::cpu {

// P: parameter/state type, G: gradient type.
template <typename P, typename G>
void adamw_update(P* params, const G* grads, P* m, P* v, double grad_scale, int64_t n, const AdamWHyper& h);

}  // namespace mt::kernels::cpu
