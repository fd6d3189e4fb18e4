// ZeRO-3's parameter store for one model chunk: parameters sharded over dp. A rank keeps only its shard of each
// bucket, packed in bucket order (shards(): laid out like ZeRO-2's gradient shards, so an optimizer updates them
// in place). It gathers a unit's whole parameters just before a pass reads them. The units are ZeRO-2's
// (grad_units: each block, the head's parameters, the embeddings), and buckets never cross a unit.
//
// Buffers: the unpinned units take turns in ring slots, each as large as the largest such unit: the unit a pass
// computes and the next one, gathered meanwhile. The forward pass asks for the next block's input norm only at the
// end of a block (the norm fused into it), so two blocks suffice there too. The ring is two slots of its own, or
// two shared with the gradients (ShardedGrads' ring_slots(): unit r in slot r % 2, its gradients written over its
// parameters; sharded_grads.h says why).
// A gather reads this rank's shard from shards() and writes the whole unit into its slot, so issuing it never
// touches the slot: a shared slot's gradients may still be waiting to be sent. A pinned unit keeps a buffer of
// its own: the tied embedding, which every forward pass reads first and last.
//
// The passes ask through GPT's hooks (GPT::set_param_views, forward's and backward's params_needed). A request
// makes the units it touches resident: gathered then, or waited for if their prefetch is in flight. When the model
// also reports each parameter it reads (reader(), GPT::set_param_read_hook), a request only issues the units'
// gathers and each read waits for its own bucket: a unit's buckets are gathered in the order the pass reads them,
// so a block starts computing when its first weights have arrived instead of all of them (the step's first block
// after the optimizer, whose gather nothing else hides, most of all). A backward pass never reads some buckets (a
// block's biases): in a shared ring GPT::grad reports them as reads before their gradients are written, and every
// pass's start waits for whatever is still in flight. A request also prefetches the next unit in the pass's order,
// unless that would evict a unit of the same request (the first request of a forward pass touches the embeddings
// and block 0). begin_pass() forgets the unpinned units (reshard after forward: the next pass gathers them again),
// except those it starts with that the chunk's previous pass ended with (a backward pass after a forward pass, and a
// forward pass after a backward pass unless the ring is shared). begin_step() forgets every unit, since an optimizer
// step changed the shards.
// parallel.reshard_after_forward: false pins every unit, so a unit gathered once stays for the whole step.
//
// Units smaller than a block (optim.zero_unit: sublayer; set_read_driven()) do not fit the model's requests, which
// ask for a whole block at once: two slots cannot hold its three units. There the reads drive the ring instead and
// the requests are not used: a pass's first read of a ring unit is that unit's request (gathered then if absent,
// its buckets waited for as they are read) and prefetches the next unit in the pass's order into the slot of the
// unit before it, which the pass has finished reading (the model reads each block's units in order, never going
// back: config_validate.cpp refuses train.recompute light and full, and zb1's weight pass). In a shared ring that
// unit's gradients are on their way: its backward pass reported them final before reading the next unit (the
// block's ready points), so their reduction was issued first.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/param_table.h"
#include "parallel/grad_buckets.h"
#include "parallel/sharded_grads.h"

namespace mt {

// Which way a pass walks the units: forward from the embeddings (the end of the layout) down to the head's, backward
// from the head's up.
enum class PassOrder { Forward, Backward };

// The elements of a ShardedParams' own unit buffers (its two ring slots, none when it shares the gradients', and the
// pinned units'), in the compute dtype; the shards are counted apart (the planner's memory model).
int64_t sharded_params_store_numel(const std::vector<GradUnit>& units, bool shared_ring = false);

class ShardedParams {
 public:
  // table: the chunk's parameters; dtype: the compute dtype; shards: where this rank's packed shards live
  // (shard_numel() elements of dtype), or undefined to allocate them; ring: two slots shared with the gradients
  // (ShardedGrads::ring_slots(), the same units), or undefined for two of its own.
  ShardedParams(Communicator& dp, const ParamTable& table, std::vector<GradUnit> units, std::vector<Bucket> buckets,
                DType dtype, Device device, const Tensor& shards = {}, const Tensor& ring = {});
  ~ShardedParams() { wait_all(); }

