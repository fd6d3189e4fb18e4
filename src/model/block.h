// The transformer block families (GPT-2: model/gpt2_block.cpp, Llama: model/llama_block.cpp) behind one interface,
// so that the model (model/gpt.h) is a list of blocks between its embedding and its head, and its passes never ask
// which family it runs. A block owns its parameters' indices in the model's table and its forward and backward
// passes, side by side; it reads parameters and writes gradients through the model (GPT::param, GPT::grad), and
// communicates only through the parallel layers (model/parallel_layers.h, model/context_parallel.h).
//
// The residual stream runs between blocks: block l reads its input residual[l] through its input norm (whose output
// is its record's ln1) and writes its output branch into residual[l + 1]. The skip connection's add is fused with the
// norm that reads its sum: the next block's input norm, or the final norm (Norm::add_forward).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "model/context_parallel.h"
#include "model/gpt.h"

namespace mt {

// One micro-batch's pass as a block sees it.
struct BlockPass {
  const GPT& model;           // parameters (param/grad) and configuration
  const TensorParallel& tp;   // the tp group (null at tp = 1)
  const ContextParallel& cp;  // the cp group (off: the whole sequence on this rank)
  Activations& a;             // the micro-batch's record: B, T, the residual stream, sequence parallelism's scratch
  Tensor param(int p) const { return model.param(p); }
  Tensor grad(int p) const { return model.grad(p); }
};

// A norm's output and the statistics its backward reads (mean only for LayerNorm).
struct NormRecord {
  Tensor y, mean, rstd;
};

// A block's input norm, or the final norm: GPT-2's LayerNorm (weight and bias), Llama's RMSNorm (weight).
class Norm {
 public:
  virtual ~Norm() = default;
  // Its parameters' indices, in layout order (the last one's gradient is final last).
  virtual std::vector<int> params() const = 0;
  // The record's tensors ([Ns, C] output and [Ns] statistics), allocated from the arena in a fixed order.
  virtual NormRecord alloc(Arena& arena, int64_t rows, int64_t C, DType dtype) const = 0;
  // r.y = norm(x).
  virtual void forward(const BlockPass& p, const NormRecord& r, const Tensor& x) const = 0;
  // x += skip, then r.y = norm(x): the same values as the two apart (kernels/layernorm.h).
  virtual void add_forward(const BlockPass& p, const NormRecord& r, const Tensor& x, const Tensor& skip) const = 0;
  // dx += d/dx from dy (dres accumulates the skip connection's share), parameter gradients accumulated (summed over
  // tp under sequence parallelism through `scratch`, model/parallel_layers.h).
  virtual void backward(const BlockPass& p, const Tensor& dx, const Tensor& dy, const Tensor& x, const NormRecord& r,
                        const Tensor& scratch) const = 0;
  // The sequence-parallel scratch backward() needs: [parameters, C] in the gradients' dtype.
  virtual Shape scratch_shape(int64_t C) const = 0;
};

// One block's record for train.recompute: block 0's tensor `t` when the policy shares it between blocks
// (`shared_under`), else a new one from the arena.
struct BlockAlloc {
  Arena& arena;
  const LayerActivations* first;
  Recompute recompute;
  Tensor operator()(Tensor LayerActivations::*t, Recompute shared_under, const Shape& shape, DType dt) const {
    return first && recompute == shared_under ? first->*t : arena.alloc(shape, dt);
  }
};

// A block backward pass's scratch, shared by every block of the pass (allocated once, in a fixed order, so the
// planner's activation model counts it).
struct BlockScratch {
  Tensor dres;       // [Ns, C]: d(loss)/d(residual stream), updated in place from the top block down
  Tensor dln;        // [Ns, C]: d/d(a norm's output)
  Tensor dln_full;   // [N, C] under sequence parallelism (a column-parallel input gradient, all rows), else dln
  Tensor dres_full;  // [N, C] under sequence parallelism (a row-parallel output gradient, all rows), else dres
  // The family's own (each block's backward allocates what it uses in alloc_scratch).
  Tensor dx_part, datty, dqkv, dfch, dq, dk, dv, dgate, dup, dswiglu, datt;
  Tensor norm_scratch;  // sequence parallelism: one norm's partial parameter gradients
};

// A backward pass's report that the gradient of parameter p (and of everything before it in the layout) is final
// for this micro-batch; empty when nobody listens.
using ParamReady = std::function<void(int p)>;

class Block {
 public:
  virtual ~Block() = default;
  const Norm& input_norm() const { return *norm_in_; }
  // Its parameters' indices in the model's table.
  const std::vector<int>& params() const { return params_; }

