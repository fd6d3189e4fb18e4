// Which library runs the CPU's fp32 and bf16 matmuls: Eigen or oneDNN for fp32; for bf16 either oneDNN on the CPU's
// bf16 instructions (AMX or AVX512-BF16, fp32 accumulation) or widening to fp32 and fp32's library. One choice per
// process, made at start (train.cpu_matmul) like the compute thread count; fp64 always runs on Eigen, and fp16
// always widens (oneDNN 2.6 has no fp16 CPU kernels). docs/performance.md ("CPU matmul libraries") has the
// measurements behind "auto".
#pragma once
#include <cstdint>
#include <string>

#include "core/enum_names.h"

namespace mt::kernels::cpu {

// train.cpu_matmul
enum class CpuMatmul : uint8_t { Auto, Eigen, OneDNN };
inline const auto& enum_names(CpuMatmul) {
  static constexpr EnumName<CpuMatmul> names[] = {
      {CpuMatmul::Auto, "auto"}, {CpuMatmul::Eigen, "eigen"}, {CpuMatmul::OneDNN, "onednn"}};
  return names;
}

enum class MatmulLibrary { Eigen, OneDNN };

struct MatmulBackends {
  MatmulLibrary fp32 = MatmulLibrary::Eigen;
  MatmulLibrary bf16 = MatmulLibrary::Eigen;  // Eigen: widened to fp32, on fp32's library
};

// auto: oneDNN for bf16 on AMX and on AMD's AVX512-BF16, for fp32 from AVX2 on, Eigen otherwise (the measurements
// behind it: matmul_backend.cpp); eigen: Eigen for both; onednn: oneDNN for both (bf16 only from AVX-512 on, Eigen
// below). Returns false and says why in `error` for onednn in a build without oneDNN.
bool resolve_matmul_backends(CpuMatmul choice, MatmulBackends& out, std::string& error);

// The process's backends; "auto"'s until set.
const MatmulBackends& matmul_backends();
void set_matmul_backends(const MatmulBackends& b);

// Sets the process's backends for its lifetime (tests and benchmarks that compare the libraries).
class UsingMatmulBackends {
 public:
  explicit UsingMatmulBackends(const MatmulBackends& b) : saved_(matmul_backends()) { set_matmul_backends(b); }
  ~UsingMatmulBackends() { set_matmul_backends(saved_); }
  UsingMatmulBackends(const UsingMatmulBackends&) = delete;
  UsingMatmulBackends& operator=(const UsingMatmulBackends&) = delete;

 private:
  MatmulBackends saved_;
};

// Why `choice` widens bf16's matmuls to fp32 on this CPU and build, for the log; meaningful only where
// resolve_matmul_backends(choice) gave bf16 = Eigen.
std::string bf16_widening_reason(CpuMatmul choice);

// One line for the log: each dtype's library and the ISA oneDNN runs on.
std::string describe(const MatmulBackends& b);

}  // namespace mt::kernels::cpu
