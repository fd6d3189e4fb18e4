// ZeRO-3's parameter store (see sharded_params.h).
#include "parallel/sharded_params.h"

#include <algorithm>

#include "comm/flight_recorder.h"

namespace mt {

int64_t sharded_params_store_numel(const std::vector<GradUnit>& units, bool shared_ring) {
  int64_t n = shared_ring ? 0 : kGradRingSlots * ring_slot_numel(units);
  for (const GradUnit& u : units) n += u.pinned ? u.end - u.begin : 0;
  return n;
}

ShardedParams::ShardedParams(Communicator& dp, const ParamTable& table, std::vector<GradUnit> units,
                             std::vector<Bucket> buckets, DType dtype, Device device, const Tensor& shards,
                             const Tensor& ring)
    : dp_(dp), table_(table), units_(std::move(units)), buckets_(std::move(buckets)) {
  const int n = static_cast<int>(units_.size());
  unit_buckets_.resize(n);
  for (int b = 0, u = 0; b < static_cast<int>(buckets_.size()); ++b) {
    while (u < n && buckets_[b].begin >= units_[u].end) ++u;
    CHECK(u < n && buckets_[b].end <= units_[u].end, "ShardedParams: bucket {} crosses a unit", b);
    unit_buckets_[u].push_back(b);
  }
  // The ring units take the slots in turn (consecutive units in either pass order never share one); the pinned
  // units have store_, after its own ring slots.
  const bool shared = shared_ = ring.defined();
  const int slots = kGradRingSlots;
  const int64_t slot_numel = ring_slot_numel(units_);
  CHECK(!shared || (ring.numel() == slots * slot_numel && ring.dtype() == dtype),
        "ShardedParams: a shared ring of {} {} elements for two slots of {} {}", ring.numel(),
        dtype_name(ring.dtype()), slot_numel, dtype_name(dtype));
  store_ = Tensor::zeros({std::max<int64_t>(1, sharded_params_store_numel(units_, shared))}, dtype, device);
  const Tensor& slot_store = shared ? ring : store_;
  int64_t at = shared ? 0 : slots * slot_numel;
  for (int u = 0, r = 0; u < n; ++u) {
    const int64_t numel = units_[u].end - units_[u].begin;
    if (units_[u].pinned) {
      slot_.push_back(-1);
      unit_buf_.push_back(store_.slice(at, {numel}));
      at += numel;
    } else {
      slot_.push_back(r % slots);
      unit_buf_.push_back(slot_store.slice((r % slots) * slot_numel, {numel}));
      ++r;
    }
  }
  occupant_.assign(slots, -1);
  shard_offsets_.push_back(0);
  for (const Bucket& b : buckets_)
    shard_offsets_.push_back(shard_offsets_.back() + shard_range(b.numel(), dp_.size(), dp_.rank()).size());
  if (shards.defined()) {
    CHECK(shards.numel() == shard_numel() && shards.dtype() == dtype,
          "ShardedParams: the shard buffer holds {} {} elements, {} of {} needed", shards.numel(),
          dtype_name(shards.dtype()), shard_numel(), dtype_name(dtype));
    shards_ = shards;
  } else {
    shards_ = Tensor::zeros({std::max<int64_t>(1, shard_numel())}, dtype, device);
  }
  state_.assign(n, Absent);
  touched_.assign(n, -1);
  work_.resize(n);
  pending_.resize(n);
}

std::vector<Tensor> ShardedParams::param_views() const {
  std::vector<Tensor> views;
  for (const ParamSpec& p : table_.specs()) {
    int u = 0;
    while (p.offset >= units_[u].end) ++u;
    views.push_back(unit_buf_[u].slice(p.offset - units_[u].begin, p.shape));
  }
  return views;
}

std::function<void(int)> ShardedParams::reader() {
  reads_reported_ = true;
  return [this](int p) { read(table_[p].offset, table_[p].offset + table_[p].numel()); };
}

void ShardedParams::load_shards(const Tensor& part, int64_t offset) {
  const int64_t n = part.numel();
  CHECK(offset >= 0 && offset + n <= table_.total_numel(), "ShardedParams::load_shards: [{}, {}) outside the chunk's {}",
        offset, offset + n, table_.total_numel());
  wait_all();
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    const ShardRange s = shard_range(buckets_[b].numel(), dp_.size(), dp_.rank());
    const int64_t lo = std::max(offset, buckets_[b].begin + s.begin), hi = std::min(offset + n, buckets_[b].begin + s.end);
    if (lo >= hi) continue;
    copy_convert(shards_.slice(shard_offsets_[b] + (lo - buckets_[b].begin - s.begin), {hi - lo}),
                 part.slice(lo - offset, {hi - lo}));
  }
  begin_step();
}

