// Tensor-parallel layers: each layer's forward and backward with the collectives that pair with them.
#include "model/parallel_layers.h"

#include <algorithm>

#include "kernels/crossentropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/vocab_parallel.h"

namespace mt {

using kernels::WeightLayout;

Tensor TensorParallel::gather_rows(const Tensor& local, const Tensor& full) const {
  if (!sp_) return local;
  comm_->all_gather(local, full);
  return full;
}

void TensorParallel::sum_partials(const Tensor& partial, const Tensor& local) const {
  if (sp_) comm_->reduce_scatter(partial, local, ReduceOp::Sum);
  else if (comm_) comm_->all_reduce(local, ReduceOp::Sum);
}

void column_linear_forward(const TensorParallel& tp, const Tensor& out, const Tensor& x_local, const Tensor& full,
                           const Tensor& w, const Tensor& bias, WeightLayout layout) {
  kernels::matmul_forward(out, tp.gather_rows(x_local, full), w, bias, layout);
}

void column_linear_gelu_forward(const TensorParallel& tp, const Tensor& pre, const Tensor& out,
                                const Tensor& x_local, const Tensor& full, const Tensor& w, const Tensor& bias) {
  kernels::matmul_bias_gelu_forward(pre, out, tp.gather_rows(x_local, full), w, bias);
}

void column_linear_backward(const TensorParallel& tp, const Tensor& dx_full, const Tensor& dx_local,
                            const Tensor& dw, const Tensor& db, const Tensor& dout, const Tensor& x_local,
                            const Tensor& full, const Tensor& w, WeightLayout layout) {
  const bool input = dx_local.defined();
  // Under sequence parallelism the input is gathered again here rather than kept (the matmul reads it for the
  // weight gradient, and its shape in any case).
  kernels::matmul_backward(input ? dx_full : Tensor(), dw, db, dout, tp.gather_rows(x_local, full), w, layout);
  if (input) tp.sum_partials(dx_full, dx_local);
}

void column_linears_forward(const TensorParallel& tp, const std::vector<Tensor>& outs, const Tensor& x_local,
                            const Tensor& full, const std::vector<Tensor>& ws, WeightLayout layout) {
  const Tensor x = tp.gather_rows(x_local, full);
  for (size_t i = 0; i < outs.size(); ++i) kernels::matmul_forward(outs[i], x, ws[i], Tensor(), layout);
}

void column_linears_backward(const TensorParallel& tp, const Tensor& dx_full, const Tensor& dx_local,
                             const Tensor& dx_part, const std::vector<Tensor>& dws, const std::vector<Tensor>& douts,
                             const Tensor& x_local, const Tensor& full, const std::vector<Tensor>& ws,
                             WeightLayout layout) {
  const bool input = dx_local.defined();
  const Tensor x = tp.gather_rows(x_local, full);
  for (size_t i = 0; i < douts.size(); ++i) {
    const Tensor dx = !input ? Tensor() : i == 0 ? dx_full : dx_part;
    kernels::matmul_backward(dx, dws[i], Tensor(), douts[i], x, ws[i], layout);
    if (input && i > 0) kernels::accumulate(dx_full, dx_part);
  }
  if (input) tp.sum_partials(dx_full, dx_local);
}

void row_linear_forward(const TensorParallel& tp, const Tensor& out_local, const Tensor& x, const Tensor& full,
                        const Tensor& w, const Tensor& bias, WeightLayout layout) {
  if (!tp.on()) return kernels::matmul_forward(out_local, x, w, bias, layout);
  const Tensor partial = tp.sp() ? full : out_local;
  kernels::matmul_forward(partial, x, w, Tensor(), layout);
  tp.sum_partials(partial, out_local);
  if (bias.defined()) kernels::bias_add(out_local, bias);
}

void row_linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout_full,
                         const Tensor& x, const Tensor& w, WeightLayout layout) {
  kernels::matmul_backward(dx, dw, db, dout_full, x, w, layout);
}

