// The shared-memory transport (shm_communicator.h).
//
// The window's layout: shm_window.h; sends and receives: shm_messages.{h,cpp}.
//
// Collectives: every rank runs the same rounds in the same order (their number depends only on the sizes), and a
// barrier numbers them (ranks publish how many they have passed). A round of all_reduce:
//   copy in     each rank copies its input into its current half, cut in p pieces (piece q: part of shard q);
//   barrier     (the first one of an operation is the arrival handshake: the op's start for the emulation)
//   reduce      rank q reduces piece q of every rank's half (Reducer, below) into its own piece q;
//   barrier
//   copy out    each rank copies piece q of rank q's half into its output, for every q.
// reduce_scatter stops after the reduce (into its output), all_gather and broadcast need one barrier per round.
// Why no trailing barrier: a round writes into half r % 2, and a rank reaches round r + 2 only after every rank
// has passed a barrier of round r + 1, which each one entered after finishing its reads of round r.
#include "comm/shm_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "comm/comm_util.h"
#include "comm/futex.h"
#include "comm/make_communicator.h"
#include "comm/mpi_init.h"
#include "comm/queued_communicator.h"
#include "comm/shm_messages.h"
#include "comm/shm_window.h"
#include "core/check.h"
#include "core/dtype.h"

namespace mt {
namespace {

// Reduces p ranks' pieces. The order of the additions is a pairwise tree over ranks, split at the largest power of
// two below the count ((r0 + r1) + (r2 + r3), ((r0 + r1) + (r2 + r3)) + (r4 + r5), ...): the order of MPICH's
// recursive doubling, so that a hierarchical all-reduce (pairs inside nodes, then across) and the flat one agree
// bit for bit, and more accurate than a running sum. 16-bit values are added in fp32 and rounded after every
// addition (as MPI's and NCCL's 16-bit sums are).
class Reducer {
 public:
  // Kept by the communicator across operations, so its buffers are allocated once.
  void set(DType dtype, ReduceOp op) {
    dtype_ = dtype;
    max_ = op == ReduceOp::Max;
  }

  // out[i] = the reduction of src[0][i] .. src[p-1][i]; out may be one of the sources.
  void reduce(const std::vector<const char*>& src, void* out, int64_t n) {
    if (n <= 0) return;
    result_.resize(static_cast<size_t>(n));
    tree(src, 0, static_cast<int>(src.size()), result_.data(), n, 0);
    for (int64_t i = 0; i < n; ++i) store(out, i, result_[i]);
  }

 private:
  float load(const void* p, int64_t i) const {
    switch (dtype_) {
      case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
      case DType::F16: return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
      default: return static_cast<const float*>(p)[i];
    }
  }
  void store(void* p, int64_t i, float x) const {
    switch (dtype_) {
      case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(x); break;
      case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_fp16(x); break;
      default: static_cast<float*>(p)[i] = x; break;
    }
  }
  float round(float x) const {
    switch (dtype_) {
      case DType::BF16: return bf16_to_float(float_to_bf16(x));
      case DType::F16: return fp16_to_float(float_to_fp16(x));
      default: return x;
    }
  }

  // out = the reduction of ranks [lo, hi).
  void tree(const std::vector<const char*>& src, int lo, int hi, float* out, int64_t n, size_t depth) {
    if (hi - lo == 1) {
      if (dtype_ == DType::F32)
        std::memcpy(out, src[lo], static_cast<size_t>(n) * 4);
      else
        for (int64_t i = 0; i < n; ++i) out[i] = load(src[lo], i);
      return;
    }
    int span = 1;
    while (span * 2 < hi - lo) span *= 2;
    tree(src, lo, lo + span, out, n, depth + 1);
    if (scratch_.size() <= depth) scratch_.resize(depth + 1);
    std::vector<float>& right = scratch_[depth];
    right.resize(static_cast<size_t>(n));
    tree(src, lo + span, hi, right.data(), n, depth + 1);
    const float* r = right.data();
    if (max_)
      for (int64_t i = 0; i < n; ++i) out[i] = r[i] > out[i] ? r[i] : out[i];
    else if (dtype_ == DType::F32)
      for (int64_t i = 0; i < n; ++i) out[i] += r[i];
    else
      for (int64_t i = 0; i < n; ++i) out[i] = round(out[i] + r[i]);
  }