void ShardedParams::gather_into(const Tensor& full) {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    need(u);
    copy_convert(full.slice(units_[u].begin, {units_[u].end - units_[u].begin}), unit_buffer(u));
  }
}

void ShardedParams::begin_step() {
  wait_all();
  std::fill(state_.begin(), state_.end(), Absent);
  std::fill(occupant_.begin(), occupant_.end(), -1);
  fresh_ = true;
}

void ShardedParams::prefetch_forward_start() {
  // Every unit when all are pinned (the passes keep them): no slot waits for a pass to free it, so their gathers
  // queue up in the forward pass's order, as ZeRO-1's and -2's gather after the optimizer does.
  const int n = static_cast<int>(units_.size());
  const bool all_pinned = std::all_of(slot_.begin(), slot_.end(), [](int s) { return s < 0; });
  for (int u = n - 1; u >= std::max(0, all_pinned ? 0 : n - 2); --u)
    if (state_[u] == Absent) issue(u, PassOrder::Forward);
}

void ShardedParams::begin_pass(PassOrder order) {
  if (!fresh_) {
    wait_all();
    // A pass that starts where the chunk's previous pass ended keeps the units that pass read last, in their slots,
    // instead of gathering them again. A backward pass after a forward pass asks first for the ring's first two
    // units (the head's parameters and the last block; torchtitan leaves the last block gathered after the forward
    // pass for the same reason). A forward pass after a backward pass (the next micro-batch) asks first for the
    // ring's last two units (block 0, or an untied embedding the backward pass prefetched), unless the ring is
    // shared: the backward pass wrote their gradients over them.
    const int ring_units = static_cast<int>(std::count_if(slot_.begin(), slot_.end(), [](int s) { return s >= 0; }));
    int keep_from = ring_units, keep_to = ring_units;  // the ring units [keep_from, keep_to) stay
    if (order_ == PassOrder::Forward && order == PassOrder::Backward) keep_from = 0, keep_to = 2;
    if (order_ == PassOrder::Backward && order == PassOrder::Forward && !shared_) keep_from = ring_units - 2;
    for (int u = 0, ring = 0; u < static_cast<int>(units_.size()); ++u) {
      if (slot_[u] < 0) continue;
      const int r = ring++;
      if (r >= keep_from && r < keep_to && state_[u] == Resident) continue;
      state_[u] = Absent;
      if (occupant_[slot_[u]] == u) occupant_[slot_[u]] = -1;
    }
  }
  fresh_ = false;
  order_ = order;
  forward_end_ = table_.total_numel();
  current_ = -1;
}

void ShardedParams::forward_needs(int64_t begin) {
  CHECK(order_ == PassOrder::Forward, "ShardedParams: a forward request in a backward pass");
  if (follows_reads()) return;
  const int64_t end = forward_end_;
  forward_end_ = std::min(forward_end_, begin);
  ++request_;
  int lowest = -1;
  for (int u = static_cast<int>(units_.size()) - 1; u >= 0; --u)
    if (units_[u].end > begin && units_[u].begin < end) {
      if (reads_reported_) request(u);  // each read waits for its own bucket
      else need(u);
      lowest = u;
    }
  if (lowest < 0) return;
  prefetch(lowest - 1);  // the forward pass walks down the layout
}

void ShardedParams::backward_needs(int64_t begin, int64_t end) {
  CHECK(order_ == PassOrder::Backward, "ShardedParams: a backward request in a forward pass");
  if (follows_reads()) return;
  ++request_;
  int lowest_ring = -1, highest = -1;  // the first ring unit the request touches; the last unit
  for (int u = 0; u < static_cast<int>(units_.size()); ++u)
    if (units_[u].end > begin && units_[u].begin < end) {
      if (reads_reported_) request(u);  // each read waits for its own bucket
      else need(u);
      highest = u;
      if (lowest_ring < 0 && slot_[u] >= 0) lowest_ring = u;
    }
  // A request for a pinned unit alone (the tied head) leaves none.
  if (lowest_ring >= 0) release_left(lowest_ring);
  if (highest >= 0) prefetch(highest + 1);  // the backward pass walks up the layout
}

bool ShardedParams::follows_reads() const {
  CHECK(!read_driven_ || reads_reported_, "ShardedParams: sub-block units follow the reads, and no reader() was taken");
  return read_driven_;
}

void ShardedParams::release_left(int u) {
  // In a shared ring the units the pass has left hold their gradients, so they are no longer resident (their
  // gathers were waited for before the first gradient was written: GPT::grad's read).
  for (int v = 0; shared_ && v < u; ++v)
    if (slot_[v] >= 0 && state_[v] != Absent) {
      CHECK(state_[v] == Resident, "ShardedParams: unit {}'s slot was given to gradients during its gather", v);
      state_[v] = Absent, occupant_[slot_[v]] = -1;
    }
}

