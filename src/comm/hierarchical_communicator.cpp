// Hierarchical all-reduce over a group spread evenly over nodes (k of its ranks on each of m nodes).
//
// all_reduce runs as three dependent phases on two communicators split from the group (make_communicator):
//   1. reduce_scatter inside the node ("<name>.intra", k ranks): local rank j gets shard_range(n, k, j) of the
//      node's sum, written into its own slice of the buffer;
//   2. all_reduce of that shard across nodes ("<name>.inter", the m ranks with local rank j, one per node);
//   3. all_gather of the shards inside the node, in place.
// Avg sums in every phase and divides the shard once by the group size (k m) before the all-gather, which is
// element for element the flat backend's Sum-then-divide. Phases whose sub-group has one rank are skipped (no
// sub-communicator exists for them), so one node (m = 1) and one rank per node (k = 1) need no special code.
// Every other operation (reduce_scatter, all_gather, broadcast, send, recv, barrier) runs flat, on an MPI
// communicator over the whole group under the group's own name.
//
// Ordering: the caller's thread only enqueues; one worker thread per hierarchical communicator pops operations
// in issue order and waits for each (each phase, each flat collective) before starting the next. Sends and
// receives are handed to the flat communicator in order but not waited for (as the MPI backend keeps them
// pending), so ranks that both send before receiving do not deadlock; their handles complete with the flat ones.
#include "comm/hierarchical_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "comm/comm_util.h"
#include "comm/comm_work.h"
#include "comm/make_communicator.h"
#include "comm/realtime_threads.h"
#include "core/check.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/errors.h"

namespace mt {

HierarchicalLayout hierarchical_layout(const std::vector<int>& node_of, int rank) {
  MT_CHECK(rank >= 0 && rank < static_cast<int>(node_of.size()), "rank {} of a group of {}", rank, node_of.size());
  // Nodes in order of their first rank, with how many of the group's ranks each holds.
  std::vector<std::pair<int, int>> count;
  for (int n : node_of) {
    auto it = std::find_if(count.begin(), count.end(), [&](const auto& c) { return c.first == n; });
    if (it == count.end())
      count.emplace_back(n, 1);
    else
      ++it->second;
  }
  HierarchicalLayout l;
  l.node = node_of[rank];
  l.nodes = static_cast<int>(count.size());
  l.ranks_per_node = count.front().second;
  for (int i = 0; i < rank; ++i) l.local_rank += node_of[i] == l.node;
  const bool even = std::all_of(count.begin(), count.end(), [&](const auto& c) { return c.second == l.ranks_per_node; });
  if (!even) {
    std::string per_node;
    for (size_t i = 0; i < count.size() && i < 8; ++i)
      per_node += fmt::format("{}node {} holds {}", i ? ", " : "", count[i].first, count[i].second);
    if (count.size() > 8) per_node += fmt::format(", ... ({} nodes)", count.size());
    l.error = fmt::format("the group's {} ranks are spread unevenly over nodes ({}); a hierarchical all-reduce needs "
                          "the same number of them on every node",
                          node_of.size(), per_node);
  }
  return l;
}

double predict_hierarchical_us(int64_t bytes, int k, int m, const CommOptions& opts) {
  // The emulation puts every rank on one node when ranks_per_node is 0, so only then is the middle phase intra-node.
  const LinkModel intra = link_model(opts, false), inter = link_model(opts, opts.ranks_per_node > 0);
  const double n = static_cast<double>(bytes);
  double t = 0;
  if (k > 1) t += 2.0 * (k - 1) * (intra.alpha_us + n / k * intra.beta_us_per_byte);
  if (m > 1) t += 2.0 * (m - 1) * (inter.alpha_us + n / (static_cast<double>(k) * m) * inter.beta_us_per_byte);
  return t;
}

namespace {

// Completed by the worker (collectives), or bound to the flat communicator's handle (send/recv), whose completion
// it then follows.
class HierWork : public Work {
 public:
  HierWork(std::shared_ptr<WaitStats> s, CommKind kind, uint64_t seq) : s_(std::move(s)), kind_(kind), seq_(seq) {}

