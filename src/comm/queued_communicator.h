// The ordered queue and communication thread that the host transports share (MPI, shared memory).
//
// A QueuedCommunicator checks each operation's arguments on the caller's thread, numbers it and queues it; its
// one communication thread takes operations in issue order and hands them to the transport: a collective runs to
// completion before the next operation starts (run_collective); a send or receive is posted (post_p2p) and then
// progressed (progress_p2p) while later operations run, so two ranks that both send before they receive never
// deadlock on a serialised queue.
//
// The thread sleeps on a futex word, its bell, whenever it has nothing to do: issuing an operation rings it, and
// a transport rings it when something the thread waits for has changed (the shared-memory backend's peers ring it
// across processes). sleep_on_bell also records when the thread was running, for the trace.
#pragma once
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/comm_work.h"
#include "comm/communicator.h"

namespace mt {

struct Op {
  CommKind kind = CommKind::Barrier;
  Tensor a, b;  // all_reduce/broadcast/send/recv: a; reduce_scatter/all_gather: a = in, b = out
  ReduceOp rop = ReduceOp::Sum;
  int peer = 0;  // root of broadcast, peer of send/recv
  int tag = 0;
  uint64_t seq = 0;
  int64_t bytes = 0;  // CommEvent::bytes: what this rank contributes
  double issue_us = 0;
  std::shared_ptr<CommWork> work;
  // Device tensors (the MPI transport in CUDA builds): the caller's tensors while a/b are host views of a pinned
  // block, the compute-stream event the inputs are ready at, and the block (see mpi_communicator.cpp).
  bool on_device = false;
  Tensor dev_a, dev_b;
  void* inputs_ready = nullptr;
  void* host_block = nullptr;
};

class QueuedCommunicator : public Communicator {
 public:
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return stats_->name; }
  double total_wait_us() const override { return stats_->total_wait_us(); }
  double thread_cpu_us() const override;

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override;
  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override;
  WorkPtr all_gather_async(const Tensor& in, const Tensor& out) override;
  WorkPtr broadcast_async(const Tensor& t, int root) override;
  WorkPtr send_async(const Tensor& t, int peer, int tag) override;
  WorkPtr recv_async(const Tensor& t, int peer, int tag) override;
  WorkPtr barrier_async() override;

 protected:
  // max_elements: the most elements one operation may carry (MPI's int counts).
  QueuedCommunicator(const std::string& name, int rank, int size, const CommOptions& opts, int64_t max_elements);
  // The derived constructor calls start() last and the derived destructor stop() first: stop() runs every queued
  // operation, completes every send and receive, and joins the thread.
  // realtime: the thread takes real-time priority (only a transport whose thread never spins asks for it).
  void start(std::atomic<uint32_t>* bell, bool realtime);
  void stop();

  // ---- transport hooks
  // Caller's thread, at issue (e.g. record when a device tensor's inputs are ready).
  virtual void on_issue(Op&) {}
  // Communication thread. run_collective finishes the operation (finish()) before it returns.
  virtual void run_collective(Op& op) = 0;
  virtual void post_p2p(Op& op) = 0;
  // Advances posted sends and receives, finishing those complete; true when anything changed.
  virtual bool progress_p2p() = 0;
  virtual bool p2p_pending() const = 0;
  // How long the idle thread may sleep with sends or receives pending before polling them again (< 0: until the
  // bell rings). The shared-memory transport never polls; MPI progresses messages only inside MPI calls.
  virtual double p2p_poll_us(int idle_rounds) const = 0;

  // Communication thread: sleeps until the bell differs from `seen` (or timeout_us passes; < 0: no limit).
  void sleep_on_bell(uint32_t seen, double timeout_us);
  // Reports the operation's event (start_us: when it could start on the wire) and completes its handle.
  void finish(Op& op, double start_us);
  std::atomic<uint32_t>* bell() const { return bell_; }

  const CommOptions opts_;

 private:
  void check_defined(const Tensor& t, const char* what) const;
  void check_count(int64_t n, const char* what) const;
  void check_reduce(const Tensor& t, const char* what) const;
  WorkPtr p2p(CommKind kind, const Tensor& t, int peer, int tag);
  WorkPtr enqueue(Op o);
  void run();

  int rank_ = 0, size_ = 1;
  int64_t max_elements_;
  std::shared_ptr<WaitStats> stats_;
  std::atomic<uint32_t>* bell_ = nullptr;

  std::mutex qm_;
  std::deque<Op> queue_;
  uint64_t seq_ = 0;
  bool stop_ = false;
  std::thread thread_;
  std::thread::native_handle_type handle_{};  // for its CPU clock

  // Communication thread only: when it ran since the last reported event (merged when the gap is tiny).
  std::vector<std::pair<double, double>> runs_;
  double running_since_ = 0;
};

}  // namespace mt