  DType dtype_ = DType::F32;
  bool max_ = false;
  std::vector<float> result_;
  std::vector<std::vector<float>> scratch_;  // one per tree level
};

void* align_64(void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<void*>((a + 63) / 64 * 64);
}

class ShmCommunicator : public QueuedCommunicator {
 public:
  ShmCommunicator(MPI_Comm comm, const std::string& name, const CommOptions& opts, const ShmSizes& sizes, int rank,
                  int size)
      : QueuedCommunicator(name, rank, size, opts, INT64_MAX) {
    CHECK(sizes.half_bytes >= 64 * size && sizes.slot_bytes >= 64 && sizes.slots >= 1,
          "shared-memory sizes: half {} bytes for {} ranks, slots {} x {} bytes", sizes.half_bytes, size,
          sizes.slots, sizes.slot_bytes);
    comm_dup_yielding(comm, &comm_);
    window_.half_bytes = ShmWindow::round_up(sizes.half_bytes, 64);
    window_.slot_bytes = sizes.slot_bytes;
    window_.slot_stride = ShmWindow::round_up(static_cast<int64_t>(sizeof(ShmSlot)) + sizes.slot_bytes, 64);
    window_.slots = sizes.slots;
    // MPI does not promise more than malloc's alignment (MPICH's single-rank window is malloc'ed: 16 bytes), and
    // the layout's structs are 64-byte aligned: each segment gets 64 bytes of slack and starts at the first
    // multiple of 64 in it. A shared mapping sits at the same offset within a page in every process, so every
    // rank finds the same start in a peer's segment.
    const int64_t segment = window_.segment_bytes(size) + 64;
    MPI_Info info;
    MPI_CHECK(MPI_Info_create(&info));
    MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true"));  // each segment page-aligned, near its owner
    void* mine = nullptr;
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));  // a clear message instead of MPI's abort
    const int rc = MPI_Win_allocate_shared(segment, 1, info, comm_, &mine, &win_);
    CHECK(rc == MPI_SUCCESS, "communicator '{}': the shared-memory transport could not allocate {:.1f} MiB of shared "
          "memory per rank (MPI error {}); is /dev/shm large enough (containers: --shm-size)? comm.backend=mpi "
          "avoids it", name, segment / 1048576.0, rc);
    MPI_CHECK(MPI_Info_free(&info));
    mine = align_64(mine);
    std::memset(mine, 0, static_cast<size_t>(segment - 64));
    new (mine) ShmControl();
    window_.segment.resize(size);
    for (int q = 0; q < size; ++q) {
      MPI_Aint bytes = 0;
      int disp = 0;
      void* base = nullptr;
      MPI_CHECK(MPI_Win_shared_query(win_, q, &bytes, &disp, &base));
      window_.segment[q] = static_cast<char*>(align_64(base));
    }
    barrier_yielding(comm_);  // every segment is initialised before any thread looks at it
    messages_ = std::make_unique<ShmMessages>(window_, rank, size, name,
                                              [this](Op& op, double start_us) { finish(op, start_us); });
    start(&window_.control(rank).bell, opts.realtime_threads);
  }

  ~ShmCommunicator() override {
    stop();
    if (!finalized_before_free("communicator " + name())) {
      MPI_Win_free(&win_);
      MPI_Comm_free(&comm_);
    }
  }

 private:
  void on_issue(Op& op) override {
    CHECK(op.a.device() == Device::CPU && op.b.device() == Device::CPU,
          "{} on '{}': the shared-memory transport takes host tensors (device tensors: comm.backend=mpi or nccl)",
          comm_kind_name(op.kind), name());
  }

  // Sleeps until done() holds, progressing sends and receives meanwhile (a peer may wait for them first).
  void wait_until(const std::function<bool()>& done) {
    for (;;) {
      const uint32_t seen = bell()->load(std::memory_order_acquire);
      if (done()) return;
      if (progress_p2p()) continue;
      sleep_on_bell(seen, -1);
    }
  }

  // Every rank enters barrier k (its k-th) and leaves once all have entered it.
  void barrier() {
    const uint64_t k = ++barriers_;
    window_.control(rank()).passed.store(k, std::memory_order_release);
    for (int q = 0; q < size(); ++q)
      if (q != rank()) ring(&window_.control(q).bell);
    wait_until([&] {
      for (int q = 0; q < size(); ++q)
        if (window_.control(q).passed.load(std::memory_order_acquire) < k) return false;
      return true;
    });
  }

