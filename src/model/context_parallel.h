// Context parallelism in the model's passes: the layers that change when a sequence is split over the cp ranks of a
// group in the zigzag layout (model/ring_attention.h: rank r holds chunks r and 2cp-1-r of 2cp). Every other layer
// works token by token and needs nothing new. Three things do:
//  * positions: a token's position is its place in the whole sequence, so the position embedding's rows (GPT-2) are
//    gathered for the rank's two chunks and its gradient scattered back, and the rotary angles (Llama) start at each
//    chunk's first position;
//  * attention: the ring (ring_attention_forward/backward), whose record is each query's log-sum-exp;
//  * nothing else: the loss and the parameter gradients are this rank's share, summed over cp by the caller.
// With cp off (no group, or one rank) each function is exactly the one-rank code.
#pragma once
#include <cstdint>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace mt {

class ContextParallel {
 public:
  explicit ContextParallel(Communicator* comm = nullptr) : comm_(comm && comm->size() > 1 ? comm : nullptr) {}
  bool on() const { return comm_ != nullptr; }
  int size() const { return comm_ ? comm_->size() : 1; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  Communicator& comm() const { return *comm_; }
  // The global position of local chunk c's first token (c = 0, 1), for a local sequence of T_local = 2 Tc tokens.
  int64_t chunk_start(int c, int64_t T_local) const;

 private:
  Communicator* comm_;
};

// pos_local [T_local, C] (overwritten) = the rows of wpe [>= cp * T_local, C] at this rank's tokens' positions.
void gather_positions(const ContextParallel& cp, const Tensor& pos_local, const Tensor& wpe);
// dwpe [>= cp * T_local, C] += dpos_local at this rank's tokens' positions.
void scatter_position_grads(const ContextParallel& cp, const Tensor& dwpe, const Tensor& dpos_local);

// kernels::rope_forward / rope_backward over x [B * T_local, W] with each row at its global position.
void rope_forward_cp(const ContextParallel& cp, const Tensor& x, int64_t T_local, int64_t head_size, double theta,
                     int64_t col_begin, int64_t col_end);
void rope_backward_cp(const ContextParallel& cp, const Tensor& dx, int64_t T_local, int64_t head_size, double theta,
                      int64_t col_begin, int64_t col_end);

// The attention record's shape and dtype for B sequences of T_local tokens and n_head (local) heads on device d:
// the one-rank kernel's (kernels/attention.h), or under cp the ring's log-sum-exp [2, B, NH, Tc] in A.
Shape attention_record_shape_cp(const ContextParallel& cp, Device d, int64_t B, int64_t n_head, int64_t T_local);
DType attention_record_dtype_cp(const ContextParallel& cp, Device d, DType S);

// What one attention call under cp allocates for its time beyond its arguments, the larger of a forward and a backward
// call (0 with cp off): the ring's temporaries (ring_attention_temp_bytes) and, with packed = true (GPT-2's q|k|v),
// the copies taken apart; local q [B, T_local, q_width] with n_head heads, k and v of kv_width, in S.
int64_t attention_temp_bytes(const ContextParallel& cp, bool packed, int64_t B, int64_t T_local, int64_t q_width,
                             int64_t kv_width, int n_head, DType S);

// Causal attention. Off: the one-rank kernel (kernels/attention.h) on the packed q|k|v, its record the kernel's. On:
// the ring, its record the log-sum-exp. tag: this layer's own, kRingAttentionTags apart from any other layer's.
// GPT-2's packed qkv [B, T, 3 NH*HS] (the ring takes q, k and v apart first) into out [B, T, NH*HS]:
void packed_attention_forward(const ContextParallel& cp, const Tensor& out, const Tensor& record, const Tensor& qkv,
                              int n_head, int tag);
// dqkv (overwritten) from dout; datt: the one-rank kernel's scratch (off only).
void packed_attention_backward(const ContextParallel& cp, const Tensor& dqkv, const Tensor& datt, const Tensor& dout,
                               const Tensor& qkv, const Tensor& out, const Tensor& record, int n_head, int tag);
// Llama's separate q [B, T, NH*HS] and k, v [B, T, KV*HS] (grouped-query). Off: expanded into qkv [B, T, 3 NH*HS]
// for the kernel (the record keeps it); on: the ring reads q, k, v themselves and leaves qkv alone.
void gqa_attention_forward(const ContextParallel& cp, const Tensor& out, const Tensor& record, const Tensor& qkv,
                           const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head, int tag);
// dq, dk, dv (overwritten) from dout; dqkv and datt: the one-rank kernel's scratch (off only).
void gqa_attention_backward(const ContextParallel& cp, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            const Tensor& dqkv, const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                            const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& record,
                            int n_head, int n_kv_head, int tag);

}  // namespace mt
