// Settings a run would ignore without a word: a key set away from its default where nothing in this run reads it
// (an outer optimizer without local SGD, a PowerSGD rank without PowerSGD, ...). The run trains; each becomes a
// warning naming the key, its value and where it applies.
#pragma once
#include <string>
#include <vector>

#include "parallel/mesh.h"
#include "train/config.h"

namespace mt {

// "KEY=VALUE is ignored: WHY" for each such setting.
std::vector<std::string> ignored_settings(const Config& cfg, const DeviceMesh& mesh);

}  // namespace mt
