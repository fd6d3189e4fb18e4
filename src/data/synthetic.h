// The synthetic corpus: a seeded first-order Markov chain over the vocabulary. Each token has a few possible
// successors with seeded probabilities, so the process is learnable, and its entropy rate (the best loss any
// model can reach) is computed exactly from the chain: H = sum_s pi(s) H(next | s), pi the stationary law.
#pragma once
#include <cstdint>
#include <vector>

namespace mt {

struct SyntheticCorpus {
  int vocab_size = 0;
  int successors = 0;                  // possible next tokens per token
  std::vector<int32_t> next;           // [vocab * successors] successor ids
  std::vector<double> prob;            // [vocab * successors] their probabilities
  double entropy_rate_nats = 0;        // computed from the stationary distribution
};

// The chain for (seed, vocab_size); independent of the mesh.
SyntheticCorpus make_synthetic_corpus(uint64_t seed, int vocab_size);
// n tokens sampled from the chain, starting from token 0; deterministic in (corpus, seed, n).
std::vector<int32_t> sample_synthetic_tokens(const SyntheticCorpus& corpus, uint64_t seed, int64_t n);

}  // namespace mt