  // Ranks calling different collectives at the same point: on every rank that sees it, the message and the flight
  // recorder's dumps (every rank's), then the job ends.
  [[noreturn]] void desync(const ShmCollective& mine, const ShmCollective& theirs, int q) {
    auto what = [](const ShmCollective& c) {
      const CommKind k = static_cast<CommKind>(c.kind);
      const bool reduces = k == CommKind::AllReduce || k == CommKind::ReduceScatter;
      static const char* const kReduce[] = {"sum", "avg", "max"};  // ReduceOp's order
      return fmt::format("{} of {} {}{}{}", comm_kind_name(k), c.count, dtype_name(static_cast<DType>(c.dtype)),
                         reduces && c.reduce >= 0 && c.reduce < 3 ? fmt::format(" ({})", kReduce[c.reduce]) : "",
                         k == CommKind::Broadcast ? fmt::format(" from group rank {}", c.root) : "");
    };
    const std::string line =
        fmt::format("desync on communicator '{}': its operation #{} is {} here and {} on group rank {} (#{} there)",
                    name(), mine.seq, what(mine), what(theirs), q, theirs.seq);
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    abort_job_with_dumps(world_rank, line);
  }

  // ---- collectives
  void run_collective(Op& op) override {
    double start = trace_clock_us();
    bool started = false;
    // The collective's first barrier: every rank has arrived, and all must be calling the same collective.
    ShmCollective mine;
    mine.kind = static_cast<int32_t>(op.kind);
    mine.dtype = static_cast<int32_t>(op.a.dtype());
    const bool reduces = op.kind == CommKind::AllReduce || op.kind == CommKind::ReduceScatter;
    mine.reduce = reduces ? static_cast<int32_t>(op.rop) : 0;
    mine.root = op.kind == CommKind::Broadcast ? op.peer : 0;
    mine.count = op.kind == CommKind::AllGather ? op.b.numel() : op.a.numel();
    mine.seq = op.seq;
    window_.control(rank()).collective[(barriers_ + 1) % 2] = mine;
    const auto sync = [&] {
      barrier();
      if (started) return;
      start = trace_clock_us(), started = true;
      for (int q = 0; q < size(); ++q)
        if (!(window_.control(q).collective[barriers_ % 2] == mine))
          desync(mine, window_.control(q).collective[barriers_ % 2], q);
    };
    switch (op.kind) {
      case CommKind::AllReduce: reduce_rounds(op.a, op.a, op.rop, true, sync); break;
      case CommKind::ReduceScatter: reduce_rounds(op.a, op.b, op.rop, false, sync); break;
      case CommKind::AllGather: all_gather(op.a, op.b, sync); break;
      case CommKind::Broadcast: broadcast(op.a, op.peer, sync); break;
      case CommKind::Barrier: sync(); break;
      default: CHECK(false, "send/recv are not collectives");
    }
    if (op.rop == ReduceOp::Avg && size() > 1 && op.kind == CommKind::AllReduce) divide_by_group_size(op.a, size());
    if (op.rop == ReduceOp::Avg && size() > 1 && op.kind == CommKind::ReduceScatter) divide_by_group_size(op.b, size());
    finish(op, start);
  }

  // all_reduce (out = in, every shard copied back) or reduce_scatter (out = this rank's shard).
  void reduce_rounds(const Tensor& in, const Tensor& out, ReduceOp rop, bool all, const std::function<void()>& sync) {
    const int p = size(), me = rank();
    const int64_t n = in.numel(), es = static_cast<int64_t>(dtype_size(in.dtype()));
    if (n == 0) return;
    const int64_t piece = window_.half_bytes / (p * es);  // elements of one shard per round
    const int64_t rounds = (shard_range(n, p, 0).size() + piece - 1) / piece;
    reducer_.set(in.dtype(), rop);
    char* src = static_cast<char*>(in.data());
    char* dst = static_cast<char*>(out.data());
    std::vector<const char*> parts(p);
    for (int64_t j = 0; j < rounds; ++j, ++round_) {
      const int64_t off = j * piece;
      const auto len = [&](int q) { return std::clamp<int64_t>(shard_range(n, p, q).size() - off, 0, piece); };
      char* mine = window_.half(me, round_);
      for (int q = 0; q < p; ++q)
        std::memcpy(mine + q * piece * es, src + (shard_range(n, p, q).begin + off) * es, len(q) * es);
      sync();
      for (int q = 0; q < p; ++q) parts[q] = window_.half(q, round_) + me * piece * es;
      if (all) {
        reducer_.reduce(parts, mine + me * piece * es, len(me));
        sync();
        for (int q = 0; q < p; ++q)
          std::memcpy(dst + (shard_range(n, p, q).begin + off) * es, window_.half(q, round_) + q * piece * es, len(q) * es);
      } else {
        reducer_.reduce(parts, dst + off * es, len(me));  // the output may alias this round's input: copied already
      }
    }
  }

