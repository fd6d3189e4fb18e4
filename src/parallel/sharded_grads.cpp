// ZeRO-2's sharded gradients (see sharded_grads.h).
#include "parallel/sharded_grads.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "comm/flight_recorder.h"
#include "kernels/elementwise.h"

namespace mt {

namespace {

// The block a parameter belongs to (h.N.* for GPT-2, model.layers.N.* for Llama), or -1.
int block_of(const std::string& name) {
  for (const char* prefix : {"h.", "model.layers."}) {
    const std::string p = prefix;
    if (name.compare(0, p.size(), p) == 0) return std::atoi(name.c_str() + p.size());
  }
  return -1;
}

// Whether a block's parameter starts a unit of its own under sub-block units: the attention's output projection
// (with the QKV projection and the input norm after it in the layout) and the MLP's input projection (with the
// norm before the MLP); the MLP's output projection leads the block.
bool starts_sublayer(const std::string& name) {
  for (const char* suffix :
       {".attn.c_proj.weight", ".mlp.c_fc.weight", ".self_attn.o_proj.weight", ".mlp.up_proj.weight"}) {
    const std::string x = suffix;
    if (name.size() > x.size() && name.compare(name.size() - x.size(), x.size(), x) == 0) return true;
  }
  return false;
}

}  // namespace

int64_t ring_slot_numel(const std::vector<GradUnit>& units) {
  int64_t slot = 0;
  for (const GradUnit& u : units)
    if (!u.pinned) slot = std::max(slot, u.end - u.begin);
  return slot;
}

std::vector<GradUnit> grad_units(const ParamTable& table, bool tied_head, bool all_pinned, bool sublayers) {
  std::vector<GradUnit> units;
  int current = -2;  // the block of the unit being built (-1: no block)
  bool seen_block = false;
  for (const ParamSpec& p : table.specs()) {
    const int block = block_of(p.name);
    if (units.empty() || block != current || (sublayers && block >= 0 && starts_sublayer(p.name))) {
      // Parameters outside blocks after a block are the embedding unit.
      const bool embedding = block < 0 && seen_block;
      units.push_back({p.offset, p.offset, all_pinned || (embedding && tied_head)});
      current = block;
    }
    seen_block = seen_block || block >= 0;
    units.back().end = p.offset + p.numel();
  }
  for (size_t u = 1; u < units.size(); ++u)
    CHECK(units[u].begin == units[u - 1].end, "gradient units: the layout has a gap at element {}", units[u - 1].end);
  CHECK(units.empty() || units.back().end == table.total_numel(), "gradient units end at {} of {} elements",
        units.empty() ? 0 : units.back().end, table.total_numel());
  return units;
}

std::vector<Bucket> unit_buckets(const ParamTable& table, const std::vector<GradUnit>& units, size_t elem_bytes,
                                 double bucket_bytes) {
  std::vector<Bucket> out;
  for (const GradUnit& u : units)
    for (const Bucket& b : make_buckets_within(table, u.begin, u.end, elem_bytes, bucket_bytes)) out.push_back(b);
  return out;
}

namespace {
// Whether a shared ring's reductions need a staging buffer, and its elements: the largest ring unit's shards (a
// unit's reductions start only once the unit before it has been waited for).
int64_t staging_numel(const std::vector<GradUnit>& units, const std::vector<Bucket>& buckets, int dp, int rank,
                      const ShardedGradsOptions& opts, bool wire16) {
  if (!opts.shared_ring || opts.reduces_once || wire16) return 0;
  int64_t most = 0;
  for (const GradUnit& u : units) {
    if (u.pinned) continue;
    int64_t n = 0;
    for (const Bucket& b : buckets)
      if (b.begin >= u.begin && b.end <= u.end) n += shard_range(b.numel(), dp, rank).size();
    most = std::max(most, n);
  }
  return most;
}
}  // namespace

ShardedGradsSize sharded_grads_size(const std::vector<GradUnit>& units, const std::vector<Bucket>& buckets, int dp,
                                    int rank, const ShardedGradsOptions& opts, bool wire16) {
  ShardedGradsSize s;
  s.store = kGradRingSlots * ring_slot_numel(units);
  for (const GradUnit& u : units) s.store += u.pinned ? u.end - u.begin : 0;
  s.staging = staging_numel(units, buckets, dp, rank, opts, wire16);
  for (const Bucket& b : buckets) s.shard += shard_range(b.numel(), dp, rank).size();
  return s;
}

ShardedGrads::ShardedGrads(Communicator& dp, const ParamTable& table, std::vector<GradUnit> units,
                           std::vector<Bucket> buckets, DType dtype, DType wire, Device device,
                           const Tensor& shards, ShardedGradsOptions opts)
    : dp_(dp), units_(std::move(units)), buckets_(std::move(buckets)), opts_(opts), table_(table) {
  // The ring slots come first in the store, the pinned units follow. Ring unit r takes slot r % 2, in a shared
  // ring the slot its parameters are gathered into (the header says why).
  slot_numel_ = ring_slot_numel(units_);
  int64_t pinned_at = kGradRingSlots * slot_numel_;
  int ring = 0, last_ring = -1;
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    if (units_[u].pinned) {
      unit_offset_.push_back(pinned_at);
      pinned_at += units_[u].end - units_[u].begin;
      prev_ring_.push_back(-1);
    } else {
      unit_offset_.push_back((ring % kGradRingSlots) * slot_numel_);
      ++ring;
      prev_ring_.push_back(last_ring);
      last_ring = u;
    }
  }
  for (const Bucket& b : buckets_) {
    int u = 0;
    while (u < static_cast<int>(units_.size()) && !(b.begin >= units_[u].begin && b.end <= units_[u].end)) ++u;
    CHECK(u < static_cast<int>(units_.size()), "ZeRO-2: bucket [{}, {}) crosses a unit boundary", b.begin, b.end);
    bucket_unit_.push_back(u);
  }
  shard_offsets_.push_back(0);
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b)
    shard_offsets_.push_back(shard_offsets_.back() + shard(b).size());
  store_ = Tensor::zeros({std::max<int64_t>(1, pinned_at)}, dtype, device);
  if (wire != dtype) {
    CHECK(dtype_size(wire) < dtype_size(dtype), "ZeRO-2: {} gradients sent as {}", dtype_name(dtype),
          dtype_name(wire));
    wire_ = Tensor::zeros(store_.shape(), wire, device);
  }
  // A shared ring's staged reductions: each ring unit's buckets from the start of the staging buffer.
  const int64_t staging = staging_numel(units_, buckets_, dp.size(), dp.rank(), opts_, wire_.defined());
  staging_at_.assign(buckets_.size(), -1);
  if (staging > 0) {
    staging_ = Tensor::zeros({staging}, dtype, device);
    std::vector<int64_t> filled(units_.size(), 0);
    for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
      const int u = bucket_unit_[b];
      if (units_[u].pinned) continue;
      staging_at_[b] = filled[u];
      filled[u] += shard(b).size();
    }
  }
  if (shards.defined()) {
    CHECK(shards.numel() == shard_numel() && shards.dtype() == dtype, "ZeRO-2: a shard buffer of {} {} for {} of {}",
          shards.numel(), dtype_name(shards.dtype()), shard_numel(), dtype_name(dtype));
    shards_ = shards;
  } else {
    shards_ = Tensor::zeros({std::max<int64_t>(1, shard_numel())}, dtype, device);
  }
  work_.resize(buckets_.size());
  reduced_.assign(buckets_.size(), 0);
}