  void wait() override {
    if (done()) return;
    const auto t0 = std::chrono::steady_clock::now();
    WorkPtr inner;
    {
      std::unique_lock<std::mutex> lk(m_);
      auto ready = [&] { return done_ || inner_ != nullptr; };
      if (s_->timeout_s > 0) {
        if (!cv_.wait_for(lk, std::chrono::duration<double>(s_->timeout_s), ready)) watchdog(t0);
      } else {
        cv_.wait(lk, ready);
      }
      if (!done_) inner = inner_;
    }
    if (inner) inner->wait();  // the flat communicator's watchdog covers this part
    s_->wait_ns.fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count(),
        std::memory_order_relaxed);
  }

  bool done() const override {
    std::lock_guard<std::mutex> lk(m_);
    return done_ || (inner_ && inner_->done());
  }

  void complete() {
    {
      std::lock_guard<std::mutex> lk(m_);
      done_ = true;
    }
    cv_.notify_all();
  }

  void bind(WorkPtr inner) {
    {
      std::lock_guard<std::mutex> lk(m_);
      inner_ = std::move(inner);
    }
    cv_.notify_all();
  }

 private:
  [[noreturn]] void watchdog(std::chrono::steady_clock::time_point t0) {
    watchdog_abort(s_->world_rank, kind_, seq_, s_->name,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), s_->timeout_s);
  }

  std::shared_ptr<WaitStats> s_;
  CommKind kind_;
  uint64_t seq_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  WorkPtr inner_;
};

struct Task {
  CommKind kind = CommKind::Barrier;
  Tensor a, b;  // all_reduce/broadcast/send/recv: a; reduce_scatter/all_gather: a = in, b = out
  ReduceOp rop = ReduceOp::Sum;
  int peer = 0, tag = 0;
  std::shared_ptr<HierWork> work;
};

// Splits `group` into the ranks with the same `colour`, ordered by group rank, and wraps the result.
std::unique_ptr<Communicator> split(MPI_Comm group, int colour, int key, const std::string& name,
                                    const CommOptions& opts) {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(group, colour, key, &c));
  auto comm = make_communicator(c, name, opts);  // duplicates c
  MPI_CHECK(MPI_Comm_free(&c));
  return comm;
}

class HierarchicalCommunicator : public Communicator {
 public:
  // Its sink receives its sub-communicators' events, numbered by each of them.
  bool events_number_own_operations() const override { return false; }
  HierarchicalCommunicator(MPI_Comm group, const std::string& name, const CommOptions& opts,
                           const HierarchicalLayout& layout) {
    MPI_CHECK(MPI_Comm_rank(group, &rank_));
    MPI_CHECK(MPI_Comm_size(group, &size_));
    shared_ = make_wait_stats(name, opts.timeout_s);
    // The same calls in the same order on every rank (k and m are the same for the whole group).
    flat_ = make_communicator(group, name, opts);
    auto intra = split(group, layout.node, rank_, name + ".intra", opts);
    auto inter = split(group, layout.local_rank, rank_, name + ".inter", opts);
    MT_CHECK(intra->size() == layout.ranks_per_node && intra->rank() == layout.local_rank && inter->size() == layout.nodes,
             "'{}': intra-node group rank {} of {}, inter-node group of {}; expected {} of {}, {}", name, intra->rank(),
             intra->size(), inter->size(), layout.local_rank, layout.ranks_per_node, layout.nodes);
    if (intra->size() > 1) intra_ = std::move(intra);
    if (inter->size() > 1) inter_ = std::move(inter);
    // Events of every sub-communicator go to this communicator's sink (read when the event happens: the sink is
    // set before operations are issued, and issuing passes through the queue's mutex).
    for (Communicator* c : {flat_.get(), intra_.get(), inter_.get()})
      if (c) c->set_event_sink([this](const CommEvent& e) {
        if (sink_) sink_(e);
      });
    worker_ = std::thread([this, realtime = opts.realtime_threads] {
      enter_comm_thread(realtime);
      // Device tensors' Avg is a kernel launched from here (divide_by_group_size): the process's GPU made current
      // on this thread, where there is one (cuda_init is idempotent; a later call only does that).
      if (cuda_device_index() >= 0) cuda_init(0);
      run();
    });
    worker_handle_ = worker_.native_handle();
  }

