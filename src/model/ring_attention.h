// Context parallelism's attention: ring attention over the zigzag layout (docs/context_parallel.md).
// The sequence of T tokens is cut into 2*cp chunks of Tc = T / (2 cp) tokens; cp rank r holds chunks r and 2cp-1-r,
// concatenated in that order (its "local" sequence of 2 Tc tokens), so that under the causal mask every rank does the
// same attention work. Keys and values travel around the ring (rank r sends to r+1 and receives from r-1, both
// non-blocking, overlapping the current step's blocks); each step computes the (query chunk, key chunk) blocks that
// the causal mask leaves (kernels/attention_block.h) and merges them through their log-sum-exp. In the backward pass
// dk and dv travel with their k and v and take one more hop at the end, so each rank ends with the gradients of its
// own k and v.
// The trainer uses it through the model (model/context_parallel.h) when parallel.cp > 1.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/attention_block.h"

namespace mt {

class Arena;

// Tags one layer's ring attention uses on the cp communicator: tag_base .. tag_base + kRingAttentionTags - 1
// (forward k|v, backward k|v, backward dk|dv). Give each layer its own range (layer l: base + l * kRingAttentionTags)
// so that no two layers' or passes' messages can match one another.
constexpr int kRingAttentionTags = 3;

// ---- The zigzag layout

// The two chunks (of 2*cp) that cp rank `rank` holds, in local order: {rank, 2*cp - 1 - rank}.
struct ZigzagChunks {
  int first = 0, second = 0;
};
ZigzagChunks zigzag_chunks(int cp, int rank);

// The global positions (0 .. T-1) of the rank's local tokens, in local order (T / cp of them). T % (2 cp) == 0.
std::vector<int64_t> zigzag_positions(int64_t T, int cp, int rank);

// local [B, T/cp, ...] (overwritten) = the rank's two chunks of full [B, T, ...], in local order. Any dtype (a
// plain copy; token ids too); both tensors on one device, of one dtype, with equal trailing dimensions.
void zigzag_shard(const Tensor& local, const Tensor& full, int cp, int rank);
// The inverse: the rank's rows of full [B, T, ...] are overwritten with local [B, T/cp, ...]; the other rows are
// left alone (the cp ranks' unshards together rebuild full).
void zigzag_unshard(const Tensor& full, const Tensor& local, int cp, int rank);

// ---- The ring schedule

// One (query chunk, key chunk) block of a ring step: local chunk indices 0 (chunk rank) or 1 (chunk 2cp-1-rank) of
// the queries, and of the k|v being held (those of rank `source`).
struct RingBlock {
  int q_chunk = 0, kv_chunk = 0;
  kernels::BlockMask mask = kernels::BlockMask::Full;
};
// What rank `rank` computes at step `step` (0 .. cp-1), where it holds the k|v of rank source = (rank - step) mod cp:
//   step 0 (its own):  (0, 0) causal, (1, 1) causal, (1, 0) full;   (0, 1) is above the diagonal: skipped
//   source < rank:     (0, 0) full, (1, 0) full;                    the source's second chunk is after both: skipped
//   source > rank:     (1, 0) full, (1, 1) full;                    the rank's first chunk is before both: skipped
// So every step after the first costs every rank two full Tc x Tc blocks.
struct RingStep {
  int source = 0, count = 0;
  RingBlock block[3];
  const RingBlock* begin() const { return block; }
  const RingBlock* end() const { return block + count; }
};
RingStep ring_attention_step(int cp, int rank, int step);

// ---- The op
// Local tensors (S: fp32, fp64, bf16 or fp16, all on one device, the CPU or the GPU): q, out, dq, dout
// [B, 2Tc, NH*HS]; k, v, dk, dv [B, 2Tc, KV*HS] with NH = n_head a multiple of KV = n_kv_head (grouped-query
// attention; query head h uses kv head h / (NH / KV)); lse [2, B, NH, Tc] in A = acc_dtype(S): each local chunk's
// log-sum-exp of its queries' scaled scores over every key they see (ring_attention_lse_shape). cp is the
// context-parallel group; with size 1 this is plain causal attention (three blocks, no messages). Every rank of cp
// must call with the same shapes and tag_base. Partial outputs merge and gradients accumulate in A; out, dq, dk, dv
// are each rounded to S once.
// scratch: where the op's temporaries come from (an Arena the caller resets), or nullptr: allocated per call.

Shape ring_attention_lse_shape(int64_t B, int n_head, int64_t T_local);

// out (overwritten) = causal attention of the local queries over the whole sequence; lse (overwritten) is what the
// backward pass needs besides out.
void ring_attention_forward(Communicator& cp, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                            const Tensor& v, int n_head, int n_kv_head, int tag_base, Arena* scratch = nullptr);

// dq, dk, dv (overwritten) = gradients of the whole sequence's loss w.r.t. this rank's q, k, v, given dout and the
// out and lse that ring_attention_forward wrote.
void ring_attention_backward(Communicator& cp, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, int n_head, int n_kv_head, int tag_base, Arena* scratch = nullptr);

// The bytes of the temporaries one forward (backward) call takes, rounded as Arena::alloc and Tensor::empty round them
// (the code that allocates them, run on a counting arena): for local q [B, T_local, q_width] and k, v [B, T_local,
// kv_width] in S on a ring of cp ranks. The planner adds them to a pass's peak.
int64_t ring_attention_temp_bytes(int64_t B, int64_t T_local, int64_t q_width, int64_t kv_width, int n_head,
                                  DType S, int cp, bool backward);

}  // namespace mt
