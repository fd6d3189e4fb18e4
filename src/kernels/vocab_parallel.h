// Vocab-parallel fused softmax + cross-entropy (Megatron's): each tensor-parallel rank holds the logits of a
// contiguous slice of the padded vocabulary and the full logits are never gathered. The loss is assembled in three
// local steps with two all-reduces over the tp group between them, which the CALLER performs; these kernels never
// communicate. Per row n, on every tp rank (logits [N, Vl] hold global columns [v0, v0 + Vl)):
//
//   vocab_parallel_xent_local_max   row_max[N]  = max over this rank's real columns (-inf when it has none)
//       caller: all_reduce(row_max, ReduceOp::Max) over tp            -> the global row max
//   vocab_parallel_xent_local_sums  stats[2, N] = { sum_exp[n]      = sum over real local v of exp(l[n, v] - max[n]),
//                                                   target_logit[n] = l[n, t - v0] if this rank owns t, else 0 }
//       caller: all_reduce(stats, ReduceOp::Sum) over tp              -> ONE all-reduce of the packed 2N buffer
//   vocab_parallel_xent_finish      losses[n]   = log(sum_exp[n]) + max[n] - target_logit[n]   (identical on all ranks)
//                                   dlogits     = (exp(l - max) / sum_exp - onehot(t)) * dloss  (this rank's slice)
//
// Global columns >= vocab (the real vocabulary size) are padding, wherever they fall (usually the tail of the last
// rank's slice, possibly whole slices): they are never read, get probability 0 and gradient 0, so any value in
// them (garbage, inf, NaN) changes nothing. Over tp = 1 (v0 = 0, Vl = Vp) the three steps with no reduction
// compute what softmax_xent_forward_backward (kernels/crossentropy.h) does.
//
// Common arguments: logits [..., Vl] of dtype S (fp32, fp64, bf16 or fp16) with N = numel / Vl rows; v0 >= 0 the
// global index of this rank's first column; vocab >= 1 the real (unpadded) vocabulary size; targets int32 with N
// elements, each in [0, vocab) (global ids). row_max (N elements) and stats ([2, N]: sum_exp in stats[0, :],
// target_logit in stats[1, :]) are in the accumulation dtype A = acc_dtype(S) (fp32, or fp64 for fp64 logits), so
// the communicator reduces them as they are and 16-bit logits never round the max or the sums. All arithmetic is
// in A; with 16-bit S only dlogits is rounded, once per element.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// Step 1. row_max[n] = max over j < nreal of logits[n, j], nreal = clamp(vocab - v0, 0, Vl); -inf when nreal = 0.
// Overwritten. The caller then all-reduces row_max with MAX over the tp group.
void vocab_parallel_xent_local_max(const Tensor& row_max, const Tensor& logits, int64_t v0, int64_t vocab);

// Step 2. row_max must hold the GLOBAL max (after the MAX all-reduce). Overwrites stats [2, N]:
//   stats[0, n] = sum over real local j of exp(logits[n, j] - row_max[n])   (0 when this rank has no real column)
//   stats[1, n] = logits[n, targets[n] - v0] if v0 <= targets[n] < v0 + Vl, else 0
// The caller then all-reduces stats with SUM over the tp group (one collective for both rows).
void vocab_parallel_xent_local_sums(const Tensor& stats, const Tensor& logits, const Tensor& targets,
                                    const Tensor& row_max, int64_t v0, int64_t vocab);

// Step 3. row_max and stats must be the GLOBAL (reduced) values. Overwrites losses[N] (dtype A; fp32 or fp64 for
// fp32 and fp64 logits) with
// log(stats[0, n]) + row_max[n] - stats[1, n], the same on every rank. If dlogits is defined (same shape and
// dtype as logits; it may alias logits, the gradient then replaces the logits in place) it is overwritten with
// this rank's slice of the gradient of dloss * sum_n losses[n]:
//   dlogits[n, j] = (exp(logits[n, j] - row_max[n]) / stats[0, n] - [v0 + j == targets[n]]) * dloss  for real j,
//   dlogits[n, j] = 0 for padding columns.
// logits is always passed (it gives N and Vl) but read only when dlogits is defined. No further communication:
// the gradient of each rank's slice is local.
void vocab_parallel_xent_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                const Tensor& targets, const Tensor& row_max, const Tensor& stats, int64_t v0,
                                int64_t vocab, double dloss);

}  // namespace mt::kernels