  ~HierarchicalCommunicator() override {
    {
      std::lock_guard<std::mutex> lk(qm_);
      stop_ = true;
    }
    qcv_.notify_all();
    worker_.join();  // runs every queued operation first
    inter_.reset();
    intra_.reset();
    flat_.reset();  // completes outstanding sends and receives
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return shared_->name; }
  double total_wait_us() const override { return shared_->total_wait_us(); }
  double thread_cpu_us() const override {
    double us = mt::thread_cpu_us(worker_handle_);
    for (const Communicator* c : {flat_.get(), intra_.get(), inter_.get()})
      if (c) us += c->thread_cpu_us();
    return us;
  }

  bool set_emulated_link(double latency_us, double bandwidth_gbps) override {
    bool any = false;
    for (Communicator* c : {flat_.get(), intra_.get(), inter_.get()})
      if (c) any = c->set_emulated_link(latency_us, bandwidth_gbps) || any;
    return any;
  }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_defined(t, "all_reduce");
    CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16 || t.dtype() == DType::F16,
          "all_reduce on '{}': reductions take fp32, bf16 or fp16 tensors, got {}", name(), dtype_name(t.dtype()));
    CHECK(t.numel() <= INT_MAX, "all_reduce on '{}': {} elements exceed one MPI call's int count", name(), t.numel());
    Task k;
    k.kind = CommKind::AllReduce;
    k.a = t;
    k.rop = op;
    return enqueue(std::move(k));
  }

  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override {
    check_defined(in, "reduce_scatter");
    check_defined(out, "reduce_scatter");
    CHECK(out.numel() == shard_range(in.numel(), size_, rank_).size(),
          "reduce_scatter on '{}': {} elements over {} ranks give rank {} {} elements, output has {}", name(),
          in.numel(), size_, rank_, shard_range(in.numel(), size_, rank_).size(), out.numel());
    Task k;
    k.kind = CommKind::ReduceScatter;
    k.a = in;
    k.b = out;
    k.rop = op;
    return enqueue(std::move(k));
  }

  WorkPtr all_gather_async(const Tensor& in, const Tensor& out) override {
    check_defined(in, "all_gather");
    check_defined(out, "all_gather");
    CHECK(in.numel() == shard_range(out.numel(), size_, rank_).size(),
          "all_gather on '{}': {} elements over {} ranks give rank {} {} elements, input has {}", name(), out.numel(),
          size_, rank_, shard_range(out.numel(), size_, rank_).size(), in.numel());
    Task k;
    k.kind = CommKind::AllGather;
    k.a = in;
    k.b = out;
    return enqueue(std::move(k));
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    check_defined(t, "broadcast");
    CHECK(root >= 0 && root < size_, "broadcast on '{}': root {} of {} ranks", name(), root, size_);
    Task k;
    k.kind = CommKind::Broadcast;
    k.a = t;
    k.peer = root;
    return enqueue(std::move(k));
  }

  WorkPtr send_async(const Tensor& t, int peer, int tag) override { return p2p(CommKind::Send, t, peer, tag); }
  WorkPtr recv_async(const Tensor& t, int peer, int tag) override { return p2p(CommKind::Recv, t, peer, tag); }

  WorkPtr barrier_async() override {
    Task k;
    k.kind = CommKind::Barrier;
    return enqueue(std::move(k));
  }

 private:
  // Device tensors pass to the sub-communicators, which take them where their transport does (MPI stages them
  // through host memory; the shared-memory transport refuses them).
  void check_defined(const Tensor& t, const char* what) const {
    CHECK(t.numel() == 0 || t.defined(), "{} on '{}': undefined tensor", what, name());
  }

  WorkPtr p2p(CommKind kind, const Tensor& t, int peer, int tag) {
    const char* what = comm_kind_name(kind);
    check_defined(t, what);
    CHECK(peer >= 0 && peer < size_, "{} on '{}': peer {} of {} ranks", what, name(), peer, size_);
    CHECK(tag >= 0, "{} on '{}': negative tag {}", what, name(), tag);
    Task k;
    k.kind = kind;
    k.a = t;
    k.peer = peer;
    k.tag = tag;
    return enqueue(std::move(k));
  }

  WorkPtr enqueue(Task k) {
    {
      std::lock_guard<std::mutex> lk(qm_);
      CHECK(!stop_, "communicator '{}' is shutting down", name());
      k.work = std::make_shared<HierWork>(shared_, k.kind, ++seq_);
      queue_.push_back(k);
    }
    qcv_.notify_one();
    return k.work;
  }

  // ---- the worker thread
  void run() {
    for (;;) {
      Task k;
      {
        std::unique_lock<std::mutex> lk(qm_);
        qcv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        k = std::move(queue_.front());
        queue_.pop_front();
      }
      execute(k);
    }
  }

  void execute(Task& k) {
    switch (k.kind) {
      case CommKind::AllReduce: all_reduce_phases(k.a, k.rop); break;
      case CommKind::ReduceScatter: flat_->reduce_scatter_async(k.a, k.b, k.rop)->wait(); break;
      case CommKind::AllGather: flat_->all_gather_async(k.a, k.b)->wait(); break;
      case CommKind::Broadcast: flat_->broadcast_async(k.a, k.peer)->wait(); break;
      case CommKind::Barrier: flat_->barrier_async()->wait(); break;
      case CommKind::Send: k.work->bind(flat_->send_async(k.a, k.peer, k.tag)); return;
      case CommKind::Recv: k.work->bind(flat_->recv_async(k.a, k.peer, k.tag)); return;
    }
    k.work->complete();
  }

  // The three phases, each finished before the next starts. Sum and Max reduce in every phase; Avg sums and
  // divides the shard by the group size once.
  void all_reduce_phases(const Tensor& t, ReduceOp op) {
    const int64_t n = t.numel();
    const Tensor x = t.view({n});
    const ReduceOp part = op == ReduceOp::Max ? ReduceOp::Max : ReduceOp::Sum;
    Tensor shard = x;
    if (intra_) {
      const ShardRange s = shard_range(n, intra_->size(), intra_->rank());
      shard = x.slice(s.begin, {s.size()});
      intra_->reduce_scatter_async(x, shard, part)->wait();  // into its own slice (the ZeRO layout)
    }
    if (inter_) inter_->all_reduce_async(shard, part)->wait();
    if (op == ReduceOp::Avg && size_ > 1) divide_by_group_size(shard, size_);
    if (intra_) intra_->all_gather_async(shard, x)->wait();  // in place
  }

  int rank_ = 0, size_ = 1;
  std::shared_ptr<WaitStats> shared_;
  std::unique_ptr<Communicator> flat_, intra_, inter_;  // intra_/inter_ null when their group has one rank

  std::mutex qm_;
  std::condition_variable qcv_;
  std::deque<Task> queue_;
  uint64_t seq_ = 0;
  bool stop_ = false;
  std::thread worker_;
  std::thread::native_handle_type worker_handle_{};
};