  // This block's record (its input norm's output is ln1); kept: what the zero-bubble weight pass needs instead.
  virtual LayerActivations alloc_record(const BlockAlloc& alloc, const GPT& model, int64_t B, int64_t T) const = 0;
  virtual LayerOutputGrads alloc_kept(Arena& arena, const GPT& model, int64_t B, int64_t T) const = 0;
  // The backward pass's scratch beyond the four tensors every family uses (dres, dln and their sp forms).
  virtual void alloc_scratch(BlockScratch& s, Arena& arena, const GPT& model, const Activations& a,
                             bool split) const = 0;
  // What its attention allocates per call beyond record and scratch (GPT::attention_temp_bytes).
  virtual int64_t attention_temp_bytes(const GPT& model, int64_t B, int64_t T) const = 0;

  // From the normed input la.ln1 (of x, the block's input) to the output branch in `out`, without the skip
  // connection: the norm after the block adds it, with la.res_attn.
  virtual void forward(const BlockPass& p, LayerActivations& la, const Tensor& x, const Tensor& out) const = 0;
  // From s.dres = d/d(block output) to s.dres = d/d(block input): parameter gradients accumulated (kept given, the
  // zero-bubble input pass: only the norms', the rest kept for backward_weights), `ready` called after each half.
  virtual void backward(const BlockPass& p, LayerActivations& la, const Tensor& x, const BlockScratch& s,
                        LayerOutputGrads* kept, const ParamReady& ready) const = 0;
  // The zero-bubble weight pass: the matmul weights' gradients from what backward(kept) kept.
  virtual void backward_weights(const BlockPass& p, const LayerActivations& la, const Tensor& x,
                                const LayerOutputGrads& kept, const ParamReady& ready) const = 0;

 protected:
  // What train.recompute drops, again at the start of the block's backward: everything after the input (full), or
  // the norms' outputs and the MLP's activation (light). The same kernels on the same inputs: bit for bit.
  void recompute(const BlockPass& p, const LayerActivations& la, const Tensor& x) const;
  // forward() up to the MLP's activation: what the block's backward reads, recomputed under train.recompute=full.
  virtual void forward_to_activation(const BlockPass& p, const LayerActivations& la, const Tensor& x) const = 0;
  // The MLP's activation from its kept inputs (train.recompute=light).
  virtual void activation_forward(const LayerActivations& la) const = 0;

  std::unique_ptr<Norm> norm_in_, norm_post_;  // before attention, before the MLP
  std::vector<int> params_;
};

// The family's norm over the given parameters (GPT-2: weight and bias; Llama: weight).
std::unique_ptr<Norm> make_norm(const GPTConfig& cfg, std::vector<int> params);
// The part's blocks, in order, with their parameters found in `table` by name.
std::vector<std::unique_ptr<Block>> make_blocks(const GPTConfig& cfg, const ModelPart& part, const ParamTable& table,
                                                DType dtype, Device device);
std::unique_ptr<Block> make_gpt2_block(const GPTConfig& cfg, const ParamTable& table, int layer);
// kv_sum: with fewer kv heads than tp ranks, the scratch in which the k and v weight gradients' copies are summed.
std::unique_ptr<Block> make_llama_block(const GPTConfig& cfg, const TensorSharding& sharding, const ParamTable& table,
                                        int layer, const Tensor& kv_sum);
// A block's record of its input norm.
inline NormRecord input_record(const LayerActivations& la) { return {la.ln1, la.ln1_mean, la.ln1_rstd}; }

}  // namespace mt
