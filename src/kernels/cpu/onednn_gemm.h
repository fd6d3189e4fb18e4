// oneDNN's matmul as a GEMM for the CPU kernels: C[M, N] (= or +=) op(A)[M, K] op(B)[K, N] (+ bias[N]) on
// row-major operands with leading dimensions, A and B in fp32 or bf16, C in fp32 or A's type, accumulating in fp32.
// Primitives are created once per distinct call and cached. Where meshtrain is built without oneDNN, available()
// is false and gemm() must not be called (kernels/cpu/matmul_backend.h never chooses it then).
#pragma once
#include <cstdint>
#include <string>

namespace mt::kernels::cpu::onednn {

enum class Type { F32, BF16 };

struct GemmShape {
  int64_t M, N, K;
  bool trans_a, trans_b;  // A is stored [K, M] (ld lda) / B is stored [N, K] (ld ldb)
  int64_t lda, ldb, ldc;
  Type ab, c;          // the operands' type and the result's (F32, or ab's)
  bool accumulate;     // C += ... instead of C = ...
  bool bias;           // + bias[N], of type c
};

// Built with oneDNN.
bool available();
// oneDNN's name for the instruction set it runs on ("avx512_core_amx", "avx2", ...); "none" without oneDNN.
std::string isa_name();
// What oneDNN runs on here: AMX tiles with bf16; AVX512-BF16 dot products (or AMX); AVX-512; AVX2 (or AVX-512).
bool has_amx();
bool has_bf16_dot();
bool has_avx512();
bool has_avx2();

void gemm(const GemmShape& s, const void* a, const void* b, const void* bias, void* c);

// The three products of a linear layer with inp [N, C] and W [C, OC] (or [OC, C] when out_in), all row-major:
// out[N, OC] = inp W (+ bias), operands (inp, W);
inline GemmShape forward_shape(int64_t N, int64_t C, int64_t OC, bool out_in, Type t, bool bias) {
  return {N, OC, C, false, out_in, C, out_in ? C : OC, OC, t, t, false, bias};
}
// dinp[N, C] = dout W^T, operands (dout, W);
inline GemmShape dinp_shape(int64_t N, int64_t C, int64_t OC, bool out_in, Type t) {
  return {N, C, OC, false, !out_in, OC, out_in ? C : OC, C, t, t, false, false};
}
// dW (fp32, W's layout) += inp^T dout, operands (inp, dout); out_in: dW += dout^T inp, operands (dout, inp).
inline GemmShape dweight_shape(int64_t N, int64_t C, int64_t OC, bool out_in, Type t) {
  return out_in ? GemmShape{OC, C, N, true, false, OC, C, C, t, Type::F32, true, false}
                : GemmShape{C, OC, N, true, false, C, OC, OC, t, Type::F32, true, false};
}

}  // namespace mt::kernels::cpu::onednn
