// Comparing a case's runs (test_op_registry.cpp, test_cuda_op_registry.cpp): the relative L2 error of every output
// against the reference run's, checked against the case's tolerance class, with the reason in the message.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/device.h"
#include "op_registry.h"

namespace mt::test {

// ||got - ref|| / ||ref|| over host copies in fp64; infinite when either holds a non-finite value (a NaN left in
// an output the op should have written).
inline double relative_l2(const Tensor& got, const Tensor& ref) {
  Tensor g = Tensor::empty(got.shape(), DType::F64), r = Tensor::empty(ref.shape(), DType::F64);
  copy_convert(g, to_host(got)), copy_convert(r, to_host(ref));
  if (g.numel() != r.numel()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double x = g.data_as<double>()[i], y = r.data_as<double>()[i];
    if (!std::isfinite(x) || !std::isfinite(y)) return std::numeric_limits<double>::infinity();
    num += (x - y) * (x - y), den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : (num > 0 ? std::numeric_limits<double>::infinity() : 0.0);
}

inline std::string case_name(const OpCase& c) {
  std::string s;
  for (const std::string& op : c.ops) s += (s.empty() ? "" : ", ") + op;
  return s + " (" + c.shape + ")";
}

// Every output of `got` within `tol(output)` of the same output of `ref`. OP_REGISTRY_VERBOSE=1 prints every error
// and its bound (the margins).
template <typename TolOf>
void compare_runs(const OpCase& c, const std::string& what, const OpOutputs& got, const OpOutputs& ref, TolOf tol) {
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const Tolerance t = tol(got[i].second);
    const double e = relative_l2(got[i].second, ref[i].second);
    INFO(case_name(c) << ", " << what << ": output " << got[i].first << " has relative L2 error " << e
                      << "; class " << c.tol->name << " allows " << t.rel << ": " << t.why);
    if (std::getenv("OP_REGISTRY_VERBOSE"))
      std::printf("%-11s %.3g of %-8.3g %s, %s: %s\n", c.tol->name, e, t.rel, case_name(c).c_str(), what.c_str(),
                  got[i].first.c_str());
    CHECK(e <= t.rel);
  }
}

}  // namespace mt::test
