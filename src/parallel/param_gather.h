// ZeRO-1 and -2: after the optimizer step every rank holds only its updated shard of each bucket of the
// parameters. ParamGather all-gathers them in the background, in the order the next forward pass reads them
// (the last bucket, the embedding's, first), and the forward pass waits for each bucket just before it reads it,
// so the gather hides behind the next step's forward instead of ending this one. The waits come from GPT::forward's
// params_needed (a block at a time), or, finer, from each parameter read (reader(): a block computes on its first
// buckets while the rest arrive).
// Whatever reads the parameters outside a forward pass (evaluation, checkpoints, the export) waits for all of them.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/param_table.h"
#include "parallel/grad_buckets.h"

namespace mt {

class ParamGather {
 public:
  // buckets: the chunk's ZeRO buckets over its flat parameters (each rank's shard is shard_range of the bucket).
  ParamGather(Communicator& dp, std::vector<Bucket> buckets) : dp_(dp), buckets_(std::move(buckets)) {}
  ~ParamGather() { wait_all(); }
  // Starts gathering every bucket of `params` (this chunk's flat parameters) in place, last bucket first.
  void launch(const Tensor& params);
  // Waits until the elements [begin, end of the layout) are gathered.
  void wait_from(int64_t begin);
  // GPT::set_param_read_hook's hook (`table`: the chunk's parameters): waits for the bucket of each parameter read.
  // From then on the forward pass's params_needed need not wait (reads_reported()).
  std::function<void(int)> reader(const ParamTable& table);
  bool reads_reported() const { return reads_reported_; }
  // Called with the start and end (trace_clock_us) of each wait a read blocked on: the profiler's trace.
  void set_read_wait_observer(std::function<void(double, double)> f) { on_read_wait_ = std::move(f); }
  void wait_all() { wait_from(0); }
  // Tests (MESHTRAIN_INJECT=late-gather): launch() only notes the buckets, and wait_from() gathers each one when
  // asked, so a read that is not preceded by its wait sees the previous step's parameters every time.
  void set_on_demand() { on_demand_ = true; }

 private:
  void issue(int b);
  void wait_bucket(int b);  // issued first when on demand
  Communicator& dp_;
  std::vector<Bucket> buckets_;
  std::vector<WorkPtr> work_;  // per bucket while in flight, else null
  std::vector<bool> pending_;  // on demand: per bucket, launched but not issued
  Tensor params_;
  bool on_demand_ = false;
  bool reads_reported_ = false;
  std::function<void(double, double)> on_read_wait_;
};

}  // namespace mt
