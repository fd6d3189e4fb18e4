// Communicator: a group of ranks and the collectives the trainer needs, each with an async form returning a
// handle. Operations on one communicator execute in the order they were issued, like a CUDA stream (the MPI
// backend runs them on one communication thread per communicator; the NCCL backend on one CUDA stream), so
// every rank of a group must issue the same operations in the same order.
// Uneven sizes: reduce_scatter and all_gather split n elements into size() contiguous shards given by
// shard_range(n, size, rank): every rank but the last few gets ceil(n / size) elements.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm_options.h"
#include "core/tensor.h"

namespace mt {

enum class ReduceOp { Sum, Avg, Max };

struct ShardRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
// Rank r's contiguous shard of n elements over `size` ranks: [min(n, r*c), min(n, (r+1)*c)), c = ceil(n/size).
ShardRange shard_range(int64_t n, int size, int rank);

// One collective or point-to-point operation, as the time accounting and the trace see it.
struct CommEvent {
  std::string comm;       // the communicator's name ("dp", "tp", "pp", "world")
  std::string op;         // "all_reduce", "reduce_scatter", ...
  uint64_t seq = 0;       // per-communicator sequence number, from 1
  int64_t bytes = 0;      // payload bytes this rank contributes
  double issue_us = 0;    // timestamps in microseconds on the process's steady clock (trace_clock_us())
  double start_us = 0, end_us = 0;  // when the operation ran (including emulated network delay)
  // When the communication thread was running (not asleep) on this operation's behalf, on the same clock: what
  // the trace shows on the communication thread's row. Empty where a backend has no thread of its own.
  std::vector<std::pair<double, double>> thread_run_us;
};

double trace_clock_us();

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation is complete (the watchdog ends the job if that outlives comm.timeout_s).
  virtual void wait() = 0;
  virtual bool done() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;

  // In place over t (fp32, bf16 or fp16; Avg divides by size()).
  virtual WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) = 0;
  // in: n elements (the same n on every rank); out: this rank's shard_range(n) of the reduction.
  virtual WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  // in: this rank's shard_range(n) of out; out: n elements, every rank's shard in rank order.
  virtual WorkPtr all_gather_async(const Tensor& in, const Tensor& out) = 0;
  virtual WorkPtr broadcast_async(const Tensor& t, int root) = 0;
  virtual WorkPtr send_async(const Tensor& t, int peer, int tag) = 0;
  virtual WorkPtr recv_async(const Tensor& t, int peer, int tag) = 0;
  virtual WorkPtr barrier_async() = 0;

  void all_reduce(const Tensor& t, ReduceOp op) { all_reduce_async(t, op)->wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) { reduce_scatter_async(in, out, op)->wait(); }
  void all_gather(const Tensor& in, const Tensor& out) { all_gather_async(in, out)->wait(); }
  void broadcast(const Tensor& t, int root) { broadcast_async(t, root)->wait(); }
  void send(const Tensor& t, int peer, int tag) { send_async(t, peer, tag)->wait(); }
  void recv(const Tensor& t, int peer, int tag) { recv_async(t, peer, tag)->wait(); }
  void barrier() { barrier_async()->wait(); }

  // Total time callers have spent blocked in wait() on this communicator's handles (exposed communication).
  virtual double total_wait_us() const = 0;
  // CPU time (us) the communicator's own threads have used since it was created, from their thread CPU clocks
  // (comm_cpu_ms in metrics.jsonl). 0 where a backend has no thread of its own.
  virtual double thread_cpu_us() const { return 0; }

  // comm.emulate.schedule: the emulated link within a node (latency_us, bandwidth_gbps; the inter-node link keeps its
  // setting) for operations issued from now on. Returns false where no network is emulated.
  virtual bool set_emulated_link(double latency_us, double bandwidth_gbps) {
    (void)latency_us, (void)bandwidth_gbps;
    return false;
  }

  // Completed operations are reported here, from the communication thread (the sink must be thread-safe), for
  // the time accounting and the trace. Set it before issuing operations.
  void set_event_sink(std::function<void(const CommEvent&)> sink) { sink_ = std::move(sink); }
  // Whether those events are this communicator's own operations, numbered (seq) in issue order from 1: false where
  // a backend passes on the events of communicators of its own (the hierarchical all-reduce's).
  virtual bool events_number_own_operations() const { return true; }
  // The operations the communication thread starts (their seq, when it takes them from the queue) are reported
  // here where a backend knows (the flight recorder's "started"). Set it before issuing operations.
  virtual void set_start_sink(std::function<void(uint64_t seq)> sink) { start_sink_ = std::move(sink); }
  // A digest of every collective issued so far (operation, count, dtype, reduce op, root) and the group's world
  // ranks, where one is kept (the flight recorder's wrapper): the ranks of a group that issued the same collectives
  // have the same digest.
  virtual bool collective_digest(uint64_t* digest, std::vector<int>* world_members) const {
    (void)digest, (void)world_members;
    return false;
  }

 protected:
  std::function<void(const CommEvent&)> sink_;
  std::function<void(uint64_t seq)> start_sink_;
};

}  // namespace mt
