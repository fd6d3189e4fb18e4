// Fuzzes the typed config (train/config.h): YAML parsing into the key table, `--set` overrides and validation.
// Input layout: a YAML document, optionally followed by a NUL byte and newline-separated `key=value` overrides
// (so the seed configs are valid inputs as they are). Allowed outcomes: a Config or InputError; any other
// exception escapes and is reported as a crash. On success the config is validated for 1..8 ranks, its stage
// split computed, and to_yaml's output must load back to the same value for every key (the trainer writes it to
// run.dir/config.yaml and promises exactly that).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/errors.h"
#include "fuzz_util.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = mt::fuzz::scratch_path("in.yaml");
  static const std::string copy = mt::fuzz::scratch_path("copy.yaml");
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  std::string_view yaml = in.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = in.substr(nul + 1);
    for (;;) {
      const size_t nl = rest.find('\n');
      overrides.emplace_back(rest.substr(0, nl));
      if (nl == std::string_view::npos || overrides.size() >= 16) break;
      rest = rest.substr(nl + 1);
    }
  }
  mt::fuzz::write_file(path, yaml.data(), yaml.size());

  mt::Config cfg;
  try {
    cfg = mt::load_config(path, overrides);
  } catch (const mt::InputError&) {
    return 0;
  }
  for (int world = 1; world <= 8; ++world) {
    try {
      mt::validate(cfg, world);
      mt::resolved_dp(cfg, world);
    } catch (const mt::InputError&) {
    }
  }
  try {
    const std::vector<int> split = mt::layers_per_stage(cfg);
    long long sum = 0;
    for (int s : split) {
      if (s < 1) mt::fuzz::property_failed("a pipeline stage without blocks");
      sum += s;
    }
    if (sum != cfg.model.n_layer) mt::fuzz::property_failed("the stage split does not sum to n_layer");
  } catch (const mt::InputError&) {
    mt::fuzz::property_failed("layers_per_stage refused a config that validate_values accepted");
  }

  const std::string text = mt::to_yaml(cfg);
  mt::fuzz::write_file(copy, text.data(), text.size());
  mt::Config back;
  try {
    back = mt::load_config(copy, {});
  } catch (const mt::InputError& e) {
    mt::fuzz::property_failed(std::string("to_yaml's output does not load: ") + e.what() + "\n" + text);
  }
  for (const std::string& key : mt::config_keys())
    if (mt::config_value(cfg, key) != mt::config_value(back, key))
      mt::fuzz::property_failed("key " + key + " changed in the to_yaml round trip: '" + mt::config_value(cfg, key) +
                                "' -> '" + mt::config_value(back, key) + "'");
  return 0;
}
