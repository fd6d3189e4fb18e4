// Tensor-parallel layers that own their communication (Megatron-LM's scheme, Shoeybi et al. 2019, with the
// sequence parallelism of Korthikanti et al. 2022), so that a transformer block is written once, in its tp = 1
// reading, and its parallel form follows from which layer each projection is:
//
//  * column-parallel linear (q/k/v, MLP up-projections, the vocabulary-parallel head): each rank holds a slice of
//    the outputs. Its input is replicated over tp; with sequence parallelism each rank holds a block of its rows
//    and the forward all-gathers them. Its input gradient is partial (each rank saw only its outputs): summed over
//    tp in the backward, by an all-reduce, or with sequence parallelism a reduce-scatter into the local rows
//    (Megatron's f: identity forward, all-reduce backward).
//  * row-parallel linear (the attention output and MLP down-projections): each rank holds a slice of the inputs,
//    so its product is partial: summed over tp in the forward (all-reduce, or reduce-scatter into the local rows
//    under sequence parallelism), then the replicated bias is added once. Its output gradient is replicated (sp:
//    all-gathered from the local rows), so its bias gradient is complete on every rank (Megatron's g).
//  * vocabulary-parallel embedding: each rank holds a slice of the vocabulary's rows and adds the tokens it holds;
//    the sum over tp has every token's row.
//  * replicated parameters read by row-sharded activations (the norms under sequence parallelism): each rank's
//    gradient covers its rows only and is summed over tp before it is accumulated.
//
// With tp = 1 every call is the plain kernel, bit for bit what the block would run without these layers.
#pragma once
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/matmul.h"

namespace mt {

// One model shard's tensor-parallel group: null at tp = 1 (no communication), with or without sequence parallelism.
class TensorParallel {
 public:
  TensorParallel(Communicator* comm, bool sequence_parallel) : comm_(comm), sp_(comm && sequence_parallel) {}
  bool on() const { return comm_ != nullptr; }
  bool sp() const { return sp_; }
  Communicator& comm() const { return *comm_; }

  // The activation a column-parallel region reads: under sequence parallelism this rank's rows all-gathered into
  // `full` (all N rows), else `local` itself.
  Tensor gather_rows(const Tensor& local, const Tensor& full) const;
  // Partial results summed over tp into `local`: under sequence parallelism `partial` holds all N rows and `local`
  // receives this rank's block of the sum (reduce-scatter); else the sum is formed in place (`partial` is `local`).
  void sum_partials(const Tensor& partial, const Tensor& local) const;

 private:
  Communicator* comm_;
  bool sp_;
};

// out = x W + b with W's outputs split over tp; x_local is this rank's rows under sequence parallelism, gathered
// into `full` ([N, in]; unused otherwise). bias may be undefined.
void column_linear_forward(const TensorParallel& tp, const Tensor& out, const Tensor& x_local, const Tensor& full,
                           const Tensor& w, const Tensor& bias,
                           kernels::WeightLayout layout = kernels::WeightLayout::InOut);
// The same followed by GELU: pre = x W + b (kept for the backward pass), out = gelu(pre) (kernels/matmul.h).
void column_linear_gelu_forward(const TensorParallel& tp, const Tensor& pre, const Tensor& out,
                                const Tensor& x_local, const Tensor& full, const Tensor& w, const Tensor& bias);
// Backward: dW += x^T dout and db += sum dout (when dw / db are defined; under sequence parallelism x is gathered
// again into `full` rather than kept), and, when dx_local is defined, d(loss)/dx summed over tp into dx_local
// (dx_full: [N, in], the partial before the sum under sequence parallelism; else it must be dx_local).
void column_linear_backward(const TensorParallel& tp, const Tensor& dx_full, const Tensor& dx_local,
                            const Tensor& dw, const Tensor& db, const Tensor& dout, const Tensor& x_local,
                            const Tensor& full, const Tensor& w,
                            kernels::WeightLayout layout = kernels::WeightLayout::InOut);

// Several column-parallel projections of one input without biases (q, k and v; gate and up): the input is
// gathered once, and in the backward their input gradients are summed (each projection's share through dx_part,
// [N, in]) before the one sum over tp.
void column_linears_forward(const TensorParallel& tp, const std::vector<Tensor>& outs, const Tensor& x_local,
                            const Tensor& full, const std::vector<Tensor>& ws, kernels::WeightLayout layout);
void column_linears_backward(const TensorParallel& tp, const Tensor& dx_full, const Tensor& dx_local,
                             const Tensor& dx_part, const std::vector<Tensor>& dws, const std::vector<Tensor>& douts,
                             const Tensor& x_local, const Tensor& full, const std::vector<Tensor>& ws,
                             kernels::WeightLayout layout);

// out_local = x W + b with W's inputs split over tp (x: this rank's slice of the inputs, all rows): the partial
// product is summed over tp (under sequence parallelism through `full` [N, out] into this rank's rows), then the
// bias added once. With tp = 1 the bias goes into the matmul.
void row_linear_forward(const TensorParallel& tp, const Tensor& out_local, const Tensor& x, const Tensor& full,
                        const Tensor& w, const Tensor& bias,
                        kernels::WeightLayout layout = kernels::WeightLayout::InOut);
// The output gradient a row-parallel layer's backward reads: all N rows (sequence parallelism all-gathers
// dout_local into `full`), the same on every tp rank.
inline Tensor row_linear_output_grad(const TensorParallel& tp, const Tensor& dout_local, const Tensor& full) {
  return tp.gather_rows(dout_local, full);
}
// Backward from the full output gradient (row_linear_output_grad): dx = dout W^T (this rank's input slice; skipped
// when undefined), dW += x^T dout, db += sum dout (each skipped when undefined). No communication: dout is whole.
void row_linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout_full,
                         const Tensor& x, const Tensor& w, kernels::WeightLayout layout = kernels::WeightLayout::InOut);

