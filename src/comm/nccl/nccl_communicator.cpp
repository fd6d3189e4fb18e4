// NCCL backend of Communicator: one NCCL communicator, one communication stream and one watchdog thread per
// group. Compiled only with CUDA (MESHTRAIN_WITH_CUDA); host code only (CUDA runtime API + NCCL), no kernels.
// What must stay true:
// - Every operation is enqueued on comm_stream_ after an event recorded on the compute stream at issue time, so
//   it reads its inputs only after the compute that produced them, and operations run in issue order.
// - Work::wait() orders the compute stream after the operation's `done` event; nothing blocks the host except
//   nccl_wait_host(), barrier() and the destructor.
// - Uneven shards (n not divisible by size) go through a padded staging buffer: rank r's shard starts at r*c
//   (c = ceil(n/size)) in both shard_range's layout and the padded one, so padding only appends. Even n uses
//   the caller's buffers directly (no copies).
#include "comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "comm/flight_recorder.h"
#include "core/cuda_check.h"

namespace mt {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
  }
  MT_CHECK(false, "no NCCL type for {}", dtype_name(t));
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One issued operation. Its events are destroyed with it (cudaEventDestroy of a pending event is allowed: the
// runtime releases it once it completes). It holds the caller's tensors until it is retired (done), as the MPI
// backend does: an owning tensor dropped by the caller right after issue must not go back to the caching
// allocator, and be handed out to compute-stream work, while the communication stream still reads or writes it.
struct Op {
  CommKind kind = CommKind::AllReduce;
  uint64_t seq = 0;
  int64_t bytes = 0;
  double issue_us = 0;
  cudaEvent_t ready = nullptr;  // on the compute stream: the operation's inputs are written
  cudaEvent_t start = nullptr;  // on the communication stream, before the NCCL call (timing)
  cudaEvent_t done = nullptr;   // on the communication stream, after the NCCL call and any copy-out
  Tensor keep_a, keep_b;        // the operation's tensors, dropped by the watchdog when it retires the op
  ~Op() {
    for (cudaEvent_t e : {ready, start, done})
      if (e) cudaEventDestroy(e);  // no CHECK: may run during teardown after a CUDA error was reported
  }
};

// What handles need after the communicator itself may be gone.
struct Shared {
  std::string name;
  int world_rank = 0;
  double timeout_s = 0;
  cudaStream_t compute_stream = nullptr;
  std::atomic<int64_t> wait_ns{0};
};

[[noreturn]] void watchdog_abort(const Shared& s, const Op& op, double waited_s, const char* what) {
  std::fprintf(stderr,
               "[rank %d] watchdog: %s #%llu on communicator '%s' (NCCL, %lld bytes) not complete after %s %.1f s "
               "(comm.timeout_s = %g); aborting the job\n",
               s.world_rank, comm_kind_name(op.kind), static_cast<unsigned long long>(op.seq), s.name.c_str(),
               static_cast<long long>(op.bytes), what, waited_s, s.timeout_s);
  std::fflush(stderr);
  const std::string flight = flight_dump_on_timeout(
      fmt::format("watchdog: {} #{} on communicator '{}' (NCCL) not complete after {} {:.1f} s", comm_kind_name(op.kind),
                  op.seq, s.name, what, waited_s));
  if (!flight.empty()) std::fprintf(stderr, "[rank %d] %s\n", s.world_rank, flight.c_str());
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

// True when `e` has completed; aborts on any error other than "not ready".
bool event_done(cudaEvent_t e) {
  const cudaError_t rc = cudaEventQuery(e);
  if (rc == cudaSuccess) return true;
  if (rc != cudaErrorNotReady) CUDA_CHECK(rc);
  return false;
}

void host_wait(Shared& s, const Op& op) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!event_done(op.done)) {
    if (s.timeout_s > 0 && seconds_since(t0) > s.timeout_s) watchdog_abort(s, op, seconds_since(t0), "waiting");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  s.wait_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count(),
      std::memory_order_relaxed);
}

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<Shared> s, std::shared_ptr<Op> op, bool host) : s_(std::move(s)), op_(std::move(op)), host_(host) {}
  // Device-side wait: later work on the compute stream runs after the operation. The host returns at once.
  void wait() override {
    if (host_) return wait_host();
    CUDA_CHECK(cudaStreamWaitEvent(s_->compute_stream, op_->done, 0));
  }
  bool done() const override { return event_done(op_->done); }
  void wait_host() { host_wait(*s_, *op_); }

 private:
  std::shared_ptr<Shared> s_;
  std::shared_ptr<Op> op_;
  bool host_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, std::string name, const CommOptions& opts, cudaStream_t compute)
      : s_(std::make_shared<Shared>()) {
    s_->name = std::move(name);
    s_->world_rank = world_rank_or_zero();
    s_->timeout_s = opts.timeout_s;
    s_->compute_stream = compute;
    MPI_CHECK(MPI_Comm_rank(comm, &rank_));
    MPI_CHECK(MPI_Comm_size(comm, &size_));
    CUDA_CHECK(cudaGetDevice(&device_));
    ncclUniqueId id{};
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
    NCCL_CHECK(ncclCommInitRank(&nccl_, size_, id, rank_));
    // The highest priority, so communication kernels are scheduled ahead of queued compute kernels.
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
    CUDA_CHECK(cudaMemset(barrier_buf_, 0, sizeof(float)));
    watchdog_ = std::thread([this] { watchdog_loop(); });
  }

  ~NcclCommunicator() override {
    // The watchdog keeps running while we drain, so a hung operation still ends the job.
    if (staging_) CUDA_CHECK(cudaFreeAsync(staging_, comm_stream_));
    CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    NCCL_CHECK(ncclCommDestroy(nccl_));
    CUDA_CHECK(cudaFree(barrier_buf_));
    CUDA_CHECK(cudaStreamDestroy(comm_stream_));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return s_->name; }
  double total_wait_us() const override { return s_->wait_ns.load(std::memory_order_relaxed) * 1e-3; }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_device(t, "all_reduce");
    return issue(CommKind::AllReduce, int64_t(t.nbytes()), false, t, Tensor(), [&] {
      if (t.numel() > 0)
        NCCL_CHECK(ncclAllReduce(t.data(), t.data(), size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op), nccl_,
                                 comm_stream_));
    });
  }

  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override {
    check_device(in, "reduce_scatter");
    check_device(out, "reduce_scatter");
    MT_CHECK(in.dtype() == out.dtype(), "reduce_scatter: in is {}, out is {}", dtype_name(in.dtype()),
             dtype_name(out.dtype()));
    const int64_t n = in.numel(), c = (n + size_ - 1) / size_, mine = shard_range(n, size_, rank_).size();
    MT_CHECK(out.numel() == mine, "reduce_scatter on '{}': out has {} elements, rank {}'s shard of {} is {}", name(),
             out.numel(), rank_, n, mine);
    return issue(CommKind::ReduceScatter, int64_t(in.nbytes()), false, in, out, [&] {
      if (n == 0) return;
      const size_t es = dtype_size(in.dtype());
      const ncclDataType_t ty = nccl_type(in.dtype());
      if (c * size_ == n) {  // every shard is c elements: the caller's buffers as they are
        NCCL_CHECK(ncclReduceScatter(in.data(), out.data(), size_t(c), ty, nccl_op(op), nccl_, comm_stream_));
        return;
      }
      // Padded input [n real | c*size - n zeros], then this rank's c-element block; copy out its real part.
      char* padded = static_cast<char*>(staging(size_t(c * size_ + c) * es));
      char* block = padded + size_t(c * size_) * es;
      CUDA_CHECK(cudaMemcpyAsync(padded, in.data(), size_t(n) * es, cudaMemcpyDeviceToDevice, comm_stream_));
      CUDA_CHECK(cudaMemsetAsync(padded + size_t(n) * es, 0, size_t(c * size_ - n) * es, comm_stream_));
      void* recv = mine == c ? out.data() : block;
      NCCL_CHECK(ncclReduceScatter(padded, recv, size_t(c), ty, nccl_op(op), nccl_, comm_stream_));
      if (recv == block && mine > 0)
        CUDA_CHECK(cudaMemcpyAsync(out.data(), block, size_t(mine) * es, cudaMemcpyDeviceToDevice, comm_stream_));
    });
  }

  WorkPtr all_gather_async(const Tensor& in, const Tensor& out) override {
    check_device(in, "all_gather");
    check_device(out, "all_gather");
    MT_CHECK(in.dtype() == out.dtype(), "all_gather: in is {}, out is {}", dtype_name(in.dtype()),
             dtype_name(out.dtype()));
    const int64_t n = out.numel(), c = (n + size_ - 1) / size_, mine = shard_range(n, size_, rank_).size();
    MT_CHECK(in.numel() == mine, "all_gather on '{}': in has {} elements, rank {}'s shard of {} is {}", name(),
             in.numel(), rank_, n, mine);
    return issue(CommKind::AllGather, int64_t(in.nbytes()), false, in, out, [&] {
      if (n == 0) return;
      const size_t es = dtype_size(in.dtype());
      const ncclDataType_t ty = nccl_type(in.dtype());
      if (c * size_ == n) {  // also covers in-place use (in == out + rank*c), which NCCL allows
        NCCL_CHECK(ncclAllGather(in.data(), out.data(), size_t(c), ty, nccl_, comm_stream_));
        return;
      }
      // Send c elements (this shard, zero-padded when short), gather c*size, copy the first n into out.
      char* gathered = static_cast<char*>(staging(size_t(c * size_ + c) * es));
      char* send = gathered + size_t(c * size_) * es;
      if (mine > 0)
        CUDA_CHECK(cudaMemcpyAsync(send, in.data(), size_t(mine) * es, cudaMemcpyDeviceToDevice, comm_stream_));
      if (mine < c) CUDA_CHECK(cudaMemsetAsync(send + size_t(mine) * es, 0, size_t(c - mine) * es, comm_stream_));
      NCCL_CHECK(ncclAllGather(send, gathered, size_t(c), ty, nccl_, comm_stream_));
      CUDA_CHECK(cudaMemcpyAsync(out.data(), gathered, size_t(n) * es, cudaMemcpyDeviceToDevice, comm_stream_));
    });
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    check_device(t, "broadcast");
    MT_CHECK(root >= 0 && root < size_, "broadcast root {} of {}", root, size_);
    return issue(CommKind::Broadcast, int64_t(t.nbytes()), false, t, Tensor(), [&] {
      if (t.numel() > 0)
        NCCL_CHECK(ncclBroadcast(t.data(), t.data(), size_t(t.numel()), nccl_type(t.dtype()), root, nccl_,
                                 comm_stream_));
    });
  }

  // NCCL has no tags: messages between two ranks match in issue order, so `tag` only documents the caller's
  // intent. A send blocks its stream until the peer's matching recv runs: two ranks that both send first on
  // one communicator deadlock for large messages (the pipeline schedule must order them, as with MPI_Ssend).
  WorkPtr send_async(const Tensor& t, int peer, int /*tag*/) override {
    check_device(t, "send");
    MT_CHECK(peer >= 0 && peer < size_ && peer != rank_, "send to {} on '{}' of {}", peer, name(), size_);
    return issue(CommKind::Send, int64_t(t.nbytes()), false, t, Tensor(), [&] {
      if (t.numel() > 0)
        NCCL_CHECK(ncclSend(t.data(), size_t(t.numel()), nccl_type(t.dtype()), peer, nccl_, comm_stream_));
    });
  }

  WorkPtr recv_async(const Tensor& t, int peer, int /*tag*/) override {
    check_device(t, "recv");
    MT_CHECK(peer >= 0 && peer < size_ && peer != rank_, "recv from {} on '{}' of {}", peer, name(), size_);
    return issue(CommKind::Recv, int64_t(t.nbytes()), false, t, Tensor(), [&] {
      if (t.numel() > 0)
        NCCL_CHECK(ncclRecv(t.data(), size_t(t.numel()), nccl_type(t.dtype()), peer, nccl_, comm_stream_));
    });
  }

  // A one-element all-reduce; its handle waits on the host (a barrier is about the host).
  WorkPtr barrier_async() override {
    return issue(CommKind::Barrier, 0, true, Tensor(), Tensor(), [&] {
      NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, nccl_, comm_stream_));
    });
  }

 private:
  void check_device(const Tensor& t, const char* op) const {
    MT_CHECK(t.numel() == 0 || t.device() == Device::CUDA, "{} on NCCL communicator '{}': tensor is on {}", op,
             name(), device_name(t.device()));
  }

  // A device buffer of at least `bytes` for the operation being enqueued. Growing frees the old buffer in
  // stream order (after the operations already queued that use it), so no host synchronisation is needed.
  void* staging(size_t bytes) {
    if (bytes > staging_bytes_) {
      if (staging_) CUDA_CHECK(cudaFreeAsync(staging_, comm_stream_));
      const size_t grow = std::max(bytes, staging_bytes_ + staging_bytes_ / 2);
      CUDA_CHECK(cudaMallocAsync(&staging_, grow, comm_stream_));
      staging_bytes_ = grow;
    }
    return staging_;
  }

  template <typename Body>
  WorkPtr issue(CommKind kind, int64_t bytes, bool host, const Tensor& a, const Tensor& b, Body&& body) {
    std::lock_guard<std::mutex> issue_lock(issue_mu_);  // NCCL calls on one communicator must not interleave
    auto op = std::make_shared<Op>();
    op->kind = kind;
    op->keep_a = a;
    op->keep_b = b;
    op->seq = ++seq_;
    op->bytes = bytes;
    op->issue_us = trace_clock_us();
    CUDA_CHECK(cudaEventCreateWithFlags(&op->ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreate(&op->start));
    CUDA_CHECK(cudaEventCreate(&op->done));
    CUDA_CHECK(cudaEventRecord(op->ready, s_->compute_stream));
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, op->ready, 0));
    CUDA_CHECK(cudaEventRecord(op->start, comm_stream_));
    body();
    CUDA_CHECK(cudaEventRecord(op->done, comm_stream_));
    {
      std::lock_guard<std::mutex> lk(mu_);
      inflight_.push_back(op);
    }
    cv_.notify_one();
    return std::make_shared<NcclWork>(s_, std::move(op), host);
  }

  // Retires operations in order (they complete in order on one stream), reports each to the event sink, and
  // ends the job when the oldest one has been runnable (its inputs ready) for longer than the timeout.
  void watchdog_loop() {
    CUDA_CHECK(cudaSetDevice(device_));
    std::shared_ptr<Op> front;
    std::chrono::steady_clock::time_point runnable_since{};
    bool runnable = false;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (!front) {
          cv_.wait(lk, [&] { return stop_ || !inflight_.empty(); });
          if (inflight_.empty()) return;  // stop_ and drained
          front = inflight_.front();
          runnable = false;
        }
      }
      if (event_done(front->done)) {
        report(*front);
        front->keep_a = front->keep_b = Tensor();  // only this thread touches them after issue
        std::lock_guard<std::mutex> lk(mu_);
        inflight_.pop_front();
        front.reset();
        continue;
      }
      if (!runnable && event_done(front->ready)) {
        runnable = true;
        runnable_since = std::chrono::steady_clock::now();
      }
      if (runnable && s_->timeout_s > 0 && seconds_since(runnable_since) > s_->timeout_s)
        watchdog_abort(*s_, *front, seconds_since(runnable_since), "running");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // Times come from the GPU events; the end is placed at the moment the watchdog saw completion (within its
  // polling interval) on the host clock the trace uses.
  void report(const Op& op) {
    if (!sink_) return;
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, op.start, op.done));
    CommEvent e;
    e.comm = s_->name;
    e.op = comm_kind_name(op.kind);
    e.seq = op.seq;
    e.bytes = op.bytes;
    e.issue_us = op.issue_us;
    e.end_us = trace_clock_us();
    e.start_us = std::max(op.issue_us, e.end_us - double(ms) * 1e3);
    sink_(e);
  }

  std::shared_ptr<Shared> s_;
  int rank_ = 0, size_ = 1, device_ = 0;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  float* barrier_buf_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  uint64_t seq_ = 0;
  std::mutex issue_mu_;

  std::mutex mu_;  // guards inflight_ and stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> inflight_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string name, const CommOptions& opts,
                                                     CUstream_st* compute_stream) {
  return std::make_unique<NcclCommunicator>(comm, std::move(name), opts, compute_stream);
}

void nccl_wait_host(const WorkPtr& w) {
  auto* nw = dynamic_cast<NcclWork*>(w.get());
  MT_CHECK(nw != nullptr, "nccl_wait_host: not a handle from an NCCL communicator");
  nw->wait_host();
}

}  // namespace mt
