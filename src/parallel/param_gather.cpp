// The background parameter all-gather of ZeRO-1 and -2 (see param_gather.h).
#include "parallel/param_gather.h"

namespace mt {

void ParamGather::launch(const Tensor& params) {
  wait_all();  // a gather still in flight writes the same elements
  work_.assign(buckets_.size(), nullptr);
  for (int b = static_cast<int>(buckets_.size()) - 1; b >= 0; --b) {
    const Bucket& k = buckets_[b];
    const ShardRange s = shard_range(k.numel(), dp_.size(), dp_.rank());
    work_[b] = dp_.all_gather_async(params.slice(k.begin + s.begin, {s.size()}), params.slice(k.begin, {k.numel()}));
  }
}

void ParamGather::wait_from(int64_t begin) {
  // Issued last bucket first, so waiting from the end down follows the communication thread's order.
  for (int b = static_cast<int>(work_.size()) - 1; b >= 0; --b) {
    if (buckets_[b].end <= begin) break;
    if (!work_[b]) continue;
    work_[b]->wait();
    work_[b].reset();
  }
}

}  // namespace mt
