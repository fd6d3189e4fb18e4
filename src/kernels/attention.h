// Causal multi-head self-attention, forward and backward.
// qkv[B, T, 3C] holds q | k | v (each C = NH * HS wide, head h at columns h*HS .. h*HS+HS-1 of each part),
// exactly GPT-2's c_attn output. Scores are scaled by 1/sqrt(HS).
// Dtypes: S (qkv's dtype: fp32, fp64, bf16 or fp16) for qkv, out, dout and dqkv; datt is in the accumulation
// dtype A = acc_dtype(S) (fp32, or fp64 when S is fp64). Scores, softmax and products are computed in A; each
// stored element is rounded to S once.
//
// The saved record `att` depends on the device (allocate it, and datt, with attention_record_shape):
//  * cpu: att [B, NH, T, T] in S, the softmax probabilities; datt [B, NH, T, T] in A is scratch for dP and dS.
//  * cuda: a flash-attention kernel that never forms the T x T matrix. att [B, NH, T] in A holds each query's
//    log-sum-exp of its scaled scores, L = log sum_j exp(q.k_j / sqrt(HS)), from which the backward pass
//    recomputes the probabilities; datt [B, NH, T] in A is scratch for D = rowsum(dout * out). The head size
//    HS = C / n_head must be a multiple of 16, at most 128. The 16-bit kernels round P to S before P V (and P, dS
//    before the backward products), as the CPU rounds its stored probabilities.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// The GPU's 16-bit attention: cuDNN's fused attention where the build has it (docs/cuda.md) and cuDNN takes the
// shape and the pointers' alignment (Auto, the default), else meshtrain's own flash-attention kernels; Own: always
// meshtrain's. Both keep the record above (cuDNN's softmax stats are the same log-sum-exp). Process-wide; the GPU
// tests run both.
enum class GpuAttention { Auto, Own };
void set_gpu_attention(GpuAttention impl);
bool gpu_attention_has_cudnn();  // this build has the cuDNN path

// The shape of att and datt on device d: cpu {B, NH, T, T}; cuda {B, NH, T}.
Shape attention_record_shape(Device d, int64_t B, int64_t NH, int64_t T);
// att's dtype on device d for activations in S: cpu S (the probabilities); cuda acc_dtype(S) (the log-sum-exp).
// datt is in acc_dtype(S) on both.
DType attention_record_dtype(Device d, DType S);

// out[B, T, C] = softmax(q k^T / sqrt(HS) + causal mask) v, per head; att saves what the backward pass needs
// (cpu: the probabilities, entries above the diagonal written as 0; cuda: the log-sum-exp). out and att are
// overwritten. With 16-bit S on the cpu the probabilities are rounded once into att and out is computed in A from
// those rounded values, as the fused GPU kernel rounds P before the P V product.
void attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv, int n_head);

// dqkv[B, T, 3C] = gradient of out w.r.t. qkv (overwritten), from the out [B, T, C] and att that attention_forward
// wrote (the cpu reads only att; cuda reads both). datt (dtype A, attention_record_shape) is scratch.
void attention_backward(const Tensor& dqkv, const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                        const Tensor& out, const Tensor& att, int n_head);

}  // namespace mt::kernels
