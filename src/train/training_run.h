// Building a run: everything one rank holds while it trains (the model chunks, data, the data-parallel strategy,
// optimizer, loss scaler, the state resumed from a checkpoint, the pipeline runner and the batchers), made once
// from the config on an established mesh, with the start-up log lines that describe it. The step loop
// (trainer.cpp) then runs train_step (train_step.h) on it step by step.
#pragma once
#include <mpi.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "comm/agree_on_setup.h"
#include "comm/communicator.h"
#include "core/errors.h"
#include "data/batcher.h"
#include "model/pipeline_chunks.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/mesh.h"
#include "train/config.h"
#include "train/dataset.h"
#include "train/data_parallel.h"
#include "train/metrics.h"
#include "train/pipeline_runner.h"
#include "train/profiler.h"
#include "train/straggler.h"
#include "train/test_hooks.h"

namespace mt {

struct TrainingRun {
  const Config& cfg;
  const DeviceMesh& mesh;
  MeshComms& comms;
  bool nccl;        // the mesh's device communicators are NCCL (host gathers need MPI ones of their own)
  CommOptions copts;  // of the host communicators

  // Shapes: tokens per sequence and this rank's of them (T / cp: its two zigzag chunks), sequences per
  // micro-batch and per step, this dp rank's share, micro-batches.
  int T, T_rank, mb, gb, local_batch, n_micro;
  int64_t tokens_per_step;
  GPTConfig gcfg;                 // the whole model's
  TensorSharding sharding;        // this rank's tp place (model/model_part.h)
  std::vector<int> stage_layers;  // blocks of each virtual pipeline stage
  DType compute;
  Device dev;
  bool mixed, fp16;
  int tied;  // the chunk whose tied embedding gradient is summed between first and last stage, or -1

  std::unique_ptr<PipelineChunks> model;
  Dataset data;
  std::unique_ptr<DataParallel> dp;  // how the replicas combine each step (data_parallel.h)
  std::unique_ptr<Optimizer> opt;
  RankStraggler straggler;  // this rank's part of train.straggler
  LossScaler scaler{LossScalerSettings{false, 1.0}};
  TestHooks hooks;
  LRSchedule sched;
  std::unique_ptr<PipelineRunner> runner;
  Tensor loss_sum;  // this rank's summed token losses of the step (the last stage's), on the model's device
  std::unique_ptr<Batcher> train_batches, val_batches;

  std::string ckpt_root;  // run.dir/checkpoints
  int start_step = 1;     // after a resume, the checkpoint's step + 1
  int64_t nonfinite_skipped = 0;  // steps skipped under train.skip_nonfinite

  TrainingRun(const Config& c, const DeviceMesh& m, MeshComms& mc) : cfg(c), mesh(m), comms(mc) {}
};

// Builds the run: model (initialised or loaded), data, reducers, optimizer, local SGD, scaler, then the newest
// checkpoint's state when run.resume finds one. Set-up that may fail on some ranks only (files) is agreed on
// before the first collective, so bad input stops every rank with SetupError.
std::unique_ptr<TrainingRun> build_training_run(const Config& cfg, const DeviceMesh& mesh, MeshComms& comms,
                                                bool nccl, const CommOptions& copts, Profiler& prof);

// Writes checkpoint `step` of the run (collective over the world).
void checkpoint_run(TrainingRun& run, int step);

// The whole model in one safetensors file from a flat fp32 buffer (parameters or gradients) of every rank.
void export_run_safetensors(TrainingRun& run, const std::string& path, const Tensor& flat);

// The fp32 weights as the export writes them, laid out like the rank's parameters: the model's own (fp32), the
// optimizer's masters (16-bit compute), completed from every replica's shards under ZeRO. Collective over the replica
// group under ZeRO; waits for the parameters' gathers in flight first. Without ZeRO it is the rank's own buffer, not a
// copy: read it before the next step changes it.
Tensor export_weights(TrainingRun& run);

// The end of a run: the fp32 weights exported to run.dir/model.safetensors (and config.json), the memory report.
// training_peak: the peak tensor bytes of the training, measured before the export gathers whole tensors.
void finish_run(TrainingRun& run, size_t training_peak);

}  // namespace mt
