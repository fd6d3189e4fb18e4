// The batcher: which tokens a global sequence reads is a function of (step, global sequence index) alone, so
// every mesh sees the same global batch (docs/data.md, window order).
//   sequential: window offset o = ((step * global_batch + g) * T) mod (N - T - 1)
//   shuffle:    window w = step * global_batch + g is taken in epochs of K = (N - T - 1) / T windows; epoch
//               e = w / K visits the non-overlapping windows k*T in a Fisher-Yates order seeded by (seed, e).
// inputs = tokens[o .. o+T-1], targets = tokens[o+1 .. o+T].
// The constructor refuses a bad seq_len or global_batch; a stream too short for one window (N < T + 2;
// shuffle: N < 2T + 1) is refused with InputError by the first window_offset/fill call, so a batcher over an
// unused stream (an empty validation tail with evaluation off) can still be constructed.
#pragma once
#include <cstdint>
#include <vector>

#include "core/enum_names.h"
#include "data/tokens.h"

namespace mt {

// The window order (data.order).
enum class DataOrder : uint8_t { Sequential, Shuffle };
inline const auto& enum_names(DataOrder) {
  static constexpr EnumName<DataOrder> names[] = {{DataOrder::Sequential, "sequential"},
                                                  {DataOrder::Shuffle, "shuffle"}};
  return names;
}

class Batcher {
 public:
  Batcher(const std::vector<int32_t>* tokens, int seq_len, int global_batch, DataOrder order, uint64_t seed);
  // The window offset of global sequence g at step s.
  int64_t window_offset(int64_t step, int64_t g);
  // The stream's non-overlapping windows, (N - T - 1) / T: one shuffle epoch, one pass over the stream.
  int64_t windows() const;
  // Fills inputs/targets [count, T] for global sequences first .. first+count-1 of step `step`.
  void fill(int64_t step, int64_t first, int64_t count, int32_t* inputs, int32_t* targets);

 private:
  void check_length() const;  // throws InputError when the stream is too short for one window

  const std::vector<int32_t>* tokens_;
  int seq_len_, global_batch_;
  DataOrder order_;
  uint64_t seed_;
  int64_t perm_epoch_ = -1;
  std::vector<int64_t> perm_;  // the current shuffle epoch's permutation of window indices
};

}  // namespace mt