// Node id of every group rank: emulated (world rank / ranks_per_node) or real (the lowest group rank sharing
// memory with it). The real case is collective over `group`.
std::vector<int> group_nodes(MPI_Comm group, const CommOptions& opts) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(group, &rank));
  MPI_CHECK(MPI_Comm_size(group, &size));
  if (opts.ranks_per_node > 0) {
    return emulated_nodes(world_ranks(group), opts.ranks_per_node);
  }
  MPI_Comm shm = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(group, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm));
  int leader = rank;
  MPI_CHECK(MPI_Allreduce(&rank, &leader, 1, MPI_INT, MPI_MIN, shm));
  MPI_CHECK(MPI_Comm_free(&shm));
  std::vector<int> nodes(size);
  MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, nodes.data(), 1, MPI_INT, group));
  return nodes;
}

}  // namespace

std::unique_ptr<Communicator> make_hierarchical_communicator(MPI_Comm group, const std::string& name,
                                                             const CommOptions& opts) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(group, &rank));
  // Every rank of the group computes the same node table, so all of them throw, or none.
  const HierarchicalLayout layout = hierarchical_layout(group_nodes(group, opts), rank);
  if (!layout.error.empty())
    input_error("comm.hierarchical on communicator '{}' ({}): {}", name,
                opts.ranks_per_node > 0 ? fmt::format("comm.emulate.ranks_per_node = {}", opts.ranks_per_node)
                                        : std::string("nodes as MPI finds them"),
                layout.error);
  return std::make_unique<HierarchicalCommunicator>(group, name, opts, layout);
}

}  // namespace mt
