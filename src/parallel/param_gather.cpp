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

void ParamGather::wait_from(int64_t begin) {
  // Issued last bucket first, so waiting from the end down follows the communication thread's order.
  for (int b = static_cast<int>(work_.size()) - 1; b >= 0; --b) {
    if (buckets_[b].end <= begin) break;
    if (pending_[b]) issue(b), pending_[b] = false;
    if (!work_[b]) continue;
    work_[b]->wait();
    work_[b].reset();
  }
}

}  // namespace mt
