// Checkpoints: every rank writes its shards of the training state, in a form any other mesh can read back.
//
// run.dir/checkpoints/step_NNNNNNNN/
//   rank_RRRRR.safetensors  one per world rank. For each optimizer segment the rank owns (all of its parameters,
//       or under ZeRO-1 its shards of them; without ZeRO-1 only the first rank (dp 0, cp 0) of each replica
//       group writes, and the last pipeline stage's copy of the tied wte is left out), three F32 tensors "master/<param>/<first>",
//       "exp_avg/<param>/<first>" and "exp_avg_sq/<param>/<first>": the fp32 master weights and AdamW moments of
//       the local elements [first, first + n) of the parameter's tensor-parallel shard. __metadata__ maps each
//       parameter to its shard layout and global and full shapes, so a reader maps local elements to elements
//       of the full (unpadded) tensor, which no mesh changes.
//       Under local SGD the ranks of replica d > 0 write its own moments as "replica<d>/exp_avg/..." and
//       "replica<d>/exp_avg_sq/...", and replica 0 the outer Nesterov momentum as "outer_velocity/...": readers that
//       know only the three kinds above read replica 0's state. Periodic checkpoints wait for an average, where the
//       replicas share the masters; one written between averages (a stop signal's) adds each replica d's masters as
//       "replica<d>/master/..." and replica 0 the anchor (the last average's weights) as "outer_anchor/...".
//       __metadata__ has the step of the last average ("local_sgd_last_average") and replica d's files its own
//       counters ("local_sgd_replica", "local_sgd_state": AdamW's step count, the loss scaler's state and the
//       non-finite steps it skipped).
//       Under comm.compress int8, topk or powersgd every rank writes its error-feedback residual as
//       "replica<q>/compress_residual/..." (q: its rank in the replica group, dp x cp), and under powersgd the first
//       rank of each replica group the Qs as "powersgd_q/<param>/tp<t>of<T>" (the draw counts in __metadata__);
//       under comm.adapt __metadata__ holds the bucket size and compression in force ("comm_adapt_setting").
//   meta.json  written by rank 0 once every rank file is in place: format and version, step, AdamW's step count,
//       the loss scaler, the data position and seed, the model's shape, the mesh that wrote it, every file's size
//       and checksum, and the resolved config.
//   COMPLETE   written last. A directory without it is an interrupted write, never read.
// Every file is written under a temporary name, fsynced and renamed; the newest run.keep_checkpoints complete
// checkpoints are kept. The compute copy of the weights is not stored: it is the rounding of the masters.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/errors.h"
#include "core/tensor.h"
#include "model/param_table.h"
#include "model/safetensors.h"
#include "train/checkpoint_meta.h"
#include "train/config.h"

