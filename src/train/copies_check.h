// The weights' copies that training keeps equal, compared between steps (run.check_copies_every, docs/reliability.md):
//   - every replica's (dp x cp) weights: under ZeRO-0 each replica updates its own copy from the averaged gradients;
//     under ZeRO-1/2 each holds the compute weights gathered from the replicas' shards, which only a faulty gather
//     could leave unequal (ZeRO-3 keeps no whole copy: nothing to compare);
//   - a parameter that tensor parallelism replicates (norms, biases of row-parallel layers, Llama's k and v weights
//     where tp exceeds the kv heads) on every tp rank that holds it, each updated apart;
//   - the tied wte on the first and the last pipeline stage, each updated apart from their summed gradient.
// Equal by design, bit for bit: any difference is a bug (the drift of compression's per-bucket encodings and of a
// norm counted on one tp rank were two) or a corrupted update, which a checkpoint would otherwise save and the export
// hide (it takes replica 0's weights). Every rank hashes its fp32 weights per parameter (64 bits; under ZeRO-1/2 with
// 16-bit compute, the gathered compute weights too), one sum over the world brings every rank's hashes, and each rank
// compares the groups it belongs to.
#pragma once
#include <string>

#include "core/tensor.h"

namespace mt {

struct TrainingRun;

// Compares the weights' copies after step `step`, collectively over the world. `weights`: the export's
// (training_run.h's export_weights) where the caller holds them; otherwise they are taken where the mesh compares
// them (under ZeRO with 16-bit compute, gathered only for tp copies or a pipeline's tied embedding). Returns a line
// that says what was compared ("" on one rank, or where the mesh holds no copies); on a difference every rank logs
// what it found, and every rank throws StoppedTogether (exit 1) together.
std::string check_weight_copies(TrainingRun& r, int step, const Tensor& weights = Tensor());

}  // namespace mt
