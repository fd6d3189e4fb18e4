// Tests of the fused CPU kernels: residual_layernorm_forward must equal add_forward followed by layernorm_forward
// bit for bit (it is defined as that composition, rounding the residual before the LayerNorm reads it), in every
// activation dtype, with the residual written in place over either input. (Its argument checks abort, as every
// CHECK does, so they are not exercised here.)
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/layernorm.h"

using namespace mt;
using namespace mt::kernels;

namespace {

// Random normal values (never all zeros) rounded into `dtype`.
Tensor random_tensor(Shape s, DType dtype, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Tensor d = Tensor::empty(s, DType::F64);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (int64_t i = 0; i < d.numel(); ++i) d.data_as<double>()[i] = shift + scale * nd(rng);
  Tensor t = Tensor::empty(s, dtype);
  copy_convert(t, d);
  return t;
}

Tensor clone(const Tensor& t) {
  Tensor r = Tensor::empty(t.shape(), t.dtype());
  copy_convert(r, t);
  return r;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("residual_layernorm_forward equals add_forward then layernorm_forward exactly", "[layernorm][fused]") {
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 72}, {4, 768}, {3, 5}}) {
      INFO(dtype_name(dt) << " N=" << N << " C=" << C);
      const DType acc = acc_dtype(dt);
      const Tensor a = random_tensor({N, C}, dt, 1, 2.0, 0.5), b = random_tensor({N, C}, dt, 2, 1.0, -0.25);
      const Tensor w = random_tensor({C}, dt, 3, 0.2, 1.0), bias = random_tensor({C}, dt, 4, 0.1);

      // The composition.
      Tensor res_ref = Tensor::empty({N, C}, dt), ln_ref = Tensor::empty({N, C}, dt);
      Tensor mean_ref = Tensor::empty({N}, acc), rstd_ref = Tensor::empty({N}, acc);
      add_forward(res_ref, a, b);
      layernorm_forward(ln_ref, mean_ref, rstd_ref, res_ref, w, bias);

      Tensor res = Tensor::empty({N, C}, dt), ln = Tensor::empty({N, C}, dt);
      Tensor mean = Tensor::empty({N}, acc), rstd = Tensor::empty({N}, acc);
      residual_layernorm_forward(res, ln, mean, rstd, a, b, w, bias);
      REQUIRE(same_bits(res, res_ref));
      REQUIRE(same_bits(ln, ln_ref));
      REQUIRE(same_bits(mean, mean_ref));
      REQUIRE(same_bits(rstd, rstd_ref));

      // In place over a, then over b (the residual stream updated where it lies).
      Tensor a2 = clone(a), b2 = clone(b);
      residual_layernorm_forward(a2, ln, mean, rstd, a2, b, w, bias);
      REQUIRE(same_bits(a2, res_ref));
      REQUIRE(same_bits(ln, ln_ref));
      residual_layernorm_forward(b2, ln, mean, rstd, a, b2, w, bias);
      REQUIRE(same_bits(b2, res_ref));
      REQUIRE(same_bits(ln, ln_ref));
    }
  }
}
