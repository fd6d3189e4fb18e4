// meta.json of a checkpoint (train/checkpoint.h): parsed and checked without touching any other file, so the
// parser can be fuzzed on its own (fuzz/fuzz_checkpoint_meta.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "train/config.h"

namespace mt {

// What a checkpoint restores besides the tensors.
struct TrainState {
  int64_t step = 0;             // the last completed step: a resumed run continues at step + 1
  int64_t optimizer_steps = 0;  // AdamW's t (steps skipped for fp16 overflow do not count)
  double loss_scale = 1;
  int good_in_a_row = 0;
  int64_t skipped_steps = 0;       // the loss scaler's (fp16 overflow)
  int64_t nonfinite_skipped = 0;   // train.skip_nonfinite's
};

struct CheckpointFileEntry {
  std::string name;  // a file name in the checkpoint directory (no '/')
  uint64_t bytes = 0;
  std::string checksum;  // 16 hex digits of Checksum64
};

struct CheckpointMeta {
  TrainState state;
  std::string mesh;  // "dp x tp x pp" of the run that wrote it, and ZeRO-1, for the log
  std::vector<CheckpointFileEntry> files;
  std::string config;  // the resolved YAML of the run that wrote it ("" where absent)
};

// Version 2 seals meta.json with a checksum of its own (seal_checkpoint_meta); version 1 (no seal) is still read.
constexpr const char* kCheckpointFormat = "meshtrain-checkpoint";
constexpr int kCheckpointVersion = 2;

// meta.json's text with its seal: the body (which must start with "{\n") gains a first field
// "meta_checksum": the Checksum64 of the body without that line, so any change to any other byte is detected.
std::string seal_checkpoint_meta(const std::string& body);

// Parses meta.json's text and checks it: the seal (version 2), format and version, every field present with a
// sane value (steps and counts below 2^31), the model shape equal to `model`'s. `path` and `dir` name the file and
// the checkpoint in messages. Throws InputError.
CheckpointMeta parse_checkpoint_meta(std::string_view text, const std::string& path, const std::string& dir,
                                     const ModelConfig& model);

// The model configuration values a checkpoint must share with the run that reads it.
std::vector<std::pair<const char*, int64_t>> checkpoint_model_shape(const ModelConfig& m);

}  // namespace mt