void vocab_embedding_forward(const TensorParallel& tp, const Tensor& out_local, const Tensor& full,
                             const Tensor& tokens, const Tensor& wte, const Tensor& pos, int64_t v0, int64_t vp) {
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1], C = wte.shape()[1];
  if (!tp.on()) return kernels::embedding_forward(out_local.view({B, T, C}), tokens, wte, pos);
  // Each rank adds the rows it holds; the sum over tp has every token's row. The (replicated) position term is
  // added once, after the sum.
  const Tensor sum = tp.sp() ? full : out_local;
  kernels::embedding_forward(sum.view({B, T, C}), tokens, wte, Tensor(), v0, vp);
  tp.sum_partials(sum, out_local);
  if (!pos.defined()) return;
  // Local row i is flat row row0 + i = b*T + t: runs of consecutive positions get pos[t..].
  const int64_t rows = out_local.shape()[0], row0 = tp.sp() ? int64_t(tp.comm().rank()) * rows : 0;
  for (int64_t i = 0; i < rows;) {
    const int64_t t = (row0 + i) % T, len = std::min(T - t, rows - i);
    kernels::accumulate(out_local.slice(i * C, {len * C}), pos.slice(t * C, {len * C}));
    i += len;
  }
}

void vocab_embedding_backward(const TensorParallel& tp, const Tensor& dwte, const Tensor& dpos, const Tensor& dout,
                              const Tensor& tokens, int64_t v0, int64_t vp) {
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1], C = dwte.shape()[1];
  if (!tp.on()) return kernels::embedding_backward(dwte, dpos, dout.view({B, T, C}), tokens);
  kernels::embedding_backward(dwte, dpos, dout.view({B, T, C}), tokens, v0, vp);
}

void vocab_cross_entropy(const TensorParallel& tp, const Tensor& losses, const Tensor& logits, const Tensor& targets,
                         const Tensor& row_max, const Tensor& stats, int64_t v0, int64_t vocab, double dloss) {
  const Tensor dlogits = dloss != 0 ? logits : Tensor();
  if (!tp.on()) return kernels::softmax_xent_forward_backward(losses, dlogits, logits, targets, vocab, dloss);
  kernels::vocab_parallel_xent_local_max(row_max, logits, v0, vocab);
  tp.comm().all_reduce(row_max, ReduceOp::Max);
  kernels::vocab_parallel_xent_local_sums(stats, logits, targets, row_max, v0, vocab);
  tp.comm().all_reduce(stats, ReduceOp::Sum);
  kernels::vocab_parallel_xent_finish(losses, dlogits, logits, targets, row_max, stats, v0, vocab, dloss);
}

void replicated_param_grads(const TensorParallel& tp, const std::vector<Tensor>& grads, const Tensor& scratch,
                            const std::function<void(const std::vector<Tensor>&)>& backward, bool over_params) {
  if (!tp.sp() && !over_params) return backward(grads);
  std::vector<Tensor> partial;
  int64_t at = 0;
  for (const Tensor& g : grads) {
    partial.push_back(scratch.slice(at, g.shape()));
    at += g.numel();
  }
  const Tensor used = scratch.slice(0, {at});
  zero_(used);
  backward(partial);
  if (tp.sp()) tp.comm().all_reduce(used, ReduceOp::Sum);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (over_params) zero_(grads[i]);
    kernels::accumulate(grads[i], partial[i]);
  }
}

void copied_param_grads(const TensorParallel& tp, const std::vector<Tensor>& grads, const std::vector<Tensor>& slots,
                        const Tensor& scratch, const std::function<void(const std::vector<Tensor>&)>& backward,
                        bool over_params) {
  zero_(scratch);
  backward(slots);
  tp.comm().all_reduce(scratch, ReduceOp::Sum);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (over_params) zero_(grads[i]);
    kernels::accumulate(grads[i], slots[i]);
  }
}

}  // namespace mt
