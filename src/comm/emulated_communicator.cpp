// The network-emulation wrapper (emulated_communicator.h).
//
// Timing model. The inner communicator reports each finished operation with the moment it could start on the
// wire (shared memory: a collective when every rank had arrived, a receive when its message was sent or posted,
// whichever is later; MPI: when its thread started the call or posted the message).
//   collectives   start = max(inner start, end of the previous collective), end = start + prediction
//                 (one link per communicator: its collectives take turns on it, as they would on a real one)
//   send, recv    end = inner start + prediction (each direction is its own link)
// The handle completes at max(end, the inner's completion); the reported event carries the emulated span.
#include "comm/emulated_communicator.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <queue>
#include <thread>

#include "comm/comm_work.h"
#include "comm/realtime_threads.h"
#include "core/check.h"

namespace mt {
namespace {

class EmulatedCommunicator : public Communicator {
 public:
  EmulatedCommunicator(std::unique_ptr<Communicator> inner, std::vector<int> node_of, const CommOptions& opts)
      : inner_(std::move(inner)), opts_(opts), node_of_(std::move(node_of)),
        stats_(make_wait_stats(inner_->name(), opts.timeout_s)) {
    CHECK(static_cast<int>(node_of_.size()) == inner_->size(), "emulation of '{}': {} node ids for {} ranks",
          inner_->name(), node_of_.size(), inner_->size());
    spans_nodes_ = std::any_of(node_of_.begin(), node_of_.end(), [&](int n) { return n != node_of_[0]; });
    const int mine = node_of_[inner_->rank()];
    sharers_ = node_link_sharers(opts_.ranks_per_node,
                                 static_cast<int>(std::count(node_of_.begin(), node_of_.end(), mine)));
    inner_->set_event_sink([this](const CommEvent& e) { on_inner_done(e); });
    timer_ = std::thread([this] {
      enter_comm_thread(opts_.realtime_threads);  // it completes handles: late wake-ups would lengthen every operation
      prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // complete handles on time, not 50 us late
      run_timer();
    });
    timer_handle_ = timer_.native_handle();
  }

  ~EmulatedCommunicator() override {
    inner_.reset();  // runs every issued operation to its end (each lands in the timer's queue)
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    timer_.join();  // completes every queued handle at its emulated end
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return stats_->name; }
  double total_wait_us() const override { return stats_->total_wait_us(); }
  double thread_cpu_us() const override { return inner_->thread_cpu_us() + mt::thread_cpu_us(timer_handle_); }
  // The inner numbers its operations as this one does (it has no other user).
  void set_start_sink(std::function<void(uint64_t)> sink) override { inner_->set_start_sink(std::move(sink)); }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    return issue(CommKind::AllReduce, t.nbytes(), -1, [&] { return inner_->all_reduce_async(t, op); });
  }
  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override {
    return issue(CommKind::ReduceScatter, in.nbytes(), -1, [&] { return inner_->reduce_scatter_async(in, out, op); });
  }
  WorkPtr all_gather_async(const Tensor& in, const Tensor& out) override {
    return issue(CommKind::AllGather, out.nbytes(), -1, [&] { return inner_->all_gather_async(in, out); });
  }
  WorkPtr broadcast_async(const Tensor& t, int root) override {
    return issue(CommKind::Broadcast, t.nbytes(), -1, [&] { return inner_->broadcast_async(t, root); });
  }
  WorkPtr send_async(const Tensor& t, int peer, int tag) override {
    return issue(CommKind::Send, t.nbytes(), peer, [&] { return inner_->send_async(t, peer, tag); });
  }
  WorkPtr recv_async(const Tensor& t, int peer, int tag) override {
    return issue(CommKind::Recv, t.nbytes(), peer, [&] { return inner_->recv_async(t, peer, tag); });
  }
  WorkPtr barrier_async() override {
    return issue(CommKind::Barrier, 0, -1, [&] { return inner_->barrier_async(); });
  }
  bool set_emulated_link(double latency_us, double bandwidth_gbps) override {
    std::lock_guard<std::mutex> lk(m_);  // issue() predicts under this lock
    opts_.latency_us = latency_us;
    opts_.bandwidth_gbps = bandwidth_gbps;
    return true;
  }

