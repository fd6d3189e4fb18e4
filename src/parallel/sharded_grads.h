// ZeRO-2 (optim.zero: 2 with optim.zero_reduce: micro_batch): gradients sharded over dp. A rank never holds a
// whole gradient buffer. Its backward passes accumulate into small per-unit buffers. A unit is one transformer
// block, or the parameters before the first block (final norm, untied head), or those after the last (the
// embeddings). After each gradient pass, each bucket is reduce-scattered (average over dp) and this rank's shard
// is added to a packed shard buffer (shard_grads(), laid out like ZeRO-1's moments), which the optimizer reads.
//
// Buffers: the units take turns in two ring slots, each as large as the largest such unit. When unit k's
// gradients are final, its buckets launch, and the reduce-scatter of unit k-1 (in the other slot) is waited
// for; that slot is then zeroed and free for unit k+1. So a unit's reduction overlaps the next unit's backward,
// and the rank holds two units of full gradients at once. A pinned unit keeps a buffer of its own for the whole
// step. The embedding unit is pinned when it holds a tied head, because its gradient is written first and last
// in every pass, and held back until the trainer sums the copies between stages. With the zero-bubble split
// backward, every unit is pinned, because the input pass writes the norms' gradients long before the weight
// pass writes the rest. Reductions still in flight at the start of the chunk's next gradient pass are waited
// for there, so forward passes in between hide them.
//
// A shared ring (ZeRO-3 resharding, compute dtype = gradient dtype): two slots hold both ZeRO-3's gathered
// parameters (ShardedParams) and the gradients, where separate rings would hold four. Ring unit r's gradients are
// its own parameters' slot, r % 2: the backward pass writes each gradient over its parameter after the parameter's
// last read (GPT::set_grads_over_params), so a unit needs one slot, not one for its parameters and one for its
// gradients. Unit r - 1's gradients, in the other slot, are reduce-scattered while unit r computes, and unit r + 1's
// parameters are gathered into that same slot: the dp communicator runs its operations in issue order, and the
// reduction is issued first, so the gather overwrites the gradients only after they have been sent. That is why a
// shared ring's reductions land outside the slot: straight in the shards when each unit is reduced once per step,
// else in a staging buffer of one unit's shards, added to the shards when waited for.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/param_table.h"
#include "parallel/grad_buckets.h"
#include "parallel/grad_sync.h"

namespace mt {

struct GradUnit {
  int64_t begin = 0, end = 0;  // elements of the chunk's gradient layout
  bool pinned = false;         // a buffer of its own for the whole step
};

// The units of a chunk's layout, in layout order. Parameters named h.N.* or model.layers.N.* belong to block N.
// tied_head: the embedding unit holds the tied head's weight. all_pinned: the zero-bubble split backward.
// sublayers (optim.zero_unit: sublayer): each block is three units, in layout order its MLP's output projection, its
// MLP's input projection(s) with the norm before the MLP, and its attention with the input norm; about a third of
// a block each, their boundaries where the block's backward pass reports gradients final (model/block.h).
std::vector<GradUnit> grad_units(const ParamTable& table, bool tied_head, bool all_pinned, bool sublayers = false);

// Each ring slot (ShardedGrads', ShardedParams'): as large as the largest unpinned unit.
int64_t ring_slot_numel(const std::vector<GradUnit>& units);

struct ShardedGradsOptions {
  bool shared_ring = false;   // its two slots shared with ZeRO-3's parameter store (ring_slots()), the gradients
                              // written over the parameters
  bool reduces_once = false;  // one gradient pass per step: a shared ring's reductions land in the shards directly
};
// The ring slots a ShardedGrads keeps (shared or not).
constexpr int kGradRingSlots = 2;

// Buckets of at most bucket_bytes over the layout that never cross a unit's boundary (make_buckets within each).
std::vector<Bucket> unit_buckets(const ParamTable& table, const std::vector<GradUnit>& units, size_t elem_bytes,
                                 double bucket_bytes);

// The elements ShardedGrads allocates for a chunk (the planner's memory model counts them).
struct ShardedGradsSize {
  int64_t store = 0;    // the ring slots and the pinned units' buffers, in the gradients' dtype (and the wire's)
  int64_t staging = 0;  // a shared ring's staged reductions, in the gradients' dtype
  int64_t shard = 0;    // this rank's packed shards
};
ShardedGradsSize sharded_grads_size(const std::vector<GradUnit>& units, const std::vector<Bucket>& buckets, int dp,
                                    int rank, const ShardedGradsOptions& opts = {}, bool wire16 = false);

class ShardedGrads : public ChunkGradSync {
 public:
  // table: the chunk's parameters; dtype: its gradients' (fp32, or fp64 in tests); wire: the dtype the buckets
  // travel in (dtype, or BF16/F16); shards: where this rank's packed shards live (shard_numel() elements of
  // dtype, e.g. a view of one buffer for every chunk of the rank), or undefined to allocate them.
  ShardedGrads(Communicator& dp, const ParamTable& table, std::vector<GradUnit> units, std::vector<Bucket> buckets,
               DType dtype, DType wire, Device device, const Tensor& shards = {}, ShardedGradsOptions opts = {});

