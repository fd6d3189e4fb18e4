// ZeRO shard segments (see zero_shards.h).
#include "train/zero_shards.h"

#include <algorithm>

namespace mt {

std::vector<OptimSegment> zero_segments(const ParamTable& table, const std::vector<Bucket>& buckets, int dp,
                                        int rank) {
  std::vector<OptimSegment> out;
  int64_t packed = 0;  // where bucket b's shard starts among this rank's shards
  for (const Bucket& k : buckets) {
    const ShardRange s = shard_range(k.numel(), dp, rank);
    const int64_t lo = k.begin + s.begin, hi = k.begin + s.end;
    for (const ParamSpec& p : table.specs()) {
      const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel());
      if (a < e) out.push_back({a, packed + (a - lo), e - a, p.decay, p.shard.summed_over_tp(), p.shard.copy == 0});
    }
    packed += s.size();
  }
  return out;
}

}  // namespace mt
