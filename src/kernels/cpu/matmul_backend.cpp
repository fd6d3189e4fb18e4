// The CPU matmul library choice (see matmul_backend.h).
#include "kernels/cpu/matmul_backend.h"

#include <fmt/format.h>

#include "kernels/cpu/onednn_gemm.h"

namespace mt::kernels::cpu {
namespace {
// From bench/bench_matmul's measurements (docs/performance.md, "CPU matmul libraries"): on an Intel Xeon with
// AVX-512, oneDNN's fp32 ran 1.14-1.38x Eigen's at the model's shapes (1.10-1.31x with oneDNN held to AVX512-BF16).
// Its bf16 beat widening to fp32 by 5x on AMX, and on an AMD EPYC's AVX512-BF16 ran 2.8-2.9x Eigen's fp32 (its
// fp32 1.46-1.60x) at the model's shapes, a bf16 step 1.72x an fp32 one; but on an
// Intel Xeon whose oneDNN was held to AVX512-BF16 (ONEDNN_MAX_CPU_ISA, no AMX) it ran at 0.67x Eigen's fp32 and a
// bf16 step took 1.3x as long as with widening, and on a Xeon without AMX at 0.69-0.80x: there one vdpbf16ps zmm
// (64 flops) issues every other cycle where two fp32 FMAs (32 flops each) issue every cycle, half the flop rate
// (build/bench/bench_isa_peak: 86 against 177 GFLOP/s per core). On an AMD EPYC with AVX2 and no AVX-512 (Zen 3)
// oneDNN's fp32 ran 1.06-1.50x Eigen's at the model's shapes, an fp32 step 1.10x (config A) and 1.38x (B) as fast.
// Older CPUs were never measured and keep Eigen.
MatmulBackends auto_backends() {
  MatmulBackends b;
  if (onednn::has_avx2()) b.fp32 = MatmulLibrary::OneDNN;
  if (onednn::has_amx() || (onednn::has_bf16_dot() && __builtin_cpu_is("amd"))) b.bf16 = MatmulLibrary::OneDNN;
  return b;
}

MatmulBackends& current() {
  static MatmulBackends b = auto_backends();
  return b;
}

const char* name(MatmulLibrary l) { return l == MatmulLibrary::OneDNN ? "oneDNN" : "Eigen"; }
}  // namespace

bool resolve_matmul_backends(CpuMatmul choice, MatmulBackends& out, std::string& error) {
  if (choice == CpuMatmul::Auto) {
    out = auto_backends();
  } else if (choice == CpuMatmul::Eigen) {
    out = MatmulBackends{};
  } else {
    if (!onednn::available()) {
      error = "this build has no oneDNN (install libdnnl-dev, e.g. with scripts/setup.sh, and rebuild)";
      return false;
    }
    // oneDNN 2.6 has bf16 kernels from AVX-512 on (emulating the dot product where the CPU lacks it).
    out = MatmulBackends{MatmulLibrary::OneDNN, onednn::has_avx512() ? MatmulLibrary::OneDNN : MatmulLibrary::Eigen};
  }
  return true;
}

const MatmulBackends& matmul_backends() { return current(); }
void set_matmul_backends(const MatmulBackends& b) { current() = b; }

std::string bf16_widening_reason(CpuMatmul choice) {
  if (choice == CpuMatmul::Eigen) return "train.cpu_matmul=eigen";
  if (!onednn::available()) return "this build has no oneDNN";
  if (!onednn::has_avx512()) return "oneDNN's bf16 kernels need AVX-512, which this CPU lacks";
  if (onednn::has_bf16_dot())  // auto_backends(): an Intel CPU with AVX512-BF16 and no AMX
    return "this CPU has AVX512-BF16 but no AMX, and on Intel that dot product computes at half the rate of its fp32 "
           "FMAs (build/bench/bench_isa_peak): oneDNN's bf16 measured 0.67-0.80x Eigen's fp32 on such a Xeon";
  return "this CPU has no bf16 dot product (neither AMX nor AVX512-BF16)";
}

std::string describe(const MatmulBackends& b) {
  return fmt::format("fp32 {}, bf16 {} (oneDNN ISA: {})", name(b.fp32),
                     b.bf16 == MatmulLibrary::OneDNN ? "oneDNN" : fmt::format("widened to fp32 on {}", name(b.fp32)),
                     onednn::isa_name());
}

}  // namespace mt::kernels::cpu