  // Each parameter's gradient view (table order), for GPT::set_grad_views.
  std::vector<Tensor> grad_views() const;
  // The step starts: the unit buffers and the shard buffer zeroed (nothing may be in flight); not a shared ring's
  // slots, which hold parameters until the backward pass writes their gradients over them.
  void zero();
  // Waits for every reduction still in flight and adds it to the shards; then, from the next pass on, reports
  // the gradients as they finish (without overlap each bucket's reduction is waited for when it launches).
  bool begin_pass(bool final, bool overlap) override;
  void grads_ready(int64_t end) override;
  // The step's end: launches the buckets held back (the tied embedding, summed between stages by now) and
  // waits for every reduction. shard_grads() then holds this rank's averaged gradients.
  void finish();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<GradUnit>& units() const { return units_; }
  ShardRange shard(int b) const { return shard_range(buckets_[b].numel(), dp_.size(), dp_.rank()); }
  int64_t shard_offset(int b) const { return shard_offsets_[b]; }
  int64_t shard_numel() const { return shard_offsets_.back(); }
  const Tensor& shard_grads() const { return shards_; }
  DType wire_dtype() const { return wire_.defined() ? wire_.dtype() : store_.dtype(); }
  int64_t bytes() const;  // the unit buffers (and their wire copies) it allocated; shard_grads() is counted apart
  // A shared ring's two slots, for ZeRO-3's parameter store (undefined otherwise).
  Tensor ring_slots() const;

 private:
  Tensor bucket_store(int b, const Tensor& buf) const;  // bucket b's elements in `buf` (store_ or wire_)
  void launch(int b);
  void settle(int b);          // wait for b's reduction, add its shard, zero its elements (unless in a shared slot)
  void settle_unit(int u);     // every bucket of unit u that is in flight
  bool staged(int b) const;    // a shared ring's bucket, reduced outside its slot
  Communicator& dp_;
  std::vector<GradUnit> units_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_unit_;      // per bucket
  std::vector<int64_t> unit_offset_;  // per unit: where its elements start in store_
  std::vector<int> prev_ring_;        // per ring unit: the ring unit before it, or -1
  std::vector<int64_t> staging_at_;   // per bucket: where its reduced shard lands in staging_
  std::vector<char> reduced_;         // per bucket: reduced this step (reduces_once)
  ShardedGradsOptions opts_;
  int64_t slot_numel_ = 0;
  std::vector<int64_t> shard_offsets_;
  ParamTable table_;
  Tensor store_, wire_, shards_, staging_;
  std::vector<WorkPtr> work_;  // per bucket, while in flight
  int next_ = 0;               // buckets [0, next_) launched this pass
  bool overlap_ = true;
};

}  // namespace mt
