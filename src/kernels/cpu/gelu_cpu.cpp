// CPU GELU: Eigen array expressions (Eigen's vectorised exp, accurate to a few ulp in fp32), split across OpenMP
// threads in contiguous chunks. 0.5 (1 + tanh u) is written as the logistic sigmoid(2u), which it equals: 1 + tanh u
// cancels for u << 0 (x below about -4 lost more than a bf16 ulp in fp32 that way), sigmoid(2u) does not. The 16-bit
// kernels widen blocks of a chunk into fp32 stack buffers, run the fp32 expression and round each output once.
#include "kernels/cpu/gelu_cpu.h"

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {
namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;

template <typename T>
void forward_span(T* out, const T* inp, int64_t n) {
  CArrMap<T> x(inp, n);
  ArrMap<T> y(out, n);
  y = x * (T(1) + (T(-2 * kSqrt2OverPi) * (x + T(kCubic) * x * x * x)).exp()).inverse();  // x sigmoid(2u)
}

template <typename T>
void backward_span(T* dinp, const T* inp, const T* dout, int64_t n) {
  CArrMap<T> x(inp, n), dy(dout, n);
  ArrMap<T> dx(dinp, n);
  // d/dx [x s] = s + 2 x s (1 - s) u'(x), s = sigmoid(2u) = 0.5 (1 + tanh u), u' = k (1 + 3 c x^2).
  // Elementwise expression: reading dout[i] and writing dinp[i] in one step is safe when they alias.
  const auto s = (T(1) + (T(-2 * kSqrt2OverPi) * (x + T(kCubic) * x * x * x)).exp()).inverse();
  dx = dy * s * (T(1) + T(2) * x * (T(1) - s) * (T(kSqrt2OverPi) * (T(1) + T(3 * kCubic) * x * x)));
}

// 16-bit: blocks of 256 from each chunk's (64-element-aligned) start, in 64-byte-aligned buffers, so Eigen splits
// them into vector packets and a scalar tail where it splits the fp32 kernel's chunks of an aligned tensor: the
// fp32 values, and so the rounded results, are those of the fp32 kernel on the widened inputs.
constexpr int64_t kGeluChunk = 256;
}  // namespace

template <typename S>
void gelu_forward(S* out, const S* inp, int64_t n) {
  parallel_ranges(n, [&](int64_t b, int64_t e) {
    if constexpr (!is_16bit<S>) {
      forward_span(out + b, inp + b, e - b);
    } else {
      alignas(64) float x[kGeluChunk], y[kGeluChunk];
      for (int64_t s = b; s < e; s += kGeluChunk) {
        const int64_t m = std::min(kGeluChunk, e - s);
        for (int64_t i = 0; i < m; ++i) x[i] = load(inp[s + i]);
        forward_span(y, x, m);
        for (int64_t i = 0; i < m; ++i) store(out[s + i], y[i]);
      }
    }
  });
}

template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, int64_t n) {
  parallel_ranges(n, [&](int64_t b, int64_t e) {
    if constexpr (!is_16bit<S>) {
      backward_span(dinp + b, inp + b, dout + b, e - b);
    } else {
      alignas(64) float x[kGeluChunk], dy[kGeluChunk];
      for (int64_t s = b; s < e; s += kGeluChunk) {
        const int64_t m = std::min(kGeluChunk, e - s);
        for (int64_t i = 0; i < m; ++i) x[i] = load(inp[s + i]), dy[i] = load(dout[s + i]);
        backward_span(dy, x, dy, m);  // in place: the block of dout is read before dinp (maybe the same) is written
        for (int64_t i = 0; i < m; ++i) store(dinp[s + i], dy[i]);
      }
    }
  });
}

#define MT_GELU_INSTANTIATE(S)                                 \
  template void gelu_forward<S>(S*, const S*, int64_t); \
  template void gelu_backward<S>(S*, const S*, const S*, int64_t);
MT_GELU_INSTANTIATE(float)
MT_GELU_INSTANTIATE(double)
MT_GELU_INSTANTIATE(bf16)
MT_GELU_INSTANTIATE(fp16)
#undef MT_GELU_INSTANTIATE

}  // namespace mt::kernels::cpu
