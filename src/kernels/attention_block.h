// Attention over one (query chunk, key/value chunk) pair: the building block of ring attention
// (model/ring_attention.h). The forward pass returns the pair's output and each query's log-sum-exp; a merge combines
// the partial results of several key chunks (online softmax); the backward pass, flash-attention style, accumulates
// one pair's share of dq, dk, dv from the *merged* output and log-sum-exp.
//
// Layouts (each head HS contiguous elements of a row, as kernels/gqa.h): q, out [B, Tq, NH*HS]; k, v [B, Tk, KV*HS];
// lse [B, NH, Tq]. Grouped-query attention: query head h uses kv head h / (NH / KV) (NH a multiple of KV; KV == NH
// is plain multi-head attention). Scores s_ij = q_i . k_j / sqrt(HS), as kernels/attention.h.
// Masks: Causal is the diagonal block (Tq == Tk, query and key chunk cover the same positions: query i sees keys
// j <= i); Full is a key chunk wholly before the query chunk (every query sees every key). A key chunk wholly after
// the query chunk contributes nothing and is never passed here. Every query row sees at least one key under either
// mask, so every lse is finite.
// Dtypes: S (fp32, fp64, bf16 or fp16) for q, k, v, dout and the merged out; A = acc_dtype(S) (fp64 for fp64, else
// fp32) for the block output, lse and the gradients, so partial outputs merge and gradients accumulate over many
// blocks in A and the caller rounds once to S at the end. With 16-bit S the probabilities are rounded to S before
// the products that use them (forward P V; backward P^T dout and P (dP - D)), as the CPU attention kernel rounds its
// stored probabilities.
// On the CPU and the GPU (kernels/cuda/attention_block_cuda.cu: the same arithmetic, not on the tensor cores).
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

enum class BlockMask {
  Causal,  // the diagonal block: query i sees keys 0..i of the same chunk (Tq == Tk)
  Full,    // every query sees every key
};

// out [B, Tq, NH*HS] (A) = softmax(s) v over this block's keys only; lse [B, NH, Tq] (A) = log sum_j exp(s_ij) over
// the same keys. Both overwritten.
void attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             int n_head, int n_kv_head, BlockMask mask);

// Merges the partial result (out_b, lse_b) of another key chunk into (out, lse), all in A, same shapes as above:
//   lse' = log(exp(lse) + exp(lse_b)),  out' = exp(lse - lse') out + exp(lse_b - lse') out_b.
// An lse of -inf is an empty partial result (an accumulator starting from (0, -inf) takes the first block as is).
void attention_block_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b, int n_head);

// Accumulates (+=) this block's share of the gradients: dq [B, Tq, NH*HS], dk, dv [B, Tk, KV*HS], all in A. dout
// and out [B, Tq, NH*HS] (S) are the gradient and value of the merged output, lse [B, NH, Tq] (A) the merged
// log-sum-exp; then P_ij = exp(s_ij - lse_i) are the merged softmax's probabilities restricted to this block and
//   D_i = sum_c dout_ic out_ic,  dv += P^T dout,  dS = P * (dout v^T - D) / sqrt(HS),  dq += dS k,  dk += dS^T q.
// Summed over the blocks of every key chunk a query saw, this is the exact gradient of the merged attention.
void attention_block_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                              const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              int n_head, int n_kv_head, BlockMask mask);

}  // namespace mt::kernels
