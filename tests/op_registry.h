// The op registry: every kernel entry point of src/kernels/*.h described once, as cases that run it forward (and
// backward) on tensors made by an OpRun. test_op_registry runs every case on the CPU in fp32 against fp64, every
// 16-bit path against fp32 on the same values, and, where a GPU exists, the CUDA kernels against the CPU; it also
// fails when a kernel entry point has no case. A case states its tolerance class; the class says why.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace mt::test {

// How far a run may be from its reference, as the relative L2 error ||got - ref|| / ||ref|| of each output (0 =
// bit for bit). `why` is the reason, printed when a check fails.
struct Tolerance {
  double rel;
  const char* why;
};

// The classes every case picks from (op_registry.cpp states each bound's derivation).
struct ToleranceClass {
  const char* name;
  Tolerance fp32;  // fp32 against fp64, the same values
  Tolerance bf16;  // bf16 against fp32, the same (bf16-representable) values
  Tolerance fp16;  // fp16 against fp32, the same (fp16-representable) values
  Tolerance gpu;   // a CUDA kernel against the CPU kernel in the same dtype, for fp32 outputs; 16-bit outputs get
                   // the 16-bit bound above
};
extern const ToleranceClass kExact;        // copies, sums of exact values, single roundings of identical results
extern const ToleranceClass kElementwise;  // each output a short fp32 formula of its own inputs
extern const ToleranceClass kReduction;    // outputs sum over a row, a column or a product (norms, matmul, loss)
extern const ToleranceClass kAttention;    // softmax of products, then products again (probabilities rounded)

// Makes one run's tensors: activations in `act` dtype, accumulation buffers in its accumulation dtype, on `device`.
// Random values are drawn in fp64 from a seed and rounded to `values` (the lower precision of a comparison), so
// the two runs of a comparison see identical inputs.
class OpRun {
 public:
  OpRun(DType act, DType values, Device device) : act_(act), values_(values), device_(device) {}
  DType act() const { return act_; }
  DType acc() const { return act_ == DType::F64 ? DType::F64 : DType::F32; }
  Device device() const { return device_; }

  // shift + scale * N(0, 1), rounded to `values`, stored in the activation dtype (or the accumulation dtype).
  Tensor act_random(Shape s, uint64_t seed, double scale = 1.0, double shift = 0.0) const;
  Tensor acc_random(Shape s, uint64_t seed, double scale = 1.0, double shift = 0.0) const;
  // An output the op overwrites: filled with NaN, so an element it leaves unwritten fails the comparison.
  Tensor act_out(Shape s) const;
  Tensor acc_out(Shape s) const;
  // int32 values in [lo, hi).
  Tensor ints(Shape s, uint64_t seed, int64_t lo, int64_t hi) const;

 private:
  Tensor random(Shape s, DType dtype, uint64_t seed, double scale, double shift) const;
  DType act_, values_;
  Device device_;
};

// The tensors a case compares, by name (host or device; the harness copies them to the host).
using OpOutputs = std::vector<std::pair<std::string, Tensor>>;

struct OpCase {
  std::vector<std::string> ops;  // the kernel entry points it calls
  std::string shape;             // what makes this case (shapes, flags), for messages
  std::vector<DType> half;       // the 16-bit dtypes it runs in besides fp32 and fp64 (none: fp32/fp64 only)
  bool fp64 = true;              // runs in fp64 (the reference of the fp32 check)
  const ToleranceClass* tol;
  // Makes the inputs (OpRun's tensors) and returns the call of the ops on them, which returns the outputs: a test
  // calls it once, bench_ops times it.
  std::function<std::function<OpOutputs()>(const OpRun&)> prepare;
  OpOutputs run(const OpRun& r) const { return prepare(r)(); }
};

// Every case, in a fixed order: the makers below at odd and tiny sizes.
const std::vector<OpCase>& op_cases();

// The cases' makers, at any size (bench_ops builds them at a model's). N = rows (B * T), C = width.
OpCase matmul_case(int64_t N, int64_t C, int64_t OC, bool out_in, bool bias);
OpCase matmul_gelu_case(int64_t N, int64_t C, int64_t OC);
OpCase attention_case(int64_t B, int64_t T, int64_t NH, int64_t HS);
OpCase attention_block_case(int64_t B, int64_t T, int64_t NH, int64_t KV, int64_t HS);
OpCase gqa_expand_case(int64_t N, int64_t NH, int64_t KV, int64_t HS);
OpCase gqa_reduce_case(int64_t N, int64_t NH, int64_t KV, int64_t HS);
OpCase layernorm_case(int64_t N, int64_t C);
OpCase residual_layernorm_case(int64_t N, int64_t C);
OpCase rmsnorm_case(int64_t N, int64_t C);
OpCase gelu_case(int64_t N, int64_t C);
OpCase swiglu_case(int64_t N, int64_t C);
OpCase rope_case(int64_t B, int64_t T, int64_t NH, int64_t HS);
OpCase add_case(int64_t N, int64_t C);  // add_forward and bias_add
OpCase accumulate_case(int64_t N, int64_t C, bool into_acc);
OpCase divide_case(int64_t N, int64_t C);
OpCase embedding_case(int64_t B, int64_t T, int64_t C, int64_t Vp, int64_t vocab, bool slice);
OpCase xent_case(int64_t N, int64_t Vp, int64_t vocab);
OpCase vocab_parallel_xent_case(int64_t N, int64_t Vl, int64_t v0, int64_t vocab);
OpCase sum_case(int64_t n, bool squares);
OpCase clip_scale_case();
OpCase adamw_case(int64_t n, int steps);
OpCase sgd_case(int64_t n, int steps);
OpCase outer_nesterov_case(int64_t n, int steps);

// Entry points of src/kernels/*.h that are settings, not ops: they need no case.
const std::vector<std::string>& not_ops();

}  // namespace mt::test
