// Element storage of the CPU kernels. Every kernel is a template over its activation storage type S (float,
// double, bf16, fp16) and computes in acc_t<S> (fp32 for every 16-bit format, as the GPU kernels accumulate in
// fp32; double for fp64 gradient checks): each value is widened with load() when read and rounded to nearest
// even with store() once, where the kernel writes its output. A reduced-precision CPU run therefore rounds at
// the same points as the GPU path.
#pragma once
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/dtype.h"

namespace mt::kernels::cpu {

struct bf16 { uint16_t bits; };
struct fp16 { uint16_t bits; };

template <typename S> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
// The type a kernel over S-stored tensors computes in, and the dtype of its statistics and parameter gradients.
template <typename S> using acc_t = typename AccOf<S>::type;

inline float load(float x) { return x; }
inline double load(double x) { return x; }
inline float load(bf16 x) { return bf16_to_float(x.bits); }
inline float load(fp16 x) { return fp16_to_float(x.bits); }

inline void store(float& d, float v) { d = v; }
inline void store(double& d, double v) { d = v; }
inline void store(bf16& d, float v) { d.bits = float_to_bf16(v); }
inline void store(fp16& d, float v) { d.bits = float_to_fp16(v); }

// n stored values widened into fp32 (one thread).
template <typename S>
inline void widen(float* dst, const S* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src[i]);
}

template <typename S> constexpr bool is_16bit = std::is_same_v<S, bf16> || std::is_same_v<S, fp16>;

// Grow-only fp32 scratch of the calling thread for the 16-bit paths, 64-byte aligned like Tensor data (so
// Eigen's vectorised loops split a widened row into scalar head, packets and tail exactly as they split an fp32
// tensor row, and the results match the fp32 kernel's bit for bit). One buffer per thread and kSlot, for kernels
// that need two at once (slot 0 is also the one OpenMP workers use inside a kernel). Once grown to a step's
// largest use, steady-state steps allocate nothing.
template <int kSlot = 0>
float* thread_scratch(int64_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < size_t(n) + 16) buf.resize(size_t(n) + 16);
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
}

}  // namespace mt::kernels::cpu
