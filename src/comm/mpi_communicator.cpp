// MPI backend: one communication thread per communicator runs the operations in issue order.
//
// Collectives run as blocking MPI calls on that thread (they reach raw MPI throughput; see docs/comm.md for the
// CPU cost of MPICH's polling). Sends and receives are posted nonblocking, in issue order (MPI's non-overtaking
// rule keeps their matching in order), and completed later, so that two ranks sending to each other before
// receiving never deadlock on a serialised queue. With network emulation each operation is held back until its
// start plus the alpha-beta prediction; the thread sleeps meanwhile, so callers' compute overlaps the delay.
// Device (Device::CUDA) tensors, in CUDA builds, go through pinned host buffers (comm/cuda/device_staging.h):
// the thread copies them to the host after the compute stream's work issued before the operation, runs the same
// host algorithm, and copies the result back before the handle completes (docs/comm.md, "Device tensors").
#include "comm/mpi_communicator.h"

#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/comm_util.h"
#include "comm/cuda/device_staging.h"  // an interface only; created in CUDA builds
#include "core/check.h"
#include "core/dtype.h"

namespace mt {
namespace {

// ---- 16-bit types on the wire: a contiguous 2-byte datatype and user reductions that add in fp32 and round
// to nearest even, so half the bytes of fp32 travel.
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FromF(ToF(a[i]) + ToF(b[i]));
}
template <float (*ToF)(uint16_t)>
void max16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    if (ToF(a[i]) > ToF(b[i])) b[i] = a[i];
}

struct MpiTypes {
  MPI_Datatype t16 = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL, bf16_max = MPI_OP_NULL, fp16_sum = MPI_OP_NULL, fp16_max = MPI_OP_NULL;
};
MpiTypes g_types;
// Frees the 16-bit datatype and operations at the start of MPI_Finalize (an attribute of MPI_COMM_SELF).
int free_types(MPI_Comm, int, void*, void*) {
  MPI_Type_free(&g_types.t16);
  MPI_Op_free(&g_types.bf16_sum);
  MPI_Op_free(&g_types.bf16_max);
  MPI_Op_free(&g_types.fp16_sum);
  MPI_Op_free(&g_types.fp16_max);
  return MPI_SUCCESS;
}
const MpiTypes& mpi_types() {
  MpiTypes& t = g_types;
  static std::once_flag once;
  std::call_once(once, [] {
    MpiTypes& t = g_types;
    int key = MPI_KEYVAL_INVALID;
    MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_types, &key, nullptr));
    MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr));
    MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.t16));
    MPI_CHECK(MPI_Type_commit(&t.t16));
    MPI_CHECK(MPI_Op_create(&sum16<bf16_to_float, float_to_bf16>, 1, &t.bf16_sum));
    MPI_CHECK(MPI_Op_create(&max16<bf16_to_float>, 1, &t.bf16_max));
    MPI_CHECK(MPI_Op_create(&sum16<fp16_to_float, float_to_fp16>, 1, &t.fp16_sum));
    MPI_CHECK(MPI_Op_create(&max16<fp16_to_float>, 1, &t.fp16_max));
  });
  return t;
}

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT;
    case DType::BF16:
    case DType::F16: return mpi_types().t16;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(DType d, ReduceOp op) {
  const bool max = op == ReduceOp::Max;
  switch (d) {
    case DType::F32: return max ? MPI_MAX : MPI_SUM;
    case DType::BF16: return max ? mpi_types().bf16_max : mpi_types().bf16_sum;
    case DType::F16: return max ? mpi_types().fp16_max : mpi_types().fp16_sum;
    default: break;
  }
  CHECK(false, "reductions take fp32, bf16 or fp16 tensors, got {}", dtype_name(d));
  return MPI_OP_NULL;
}

