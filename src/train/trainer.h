// The training run: data, model, optimizer and the step loop, with metrics, evaluation and the final export.
#pragma once
#include "train/config.h"

namespace mt {

// Runs the whole job described by cfg (already validated). Throws InputError for bad input files (exit 2)
// and std::runtime_error for failures while running (exit 1).
void run_training(const Config& cfg);

}  // namespace mt