Tensor ShardedGrads::ring_slots() const {
  return opts_.shared_ring ? store_.slice(0, {kGradRingSlots * slot_numel_}) : Tensor();
}

bool ShardedGrads::staged(int b) const {
  return opts_.shared_ring && !wire_.defined() && !units_[bucket_unit_[b]].pinned;
}

std::vector<Tensor> ShardedGrads::grad_views() const {
  std::vector<Tensor> views;
  for (const ParamSpec& p : table_.specs()) {
    int u = 0;
    while (!(p.offset >= units_[u].begin && p.offset < units_[u].end)) ++u;
    views.push_back(store_.slice(unit_offset_[u] + (p.offset - units_[u].begin), p.shape));
  }
  return views;
}

Tensor ShardedGrads::bucket_store(int b, const Tensor& buf) const {
  const GradUnit& u = units_[bucket_unit_[b]];
  return buf.slice(unit_offset_[bucket_unit_[b]] + (buckets_[b].begin - u.begin), {buckets_[b].numel()});
}

void ShardedGrads::zero() {
  for (const WorkPtr& w : work_) CHECK(!w, "ZeRO-2: the gradients zeroed while a reduction is in flight");
  const int64_t ring = opts_.shared_ring ? kGradRingSlots * slot_numel_ : 0;  // holds parameters until written
  if (store_.numel() > ring) zero_(store_.slice(ring, {store_.numel() - ring}));
  zero_(shards_);
  std::fill(reduced_.begin(), reduced_.end(), 0);
  next_ = 0;
}

