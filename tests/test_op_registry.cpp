// The op registry on the CPU (tests/op_registry.h): every case in fp32 against fp64, and every 16-bit path against
// fp32 on the same values, each on every matmul library this build and CPU can run; and every kernel entry point
// of src/kernels/*.h has a case. The CUDA kernels against these: test_cuda_op_registry.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "kernels/cpu/matmul_backend.h"
#include "kernels/cpu/onednn_gemm.h"
#include "op_registry.h"
#include "op_registry_check.h"

using namespace mt;
using namespace mt::test;
using kernels::cpu::MatmulLibrary;

namespace {
// The matmul libraries that can run `dtype` here (fp16 and fp64 always run on Eigen).
std::vector<MatmulLibrary> libraries(DType dtype) {
  std::vector<MatmulLibrary> libs{MatmulLibrary::Eigen};
  if ((dtype == DType::F32 && kernels::cpu::onednn::available()) ||
      (dtype == DType::BF16 && kernels::cpu::onednn::has_avx512()))
    libs.push_back(MatmulLibrary::OneDNN);
  else if (dtype == DType::F32 || dtype == DType::BF16)
    WARN("oneDNN's " << dtype_name(dtype) << " matmul not checked: "
                     << (kernels::cpu::onednn::available() ? "it needs AVX-512" : "built without oneDNN"));
  return libs;
}
const char* name(MatmulLibrary l) { return l == MatmulLibrary::OneDNN ? "oneDNN" : "Eigen"; }
}  // namespace

TEST_CASE("op registry: every case on the CPU in fp32 against fp64") {
  for (MatmulLibrary lib : libraries(DType::F32)) {
    kernels::cpu::UsingMatmulBackends use({lib, MatmulLibrary::Eigen});
    for (const OpCase& c : op_cases()) {
      if (!c.fp64) continue;
      const OpOutputs ref = c.run(OpRun(DType::F64, DType::F32, Device::CPU));
      compare_runs(c, std::string("fp32 against fp64, matmuls on ") + name(lib),
                   c.run(OpRun(DType::F32, DType::F32, Device::CPU)), ref,
                   [&](const Tensor&) { return c.tol->fp32; });
    }
  }
}

TEST_CASE("op registry: every 16-bit path on the CPU against fp32 on the same values") {
  for (DType d : {DType::BF16, DType::F16})
    for (MatmulLibrary lib : libraries(d)) {
      kernels::cpu::UsingMatmulBackends use({MatmulLibrary::Eigen, lib});
      for (const OpCase& c : op_cases()) {
        if (std::find(c.half.begin(), c.half.end(), d) == c.half.end()) continue;
        const OpOutputs ref = c.run(OpRun(DType::F32, d, Device::CPU));
        compare_runs(c, std::string(dtype_name(d)) + " against fp32, matmuls on " + name(lib),
                     c.run(OpRun(d, d, Device::CPU)), ref,
                     [&](const Tensor&) { return d == DType::BF16 ? c.tol->bf16 : c.tol->fp16; });
      }
    }
}

TEST_CASE("op registry: every kernel entry point of src/kernels/*.h has a case, and every case names one") {
  std::set<std::string> declared;
  const std::regex decl(R"(^void\s+([a-z_0-9]+)\()");
  for (const auto& f : std::filesystem::directory_iterator(std::string(MESHTRAIN_SOURCE_DIR) + "/src/kernels")) {
    if (f.path().extension() != ".h") continue;
    std::ifstream in(f.path());
    std::string line;
    std::smatch m;
    while (std::getline(in, line))
      if (std::regex_search(line, m, decl)) declared.insert(m[1]);
  }
  REQUIRE(declared.size() > 30);  // the scan found the headers
  for (const std::string& s : not_ops()) declared.erase(s);
  std::set<std::string> covered;
  for (const OpCase& c : op_cases()) covered.insert(c.ops.begin(), c.ops.end());
  for (const std::string& op : declared) {
    INFO(op << " is declared in src/kernels/*.h but has no case in tests/op_cases.cpp");
    CHECK(covered.count(op) == 1);
  }
  for (const std::string& op : covered) {
    INFO(op << " has a case but no declaration in src/kernels/*.h");
    CHECK(declared.count(op) == 1);
  }
}
