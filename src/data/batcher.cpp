// The batcher (formulas in batcher.h): window offsets are a pure function of (step, global sequence), so any
// split of a global batch over ranks and micro-batches reads the same tokens.
#include "data/batcher.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "core/errors.h"
#include "core/philox.h"

namespace mt {

namespace {

// A uniform integer in [0, n) from 64 random bits by multiply-shift (bias below n / 2^64, negligible).
uint64_t below(uint64_t bits, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * n) >> 64);
}

}  // namespace

Batcher::Batcher(const std::vector<int32_t>* tokens, int seq_len, int global_batch, DataOrder order, uint64_t seed)
    : tokens_(tokens), seq_len_(seq_len), global_batch_(global_batch), order_(order), seed_(seed) {
  if (tokens_ == nullptr) input_error("batcher: no token stream");
  if (seq_len_ <= 0) input_error("model.seq_len must be positive (got {})", seq_len_);
  if (global_batch_ <= 0) input_error("train.global_batch must be positive (got {})", global_batch_);
}

// The stream's length is checked when a window is first asked for, not at construction, so a batcher over an
// unused stream (an empty validation tail with evaluation off) can still be built.
void Batcher::check_length() const {
  const int64_t N = static_cast<int64_t>(tokens_->size());
  if (N < static_cast<int64_t>(seq_len_) + 2)
    input_error("the token stream has {} tokens, too short for model.seq_len {} (needs at least seq_len + 2 = {})",
                N, seq_len_, static_cast<int64_t>(seq_len_) + 2);
  if (order_ == DataOrder::Shuffle && windows() < 1)
    input_error("data.order=shuffle: the token stream has {} tokens, too short for one window of model.seq_len "
                "{} (needs at least 2 * seq_len + 1 = {})",
                N, seq_len_, 2 * static_cast<int64_t>(seq_len_) + 1);
}

int64_t Batcher::windows() const {
  return (static_cast<int64_t>(tokens_->size()) - seq_len_ - 1) / seq_len_;
}

int64_t Batcher::window_offset(int64_t step, int64_t g) {
  check_length();
  if (step < 0 || g < 0 || g >= global_batch_)
    throw std::out_of_range("Batcher::window_offset: step " + std::to_string(step) + ", sequence " +
                            std::to_string(g) + " of a global batch of " + std::to_string(global_batch_));
  const int64_t N = static_cast<int64_t>(tokens_->size()), T = seq_len_;
  const int64_t M = N - T - 1;  // number of valid window starts: o in [0, M)
  const int64_t w = step * global_batch_ + g;
  if (order_ == DataOrder::Sequential) {
    // (w * T) mod M without overflow: w mod M < M and M * T < N * T fits easily in 64 bits.
    return static_cast<int64_t>((static_cast<unsigned __int128>(w % M) * static_cast<uint64_t>(T)) %
                                static_cast<uint64_t>(M));
  }
  const int64_t K = windows();  // non-overlapping windows k*T, k in [0, K): k*T + T <= M < N - 1
  const int64_t epoch = w / K;
  if (epoch != perm_epoch_) {
    // Fisher-Yates (Durstenfeld) over [0, K), draw i keyed by (seed, epoch, i): the order depends on the
    // seed and the epoch only, never on the mesh.
    perm_.resize(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) perm_[static_cast<size_t>(k)] = k;
    const uint64_t tag = fnv1a64("meshtrain.batcher.shuffle");
    PhiloxKey key{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)};
    const uint64_t ctr_hi = tag ^ (static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ull);
    for (int64_t i = K - 1; i > 0; --i) {
      PhiloxCounter r = philox4x32({static_cast<uint32_t>(i), static_cast<uint32_t>(static_cast<uint64_t>(i) >> 32),
                                    static_cast<uint32_t>(ctr_hi), static_cast<uint32_t>(ctr_hi >> 32)},
                                   key);
      uint64_t bits = (static_cast<uint64_t>(r[0]) << 32) | r[1];
      int64_t j = static_cast<int64_t>(below(bits, static_cast<uint64_t>(i) + 1));
      std::swap(perm_[static_cast<size_t>(i)], perm_[static_cast<size_t>(j)]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[static_cast<size_t>(w % K)] * T;
}

void Batcher::fill(int64_t step, int64_t first, int64_t count, int32_t* inputs, int32_t* targets) {
  if (first < 0 || count < 0 || first + count > global_batch_)
    throw std::out_of_range("Batcher::fill: sequences [" + std::to_string(first) + ", " +
                            std::to_string(first + count) + ") outside a global batch of " +
                            std::to_string(global_batch_));
  const int32_t* tok = tokens_->data();
  const int64_t T = seq_len_;
  for (int64_t b = 0; b < count; ++b) {
    const int64_t o = window_offset(step, first + b);
    for (int64_t t = 0; t < T; ++t) {
      inputs[b * T + t] = tok[o + t];
      targets[b * T + t] = tok[o + t + 1];
    }
  }
}

}  // namespace mt