void ShardedGrads::launch(int b) {
  const Tensor full = bucket_store(b, wire_.defined() ? wire_ : store_);
  if (wire_.defined()) copy_convert(full, bucket_store(b, store_));
  FlightSite site("gradient bucket", b);
  const int64_t n = shard(b).size();
  if (!staged(b)) {  // in place: the output is this rank's own slice of the input (the backends allow that)
    work_[b] = dp_.reduce_scatter_async(full, full.slice(shard(b).begin, {n}), ReduceOp::Avg);
    return;
  }
  CHECK(!(opts_.reduces_once && reduced_[b]), "ZeRO-3: gradient bucket {} reduced twice in a step that reduces once",
        b);
  reduced_[b] = 1;
  const Tensor out = opts_.reduces_once ? shards_.slice(shard_offset(b), {n}) : staging_.slice(staging_at_[b], {n});
  work_[b] = dp_.reduce_scatter_async(full, out, ReduceOp::Avg);
}

void ShardedGrads::settle(int b) {
  if (!work_[b]) return;
  work_[b]->wait();
  work_[b].reset();
  const Tensor mine = shards_.slice(shard_offset(b), {shard(b).size()});
  if (staged(b)) {  // the slot may hold parameters by now
    if (!opts_.reduces_once) kernels::accumulate(mine, staging_.slice(staging_at_[b], {shard(b).size()}));
    return;
  }
  const Tensor full = bucket_store(b, wire_.defined() ? wire_ : store_);
  kernels::accumulate(mine, full.slice(shard(b).begin, {shard(b).size()}));
  if (!opts_.shared_ring || units_[bucket_unit_[b]].pinned) zero_(bucket_store(b, store_));
}

void ShardedGrads::settle_unit(int u) {
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b)
    if (bucket_unit_[b] == u) settle(b);
}

bool ShardedGrads::begin_pass(bool, bool overlap) {
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) settle(b);
  next_ = 0;
  overlap_ = overlap;
  return true;
}

void ShardedGrads::grads_ready(int64_t end) {
  int completed = 0;  // ring units whose gradients became final in this call
  while (next_ < static_cast<int>(buckets_.size()) && buckets_[next_].end <= end) {
    const int b = next_++, u = bucket_unit_[b];
    // Staged reductions share one buffer: a unit's first waits for the unit before it (with a block in one bucket,
    // the moment it would be waited for anyway).
    if (staging_at_[b] == 0 && prev_ring_[u] >= 0) settle_unit(prev_ring_[u]);
    launch(b);
    if (!overlap_) settle(b);
    if (units_[u].pinned || buckets_[b].end != units_[u].end) continue;
    // Ring unit u is final: the unit before it frees the slot that the next one writes into (in a shared ring,
    // the slot the next unit's parameters are gathered into, after that reduction in the communicator's order).
    CHECK(++completed == 1, "ZeRO-2: the backward pass reported two blocks' gradients final at once, so they "
          "shared a buffer (element {})", end);
    if (prev_ring_[u] >= 0) settle_unit(prev_ring_[u]);
  }
}

void ShardedGrads::finish() {
  while (next_ < static_cast<int>(buckets_.size())) launch(next_++);
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) settle(b);
  next_ = 0;
}

int64_t ShardedGrads::bytes() const {
  return int64_t(store_.nbytes() + (wire_.defined() ? wire_.nbytes() : 0) +
                 (staging_.defined() ? staging_.nbytes() : 0));
}

}  // namespace mt
