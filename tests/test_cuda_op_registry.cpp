// The op registry on the GPU (tests/op_registry.h): every case's CUDA kernels against the CPU's, in fp32 and in each
// 16-bit dtype the case runs in, on the same inputs. Skipped (exit 77) where no GPU can be used.
#include <catch2/catch.hpp>

#include "op_registry.h"
#include "op_registry_check.h"

using namespace mt;
using namespace mt::test;

TEST_CASE("op registry: every case's CUDA kernels against the CPU's", "[cuda]") {
  for (const OpCase& c : op_cases()) {
    std::vector<DType> dtypes{DType::F32};
    dtypes.insert(dtypes.end(), c.half.begin(), c.half.end());
    for (DType d : dtypes) {
      const OpOutputs ref = c.run(OpRun(d, d, Device::CPU));
      compare_runs(c, std::string(dtype_name(d)) + ", CUDA against the CPU", c.run(OpRun(d, d, Device::CUDA)), ref,
                   [&](const Tensor& out) {
                     if (out.dtype() == DType::BF16) return c.tol->bf16;
                     if (out.dtype() == DType::F16) return c.tol->fp16;
                     return c.tol->gpu;
                   });
    }
  }
}
