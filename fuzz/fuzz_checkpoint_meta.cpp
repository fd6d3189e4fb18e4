// Fuzzes the checkpoint meta.json parser (train/checkpoint_meta.h), which reads the text before any other file of
// a checkpoint is opened. Allowed outcomes: a CheckpointMeta or InputError. On success the values are the ones
// the loader relies on: counts and steps in [0, 2^31 - 2], a positive finite loss scale, at least one file,
// and file names that stay inside the checkpoint directory.
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/errors.h"
#include "fuzz_util.h"
#include "train/checkpoint_meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const mt::ModelConfig model;  // the defaults: the seed's "model" object matches them
  mt::CheckpointMeta m;
  try {
    m = mt::parse_checkpoint_meta(std::string_view(reinterpret_cast<const char*>(data), size), "ckpt/meta.json",
                                  "ckpt", model);
  } catch (const mt::InputError&) {
    return 0;
  }
  const int64_t max = (int64_t(1) << 31) - 2;
  const mt::TrainState& s = m.state;
  for (int64_t v : {s.step, s.optimizer_steps, int64_t(s.good_in_a_row), s.skipped_steps, s.nonfinite_skipped})
    if (v < 0 || v > max) mt::fuzz::property_failed("a step or count outside [0, 2^31 - 2]: " + std::to_string(v));
  if (!(s.loss_scale > 0) || !std::isfinite(s.loss_scale)) mt::fuzz::property_failed("a bad loss scale");
  if (m.files.empty()) mt::fuzz::property_failed("no files");
  for (const mt::CheckpointFileEntry& f : m.files)
    if (f.name.empty() || f.name == "." || f.name == ".." || f.name.find('/') != std::string::npos ||
        f.name.find('\0') != std::string::npos)
      mt::fuzz::property_failed("a file name that leaves the checkpoint directory: '" + f.name + "'");
  return 0;
}