  void all_gather(const Tensor& in, const Tensor& out, const std::function<void()>& sync) {
    const int p = size(), me = rank();
    const int64_t n = out.numel(), es = static_cast<int64_t>(dtype_size(out.dtype()));
    if (n == 0) return;
    const char* src = static_cast<const char*>(in.data());
    char* dst = static_cast<char*>(out.data());
    // An input inside the output but not at this rank's own shard would be overwritten by other shards.
    const ShardRange own = shard_range(n, p, me);
    const char* a0 = src;
    const char* b0 = dst;
    if (in.nbytes() > 0 && src != dst + own.begin * es && a0 < b0 + out.nbytes() && b0 < a0 + in.nbytes()) {
      copy_.assign(src, src + in.nbytes());
      src = copy_.data();
    }
    const int64_t piece = window_.half_bytes / es;
    const int64_t rounds = (shard_range(n, p, 0).size() + piece - 1) / piece;
    for (int64_t j = 0; j < rounds; ++j, ++round_) {
      const int64_t off = j * piece;
      const auto len = [&](int q) { return std::clamp<int64_t>(shard_range(n, p, q).size() - off, 0, piece); };
      std::memcpy(window_.half(me, round_), src + off * es, len(me) * es);
      sync();
      for (int q = 0; q < p; ++q)
        if (q != me || dst + (own.begin + off) * es != src + off * es)
          std::memcpy(dst + (shard_range(n, p, q).begin + off) * es, window_.half(q, round_), len(q) * es);
    }
  }

  void broadcast(const Tensor& t, int root, const std::function<void()>& sync) {
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    if (bytes == 0 || size() == 1) return;
    char* data = static_cast<char*>(t.data());
    for (int64_t off = 0; off < bytes; off += window_.half_bytes, ++round_) {
      const int64_t len = std::min(window_.half_bytes, bytes - off);
      if (rank() == root) std::memcpy(window_.half(root, round_), data + off, len);
      sync();
      if (rank() != root) std::memcpy(data + off, window_.half(root, round_), len);
    }
  }

  // ---- sends and receives
  double p2p_poll_us(int) const override { return -1; }  // every change rings the bell: never poll
  bool p2p_pending() const override { return messages_->pending(); }
  void post_p2p(Op& op) override { messages_->post(op); }
  bool progress_p2p() override { return messages_->progress(); }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  ShmWindow window_;

  // Communication thread only.
  uint64_t barriers_ = 0, round_ = 0;
  Reducer reducer_;
  std::vector<char> copy_;
  std::unique_ptr<ShmMessages> messages_;
};

}  // namespace

bool shares_memory(MPI_Comm comm) {
  // All of comm's ranks on one node: read from the world's node map when node_ranks() has run (the trainer calls
  // it at start), without a message; otherwise asked of MPI.
  if (const std::vector<int>* node_of = world_node_map()) {
    const std::vector<int> members = world_ranks(comm);
    for (int w : members)
      if ((*node_of)[static_cast<size_t>(w)] != (*node_of)[static_cast<size_t>(members.front())]) return false;
    return true;
  }
  int size = 0, rank = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int local = 0;
  MPI_CHECK(MPI_Comm_size(node, &local));
  MPI_CHECK(MPI_Comm_free(&node));
  int all = local == size ? 1 : 0, every = 0;
  MPI_CHECK(MPI_Allreduce(&all, &every, 1, MPI_INT, MPI_MIN, comm));
  return every == 1;
}

std::unique_ptr<Communicator> make_shm_transport(MPI_Comm comm, const std::string& name, const CommOptions& opts,
                                                 const ShmSizes& sizes) {
  int rank = 0, size = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  return std::make_unique<ShmCommunicator>(comm, name, opts, sizes, rank, size);
}

}  // namespace mt
