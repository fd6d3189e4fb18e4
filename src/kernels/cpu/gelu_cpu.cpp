// CPU GELU: Eigen array expressions, so tanh is Eigen's vectorised one (a rational approximation accurate to a
// few ulp in fp32; std::tanh per element in fp64), split across OpenMP threads in contiguous chunks.
#include "kernels/cpu/gelu_cpu.h"

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {
namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;
}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  parallel_ranges(n, [&](int64_t b, int64_t e) {
    CArrMap<T> x(inp + b, e - b);
    ArrMap<T> y(out + b, e - b);
    y = T(0.5) * x * (T(1) + (T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x)).tanh());
  });
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  parallel_ranges(n, [&](int64_t b, int64_t e) {
    CArrMap<T> x(inp + b, e - b), dy(dout + b, e - b);
    ArrMap<T> dx(dinp + b, e - b);
    // d/dx [0.5 x (1 + t)] = 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x), t = tanh(u), u' = k (1 + 3 c x^2).
    // Elementwise expression: reading dout[i] and writing dinp[i] in one step is safe when they alias.
    const auto t = (T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x)).tanh();
    dx = dy * (T(0.5) * (T(1) + t) +
               T(0.5) * x * (T(1) - t * t) * (T(kSqrt2OverPi) * (T(1) + T(3 * kCubic) * x * x)));
  });
}

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);

}  // namespace mt::kernels::cpu