 private:
  struct Issued {
    std::shared_ptr<CommWork> work;
    double predicted_us = 0;
  };
  struct Due {
    double at_us = 0;
    CommEvent event;
    std::shared_ptr<CommWork> work;
    bool operator>(const Due& o) const { return at_us > o.at_us; }
  };

  double predict(CommKind kind, size_t bytes, int peer) const {
    const int p = size();
    const bool inter = peer >= 0 ? node_of_[peer] != node_of_[rank()] : spans_nodes_;
    return predict_us(kind, static_cast<int64_t>(bytes), p,
                      inter ? shared_link(link_model(opts_, true), sharers_) : link_model(opts_, false));
  }

  template <class Issue>
  WorkPtr issue(CommKind kind, size_t bytes, int peer, Issue&& inner_issue) {
    std::shared_ptr<CommWork> work;
    {
      std::lock_guard<std::mutex> lk(m_);
      const uint64_t seq = ++seq_;  // the inner numbers its operations the same way: it has no other user
      work = std::make_shared<CommWork>(stats_, kind, seq);
      issued_[seq] = Issued{work, predict(kind, bytes, peer)};
    }
    inner_issue();  // the inner checks the arguments (a bad call fails there, as without emulation)
    return work;
  }

  // The inner's thread: the real operation is finished; schedule the handle at its emulated end.
  void on_inner_done(const CommEvent& e) {
    {
      std::lock_guard<std::mutex> lk(m_);
      auto it = issued_.find(e.seq);
      CHECK(it != issued_.end(), "emulation of '{}': the inner communicator finished operation #{} that was not "
            "issued through the wrapper", name(), e.seq);
      Due d;
      d.work = it->second.work;
      d.event = e;
      const CommKind kind = it->second.work->kind();
      const bool p2p = kind == CommKind::Send || kind == CommKind::Recv;
      const double start = p2p ? e.start_us : std::max(e.start_us, link_free_us_);
      d.event.start_us = start;
      d.at_us = start + it->second.predicted_us;
      if (!p2p) link_free_us_ = d.at_us;
      issued_.erase(it);
      due_.push(std::move(d));
    }
    cv_.notify_all();
  }

  void run_timer() {
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      if (due_.empty()) {
        if (stop_) return;
        cv_.wait(lk);
        continue;
      }
      const double now = trace_clock_us();
      const double at = due_.top().at_us;
      if (at > now) {
        cv_.wait_for(lk, std::chrono::duration<double, std::micro>(at - now));
        continue;
      }
      Due d = due_.top();
      due_.pop();
      lk.unlock();
      d.event.end_us = trace_clock_us();
      if (sink_) sink_(d.event);
      d.work->complete();
      lk.lock();
    }
  }

  std::unique_ptr<Communicator> inner_;
  CommOptions opts_;
  std::vector<int> node_of_;
  bool spans_nodes_ = false;
  int sharers_ = 1;  // groups crossing this rank's node link at once (node_link_sharers)
  std::shared_ptr<WaitStats> stats_;

  std::mutex m_;
  std::condition_variable cv_;
  uint64_t seq_ = 0;
  std::map<uint64_t, Issued> issued_;
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> due_;
  double link_free_us_ = 0;
  bool stop_ = false;
  std::thread timer_;
  std::thread::native_handle_type timer_handle_{};
};

}  // namespace

std::unique_ptr<Communicator> wrap_emulation(std::unique_ptr<Communicator> inner, std::vector<int> node_of,
                                             const CommOptions& opts) {
  return std::make_unique<EmulatedCommunicator>(std::move(inner), std::move(node_of), opts);
}

}  // namespace mt