int to_int(int64_t n, const char* what) {
  CHECK(n >= 0 && n <= INT_MAX, "{}: {} elements exceed one MPI call's int count", what, n);
  return static_cast<int>(n);
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* a0 = static_cast<const char*>(a.data());
  const char* b0 = static_cast<const char*>(b.data());
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// State a handle shares with its communicator (a handle may outlive the communicator).
struct Shared {
  std::string name;
  double timeout_s = 0;
  int world_rank = 0;
  std::atomic<int64_t> wait_ns{0};
};

class MpiWork : public Work {
 public:
  MpiWork(std::shared_ptr<Shared> s, CommKind kind, uint64_t seq) : s_(std::move(s)), kind_(kind), seq_(seq) {}

  void wait() override {
    if (done_.load(std::memory_order_acquire)) return;
    const auto t0 = std::chrono::steady_clock::now();
    {
      std::unique_lock<std::mutex> lk(m_);
      auto ready = [&] { return done_.load(std::memory_order_acquire); };
      if (s_->timeout_s > 0) {
        if (!cv_.wait_for(lk, std::chrono::duration<double>(s_->timeout_s), ready)) watchdog(t0);
      } else {
        cv_.wait(lk, ready);
      }
    }
    s_->wait_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count(),
                          std::memory_order_relaxed);
  }
  bool done() const override { return done_.load(std::memory_order_acquire); }

  void complete() {
    {
      std::lock_guard<std::mutex> lk(m_);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

 private:
  [[noreturn]] void watchdog(std::chrono::steady_clock::time_point t0) {
    watchdog_abort(s_->world_rank, kind_, seq_, s_->name,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), s_->timeout_s);
  }

  std::shared_ptr<Shared> s_;
  CommKind kind_;
  uint64_t seq_;
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
};

struct Op {
  CommKind kind = CommKind::Barrier;
  Tensor a, b;  // all_reduce/broadcast/send/recv: a; reduce_scatter/all_gather: a = in, b = out
  ReduceOp rop = ReduceOp::Sum;
  int peer = 0;  // root of broadcast, peer of send/recv
  int tag = 0;
  uint64_t seq = 0;
  int64_t bytes = 0;        // CommEvent::bytes
  double predicted_us = 0;  // emulated minimum duration
  double issue_us = 0;
  std::shared_ptr<MpiWork> work;
  // Device operations: the caller's device tensors; from stage_in on, a and b are host views of host_block (a
  // pinned block of the communicator's DeviceStaging, given back when the operation finishes).
  bool on_device = false;
  Tensor dev_a, dev_b;
  DeviceStaging::Event inputs_ready = nullptr;  // recorded on the compute stream at issue
  void* host_block = nullptr;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, const CommOptions& opts) : opts_(opts) {
    mpi_types();
    int level = 0;
    MPI_CHECK(MPI_Query_thread(&level));
    CHECK(level >= MPI_THREAD_MULTIPLE,
          "communicator '{}': MPI was initialised at thread level {}, the MPI backend needs MPI_THREAD_MULTIPLE "
          "(initialise with mt::init_mpi)",
          name, level);
    MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    shared_ = std::make_shared<Shared>();
    shared_->name = std::move(name);
    shared_->timeout_s = opts.timeout_s;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &shared_->world_rank));

    // Emulated nodes: map this group's ranks to world ranks; node = world_rank / ranks_per_node.
    std::vector<int> mine(size_), world(size_);
    for (int i = 0; i < size_; ++i) mine[i] = i;
    MPI_Group g, gw;
    MPI_CHECK(MPI_Comm_group(comm_, &g));
    MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &gw));
    MPI_CHECK(MPI_Group_translate_ranks(g, size_, mine.data(), gw, world.data()));
    MPI_CHECK(MPI_Group_free(&g));
    MPI_CHECK(MPI_Group_free(&gw));
    node_.resize(size_);
    for (int i = 0; i < size_; ++i) node_[i] = opts.ranks_per_node > 0 ? world[i] / opts.ranks_per_node : 0;
    spans_nodes_ = std::any_of(node_.begin(), node_.end(), [&](int n) { return n != node_[0]; });

    const char* mode = std::getenv("MESHTRAIN_COMM_WAIT");
    blocking_ = mode ? std::string(mode) == "block" : opts.blocking_waits;
    thread_ = std::thread([this] {
      prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // short back-off sleeps must not be rounded up to 50 us
      run();
    });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lk(qm_);
      stop_ = true;
    }
    qcv_.notify_all();
    thread_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return shared_->name; }
  double total_wait_us() const override { return shared_->wait_ns.load(std::memory_order_relaxed) * 1e-3; }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce");
    mpi_op(t.dtype(), op);  // checks the dtype
    to_int(t.numel(), "all_reduce");
    Op o;
    o.kind = CommKind::AllReduce;
    o.a = t;
    o.rop = op;
    o.bytes = static_cast<int64_t>(t.nbytes());
    o.predicted_us = predict(o.kind, o.bytes);
    return enqueue(std::move(o));
  }

  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override {
    check_tensor(in, "reduce_scatter");
    check_tensor(out, "reduce_scatter");
    check_same_device(in, out, "reduce_scatter");
    mpi_op(in.dtype(), op);
    CHECK(in.dtype() == out.dtype(), "reduce_scatter: input {} and output {}", dtype_name(in.dtype()),
          dtype_name(out.dtype()));
    const ShardRange s = shard_range(in.numel(), size_, rank_);
    CHECK(out.numel() == s.size(), "reduce_scatter on '{}': {} elements over {} ranks give rank {} {} elements, "
          "output has {}", name(), in.numel(), size_, rank_, s.size(), out.numel());
    to_int(shard_range(in.numel(), size_, 0).size(), "reduce_scatter");
    Op o;
    o.kind = CommKind::ReduceScatter;
    o.a = in;
    o.b = out;
    o.rop = op;
    o.bytes = static_cast<int64_t>(in.nbytes());
    o.predicted_us = predict(o.kind, o.bytes);
    return enqueue(std::move(o));
  }

  WorkPtr all_gather_async(const Tensor& in, const Tensor& out) override {
    check_tensor(in, "all_gather");
    check_tensor(out, "all_gather");
    check_same_device(in, out, "all_gather");
    CHECK(in.dtype() == out.dtype(), "all_gather: input {} and output {}", dtype_name(in.dtype()),
          dtype_name(out.dtype()));
    const ShardRange s = shard_range(out.numel(), size_, rank_);
    CHECK(in.numel() == s.size(), "all_gather on '{}': {} elements over {} ranks give rank {} {} elements, input "
          "has {}", name(), out.numel(), size_, rank_, s.size(), in.numel());
    to_int(out.numel(), "all_gather");
    Op o;
    o.kind = CommKind::AllGather;
    o.a = in;
    o.b = out;
    o.bytes = static_cast<int64_t>(in.nbytes());
    o.predicted_us = predict(o.kind, static_cast<int64_t>(out.nbytes()));
    return enqueue(std::move(o));
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    check_tensor(t, "broadcast");
    CHECK(root >= 0 && root < size_, "broadcast on '{}': root {} of {} ranks", name(), root, size_);
    to_int(t.numel(), "broadcast");
    Op o;
    o.kind = CommKind::Broadcast;
    o.a = t;
    o.peer = root;
    o.bytes = static_cast<int64_t>(t.nbytes());
    o.predicted_us = predict(o.kind, o.bytes);
    return enqueue(std::move(o));
  }

  WorkPtr send_async(const Tensor& t, int peer, int tag) override { return p2p(CommKind::Send, t, peer, tag); }
  WorkPtr recv_async(const Tensor& t, int peer, int tag) override { return p2p(CommKind::Recv, t, peer, tag); }

  WorkPtr barrier_async() override {
    Op o;
    o.kind = CommKind::Barrier;
    o.predicted_us = predict(o.kind, 0);
    return enqueue(std::move(o));
  }

 private:
  // Host or device tensors (device ones are staged; a build without CUDA refuses them in staging()).
  void check_tensor(const Tensor& t, const char* what) const {
    CHECK(t.numel() == 0 || t.defined(), "{} on '{}': undefined tensor", what, name());
  }
  void check_same_device(const Tensor& in, const Tensor& out, const char* what) const {
    CHECK(in.device() == out.device(), "{} on '{}': input on {}, output on {}; the MPI backend needs both on the "
          "same device", what, name(), device_name(in.device()), device_name(out.device()));
  }

  // The staging of device tensors, created by the first device operation (CPU runs never touch CUDA).
  DeviceStaging& staging() {
    std::call_once(staging_once_, [&] {
#ifdef MESHTRAIN_WITH_CUDA
      staging_ = make_device_staging();
#endif
    });
    CHECK(staging_ != nullptr, "communicator '{}': a tensor on cuda, but this build has no CUDA backend", name());
    return *staging_;
  }

  double predict(CommKind k, int64_t bytes, int peer = -1) const {
    if (!opts_.emulating()) return 0;
    const bool inter = peer >= 0 ? node_[peer] != node_[rank_] : spans_nodes_;
    return predict_us(k, bytes, size_, link_model(opts_, inter));
  }

  WorkPtr p2p(CommKind kind, const Tensor& t, int peer, int tag) {
    const char* what = comm_kind_name(kind);
    check_tensor(t, what);
    CHECK(peer >= 0 && peer < size_, "{} on '{}': peer {} of {} ranks", what, name(), peer, size_);
    CHECK(tag >= 0, "{} on '{}': negative tag {}", what, name(), tag);
    to_int(t.numel(), what);
    Op o;
    o.kind = kind;
    o.a = t;
    o.peer = peer;
    o.tag = tag;
    o.bytes = static_cast<int64_t>(t.nbytes());
    o.predicted_us = predict(kind, o.bytes, peer);
    return enqueue(std::move(o));
  }

  WorkPtr enqueue(Op o) {
    // Device operations start after the compute stream's work issued so far (their inputs' producers).
    o.on_device = o.a.device() == Device::CUDA;
    if (o.on_device) o.inputs_ready = staging().record_inputs_ready();
    {
      std::lock_guard<std::mutex> lk(qm_);
      CHECK(!stop_, "communicator '{}' is shutting down", name());
      o.seq = ++seq_;
      o.work = std::make_shared<MpiWork>(shared_, o.kind, o.seq);
      o.issue_us = trace_clock_us();
      queue_.push_back(o);
    }
    qcv_.notify_one();
    return o.work;
  }

  // ---- the communication thread
  struct Pending {
    Op op;
    MPI_Request req = MPI_REQUEST_NULL;
    double start_us = 0, deadline_us = 0;
    bool mpi_done = false;
  };

  void run() {
    int idle_polls = 0;
    for (;;) {
      Op op;
      bool have = false;
      {
        std::unique_lock<std::mutex> lk(qm_);
        if (queue_.empty()) {
          if (pending_.empty()) {
            if (stop_) return;
            qcv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
          } else {
            // Point-to-point messages in flight: poll them, backing off from 25 us to 200 us between tests. Each
            // test runs MPICH's progress engine over every posted request (a pipeline posts a step's receives up
            // front); starting at 2 us, bench_pipeline's bubbles came out larger on a 2-core machine
            // (docs/performance.md).
            const int us = std::min(200, 25 << std::min(idle_polls, 3));
            qcv_.wait_for(lk, std::chrono::microseconds(us), [&] { return !queue_.empty(); });
          }
        }
        if (!queue_.empty()) {
          op = std::move(queue_.front());
          queue_.pop_front();
          have = true;
        }
      }
      if (have) {
        execute(op);
        idle_polls = 0;
      }
      if (!pending_.empty()) idle_polls = poll_pending() ? 0 : idle_polls + 1;
    }
  }

  // Tests the point-to-point operations in flight; completes those done and past their emulated deadline.
  bool poll_pending() {
    bool progressed = false;
    for (size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      if (!p.mpi_done) {
        int flag = 0;
        MPI_Status st;
        MPI_CHECK(MPI_Test(&p.req, &flag, &st));
        if (flag) {
          p.mpi_done = true;
          progressed = true;
          if (p.op.kind == CommKind::Recv) {
            int count = 0;
            MPI_Get_count(&st, mpi_type(p.op.a.dtype()), &count);
            CHECK(count == p.op.a.numel(), "recv on '{}' from {} tag {}: expected {} elements, got {}", name(),
                  p.op.peer, p.op.tag, p.op.a.numel(), count);
          }
          if (p.op.on_device) stage_out(p.op);  // inside the emulated time, like the message itself
        }
      }
      if (p.mpi_done && trace_clock_us() >= p.deadline_us) {
        finish(p.op, p.start_us);
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
        progressed = true;
      } else {
        ++i;
      }
    }
    return progressed;
  }

  // Sleeps until `deadline` (the emulated end of an operation), still completing point-to-point messages.
  void sleep_until(double deadline) {
    for (;;) {
      const double now = trace_clock_us();
      if (now >= deadline) return;
      double dt = deadline - now;
      if (!pending_.empty()) {
        poll_pending();
        dt = std::min(dt, 50.0);
      }
      std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(dt));
    }
  }

  void finish(Op& op, double start_us) {
    if (op.host_block) staging_->release(op.host_block);  // its copies are complete (stage_out synchronised)
    CommEvent ev;
    ev.comm = name();
    ev.op = comm_kind_name(op.kind);
    ev.seq = op.seq;
    ev.bytes = op.bytes;
    ev.issue_us = op.issue_us;
    ev.start_us = start_us;
    ev.end_us = trace_clock_us();
    if (sink_) sink_(ev);
    op.work->complete();
  }

  void* scratch(size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  // Completes the collective just started: a blocking call (rc only) is done; a nonblocking one (req_) is
  // polled with MPI_Test: spinning for the first kSpinUs, then sleeping with a doubling back-off (from 1 us) capped at
  // kMaxSleepUs, so a rank waiting for a late peer leaves the cores to compute (MPICH's blocking calls spin).
  void complete_request(int rc) {
    MPI_CHECK(rc);
    if (blocking_) return;
    // Spin (yielding) for 1 ms plus the time the payload takes at 1 GB/s: MPICH advances a nonblocking
    // collective only inside MPI calls, so sleeping while data still moves would cost bandwidth.
    constexpr double kMaxSleepUs = 200;
    const double spin_us = 1000 + static_cast<double>(op_bytes_) * 1e-3;
    const double t0 = trace_clock_us();
    double sleep_us = 1;
    for (;;) {
      int flag = 0;
      MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
      if (flag) return;
      if (!pending_.empty()) poll_pending();
      if (trace_clock_us() - t0 < spin_us) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(sleep_us));
      sleep_us = std::min(kMaxSleepUs, 2 * sleep_us);
    }
  }

  // Device operation: keeps the caller's tensors in dev_a/dev_b and points a/b at host views of one pinned block
  // laid out for the host algorithm, with its inputs copied in (after the compute work issued before the op).
  void stage_in(Op& op) {
    DeviceStaging& st = *staging_;
    st.begin(op.inputs_ready);
    op.inputs_ready = nullptr;
    op.dev_a = op.a;
    op.dev_b = op.b;
    const auto host_view = [](void* p, const Tensor& like) { return Tensor(p, like.shape(), like.dtype()); };
    bool downloaded = false;
    const auto download = [&](const Tensor& host, const Tensor& dev) {
      st.download(host.data(), dev.data(), dev.nbytes());
      downloaded |= dev.nbytes() > 0;
    };
    switch (op.kind) {
      case CommKind::ReduceScatter: {  // [input | output]: apart, so the host algorithm needs no scratch
        const size_t out_at = (op.dev_a.nbytes() + 63) / 64 * 64;
        char* block = static_cast<char*>(op.host_block = st.acquire(out_at + op.dev_b.nbytes()));
        op.a = host_view(block, op.dev_a);
        op.b = host_view(block ? block + out_at : nullptr, op.dev_b);
        download(op.a, op.dev_a);
        break;
      }
      case CommKind::AllGather: {  // the output, this rank's input already in its own shard: MPI runs in place
        op.host_block = st.acquire(op.dev_b.nbytes());
        op.b = host_view(op.host_block, op.dev_b);
        op.a = op.b.slice(shard_range(op.dev_b.numel(), size_, rank_).begin, op.dev_a.shape());
        download(op.a, op.dev_a);
        break;
      }
      case CommKind::Barrier: break;  // no tensors: never a device operation
      default: {  // all_reduce, broadcast, send, recv: one tensor
        op.host_block = st.acquire(op.dev_a.nbytes());
        op.a = host_view(op.host_block, op.dev_a);
        const bool reads_input = op.kind != CommKind::Recv && (op.kind != CommKind::Broadcast || rank_ == op.peer);
        if (reads_input) download(op.a, op.dev_a);
        break;
      }
    }
    if (downloaded) st.synchronize();
  }

  // Device operation: copies the result from the host views back into the caller's tensors and waits for it, so
  // the handle completes with the result in device memory.
  void stage_out(Op& op) {
    DeviceStaging& st = *staging_;
    switch (op.kind) {
      case CommKind::ReduceScatter:
      case CommKind::AllGather: st.upload(op.dev_b.data(), op.b.data(), op.dev_b.nbytes()); break;
      case CommKind::Broadcast:
        if (rank_ != op.peer) st.upload(op.dev_a.data(), op.a.data(), op.dev_a.nbytes());
        break;
      case CommKind::AllReduce:
      case CommKind::Recv: st.upload(op.dev_a.data(), op.a.data(), op.dev_a.nbytes()); break;
      case CommKind::Send:
      case CommKind::Barrier: return;
    }
    st.synchronize();
  }

  void execute(Op& op) {
    const double start = trace_clock_us();
    if (op.on_device) stage_in(op);
    op_bytes_ = std::max<int64_t>(op.bytes, static_cast<int64_t>(op.b.nbytes()));
    const Tensor& a = op.a;
    const Tensor& b = op.b;
    switch (op.kind) {
      case CommKind::AllReduce: {
        if (size_ > 1 && a.numel() > 0)
          complete_request(blocking_ ? MPI_Allreduce(MPI_IN_PLACE, a.data(), static_cast<int>(a.numel()), mpi_type(a.dtype()),
                                               mpi_op(a.dtype(), op.rop), comm_)
                                 : MPI_Iallreduce(MPI_IN_PLACE, a.data(), static_cast<int>(a.numel()),
                                                  mpi_type(a.dtype()), mpi_op(a.dtype(), op.rop), comm_, &req_));
        if (op.rop == ReduceOp::Avg && size_ > 1) divide_by_group_size(a, size_);
        break;
      }
      case CommKind::ReduceScatter: {
        const int64_t n = a.numel();
        if (size_ == 1) {
          if (n > 0 && a.data() != b.data()) std::memmove(b.data(), a.data(), a.nbytes());
        } else if (n > 0) {
          std::vector<int>& counts = counts_;
          counts.resize(size_);
          for (int r = 0; r < size_; ++r) counts[r] = static_cast<int>(shard_range(n, size_, r).size());
          // MPI forbids aliasing send and receive buffers: an output inside the input goes through scratch.
          const bool alias = overlaps(a, b);
          void* dst = alias ? scratch(b.nbytes()) : b.data();
          complete_request(blocking_ ? MPI_Reduce_scatter(a.data(), dst, counts.data(), mpi_type(a.dtype()),
                                                          mpi_op(a.dtype(), op.rop), comm_)
                                      : MPI_Ireduce_scatter(a.data(), dst, counts.data(), mpi_type(a.dtype()),
                                                            mpi_op(a.dtype(), op.rop), comm_, &req_));
          if (alias) std::memcpy(b.data(), dst, b.nbytes());
        }
        if (op.rop == ReduceOp::Avg && size_ > 1) divide_by_group_size(b, size_);
        break;
      }
      case CommKind::AllGather: {
        const int64_t n = b.numel();
        const size_t es = dtype_size(b.dtype());
        if (size_ == 1) {
          if (n > 0 && a.data() != b.data()) std::memmove(b.data(), a.data(), a.nbytes());
        } else if (n > 0) {
          counts_.resize(size_);
          displs_.resize(size_);
          for (int r = 0; r < size_; ++r) {
            const ShardRange s = shard_range(n, size_, r);
            counts_[r] = static_cast<int>(s.size());
            displs_[r] = static_cast<int>(s.begin);
          }
          const void* src = a.data();
          char* own = static_cast<char*>(b.data()) + static_cast<size_t>(displs_[rank_]) * es;
          if (a.numel() == 0 || a.data() == own) {
            if (a.numel() > 0) src = MPI_IN_PLACE;
          } else if (overlaps(a, b)) {
            src = std::memcpy(scratch(a.nbytes()), a.data(), a.nbytes());
          }
          complete_request(blocking_ ? MPI_Allgatherv(src, static_cast<int>(a.numel()), mpi_type(a.dtype()), b.data(),
                                                     counts_.data(), displs_.data(), mpi_type(b.dtype()), comm_)
                                      : MPI_Iallgatherv(src, static_cast<int>(a.numel()), mpi_type(a.dtype()), b.data(),
                                                       counts_.data(), displs_.data(), mpi_type(b.dtype()), comm_,
                                                       &req_));
        }
        break;
      }
      case CommKind::Broadcast:
        if (size_ > 1 && a.numel() > 0)
          complete_request(blocking_ ? MPI_Bcast(a.data(), static_cast<int>(a.numel()), mpi_type(a.dtype()), op.peer, comm_)
                                     : MPI_Ibcast(a.data(), static_cast<int>(a.numel()), mpi_type(a.dtype()), op.peer,
                                                  comm_, &req_));
        break;
      case CommKind::Barrier:
        if (size_ > 1) complete_request(blocking_ ? MPI_Barrier(comm_) : MPI_Ibarrier(comm_, &req_));
        break;
      case CommKind::Send:
      case CommKind::Recv: {
        Pending p;
        p.op = op;
        p.start_us = start;
        p.deadline_us = start + op.predicted_us;
        if (op.kind == CommKind::Send)
          MPI_CHECK(MPI_Isend(a.data(), static_cast<int>(a.numel()), mpi_type(a.dtype()), op.peer, op.tag, comm_,
                              &p.req));
        else
          MPI_CHECK(MPI_Irecv(a.data(), static_cast<int>(a.numel()), mpi_type(a.dtype()), op.peer, op.tag, comm_,
                              &p.req));
        pending_.push_back(std::move(p));
        return;  // completed by poll_pending
      }
    }
    if (op.on_device) stage_out(op);
    if (op.predicted_us > 0) sleep_until(start + op.predicted_us);
    finish(op, start);
  }

  CommOptions opts_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<Shared> shared_;
  std::vector<int> node_;
  bool spans_nodes_ = false;

  std::mutex qm_;
  std::condition_variable qcv_;
  std::deque<Op> queue_;
  uint64_t seq_ = 0;
  bool stop_ = false;
  std::thread thread_;

  // Device tensors only: created by the first device operation's issuing thread (staging_once_), then used by the
  // communication thread (the queue's mutex orders the two); destroyed after the thread has been joined.
  std::once_flag staging_once_;
  std::unique_ptr<DeviceStaging> staging_;

  // Communication thread only.
  std::vector<Pending> pending_;
  std::vector<char> scratch_;
  std::vector<int> counts_, displs_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  int64_t op_bytes_ = 0;  // bytes of the collective in flight (sets the spin window)
  bool blocking_ = false;  // CommOptions::blocking_waits: blocking MPI collectives (they spin while waiting)
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name, const CommOptions& opts) {
  return std::make_unique<MpiCommunicator>(comm, std::move(name), opts);
}

}  // namespace mt
