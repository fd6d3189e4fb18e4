// ZeRO-1 shard segments (see zero_shards.h).
#include "train/zero_shards.h"

#include <algorithm>

namespace mt {

std::vector<OptimSegment> zero_segments(const ParamTable& table, const GradReducer& reducer) {
  std::vector<OptimSegment> out;
  for (int b = 0; b < static_cast<int>(reducer.buckets().size()); ++b) {
    const int64_t lo = reducer.buckets()[b].begin + reducer.shard(b).begin;
    const int64_t hi = reducer.buckets()[b].begin + reducer.shard(b).end;
    for (const ParamSpec& p : table.specs()) {
      const int64_t s = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel());
      if (s < e)
        out.push_back({s, reducer.shard_offset(b) + (s - lo), e - s, p.decay, !p.shard.whole(), p.shard.copy == 0});
    }
  }
  return out;
}

}  // namespace mt
