// The typed run configuration: YAML -> structs with defaults, `--set key=value` overrides, validation, and the
// `--help` text. Every key users rely on lives here; bad input throws InputError (exit status 2).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "core/tensor.h"
#include "data/batcher.h"
#include "kernels/cpu/matmul_backend.h"
#include "model/model_arch.h"
#include "model/recompute.h"
#include "optim/lr_schedule.h"
#include "parallel/compress_method.h"
#include "parallel/schedule.h"
#include "parallel/staleness_policy.h"
#include "train/straggler.h"

namespace mt {

// The policies only src/train reads; the others live beside the code that takes them (PipelineSchedule, LRDecay,
// CompressMethod, DataOrder, Device). Each enum_names table is the keys' YAML spelling.
enum class OptimizerKind : uint8_t { AdamW, SGD };  // optim.name
inline const auto& enum_names(OptimizerKind) {
  static constexpr EnumName<OptimizerKind> names[] = {{OptimizerKind::AdamW, "adamw"}, {OptimizerKind::SGD, "sgd"}};
  return names;
}
enum class OuterOptimizer : uint8_t { None, Nesterov };  // optim.outer
inline const auto& enum_names(OuterOptimizer) {
  static constexpr EnumName<OuterOptimizer> names[] = {{OuterOptimizer::None, "none"},
                                                       {OuterOptimizer::Nesterov, "nesterov"}};
  return names;
}
enum class ZeroReduce : uint8_t { MicroBatch, Step };  // optim.zero_reduce (ZeRO-2)
// parallel.reshard_after_forward (ZeRO-3): auto is true without pipeline parallelism and false with it.
enum class Reshard : uint8_t { Auto, Yes, No };
inline const auto& enum_names(Reshard) {
  static constexpr EnumName<Reshard> names[] = {{Reshard::Auto, "auto"}, {Reshard::Yes, "true"}, {Reshard::No, "false"}};
  return names;
}
// optim.zero_unit (ZeRO-2 and -3): what a unit of gathered parameters and sharded gradients holds.
enum class ZeroUnit : uint8_t { Block, Sublayer };
inline const auto& enum_names(ZeroUnit) {
  static constexpr EnumName<ZeroUnit> names[] = {{ZeroUnit::Block, "block"}, {ZeroUnit::Sublayer, "sublayer"}};
  return names;
}
inline const auto& enum_names(ZeroReduce) {
  static constexpr EnumName<ZeroReduce> names[] = {{ZeroReduce::MicroBatch, "micro_batch"},
                                                   {ZeroReduce::Step, "step"}};
  return names;
}
enum class DataSource : uint8_t { Synthetic, Tokens, Text };  // data.source
inline const auto& enum_names(DataSource) {
  static constexpr EnumName<DataSource> names[] = {
      {DataSource::Synthetic, "synthetic"}, {DataSource::Tokens, "tokens"}, {DataSource::Text, "text"}};
  return names;
}
enum class CommBackend : uint8_t { Auto, Shm, Mpi, Nccl };  // comm.backend
inline const auto& enum_names(CommBackend) {
  static constexpr EnumName<CommBackend> names[] = {
      {CommBackend::Auto, "auto"}, {CommBackend::Shm, "shm"}, {CommBackend::Mpi, "mpi"}, {CommBackend::Nccl, "nccl"}};
  return names;
}
enum class CommWait : uint8_t { Auto, Poll, Block };  // comm.wait
inline const auto& enum_names(CommWait) {
  static constexpr EnumName<CommWait> names[] = {
      {CommWait::Auto, "auto"}, {CommWait::Poll, "poll"}, {CommWait::Block, "block"}};
  return names;
}
enum class CommThreadPriority : uint8_t { Auto, Realtime, Normal };  // comm.thread_priority
inline const auto& enum_names(CommThreadPriority) {
  static constexpr EnumName<CommThreadPriority> names[] = {{CommThreadPriority::Auto, "auto"},
                                                           {CommThreadPriority::Realtime, "realtime"},
                                                           {CommThreadPriority::Normal, "normal"}};
  return names;
}
// The dtypes precision.compute and precision.grad_reduce accept (a few of DType's), named as dtype_name names them.
inline const auto& compute_dtype_names() {
  static constexpr EnumName<DType> names[] = {{DType::F32, "fp32"}, {DType::BF16, "bf16"}, {DType::F16, "fp16"}};
  return names;
}
inline const auto& grad_reduce_dtype_names() {
  static constexpr EnumName<DType> names[] = {{DType::F32, "fp32"}, {DType::BF16, "bf16"}};
  return names;
}

struct ModelConfig {
  ModelArch arch = ModelArch::GPT2;  // gpt2 | llama (docs/llama.md)
  int n_layer = 4, n_head = 4, d_model = 128, seq_len = 64, vocab_size = 256;
  // Llama only: kv heads (0 = n_head), SwiGLU hidden size (0 = 2/3 of 4 d_model rounded up to multiple_of),
  // RMSNorm eps, rotary base, and whether the head reads the token embedding.
  int n_kv_head = 0, ffn_hidden = 0, multiple_of = 256;
  double norm_eps = 1e-5, rope_theta = 10000.0;
  bool tie_embeddings = false;
  double init_std = 0.02;
  std::string init_from;  // "" or a safetensors file with Hugging Face names (GPT-2 or Llama) to start from
};

struct ParallelConfig {
  int dp = 0, tp = 1, pp = 1;  // dp 0 = world / (tp * pp * cp)
  // Context parallelism (docs/context_parallel.md): each sequence split over cp ranks in 2 cp zigzag chunks, keys
  // and values passed around a ring. The mesh's fourth axis; the gradients are averaged over dp x cp.
  int cp = 1;
  bool sequence_parallel = false;  // Megatron sequence parallelism over the tp ranks (tp > 1 only)
  std::string order = "tp-dp-pp";
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  int virtual_stages = 1;
  // Transformer blocks of each virtual stage s = c*pp + r (chunk c on pipeline rank r); empty = an even split.
  // An uneven split balances stages whose extra work (embedding, head + loss) is not in the blocks.
  std::vector<int> stage_layers;
  // ZeRO-3: gather a block's parameters again for each pass (true), or keep every unit gathered from the step's
  // first pass to its end (false: ZeRO-2's gather traffic, a whole chunk's compute copy during the step); auto:
  // true without pipeline parallelism, false with it (each micro-batch's passes would gather every unit again).
  Reshard reshard_after_forward = Reshard::Auto;
};

struct TrainConfig {
  int global_batch = 8, micro_batch = 8, steps = 100;
  uint64_t seed = 1234;
  double grad_clip = 1.0;  // 0 = off
  int eval_every = 0, eval_batches = 4;
  int threads = 0;  // compute threads per rank; 0 = OMP_NUM_THREADS if set, else cores / ranks on the node
  bool pin_threads = true;  // each rank's threads on cores of its own when its compute threads fill the node
  kernels::cpu::CpuMatmul cpu_matmul = kernels::cpu::CpuMatmul::Auto;  // the CPU's fp32/bf16 matmul library
  bool skip_nonfinite = false;  // skip a step whose loss or gradient norm is inf/NaN instead of stopping
  Recompute recompute = Recompute::None;  // activation recomputation (model/recompute.h, docs/recompute.md)
  StragglerSettings straggler;  // emulated slow ranks (train/straggler.h)
};

struct OptimConfig {
  double lr = 1e-3, min_lr = 1e-4;
  int warmup_steps = 10;
  LRDecay schedule = LRDecay::Cosine;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  int zero = 0;
  // ZeRO-2 under gradient accumulation: reduce-scatter after every micro-batch's backward pass (no whole gradient
  // buffer; m times the traffic) or once on the last (a whole gradient buffer to accumulate into: ZeRO-1's memory).
  ZeroReduce zero_reduce = ZeroReduce::MicroBatch;
  // ZeRO-2 and -3's units: whole blocks, or each block's attention, MLP input and MLP output projections apart
  // (a third of a block each: the two ring slots hold two thirds of a block instead of two blocks).
  ZeroUnit zero_unit = ZeroUnit::Block;
  OptimizerKind name = OptimizerKind::AdamW;  // or SGD with momentum (weight decay decoupled as in AdamW)
  double momentum = 0.9;       // sgd only
  // Local SGD (docs/local_sgd.md): 0 = synchronous data parallelism (gradients averaged every step); H >= 1 = each
  // dp replica steps on its own gradients, and every H steps the replicas' parameters are averaged and the outer
  // optimizer applies the averaged change (DiLoCo when outer = nesterov).
  int sync_every = 0;
  OuterOptimizer outer = OuterOptimizer::None;  // None: plain averaging; Nesterov: SGD with Nesterov momentum
  double outer_lr = 0.7, outer_momentum = 0.9;
  // Stale-synchronous data parallelism (docs/staleness.md): 0 = synchronous; S >= 1 = each step's gradient average
  // runs in the background and no replica runs more than S steps ahead of the slowest.
  int staleness = 0;
  StalenessPolicy staleness_policy = StalenessPolicy::Newest;
};

struct PrecisionConfig {
  DType compute = DType::F32;      // F32 | BF16 | F16
  DType grad_reduce = DType::F32;  // F32 | BF16
  std::string loss_scale = "dynamic";  // dynamic | a positive number
};

struct DataConfig {
  DataSource source = DataSource::Synthetic;
  std::string path, val_path;
  DataOrder order = DataOrder::Sequential;
  int64_t synthetic_tokens = 1 << 20;  // length of the generated synthetic stream
  double val_fraction = 0.1;  // held-out tail used for validation when val_path is empty
};

struct EmulateConfig {
  double latency_us = 0, bandwidth_gbps = 0;
  int ranks_per_node = 0;
  double inter_latency_us = 0, inter_bandwidth_gbps = 0;
  std::string schedule;  // the link from given steps on (train/link_schedule.h); "" = as above throughout
};

struct CommConfig {
  CommBackend backend = CommBackend::Auto;
  double bucket_mb = 25;
  bool overlap = true;
  // Compression of the data-parallel gradient reduction (docs/compression.md); error feedback for int8, topk and
  // powersgd.
  CompressMethod compress = CompressMethod::None;
  double topk_fraction = 0.01;    // topk: fraction of each bucket's elements sent
  int powersgd_rank = 4;          // powersgd: rank of the low-rank approximation of each matrix
  // Data-parallel all-reduce as reduce-scatter inside each (emulated) node, all-reduce across nodes, all-gather
  // inside (docs/comm.md).
  bool hierarchical = false;
  CommWait wait = CommWait::Auto;  // how communication threads wait for peers (docs/comm.md)
  // Real-time priority for the communication threads that never spin (comm/realtime_threads.h).
  CommThreadPriority thread_priority = CommThreadPriority::Auto;
  double timeout_s = 300;
  EmulateConfig emulate;
  // comm.adapt (docs/adaptive.md): a controller picks the bucket size within [adapt_bucket_mb_min, _max] and, among
  // the methods listed in adapt_compress ("" = comm.compress only), the compression, every adapt_every steps; under
  // local SGD it picks the period (optim.sync_every) within [adapt_sync_every_min, _max] at every average instead.
  bool adapt = false;
  double adapt_bucket_mb_min = 0.25, adapt_bucket_mb_max = 64;
  std::string adapt_compress;  // comma-separated method names (parse_compress_list)
  int adapt_every = 4;
  int adapt_sync_every_min = 1, adapt_sync_every_max = 16;
};

struct RunConfig {
  std::string dir;  // "" = runs/<config file stem>
  int log_every = 1, checkpoint_every = 0, keep_checkpoints = 3;
  // Compare the weight copies that training keeps equal by hash every this many steps (copies_check.h); 0 = only at
  // the end.
  int check_copies_every = 0;
  std::string resume = "auto";  // auto | none | PATH
  // Signals that stop the run at the next step boundary with a checkpoint (stop_signal.h), comma-separated; "" =
  // none (the signals then end the run at once, as without a handler).
  std::string stop_signals = "TERM,USR1";
  bool profile = false;
  // The flight recorder (docs/flight_recorder.md): each communicator's last flight_recorder_ops operations, dumped
  // to dir/flight/rank_N.json on a watchdog timeout, a fatal error or SIGUSR2.
  bool flight_recorder = true;
  int flight_recorder_ops = 2000;
  std::string dump_grads;  // "" or a safetensors path: write the first step's gradients there (parity tests)
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  OptimConfig optim;
  PrecisionConfig precision;
  DataConfig data;
  CommConfig comm;
  RunConfig run;
  Device device = Device::CPU;

