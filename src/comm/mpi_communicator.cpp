// The MPI transport: the calls that run each operation over MPI on the communication thread of a
// QueuedCommunicator (queued_communicator.h), which owns the queue, the handles and the thread.
//
// Collectives: with CommOptions::blocking_waits, MPI's blocking calls (raw MPI throughput, but MPICH spins while a
// peer is late, taking a core); otherwise MPI's nonblocking calls polled with MPI_Test, spinning only while data
// moves and then sleeping with a back-off, so a rank waiting for a late peer leaves the cores to compute (see
// docs/comm.md). Sends and receives are posted nonblocking, in issue order (MPI's non-overtaking rule keeps their
// matching in order), and completed by polling: MPI progresses them only inside MPI calls.
// Device (Device::CUDA) tensors, in CUDA builds, go through pinned host buffers (comm/cuda/device_staging.h): the
// thread copies them to the host after the compute stream's work issued before the operation, runs the same host
// algorithm, and copies the result back before the handle completes (docs/comm.md, "Device tensors").
#include "comm/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <vector>

#include "comm/comm_util.h"
#include "comm/cuda/device_staging.h"  // an interface only; created in CUDA builds
#include "comm/mpi_init.h"
#include "comm/mpi_types.h"
#include "comm/queued_communicator.h"
#include "core/check.h"
#include "core/dtype.h"

namespace mt {
namespace {

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* a0 = static_cast<const char*>(a.data());
  const char* b0 = static_cast<const char*>(b.data());
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_CHECK(MPI_Comm_rank(c, &r));
  return r;
}
int comm_size(MPI_Comm c) {
  int s = 0;
  MPI_CHECK(MPI_Comm_size(c, &s));
  return s;
}

class MpiCommunicator : public QueuedCommunicator {
 public:
  MpiCommunicator(MPI_Comm comm, const std::string& name, const CommOptions& opts)
      : QueuedCommunicator(name, comm_rank(comm), comm_size(comm), opts, INT_MAX) {
    int level = 0;
    MPI_CHECK(MPI_Query_thread(&level));
    CHECK(level >= MPI_THREAD_MULTIPLE,
          "communicator '{}': MPI was initialised at thread level {}, the MPI backend needs MPI_THREAD_MULTIPLE "
          "(initialise with mt::init_mpi)",
          name, level);
    mpi_type(DType::BF16);  // creates the 16-bit types on this thread, before the communication thread runs
    comm_dup_yielding(comm, &comm_);
    comm_dup_yielding(comm, &exchange_comm_);  // its own matching space: no user send can match its messages
    // A peer that died can make MPI fail this rank's next operation with it (over UCX: "Endpoint timeout"). Fatal, MPI
    // would abort the whole job at once, before any rank could dump its flight record; returned, the failure is a
    // CHECK here, which dumps every rank's record first (comm/flight_recorder.h) and then ends this rank alone.
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_set_errhandler(exchange_comm_, MPI_ERRORS_RETURN));
    start(&bell_, false);  // MPI polls or spins: never real-time (realtime_threads.h)
  }

  ~MpiCommunicator() override {
    stop();
    if (!finalized_before_free("communicator " + name())) MPI_Comm_free(&comm_), MPI_Comm_free(&exchange_comm_);
  }

 private:
  struct Pending {
    Op op;
    MPI_Request req = MPI_REQUEST_NULL;
    double start_us = 0;
  };