  // Each parameter's view (table order) in its unit's buffer, for GPT::set_param_views.
  std::vector<Tensor> param_views() const;
  // GPT::set_param_read_hook's hook: parameter p is read next. Waits for p's bucket when its unit's gather is in
  // flight; once taken, requests stop waiting for whole units (the header says why).
  std::function<void(int)> reader();
  // Called with the start and end (trace_clock_us) of each wait a read blocked on: the profiler's trace.
  void set_read_wait_observer(std::function<void(double, double)> f) { on_read_wait_ = std::move(f); }
  const Tensor& shards() const { return shards_; }
  int64_t shard_numel() const { return shard_offsets_.back(); }
  // This rank's shards of the elements [offset, offset + part.numel()) of the chunk's flat layout taken from
  // `part` (any float dtype: initialisation, a checkpoint); the whole chunk when offset is 0 and part all of it.
  void load_shards(const Tensor& part, int64_t offset = 0);
  // The chunk's whole flat parameters gathered into `full` (the export); leaves every unit not resident.
  void gather_into(const Tensor& full);

  void begin_step();                // the shards changed: no unit is resident
  // After begin_step: the next forward pass's first units (the end of the layout: the embeddings and the first
  // block; every unit when all are pinned) gathered in the background, so that pass need not wait for them in full.
  void prefetch_forward_start();
  // A new pass: the unpinned units are not resident, unless the pass is the step's first (what is in the store
  // then was gathered from the step's shards).
  void begin_pass(PassOrder order);
  // GPT::forward's params_needed: the elements [begin, the previous request's begin) are read next.
  void forward_needs(int64_t begin);
  // GPT::backward's params_needed: the elements [begin, end) are read next.
  void backward_needs(int64_t begin, int64_t end);
  // Sub-block units: the reads drive the ring, the requests are ignored (the header says why). Needs reader().
  void set_read_driven() { read_driven_ = true; }
  // Tests (MESHTRAIN_INJECT=late-gather): issuing a unit only notes its buckets, and each is gathered when a read
  // or a wait asks for it, so a parameter read without asking sees the slot's old contents on every run.
  void set_on_demand() { on_demand_ = true; }

  // The unit buffers it allocated (its own ring slots and the pinned units'); the gathers issued so far, and how many
  // of them a request had to issue itself, not prefetched (tests: a unit gathered once per pass, and only a pass's
  // first units waited for in full).
  int64_t buffer_bytes() const { return int64_t(store_.nbytes()); }
  int64_t gathers_issued() const { return gathers_; }
  int64_t gathers_not_prefetched() const { return misses_; }

 private:
  enum State { Absent, InFlight, Resident };
  void need(int u);                      // unit u resident
  void request(int u);                   // unit u's gather issued if absent (a miss), not waited for
  void prefetch(int u);                  // unit u's gather issued, if u exists and is absent
  void issue(int u, PassOrder order);    // its buckets in the order that pass reads them
  void wait(int u);
  void read(int64_t begin, int64_t end);  // the elements [begin, end) of one unit waited for
  bool follows_reads() const;             // read-driven: the model's requests are not used
  void enter(int u);                      // read-driven: the pass's first read of ring unit u
  void release_left(int u);               // a shared ring's units a backward pass has left before ring unit u
  void launch(int u, int j);              // unit u's j-th bucket's all-gather issued
  void finish(int u, int j);              // and waited for (issued now when on demand)
  void wait_all();
  Tensor unit_buffer(int u) const { return unit_buf_[u]; }

  Communicator& dp_;
  ParamTable table_;
  std::vector<GradUnit> units_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<int>> unit_buckets_;  // per unit, its buckets
  std::vector<Tensor> unit_buf_;                // per unit: its elements, in its ring slot or in store_
  std::vector<int> slot_;                       // per unit: its ring slot, -1 when pinned
  std::vector<int> occupant_;                   // per slot: the unit whose elements it holds, or -1
  std::vector<int64_t> shard_offsets_;          // per bucket, and the total last
  std::vector<State> state_;
  std::vector<int64_t> touched_;                // per unit: the request that last touched it
  std::vector<std::vector<WorkPtr>> work_;      // per unit, per bucket (as unit_buckets_), while in flight
  std::vector<std::vector<char>> pending_;      // per unit, per bucket: issued on demand, not launched yet
  Tensor store_, shards_;
  PassOrder order_ = PassOrder::Forward;
  int64_t forward_end_ = 0;  // the forward pass's previous request
  bool fresh_ = true;        // no pass since begin_step
  bool shared_ = false;      // the ring's slots are shared with the gradients
  bool reads_reported_ = false;  // reader() was taken: a request does not wait
  bool on_demand_ = false;       // set_on_demand()
  bool read_driven_ = false;     // set_read_driven()
  int current_ = -1;             // read-driven: the ring unit the pass reads now
  std::function<void(double, double)> on_read_wait_;
  int64_t request_ = 0;      // requests so far
  int64_t gathers_ = 0, misses_ = 0;
};

}  // namespace mt
