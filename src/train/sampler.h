// Generating from a trained model (build/sample): the model's forward pass over the tokens so far, the next token
// drawn from its last row of logits (temperature, top-k, seeded), one token at a time. In fp32, on one process or
// split over tp x pp ranks (a model too large for one), with no cache of keys and values: each token runs the pass
// over the last seq_len tokens again, which is simple and exact, and fast enough for the small models this runs on.
// Split, every rank runs the passes of its stage; the last stage's tp ranks gather the logits row over the
// vocabulary shards and draw the same token (the same seed), which every rank then learns.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "parallel/mesh.h"
#include "train/config.h"

namespace mt {

class GPT;
struct Activations;

struct SampleOptions {
  int tokens = 64;           // new tokens to generate
  double temperature = 1.0;  // 0: greedy (the most likely token, ties to the lowest id)
  int top_k = 0;             // > 0: draw among the k most likely tokens only
  uint64_t seed = 1234;
  int64_t vocab_limit = 0;   // > 0: draw only ids below it (a tokenizer's tokens, fewer than the model's vocabulary)
};

class Sampler {
 public:
  // The model of `cfg` (its model section), loaded from a safetensors file with Hugging Face names, as the trainer
  // exports it (run.dir/model.safetensors). tp x pp > 1: this rank's shard of it on a mesh of tp x pp MPI ranks
  // (MPI initialised; the run's parallel section is not used); a mesh the model cannot be split over is an
  // InputError with the trainer's reason.
  Sampler(const Config& cfg, const std::string& weights, int tp = 1, int pp = 1);
  ~Sampler();

  // The prompt followed by opts.tokens generated tokens. Throws InputError for an empty prompt or an id outside
  // the vocabulary.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SampleOptions& opts);

  // The next token after `context` (its last seq_len tokens).
  int32_t next(const std::vector<int32_t>& context, const SampleOptions& opts, std::mt19937_64& rng);

 private:
  Tensor last_row(const Activations& a) const;  // the last position's logits over the whole (padded) vocabulary
  int32_t draw(const Tensor& logits, const SampleOptions& opts, std::mt19937_64& rng) const;

  Config cfg_;
  std::unique_ptr<DeviceMesh> mesh_;  // tp x pp > 1
  MeshComms comms_;
  std::unique_ptr<GPT> model_;
};

// Token ids as text for a byte-level model (data.source: text): the bytes as UTF-8, each invalid sequence replaced
// by U+FFFD.
std::string decode_bytes(const std::vector<int32_t>& ids);
// The bytes as UTF-8, each invalid sequence replaced by U+FFFD (a tokenizer's decoded text).
std::string valid_utf8(const std::string& bytes);

}  // namespace mt
