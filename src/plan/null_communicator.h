// A communicator that does nothing: every operation completes at once and leaves its buffers as they are. The
// planner times one tensor-parallel rank's compute on one process with it (the model only talks to its tp group
// through a Communicator); the values computed are meaningless, their cost is not.
#pragma once
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_options.h"
#include "comm/communicator.h"

namespace mt::plan {

class NullCommunicator : public Communicator {
 public:
  NullCommunicator(int size, int rank) : size_(size), rank_(rank), name_("null") {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  WorkPtr all_reduce_async(const Tensor&, ReduceOp) override { return done(); }
  WorkPtr reduce_scatter_async(const Tensor&, const Tensor&, ReduceOp) override { return done(); }
  WorkPtr all_gather_async(const Tensor&, const Tensor&) override { return done(); }
  WorkPtr broadcast_async(const Tensor&, int) override { return done(); }
  WorkPtr send_async(const Tensor&, int, int) override { return done(); }
  WorkPtr recv_async(const Tensor&, int, int) override { return done(); }
  WorkPtr barrier_async() override { return done(); }
  double total_wait_us() const override { return 0; }

 private:
  struct Done : Work {
    void wait() override {}
    bool done() const override { return true; }
  };
  static WorkPtr done() { return std::make_shared<Done>(); }
  int size_, rank_;
  std::string name_;
};

// A collective as the planner's time model charges it: its kind and bytes as predict_us takes them (all-reduce: the
// tensor; all-gather: the output; reduce-scatter: the input).
struct TpOp {
  CommKind kind;
  int64_t bytes;
  bool operator<(const TpOp& o) const { return std::make_pair(int(kind), bytes) < std::make_pair(int(o.kind), o.bytes); }
  bool operator==(const TpOp& o) const { return kind == o.kind && bytes == o.bytes; }
};

// A NullCommunicator that also notes each collective and send it is asked for: the calibration runs the model's passes
// on one (the tp group, and the cp ring), so the planner's traffic is what the model's own code asks for.
class CountingCommunicator : public NullCommunicator {
 public:
  using NullCommunicator::NullCommunicator;
  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    ops.push_back({CommKind::AllReduce, int64_t(t.nbytes())});
    return NullCommunicator::all_reduce_async(t, op);
  }
  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override {
    ops.push_back({CommKind::ReduceScatter, int64_t(in.nbytes())});
    return NullCommunicator::reduce_scatter_async(in, out, op);
  }
  WorkPtr all_gather_async(const Tensor& in, const Tensor& out) override {
    ops.push_back({CommKind::AllGather, int64_t(out.nbytes())});
    return NullCommunicator::all_gather_async(in, out);
  }
  // Context parallelism's ring messages (a cp group's sends; their receives are the same messages).
  WorkPtr send_async(const Tensor& t, int peer, int tag) override {
    ops.push_back({CommKind::Send, int64_t(t.nbytes())});
    return NullCommunicator::send_async(t, peer, tag);
  }
  // A receive's buffer gets zeros, not what the arena held before: leftover bits could be denormals or NaNs, which
  // would time the ring's attention blocks at other speeds than real keys and values do.
  WorkPtr recv_async(const Tensor& t, int peer, int tag) override {
    if (t.numel() > 0) std::memset(t.data(), 0, t.nbytes());
    return NullCommunicator::recv_async(t, peer, tag);
  }
  std::vector<TpOp> ops;  // in the order asked
};

}  // namespace mt::plan