void ShardedParams::enter(int u) {
  // A unit read again after the pass left it may have been evicted (or, in a shared ring, hold its gradients).
  CHECK(current_ < 0 || (order_ == PassOrder::Forward ? u < current_ : u > current_),
        "ShardedParams: a {} pass read unit {} after unit {} (sub-block units are read in order)",
        order_ == PassOrder::Forward ? "forward" : "backward", u, current_);
  current_ = u;
  ++request_;
  if (order_ == PassOrder::Backward) release_left(u);
  request(u);
  prefetch(order_ == PassOrder::Forward ? u - 1 : u + 1);
}

void ShardedParams::request(int u) {
  touched_[u] = request_;
  if (state_[u] == Absent) issue(u, order_), ++misses_;
}

void ShardedParams::need(int u) {
  request(u);
  wait(u);
}

void ShardedParams::prefetch(int u) {
  if (u < 0 || u >= static_cast<int>(units_.size()) || state_[u] != Absent) return;
  // Never into the slot of a unit the request just made resident: the pass reads it next.
  const int holder = slot_[u] >= 0 ? occupant_[slot_[u]] : -1;
  if (holder >= 0 && touched_[holder] == request_) return;
  issue(u, order_);
}

void ShardedParams::issue(int u, PassOrder order) {
  const int slot = slot_[u];
  if (slot >= 0) {
    const int prev = occupant_[slot];
    if (prev >= 0 && prev != u) {
      wait(prev);  // its gather writes the same elements
      state_[prev] = Absent;
    }
    occupant_[slot] = u;
  }
  FlightSite site("parameter unit", u);
  // The dp communicator runs its operations in issue order: the bucket the pass reads first arrives first. A forward
  // pass reads a unit down the layout (the model lays out its parameters in reverse order of use).
  const int nb = static_cast<int>(unit_buckets_[u].size());
  work_[u].assign(nb, nullptr);
  pending_[u].assign(nb, 0);
  for (int i = 0; i < nb; ++i) {
    const int j = order == PassOrder::Forward ? nb - 1 - i : i;
    if (on_demand_) pending_[u][j] = 1;
    else launch(u, j);
  }
  state_[u] = InFlight;
  ++gathers_;
}

void ShardedParams::launch(int u, int j) {
  const int b = unit_buckets_[u][j];
  const Bucket& k = buckets_[b];
  const ShardRange s = shard_range(k.numel(), dp_.size(), dp_.rank());
  work_[u][j] = dp_.all_gather_async(shards_.slice(shard_offsets_[b], {s.size()}),
                                     unit_buffer(u).slice(k.begin - units_[u].begin, {k.numel()}));
}

void ShardedParams::finish(int u, int j) {
  if (pending_[u][j]) {
    pending_[u][j] = 0;
    FlightSite site("parameter unit", u);
    launch(u, j);
  }
  if (work_[u][j]) work_[u][j]->wait(), work_[u][j].reset();
}

void ShardedParams::wait(int u) {
  if (state_[u] != InFlight) return;
  for (int j = 0; j < static_cast<int>(work_[u].size()); ++j) finish(u, j);
  work_[u].clear();
  pending_[u].clear();
  state_[u] = Resident;
}

void ShardedParams::read(int64_t begin, int64_t end) {
  int u = 0;
  while (u < static_cast<int>(units_.size()) && begin >= units_[u].end) ++u;
  CHECK(u < static_cast<int>(units_.size()), "ShardedParams: a read of [{}, {}) past the chunk's units", begin, end);
  if (read_driven_ && !fresh_) {  // (the set-up draws parameters through GPT::grad, outside any pass)
    if (slot_[u] < 0) request(u);       // a pinned unit: the ring's walk goes on around it
    else if (u != current_) enter(u);
  }
  if (state_[u] != InFlight) return;
  bool all = true;
  for (int j = 0; j < static_cast<int>(unit_buckets_[u].size()); ++j) {
    const Bucket& k = buckets_[unit_buckets_[u][j]];
    if ((work_[u][j] || pending_[u][j]) && k.begin < end && k.end > begin) {
      const double t0 = on_read_wait_ ? trace_clock_us() : 0.0;
      finish(u, j);
      if (on_read_wait_) on_read_wait_(t0, trace_clock_us());
    }
    all = all && !work_[u][j] && !pending_[u][j];
  }
  if (all) wait(u);
}

void ShardedParams::wait_all() {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) wait(u);
}

}  // namespace mt
