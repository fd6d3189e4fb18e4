// Element types and the fp32 <-> bf16 / fp16 conversions. Conversions round to nearest even, as the GPU does,
// so CPU runs in reduced precision round at the same points and to the same values as GPU runs.
#pragma once
#include <cstdint>
#include <cstring>
#ifdef __F16C__
#include <immintrin.h>
#endif

namespace mt {

// F64 exists for finite-difference gradient checks; training uses F32 masters and F32/BF16/F16 compute.
enum class DType : uint8_t { F32, F64, BF16, F16, I32 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: return 8;
    case DType::BF16:
    case DType::F16: return 2;
    default: return 4;
  }
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F64: return "fp64";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::I32: return "int32";
  }
  return "?";
}

// The accumulation dtype of computations over `activation`-typed tensors: the dtype of LayerNorm statistics,
// losses, attention-gradient scratch and parameter gradients (fp32 for fp32, bf16 and fp16; fp64 for fp64).
inline DType acc_dtype(DType activation) { return activation == DType::F64 ? DType::F64 : DType::F32; }

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// The software conversions work on any CPU; float_to_fp16 / fp16_to_float use the F16C instructions where the
// build targets them (a single instruction each, the same results: tests/test_core.cpp checks the software
// version against F16C bit for bit).
inline uint16_t float_to_fp16_portable(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absu < 0x38800000u) {  // below the smallest normal fp16 (2^-14): subnormal or zero
    // Add 0.5 (as a float) so the FPU's own round-to-nearest-even aligns the mantissa at 2^-24 steps.
    float shifted = bits_float(absu) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(shifted) - 0x3f000000u));
  }
  uint32_t mant_odd = (absu >> 13) & 1u;
  absu += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (absu >> 13));
}

inline float fp16_to_float_portable(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {                                                          // zero / subnormal
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);              // mant * 2^-24, exact
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

#ifdef __F16C__
inline uint16_t float_to_fp16(float f) { return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }
inline float fp16_to_float(uint16_t h) { return _cvtsh_ss(h); }
#else
inline uint16_t float_to_fp16(float f) { return float_to_fp16_portable(f); }
inline float fp16_to_float(uint16_t h) { return fp16_to_float_portable(h); }
#endif

}  // namespace mt
