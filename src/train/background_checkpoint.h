// run.checkpoint_async: checkpoints written while the training goes on. At the checkpoint's step this rank's state
// is copied into a staging buffer (kept from one checkpoint to the next: the next update would change the state
// under a write that read it in place), and a thread writes the rank file from there. The checkpoint is completed
// (the ranks' sizes and checksums, meta.json, COMPLETE, pruning: collective, on the training thread) at the first
// step boundary where every rank's file is in place, or when the run needs it: before the next checkpoint, at a
// stop, at a failed step and at the end. Until then its directory has no COMPLETE marker and a resume skips it, as
// it skips a synchronous write that a crash interrupted.
#pragma once
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "train/checkpoint.h"

namespace mt {

class BackgroundCheckpoint {
 public:
  // slow_step (MESHTRAIN_INJECT=slow-checkpoint@STEP, test_hooks.h): that step's file waits for two polls first.
  BackgroundCheckpoint(const Config& cfg, Communicator& world, int rank, int world_size, int slow_step);
  ~BackgroundCheckpoint();  // waits for a file in flight; its checkpoint stays incomplete
  BackgroundCheckpoint(const BackgroundCheckpoint&) = delete;
  BackgroundCheckpoint& operator=(const BackgroundCheckpoint&) = delete;

  // Collective: completes the checkpoint in flight (waiting for its file), then stages `shard` and starts the file
  // of checkpoint `st.step` under root.
  void start(const std::string& root, const TrainState& st, const CheckpointShard& shard);
  // Collective while a checkpoint is in flight (every rank calls it after the same steps; `step`: the step just
  // trained): completes the checkpoint when every rank's file is written.
  void poll(int step);
  // Collective: waits for the file in flight, if any, and completes its checkpoint.
  void finish(int step);
  bool in_flight() const { return thread_.joinable(); }

 private:
  void complete(int step, double waited_ms);

  const Config& cfg_;
  Communicator& world_;
  int rank_, world_size_, slow_step_;
  std::vector<float> staging_;  // this rank's checkpoint state, copied at its step
  ParamTable table_;            // the shard's, for the thread
  CheckpointShard shard_;       // views into staging_
  std::string root_, dir_;
  TrainState st_;
  std::thread thread_;
  std::atomic<bool> written_{false};
  RankFileWritten result_;
  double file_ms_ = 0;
  std::atomic<int> polls_{0};
  std::atomic<bool> release_{false};  // finish() lets a slow-checkpoint file go on
};

}  // namespace mt
