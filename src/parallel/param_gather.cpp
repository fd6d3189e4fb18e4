// The background parameter all-gather of ZeRO-1 and -2 (see param_gather.h).
#include "parallel/param_gather.h"

#include "comm/flight_recorder.h"

namespace mt {

void ParamGather::issue(int b) {
  const Bucket& k = buckets_[b];
  const ShardRange s = shard_range(k.numel(), dp_.size(), dp_.rank());
  FlightSite site("parameter bucket", b);
  work_[b] = dp_.all_gather_async(params_.slice(k.begin + s.begin, {s.size()}), params_.slice(k.begin, {k.numel()}));
}

void ParamGather::launch(const Tensor& params) {
  wait_all();  // a gather still in flight writes the same elements
  params_ = params;
  work_.assign(buckets_.size(), nullptr);
  pending_.assign(buckets_.size(), on_demand_);
  if (on_demand_) return;
  for (int b = static_cast<int>(buckets_.size()) - 1; b >= 0; --b) issue(b);
}

void ParamGather::wait_bucket(int b) {
  if (pending_[b]) issue(b), pending_[b] = false;
  if (!work_[b]) return;
  work_[b]->wait();
  work_[b].reset();
}

void ParamGather::wait_from(int64_t begin) {
  // Issued last bucket first, so waiting from the end down follows the communication thread's order.
  for (int b = static_cast<int>(work_.size()) - 1; b >= 0 && buckets_[b].end > begin; --b) wait_bucket(b);
}

std::function<void(int)> ParamGather::reader(const ParamTable& table) {
  reads_reported_ = true;
  return [this, &table](int p) {
    const int64_t begin = table[p].offset, end = begin + table[p].numel();
    for (int b = 0; b < static_cast<int>(work_.size()); ++b)
      if (buckets_[b].begin < end && buckets_[b].end > begin && (pending_[b] || work_[b])) {
        const double t0 = on_read_wait_ ? trace_clock_us() : 0.0;
        wait_bucket(b);
        if (on_read_wait_) on_read_wait_(t0, trace_clock_us());
      }
  };
}

}  // namespace mt