  // ---- caller's thread
  void on_issue(Op& op) override {
    // Device operations start after the compute stream's work issued so far (their inputs' producers).
    op.on_device = op.a.device() == Device::CUDA || op.b.device() == Device::CUDA;
    if (op.on_device) op.inputs_ready = staging().record_inputs_ready();
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

  // ---- communication thread
  double p2p_poll_us(int idle_rounds) const override {
    // Back off from 25 us to 200 us between tests: each test runs MPICH's progress engine over every posted
    // request (a pipeline posts a step's receives up front).
    return std::min(200, 25 << std::min(idle_rounds, 3));
  }
  bool p2p_pending() const override { return !pending_.empty(); }

  void post_p2p(Op& op) override {
    Pending p;
    p.start_us = trace_clock_us();
    if (op.on_device) stage_in(op);
    const Tensor& a = op.a;
    if (op.kind == CommKind::Send)
      MPI_CHECK(MPI_Isend(a.data(), static_cast<int>(a.numel()), mpi_type(a.dtype()), op.peer, op.tag, comm_, &p.req));
    else
      MPI_CHECK(MPI_Irecv(a.data(), static_cast<int>(a.numel()), mpi_type(a.dtype()), op.peer, op.tag, comm_, &p.req));
    p.op = std::move(op);
    pending_.push_back(std::move(p));
  }

  bool progress_p2p() override {
    bool progressed = false;
    for (size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      int flag = 0;
      MPI_Status st;
      MPI_CHECK(MPI_Test(&p.req, &flag, &st));
      if (!flag) {
        ++i;
        continue;
      }
      if (p.op.kind == CommKind::Recv) {
        int count = 0;
        MPI_Get_count(&st, mpi_type(p.op.a.dtype()), &count);
        CHECK(count == p.op.a.numel(), "recv on '{}' from {} tag {}: expected {} elements, got {}", name(),
              p.op.peer, p.op.tag, p.op.a.numel(), count);
      }
      if (p.op.on_device) stage_out(p.op);
      release_block(p.op);
      finish(p.op, p.start_us);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      progressed = true;
    }
    return progressed;
  }

  // Completes the collective just started: a blocking call (rc only) is done; a nonblocking one (req_, or the
  // `count` requests at `reqs`) is polled with MPI_Test, spinning (yielding) for 1 ms plus the time the payload
  // takes at 1 GB/s, since MPICH advances a nonblocking collective only inside MPI calls and sleeping while data
  // moves would cost bandwidth; then sleeping with a doubling back-off from 1 us to 200 us, so a rank waiting for
  // a late peer leaves the cores to compute (MPICH's blocking calls spin).
  void complete_request(int rc, int64_t bytes, MPI_Request* reqs = nullptr, int count = 1) {
    MPI_CHECK(rc);
    if (!reqs) {
      if (opts_.blocking_waits) return;
      reqs = &req_;
    } else if (opts_.blocking_waits) {
      MPI_CHECK(MPI_Waitall(count, reqs, MPI_STATUSES_IGNORE));
      return;
    }
    constexpr double kMaxSleepUs = 200;
    const double spin_us = 1000 + static_cast<double>(bytes) * 1e-3;
    const double t0 = trace_clock_us();
    double sleep_us = 1;
    for (;;) {
      int flag = 0;
      MPI_CHECK(MPI_Testall(count, reqs, &flag, MPI_STATUSES_IGNORE));
      if (flag) return;
      if (!pending_.empty()) progress_p2p();
      if (trace_clock_us() - t0 < spin_us) {
        std::this_thread::yield();
        continue;
      }
      sleep_on_bell(bell()->load(std::memory_order_acquire), sleep_us);
      sleep_us = std::min(kMaxSleepUs, 2 * sleep_us);
    }
  }

  // The all-reduce of a group of two: each rank sends its whole buffer and adds the peer's (x + y == y + x in
  // IEEE arithmetic, so both hold the same bits, those MPICH's algorithms give). One exchange where MPICH's
  // reduce-scatter + all-gather makes two, each waiting for both directions of the one before: where two such
  // groups share a host's link and TCP shares it unevenly, that wait left the link idle (docs/multinode.md).
  void exchange_all_reduce(const Tensor& a, MPI_Datatype t, MPI_Op r, int64_t bytes) {
    const int n = static_cast<int>(a.numel());
    void* peer = scratch(a.nbytes());
    MPI_Request reqs[2];
    MPI_CHECK(MPI_Irecv(peer, n, t, 1 - rank(), 0, exchange_comm_, &reqs[0]));
    complete_request(MPI_Isend(a.data(), n, t, 1 - rank(), 0, exchange_comm_, &reqs[1]), bytes, reqs, 2);
    MPI_CHECK(MPI_Reduce_local(peer, a.data(), n, t, r));
  }

  void* scratch(size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  void run_collective(Op& op) override {
    const double start = trace_clock_us();
    if (op.on_device) stage_in(op);
    const bool blocking = opts_.blocking_waits;
    const int p = size();
    const int64_t bytes = std::max<int64_t>(op.bytes, static_cast<int64_t>(op.b.nbytes()));
    const Tensor& a = op.a;
    const Tensor& b = op.b;
    switch (op.kind) {
      case CommKind::AllReduce: {
        const int n = static_cast<int>(a.numel());
        if (p > 1 && n > 0) {
          const MPI_Datatype t = mpi_type(a.dtype());
          const MPI_Op r = mpi_op(a.dtype(), op.rop);
          if (p == 2)
            exchange_all_reduce(a, t, r, bytes);
          else
            complete_request(blocking ? MPI_Allreduce(MPI_IN_PLACE, a.data(), n, t, r, comm_)
                                      : MPI_Iallreduce(MPI_IN_PLACE, a.data(), n, t, r, comm_, &req_),
                             bytes);
        }
        if (op.rop == ReduceOp::Avg && p > 1) divide_by_group_size(a, p);
        break;
      }
      case CommKind::ReduceScatter: {
        const int64_t n = a.numel();
        if (p == 1) {
          if (n > 0 && a.data() != b.data()) std::memmove(b.data(), a.data(), a.nbytes());
        } else if (n > 0) {
          counts_.resize(p);
          for (int r = 0; r < p; ++r) counts_[r] = static_cast<int>(shard_range(n, p, r).size());
          // MPI forbids aliasing send and receive buffers: an output inside the input goes through scratch.
          const bool alias = overlaps(a, b);
          void* dst = alias ? scratch(b.nbytes()) : b.data();
          const MPI_Datatype t = mpi_type(a.dtype());
          const MPI_Op r = mpi_op(a.dtype(), op.rop);
          complete_request(blocking ? MPI_Reduce_scatter(a.data(), dst, counts_.data(), t, r, comm_)
                                    : MPI_Ireduce_scatter(a.data(), dst, counts_.data(), t, r, comm_, &req_),
                           bytes);
          if (alias) std::memcpy(b.data(), dst, b.nbytes());
        }
        if (op.rop == ReduceOp::Avg && p > 1) divide_by_group_size(b, p);
        break;
      }
      case CommKind::AllGather: {
        const int64_t n = b.numel();
        const size_t es = dtype_size(b.dtype());
        if (p == 1) {
          if (n > 0 && a.data() != b.data()) std::memmove(b.data(), a.data(), a.nbytes());
        } else if (n > 0) {
          counts_.resize(p);
          displs_.resize(p);
          for (int r = 0; r < p; ++r) {
            const ShardRange s = shard_range(n, p, r);
            counts_[r] = static_cast<int>(s.size());
            displs_[r] = static_cast<int>(s.begin);
          }
          const void* src = a.data();
          char* own = static_cast<char*>(b.data()) + static_cast<size_t>(displs_[rank()]) * es;
          if (a.numel() == 0 || a.data() == own) {
            if (a.numel() > 0) src = MPI_IN_PLACE;
          } else if (overlaps(a, b)) {
            src = std::memcpy(scratch(a.nbytes()), a.data(), a.nbytes());
          }
          const int na = static_cast<int>(a.numel());
          const MPI_Datatype t = mpi_type(b.dtype());
          complete_request(blocking ? MPI_Allgatherv(src, na, t, b.data(), counts_.data(), displs_.data(), t, comm_)
                                    : MPI_Iallgatherv(src, na, t, b.data(), counts_.data(), displs_.data(), t, comm_,
                                                      &req_),
                           bytes);
        }
        break;
      }
      case CommKind::Broadcast:
        if (p > 1 && a.numel() > 0) {
          const int n = static_cast<int>(a.numel());
          const MPI_Datatype t = mpi_type(a.dtype());
          complete_request(blocking ? MPI_Bcast(a.data(), n, t, op.peer, comm_)
                                    : MPI_Ibcast(a.data(), n, t, op.peer, comm_, &req_),
                           bytes);
        }
        break;
      case CommKind::Barrier:
        if (p > 1) complete_request(blocking ? MPI_Barrier(comm_) : MPI_Ibarrier(comm_, &req_), 0);
        break;
      case CommKind::Send:
      case CommKind::Recv: CHECK(false, "send/recv are not collectives"); break;
    }
    if (op.on_device) stage_out(op);
    release_block(op);
    finish(op, start);
  }

  // ---- device tensors
  void release_block(Op& op) {
    if (op.host_block) staging_->release(op.host_block);  // its copies are complete (stage_out synchronised)
    op.host_block = nullptr;
  }

  // Keeps the caller's tensors in dev_a/dev_b and points a/b at host views of one pinned block laid out for the
  // host algorithm, with its inputs copied in (after the compute work issued before the operation).
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
        op.a = op.b.slice(shard_range(op.dev_b.numel(), size(), rank()).begin, op.dev_a.shape());
        download(op.a, op.dev_a);
        break;
      }
      case CommKind::Barrier: break;  // no tensors: never a device operation
      default: {  // all_reduce, broadcast, send, recv: one tensor
        op.host_block = st.acquire(op.dev_a.nbytes());
        op.a = host_view(op.host_block, op.dev_a);
        const bool reads_input = op.kind != CommKind::Recv && (op.kind != CommKind::Broadcast || rank() == op.peer);
        if (reads_input) download(op.a, op.dev_a);
        break;
      }
    }
    if (downloaded) st.synchronize();
  }

  // Copies the result from the host views back into the caller's tensors and waits for it, so the handle
  // completes with the result in device memory.
  void stage_out(Op& op) {
    DeviceStaging& st = *staging_;
    switch (op.kind) {
      case CommKind::ReduceScatter:
      case CommKind::AllGather: st.upload(op.dev_b.data(), op.b.data(), op.dev_b.nbytes()); break;
      case CommKind::Broadcast:
        if (rank() != op.peer) st.upload(op.dev_a.data(), op.a.data(), op.dev_a.nbytes());
        break;
      case CommKind::AllReduce:
      case CommKind::Recv: st.upload(op.dev_a.data(), op.a.data(), op.dev_a.nbytes()); break;
      case CommKind::Send:
      case CommKind::Barrier: return;
    }
    st.synchronize();
  }

  MPI_Comm comm_ = MPI_COMM_NULL, exchange_comm_ = MPI_COMM_NULL;
  std::atomic<uint32_t> bell_{0};  // private to this process: only the caller's issues ring it

  // Device tensors only: created by the first device operation's issuing thread (staging_once_), then used by the
  // communication thread (the queue's mutex orders the two); destroyed after the thread has been joined.
  std::once_flag staging_once_;
  std::unique_ptr<DeviceStaging> staging_;

  // Communication thread only.
  std::vector<Pending> pending_;
  std::vector<char> scratch_;
  std::vector<int> counts_, displs_;
  MPI_Request req_ = MPI_REQUEST_NULL;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_transport(MPI_Comm comm, const std::string& name, const CommOptions& opts) {
  return std::make_unique<MpiCommunicator>(comm, name, opts);
}

}  // namespace mt