namespace mt {


// The kinds of fp32 field a checkpoint holds per parameter (its tensors' names begin with them): the masters and
// AdamW moments, and local SGD's outer momentum and anchor (its other replicas' state is "replica<d>/" + a kind).
inline constexpr char kMasterKind[] = "master", kExpAvgKind[] = "exp_avg", kExpAvgSqKind[] = "exp_avg_sq",
                      kOuterVelocityKind[] = "outer_velocity", kOuterAnchorKind[] = "outer_anchor",
                      kResidualKind[] = "compress_residual";

// One fp32 field of a piece, viewed where it lives: its kind names the tensors it becomes.
struct CheckpointField {
  std::string kind;
  const float* data = nullptr;
};

// A contiguous range of a rank's flat parameter layout and its fp32 state, viewed where it lives (the
// optimizer's packed masters and moments, or the fp32 parameters): written without a copy.
struct CheckpointPiece {
  int64_t offset = 0, numel = 0;  // elements [offset, offset + numel) of the table's flat layout
  std::vector<CheckpointField> fields;
};

// An fp32 tensor written as it is, under its own name (state not laid out like a parameter: PowerSGD's Qs).
struct CheckpointTensor {
  std::string name;
  const float* data = nullptr;
  int64_t numel = 0;
};

// This rank's part of a checkpoint: its parameter table (all its pipeline chunks), the pieces it writes, and its
// place in the world.
struct CheckpointShard {
  const ParamTable* table = nullptr;
  std::vector<CheckpointPiece> pieces;
  std::vector<CheckpointTensor> tensors;
  std::vector<Tensor> host_copies;  // state that lives on a GPU, downloaded for the write: the pieces point here
  std::map<std::string, std::string> metadata;  // added to the rank file's __metadata__
  int rank = 0, world = 1;
};

// Collective over `world` (every rank calls it with its shard): writes root/step_NNNNNNNN and keeps the newest
// `keep` complete checkpoints under root. Returns the directory. Throws on every rank if any rank's write failed.
std::string write_checkpoint(const std::string& root, const Config& cfg, const TrainState& state,
                             const CheckpointShard& shard, Communicator& world, int keep);

// The newest complete checkpoint directory under root, or "" when there is none.
std::string latest_checkpoint(const std::string& root);

// Every complete checkpoint directory under root, newest first. `skipped` (if given) gets a line for each
// incomplete directory newer than the newest complete one: which step, and why it is not read.
std::vector<std::string> complete_checkpoints(const std::string& root, std::vector<std::string>* skipped);

// A checkpoint that is intact but was written with a config value this run does not share (model.arch,
// model.tie_embeddings, model.rope_theta, model.norm_eps, optim.name): refused, never fallen back from, since an
// older checkpoint of the same run would disagree the same way.
struct CheckpointMismatch : InputError {
  using InputError::InputError;
};

struct CheckpointInfo {
  std::string dir;
  TrainState state;
  std::string mesh;  // "dp x tp x pp" of the run that wrote it, and ZeRO-1, for the log
  std::string config;  // the resolved YAML of the run that wrote it ("" where absent)
  std::vector<SafetensorsFile> files;  // every rank file, read and verified
};

// Reads meta.json of `dir` and every rank file, and checks the checkpoint against the model of `cfg`: complete,
// format and version known, every rank file present with the size and checksum meta.json records and a valid
// safetensors layout, the same model shape. Throws InputError naming the file and what is wrong.
CheckpointInfo read_checkpoint(const std::string& dir, const Config& cfg);

// Calls sink(p, master, exp_avg, exp_avg_sq) for every parameter p of `table` (any mesh's rank table) with the
// checkpoint's fp32 values laid out as p's local shard (table[p].numel() each, vocabulary padding 0; valid during
// the call). Throws InputError when the checkpoint lacks an element.
using ParamStateSink = std::function<void(int p, const float* master, const float* exp_avg, const float* exp_avg_sq)>;
void load_checkpoint(const CheckpointInfo& info, const ParamTable& table, const ParamStateSink& sink);
// The same for any fields: sink(p, values) with values[k] the checkpoint's `kinds[k]` of p, laid out as p's local
// shard. Throws InputError when the checkpoint lacks an element of any of them.
using ParamFieldsSink = std::function<void(int p, const std::vector<const float*>& values)>;
void load_checkpoint_fields(const CheckpointInfo& info, const ParamTable& table, const std::vector<std::string>& kinds,
                            const ParamFieldsSink& sink);
// Whether any rank file holds tensors of `kind`.
bool checkpoint_has(const CheckpointInfo& info, const std::string& kind);
// The value of `key` in the __metadata__ of the first rank file that has it (`file`, if given, gets that file), or
// null: what a strategy wrote into every rank's file (CheckpointShard::metadata).
const std::string* checkpoint_metadata(const CheckpointInfo& info, const std::string& key,
                                       const SafetensorsFile** file = nullptr);

// `build/trainer --export CHECKPOINT OUT_DIR`: the full fp32 master weights as OUT_DIR/model.safetensors (GPT-2
// names, the single-rank layout) and a Hugging Face config.json, whatever mesh wrote the checkpoint.
void export_checkpoint(const std::string& dir, const std::string& out_dir, const Config& cfg);

}  // namespace mt
