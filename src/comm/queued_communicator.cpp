// The ordered queue and communication thread of the host transports (queued_communicator.h).
#include "comm/queued_communicator.h"

#include <sys/prctl.h>

#include <algorithm>

#include "comm/futex.h"
#include "comm/realtime_threads.h"
#include "core/check.h"
#include "core/dtype.h"

namespace mt {

QueuedCommunicator::QueuedCommunicator(const std::string& name, int rank, int size, const CommOptions& opts,
                                       int64_t max_elements)
    : opts_(opts), rank_(rank), size_(size), max_elements_(max_elements),
      stats_(make_wait_stats(name, opts.timeout_s)) {}

void QueuedCommunicator::start(std::atomic<uint32_t>* bell, bool realtime) {
  bell_ = bell;
  thread_ = std::thread([this, realtime] {
    enter_comm_thread(realtime);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // short sleeps (MPI polling) must not be rounded up to 50 us
    run();
  });
  handle_ = thread_.native_handle();
}

void QueuedCommunicator::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(qm_);
    stop_ = true;
  }
  ring(bell_);
  thread_.join();
}

double QueuedCommunicator::thread_cpu_us() const { return handle_ ? mt::thread_cpu_us(handle_) : 0.0; }

// ---- issue (caller's thread)

void QueuedCommunicator::check_defined(const Tensor& t, const char* what) const {
  CHECK(t.numel() == 0 || t.defined(), "{} on '{}': undefined tensor", what, name());
}

void QueuedCommunicator::check_count(int64_t n, const char* what) const {
  CHECK(n >= 0 && n <= max_elements_, "{} on '{}': {} elements exceed one operation's limit of {}", what, name(), n,
        max_elements_);
}

void QueuedCommunicator::check_reduce(const Tensor& t, const char* what) const {
  const DType d = t.dtype();
  CHECK(d == DType::F32 || d == DType::BF16 || d == DType::F16,
        "{} on '{}': reductions take fp32, bf16 or fp16 tensors, got {}", what, name(), dtype_name(d));
}

WorkPtr QueuedCommunicator::all_reduce_async(const Tensor& t, ReduceOp op) {
  check_defined(t, "all_reduce");
  check_reduce(t, "all_reduce");
  check_count(t.numel(), "all_reduce");
  Op o;
  o.kind = CommKind::AllReduce;
  o.a = t;
  o.rop = op;
  o.bytes = static_cast<int64_t>(t.nbytes());
  return enqueue(std::move(o));
}

WorkPtr QueuedCommunicator::reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) {
  check_defined(in, "reduce_scatter");
  check_defined(out, "reduce_scatter");
  CHECK(in.device() == out.device(), "reduce_scatter on '{}': input on {}, output on {}; both must be on the same "
        "device", name(), device_name(in.device()), device_name(out.device()));
  check_reduce(in, "reduce_scatter");
  CHECK(in.dtype() == out.dtype(), "reduce_scatter: input {} and output {}", dtype_name(in.dtype()),
        dtype_name(out.dtype()));
  const ShardRange s = shard_range(in.numel(), size_, rank_);
  CHECK(out.numel() == s.size(), "reduce_scatter on '{}': {} elements over {} ranks give rank {} {} elements, "
        "output has {}", name(), in.numel(), size_, rank_, s.size(), out.numel());
  check_count(shard_range(in.numel(), size_, 0).size(), "reduce_scatter");
  Op o;
  o.kind = CommKind::ReduceScatter;
  o.a = in;
  o.b = out;
  o.rop = op;
  o.bytes = static_cast<int64_t>(in.nbytes());
  return enqueue(std::move(o));
}

WorkPtr QueuedCommunicator::all_gather_async(const Tensor& in, const Tensor& out) {
  check_defined(in, "all_gather");
  check_defined(out, "all_gather");
  CHECK(in.device() == out.device(), "all_gather on '{}': input on {}, output on {}; both must be on the same "
        "device", name(), device_name(in.device()), device_name(out.device()));
  CHECK(in.dtype() == out.dtype(), "all_gather: input {} and output {}", dtype_name(in.dtype()),
        dtype_name(out.dtype()));
  const ShardRange s = shard_range(out.numel(), size_, rank_);
  CHECK(in.numel() == s.size(), "all_gather on '{}': {} elements over {} ranks give rank {} {} elements, input "
        "has {}", name(), out.numel(), size_, rank_, s.size(), in.numel());
  check_count(out.numel(), "all_gather");
  Op o;
  o.kind = CommKind::AllGather;
  o.a = in;
  o.b = out;
  o.bytes = static_cast<int64_t>(in.nbytes());
  return enqueue(std::move(o));
}