// Token embedding out_local = wte[tokens] (+ pos[t] when pos is defined: position t of each row) with wte's
// vocabulary rows split over tp (this rank's rows [v0, v0 + rows) of the padded vocabulary vp); under sequence
// parallelism the sum over tp is reduce-scattered through `full` ([N, C]) into this rank's rows.
void vocab_embedding_forward(const TensorParallel& tp, const Tensor& out_local, const Tensor& full,
                             const Tensor& tokens, const Tensor& wte, const Tensor& pos, int64_t v0, int64_t vp);
// dwte += for the tokens this rank holds, dpos += per position (when defined), from dout: all N rows.
void vocab_embedding_backward(const TensorParallel& tp, const Tensor& dwte, const Tensor& dpos, const Tensor& dout,
                              const Tensor& tokens, int64_t v0, int64_t vp);

// Cross-entropy over vocabulary-parallel logits [N, Vp/tp] (the full logits are never gathered; two all-reduces of
// [N] and [2, N] statistics, kernels/vocab_parallel.h): per-token losses [N] the same on every rank and, when dloss
// != 0, the logits replaced by dloss * d(sum of losses)/d(logits) (this rank's slice). row_max and stats: [N] and
// [2, N] scratch in the accumulation dtype (tp > 1 only).
void vocab_cross_entropy(const TensorParallel& tp, const Tensor& losses, const Tensor& logits, const Tensor& targets,
                         const Tensor& row_max, const Tensor& stats, int64_t v0, int64_t vocab, double dloss);

// A replicated parameter's gradient computed from this rank's rows only (sequence parallelism): `backward` writes
// this micro-batch's share into the given tensors (zeroed scratch laid out like `grads`, from `scratch`), which are
// summed over tp and then accumulated into `grads` (summing grads() itself would count earlier micro-batches tp
// times). Without sequence parallelism `backward` accumulates into `grads` directly, unless they are the parameters'
// own storage (over_params: ZeRO-3's shared ring), which `backward` still reads: then it writes into the scratch too,
// and `grads` are overwritten afterwards.
void replicated_param_grads(const TensorParallel& tp, const std::vector<Tensor>& grads, const Tensor& scratch,
                            const std::function<void(const std::vector<Tensor>&)>& backward, bool over_params);

// Parameters held in copies by several tp ranks, each copy's gradient only its ranks' share (Llama's k and v when kv
// heads are fewer than tp ranks: a copy sees its ranks' query heads). `backward` writes this micro-batch's shares
// into `slots` (views of `scratch`, each part of the weight in its own place, zero elsewhere), `scratch` is summed
// over tp, which sums every part's copies at once, and each slot is accumulated into its gradient (over_params: the
// gradients are the parameters' own storage, overwritten instead).
void copied_param_grads(const TensorParallel& tp, const std::vector<Tensor>& grads, const std::vector<Tensor>& slots,
                        const Tensor& scratch, const std::function<void(const std::vector<Tensor>&)>& backward,
                        bool over_params);

}  // namespace mt
