// cuBLASLt is opened on first use (kernels/cuda/cublaslt_library.h), not linked: a process that runs no CUDA
// matmul, as every CPU run, never maps the library. Needs no GPU: opening cuBLASLt does not need the driver.
#include <catch2/catch.hpp>

#ifdef MESHTRAIN_WITH_CUDA
#include <fstream>
#include <sstream>
#include <string>

#include "kernels/cuda/cublaslt_library.h"

namespace {

bool cublaslt_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find("libcublasLt") != std::string::npos;
}

}  // namespace

TEST_CASE("cuBLASLt: not mapped until the first call, then every function it is called through resolved") {
  REQUIRE_FALSE(cublaslt_mapped());
  const mt::kernels::gpu::CublasLt& lt = mt::kernels::gpu::cublaslt();
  CHECK(cublaslt_mapped());
#define MT_CHECK_RESOLVED(name) CHECK(lt.name != nullptr);
  MT_CUBLASLT_FUNCTIONS(MT_CHECK_RESOLVED)
#undef MT_CHECK_RESOLVED
  // The text CUBLAS_CHECK reports comes from the library itself.
  CHECK(std::string(lt.cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)).find("not supported") !=
        std::string::npos);
}
#endif