WorkPtr QueuedCommunicator::broadcast_async(const Tensor& t, int root) {
  check_defined(t, "broadcast");
  CHECK(root >= 0 && root < size_, "broadcast on '{}': root {} of {} ranks", name(), root, size_);
  check_count(t.numel(), "broadcast");
  Op o;
  o.kind = CommKind::Broadcast;
  o.a = t;
  o.peer = root;
  o.bytes = static_cast<int64_t>(t.nbytes());
  return enqueue(std::move(o));
}

WorkPtr QueuedCommunicator::send_async(const Tensor& t, int peer, int tag) { return p2p(CommKind::Send, t, peer, tag); }
WorkPtr QueuedCommunicator::recv_async(const Tensor& t, int peer, int tag) { return p2p(CommKind::Recv, t, peer, tag); }

WorkPtr QueuedCommunicator::barrier_async() {
  Op o;
  o.kind = CommKind::Barrier;
  return enqueue(std::move(o));
}

WorkPtr QueuedCommunicator::p2p(CommKind kind, const Tensor& t, int peer, int tag) {
  const char* what = comm_kind_name(kind);
  check_defined(t, what);
  CHECK(peer >= 0 && peer < size_, "{} on '{}': peer {} of {} ranks", what, name(), peer, size_);
  CHECK(tag >= 0, "{} on '{}': negative tag {}", what, name(), tag);
  check_count(t.numel(), what);
  Op o;
  o.kind = kind;
  o.a = t;
  o.peer = peer;
  o.tag = tag;
  o.bytes = static_cast<int64_t>(t.nbytes());
  return enqueue(std::move(o));
}

WorkPtr QueuedCommunicator::enqueue(Op o) {
  on_issue(o);
  {
    std::lock_guard<std::mutex> lk(qm_);
    CHECK(!stop_, "communicator '{}' is shutting down", name());
    o.seq = ++seq_;
    o.work = std::make_shared<CommWork>(stats_, o.kind, o.seq);
    o.issue_us = trace_clock_us();
    queue_.push_back(o);
  }
  ring(bell_);
  return o.work;
}

// ---- the communication thread

void QueuedCommunicator::run() {
  running_since_ = trace_clock_us();
  int idle_rounds = 0;
  for (;;) {
    // Read the bell before looking for work: a ring after this read makes the sleep below return at once.
    const uint32_t seen = bell_->load(std::memory_order_acquire);
    bool worked = false, stopping = false;
    for (;;) {
      Op op;
      {
        std::lock_guard<std::mutex> lk(qm_);
        stopping = stop_;
        if (queue_.empty()) break;
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      worked = true;
      if (start_sink_) start_sink_(op.seq);
      if (op.kind == CommKind::Send || op.kind == CommKind::Recv)
        post_p2p(op);
      else
        run_collective(op);
    }
    const bool pending = p2p_pending();
    if (pending && progress_p2p()) worked = true;
    if (stopping && !p2p_pending()) {
      std::lock_guard<std::mutex> lk(qm_);
      if (queue_.empty()) return;
      continue;
    }
    idle_rounds = worked ? 0 : idle_rounds + 1;
    if (!worked) sleep_on_bell(seen, p2p_pending() ? p2p_poll_us(idle_rounds) : -1.0);
  }
}

void QueuedCommunicator::sleep_on_bell(uint32_t seen, double timeout_us) {
  const double now = trace_clock_us();
  // Runs closer than this are one on the trace: a row of microsecond slivers says no more and costs more.
  constexpr double kMergeUs = 20;
  if (!runs_.empty() && running_since_ - runs_.back().second < kMergeUs)
    runs_.back().second = now;
  else
    runs_.emplace_back(running_since_, now);
  futex_wait(bell_, seen, timeout_us);
  running_since_ = trace_clock_us();
}

void QueuedCommunicator::finish(Op& op, double start_us) {
  CommEvent ev;
  ev.comm = name();
  ev.op = comm_kind_name(op.kind);
  ev.seq = op.seq;
  ev.bytes = op.bytes;
  ev.issue_us = op.issue_us;
  ev.start_us = start_us;
  ev.end_us = trace_clock_us();
  // The thread's runs since the last event, the current one up to now, go with this event.
  ev.thread_run_us = std::move(runs_);
  runs_.clear();
  if (running_since_ < ev.end_us) ev.thread_run_us.emplace_back(running_since_, ev.end_us);
  running_since_ = ev.end_us;
  if (sink_) sink_(ev);
  // Let go of the operation's tensors before its caller learns that it is done: the caller may free them at once
  // (a ring's k|v buffer), and the peak memory must not depend on when this thread gets to drop its references (a
  // 16-core machine measured one k|v buffer more than the planner's exact prediction before this).
  op.a = op.b = op.dev_a = op.dev_b = Tensor();
  op.work->complete();
}

}  // namespace mt