  std::string source_path;  // the config file it was read from ("" when built in code)
};

// Reads `path` (YAML), applies `overrides` ("dotted.key=value", in order, the last one winning), sets run.dir to
// runs/<stem of path> when it is empty, and runs validate_values (the checks that need no rank count; call
// validate(cfg, world) once the number of ranks is known).
// Throws InputError naming the file or key, the bad value and, for unknown keys, the nearest known key.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);

// Applies one "dotted.key=value" override to cfg (throws InputError as above). Does not validate.
void apply_override(Config& cfg, const std::string& assignment);

// Checks values and their combinations for a run on `world_size` ranks (throws InputError).
void validate(const Config& cfg, int world_size);

// The resolved config as YAML (written to run.dir/config.yaml; loading it back gives the same Config).
std::string to_yaml(const Config& cfg);

// The `--help` text: every key with its default and meaning.
std::string help_text();

// Data-parallel size on `world` ranks: parallel.dp, or world / (tp*pp) when dp is 0 (throws InputError when that
// does not divide exactly, or tp/pp < 1).
int resolved_dp(const Config& cfg, int world);

// Transformer blocks of each virtual pipeline stage s = 0 .. pp*virtual_stages-1, where virtual stage s is model
// chunk c = s / pp on pipeline rank r = s % pp (s = c*pp + r). Blocks are assigned contiguously in virtual-stage
// order, so stage s holds blocks [sum of the entries before s, that + entry s). The entries are
// parallel.stage_layers when given, else n_layer / (pp*virtual_stages) each. Throws InputError when the split is
// not valid (the same checks and messages as validate_values), so a caller never builds a wrong model.
std::vector<int> layers_per_stage(const Config& cfg);

// The checks of validate() that do not depend on the number of ranks (load_config runs these).
void validate_values(const Config& cfg);

// Every dotted key, in the order of to_yaml and --help; and one key's value as to_yaml writes it (unquoted).
std::vector<std::string> config_keys();
// Other trainers' names for keys (learning_rate, batch_size, num_layers, ...) and the key each means: an unknown
// key's "did you mean" suggests that key first.
const std::map<std::string, std::string>& config_key_synonyms();
std::string config_value(const Config& cfg, const std::string& key);
// The learning-rate schedule the config trains under (optim.schedule, lr, min_lr, warmup_steps over train.steps).
LRSchedule lr_schedule(const Config& cfg);
// The names an enum-valued key accepts, in the order --help and errors list them; empty for any other key.
std::vector<std::string> config_choices(const std::string& key);

}  // namespace mt
