// Rank-valued test data for the communication tests (test_comm, test_hierarchical, test_cuda_comm): element i of
// rank r's input is r + 1 + i % 7, exact in fp32, bf16 and fp16, so a Sum, Avg (p = 1, 2, 4) or Max over up to 8
// ranks is exact too and results can be compared bit for bit. Include after <catch2/catch.hpp>.
#pragma once
#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace mt::test {

// Element i of a host tensor as fp32, whatever its type; and the inverse.
inline float get(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32: return static_cast<const float*>(t.data())[i];
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(t.data())[i]);
    case DType::F16: return fp16_to_float(static_cast<const uint16_t*>(t.data())[i]);
    default: FAIL("unexpected dtype"); return 0;
  }
}
inline void set(const Tensor& t, int64_t i, float v) {
  switch (t.dtype()) {
    case DType::F32: static_cast<float*>(t.data())[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(t.data())[i] = float_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(t.data())[i] = float_to_fp16(v); break;
    default: FAIL("unexpected dtype");
  }
}

inline float input(int r, int64_t i) { return static_cast<float>(r + 1 + i % 7); }
// The reduction of input(., i) over p ranks.
inline float expected(ReduceOp op, int p, int64_t i) {
  const float sum = static_cast<float>(p * (p + 1) / 2 + p * (i % 7));
  if (op == ReduceOp::Sum) return sum;
  if (op == ReduceOp::Avg) return sum / static_cast<float>(p);  // (p+1)/2 + i%7: exact for p = 1, 2, 4
  return static_cast<float>(p + i % 7);
}

}  // namespace mt::test
