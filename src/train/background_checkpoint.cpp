// Checkpoints written by a thread while the training goes on (see background_checkpoint.h).
#include "train/background_checkpoint.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>

namespace mt {

namespace {
double now_ms() { return trace_clock_us() / 1000.0; }

// Copies [src, src + n) to dst on the OpenMP threads, in pieces of 1 MiB.
struct Copy {
  const float* src;
  float* dst;
  int64_t n;
};
void copy_all(const std::vector<Copy>& copies) {
  constexpr int64_t kPiece = 1 << 18;
  std::vector<Copy> pieces;
  for (const Copy& c : copies)
    for (int64_t i = 0; i < c.n; i += kPiece) pieces.push_back({c.src + i, c.dst + i, std::min(kPiece, c.n - i)});
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < int64_t(pieces.size()); ++i)
    std::memcpy(pieces[i].dst, pieces[i].src, size_t(pieces[i].n) * sizeof(float));
}
}  // namespace

BackgroundCheckpoint::BackgroundCheckpoint(const Config& cfg, Communicator& world, int rank, int world_size,
                                           int slow_step)
    : cfg_(cfg), world_(world), rank_(rank), world_size_(world_size), slow_step_(slow_step) {}

BackgroundCheckpoint::~BackgroundCheckpoint() {
  release_ = true;
  if (thread_.joinable()) thread_.join();
}

void BackgroundCheckpoint::start(const std::string& root, const TrainState& st, const CheckpointShard& shard) {
  finish(int(st.step));
  const double t0 = now_ms();
  // The shard's views, repointed into the staging buffer, which holds every field and tensor in turn.
  int64_t total = 0;
  for (const CheckpointPiece& p : shard.pieces) total += p.numel * int64_t(p.fields.size());
  for (const CheckpointTensor& t : shard.tensors) total += t.numel;
  const bool first = staging_.empty() && total > 0;
  if (int64_t(staging_.size()) < total) staging_.assign(size_t(total), 0.f);
  table_ = *shard.table;
  shard_ = CheckpointShard();
  shard_.table = &table_;
  shard_.metadata = shard.metadata;
  shard_.rank = shard.rank;
  shard_.world = shard.world;
  std::vector<Copy> copies;
  int64_t at = 0;
  for (const CheckpointPiece& p : shard.pieces) {
    CheckpointPiece& q = shard_.pieces.emplace_back(CheckpointPiece{p.offset, p.numel, {}});
    for (const CheckpointField& f : p.fields) {
      copies.push_back({f.data, staging_.data() + at, p.numel});
      q.fields.push_back({f.kind, staging_.data() + at});
      at += p.numel;
    }
  }
  for (const CheckpointTensor& t : shard.tensors) {
    copies.push_back({t.data, staging_.data() + at, t.numel});
    shard_.tensors.push_back({t.name, staging_.data() + at, t.numel});
    at += t.numel;
  }
  copy_all(copies);
  const double staged_ms = now_ms() - t0;

  root_ = root;
  st_ = st;
  dir_ = begin_checkpoint(root, st.step, rank_, world_size_, world_);
  written_ = false;
  polls_ = 0;
  release_ = false;
  const bool slow = st.step == slow_step_;
  if (slow) spdlog::warn("MESHTRAIN_INJECT: the file of checkpoint {} waits for two polls", st.step);
  thread_ = std::thread([this, slow] {
    while (slow && polls_ < 2 && !release_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const double t1 = now_ms();
    result_ = write_rank_file(dir_, shard_);
    file_ms_ = now_ms() - t1;
    written_ = true;
  });
  spdlog::info("checkpoint: step {} staged in {:.0f} ms ({:.1f} MiB{}), its files written in the background "
               "(run.checkpoint_async)", st.step, staged_ms, double(total) * sizeof(float) / 1048576.0,
               first ? ", a buffer kept in memory for every later checkpoint" : "");
}

void BackgroundCheckpoint::poll(int step) {
  if (!in_flight()) return;
  ++polls_;
  // The ranks whose file is still being written.
  Tensor writing = Tensor::zeros({1}, DType::F32);
  static_cast<float*>(writing.data())[0] = written_ ? 0.f : 1.f;
  world_.all_reduce(writing, ReduceOp::Sum);
  if (static_cast<const float*>(writing.data())[0] == 0.f) complete(step, 0);
}

void BackgroundCheckpoint::finish(int step) {
  if (!in_flight()) return;
  const double t0 = now_ms();
  release_ = true;
  thread_.join();
  complete(step, now_ms() - t0);
}

void BackgroundCheckpoint::complete(int step, double waited_ms) {
  if (thread_.joinable()) thread_.join();  // written: the thread has nothing left to do
  finish_checkpoint(root_, dir_, cfg_, st_, result_, rank_, world_size_, world_, cfg_.run.keep_checkpoints);
  spdlog::info("checkpoint: step {} written to {} in the background (its file in {:.0f} ms), complete after step "
               "{}{}", st_.step, dir_, file_ms_, step,
               waited_ms >= 1 ? fmt::format("; the training waited {:.0f} ms for it", waited_ms) : "");
}

}  // namespace mt
