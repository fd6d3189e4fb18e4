// The op registry's run helpers and tolerance classes (op_registry.h); the cases are in op_cases.cpp.
#include "op_registry.h"

#include <cmath>
#include <limits>
#include <random>

namespace mt::test {
namespace {
// A copy of a host tensor on `device` (the host tensor itself on the CPU).
Tensor on(const Tensor& host, Device device) {
  if (device == Device::CPU) return host;
  Tensor t = Tensor::empty(host.shape(), host.dtype(), device);
  copy_convert(t, host);
  return t;
}
}  // namespace

// Bounds on the relative L2 error of a whole output. u is the unit roundoff: 2^-24 (fp32), 2^-8 (bf16), 2^-11
// (fp16). Rounding each element of an output once (to nearest) moves it by at most u relative, so the whole output
// by at most u in relative L2; every bound below is that, times the number of such roundings a path makes, plus
// what fp32 arithmetic adds, with a margin of about 2x for cancellation.
const ToleranceClass kExact = {
    "exact",
    {0, "every output element is one input element (a copy or a gather): nothing rounds"},
    {0, "a copy of bf16 values"},
    {0, "a copy of fp16 values"},
    {0, "a copy: both devices move the same bits"}};

const ToleranceClass kElementwise = {
    "elementwise",
    {1e-6, "each element is a few fp32 operations (and tanh, exp or sqrt within a few ulp) of its own inputs: "
           "<= ~10 fp32 roundings of 6e-8 each"},
    {8e-3, "each element rounded once to bf16 (u = 3.9e-3), and for a backward at most once more where its input "
           "was a rounded 16-bit value: 2u"},
    {1e-3, "each element rounded once to fp16 (u = 4.9e-4), at most twice: 2u"},
    {1e-6, "the same formula on both devices; CUDA's tanhf/expf/sqrtf differ from the host's by a few ulp, and "
           "FMA contraction"}};

const ToleranceClass kReduction = {
    "reduction",
    {1e-5, "sums of up to a few hundred fp32 terms (rows, columns, products): normwise error ~ sqrt(K) * 6e-8, "
           "times 10 for cancellation"},
    {1.2e-2, "the output rounded once to bf16 (u = 3.9e-3), after at most two 16-bit intermediates the GPU "
             "also rounds (the fused residual's sum, a backward's 16-bit input gradient): 3u"},
    {1.5e-3, "the output rounded once to fp16 (u = 4.9e-4), after at most two 16-bit intermediates: 3u"},
    {1e-5, "another summation order (warp trees, atomics) over the same fp32 terms"}};

const ToleranceClass kAttention = {
    "attention",
    {1e-5, "exp and sums over a row of T <= 64 scores, then products over T: fp32 sums as in `reduction`"},
    {2e-2, "16-bit paths round the probabilities P before P V (forward) and P, dS before the backward products "
           "(as the GPU's fused kernels do), then the output: up to 4 roundings of u = 3.9e-3 on the way to "
           "dqkv, partly averaging out over the T-term products: 5u"},
    {2.5e-3, "the same 4 roundings with fp16's u = 4.9e-4: 5u"},
    {1e-5, "another summation order over the same fp32 terms (flash-attention tiles against the CPU's rows)"}};

Tensor OpRun::random(Shape s, DType dtype, uint64_t seed, double scale, double shift) const {
  Tensor d = Tensor::empty(s, DType::F64);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (int64_t i = 0; i < d.numel(); ++i) d.data_as<double>()[i] = shift + scale * nd(rng);
  // Rounded to the comparison's lower precision, fp32 at least, so both runs of a comparison hold the same values
  // (a 16-bit run's fp32 buffers included).
  const DType via = values_ == DType::BF16 || values_ == DType::F16 ? values_ : DType::F32;
  Tensor rounded = Tensor::empty(s, via);
  copy_convert(rounded, d);
  Tensor host = Tensor::empty(s, dtype);
  copy_convert(host, rounded);
  return on(host, device_);
}

Tensor OpRun::act_random(Shape s, uint64_t seed, double scale, double shift) const {
  return random(s, act_, seed, scale, shift);
}
Tensor OpRun::acc_random(Shape s, uint64_t seed, double scale, double shift) const {
  return random(s, acc(), seed, scale, shift);
}

namespace {
Tensor filled_nan(Shape s, DType dtype, Device device) {
  Tensor d = Tensor::empty(s, DType::F64);
  for (int64_t i = 0; i < d.numel(); ++i) d.data_as<double>()[i] = std::numeric_limits<double>::quiet_NaN();
  Tensor host = Tensor::empty(s, dtype);
  copy_convert(host, d);
  return on(host, device);
}
}  // namespace

Tensor OpRun::act_out(Shape s) const { return filled_nan(s, act_, device_); }
Tensor OpRun::acc_out(Shape s) const { return filled_nan(s, acc(), device_); }

Tensor OpRun::ints(Shape s, uint64_t seed, int64_t lo, int64_t hi) const {
  Tensor t = Tensor::empty(s, DType::I32);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> ud(lo, hi - 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<int32_t>()[i] = int32_t(ud(rng));
  return on(t, device_);
}

const std::vector<std::string>& not_ops() {
  static const std::vector<std::string> names = {"set_gpu_attention"};
  return names;
}

}  // namespace mt::test
